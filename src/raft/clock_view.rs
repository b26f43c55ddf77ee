//! What this node knows of its peers' wall clocks, and so of its own clock's offset from a
//! quorum's median (contract §3, docs/decisions/026).
//!
//! Every peer frame carries its sender's wall clock. A call's answer gives the caller a
//! reading of the peer's offset at half the round trip; a call gives the receiver one at
//! its arrival (late by the transit, a few milliseconds against a bound of hundreds). A
//! node's own median needs readings from a quorum of voters (itself included), which a
//! follower rarely has: it hears from the leader only. So every call also tells the
//! receiver its offset from the median of the sender's readings, and a node takes the
//! estimate that rests on the most clocks, its own or the one the leader told it (only the
//! leader's word is taken: `PeerService`).
//!
//! `watch` acts on the estimate: a node further than `max_clock_offset_ms` from the median
//! does not campaign and, leading, stops proposing and heartbeating so that a node with a
//! sound clock takes over; and a voter refuses a candidate whose clock is that far from its
//! own (`refuses_candidate`), which also stops a node that has no readings yet.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use crate::clock::wall_clock_us;
use crate::raft::{NodeId, Raft};

/// How long a reading counts: a peer not heard from for this long is left out of the
/// median (it may be down, and its clock with it).
const READING_FRESH_FOR: Duration = Duration::from_secs(5);

/// A clock offset in microseconds (positive: ahead), and how many clocks it was judged
/// against.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Offset {
    pub offset_us: i64,
    pub clocks: u32,
}

#[derive(Clone, Copy)]
struct Reading {
    /// The peer's wall clock minus this node's.
    offset_us: i64,
    at: Instant,
}

/// The last readings of one peer: from a round trip (the better: its error is at most half
/// the trip) and from a call's arrival (late by the transit).
#[derive(Clone, Copy, Default)]
struct PeerReadings {
    round_trip: Option<Reading>,
    arrival: Option<Reading>,
}

impl PeerReadings {
    /// The offset of the best fresh reading.
    fn fresh(&self, now: Instant) -> Option<i64> {
        let fresh = |reading: &Option<Reading>| {
            reading.filter(|r| now.duration_since(r.at) <= READING_FRESH_FOR)
        };
        fresh(&self.round_trip)
            .or_else(|| fresh(&self.arrival))
            .map(|r| r.offset_us)
    }
}

#[derive(Default)]
struct Readings {
    peers: HashMap<NodeId, PeerReadings>,
    /// This node's offset from the median of a peer's readings, as that peer last told it.
    told: Option<(Offset, Instant)>,
    /// The voters, this node among them or not: whose clocks make the median.
    voters: Vec<NodeId>,
}

/// The clock readings of one node; cheap to clone (clones share them).
#[derive(Clone)]
pub struct ClockView {
    node_id: NodeId,
    bound_us: i64,
    readings: Arc<Mutex<Readings>>,
    /// Set by `watch` while the estimate is past the bound: the router proposes nothing.
    skewed: Arc<AtomicBool>,
}

impl ClockView {
    /// Readings for `node_id`, judged against `max_clock_offset`.
    pub fn new(node_id: NodeId, max_clock_offset: Duration) -> Self {
        Self {
            node_id,
            bound_us: i64::try_from(max_clock_offset.as_micros()).unwrap_or(i64::MAX),
            readings: Arc::default(),
            skewed: Arc::default(),
        }
    }

    /// `max_clock_offset_ms`, in microseconds.
    pub fn bound_us(&self) -> u64 {
        self.bound_us.unsigned_abs()
    }

    /// A peer's clock read from a call it sent: `peer_wall_us` at this node's
    /// `local_wall_us` as the call arrived.
    pub fn read_arrival(&self, peer: NodeId, peer_wall_us: u64, local_wall_us: u64) {
        if let Some(reading) = self.reading(peer, peer_wall_us, local_wall_us) {
            self.lock().peers.entry(peer).or_default().arrival = Some(reading);
        }
    }

    /// A peer's clock read from its answer to a call: `peer_wall_us` at this node's
    /// `midpoint_wall_us`, halfway through a `round_trip`. A trip longer than the bound
    /// says too little to keep.
    pub fn read_round_trip(
        &self,
        peer: NodeId,
        peer_wall_us: u64,
        midpoint_wall_us: u64,
        round_trip: Duration,
    ) {
        if round_trip.as_micros() > u128::from(self.bound_us()) {
            return;
        }
        if let Some(reading) = self.reading(peer, peer_wall_us, midpoint_wall_us) {
            self.lock().peers.entry(peer).or_default().round_trip = Some(reading);
        }
    }

    fn reading(&self, peer: NodeId, peer_wall_us: u64, local_wall_us: u64) -> Option<Reading> {
        (peer_wall_us != 0 && peer != self.node_id).then(|| Reading {
            offset_us: signed_difference(peer_wall_us, local_wall_us),
            at: Instant::now(),
        })
    }

    /// What a peer told this node of its offset (`clocks` 0: nothing).
    pub fn told(&self, offset_us: i64, clocks: u32) {
        if clocks == 0 {
            return;
        }
        self.lock().told = Some((Offset { offset_us, clocks }, Instant::now()));
    }

    /// The voters whose clocks make the median (from the membership, as it changes).
    pub fn set_voters(&self, voters: Vec<NodeId>) {
        self.lock().voters = voters;
    }

    /// What to tell `peer` of its offset: from the median of this node's own readings,
    /// `(0, 0)` when they are no quorum's or `peer` has none.
    pub fn offset_of(&self, peer: NodeId) -> (i64, u32) {
        let readings = self.lock();
        let now = Instant::now();
        let Some(peer_offset) = readings.peers.get(&peer).and_then(|r| r.fresh(now)) else {
            return (0, 0);
        };
        match own_median(&readings, self.node_id, now) {
            Some((median_us, clocks)) => (peer_offset.saturating_sub(median_us), clocks),
            None => (0, 0),
        }
    }

    /// This node's offset from a quorum's median: from its own readings or from what a
    /// peer told it, whichever rests on more clocks; `None` when neither is fresh.
    pub fn estimate(&self) -> Option<Offset> {
        let readings = self.lock();
        let now = Instant::now();
        let own = own_median(&readings, self.node_id, now).map(|(median_us, clocks)| Offset {
            offset_us: median_us.saturating_neg(),
            clocks,
        });
        let told = readings
            .told
            .filter(|(_, at)| now.duration_since(*at) <= READING_FRESH_FOR)
            .map(|(offset, _)| offset);
        match (own, told) {
            (Some(own), Some(told)) if told.clocks > own.clocks => Some(told),
            (Some(own), _) => Some(own),
            (None, told) => told,
        }
    }

    /// Whether this node's clock is past the bound (as `watch` last judged it).
    pub fn skewed(&self) -> bool {
        self.skewed.load(Ordering::Relaxed)
    }

    /// Whether a vote request stamped `candidate_wall_us` comes from a clock further than
    /// the bound from this node's, judged by a node whose own clock is not known to be
    /// off; the reason, to refuse it with.
    pub fn refuses_candidate(&self, candidate_wall_us: u64) -> Option<String> {
        if candidate_wall_us == 0 || self.skewed() {
            return None;
        }
        let offset_us = signed_difference(candidate_wall_us, wall_clock_us());
        (offset_us.unsigned_abs() > self.bound_us()).then(|| {
            format!(
                "the candidate's clock is {} ms from this voter's, past max_clock_offset_ms = {}",
                offset_us / 1_000,
                self.bound_us() / 1_000
            )
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Readings> {
        self.readings
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// `a - b` as a signed number of microseconds, saturating.
fn signed_difference(a: u64, b: u64) -> i64 {
    if a >= b {
        i64::try_from(a - b).unwrap_or(i64::MAX)
    } else {
        i64::try_from(b - a).map_or(i64::MIN, i64::saturating_neg)
    }
}

/// The median of this node's fresh readings of the voters' clocks (its own counted as 0),
/// relative to its own clock, and how many clocks it is of; `None` short of a quorum of
/// the voters. Of an even count's two middle values, the one nearer this node's clock:
/// two clocks that disagree do not say which one is off.
fn own_median(readings: &Readings, node_id: NodeId, now: Instant) -> Option<(i64, u32)> {
    let mut offsets: Vec<i64> = readings
        .voters
        .iter()
        .filter(|&&voter| voter != node_id)
        .filter_map(|voter| readings.peers.get(voter)?.fresh(now))
        .collect();
    offsets.push(0);
    let quorum = readings.voters.len() / 2 + 1;
    if readings.voters.is_empty() || offsets.len() < quorum {
        return None;
    }
    offsets.sort_unstable();
    let n = offsets.len();
    let median = if n % 2 == 1 {
        offsets[n / 2]
    } else {
        let (low, high) = (offsets[n / 2 - 1], offsets[n / 2]);
        if low.unsigned_abs() <= high.unsigned_abs() {
            low
        } else {
            high
        }
    };
    Some((median, u32::try_from(n).unwrap_or(u32::MAX)))
}

/// Judges this node's clock every `every` until `stop`: keeps the voters current, reports
/// the offset (`ankusa_clock_offset_seconds`), and past the bound takes the node out of
/// leading (no campaign, no heartbeat, no proposal) until it is back within it.
pub async fn watch(raft: Raft, view: ClockView, every: Duration, mut stop: watch::Receiver<bool>) {
    let mut ticks = tokio::time::interval(every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticks.tick() => {}
            _ = stop.changed() => return,
        }
        let voters: Vec<NodeId> = raft
            .metrics()
            .borrow()
            .membership_config
            .membership()
            .voter_ids()
            .collect();
        view.set_voters(voters);
        let estimate = view.estimate();
        if let Some(estimate) = estimate {
            #[allow(clippy::cast_precision_loss)]
            metrics::gauge!("ankusa_clock_offset_seconds").set(estimate.offset_us as f64 / 1e6);
        }
        let skewed = estimate.is_some_and(|e| e.offset_us.unsigned_abs() > view.bound_us());
        if skewed == view.skewed() {
            continue;
        }
        view.skewed.store(skewed, Ordering::Relaxed);
        let runtime = raft.runtime_config();
        runtime.elect(!skewed);
        runtime.heartbeat(!skewed);
        if let (true, Some(estimate)) = (skewed, estimate) {
            tracing::warn!(
                offset_ms = estimate.offset_us / 1_000,
                clocks = estimate.clocks,
                max_clock_offset_ms = view.bound_us() / 1_000,
                "this node's wall clock is too far from the fleet's median: it does not campaign, and if it leads it stops proposing and heartbeating so another node takes over"
            );
        } else {
            tracing::info!(
                offset_ms = estimate.map_or(0, |e| e.offset_us / 1_000),
                "this node's wall clock is back within max_clock_offset_ms: it may lead again"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINUTE_US: u64 = 60_000_000;
    const NOW_US: u64 = 1_800_000_000_000_000;

    fn view(node: NodeId, voters: &[NodeId]) -> ClockView {
        let view = ClockView::new(node, Duration::from_millis(500));
        view.set_voters(voters.to_vec());
        view
    }

    #[test]
    fn a_leader_ahead_of_both_followers_finds_itself_off_and_tells_each_follower_it_is_not() {
        let leader = view(1, &[1, 2, 3]);
        leader.read_arrival(2, NOW_US, NOW_US + 90 * MINUTE_US);
        leader.read_round_trip(
            3,
            NOW_US + 1_000,
            NOW_US + 90 * MINUTE_US,
            Duration::from_millis(2),
        );
        let own = leader.estimate().expect("a quorum's readings");
        assert_eq!(own.clocks, 3);
        assert!(own.offset_us > 89 * 60_000_000, "{own:?}");
        // Each follower is within a millisecond of the median of the leader's readings.
        for follower in [2, 3] {
            let (offset_us, clocks) = leader.offset_of(follower);
            assert_eq!(clocks, 3);
            assert!(offset_us.abs() <= 1_000, "{follower}: {offset_us}");
        }
    }

    #[test]
    fn a_follower_with_one_reading_trusts_what_the_leader_told_it() {
        let follower = view(2, &[1, 2, 3]);
        // Its own two clocks disagree by 90 minutes: it cannot tell which is off and takes
        // its own.
        follower.read_arrival(1, NOW_US, NOW_US + 90 * MINUTE_US);
        assert_eq!(follower.estimate().map(|e| e.offset_us), Some(0));
        // The leader, reading all three, says this follower is 90 minutes ahead.
        follower.told(90 * 60_000_000, 3);
        let estimate = follower.estimate().expect("told");
        assert_eq!(estimate.clocks, 3);
        assert_eq!(estimate.offset_us, 90 * 60_000_000);
    }

    #[test]
    fn no_estimate_without_a_quorum_of_voters() {
        let lonely = view(1, &[1, 2, 3, 4, 5]);
        lonely.read_arrival(2, NOW_US, NOW_US);
        assert_eq!(lonely.estimate(), None, "two of five clocks are no quorum");
        lonely.read_arrival(3, NOW_US, NOW_US);
        assert_eq!(lonely.estimate().map(|e| e.clocks), Some(3));
        // A reading of a node that is no voter does not count.
        let learner_only = view(1, &[1, 2, 3]);
        learner_only.read_arrival(9, NOW_US, NOW_US);
        assert_eq!(learner_only.estimate(), None);
    }

    #[test]
    fn a_voter_refuses_a_candidate_past_the_bound_unless_its_own_clock_is_off() {
        let voter = view(1, &[1, 2, 3]);
        let now = wall_clock_us();
        assert!(voter.refuses_candidate(now + 90 * MINUTE_US).is_some());
        assert!(voter.refuses_candidate(now - 90 * MINUTE_US).is_some());
        assert!(voter.refuses_candidate(now + 100_000).is_none());
        assert!(
            voter.refuses_candidate(0).is_none(),
            "no reading: no judgment"
        );
        voter.skewed.store(true, Ordering::Relaxed);
        assert!(voter.refuses_candidate(now + 90 * MINUTE_US).is_none());
    }

    #[test]
    fn a_round_trip_reading_is_preferred_and_a_slow_trip_is_not_kept() {
        let node = view(1, &[1, 2, 3]);
        node.read_arrival(2, NOW_US + 300_000, NOW_US);
        node.read_round_trip(2, NOW_US + 1_000, NOW_US, Duration::from_millis(4));
        assert_eq!(node.offset_of(2).0, 1_000, "the round trip's reading");
        // A trip longer than the bound: the reading it gives is not kept.
        node.read_round_trip(3, NOW_US + 90 * MINUTE_US, NOW_US, Duration::from_secs(2));
        assert_eq!(node.offset_of(3), (0, 0));
    }

    #[test]
    fn signed_differences_saturate() {
        assert_eq!(signed_difference(5, 3), 2);
        assert_eq!(signed_difference(3, 5), -2);
        assert_eq!(signed_difference(u64::MAX, 0), i64::MAX);
        assert_eq!(signed_difference(0, u64::MAX), i64::MIN);
    }
}
