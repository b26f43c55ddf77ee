//! The public gRPC service `ankusa.fleet.v1.Fleet` (on `api_addr`) and the `Admin` service
//! (on `raft_addr`, [`admin`]): convert and validate the request ([`validate`]), call the
//! [`Node`], convert the answer back.
//!
//! Every error that leaves one of the node's services becomes a gRPC status in one table,
//! [`status`]: the node's errors (`NodeError`), invalid fields, a drain's refusal, and the
//! typed refusals of `Admin`, Envoy and `raft::service`'s `Peer`.

use std::pin::Pin;
use std::sync::Arc;
use std::time::Instant;

use futures::{Stream, StreamExt};
use tonic::{Request, Response, Status, Streaming};

pub mod admin;
pub mod batch;
pub mod drain;
pub mod envoy;
pub mod status;
pub mod validate;
pub mod wire;

use crate::node::{Decided, DecidedBy, Node};
use crate::pb;
use crate::state::{HitAnswer, SettleAnswer};
use drain::DrainGate;
use status::status_of;
use validate::RequestDefaults;

fn decided_by(decided_by: &DecidedBy) -> (i32, String) {
    match decided_by {
        DecidedBy::Fleet => (pb::DecidedBy::Fleet as i32, String::new()),
        DecidedBy::Local { reason } => (pb::DecidedBy::Local as i32, reason.clone()),
    }
}

fn hit_response(decided: Decided<HitAnswer>) -> pb::HitResponse {
    use pb::hit_response::Outcome;
    let outcome = match decided.answer {
        HitAnswer::Allowed => Outcome::Allowed(pb::Allowed {}),
        HitAnswer::Duplicate { hook_id } => Outcome::Duplicate(pb::Duplicate {
            hook_id: hook_id.0.into(),
        }),
        HitAnswer::Pending { retry_after_ms } => Outcome::Pending(pb::Pending { retry_after_ms }),
        HitAnswer::RateLimited { retry_after_ms } => {
            Outcome::RateLimited(pb::RateLimited { retry_after_ms })
        }
    };
    let (decided_by, local_reason) = decided_by(&decided.decided_by);
    pb::HitResponse {
        outcome: Some(outcome),
        decided_by,
        local_reason,
    }
}

fn settle_response(decided: Decided<SettleAnswer>) -> pb::SettleResponse {
    let (status, holder_hook_id) = match decided.answer {
        SettleAnswer::Settled => (pb::SettleStatus::Settled, String::new()),
        SettleAnswer::Recreated => (pb::SettleStatus::Recreated, String::new()),
        SettleAnswer::Conflict { holder } => (pb::SettleStatus::Conflict, holder.0.into()),
        SettleAnswer::Queued => (pb::SettleStatus::Queued, String::new()),
    };
    pb::SettleResponse {
        status: status as i32,
        holder_hook_id,
        decided_by: decided_by(&decided.decided_by).0,
    }
}

/// Who decided an answer, as the metrics label it (`none`: the call failed).
fn decider_label(decided_by: Option<&DecidedBy>) -> &'static str {
    match decided_by {
        Some(DecidedBy::Fleet) => "fleet",
        Some(DecidedBy::Local { .. }) => "local",
        None => "none",
    }
}

fn hit_outcome_label(answer: &HitAnswer) -> &'static str {
    match answer {
        HitAnswer::Allowed => "allowed",
        HitAnswer::Duplicate { .. } => "duplicate",
        HitAnswer::Pending { .. } => "pending",
        HitAnswer::RateLimited { .. } => "rate_limited",
    }
}

fn settle_outcome_label(answer: &SettleAnswer) -> &'static str {
    match answer {
        SettleAnswer::Settled => "settled",
        SettleAnswer::Recreated => "recreated",
        SettleAnswer::Conflict { .. } => "conflict",
        SettleAnswer::Queued => "queued",
    }
}

/// A failed call's outcome label: its gRPC code (`invalid_argument`, `unavailable`, ...).
pub(crate) fn error_label(status: &Status) -> &'static str {
    match status.code() {
        tonic::Code::InvalidArgument => "invalid_argument",
        tonic::Code::Unavailable => "unavailable",
        tonic::Code::ResourceExhausted => "resource_exhausted",
        tonic::Code::DeadlineExceeded => "deadline_exceeded",
        tonic::Code::OutOfRange => "out_of_range",
        _ => "error",
    }
}

/// Records how long a call took, in `ankusa_call_seconds{call}`.
pub(crate) fn record_latency(call: &'static str, started: Instant) {
    metrics::histogram!("ankusa_call_seconds", "call" => call)
        .record(started.elapsed().as_secs_f64());
}

/// A call's `outcome` and `decided_by` labels: its answer's, or its error's.
fn labels<T>(
    outcome: &Result<Decided<T>, Status>,
    answer_label: fn(&T) -> &'static str,
) -> (&'static str, &'static str) {
    match outcome {
        Ok(decided) => (
            answer_label(&decided.answer),
            decider_label(Some(&decided.decided_by)),
        ),
        Err(status) => (error_label(status), decider_label(None)),
    }
}

/// Counts one hit in `ankusa_hits_total{outcome, decided_by}`.
fn count_hit(outcome: &Result<Decided<HitAnswer>, Status>) {
    let (outcome, decided_by) = labels(outcome, hit_outcome_label);
    metrics::counter!("ankusa_hits_total", "outcome" => outcome, "decided_by" => decided_by)
        .increment(1);
}

/// Emits contract §11's telemetry event and counts it.
fn check_rate_telemetry(
    request: &pb::CheckRateRequest,
    outcome: &Result<Decided<HitAnswer>, Status>,
    elapsed_us: u64,
) {
    let (event, decision) = match outcome {
        Ok(Decided {
            answer: HitAnswer::Allowed,
            ..
        }) => ("request_allowed", "allowed"),
        Ok(_) => ("request_denied", "denied"),
        Err(_) => ("rate_limiter_exception", "error"),
    };
    // Per call, so at debug, under a target of its own (RUST_LOG=info,check_rate=debug
    // turns on just these); the caller's strings in Debug form (quoted, a newline escaped),
    // so no entity id can forge a log line.
    tracing::debug!(
        target: "check_rate",
        event,
        entity_id = ?request.entity_id,
        operation = ?request.operation,
        decision,
        limit = request.limit,
        window_ms = request.window_ms,
        elapsed_us,
        "check_rate"
    );
    let decided_by = decider_label(outcome.as_ref().ok().map(|decided| &decided.decided_by));
    metrics::counter!("ankusa_check_rate_total", "event" => event, "outcome" => decision, "decided_by" => decided_by)
        .increment(1);
}

/// Requests one `HitStream` works on at once; replies still leave in request order. A closed
/// loop edge worker has one in flight; a pipelining one gets this much overlap.
pub const HIT_STREAM_IN_FLIGHT: usize = 64;

/// The stream of `HitStream` replies.
pub type HitReplies = Pin<Box<dyn Stream<Item = Result<pb::HitStreamReply, Status>> + Send>>;

/// Validates and answers one hit: the body of both `Hit` and `HitStream`.
async fn answer_hit(
    node: &Node,
    defaults: RequestDefaults,
    request: pb::HitRequest,
) -> Result<pb::HitResponse, Status> {
    let started = Instant::now();
    let decided = match validate::hit(request, defaults) {
        Ok(input) => node.hit(input).await.map_err(status_of),
        Err(e) => Err(Status::from(e)),
    };
    count_hit(&decided);
    record_latency("hit", started);
    let decided = decided?;
    tracing::debug!(answer = ?decided.answer, decided_by = ?decided.decided_by, "hit");
    Ok(hit_response(decided))
}

/// A unary call's error status as a stream message carries it.
fn call_error(status: &Status) -> pb::CallError {
    pb::CallError {
        code: status.code() as u32,
        message: status.message().to_owned(),
    }
}

/// One `HitStream` reply: the answer, or the status a unary `Hit` would have ended with.
fn stream_reply(answer: Result<pb::HitResponse, Status>) -> pb::HitStreamReply {
    use pb::hit_stream_reply::Result as Reply;
    let result = match answer {
        Ok(response) => Reply::Response(response),
        Err(status) => Reply::Error(call_error(&status)),
    };
    pb::HitStreamReply {
        result: Some(result),
    }
}

/// The other side of `stream_reply`, for callers of `HitStream`: the answer, or the error
/// reply as the status a unary `Hit` would have returned.
///
/// # Errors
/// The error reply, or INTERNAL for a reply without a result.
pub fn stream_reply_result(reply: pb::HitStreamReply) -> Result<pb::HitResponse, Status> {
    use pb::hit_stream_reply::Result as Reply;
    match reply.result {
        Some(Reply::Response(response)) => Ok(response),
        Some(Reply::Error(error)) => Err(call_status(error)),
        None => Err(Status::internal("a HitStream reply without a result")),
    }
}

/// The other side of `call_error`: the status a unary call would have returned.
fn call_status(error: pb::CallError) -> Status {
    Status::new(
        tonic::Code::from_i32(i32::try_from(error.code).unwrap_or(tonic::Code::Unknown as i32)),
        error.message,
    )
}

/// The edge-facing service.
pub struct FleetService {
    node: Arc<Node>,
    defaults: RequestDefaults,
    gate: DrainGate,
}

impl FleetService {
    /// Serves `node` with these request defaults; `gate` refuses calls once a drain began.
    pub fn new(node: Arc<Node>, defaults: RequestDefaults, gate: DrainGate) -> Self {
        Self {
            node,
            defaults,
            gate,
        }
    }
}

#[tonic::async_trait]
impl pb::fleet_server::Fleet for FleetService {
    async fn hit(
        &self,
        request: Request<pb::HitRequest>,
    ) -> Result<Response<pb::HitResponse>, Status> {
        let _call = self.gate.enter()?;
        answer_hit(&self.node, self.defaults, request.into_inner())
            .await
            .map(Response::new)
    }

    type HitStreamStream = HitReplies;

    /// Each request is answered like a unary `Hit` (`answer_hit`), up to [`HIT_STREAM_IN_FLIGHT`] at once,
    /// inside the response stream's own polling (no task per request). A message that does
    /// not decode ends the stream with INVALID_ARGUMENT naming the field (the bytes after it
    /// cannot be trusted); any other error is a reply and the stream goes on. Once the node
    /// drains, each further request is answered `UNAVAILABLE`.
    async fn hit_stream(
        &self,
        request: Request<Streaming<pb::HitRequest>>,
    ) -> Result<Response<HitReplies>, Status> {
        drop(self.gate.enter()?);
        let node = self.node.clone();
        let defaults = self.defaults;
        let gate = self.gate.clone();
        let replies = request
            .into_inner()
            .map(move |message| {
                let node = node.clone();
                let gate = gate.clone();
                async move {
                    let request = message?;
                    let answer = match gate.enter() {
                        Ok(_call) => answer_hit(&node, defaults, request).await,
                        Err(refused) => Err(Status::from(refused)),
                    };
                    Ok(stream_reply(answer))
                }
            })
            .buffered(HIT_STREAM_IN_FLIGHT);
        Ok(Response::new(Box::pin(replies)))
    }

    type HitBatchStream = batch::BatchReplies;

    /// Many hits per message, answered by id as each group of them is decided
    /// ([`batch::serve`]).
    async fn hit_batch(
        &self,
        request: Request<Streaming<pb::HitBatchRequest>>,
    ) -> Result<Response<batch::BatchReplies>, Status> {
        drop(self.gate.enter()?);
        Ok(Response::new(batch::serve(
            self.node.clone(),
            self.defaults,
            self.gate.clone(),
            request.into_inner(),
        )))
    }

    async fn settle(
        &self,
        request: Request<pb::SettleRequest>,
    ) -> Result<Response<pb::SettleResponse>, Status> {
        let _call = self.gate.enter()?;
        let started = Instant::now();
        let decided = match validate::settle(request.get_ref(), self.defaults) {
            Ok(input) => self.node.settle(input).await.map_err(status_of),
            Err(e) => Err(Status::from(e)),
        };
        let (outcome, decided_by) = labels(&decided, settle_outcome_label);
        metrics::counter!("ankusa_settles_total", "outcome" => outcome, "decided_by" => decided_by)
            .increment(1);
        record_latency("settle", started);
        Ok(Response::new(settle_response(decided?)))
    }

    async fn reset(
        &self,
        request: Request<pb::ResetRequest>,
    ) -> Result<Response<pb::ResetResponse>, Status> {
        let _call = self.gate.enter()?;
        let started = Instant::now();
        let done = match validate::reset(request.get_ref(), self.defaults) {
            Ok(input) => self.node.reset(input).await.map_err(status_of),
            Err(e) => Err(Status::from(e)),
        };
        let outcome = match &done {
            Ok(()) => "reset",
            Err(status) => error_label(status),
        };
        // A reset is decided by the fleet or not at all.
        let decided_by = if done.is_ok() { "fleet" } else { "none" };
        metrics::counter!("ankusa_resets_total", "outcome" => outcome, "decided_by" => decided_by)
            .increment(1);
        record_latency("reset", started);
        done?;
        Ok(Response::new(pb::ResetResponse {}))
    }

    async fn check_rate(
        &self,
        request: Request<pb::CheckRateRequest>,
    ) -> Result<Response<pb::CheckRateResponse>, Status> {
        let _call = self.gate.enter()?;
        let started = Instant::now();
        let outcome = match validate::check_rate(request.get_ref(), self.defaults) {
            Ok(input) => self.node.check_rate(input).await.map_err(status_of),
            Err(e) => Err(Status::from(e)),
        };
        let elapsed_us = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
        check_rate_telemetry(request.get_ref(), &outcome, elapsed_us);
        record_latency("check_rate", started);
        let decided = outcome?;
        let retry_after_ms = match decided.answer {
            HitAnswer::RateLimited { retry_after_ms } => retry_after_ms,
            _ => 0,
        };
        Ok(Response::new(pb::CheckRateResponse {
            allowed: decided.answer == HitAnswer::Allowed,
            retry_after_ms,
            decided_by: decided_by(&decided.decided_by).0,
        }))
    }

    async fn status(
        &self,
        _request: Request<pb::StatusRequest>,
    ) -> Result<Response<pb::StatusResponse>, Status> {
        let status = self.node.status();
        // The first that holds: a stopped Raft core (the node is on its way out), no leader,
        // or local decisions not yet handed to the fleet.
        let degraded_reason = match (&status.raft_core_stopped, status.leader_id) {
            (Some(why), _) => format!("raft core stopped: {why}"),
            (None, _) if status.clock_skewed => format!(
                "clock offset {} ms from the fleet's median, past max_clock_offset_ms = {}: this node does not lead",
                status.clock_offset.map_or(0, |o| o.offset_us / 1_000),
                status.max_clock_offset_ms
            ),
            (None, None) => "no leader known".to_owned(),
            (None, Some(_)) if self.node.fallback().has_unreconciled() => {
                "local decisions wait to be handed to the fleet".to_owned()
            }
            (None, Some(_)) => String::new(),
        };
        Ok(Response::new(pb::StatusResponse {
            node_id: status.node_id,
            leader_id: status.leader_id.unwrap_or(0),
            term: status.term,
            last_applied: status.last_applied,
            members: status
                .members
                .into_iter()
                .map(|(id, node, voter)| pb::Member {
                    id,
                    api_addr: node.api_addr,
                    raft_addr: node.raft_addr,
                    voter,
                })
                .collect(),
            degraded: !degraded_reason.is_empty(),
            degraded_reason,
            clock_offset_ms: status.clock_offset.map_or(0, |o| o.offset_us / 1_000),
            clock_offset_known: status.clock_offset.is_some(),
        }))
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::sync::{Arc, Mutex};

    use super::*;

    /// Collects what a subscriber writes.
    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl Write for Captured {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().expect("lock").extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// An entity id with a newline and a forged line after it stays inside its own field:
    /// the call writes one line, with the newline escaped.
    #[test]
    fn a_caller_string_cannot_forge_a_log_line() {
        let captured = Captured::default();
        let writer = captured.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::DEBUG)
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .finish();
        let request = pb::CheckRateRequest {
            entity_id: "e1\n2026-12-04T00:00:00Z  INFO node started forged=yes".to_owned(),
            operation: "op\r\nx".to_owned(),
            ..Default::default()
        };
        tracing::subscriber::with_default(subscriber, || {
            check_rate_telemetry(&request, &Err(Status::internal("x")), 5);
        });
        let text = String::from_utf8(captured.0.lock().expect("lock").clone()).expect("utf-8");
        assert_eq!(text.lines().count(), 1, "{text}");
        assert!(text.contains("DEBUG"), "per-call logs are debug: {text}");
        assert!(
            text.contains(r#"entity_id="e1\n2026-12-04T00:00:00Z  INFO node started forged=yes""#),
            "{text}"
        );
        assert!(text.contains(r#"operation="op\r\nx""#), "{text}");
    }
}
