//! Crash faults (contract §12): kill -9 of the leader and of every node. Every answer the
//! fleet gave before the kill (committed claims, spent budget) must still hold afterwards,
//! and a restarted node catches up from its own data dir.

mod common;

use std::collections::BTreeSet;

use ankusa_fleet::pb;
use common::*;
use tokio::time::Instant;

const TENANT: &str = "acme";
/// One hook token per hour, ten in the bucket: nothing refills while a test runs.
const HOUR_US: u64 = 3_600_000_000;
const BUDGET: u64 = 10;

fn budget_hit() -> pb::HitRequest {
    hit(vec![hooks("budgeted", HOUR_US, BUDGET * HOUR_US)], None)
}

/// Spends the budget `n` times through node `id`; every one must be allowed by the fleet.
async fn spend(fleet: &Fleet, id: u64, n: u64) {
    let mut client = fleet.client(id).await;
    for i in 0..n {
        let got = send_hit(&mut client, budget_hit()).await;
        if got != (Outcome::Allowed, pb::DecidedBy::Fleet as i32) {
            fleet.fail(&format!("node {id}: spend {i} of {n} answered {got:?}"));
        }
    }
}

/// Asserts that through node `id` exactly `left` more charges pass, then the fleet denies.
async fn assert_budget_left(fleet: &Fleet, id: u64, left: u64) {
    spend(fleet, id, left).await;
    let mut client = fleet.client(id).await;
    let (answer, decided_by) = send_hit(&mut client, budget_hit()).await;
    if !matches!(answer, Outcome::RateLimited(_)) || decided_by != pb::DecidedBy::Fleet as i32 {
        fleet.fail(&format!(
            "node {id}: charge {} answered {answer:?} decided_by {decided_by}, expected rate_limited",
            left + 1
        ));
    }
}

/// Waits until every node in `ids` names one leader that is not `gone`.
async fn wait_for_new_leader(fleet: &Fleet, ids: &[u64], gone: u64) -> u64 {
    fleet
        .wait_for("a new leader known to every survivor", || async {
            let mut leaders = BTreeSet::new();
            for id in ids {
                leaders.insert(fleet.status(*id).await?.leader_id);
            }
            let leader = *leaders.first()?;
            (leaders.len() == 1 && leader != 0 && leader != gone).then_some(leader)
        })
        .await
}

/// Starts three nodes (`extra` in every config) and waits for a leader; returns the fleet,
/// the leader and the other two.
async fn three_nodes(extra: &str) -> (Fleet, u64, Vec<u64>) {
    init_tracing();
    let fleet = Fleet::start(3, extra).await;
    let leader = fleet.wait_for_leader(&[1, 2, 3]).await;
    let survivors = (1..=3).filter(|id| *id != leader).collect();
    (fleet, leader, survivors)
}

/// After a failover: commits `n` new claims through the survivors and returns them with
/// the new leader's applied index (what a restarted node must catch up to).
async fn commit_after_failover(
    fleet: &Fleet,
    survivors: &[u64],
    new_leader: u64,
    n: usize,
) -> (Vec<String>, u64) {
    let after = keys("after", n);
    fleet.commit_claims(survivors, TENANT, &after, 4).await;
    let target = fleet
        .last_applied(new_leader)
        .await
        .unwrap_or_else(|| fleet.fail("the new leader does not answer status"));
    (after, target)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_leader_loses_no_answer() {
    let (mut fleet, leader, survivors) = three_nodes("").await;

    tracing::info!("--- commit claims through every node and spend 6 of 10 tokens");
    let committed = keys("before", 30);
    fleet.commit_claims(&[1, 2, 3], TENANT, &committed, 6).await;
    spend(&fleet, survivors[0], 3).await;
    spend(&fleet, leader, 3).await;

    tracing::info!("--- kill -9 the leader {leader}");
    let killed_at = Instant::now();
    fleet.kill(leader);
    let new_leader = wait_for_new_leader(&fleet, &survivors, leader).await;
    let failover = killed_at.elapsed();
    tracing::info!(
        failover_ms = failover.as_millis() as u64,
        new_leader,
        "failover"
    );

    tracing::info!("--- every committed key is a duplicate on both survivors");
    for id in &survivors {
        fleet.assert_duplicates(*id, TENANT, &committed, 8).await;
    }

    tracing::info!("--- the spent budget is still spent: exactly 4 more pass");
    assert_budget_left(&fleet, survivors[1], 4).await;

    tracing::info!("--- the fleet still commits new claims");
    let (after, target) = commit_after_failover(&fleet, &survivors, new_leader, 10).await;

    tracing::info!("--- restart {leader} from its data dir; it catches up");
    let restarted_at = Instant::now();
    fleet.restart(leader);
    fleet.wait_caught_up(leader, new_leader, target).await;
    tracing::info!(
        catch_up_ms = restarted_at.elapsed().as_millis() as u64,
        target,
        "restarted node caught up"
    );
    fleet.assert_duplicates(leader, TENANT, &committed, 8).await;
    fleet.assert_duplicates(leader, TENANT, &after, 8).await;
    assert_budget_left(&fleet, leader, 0).await;
}

/// Kills every node, restarts them all from their data dirs, and waits for a leader.
async fn kill_all_and_restart(fleet: &mut Fleet) -> u64 {
    for id in 1..=3 {
        fleet.kill(id);
    }
    let restarted_at = Instant::now();
    for id in 1..=3 {
        fleet.restart(id);
    }
    let leader = fleet.wait_for_leader(&[1, 2, 3]).await;
    tracing::info!(
        election_ms = restarted_at.elapsed().as_millis() as u64,
        leader,
        "fleet back after a full restart"
    );
    leader
}

/// How many snapshots each node has logged as built.
fn snapshot_counts(fleet: &Fleet) -> Vec<usize> {
    (1..=3).map(|id| fleet.snapshots_built(id).len()).collect()
}

/// Waits until every node built a snapshot since `before` was counted, so its restart loads
/// one.
async fn wait_for_new_snapshots(fleet: &Fleet, before: &[usize]) {
    fleet
        .wait_for("every node built a new snapshot", || async {
            let now = snapshot_counts(fleet);
            now.iter().zip(before).all(|(n, b)| n > b).then_some(())
        })
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restarting_every_node_twice_loses_no_answer() {
    init_tracing();
    // One command per entry: the writes below must make many entries, so restarts go
    // through snapshot load plus log replay (group commit would fold them into a few).
    let mut fleet = Fleet::start(
        3,
        "snapshot_logs_since_last = 20\nsnapshot_log_percent = 0\nbatch_commands_max = 1",
    )
    .await;
    fleet.wait_for_leader(&[1, 2, 3]).await;

    tracing::info!("--- 100 committed claims (snapshots every 20 entries), 6 of 10 tokens spent");
    let mut committed = keys("first", 100);
    fleet.commit_claims(&[1, 2, 3], TENANT, &committed, 4).await;
    wait_for_new_snapshots(&fleet, &[0, 0, 0]).await;
    spend(&fleet, 1, 6).await;

    tracing::info!("--- kill -9 every node, restart all: snapshot load + log replay");
    let leader = kill_all_and_restart(&mut fleet).await;
    for id in 1..=3 {
        assert!(
            fleet.log_count(id, "state machine resumed from snapshot") >= 1,
            "node {id} did not resume from its snapshot"
        );
        fleet.assert_duplicates(id, TENANT, &committed, 8).await;
    }
    tracing::info!("--- spend 2 of the 4 tokens left, commit 20 more claims");
    let before = snapshot_counts(&fleet);
    spend(&fleet, leader, 2).await;
    let second = keys("second", 20);
    fleet.commit_claims(&[1, 2, 3], TENANT, &second, 2).await;
    committed.extend(second);
    wait_for_new_snapshots(&fleet, &before).await;

    tracing::info!("--- kill -9 every node again, restart all");
    kill_all_and_restart(&mut fleet).await;
    for id in 1..=3 {
        assert!(
            fleet.log_count(id, "state machine resumed from snapshot") >= 2,
            "node {id} did not resume from its snapshot the second time"
        );
        fleet.assert_duplicates(id, TENANT, &committed, 8).await;
    }
    tracing::info!("--- exactly the 2 tokens left pass");
    assert_budget_left(&fleet, 2, 2).await;
}

/// How long a hit waits for the fleet while the leader's log writer is held.
const HELD_TIMEOUT_MS: u32 = 1_500;

/// A leader reports its own entries to openraft before they are fsynced, so it replicates
/// while it flushes (docs/storage.md, "The leader's early flush report"); nothing may show a
/// commit before the leader's copy is on disk. Hold the leader's log writer (its appends
/// stay in memory, unwritten, so a kill loses them as a power cut would): no hit may be
/// answered by the fleet, and no follower may apply anything. Then kill the leader inside
/// that window: every earlier answer must hold on every node, the restarted one included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_killed_before_its_flush_has_answered_nothing() {
    let (mut fleet, leader, survivors) = three_nodes("fault_injection = true").await;

    tracing::info!("--- commit claims through every node");
    let committed = keys("durable", 12);
    fleet.commit_claims(&[1, 2, 3], TENANT, &committed, 4).await;
    let before = fleet.wait_for_applied_in_step(&[1, 2, 3]).await;

    tracing::info!("--- hold the leader {leader}'s log writer; claim through it and a follower");
    fleet.hold_log_writes(leader).await;
    let held = keys("held", 2);
    let calls = [(leader, &held[0]), (survivors[0], &held[1])].map(|(id, key)| {
        let fleet = &fleet;
        async move {
            let mut client = fleet.client(id).await;
            let mut request = hit(Vec::new(), Some(claim(TENANT, key, &hook_of(key))));
            request.timeout_ms = HELD_TIMEOUT_MS;
            (id, send_hit(&mut client, request).await)
        }
    });
    for (id, (answer, decided_by)) in futures::future::join_all(calls).await {
        if decided_by == pb::DecidedBy::Fleet as i32 {
            fleet.fail(&format!(
                "node {id} answered {answer:?} from the fleet while the leader's log was not on disk"
            ));
        }
    }
    for id in &survivors {
        let applied = fleet.last_applied(*id).await;
        if applied != Some(before.last_applied) {
            fleet.fail(&format!(
                "follower {id} applied {applied:?} while the leader's log was held at {}",
                before.last_applied
            ));
        }
    }

    tracing::info!("--- kill -9 the leader {leader} inside the window");
    fleet.kill(leader);
    let new_leader = wait_for_new_leader(&fleet, &survivors, leader).await;
    for id in &survivors {
        fleet.assert_duplicates(*id, TENANT, &committed, 4).await;
    }
    let (after, target) = commit_after_failover(&fleet, &survivors, new_leader, 6).await;

    tracing::info!("--- restart {leader}: it lost its unwritten entries and catches up");
    fleet.restart(leader);
    fleet.wait_caught_up(leader, new_leader, target).await;
    fleet.assert_duplicates(leader, TENANT, &committed, 4).await;
    fleet.assert_duplicates(leader, TENANT, &after, 4).await;
    let last = keys("last", 6);
    fleet.commit_claims(&[1, 2, 3], TENANT, &last, 2).await;
    for id in 1..=3 {
        fleet.assert_duplicates(id, TENANT, &last, 4).await;
    }
}
