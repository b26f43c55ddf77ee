//! Membership at run time (contract §13): a node added to a running fleet catches up by
//! snapshot and serves; a removed node stops taking part; `voters_max` keeps extra nodes
//! learners that still serve their edge by forwarding.

mod common;

use ankusa_fleet::cmd::cluster as cli;
use ankusa_fleet::pb::internal::AddMemberRequest;
use common::*;
use tokio::time::Instant;

const TENANT: &str = "acme";

/// Starts `spec` as a joining node (`members = []`) and checks it formed no cluster alone.
async fn start_joiner(fleet: &mut Fleet, spec: NodeSpec, extra: &str) {
    let id = spec.id;
    fleet.add_process(spec, &[], extra);
    fleet
        .wait_for(&format!("node {id} started"), || async {
            (fleet.log_count(id, "node started") >= 1).then_some(())
        })
        .await;
    let status = fleet
        .status(id)
        .await
        .unwrap_or_else(|| fleet.fail(&format!("node {id} does not answer status")));
    assert_eq!(
        (status.leader_id, status.members.len()),
        (0, 0),
        "a node outside the initial members formed a cluster of its own: {status:?}"
    );
}

/// AddMember through node `via`; returns the admin answer.
async fn add_member(fleet: &Fleet, via: u64, spec: &NodeSpec, voter: bool) -> String {
    let request = AddMemberRequest {
        cluster_id: String::new(),
        id: spec.id,
        api_addr: spec.api_addr.clone(),
        raft_addr: spec.raft_addr.clone(),
        voter,
    };
    let via = fleet.admin_target(via);
    let call = cli::add(&via, request);
    match tokio::time::timeout(CONDITION_DEADLINE, call).await {
        Ok(Ok(message)) => message,
        Ok(Err(e)) => fleet.fail(&format!("AddMember {} via {via:?}: {e:#}", spec.id)),
        Err(_) => fleet.fail(&format!("AddMember {} via {via:?}: no answer", spec.id)),
    }
}

/// The (id, voter) pairs node `id` lists, once it answers.
async fn members_of(fleet: &Fleet, id: u64) -> Option<Vec<(u64, bool)>> {
    let status = fleet.status(id).await?;
    Some(status.members.iter().map(|m| (m.id, m.voter)).collect())
}

/// Waits until node `id` lists exactly `expected` as (id, voter), sorted by id.
async fn wait_for_members(fleet: &Fleet, id: u64, expected: &[(u64, bool)]) {
    fleet
        .wait_for(&format!("node {id} lists members {expected:?}"), || async {
            let mut members = members_of(fleet, id).await?;
            members.sort_unstable();
            (members == expected).then_some(())
        })
        .await;
}

/// A snapshot every 20 entries and no log kept behind it: the leader's log is purged
/// almost at once, so a joining node can only catch up by snapshot. One command per entry,
/// so the test's writes make many entries (group commit would fold them into a few).
const SNAPSHOT_EVERY_20: &str = "snapshot_logs_since_last = 20\n\
                                 snapshot_log_percent = 0\n\
                                 snapshot_logs_kept = 0\n\
                                 batch_commands_max = 1";

/// The log index of the newest snapshot node `id` logged as built.
fn newest_snapshot_index(fleet: &Fleet, id: u64) -> Option<u64> {
    fleet
        .snapshots_built(id)
        .into_iter()
        .map(|(index, _)| index)
        .max()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_added_at_run_time_catches_up_by_snapshot() {
    init_tracing();
    let mut fleet = Fleet::start(3, SNAPSHOT_EVERY_20).await;
    let leader = fleet.wait_for_leader(&[1, 2, 3]).await;
    let follower = (1..=3).find(|id| *id != leader).expect("a follower");

    tracing::info!("--- 200 committed claims; the log behind each snapshot is purged");
    let old = keys("old", 200);
    let started = Instant::now();
    fleet.commit_claims(&[1, 2, 3], TENANT, &old, 32).await;
    let applied = fleet.last_applied(leader).await.expect("leader status");
    tracing::info!(
        applied,
        write_ms = started.elapsed().as_millis() as u64,
        "log written"
    );
    fleet
        .wait_for(
            "the leader built a snapshot past the first entries",
            || async { (newest_snapshot_index(&fleet, leader)? > 20).then_some(()) },
        )
        .await;

    tracing::info!(
        "--- node 4 starts with no members and joins as a voter via follower {follower}"
    );
    let spec = fleet.new_spec(4);
    start_joiner(&mut fleet, spec.clone(), SNAPSHOT_EVERY_20).await;
    let joined_at = Instant::now();
    let message = add_member(&fleet, follower, &spec, true).await;
    tracing::info!(%message, "AddMember answered");
    let all_voters = [(1, true), (2, true), (3, true), (4, true)];
    wait_for_members(&fleet, leader, &all_voters).await;
    fleet.wait_caught_up(4, leader, applied).await;
    tracing::info!(
        catch_up_ms = joined_at.elapsed().as_millis() as u64,
        "node 4 caught up"
    );
    wait_for_members(&fleet, 4, &all_voters).await;
    assert!(
        fleet.log_count(4, "snapshot installed") >= 1,
        "node 4 caught up without installing a snapshot"
    );
    // The same, on the metrics pages: builds on the leader, the install on node 4, with
    // their durations and sizes as histograms.
    for (id, name) in [
        (leader, r#"ankusa_snapshots_total{event="built"}"#),
        (leader, r#"ankusa_snapshot_seconds_count{event="built"}"#),
        (4, r#"ankusa_snapshots_total{event="installed"}"#),
        (
            4,
            r#"ankusa_snapshot_size_bytes_bucket{event="installed",le="+Inf"}"#,
        ),
    ] {
        let fleet = &fleet;
        fleet
            .wait_for(&format!("{name} on node {id}"), || async move {
                fleet.metric(id, name).await.filter(|count| *count >= 1.0)
            })
            .await;
    }

    tracing::info!("--- through node 4: old keys are duplicates, new hits commit");
    fleet.assert_duplicates(4, TENANT, &old, 16).await;
    let new = keys("new", 20);
    fleet.commit_claims(&[4], TENANT, &new, 4).await;
    for id in 1..=4 {
        fleet.assert_duplicates(id, TENANT, &new, 4).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removed_node_stops_taking_part() {
    init_tracing();
    let fleet = Fleet::start(3, "").await;
    let leader = fleet.wait_for_leader(&[1, 2, 3]).await;
    let followers: Vec<u64> = (1..=3).filter(|id| *id != leader).collect();
    let (removed, kept) = (followers[0], followers[1]);
    fleet
        .commit_claims(&[1, 2, 3], TENANT, &keys("before", 10), 4)
        .await;

    tracing::info!("--- remove voter {removed} via follower {kept}");
    let via = fleet.admin_target(kept);
    let call = cli::remove(&via, removed);
    let message = match tokio::time::timeout(CONDITION_DEADLINE, call).await {
        Ok(Ok(message)) => message,
        Ok(Err(e)) => fleet.fail(&format!("RemoveMember {removed}: {e:#}")),
        Err(_) => fleet.fail(&format!("RemoveMember {removed}: no answer")),
    };
    tracing::info!(%message, "RemoveMember answered");
    let mut remaining = vec![(leader, true), (kept, true)];
    remaining.sort_unstable();
    wait_for_members(&fleet, leader, &remaining).await;
    wait_for_members(&fleet, kept, &remaining).await;
    let frozen = fleet
        .last_applied(removed)
        .await
        .unwrap_or_else(|| fleet.fail("the removed node does not answer status"));

    tracing::info!("--- the fleet still commits; the removed node's replica stays behind");
    let after = keys("after", 30);
    fleet
        .commit_claims(&[leader, kept], TENANT, &after, 4)
        .await;
    let index = fleet
        .last_applied(leader)
        .await
        .unwrap_or_else(|| fleet.fail("the leader does not answer status"));
    fleet.wait_caught_up(kept, leader, index).await;
    fleet.assert_duplicates(kept, TENANT, &after, 8).await;
    let still = fleet
        .last_applied(removed)
        .await
        .unwrap_or_else(|| fleet.fail("the removed node does not answer status"));
    // At most the entries that finish the membership change may still reach it.
    if still > frozen + 2 || still >= index {
        fleet.fail(&format!(
            "removed node {removed} applied {frozen} -> {still} while the fleet went to {index}"
        ));
    }
    tracing::info!(frozen, still, index, "removed node stayed behind");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn beyond_voters_max_a_node_stays_a_learner_and_serves() {
    init_tracing();
    let mut fleet = Fleet::start(3, "voters_max = 3").await;
    let leader = fleet.wait_for_leader(&[1, 2, 3]).await;
    let old = keys("old", 10);
    fleet.commit_claims(&[1, 2, 3], TENANT, &old, 4).await;

    tracing::info!("--- node 4 asks to join as a voter; 3 voters already");
    let spec = fleet.new_spec(4);
    start_joiner(&mut fleet, spec.clone(), "voters_max = 3").await;
    let message = add_member(&fleet, leader, &spec, true).await;
    tracing::info!(%message, "AddMember answered");
    assert!(
        message.contains("learner"),
        "AddMember answered {message:?}"
    );
    let expected = [(1, true), (2, true), (3, true), (4, false)];
    for id in 1..=4 {
        wait_for_members(&fleet, id, &expected).await;
    }
    fleet.wait_for_leader(&[1, 2, 3, 4]).await;

    tracing::info!("--- the learner answers its edge through the leader");
    fleet.assert_duplicates(4, TENANT, &old, 4).await;
    let new = keys("new", 10);
    fleet.commit_claims(&[4], TENANT, &new, 4).await;
    fleet.assert_duplicates(leader, TENANT, &new, 4).await;
}
