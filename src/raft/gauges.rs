//! The Raft gauges, set from openraft's metrics each time they change: term, leader,
//! indexes, membership size, on the leader how far each peer lags, and whether the Raft
//! core runs at all (docs/operations.md lists them).

use std::collections::{BTreeMap, BTreeSet};

use super::{MemberNode, NodeId};

/// openraft's metrics of one node.
pub type Metrics = openraft::RaftMetrics<NodeId, MemberNode>;

/// The index a majority of `voters` hold, given what each one matched: the commit index as
/// the leader counts it.
fn quorum_index(voters: &[NodeId], matched: &BTreeMap<NodeId, u64>) -> u64 {
    let mut held: Vec<u64> = voters
        .iter()
        .map(|voter| matched.get(voter).copied().unwrap_or(0))
        .collect();
    held.sort_unstable_by(|a, b| b.cmp(a));
    held.get(voters.len() / 2).copied().unwrap_or(0)
}

/// The gauges of one node; it remembers which peers' lag it exported, so a peer that is
/// gone, or a node that no longer leads, shows no stale lag.
#[derive(Default)]
pub struct Gauges {
    lag_of: BTreeSet<NodeId>,
}

impl Gauges {
    /// Sets every gauge from `metrics`, for node `node_id`. The commit index is the
    /// leader's count (what a majority of voters hold); a follower shows its applied index
    /// there, since openraft does not report a follower's commit index.
    pub fn export(&mut self, metrics: &Metrics, node_id: NodeId) {
        let lagging = export(metrics, node_id);
        for gone in self.lag_of.difference(&lagging) {
            metrics::gauge!("ankusa_raft_replication_lag_entries", "peer" => gone.to_string())
                .set(0.0);
        }
        self.lag_of = lagging;
    }
}

/// Why this node's Raft core no longer runs, if it does not: openraft puts the error that
/// ended it (`Stopped` for a shutdown) in `running_state`, and a core task that ended
/// without a word (a panic) drops the sender of its metrics.
pub fn core_stopped(metrics: &tokio::sync::watch::Receiver<Metrics>) -> Option<String> {
    if let Err(fatal) = &metrics.borrow().running_state {
        return Some(fatal.to_string());
    }
    metrics
        .has_changed()
        .is_err()
        .then(|| "the Raft core task ended".to_owned())
}

/// Sets `ankusa_raft_core_running`: 1 while the Raft core runs, 0 once it stopped.
pub fn export_core_running(running: bool) {
    metrics::gauge!("ankusa_raft_core_running").set(if running { 1.0 } else { 0.0 });
}

/// Sets the gauges; returns the peers whose lag it set.
fn export(metrics: &Metrics, node_id: NodeId) -> BTreeSet<NodeId> {
    let mut lagging = BTreeSet::new();
    let is_leader = metrics.current_leader == Some(node_id);
    let applied = metrics.last_applied.map_or(0, |log_id| log_id.index);
    let last_log = metrics.last_log_index.unwrap_or(0);
    let membership = metrics.membership_config.membership();
    let voters: Vec<NodeId> = membership.voter_ids().collect();
    let learners = membership.learner_ids().count();
    metrics::gauge!("ankusa_raft_term").set(metrics.current_term as f64);
    metrics::gauge!("ankusa_raft_leader_id").set(metrics.current_leader.unwrap_or(0) as f64);
    metrics::gauge!("ankusa_raft_is_leader").set(if is_leader { 1.0 } else { 0.0 });
    metrics::gauge!("ankusa_raft_applied_index").set(applied as f64);
    metrics::gauge!("ankusa_raft_last_log_index").set(last_log as f64);
    metrics::gauge!("ankusa_raft_voters").set(voters.len() as f64);
    metrics::gauge!("ankusa_raft_learners").set(learners as f64);
    let mut commit = applied;
    if let (true, Some(replication)) = (is_leader, &metrics.replication) {
        let mut matched: BTreeMap<NodeId, u64> = replication
            .iter()
            .map(|(peer, log_id)| (*peer, log_id.map_or(0, |log_id| log_id.index)))
            .collect();
        for (peer, index) in &matched {
            if *peer != node_id {
                metrics::gauge!("ankusa_raft_replication_lag_entries", "peer" => peer.to_string())
                    .set(last_log.saturating_sub(*index) as f64);
                lagging.insert(*peer);
            }
        }
        // The leader's own entry, when openraft lists it, is what it flushed.
        matched.entry(node_id).or_insert(last_log);
        commit = quorum_index(&voters, &matched).max(applied);
    }
    metrics::gauge!("ankusa_raft_commit_index").set(commit as f64);
    lagging
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The commit index is what a majority holds: with 3 voters the second highest, with 4
    /// the second highest too (3 of 4), and a voter nobody heard from holds nothing.
    /// A core that ended says why in `running_state`; one whose metrics sender is gone
    /// (its task ended without a word) is stopped too.
    #[test]
    fn a_core_is_stopped_when_openraft_says_so_or_its_metrics_end() {
        let (sender, receiver) = tokio::sync::watch::channel(Metrics::new_initial(1));
        assert_eq!(core_stopped(&receiver), None);
        let mut ended = Metrics::new_initial(1);
        ended.running_state = Err(openraft::error::Fatal::Panicked);
        sender.send(ended).expect("a receiver");
        assert!(core_stopped(&receiver).is_some_and(|why| why.contains("panicked")));
        let (sender, receiver) = tokio::sync::watch::channel(Metrics::new_initial(1));
        drop(sender);
        assert_eq!(
            core_stopped(&receiver).as_deref(),
            Some("the Raft core task ended")
        );
    }

    #[test]
    fn the_quorum_index_is_what_a_majority_holds() {
        let matched = BTreeMap::from([(1, 10), (2, 7), (3, 3)]);
        assert_eq!(quorum_index(&[1, 2, 3], &matched), 7);
        let four = BTreeMap::from([(1, 10), (2, 9), (3, 7), (4, 1)]);
        assert_eq!(quorum_index(&[1, 2, 3, 4], &four), 7);
        assert_eq!(quorum_index(&[1, 2, 3], &BTreeMap::from([(1, 5)])), 0);
        assert_eq!(quorum_index(&[1], &BTreeMap::from([(1, 5)])), 5);
    }
}
