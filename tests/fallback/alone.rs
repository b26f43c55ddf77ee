//! A node without a quorum (left alone, or started alone) answers locally: within one
//! second of its start, for mixed-scope hits, with a full proposal queue, and for a reset.

use std::time::Duration;

use ankusa_fleet::pb;
use ankusa_fleet::pb::fleet_client::FleetClient;
use futures::StreamExt;
use tokio::time::Instant;
use tonic::transport::Channel;

use crate::common::*;
use crate::support::millis;
use crate::{claim_hit, decided, within_deadline};

/// A 3-node fleet (with `extra` config lines) of which only one follower is left running:
/// no quorum. The fleet is returned to keep that node alive.
async fn a_follower_left_alone(extra: &str) -> (Fleet, u64) {
    let mut fleet = Fleet::start(3, extra).await;
    let leader = fleet.wait_for_leader(&[1, 2, 3]).await;
    let survivor = (1..=3).find(|id| *id != leader).expect("a follower");
    tracing::info!("--- only node {survivor} is left: no quorum");
    for id in (1..=3).filter(|id| *id != survivor) {
        fleet.kill(id);
    }
    (fleet, survivor)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_started_alone_serves_within_one_second() {
    init_tracing();
    const TIMEOUT_MS: u32 = 100;
    /// Start-up of a debug build on a loaded machine, beyond the one second the the contract allows.
    const START_MARGIN: Duration = Duration::from_millis(500);

    tracing::info!("--- start node 1 of a three-voter fleet whose other nodes never start");
    let spawned_at = Instant::now();
    let fleet = Fleet::start_some(3, &[1], "");
    let request = claim_hit("alone", "first", &hook_of("first"), TIMEOUT_MS);
    let deadline = spawned_at + CONDITION_DEADLINE;
    let response = loop {
        let endpoint =
            Channel::from_shared(format!("http://{}", fleet.api_addr(1))).expect("an endpoint");
        if let Ok(channel) = endpoint.connect().await {
            match FleetClient::new(channel).hit(request.clone()).await {
                Ok(response) => break response.into_inner(),
                Err(e) => tracing::info!(error = %e, "the lone node does not answer yet"),
            }
        }
        if Instant::now() > deadline {
            fleet.fail("the lone node never answered");
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    let first_answer = spawned_at.elapsed();
    tracing::info!(
        first_answer_ms = millis(first_answer),
        "spawn to first answer"
    );

    let got = (
        outcome(&response),
        decided(response.decided_by),
        response.local_reason.as_str(),
    );
    if got != (Outcome::Allowed, "local", "no leader") {
        fleet.fail(&format!("the lone node answered {got:?}"));
    }
    if first_answer > Duration::from_secs(1) + START_MARGIN {
        fleet.fail(&format!(
            "the first answer came {first_answer:?} after spawn"
        ));
    }
}

/// A hit whose charges and claim have different scopes still answers within its deadline
/// when the fleet cannot: the fleet part is decided by the local fallback, the node part by
/// the node, and the answer says `DECIDED_BY_LOCAL`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mixed_scope_hits_fall_back_too() {
    init_tracing();
    let (fleet, survivor) = a_follower_left_alone("").await;
    let mut client = fleet.client(survivor).await;
    let mixed = |charges_scope: pb::Scope, claim_scope: pb::Scope, key: &str, hook: &str| {
        let mut request = hit(
            vec![hooks("mixed", 1_000, 60_000_000)],
            Some(claim("mixed", key, hook)),
        );
        request.timeout_ms = 200;
        request.rate_limit_scope = charges_scope as i32;
        request.dedupe_scope = claim_scope as i32;
        request
    };
    for (charges_scope, claim_scope, key) in [
        (
            pb::Scope::Fleet,
            pb::Scope::Node,
            "fleet-charges-node-claim",
        ),
        (
            pb::Scope::Node,
            pb::Scope::Fleet,
            "node-charges-fleet-claim",
        ),
    ] {
        tracing::info!(
            key,
            "--- first hook takes the key, a second one finds it pending"
        );
        let started = Instant::now();
        let first = client
            .hit(mixed(charges_scope, claim_scope, key, "hook-1"))
            .await
            .expect("answered")
            .into_inner();
        assert!(
            started.elapsed() < Duration::from_millis(200 + 500),
            "{key}: answered after {:?}",
            started.elapsed()
        );
        assert_eq!(outcome(&first), Outcome::Allowed, "{key}");
        assert_eq!(first.decided_by, pb::DecidedBy::Local as i32, "{key}");
        // A mixed hit says local anyway (contract §8); that its fleet part fell back too
        // is in the reason, after the node-scoped part.
        let node_part = if claim_scope == pb::Scope::Node {
            "node scope: claim; "
        } else {
            "node scope: charges; "
        };
        assert!(
            first.local_reason.starts_with(node_part) && first.local_reason.len() > node_part.len(),
            "{key}: the reason names the node part and why the fleet part was local: {:?}",
            first.local_reason
        );
        let second = client
            .hit(mixed(charges_scope, claim_scope, key, "hook-2"))
            .await
            .expect("answered")
            .into_inner();
        assert!(
            matches!(outcome(&second), Outcome::Pending(_)),
            "{key}: a second hook got {:?}",
            outcome(&second)
        );
    }
}

/// The proposal queue is bounded: when it is full, a call does not wait. An overloaded
/// fleet is one of contract §7's failures, so the node answers from its own state at
/// once: a hit decided locally, its reason saying "overloaded" with a retry hint (issue
/// #4's overloaded answer), and a settle written to the node's queue (`QUEUED`, never lost).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_proposal_queue_answers_locally_at_once() {
    init_tracing();
    // The follower's one forward slot waits for a leader that does not come.
    let (fleet, survivor) =
        a_follower_left_alone("queue_depth_max = 1\nforwards_in_flight_max = 1").await;
    // The forward slot, the batcher and the queue hold three of these until their deadline
    // (no leader comes back); the others find the queue full.
    const WAITING_MS: u32 = 30_000;
    let mut calls: futures::stream::FuturesUnordered<_> = (0..6)
        .map(|i| {
            let addr = fleet.api_addr(survivor);
            async move {
                let mut client = connect(&addr).await;
                let mut request = hit(vec![], Some(claim("queue", &format!("key-{i}"), "hook")));
                request.timeout_ms = WAITING_MS;
                client.hit(request).await
            }
        })
        .collect();
    let first = calls.next().await.expect("six calls");
    let first = first
        .expect("an overloaded hit is answered, not refused")
        .into_inner();
    assert_eq!(decided(first.decided_by), "local");
    assert!(
        first.local_reason.contains("overloaded") && first.local_reason.contains("retry after"),
        "the first answer comes from a full queue: {first:?}"
    );
    assert_eq!(
        outcome(&first),
        Outcome::Allowed,
        "an unknown key is accepted"
    );

    tracing::info!("--- the queue is still full: a settle is queued on this node's disk");
    let mut client = connect(&fleet.api_addr(survivor)).await;
    let mut request = settle("queue", "settle-key", "hook", pb::SettleOutcome::Commit);
    request.timeout_ms = WAITING_MS;
    let settled = client
        .settle(request)
        .await
        .expect("an overloaded settle is answered, not refused")
        .into_inner();
    assert_eq!(
        settled.status,
        pb::SettleStatus::Queued as i32,
        "{settled:?}"
    );
    assert_eq!(decided(settled.decided_by), "local");

    let mut overloaded = 1;
    while let Some(answer) = calls.next().await {
        let answer = answer.expect("every hit is answered").into_inner();
        assert_eq!(decided(answer.decided_by), "local", "{answer:?}");
        if answer.local_reason.contains("overloaded") {
            overloaded += 1;
        } else {
            assert_eq!(answer.local_reason, "no leader", "{answer:?}");
        }
    }
    assert!(
        overloaded >= 3,
        "at most three of six wait for a leader: {overloaded} overloaded"
    );
}

/// contract §10: a reset clears the node-local buckets even when the fleet cannot take
/// it, including those a cut-off node charges in its place (contract §7).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_clears_the_buckets_a_cut_off_node_charges() {
    init_tracing();
    let (fleet, survivor) = a_follower_left_alone("").await;
    let mut client = connect(&fleet.api_addr(survivor)).await;
    // One hit per hour: the second is denied for the whole test unless the bucket is reset.
    let hourly = || pb::HitRequest {
        timeout_ms: 200,
        ..hit(vec![hooks("reset-me", 3_600_000_000, 3_600_000_000)], None)
    };
    let first = client.hit(hourly()).await.expect("answered").into_inner();
    assert_eq!(
        (outcome(&first), decided(first.decided_by)),
        (Outcome::Allowed, "local")
    );
    let second = client.hit(hourly()).await.expect("answered").into_inner();
    assert!(
        matches!(outcome(&second), Outcome::RateLimited(_)),
        "{second:?}"
    );

    let mut request = reset("reset-me");
    request.timeout_ms = 200;
    let status = client
        .reset(request)
        .await
        .expect_err("no leader to take it");
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");

    let after = client.hit(hourly()).await.expect("answered").into_inner();
    assert_eq!(
        (outcome(&after), decided(after.decided_by)),
        (Outcome::Allowed, "local"),
        "the reset cleared the bucket the fallback charged"
    );
}

/// A `HitBatch` frame on a node without a quorum: every hit is answered locally, each by
/// its own deadline: the two hits with the shorter timeout come together in an earlier
/// reply than the one with the longer, which does not hold them back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frame_without_a_quorum_answers_each_hit_by_its_own_deadline() {
    init_tracing();
    let (fleet, survivor) = a_follower_left_alone("").await;
    let mut client = fleet.client(survivor).await;
    let mut batch = HitBatch::open(&mut client).await;
    const SHORT_MS: u32 = 100;
    const LONG_MS: u32 = 1_500;
    // A node-scoped hit behind a fleet hit with a long timeout: decided at once, and not
    // held back by it.
    let node_scoped = pb::HitRequest {
        rate_limit_scope: pb::Scope::Node as i32,
        dedupe_scope: pb::Scope::Node as i32,
        ..claim_hit("frame", "node", "hook-4", LONG_MS)
    };
    let started = Instant::now();
    batch
        .send(vec![
            (1, claim_hit("frame", "short-1", "hook-1", SHORT_MS)),
            (2, claim_hit("frame", "short-2", "hook-2", SHORT_MS)),
            (3, claim_hit("frame", "long", "hook-3", LONG_MS)),
            (4, node_scoped),
        ])
        .await;
    let answers = batch.answers(4).await;
    let elapsed = started.elapsed();
    let node = answers[&4].1.as_ref().expect("answered");
    assert_eq!(
        (outcome(node), node.local_reason.as_str()),
        (Outcome::Allowed, "node scope"),
        "{node:?}"
    );
    assert!(
        answers[&4].0 < answers[&3].0,
        "the node-scoped hit is not held back by the long one: {answers:?}"
    );
    for (id, (_, answer)) in answers.iter().filter(|(id, _)| **id != 4) {
        let response = answer.as_ref().expect("answered");
        assert_eq!(
            outcome(response),
            Outcome::Allowed,
            "hit {id}: {response:?}"
        );
        assert_eq!(
            decided(response.decided_by),
            "local",
            "hit {id}: {response:?}"
        );
        // The leader's loss may not be known yet: the fleet is then waited for until the
        // deadline.
        assert!(
            ["no leader", "deadline"].contains(&response.local_reason.as_str()),
            "hit {id}: {response:?}"
        );
    }
    let message = |id: u64| answers[&id].0;
    assert_eq!(
        message(1),
        message(2),
        "consecutive hits with one timeout are one group: {answers:?}"
    );
    assert!(
        message(1) < message(3),
        "the short hits are not held back by the long one: {answers:?}"
    );
    assert!(
        within_deadline(elapsed, LONG_MS),
        "every hit by its deadline: the last after {elapsed:?}"
    );
}
