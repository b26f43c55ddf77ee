//! A node whose Raft core stops never stays up in silence: it says so (Status, the health
//! of `ankusa.fleet.v1.Fleet`, `ankusa_raft_core_running`), drains, and exits with status 3
//! for its supervisor to start it again; started again, it catches up.

mod common;

use std::time::Duration;

use ankusa_fleet::pb;
use ankusa_fleet::pb::internal::{FaultDirection, FaultKind, PeerFault, SetFaultsRequest};
use common::*;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;

const TENANT: &str = "acme";
/// `server::RAFT_CORE_STOPPED_EXIT_CODE`, as an operator's supervisor sees it.
const EXIT_CODE: i32 = ankusa_fleet::server::RAFT_CORE_STOPPED_EXIT_CODE;
/// The hit kept waiting in the node while its core stops: long enough for every check
/// below on a loaded machine, well within the harness deadline for the exit after it.
const WAITING_HIT_TIMEOUT_MS: u32 = 15_000;

async fn fleet_health(fleet: &Fleet, id: u64) -> Option<ServingStatus> {
    let channel = tonic::transport::Channel::from_shared(format!("http://{}", fleet.api_addr(id)))
        .ok()?
        .connect_timeout(Duration::from_millis(500))
        .connect()
        .await
        .ok()?;
    let answer = HealthClient::new(channel)
        .check(HealthCheckRequest {
            service: "ankusa.fleet.v1.Fleet".to_owned(),
        })
        .await
        .ok()?;
    Some(answer.into_inner().status())
}

/// The faults on `node`: its calls to `leader` are never answered (one way, so it still
/// follows the leader), and, if `stop`, its Raft core stops.
fn faults(leader: u64, stop: bool) -> SetFaultsRequest {
    SetFaultsRequest {
        cluster_id: "ankusa-fleet".to_owned(),
        faults: vec![PeerFault {
            peer_id: leader,
            kind: FaultKind::Blackhole as i32,
            direction: FaultDirection::Outgoing as i32,
            ..Default::default()
        }],
        stop_raft_core: stop,
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_raft_core_is_reported_and_its_node_drains_and_exits_3() {
    init_tracing();
    let mut fleet = Fleet::start_plain(3, "fault_injection = true").await;
    let leader = fleet.wait_for_leader(&[1, 2, 3]).await;
    let node = (1..=3).find(|id| *id != leader).expect("a follower");
    fleet
        .commit_claims(&[1, 2, 3], TENANT, &keys("before", 6), 3)
        .await;
    let running = fleet.metric(node, "ankusa_raft_core_running").await;
    assert_eq!(running, Some(1.0), "node {node} before the stop");

    tracing::info!(
        node,
        "--- a hit waits in the node: its forward to the leader is black-holed"
    );
    fleet.send_faults(node, faults(leader, false)).await;
    let mut client = fleet.client(node).await;
    let mut request = hit(vec![hooks(TENANT, 1, 1_000_000_000)], None);
    request.timeout_ms = WAITING_HIT_TIMEOUT_MS;
    let waiting = tokio::spawn(async move { client.hit(request).await });
    fleet
        .wait_for("the hit is inside the node", || async {
            let inside = fleet.metric(node, "ankusa_edge_calls_in_flight").await?;
            (inside >= 1.0).then_some(())
        })
        .await;

    tracing::info!(
        node,
        "--- its Raft core stops: Status, health and the gauge say so"
    );
    fleet.send_faults(node, faults(leader, true)).await;
    let status = fleet
        .wait_for("Status says the core stopped", || async {
            let status = fleet.status(node).await?;
            status
                .degraded_reason
                .starts_with("raft core stopped")
                .then_some(status)
        })
        .await;
    assert!(status.degraded, "{status:?}");
    // Health and the gauge follow the core's metrics, read every 100 ms.
    fleet
        .wait_for("Fleet health NOT_SERVING", || async {
            let health = fleet_health(&fleet, node).await?;
            (health == ServingStatus::NotServing).then_some(())
        })
        .await;
    fleet
        .wait_for("ankusa_raft_core_running 0", || async {
            let running = fleet.metric(node, "ankusa_raft_core_running").await?;
            (running == 0.0).then_some(())
        })
        .await;
    assert!(
        fleet.try_exit_status(node).is_none(),
        "node {node} left before its drain ended"
    );

    tracing::info!(
        node,
        "--- the waiting hit is answered, then the node exits 3"
    );
    let answered = tokio::time::timeout(
        Duration::from_millis(u64::from(WAITING_HIT_TIMEOUT_MS) + 5_000),
        waiting,
    )
    .await
    .unwrap_or_else(|_| fleet.fail("the waiting hit was never answered"))
    .expect("the hit's task");
    let answered = answered.map(|reply| reply.into_inner());
    tracing::info!(?answered, "the waiting hit's answer");
    assert!(
        matches!(&answered, Ok(reply) if reply.decided_by == pb::DecidedBy::Local as i32),
        "a hit in flight during the drain is answered (by the node alone): {answered:?}"
    );
    let exited = fleet.wait_exit(node).await;
    assert_eq!(
        exited.code(),
        Some(EXIT_CODE),
        "node {node} exited {exited}"
    );
    assert_eq!(
        fleet.log_count(node, "the Raft core stopped: this node drains and exits"),
        1
    );

    tracing::info!(node, "--- started again from its data dir, it catches up");
    let others: Vec<u64> = (1..=3).filter(|id| *id != node).collect();
    let leader = fleet.wait_for_leader(&others).await;
    fleet
        .commit_claims(&others, TENANT, &keys("meanwhile", 6), 3)
        .await;
    fleet.restart(node);
    let index = fleet.last_applied(leader).await.expect("leader status");
    fleet.wait_caught_up(node, leader, index).await;
    assert_eq!(
        fleet.metric(node, "ankusa_raft_core_running").await,
        Some(1.0)
    );
}
