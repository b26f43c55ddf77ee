use super::*;
use crate::state::model::{ClaimState, Kind};

#[test]
fn the_expiry_queue_pops_the_soonest_deadline_first_whatever_the_item() {
    let claim = |key: &str| {
        Expiring::Claim(Arc::new(ClaimKey {
            tenant: "t".into(),
            source_id: "s".into(),
            key: key.into(),
        }))
    };
    let mut queue = ExpiryQueue::default();
    for (deadline_us, key) in [(30, "a"), (10, "z"), (20, "m"), (10, "b")] {
        queue.push(Due {
            deadline_us,
            hash: 0,
            item: claim(key),
        });
    }
    let order: Vec<u64> = std::iter::from_fn(|| queue.pop().map(|due| due.deadline_us)).collect();
    assert_eq!(order, vec![10, 10, 20, 30]);
}

/// The digest follows the live content, not the order items came in, and expired items
/// do not count.
#[test]
fn the_digest_is_the_live_content_in_any_order() {
    let bucket = |tenant: &str| BucketKey::Tenant {
        kind: Kind::Hooks,
        tenant: tenant.into(),
    };
    let claim = |key: &str, expires_at_us: u64| {
        let key = ClaimKey {
            tenant: "t".into(),
            source_id: "s".into(),
            key: key.into(),
        };
        let record = ClaimRecord {
            hook_id: "h".into(),
            node: 1,
            state: ClaimState::Pending,
            expires_at_us,
            ttl_ms: 1_000,
        };
        (key, record)
    };
    let image = StateImage {
        clock_us: 100,
        buckets: vec![(bucket("a"), 200), (bucket("b"), 300)],
        claims: vec![claim("x", 500), claim("y", 600)],
        absorbed: vec![(1, 10), (2, 20)],
    };
    let mut reversed = image.clone();
    reversed.buckets.reverse();
    reversed.claims.reverse();
    let digest = FleetState::from_image(image.clone()).digest();
    assert_eq!(digest, FleetState::from_image(reversed).digest());

    let mut expired_extra = image.clone();
    expired_extra.claims.push(claim("z", 50));
    assert_eq!(
        digest,
        FleetState::from_image(expired_extra).digest(),
        "an expired claim is not content"
    );
    let mut changed = image.clone();
    changed.buckets[0].1 = 201;
    assert_ne!(digest, FleetState::from_image(changed).digest());
    let mut absorbed_more = image.clone();
    absorbed_more.absorbed[1].1 = 21;
    assert_ne!(
        digest,
        FleetState::from_image(absorbed_more).digest(),
        "the absorb rounds are content"
    );
    let mut later = image;
    later.clock_us = 101;
    assert_ne!(digest, FleetState::from_image(later).digest());
}
