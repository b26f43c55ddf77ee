//! The durable mark: how far this node's log is fsynced, moved by the log writer and read
//! by everything that must not run ahead of it (see the rule in [`super`]).

use std::sync::Arc;

use tokio::sync::watch;

use crate::raft::LogId;

/// The writer's latest word on the log.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Mark {
    /// Every entry up to this log id is fsynced (`None`: the log is empty).
    Upto(Option<LogId>),
    /// A write failed: nothing after the last good mark will ever be durable.
    Failed(Arc<str>),
}

/// Moves the mark: held by the log store and its writer thread.
#[derive(Clone)]
pub(crate) struct DurableMark {
    sender: Arc<watch::Sender<Mark>>,
}

impl DurableMark {
    /// A mark at `last` (the log as it was found on disk).
    pub(crate) fn new(last: Option<LogId>) -> Self {
        let (sender, _) = watch::channel(Mark::Upto(last));
        Self {
            sender: Arc::new(sender),
        }
    }

    /// Everything up to `last` is durable now (after an append, or a truncation that cut
    /// the log back to `last`). A failed mark stays failed.
    pub(crate) fn set(&self, last: Option<LogId>) {
        self.sender.send_if_modified(|mark| match mark {
            Mark::Upto(current) if *current != last => {
                *current = last;
                true
            }
            _ => false,
        });
    }

    /// Moves the mark up to `last` if it is below `index` (the log was purged past it: a
    /// snapshot replaced what the log held). A failed mark stays failed.
    pub(crate) fn raise_to(&self, index: u64, last: Option<LogId>) {
        self.sender.send_if_modified(|mark| match mark {
            Mark::Upto(current) if current.is_none_or(|current| current.index < index) => {
                *current = last;
                true
            }
            _ => false,
        });
    }

    /// A write failed: every wait from now on fails with `reason`.
    pub(crate) fn fail(&self, reason: &str) {
        self.sender.send_replace(Mark::Failed(Arc::from(reason)));
    }

    /// A read side for the state machine and the peer traffic.
    pub(crate) fn reader(&self) -> DurableLog {
        DurableLog {
            mark: self.sender.subscribe(),
        }
    }
}

/// The log writer failed: what has not been made durable never will be.
#[derive(Clone, Debug, thiserror::Error)]
#[error("the raft log could not be made durable: {0}")]
pub struct NotDurable(Arc<str>);

/// The read side of the durable mark (cheap to clone).
#[derive(Clone, Debug)]
pub struct DurableLog {
    mark: watch::Receiver<Mark>,
}

impl DurableLog {
    /// The last log id known to be on disk, if any and if no write has failed.
    pub fn last(&self) -> Option<LogId> {
        match &*self.mark.borrow() {
            Mark::Upto(last) => *last,
            Mark::Failed(_) => None,
        }
    }

    /// Waits until the entry at `index` (and every one before it) is durable.
    ///
    /// # Errors
    /// When a write failed first: that entry may never reach the disk.
    pub async fn wait_for(&self, index: u64) -> Result<(), NotDurable> {
        let mut mark = self.mark.clone();
        let reached = mark
            .wait_for(|mark| match mark {
                Mark::Upto(last) => last.is_some_and(|last| last.index >= index),
                Mark::Failed(_) => true,
            })
            .await;
        match reached.as_deref() {
            Ok(Mark::Upto(_)) => Ok(()),
            Ok(Mark::Failed(reason)) => Err(NotDurable(Arc::clone(reason))),
            Err(_) => Err(NotDurable(Arc::from("the log writer is gone"))),
        }
    }

    /// The commit index a leader may tell its followers: `committed`, or the durable mark
    /// if that is at a lower index (the mark is always an id in this node's own log).
    pub fn clamp_commit(&self, committed: Option<LogId>) -> Option<LogId> {
        match (committed, self.last()) {
            (Some(committed), Some(durable)) if committed.index <= durable.index => Some(committed),
            (Some(_), durable) => durable,
            (None, _) => None,
        }
    }

    /// A mark that is always far enough, for tests of code that takes one but writes no log.
    #[cfg(test)]
    pub(crate) fn everything() -> Self {
        let last = LogId::new(openraft::CommittedLeaderId::new(u64::MAX, 0), u64::MAX);
        DurableMark::new(Some(last)).reader()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn log_id(term: u64, index: u64) -> LogId {
        LogId::new(openraft::CommittedLeaderId::new(term, 1), index)
    }

    #[test]
    fn the_commit_sent_is_capped_at_the_durable_mark_by_index() {
        let mark = DurableMark::new(Some(log_id(2, 5)));
        let durable = mark.reader();
        assert_eq!(durable.clamp_commit(Some(log_id(2, 4))), Some(log_id(2, 4)));
        assert_eq!(durable.clamp_commit(Some(log_id(2, 5))), Some(log_id(2, 5)));
        assert_eq!(durable.clamp_commit(Some(log_id(3, 7))), Some(log_id(2, 5)));
        assert_eq!(durable.clamp_commit(None), None);
        mark.fail("disk gone");
        assert_eq!(
            durable.clamp_commit(Some(log_id(2, 4))),
            None,
            "nothing after a failure"
        );
    }

    #[test]
    fn a_purge_past_the_mark_raises_it_and_a_purge_below_leaves_it() {
        let mark = DurableMark::new(Some(log_id(1, 3)));
        let durable = mark.reader();
        mark.raise_to(2, Some(log_id(1, 2)));
        assert_eq!(durable.last(), Some(log_id(1, 3)), "purged below the mark");
        mark.raise_to(10, Some(log_id(2, 10)));
        assert_eq!(durable.last(), Some(log_id(2, 10)), "purged past it");
    }

    #[tokio::test]
    async fn a_failed_write_fails_every_wait() {
        let mark = DurableMark::new(None);
        let durable = mark.reader();
        let waiting = tokio::spawn({
            let durable = durable.clone();
            async move { durable.wait_for(1).await }
        });
        mark.fail("disk gone");
        let result = waiting.await.expect("the wait ends");
        assert!(result.is_err(), "a wait after a failed write: {result:?}");
        mark.set(Some(log_id(1, 1)));
        assert!(
            durable.wait_for(1).await.is_err(),
            "a failed mark stays failed"
        );
    }
}
