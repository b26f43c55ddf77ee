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

use std::time::Duration;

use tokio::sync::watch;
use tokio::time::MissedTickBehavior;

use crate::raft::log_store::LogBytes;
use crate::raft::state_machine::StateMachineStore;
use crate::raft::Raft;

/// How often a node checks whether a snapshot is due.
pub const CHECK_EVERY: Duration = Duration::from_millis(100);
/// Longest wait for a triggered snapshot to show up in the metrics before checking again.
const BUILD_WAIT_MAX: Duration = Duration::from_secs(300);

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
    log: LogBytes,
    state: StateMachineStore,
    policy: SnapshotPolicy,
    mut stopped: watch::Receiver<bool>,
) {
    let mut tick = tokio::time::interval(CHECK_EVERY);
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
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
        tracing::debug!(
            ?applied,
            ?snapshot_index,
            snapshot_bytes,
            log_bytes,
            "snapshot due"
        );
        if let Err(e) = raft.trigger().snapshot().await {
            tracing::warn!(error = %e, "raft stopped; no more snapshots");
            return;
        }
        // One at a time: the next check starts from the snapshot this one built.
        let wait = raft.wait(Some(BUILD_WAIT_MAX));
        let built = wait.metrics(|m| m.snapshot != snapshot, "snapshot built");
        tokio::select! {
            result = built => {
                if let Err(e) = result {
                    tracing::warn!(error = %e, "no snapshot built after the trigger");
                }
            }
            _ = stopped.wait_for(|stop| *stop) => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::SnapshotPolicy;

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
    fn huge_sizes_do_not_overflow() {
        let many = SnapshotPolicy {
            log_percent: u64::MAX,
            ..POLICY
        };
        assert!(!many.due(Some(1_100), Some(1_000), u64::MAX, u64::MAX));
        assert!(POLICY.due(Some(1_100), Some(1_000), u64::MAX, u64::MAX));
    }
}
