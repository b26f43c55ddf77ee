//! Ids that are not UTF-8. The typed client cannot send them (a Rust `String` is UTF-8), so
//! these requests are encoded from mirror messages whose id fields are `bytes`: on the wire
//! a `bytes` field and a `string` field with the same tag are the same.

use ankusa_fleet::pb;
use tonic::transport::Channel;

use crate::common::*;
use crate::{
    ghost_charge, GHOST, GHOST_CAPACITY_US, GHOST_ENTITY, GHOST_HOOK, GHOST_INCREMENT_US, GHOST_KEY,
};

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

/// Sends one hand-made request; `None` when it broke contract §9, with a line saying how.
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

    tracing::info!("--- contract §9: every id field holding bytes that are not UTF-8");
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
        "{} non-UTF-8 requests broke contract §9:\n{}",
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
