use super::*;
use crate::state::ClaimKey;

/// The local reserve is an eighth of a short timeout and capped for a long one, so the
/// fleet keeps nearly all of a timeout (docs/decisions/023).
#[test]
fn the_local_reserve_is_an_eighth_of_the_timeout_at_most_its_cap() {
    let ms = std::time::Duration::from_millis;
    assert_eq!(local_reserve(ms(300), SETTLE_RESERVE_MAX), ms(25));
    assert_eq!(local_reserve(ms(80), SETTLE_RESERVE_MAX), ms(10));
    assert_eq!(local_reserve(ms(1_000), HIT_RESERVE_MAX), ms(5));
    assert_eq!(local_reserve(ms(16), HIT_RESERVE_MAX), ms(2));
    assert_eq!(local_reserve(ms(0), HIT_RESERVE_MAX), ms(0));
    assert_eq!(local_reserve(ms(300), RESET_RESERVE_MAX), ms(5));
}

/// Contract §8: one part in each scope says local, naming the node-scoped part, and then
/// why the fleet part was local too, when it was.
#[test]
fn a_mixed_decision_names_its_node_part_then_why_the_fleet_was_not_asked() {
    let claim = ClaimRequest {
        key: ClaimKey {
            tenant: "t".into(),
            source_id: "s".into(),
            key: "k".into(),
        },
        hook_id: "h".into(),
        ttl_ms: 1,
        pending_ttl_ms: 1,
    };
    let reason = |route: &Route, missed: Option<&str>| match mixed_decision(
        HitAnswer::Allowed,
        route,
        missed.map(str::to_owned),
    ) {
        Decided {
            answer: HitAnswer::Allowed,
            decided_by: DecidedBy::Local { reason },
        } => reason,
        other => panic!("{other:?}"),
    };
    let node_claim = Route::FleetChargesNodeClaim(&claim);
    let node_charges = Route::NodeChargesFleetClaim(&claim);
    assert_eq!(reason(&node_claim, None), "node scope: claim");
    assert_eq!(reason(&node_charges, None), "node scope: charges");
    assert_eq!(
        reason(&node_claim, Some("no leader")),
        "node scope: claim; no leader"
    );
    assert_eq!(
        reason(&node_charges, Some("deadline")),
        "node scope: charges; deadline"
    );
}
