//! The node's own decisions, without Raft: node-local GCRA buckets (memory) and a claim
//! index (memory, and on disk in a [`journal`] written on every change). The same rules as the fleet
//! ([`crate::state::rules`]) run here on the node's own time ([`crate::clock::LocalTime`]: its
//! wall clock, bounded by its monotonic clock) instead of a log entry's stamp.
//!
//! Two engines use this: node scope (contract §8, journal `node-claims.journal`) and the
//! local fallback when the fleet does not answer in time (contract §7, journal
//! `fallback-claims.journal`, seeded from the fleet replica, plus the [`settle_queue::SettleQueue`] and
//! the [`ChargeLedger`] that reconciliation hands to the fleet later).
//!
//! Never proposes anything to the fleet itself.

pub mod journal;
mod ledger;
pub mod reconcile;
pub mod settle_queue;

pub use ledger::ChargeLedger;

use crate::clock::LocalTime;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};

use crate::codec;
use crate::lock::lock;
use crate::state::rules;
use crate::state::FleetState;
use crate::state::{
    Answer, Charge, ClaimKey, ClaimRecord, ClaimRequest, Command, HitAnswer, NodeId, StateImage,
};
use crate::storage::layout::{FALLBACK_JOURNAL, SETTLE_QUEUE_JOURNAL};

/// The local engine failed to read or write its claim index or settle queue.
#[derive(Debug, thiserror::Error)]
pub enum LocalError {
    /// The claim journals' and the settle queue's: they name their file.
    #[error(transparent)]
    Journal(#[from] journal::JournalError),
    /// Moving the settle queue a node of the previous version left in `state.sled`.
    #[error("settle queue of the previous version (sled tree `settle_queue` in the data dir's state.sled): {0}")]
    Sled(#[from] sled::Error),
    #[error(
        "settle queue of the previous version (sled tree `settle_queue` in the data dir's state.sled): sled panicked: {0}"
    )]
    QueuePanicked(String),
    #[error("settle queue of the previous version, syncing state.sled after moving it: {0}")]
    Sync(#[from] std::io::Error),
    #[error("settle queue of the previous version (sled tree `settle_queue` in the data dir's state.sled), record {seq}: {source}")]
    Record { seq: u64, source: codec::CodecError },
    /// The marker that the old queue was moved could not be read or written.
    #[error("settle queue marker {path}: {source}")]
    Marker {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
    /// The old queue's tree holds settles though the marker says they were moved.
    #[error(
        "settle queue: state.sled's sled tree `settle_queue` holds {settles} settles, though \
         {marker} says it was moved into the journal: a node of the previous version ran on \
         this data dir since (its QUEUED settles are there: delete {marker} to move them), \
         or sled brought a dropped tree back from a damaged file (replace the node); not \
         starting rather than choose"
    )]
    MovedTwice {
        settles: usize,
        marker: std::path::PathBuf,
    },
}

/// Node-local buckets (memory only) and claims (also on disk), in one rules state.
pub struct LocalEngine {
    node_id: NodeId,
    state: Mutex<FleetState>,
    journal: journal::ClaimJournal,
    /// What the engine decides by: the wall clock, bounded (`clock::LocalTime`).
    time: Arc<LocalTime>,
}

impl LocalEngine {
    /// Opens the claim journal at `path` and loads its claims live at `time`'s now.
    ///
    /// # Errors
    /// When the journal cannot be read or rewritten.
    pub fn open(path: &Path, node_id: NodeId, time: Arc<LocalTime>) -> Result<Self, LocalError> {
        let now_us = time.now_us();
        let (journal, claims) = journal::ClaimJournal::open(path, now_us)?;
        let image = StateImage {
            clock_us: now_us,
            claims,
            ..StateImage::default()
        };
        Ok(Self {
            node_id,
            state: Mutex::new(FleetState::from_image(image)),
            journal,
            time,
        })
    }

    /// The time the engine decides by now: its state's clock, moved to the local time
    /// (it never goes back).
    pub fn now_us(&self) -> u64 {
        self.now().1
    }

    /// Waits until every claim change so far is on disk (before answering a settle).
    ///
    /// # Errors
    /// When the journal failed to write.
    pub async fn sync(&self) -> Result<(), LocalError> {
        Ok(self.journal.sync().await?)
    }

    /// Locks the state and moves its clock to now; returns the guard and the time.
    fn now(&self) -> (MutexGuard<'_, FleetState>, u64) {
        // The rules never panic on validated input; if one did, the maps are still whole.
        let mut state = lock(&self.state);
        let now_us = state.advance_clock(self.time.now_us());
        (state, now_us)
    }

    /// A hit decided here: charges and claim together, atomically, in the the contract's order.
    ///
    /// # Errors
    /// When the claim index cannot be written (the answer would not survive a restart).
    pub fn hit(
        &self,
        charges: &[Charge],
        claim: Option<&ClaimRequest>,
    ) -> Result<HitAnswer, LocalError> {
        let command = Command::Hit {
            charges: charges.to_vec(),
            claim: claim.cloned(),
            node: self.node_id,
        };
        let (mut state, now_us) = self.now();
        let answer = hit_answer(rules::apply(&mut state, &command, now_us));
        if let Some(claim) = claim {
            self.persist(&state, &claim.key)?;
        }
        Ok(answer)
    }

    /// Gives back charges [`LocalEngine::hit`] spent for a hit that then did not happen.
    pub fn refund(&self, charges: &[Charge]) {
        if charges.is_empty() {
            return;
        }
        let (mut state, _) = self.now();
        for charge in charges {
            state.refund_bucket(&charge.bucket, charge.increment_us);
        }
    }

    /// Evaluates node-local charges without spending them.
    pub fn probe(&self, charges: &[Charge]) -> HitAnswer {
        let (mut state, now_us) = self.now();
        hit_answer(rules::apply(
            &mut state,
            &Command::ProbeCharges {
                charges: charges.to_vec(),
            },
            now_us,
        ))
    }

    /// What a claim would answer now without taking it; `None` when it is free.
    pub fn peek_claim(&self, claim: &ClaimRequest) -> Option<HitAnswer> {
        let (state, now_us) = self.now();
        rules::claim_blocked(&state, claim, now_us)
    }

    /// Settles (or, for any command, applies) `command` touching the claim `key`.
    ///
    /// # Errors
    /// When the claim index cannot be written.
    pub fn apply(&self, command: &Command, key: Option<&ClaimKey>) -> Result<Answer, LocalError> {
        let (mut state, now_us) = self.now();
        let answer = rules::apply(&mut state, command, now_us);
        if let Some(key) = key {
            self.persist(&state, key)?;
        }
        Ok(answer)
    }

    /// A fallback hit (contract §7): like [`LocalEngine::hit`], but buckets start from
    /// the replica's TAT where it is later than the local one, and a live replica claim
    /// decides first (committed: duplicate; pending for another hook: pending; pending for
    /// this hook, a retry the fleet already took, and nothing here: allowed, with nothing
    /// charged or extended, contract §5). Returns the answer and whether charges were
    /// spent (for the [`ChargeLedger`]).
    ///
    /// # Errors
    /// When the claim index cannot be written.
    pub fn hit_seeded(
        &self,
        charges: &[Charge],
        claim: Option<&ClaimRequest>,
        replica: &ReplicaView,
    ) -> Result<(HitAnswer, bool), LocalError> {
        let (mut state, now_us) = self.now();
        seed(&mut state, charges, replica);
        let probe = Command::ProbeCharges {
            charges: charges.to_vec(),
        };
        if let denied @ HitAnswer::RateLimited { .. } =
            hit_answer(rules::apply(&mut state, &probe, now_us))
        {
            return Ok((denied, false));
        }
        let here = claim.and_then(|c| rules::claim_blocked(&state, c, now_us));
        if let (Some(claim), Some(record)) = (claim, replica.claim.as_ref()) {
            if let Some(blocked) = replica_blocks(record, claim, now_us) {
                return Ok((blocked, false));
            }
            // The fleet holds it pending for this very hook; a record here (this node's own
            // commit, say) still decides below.
            if here.is_none() && record.expires_at_us > now_us {
                return Ok((HitAnswer::Allowed, false));
            }
        }
        let already_ours = here == Some(HitAnswer::Allowed);
        let command = Command::Hit {
            charges: charges.to_vec(),
            claim: claim.cloned(),
            node: self.node_id,
        };
        let answer = hit_answer(rules::apply(&mut state, &command, now_us));
        if let Some(claim) = claim {
            self.persist(&state, &claim.key)?;
        }
        let spent = answer == HitAnswer::Allowed && !already_ours && !charges.is_empty();
        Ok((answer, spent))
    }

    /// Evaluates charges like [`LocalEngine::hit_seeded`] does, without a claim and
    /// without spending them (the fleet part of a mixed-scope hit whose claim is taken).
    pub fn probe_seeded(&self, charges: &[Charge], replica: &ReplicaView) -> HitAnswer {
        let (mut state, now_us) = self.now();
        seed(&mut state, charges, replica);
        let probe = Command::ProbeCharges {
            charges: charges.to_vec(),
        };
        hit_answer(rules::apply(&mut state, &probe, now_us))
    }

    /// Live pending claims of this engine (what reconciliation hands to the fleet).
    pub fn pending_claims(&self) -> Vec<(ClaimKey, ClaimRecord)> {
        self.claims_in(crate::state::ClaimState::Pending)
    }

    /// Live committed claims of this engine (in the fallback: commits not yet reconciled).
    pub fn committed_claims(&self) -> Vec<(ClaimKey, ClaimRecord)> {
        self.claims_in(crate::state::ClaimState::Committed)
    }

    fn claims_in(&self, wanted: crate::state::ClaimState) -> Vec<(ClaimKey, ClaimRecord)> {
        let (state, _) = self.now();
        state
            .image()
            .claims
            .into_iter()
            .filter(|(_, record)| record.state == wanted)
            .collect()
    }

    /// Forgets a claim once the fleet holds it, unless it changed meanwhile.
    ///
    /// # Errors
    /// When the claim index cannot be written.
    pub fn forget(&self, key: &ClaimKey, seen: &ClaimRecord) -> Result<(), LocalError> {
        let (mut state, _) = self.now();
        if state.claim(key) == Some(seen) {
            state.remove_claim(key);
            self.persist(&state, key)?;
        }
        Ok(())
    }

    /// Forgets a claim whatever it holds (its settle reached the fleet).
    ///
    /// # Errors
    /// When the claim index cannot be written.
    pub fn forget_any(&self, key: &ClaimKey) -> Result<(), LocalError> {
        let (mut state, _) = self.now();
        state.remove_claim(key);
        self.persist(&state, key)
    }

    /// Journals the claim's current record (or its absence); compacts the journal when it
    /// grew enough (under the state lock, so the live set and the appends stay in order).
    fn persist(&self, state: &FleetState, key: &ClaimKey) -> Result<(), LocalError> {
        if self.journal.append(key, state.claim(key))? {
            self.journal.compact(state.live_claims())?;
        }
        Ok(())
    }
}

/// Everything the node decides alone while the fleet does not answer: the fallback engine,
/// the settle queue and the ledger of charges granted locally.
pub struct Fallback {
    pub engine: LocalEngine,
    pub queue: settle_queue::SettleQueue,
    pub ledger: ChargeLedger,
    pub budget: crate::config::FallbackBudget,
}

impl Fallback {
    /// Opens the fallback's claim journal and its settle queue in `data_dir` (moving a
    /// settle queue of the previous version out of `disk`).
    ///
    /// # Errors
    /// When the journal or sled fails, or a stored record does not decode.
    pub fn open(
        data_dir: &Path,
        disk: &crate::storage::sled_disk::SledDisk,
        node_id: NodeId,
        budget: crate::config::FallbackBudget,
        time: Arc<LocalTime>,
    ) -> Result<Self, LocalError> {
        let fallback = Self {
            engine: LocalEngine::open(&data_dir.join(FALLBACK_JOURNAL), node_id, time)?,
            queue: settle_queue::SettleQueue::open(&data_dir.join(SETTLE_QUEUE_JOURNAL), disk)?,
            ledger: ChargeLedger::default(),
            budget,
        };
        fallback.requeue_lost_commits()?;
        Ok(fallback)
    }

    /// Queues again every commit the fallback journal holds that the settle queue lost;
    /// returns how many.
    ///
    /// A settle queue that lost records (a torn last append dropped; before its journal,
    /// sled recovering a prefix of `state.sled` without a word) would break a promise
    /// (contract §6). A settle is answered `QUEUED` only once its commit is synced
    /// in the fallback journal as well as in the queue (`Node::queue_settle`), and the claim
    /// stays in the journal, committed, until reconciliation has applied it and forgets it;
    /// so a committed fallback claim with no commit of its hook in the queue is one the
    /// queue lost, or one a crash stopped before both writes were on disk or after the fleet
    /// applied it (which was not answered `QUEUED`, or was applied: applying it again
    /// commits the same hook again). A crash can also leave the queued settle without its
    /// journal record; it was not answered either, and reconciliation still applies it.
    /// Blocking (a sync): at start-up.
    ///
    /// # Errors
    /// When the queue's journal cannot write or sync.
    fn requeue_lost_commits(&self) -> Result<usize, LocalError> {
        let queued: std::collections::HashSet<(ClaimKey, crate::state::HookId)> = self
            .queue
            .all()
            .into_iter()
            .filter(|(_, settle)| settle.outcome == crate::state::SettleOutcome::Commit)
            .map(|(_, settle)| (settle.key, settle.hook_id))
            .collect();
        let lost: Vec<settle_queue::QueuedSettle> = self
            .engine
            .committed_claims()
            .into_iter()
            .filter(|(key, record)| !queued.contains(&(key.clone(), record.hook_id.clone())))
            .map(|(key, record)| settle_queue::QueuedSettle {
                key,
                hook_id: record.hook_id,
                outcome: crate::state::SettleOutcome::Commit,
                ttl_ms: record.ttl_ms,
            })
            .collect();
        if lost.is_empty() {
            return Ok(0);
        }
        for settle in &lost {
            tracing::warn!(key = ?settle.key, hook_id = ?settle.hook_id, "settle queue lost a queued commit the fallback journal holds; queued again");
        }
        self.queue.push_blocking(&lost)?;
        Ok(lost.len())
    }

    /// The charges a cut-off node applies: with [`FallbackBudget::FairShare`] each bucket's
    /// capacity is divided by the number of voters (never below one increment).
    ///
    /// [`FallbackBudget::FairShare`]: crate::config::FallbackBudget::FairShare
    pub fn local_charges(&self, charges: &[Charge], voters: usize) -> Vec<Charge> {
        let share = match self.budget {
            crate::config::FallbackBudget::Full => 1,
            crate::config::FallbackBudget::FairShare => voters.max(1) as u64,
        };
        charges
            .iter()
            .map(|charge| Charge {
                capacity_us: (charge.capacity_us / share).max(charge.increment_us),
                ..charge.clone()
            })
            .collect()
    }

    /// How many local decisions wait to be handed to the fleet: queued settles (the first
    /// number), and all of them (the second): those, claims allowed alone, and the buckets
    /// with charges the fallback granted.
    pub fn backlog(&self) -> (usize, usize) {
        let settles = self.queue.len();
        let others = self.ledger.len() + self.engine.pending_claims().len();
        (settles, settles + others)
    }

    /// True when local decisions still wait to be handed to the fleet.
    pub fn has_unreconciled(&self) -> bool {
        !self.queue.is_empty()
            || !self.ledger.is_empty()
            || !self.engine.pending_claims().is_empty()
    }
}

/// What this node's replica of the fleet knows about a fallback hit's buckets and claim.
#[derive(Clone, Debug, Default)]
pub struct ReplicaView {
    /// The fleet TAT of each charge's bucket, in the charges' order.
    pub tats_us: Vec<Option<u64>>,
    /// The fleet's record of the claim key, if any.
    pub claim: Option<ClaimRecord>,
}

/// Starts each charge's local bucket from the replica's TAT where that one is later.
fn seed(state: &mut FleetState, charges: &[Charge], replica: &ReplicaView) {
    for (charge, tat_us) in charges.iter().zip(&replica.tats_us) {
        if let Some(tat_us) = *tat_us {
            let behind = state
                .bucket_tat_us(&charge.bucket)
                .is_none_or(|local_us| local_us < tat_us);
            if behind {
                state.seed_bucket(charge.bucket.clone(), tat_us);
            }
        }
    }
}

/// A replica claim stops a fallback hit only when it is live on this node's clock:
/// committed (any hook) answers duplicate, pending for another hook answers pending.
fn replica_blocks(record: &ClaimRecord, claim: &ClaimRequest, now_us: u64) -> Option<HitAnswer> {
    if record.expires_at_us <= now_us {
        return None;
    }
    match record.state {
        crate::state::ClaimState::Committed => Some(HitAnswer::Duplicate {
            hook_id: record.hook_id.clone(),
        }),
        crate::state::ClaimState::Pending if record.hook_id != claim.hook_id => {
            Some(HitAnswer::Pending {
                retry_after_ms: (record.expires_at_us - now_us).div_ceil(1_000).max(1),
            })
        }
        crate::state::ClaimState::Pending => None,
    }
}

/// The rules answer a hit-shaped command with a hit answer.
fn hit_answer(answer: Answer) -> HitAnswer {
    match answer {
        Answer::Hit(answer) => answer,
        // A true invariant of `rules::apply`: Hit and ProbeCharges yield Answer::Hit.
        other => unreachable!("rules answered a hit with {other:?}"),
    }
}

#[cfg(test)]
pub(crate) mod tests;
