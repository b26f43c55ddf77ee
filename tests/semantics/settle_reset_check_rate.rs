//! contract §6, 10 and 11: settle, reset and check_rate.

use ankusa_fleet::pb;
use tokio::time::Instant;

use crate::common::*;
use crate::{
    assert_budget, commit_claim, drained, elapsed_ms, entries, fleet_hit, fleet_settle, node_hit,
    slow, slow_bytes, Client,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settle_reset_and_check_rate_follow_the_contract() {
    init_tracing();
    let fleet = Fleet::start(3, "").await;
    for (role, id) in entries(&fleet).await {
        let mut client = fleet.client(id).await;
        let tag = format!("settle-{role}");
        commit_branches(&mut client, &tag, role).await;
        release_branches(&mut client, &tag, role).await;
        reset_forgets_buckets_only(&mut client, &tag, role).await;
        check_rate_answers(&mut client, &tag, role).await;
        check_rate_telemetry(&fleet, id, &tag, role).await;
    }
}

async fn commit_branches(client: &mut Client, tag: &str, role: &str) {
    use pb::SettleOutcome::Commit;
    use pb::SettleStatus::{Conflict, Recreated, Settled};
    let tenant = format!("{tag}-commit");
    let none = String::new;

    tracing::info!(
        role,
        "--- contract §6 commit: pending for the hook → settled"
    );
    let taken = fleet_hit(client, vec![], Some(claim(&tenant, "own", "hook-a"))).await;
    assert_eq!(taken, Outcome::Allowed);
    let settled = fleet_settle(client, &tenant, "own", "hook-a", Commit).await;
    assert_eq!(settled, (Settled, none()));
    let seen = fleet_hit(client, vec![], Some(claim(&tenant, "own", "hook-b"))).await;
    assert_eq!(seen, Outcome::Duplicate("hook-a".to_owned()));

    tracing::info!(
        role,
        "--- contract §6 commit: already committed for the hook → settled"
    );
    let again = fleet_settle(client, &tenant, "own", "hook-a", Commit).await;
    assert_eq!(again, (Settled, none()), "commit is idempotent");
    let seen = fleet_hit(client, vec![], Some(claim(&tenant, "own", "hook-b"))).await;
    assert_eq!(seen, Outcome::Duplicate("hook-a".to_owned()));

    tracing::info!(
        role,
        "--- contract §6 commit: absent → recreated, committed"
    );
    let recreated = fleet_settle(client, &tenant, "absent", "hook-z", Commit).await;
    assert_eq!(recreated, (Recreated, none()));
    let seen = fleet_hit(client, vec![], Some(claim(&tenant, "absent", "hook-b"))).await;
    assert_eq!(seen, Outcome::Duplicate("hook-z".to_owned()));

    tracing::info!(
        role,
        "--- contract §6 commit: pending for another hook → conflict, no change"
    );
    let taken = fleet_hit(client, vec![], Some(claim(&tenant, "other", "hook-a"))).await;
    assert_eq!(taken, Outcome::Allowed);
    let conflict = fleet_settle(client, &tenant, "other", "hook-b", Commit).await;
    assert_eq!(conflict, (Conflict, "hook-a".to_owned()));
    let seen = fleet_hit(client, vec![], Some(claim(&tenant, "other", "hook-c"))).await;
    assert!(
        matches!(seen, Outcome::Pending(_)),
        "still pending for hook-a: {seen:?}"
    );
    let settled = fleet_settle(client, &tenant, "other", "hook-a", Commit).await;
    assert_eq!(settled, (Settled, none()), "the holder still commits");

    tracing::info!(
        role,
        "--- contract §6 commit: committed by another hook → conflict"
    );
    let conflict = fleet_settle(client, &tenant, "other", "hook-b", Commit).await;
    assert_eq!(conflict, (Conflict, "hook-a".to_owned()));
    let seen = fleet_hit(client, vec![], Some(claim(&tenant, "other", "hook-c"))).await;
    assert_eq!(seen, Outcome::Duplicate("hook-a".to_owned()));
}

async fn release_branches(client: &mut Client, tag: &str, role: &str) {
    use pb::SettleOutcome::{Commit, Release};
    use pb::SettleStatus::{Conflict, Settled};
    let tenant = format!("{tag}-release");
    let none = String::new;

    tracing::info!(
        role,
        "--- contract §6 release: pending for the hook → removed, settled"
    );
    let taken = fleet_hit(client, vec![], Some(claim(&tenant, "own", "hook-a"))).await;
    assert_eq!(taken, Outcome::Allowed);
    let released = fleet_settle(client, &tenant, "own", "hook-a", Release).await;
    assert_eq!(released, (Settled, none()));
    let retaken = fleet_hit(client, vec![], Some(claim(&tenant, "own", "hook-b"))).await;
    assert_eq!(retaken, Outcome::Allowed, "a released key is free");

    tracing::info!(role, "--- contract §6 release: absent → settled");
    let released = fleet_settle(client, &tenant, "absent", "hook-a", Release).await;
    assert_eq!(released, (Settled, none()));
    let taken = fleet_hit(client, vec![], Some(claim(&tenant, "absent", "hook-b"))).await;
    assert_eq!(taken, Outcome::Allowed, "releasing nothing created nothing");

    tracing::info!(
        role,
        "--- contract §6 release: pending for another hook → conflict, no change"
    );
    let taken = fleet_hit(client, vec![], Some(claim(&tenant, "other", "hook-a"))).await;
    assert_eq!(taken, Outcome::Allowed);
    let conflict = fleet_settle(client, &tenant, "other", "hook-b", Release).await;
    assert_eq!(conflict, (Conflict, "hook-a".to_owned()));
    let seen = fleet_hit(client, vec![], Some(claim(&tenant, "other", "hook-c"))).await;
    assert!(
        matches!(seen, Outcome::Pending(_)),
        "still pending for hook-a: {seen:?}"
    );

    tracing::info!(
        role,
        "--- contract §6 release: committed (same hook) → conflict, no change"
    );
    let settled = fleet_settle(client, &tenant, "other", "hook-a", Commit).await;
    assert_eq!(settled, (Settled, none()));
    let conflict = fleet_settle(client, &tenant, "other", "hook-a", Release).await;
    assert_eq!(conflict, (Conflict, "hook-a".to_owned()));
    let seen = fleet_hit(client, vec![], Some(claim(&tenant, "other", "hook-c"))).await;
    assert_eq!(seen, Outcome::Duplicate("hook-a".to_owned()));

    tracing::info!(
        role,
        "--- contract §6 release: committed by another hook → conflict"
    );
    let conflict = fleet_settle(client, &tenant, "other", "hook-b", Release).await;
    assert_eq!(conflict, (Conflict, "hook-a".to_owned()));
    let seen = fleet_hit(client, vec![], Some(claim(&tenant, "other", "hook-c"))).await;
    assert_eq!(seen, Outcome::Duplicate("hook-a".to_owned()));
}

async fn reset_forgets_buckets_only(client: &mut Client, tag: &str, role: &str) {
    tracing::info!(
        role,
        "--- contract §10: spend a tenant's buckets of both kinds, and another's"
    );
    let tenant = format!("{tag}-reset");
    let bystander = format!("{tag}-reset-bystander");
    let charges = [slow(&tenant, 2), slow_bytes(&tenant, 2)];
    for _ in 0..2 {
        let answer = fleet_hit(client, charges.to_vec(), None).await;
        assert_eq!(answer, Outcome::Allowed);
    }
    for charge in &charges {
        let answer = fleet_hit(client, vec![charge.clone()], None).await;
        assert!(matches!(answer, Outcome::RateLimited(_)), "{answer:?}");
    }
    let other = slow(&bystander, 1);
    assert_eq!(
        fleet_hit(client, vec![other.clone()], None).await,
        Outcome::Allowed
    );
    commit_claim(client, &tenant, "evt", "hook-a").await;
    let local = node_hit(hit(vec![slow(&tenant, 1)], None));
    let answer = outcome(&send_hit_full(client, local.clone()).await);
    assert_eq!(answer, Outcome::Allowed, "node-local bucket spent");
    let answer = outcome(&send_hit_full(client, local.clone()).await);
    assert!(matches!(answer, Outcome::RateLimited(_)), "{answer:?}");

    tracing::info!(
        role,
        "--- contract §10: reset forgets both kinds, fleet and node-local"
    );
    send_reset(client, &tenant).await;
    assert_budget(client, &charges[0], 2, "hooks bucket after reset").await;
    assert_budget(client, &charges[1], 2, "bytes bucket after reset").await;
    let answer = outcome(&send_hit_full(client, local).await);
    assert_eq!(answer, Outcome::Allowed, "node-local bucket after reset");

    tracing::info!(
        role,
        "--- contract §10: claims and other tenants are untouched"
    );
    let seen = fleet_hit(client, vec![], Some(claim(&tenant, "evt", "hook-b"))).await;
    assert_eq!(seen, Outcome::Duplicate("hook-a".to_owned()));
    let answer = fleet_hit(client, vec![other], None).await;
    assert!(
        matches!(answer, Outcome::RateLimited(_)),
        "another tenant's bucket is kept: {answer:?}"
    );
}

async fn check_rate_answers(client: &mut Client, tag: &str, role: &str) {
    tracing::info!(
        role,
        "--- contract §11: limit 3 per 60 s: three allowed, the fourth waits ~20 s"
    );
    let entity = format!("{tag}-entity");
    let started = Instant::now();
    for i in 0..3 {
        let answer = send_check_rate(client, check_rate(&entity, "send", 3, 60_000)).await;
        assert!(answer.allowed, "request {i} of 3: {answer:?}");
        assert_eq!(answer.retry_after_ms, 0, "an allowed answer has no retry");
        assert_eq!(answer.decided_by, pb::DecidedBy::Fleet as i32);
    }
    let denied = send_check_rate(client, check_rate(&entity, "send", 3, 60_000)).await;
    let elapsed = elapsed_ms(started);
    assert!(!denied.allowed, "the fourth is over the limit: {denied:?}");
    assert!(
        drained(20_000, elapsed).contains(&denied.retry_after_ms),
        "retry_after_ms {} after {elapsed} ms",
        denied.retry_after_ms
    );
    let other_operation = send_check_rate(client, check_rate(&entity, "read", 3, 60_000)).await;
    assert!(
        other_operation.allowed,
        "one bucket per (entity, operation)"
    );

    tracing::info!(
        role,
        "--- contract §11: entity buckets never share a hit bucket's budget"
    );
    let shared = format!("{tag}-shared");
    for charge in [slow(&shared, 1), slow_bytes(&shared, 1)] {
        assert_eq!(
            fleet_hit(client, vec![charge.clone()], None).await,
            Outcome::Allowed
        );
        let spent = fleet_hit(client, vec![charge], None).await;
        assert!(matches!(spent, Outcome::RateLimited(_)), "{spent:?}");
    }
    for operation in ["hooks", "bytes", "KIND_HOOKS", "KIND_BYTES", "1", "2"] {
        let answer = send_check_rate(client, check_rate(&shared, operation, 1, 60_000)).await;
        assert!(
            answer.allowed,
            "entity ({shared}, {operation}) has its own budget: {answer:?}"
        );
    }
    let entity_first = format!("{tag}-entity-first");
    for operation in ["hooks", "bytes"] {
        let answer = send_check_rate(client, check_rate(&entity_first, operation, 1, 60_000)).await;
        assert!(answer.allowed);
        let spent = send_check_rate(client, check_rate(&entity_first, operation, 1, 60_000)).await;
        assert!(!spent.allowed, "limit 1 is spent: {spent:?}");
    }
    assert_budget(client, &slow(&entity_first, 1), 1, "hooks after entity").await;
    assert_budget(
        client,
        &slow_bytes(&entity_first, 1),
        1,
        "bytes after entity",
    )
    .await;
}

async fn check_rate_telemetry(fleet: &Fleet, id: u64, tag: &str, role: &str) {
    tracing::info!(
        role,
        "--- contract §11: each decision is a structured event in the node's log"
    );
    let entity = format!("{tag}-entity");
    for event in ["request_allowed", "request_denied"] {
        fleet
            .wait_for(&format!("{event} for {entity} in node {id}'s log"), || {
                let found = fleet.log_lines(id, &[event, &entity, "operation", "send"]) > 0;
                async move { found.then_some(()) }
            })
            .await;
    }
}
