//! The edge client against a fake node (`fake`) that hands each `HitBatch` stream to the
//! test, which answers its frames as it likes: how hits are gathered into frames, matched
//! by id, given up at their deadlines, and failed when the stream breaks.

use std::time::Duration;

use ankusa_fleet_client::{pb, Client, Error, Options, Outcome, Target};

use super::common::*;
use super::{budget_hit, fleet_says};

/// A `Fleet` node of the test's own making: every `HitBatch` stream the client opens is
/// handed to the test, which reads its frames and answers them as it likes (late, out of
/// order, never, or by ending the stream). Every other call is unimplemented.
mod fake {
    use ankusa_fleet::pb;
    use tokio::sync::mpsc;
    use tokio_stream::wrappers::UnboundedReceiverStream;
    use tokio_stream::StreamExt;
    use tonic::{Request, Response, Status, Streaming};

    use super::CONDITION_DEADLINE;

    /// One `HitBatch` stream: the frames the client sent, and the replies to send it.
    pub struct BatchStream {
        frames: mpsc::UnboundedReceiver<pb::HitBatchRequest>,
        replies: mpsc::UnboundedSender<Result<pb::HitBatchReply, Status>>,
    }

    /// A hit as the fake node read it: its id and the tenant of its first charge (each
    /// test's hits carry their names there).
    #[derive(Clone, Debug, PartialEq, Eq)]
    pub struct Received {
        pub id: u64,
        pub name: String,
        pub timeout_ms: u32,
    }

    impl BatchStream {
        /// The next frame the client sent, within [`CONDITION_DEADLINE`].
        pub async fn frame(&mut self) -> Vec<Received> {
            let frame = tokio::time::timeout(CONDITION_DEADLINE, self.frames.recv())
                .await
                .expect("a frame within the deadline")
                .expect("the client keeps the stream open");
            frame
                .hits
                .into_iter()
                .map(|batched| {
                    let hit = batched.hit.expect("a hit");
                    Received {
                        id: batched.id,
                        name: hit.charges[0].tenant.clone(),
                        timeout_ms: hit.timeout_ms,
                    }
                })
                .collect()
        }

        /// Answers hit `id` allowed, or rate limited for `retry_after_ms`.
        pub fn answer(&self, answers: &[(u64, Option<u64>)]) {
            use pb::hit_response::Outcome;
            let answers = answers
                .iter()
                .map(|&(id, limited)| {
                    let outcome = match limited {
                        None => Outcome::Allowed(pb::Allowed {}),
                        Some(retry_after_ms) => {
                            Outcome::RateLimited(pb::RateLimited { retry_after_ms })
                        }
                    };
                    pb::BatchedAnswer {
                        id,
                        result: Some(pb::batched_answer::Result::Response(pb::HitResponse {
                            outcome: Some(outcome),
                            decided_by: pb::DecidedBy::Fleet as i32,
                            ..Default::default()
                        })),
                    }
                })
                .collect();
            self.replies
                .send(Ok(pb::HitBatchReply { answers }))
                .expect("the stream is open");
        }

        /// Ends the stream with `status`.
        pub fn break_with(self, status: Status) {
            let _ = self.replies.send(Err(status));
        }
    }

    struct FakeNode {
        streams: mpsc::UnboundedSender<BatchStream>,
    }

    /// Serves a fake node on a free loopback port: its address, and the streams opened on
    /// it as they open.
    pub async fn start() -> (String, mpsc::UnboundedReceiver<BatchStream>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr").to_string();
        let (streams, opened) = mpsc::unbounded_channel();
        let node = pb::fleet_server::FleetServer::new(FakeNode { streams });
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(node)
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
        );
        (addr, opened)
    }

    /// The next stream the client opens, within [`CONDITION_DEADLINE`].
    pub async fn next_stream(opened: &mut mpsc::UnboundedReceiver<BatchStream>) -> BatchStream {
        tokio::time::timeout(CONDITION_DEADLINE, opened.recv())
            .await
            .expect("a stream within the deadline")
            .expect("the fake node runs")
    }

    #[tonic::async_trait]
    impl pb::fleet_server::Fleet for FakeNode {
        async fn hit(
            &self,
            _: Request<pb::HitRequest>,
        ) -> Result<Response<pb::HitResponse>, Status> {
            Err(Status::unimplemented("fake node"))
        }

        async fn settle(
            &self,
            _: Request<pb::SettleRequest>,
        ) -> Result<Response<pb::SettleResponse>, Status> {
            Err(Status::unimplemented("fake node"))
        }

        async fn reset(
            &self,
            _: Request<pb::ResetRequest>,
        ) -> Result<Response<pb::ResetResponse>, Status> {
            Err(Status::unimplemented("fake node"))
        }

        async fn check_rate(
            &self,
            _: Request<pb::CheckRateRequest>,
        ) -> Result<Response<pb::CheckRateResponse>, Status> {
            Err(Status::unimplemented("fake node"))
        }

        async fn status(
            &self,
            _: Request<pb::StatusRequest>,
        ) -> Result<Response<pb::StatusResponse>, Status> {
            Err(Status::unimplemented("fake node"))
        }

        type HitStreamStream = tokio_stream::Empty<Result<pb::HitStreamReply, Status>>;

        async fn hit_stream(
            &self,
            _: Request<Streaming<pb::HitRequest>>,
        ) -> Result<Response<Self::HitStreamStream>, Status> {
            Err(Status::unimplemented("fake node"))
        }

        type HitBatchStream = UnboundedReceiverStream<Result<pb::HitBatchReply, Status>>;

        async fn hit_batch(
            &self,
            request: Request<Streaming<pb::HitBatchRequest>>,
        ) -> Result<Response<Self::HitBatchStream>, Status> {
            let mut incoming = request.into_inner();
            let (frames, read) = mpsc::unbounded_channel();
            let (replies, outgoing) = mpsc::unbounded_channel();
            tokio::spawn(async move {
                while let Some(Ok(frame)) = incoming.next().await {
                    if frames.send(frame).is_err() {
                        break;
                    }
                }
            });
            let _ = self.streams.send(BatchStream {
                frames: read,
                replies,
            });
            Ok(Response::new(UnboundedReceiverStream::new(outgoing)))
        }
    }
}

/// A deadline no test waits out: a hit that must not leave by its gather share (a quarter
/// of it) or its deadline within [`CONDITION_DEADLINE`].
const FAR_MS: u32 = 600_000;

/// A hit named `name` (its charge's tenant), for the fake node to tell hits apart.
fn named_hit(name: &str, timeout_ms: u32) -> pb::HitRequest {
    let mut hit = budget_hit(name, 1);
    hit.timeout_ms = timeout_ms;
    hit
}

fn rate_limited(retry_after_ms: u64) -> Result<ankusa_fleet_client::Decision, Error> {
    fleet_says(Outcome::RateLimited {
        retry_after: Duration::from_millis(retry_after_ms),
    })
}

/// Calls that have handed their hits to the client. These tests run on one thread, so a
/// call counted here has put its hit in the client's queue: a call's first poll does both,
/// and the test reads the count only between polls.
#[derive(Clone, Default)]
struct Calls(std::sync::Arc<std::sync::atomic::AtomicUsize>);

impl Calls {
    /// Starts `client.hit(named_hit(name, timeout_ms))` in a task of its own.
    fn hit(
        &self,
        client: &Client,
        name: &str,
        timeout_ms: u32,
    ) -> tokio::task::JoinHandle<Result<ankusa_fleet_client::Decision, Error>> {
        let (client, count, hit) = (client.clone(), self.0.clone(), named_hit(name, timeout_ms));
        tokio::spawn(async move {
            count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            client.hit(hit).await
        })
    }

    async fn wait_for(&self, calls: usize) {
        wait_until("the calls have handed over their hits", || {
            (self.0.load(std::sync::atomic::Ordering::SeqCst) >= calls).then_some(())
        })
        .await;
    }
}

/// The answer of a call started with [`Calls::hit`], within [`CONDITION_DEADLINE`].
async fn answer_of(
    call: tokio::task::JoinHandle<Result<ankusa_fleet_client::Decision, Error>>,
) -> Result<ankusa_fleet_client::Decision, Error> {
    tokio::time::timeout(CONDITION_DEADLINE, call)
        .await
        .expect("the call returned")
        .expect("the call's task")
}

/// The names of `frame`'s hits, sorted.
fn names_of(frame: &[fake::Received]) -> Vec<&str> {
    let mut names: Vec<&str> = frame.iter().map(|hit| hit.name.as_str()).collect();
    names.sort_unstable();
    names
}

/// Every hit of `frame` allowed, as [`fake::BatchStream::answer`] takes it.
fn all_allowed(frame: &[fake::Received]) -> Vec<(u64, Option<u64>)> {
    frame.iter().map(|hit| (hit.id, None)).collect()
}

/// A client of a fresh fake node with one hit sent: the hit alone in the first frame.
struct OneInFlight {
    client: Client,
    calls: Calls,
    stream: fake::BatchStream,
    /// The call of the hit in flight.
    call: tokio::task::JoinHandle<Result<ankusa_fleet_client::Decision, Error>>,
    /// The frame it left in.
    frame: Vec<fake::Received>,
}

/// Starts a fake node and a client, and sends it the hit `name` with `timeout_ms`.
async fn one_in_flight(name: &str, timeout_ms: u32) -> OneInFlight {
    let (addr, mut opened) = fake::start().await;
    let client = fake_client(addr);
    let calls = Calls::default();
    let call = calls.hit(&client, name, timeout_ms);
    let stream = fake::next_stream(&mut opened).await;
    let mut started = OneInFlight {
        client,
        calls,
        stream,
        call,
        frame: Vec::new(),
    };
    started.frame = started.stream.frame().await;
    assert_eq!(started.frame.len(), 1, "{:?}", started.frame);
    started
}

/// The answers of a caller that hit twice.
type TwoAnswers = (
    Result<ankusa_fleet_client::Decision, Error>,
    Result<ankusa_fleet_client::Decision, Error>,
);

/// Waits for a caller that hit twice, and checks that both hits were allowed.
async fn both_allowed(caller: tokio::task::JoinHandle<TwoAnswers>) {
    let (first, second) = tokio::time::timeout(CONDITION_DEADLINE, caller)
        .await
        .expect("the caller returned")
        .expect("the caller's task");
    assert_eq!(first, fleet_says(Outcome::Ok));
    assert_eq!(second, fleet_says(Outcome::Ok));
}

fn fake_client(addr: String) -> Client {
    Client::connect(Target::Tcp(addr), Options::default()).expect("a client")
}

/// With nothing in flight a hit leaves at once in a frame of its own (its deadline is far
/// off, so no gather timer sends it); while a frame is in flight, the hits of 64 clones
/// gather, and all leave in the one frame after it, each answered with its own answer.
#[tokio::test]
async fn a_lone_hit_leaves_alone_and_hits_of_many_clones_share_the_next_frame() {
    init_tracing();
    tracing::info!("--- a lone hit: a frame of its own, answered");
    let OneInFlight {
        client,
        calls,
        mut stream,
        call: lone,
        frame,
    } = one_in_flight("lone", FAR_MS).await;
    assert_eq!(frame[0].name, "lone");
    stream.answer(&[(frame[0].id, None)]);
    assert_eq!(answer_of(lone).await, fleet_says(Outcome::Ok));

    tracing::info!("--- 64 clones' hits while a frame is in flight: one frame after it");
    let first = calls.hit(&client, "first", FAR_MS);
    let in_flight = stream.frame().await;
    assert_eq!(in_flight.len(), 1, "{in_flight:?}");
    let many: Vec<_> = (0..64u64)
        .map(|i| (i, calls.hit(&client, &format!("clone-{i}"), FAR_MS)))
        .collect();
    calls.wait_for(2 + 64).await;
    stream.answer(&[(in_flight[0].id, None)]);
    assert_eq!(answer_of(first).await, fleet_says(Outcome::Ok));
    let next = stream.frame().await;
    let mut expected: Vec<String> = (0..64).map(|i| format!("clone-{i}")).collect();
    expected.sort_unstable();
    assert_eq!(
        names_of(&next),
        expected,
        "the frame after the one in flight"
    );

    // Each hit's own answer: clone i is rate limited for i ms.
    let answers: Vec<(u64, Option<u64>)> = next
        .iter()
        .map(|hit| {
            let i: u64 = hit.name["clone-".len()..]
                .parse()
                .expect("a clone's number");
            (hit.id, Some(i))
        })
        .collect();
    stream.answer(&answers);
    for (i, call) in many {
        assert_eq!(answer_of(call).await, rate_limited(i), "clone {i}");
    }
}

/// A caller that hits again as soon as it is answered rides in the frame that leaves
/// after that answer, beside the hits gathered meanwhile, not in the one after it: without
/// that, closed-loop callers split into two groups that take turns, each frame carrying
/// half of them.
#[tokio::test]
async fn a_caller_that_hits_again_on_its_answer_joins_the_next_frame() {
    init_tracing();
    let (addr, mut opened) = fake::start().await;
    let client = fake_client(addr);
    let calls = Calls::default();
    let again = {
        let client = client.clone();
        tokio::spawn(async move {
            let first = client.hit(named_hit("again", FAR_MS)).await;
            let second = client.hit(named_hit("again-2", FAR_MS)).await;
            (first, second)
        })
    };
    let mut stream = fake::next_stream(&mut opened).await;
    let in_flight = stream.frame().await;
    assert_eq!(in_flight.len(), 1, "{in_flight:?}");
    assert_eq!(in_flight[0].name, "again");
    let waiting = calls.hit(&client, "waiting", FAR_MS);
    calls.wait_for(1).await;

    stream.answer(&[(in_flight[0].id, None)]);
    let next = stream.frame().await;
    assert_eq!(
        names_of(&next),
        ["again-2", "waiting"],
        "the frame after the answer"
    );

    stream.answer(&all_allowed(&next));
    assert_eq!(answer_of(waiting).await, fleet_says(Outcome::Ok));
    both_allowed(again).await;
}

/// The same on a multi-thread runtime, an edge's, with several callers: every caller the
/// answer woke that hits again at once rides in the next frame, not only the first of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn every_caller_that_hits_again_joins_the_next_frame_on_a_multi_thread_runtime() {
    init_tracing();
    let OneInFlight {
        client,
        calls,
        mut stream,
        call: lead,
        frame: in_flight,
    } = one_in_flight("lead", FAR_MS).await;
    let callers: Vec<_> = (0..3)
        .map(|i| {
            let (client, count) = (client.clone(), calls.0.clone());
            tokio::spawn(async move {
                count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let first = client.hit(named_hit(&format!("again-{i}"), FAR_MS)).await;
                let second = client.hit(named_hit(&format!("again-{i}-2"), FAR_MS)).await;
                (first, second)
            })
        })
        .collect();
    calls.wait_for(4).await;
    stream.answer(&[(in_flight[0].id, None)]);
    assert_eq!(answer_of(lead).await, fleet_says(Outcome::Ok));
    let gathered = stream.frame().await;
    assert_eq!(names_of(&gathered), ["again-0", "again-1", "again-2"]);

    let waiting = calls.hit(&client, "waiting", FAR_MS);
    calls.wait_for(5).await;
    stream.answer(&all_allowed(&gathered));
    let next = stream.frame().await;
    assert_eq!(
        names_of(&next),
        ["again-0-2", "again-1-2", "again-2-2", "waiting"],
        "the frame after the answer"
    );

    stream.answer(&all_allowed(&next));
    assert_eq!(answer_of(waiting).await, fleet_says(Outcome::Ok));
    for caller in callers {
        both_allowed(caller).await;
    }
}

/// The node answers the later of two hits in one frame first: its caller returns while
/// the earlier one still waits, and then the earlier one gets its own answer.
#[tokio::test]
async fn answers_are_matched_by_id_without_head_of_line_blocking() {
    init_tracing();
    let (addr, mut opened) = fake::start().await;
    let client = fake_client(addr);
    let calls = Calls::default();
    let first = calls.hit(&client, "first", FAR_MS);
    let mut stream = fake::next_stream(&mut opened).await;
    let in_flight = stream.frame().await;
    let early = calls.hit(&client, "early", FAR_MS);
    calls.wait_for(2).await;
    let late = calls.hit(&client, "late", FAR_MS);
    calls.wait_for(3).await;
    stream.answer(&[(in_flight[0].id, None)]);
    assert_eq!(answer_of(first).await, fleet_says(Outcome::Ok));

    let frame = stream.frame().await;
    let names: Vec<&str> = frame.iter().map(|hit| hit.name.as_str()).collect();
    assert_eq!(names, ["early", "late"]);
    stream.answer(&[(frame[1].id, Some(7))]);
    assert_eq!(answer_of(late).await, rate_limited(7));
    assert!(!early.is_finished(), "the early hit has no answer yet");
    stream.answer(&[(frame[0].id, None)]);
    assert_eq!(answer_of(early).await, fleet_says(Outcome::Ok));
}

/// The node never answers one hit: its call ends at its deadline as a timeout, the node
/// was asked to answer before it, and the hit no longer counts as in flight, so the hit
/// gathered behind it leaves then. The node's late answer goes to nobody.
#[tokio::test]
async fn a_hit_never_answered_times_out_by_its_deadline_and_the_others_go_on() {
    init_tracing();
    let OneInFlight {
        client,
        calls,
        mut stream,
        call: held,
        frame: held_frame,
    } = one_in_flight("held", 300).await;
    let asked_ms = held_frame[0].timeout_ms;
    assert!(
        asked_ms > 0 && asked_ms <= 280,
        "the node is asked {asked_ms} ms"
    );
    let behind = calls.hit(&client, "behind", FAR_MS);
    calls.wait_for(2).await;

    assert_eq!(
        answer_of(held).await,
        Err(Error::Timeout(Duration::from_millis(300)))
    );
    let frame = stream.frame().await;
    assert_eq!(frame.len(), 1, "{frame:?}");
    assert_eq!(frame[0].name, "behind");
    // The held hit's answer, late, and then the one behind it.
    stream.answer(&[(held_frame[0].id, Some(1)), (frame[0].id, None)]);
    assert_eq!(answer_of(behind).await, fleet_says(Outcome::Ok));

    let after = calls.hit(&client, "after", FAR_MS);
    let frame = stream.frame().await;
    stream.answer(&[(frame[0].id, Some(9))]);
    assert_eq!(answer_of(after).await, rate_limited(9));
}

/// A frame whose hit the node holds (its deadline far off) keeps a later hit waiting only
/// for a share of that hit's own deadline: then it leaves on its own and is answered.
#[tokio::test]
async fn a_stalled_frame_holds_a_gathered_hit_only_a_share_of_its_deadline() {
    init_tracing();
    let OneInFlight {
        client,
        calls,
        mut stream,
        call: _held,
        ..
    } = one_in_flight("held", FAR_MS).await;

    let quick = calls.hit(&client, "quick", 8_000);
    let frame = stream.frame().await;
    assert_eq!(frame.len(), 1, "{frame:?}");
    assert_eq!(frame[0].name, "quick");
    stream.answer(&[(frame[0].id, None)]);
    assert_eq!(answer_of(quick).await, fleet_says(Outcome::Ok));
}

/// The stream breaks with a frame in flight and a hit gathered: both calls fail at once as
/// unavailable, and the next hit opens a new stream and is answered there.
#[tokio::test]
async fn a_broken_stream_fails_its_hits_and_the_next_hit_opens_another() {
    init_tracing();
    let (addr, mut opened) = fake::start().await;
    let client = fake_client(addr);
    let calls = Calls::default();
    let sent = calls.hit(&client, "sent", FAR_MS);
    let mut stream = fake::next_stream(&mut opened).await;
    stream.frame().await;
    let gathered = calls.hit(&client, "gathered", FAR_MS);
    calls.wait_for(2).await;

    stream.break_with(tonic::Status::internal("the fake node gives up"));
    for call in [sent, gathered] {
        let failed = answer_of(call).await;
        assert!(matches!(failed, Err(Error::Unavailable(_))), "{failed:?}");
    }

    let next = calls.hit(&client, "next", FAR_MS);
    let mut stream = fake::next_stream(&mut opened).await;
    let frame = stream.frame().await;
    assert_eq!(frame.len(), 1, "{frame:?}");
    assert_eq!(frame[0].name, "next");
    stream.answer(&[(frame[0].id, None)]);
    assert_eq!(answer_of(next).await, fleet_says(Outcome::Ok));
}
