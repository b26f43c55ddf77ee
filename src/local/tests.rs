use super::*;
use crate::clock::{wall_clock_us, ManualClock};
use crate::state::{BucketKey, ClaimKey, EntityId, Kind, TenantId};
use std::time::Duration;

const BOUND: Duration = Duration::from_millis(500);

/// The machine's clocks, bounded as a node's default `max_clock_offset_ms`.
pub(crate) fn system_time() -> Arc<LocalTime> {
    Arc::new(LocalTime::system(BOUND))
}

/// A node-scope bucket of 10 at once refilling 10 per second, and a claim pending for
/// a minute, on an engine whose wall clock is set 90 minutes forward and then back:
/// the bucket refills at the monotonic clock's rate through
/// both steps, and the claim stays pending until its minute is up. Before the engine
/// bounded its time, the forward step ended the claim at once, and the step back froze
/// the bucket for 90 minutes.
#[test]
fn a_wall_clock_set_90_minutes_off_neither_ends_claims_nor_freezes_buckets() {
    const MINUTE_US: i64 = 60_000_000;
    let dir = tempfile::tempdir().expect("tempdir");
    let clock = Arc::new(ManualClock::new(1_800_000_000_000_000));
    let time = Arc::new(LocalTime::new(clock.clone(), BOUND));
    let engine = LocalEngine::open(&dir.path().join("claims.journal"), 1, time).expect("open");
    let bucket = [charge(tenant(Kind::Hooks, "t"), 100_000)];
    let drain = || {
        let mut allowed = 0;
        while engine.hit(&bucket, None).expect("hit") == HitAnswer::Allowed {
            allowed += 1;
        }
        allowed
    };
    assert_eq!(drain(), 10, "a full bucket");
    let first = claim_request("k", "h1");
    assert_eq!(
        engine.hit(&[], Some(&first)).expect("claim"),
        HitAnswer::Allowed
    );
    let second = claim_request("k", "h2");

    clock.step_wall(90 * MINUTE_US);
    assert!(
        matches!(
            engine.hit(&[], Some(&second)),
            Ok(HitAnswer::Pending { .. })
        ),
        "still pending after the step forward"
    );
    clock.advance(Duration::from_millis(300));
    // 300 ms and at most the bound's 500 ms ahead: 3 to 8 refilled, not 10.
    let refilled = drain();
    assert!((3..=8).contains(&refilled), "{refilled} refilled");

    clock.step_wall(-90 * MINUTE_US);
    clock.advance(Duration::from_secs(2));
    assert_eq!(
        drain(),
        10,
        "refilled at the monotonic rate after the step back"
    );
    assert!(
        matches!(
            engine.hit(&[], Some(&second)),
            Ok(HitAnswer::Pending { .. })
        ),
        "still pending"
    );
    clock.advance(Duration::from_secs(60));
    assert_eq!(
        engine.hit(&[], Some(&second)).expect("claim"),
        HitAnswer::Allowed,
        "the minute is up"
    );
}

fn charge(bucket: BucketKey, increment_us: u64) -> Charge {
    Charge {
        bucket,
        increment_us,
        capacity_us: 1_000_000,
    }
}

fn tenant(kind: Kind, tenant: &str) -> BucketKey {
    BucketKey::Tenant {
        kind,
        tenant: tenant.into(),
    }
}

fn claim_request(key: &str, hook_id: &str) -> ClaimRequest {
    ClaimRequest {
        key: ClaimKey {
            tenant: "t".into(),
            source_id: "s".into(),
            key: key.into(),
        },
        hook_id: hook_id.into(),
        ttl_ms: 3_600_000,
        pending_ttl_ms: 60_000,
    }
}

/// The fleet's record of a claim pending for `hook_id`, live for another minute.
fn replica_pending(hook_id: &str) -> ReplicaView {
    ReplicaView {
        tats_us: vec![None],
        claim: Some(ClaimRecord {
            hook_id: hook_id.into(),
            node: 2,
            state: crate::state::ClaimState::Pending,
            expires_at_us: wall_clock_us() + 60_000_000,
            ttl_ms: 3_600_000,
        }),
    }
}

#[test]
fn a_retry_of_a_hook_the_fleet_holds_pending_is_allowed_without_a_charge() {
    let dir = tempfile::tempdir().expect("tempdir");
    let engine =
        LocalEngine::open(&dir.path().join("claims.journal"), 1, system_time()).expect("open");
    let charges = [charge(tenant(Kind::Hooks, "t"), 10)];

    let retry = claim_request("k", "h1");
    let (answer, spent) = engine
        .hit_seeded(&charges, Some(&retry), &replica_pending("h1"))
        .expect("hit");
    assert_eq!((answer, spent), (HitAnswer::Allowed, false));
    assert!(
        engine.pending_claims().is_empty(),
        "no local claim taken, no expiry extended"
    );

    // This node's own commit of the hook still answers duplicate.
    let committed = claim_request("committed", "h1");
    let commit = Command::Settle {
        key: committed.key.clone(),
        hook_id: "h1".into(),
        outcome: crate::state::SettleOutcome::Commit,
        ttl_ms: 3_600_000,
        node: 1,
    };
    engine.apply(&commit, Some(&committed.key)).expect("commit");
    let (answer, spent) = engine
        .hit_seeded(&charges, Some(&committed), &replica_pending("h1"))
        .expect("hit");
    assert_eq!(
        (answer, spent),
        (
            HitAnswer::Duplicate {
                hook_id: "h1".into()
            },
            false
        )
    );
}

#[test]
fn a_reset_tenant_leaves_the_ledger_with_its_buckets_of_both_kinds() {
    let ledger = ChargeLedger::default();
    let entity = BucketKey::Entity {
        entity_id: EntityId::from("t"),
        operation: "op".into(),
    };
    ledger.record(&[
        charge(tenant(Kind::Hooks, "t"), 10),
        charge(tenant(Kind::Bytes, "t"), 20),
        charge(tenant(Kind::Hooks, "other"), 30),
        charge(entity.clone(), 40),
    ]);
    ledger.forget_tenant(&TenantId::from("t"));
    let mut left: Vec<(BucketKey, u64)> = ledger
        .next_round(0, 1)
        .expect("a round")
        .charges
        .into_iter()
        .map(|charge| (charge.bucket, charge.increment_us))
        .collect();
    left.sort();
    assert_eq!(left, [(tenant(Kind::Hooks, "other"), 30), (entity, 40)]);
}

/// A commit the settle queue lost (a torn last append dropped) is queued again from the fallback journal, once; one still queued is not doubled.
#[tokio::test]
async fn a_commit_the_settle_queue_lost_is_queued_again_from_the_journal() {
    let dir = tempfile::tempdir().expect("tempdir");
    let budget = crate::config::FallbackBudget::Full;
    let commit = |key: &str| Command::Settle {
        key: claim_request(key, "h").key,
        hook_id: "h".into(),
        outcome: crate::state::SettleOutcome::Commit,
        ttl_ms: 3_600_000,
        node: 1,
    };
    {
        let disk = settle_queue::tests::sled(dir.path());
        let fallback = Fallback::open(dir.path(), &disk, 1, budget, system_time()).expect("open");
        for key in ["kept", "lost"] {
            let request = claim_request(key, "h");
            fallback.engine.hit(&[], Some(&request)).expect("hit");
            fallback
                .engine
                .apply(&commit(key), Some(&request.key))
                .expect("commit");
            fallback.engine.sync().await.expect("sync");
            let queued = settle_queue::QueuedSettle {
                key: request.key,
                hook_id: "h".into(),
                outcome: crate::state::SettleOutcome::Commit,
                ttl_ms: 3_600_000,
            };
            fallback.queue.push(&queued).await.expect("queue");
        }
        let (lost, _) = fallback.queue.all().remove(1);
        fallback.queue.remove(lost).expect("lose it");
        fallback.queue.sync().await.expect("sync");
    }
    let queued_keys = |fallback: &Fallback| {
        let mut keys: Vec<String> = fallback
            .queue
            .all()
            .into_iter()
            .map(|(_, settle)| settle.key.key.to_string())
            .collect();
        keys.sort();
        keys
    };
    for _ in 0..2 {
        // sled lets go of its file lock a moment after the last handle is dropped.
        let disk = settle_queue::tests::sled(dir.path());
        let fallback = Fallback::open(dir.path(), &disk, 1, budget, system_time()).expect("reopen");
        assert_eq!(queued_keys(&fallback), ["kept", "lost"]);
        disk.flush_to_disk().expect("flush");
    }
}
