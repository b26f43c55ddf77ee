//! Envoy's rate limit service on a real fleet, through a client built from Envoy's own
//! types (`envoy-types`): descriptors matched in an envoyproxy/ratelimit limits file, each
//! a GCRA bucket decided through the fleet, with per-descriptor statuses; shadow mode,
//! unlimited and unmatched descriptors say OK; a node cut off from the fleet still
//! answers, deciding alone.

mod common;

use std::time::Duration;

use ankusa_fleet::pb;
use common::*;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{Code, DescriptorStatus};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use tonic::transport::Channel;

const LIMITS: &str = "
domain: edge
descriptors:
  - key: tenant
    value: acme
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: tenant
    value: beta
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: tenant
  - key: path
    rate_limit: {unit: minute, requests_per_unit: 1}
    shadow_mode: true
  - key: health
    rate_limit: {unlimited: true}
";

fn descriptor(entries: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries
            .iter()
            .map(|(key, value)| Entry {
                key: (*key).to_owned(),
                value: (*value).to_owned(),
            })
            .collect(),
        ..Default::default()
    }
}

async fn ask(
    client: &mut RateLimitServiceClient<Channel>,
    domain: &str,
    descriptors: Vec<RateLimitDescriptor>,
    hits_addend: u32,
) -> Result<RateLimitResponse, tonic::Status> {
    let mut request = tonic::Request::new(RateLimitRequest {
        domain: domain.to_owned(),
        descriptors,
        hits_addend,
    });
    // As Envoy's filter does: its timeout travels as the gRPC deadline. The node keeps at
    // most its own default (1 s) of it, so a loaded machine has a second to spare.
    request.set_timeout(Duration::from_secs(2));
    client
        .should_rate_limit(request)
        .await
        .map(tonic::Response::into_inner)
}

fn codes(response: &RateLimitResponse) -> (i32, Vec<i32>) {
    (
        response.overall_code,
        response.statuses.iter().map(|status| status.code).collect(),
    )
}

async fn start() -> (Fleet, tempfile::NamedTempFile) {
    let mut file = tempfile::NamedTempFile::new().expect("limits file");
    std::io::Write::write_all(&mut file, LIMITS.as_bytes()).expect("write limits");
    let extra = format!(
        "rate_limits_file = {:?}\nfault_injection = true",
        file.path().display().to_string()
    );
    (Fleet::start(3, &extra).await, file)
}

async fn client(fleet: &Fleet, id: u64) -> RateLimitServiceClient<Channel> {
    let channel = Channel::from_shared(format!("http://{}", fleet.api_addr(id)))
        .expect("uri")
        .connect()
        .await
        .expect("connect");
    RateLimitServiceClient::new(channel)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn descriptors_are_fleet_buckets_with_per_descriptor_statuses() {
    init_tracing();
    let (fleet, _limits) = start().await;
    let leader = fleet.wait_for_leader(&[1, 2, 3]).await;
    let follower = (1..=3).find(|id| *id != leader).expect("a follower");
    let mut on_leader = client(&fleet, leader).await;
    let ok = Code::Ok as i32;
    let over = Code::OverLimit as i32;

    tracing::info!("--- tenant=acme: 3 a minute, then over the limit, on any node");
    for left in [2, 1] {
        let answer = ask(
            &mut on_leader,
            "edge",
            vec![descriptor(&[("tenant", "acme")])],
            0,
        )
        .await
        .expect("answered");
        assert_eq!(codes(&answer), (ok, vec![ok]), "{answer:?}");
        let status: &DescriptorStatus = &answer.statuses[0];
        let limit = status.current_limit.as_ref().expect("the limit");
        assert_eq!(
            (limit.requests_per_unit, limit.unit),
            (3, Unit::Minute as i32)
        );
        assert_eq!(status.limit_remaining, left, "{status:?}");
    }
    // The third through a follower: the same fleet bucket.
    let mut on_follower = client(&fleet, follower).await;
    let third = ask(
        &mut on_follower,
        "edge",
        vec![descriptor(&[("tenant", "acme")])],
        0,
    )
    .await
    .expect("answered");
    assert_eq!(codes(&third), (ok, vec![ok]), "{third:?}");
    let fourth = ask(
        &mut on_leader,
        "edge",
        vec![descriptor(&[("tenant", "acme")])],
        0,
    )
    .await
    .expect("answered");
    assert_eq!(codes(&fourth), (over, vec![over]), "{fourth:?}");
    assert_eq!(fourth.statuses[0].limit_remaining, 0);
    let reset = fourth.statuses[0]
        .duration_until_reset
        .expect("time until reset");
    assert!(reset.seconds > 0 && reset.seconds <= 60, "{reset:?}");

    tracing::info!("--- one request, several descriptors: each answered, overall over");
    let mixed = ask(
        &mut on_leader,
        "edge",
        vec![
            descriptor(&[("tenant", "acme")]),
            descriptor(&[("tenant", "zed")]),
            descriptor(&[("health", "")]),
            descriptor(&[("nothing", "matches")]),
        ],
        0,
    )
    .await
    .expect("answered");
    assert_eq!(codes(&mixed), (over, vec![over, ok, ok, ok]), "{mixed:?}");
    assert!(
        mixed.statuses[1..]
            .iter()
            .all(|status| status.current_limit.is_none()),
        "no limit for a key-only rule without one, unlimited, or no match: {mixed:?}"
    );
    let nothing = ask(
        &mut on_leader,
        "elsewhere",
        vec![descriptor(&[("a", "b")])],
        0,
    )
    .await
    .expect("answered");
    assert_eq!(
        codes(&nothing),
        (ok, vec![ok]),
        "an unknown domain matches nothing"
    );

    tracing::info!("--- hits_addend takes three at once; shadow mode counts but says OK");
    let three = ask(
        &mut on_leader,
        "edge",
        vec![descriptor(&[("tenant", "beta")])],
        3,
    )
    .await
    .expect("answered");
    assert_eq!(codes(&three), (ok, vec![ok]), "{three:?}");
    assert_eq!(three.statuses[0].limit_remaining, 0, "{three:?}");
    let after = ask(
        &mut on_leader,
        "edge",
        vec![descriptor(&[("tenant", "beta")])],
        0,
    )
    .await
    .expect("answered");
    assert_eq!(codes(&after), (over, vec![over]), "{after:?}");
    for _ in 0..2 {
        let shadow = ask(
            &mut on_leader,
            "edge",
            vec![descriptor(&[("path", "/x")])],
            0,
        )
        .await
        .expect("answered");
        assert_eq!(codes(&shadow), (ok, vec![ok]), "{shadow:?}");
    }
    assert_eq!(
        fleet
            .metric(
                leader,
                r#"ankusa_envoy_descriptors_total{outcome="shadow_over_limit",decided_by="fleet"}"#
            )
            .await,
        Some(1.0),
        "the second shadow-mode request was over its limit"
    );

    tracing::info!("--- bad input is refused by name");
    let refused = ask(&mut on_leader, "", vec![descriptor(&[("a", "b")])], 0)
        .await
        .expect_err("an empty domain");
    assert_eq!(refused.code(), tonic::Code::InvalidArgument);
    assert!(refused.message().contains("domain"), "{refused:?}");
    let refused = ask(&mut on_leader, "edge", vec![descriptor(&[])], 0)
        .await
        .expect_err("no entries");
    assert!(
        refused.message().contains("descriptors[0].entries"),
        "{refused:?}"
    );
    let refused = ask(&mut on_leader, "edge", vec![], 0)
        .await
        .expect_err("no descriptors");
    assert!(refused.message().contains("descriptors"), "{refused:?}");
    let refund = RateLimitDescriptor {
        is_negative_hits: true,
        ..descriptor(&[("tenant", "acme")])
    };
    let refused = ask(&mut on_leader, "edge", vec![refund], 0)
        .await
        .expect_err("a refund");
    assert!(
        refused
            .message()
            .contains("descriptors[0].is_negative_hits"),
        "{refused:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_cut_off_from_the_fleet_decides_alone() {
    init_tracing();
    let (fleet, _limits) = start().await;
    let leader = fleet.wait_for_leader(&[1, 2, 3]).await;
    let follower = (1..=3).find(|id| *id != leader).expect("a follower");
    fleet.isolate(follower, pb::internal::FaultKind::Drop).await;
    let mut cut_off = client(&fleet, follower).await;
    let answer = ask(
        &mut cut_off,
        "edge",
        vec![descriptor(&[("tenant", "acme")])],
        0,
    )
    .await
    .expect("answered alone, within the deadline");
    assert_eq!(answer.statuses.len(), 1, "{answer:?}");
    assert_eq!(answer.statuses[0].code, Code::Ok as i32, "{answer:?}");
    let local = r#"ankusa_envoy_descriptors_total{outcome="ok",decided_by="local"}"#;
    assert_eq!(fleet.metric(follower, local).await, Some(1.0));
    fleet.heal(follower).await;
}
