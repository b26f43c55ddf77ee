//! Part 2 of the rule ([`super`]): a wrapper around a plain Raft transport that never tells
//! a follower a commit index past this node's durable mark, and answers commit-only
//! `AppendEntries` itself when they only repeat what the follower just accepted.
//!
//! openraft 0.9.25 follows every commit with an `AppendEntries` without entries that only
//! carries the new commit index: a frame each way and a wake-up on both nodes per entry per
//! follower. Such a request is answered `Success` here when the follower accepted, under
//! the same vote, the entries it starts after, less than `fresh` ago (at most half the
//! heartbeat interval): the answer only repeats what the follower said (it holds that log
//! id, durably, under that vote), and openraft moves nothing on a heartbeat's answer but
//! its clock. The request itself goes out `catch_up` later unless another `AppendEntries`
//! to that follower went first (under load: the next entry, which carries the commit
//! index), so a follower learns a commit a few milliseconds later at most. A follower's
//! applied state matters to its local fallback answers, not to its fleet answers, which
//! come from the leader.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use openraft::error::{InstallSnapshotError, RPCError, RaftError};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};

use super::DurableLog;
use crate::raft::{LogId, MemberNode, NodeId, TypeConfig};

/// The longest a commit-only `AppendEntries` may follow the follower's last acceptance and
/// still be answered here.
const COMMIT_ONLY_FRESH: Duration = Duration::from_millis(10);
/// How long a commit-only `AppendEntries` answered here waits for the next one that goes
/// out to the same follower before it is sent after all.
const COMMIT_ONLY_CATCH_UP: Duration = Duration::from_millis(2);

type RpcResult<Resp, E> = Result<Resp, RPCError<NodeId, MemberNode, RaftError<NodeId, E>>>;

/// When a commit-only `AppendEntries` is answered here.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct CommitOnly {
    fresh: Duration,
    catch_up: Duration,
}

/// A network factory whose connections keep the durability rule (see the module header).
#[derive(Clone)]
pub struct DurableNetwork<F> {
    inner: F,
    durable: DurableLog,
    commit_only: Option<CommitOnly>,
}

impl<F> DurableNetwork<F> {
    /// Wraps the plain transport `inner`; commits sent are clamped at `durable`.
    pub fn new(inner: F, durable: DurableLog) -> Self {
        Self {
            inner,
            durable,
            commit_only: None,
        }
    }

    /// Lets connections answer commit-only `AppendEntries` themselves; `heartbeat` is
    /// openraft's heartbeat interval (the follower still hears from the leader at least
    /// every half of it).
    pub fn answering_commit_only(mut self, heartbeat: Duration) -> Self {
        self.commit_only = Some(CommitOnly {
            fresh: COMMIT_ONLY_FRESH.min(heartbeat / 2),
            catch_up: COMMIT_ONLY_CATCH_UP,
        });
        self
    }
}

impl<F> RaftNetworkFactory<TypeConfig> for DurableNetwork<F>
where
    F: RaftNetworkFactory<TypeConfig>,
    F::Network: Clone,
{
    type Network = DurableConnection<F::Network>;

    async fn new_client(&mut self, target: NodeId, node: &MemberNode) -> Self::Network {
        DurableConnection {
            inner: self.inner.new_client(target, node).await,
            target,
            durable: self.durable.clone(),
            commit_only: self.commit_only,
            accepted: None,
            sends: Arc::default(),
        }
    }
}

/// An `AppendEntries` a follower accepted: under which vote, up to which log id, and when
/// it was sent.
#[derive(Clone, Copy, Debug)]
struct Accepted {
    vote: openraft::Vote<NodeId>,
    last: Option<LogId>,
    sent_at: Instant,
}

/// One follower's connection, keeping the rule around the plain one (`inner`).
pub struct DurableConnection<N> {
    inner: N,
    target: NodeId,
    durable: DurableLog,
    commit_only: Option<CommitOnly>,
    /// The last `AppendEntries` the follower accepted whole, if the one after it did not fail.
    accepted: Option<Accepted>,
    /// `AppendEntries` sent on this connection so far.
    sends: Arc<AtomicU64>,
}

impl<N> DurableConnection<N>
where
    N: RaftNetwork<TypeConfig> + Clone,
{
    /// Whether `rpc` (its commit already clamped) only repeats what the follower accepted
    /// within the fresh window.
    fn answerable_here(&self, rpc: &AppendEntriesRequest<TypeConfig>) -> Option<CommitOnly> {
        let (accepted, commit_only) = (self.accepted?, self.commit_only?);
        (rpc.entries.is_empty()
            && accepted.vote == rpc.vote
            && accepted.last == rpc.prev_log_id
            && accepted.sent_at.elapsed() < commit_only.fresh)
            .then_some(commit_only)
    }

    /// Sends `rpc` (a commit-only `AppendEntries` answered here) after `delay`, unless
    /// another `AppendEntries` went out to this follower meanwhile (it carried a commit index
    /// at least as new). So an idle leader's followers still learn its last commit within a
    /// few milliseconds. The answer is not awaited by openraft: the follower already
    /// accepted what this one confirms.
    fn catch_up_later(
        &self,
        rpc: AppendEntriesRequest<TypeConfig>,
        delay: Duration,
        option: RPCOption,
    ) {
        let sends = Arc::clone(&self.sends);
        let seen = sends.load(Ordering::Relaxed);
        let mut inner = self.inner.clone();
        let target = self.target;
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            if sends.load(Ordering::Relaxed) != seen {
                return;
            }
            metrics::counter!("ankusa_commit_only_appends_sent_late_total").increment(1);
            if let Err(e) = inner.append_entries(rpc, option).await {
                tracing::debug!(target, error = %e, "a late commit-only AppendEntries failed");
            }
        });
    }
}

impl<N> RaftNetwork<TypeConfig> for DurableConnection<N>
where
    N: RaftNetwork<TypeConfig> + Clone,
{
    async fn append_entries(
        &mut self,
        mut rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> RpcResult<AppendEntriesResponse<NodeId>, openraft::error::Infallible> {
        rpc.leader_commit = self.durable.clamp_commit(rpc.leader_commit);
        if let Some(commit_only) = self.answerable_here(&rpc) {
            metrics::counter!("ankusa_commit_only_appends_answered_here_total").increment(1);
            self.catch_up_later(rpc, commit_only.catch_up, RPCOption::new(option.hard_ttl()));
            return Ok(AppendEntriesResponse::Success);
        }
        self.sends.fetch_add(1, Ordering::Relaxed);
        let sent = Accepted {
            vote: rpc.vote,
            last: rpc
                .entries
                .last()
                .map(|entry| entry.log_id)
                .or(rpc.prev_log_id),
            sent_at: Instant::now(),
        };
        // Forgotten first: openraft drops this future when it times out.
        self.accepted = None;
        let response = self.inner.append_entries(rpc, option).await;
        self.accepted = match &response {
            Ok(AppendEntriesResponse::Success) => Some(sent),
            _ => None,
        };
        response
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> RpcResult<InstallSnapshotResponse<NodeId>, InstallSnapshotError> {
        self.inner.install_snapshot(rpc, option).await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> RpcResult<VoteResponse<NodeId>, openraft::error::Infallible> {
        self.inner.vote(rpc, option).await
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::sync::Mutex;

    use super::*;
    use crate::lock::lock;
    use crate::raft::durability::DurableMark;

    /// What a fake follower got: (prev index, entries, leader commit index) per request.
    type Got = Arc<Mutex<Vec<(u64, usize, Option<u64>)>>>;

    /// A plain transport to a follower that accepts every `AppendEntries`.
    #[derive(Clone, Default)]
    struct Follower {
        got: Got,
    }

    impl RaftNetwork<TypeConfig> for Follower {
        async fn append_entries(
            &mut self,
            rpc: AppendEntriesRequest<TypeConfig>,
            _option: RPCOption,
        ) -> RpcResult<AppendEntriesResponse<NodeId>, openraft::error::Infallible> {
            let prev = rpc.prev_log_id.map_or(0, |id| id.index);
            let commit = rpc.leader_commit.map(|id| id.index);
            lock(&self.got).push((prev, rpc.entries.len(), commit));
            Ok(AppendEntriesResponse::Success)
        }

        async fn install_snapshot(
            &mut self,
            _rpc: InstallSnapshotRequest<TypeConfig>,
            _option: RPCOption,
        ) -> RpcResult<InstallSnapshotResponse<NodeId>, InstallSnapshotError> {
            unreachable!("no snapshots in these tests")
        }

        async fn vote(
            &mut self,
            _rpc: VoteRequest<NodeId>,
            _option: RPCOption,
        ) -> RpcResult<VoteResponse<NodeId>, openraft::error::Infallible> {
            unreachable!("no votes in these tests")
        }
    }

    impl RaftNetworkFactory<TypeConfig> for Follower {
        type Network = Follower;

        async fn new_client(&mut self, _target: NodeId, _node: &MemberNode) -> Follower {
            self.clone()
        }
    }

    const DEADLINE: Duration = Duration::from_secs(10);

    fn log_id(term: u64, index: u64) -> LogId {
        openraft::LogId::new(openraft::CommittedLeaderId::new(term, 1), index)
    }

    /// An `AppendEntries` of leader 1 in `term`: `entries` (blank, by index) after `prev`,
    /// the commit at `prev`.
    pub(crate) fn append(
        term: u64,
        prev: u64,
        entries: &[u64],
    ) -> AppendEntriesRequest<TypeConfig> {
        AppendEntriesRequest {
            vote: openraft::Vote::new_committed(term, 1),
            prev_log_id: Some(log_id(term, prev)),
            entries: entries
                .iter()
                .map(|index| crate::raft::Entry {
                    log_id: log_id(term, *index),
                    payload: openraft::EntryPayload::Blank,
                })
                .collect(),
            leader_commit: Some(log_id(term, prev)),
        }
    }

    async fn append_ok<N>(peer: &mut DurableConnection<N>, term: u64, prev: u64, entries: &[u64])
    where
        N: RaftNetwork<TypeConfig> + Clone,
    {
        let response = peer
            .append_entries(append(term, prev, entries), RPCOption::new(DEADLINE))
            .await;
        assert!(
            matches!(response, Ok(AppendEntriesResponse::Success)),
            "{response:?}"
        );
    }

    /// A connection through `DurableNetwork` with these windows (`None`: never answers
    /// commit-only requests itself) and a mark that holds everything.
    async fn connect(
        follower: &Follower,
        commit_only: Option<(Duration, Duration)>,
    ) -> DurableConnection<Follower> {
        let mut network = DurableNetwork::new(follower.clone(), DurableLog::everything());
        network.commit_only = commit_only.map(|(fresh, catch_up)| CommitOnly { fresh, catch_up });
        network.new_client(2, &MemberNode::default()).await
    }

    /// Waits (with the test's deadline) until `done` holds; panics with `what` if it never does.
    async fn wait_until(what: &str, done: impl Fn() -> bool) {
        let deadline = tokio::time::Instant::now() + DEADLINE;
        while !done() {
            assert!(tokio::time::Instant::now() < deadline, "{what}");
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    #[test]
    fn the_fresh_window_is_ten_ms_and_never_more_than_half_a_heartbeat() {
        let network = DurableNetwork::new((), DurableLog::everything());
        assert_eq!(network.commit_only, None, "off unless asked");
        let windows = |heartbeat_ms| {
            let network = network
                .clone()
                .answering_commit_only(Duration::from_millis(heartbeat_ms));
            network.commit_only.map(|c| (c.fresh, c.catch_up))
        };
        assert_eq!(windows(50), Some((COMMIT_ONLY_FRESH, COMMIT_ONLY_CATCH_UP)));
        assert_eq!(
            windows(8).map(|(fresh, _)| fresh),
            Some(Duration::from_millis(4))
        );
    }

    /// The commit index a follower is told never passes the leader's durable mark, in
    /// requests with entries and in commit-only ones alike.
    #[tokio::test]
    async fn the_commit_sent_stops_at_the_durable_mark() {
        let follower = Follower::default();
        let mark = DurableMark::new(Some(log_id(1, 3)));
        let mut network = DurableNetwork::new(follower.clone(), mark.reader());
        let mut peer = network.new_client(2, &MemberNode::default()).await;
        let mut request = append(1, 5, &[6]);
        request.leader_commit = Some(log_id(1, 6));
        peer.append_entries(request, RPCOption::new(DEADLINE))
            .await
            .expect("sent");
        mark.set(Some(log_id(1, 6)));
        let mut request = append(1, 6, &[]);
        request.leader_commit = Some(log_id(1, 6));
        peer.append_entries(request, RPCOption::new(DEADLINE))
            .await
            .expect("sent");
        assert_eq!(
            *lock(&follower.got),
            vec![(5, 1, Some(3)), (6, 0, Some(6))],
            "capped at the mark, then up to it"
        );
    }

    /// A commit-only request right after the follower accepted the entries it starts
    /// after, under the same vote, is answered here and sent later only if no other went out
    /// meanwhile; anything else goes out at once.
    #[tokio::test]
    async fn a_commit_only_append_right_after_an_accepted_one_is_answered_here_and_sent_late() {
        let follower = Follower::default();
        let sent = || lock(&follower.got).len();
        // Here the window is long and the late send never comes; it is checked below.
        let mut peer = connect(&follower, Some((DEADLINE, DEADLINE * 10))).await;
        append_ok(&mut peer, 1, 4, &[5, 6]).await;
        assert_eq!(sent(), 1);
        append_ok(&mut peer, 1, 6, &[]).await;
        assert_eq!(
            sent(),
            1,
            "the commit-only append after entries up to 6 is answered here"
        );
        append_ok(&mut peer, 1, 5, &[]).await;
        assert_eq!(
            sent(),
            2,
            "one that does not match what the follower accepted goes out"
        );
        append_ok(&mut peer, 2, 5, &[]).await;
        assert_eq!(sent(), 3, "so does one under another vote");
        append_ok(&mut peer, 2, 5, &[]).await;
        assert_eq!(sent(), 3, "a repeat of the one just accepted does not");

        let mut peer = connect(&follower, Some((Duration::ZERO, DEADLINE * 10))).await;
        append_ok(&mut peer, 2, 5, &[6]).await;
        append_ok(&mut peer, 2, 6, &[]).await;
        assert_eq!(
            sent(),
            5,
            "once the last acceptance is older than the window, it goes out"
        );

        let mut peer = connect(&follower, None).await;
        append_ok(&mut peer, 2, 6, &[7]).await;
        append_ok(&mut peer, 2, 7, &[]).await;
        assert_eq!(
            sent(),
            7,
            "connections not told to answer them send every one"
        );

        let mut peer = connect(&follower, Some((DEADLINE, Duration::from_millis(1)))).await;
        append_ok(&mut peer, 2, 7, &[8]).await;
        append_ok(&mut peer, 2, 8, &[]).await;
        wait_until("the late send never came", || sent() >= 9).await;
        assert_eq!(
            sent(),
            9,
            "answered here, then sent once the catch-up delay passed"
        );
    }

    /// A commit-only request answered here is not sent late when another one went to that
    /// follower first: that one carried a commit index at least as new.
    #[tokio::test]
    async fn a_late_commit_only_append_is_dropped_when_another_went_first() {
        let follower = Follower::default();
        // A catch-up delay far longer than the test's next call takes even on a loaded
        // machine: the first late send must find that call already gone out.
        let mut peer = connect(&follower, Some((DEADLINE, Duration::from_secs(2)))).await;
        let sent = || lock(&follower.got).len();
        append_ok(&mut peer, 2, 8, &[9]).await;
        append_ok(&mut peer, 2, 9, &[]).await;
        assert_eq!(sent(), 1, "the commit-only append is answered here");
        append_ok(&mut peer, 2, 9, &[10]).await;
        assert_eq!(sent(), 2, "entries go out at once");
        // This one's late send is due after the first one's: once it arrived, the first
        // one's had its turn too.
        append_ok(&mut peer, 2, 10, &[]).await;
        let commit_only_after = |prev: u64| {
            lock(&follower.got)
                .iter()
                .any(|(p, entries, _)| *p == prev && *entries == 0)
        };
        wait_until("the second commit-only append was never sent late", || {
            commit_only_after(10)
        })
        .await;
        assert!(
            !commit_only_after(9),
            "the first commit-only append went out late although entries went first: {:?}",
            lock(&follower.got)
        );
    }
}
