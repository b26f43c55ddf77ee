//! A paused (SIGSTOP) follower or leader never blocks the answers of the others.

use tokio::time::Instant;

use crate::common::*;
use crate::history::{assert_journal, History};
use crate::support::{assert_duplicates_everywhere, commit_through_fleet, millis};
use crate::{claim_hit, decided, within_deadline};

/// Hits through node `id` (timeout `timeout_ms`) until one is decided by the fleet; every
/// answer must be allowed and come within its deadline. Returns how many were local.
async fn hit_until_fleet(
    fleet: &Fleet,
    journal: &History,
    id: u64,
    tenant: &str,
    timeout_ms: u32,
) -> usize {
    let mut client = fleet.client(id).await;
    let deadline = Instant::now() + CONDITION_DEADLINE;
    for local in 0.. {
        let key = format!("leader-paused-{local}");
        let request = claim_hit(tenant, &key, &hook_of(&key), timeout_ms);
        let (response, elapsed) = journal
            .hit(&mut client, id, request)
            .await
            .unwrap_or_else(|e| fleet.fail(&e));
        if outcome(&response) != Outcome::Allowed || !within_deadline(elapsed, timeout_ms) {
            fleet.fail(&format!(
                "node {id}: {key} answered {:?} after {elapsed:?}",
                outcome(&response)
            ));
        }
        if decided(response.decided_by) == "fleet" {
            return local;
        }
        if Instant::now() > deadline {
            fleet.fail("no fleet answer while the old leader is paused");
        }
    }
    unreachable!("the loop returns or fails")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_follower_or_leader_never_blocks_answers() {
    init_tracing();
    const TENANT: &str = "paused";
    const TIMEOUT_MS: u32 = 300;
    let mut fleet = Fleet::start(3, "").await;
    let journal = History::default();
    let leader = fleet.wait_for_leader(&[1, 2, 3]).await;
    let followers: Vec<u64> = (1..=3).filter(|id| *id != leader).collect();
    let (paused, other) = (followers[0], followers[1]);

    tracing::info!("--- SIGSTOP follower {paused}; hits through {other} and {leader} stay fleet");
    fleet.pause(paused);
    let while_paused = keys("follower-paused", 10);
    commit_through_fleet(&fleet, &journal, &[other, leader], TENANT, &while_paused).await;

    tracing::info!("--- SIGCONT {paused}: it catches up and answers from the fleet");
    fleet.resume(paused);
    fleet.wait_for_applied_in_step(&[1, 2, 3]).await;
    assert_duplicates_everywhere(&fleet, &journal, &[paused], TENANT, &while_paused).await;

    tracing::info!("--- SIGSTOP the leader {leader}; hits through {paused} answer in time");
    fleet.pause(leader);
    let paused_at = Instant::now();
    let local = hit_until_fleet(&fleet, &journal, paused, TENANT, TIMEOUT_MS).await;
    tracing::info!(
        local,
        first_fleet_answer_ms = millis(paused_at.elapsed()),
        "answers while the leader is paused"
    );

    tracing::info!("--- SIGCONT {leader}: all three agree on one leader");
    fleet.resume(leader);
    let new_leader = fleet.wait_for_leader(&[1, 2, 3]).await;
    tracing::info!(new_leader, "one leader after the pause");
    assert_duplicates_everywhere(&fleet, &journal, &[1, 2, 3], TENANT, &while_paused).await;
    assert_journal(&fleet, &journal);
}
