//! Reconciliation (SPEC section 7): once a leader is reachable again, hand the fleet what
//! this node decided alone — its fallback claims, its queued settles, its local charges —
//! so the fleet's dedupe index and budgets account for them.
//!
//! Rules (also in docs/fallback.md):
//! 1. Claims first: each live pending fallback claim is proposed as a claim-only hit for
//!    its hook, with the time it has left. `Allowed` (the fleet had nothing, or already
//!    had it for this hook): forgotten locally. `Duplicate`/`Pending` for another hook: a
//!    conflict — the fleet's holder is kept, never overwritten; counted and logged.
//! 2. Then queued settles, oldest first: applied as ordinary settles (commit re-creates an
//!    absent claim; release of an absent claim is settled). A `Conflict` keeps the fleet's
//!    holder: counted, logged, and the settle is dropped from the queue.
//! 3. Then charges: one `Absorb` per bucket with the summed increments, capped at one burst
//!    window, so locally granted hits spend the fleet budget.
//!
//! A step that gets no answer stops the round; everything not yet applied stays queued for
//! the next round (also across a restart, for claims and settles).

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use super::{Node, NodeError};
use crate::fallback::wall_clock_us;
use crate::state::{Answer, ClaimRequest, Command, HitAnswer, SettleAnswer};

/// How often the reconciler looks for local decisions to hand over.
const ROUND_INTERVAL: Duration = Duration::from_millis(200);
/// How long one proposal of a round may take.
const PROPOSAL_TIMEOUT: Duration = Duration::from_secs(2);

/// Runs rounds until `stopped` turns true.
pub async fn run(node: Arc<Node>, mut stopped: watch::Receiver<bool>) {
    loop {
        tokio::select! {
            _ = tokio::time::sleep(ROUND_INTERVAL) => {}
            _ = stopped.wait_for(|stop| *stop) => return,
        }
        if node.status().leader_id.is_none() || !node.fallback().has_unreconciled() {
            continue;
        }
        match round(&node).await {
            Ok(()) => tracing::info!(
                node_id = node.id(),
                "local decisions reconciled with the fleet"
            ),
            Err(e) => tracing::debug!(error = %e, "reconciliation round stopped; retrying"),
        }
    }
}

/// One pass over claims, settles and charges.
///
/// # Errors
/// The first proposal the fleet did not answer; the rest waits for the next round.
pub async fn round(node: &Node) -> Result<(), NodeError> {
    claims(node).await?;
    settles(node).await?;
    charges(node).await
}

fn conflict(what: &'static str) {
    metrics::counter!("ankusa_reconcile_conflicts_total", "what" => what).increment(1);
}

async fn claims(node: &Node) -> Result<(), NodeError> {
    let now_us = wall_clock_us();
    for (key, record) in node.fallback().engine.pending_claims() {
        let claim = ClaimRequest {
            key: key.clone(),
            hook_id: record.hook_id.clone(),
            ttl_ms: record.ttl_ms,
            pending_ttl_ms: record
                .expires_at_us
                .saturating_sub(now_us)
                .div_ceil(1_000)
                .max(1),
        };
        let hit = Command::Hit {
            charges: Vec::new(),
            claim: Some(claim),
            node: node.id(),
        };
        let answer = node
            .propose_hit(hit, Instant::now() + PROPOSAL_TIMEOUT)
            .await?;
        if answer != HitAnswer::Allowed {
            conflict("claim");
            tracing::warn!(?key, local_hook_id = %record.hook_id, fleet = ?answer, "reconcile: the fleet holds this key for another hook; kept the fleet's");
        }
        node.fallback().engine.forget(&key, &record)?;
    }
    Ok(())
}

async fn settles(node: &Node) -> Result<(), NodeError> {
    for (seq, queued) in node.fallback().queue.all()? {
        let settle = Command::Settle {
            key: queued.key.clone(),
            hook_id: queued.hook_id.clone(),
            outcome: queued.outcome,
            ttl_ms: queued.ttl_ms,
            node: node.id(),
        };
        let answer = node
            .propose(settle, Instant::now() + PROPOSAL_TIMEOUT)
            .await?;
        if let Answer::Settle(SettleAnswer::Conflict { holder }) = &answer {
            conflict("settle");
            tracing::warn!(key = ?queued.key, hook_id = %queued.hook_id, holder = %holder, "reconcile: queued settle conflicts; kept the fleet's holder");
        }
        node.fallback().queue.remove(seq)?;
        node.fallback().engine.forget_any(&queued.key)?;
        metrics::counter!("ankusa_reconciled_total", "what" => "settle").increment(1);
    }
    Ok(())
}

async fn charges(node: &Node) -> Result<(), NodeError> {
    let charges = node.fallback().ledger.take();
    if charges.is_empty() {
        return Ok(());
    }
    let absorb = Command::Absorb {
        charges: charges.clone(),
    };
    if let Err(e) = node
        .propose(absorb, Instant::now() + PROPOSAL_TIMEOUT)
        .await
    {
        node.fallback().ledger.record(&charges);
        return Err(e);
    }
    Ok(())
}
