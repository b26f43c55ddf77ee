//! SPEC section 9 from outside: every input rule of Hit, Settle, Reset and CheckRate is
//! INVALID_ARGUMENT with the field's name in the message, through every node, and writes
//! nothing; the boundary values themselves are valid.
//!
//! "Writes nothing" is checked two ways: no node's `last_applied` moves during the invalid
//! batch (and one valid hit afterwards moves the leader's by exactly one, so the check can
//! fail), and the tenant, key and entity used only by invalid requests are afterwards
//! wholly free.

mod common;

use ankusa_fleet::pb;
use ankusa_fleet::pb::fleet_client::FleetClient;
use common::*;
use tonic::transport::Channel;

type Client = FleetClient<Channel>;

const SECOND_US: u64 = 1_000_000;
const YEAR_US: u64 = 365 * 86_400 * SECOND_US;
const YEAR_MS: u64 = 365 * 86_400 * 1_000;
const THIRTY_DAYS_MS: u64 = 30 * 86_400 * 1_000;

/// Used only inside invalid requests: afterwards it must be as if never seen.
const GHOST: &str = "ghost";
const GHOST_KEY: &str = "ghost-evt";
const GHOST_HOOK: &str = "hook-ghost";
const GHOST_ENTITY: &str = "ghost-entity";
/// Three hits of budget, no refill within a test run.
const GHOST_INCREMENT_US: u64 = 60 * SECOND_US;
const GHOST_CAPACITY_US: u64 = 3 * GHOST_INCREMENT_US;

fn ghost_charge() -> pb::Charge {
    hooks(GHOST, GHOST_INCREMENT_US, GHOST_CAPACITY_US)
}

fn ghost_bytes() -> pb::Charge {
    bytes(GHOST, GHOST_INCREMENT_US, GHOST_CAPACITY_US)
}

/// A valid hit that would spend ghost budget and take the ghost claim.
fn ghost_hit() -> pb::HitRequest {
    hit(
        vec![ghost_charge()],
        Some(claim(GHOST, GHOST_KEY, GHOST_HOOK)),
    )
}

/// A valid settle that would re-create the ghost claim as committed.
fn ghost_settle() -> pb::SettleRequest {
    settle(GHOST, GHOST_KEY, GHOST_HOOK, pb::SettleOutcome::Commit)
}

fn ghost_check_rate() -> pb::CheckRateRequest {
    check_rate(GHOST_ENTITY, "send", 3, 60_000)
}

fn long(bytes: usize) -> String {
    "x".repeat(bytes)
}

/// `chars` two-byte characters: 128 of them is 256 bytes.
fn wide(chars: usize) -> String {
    "é".repeat(chars)
}

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

/// Sends every case through `client`; returns one line per case that broke SPEC 9.
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

/// Sends every case as a unary call, and every hit also over one `HitStream` (an error
/// reply must not end the stream: the next case goes on the same one).
async fn check_invalid(client: &mut Client, node: u64, cases: &[Invalid]) -> Vec<String> {
    let mut failures = Vec::new();
    let mut stream = HitStream::open(client).await;
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
                "--- SPEC 9: every invalid request"
            );
            let mut client = fleet.client(id).await;
            failures.extend(check_invalid(&mut client, id, &cases).await);
        }
        assert!(
            failures.is_empty(),
            "{} answers broke SPEC 9 ({} cases on 3 nodes, hits also over HitStream):\n{}",
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn boundary_values_are_valid() {
    init_tracing();
    let fleet = Fleet::start(3, "").await;
    let leader = fleet.wait_for_leader(&[1, 2, 3]).await;
    let follower = (1..=3).find(|id| *id != leader).expect("a follower");

    for (role, id) in [("leader", leader), ("follower", follower)] {
        let mut client = fleet.client(id).await;
        let tag = format!("edge-{role}");
        hit_boundaries(&mut client, &tag, role).await;
        claim_boundaries(&mut client, &tag, role).await;
        settle_reset_and_check_rate_boundaries(&mut client, &tag, role).await;
    }
}

/// A tenant of exactly `bytes` bytes, distinct per `tag`.
fn sized(tag: &str, bytes: usize) -> String {
    let mut text = format!("{tag}-");
    text.push_str(&long(bytes - text.len()));
    text
}

async fn hit_boundaries(client: &mut Client, tag: &str, role: &str) {
    tracing::info!(
        role,
        "--- a 256-byte tenant, capacity == increment: a budget of one"
    );
    let charge = hooks(&sized(tag, 256), GHOST_INCREMENT_US, GHOST_INCREMENT_US);
    let (answer, _) = send_hit(client, hit(vec![charge.clone()], None)).await;
    assert_eq!(answer, Outcome::Allowed);
    let (answer, _) = send_hit(client, hit(vec![charge], None)).await;
    assert!(matches!(answer, Outcome::RateLimited(_)), "{answer:?}");

    tracing::info!(role, "--- 256 bytes in 128 two-byte characters is valid");
    let mut tenant = format!("{tag}-");
    tenant.push_str(&wide((256 - tenant.len()) / 2));
    tenant.push_str(&long(256 - tenant.len()));
    assert_eq!(tenant.len(), 256);
    let (answer, _) = send_hit(client, hit(vec![hooks(&tenant, 1, 1)], None)).await;
    assert_eq!(answer, Outcome::Allowed);

    tracing::info!(role, "--- 16 charges, and one tenant under both kinds");
    let mut charges: Vec<pb::Charge> = (0..15)
        .map(|i| hooks(&format!("{tag}-many-{i}"), 1, 1))
        .collect();
    charges.push(bytes(&format!("{tag}-many-0"), 1, 1));
    assert_eq!(charges.len(), 16);
    let (answer, _) = send_hit(client, hit(charges, None)).await;
    assert_eq!(answer, Outcome::Allowed);

    tracing::info!(role, "--- increment and capacity of exactly one year");
    let year = hooks(&format!("{tag}-year"), YEAR_US, YEAR_US);
    let (answer, _) = send_hit(client, hit(vec![year], None)).await;
    assert_eq!(answer, Outcome::Allowed);

    tracing::info!(role, "--- timeout_ms 60000 and 0 (node default)");
    for timeout_ms in [60_000, 0] {
        let mut request = hit(vec![hooks(&format!("{tag}-t{timeout_ms}"), 1, 1)], None);
        request.timeout_ms = timeout_ms;
        let (answer, _) = send_hit(client, request).await;
        assert_eq!(answer, Outcome::Allowed, "timeout_ms {timeout_ms}");
    }
}

async fn claim_boundaries(client: &mut Client, tag: &str, role: &str) {
    tracing::info!(
        role,
        "--- a claim of 256-byte ids, a 1024-byte key, 30-day ttls"
    );
    let mut edge = pb::Claim {
        tenant: sized(tag, 256),
        source_id: sized(tag, 256),
        key: sized(tag, 1024),
        hook_id: sized(tag, 256),
        ttl_ms: THIRTY_DAYS_MS,
        pending_ttl_ms: THIRTY_DAYS_MS,
    };
    let (answer, _) = send_hit(client, hit(vec![], Some(edge.clone()))).await;
    assert_eq!(answer, Outcome::Allowed);
    let commit = pb::SettleRequest {
        tenant: edge.tenant.clone(),
        source_id: edge.source_id.clone(),
        key: edge.key.clone(),
        hook_id: edge.hook_id.clone(),
        outcome: pb::SettleOutcome::Commit as i32,
        timeout_ms: 60_000,
        dedupe_scope: pb::Scope::Fleet as i32,
        ttl_ms: THIRTY_DAYS_MS,
    };
    let settled = send_settle(client, commit).await;
    assert_eq!(settled.status, pb::SettleStatus::Settled as i32);
    let holder = std::mem::replace(&mut edge.hook_id, "hook-other".to_owned());
    let (answer, _) = send_hit(client, hit(vec![], Some(edge))).await;
    assert_eq!(answer, Outcome::Duplicate(holder));

    tracing::info!(role, "--- ttl_ms and pending_ttl_ms of 1 ms");
    let mut short = claim(&format!("{tag}-short"), "evt", "hook-a");
    short.ttl_ms = 1;
    short.pending_ttl_ms = 1;
    let (answer, _) = send_hit(client, hit(vec![], Some(short))).await;
    assert_eq!(answer, Outcome::Allowed);
}

async fn settle_reset_and_check_rate_boundaries(client: &mut Client, tag: &str, role: &str) {
    tracing::info!(role, "--- settle ttl_ms 0 (node default) and 30 days");
    for ttl_ms in [0, THIRTY_DAYS_MS] {
        let key = format!("recreate-{ttl_ms}");
        let mut request = settle(tag, &key, "hook-a", pb::SettleOutcome::Commit);
        request.ttl_ms = ttl_ms;
        let settled = send_settle(client, request).await;
        assert_eq!(settled.status, pb::SettleStatus::Recreated as i32);
        let (answer, _) = send_hit(client, hit(vec![], Some(claim(tag, &key, "hook-b")))).await;
        assert_eq!(
            answer,
            Outcome::Duplicate("hook-a".to_owned()),
            "ttl {ttl_ms}"
        );
    }

    tracing::info!(role, "--- reset of a 256-byte tenant, timeout 60000");
    let mut request = reset(&sized(tag, 256));
    request.timeout_ms = 60_000;
    client.reset(request).await.expect("a valid reset");

    tracing::info!(role, "--- check_rate at its limits");
    let edges = [
        (sized(tag, 256), sized(tag, 256), 1, 60_000),
        (format!("{tag}-per-us"), "send".to_owned(), 1_000, 1),
        (format!("{tag}-year"), "send".to_owned(), 1, YEAR_MS),
    ];
    for (entity_id, operation, limit, window_ms) in edges {
        let mut request = check_rate(&entity_id, &operation, limit, window_ms);
        request.timeout_ms = 60_000;
        let answer = send_check_rate(client, request).await;
        assert!(
            answer.allowed,
            "limit {limit} per {window_ms} ms: {answer:?}"
        );
    }
}

// ---------------------------------------------------------------------------------------
// Ids that are not UTF-8. The typed client cannot send them (a Rust `String` is UTF-8), so
// these requests are encoded from mirror messages whose id fields are `bytes`: on the wire
// a `bytes` field and a `string` field with the same tag are the same.
// ---------------------------------------------------------------------------------------

#[derive(Clone, PartialEq, prost::Message)]
struct RawCharge {
    #[prost(int32, tag = "1")]
    kind: i32,
    #[prost(bytes = "vec", tag = "2")]
    tenant: Vec<u8>,
    #[prost(uint64, tag = "3")]
    increment_us: u64,
    #[prost(uint64, tag = "4")]
    capacity_us: u64,
}

#[derive(Clone, PartialEq, prost::Message)]
struct RawClaim {
    #[prost(bytes = "vec", tag = "1")]
    tenant: Vec<u8>,
    #[prost(bytes = "vec", tag = "2")]
    source_id: Vec<u8>,
    #[prost(bytes = "vec", tag = "3")]
    key: Vec<u8>,
    #[prost(bytes = "vec", tag = "4")]
    hook_id: Vec<u8>,
    #[prost(uint64, tag = "5")]
    ttl_ms: u64,
    #[prost(uint64, tag = "6")]
    pending_ttl_ms: u64,
}

#[derive(Clone, PartialEq, prost::Message)]
struct RawHitRequest {
    #[prost(message, repeated, tag = "1")]
    charges: Vec<RawCharge>,
    #[prost(message, optional, tag = "2")]
    claim: Option<RawClaim>,
    #[prost(uint32, tag = "3")]
    timeout_ms: u32,
}

#[derive(Clone, PartialEq, prost::Message)]
struct RawSettleRequest {
    #[prost(bytes = "vec", tag = "1")]
    tenant: Vec<u8>,
    #[prost(bytes = "vec", tag = "2")]
    source_id: Vec<u8>,
    #[prost(bytes = "vec", tag = "3")]
    key: Vec<u8>,
    #[prost(bytes = "vec", tag = "4")]
    hook_id: Vec<u8>,
    #[prost(int32, tag = "5")]
    outcome: i32,
    #[prost(uint32, tag = "6")]
    timeout_ms: u32,
}

#[derive(Clone, PartialEq, prost::Message)]
struct RawResetRequest {
    #[prost(bytes = "vec", tag = "1")]
    tenant: Vec<u8>,
    #[prost(uint32, tag = "2")]
    timeout_ms: u32,
}

#[derive(Clone, PartialEq, prost::Message)]
struct RawCheckRateRequest {
    #[prost(bytes = "vec", tag = "1")]
    entity_id: Vec<u8>,
    #[prost(bytes = "vec", tag = "2")]
    operation: Vec<u8>,
    #[prost(uint64, tag = "3")]
    limit: u64,
    #[prost(uint64, tag = "4")]
    window_ms: u64,
    #[prost(uint32, tag = "5")]
    timeout_ms: u32,
}

/// A lone continuation byte: never valid UTF-8.
const NOT_UTF8: &[u8] = b"ghost-\x80";

/// One unary call of the public service with a hand-made request message.
async fn raw_call<Req, Resp>(
    api_addr: &str,
    path: &'static str,
    request: Req,
) -> Result<Resp, tonic::Status>
where
    Req: prost::Message + Send + Sync + 'static,
    Resp: prost::Message + Default + Send + Sync + 'static,
{
    let channel = Channel::from_shared(format!("http://{api_addr}"))
        .expect("an address")
        .connect()
        .await
        .expect("connect");
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.expect("ready");
    let codec = tonic_prost::ProstCodec::<Req, Resp>::default();
    let path = tonic::codegen::http::uri::PathAndQuery::from_static(path);
    grpc.unary(tonic::Request::new(request), path, codec)
        .await
        .map(tonic::Response::into_inner)
}

fn raw_ghost_charge(tenant: &[u8]) -> RawCharge {
    RawCharge {
        kind: pb::Kind::Hooks as i32,
        tenant: tenant.to_vec(),
        increment_us: GHOST_INCREMENT_US,
        capacity_us: GHOST_CAPACITY_US,
    }
}

fn raw_ghost_claim() -> RawClaim {
    RawClaim {
        tenant: GHOST.into(),
        source_id: b"stripe".to_vec(),
        key: GHOST_KEY.into(),
        hook_id: GHOST_HOOK.into(),
        ttl_ms: 3_600_000,
        pending_ttl_ms: 60_000,
    }
}

fn raw_ghost_hit() -> RawHitRequest {
    RawHitRequest {
        charges: vec![raw_ghost_charge(GHOST.as_bytes())],
        claim: Some(raw_ghost_claim()),
        timeout_ms: CALL_TIMEOUT_MS,
    }
}

fn raw_ghost_settle() -> RawSettleRequest {
    RawSettleRequest {
        tenant: GHOST.into(),
        source_id: b"stripe".to_vec(),
        key: GHOST_KEY.into(),
        hook_id: GHOST_HOOK.into(),
        outcome: pb::SettleOutcome::Commit as i32,
        timeout_ms: CALL_TIMEOUT_MS,
    }
}

/// Sends one hand-made request; `None` when it broke SPEC 9, with a line saying how.
async fn raw_case<Req, Resp>(
    api_addr: &str,
    path: &'static str,
    what: &str,
    request: Req,
    field: &str,
) -> Option<String>
where
    Req: prost::Message + Send + Sync + 'static,
    Resp: prost::Message + Default + Send + Sync + 'static,
{
    match raw_call::<Req, Resp>(api_addr, path, request).await {
        Ok(_) => Some(format!("{what}: accepted")),
        Err(status)
            if status.code() == tonic::Code::InvalidArgument
                && names_field(status.message(), field) =>
        {
            None
        }
        Err(status) => Some(format!(
            "{what}: {:?} {:?}, want INVALID_ARGUMENT naming {field}",
            status.code(),
            status.message()
        )),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ids_that_are_not_utf8_are_invalid_and_write_nothing() {
    init_tracing();
    let fleet = Fleet::start(3, "").await;
    let leader = fleet.wait_for_leader(&[1, 2, 3]).await;
    let api_addr = fleet.api_addr(leader);
    let addr = api_addr.as_str();
    const HIT: &str = "/ankusa.fleet.v1.Fleet/Hit";
    const SETTLE: &str = "/ankusa.fleet.v1.Fleet/Settle";
    const RESET: &str = "/ankusa.fleet.v1.Fleet/Reset";
    const CHECK_RATE: &str = "/ankusa.fleet.v1.Fleet/CheckRate";
    type HitR = pb::HitResponse;
    type SettleR = pb::SettleResponse;

    tracing::info!("--- SPEC 9: every id field holding bytes that are not UTF-8");
    let mut failures = Vec::new();
    let mut hit_cases: Vec<(&str, RawHitRequest, &str)> = Vec::new();
    let mut request = raw_ghost_hit();
    request.charges.push(raw_ghost_charge(NOT_UTF8));
    hit_cases.push(("charge tenant", request, "charges[1].tenant"));
    type ClaimField = fn(&mut RawClaim) -> &mut Vec<u8>;
    let claim_fields: [(&str, ClaimField); 4] = [
        ("claim.tenant", |c| &mut c.tenant),
        ("claim.source_id", |c| &mut c.source_id),
        ("claim.key", |c| &mut c.key),
        ("claim.hook_id", |c| &mut c.hook_id),
    ];
    for (field, slot) in claim_fields {
        let mut request = raw_ghost_hit();
        *slot(request.claim.as_mut().expect("a claim")) = NOT_UTF8.to_vec();
        hit_cases.push((field, request, field));
    }
    for (what, request, field) in hit_cases {
        failures.extend(raw_case::<_, HitR>(addr, HIT, what, request, field).await);
    }
    type SettleField = fn(&mut RawSettleRequest) -> &mut Vec<u8>;
    let settle_fields: [(&str, SettleField); 4] = [
        ("tenant", |r| &mut r.tenant),
        ("source_id", |r| &mut r.source_id),
        ("key", |r| &mut r.key),
        ("hook_id", |r| &mut r.hook_id),
    ];
    for (field, slot) in settle_fields {
        let mut request = raw_ghost_settle();
        *slot(&mut request) = NOT_UTF8.to_vec();
        let what = format!("settle {field}");
        failures.extend(raw_case::<_, SettleR>(addr, SETTLE, &what, request, field).await);
    }
    let request = RawResetRequest {
        tenant: NOT_UTF8.to_vec(),
        timeout_ms: CALL_TIMEOUT_MS,
    };
    failures.extend(
        raw_case::<_, pb::ResetResponse>(addr, RESET, "reset tenant", request, "tenant").await,
    );
    type CheckRateField = fn(&mut RawCheckRateRequest) -> &mut Vec<u8>;
    let check_rate_fields: [(&str, CheckRateField); 2] = [
        ("entity_id", |r| &mut r.entity_id),
        ("operation", |r| &mut r.operation),
    ];
    for (field, slot) in check_rate_fields {
        let mut request = RawCheckRateRequest {
            entity_id: GHOST_ENTITY.into(),
            operation: b"send".to_vec(),
            limit: 3,
            window_ms: 60_000,
            timeout_ms: CALL_TIMEOUT_MS,
        };
        *slot(&mut request) = NOT_UTF8.to_vec();
        let what = format!("check_rate {field}");
        failures.extend(
            raw_case::<_, pb::CheckRateResponse>(addr, CHECK_RATE, &what, request, field).await,
        );
    }
    assert!(
        failures.is_empty(),
        "{} non-UTF-8 requests broke SPEC 9:\n{}",
        failures.len(),
        failures.join("\n")
    );

    tracing::info!("--- the ghost tenant and key are still free");
    let mut client = fleet.client(leader).await;
    for i in 0..3 {
        let (answer, _) = send_hit(&mut client, hit(vec![ghost_charge()], None)).await;
        assert_eq!(answer, Outcome::Allowed, "hit {i} of the budget 3");
    }
    let (answer, _) = send_hit(
        &mut client,
        hit(vec![], Some(claim(GHOST, GHOST_KEY, "hook-other"))),
    )
    .await;
    assert_eq!(answer, Outcome::Allowed);
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
