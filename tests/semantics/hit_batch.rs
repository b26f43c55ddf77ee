//! HitBatch (beyond contract §14): many hits per message, each answered by the caller's id
//! as Hit would answer it, with the effects of one message's hits in their order.

use ankusa_fleet::limits::{
    API_MESSAGE_BYTES_MAX, HIT_BATCH_HITS_MAX, HIT_BATCH_MESSAGE_BYTES_MAX,
};
use ankusa_fleet::pb;

use crate::common::*;
use crate::{commit_through_another_node, entries, node_hit, slow};

/// The caller's ids, out of order on purpose: answers are matched by id, not by position.
const FIRST: u64 = 40;
const SECOND: u64 = 7;
const INVALID: u64 = 99;
const FOURTH: u64 = 3;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hit_batch_answers_each_hit_by_id_with_effects_in_frame_order() {
    init_tracing();
    let fleet = Fleet::start(3, "").await;
    for (role, id) in entries(&fleet).await {
        tracing::info!(role, "--- four hits in one frame");
        let tenant = format!("batch-{role}");
        let mut client = fleet.client(id).await;
        let mut batch = HitBatch::open(&mut client).await;
        let mut invalid = hit(vec![], Some(claim(&tenant, "evt-3", "hook-x")));
        invalid.claim.as_mut().expect("a claim").tenant = String::new();
        batch
            .send(vec![
                (
                    FIRST,
                    hit(
                        vec![slow(&tenant, 1)],
                        Some(claim(&tenant, "evt-1", "hook-a")),
                    ),
                ),
                (SECOND, hit(vec![], Some(claim(&tenant, "evt-1", "hook-b")))),
                (INVALID, invalid),
                (
                    FOURTH,
                    hit(
                        vec![slow(&tenant, 1)],
                        Some(claim(&tenant, "evt-2", "hook-c")),
                    ),
                ),
            ])
            .await;
        let answers = batch.answers(4).await;
        assert_eq!(
            answers.keys().copied().collect::<Vec<_>>(),
            [FOURTH, SECOND, FIRST, INVALID],
            "every hit is answered once, by its id: {answers:?}"
        );
        let first = answers[&FIRST]
            .1
            .as_ref()
            .expect("the first hit is answered");
        assert_eq!(outcome(first), Outcome::Allowed, "{first:?}");
        assert_eq!(first.decided_by, pb::DecidedBy::Fleet as i32, "{first:?}");
        let second = answers[&SECOND]
            .1
            .as_ref()
            .expect("the second hit is answered");
        assert!(
            matches!(outcome(second), Outcome::Pending(_)),
            "the first hit (before it in the frame) holds evt-1 for hook-a: {second:?}"
        );
        let refused = answers[&INVALID]
            .1
            .as_ref()
            .expect_err("an empty tenant is refused");
        assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{refused:?}");
        assert!(refused.message().contains("claim.tenant"), "{refused:?}");
        let fourth = answers[&FOURTH].1.as_ref().expect("the others go on");
        assert!(
            matches!(outcome(fourth), Outcome::RateLimited(_)),
            "the first hit spent the bucket's one hit: {fourth:?}"
        );

        tracing::info!(
            role,
            "--- a commit made through another node is seen on the stream"
        );
        commit_through_another_node(&fleet, id, &tenant, "evt-1", "hook-a").await;
        let again = batch
            .hit(hit(vec![], Some(claim(&tenant, "evt-1", "hook-z"))))
            .await
            .expect("answered");
        assert_eq!(outcome(&again), Outcome::Duplicate("hook-a".to_owned()));
    }
}

/// A frame's hits in different scopes are each decided where Hit would decide them, and
/// each says who decided it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frame_decides_each_hit_in_its_own_scope() {
    init_tracing();
    let fleet = Fleet::start(3, "").await;
    for (role, id) in entries(&fleet).await {
        let tenant = format!("scopes-{role}");
        let mut client = fleet.client(id).await;
        let mut batch = HitBatch::open(&mut client).await;
        let mixed = pb::HitRequest {
            dedupe_scope: pb::Scope::Node as i32,
            ..hit(
                vec![slow(&tenant, 5)],
                Some(claim(&tenant, "evt-mixed", "hook-m")),
            )
        };
        batch
            .send(vec![
                (1, node_hit(hit(vec![slow(&tenant, 1)], None))),
                (2, hit(vec![slow(&tenant, 5)], None)),
                (3, mixed),
                (4, node_hit(hit(vec![slow(&tenant, 1)], None))),
            ])
            .await;
        let answers = batch.answers(4).await;
        let decided = |id: u64| {
            let response = answers[&id].1.as_ref().expect("answered");
            (
                outcome(response),
                response.decided_by,
                response.local_reason.clone(),
            )
        };
        let local = pb::DecidedBy::Local as i32;
        assert_eq!(
            decided(1),
            (Outcome::Allowed, local, "node scope".to_owned()),
            "{role}"
        );
        assert_eq!(
            decided(2),
            (Outcome::Allowed, pb::DecidedBy::Fleet as i32, String::new()),
            "{role}"
        );
        assert_eq!(
            decided(3),
            (Outcome::Allowed, local, "node scope: claim".to_owned()),
            "{role}"
        );
        assert!(
            matches!(decided(4).0, Outcome::RateLimited(_)),
            "the node-scoped bucket of one hit was spent by hit 1: {:?}",
            decided(4)
        );
    }
}

/// A hit without its request is refused by id and the others go on; a message with a hit
/// over one hit's limit, or with too many hits, or over the frame's limit ends the stream,
/// its status naming the limit, and nothing of it is decided.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frame_holds_each_hit_and_itself_to_their_limits() {
    init_tracing();
    let fleet = Fleet::start(3, "").await;
    let leader = fleet.wait_for_leader(&[1, 2, 3]).await;
    let mut client = fleet.client(leader).await;
    let mut batch = HitBatch::open(&mut client).await;
    batch
        .frames()
        .send(pb::HitBatchRequest {
            hits: vec![
                pb::BatchedHit { id: 1, hit: None },
                pb::BatchedHit {
                    id: 2,
                    hit: Some(hit(vec![], Some(claim("limits", "evt-2", "hook-2")))),
                },
            ],
        })
        .await
        .expect("the stream takes frames");
    let answers = batch.answers(2).await;
    let refused = answers[&1]
        .1
        .as_ref()
        .expect_err("a hit without its request");
    assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{refused:?}");
    assert!(refused.message().starts_with("hit: "), "{refused:?}");
    let taken = answers[&2].1.as_ref().expect("the other hit goes on");
    assert_eq!(outcome(taken), Outcome::Allowed, "{taken:?}");

    let oversized = "k".repeat(API_MESSAGE_BYTES_MAX + 1);
    batch
        .send(vec![
            (1, hit(vec![], Some(claim("limits", "evt-3", "hook-3")))),
            (2, hit(vec![], Some(claim("limits", &oversized, "hook-4")))),
        ])
        .await;
    let ended = batch.ended().await;
    assert_eq!(ended.code(), tonic::Code::OutOfRange, "{ended:?}");
    assert!(
        ended.message().starts_with("hits[1].hit: ")
            && ended
                .message()
                .contains(&format!("the limit is: {API_MESSAGE_BYTES_MAX} bytes")),
        "{ended:?}"
    );

    let mut batch = HitBatch::open(&mut client).await;
    let count = HIT_BATCH_HITS_MAX + 1;
    let too_many = (0..count as u64)
        .map(|i| {
            (
                i,
                hit(vec![], Some(claim("limits", &format!("many-{i}"), "hook"))),
            )
        })
        .collect();
    batch.send(too_many).await;
    let ended = batch.ended().await;
    assert_eq!(ended.code(), tonic::Code::InvalidArgument, "{ended:?}");
    assert!(ended.message().starts_with("hits: "), "{ended:?}");

    let mut batch = HitBatch::open(&mut client).await;
    // Each hit within its own limit, together past the frame's.
    let key = "k".repeat(API_MESSAGE_BYTES_MAX - 1024);
    let hits_to_pass = HIT_BATCH_MESSAGE_BYTES_MAX / key.len() + 2;
    let huge = (0..hits_to_pass as u64)
        .map(|i| (i, hit(vec![], Some(claim("limits", &key, "hook")))))
        .collect();
    batch.send(huge).await;
    let ended = batch.ended().await;
    assert_eq!(ended.code(), tonic::Code::OutOfRange, "{ended:?}");
    assert!(
        ended.message().contains(&format!(
            "the limit is: {HIT_BATCH_MESSAGE_BYTES_MAX} bytes"
        )),
        "{ended:?}"
    );

    let mut batch = HitBatch::open(&mut client).await;
    let probe = batch
        .hit(hit(vec![], Some(claim("limits", "evt-3", "hook-probe"))))
        .await
        .expect("a new stream is served");
    assert_eq!(
        outcome(&probe),
        Outcome::Allowed,
        "no hit of a refused message took its claim: {probe:?}"
    );
    let probe = batch
        .hit(hit(vec![], Some(claim("limits", "many-0", "hook-probe"))))
        .await
        .expect("answered");
    assert_eq!(outcome(&probe), Outcome::Allowed, "{probe:?}");
}
