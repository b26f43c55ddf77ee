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

/// The queue against a sorted list of the same deadlines: each take gives exactly the
/// entries due at the clock, soonest first, while it grows past several chunks and shrinks.
#[test]
fn the_expiry_queue_gives_what_is_due_soonest_first_and_nothing_later() {
    let mut queue = ExpiryQueue::default();
    let mut model: Vec<u64> = Vec::new();
    let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
    let mut random = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let mut clock = 0;
    // 14 rounds of 1,000 pushes and takes at a clock 700 later: the queue holds 10,766
    // entries (into its third chunk of 4,096) at its largest, then the last takes empty it.
    for round in 0..20_u64 {
        let pushes = if round < 14 { 1_000 } else { 0 };
        for _ in 0..pushes {
            let deadline = clock + random() % 20_000;
            queue.push(due(deadline, "k"));
            model.push(deadline);
        }
        clock += if round < 14 { 700 } else { 4_000 };
        model.sort_unstable();
        let due_now = model.partition_point(|deadline| *deadline <= clock);
        let taken: Vec<u64> =
            std::iter::from_fn(|| queue.pop_due(clock).map(|due| due.deadline_us)).collect();
        assert_eq!(taken, model[..due_now], "round {round}, clock {clock}");
        model.drain(..due_now);
    }
    assert!(model.is_empty());
    assert!(queue.pop_due(u64::MAX).is_none());

    // Across the first chunk's end and back: 4,097 entries, down to 4,095, up to 4,098.
    for deadline in (0..4_097).rev() {
        queue.push(due(deadline, "k"));
    }
    let first: Vec<u64> =
        std::iter::from_fn(|| queue.pop_due(1).map(|due| due.deadline_us)).collect();
    assert_eq!(first, [0, 1]);
    for deadline in [5_000, 2, 4_096] {
        queue.push(due(deadline, "k"));
    }
    let all: Vec<u64> =
        std::iter::from_fn(|| queue.pop_due(u64::MAX).map(|due| due.deadline_us)).collect();
    let mut expected: Vec<u64> = (2..4_097).chain([2, 4_096, 5_000]).collect();
    expected.sort_unstable();
    assert_eq!(all, expected);

    queue.push(due(u64::MAX, "last"));
    assert!(queue.pop_due(u64::MAX - 1).is_none());
    assert_eq!(
        queue.pop_due(u64::MAX).map(|due| due.deadline_us),
        Some(u64::MAX)
    );
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
