//! contract §6: settle.

use super::*;

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
