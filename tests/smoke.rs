//! The shortest path through a real fleet: three processes elect a leader, a hit through a
//! follower is committed, its claim is visible from every node, and the commit path's
//! timings show on the nodes' metrics pages. Nodes run without transparent huge pages.

mod common;

use ankusa_fleet::pb;
use common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hit_through_a_follower_is_seen_by_every_node() {
    init_tracing();
    let fleet = Fleet::start(3, "").await;
    tracing::info!("--- wait for the fleet to elect a leader");
    let leader = fleet.wait_for_leader(&[1, 2, 3]).await;
    let follower = (1..=3).find(|id| *id != leader).expect("a follower");
    // Each node turns huge pages off before it serves, so before a leader is elected.
    for id in 1..=3 {
        let pid = fleet.pid(id).expect("node runs");
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
        // Kernels before 5.0 do not show the line; this machine class's does.
        if let Some(line) = status.lines().find(|l| l.starts_with("THP_enabled:")) {
            assert_eq!(
                line.split_whitespace().nth(1),
                Some("0"),
                "node {id}: {line}"
            );
        }
    }

    tracing::info!("--- claim a key through follower {follower}");
    let mut client = fleet.client(follower).await;
    let request = hit(
        vec![hooks("acme", 100_000, 1_000_000)],
        Some(claim("acme", "evt_1", "hook-a")),
    );
    let (answer, decided_by) = send_hit(&mut client, request).await;
    assert_eq!(answer, Outcome::Allowed);
    assert_eq!(decided_by, pb::DecidedBy::Fleet as i32);
    let settled = client
        .settle(settle("acme", "evt_1", "hook-a", pb::SettleOutcome::Commit))
        .await
        .expect("settle")
        .into_inner();
    assert_eq!(settled.status, pb::SettleStatus::Settled as i32);

    tracing::info!("--- every node answers duplicate at once");
    for id in 1..=3 {
        let mut client = fleet.client(id).await;
        let (answer, _) = send_hit(
            &mut client,
            hit(vec![], Some(claim("acme", "evt_1", "hook-b"))),
        )
        .await;
        assert_eq!(answer, Outcome::Duplicate("hook-a".to_owned()), "node {id}");
    }

    tracing::info!(
        "--- the commit path's timings and the log size are on both nodes' metrics pages"
    );
    let follower_commits = r#"ankusa_commit_seconds_count{role="follower"}"#;
    let leader_commits = r#"ankusa_commit_seconds_count{role="leader"}"#;
    for (id, name) in [
        (follower, follower_commits),
        (leader, leader_commits),
        (follower, "ankusa_log_flush_seconds_count"),
        (leader, "ankusa_log_flush_seconds_count"),
        (follower, "ankusa_apply_durable_wait_seconds_count"),
        (leader, "ankusa_apply_durable_wait_seconds_count"),
        // The snapshot policy reads the log it weighs (no snapshot yet: all of it).
        (follower, "ankusa_log_bytes_since_snapshot"),
        (leader, "ankusa_log_bytes_since_snapshot"),
    ] {
        let fleet = &fleet;
        fleet
            .wait_for(&format!("{name} on node {id}"), || async move {
                fleet.metric(id, name).await.filter(|count| *count >= 1.0)
            })
            .await;
    }
}
