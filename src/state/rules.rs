//! The fleet's rules as pure functions over [`FleetState`]: GCRA (contract §4), the
//! hit steps (§5), settle (§6), reset (§10) and expiry.
//!
//! Nothing here does IO, reads a clock or awaits: `now_us` always comes from the log entry
//! (or, for node-local state, from the caller). Every replica that applies the same entries
//! reaches the same state and the same answers.

use super::fleet::FleetState;
use super::model::{
    Answer, BucketKey, Charge, ClaimKey, ClaimRecord, ClaimRequest, ClaimState, Command, HitAnswer,
    HookId, Kind, NodeId, SettleAnswer, SettleOutcome, TenantId, US_PER_MS,
};

/// Applies one command at `now_us` (already advanced with [`FleetState::advance_clock`]).
pub fn apply(state: &mut FleetState, command: &Command, now_us: u64) -> Answer {
    match command {
        Command::Hit {
            charges,
            claim,
            node,
        } => Answer::Hit(hit(state, charges, claim.as_ref(), *node, now_us)),
        Command::ProbeCharges { charges } => {
            Answer::Hit(match evaluate_charges(state, charges, now_us) {
                Ok(_) => HitAnswer::Allowed,
                Err(retry_after_ms) => HitAnswer::RateLimited { retry_after_ms },
            })
        }
        Command::Settle {
            key,
            hook_id,
            outcome: SettleOutcome::Commit,
            ttl_ms,
            node,
        } => Answer::Settle(commit(state, key, hook_id, *ttl_ms, *node, now_us)),
        Command::Settle {
            key,
            hook_id,
            outcome: SettleOutcome::Release,
            ..
        } => Answer::Settle(release(state, key, hook_id)),
        Command::Reset { tenant } => {
            reset(state, tenant);
            Answer::Reset
        }
        Command::Absorb { charges } => {
            absorb(state, charges, now_us);
            Answer::Absorbed
        }
        Command::AbsorbRound {
            node,
            round,
            charges,
        } => {
            if *round > state.absorbed_round(*node) {
                absorb(state, charges, now_us);
                state.set_absorbed_round(*node, *round);
            }
            Answer::Absorbed
        }
        Command::ReconcileCommit {
            key,
            hook_id,
            ttl_ms,
            node,
        } => Answer::Settle(reconcile_commit(
            state, key, hook_id, *ttl_ms, *node, now_us,
        )),
    }
}

fn reconcile_commit(
    state: &mut FleetState,
    key: &ClaimKey,
    hook_id: &HookId,
    ttl_ms: u64,
    node: NodeId,
    now_us: u64,
) -> SettleAnswer {
    let pending_for_another = state
        .claim(key)
        .is_some_and(|record| record.state == ClaimState::Pending && record.hook_id != *hook_id);
    if pending_for_another {
        state.remove_claim(key);
    }
    commit(state, key, hook_id, ttl_ms, node, now_us)
}

fn absorb(state: &mut FleetState, charges: &[Charge], now_us: u64) {
    for charge in charges {
        let tat_us = state
            .bucket_tat_us(&charge.bucket)
            .unwrap_or(now_us)
            .max(now_us);
        let ceiling_us = now_us.saturating_add(charge.capacity_us);
        let new_tat_us = tat_us.saturating_add(charge.increment_us).min(ceiling_us);
        if new_tat_us > now_us {
            state.set_bucket(charge.bucket.clone(), new_tat_us);
        }
    }
}

/// Applies a whole entry: advances the clock once, then each command in order.
pub fn apply_batch(
    state: &mut FleetState,
    commands: &[Command],
    stamped_now_us: u64,
) -> Vec<Answer> {
    let now_us = state.advance_clock(stamped_now_us);
    commands
        .iter()
        .map(|command| apply(state, command, now_us))
        .collect()
}

/// GCRA for one charge against a TAT: `Ok(new_tat_us)` or `Err(retry_after_ms)`.
pub fn gcra(
    tat_us: Option<u64>,
    now_us: u64,
    increment_us: u64,
    capacity_us: u64,
) -> Result<u64, u64> {
    let new_tat_us = tat_us.unwrap_or(0).max(now_us).saturating_add(increment_us);
    let ahead_us = new_tat_us - now_us;
    if ahead_us <= capacity_us {
        Ok(new_tat_us)
    } else {
        Err(ceil_ms(ahead_us - capacity_us))
    }
}

/// Microseconds to whole milliseconds, rounded up, at least 1.
fn ceil_ms(duration_us: u64) -> u64 {
    duration_us.div_ceil(US_PER_MS).max(1)
}

/// Step 2 of a hit: every charge's new TAT, or the largest retry among the denied ones.
fn evaluate_charges(state: &FleetState, charges: &[Charge], now_us: u64) -> Result<Vec<u64>, u64> {
    let mut new_tats_us = Vec::with_capacity(charges.len());
    let mut retry_after_ms = None;
    for charge in charges {
        let tat_us = state.bucket_tat_us(&charge.bucket);
        match gcra(tat_us, now_us, charge.increment_us, charge.capacity_us) {
            Ok(new_tat_us) => new_tats_us.push(new_tat_us),
            Err(retry_ms) => retry_after_ms = Some(retry_after_ms.unwrap_or(0).max(retry_ms)),
        }
    }
    match retry_after_ms {
        Some(retry_ms) => Err(retry_ms),
        None => Ok(new_tats_us),
    }
}

fn hit(
    state: &mut FleetState,
    charges: &[Charge],
    claim: Option<&ClaimRequest>,
    node: NodeId,
    now_us: u64,
) -> HitAnswer {
    let new_tats_us = match evaluate_charges(state, charges, now_us) {
        Ok(new_tats_us) => new_tats_us,
        Err(retry_after_ms) => return HitAnswer::RateLimited { retry_after_ms },
    };
    if let Some(claim) = claim {
        if let Some(blocked) = claim_blocked(state, claim, now_us) {
            return blocked;
        }
    }
    for (charge, new_tat_us) in charges.iter().zip(new_tats_us) {
        state.set_bucket(charge.bucket.clone(), new_tat_us);
    }
    if let Some(claim) = claim {
        let record = ClaimRecord {
            hook_id: claim.hook_id.clone(),
            node,
            state: ClaimState::Pending,
            expires_at_us: now_us.saturating_add(claim.pending_ttl_ms.saturating_mul(US_PER_MS)),
            ttl_ms: claim.ttl_ms,
        };
        state.set_claim(claim.key.clone(), record);
    }
    HitAnswer::Allowed
}

/// Step 3 of a hit: `Some(answer)` when the claim stops the hit here, `None` to go on.
///
/// A retry of the same pending hook answers `Allowed` without charging or extending.
pub fn claim_blocked(state: &FleetState, claim: &ClaimRequest, now_us: u64) -> Option<HitAnswer> {
    let record = state.claim(&claim.key)?;
    Some(match record.state {
        ClaimState::Committed => HitAnswer::Duplicate {
            hook_id: record.hook_id.clone(),
        },
        ClaimState::Pending if record.hook_id != claim.hook_id => HitAnswer::Pending {
            retry_after_ms: ceil_ms(record.expires_at_us - now_us),
        },
        ClaimState::Pending => HitAnswer::Allowed,
    })
}

fn commit(
    state: &mut FleetState,
    key: &ClaimKey,
    hook_id: &HookId,
    settle_ttl_ms: u64,
    node: NodeId,
    now_us: u64,
) -> SettleAnswer {
    let Some(record) = state.claim(key).cloned() else {
        let record = ClaimRecord {
            hook_id: hook_id.clone(),
            node,
            state: ClaimState::Committed,
            expires_at_us: now_us.saturating_add(settle_ttl_ms.saturating_mul(US_PER_MS)),
            ttl_ms: settle_ttl_ms,
        };
        state.set_claim(key.clone(), record);
        return SettleAnswer::Recreated;
    };
    if record.hook_id != *hook_id {
        return SettleAnswer::Conflict {
            holder: record.hook_id,
        };
    }
    if record.state == ClaimState::Pending {
        let committed = ClaimRecord {
            state: ClaimState::Committed,
            expires_at_us: now_us.saturating_add(record.ttl_ms.saturating_mul(US_PER_MS)),
            ..record
        };
        state.set_claim(key.clone(), committed);
    }
    SettleAnswer::Settled
}

fn release(state: &mut FleetState, key: &ClaimKey, hook_id: &HookId) -> SettleAnswer {
    let Some(record) = state.claim(key) else {
        return SettleAnswer::Settled;
    };
    if record.hook_id != *hook_id || record.state == ClaimState::Committed {
        return SettleAnswer::Conflict {
            holder: record.hook_id.clone(),
        };
    }
    state.remove_claim(key);
    SettleAnswer::Settled
}

fn reset(state: &mut FleetState, tenant: &TenantId) {
    for kind in [Kind::Hooks, Kind::Bytes] {
        state.remove_bucket(&BucketKey::Tenant {
            kind,
            tenant: tenant.clone(),
        });
    }
}

#[cfg(test)]
mod tests;
