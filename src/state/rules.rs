//! The fleet's rules as pure functions over [`FleetState`]: GCRA (contract §4), the
//! hit steps (§5), settle (§6), reset (§10) and expiry, within the state limits the
//! leader stamped ([`StateLimits`]): a command that would create a claim or a bucket beyond
//! one is answered [`Refusal::Exhausted`] and writes nothing.
//!
//! Nothing here does IO, reads a clock or awaits: `now_us` always comes from the log entry
//! (or, for node-local state, from the caller). Every replica that applies the same entries
//! reaches the same state and the same answers.

use std::borrow::Cow;

use super::fleet::FleetState;
use super::model::{
    Answer, BucketKey, Charge, ClaimKey, ClaimRecord, ClaimRequest, ClaimState, Command, HitAnswer,
    HookId, Kind, NodeId, Refusal, SettleAnswer, SettleOutcome, StateLimit, StateLimits, TenantId,
    US_PER_MS,
};

/// Applies one command at `now_us` (already advanced with [`FleetState::advance_clock`]),
/// with no state limit (node-local state, tests).
pub fn apply(state: &mut FleetState, command: &Command, now_us: u64) -> Answer {
    apply_within(state, command, now_us, &StateLimits::UNLIMITED)
}

fn exhausted(limit: StateLimit) -> Answer {
    Answer::Refused(Refusal::Exhausted { limit })
}

/// Applies one command at `now_us` within `limits`.
pub fn apply_within(
    state: &mut FleetState,
    command: &Command,
    now_us: u64,
    limits: &StateLimits,
) -> Answer {
    match command {
        Command::Hit {
            charges,
            claim,
            node,
        } => match hit(state, charges, claim.as_ref(), *node, now_us, limits) {
            Ok(answer) => Answer::Hit(answer),
            Err(limit) => exhausted(limit),
        },
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
        } => match commit(state, key, hook_id, (*ttl_ms, *node, now_us), limits) {
            Ok(answer) => Answer::Settle(answer),
            Err(limit) => exhausted(limit),
        },
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
            absorb(state, charges, now_us, limits);
            Answer::Absorbed
        }
        Command::AbsorbRound {
            node,
            round,
            charges,
        } => {
            if *round > state.absorbed_round(*node) {
                absorb(state, charges, now_us, limits);
                state.set_absorbed_round(*node, *round);
            }
            Answer::Absorbed
        }
        Command::ReconcileCommit {
            key,
            hook_id,
            ttl_ms,
            node,
        } => match reconcile_commit(state, key, hook_id, (*ttl_ms, *node, now_us), limits) {
            Ok(answer) => Answer::Settle(answer),
            Err(limit) => exhausted(limit),
        },
    }
}

/// Room for one new claim of `key`'s tenant, or the limit it would pass.
fn room_for_claim(
    state: &FleetState,
    key: &ClaimKey,
    limits: &StateLimits,
) -> Result<(), StateLimit> {
    let (_, claims) = state.len();
    if claims as u64 >= limits.claims_max {
        return Err(StateLimit::ClaimsMax);
    }
    if state.tenant_claims(&key.tenant) >= limits.tenant_claims_max {
        return Err(StateLimit::TenantClaimsMax);
    }
    Ok(())
}

/// Room for `new`, the buckets a command would create (those not live now), or the limit
/// they would pass. A bucket is counted once (a hit never names a bucket twice).
fn room_for_new_buckets(
    state: &FleetState,
    new: &[&BucketKey],
    limits: &StateLimits,
) -> Result<(), StateLimit> {
    if new.is_empty() {
        return Ok(());
    }
    let (buckets, _) = state.len();
    if buckets as u64 + new.len() as u64 > limits.buckets_max {
        return Err(StateLimit::BucketsMax);
    }
    for bucket in new {
        let owner = bucket.owner();
        let same_owner = new.iter().filter(|other| other.owner() == owner).count() as u64;
        if state.owner_buckets(bucket) + same_owner > limits.tenant_buckets_max {
            return Err(StateLimit::TenantBucketsMax);
        }
    }
    Ok(())
}

/// A settle's `ttl_ms`, the node taking it and the entry's time.
type SettleAt = (u64, NodeId, u64);

fn reconcile_commit(
    state: &mut FleetState,
    key: &ClaimKey,
    hook_id: &HookId,
    at: SettleAt,
    limits: &StateLimits,
) -> Result<SettleAnswer, StateLimit> {
    let pending_for_another = state
        .claim(key)
        .is_some_and(|record| record.state == ClaimState::Pending && record.hook_id != *hook_id);
    if pending_for_another {
        state.remove_claim(key);
    }
    // The claim just removed leaves room for the one the commit writes.
    commit(state, key, hook_id, at, limits)
}

/// Charges each bucket without the capacity check (see [`Command::Absorb`]). A charge that
/// would create a bucket beyond `limits` is dropped: the state stays bounded, and the
/// fleet forgoes that part of a node's local grants.
fn absorb(state: &mut FleetState, charges: &[Charge], now_us: u64, limits: &StateLimits) {
    for charge in charges {
        let hash = state.bucket_hash(&charge.bucket);
        let live_tat_us = state.bucket_tat_us_hashed(hash, &charge.bucket);
        if live_tat_us.is_none() && room_for_new_buckets(state, &[&charge.bucket], limits).is_err()
        {
            continue;
        }
        let tat_us = live_tat_us.unwrap_or(now_us).max(now_us);
        let ceiling_us = now_us.saturating_add(charge.capacity_us);
        let new_tat_us = tat_us.saturating_add(charge.increment_us).min(ceiling_us);
        if new_tat_us > now_us {
            state.set_bucket_hashed(hash, Cow::Borrowed(&charge.bucket), new_tat_us);
        }
    }
}

/// Applies a whole entry with no state limit (node-local state, tests): advances the
/// clock once, then each command in order.
pub fn apply_batch(
    state: &mut FleetState,
    commands: &[Command],
    stamped_now_us: u64,
) -> Vec<Answer> {
    apply_batch_within(state, commands, stamped_now_us, &StateLimits::UNLIMITED)
}

/// Applies a whole entry within the limits its leader stamped: advances the clock once
/// (dropping what expired, so the counts the limits are held to are of live items), then
/// each command in order.
pub fn apply_batch_within(
    state: &mut FleetState,
    commands: &[Command],
    stamped_now_us: u64,
    limits: &StateLimits,
) -> Vec<Answer> {
    let now_us = state.advance_clock(stamped_now_us);
    commands
        .iter()
        .map(|command| apply_within(state, command, now_us, limits))
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

/// One charge that passed: its bucket's hash (so the write hashes the key no more), whether
/// the bucket is live now, and its new TAT.
struct Priced {
    hash: u64,
    live: bool,
    new_tat_us: u64,
}

/// Step 2 of a hit: every charge priced, or the largest retry among the denied ones.
fn evaluate_charges(
    state: &FleetState,
    charges: &[Charge],
    now_us: u64,
) -> Result<Vec<Priced>, u64> {
    let mut priced = Vec::with_capacity(charges.len());
    let mut retry_after_ms = None;
    for charge in charges {
        let hash = state.bucket_hash(&charge.bucket);
        let tat_us = state.bucket_tat_us_hashed(hash, &charge.bucket);
        match gcra(tat_us, now_us, charge.increment_us, charge.capacity_us) {
            Ok(new_tat_us) => priced.push(Priced {
                hash,
                live: tat_us.is_some(),
                new_tat_us,
            }),
            Err(retry_ms) => retry_after_ms = Some(retry_after_ms.unwrap_or(0).max(retry_ms)),
        }
    }
    match retry_after_ms {
        Some(retry_ms) => Err(retry_ms),
        None => Ok(priced),
    }
}

/// A hit: its charges, then its claim, then room for what it would create, then the
/// writes. Refused for room, it writes nothing (none of its charges is spent).
fn hit(
    state: &mut FleetState,
    charges: &[Charge],
    claim: Option<&ClaimRequest>,
    node: NodeId,
    now_us: u64,
    limits: &StateLimits,
) -> Result<HitAnswer, StateLimit> {
    let priced = match evaluate_charges(state, charges, now_us) {
        Ok(priced) => priced,
        Err(retry_after_ms) => return Ok(HitAnswer::RateLimited { retry_after_ms }),
    };
    // The claim's key is hashed once, for its lookup and its write.
    let claim = claim.map(|claim| (claim, state.claim_hash(&claim.key)));
    if let Some((claim, hash)) = claim {
        if let Some(blocked) = blocked_by(state.claim_hashed(hash, &claim.key), claim, now_us) {
            return Ok(blocked);
        }
        room_for_claim(state, &claim.key, limits)?;
    }
    // Every charge passed, so `priced` lines up with `charges`.
    let new: Vec<&BucketKey> = charges
        .iter()
        .zip(&priced)
        .filter(|(_, priced)| !priced.live)
        .map(|(charge, _)| &charge.bucket)
        .collect();
    room_for_new_buckets(state, &new, limits)?;
    for (charge, priced) in charges.iter().zip(priced) {
        state.set_bucket_hashed(
            priced.hash,
            Cow::Borrowed(&charge.bucket),
            priced.new_tat_us,
        );
    }
    if let Some((claim, hash)) = claim {
        let record = ClaimRecord {
            hook_id: claim.hook_id.clone(),
            node,
            state: ClaimState::Pending,
            expires_at_us: now_us.saturating_add(claim.pending_ttl_ms.saturating_mul(US_PER_MS)),
            ttl_ms: claim.ttl_ms,
        };
        state.set_claim_hashed(hash, Cow::Borrowed(&claim.key), record);
    }
    Ok(HitAnswer::Allowed)
}

/// Whether `claim` would stop a hit on `state` now, and with what answer (the local
/// fallback asks before it decides a hit itself), as step 3 of a hit answers.
pub fn claim_blocked(state: &FleetState, claim: &ClaimRequest, now_us: u64) -> Option<HitAnswer> {
    blocked_by(state.claim(&claim.key), claim, now_us)
}

/// Step 3 of a hit, given the live claim of its key (`record`): `Some(answer)` when the
/// claim stops the hit here, `None` to go on.
///
/// A retry of the same pending hook answers `Allowed` without charging or extending.
fn blocked_by(
    record: Option<&ClaimRecord>,
    claim: &ClaimRequest,
    now_us: u64,
) -> Option<HitAnswer> {
    let record = record?;
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

/// A settle's commit; one that recreates an absent claim needs room for it like a hit.
fn commit(
    state: &mut FleetState,
    key: &ClaimKey,
    hook_id: &HookId,
    (settle_ttl_ms, node, now_us): SettleAt,
    limits: &StateLimits,
) -> Result<SettleAnswer, StateLimit> {
    let Some(record) = state.claim(key).cloned() else {
        room_for_claim(state, key, limits)?;
        let record = ClaimRecord {
            hook_id: hook_id.clone(),
            node,
            state: ClaimState::Committed,
            expires_at_us: now_us.saturating_add(settle_ttl_ms.saturating_mul(US_PER_MS)),
            ttl_ms: settle_ttl_ms,
        };
        state.set_claim(Cow::Borrowed(key), record);
        return Ok(SettleAnswer::Recreated);
    };
    if record.hook_id != *hook_id {
        return Ok(SettleAnswer::Conflict {
            holder: record.hook_id,
        });
    }
    if record.state == ClaimState::Pending {
        let committed = ClaimRecord {
            state: ClaimState::Committed,
            expires_at_us: now_us.saturating_add(record.ttl_ms.saturating_mul(US_PER_MS)),
            ..record
        };
        state.set_claim(Cow::Borrowed(key), committed);
    }
    Ok(SettleAnswer::Settled)
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
