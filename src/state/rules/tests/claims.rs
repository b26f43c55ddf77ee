//! contract §5: hit, step 3 (the claim) and step 4 (take).

use super::*;

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
