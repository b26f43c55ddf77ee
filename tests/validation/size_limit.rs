//! Contract §9, last rule: a message over the API's size limit is refused by the transport
//! before it is read, its status naming the limit; the node's own validation never sees it.

use ankusa_fleet::limits::{API_MESSAGE_BYTES_MAX, HIT_BATCH_MESSAGE_BYTES_MAX};

use super::*;

/// The status of an oversized call: OUT_OF_RANGE from the transport (INVALID_ARGUMENT
/// would mean the request was read and validated), its message naming the limit.
fn assert_refused_by_size(status: &tonic::Status, call: &str) {
    assert_eq!(status.code(), tonic::Code::OutOfRange, "{call}: {status:?}");
    assert!(
        status
            .message()
            .contains(&format!("the limit is: {API_MESSAGE_BYTES_MAX} bytes")),
        "{call}: the status names the limit: {status:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_over_the_size_limit_is_refused_by_the_transport_naming_it() {
    init_tracing();
    let fleet = Fleet::start(3, "").await;
    let oversized = long(API_MESSAGE_BYTES_MAX + 1);
    for id in 1..=3 {
        let mut client = fleet.client(id).await;
        let status = client
            .hit(hit(
                vec![ghost_charge()],
                Some(claim(GHOST, &oversized, GHOST_HOOK)),
            ))
            .await
            .expect_err("an oversized hit is refused");
        assert_refused_by_size(&status, "hit");
        // Far over it but within a HitBatch frame's limit: still one request's limit,
        // refused from the length prefix.
        let status = client
            .hit(hit(
                vec![ghost_charge()],
                Some(claim(
                    GHOST,
                    &long(HIT_BATCH_MESSAGE_BYTES_MAX / 2),
                    GHOST_HOOK,
                )),
            ))
            .await
            .expect_err("a hit of half a frame is refused");
        assert_refused_by_size(&status, "hit of half a frame");
        let status = client
            .settle(settle(
                GHOST,
                &oversized,
                GHOST_HOOK,
                pb::SettleOutcome::Commit,
            ))
            .await
            .expect_err("an oversized settle is refused");
        assert_refused_by_size(&status, "settle");
        // The connection still serves a request within the limit.
        let answer = client
            .hit(ghost_hit())
            .await
            .expect("a valid hit after the refusals")
            .into_inner();
        assert!(answer.outcome.is_some(), "node {id}: {answer:?}");
    }
}
