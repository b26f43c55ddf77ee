//! contract §10: reset; section 11: entity buckets.

use super::*;

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
