//! Every invalid request is INVALID_ARGUMENT naming its field, through every node (unary
//! and over HitStream), and writes nothing.

use ankusa_fleet::pb;

use crate::common::*;
use crate::{
    ghost_bytes, ghost_charge, ghost_check_rate, ghost_hit, ghost_settle, long, wide, Client,
    GHOST, GHOST_CAPACITY_US, GHOST_INCREMENT_US, GHOST_KEY, THIRTY_DAYS_MS, YEAR_MS, YEAR_US,
};

#[derive(Clone, Debug)]
enum Call {
    Hit(pb::HitRequest),
    Settle(pb::SettleRequest),
    Reset(pb::ResetRequest),
    CheckRate(pb::CheckRateRequest),
}

async fn send(client: &mut Client, call: Call) -> Result<(), tonic::Status> {
    match call {
        Call::Hit(request) => client.hit(request).await.map(drop),
        Call::Settle(request) => client.settle(request).await.map(drop),
        Call::Reset(request) => client.reset(request).await.map(drop),
        Call::CheckRate(request) => client.check_rate(request).await.map(drop),
    }
}

/// One invalid request and the field(s) its message may name (two only where the rules
/// make both fields wrong at once).
struct Invalid {
    what: &'static str,
    call: Call,
    fields: &'static [&'static str],
}

fn invalid_hit(
    what: &'static str,
    fields: &'static [&'static str],
    edit: impl FnOnce(&mut pb::HitRequest),
) -> Invalid {
    let mut request = ghost_hit();
    edit(&mut request);
    Invalid {
        what,
        call: Call::Hit(request),
        fields,
    }
}

fn invalid_settle(
    what: &'static str,
    fields: &'static [&'static str],
    edit: impl FnOnce(&mut pb::SettleRequest),
) -> Invalid {
    let mut request = ghost_settle();
    edit(&mut request);
    Invalid {
        what,
        call: Call::Settle(request),
        fields,
    }
}

fn invalid_reset(
    what: &'static str,
    fields: &'static [&'static str],
    edit: impl FnOnce(&mut pb::ResetRequest),
) -> Invalid {
    let mut request = reset(GHOST);
    edit(&mut request);
    Invalid {
        what,
        call: Call::Reset(request),
        fields,
    }
}

fn invalid_check_rate(
    what: &'static str,
    fields: &'static [&'static str],
    edit: impl FnOnce(&mut pb::CheckRateRequest),
) -> Invalid {
    let mut request = ghost_check_rate();
    edit(&mut request);
    Invalid {
        what,
        call: Call::CheckRate(request),
        fields,
    }
}

fn claim_of(request: &mut pb::HitRequest) -> &mut pb::Claim {
    request.claim.as_mut().expect("the ghost hit has a claim")
}

fn invalid_hits() -> Vec<Invalid> {
    vec![
        invalid_hit("kind unspecified", &["charges[0].kind"], |r| {
            r.charges[0].kind = pb::Kind::Unspecified as i32;
        }),
        invalid_hit("kind unknown", &["charges[0].kind"], |r| {
            r.charges[0].kind = 7;
        }),
        invalid_hit("second charge's kind", &["charges[1].kind"], |r| {
            let mut charge = hooks("ghost-b", GHOST_INCREMENT_US, GHOST_CAPACITY_US);
            charge.kind = pb::Kind::Unspecified as i32;
            r.charges.push(charge);
        }),
        invalid_hit("charge tenant empty", &["charges[0].tenant"], |r| {
            r.charges[0].tenant = String::new();
        }),
        invalid_hit("charge tenant 257 bytes", &["charges[0].tenant"], |r| {
            r.charges[0].tenant = long(257);
        }),
        invalid_hit(
            "charge tenant 129 chars = 258 bytes",
            &["charges[0].tenant"],
            |r| {
                r.charges[0].tenant = wide(129);
            },
        ),
        invalid_hit("increment 0", &["charges[0].increment_us"], |r| {
            r.charges[0].increment_us = 0;
        }),
        invalid_hit(
            "increment over a year",
            &["charges[0].increment_us", "charges[0].capacity_us"],
            |r| {
                r.charges[0].increment_us = YEAR_US + 1;
                r.charges[0].capacity_us = YEAR_US + 1;
            },
        ),
        invalid_hit(
            "capacity below increment",
            &["charges[0].capacity_us"],
            |r| {
                r.charges[0].increment_us = 2;
                r.charges[0].capacity_us = 1;
            },
        ),
        invalid_hit("capacity 0", &["charges[0].capacity_us"], |r| {
            r.charges[0].capacity_us = 0;
        }),
        invalid_hit("capacity over a year", &["charges[0].capacity_us"], |r| {
            r.charges[0].increment_us = 1;
            r.charges[0].capacity_us = YEAR_US + 1;
        }),
        invalid_hit("second charge for (hooks, ghost)", &["charges[1]"], |r| {
            r.charges.push(ghost_charge());
        }),
        invalid_hit("third charge for (bytes, ghost)", &["charges[2]"], |r| {
            r.charges.push(ghost_bytes());
            r.charges.push(ghost_bytes());
        }),
        invalid_hit("17 charges", &["charges"], |r| {
            r.charges = (0..17)
                .map(|i| hooks(&format!("ghost-{i}"), 1, 1))
                .collect();
        }),
        invalid_hit("claim tenant empty", &["claim.tenant"], |r| {
            claim_of(r).tenant = String::new();
        }),
        invalid_hit("claim tenant 257 bytes", &["claim.tenant"], |r| {
            claim_of(r).tenant = long(257);
        }),
        invalid_hit("claim source_id empty", &["claim.source_id"], |r| {
            claim_of(r).source_id = String::new();
        }),
        invalid_hit("claim source_id 257 bytes", &["claim.source_id"], |r| {
            claim_of(r).source_id = long(257);
        }),
        invalid_hit("claim key empty", &["claim.key"], |r| {
            claim_of(r).key = String::new();
        }),
        invalid_hit("claim key 1025 bytes", &["claim.key"], |r| {
            claim_of(r).key = long(1025);
        }),
        invalid_hit("claim hook_id empty", &["claim.hook_id"], |r| {
            claim_of(r).hook_id = String::new();
        }),
        invalid_hit("claim hook_id 257 bytes", &["claim.hook_id"], |r| {
            claim_of(r).hook_id = long(257);
        }),
        invalid_hit("claim-only hit, hook_id empty", &["claim.hook_id"], |r| {
            r.charges.clear();
            claim_of(r).hook_id = String::new();
        }),
        invalid_hit("claim ttl 0", &["claim.ttl_ms"], |r| {
            claim_of(r).ttl_ms = 0;
        }),
        invalid_hit("claim ttl over 30 days", &["claim.ttl_ms"], |r| {
            claim_of(r).ttl_ms = THIRTY_DAYS_MS + 1;
        }),
        invalid_hit("claim pending ttl 0", &["claim.pending_ttl_ms"], |r| {
            claim_of(r).pending_ttl_ms = 0;
        }),
        invalid_hit(
            "claim pending ttl over 30 days",
            &["claim.pending_ttl_ms"],
            |r| {
                claim_of(r).pending_ttl_ms = THIRTY_DAYS_MS + 1;
            },
        ),
        invalid_hit("timeout 60001", &["timeout_ms"], |r| {
            r.timeout_ms = 60_001;
        }),
        invalid_hit("timeout u32::MAX", &["timeout_ms"], |r| {
            r.timeout_ms = u32::MAX;
        }),
        invalid_hit("rate_limit_scope unknown", &["rate_limit_scope"], |r| {
            r.rate_limit_scope = 2;
        }),
        invalid_hit("dedupe_scope unknown", &["dedupe_scope"], |r| {
            r.dedupe_scope = 2;
        }),
    ]
}

fn invalid_settles() -> Vec<Invalid> {
    vec![
        invalid_settle("tenant empty", &["tenant"], |r| r.tenant = String::new()),
        invalid_settle("tenant 257 bytes", &["tenant"], |r| r.tenant = long(257)),
        invalid_settle("source_id empty", &["source_id"], |r| {
            r.source_id = String::new();
        }),
        invalid_settle("source_id 257 bytes", &["source_id"], |r| {
            r.source_id = long(257);
        }),
        invalid_settle("key empty", &["key"], |r| r.key = String::new()),
        invalid_settle("key 1025 bytes", &["key"], |r| r.key = long(1025)),
        invalid_settle("hook_id empty", &["hook_id"], |r| r.hook_id = String::new()),
        invalid_settle("hook_id 257 bytes", &["hook_id"], |r| r.hook_id = long(257)),
        invalid_settle("outcome unspecified", &["outcome"], |r| {
            r.outcome = pb::SettleOutcome::Unspecified as i32;
        }),
        invalid_settle("outcome unknown", &["outcome"], |r| r.outcome = 9),
        invalid_settle("ttl over 30 days", &["ttl_ms"], |r| {
            r.ttl_ms = THIRTY_DAYS_MS + 1;
        }),
        invalid_settle("timeout 60001", &["timeout_ms"], |r| r.timeout_ms = 60_001),
        invalid_settle("dedupe_scope unknown", &["dedupe_scope"], |r| {
            r.dedupe_scope = 3;
        }),
    ]
}

fn invalid_resets() -> Vec<Invalid> {
    vec![
        invalid_reset("tenant empty", &["tenant"], |r| r.tenant = String::new()),
        invalid_reset("tenant 257 bytes", &["tenant"], |r| r.tenant = long(257)),
        invalid_reset("timeout 60001", &["timeout_ms"], |r| r.timeout_ms = 60_001),
    ]
}

fn invalid_check_rates() -> Vec<Invalid> {
    vec![
        invalid_check_rate("entity_id empty", &["entity_id"], |r| {
            r.entity_id = String::new();
        }),
        invalid_check_rate("entity_id 257 bytes", &["entity_id"], |r| {
            r.entity_id = long(257);
        }),
        invalid_check_rate("operation empty", &["operation"], |r| {
            r.operation = String::new();
        }),
        invalid_check_rate("operation 257 bytes", &["operation"], |r| {
            r.operation = long(257);
        }),
        invalid_check_rate("limit 0", &["limit"], |r| r.limit = 0),
        invalid_check_rate("window 0", &["window_ms"], |r| r.window_ms = 0),
        invalid_check_rate("window over a year", &["window_ms"], |r| {
            r.window_ms = YEAR_MS + 1;
        }),
        invalid_check_rate("over one per microsecond", &["limit"], |r| {
            r.window_ms = 1;
            r.limit = 1_001;
        }),
        invalid_check_rate("timeout 60001", &["timeout_ms"], |r| r.timeout_ms = 60_001),
        invalid_check_rate("scope unknown", &["scope"], |r| r.scope = 5),
    ]
}

/// Sends every case through `client`; returns one line per case that broke contract §9.
/// What is wrong with `result` as the answer to `case` (None: INVALID_ARGUMENT naming the field).
fn misjudged(case: &Invalid, result: Result<(), tonic::Status>) -> Option<String> {
    match result {
        Ok(()) => Some("accepted".to_owned()),
        Err(status) if status.code() != tonic::Code::InvalidArgument => {
            Some(format!("{:?} {:?}", status.code(), status.message()))
        }
        Err(status) if !case.fields.iter().any(|f| names_field(status.message(), f)) => {
            Some(format!(
                "message {:?} does not name {:?}",
                status.message(),
                case.fields
            ))
        }
        Err(_) => None,
    }
}

/// Sends every case as a unary call, and every hit also over one `HitStream` and in a
/// `HitBatch` frame of its own (an error reply must not end either stream: the next case
/// goes on the same one).
async fn check_invalid(client: &mut Client, node: u64, cases: &[Invalid]) -> Vec<String> {
    let mut failures = Vec::new();
    let mut stream = HitStream::open(client).await;
    let mut batch = HitBatch::open(client).await;
    for case in cases {
        let what = case.what;
        if let Some(wrong) = misjudged(case, send(client, case.call.clone()).await) {
            failures.push(format!("node {node}, {what}: {wrong}"));
        }
        if let Call::Hit(request) = &case.call {
            let result = stream.hit(request.clone()).await.map(drop);
            if let Some(wrong) = misjudged(case, result) {
                failures.push(format!("node {node}, {what} (HitStream): {wrong}"));
            }
            let result = batch.hit(request.clone()).await.map(drop);
            if let Some(wrong) = misjudged(case, result) {
                failures.push(format!("node {node}, {what} (HitBatch): {wrong}"));
            }
        }
    }
    failures
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_requests_name_the_field_and_write_nothing() {
    init_tracing();
    let fleet = Fleet::start(3, "").await;
    let cases: Vec<Invalid> = [
        invalid_hits(),
        invalid_settles(),
        invalid_resets(),
        invalid_check_rates(),
    ]
    .into_iter()
    .flatten()
    .collect();

    // An election in the middle appends the new leader's own entry, which would hide
    // (or fake) a write; such a round proves nothing and is run again.
    let mut counted = false;
    for round in 1..=3 {
        let leader = fleet.wait_for_leader(&[1, 2, 3]).await;
        let before = fleet.wait_for_applied_in_step(&[1, 2, 3]).await;
        let mut failures = Vec::new();
        for id in 1..=3 {
            tracing::info!(
                round,
                node = id,
                cases = cases.len(),
                "--- contract §9: every invalid request"
            );
            let mut client = fleet.client(id).await;
            failures.extend(check_invalid(&mut client, id, &cases).await);
        }
        assert!(
            failures.is_empty(),
            "{} answers broke contract §9 ({} cases on 3 nodes, hits also over HitStream and HitBatch):\n{}",
            failures.len(),
            cases.len(),
            failures.join("\n")
        );

        tracing::info!(
            round,
            "--- nothing reached the log: last_applied did not move"
        );
        let after = fleet.wait_for_applied_in_step(&[1, 2, 3]).await;
        let Some(during) = after.entries_since(before) else {
            tracing::warn!(?before, ?after, "an election during the batch; again");
            continue;
        };
        assert_eq!(during, 0, "entries applied during the invalid batch");

        tracing::info!(
            round,
            "--- one valid hit moves it by exactly one (the check can fail)"
        );
        let mut client = fleet.client(leader).await;
        let (answer, _) = send_hit(&mut client, hit(vec![], None)).await;
        assert_eq!(answer, Outcome::Allowed);
        let marked = fleet.wait_for_applied_in_step(&[1, 2, 3]).await;
        let Some(marker) = marked.entries_since(after) else {
            tracing::warn!(?after, ?marked, "an election after the batch; again");
            continue;
        };
        assert_eq!(
            marker, 1,
            "the marker hit is one entry, and nothing came late"
        );
        counted = true;
        break;
    }
    assert!(counted, "an election interrupted every round");

    let leader = fleet.wait_for_leader(&[1, 2, 3]).await;
    let mut client = fleet.client(leader).await;
    tracing::info!("--- the ghost tenant, key and entity are wholly free");
    for charge in [ghost_charge(), ghost_bytes()] {
        for i in 0..3 {
            let (answer, _) = send_hit(&mut client, hit(vec![charge.clone()], None)).await;
            assert_eq!(
                answer,
                Outcome::Allowed,
                "{charge:?}: hit {i} of the budget 3"
            );
        }
        let (answer, _) = send_hit(&mut client, hit(vec![charge.clone()], None)).await;
        assert!(matches!(answer, Outcome::RateLimited(_)), "{answer:?}");
    }
    let (answer, _) = send_hit(
        &mut client,
        hit(vec![], Some(claim(GHOST, GHOST_KEY, "hook-other"))),
    )
    .await;
    assert_eq!(answer, Outcome::Allowed, "no invalid request took the key");
    for i in 0..3 {
        let answer = send_check_rate(&mut client, ghost_check_rate()).await;
        assert!(
            answer.allowed,
            "entity request {i} of the limit 3: {answer:?}"
        );
    }
    let answer = send_check_rate(&mut client, ghost_check_rate()).await;
    assert!(!answer.allowed, "the limit is 3: {answer:?}");
}

#[test]
fn names_field_matches_whole_names_only() {
    assert!(names_field("charges: 17 charges, at most 16", "charges"));
    assert!(!names_field(
        "charges[0].kind: must be KIND_HOOKS",
        "charges"
    ));
    assert!(names_field(
        "charges[0].kind: must be KIND_HOOKS",
        "charges[0].kind"
    ));
    assert!(!names_field("claim.ttl_ms: must be between", "ttl_ms"));
    assert!(names_field("field `ttl_ms` must be between", "ttl_ms"));
    assert!(!names_field("SettleRequest.tenant: not UTF-8", "tenant"));
}
