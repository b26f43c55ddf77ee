//! One fleet: shared budgets, shared claims, expiry.

use ankusa_fleet::pb;
use tokio::time::Instant;

use crate::common::*;
use crate::{commit_claim, elapsed_ms, entries, fleet_hit, fleet_settle, slow, Client};

/// A claim ttl short enough to wait out, long enough that two calls on a loaded machine
/// still see the claim before it expires.
const SHORT_TTL_MS: u64 = 1_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fleet_shares_budgets_and_claims_and_expires_them() {
    init_tracing();
    let fleet = Fleet::start(3, "").await;
    let entries = entries(&fleet).await;
    let mut clients = Vec::new();
    for id in 1..=3 {
        clients.push((id, fleet.client(id).await));
    }

    tracing::info!("--- one burst of 6, hit concurrently through all three nodes, allows 6");
    let charge = slow("shared-burst", 6);
    let racers = (0..12).map(|i| {
        let (_, client) = &clients[i % 3];
        let mut client = client.clone();
        let charge = charge.clone();
        async move { fleet_hit(&mut client, vec![charge], None).await }
    });
    let answers = futures::future::join_all(racers).await;
    let allowed = answers.iter().filter(|a| **a == Outcome::Allowed).count();
    assert_eq!(
        allowed, 6,
        "exactly the capacity passes fleet-wide: {answers:?}"
    );
    for (id, client) in &mut clients {
        let answer = fleet_hit(client, vec![charge.clone()], None).await;
        assert!(
            matches!(answer, Outcome::RateLimited(_)),
            "node {id}: {answer:?}"
        );
    }

    tracing::info!("--- one key claimed concurrently by three hooks through three nodes");
    let racers = clients.iter().map(|(id, client)| {
        let mut client = client.clone();
        let request = claim("shared-race", "evt", &format!("hook-{id}"));
        async move { fleet_hit(&mut client, vec![], Some(request)).await }
    });
    let answers = futures::future::join_all(racers).await;
    let allowed = answers.iter().filter(|a| **a == Outcome::Allowed).count();
    let pending = answers
        .iter()
        .filter(|a| matches!(a, Outcome::Pending(_)))
        .count();
    assert_eq!((allowed, pending), (1, 2), "one holder: {answers:?}");

    tracing::info!("--- an answer from one node is visible at once from every other");
    for a in 0..3 {
        for b in 0..3 {
            if a == b {
                continue;
            }
            let key = format!("visible-{a}-{b}");
            commit_claim(&mut clients[a].1, "shared-visible", &key, "hook-a").await;
            let seen = fleet_hit(
                &mut clients[b].1,
                vec![],
                Some(claim("shared-visible", &key, "hook-b")),
            )
            .await;
            assert_eq!(
                seen,
                Outcome::Duplicate("hook-a".to_owned()),
                "commit via node {}, hit via node {}",
                clients[a].0,
                clients[b].0
            );
            let charge = slow(&format!("visible-{a}-{b}"), 1);
            let spent = fleet_hit(&mut clients[a].1, vec![charge.clone()], None).await;
            assert_eq!(spent, Outcome::Allowed);
            let seen = fleet_hit(&mut clients[b].1, vec![charge], None).await;
            assert!(matches!(seen, Outcome::RateLimited(_)), "{seen:?}");
        }
    }

    for (role, id) in entries {
        let mut client = fleet.client(id).await;
        let tenant = format!("expiry-{role}");
        pending_claim_expires(&fleet, &mut client, &tenant, role).await;
        committed_claim_expires(&fleet, &mut client, &tenant, role).await;
    }
}

/// Waits until `hook_id` can take `key`, retrying (a blocked claim writes nothing).
async fn wait_until_free(fleet: &Fleet, client: &Client, tenant: &str, key: &str, hook_id: &str) {
    let started = Instant::now();
    fleet
        .wait_for("the claim expired", || {
            let mut client = client.clone();
            let request = claim(tenant, key, hook_id);
            async move {
                let answer = fleet_hit(&mut client, vec![], Some(request)).await;
                match answer {
                    Outcome::Allowed => Some(()),
                    Outcome::Pending(_) | Outcome::Duplicate(_) => None,
                    other => panic!("a claim-only hit answered {other:?}"),
                }
            }
        })
        .await;
    tracing::info!(elapsed_ms = elapsed_ms(started), key, "claim expired");
}

async fn pending_claim_expires(fleet: &Fleet, client: &mut Client, tenant: &str, role: &str) {
    tracing::info!(
        role,
        "--- contract §2/5: a pending claim expires after pending_ttl_ms"
    );
    let mut short = claim(tenant, "pending", "hook-a");
    short.pending_ttl_ms = SHORT_TTL_MS;
    assert_eq!(
        fleet_hit(client, vec![], Some(short)).await,
        Outcome::Allowed
    );
    let blocked = fleet_hit(client, vec![], Some(claim(tenant, "pending", "hook-b"))).await;
    let Outcome::Pending(retry_after_ms) = blocked else {
        panic!("hook-a holds the claim for now, got {blocked:?}");
    };
    assert!(
        (1..=SHORT_TTL_MS).contains(&retry_after_ms),
        "{retry_after_ms}"
    );
    wait_until_free(fleet, client, tenant, "pending", "hook-b").await;
    let late = fleet_hit(client, vec![], Some(claim(tenant, "pending", "hook-a"))).await;
    assert!(
        matches!(late, Outcome::Pending(_)),
        "hook-b holds it now, hook-a waits: {late:?}"
    );
    let late_commit = fleet_settle(
        client,
        tenant,
        "pending",
        "hook-a",
        pb::SettleOutcome::Commit,
    )
    .await;
    assert_eq!(
        late_commit,
        (pb::SettleStatus::Conflict, "hook-b".to_owned())
    );
}

async fn committed_claim_expires(fleet: &Fleet, client: &mut Client, tenant: &str, role: &str) {
    tracing::info!(
        role,
        "--- contract §6: a committed claim expires after ttl_ms"
    );
    let mut short = claim(tenant, "committed", "hook-a");
    short.ttl_ms = SHORT_TTL_MS;
    assert_eq!(
        fleet_hit(client, vec![], Some(short)).await,
        Outcome::Allowed
    );
    let settled = fleet_settle(
        client,
        tenant,
        "committed",
        "hook-a",
        pb::SettleOutcome::Commit,
    )
    .await;
    assert_eq!(settled, (pb::SettleStatus::Settled, String::new()));
    let seen = fleet_hit(client, vec![], Some(claim(tenant, "committed", "hook-b"))).await;
    assert_eq!(seen, Outcome::Duplicate("hook-a".to_owned()));
    wait_until_free(fleet, client, tenant, "committed", "hook-b").await;

    tracing::info!(
        role,
        "--- contract §6: a recreated claim lives for the settle's ttl_ms"
    );
    let mut recreate = settle(tenant, "recreated", "hook-a", pb::SettleOutcome::Commit);
    recreate.ttl_ms = SHORT_TTL_MS;
    let response = send_settle(client, recreate).await;
    assert_eq!(response.status, pb::SettleStatus::Recreated as i32);
    let seen = fleet_hit(client, vec![], Some(claim(tenant, "recreated", "hook-b"))).await;
    assert_eq!(seen, Outcome::Duplicate("hook-a".to_owned()));
    wait_until_free(fleet, client, tenant, "recreated", "hook-b").await;
}
