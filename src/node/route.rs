//! Where a hit is decided, from its two scopes and what it carries (contract §8): a pure
//! function, so every combination is tested here rather than found in [`super::Node::hit`].

use super::request::{HitInput, Scope};
use crate::state::ClaimRequest;

/// The way one hit is decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route<'a> {
    /// Every part it carries is node-scoped: node-local buckets and claim index only.
    NodeOnly,
    /// Every part it carries is fleet-scoped: one command through the log.
    FleetOnly,
    /// Fleet charges, then this claim on the node's own index.
    FleetChargesNodeClaim(&'a ClaimRequest),
    /// Node charges, then this claim through the log.
    NodeChargesFleetClaim(&'a ClaimRequest),
}

impl Route<'_> {
    /// What `local_reason` says of a hit with one part in each scope (contract §8: such a
    /// hit is not a fleet-wide decision); `None` for a hit in one scope.
    pub fn node_part(&self) -> Option<&'static str> {
        match self {
            Route::NodeOnly | Route::FleetOnly => None,
            Route::FleetChargesNodeClaim(_) => Some("node scope: claim"),
            Route::NodeChargesFleetClaim(_) => Some("node scope: charges"),
        }
    }
}

/// The route of `input`. A part it does not carry does not constrain the route, so a hit
/// of node-scoped charges and no claim is `NodeOnly` whatever its dedupe scope; a hit with
/// neither part follows its scopes, fleet if either says fleet.
pub fn route(input: &HitInput) -> Route<'_> {
    let charges = (!input.charges.is_empty()).then_some(input.rate_limit_scope);
    let claim = input
        .claim
        .as_ref()
        .map(|claim| (claim, input.dedupe_scope));
    match (charges, claim) {
        (Some(Scope::Fleet), Some((claim, Scope::Node))) => Route::FleetChargesNodeClaim(claim),
        (Some(Scope::Node), Some((claim, Scope::Fleet))) => Route::NodeChargesFleetClaim(claim),
        (Some(Scope::Fleet), _) | (None, Some((_, Scope::Fleet))) => Route::FleetOnly,
        (Some(Scope::Node), _) | (None, Some((_, Scope::Node))) => Route::NodeOnly,
        (None, None) if input.rate_limit_scope == Scope::Fleet => Route::FleetOnly,
        (None, None) if input.dedupe_scope == Scope::Fleet => Route::FleetOnly,
        (None, None) => Route::NodeOnly,
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::state::{BucketKey, Charge, ClaimKey, Kind};

    const F: Scope = Scope::Fleet;
    const N: Scope = Scope::Node;

    fn input(charges: bool, claim: bool, scopes: (Scope, Scope)) -> HitInput {
        HitInput {
            charges: charges
                .then(|| Charge {
                    bucket: BucketKey::Tenant {
                        kind: Kind::Hooks,
                        tenant: "t".into(),
                    },
                    increment_us: 1,
                    capacity_us: 1,
                })
                .into_iter()
                .collect(),
            claim: claim.then(|| ClaimRequest {
                key: ClaimKey {
                    tenant: "t".into(),
                    source_id: "s".into(),
                    key: "k".into(),
                },
                hook_id: "h".into(),
                ttl_ms: 1,
                pending_ttl_ms: 1,
            }),
            timeout: Duration::from_millis(1),
            rate_limit_scope: scopes.0,
            dedupe_scope: scopes.1,
        }
    }

    /// Every combination of parts carried and scopes, with the route the contract gives it.
    #[test]
    fn every_combination_of_parts_and_scopes_has_its_route() {
        use Route::*;
        let cases: [(bool, bool, (Scope, Scope), &str); 16] = [
            (true, true, (F, F), "fleet"),
            (true, true, (N, N), "node"),
            (true, true, (F, N), "fleet charges, node claim"),
            (true, true, (N, F), "node charges, fleet claim"),
            (true, false, (F, F), "fleet"),
            (true, false, (F, N), "fleet"),
            (true, false, (N, F), "node"),
            (true, false, (N, N), "node"),
            (false, true, (F, F), "fleet"),
            (false, true, (N, F), "fleet"),
            (false, true, (F, N), "node"),
            (false, true, (N, N), "node"),
            (false, false, (F, F), "fleet"),
            (false, false, (F, N), "fleet"),
            (false, false, (N, F), "fleet"),
            (false, false, (N, N), "node"),
        ];
        for (charges, claim, scopes, expected) in cases {
            let input = input(charges, claim, scopes);
            let got = match route(&input) {
                FleetOnly => "fleet",
                NodeOnly => "node",
                FleetChargesNodeClaim(c) => {
                    assert_eq!(Some(c), input.claim.as_ref());
                    "fleet charges, node claim"
                }
                NodeChargesFleetClaim(c) => {
                    assert_eq!(Some(c), input.claim.as_ref());
                    "node charges, fleet claim"
                }
            };
            assert_eq!(
                got, expected,
                "charges {charges}, claim {claim}, scopes {scopes:?}"
            );
        }
    }

    /// Only a hit with one part in each scope names a node part (contract §8).
    #[test]
    fn only_a_mixed_hit_names_its_node_scoped_part() {
        let both = input(true, true, (F, N));
        assert_eq!(route(&both).node_part(), Some("node scope: claim"));
        let both = input(true, true, (N, F));
        assert_eq!(route(&both).node_part(), Some("node scope: charges"));
        for scopes in [(F, F), (N, N)] {
            assert_eq!(route(&input(true, true, scopes)).node_part(), None);
        }
    }
}
