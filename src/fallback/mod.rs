//! The node's own decisions, without Raft: node-local GCRA buckets (memory) and the node's
//! own claim index (sled, written through on every change). Used for `SCOPE_NODE`
//! requests (SPEC section 8); the same rules as the fleet ([`crate::state::rules`]) run
//! here on the node's wall clock instead of a log entry's stamp.
//!
//! Never proposes anything to the fleet and never reads the fleet's replica.

use std::sync::{Mutex, MutexGuard};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::codec;
use crate::state::rules::{self, FleetState};
use crate::state::{
    Answer, Charge, ClaimKey, ClaimRecord, ClaimRequest, Command, HitAnswer, NodeId, StateImage,
};

/// The sled tree of node-scope claims.
const CLAIM_TREE: &str = "node_claims";

/// The local engine failed to read or write its claim index.
#[derive(Debug, thiserror::Error)]
pub enum LocalError {
    #[error("node claim index: {0}")]
    Sled(#[from] sled::Error),
    #[error("node claim index record: {0}")]
    Codec(#[from] codec::CodecError),
}

/// Microseconds since the Unix epoch on this node's wall clock.
pub fn wall_clock_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// Node-local buckets (memory only) and claims (also on disk), in one rules state.
pub struct LocalEngine {
    node_id: NodeId,
    state: Mutex<FleetState>,
    claim_tree: sled::Tree,
}

impl LocalEngine {
    /// Opens the claim index in `db` and loads its live claims.
    ///
    /// # Errors
    /// When sled fails or a stored claim does not decode.
    pub fn open(db: &sled::Db, node_id: NodeId) -> Result<Self, LocalError> {
        let claim_tree = db.open_tree(CLAIM_TREE)?;
        let now_us = wall_clock_us();
        let mut image = StateImage {
            clock_us: now_us,
            ..StateImage::default()
        };
        for item in claim_tree.iter() {
            let (key_bytes, record_bytes) = item?;
            let record: ClaimRecord = codec::decode(&record_bytes)?;
            if record.expires_at_us > now_us {
                image.claims.push((codec::decode(&key_bytes)?, record));
            } else {
                claim_tree.remove(key_bytes)?;
            }
        }
        Ok(Self {
            node_id,
            state: Mutex::new(FleetState::from_image(image)),
            claim_tree,
        })
    }

    /// Locks the state and moves its clock to now; returns the guard and the time.
    fn now(&self) -> (MutexGuard<'_, FleetState>, u64) {
        // The rules never panic on validated input; if one did, the maps are still whole.
        let mut state = match self.state.lock() {
            Ok(guard) => guard,
            Err(poisoned) => poisoned.into_inner(),
        };
        let now_us = state.advance_clock(wall_clock_us());
        (state, now_us)
    }

    /// A hit decided here: charges and claim together, atomically, in the SPEC's order.
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

    /// Writes the claim's current record (or its absence) through to sled.
    fn persist(&self, state: &FleetState, key: &ClaimKey) -> Result<(), LocalError> {
        let key_bytes = codec::encode(key)?;
        match state.claim(key) {
            Some(record) => self.claim_tree.insert(key_bytes, codec::encode(record)?)?,
            None => self.claim_tree.remove(key_bytes)?,
        };
        Ok(())
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
