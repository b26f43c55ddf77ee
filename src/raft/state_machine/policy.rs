//! When a node takes a snapshot.
//!
//! openraft's own policy counts entries only, so once the state is large every snapshot
//! encodes and stores all of it again after the same number of entries: the work per hit
//! grows with the state (docs/decisions/012). Here a snapshot also waits until the log written since the
//! last one reaches `log_percent` of that snapshot's size, as Redis waits before it
//! rewrites its append-only file (`auto-aof-rewrite-percentage`): snapshot work then grows
//! with the log written, whatever the size of the state. The log after a snapshot grows to
//! about that share of its size (or `logs_since_last` entries, if more) before the next.
//!
//! openraft runs with `SnapshotPolicy::Never`; [`run`] checks [`SnapshotPolicy::due`]
//! every [`CHECK_EVERY`] and asks openraft for a snapshot with `Trigger::snapshot`.
//!
//! The rule is the same on every node, so the nodes of a fleet come due at about the same
//! index. They take turns: a node waits its slot times its last build's duration, so the
//! voters' builds mostly do not meet and a quorum keeps committing at speed (on hosts that
//! share cores or a disk, the builds compete less with each other too). Mostly: a node
//! times its turn by its own last build, and another node's build may take longer.

use std::time::Duration;

use tokio::sync::watch;
use tokio::time::MissedTickBehavior;

use crate::raft::log_store::LogBytes;
use crate::raft::state_machine::StateMachineStore;
use crate::raft::{NodeId, Raft};

/// How often a node checks whether a snapshot is due.
pub const CHECK_EVERY: Duration = Duration::from_millis(100);
/// Longest wait for a triggered snapshot to show up in the metrics before checking again.
const BUILD_WAIT_MAX: Duration = Duration::from_secs(300);
/// Turns for snapshots: a voter's slot is its rank among the voters' ids modulo this. With
/// 3, fewer than a quorum of voters share a slot in a fleet of two voters or more
/// (ceil(n/3) < n/2 + 1).
const TURN_SLOTS: usize = 3;
/// The longest a node waits for its turn.
const TURN_DELAY_MAX: Duration = Duration::from_secs(10);

/// This node's slot: its rank among the `voters` (their ids) modulo [`TURN_SLOTS`]; a
/// learner, which no quorum waits for, ranks after them among the `learners`.
fn turn_slot(
    node_id: NodeId,
    voters: impl IntoIterator<Item = NodeId>,
    learners: impl IntoIterator<Item = NodeId>,
) -> usize {
    let voters: Vec<NodeId> = voters.into_iter().collect();
    let rank = if voters.contains(&node_id) {
        voters.iter().filter(|id| **id < node_id).count()
    } else {
        voters.len() + learners.into_iter().filter(|id| *id < node_id).count()
    };
    rank % TURN_SLOTS
}

/// How long a node in `slot` waits before it asks for a snapshot that is due: the nodes
/// of the slots before it build theirs meanwhile, each about as long as this node's last
/// build took (none yet: no wait). At most [`TURN_DELAY_MAX`].
fn turn_delay(slot: usize, last_build: Option<Duration>) -> Duration {
    let Some(last_build) = last_build else {
        return Duration::ZERO;
    };
    last_build
        .saturating_mul(u32::try_from(slot).unwrap_or(u32::MAX))
        .min(TURN_DELAY_MAX)
}

/// When a snapshot is due (see the module docs).
#[derive(Clone, Copy, Debug)]
pub struct SnapshotPolicy {
    /// Fewest applied entries since the last snapshot.
    pub logs_since_last: u64,
    /// Log bytes written since the last snapshot, in percent of its size (0: entries alone
    /// decide).
    pub log_percent: u64,
}

impl SnapshotPolicy {
    /// Whether to snapshot now, given the last applied index, the current snapshot's last
    /// index and size in bytes, and the bytes of log after that index.
    pub fn due(
        &self,
        applied: Option<u64>,
        snapshot: Option<u64>,
        snapshot_bytes: u64,
        log_bytes: u64,
    ) -> bool {
        let Some(applied) = applied else {
            return false;
        };
        let entries = match snapshot {
            Some(snapshot) => applied.saturating_sub(snapshot),
            None => applied + 1,
        };
        entries >= self.logs_since_last
            && u128::from(log_bytes) * 100
                >= u128::from(snapshot_bytes) * u128::from(self.log_percent)
    }
}

/// Checks the policy until `stopped` turns true; a node whose Raft has stopped stops here.
pub async fn run(
    raft: Raft,
    node_id: NodeId,
    log: LogBytes,
    state: StateMachineStore,
    policy: SnapshotPolicy,
    mut stopped: watch::Receiver<bool>,
) {
    let mut tick = tokio::time::interval(CHECK_EVERY);
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut last_build = None;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stopped.wait_for(|stop| *stop) => return,
        }
        let (applied, snapshot) = {
            let metrics = raft.metrics();
            let metrics = metrics.borrow();
            (metrics.last_applied.map(|id| id.index), metrics.snapshot)
        };
        let snapshot_index = snapshot.map(|id| id.index);
        // Skipped while the log's writer holds it (a purge right after a snapshot, say).
        let Some(log_bytes) = log.after(snapshot_index) else {
            continue;
        };
        let snapshot_bytes = state.snapshot_bytes();
        metrics::gauge!("ankusa_snapshot_bytes").set(snapshot_bytes as f64);
        metrics::gauge!("ankusa_log_bytes_since_snapshot").set(log_bytes as f64);
        if !policy.due(applied, snapshot_index, snapshot_bytes, log_bytes) {
            continue;
        }
        let slot = {
            let metrics = raft.metrics();
            let metrics = metrics.borrow();
            let membership = metrics.membership_config.membership();
            turn_slot(node_id, membership.voter_ids(), membership.learner_ids())
        };
        let delay = turn_delay(slot, last_build);
        tracing::debug!(
            ?applied,
            ?snapshot_index,
            snapshot_bytes,
            log_bytes,
            slot,
            delay_ms = delay.as_millis(),
            "snapshot due"
        );
        tokio::select! {
            () = tokio::time::sleep(delay) => {}
            _ = stopped.wait_for(|stop| *stop) => return,
        }
        // A snapshot installed from the leader meanwhile may have made this one needless.
        if raft.metrics().borrow().snapshot != snapshot {
            continue;
        }
        let started = tokio::time::Instant::now();
        if let Err(e) = raft.trigger().snapshot().await {
            tracing::warn!(error = %e, "raft stopped; no more snapshots");
            return;
        }
        // One at a time: the next check starts from the snapshot this one built.
        let wait = raft.wait(Some(BUILD_WAIT_MAX));
        let built = wait.metrics(|m| m.snapshot != snapshot, "snapshot built");
        tokio::select! {
            result = built => match result {
                Ok(_) => last_build = Some(started.elapsed()),
                Err(e) => tracing::warn!(error = %e, "no snapshot built after the trigger"),
            },
            _ = stopped.wait_for(|stop| *stop) => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::{turn_delay, turn_slot, SnapshotPolicy, TURN_DELAY_MAX, TURN_SLOTS};

    const POLICY: SnapshotPolicy = SnapshotPolicy {
        logs_since_last: 100,
        log_percent: 100,
    };

    #[test]
    fn nothing_applied_is_never_due() {
        assert!(!POLICY.due(None, None, 0, u64::MAX));
    }

    #[test]
    fn the_first_snapshot_waits_only_for_the_entries() {
        assert!(!POLICY.due(Some(98), None, 0, 0));
        assert!(POLICY.due(Some(99), None, 0, 0));
    }

    #[test]
    fn a_later_one_waits_for_the_entries_and_for_log_as_large_as_the_last_snapshot() {
        assert!(!POLICY.due(Some(1_099), Some(1_000), 10, 1_000_000));
        assert!(!POLICY.due(Some(1_100), Some(1_000), 5_000, 4_999));
        assert!(POLICY.due(Some(1_100), Some(1_000), 5_000, 5_000));
    }

    #[test]
    fn the_percent_scales_the_log_needed_and_zero_leaves_only_the_entries() {
        let half = SnapshotPolicy {
            log_percent: 50,
            ..POLICY
        };
        assert!(!half.due(Some(1_100), Some(1_000), 5_000, 2_499));
        assert!(half.due(Some(1_100), Some(1_000), 5_000, 2_500));
        let entries_only = SnapshotPolicy {
            log_percent: 0,
            ..POLICY
        };
        assert!(entries_only.due(Some(1_100), Some(1_000), u64::MAX, 0));
    }

    #[test]
    fn voters_take_turns_by_rank_and_learners_after_them() {
        let three = [7, 3, 11];
        let slots: Vec<usize> = [3, 7, 11]
            .iter()
            .map(|id| turn_slot(*id, three, []))
            .collect();
        assert_eq!(slots, [0, 1, 2]);
        // Five voters: no slot holds a quorum (3) of them.
        let five = [1, 2, 3, 4, 5];
        let mut per_slot = [0; TURN_SLOTS];
        for id in five {
            per_slot[turn_slot(id, five, [])] += 1;
        }
        assert_eq!(per_slot, [2, 2, 1]);
        // Learners with ids between the voters' leave the voters' slots as they were.
        let (voters, learners) = ([1, 3, 4], [2, 5]);
        let slots: Vec<usize> = [1, 3, 4, 2, 5]
            .iter()
            .map(|id| turn_slot(*id, voters, learners))
            .collect();
        assert_eq!(slots, [0, 1, 2, 0, 1]);
    }

    #[test]
    fn a_node_waits_its_slot_times_its_last_build_at_most_the_cap() {
        let build = Duration::from_millis(300);
        assert_eq!(turn_delay(0, Some(build)), Duration::ZERO);
        assert_eq!(turn_delay(2, Some(build)), Duration::from_millis(600));
        assert_eq!(turn_delay(2, None), Duration::ZERO);
        assert_eq!(
            turn_delay(2, Some(Duration::from_secs(3600))),
            TURN_DELAY_MAX
        );
    }

    #[test]
    fn huge_sizes_do_not_overflow() {
        let many = SnapshotPolicy {
            log_percent: u64::MAX,
            ..POLICY
        };
        assert!(!many.due(Some(1_100), Some(1_000), u64::MAX, u64::MAX));
        assert!(POLICY.due(Some(1_100), Some(1_000), u64::MAX, u64::MAX));
    }
}
