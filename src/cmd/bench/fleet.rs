//! The bench's ways into the fleet: a unary `Hit` per hit, one `HitStream` per caller, or
//! the edge client (`ankusa-fleet-client`) shared by the callers of one node. Each caller
//! of the first two has a connection of its own, like a separate edge worker.

use anyhow::Context;
use tonic::transport::Channel;
use tonic::Status;

use super::{Answer, BenchPlan, HitId, HitNames};
use crate::pb;
use crate::pb::fleet_client::FleetClient;

use ankusa_fleet_client as edge;

/// How one caller sends its hits to its node. The unary client also carries the settles.
pub(super) enum FleetSender {
    Unary(FleetClient<Channel>),
    Stream {
        unary: FleetClient<Channel>,
        /// `None` after the stream broke: the next hit opens it again.
        stream: Option<Box<HitStream>>,
    },
    Client(edge::Client),
}

/// One `HitStream` with one hit in flight.
pub(super) struct HitStream {
    requests: tokio::sync::mpsc::Sender<pb::HitRequest>,
    replies: tonic::Streaming<pb::HitStreamReply>,
}

impl HitStream {
    async fn open(client: &mut FleetClient<Channel>) -> Result<Self, Status> {
        let (requests, outgoing) = tokio::sync::mpsc::channel(1);
        let replies = client
            .hit_stream(tokio_stream::wrappers::ReceiverStream::new(outgoing))
            .await?
            .into_inner();
        Ok(Self { requests, replies })
    }

    async fn hit(&mut self, request: pb::HitRequest) -> Result<pb::HitResponse, StreamError> {
        if self.requests.send(request).await.is_err() {
            return Err(StreamError::Broken(Status::unavailable(
                "the hit stream closed",
            )));
        }
        match self.replies.message().await {
            Ok(Some(reply)) => crate::api::stream_reply_result(reply).map_err(StreamError::Hit),
            Ok(None) => Err(StreamError::Broken(Status::unavailable(
                "the hit stream ended",
            ))),
            Err(status) => Err(StreamError::Broken(status)),
        }
    }
}

/// A hit on a stream failed: the hit alone, or the stream with it.
enum StreamError {
    Hit(Status),
    Broken(Status),
}

/// One sender per caller, caller `i` on node `i % nodes`.
pub(super) async fn senders(plan: &BenchPlan) -> anyhow::Result<Vec<FleetSender>> {
    let mut edge_clients = Vec::new();
    if plan.client {
        for (node, addr) in plan.api_addrs.iter().enumerate() {
            edge_clients.push(edge_client(plan, addr, node as u64).await?);
        }
    }
    let mut senders = Vec::with_capacity(plan.callers);
    for i in 0..plan.callers {
        if plan.client {
            senders.push(FleetSender::Client(
                edge_clients[i % edge_clients.len()].clone(),
            ));
            continue;
        }
        let addr = plan.addr_of(i);
        let mut unary = FleetClient::connect(format!("http://{addr}"))
            .await
            .with_context(|| format!("connecting to {addr}"))?
            .max_decoding_message_size(crate::limits::API_RESPONSE_BYTES_MAX);
        if !plan.stream {
            // One call now, before the next caller connects: a node closes a source's
            // connections past `API_UNPROVEN_PER_SOURCE_MAX` that have made no call yet,
            // and 64 idle connections would lose their first hits to it.
            unary
                .hit(hit_request(plan, HitId::warm_up(i as u64)))
                .await
                .with_context(|| format!("a first hit on a connection to {addr}"))?;
            senders.push(FleetSender::Unary(unary));
            continue;
        }
        let stream = HitStream::open(&mut unary)
            .await
            .with_context(|| format!("opening a hit stream to {addr}"))?;
        senders.push(FleetSender::Stream {
            unary,
            stream: Some(Box::new(stream)),
        });
    }
    Ok(senders)
}

/// The edge client of the node at `addr`, its hit stream opened by one hit before the
/// clock starts (the client connects on its first call).
async fn edge_client(plan: &BenchPlan, addr: &str, node: u64) -> anyhow::Result<edge::Client> {
    let client =
        edge::Client::connect(edge::Target::Tcp(addr.to_owned()), edge::Options::default())
            .with_context(|| format!("an edge client of {addr}"))?;
    client
        .hit(edge_request(plan, HitId::warm_up(node)))
        .await
        .with_context(|| format!("a first hit through the edge client of {addr}"))?;
    Ok(client)
}

impl FleetSender {
    pub(super) async fn hit(&mut self, plan: &BenchPlan, id: HitId) -> anyhow::Result<Answer> {
        let request = hit_request(plan, id);
        // A copy only for the settle: the bench's own CPU is shared with the servers.
        let kept = plan.settle.then(|| request.clone());
        let (unary, response) = match self {
            Self::Unary(unary) => {
                let response = unary.hit(request).await?.into_inner();
                (unary, response)
            }
            Self::Stream { unary, stream } => {
                let response = stream_hit(unary, stream, request).await?;
                (unary, response)
            }
            Self::Client(client) => return client_hit(client, plan, id).await,
        };
        let allowed = matches!(
            response.outcome,
            Some(pb::hit_response::Outcome::Allowed(_))
        );
        let settled = match &kept {
            Some(request) if allowed => settle(unary, request, plan).await,
            _ => false,
        };
        Ok(Answer {
            allowed,
            decided_local: response.decided_by == pb::DecidedBy::Local as i32 && !plan.node_scope,
            settled,
        })
    }
}

/// A hit on the caller's stream; a broken stream is dropped and opened anew by the next hit.
async fn stream_hit(
    unary: &mut FleetClient<Channel>,
    stream: &mut Option<Box<HitStream>>,
    request: pb::HitRequest,
) -> anyhow::Result<pb::HitResponse> {
    let open = match stream {
        Some(open) => open,
        None => stream.insert(Box::new(HitStream::open(unary).await?)),
    };
    match open.hit(request).await {
        Ok(response) => Ok(response),
        Err(StreamError::Hit(status)) => Err(status.into()),
        Err(StreamError::Broken(status)) => {
            *stream = None;
            Err(status.into())
        }
    }
}

async fn client_hit(client: &edge::Client, plan: &BenchPlan, id: HitId) -> anyhow::Result<Answer> {
    let request = edge_request(plan, id);
    let claim = request.claim.clone();
    let decision = client.hit(request).await?;
    let allowed = decision.outcome == edge::Outcome::Ok;
    let settled = match claim {
        Some(claim) if allowed && plan.settle => client_settle(client, claim, plan).await,
        _ => false,
    };
    Ok(Answer {
        allowed,
        decided_local: matches!(decision.decided_by, edge::DecidedBy::Local { .. })
            && !plan.node_scope,
        settled,
    })
}

fn scope(plan: &BenchPlan) -> pb::Scope {
    if plan.node_scope {
        pb::Scope::Node
    } else {
        pb::Scope::Fleet
    }
}

/// The hit: one KIND_HOOKS charge and one claim on a fresh key.
fn hit_request(plan: &BenchPlan, id: HitId) -> pb::HitRequest {
    let names = HitNames::new(plan, id);
    let scope = scope(plan) as i32;
    pb::HitRequest {
        charges: vec![pb::Charge {
            kind: pb::Kind::Hooks as i32,
            tenant: names.tenant.clone(),
            increment_us: plan.increment_us,
            capacity_us: plan.capacity_us,
        }],
        claim: Some(pb::Claim {
            tenant: names.tenant,
            source_id: "bench".to_owned(),
            key: names.claim_key,
            hook_id: names.hook_id,
            ttl_ms: 600_000,
            pending_ttl_ms: plan.pending_ttl_ms,
        }),
        timeout_ms: plan.timeout_ms,
        rate_limit_scope: scope,
        dedupe_scope: scope,
    }
}

/// [`hit_request`] in the edge client's types (generated from the same proto, but its own).
fn edge_request(plan: &BenchPlan, id: HitId) -> edge::pb::HitRequest {
    let names = HitNames::new(plan, id);
    let scope = scope(plan) as i32;
    edge::pb::HitRequest {
        charges: vec![edge::pb::Charge {
            kind: edge::pb::Kind::Hooks as i32,
            tenant: names.tenant.clone(),
            increment_us: plan.increment_us,
            capacity_us: plan.capacity_us,
        }],
        claim: Some(edge::pb::Claim {
            tenant: names.tenant,
            source_id: "bench".to_owned(),
            key: names.claim_key,
            hook_id: names.hook_id,
            ttl_ms: 600_000,
            pending_ttl_ms: plan.pending_ttl_ms,
        }),
        timeout_ms: plan.timeout_ms,
        rate_limit_scope: scope,
        dedupe_scope: scope,
    }
}

async fn settle(
    client: &mut FleetClient<Channel>,
    request: &pb::HitRequest,
    plan: &BenchPlan,
) -> bool {
    let Some(claim) = request.claim.as_ref() else {
        return false;
    };
    let settle = pb::SettleRequest {
        tenant: claim.tenant.clone(),
        source_id: claim.source_id.clone(),
        key: claim.key.clone(),
        hook_id: claim.hook_id.clone(),
        outcome: pb::SettleOutcome::Commit as i32,
        timeout_ms: plan.timeout_ms,
        dedupe_scope: request.dedupe_scope,
        ttl_ms: 0,
    };
    client.settle(settle).await.is_ok()
}

async fn client_settle(client: &edge::Client, claim: edge::pb::Claim, plan: &BenchPlan) -> bool {
    let settle = edge::pb::SettleRequest {
        tenant: claim.tenant,
        source_id: claim.source_id,
        key: claim.key,
        hook_id: claim.hook_id,
        outcome: edge::pb::SettleOutcome::Commit as i32,
        timeout_ms: plan.timeout_ms,
        dedupe_scope: scope(plan) as i32,
        ttl_ms: 0,
    };
    client.settle(settle).await.is_ok()
}
