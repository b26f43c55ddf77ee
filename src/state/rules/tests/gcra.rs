//! contract §4: GCRA.

use super::*;

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
