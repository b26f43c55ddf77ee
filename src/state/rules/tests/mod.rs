//! Tests of the pure rules against contract §2–6, 10 and 11: one unit test per case,
//! then property tests against a small reference model written from the contract text.
//!
//! Shared helpers live here; each contract section has its own file below.

use super::{apply_batch, gcra};
use crate::state::model::{
    Answer, BucketKey, Charge, ClaimKey, ClaimRecord, ClaimRequest, ClaimState, Command, EntityId,
    HitAnswer, HookId, Kind, NodeId, SettleAnswer, SettleOutcome, SourceId, TenantId,
};
use crate::state::{FleetState, StateImage};

mod claims;
mod expiry;
mod gcra;
mod limits;
mod probe;
mod proptests;
mod reconcile;
mod reset;
mod settle;
mod snapshots;

// ---------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------

/// A realistic "now": 2023-11-14 in microseconds since the Unix epoch.
const T0_US: u64 = 1_700_000_000_000_000;
const MS_US: u64 = 1_000;
const SEC_US: u64 = 1_000_000;
const NODE: NodeId = 7;

/// contract §4's example: 10 per second with a burst of 10.
const TEN_PER_SEC_INCREMENT_US: u64 = 100_000;
const TEN_PER_SEC_CAPACITY_US: u64 = 1_000_000;

fn hooks(tenant: &str) -> BucketKey {
    BucketKey::Tenant {
        kind: Kind::Hooks,
        tenant: TenantId::from(tenant),
    }
}

fn bytes(tenant: &str) -> BucketKey {
    BucketKey::Tenant {
        kind: Kind::Bytes,
        tenant: TenantId::from(tenant),
    }
}

fn entity(entity_id: &str, operation: &str) -> BucketKey {
    BucketKey::Entity {
        entity_id: EntityId::from(entity_id),
        operation: operation.into(),
    }
}

fn charge(bucket: BucketKey, increment_us: u64, capacity_us: u64) -> Charge {
    Charge {
        bucket,
        increment_us,
        capacity_us,
    }
}

fn ten_per_sec(bucket: BucketKey) -> Charge {
    charge(bucket, TEN_PER_SEC_INCREMENT_US, TEN_PER_SEC_CAPACITY_US)
}

fn claim_key(tenant: &str, source_id: &str, key: &str) -> ClaimKey {
    ClaimKey {
        tenant: TenantId::from(tenant),
        source_id: source_id.into(),
        key: key.into(),
    }
}

fn claim(key: &ClaimKey, hook_id: &str, ttl_ms: u64, pending_ttl_ms: u64) -> ClaimRequest {
    ClaimRequest {
        key: key.clone(),
        hook_id: HookId::from(hook_id),
        ttl_ms,
        pending_ttl_ms,
    }
}

fn hit_cmd(charges: Vec<Charge>, claim: Option<ClaimRequest>) -> Command {
    Command::Hit {
        charges,
        claim,
        node: NODE,
    }
}

fn probe_cmd(charges: Vec<Charge>) -> Command {
    Command::ProbeCharges { charges }
}

fn commit_cmd(key: &ClaimKey, hook_id: &str, ttl_ms: u64) -> Command {
    Command::Settle {
        key: key.clone(),
        hook_id: HookId::from(hook_id),
        outcome: SettleOutcome::Commit,
        ttl_ms,
        node: NODE,
    }
}

fn release_cmd(key: &ClaimKey, hook_id: &str) -> Command {
    Command::Settle {
        key: key.clone(),
        hook_id: HookId::from(hook_id),
        outcome: SettleOutcome::Release,
        ttl_ms: 60_000,
        node: NODE,
    }
}

fn reset_cmd(tenant: &str) -> Command {
    Command::Reset {
        tenant: TenantId::from(tenant),
    }
}

/// Applies one command as its own entry stamped `now_us`.
fn run(state: &mut FleetState, now_us: u64, command: Command) -> Answer {
    let mut answers = apply_batch(state, &[command], now_us);
    assert_eq!(answers.len(), 1, "one answer per command");
    answers.remove(0)
}

fn run_hit(state: &mut FleetState, now_us: u64, command: Command) -> HitAnswer {
    match run(state, now_us, command) {
        Answer::Hit(answer) => answer,
        other => panic!("expected a hit answer, got {other:?}"),
    }
}

fn run_settle(state: &mut FleetState, now_us: u64, command: Command) -> SettleAnswer {
    match run(state, now_us, command) {
        Answer::Settle(answer) => answer,
        other => panic!("expected a settle answer, got {other:?}"),
    }
}

fn rate_limited(retry_after_ms: u64) -> HitAnswer {
    HitAnswer::RateLimited { retry_after_ms }
}

fn pending_record(hook_id: &str, expires_at_us: u64, ttl_ms: u64) -> ClaimRecord {
    ClaimRecord {
        hook_id: HookId::from(hook_id),
        node: NODE,
        state: ClaimState::Pending,
        expires_at_us,
        ttl_ms,
    }
}

fn committed_record(hook_id: &str, expires_at_us: u64, ttl_ms: u64) -> ClaimRecord {
    ClaimRecord {
        state: ClaimState::Committed,
        ..pending_record(hook_id, expires_at_us, ttl_ms)
    }
}

/// An image with its items in key order, so two images compare regardless of map order.
fn sorted_image(state: &FleetState) -> StateImage {
    let mut image = state.image();
    image.buckets.sort_by(|a, b| a.0.cmp(&b.0));
    image.claims.sort_by(|a, b| a.0.cmp(&b.0));
    image
}

/// A state holding `key` pending for `hook_id` since T0 (ttl 60 s, pending 5 s).
fn with_pending(key: &ClaimKey, hook_id: &str) -> FleetState {
    let mut state = FleetState::default();
    run_hit(
        &mut state,
        T0_US,
        hit_cmd(vec![], Some(claim(key, hook_id, 60_000, 5_000))),
    );
    state
}
