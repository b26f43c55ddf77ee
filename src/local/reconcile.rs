//! Reconciliation (contract §7): once a leader is reachable again, hand the fleet what
//! this node decided alone — its fallback claims, its queued settles, its local charges —
//! so the fleet's dedupe index and budgets account for them.
//!
//! Rules (also in docs/fallback.md):
//! 1. Claims first: each live pending fallback claim is proposed as a claim-only hit for
//!    its hook, with the time it has left. `Allowed` (the fleet had nothing, or already
//!    had it for this hook): forgotten locally. `Duplicate`/`Pending` for another hook: a
//!    conflict — the fleet's holder is kept, never overwritten; counted and logged.
//! 2. Then queued settles, oldest first per key: a commit goes as `ReconcileCommit` (like a
//!    commit, but it wins over a claim another hook holds pending: this hook is stored,
//!    contract §7); a release is an ordinary release. A `Conflict` keeps the fleet's holder: counted, logged, and the
//!    settle leaves the queue.
//! 3. Then charges: one `Absorb` per bucket with the summed increments, capped at one burst
//!    window, so locally granted hits spend the fleet budget.
//!
//! Proposals of one step go out together (up to 256 at once) and share log entries.
//! A step that gets no answer stops the round; everything not yet applied stays queued for
//! the next round (also across a restart, for claims and settles).

use std::collections::HashSet;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use super::settle_queue::QueuedSettle;
use super::{Fallback, LocalError};
use crate::clock::wall_clock_us;
use crate::state::{Answer, ClaimRequest, Command, HitAnswer, NodeId, SettleAnswer, SettleOutcome};

/// What reconciliation needs of its node: who it is, whether it knows a leader, its
/// fallback state, and the way to the fleet (`node::Node` implements it).
pub trait Fleet: Send + Sync + 'static {
    /// Why a proposal did not get an answer.
    type Error: std::fmt::Display + From<LocalError> + Send;

    fn node_id(&self) -> NodeId;
    fn leader_known(&self) -> bool;
    fn fallback(&self) -> &Fallback;
    /// Commits `command` through the fleet by `deadline`.
    fn propose(
        &self,
        command: Command,
        deadline: Instant,
    ) -> impl Future<Output = Result<Answer, Self::Error>> + Send;
    /// As [`Fleet::propose`], for a hit-shaped command.
    fn propose_hit(
        &self,
        command: Command,
        deadline: Instant,
    ) -> impl Future<Output = Result<HitAnswer, Self::Error>> + Send;
}

/// How often the reconciler looks for local decisions to hand over.
const ROUND_INTERVAL: Duration = Duration::from_millis(200);
/// How long one proposal of a round may take.
const PROPOSAL_TIMEOUT: Duration = Duration::from_secs(2);

/// Runs rounds until `stopped` turns true.
pub async fn run<N: Fleet>(node: Arc<N>, mut stopped: watch::Receiver<bool>) {
    loop {
        tokio::select! {
            _ = tokio::time::sleep(ROUND_INTERVAL) => {}
            _ = stopped.wait_for(|stop| *stop) => return,
        }
        let (queued, backlog) = node.fallback().backlog();
        metrics::gauge!("ankusa_queued_settles").set(queued as f64);
        metrics::gauge!("ankusa_reconcile_backlog").set(backlog as f64);
        if !node.leader_known() || backlog == 0 {
            continue;
        }
        match round(node.as_ref()).await {
            Ok(()) => tracing::info!(
                node_id = node.node_id(),
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
pub async fn round<N: Fleet>(node: &N) -> Result<(), N::Error> {
    claims(node).await?;
    settles(node).await?;
    charges(node).await
}

fn conflict(what: &'static str) {
    metrics::counter!("ankusa_reconcile_conflicts_total", "what" => what).increment(1);
}

/// Most proposals of one round in flight at once (they share log entries).
const ROUND_PROPOSALS_MAX: usize = 256;

async fn claims<N: Fleet>(node: &N) -> Result<(), N::Error> {
    let now_us = wall_clock_us();
    let pending = node.fallback().engine.pending_claims();
    for chunk in pending.chunks(ROUND_PROPOSALS_MAX) {
        let deadline = Instant::now() + PROPOSAL_TIMEOUT;
        let proposals = chunk.iter().map(|(key, record)| {
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
                node: node.node_id(),
            };
            node.propose_hit(hit, deadline)
        });
        let answers = futures::future::join_all(proposals).await;
        for ((key, record), answer) in chunk.iter().zip(answers) {
            let answer = answer?;
            if answer != HitAnswer::Allowed {
                conflict("claim");
                tracing::warn!(?key, local_hook_id = %record.hook_id, fleet = ?answer, "reconcile: the fleet holds this key for another hook; kept the fleet's");
            }
            node.fallback().engine.forget(key, record)?;
        }
    }
    Ok(())
}

/// The command a queued settle becomes: a commit wins over a pending claim of another
/// hook (see [`Command::ReconcileCommit`]); a release is an ordinary release.
fn settle_command(queued: &QueuedSettle, node_id: u64) -> Command {
    match queued.outcome {
        SettleOutcome::Commit => Command::ReconcileCommit {
            key: queued.key.clone(),
            hook_id: queued.hook_id.clone(),
            ttl_ms: queued.ttl_ms,
            node: node_id,
        },
        SettleOutcome::Release => Command::Settle {
            key: queued.key.clone(),
            hook_id: queued.hook_id.clone(),
            outcome: SettleOutcome::Release,
            ttl_ms: queued.ttl_ms,
            node: node_id,
        },
    }
}

/// Queued settles in chunks that never hold one key twice, so settles of the same key stay
/// in their queue order while different keys share entries.
fn settle_chunks(queued: Vec<(u64, QueuedSettle)>) -> Vec<Vec<(u64, QueuedSettle)>> {
    let mut chunks: Vec<Vec<(u64, QueuedSettle)>> = Vec::new();
    let mut keys = HashSet::new();
    for item in queued {
        let full = chunks
            .last()
            .is_none_or(|chunk| chunk.len() >= ROUND_PROPOSALS_MAX);
        if full || !keys.insert(item.1.key.clone()) {
            keys.clear();
            keys.insert(item.1.key.clone());
            chunks.push(Vec::new());
        }
        if let Some(chunk) = chunks.last_mut() {
            chunk.push(item);
        }
    }
    chunks
}

async fn settles<N: Fleet>(node: &N) -> Result<(), N::Error> {
    for chunk in settle_chunks(node.fallback().queue.all()?) {
        let deadline = Instant::now() + PROPOSAL_TIMEOUT;
        let proposals = chunk
            .iter()
            .map(|(_, queued)| node.propose(settle_command(queued, node.node_id()), deadline));
        let answers = futures::future::join_all(proposals).await;
        for ((seq, queued), answer) in chunk.iter().zip(answers) {
            if let Answer::Settle(SettleAnswer::Conflict { holder }) = &answer? {
                conflict("settle");
                tracing::warn!(key = ?queued.key, hook_id = %queued.hook_id, holder = %holder, "reconcile: queued settle conflicts; kept the fleet's holder");
            }
            node.fallback().queue.remove(*seq)?;
            node.fallback().engine.forget_any(&queued.key)?;
            metrics::counter!("ankusa_reconciled_total", "what" => "settle").increment(1);
        }
    }
    Ok(())
}

async fn charges<N: Fleet>(node: &N) -> Result<(), N::Error> {
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
