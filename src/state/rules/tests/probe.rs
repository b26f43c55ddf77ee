//! ProbeCharges: a hit's charges answered without writing anything.

use super::*;

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
