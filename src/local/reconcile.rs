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
//! 3. Then charges: one numbered `AbsorbRound` with each bucket's summed increments,
//!    capped at one burst window, so locally granted hits spend the fleet budget. A round
//!    without an answer is sent again, unchanged; the fleet applies a node's round number
//!    once, so a round that committed although its answer was lost is not charged twice.
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
use crate::state::{Answer, ClaimRequest, Command, HitAnswer, NodeId, SettleAnswer, SettleOutcome};

/// What reconciliation needs of its node: who it is, whether it knows a leader, its
/// fallback state, and the way to the fleet (`node::Node` implements it).
pub trait Fleet: Send + Sync + 'static {
    /// Why a proposal did not get an answer.
    type Error: std::fmt::Display + From<LocalError> + Send;

    fn node_id(&self) -> NodeId;
    fn leader_known(&self) -> bool;
    fn fallback(&self) -> &Fallback;
    /// The last absorb round of this node's that its replica of the fleet state applied.
    fn absorbed_round(&self) -> u64;
    /// This node's wall clock, in microseconds since the Unix epoch: a new absorb round's
    /// number is at least this ([`super::ChargeLedger::next_round`]).
    fn wall_clock_us(&self) -> u64;
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
    /// True when `error` is the fleet refusing the command (a state limit, an invalid
    /// field): proposing it again would be refused again.
    fn is_refusal(_error: &Self::Error) -> bool {
        false
    }
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
    let now_us = node.fallback().engine.now_us();
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
            let answer = match answer {
                Err(e) if N::is_refusal(&e) => {
                    conflict("claim");
                    tracing::debug!(?key, local_hook_id = ?record.hook_id, error = %e, "reconcile: the fleet refused this claim; forgot the local one");
                    node.fallback().engine.forget(key, record)?;
                    continue;
                }
                other => other?,
            };
            if answer != HitAnswer::Allowed {
                conflict("claim");
                tracing::debug!(?key, local_hook_id = ?record.hook_id, fleet = ?answer, "reconcile: the fleet holds this key for another hook; kept the fleet's");
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
    for chunk in settle_chunks(node.fallback().queue.all()) {
        let deadline = Instant::now() + PROPOSAL_TIMEOUT;
        let proposals = chunk
            .iter()
            .map(|(_, queued)| node.propose(settle_command(queued, node.node_id()), deadline));
        let answers = futures::future::join_all(proposals).await;
        for ((seq, queued), answer) in chunk.iter().zip(answers) {
            match &answer? {
                Answer::Settle(SettleAnswer::Conflict { holder }) => {
                    conflict("settle");
                    tracing::debug!(key = ?queued.key, hook_id = ?queued.hook_id, holder = ?holder, "reconcile: queued settle conflicts; kept the fleet's holder");
                }
                Answer::Refused(refusal) => {
                    conflict("settle");
                    tracing::debug!(key = ?queued.key, hook_id = ?queued.hook_id, %refusal, "reconcile: the fleet refused a queued settle; dropped it");
                }
                _ => {}
            }
            node.fallback().queue.remove(*seq)?;
            node.fallback().engine.forget_any(&queued.key)?;
            metrics::counter!("ankusa_reconciled_total", "what" => "settle").increment(1);
        }
    }
    Ok(())
}

/// Step 3: one numbered round of the ledger's charges. A round that gets no answer stays
/// the ledger's round in flight and goes again, the same, next time: it may have committed
/// all the same, and the fleet applies a round number once.
async fn charges<N: Fleet>(node: &N) -> Result<(), N::Error> {
    let ledger = &node.fallback().ledger;
    let Some(round) = ledger.next_round(node.absorbed_round(), node.wall_clock_us()) else {
        return Ok(());
    };
    let absorb = Command::AbsorbRound {
        node: node.node_id(),
        round: round.round,
        charges: round.charges,
    };
    node.propose(absorb, Instant::now() + PROPOSAL_TIMEOUT)
        .await?;
    ledger.confirm(round.round);
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;
    use crate::clock::{Clock, LocalTime, ManualClock};
    use crate::state::{rules, BucketKey, Charge, FleetState, Kind, TenantId};

    const T0_US: u64 = 1_800_000_000_000_000;

    /// A fleet on a clock the test drives, whose first proposal may commit but lose its
    /// answer (the caller sees an error, as when the deadline passes after the entry was
    /// appended); later ones answer.
    struct DrivenFleet {
        lose_first: bool,
        clock: Arc<ManualClock>,
        fallback: Fallback,
        state: Mutex<FleetState>,
        /// The stamp each proposal was applied at, and the round each absorb carried.
        stamps: Mutex<Vec<u64>>,
        rounds: Mutex<Vec<u64>>,
        _dir: tempfile::TempDir,
    }

    #[derive(Debug)]
    struct Lost(String);

    impl std::fmt::Display for Lost {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(&self.0)
        }
    }

    impl From<LocalError> for Lost {
        fn from(e: LocalError) -> Self {
            Lost(e.to_string())
        }
    }

    impl DrivenFleet {
        fn new(lose_first: bool) -> Self {
            let dir = tempfile::tempdir().expect("tempdir");
            let disk =
                crate::storage::sled_disk::SledDisk::open(&dir.path().join("state.sled"), 1 << 20)
                    .expect("sled");
            let clock = Arc::new(ManualClock::new(T0_US));
            let time = Arc::new(LocalTime::new(clock.clone(), Duration::from_millis(500)));
            let fallback = Fallback::open(
                dir.path(),
                &disk,
                1,
                crate::config::FallbackBudget::Full,
                time,
            )
            .expect("fallback");
            Self {
                lose_first,
                clock,
                fallback,
                state: Mutex::default(),
                stamps: Mutex::default(),
                rounds: Mutex::default(),
                _dir: dir,
            }
        }

        fn apply(&self, command: Command) -> Result<Answer, Lost> {
            let now_us = self.clock.wall_us();
            if let Command::AbsorbRound { round, .. } = &command {
                crate::lock::lock(&self.rounds).push(*round);
            }
            let mut state = crate::lock::lock(&self.state);
            let answer = rules::apply_batch(&mut state, &[command], now_us).remove(0);
            let mut stamps = crate::lock::lock(&self.stamps);
            stamps.push(now_us);
            if self.lose_first && stamps.len() == 1 {
                return Err(Lost("the answer was lost after the commit".to_owned()));
            }
            Ok(answer)
        }
    }

    impl Fleet for DrivenFleet {
        type Error = Lost;

        fn node_id(&self) -> NodeId {
            1
        }

        fn leader_known(&self) -> bool {
            true
        }

        fn fallback(&self) -> &Fallback {
            &self.fallback
        }

        fn absorbed_round(&self) -> u64 {
            crate::lock::lock(&self.state).absorbed_round(1)
        }

        fn wall_clock_us(&self) -> u64 {
            self.clock.wall_us()
        }

        async fn propose(&self, command: Command, _deadline: Instant) -> Result<Answer, Lost> {
            self.apply(command)
        }

        async fn propose_hit(
            &self,
            command: Command,
            _deadline: Instant,
        ) -> Result<HitAnswer, Lost> {
            match self.apply(command)? {
                Answer::Hit(answer) => Ok(answer),
                other => Err(Lost(format!("{other:?} to a hit"))),
            }
        }
    }

    fn bucket() -> BucketKey {
        BucketKey::Tenant {
            kind: Kind::Hooks,
            tenant: TenantId::from("t"),
        }
    }

    /// A local grant of `increment_us` on [`bucket`].
    fn grant(fleet: &DrivenFleet, increment_us: u64) {
        fleet.fallback.ledger.record(&[Charge {
            bucket: bucket(),
            increment_us,
            capacity_us: 600_000_000,
        }]);
    }

    /// Contract §7: local charges are handed over once. The first round commits but its
    /// answer is lost; the next round sends the same round again, though the clock moved
    /// on, and the fleet does not charge it a second time.
    #[tokio::test]
    async fn a_round_whose_answer_was_lost_is_not_charged_twice() {
        let fleet = DrivenFleet::new(true);
        let increment_us = 10_000_000;
        grant(&fleet, increment_us);
        assert!(round(&fleet).await.is_err(), "the first answer is lost");
        assert!(
            !fleet.fallback.ledger.is_empty(),
            "the round waits to be answered"
        );
        fleet.clock.advance(Duration::from_secs(1));
        round(&fleet).await.expect("the second round is answered");
        assert!(fleet.fallback.ledger.is_empty());
        let stamps = crate::lock::lock(&fleet.stamps).clone();
        assert_eq!(stamps, [T0_US, T0_US + 1_000_000], "one proposal per round");
        assert_eq!(
            crate::lock::lock(&fleet.rounds).clone(),
            [T0_US, T0_US],
            "the same round, sent again"
        );
        assert_eq!(
            crate::lock::lock(&fleet.state).bucket_tat_us(&bucket()),
            Some(stamps[0] + increment_us),
            "charged once, at the first round"
        );
        assert_eq!(round(&fleet).await.map_err(|e| e.0), Ok(()));
        assert_eq!(
            crate::lock::lock(&fleet.stamps).len(),
            2,
            "nothing left to send"
        );
    }

    /// A new round is numbered by the wall clock when it is made (so a node that restarts
    /// with an empty ledger numbers its next round above the ones the fleet applied); a
    /// round sent again keeps its number; with the clock set back, a new round is still
    /// above the last.
    #[tokio::test]
    async fn a_new_round_is_numbered_by_the_driven_wall_clock_and_above_the_last() {
        let fleet = DrivenFleet::new(true);
        grant(&fleet, 1_000);
        assert!(round(&fleet).await.is_err(), "the first answer is lost");
        round(&fleet).await.expect("sent again, answered");
        fleet.clock.advance(Duration::from_secs(5));
        grant(&fleet, 1_000);
        round(&fleet).await.expect("a new round");
        fleet.clock.step_wall(-3_600_000_000);
        grant(&fleet, 1_000);
        round(&fleet)
            .await
            .expect("a round with the clock set back");
        assert_eq!(
            crate::lock::lock(&fleet.rounds).clone(),
            [T0_US, T0_US, T0_US + 5_000_000, T0_US + 5_000_001],
        );
        assert_eq!(fleet.absorbed_round(), T0_US + 5_000_001, "each absorbed");
    }

    /// The reconciler runs a round every `ROUND_INTERVAL` (tokio's paused time, driven by
    /// hand): nothing is sent before it passes, the waiting charges once it has.
    #[tokio::test(start_paused = true)]
    async fn a_round_runs_once_its_interval_passes() {
        let fleet = Arc::new(DrivenFleet::new(false));
        grant(&fleet, 1_000);
        let (stop, stopped) = watch::channel(false);
        let reconciler = tokio::spawn(run(fleet.clone(), stopped));
        tokio::task::yield_now().await; // the reconciler starts its first wait
        tokio::time::advance(ROUND_INTERVAL - Duration::from_millis(1)).await;
        tokio::task::yield_now().await;
        assert!(crate::lock::lock(&fleet.rounds).is_empty(), "not yet");
        tokio::time::advance(Duration::from_millis(1)).await;
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        assert_eq!(crate::lock::lock(&fleet.rounds).clone(), [T0_US]);
        assert!(fleet.fallback.ledger.is_empty(), "answered");
        stop.send(true).expect("the reconciler listens");
        reconciler.await.expect("stops");
    }
}
