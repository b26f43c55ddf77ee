//! The node's wall clock, in the microseconds the state machine counts in, and the time
//! the node-local engine decides by.
//!
//! The leader stamps each batch with the wall clock, bounded by its monotonic clock
//! (contract §3, [`bounded_stamp`]); the node-local engine decides by [`LocalTime`], the
//! same rule with an anchor of its own. Both read a [`Clock`] given to them at start-up
//! (one [`SystemClock`] per node), which a test replaces with a [`ManualClock`] it drives.
//!
//! Fault injection can set the wall clock off by an offset, to play a node whose clock is
//! wrong (the nemesis's `clock` fault). The offset is process-wide: one node per process,
//! as `serve` runs.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// The fault-injection offset, in microseconds (0 unless a fault set it).
static FAULT_OFFSET_US: AtomicI64 = AtomicI64::new(0);

/// Microseconds since the Unix epoch on this node's wall clock.
pub fn wall_clock_us() -> u64 {
    let now_us = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
        .unwrap_or(0);
    now_us.saturating_add_signed(FAULT_OFFSET_US.load(Ordering::Relaxed))
}

/// Sets the wall clock's offset (only `raft::faults` calls this, with fault injection on);
/// `true` if it changed.
pub(crate) fn set_fault_offset_ms(offset_ms: i64) -> bool {
    let offset_us = offset_ms.saturating_mul(1_000);
    FAULT_OFFSET_US.swap(offset_us, Ordering::Relaxed) != offset_us
}

/// The stamp for wall-clock reading `wall_us`, `elapsed_us` of monotonic time after the
/// anchor `anchor_us`: the wall clock, within `bound_us` of the anchor moved on by the
/// monotonic time (contract §3). Whether the wall clock was within the bound (then the
/// stamp is a new anchor; otherwise the old one stays, so a clock that jumped moves the
/// time at the monotonic rate and at most `bound_us` off it).
pub fn bounded_stamp(wall_us: u64, anchor_us: u64, elapsed_us: u64, bound_us: u64) -> (u64, bool) {
    let expected_us = anchor_us.saturating_add(elapsed_us);
    let low_us = expected_us.saturating_sub(bound_us);
    let high_us = expected_us.saturating_add(bound_us);
    let stamp_us = wall_us.clamp(low_us, high_us);
    (stamp_us, stamp_us == wall_us)
}

/// The two clocks a node reads: the wall clock (microseconds since the Unix epoch) and a
/// monotonic one (microseconds since an origin of its own, never set back).
pub trait Clock: Send + Sync {
    fn wall_us(&self) -> u64;
    fn monotonic_us(&self) -> u64;
}

/// The machine's clocks: the wall clock with the fault-injection offset, and as the
/// monotonic clock `CLOCK_BOOTTIME` where there is one (Linux), which unlike `Instant`'s
/// `CLOCK_MONOTONIC` also counts the time the machine was suspended, so a resumed node's
/// wall clock does not look stepped; elsewhere `Instant`.
pub struct SystemClock {
    origin: Instant,
}

impl Default for SystemClock {
    fn default() -> Self {
        Self {
            origin: Instant::now(),
        }
    }
}

impl Clock for SystemClock {
    fn wall_us(&self) -> u64 {
        wall_clock_us()
    }

    #[cfg(target_os = "linux")]
    fn monotonic_us(&self) -> u64 {
        let mut now = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: clock_gettime writes one timespec, which `now` is, and reads nothing else.
        let rc = unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut now) };
        // It cannot fail on Linux since 2.6.39 with a valid pointer; were it to, `origin`
        // still moves on, though from another origin (one step, then at the right rate).
        if rc != 0 {
            return u64::try_from(self.origin.elapsed().as_micros()).unwrap_or(u64::MAX);
        }
        let secs = u64::try_from(now.tv_sec).unwrap_or(0);
        let nanos = u64::try_from(now.tv_nsec).unwrap_or(0);
        secs.saturating_mul(1_000_000).saturating_add(nanos / 1_000)
    }

    #[cfg(not(target_os = "linux"))]
    fn monotonic_us(&self) -> u64 {
        u64::try_from(self.origin.elapsed().as_micros()).unwrap_or(u64::MAX)
    }
}

/// Clocks a test moves by hand: [`ManualClock::advance`] moves both, as time passing;
/// [`ManualClock::step_wall`] moves the wall clock alone, as an NTP step or a bad RTC.
#[derive(Debug, Default)]
pub struct ManualClock {
    wall_us: AtomicU64,
    monotonic_us: AtomicU64,
}

impl ManualClock {
    /// Clocks reading `wall_us` on the wall and 0 on the monotonic clock.
    pub fn new(wall_us: u64) -> Self {
        Self {
            wall_us: AtomicU64::new(wall_us),
            monotonic_us: AtomicU64::new(0),
        }
    }

    /// Time passes: both clocks move on by `by`.
    pub fn advance(&self, by: Duration) {
        let by_us = u64::try_from(by.as_micros()).unwrap_or(u64::MAX);
        self.wall_us.fetch_add(by_us, Ordering::Relaxed);
        self.monotonic_us.fetch_add(by_us, Ordering::Relaxed);
    }

    /// The wall clock alone is set `by_us` microseconds on (negative: back).
    pub fn step_wall(&self, by_us: i64) {
        let _ = self
            .wall_us
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |wall_us| {
                Some(wall_us.saturating_add_signed(by_us))
            });
    }
}

impl Clock for ManualClock {
    fn wall_us(&self) -> u64 {
        self.wall_us.load(Ordering::Relaxed)
    }

    fn monotonic_us(&self) -> u64 {
        self.monotonic_us.load(Ordering::Relaxed)
    }
}

/// The time the node-local engines decide by: the leader's rule ([`bounded_stamp`]) with
/// an anchor of their own, set at start-up. A wall clock within `bound_us` of the anchor
/// moved on by the monotonic clock is the time, and the next anchor (so NTP's slewing is
/// followed); one further off (a clock set 90 minutes forward or back) moves the time only
/// at the monotonic rate, at most the bound off it, so the node's own buckets keep
/// refilling and its pending claims do not all end at once. Unlike the leader's stamps,
/// which anchor again at each new term (the voters found that clock sound), nothing moves
/// the anchor past the bound: a node started with its clock wrong keeps deciding alone by
/// that reading, at the monotonic rate, until it restarts (docs/decisions/026).
pub struct LocalTime {
    clock: Arc<dyn Clock>,
    bound_us: u64,
    /// The last time that was the wall clock, the monotonic reading then, and whether the
    /// wall clock is past the bound now (said once in the log as it goes and comes back).
    anchor: Mutex<(u64, u64, bool)>,
}

impl LocalTime {
    /// Time read from `clock`, bounded by `bound`, anchored at the wall clock now.
    pub fn new(clock: Arc<dyn Clock>, bound: Duration) -> Self {
        let anchor = (clock.wall_us(), clock.monotonic_us(), false);
        Self {
            clock,
            bound_us: u64::try_from(bound.as_micros()).unwrap_or(u64::MAX),
            anchor: Mutex::new(anchor),
        }
    }

    /// The machine's clocks, bounded by `bound`.
    pub fn system(bound: Duration) -> Self {
        Self::new(Arc::new(SystemClock::default()), bound)
    }

    /// The time now, in microseconds since the Unix epoch.
    pub fn now_us(&self) -> u64 {
        let mut anchor = crate::lock::lock(&self.anchor);
        // Read under the lock, so no caller anchors on a reading older than the anchor.
        let (wall_us, monotonic_us) = (self.clock.wall_us(), self.clock.monotonic_us());
        let elapsed_us = monotonic_us.saturating_sub(anchor.1);
        let (now_us, within) = bounded_stamp(wall_us, anchor.0, elapsed_us, self.bound_us);
        if within {
            if anchor.2 {
                tracing::info!("local time: the wall clock is back within max_clock_offset_ms");
            }
            *anchor = (wall_us, monotonic_us, false);
        } else if !anchor.2 {
            anchor.2 = true;
            let off_ms = i128::from(wall_us) - i128::from(now_us);
            tracing::warn!(
                off_ms = off_ms / 1_000,
                "local time: the wall clock stepped past max_clock_offset_ms; this node's own \
                 decisions (node scope, fallback) go on at the monotonic rate until it comes \
                 back, or until a restart takes the wall clock as it is then"
            );
        }
        now_us
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T0_US: u64 = 1_800_000_000_000_000;
    const BOUND: Duration = Duration::from_millis(500);
    const MINUTE_US: i64 = 60_000_000;

    const BOUND_US_U64: u64 = 500_000;
    const MINUTE_US_U64: u64 = 60_000_000;

    #[test]
    fn a_sound_wall_clock_is_the_stamp_and_the_next_anchor() {
        // 10 ms of monotonic time, the wall clock 10.3 ms on: within the bound.
        assert_eq!(
            bounded_stamp(T0_US + 10_300, T0_US, 10_000, BOUND_US_U64),
            (T0_US + 10_300, true)
        );
    }

    #[test]
    fn a_wall_clock_that_jumps_either_way_moves_the_stamps_at_the_monotonic_rate() {
        // 90 minutes ahead: the stamp is the anchor plus the elapsed time plus the bound,
        // and the anchor stays, so the next stamp is not a bound further on.
        let (ahead, within) = bounded_stamp(T0_US + 90 * MINUTE_US_U64, T0_US, 1_000, BOUND_US_U64);
        assert_eq!((ahead, within), (T0_US + 1_000 + BOUND_US_U64, false));
        let (later, _) = bounded_stamp(T0_US + 90 * MINUTE_US_U64, T0_US, 2_000_000, BOUND_US_U64);
        assert_eq!(
            later,
            T0_US + 2_000_000 + BOUND_US_U64,
            "a bound ahead, not two"
        );
        // 90 minutes back: the fleet's time still advances with the monotonic clock.
        let (behind, within) =
            bounded_stamp(T0_US - 90 * MINUTE_US_U64, T0_US, 3_000_000, BOUND_US_U64);
        assert_eq!((behind, within), (T0_US + 3_000_000 - BOUND_US_U64, false));
    }

    fn time() -> (Arc<ManualClock>, LocalTime) {
        let clock = Arc::new(ManualClock::new(T0_US));
        let time = LocalTime::new(clock.clone(), BOUND);
        (clock, time)
    }

    #[test]
    fn a_sound_wall_clock_is_the_time() {
        let (clock, time) = time();
        assert_eq!(time.now_us(), T0_US);
        clock.advance(Duration::from_secs(3));
        clock.step_wall(200_000); // within the bound
        assert_eq!(time.now_us(), T0_US + 3_200_000);
    }

    #[test]
    fn a_wall_clock_set_90_minutes_either_way_moves_the_time_at_the_monotonic_rate() {
        let (clock, time) = time();
        clock.advance(Duration::from_secs(1));
        clock.step_wall(90 * MINUTE_US);
        assert_eq!(
            time.now_us(),
            T0_US + 1_000_000 + 500_000,
            "a bound ahead, no more"
        );
        clock.advance(Duration::from_secs(2));
        assert_eq!(
            time.now_us(),
            T0_US + 3_000_000 + 500_000,
            "on at the monotonic rate"
        );
        // Set back past where it was: a bound behind the monotonic time, where it was a
        // bound ahead (the engine's state clock, which never goes back, waits out those
        // 2 bounds), then on at the monotonic rate.
        clock.step_wall(-180 * MINUTE_US);
        clock.advance(Duration::from_secs(1));
        assert_eq!(time.now_us(), T0_US + 4_000_000 - 500_000);
        // Set right again: followed.
        clock.step_wall(90 * MINUTE_US);
        clock.advance(Duration::from_secs(1));
        assert_eq!(time.now_us(), T0_US + 5_000_000);
    }

    #[test]
    fn a_wall_clock_wrong_from_the_start_is_kept_at_the_monotonic_rate() {
        let (clock, time) = time();
        clock.step_wall(-90 * MINUTE_US); // set right after the start
        clock.advance(Duration::from_secs(10));
        assert_eq!(time.now_us(), T0_US + 10_000_000 - 500_000);
    }
}
