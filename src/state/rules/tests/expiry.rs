//! Sections 2 and 3: expiry and time (and the expiry queue that drives the sweep).

use super::*;

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
            absorbed: vec![],
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
