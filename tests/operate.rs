//! What an operator reads off a running node (issue 17): Prometheus metrics with real
//! histograms, per-call counters and the Raft gauges; JSON log lines; and health that says
//! whether the node is in touch with a leader.

mod common;

use ankusa_fleet::pb;
use common::*;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_calls_by_outcome_and_show_the_raft_state() {
    init_tracing();
    let fleet = Fleet::start(3, "").await;
    let leader = fleet.wait_for_leader(&[1, 2, 3]).await;
    let follower = (1..=3).find(|id| *id != leader).expect("a follower");
    let mut client = fleet.client(leader).await;
    let (answer, _) = send_hit(
        &mut client,
        hit(vec![], Some(claim("acme", "m-1", "hook-a"))),
    )
    .await;
    assert_eq!(answer, Outcome::Allowed);
    let settled = client
        .settle(settle("acme", "m-1", "hook-a", pb::SettleOutcome::Commit))
        .await
        .expect("settle answered")
        .into_inner();
    assert_eq!(settled.status, pb::SettleStatus::Settled as i32);

    tracing::info!("--- the calls, their latency histograms and the Raft gauges are on the pages");
    let leader_id = leader as f64;
    for (id, name, least) in [
        (
            leader,
            r#"ankusa_hits_total{outcome="allowed",decided_by="fleet"}"#,
            1.0,
        ),
        (
            leader,
            r#"ankusa_settles_total{outcome="settled",decided_by="fleet"}"#,
            1.0,
        ),
        (
            leader,
            r#"ankusa_call_seconds_bucket{call="hit",le="+Inf"}"#,
            1.0,
        ),
        (
            leader,
            r#"ankusa_call_seconds_bucket{call="settle",le="+Inf"}"#,
            1.0,
        ),
        (leader, "ankusa_raft_is_leader", 1.0),
        (leader, "ankusa_raft_voters", 3.0),
        (leader, "ankusa_raft_commit_index", 1.0),
        (follower, "ankusa_raft_leader_id", leader_id),
        (follower, "ankusa_raft_applied_index", 1.0),
        (follower, "ankusa_raft_term", 1.0),
    ] {
        let fleet = &fleet;
        fleet
            .wait_for(&format!("{name} >= {least} on node {id}"), || async move {
                fleet.metric(id, name).await.filter(|value| *value >= least)
            })
            .await;
    }
    assert_eq!(
        fleet.metric(follower, "ankusa_raft_is_leader").await,
        Some(0.0)
    );
    // Nothing was decided alone: no queued settle, nothing to hand over.
    for name in ["ankusa_queued_settles", "ankusa_reconcile_backlog"] {
        let fleet = &fleet;
        fleet
            .wait_for(&format!("{name} on node {follower}"), || async move {
                fleet
                    .metric(follower, name)
                    .await
                    .filter(|value| *value == 0.0)
            })
            .await;
    }
    let lag = format!(r#"ankusa_raft_replication_lag_entries{{peer="{follower}"}}"#);
    let fleet_ref = &fleet;
    fleet
        .wait_for("the leader reports each follower's lag", || async {
            fleet_ref.metric(leader, &lag).await
        })
        .await;
    // A histogram, not a summary: bucket lines with an upper bound.
    assert!(
        fleet
            .metric(
                leader,
                r#"ankusa_call_seconds_bucket{call="hit",le="0.0001"}"#
            )
            .await
            .is_some(),
        "ankusa_call_seconds has no 100 µs bucket"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn log_format_json_writes_one_json_object_per_line() {
    init_tracing();
    let fleet = Fleet::start(3, "log_format = \"json\"").await;
    fleet.wait_for_leader(&[1, 2, 3]).await;
    fleet
        .wait_for("node 1 logs that it started", || async {
            (fleet.log_count(1, "node started") >= 1).then_some(())
        })
        .await;
    let log = fleet.log_since(1, 0);
    let mut lines = 0;
    for line in log.lines().filter(|line| !line.trim().is_empty()) {
        let object: serde_json::Value = serde_json::from_str(line)
            .unwrap_or_else(|e| fleet.fail(&format!("not a JSON line ({e}): {line}")));
        for field in ["timestamp", "level", "fields"] {
            assert!(object.get(field).is_some(), "no {field} in {line}");
        }
        lines += 1;
    }
    assert!(lines >= 2, "only {lines} log lines");
}

async fn health_of(fleet: &Fleet, id: u64, service: &str) -> Option<ServingStatus> {
    let channel = tonic::transport::Channel::from_shared(format!("http://{}", fleet.api_addr(id)))
        .ok()?
        .connect()
        .await
        .ok()?;
    let answer = HealthClient::new(channel)
        .check(HealthCheckRequest {
            service: service.to_owned(),
        })
        .await
        .ok()?;
    Some(answer.into_inner().status())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fleet_health_follows_the_leader_while_the_node_stays_serving() {
    init_tracing();
    let fleet = Fleet::start(3, "fault_injection = true").await;
    let leader = fleet.wait_for_leader(&[1, 2, 3]).await;
    let follower = (1..=3).find(|id| *id != leader).expect("a follower");
    let fleet_service = "ankusa.fleet.v1.Fleet";
    let wait_health = |service: &'static str, expected: ServingStatus| {
        let fleet = &fleet;
        async move {
            fleet
                .wait_for(
                    &format!("{service:?} {expected:?} on node {follower}"),
                    || async {
                        (health_of(fleet, follower, service).await == Some(expected)).then_some(())
                    },
                )
                .await
        }
    };
    wait_health(fleet_service, ServingStatus::Serving).await;

    tracing::info!("--- cut off, the follower loses its leader: the fleet service says so");
    fleet.isolate(follower, pb::internal::FaultKind::Drop).await;
    wait_health(fleet_service, ServingStatus::NotServing).await;
    assert_eq!(
        health_of(&fleet, follower, "").await,
        Some(ServingStatus::Serving),
        "the node still answers its edge, from its own state"
    );

    tracing::info!("--- healed, it follows a leader again");
    fleet.heal(follower).await;
    wait_health(fleet_service, ServingStatus::Serving).await;

    tracing::info!("--- a leader cut off keeps calling itself leader; its health does not");
    let leader = fleet.wait_for_leader(&[1, 2, 3]).await;
    fleet.isolate(leader, pb::internal::FaultKind::Drop).await;
    fleet
        .wait_for(
            &format!("{fleet_service:?} NotServing on the cut-off leader {leader}"),
            || async {
                (health_of(&fleet, leader, fleet_service).await == Some(ServingStatus::NotServing))
                    .then_some(())
            },
        )
        .await;
    assert_eq!(
        health_of(&fleet, leader, "").await,
        Some(ServingStatus::Serving)
    );
    fleet.heal(leader).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reflection_lists_the_edge_services_and_describes_them() {
    use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;
    use tonic_reflection::pb::v1::ServerReflectionRequest;

    init_tracing();
    let fleet = Fleet::start(3, "").await;
    fleet.wait_for_leader(&[1, 2, 3]).await;
    let channel = tonic::transport::Channel::from_shared(format!("http://{}", fleet.api_addr(1)))
        .expect("uri")
        .connect()
        .await
        .expect("connect");
    let mut client = ServerReflectionClient::new(channel);
    let ask = |request: MessageRequest| ServerReflectionRequest {
        host: String::new(),
        message_request: Some(request),
    };
    let requests = vec![
        ask(MessageRequest::ListServices(String::new())),
        ask(MessageRequest::FileContainingSymbol(
            "ankusa.fleet.v1.Fleet".to_owned(),
        )),
        ask(MessageRequest::FileContainingSymbol(
            "envoy.service.ratelimit.v3.RateLimitService".to_owned(),
        )),
    ];
    let mut answers = client
        .server_reflection_info(tokio_stream::iter(requests))
        .await
        .expect("reflection answers")
        .into_inner();
    let listed = match answers
        .message()
        .await
        .expect("a reply")
        .map(|r| r.message_response)
    {
        Some(Some(MessageResponse::ListServicesResponse(list))) => list,
        other => panic!("not a service list: {other:?}"),
    };
    let names: Vec<String> = listed.service.into_iter().map(|s| s.name).collect();
    for expected in [
        "ankusa.fleet.v1.Fleet",
        "grpc.health.v1.Health",
        "envoy.service.ratelimit.v3.RateLimitService",
    ] {
        assert!(
            names.iter().any(|name| name == expected),
            "{expected} in {names:?}"
        );
    }
    assert!(
        !names.iter().any(|name| name.contains("internal")),
        "the peer and admin services are not on api_addr: {names:?}"
    );
    match answers
        .message()
        .await
        .expect("a reply")
        .map(|r| r.message_response)
    {
        Some(Some(MessageResponse::FileDescriptorResponse(files))) => {
            assert!(
                !files.file_descriptor_proto.is_empty(),
                "no descriptor for Fleet"
            );
        }
        other => panic!("no file descriptor for ankusa.fleet.v1.Fleet: {other:?}"),
    }
    // Envoy's service is in rls.proto, and every file it imports, to the last, is served
    // too: a client can decode its messages.
    let names_in = |response: Option<MessageResponse>| -> Vec<prost_types::FileDescriptorProto> {
        match response {
            Some(MessageResponse::FileDescriptorResponse(files)) => files
                .file_descriptor_proto
                .iter()
                .map(|bytes| prost::Message::decode(bytes.as_slice()).expect("a file descriptor"))
                .collect(),
            other => panic!("not a file descriptor answer: {other:?}"),
        }
    };
    let rls = names_in(
        answers
            .message()
            .await
            .expect("a reply")
            .and_then(|r| r.message_response),
    );
    assert_eq!(
        rls.iter().map(|file| file.name()).collect::<Vec<_>>(),
        ["envoy/service/ratelimit/v3/rls.proto"]
    );
    let mut due: Vec<String> = rls[0].dependency.clone();
    let mut served = std::collections::BTreeSet::new();
    while let Some(name) = due.pop() {
        if !served.insert(name.clone()) {
            continue;
        }
        let mut answer = client
            .server_reflection_info(tokio_stream::iter([ask(MessageRequest::FileByFilename(
                name.clone(),
            ))]))
            .await
            .expect("reflection answers")
            .into_inner();
        let files = names_in(
            answer
                .message()
                .await
                .expect("a reply")
                .and_then(|r| r.message_response),
        );
        let file = files
            .iter()
            .find(|file| file.name() == name)
            .unwrap_or_else(|| panic!("{name} is not served"));
        due.extend(file.dependency.iter().cloned());
    }
    assert!(
        served.contains("envoy/config/core/v3/base.proto") && served.len() >= 20,
        "the files rls.proto imports: {served:?}"
    );
}
