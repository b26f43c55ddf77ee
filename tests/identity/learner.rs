//! A learner never votes or leads, and the cluster commands follow the leader: a follower
//! answers admin calls with the leader's address, and `cluster add` goes there.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_learner_never_votes_and_the_cluster_commands_follow_the_leader() {
    init_tracing();
    let mut fleet = Fleet::start(3, "voters_max = 3").await;
    let leader = fleet.wait_for_leader(&[1, 2, 3]).await;
    let follower = [1, 2, 3].into_iter().find(|id| *id != leader).expect("one");

    tracing::info!("--- node 4 joins as a learner, added through a follower");
    let spec = fleet.new_spec(4);
    fleet.add_process(spec.clone(), &[], "voters_max = 3");
    fleet
        .wait_for("node 4 started", || async {
            (fleet.log_count(4, "node started") >= 1).then_some(())
        })
        .await;
    let request = AddMemberRequest {
        cluster_id: String::new(),
        id: 4,
        api_addr: spec.api_addr.clone(),
        raft_addr: spec.raft_addr.clone(),
        voter: true,
    };
    let added = tokio::time::timeout(
        CONDITION_DEADLINE,
        ankusa_fleet::cmd::cluster::add(&fleet.admin_target(follower), request),
    )
    .await
    .expect("AddMember answers")
    .expect("AddMember through a follower reaches the leader");
    assert!(added.contains("learner"), "{added}");
    fleet
        .wait_for("node 4 a learner on every voter", || async {
            for id in [1, 2, 3] {
                let status = ankusa_fleet::cmd::cluster::cluster_status(&fleet.admin_target(id))
                    .await
                    .ok()?;
                status.members.iter().find(|m| m.id == 4 && !m.voter)?;
            }
            Some(())
        })
        .await;

    tracing::info!("--- the learner's certificate may propose but never vote or lead");
    let term = cli_status(&fleet, leader).await.term;
    let follower_addr = fleet.nodes[&follower].spec.raft_addr.clone();
    for method in [
        PeerMethod::Vote,
        PeerMethod::AppendEntries,
        PeerMethod::InstallSnapshot,
    ] {
        let answer = as_node(&fleet, &follower_addr, 4, method, term + 1).await;
        assert_denied(
            &format!("learner {method:?}"),
            answer,
            &format!(
                "identity node 4 is a learner and may not call Peer/{}",
                method.as_str_name()
            ),
        );
    }
    let answer = as_node(&fleet, &follower_addr, 4, PeerMethod::Propose, 0).await;
    assert_admitted("a learner's Propose", answer);

    tracing::info!("--- a backup through a follower comes from the leader");
    let file = fleet.dir.path().join("backup.snapshot");
    let target = ankusa_fleet::cmd::snapshot::SaveTarget {
        addr: None,
        raft_addr: Some(fleet.nodes[&follower].spec.raft_addr.clone()),
        credentials: fleet.admin_target(follower).credentials,
    };
    let summary = tokio::time::timeout(
        CONDITION_DEADLINE,
        ankusa_fleet::cmd::snapshot::save(&target, &file),
    )
    .await
    .expect("snapshot save answers")
    .expect("snapshot save through a follower");
    assert_eq!(summary.members.len(), 4, "{summary:?}");
}
