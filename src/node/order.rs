//! The order batches leave in: the batcher makes batches in queue order, but each is
//! committed by a task of its own, so two batches in flight could reach the leader (or
//! openraft) in either order. A [`SubmitTurn`] chains them: a batch submits only once the batch
//! before it has (or has given up), so the effects of one stream's requests, which enter
//! the queue in request order, take place in that order (contract §14, `HitStream`).
//!
//! Only the first attempt keeps the order: a batch sent again after a change of leader may
//! take effect after the batches behind it.

use tokio::sync::oneshot;
use tokio::time::Instant;

/// One batch's place in the chain: what it waits for, and what the batch after it waits
/// for (dropped once this one is submitted, or when it gives up).
#[derive(Debug)]
pub struct SubmitTurn {
    after: Option<oneshot::Receiver<()>>,
    submitted: Option<oneshot::Sender<()>>,
}

/// Hands out the turns of one sequence of batches, in the order they are made.
#[derive(Debug, Default)]
pub struct SubmitOrder {
    last: Option<oneshot::Receiver<()>>,
}

impl SubmitOrder {
    /// The next batch's turn: after every turn handed out before it.
    pub fn take(&mut self) -> SubmitTurn {
        let (submitted, next) = oneshot::channel();
        SubmitTurn {
            after: self.last.replace(next),
            submitted: Some(submitted),
        }
    }
}

impl SubmitTurn {
    /// Waits until the batch before has been submitted, or `deadline` (a batch whose own
    /// caller has stopped waiting keeps no order).
    pub async fn wait(&mut self, deadline: Instant) {
        if let Some(after) = self.after.take() {
            let _ = tokio::time::timeout_at(deadline, after).await;
        }
    }

    /// What the submitter drops once the batch is on its way: the next batch may go then.
    /// `None` after the first attempt.
    pub fn submitted(&mut self) -> Option<oneshot::Sender<()>> {
        self.submitted.take()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn a_turn_goes_once_the_one_before_it_was_submitted_or_gave_up() {
        let mut turns = SubmitOrder::default();
        let mut first = turns.take();
        let mut second = turns.take();
        let mut third = turns.take();
        let far = Instant::now() + Duration::from_secs(60);
        first.wait(far).await;
        let waiting = tokio::spawn(async move {
            second.wait(far).await;
            second
        });
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished(), "the second waits for the first");
        drop(first.submitted());
        let mut second = waiting.await.expect("the second's turn came");
        // A batch that gives up (dropped before it submits) lets the next go too.
        drop(second.submitted());
        drop(second);
        third.wait(far).await;
    }

    #[tokio::test(start_paused = true)]
    async fn a_turn_waits_no_longer_than_its_deadline() {
        let mut turns = SubmitOrder::default();
        let _first = turns.take();
        let mut second = turns.take();
        let deadline = Instant::now() + Duration::from_millis(50);
        second.wait(deadline).await;
        assert!(Instant::now() >= deadline);
    }
}
