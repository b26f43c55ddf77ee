//! The time a leader stamps into each entry it proposes (contract §3, docs/decisions/026):
//! its wall clock, bounded by its monotonic clock since the anchor of its term, never
//! before its last stamp. Both clocks are read from an injected [`Clock`], so a test can
//! step the wall clock past the bound without sleeping.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::clock::{bounded_stamp, Clock};

/// The stamps of one node's proposals.
pub struct Stamps {
    clock: Arc<dyn Clock>,
    /// The last time stamped on a proposal by this node, so stamps never go back here.
    last_stamp_us: AtomicU64,
    /// Where the fleet's time stood at a monotonic reading, while this node leads: what
    /// its stamps are bounded by (`bounded_stamp`).
    anchor: Mutex<Option<Anchor>>,
}

/// A stamp and the monotonic reading it was made at, in one term of this node's
/// leadership.
#[derive(Clone, Copy, Debug)]
struct Anchor {
    term: u64,
    stamp_us: u64,
    monotonic_us: u64,
}

impl Stamps {
    /// Stamps read from `clock`.
    pub fn new(clock: Arc<dyn Clock>) -> Self {
        Self {
            clock,
            last_stamp_us: AtomicU64::new(0),
            anchor: Mutex::new(None),
        }
    }

    /// The time of the next entry of term `term`: the wall clock, within `bound_us` of the
    /// anchor of this term of leadership moved on by the monotonic clock (a new term
    /// anchors at the wall clock, which the voters found within the bound of theirs), never
    /// before this node's last stamp.
    pub fn next_us(&self, term: u64, bound_us: u64) -> u64 {
        let stamp_us = {
            let mut anchor = crate::lock::lock(&self.anchor);
            // Read under the lock, so no stamp anchors on a reading older than the anchor.
            let (wall_us, monotonic_us) = (self.clock.wall_us(), self.clock.monotonic_us());
            match *anchor {
                Some(held) if held.term == term => {
                    let elapsed_us = monotonic_us.saturating_sub(held.monotonic_us);
                    let (stamp_us, within) =
                        bounded_stamp(wall_us, held.stamp_us, elapsed_us, bound_us);
                    if within {
                        *anchor = Some(Anchor {
                            term,
                            stamp_us,
                            monotonic_us,
                        });
                    } else {
                        metrics::counter!("ankusa_stamps_bounded_total").increment(1);
                    }
                    stamp_us
                }
                _ => {
                    *anchor = Some(Anchor {
                        term,
                        stamp_us: wall_us,
                        monotonic_us,
                    });
                    wall_us
                }
            }
        };
        self.last_stamp_us
            .fetch_max(stamp_us, Ordering::Relaxed)
            .max(stamp_us)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::clock::ManualClock;

    const T0_US: u64 = 1_800_000_000_000_000;
    const BOUND_US: u64 = 500_000;
    const MINUTE_US: i64 = 60_000_000;

    fn stamps() -> (Arc<ManualClock>, Stamps) {
        let clock = Arc::new(ManualClock::new(T0_US));
        (clock.clone(), Stamps::new(clock))
    }

    /// A sound wall clock is the stamp, NTP's small steps included.
    #[test]
    fn a_sound_wall_clock_is_the_stamp() {
        let (clock, stamps) = stamps();
        assert_eq!(stamps.next_us(1, BOUND_US), T0_US);
        clock.advance(Duration::from_millis(10));
        clock.step_wall(300_000); // within the bound
        assert_eq!(stamps.next_us(1, BOUND_US), T0_US + 310_000);
    }

    /// The leader's wall clock set 90 minutes forward, then back past where it was: the
    /// stamps move on at the monotonic rate, at most the bound off it, and never go back
    /// (the stamp a bound ahead is held until the monotonic time passes it).
    #[test]
    fn a_wall_clock_stepped_either_way_past_the_bound_moves_the_stamps_at_the_monotonic_rate() {
        let (clock, stamps) = stamps();
        assert_eq!(stamps.next_us(1, BOUND_US), T0_US);
        clock.advance(Duration::from_secs(1));
        clock.step_wall(90 * MINUTE_US);
        assert_eq!(
            stamps.next_us(1, BOUND_US),
            T0_US + 1_000_000 + BOUND_US,
            "a bound ahead, no more"
        );
        clock.advance(Duration::from_secs(2));
        assert_eq!(
            stamps.next_us(1, BOUND_US),
            T0_US + 3_000_000 + BOUND_US,
            "on at the monotonic rate, still a bound ahead, not two"
        );
        clock.step_wall(-180 * MINUTE_US);
        clock.advance(Duration::from_millis(500));
        // The bound allows a bound behind (T0 + 3 s), but the last stamp was later.
        assert_eq!(
            stamps.next_us(1, BOUND_US),
            T0_US + 3_000_000 + BOUND_US,
            "never before the last stamp"
        );
        clock.advance(Duration::from_secs(2));
        assert_eq!(
            stamps.next_us(1, BOUND_US),
            T0_US + 5_500_000 - BOUND_US,
            "a bound behind, on at the monotonic rate"
        );
        clock.step_wall(90 * MINUTE_US);
        clock.advance(Duration::from_secs(1));
        assert_eq!(
            stamps.next_us(1, BOUND_US),
            T0_US + 6_500_000,
            "set right again: followed"
        );
    }

    /// A new term anchors at the wall clock again (its voters found it within the bound of
    /// theirs), though never before the last stamp.
    #[test]
    fn a_new_term_anchors_at_the_wall_clock() {
        let (clock, stamps) = stamps();
        assert_eq!(stamps.next_us(1, BOUND_US), T0_US);
        clock.step_wall(90 * MINUTE_US);
        assert_eq!(stamps.next_us(1, BOUND_US), T0_US + BOUND_US);
        let ahead_us = T0_US + 90 * MINUTE_US.unsigned_abs();
        assert_eq!(stamps.next_us(2, BOUND_US), ahead_us);
        clock.step_wall(-90 * MINUTE_US);
        assert_eq!(
            stamps.next_us(3, BOUND_US),
            ahead_us,
            "held at the last stamp"
        );
    }
}
