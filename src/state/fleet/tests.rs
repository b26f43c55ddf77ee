use super::*;
use crate::state::model::{ClaimState, Kind};

fn due(deadline_us: u64, key: &str) -> Due {
    Due {
        deadline_us,
        hash: 0,
        item: Expiring::Claim(Arc::new(ClaimKey {
            tenant: "t".into(),
            source_id: "s".into(),
            key: key.into(),
        })),
    }
}

/// Everything due at the clock, `(deadline, key)` sorted (the queue's order inside one
/// millisecond is none).
fn take_due(queue: &mut ExpiryQueue, clock_us: u64) -> Vec<(u64, String)> {
    let mut taken: Vec<(u64, String)> = std::iter::from_fn(|| queue.pop_due(clock_us))
        .map(|due| match due.item {
            Expiring::Claim(key) => (due.deadline_us, key.key.to_string()),
            Expiring::Bucket(_) => unreachable!("only claims queued here"),
        })
        .collect();
    taken.sort();
    taken
}

#[test]
fn the_expiry_queue_gives_what_is_due_at_the_clock_and_nothing_later() {
    let mut queue = ExpiryQueue::default();
    // Two milliseconds, the second only partly due at the clocks below.
    for (deadline_us, key) in [
        (2_500, "c"),
        (1_010, "z"),
        (2_001, "m"),
        (1_999, "b"),
        (2_999, "e"),
    ] {
        queue.push(due(deadline_us, key));
    }
    assert_eq!(take_due(&mut queue, 999), []);
    let owned = |taken: &[(u64, &str)]| -> Vec<(u64, String)> {
        taken
            .iter()
            .map(|(at, key)| (*at, key.to_string()))
            .collect()
    };
    assert_eq!(
        take_due(&mut queue, 1_999),
        owned(&[(1_010, "z"), (1_999, "b")])
    );
    assert_eq!(
        take_due(&mut queue, 2_500),
        owned(&[(2_001, "m"), (2_500, "c")])
    );
    assert_eq!(take_due(&mut queue, 2_998), []);
    queue.push(due(1_500, "late"));
    assert_eq!(
        take_due(&mut queue, 3_000),
        owned(&[(1_500, "late"), (2_999, "e")])
    );
    assert_eq!(take_due(&mut queue, u64::MAX), []);
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
