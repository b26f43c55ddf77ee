//! The local node: takes a validated request from the API, routes it to the fleet (the
//! proposal queue in [`propose`]) or to the node-local engine by scope (contract §8),
//! bounds it by its deadline, and says who decided the answer.
//!
//! It never names tonic or sled: the transport lives in `raft::network`/`api`, storage in
//! `raft::log_store`, `raft::state_machine` and `local`.

use std::sync::Arc;

use tokio::time::Instant;

use crate::clock::Clock;
use crate::planted::{Planted, PlantedBug};

mod backup;
mod error;
pub mod frame;
mod membership;
pub mod order;
pub mod propose;
pub mod request;
pub mod route;
pub mod router;
mod settle;
mod stamp;
mod turns;

use crate::local::{Fallback, LocalEngine, LocalError, ReplicaView};
use crate::raft::log_store::DurableLog;
use crate::raft::state_machine::{self, StateMachineStore};
use crate::raft::{MemberNode, NodeId, Raft};
use crate::state::{
    Answer, Charge, ClaimRequest, ClaimState, Command, EncodedCommand, HitAnswer, SettleAnswer,
};
pub use error::{FleetUnavailable, NodeError};
use propose::Proposer;
use request::{CheckRateInput, HitInput, ResetInput, Scope};
use route::Route;

/// Who decided an answer (contract §5, last paragraph).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DecidedBy {
    /// Committed through the Raft log.
    Fleet,
    /// Decided by this node alone, for the given reason (e.g. "node scope").
    Local { reason: String },
}

/// An answer with who decided it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decided<T> {
    pub answer: T,
    pub decided_by: DecidedBy,
}

impl<T> Decided<T> {
    fn fleet(answer: T) -> Self {
        Self {
            answer,
            decided_by: DecidedBy::Fleet,
        }
    }

    fn node_scope(answer: T) -> Self {
        Self {
            answer,
            decided_by: DecidedBy::Local {
                reason: "node scope".to_owned(),
            },
        }
    }
}

/// This node's view of the fleet (the `Status` call).
#[derive(Clone, Debug)]
pub struct NodeStatus {
    pub node_id: NodeId,
    pub leader_id: Option<NodeId>,
    pub term: u64,
    pub last_applied: u64,
    pub members: Vec<(NodeId, MemberNode, bool)>,
    /// Why this node's Raft core stopped, if it did (the node then drains and exits).
    pub raft_core_stopped: Option<String>,
    /// This node's wall-clock offset from a quorum's median, when known.
    pub clock_offset: Option<crate::raft::clock_view::Offset>,
    /// Whether that offset is past `max_clock_offset_ms` (the node does not lead).
    pub clock_skewed: bool,
    pub max_clock_offset_ms: u64,
}

/// The started parts a node is made of.
pub struct NodeParts {
    pub id: NodeId,
    pub raft: Raft,
    pub state: StateMachineStore,
    pub proposer: Proposer,
    /// Node scope (contract §8).
    pub local: LocalEngine,
    /// The local fallback (contract §7).
    pub fallback: Fallback,
    pub voters_max: usize,
    /// How far this node's Raft log is on disk (membership changes wait on it).
    pub durable: DurableLog,
    /// A known bug this node plays, for the nemesis's tests (`crate::planted`).
    pub planted_bug: Planted,
    /// What this node knows of its clock against its peers'.
    pub clock: crate::raft::clock_view::ClockView,
    /// The machine's clocks, the ones its local time reads: the wall clock of
    /// reconciliation's round numbers and of [`Node::bucket_ahead_us`].
    pub clocks: Arc<dyn Clock>,
}

/// One fleet node: Raft, the state machine replica, the proposal queue, the node-scope
/// engine and the local fallback.
pub struct Node {
    id: NodeId,
    raft: Raft,
    state: StateMachineStore,
    proposer: Proposer,
    local: LocalEngine,
    fallback: Fallback,
    voters_max: usize,
    durable: DurableLog,
    /// Held through one membership change, so changes never overlap.
    membership_changes: tokio::sync::Mutex<()>,
    /// Mixed-scope hits with a node claim take turns per key (`turns`).
    claim_turns: turns::KeyTurns,
    planted_bug: Planted,
    clock: crate::raft::clock_view::ClockView,
    clocks: Arc<dyn Clock>,
}

impl Node {
    /// Assembles a node from its started parts.
    pub fn new(parts: NodeParts) -> Self {
        Self {
            id: parts.id,
            raft: parts.raft,
            state: parts.state,
            proposer: parts.proposer,
            local: parts.local,
            fallback: parts.fallback,
            voters_max: parts.voters_max,
            durable: parts.durable,
            membership_changes: tokio::sync::Mutex::new(()),
            claim_turns: turns::KeyTurns::default(),
            planted_bug: parts.planted_bug,
            clock: parts.clock,
            clocks: parts.clocks,
        }
    }

    /// The node's Raft handle (for the peer service and shutdown).
    pub fn raft(&self) -> &Raft {
        &self.raft
    }

    /// The proposal queue (the peer service feeds forwarded batches into it).
    pub fn proposer(&self) -> &Proposer {
        &self.proposer
    }

    pub(crate) async fn propose(
        &self,
        command: Command,
        deadline: Instant,
    ) -> Result<Answer, NodeError> {
        self.propose_encoded(EncodedCommand::encode(&command)?, deadline)
            .await
    }

    /// As [`Node::propose`], for a command encoded already (from a value the caller keeps).
    async fn propose_encoded(
        &self,
        command: EncodedCommand,
        deadline: Instant,
    ) -> Result<Answer, NodeError> {
        Ok(self.proposer.propose(command, deadline).await?)
    }

    pub(crate) async fn propose_hit(
        &self,
        command: Command,
        deadline: Instant,
    ) -> Result<HitAnswer, NodeError> {
        self.propose_encoded_hit(EncodedCommand::encode(&command)?, deadline)
            .await
    }

    /// As [`Node::propose_hit`], for a command encoded already: a hit encoded from the
    /// caller's input (`EncodedCommand::hit`), which the fallback may still need.
    async fn propose_encoded_hit(
        &self,
        command: EncodedCommand,
        deadline: Instant,
    ) -> Result<HitAnswer, NodeError> {
        match self.proposer.propose(command, deadline).await? {
            Answer::Hit(answer) => Ok(answer),
            Answer::Refused(refusal) => Err(NodeError::Refused { refusal }),
            other => Err(mismatched(&other)),
        }
    }

    /// Contract §5, decided where [`route::route`] says.
    ///
    /// # Errors
    /// When the fleet could not answer in time, or the local claim index failed.
    pub async fn hit(&self, mut input: HitInput) -> Result<Decided<HitAnswer>, NodeError> {
        if self.planted_bug.is(PlantedBug::OneChargeOver) {
            Self::plant_one_charge_over(&mut input);
        }
        let decided = self.decide_hit(&input).await?;
        Ok(self.with_planted_bug(decided, input.claim.as_ref()))
    }

    /// The planted `OneChargeOver` bug: every charge gets room for one more increment (only
    /// ever with `fault_injection`; see `crate::planted`).
    fn plant_one_charge_over(input: &mut HitInput) {
        for charge in &mut input.charges {
            charge.capacity_us = charge.capacity_us.saturating_add(charge.increment_us);
        }
    }

    /// The planted `DuplicateForPending` bug: a pending answer becomes a duplicate naming
    /// the pending hook (only ever with `fault_injection`; see `crate::planted`).
    fn with_planted_bug(
        &self,
        decided: Decided<HitAnswer>,
        claim: Option<&ClaimRequest>,
    ) -> Decided<HitAnswer> {
        if !self.planted_bug.is(PlantedBug::DuplicateForPending) {
            return decided;
        }
        let (HitAnswer::Pending { .. }, Some(claim)) = (&decided.answer, claim) else {
            return decided;
        };
        let holder = self
            .state
            .lock()
            .state
            .claim(&claim.key)
            .map(|record| record.hook_id.clone());
        match holder {
            Some(hook_id) => Decided {
                answer: HitAnswer::Duplicate { hook_id },
                ..decided
            },
            None => decided,
        }
    }

    async fn decide_hit(&self, input: &HitInput) -> Result<Decided<HitAnswer>, NodeError> {
        let deadline = fleet_deadline(input.timeout, HIT_RESERVE_MAX);
        match route::route(input) {
            Route::NodeOnly => Ok(Decided::node_scope(
                self.local.hit(&input.charges, input.claim.as_ref())?,
            )),
            Route::FleetOnly => {
                let command = EncodedCommand::hit(&input.charges, input.claim.as_ref(), self.id)?;
                match self.propose_encoded_hit(command, deadline).await {
                    Err(e) if e.fleet_unavailable() => {
                        self.fallback_hit(&input.charges, input.claim.as_ref(), &e)
                    }
                    other => other.map(Decided::fleet),
                }
            }
            mixed @ Route::FleetChargesNodeClaim(claim) => {
                let (answer, fleet_missed) = self
                    .hit_fleet_charges_node_claim(&input.charges, claim, deadline)
                    .await?;
                Ok(mixed_decision(answer, &mixed, fleet_missed))
            }
            mixed @ Route::NodeChargesFleetClaim(claim) => {
                let (answer, fleet_missed) = self
                    .hit_node_charges_fleet_claim(&input.charges, claim, deadline)
                    .await?;
                Ok(mixed_decision(answer, &mixed, fleet_missed))
            }
        }
    }

    /// Fleet charges, node claim: charges are checked first (contract order), the claim is
    /// taken on this node only after the fleet spent the charges. Hits for the same key take
    /// turns through all of it, so two cannot both see the claim free and both spend
    /// (contract §5: one atomic decision); a turn not had by the deadline is not waited
    /// for, and the fleet part is then decided locally like any fleet that did not answer
    /// (the answer's second half says why).
    async fn hit_fleet_charges_node_claim(
        &self,
        charges: &[Charge],
        claim: &ClaimRequest,
        deadline: Instant,
    ) -> Result<(HitAnswer, Option<String>), NodeError> {
        let _turn = tokio::time::timeout_at(deadline, self.claim_turns.take(&claim.key))
            .await
            .ok();
        let blocked = self.local.peek_claim(claim);
        let command = match blocked {
            Some(_) => EncodedCommand::encode(&Command::ProbeCharges {
                charges: charges.to_vec(),
            })?,
            None => EncodedCommand::hit(charges, None, self.id)?,
        };
        let (charged, fleet_missed) = match self.propose_encoded_hit(command, deadline).await {
            Ok(answer) => (answer, None),
            Err(e) if e.fleet_unavailable() => {
                let reason = self.local_reason(&e);
                let answer = self.fallback_charges(charges, blocked.is_none())?;
                (answer, Some(reason))
            }
            Err(e) => return Err(e),
        };
        let answer = match (charged, blocked) {
            (HitAnswer::Allowed, Some(blocked)) => blocked,
            (HitAnswer::Allowed, None) => self.local.hit(&[], Some(claim))?,
            (denied, _) => denied,
        };
        Ok((answer, fleet_missed))
    }

    /// Node charges, fleet claim: the node charges are spent first (evaluated and spent in
    /// one step, so concurrent hits cannot both pass a bucket with room for one), then the
    /// claim is taken by the fleet (or by the local fallback when the fleet did not answer);
    /// a claim that is not `allowed` gives the charges back. A retry of a hook the fleet
    /// already holds pending for it (this node's replica says so) is not charged again
    /// (contract §5). The answer's second half says why the fleet part was decided
    /// locally, when it was.
    async fn hit_node_charges_fleet_claim(
        &self,
        charges: &[Charge],
        claim: &ClaimRequest,
        deadline: Instant,
    ) -> Result<(HitAnswer, Option<String>), NodeError> {
        let retry = self
            .state
            .lock()
            .state
            .claim(&claim.key)
            .is_some_and(|record| {
                record.state == ClaimState::Pending && record.hook_id == claim.hook_id
            });
        let charged = if retry {
            self.local.probe(charges)
        } else {
            self.local.hit(charges, None)?
        };
        if let denied @ HitAnswer::RateLimited { .. } = charged {
            return Ok((denied, None));
        }
        let spent: &[Charge] = if retry { &[] } else { charges };
        let take = EncodedCommand::hit(&[], Some(claim), self.id)?;
        let decided = match self.propose_encoded_hit(take, deadline).await {
            Ok(answer) => Ok((answer, None)),
            Err(e) if e.fleet_unavailable() => {
                self.fallback_hit(&[], Some(claim), &e)
                    .map(|local| match local.decided_by {
                        DecidedBy::Local { reason } => (local.answer, Some(reason)),
                        DecidedBy::Fleet => (local.answer, None),
                    })
            }
            Err(e) => Err(e),
        };
        // Given back unless the claim was taken, also when no answer came at all.
        if !matches!(&decided, Ok((answer, _)) if *answer == HitAnswer::Allowed) {
            self.local.refund(spent);
        }
        decided
    }

    /// Why the fleet did not answer `why`, for `local_reason`: a full queue says so with
    /// its retry hint, anything else by whether a leader is known.
    fn local_reason(&self, why: &NodeError) -> String {
        if let NodeError::Overloaded { .. } = why {
            return why.to_string();
        }
        match self.raft.metrics().borrow().current_leader {
            None => "no leader".to_owned(),
            Some(_) => "deadline".to_owned(),
        }
    }

    /// contract §7: the fleet did not answer in time, so this node decides from its
    /// replica and its own fallback index. Duplicate only for a claim known committed.
    fn fallback_hit(
        &self,
        charges: &[Charge],
        claim: Option<&ClaimRequest>,
        why: &NodeError,
    ) -> Result<Decided<HitAnswer>, NodeError> {
        let (replica, voters) = self.replica_view(charges, claim);
        let local_charges = self.fallback.local_charges(charges, voters);
        let (answer, spent) = self
            .fallback
            .engine
            .hit_seeded(&local_charges, claim, &replica)?;
        if spent {
            self.fallback.ledger.record(charges);
        }
        metrics::counter!("ankusa_fallback_answers_total", "call" => "hit").increment(1);
        let reason = self.local_reason(why);
        tracing::debug!(?answer, %reason, "hit answered locally");
        Ok(Decided {
            answer,
            decided_by: DecidedBy::Local { reason },
        })
    }

    /// The fleet-scoped charges of a mixed-scope hit, decided locally because the fleet
    /// did not answer: `spend = false` only evaluates them.
    fn fallback_charges(&self, charges: &[Charge], spend: bool) -> Result<HitAnswer, NodeError> {
        let (replica, voters) = self.replica_view(charges, None);
        let local_charges = self.fallback.local_charges(charges, voters);
        metrics::counter!("ankusa_fallback_answers_total", "call" => "hit").increment(1);
        if !spend {
            return Ok(self.fallback.engine.probe_seeded(&local_charges, &replica));
        }
        let (answer, spent) = self
            .fallback
            .engine
            .hit_seeded(&local_charges, None, &replica)?;
        if spent {
            self.fallback.ledger.record(charges);
        }
        Ok(answer)
    }

    /// What this node's replica knows about `charges` and `claim`, and the voter count.
    fn replica_view(
        &self,
        charges: &[Charge],
        claim: Option<&ClaimRequest>,
    ) -> (ReplicaView, usize) {
        let applied = self.state.lock();
        let view = ReplicaView {
            tats_us: charges
                .iter()
                .map(|c| applied.state.bucket_tat_us(&c.bucket))
                .collect(),
            claim: claim.and_then(|c| applied.state.claim(&c.key).cloned()),
        };
        (view, applied.membership.membership().voter_ids().count())
    }

    /// Waits until both local claim journals (node scope, fallback) are on disk.
    ///
    /// # Errors
    /// When a journal failed to write.
    pub async fn sync_local(&self) -> Result<(), LocalError> {
        self.local.sync().await?;
        self.fallback.engine.sync().await
    }

    /// The local fallback's state (for reconciliation and status).
    pub fn fallback(&self) -> &Fallback {
        &self.fallback
    }

    /// This node's id.
    pub fn id(&self) -> NodeId {
        self.id
    }

    /// contract §10: node-local buckets are cleared whatever the fleet does: node
    /// scope's, the fallback's, and the charges the fallback granted that wait to be handed
    /// to the fleet (they would charge the tenant again after the reset).
    ///
    /// # Errors
    /// When the fleet could not take it in time.
    pub async fn reset(&self, input: ResetInput) -> Result<(), NodeError> {
        let deadline = fleet_deadline(input.timeout, RESET_RESERVE_MAX);
        self.fallback.ledger.forget_tenant(&input.tenant);
        let command = Command::Reset {
            tenant: input.tenant,
        };
        self.local.apply(&command, None)?;
        self.fallback.engine.apply(&command, None)?;
        self.propose(command, deadline).await?;
        Ok(())
    }

    /// contract §11: one entity charge, allowed or denied.
    ///
    /// # Errors
    /// When the fleet could not answer in time.
    pub async fn check_rate(&self, input: CheckRateInput) -> Result<Decided<HitAnswer>, NodeError> {
        let deadline = fleet_deadline(input.timeout, HIT_RESERVE_MAX);
        let charges = vec![input.charge];
        match input.scope {
            Scope::Node => Ok(Decided::node_scope(self.local.hit(&charges, None)?)),
            Scope::Fleet => {
                let command = EncodedCommand::hit(&charges, None, self.id)?;
                match self.propose_encoded_hit(command, deadline).await {
                    Err(e) if e.fleet_unavailable() => self.fallback_hit(&charges, None, &e),
                    other => other.map(Decided::fleet),
                }
            }
        }
    }

    /// This node's view: leader, term, applied index and members.
    pub fn status(&self) -> NodeStatus {
        let receiver = self.raft.metrics();
        let raft_core_stopped = crate::raft::gauges::core_stopped(&receiver);
        let metrics = receiver.borrow().clone();
        NodeStatus {
            raft_core_stopped,
            node_id: self.id,
            leader_id: metrics.current_leader,
            term: metrics.current_term,
            last_applied: metrics.last_applied.map_or(0, |log_id| log_id.index),
            members: state_machine::members(&metrics.membership_config),
            clock_offset: self.clock.estimate(),
            clock_skewed: self.clock.skewed(),
            max_clock_offset_ms: self.clock.bound_us() / 1_000,
        }
    }

    /// The log index this node's replica has applied, and a digest of its state there
    /// (`FleetState::digest`): replicas at one index must have one digest.
    pub fn state_digest(&self) -> (u64, u64) {
        let applied = self.state.lock();
        let index = applied.last_applied.map_or(0, |log_id| log_id.index);
        (index, applied.state.digest())
    }

    /// How far a bucket's TAT is ahead of now on this node's replica (0: the bucket is
    /// full): what an Envoy answer reports as left and as the time until reset.
    pub fn bucket_ahead_us(&self, bucket: &crate::state::BucketKey) -> u64 {
        // A fleet bucket: the wall clock, off only while it is (the local time would keep a
        // clock wrong at start-up until a restart).
        let applied = self.state.lock();
        let now_us = self.clocks.wall_us().max(applied.state.clock_us());
        applied
            .state
            .bucket_tat_us(bucket)
            .map_or(0, |tat_us| tat_us.saturating_sub(now_us))
    }

    /// The fleet state replica, for reads that need no consensus (tests, status).
    pub fn replica(&self) -> &StateMachineStore {
        &self.state
    }
}

/// The most of a call's timeout kept for deciding alone once the fleet missed, so the
/// answer still comes within the timeout (contract §7, docs/decisions/023): a queued
/// settle fsyncs the claim journal and the settle queue; a hit or check_rate only
/// computes. At most an eighth of the timeout is kept, so a short timeout stays mostly the
/// fleet's.
const SETTLE_RESERVE_MAX: std::time::Duration = std::time::Duration::from_millis(25);
const HIT_RESERVE_MAX: std::time::Duration = std::time::Duration::from_millis(5);
/// A reset has no local answer, but the `UNAVAILABLE` it ends in when the fleet did not
/// take it is an answer too: waiting the whole timeout would leave nothing for the timer's
/// millisecond tick and the reply, so it keeps a hit's reserve.
const RESET_RESERVE_MAX: std::time::Duration = HIT_RESERVE_MAX;

/// When the fleet's part of a call must be done: its timeout from now, less the reserve
/// for a local answer (at most `reserve_max`, at most an eighth of the timeout).
fn fleet_deadline(timeout: std::time::Duration, reserve_max: std::time::Duration) -> Instant {
    Instant::now() + (timeout - local_reserve(timeout, reserve_max))
}

fn local_reserve(
    timeout: std::time::Duration,
    reserve_max: std::time::Duration,
) -> std::time::Duration {
    (timeout / 8).min(reserve_max)
}

/// A hit with one part in each scope is not a fleet-wide decision (contract §8): it says
/// `local`, its reason naming the node-scoped part, then why the fleet part was decided
/// locally too when it was (`fleet_missed`).
fn mixed_decision(
    answer: HitAnswer,
    route: &Route,
    fleet_missed: Option<String>,
) -> Decided<HitAnswer> {
    let node_part = route.node_part().unwrap_or("node scope");
    let reason = match fleet_missed {
        Some(missed) => format!("{node_part}; {missed}"),
        None => node_part.to_owned(),
    };
    Decided {
        answer,
        decided_by: DecidedBy::Local { reason },
    }
}

impl crate::local::reconcile::Fleet for Node {
    type Error = NodeError;

    fn node_id(&self) -> NodeId {
        self.id
    }

    fn leader_known(&self) -> bool {
        self.raft.metrics().borrow().current_leader.is_some()
    }

    fn fallback(&self) -> &Fallback {
        &self.fallback
    }

    fn absorbed_round(&self) -> u64 {
        self.state.lock().state.absorbed_round(self.id)
    }

    fn wall_clock_us(&self) -> u64 {
        self.clocks.wall_us()
    }

    async fn propose(&self, command: Command, deadline: Instant) -> Result<Answer, NodeError> {
        Node::propose(self, command, deadline).await
    }

    async fn propose_hit(
        &self,
        command: Command,
        deadline: Instant,
    ) -> Result<HitAnswer, NodeError> {
        Node::propose_hit(self, command, deadline).await
    }

    fn is_refusal(error: &NodeError) -> bool {
        matches!(error, NodeError::Refused { .. })
    }
}

fn settle_answer(answer: Answer) -> Result<SettleAnswer, NodeError> {
    match answer {
        Answer::Settle(answer) => Ok(answer),
        Answer::Refused(refusal) => Err(NodeError::Refused { refusal }),
        other => Err(mismatched(&other)),
    }
}

fn mismatched(answer: &Answer) -> NodeError {
    NodeError::Fatal {
        reason: format!("the state machine answered {answer:?} to another kind of command"),
    }
}

#[cfg(test)]
mod tests;
