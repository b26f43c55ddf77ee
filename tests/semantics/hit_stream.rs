//! HitStream (beyond contract §14): the same answers as Hit, in request order.

use ankusa_fleet::pb;

use crate::common::*;
use crate::{commit_through_another_node, entries, slow};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hit_stream_answers_like_hit_in_request_order() {
    init_tracing();
    let fleet = Fleet::start(3, "").await;
    for (role, id) in entries(&fleet).await {
        tracing::info!(role, "--- four requests sent at once on one stream");
        let tenant = format!("stream-{role}");
        let mut client = fleet.client(id).await;
        let mut stream = HitStream::open(&mut client).await;
        let mut invalid = hit(vec![], Some(claim(&tenant, "evt-3", "hook-x")));
        invalid.claim.as_mut().expect("a claim").tenant = String::new();
        let requests = [
            hit(
                vec![slow(&tenant, 1)],
                Some(claim(&tenant, "evt-1", "hook-a")),
            ),
            hit(vec![], Some(claim(&tenant, "evt-1", "hook-b"))),
            invalid,
            hit(
                vec![slow(&tenant, 1)],
                Some(claim(&tenant, "evt-2", "hook-c")),
            ),
        ];
        for request in requests {
            stream.send(request).await;
        }
        let first = stream.reply().await.expect("the first hit is answered");
        assert_eq!(outcome(&first), Outcome::Allowed, "{first:?}");
        assert_eq!(first.decided_by, pb::DecidedBy::Fleet as i32, "{first:?}");
        let second = stream.reply().await.expect("the second hit is answered");
        assert!(
            matches!(outcome(&second), Outcome::Pending(_)),
            "the first hit (sent before it) holds evt-1 for hook-a: {second:?}"
        );
        let third = stream
            .reply()
            .await
            .expect_err("an empty tenant is refused");
        assert_eq!(third.code(), tonic::Code::InvalidArgument, "{third:?}");
        assert!(third.message().contains("claim.tenant"), "{third:?}");
        let fourth = stream
            .reply()
            .await
            .expect("the stream goes on after an error");
        assert!(
            matches!(outcome(&fourth), Outcome::RateLimited(_)),
            "the first hit spent the bucket's one hit: {fourth:?}"
        );

        tracing::info!(
            role,
            "--- a commit made through another node is seen on the stream"
        );
        commit_through_another_node(&fleet, id, &tenant, "evt-1", "hook-a").await;
        let again = stream
            .hit(hit(vec![], Some(claim(&tenant, "evt-1", "hook-z"))))
            .await
            .expect("answered");
        assert_eq!(outcome(&again), Outcome::Duplicate("hook-a".to_owned()));
    }
}

/// Rounds of one stream's effects in order (issue 26, finding 4): in each round eight
/// requests are sent at once, each charging the same one-hit bucket, and only the first
/// sent may be allowed, through a follower as through the leader. Before the fix a
/// follower forwarded two batches from two tasks, and the leader entered two `Propose`
/// frames of one stream from two tasks, so a later request could take the bucket first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_takes_effect_in_request_order_round_after_round() {
    init_tracing();
    const ROUNDS: usize = 200;
    const REQUESTS: usize = 8;
    let fleet = Fleet::start(3, "").await;
    for (role, id) in entries(&fleet).await {
        tracing::info!(
            role,
            "--- {ROUNDS} rounds of {REQUESTS} requests sent at once"
        );
        let mut client = fleet.client(id).await;
        let mut stream = HitStream::open(&mut client).await;
        for round in 0..ROUNDS {
            let tenant = format!("order-{role}-{round}");
            for _ in 0..REQUESTS {
                stream.send(hit(vec![slow(&tenant, 1)], None)).await;
            }
            let mut outcomes = Vec::with_capacity(REQUESTS);
            for _ in 0..REQUESTS {
                let reply = stream.reply().await.expect("a hit is answered");
                assert_eq!(reply.decided_by, pb::DecidedBy::Fleet as i32, "{reply:?}");
                outcomes.push(outcome(&reply));
            }
            assert_eq!(outcomes[0], Outcome::Allowed, "round {round}: {outcomes:?}");
            assert!(
                outcomes[1..]
                    .iter()
                    .all(|later| matches!(later, Outcome::RateLimited(_))),
                "round {round} through the {role}: the first request sent spent the bucket's one hit: {outcomes:?}"
            );
        }
    }
}
