//! Tests of the pure rules against SPEC sections 2-6, 10 and 11: one unit test per case,
//! then property tests against a small reference model written from the SPEC text.

use std::collections::BTreeMap;

use proptest::prelude::*;

use super::{apply_batch, gcra, FleetState, StateImage};
use crate::state::model::{
    Answer, BucketKey, Charge, ClaimKey, ClaimRecord, ClaimRequest, ClaimState, Command, EntityId,
    HitAnswer, HookId, Kind, NodeId, SettleAnswer, SettleOutcome, SourceId, TenantId,
};

// ---------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------

/// A realistic "now": 2023-11-14 in microseconds since the Unix epoch.
const T0_US: u64 = 1_700_000_000_000_000;
const MS_US: u64 = 1_000;
const SEC_US: u64 = 1_000_000;
const NODE: NodeId = 7;

/// SPEC section 4's example: 10 per second with a burst of 10.
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

// ---------------------------------------------------------------------------------------
// SPEC section 4: GCRA
// ---------------------------------------------------------------------------------------

#[test]
fn spec_example_ten_at_one_instant_pass_and_the_eleventh_waits_100_ms() {
    let mut state = FleetState::default();
    for n in 1..=10 {
        assert_eq!(
            run_hit(
                &mut state,
                T0_US,
                hit_cmd(vec![ten_per_sec(hooks("a"))], None)
            ),
            HitAnswer::Allowed,
            "charge {n}"
        );
    }
    assert_eq!(state.bucket_tat_us(&hooks("a")), Some(T0_US + SEC_US));
    assert_eq!(
        run_hit(
            &mut state,
            T0_US,
            hit_cmd(vec![ten_per_sec(hooks("a"))], None)
        ),
        rate_limited(100)
    );
    assert_eq!(state.bucket_tat_us(&hooks("a")), Some(T0_US + SEC_US));
}

#[test]
fn spec_example_one_more_passes_after_one_increment() {
    let mut state = FleetState::default();
    let burst = vec![ten_per_sec(hooks("a"))];
    for _ in 0..10 {
        run_hit(&mut state, T0_US, hit_cmd(burst.clone(), None));
    }
    let later_us = T0_US + TEN_PER_SEC_INCREMENT_US;
    assert_eq!(
        run_hit(&mut state, later_us, hit_cmd(burst.clone(), None)),
        HitAnswer::Allowed
    );
    assert_eq!(
        run_hit(&mut state, later_us, hit_cmd(burst, None)),
        rate_limited(100)
    );
}

#[test]
fn retry_after_rounds_a_partial_millisecond_up() {
    let mut state = FleetState::default();
    for _ in 0..10 {
        run_hit(
            &mut state,
            T0_US,
            hit_cmd(vec![ten_per_sec(hooks("a"))], None),
        );
    }
    // 99_500 us later the eleventh is 500 us early: 0.5 ms rounds up to 1.
    assert_eq!(
        run_hit(
            &mut state,
            T0_US + 99_500,
            hit_cmd(vec![ten_per_sec(hooks("a"))], None)
        ),
        rate_limited(1)
    );
}

#[test]
fn retry_after_is_at_least_one_ms_when_one_microsecond_early() {
    let mut state = FleetState::default();
    for _ in 0..10 {
        run_hit(
            &mut state,
            T0_US,
            hit_cmd(vec![ten_per_sec(hooks("a"))], None),
        );
    }
    assert_eq!(
        run_hit(
            &mut state,
            T0_US + TEN_PER_SEC_INCREMENT_US - 1,
            hit_cmd(vec![ten_per_sec(hooks("a"))], None)
        ),
        rate_limited(1)
    );
}

#[test]
fn retry_after_of_1001_us_is_2_ms() {
    let mut state = FleetState::default();
    for _ in 0..10 {
        run_hit(
            &mut state,
            T0_US,
            hit_cmd(vec![ten_per_sec(hooks("a"))], None),
        );
    }
    assert_eq!(
        run_hit(
            &mut state,
            T0_US + TEN_PER_SEC_INCREMENT_US - 1_001,
            hit_cmd(vec![ten_per_sec(hooks("a"))], None)
        ),
        rate_limited(2)
    );
}

#[test]
fn gcra_function_follows_the_formula() {
    // Empty bucket: new_tat = now + increment.
    assert_eq!(gcra(None, T0_US, 100, 1_000), Ok(T0_US + 100));
    // A TAT in the past counts as now.
    assert_eq!(gcra(Some(T0_US - 5), T0_US, 100, 1_000), Ok(T0_US + 100));
    // Exactly at capacity is allowed.
    assert_eq!(
        gcra(Some(T0_US + 900), T0_US, 100, 1_000),
        Ok(T0_US + 1_000)
    );
    // One microsecond over: denied, 1 ms.
    assert_eq!(gcra(Some(T0_US + 901), T0_US, 100, 1_000), Err(1));
    // 2_500 us over: 3 ms.
    assert_eq!(gcra(Some(T0_US + 3_400), T0_US, 100, 1_000), Err(3));
}

#[test]
fn a_denied_charge_among_two_writes_neither_bucket() {
    let mut state = FleetState::default();
    // hooks(a) has room; bytes(a) is full (burst of 1 spent).
    run_hit(
        &mut state,
        T0_US,
        hit_cmd(vec![ten_per_sec(hooks("a"))], None),
    );
    run_hit(
        &mut state,
        T0_US,
        hit_cmd(vec![charge(bytes("a"), 500_000, 500_000)], None),
    );
    let hooks_tat_us = state.bucket_tat_us(&hooks("a"));
    let bytes_tat_us = state.bucket_tat_us(&bytes("a"));
    assert_eq!(hooks_tat_us, Some(T0_US + TEN_PER_SEC_INCREMENT_US));
    assert_eq!(bytes_tat_us, Some(T0_US + 500_000));

    let answer = run_hit(
        &mut state,
        T0_US + 50_000,
        hit_cmd(
            vec![
                ten_per_sec(hooks("a")),
                charge(bytes("a"), 500_000, 500_000),
            ],
            None,
        ),
    );
    // bytes: new_tat = T0 + 1_000_000, ahead 950_000, 450_000 over capacity.
    assert_eq!(answer, rate_limited(450));
    assert_eq!(state.bucket_tat_us(&hooks("a")), hooks_tat_us);
    assert_eq!(state.bucket_tat_us(&bytes("a")), bytes_tat_us);
}

#[test]
fn two_denied_charges_answer_the_largest_retry() {
    let mut state = FleetState::default();
    run_hit(
        &mut state,
        T0_US,
        hit_cmd(
            vec![
                charge(hooks("a"), 10_000, 10_000),
                charge(bytes("a"), 70_000, 70_000),
            ],
            None,
        ),
    );
    let answer = run_hit(
        &mut state,
        T0_US,
        hit_cmd(
            vec![
                charge(hooks("a"), 10_000, 10_000),
                charge(bytes("a"), 70_000, 70_000),
            ],
            None,
        ),
    );
    assert_eq!(answer, rate_limited(70));
}

#[test]
fn a_denied_charge_with_a_duplicate_claim_is_rate_limited_and_leaves_the_claim() {
    let mut state = FleetState::default();
    let key = claim_key("a", "stripe", "evt_1");
    run_hit(
        &mut state,
        T0_US,
        hit_cmd(
            vec![charge(hooks("a"), SEC_US, SEC_US)],
            Some(claim(&key, "h1", 60_000, 5_000)),
        ),
    );
    run_settle(&mut state, T0_US, commit_cmd(&key, "h1", 60_000));
    let committed = state.claim(&key).cloned();
    assert_eq!(
        committed,
        Some(committed_record("h1", T0_US + 60 * SEC_US, 60_000))
    );

    let answer = run_hit(
        &mut state,
        T0_US + 1,
        hit_cmd(
            vec![charge(hooks("a"), SEC_US, SEC_US)],
            Some(claim(&key, "h2", 60_000, 5_000)),
        ),
    );
    assert_eq!(answer, rate_limited(1_000));
    assert_eq!(state.claim(&key).cloned(), committed);
    assert_eq!(state.bucket_tat_us(&hooks("a")), Some(T0_US + SEC_US));
}

#[test]
fn a_denied_charge_with_a_new_claim_takes_no_claim() {
    let mut state = FleetState::default();
    let key = claim_key("a", "stripe", "evt_1");
    run_hit(
        &mut state,
        T0_US,
        hit_cmd(vec![charge(hooks("a"), SEC_US, SEC_US)], None),
    );
    let answer = run_hit(
        &mut state,
        T0_US,
        hit_cmd(
            vec![charge(hooks("a"), SEC_US, SEC_US)],
            Some(claim(&key, "h1", 60_000, 5_000)),
        ),
    );
    assert_eq!(answer, rate_limited(1_000));
    assert_eq!(state.claim(&key), None);
}

// ---------------------------------------------------------------------------------------
// SPEC section 5: hit, step 3 (the claim) and step 4 (take)
// ---------------------------------------------------------------------------------------

#[test]
fn a_hit_with_no_charges_and_no_claim_is_allowed_and_writes_nothing() {
    let mut state = FleetState::default();
    assert_eq!(
        run_hit(&mut state, T0_US, hit_cmd(vec![], None)),
        HitAnswer::Allowed
    );
    assert!(state.is_empty());
    assert_eq!(state.clock_us(), T0_US);
}

#[test]
fn a_new_claim_becomes_pending_and_the_charges_are_taken() {
    let mut state = FleetState::default();
    let key = claim_key("a", "stripe", "evt_1");
    let answer = run_hit(
        &mut state,
        T0_US,
        hit_cmd(
            vec![ten_per_sec(hooks("a")), charge(bytes("a"), 4_096, 1 << 20)],
            Some(claim(&key, "h1", 60_000, 5_000)),
        ),
    );
    assert_eq!(answer, HitAnswer::Allowed);
    assert_eq!(
        state.claim(&key),
        Some(&pending_record("h1", T0_US + 5 * SEC_US, 60_000))
    );
    assert_eq!(
        state.bucket_tat_us(&hooks("a")),
        Some(T0_US + TEN_PER_SEC_INCREMENT_US)
    );
    assert_eq!(state.bucket_tat_us(&bytes("a")), Some(T0_US + 4_096));
}

#[test]
fn a_committed_claim_answers_duplicate_with_the_holder_and_spends_no_charge() {
    let mut state = FleetState::default();
    let key = claim_key("a", "stripe", "evt_1");
    run_hit(
        &mut state,
        T0_US,
        hit_cmd(vec![], Some(claim(&key, "h1", 60_000, 5_000))),
    );
    run_settle(&mut state, T0_US, commit_cmd(&key, "h1", 60_000));

    let answer = run_hit(
        &mut state,
        T0_US + SEC_US,
        hit_cmd(
            vec![
                ten_per_sec(hooks("a")),
                ten_per_sec(entity("user-1", "send")),
            ],
            Some(claim(&key, "h2", 60_000, 5_000)),
        ),
    );
    assert_eq!(
        answer,
        HitAnswer::Duplicate {
            hook_id: HookId::from("h1")
        }
    );
    assert_eq!(state.bucket_tat_us(&hooks("a")), None);
    assert_eq!(state.bucket_tat_us(&entity("user-1", "send")), None);
    assert_eq!(
        state.claim(&key),
        Some(&committed_record("h1", T0_US + 60 * SEC_US, 60_000))
    );
}

#[test]
fn a_committed_claim_is_a_duplicate_for_its_own_hook_too() {
    let mut state = FleetState::default();
    let key = claim_key("a", "stripe", "evt_1");
    run_settle(&mut state, T0_US, commit_cmd(&key, "h1", 60_000));
    assert_eq!(
        run_hit(
            &mut state,
            T0_US,
            hit_cmd(vec![], Some(claim(&key, "h1", 60_000, 5_000)))
        ),
        HitAnswer::Duplicate {
            hook_id: HookId::from("h1")
        }
    );
}

#[test]
fn a_pending_claim_of_another_hook_answers_pending_with_the_time_left() {
    let mut state = FleetState::default();
    let key = claim_key("a", "stripe", "evt_1");
    run_hit(
        &mut state,
        T0_US,
        hit_cmd(vec![], Some(claim(&key, "h1", 60_000, 5_000))),
    );
    let tat_before_us = state.bucket_tat_us(&hooks("a"));

    // 3_499_500 us left: 3_499.5 ms rounds up to 3_500.
    let answer = run_hit(
        &mut state,
        T0_US + 1_500_500,
        hit_cmd(
            vec![ten_per_sec(hooks("a"))],
            Some(claim(&key, "h2", 60_000, 5_000)),
        ),
    );
    assert_eq!(
        answer,
        HitAnswer::Pending {
            retry_after_ms: 3_500
        }
    );
    assert_eq!(state.bucket_tat_us(&hooks("a")), tat_before_us);
    assert_eq!(
        state.claim(&key),
        Some(&pending_record("h1", T0_US + 5 * SEC_US, 60_000))
    );
}

#[test]
fn a_pending_claim_one_microsecond_from_expiry_answers_pending_1_ms() {
    let mut state = FleetState::default();
    let key = claim_key("a", "stripe", "evt_1");
    run_hit(
        &mut state,
        T0_US,
        hit_cmd(vec![], Some(claim(&key, "h1", 60_000, 5_000))),
    );
    assert_eq!(
        run_hit(
            &mut state,
            T0_US + 5 * SEC_US - 1,
            hit_cmd(vec![], Some(claim(&key, "h2", 60_000, 5_000)))
        ),
        HitAnswer::Pending { retry_after_ms: 1 }
    );
}

#[test]
fn a_pending_claim_of_the_same_hook_is_allowed_without_charging_or_extending() {
    let mut state = FleetState::default();
    let key = claim_key("a", "stripe", "evt_1");
    run_hit(
        &mut state,
        T0_US,
        hit_cmd(
            vec![ten_per_sec(hooks("a"))],
            Some(claim(&key, "h1", 60_000, 5_000)),
        ),
    );
    let tat_before_us = state.bucket_tat_us(&hooks("a"));
    assert_eq!(tat_before_us, Some(T0_US + TEN_PER_SEC_INCREMENT_US));

    let answer = run_hit(
        &mut state,
        T0_US + 50_000,
        hit_cmd(
            vec![ten_per_sec(hooks("a"))],
            Some(claim(&key, "h1", 90_000, 9_000)),
        ),
    );
    assert_eq!(answer, HitAnswer::Allowed);
    assert_eq!(state.bucket_tat_us(&hooks("a")), tat_before_us);
    assert_eq!(
        state.claim(&key),
        Some(&pending_record("h1", T0_US + 5 * SEC_US, 60_000))
    );
}

#[test]
fn an_expired_pending_claim_is_taken_anew() {
    let mut state = FleetState::default();
    let key = claim_key("a", "stripe", "evt_1");
    run_hit(
        &mut state,
        T0_US,
        hit_cmd(vec![], Some(claim(&key, "h1", 60_000, 5_000))),
    );
    // At exactly expires_at the claim is gone (an expired claim is no claim).
    let expiry_us = T0_US + 5 * SEC_US;
    let answer = run_hit(
        &mut state,
        expiry_us,
        hit_cmd(
            vec![ten_per_sec(hooks("a"))],
            Some(claim(&key, "h2", 30_000, 2_000)),
        ),
    );
    assert_eq!(answer, HitAnswer::Allowed);
    assert_eq!(
        state.claim(&key),
        Some(&pending_record("h2", expiry_us + 2 * SEC_US, 30_000))
    );
    assert_eq!(
        state.bucket_tat_us(&hooks("a")),
        Some(expiry_us + TEN_PER_SEC_INCREMENT_US)
    );
}

#[test]
fn an_expired_committed_claim_is_taken_anew() {
    let mut state = FleetState::default();
    let key = claim_key("a", "stripe", "evt_1");
    run_settle(&mut state, T0_US, commit_cmd(&key, "h1", 1_000));
    let later_us = T0_US + SEC_US;
    assert_eq!(
        run_hit(
            &mut state,
            later_us,
            hit_cmd(vec![], Some(claim(&key, "h2", 60_000, 5_000)))
        ),
        HitAnswer::Allowed
    );
    assert_eq!(
        state.claim(&key),
        Some(&pending_record("h2", later_us + 5 * SEC_US, 60_000))
    );
}

#[test]
fn claims_of_other_tenants_sources_and_keys_are_independent() {
    let mut state = FleetState::default();
    let key = claim_key("a", "stripe", "evt_1");
    run_settle(&mut state, T0_US, commit_cmd(&key, "h1", 60_000));
    for other in [
        claim_key("b", "stripe", "evt_1"),
        claim_key("a", "github", "evt_1"),
        claim_key("a", "stripe", "evt_2"),
    ] {
        assert_eq!(
            run_hit(
                &mut state,
                T0_US,
                hit_cmd(vec![], Some(claim(&other, "h2", 60_000, 5_000)))
            ),
            HitAnswer::Allowed,
            "{other:?}"
        );
    }
}

// ---------------------------------------------------------------------------------------
// ProbeCharges
// ---------------------------------------------------------------------------------------

#[test]
fn probe_charges_answers_but_never_writes() {
    let mut state = FleetState::default();
    assert_eq!(
        run_hit(&mut state, T0_US, probe_cmd(vec![ten_per_sec(hooks("a"))])),
        HitAnswer::Allowed
    );
    assert_eq!(state.bucket_tat_us(&hooks("a")), None);
    assert!(state.is_empty());

    run_hit(
        &mut state,
        T0_US,
        hit_cmd(vec![charge(hooks("a"), SEC_US, SEC_US)], None),
    );
    assert_eq!(
        run_hit(
            &mut state,
            T0_US + 250_000,
            probe_cmd(vec![
                charge(hooks("a"), SEC_US, SEC_US),
                ten_per_sec(bytes("a"))
            ])
        ),
        rate_limited(750)
    );
    assert_eq!(state.bucket_tat_us(&hooks("a")), Some(T0_US + SEC_US));
    assert_eq!(state.bucket_tat_us(&bytes("a")), None);
    assert_eq!(state.len(), (1, 0));
}

// ---------------------------------------------------------------------------------------
// SPEC section 6: settle
// ---------------------------------------------------------------------------------------

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

#[test]
fn commit_of_a_pending_claim_settles_it_with_the_claims_ttl() {
    let key = claim_key("a", "stripe", "evt_1");
    let mut state = with_pending(&key, "h1");
    let commit_us = T0_US + 2 * SEC_US;
    assert_eq!(
        run_settle(&mut state, commit_us, commit_cmd(&key, "h1", 999_000)),
        SettleAnswer::Settled
    );
    assert_eq!(
        state.claim(&key),
        Some(&committed_record("h1", commit_us + 60 * SEC_US, 60_000))
    );
}

#[test]
fn commit_of_an_already_committed_claim_is_idempotent() {
    let key = claim_key("a", "stripe", "evt_1");
    let mut state = with_pending(&key, "h1");
    run_settle(&mut state, T0_US, commit_cmd(&key, "h1", 30_000));
    let committed = state.claim(&key).cloned();
    assert_eq!(
        run_settle(
            &mut state,
            T0_US + 10 * SEC_US,
            commit_cmd(&key, "h1", 30_000)
        ),
        SettleAnswer::Settled
    );
    assert_eq!(state.claim(&key).cloned(), committed);
}

#[test]
fn commit_of_an_absent_claim_recreates_it_with_the_settle_ttl() {
    let mut state = FleetState::default();
    let key = claim_key("a", "stripe", "evt_1");
    assert_eq!(
        run_settle(&mut state, T0_US, commit_cmd(&key, "h1", 45_000)),
        SettleAnswer::Recreated
    );
    assert_eq!(
        state.claim(&key),
        Some(&committed_record("h1", T0_US + 45 * SEC_US, 45_000))
    );
}

#[test]
fn commit_of_an_expired_pending_claim_recreates_it_with_the_settle_ttl() {
    let key = claim_key("a", "stripe", "evt_1");
    let mut state = with_pending(&key, "h1");
    let late_us = T0_US + 5 * SEC_US;
    assert_eq!(
        run_settle(&mut state, late_us, commit_cmd(&key, "h1", 45_000)),
        SettleAnswer::Recreated
    );
    assert_eq!(
        state.claim(&key),
        Some(&committed_record("h1", late_us + 45 * SEC_US, 45_000))
    );
}

#[test]
fn commit_of_a_claim_held_pending_by_another_hook_is_a_conflict_naming_it() {
    let key = claim_key("a", "stripe", "evt_1");
    let mut state = with_pending(&key, "h1");
    let before = state.claim(&key).cloned();
    assert_eq!(
        run_settle(&mut state, T0_US + 1, commit_cmd(&key, "h2", 60_000)),
        SettleAnswer::Conflict {
            holder: HookId::from("h1")
        }
    );
    assert_eq!(state.claim(&key).cloned(), before);
}

#[test]
fn commit_of_a_claim_committed_by_another_hook_is_a_conflict_naming_it() {
    let key = claim_key("a", "stripe", "evt_1");
    let mut state = with_pending(&key, "h1");
    run_settle(&mut state, T0_US, commit_cmd(&key, "h1", 60_000));
    let before = state.claim(&key).cloned();
    assert_eq!(
        run_settle(&mut state, T0_US + 1, commit_cmd(&key, "h2", 60_000)),
        SettleAnswer::Conflict {
            holder: HookId::from("h1")
        }
    );
    assert_eq!(state.claim(&key).cloned(), before);
}

#[test]
fn release_of_a_pending_claim_removes_it() {
    let key = claim_key("a", "stripe", "evt_1");
    let mut state = with_pending(&key, "h1");
    assert_eq!(
        run_settle(&mut state, T0_US + 1, release_cmd(&key, "h1")),
        SettleAnswer::Settled
    );
    assert_eq!(state.claim(&key), None);
    assert_eq!(state.len(), (0, 0));
    // The key is free again, for any hook.
    assert_eq!(
        run_hit(
            &mut state,
            T0_US + 2,
            hit_cmd(vec![], Some(claim(&key, "h2", 60_000, 5_000)))
        ),
        HitAnswer::Allowed
    );
}

#[test]
fn release_of_an_absent_claim_is_settled() {
    let mut state = FleetState::default();
    let key = claim_key("a", "stripe", "evt_1");
    assert_eq!(
        run_settle(&mut state, T0_US, release_cmd(&key, "h1")),
        SettleAnswer::Settled
    );
    assert!(state.is_empty());
}

#[test]
fn release_of_an_expired_claim_is_settled() {
    let key = claim_key("a", "stripe", "evt_1");
    let mut state = with_pending(&key, "h2");
    assert_eq!(
        run_settle(&mut state, T0_US + 5 * SEC_US, release_cmd(&key, "h1")),
        SettleAnswer::Settled
    );
    assert_eq!(state.claim(&key), None);
}

#[test]
fn release_of_a_committed_claim_is_a_conflict() {
    let key = claim_key("a", "stripe", "evt_1");
    let mut state = with_pending(&key, "h1");
    run_settle(&mut state, T0_US, commit_cmd(&key, "h1", 60_000));
    let before = state.claim(&key).cloned();
    assert_eq!(
        run_settle(&mut state, T0_US + 1, release_cmd(&key, "h1")),
        SettleAnswer::Conflict {
            holder: HookId::from("h1")
        }
    );
    assert_eq!(state.claim(&key).cloned(), before);
}

#[test]
fn release_of_a_claim_held_by_another_hook_is_a_conflict_naming_it() {
    let key = claim_key("a", "stripe", "evt_1");
    let mut state = with_pending(&key, "h1");
    let before = state.claim(&key).cloned();
    assert_eq!(
        run_settle(&mut state, T0_US + 1, release_cmd(&key, "h2")),
        SettleAnswer::Conflict {
            holder: HookId::from("h1")
        }
    );
    assert_eq!(state.claim(&key).cloned(), before);
}

// ---------------------------------------------------------------------------------------
// SPEC section 10: reset; section 11: entity buckets
// ---------------------------------------------------------------------------------------

#[test]
fn reset_forgets_both_kinds_of_that_tenant_only() {
    let mut state = FleetState::default();
    let key = claim_key("a", "stripe", "evt_1");
    run_hit(
        &mut state,
        T0_US,
        hit_cmd(
            vec![
                charge(hooks("a"), SEC_US, SEC_US),
                charge(bytes("a"), SEC_US, SEC_US),
                charge(hooks("b"), SEC_US, SEC_US),
                charge(bytes("b"), SEC_US, SEC_US),
                charge(entity("a", "send"), SEC_US, SEC_US),
            ],
            Some(claim(&key, "h1", 60_000, 5_000)),
        ),
    );
    let claim_before = state.claim(&key).cloned();

    assert_eq!(run(&mut state, T0_US + 1, reset_cmd("a")), Answer::Reset);

    assert_eq!(state.bucket_tat_us(&hooks("a")), None);
    assert_eq!(state.bucket_tat_us(&bytes("a")), None);
    assert_eq!(state.bucket_tat_us(&hooks("b")), Some(T0_US + SEC_US));
    assert_eq!(state.bucket_tat_us(&bytes("b")), Some(T0_US + SEC_US));
    assert_eq!(
        state.bucket_tat_us(&entity("a", "send")),
        Some(T0_US + SEC_US)
    );
    assert_eq!(state.claim(&key).cloned(), claim_before);
    // The tenant's budget starts afresh.
    assert_eq!(
        run_hit(
            &mut state,
            T0_US + 1,
            hit_cmd(vec![charge(hooks("a"), SEC_US, SEC_US)], None)
        ),
        HitAnswer::Allowed
    );
}

#[test]
fn entity_buckets_never_share_a_name_with_tenant_buckets() {
    let mut state = FleetState::default();
    run_hit(
        &mut state,
        T0_US,
        hit_cmd(vec![charge(hooks("a"), SEC_US, SEC_US)], None),
    );
    // An entity named like the tenant, and its operation named like the kind.
    for bucket in [entity("a", "hooks"), entity("a", "Hooks"), entity("a", "")] {
        assert_eq!(
            run_hit(
                &mut state,
                T0_US,
                hit_cmd(vec![charge(bucket.clone(), SEC_US, SEC_US)], None)
            ),
            HitAnswer::Allowed,
            "{bucket:?}"
        );
    }
    assert_eq!(state.bucket_tat_us(&hooks("a")), Some(T0_US + SEC_US));
}

// ---------------------------------------------------------------------------------------
// Sections 2 and 3: expiry and time
// ---------------------------------------------------------------------------------------

#[test]
fn expiry_drops_buckets_and_claims_from_memory() {
    let mut state = FleetState::default();
    let key = claim_key("a", "stripe", "evt_1");
    let committed_key = claim_key("a", "stripe", "evt_2");
    run_hit(
        &mut state,
        T0_US,
        hit_cmd(
            vec![
                charge(hooks("a"), SEC_US, 2 * SEC_US),
                charge(entity("u", "op"), 3 * SEC_US, 3 * SEC_US),
            ],
            Some(claim(&key, "h1", 60_000, 2_000)),
        ),
    );
    run_settle(&mut state, T0_US, commit_cmd(&committed_key, "h2", 4_000));
    assert_eq!(state.len(), (2, 2));

    // Each item is still there one microsecond before its deadline, gone at it.
    apply_batch(&mut state, &[], T0_US + SEC_US - 1);
    assert_eq!(state.len(), (2, 2));
    apply_batch(&mut state, &[], T0_US + SEC_US);
    assert_eq!(state.len(), (1, 2));
    assert_eq!(state.bucket_tat_us(&hooks("a")), None);
    apply_batch(&mut state, &[], T0_US + 2 * SEC_US);
    assert_eq!(state.len(), (1, 1));
    assert_eq!(state.claim(&key), None);
    apply_batch(&mut state, &[], T0_US + 3 * SEC_US);
    assert_eq!(state.len(), (0, 1));
    apply_batch(&mut state, &[], T0_US + 4 * SEC_US);
    assert_eq!(state.len(), (0, 0));
    assert!(state.is_empty());
    assert_eq!(
        state.image(),
        StateImage {
            clock_us: T0_US + 4 * SEC_US,
            buckets: vec![],
            claims: vec![],
        }
    );
}

#[test]
fn a_bucket_charged_again_lives_until_its_latest_tat() {
    let mut state = FleetState::default();
    run_hit(
        &mut state,
        T0_US,
        hit_cmd(vec![charge(hooks("a"), SEC_US, 3 * SEC_US)], None),
    );
    run_hit(
        &mut state,
        T0_US,
        hit_cmd(vec![charge(hooks("a"), SEC_US, 3 * SEC_US)], None),
    );
    // The first charge's deadline passes; the bucket is still live (TAT T0 + 2 s).
    apply_batch(&mut state, &[], T0_US + SEC_US);
    assert_eq!(state.bucket_tat_us(&hooks("a")), Some(T0_US + 2 * SEC_US));
    assert_eq!(state.len(), (1, 0));
    apply_batch(&mut state, &[], T0_US + 2 * SEC_US);
    assert!(state.is_empty());
}

#[test]
fn a_claim_committed_after_pending_lives_until_its_committed_expiry() {
    let key = claim_key("a", "stripe", "evt_1");
    let mut state = with_pending(&key, "h1");
    run_settle(&mut state, T0_US + SEC_US, commit_cmd(&key, "h1", 60_000));
    // The pending deadline (T0 + 5 s) passes without dropping the committed claim.
    apply_batch(&mut state, &[], T0_US + 5 * SEC_US);
    assert_eq!(
        state.claim(&key),
        Some(&committed_record("h1", T0_US + 61 * SEC_US, 60_000))
    );
    assert_eq!(state.len(), (0, 1));
    apply_batch(&mut state, &[], T0_US + 61 * SEC_US);
    assert!(state.is_empty());
}

#[test]
fn an_entry_stamped_earlier_keeps_the_later_clock_and_answers_with_it() {
    let mut state = FleetState::default();
    let key = claim_key("a", "stripe", "evt_1");
    let t1_us = T0_US + 10 * SEC_US;
    let answers = apply_batch(
        &mut state,
        &[
            hit_cmd(vec![charge(hooks("a"), 100_000, 100_000)], None),
            hit_cmd(vec![], Some(claim(&key, "h1", 60_000, 1_000))),
        ],
        t1_us,
    );
    assert_eq!(
        answers,
        vec![
            Answer::Hit(HitAnswer::Allowed),
            Answer::Hit(HitAnswer::Allowed)
        ]
    );

    // Stamped 500 ms before the clock: decided at t1 all the same.
    let answers = apply_batch(
        &mut state,
        &[
            hit_cmd(vec![charge(hooks("a"), 100_000, 100_000)], None),
            hit_cmd(vec![], Some(claim(&key, "h2", 60_000, 1_000))),
            commit_cmd(&claim_key("a", "stripe", "evt_2"), "h3", 2_000),
        ],
        t1_us - 500_000,
    );
    assert_eq!(
        answers,
        vec![
            Answer::Hit(rate_limited(100)),
            Answer::Hit(HitAnswer::Pending {
                retry_after_ms: 1_000
            }),
            Answer::Settle(SettleAnswer::Recreated),
        ]
    );
    assert_eq!(state.clock_us(), t1_us);
    assert_eq!(
        state.claim(&claim_key("a", "stripe", "evt_2")),
        Some(&committed_record("h3", t1_us + 2 * SEC_US, 2_000))
    );
    assert_eq!(state.advance_clock(T0_US), t1_us);
}

#[test]
fn a_batch_answers_each_command_in_order_at_one_instant() {
    let mut state = FleetState::default();
    let key = claim_key("a", "stripe", "evt_1");
    let answers = apply_batch(
        &mut state,
        &[
            hit_cmd(
                vec![charge(hooks("a"), SEC_US, SEC_US)],
                Some(claim(&key, "h1", 60_000, 5_000)),
            ),
            hit_cmd(
                vec![charge(hooks("a"), SEC_US, SEC_US)],
                Some(claim(&key, "h2", 60_000, 5_000)),
            ),
            hit_cmd(vec![], Some(claim(&key, "h2", 60_000, 5_000))),
            commit_cmd(&key, "h1", 60_000),
            hit_cmd(vec![], Some(claim(&key, "h2", 60_000, 5_000))),
            reset_cmd("a"),
            release_cmd(&key, "h1"),
        ],
        T0_US,
    );
    assert_eq!(
        answers,
        vec![
            Answer::Hit(HitAnswer::Allowed),
            Answer::Hit(rate_limited(1_000)),
            Answer::Hit(HitAnswer::Pending {
                retry_after_ms: 5_000
            }),
            Answer::Settle(SettleAnswer::Settled),
            Answer::Hit(HitAnswer::Duplicate {
                hook_id: HookId::from("h1")
            }),
            Answer::Reset,
            Answer::Settle(SettleAnswer::Conflict {
                holder: HookId::from("h1")
            }),
        ]
    );
}

// ---------------------------------------------------------------------------------------
// Snapshots: image() / from_image()
// ---------------------------------------------------------------------------------------

#[test]
fn image_round_trip_keeps_live_items_and_gives_the_same_answers() {
    let mut state = FleetState::default();
    let pending_key = claim_key("a", "stripe", "evt_1");
    let committed_key = claim_key("b", "github", "evt_9");
    let short_key = claim_key("a", "stripe", "evt_short");
    run_hit(
        &mut state,
        T0_US,
        hit_cmd(
            vec![
                charge(hooks("a"), 400_000, SEC_US),
                charge(bytes("b"), 100, 100),
                charge(entity("u", "op"), 600_000, 2 * SEC_US),
            ],
            Some(claim(&pending_key, "h1", 60_000, 5_000)),
        ),
    );
    run_hit(
        &mut state,
        T0_US,
        hit_cmd(vec![], Some(claim(&short_key, "h4", 60_000, 1))),
    );
    run_settle(&mut state, T0_US, commit_cmd(&committed_key, "h2", 30_000));
    // bytes(b) (TAT T0 + 100 us) and evt_short (T0 + 1 ms) have expired by now.
    let now_us = T0_US + 200_000;
    apply_batch(&mut state, &[], now_us);

    let image = sorted_image(&state);
    assert_eq!(image.clock_us, now_us);
    assert_eq!(
        image.buckets,
        vec![
            (hooks("a"), T0_US + 400_000),
            (entity("u", "op"), T0_US + 600_000),
        ]
    );
    assert_eq!(
        image.claims,
        vec![
            (
                pending_key.clone(),
                pending_record("h1", T0_US + 5 * SEC_US, 60_000)
            ),
            (
                committed_key.clone(),
                committed_record("h2", T0_US + 30 * SEC_US, 30_000)
            ),
        ]
    );

    let mut restored = FleetState::from_image(state.image());
    assert_eq!(sorted_image(&restored), image);
    assert_eq!(restored.len(), state.len());

    let script = [
        (
            now_us,
            hit_cmd(
                vec![charge(hooks("a"), 400_000, SEC_US)],
                Some(claim(&pending_key, "h3", 60_000, 5_000)),
            ),
        ),
        (
            now_us,
            hit_cmd(vec![charge(hooks("a"), 400_000, SEC_US)], None),
        ),
        (
            now_us,
            hit_cmd(vec![charge(hooks("a"), 400_000, SEC_US)], None),
        ),
        (
            now_us + 1,
            hit_cmd(vec![], Some(claim(&committed_key, "h3", 60_000, 5_000))),
        ),
        (now_us + 2, commit_cmd(&pending_key, "h1", 60_000)),
        (
            now_us + 3,
            probe_cmd(vec![charge(entity("u", "op"), 600_000, SEC_US)]),
        ),
        (T0_US + 5 * SEC_US, release_cmd(&pending_key, "h1")),
        (T0_US + 30 * SEC_US, commit_cmd(&committed_key, "h3", 1_000)),
    ];
    for (stamp_us, command) in script {
        let original = run(&mut state, stamp_us, command.clone());
        let copy = run(&mut restored, stamp_us, command.clone());
        assert_eq!(original, copy, "{command:?} at {stamp_us}");
        assert_eq!(sorted_image(&state), sorted_image(&restored));
    }
}

#[test]
fn from_image_drops_items_already_expired_at_its_clock() {
    let key = claim_key("a", "stripe", "evt_1");
    let image = StateImage {
        clock_us: T0_US,
        buckets: vec![(hooks("a"), T0_US), (hooks("b"), T0_US + 1)],
        claims: vec![(key.clone(), pending_record("h1", T0_US, 60_000))],
    };
    let state = FleetState::from_image(image);
    assert_eq!(state.clock_us(), T0_US);
    assert_eq!(state.len(), (1, 0));
    assert_eq!(state.bucket_tat_us(&hooks("b")), Some(T0_US + 1));
    assert_eq!(state.claim(&key), None);
}

// ---------------------------------------------------------------------------------------
// Property tests against a reference model
// ---------------------------------------------------------------------------------------

/// The SPEC's state, literally: a map of buckets and a map of claims that is never swept.
/// A bucket whose TAT is not after now, or a claim whose expiry is not after now, is
/// treated as absent wherever it is read.
#[derive(Debug, Default)]
struct Model {
    clock_us: u64,
    buckets: BTreeMap<BucketKey, u64>,
    claims: BTreeMap<ClaimKey, ClaimRecord>,
}

fn ceil_to_ms(duration_us: u64) -> u64 {
    duration_us.div_ceil(MS_US)
}

impl Model {
    fn bucket_tat_us(&self, bucket: &BucketKey) -> Option<u64> {
        match self.buckets.get(bucket) {
            Some(&tat_us) if tat_us > self.clock_us => Some(tat_us),
            _ => None,
        }
    }

    fn claim(&self, key: &ClaimKey) -> Option<&ClaimRecord> {
        match self.claims.get(key) {
            Some(record) if record.expires_at_us > self.clock_us => Some(record),
            _ => None,
        }
    }

    /// The latest deadline of anything ever stored: past it, nothing is live.
    fn last_deadline_us(&self) -> u64 {
        let buckets = self.buckets.values().copied();
        let claims = self.claims.values().map(|record| record.expires_at_us);
        buckets.chain(claims).fold(self.clock_us, u64::max)
    }

    /// Section 3: time never goes back; every command of the entry is decided at one now.
    fn apply_batch(&mut self, commands: &[Command], stamped_now_us: u64) -> Vec<Answer> {
        self.clock_us = self.clock_us.max(stamped_now_us);
        commands.iter().map(|command| self.apply(command)).collect()
    }

    fn apply(&mut self, command: &Command) -> Answer {
        match command {
            Command::Hit {
                charges,
                claim,
                node,
            } => Answer::Hit(self.hit(charges, claim.as_ref(), *node)),
            Command::ProbeCharges { charges } => Answer::Hit(match self.charges(charges) {
                Ok(_) => HitAnswer::Allowed,
                Err(retry_after_ms) => HitAnswer::RateLimited { retry_after_ms },
            }),
            Command::Settle {
                key,
                hook_id,
                outcome: SettleOutcome::Commit,
                ttl_ms,
                node,
            } => Answer::Settle(self.commit(key, hook_id, *ttl_ms, *node)),
            Command::Settle {
                key,
                hook_id,
                outcome: SettleOutcome::Release,
                ..
            } => Answer::Settle(self.release(key, hook_id)),
            Command::ReconcileCommit {
                key,
                hook_id,
                ttl_ms,
                node,
            } => {
                let own_late_pending = self.claim(key).is_some_and(|record| {
                    record.state == ClaimState::Pending
                        && record.node == *node
                        && record.hook_id != *hook_id
                });
                if own_late_pending {
                    self.claims.remove(key);
                }
                Answer::Settle(self.commit(key, hook_id, *ttl_ms, *node))
            }
            Command::Absorb { charges } => {
                let now_us = self.clock_us;
                for charge in charges {
                    let tat_us = self
                        .bucket_tat_us(&charge.bucket)
                        .unwrap_or(now_us)
                        .max(now_us);
                    let new_tat_us =
                        (tat_us + charge.increment_us).min(now_us + charge.capacity_us);
                    self.buckets.insert(charge.bucket.clone(), new_tat_us);
                }
                Answer::Absorbed
            }
            Command::Reset { tenant } => {
                for kind in [Kind::Hooks, Kind::Bytes] {
                    self.buckets.remove(&BucketKey::Tenant {
                        kind,
                        tenant: tenant.clone(),
                    });
                }
                Answer::Reset
            }
        }
    }

    /// Section 4 for each charge: the new TATs if all pass, else the largest retry.
    fn charges(&self, charges: &[Charge]) -> Result<Vec<(BucketKey, u64)>, u64> {
        let now_us = self.clock_us;
        let mut taken = Vec::new();
        let mut denied_retries_ms = Vec::new();
        for charge in charges {
            let tat_us = self.bucket_tat_us(&charge.bucket).unwrap_or(now_us);
            let new_tat_us = tat_us.max(now_us) + charge.increment_us;
            if new_tat_us - now_us <= charge.capacity_us {
                taken.push((charge.bucket.clone(), new_tat_us));
            } else {
                let over_us = new_tat_us - now_us - charge.capacity_us;
                denied_retries_ms.push(ceil_to_ms(over_us).max(1));
            }
        }
        match denied_retries_ms.into_iter().max() {
            Some(retry_after_ms) => Err(retry_after_ms),
            None => Ok(taken),
        }
    }

    /// Section 5, steps 2 to 4.
    fn hit(&mut self, charges: &[Charge], claim: Option<&ClaimRequest>, node: NodeId) -> HitAnswer {
        let now_us = self.clock_us;
        let taken = match self.charges(charges) {
            Ok(taken) => taken,
            Err(retry_after_ms) => return HitAnswer::RateLimited { retry_after_ms },
        };
        if let Some(request) = claim {
            if let Some(record) = self.claim(&request.key) {
                if record.state == ClaimState::Committed {
                    return HitAnswer::Duplicate {
                        hook_id: record.hook_id.clone(),
                    };
                }
                if record.hook_id != request.hook_id {
                    let left_us = record.expires_at_us - now_us;
                    return HitAnswer::Pending {
                        retry_after_ms: ceil_to_ms(left_us).max(1),
                    };
                }
                return HitAnswer::Allowed;
            }
        }
        self.buckets.extend(taken);
        if let Some(request) = claim {
            self.claims.insert(
                request.key.clone(),
                ClaimRecord {
                    hook_id: request.hook_id.clone(),
                    node,
                    state: ClaimState::Pending,
                    expires_at_us: now_us + request.pending_ttl_ms * MS_US,
                    ttl_ms: request.ttl_ms,
                },
            );
        }
        HitAnswer::Allowed
    }

    /// Section 6, commit. A pending claim keeps the node that took it.
    fn commit(
        &mut self,
        key: &ClaimKey,
        hook_id: &HookId,
        ttl_ms: u64,
        node: NodeId,
    ) -> SettleAnswer {
        let now_us = self.clock_us;
        let Some(record) = self.claim(key).cloned() else {
            self.claims.insert(
                key.clone(),
                ClaimRecord {
                    hook_id: hook_id.clone(),
                    node,
                    state: ClaimState::Committed,
                    expires_at_us: now_us + ttl_ms * MS_US,
                    ttl_ms,
                },
            );
            return SettleAnswer::Recreated;
        };
        if record.hook_id != *hook_id {
            return SettleAnswer::Conflict {
                holder: record.hook_id,
            };
        }
        if record.state == ClaimState::Pending {
            let expires_at_us = now_us + record.ttl_ms * MS_US;
            self.claims.insert(
                key.clone(),
                ClaimRecord {
                    state: ClaimState::Committed,
                    expires_at_us,
                    ..record
                },
            );
        }
        SettleAnswer::Settled
    }

    /// Section 6, release.
    fn release(&mut self, key: &ClaimKey, hook_id: &HookId) -> SettleAnswer {
        let Some(record) = self.claim(key) else {
            return SettleAnswer::Settled;
        };
        if record.hook_id == *hook_id && record.state == ClaimState::Pending {
            self.claims.remove(key);
            return SettleAnswer::Settled;
        }
        SettleAnswer::Conflict {
            holder: record.hook_id.clone(),
        }
    }
}

const TENANTS: [&str; 2] = ["t0", "t1"];
const SOURCES: [&str; 2] = ["s0", "s1"];
const KEYS: [&str; 3] = ["k0", "k1", "k2"];
const HOOKS: [&str; 3] = ["h0", "h1", "h2"];
const NODES: [NodeId; 2] = [1, 2];

fn universe_buckets() -> Vec<BucketKey> {
    let mut buckets: Vec<BucketKey> = TENANTS
        .iter()
        .flat_map(|tenant| [hooks(tenant), bytes(tenant)])
        .collect();
    buckets.push(entity("t0", "send"));
    buckets
}

fn universe_claim_keys() -> Vec<ClaimKey> {
    let mut keys = Vec::new();
    for tenant in TENANTS {
        for source_id in SOURCES {
            for key in KEYS {
                keys.push(claim_key(tenant, source_id, key));
            }
        }
    }
    keys
}

/// Up to three charges on distinct buckets; rates of a few per second with small bursts,
/// increments not whole milliseconds so retry rounding is exercised.
fn arb_charges() -> impl Strategy<Value = Vec<Charge>> {
    let params =
        (1u64..=1_500_000, 1u64..=3, 0u64..=400_000).prop_map(|(increment_us, burst, extra_us)| {
            (increment_us, increment_us * burst + extra_us)
        });
    (
        prop::sample::subsequence(universe_buckets(), 0..=3),
        prop::collection::vec(params, 3),
    )
        .prop_map(|(buckets, params)| {
            buckets
                .into_iter()
                .zip(params)
                .map(|(bucket, (increment_us, capacity_us))| {
                    charge(bucket, increment_us, capacity_us)
                })
                .collect()
        })
}

fn arb_claim_key() -> impl Strategy<Value = ClaimKey> {
    prop::sample::select(universe_claim_keys())
}

fn arb_hook_id() -> impl Strategy<Value = HookId> {
    prop::sample::select(HOOKS.to_vec()).prop_map(HookId::from)
}

fn arb_claim() -> impl Strategy<Value = ClaimRequest> {
    (arb_claim_key(), arb_hook_id(), 1u64..=8_000, 1u64..=5_000).prop_map(
        |(key, hook_id, ttl_ms, pending_ttl_ms)| ClaimRequest {
            key,
            hook_id,
            ttl_ms,
            pending_ttl_ms,
        },
    )
}

fn arb_command() -> impl Strategy<Value = Command> {
    let node = prop::sample::select(NODES.to_vec());
    let outcome = prop_oneof![Just(SettleOutcome::Commit), Just(SettleOutcome::Release)];
    prop_oneof![
        5 => (arb_charges(), prop::option::weighted(0.7, arb_claim()), node.clone())
            .prop_map(|(charges, claim, node)| Command::Hit { charges, claim, node }),
        1 => arb_charges().prop_map(|charges| Command::ProbeCharges { charges }),
        1 => arb_charges().prop_map(|charges| Command::Absorb { charges }),
        1 => (arb_claim_key(), arb_hook_id(), 1u64..=8_000, node.clone()).prop_map(
            |(key, hook_id, ttl_ms, node)| Command::ReconcileCommit {
                key,
                hook_id,
                ttl_ms,
                node,
            }
        ),
        4 => (arb_claim_key(), arb_hook_id(), outcome, 1u64..=8_000, node).prop_map(
            |(key, hook_id, outcome, ttl_ms, node)| Command::Settle {
                key,
                hook_id,
                outcome,
                ttl_ms,
                node,
            }
        ),
        1 => prop::sample::select(TENANTS.to_vec())
            .prop_map(|tenant| Command::Reset { tenant: TenantId::from(tenant) }),
    ]
}

/// How far an entry's stamp is from the clock: mostly 0..=3 s ahead (0 included), now and
/// then up to 1 s behind (a new leader whose wall clock lags).
fn arb_step_us() -> impl Strategy<Value = i64> {
    prop_oneof![
        2 => Just(0i64),
        8 => 0i64..=3_000_000,
        1 => -1_000_000i64..0,
    ]
}

/// One log entry: its stamp relative to the clock, and up to three commands.
fn arb_entries(min_len: usize) -> impl Strategy<Value = Vec<(i64, Vec<Command>)>> {
    prop::collection::vec(
        (arb_step_us(), prop::collection::vec(arb_command(), 0..=3)),
        min_len..40,
    )
}

fn stamp_us(clock_us: u64, step_us: i64) -> u64 {
    clock_us.max(T0_US).saturating_add_signed(step_us)
}

proptest! {
    /// Also while a snapshot holds the state frozen for a stretch of the entries (changes
    /// and expiries then go through the maps' overlays), and after it thaws.
    #[test]
    fn rules_agree_with_the_reference_model(
        entries in arb_entries(1),
        freeze_at in any::<prop::sample::Index>(),
        frozen_for in 0usize..40,
    ) {
        let mut state = FleetState::default();
        let mut model = Model::default();
        let freeze_at = freeze_at.index(entries.len());
        let mut frozen = None;
        for (i, (step_us, commands)) in entries.iter().enumerate() {
            if i == freeze_at {
                frozen = Some(state.freeze());
            }
            if i == freeze_at + frozen_for {
                frozen = None;
                state.thaw();
            }
            let now_us = stamp_us(model.clock_us, *step_us);
            let got = apply_batch(&mut state, commands, now_us);
            let want = model.apply_batch(commands, now_us);
            prop_assert_eq!(got, want, "entry {:?} at {}", commands, now_us);
            prop_assert_eq!(state.clock_us(), model.clock_us);
            for bucket in universe_buckets() {
                prop_assert_eq!(
                    state.bucket_tat_us(&bucket),
                    model.bucket_tat_us(&bucket),
                    "{:?}",
                    bucket
                );
            }
            for key in universe_claim_keys() {
                prop_assert_eq!(state.claim(&key), model.claim(&key), "{:?}", key);
            }
        }
        drop(frozen);
        state.thaw();
        let last_us = model.last_deadline_us();
        prop_assert_eq!(apply_batch(&mut state, &[], last_us), vec![]);
        prop_assert!(state.is_empty(), "stored {:?} at {}", state.len(), last_us);
        prop_assert_eq!(state.image().clock_us, last_us);
    }

    #[test]
    fn a_snapshot_mid_way_answers_like_the_original(
        entries in arb_entries(2),
        split in any::<prop::sample::Index>(),
    ) {
        let (before, after) = entries.split_at(split.index(entries.len()));
        let mut state = FleetState::default();
        for (step_us, commands) in before {
            let now_us = stamp_us(state.clock_us(), *step_us);
            apply_batch(&mut state, commands, now_us);
        }
        let mut restored = FleetState::from_image(state.image());
        prop_assert_eq!(restored.clock_us(), state.clock_us());
        prop_assert_eq!(sorted_image(&restored), sorted_image(&state));
        for (step_us, commands) in after {
            let now_us = stamp_us(state.clock_us(), *step_us);
            let original = apply_batch(&mut state, commands, now_us);
            let copy = apply_batch(&mut restored, commands, now_us);
            prop_assert_eq!(original, copy, "entry {:?} at {}", commands, now_us);
            prop_assert_eq!(sorted_image(&restored), sorted_image(&state));
        }
    }
}

// ReconcileCommit (SPEC section 7: a queued commit handed to the fleet)

fn reconcile_commit(key: &ClaimKey, hook_id: &str, node: NodeId) -> Command {
    Command::ReconcileCommit {
        key: key.clone(),
        hook_id: HookId::from(hook_id),
        ttl_ms: 5_000,
        node,
    }
}

fn pending_by(key: &ClaimKey, hook_id: &str, node: NodeId) -> Command {
    Command::Hit {
        charges: Vec::new(),
        claim: Some(ClaimRequest {
            key: key.clone(),
            hook_id: HookId::from(hook_id),
            ttl_ms: 5_000,
            pending_ttl_ms: 60_000,
        }),
        node,
    }
}

#[test]
fn a_reconciled_commit_replaces_a_late_pending_claim_of_its_own_node() {
    let key = ClaimKey {
        tenant: TenantId::from("t"),
        source_id: SourceId::from("s"),
        key: "k".into(),
    };
    let mut state = FleetState::default();
    apply_batch(&mut state, &[pending_by(&key, "retry", 7)], T0_US);
    let answers = apply_batch(&mut state, &[reconcile_commit(&key, "stored", 7)], T0_US);
    assert_eq!(answers, vec![Answer::Settle(SettleAnswer::Recreated)]);
    let record = state.claim(&key).expect("committed");
    assert_eq!(record.state, ClaimState::Committed);
    assert_eq!(record.hook_id, HookId::from("stored"));
}

#[test]
fn a_reconciled_commit_still_conflicts_with_other_nodes_and_commits() {
    let key = ClaimKey {
        tenant: TenantId::from("t"),
        source_id: SourceId::from("s"),
        key: "k".into(),
    };
    let mut state = FleetState::default();
    apply_batch(&mut state, &[pending_by(&key, "theirs", 8)], T0_US);
    let answers = apply_batch(&mut state, &[reconcile_commit(&key, "mine", 7)], T0_US);
    let conflict = Answer::Settle(SettleAnswer::Conflict {
        holder: HookId::from("theirs"),
    });
    assert_eq!(answers, vec![conflict]);
    assert_eq!(
        state.claim(&key).expect("kept").hook_id,
        HookId::from("theirs")
    );
}

#[test]
fn the_expiry_queue_pops_the_soonest_deadline_first_whatever_the_item() {
    use super::{Due, Expiring, ExpiryQueue};
    use std::sync::Arc;
    let claim = |key: &str| {
        Expiring::Claim(Arc::new(ClaimKey {
            tenant: TenantId::from("t"),
            source_id: SourceId::from("s"),
            key: key.into(),
        }))
    };
    let mut queue = ExpiryQueue::default();
    for (deadline_us, key) in [(30, "a"), (10, "z"), (20, "m"), (10, "b")] {
        queue.push(Due {
            deadline_us,
            hash: 0,
            item: claim(key),
        });
    }
    let order: Vec<u64> = std::iter::from_fn(|| queue.pop().map(|due| due.deadline_us)).collect();
    assert_eq!(order, vec![10, 10, 20, 30]);
}
