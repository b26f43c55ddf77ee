//! Snapshots: image() / from_image().

use super::*;

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
        absorbed: vec![],
    };
    let state = FleetState::from_image(image);
    assert_eq!(state.clock_us(), T0_US);
    assert_eq!(state.len(), (1, 0));
    assert_eq!(state.bucket_tat_us(&hooks("b")), Some(T0_US + 1));
    assert_eq!(state.claim(&key), None);
}
