//! The state limits (`StateLimits`): a command that would create a claim or a bucket beyond
//! one is refused with the limit's name and writes nothing; room comes back as items expire
//! or are removed; a limit of its own tenant or owner leaves the others alone.

use super::*;
use crate::state::model::{Refusal, StateLimit, StateLimits};
use crate::state::rules::apply_batch_within;

fn within(
    claims_max: u64,
    buckets_max: u64,
    tenant_claims_max: u64,
    tenant_buckets_max: u64,
) -> StateLimits {
    StateLimits {
        claims_max,
        buckets_max,
        tenant_claims_max,
        tenant_buckets_max,
    }
}

fn run_within(
    state: &mut FleetState,
    now_us: u64,
    limits: &StateLimits,
    command: Command,
) -> Answer {
    let mut answers = apply_batch_within(state, &[command], now_us, limits);
    answers.remove(0)
}

fn exhausted(limit: StateLimit) -> Answer {
    Answer::Refused(Refusal::Exhausted { limit })
}

fn claim_hit(tenant: &str, key: &str) -> Command {
    let key = claim_key(tenant, "src", key);
    hit_cmd(Vec::new(), Some(claim(&key, "h", 60_000, 1_000)))
}

#[test]
fn claims_max_refuses_the_next_claim_and_writes_nothing() {
    let mut state = FleetState::default();
    let limits = within(2, 10, 10, 10);
    for key in ["a", "b"] {
        let answer = run_within(&mut state, T0_US, &limits, claim_hit("t", key));
        assert_eq!(answer, Answer::Hit(HitAnswer::Allowed));
    }
    let charged = hit_cmd(
        vec![ten_per_sec(hooks("t"))],
        Some(claim(&claim_key("u", "src", "c"), "h", 60_000, 1_000)),
    );
    let before = state.image();
    assert_eq!(
        run_within(&mut state, T0_US, &limits, charged.clone()),
        exhausted(StateLimit::ClaimsMax)
    );
    assert_eq!(
        state.image(),
        before,
        "a refused hit spends none of its charges"
    );
    assert_eq!(state.len(), (0, 2));
    // A retry of a claim already held needs no room.
    assert_eq!(
        run_within(&mut state, T0_US, &limits, claim_hit("t", "a")),
        Answer::Hit(HitAnswer::Allowed)
    );
    // The pending claims expire after 1 s: room again.
    assert_eq!(
        run_within(&mut state, T0_US + 2 * SEC_US, &limits, charged),
        Answer::Hit(HitAnswer::Allowed)
    );
}

#[test]
fn a_settle_that_recreates_an_absent_claim_counts_like_a_claim() {
    let mut state = FleetState::default();
    let limits = within(1, 10, 1, 10);
    let held = claim_key("t", "src", "held");
    assert_eq!(
        run_within(&mut state, T0_US, &limits, commit_cmd(&held, "h", 60_000)),
        Answer::Settle(SettleAnswer::Recreated)
    );
    let absent = claim_key("u", "src", "absent");
    assert_eq!(
        run_within(&mut state, T0_US, &limits, commit_cmd(&absent, "h", 60_000)),
        exhausted(StateLimit::ClaimsMax)
    );
    assert!(state.claim(&absent).is_none(), "nothing written");
    // A commit of the claim that is there needs no room; a release frees it.
    assert_eq!(
        run_within(&mut state, T0_US, &limits, commit_cmd(&held, "h", 60_000)),
        Answer::Settle(SettleAnswer::Settled)
    );
    let reconcile = Command::ReconcileCommit {
        key: absent.clone(),
        hook_id: "h".into(),
        ttl_ms: 60_000,
        node: NODE,
    };
    assert_eq!(
        run_within(&mut state, T0_US, &limits, reconcile),
        exhausted(StateLimit::ClaimsMax),
        "a reconciled commit is held to the limit too"
    );
}

#[test]
fn tenant_claims_max_refuses_one_tenant_and_leaves_the_others() {
    let mut state = FleetState::default();
    let limits = within(100, 100, 2, 100);
    for key in ["a", "b"] {
        run_within(&mut state, T0_US, &limits, claim_hit("flood", key));
    }
    assert_eq!(
        run_within(&mut state, T0_US, &limits, claim_hit("flood", "c")),
        exhausted(StateLimit::TenantClaimsMax)
    );
    let settle = commit_cmd(&claim_key("flood", "src", "d"), "h", 60_000);
    assert_eq!(
        run_within(&mut state, T0_US, &limits, settle),
        exhausted(StateLimit::TenantClaimsMax)
    );
    assert_eq!(
        run_within(&mut state, T0_US, &limits, claim_hit("quiet", "a")),
        Answer::Hit(HitAnswer::Allowed)
    );
    assert_eq!(state.tenant_claims(&"flood".into()), 2);
}

#[test]
fn buckets_max_counts_every_bucket_a_hit_would_create() {
    let mut state = FleetState::default();
    let limits = within(100, 3, 100, 100);
    let two = hit_cmd(vec![ten_per_sec(hooks("a")), ten_per_sec(bytes("a"))], None);
    assert_eq!(
        run_within(&mut state, T0_US, &limits, two),
        Answer::Hit(HitAnswer::Allowed)
    );
    // One live bucket and two new ones: three would be fine, four is not.
    let three = hit_cmd(
        vec![
            ten_per_sec(hooks("a")),
            ten_per_sec(hooks("b")),
            ten_per_sec(hooks("c")),
        ],
        None,
    );
    let before = state.image();
    assert_eq!(
        run_within(&mut state, T0_US, &limits, three),
        exhausted(StateLimit::BucketsMax)
    );
    assert_eq!(
        state.image(),
        before,
        "no charge spent, not even on the live bucket"
    );
    let one_more = hit_cmd(vec![ten_per_sec(hooks("a")), ten_per_sec(hooks("b"))], None);
    assert_eq!(
        run_within(&mut state, T0_US, &limits, one_more),
        Answer::Hit(HitAnswer::Allowed)
    );
    // A reset frees its tenant's buckets.
    run_within(&mut state, T0_US, &limits, reset_cmd("a"));
    assert_eq!(state.len().0, 1);
}

#[test]
fn tenant_buckets_max_counts_per_owner() {
    let mut state = FleetState::default();
    let limits = within(100, 100, 100, 2);
    for operation in ["read", "write"] {
        let command = hit_cmd(vec![ten_per_sec(entity("user-1", operation))], None);
        assert_eq!(
            run_within(&mut state, T0_US, &limits, command),
            Answer::Hit(HitAnswer::Allowed)
        );
    }
    let third = hit_cmd(vec![ten_per_sec(entity("user-1", "delete"))], None);
    assert_eq!(
        run_within(&mut state, T0_US, &limits, third),
        exhausted(StateLimit::TenantBucketsMax)
    );
    let other = hit_cmd(vec![ten_per_sec(entity("user-2", "delete"))], None);
    assert_eq!(
        run_within(&mut state, T0_US, &limits, other),
        Answer::Hit(HitAnswer::Allowed)
    );
    // Two new buckets of one owner in one hit count twice.
    let mut fresh = FleetState::default();
    let one_each = within(100, 100, 100, 1);
    let both = hit_cmd(vec![ten_per_sec(hooks("t")), ten_per_sec(bytes("t"))], None);
    assert_eq!(
        run_within(&mut fresh, T0_US, &one_each, both),
        exhausted(StateLimit::TenantBucketsMax)
    );
}

#[test]
fn an_absorb_beyond_buckets_max_drops_only_the_new_buckets() {
    let mut state = FleetState::default();
    let limits = within(100, 1, 100, 100);
    run_within(
        &mut state,
        T0_US,
        &limits,
        hit_cmd(vec![ten_per_sec(hooks("a"))], None),
    );
    let absorb = Command::AbsorbRound {
        node: NODE,
        round: 1,
        charges: vec![ten_per_sec(hooks("a")), ten_per_sec(hooks("b"))],
    };
    assert_eq!(
        run_within(&mut state, T0_US, &limits, absorb),
        Answer::Absorbed
    );
    assert_eq!(state.len().0, 1, "no bucket beyond the limit");
    assert_eq!(
        state.bucket_tat_us(&hooks("a")),
        Some(T0_US + 2 * TEN_PER_SEC_INCREMENT_US),
        "the live bucket still takes its charge"
    );
    assert_eq!(state.absorbed_round(NODE), 1);
}

/// The counts the limits are held to are rebuilt from a snapshot's image, so a restored
/// replica refuses exactly what the original does.
#[test]
fn a_restored_state_counts_what_it_holds() {
    let mut state = FleetState::default();
    let limits = within(100, 100, 2, 100);
    for key in ["a", "b"] {
        run_within(&mut state, T0_US, &limits, claim_hit("t", key));
    }
    let mut restored = FleetState::from_image(state.image());
    assert_eq!(
        run_within(&mut restored, T0_US, &limits, claim_hit("t", "c")),
        exhausted(StateLimit::TenantClaimsMax)
    );
}
