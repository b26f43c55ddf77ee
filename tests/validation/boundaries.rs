//! The boundary values of every input rule are valid: the contract's, on a fleet whose
//! ceilings (`ttl_ms_max`, `capacity_us_max`) are the contract's own maxima.

use ankusa_fleet::pb;

use crate::common::*;
use crate::{long, wide, Client, GHOST_INCREMENT_US, THIRTY_DAYS_MS, YEAR_MS, YEAR_US};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn boundary_values_are_valid() {
    init_tracing();
    let fleet = Fleet::start(3, CONTRACT_CEILINGS).await;
    let leader = fleet.wait_for_leader(&[1, 2, 3]).await;
    let follower = (1..=3).find(|id| *id != leader).expect("a follower");

    for (role, id) in [("leader", leader), ("follower", follower)] {
        let mut client = fleet.client(id).await;
        let tag = format!("edge-{role}");
        hit_boundaries(&mut client, &tag, role).await;
        claim_boundaries(&mut client, &tag, role).await;
        settle_reset_and_check_rate_boundaries(&mut client, &tag, role).await;
    }
}

/// The node ceilings at the contract's maxima (30 days, one year); their defaults are lower.
const CONTRACT_CEILINGS: &str = "ttl_ms_max = 2592000000\ncapacity_us_max = 31536000000000";

/// A tenant of exactly `bytes` bytes, distinct per `tag`.
fn sized(tag: &str, bytes: usize) -> String {
    let mut text = format!("{tag}-");
    text.push_str(&long(bytes - text.len()));
    text
}

async fn hit_boundaries(client: &mut Client, tag: &str, role: &str) {
    tracing::info!(
        role,
        "--- a 256-byte tenant, capacity == increment: a budget of one"
    );
    let charge = hooks(&sized(tag, 256), GHOST_INCREMENT_US, GHOST_INCREMENT_US);
    let (answer, _) = send_hit(client, hit(vec![charge.clone()], None)).await;
    assert_eq!(answer, Outcome::Allowed);
    let (answer, _) = send_hit(client, hit(vec![charge], None)).await;
    assert!(matches!(answer, Outcome::RateLimited(_)), "{answer:?}");

    tracing::info!(role, "--- 256 bytes in 128 two-byte characters is valid");
    let mut tenant = format!("{tag}-");
    tenant.push_str(&wide((256 - tenant.len()) / 2));
    tenant.push_str(&long(256 - tenant.len()));
    assert_eq!(tenant.len(), 256);
    let (answer, _) = send_hit(client, hit(vec![hooks(&tenant, 1, 1)], None)).await;
    assert_eq!(answer, Outcome::Allowed);

    tracing::info!(role, "--- 16 charges, and one tenant under both kinds");
    let mut charges: Vec<pb::Charge> = (0..15)
        .map(|i| hooks(&format!("{tag}-many-{i}"), 1, 1))
        .collect();
    charges.push(bytes(&format!("{tag}-many-0"), 1, 1));
    assert_eq!(charges.len(), 16);
    let (answer, _) = send_hit(client, hit(charges, None)).await;
    assert_eq!(answer, Outcome::Allowed);

    tracing::info!(role, "--- increment and capacity of exactly one year");
    let year = hooks(&format!("{tag}-year"), YEAR_US, YEAR_US);
    let (answer, _) = send_hit(client, hit(vec![year], None)).await;
    assert_eq!(answer, Outcome::Allowed);

    tracing::info!(role, "--- timeout_ms 60000 and 0 (node default)");
    for timeout_ms in [60_000, 0] {
        let mut request = hit(vec![hooks(&format!("{tag}-t{timeout_ms}"), 1, 1)], None);
        request.timeout_ms = timeout_ms;
        let (answer, _) = send_hit(client, request).await;
        assert_eq!(answer, Outcome::Allowed, "timeout_ms {timeout_ms}");
    }
}

async fn claim_boundaries(client: &mut Client, tag: &str, role: &str) {
    tracing::info!(
        role,
        "--- a claim of 256-byte ids, a 1024-byte key, 30-day ttls"
    );
    let mut edge = pb::Claim {
        tenant: sized(tag, 256),
        source_id: sized(tag, 256),
        key: sized(tag, 1024),
        hook_id: sized(tag, 256),
        ttl_ms: THIRTY_DAYS_MS,
        pending_ttl_ms: THIRTY_DAYS_MS,
    };
    let (answer, _) = send_hit(client, hit(vec![], Some(edge.clone()))).await;
    assert_eq!(answer, Outcome::Allowed);
    let commit = pb::SettleRequest {
        tenant: edge.tenant.clone(),
        source_id: edge.source_id.clone(),
        key: edge.key.clone(),
        hook_id: edge.hook_id.clone(),
        outcome: pb::SettleOutcome::Commit as i32,
        timeout_ms: 60_000,
        dedupe_scope: pb::Scope::Fleet as i32,
        ttl_ms: THIRTY_DAYS_MS,
    };
    let settled = send_settle(client, commit).await;
    assert_eq!(settled.status, pb::SettleStatus::Settled as i32);
    let holder = std::mem::replace(&mut edge.hook_id, "hook-other".to_owned());
    let (answer, _) = send_hit(client, hit(vec![], Some(edge))).await;
    assert_eq!(answer, Outcome::Duplicate(holder));

    tracing::info!(role, "--- ttl_ms and pending_ttl_ms of 1 ms");
    let mut short = claim(&format!("{tag}-short"), "evt", "hook-a");
    short.ttl_ms = 1;
    short.pending_ttl_ms = 1;
    let (answer, _) = send_hit(client, hit(vec![], Some(short))).await;
    assert_eq!(answer, Outcome::Allowed);
}

async fn settle_reset_and_check_rate_boundaries(client: &mut Client, tag: &str, role: &str) {
    tracing::info!(role, "--- settle ttl_ms 0 (node default) and 30 days");
    for ttl_ms in [0, THIRTY_DAYS_MS] {
        let key = format!("recreate-{ttl_ms}");
        let mut request = settle(tag, &key, "hook-a", pb::SettleOutcome::Commit);
        request.ttl_ms = ttl_ms;
        let settled = send_settle(client, request).await;
        assert_eq!(settled.status, pb::SettleStatus::Recreated as i32);
        let (answer, _) = send_hit(client, hit(vec![], Some(claim(tag, &key, "hook-b")))).await;
        assert_eq!(
            answer,
            Outcome::Duplicate("hook-a".to_owned()),
            "ttl {ttl_ms}"
        );
    }

    tracing::info!(role, "--- reset of a 256-byte tenant, timeout 60000");
    let mut request = reset(&sized(tag, 256));
    request.timeout_ms = 60_000;
    client.reset(request).await.expect("a valid reset");

    tracing::info!(role, "--- check_rate at its limits");
    let edges = [
        (sized(tag, 256), sized(tag, 256), 1, 60_000),
        (format!("{tag}-per-us"), "send".to_owned(), 1_000, 1),
        (format!("{tag}-year"), "send".to_owned(), 1, YEAR_MS),
    ];
    for (entity_id, operation, limit, window_ms) in edges {
        let mut request = check_rate(&entity_id, &operation, limit, window_ms);
        request.timeout_ms = 60_000;
        let answer = send_check_rate(client, request).await;
        assert!(
            answer.allowed,
            "limit {limit} per {window_ms} ms: {answer:?}"
        );
    }
}
