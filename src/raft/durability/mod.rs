//! The durability rule of the commit pipeline, in one place.
//!
//! **The rule.** An entry is visible (applied, answered, in a snapshot, counted as
//! committed by a follower) only once it is on this node's disk, although the leader tells
//! openraft otherwise. Three parts hold it together; whoever changes one must keep the
//! other two:
//!
//! 1. **Early report** ([`reports_early`], used by `raft::log_store`'s `append`): the
//!    leader's own new entries are reported to openraft as flushed at once, so it
//!    replicates them while its writer fsyncs them. openraft then counts the leader's copy
//!    towards a quorum before it is durable.
//! 2. **Commit clamp** ([`network::DurableNetwork`]): the commit index a leader sends a
//!    follower is never past the leader's [`DurableLog`] mark. Without it a follower could
//!    apply an entry the leader then lost in a crash, and keep an answer the fleet forgot.
//!    The same wrapper answers commit-only `AppendEntries` itself (openraft 0.9.25 sends
//!    one after every commit, to every follower) when it only repeats what the follower
//!    just accepted.
//! 3. **Apply wait** ([`wait_to_apply`], used by `raft::state_machine`): the state machine
//!    applies an entry only once the mark reached it, so no answer, snapshot or local read
//!    sees an entry the leader's disk does not hold.
//!
//! A restarted leader never resumes its old term (`raft::log_store`'s `read_vote`), since
//! the entries it reported early may be gone. A failed write fails the mark for good:
//! every wait after it fails, and nothing past the last durable entry is ever applied.

mod mark;
pub mod network;

pub(crate) use mark::DurableMark;
pub use mark::{DurableLog, NotDurable};

use crate::raft::{Entry, NodeId};

/// Part 1: whether `entries` appended under `vote` on node `node_id` are reported to
/// openraft before their fsync: only a committed vote of this node's own (it leads the
/// term) and only entries made under that leadership.
pub fn reports_early(
    vote: Option<openraft::Vote<NodeId>>,
    node_id: NodeId,
    entries: &[Entry],
) -> bool {
    vote.is_some_and(|vote| {
        vote.is_committed()
            && vote.leader_id().voted_for() == Some(node_id)
            && entries
                .iter()
                .all(|entry| entry.log_id.leader_id == *vote.leader_id())
    })
}

/// Part 3: waits until the last of `entries` is durable in this node's log (and so every
/// one before it), recording how long that took.
///
/// # Errors
/// When a log write failed first: those entries may never reach the disk.
pub async fn wait_to_apply(durable: &DurableLog, entries: &[Entry]) -> Result<(), NotDurable> {
    let Some(last) = entries.last() else {
        return Ok(());
    };
    let started = std::time::Instant::now();
    durable.wait_for(last.log_id.index).await?;
    metrics::histogram!("ankusa_apply_durable_wait_seconds")
        .record(started.elapsed().as_secs_f64());
    Ok(())
}

#[cfg(test)]
mod tests {
    use openraft::{CommittedLeaderId, EntryPayload, LogId, Vote};

    use super::*;

    fn entry(term: u64, leader: NodeId, index: u64) -> Entry {
        Entry {
            log_id: LogId::new(CommittedLeaderId::new(term, leader), index),
            payload: EntryPayload::Blank,
        }
    }

    /// Only the current leader's own entries are reported early: not a follower's copy,
    /// not under an uncommitted vote, not entries of an earlier term.
    #[test]
    fn only_the_leaders_own_entries_of_its_term_are_reported_early() {
        let leading = Some(Vote::new_committed(3, 1));
        assert!(reports_early(leading, 1, &[entry(3, 1, 7), entry(3, 1, 8)]));
        assert!(!reports_early(leading, 2, &[entry(3, 1, 7)]), "a follower");
        assert!(
            !reports_early(leading, 1, &[entry(2, 1, 6), entry(3, 1, 7)]),
            "an entry of an older term"
        );
        assert!(
            !reports_early(Some(Vote::new(3, 1)), 1, &[entry(3, 1, 7)]),
            "a candidate's vote"
        );
        assert!(!reports_early(None, 1, &[entry(3, 1, 7)]), "no vote");
    }

    /// Apply waits for the mark, and a failed write fails the wait.
    #[tokio::test]
    async fn apply_waits_for_the_mark_and_fails_with_it() {
        use futures::FutureExt;

        let mark = DurableMark::new(None);
        let durable = mark.reader();
        assert!(
            wait_to_apply(&durable, &[]).now_or_never().is_some(),
            "nothing to wait for"
        );
        let entries = [entry(1, 1, 1), entry(1, 1, 2)];
        let mut waiting = Box::pin(wait_to_apply(&durable, &entries));
        assert!(
            (&mut waiting).now_or_never().is_none(),
            "nothing is durable yet"
        );
        mark.set(Some(entries[0].log_id));
        assert!(
            (&mut waiting).now_or_never().is_none(),
            "only the first entry is"
        );
        mark.set(Some(entries[1].log_id));
        assert!(waiting.await.is_ok());

        let later = [entry(1, 1, 3)];
        let waiting = tokio::spawn({
            let durable = durable.clone();
            async move { wait_to_apply(&durable, &later).await }
        });
        mark.fail("disk gone");
        assert!(waiting.await.expect("the wait ends").is_err());
    }
}
