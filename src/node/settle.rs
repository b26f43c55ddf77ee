//! A settle through the node (contract §6): applied by the node-scope engine (its record
//! synced first) for node scope; otherwise to the fleet within its deadline or, when the
//! fleet does not take it in time, applied to the fallback index and written to the
//! settle queue before it is answered `QUEUED`.

use tokio::time::Instant;

use super::request::{Scope, SettleInput};
use super::{
    fleet_deadline, local_reserve, settle_answer, Decided, DecidedBy, Node, NodeError,
    SETTLE_RESERVE_MAX,
};
use crate::local::settle_queue::QueuedSettle;
use crate::planted::PlantedBug;
use crate::state::{Command, EncodedCommand, SettleAnswer};

impl Node {
    /// contract §6.
    ///
    /// # Errors
    /// When the fleet could not take it in time, or the local claim index failed.
    pub async fn settle(&self, input: SettleInput) -> Result<Decided<SettleAnswer>, NodeError> {
        let deadline = fleet_deadline(input.timeout, SETTLE_RESERVE_MAX);
        let command = Command::Settle {
            key: input.key.clone(),
            hook_id: input.hook_id.clone(),
            outcome: input.outcome,
            ttl_ms: input.ttl_ms,
            node: self.id,
        };
        let answer = match input.scope {
            Scope::Node => {
                let answer = self.local.apply(&command, Some(&input.key))?;
                // A settle is answered once its record is on disk (hits need not wait:
                // see `local::journal`).
                self.local.sync().await?;
                return settle_answer(answer).map(Decided::node_scope);
            }
            Scope::Fleet => match EncodedCommand::encode(&command) {
                Ok(encoded) => self.propose_encoded(encoded, deadline).await,
                Err(e) => Err(e.into()),
            },
        };
        match answer {
            Err(e) if e.fleet_unavailable() => self.queue_settle(&input, &command, &e).await,
            other => settle_answer(other?).map(Decided::fleet),
        }
    }

    /// A settle the fleet did not take in time: applied to the fallback index (so this node
    /// answers duplicate for its own commit), written to the on-disk queue, answered
    /// `Queued`; [`reconcile`](crate::local::reconcile) retries it until the fleet applies it.
    async fn queue_settle(
        &self,
        input: &SettleInput,
        command: &Command,
        why: &NodeError,
    ) -> Result<Decided<SettleAnswer>, NodeError> {
        self.fallback.engine.apply(command, Some(&input.key))?;
        let queued = QueuedSettle {
            key: input.key.clone(),
            hook_id: input.hook_id.clone(),
            outcome: input.outcome,
            ttl_ms: input.ttl_ms,
        };
        let push = async {
            if self.planted_bug.is(PlantedBug::ForgetQueuedSettle) {
                return Ok(());
            }
            self.fallback.queue.push(&queued).await
        };
        // The claim's new record and the queued settle are both on disk before `QUEUED`.
        // They are different journals, so their syncs run side by side: the answer, already
        // past the fleet's deadline, waits for the slower of the two rather than for one
        // after the other.
        let syncing = Instant::now();
        tokio::try_join!(self.fallback.engine.sync(), push)?;
        let synced = syncing.elapsed();
        metrics::histogram!("ankusa_settle_queue_sync_seconds").record(synced.as_secs_f64());
        let reserve = local_reserve(input.timeout, SETTLE_RESERVE_MAX);
        if synced > reserve {
            tracing::warn!(
                synced_ms = u64::try_from(synced.as_millis()).unwrap_or(u64::MAX),
                reserve_ms = u64::try_from(reserve.as_millis()).unwrap_or(u64::MAX),
                "a queued settle's syncs took longer than its local reserve: its answer may be late"
            );
        }
        metrics::counter!("ankusa_fallback_answers_total", "call" => "settle").increment(1);
        tracing::debug!(key = ?queued.key, "settle queued");
        Ok(Decided {
            answer: SettleAnswer::Queued,
            decided_by: DecidedBy::Local {
                reason: self.local_reason(why),
            },
        })
    }
}
