//! `Fleet/HitBatch`: many hits per message, answers by the caller's ids, in any order.
//!
//! A frame is split once, in its order: hits that do not validate are answered at once by
//! id; each run of consecutive hits that route to the fleet alone and share a deadline
//! (`shares_deadline`) goes to the node as one group ([`Node::hit_fleet_group`]: one
//! proposer unit, one deadline); each other hit (node scope, mixed scopes) is a group of
//! its own. Each group leaves as one reply message as soon as it is decided, with one
//! metrics update. A stream reads no further frame while [`HIT_BATCH_HITS_IN_FLIGHT_MAX`]
//! hits could be passed, so HTTP/2 flow control holds the edge back.
//!
//! [`FleetRoutes`] serves the `Fleet` service with a transport limit per method: a
//! `HitBatch` message may be a frame's size, every other request one hit's.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use futures::stream::FuturesUnordered;
use futures::{Stream, StreamExt};
use tonic::{Status, Streaming};

use super::drain::{DrainGate, Draining};
use super::status::status_of;
use super::validate::{self, RequestDefaults};
use super::FleetService;
use super::{call_error, call_status, decider_label, error_label, hit_outcome_label, hit_response};
use crate::limits::{
    API_MESSAGE_BYTES_MAX, HIT_BATCH_HITS_IN_FLIGHT_MAX, HIT_BATCH_HITS_MAX,
    HIT_BATCH_MESSAGE_BYTES_MAX,
};
use crate::node::frame::HitResult;
use crate::node::request::HitInput;
use crate::node::route::{route, Route};
use crate::node::Node;
use crate::pb;
use crate::pb::fleet_server::FleetServer;

/// The stream of `HitBatch` replies.
pub type BatchReplies = Pin<Box<dyn Stream<Item = Result<pb::HitBatchReply, Status>> + Send>>;

/// Answers of one group, by the caller's ids.
type Answers = Vec<(u64, Result<pb::HitResponse, Status>)>;

/// Hits of a frame decided together: consecutive fleet-scoped ones whose timeouts are
/// within [`shares_deadline`] of each other (`fleet_timeout`, the shortest of them: one
/// proposer unit, one deadline), or one hit routed otherwise (node scope, mixed scopes).
struct Run {
    fleet_timeout: Option<Duration>,
    /// The longest timeout of the run's fleet-scoped hits.
    longest: Duration,
    ids: Vec<u64>,
    inputs: Vec<HitInput>,
}

impl Run {
    /// Whether a hit with this route and timeout joins the run.
    fn takes(&self, fleet_only: bool, timeout: Duration) -> bool {
        match self.fleet_timeout {
            Some(shortest) if fleet_only => {
                shares_deadline(shortest.min(timeout), self.longest.max(timeout))
            }
            // Each hit routed otherwise is a group of its own: its answer must not wait
            // for another's deadline.
            Some(_) | None => false,
        }
    }

    fn push(&mut self, id: u64, input: HitInput) {
        if let Some(shortest) = &mut self.fleet_timeout {
            *shortest = (*shortest).min(input.timeout);
            self.longest = self.longest.max(input.timeout);
        }
        self.ids.push(id);
        self.inputs.push(input);
    }
}

/// Whether fleet-scoped hits with timeouts from `shortest` to `longest` share one deadline,
/// the shortest's: a tenth of it apart at most (at least 2 ms). An edge client that sends
/// each hit with what is left of its own deadline gives hits gathered together timeouts a
/// few milliseconds apart; one deadline for them all keeps them one unit, and a hit then
/// falls back at most that much before its own deadline, never after it.
fn shares_deadline(shortest: Duration, longest: Duration) -> bool {
    longest - shortest <= (shortest / 10).max(Duration::from_millis(2))
}

/// One stream's frames being read and its groups being decided.
struct Frames {
    node: Arc<Node>,
    defaults: RequestDefaults,
    gate: DrainGate,
    /// `None` once the edge closed its side (or sent a message that did not decode).
    incoming: Option<Streaming<pb::HitBatchRequest>>,
    /// Each group's answers, with how many hits it holds.
    groups: FuturesUnordered<BoxFuture<'static, (usize, Answers)>>,
    hits_in_flight: usize,
}

/// Serves one `HitBatch` stream: `incoming` frames in, one reply per decided group out.
/// A message that does not decode ends the stream with INVALID_ARGUMENT naming the field
/// (the bytes after it cannot be trusted); the groups already taken are answered first.
pub fn serve(
    node: Arc<Node>,
    defaults: RequestDefaults,
    gate: DrainGate,
    incoming: Streaming<pb::HitBatchRequest>,
) -> BatchReplies {
    let frames = Frames {
        node,
        defaults,
        gate,
        incoming: Some(incoming),
        groups: FuturesUnordered::new(),
        hits_in_flight: 0,
    };
    let replies = futures::stream::unfold((frames, None), |(mut frames, mut ended)| async move {
        loop {
            // Room for one more whole frame: read; else wait for a group to finish.
            let may_read =
                frames.hits_in_flight + HIT_BATCH_HITS_MAX <= HIT_BATCH_HITS_IN_FLIGHT_MAX;
            let can_read = frames.incoming.is_some() && may_read;
            let reading = frames.incoming.as_mut().filter(|_| may_read);
            tokio::select! {
                biased;
                Some((hits, answers)) = frames.groups.next(), if !frames.groups.is_empty() => {
                    frames.hits_in_flight -= hits;
                    return Some((Ok(reply(answers)), (frames, ended)));
                }
                message = next_message(reading), if can_read => {
                    match message {
                        Some(Ok(frame)) => frames.take(frame),
                        Some(Err(status)) => {
                            frames.incoming = None;
                            ended = Some(status);
                        }
                        None => frames.incoming = None,
                    }
                }
                else => {
                    // Nothing left to read or to answer.
                    return ended.take().map(|status| (Err(status), (frames, None)));
                }
            }
        }
    });
    Box::pin(replies)
}

async fn next_message(
    incoming: Option<&mut Streaming<pb::HitBatchRequest>>,
) -> Option<Result<pb::HitBatchRequest, Status>> {
    incoming?.next().await
}

impl Frames {
    /// Splits one frame into its groups and starts them.
    fn take(&mut self, frame: pb::HitBatchRequest) {
        // `api::wire` refused a message of more hits, or with a hit over its limit.
        debug_assert!(frame.hits.len() <= HIT_BATCH_HITS_MAX);
        if let Err(refused) = self.gate.enter() {
            // Draining: every hit is refused, as a unary Hit would be before it is read.
            let ids = frame.hits.iter().map(|batched| batched.id).collect();
            let hits = frame.hits.len();
            let answers = refuse_all(ids, &refused);
            self.start(hits, Box::pin(async move { (hits, answers) }));
            return;
        }
        let (refused_hits, runs) = validated_runs(frame.hits, self.defaults);
        if !refused_hits.is_empty() {
            count_answers(&refused_hits);
            let hits = refused_hits.len();
            self.start(hits, Box::pin(async move { (hits, refused_hits) }));
        }
        // Started in the frame's order: each group's commands reach the proposer when it
        // is first polled, and the stream polls new groups in the order they came.
        for run in runs {
            let node = self.node.clone();
            let call = self.gate.enter();
            let hits = run.ids.len();
            self.start(
                hits,
                Box::pin(async move {
                    let started = Instant::now();
                    let Run {
                        fleet_timeout,
                        ids,
                        inputs,
                        ..
                    } = run;
                    let _call = match call {
                        Ok(call) => call,
                        Err(refused) => return (hits, refuse_all(ids, &refused)),
                    };
                    let results = match fleet_timeout {
                        Some(timeout) => node.hit_fleet_group(inputs, timeout).await,
                        None => {
                            futures::future::join_all(
                                inputs.into_iter().map(|input| node.hit(input)),
                            )
                            .await
                        }
                    };
                    (hits, decided(ids, results, started))
                }),
            );
        }
    }

    fn start(&mut self, hits: usize, group: BoxFuture<'static, (usize, Answers)>) {
        self.hits_in_flight += hits;
        self.groups.push(group);
    }
}

/// Validates a frame's hits: the refusals by id, and the valid hits in runs of one group
/// each (`Run::takes`), in the frame's order.
fn validated_runs(hits: Vec<pb::BatchedHit>, defaults: RequestDefaults) -> (Answers, Vec<Run>) {
    let mut refused_hits: Answers = Vec::new();
    let mut runs: Vec<Run> = Vec::new();
    for batched in hits {
        let Some(hit) = batched.hit else {
            let missing = validate::InvalidArgument {
                field: "hit".to_owned(),
                reason: "must be set".to_owned(),
            };
            refused_hits.push((batched.id, Err(Status::from(missing))));
            continue;
        };
        match validate::hit(hit, defaults) {
            Err(e) => refused_hits.push((batched.id, Err(Status::from(e)))),
            Ok(input) => {
                let fleet_only = route(&input) == Route::FleetOnly;
                match runs.last_mut() {
                    Some(run) if run.takes(fleet_only, input.timeout) => {
                        run.push(batched.id, input);
                    }
                    _ => runs.push(Run {
                        fleet_timeout: fleet_only.then_some(input.timeout),
                        longest: input.timeout,
                        ids: vec![batched.id],
                        inputs: vec![input],
                    }),
                }
            }
        }
    }
    (refused_hits, runs)
}

/// Every hit of a group the draining node no longer takes, answered with that refusal.
fn refuse_all(ids: Vec<u64>, refused: &Draining) -> Answers {
    let answers: Answers = ids
        .into_iter()
        .map(|id| (id, Err(Status::from(*refused))))
        .collect();
    count_answers(&answers);
    answers
}

/// A group's answers by id, counted and timed once for the group.
fn decided(ids: Vec<u64>, results: Vec<HitResult>, started: Instant) -> Answers {
    let mut labels: HashMap<(&'static str, &'static str), u64> = HashMap::new();
    let answers: Answers = ids
        .into_iter()
        .zip(results)
        .map(|(id, result)| {
            let answered = result.map_err(status_of);
            let label = match &answered {
                Ok(decided) => (
                    hit_outcome_label(&decided.answer),
                    decider_label(Some(&decided.decided_by)),
                ),
                Err(status) => (error_label(status), decider_label(None)),
            };
            let answer = answered.map(hit_response);
            *labels.entry(label).or_default() += 1;
            (id, answer)
        })
        .collect();
    for ((outcome, decided_by), count) in labels {
        metrics::counter!("ankusa_hits_total", "outcome" => outcome, "decided_by" => decided_by)
            .increment(count);
    }
    super::record_latency("hit_batch", started);
    answers
}

/// Counts answers decided without the node (refused before it was asked).
fn count_answers(answers: &Answers) {
    for (_, answer) in answers {
        if let Err(status) = answer {
            metrics::counter!("ankusa_hits_total", "outcome" => error_label(status), "decided_by" => "none")
                .increment(1);
        }
    }
}

fn reply(answers: Answers) -> pb::HitBatchReply {
    use pb::batched_answer::Result as Reply;
    pb::HitBatchReply {
        answers: answers
            .into_iter()
            .map(|(id, answer)| pb::BatchedAnswer {
                id,
                result: Some(match answer {
                    Ok(response) => Reply::Response(response),
                    Err(status) => Reply::Error(call_error(&status)),
                }),
            })
            .collect(),
    }
}

/// For callers of `HitBatch`: one answer's id, and the answer or the status a unary `Hit`
/// would have returned.
///
/// # Errors
/// The answer's error, or INTERNAL for an answer without a result.
pub fn answer_result(answer: pb::BatchedAnswer) -> (u64, Result<pb::HitResponse, Status>) {
    use pb::batched_answer::Result as Reply;
    let result = match answer.result {
        Some(Reply::Response(response)) => Ok(response),
        Some(Reply::Error(error)) => Err(call_status(error)),
        None => Err(Status::internal("a HitBatch answer without a result")),
    };
    (answer.id, result)
}

/// The `Fleet` service as the node serves it: `HitBatch` with a frame's transport limit
/// ([`HIT_BATCH_MESSAGE_BYTES_MAX`]), every other method with one request's
/// ([`API_MESSAGE_BYTES_MAX`]), so a request over its limit is refused from its length
/// prefix, before any of it is buffered.
#[derive(Clone)]
pub struct FleetRoutes {
    single: FleetServer<FleetService>,
    batch: FleetServer<FleetService>,
}

impl FleetRoutes {
    pub fn new(fleet: FleetService) -> Self {
        let fleet = Arc::new(fleet);
        Self {
            single: FleetServer::from_arc(fleet.clone())
                .max_decoding_message_size(API_MESSAGE_BYTES_MAX),
            batch: FleetServer::from_arc(fleet)
                .max_decoding_message_size(HIT_BATCH_MESSAGE_BYTES_MAX),
        }
    }
}

/// The path of `Fleet/HitBatch`.
const HIT_BATCH_PATH: &str = "/ankusa.fleet.v1.Fleet/HitBatch";

impl<B> tower::Service<http::Request<B>> for FleetRoutes
where
    FleetServer<FleetService>: tower::Service<http::Request<B>>,
{
    type Response = <FleetServer<FleetService> as tower::Service<http::Request<B>>>::Response;
    type Error = <FleetServer<FleetService> as tower::Service<http::Request<B>>>::Error;
    type Future = <FleetServer<FleetService> as tower::Service<http::Request<B>>>::Future;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        // Both are always ready (tonic's generated servers are).
        match self.single.poll_ready(cx) {
            std::task::Poll::Ready(Ok(())) => self.batch.poll_ready(cx),
            other => other,
        }
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        if request.uri().path() == HIT_BATCH_PATH {
            self.batch.call(request)
        } else {
            self.single.call(request)
        }
    }
}

impl tonic::server::NamedService for FleetRoutes {
    const NAME: &'static str = pb::fleet_server::SERVICE_NAME;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeouts_a_tenth_apart_share_a_deadline_and_no_further() {
        let ms = Duration::from_millis;
        assert!(shares_deadline(ms(300), ms(300)));
        assert!(shares_deadline(ms(300), ms(330)));
        assert!(!shares_deadline(ms(300), ms(331)));
        // Short timeouts still group a couple of milliseconds apart.
        assert!(shares_deadline(ms(5), ms(7)));
        assert!(!shares_deadline(ms(5), ms(8)));
    }
}
