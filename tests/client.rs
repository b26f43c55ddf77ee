//! The edge client crate (`client/`, `ankusa-fleet-client`) against real fleets: the whole
//! API over TCP, many concurrent hits on one stream each getting its own answer, `hit_many`
//! answering in the order asked, a frozen node answered for by the deadline, and the node's
//! Unix socket (`api_socket`).
//!
//! And against a fake node (`fake`) that hands each `HitBatch` stream to the test, which
//! answers its frames as it likes: how hits are gathered into frames, matched by id, given
//! up at their deadlines, and failed when the stream breaks.

mod common;

use std::time::Duration;

use ankusa_fleet_client::{pb, Client, DecidedBy, Error, Options, Outcome, SettleStatus, Target};
use common::*;

const TENANT: &str = "acme";
/// Long enough for a loaded machine's fleet; the deadline tests use their own.
const DEADLINE_MS: u32 = 10_000;

fn client_of(fleet: &Fleet, id: u64) -> Client {
    Client::connect(Target::Tcp(fleet.api_addr(id)), Options::default()).expect("a client")
}

fn claim_hit(key: &str, hook_id: &str) -> pb::HitRequest {
    pb::HitRequest {
        claim: Some(pb::Claim {
            tenant: TENANT.into(),
            source_id: "stripe".into(),
            key: key.into(),
            hook_id: hook_id.into(),
            ttl_ms: 3_600_000,
            pending_ttl_ms: 60_000,
        }),
        timeout_ms: DEADLINE_MS,
        ..Default::default()
    }
}

fn budget_hit(tenant: &str, capacity: u64) -> pb::HitRequest {
    pb::HitRequest {
        charges: vec![pb::Charge {
            kind: pb::Kind::Hooks as i32,
            tenant: tenant.into(),
            increment_us: 3_600_000_000,
            capacity_us: capacity * 3_600_000_000,
        }],
        timeout_ms: DEADLINE_MS,
        ..Default::default()
    }
}

fn settle(key: &str, hook_id: &str, outcome: pb::SettleOutcome) -> pb::SettleRequest {
    pb::SettleRequest {
        tenant: TENANT.into(),
        source_id: "stripe".into(),
        key: key.into(),
        hook_id: hook_id.into(),
        outcome: outcome as i32,
        timeout_ms: DEADLINE_MS,
        ..Default::default()
    }
}

fn fleet_says(outcome: Outcome) -> Result<ankusa_fleet_client::Decision, Error> {
    Ok(ankusa_fleet_client::Decision {
        outcome,
        decided_by: DecidedBy::Fleet,
    })
}

/// Claim, commit, duplicate, pending, conflict, rate limited, check_rate and reset, each
/// answered as the contract says, through a follower.
async fn the_whole_api(client: &Client) {
    assert_eq!(
        client.hit(claim_hit("k1", "h1")).await,
        fleet_says(Outcome::Ok)
    );
    let settled = client
        .settle(settle("k1", "h1", pb::SettleOutcome::Commit))
        .await
        .expect("settled");
    assert_eq!(
        (settled.status, settled.decided_by),
        (SettleStatus::Settled, DecidedBy::Fleet)
    );
    assert_eq!(
        client.hit(claim_hit("k1", "h2")).await,
        fleet_says(Outcome::Duplicate {
            hook_id: "h1".into()
        })
    );

    assert_eq!(
        client.hit(claim_hit("k2", "h3")).await,
        fleet_says(Outcome::Ok)
    );
    let pending = client.hit(claim_hit("k2", "h4")).await.expect("answered");
    assert!(
        matches!(pending.outcome, Outcome::Pending { retry_after } if retry_after > Duration::ZERO),
        "{pending:?}"
    );
    let conflict = client
        .settle(settle("k2", "h4", pb::SettleOutcome::Commit))
        .await
        .expect("answered");
    assert_eq!(
        conflict.status,
        SettleStatus::Conflict {
            holder_hook_id: "h3".into()
        }
    );

    for _ in 0..2 {
        assert_eq!(
            client.hit(budget_hit("two", 2)).await,
            fleet_says(Outcome::Ok)
        );
    }
    let limited = client.hit(budget_hit("two", 2)).await.expect("answered");
    assert!(
        matches!(limited.outcome, Outcome::RateLimited { retry_after } if retry_after > Duration::ZERO),
        "{limited:?}"
    );
    client
        .reset(pb::ResetRequest {
            tenant: "two".into(),
            timeout_ms: DEADLINE_MS,
        })
        .await
        .expect("reset");
    assert_eq!(
        client.hit(budget_hit("two", 2)).await,
        fleet_says(Outcome::Ok)
    );

    let check = |limit| pb::CheckRateRequest {
        entity_id: "user-1".into(),
        operation: "login".into(),
        limit,
        window_ms: 3_600_000,
        timeout_ms: DEADLINE_MS,
        ..Default::default()
    };
    assert_eq!(client.check_rate(check(1)).await, fleet_says(Outcome::Ok));
    let refused = client.check_rate(check(1)).await.expect("answered");
    assert!(
        matches!(refused.outcome, Outcome::RateLimited { .. }),
        "{refused:?}"
    );

    let status = client.status().await.expect("status");
    assert_ne!(status.leader_id, 0, "{status:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_speaks_the_whole_api_over_tcp() {
    init_tracing();
    let fleet = Fleet::start(3, "").await;
    let leader = fleet.wait_for_leader(&[1, 2, 3]).await;
    let follower = (1..=3).find(|id| *id != leader).expect("a follower");
    the_whole_api(&client_of(&fleet, follower)).await;

    tracing::info!("--- a request the node refuses is an error value naming the field");
    let mut bad = claim_hit("k3", "h5");
    bad.claim.as_mut().expect("claim").tenant.clear();
    let refused = client_of(&fleet, follower).hit(bad).await;
    assert!(
        matches!(&refused, Err(Error::InvalidArgument(message)) if message.contains("tenant")),
        "{refused:?}"
    );
}

/// Hundreds of hits at once from clones of one client, over one stream: each answer is its
/// own hit's (committed keys answer with their own holder, new keys are allowed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_hits_on_one_stream_each_get_their_own_answer() {
    init_tracing();
    let fleet = Fleet::start(3, "").await;
    fleet.wait_for_leader(&[1, 2, 3]).await;
    let client = client_of(&fleet, 1);
    let committed = keys("held", 40);
    fleet.commit_claims(&[1, 2, 3], TENANT, &committed, 8).await;

    let mut calls = tokio::task::JoinSet::new();
    for round in 0..5 {
        for (i, key) in committed.iter().enumerate() {
            let client = client.clone();
            let (key, fresh) = (key.clone(), format!("fresh-{round}-{i}"));
            calls.spawn(async move {
                let probe = client.hit(claim_hit(&key, "another")).await;
                let new = client.hit(claim_hit(&fresh, "mine")).await;
                (key, probe, new)
            });
        }
    }
    let mut answered = 0;
    while let Some(joined) = calls.join_next().await {
        let (key, probe, new) = joined.expect("a call task");
        assert_eq!(
            probe,
            fleet_says(Outcome::Duplicate {
                hook_id: hook_of(&key)
            }),
            "the probe of {key}"
        );
        assert_eq!(new, fleet_says(Outcome::Ok), "a fresh key after {key}");
        answered += 2;
    }
    assert_eq!(answered, 5 * 2 * committed.len());
}

/// A frozen node (SIGSTOP) answers nothing: the client's hit and settle end at their
/// deadline as timeouts; once the node runs again, the same client is answered, each hit
/// with its own answer although the frozen one's late reply comes first on the stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_node_is_a_timeout_by_the_deadline_not_a_hang() {
    init_tracing();
    let mut fleet = Fleet::start(3, "").await;
    let leader = fleet.wait_for_leader(&[1, 2, 3]).await;
    let id = (1..=3).find(|id| *id != leader).expect("a follower");
    let client = client_of(&fleet, id);
    assert_eq!(
        client.hit(claim_hit("held", "h1")).await,
        fleet_says(Outcome::Ok)
    );
    let committed = client
        .settle(settle("held", "h1", pb::SettleOutcome::Commit))
        .await;
    assert_eq!(committed.map(|s| s.status), Ok(SettleStatus::Settled));
    assert_eq!(
        client.hit(claim_hit("open", "h5")).await,
        fleet_says(Outcome::Ok)
    );

    fleet.pause(id);
    let deadline = Duration::from_millis(300);
    // Its late reply would be `duplicate h1`: were it handed to the next hit, that hit
    // would not see `allowed`.
    let mut frozen = claim_hit("held", "h2");
    frozen.timeout_ms = 300;
    let mut settle_frozen = settle("open", "h5", pb::SettleOutcome::Commit);
    settle_frozen.timeout_ms = 300;
    let outer = CONDITION_DEADLINE;
    let hit = tokio::time::timeout(outer, client.hit(frozen)).await;
    let settled = tokio::time::timeout(outer, client.settle(settle_frozen)).await;
    fleet.resume(id);
    assert_eq!(
        hit.expect("the hit returned"),
        Err(Error::Timeout(deadline))
    );
    assert_eq!(
        settled.expect("the settle returned"),
        Err(Error::Timeout(deadline))
    );

    assert_eq!(
        client.hit(claim_hit("after", "h3")).await,
        fleet_says(Outcome::Ok)
    );
    // The settle that timed out may or may not have been carried out once the node ran
    // again: `open` is h5's, pending or committed, and never anyone else's.
    let probe = client.hit(claim_hit("open", "h4")).await.expect("answered");
    assert!(
        matches!(&probe.outcome, Outcome::Pending { .. })
            || probe.outcome
                == Outcome::Duplicate {
                    hook_id: "h5".into()
                },
        "{probe:?}"
    );
}

/// A node with `api_socket` serves the edge API there too, without TLS: the client speaks
/// all of it over the socket. The file is `0660`, gone after a drain, and a file left by a
/// kill -9 is replaced when the node starts again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_unix_socket_serves_the_edge_api() {
    use std::os::unix::fs::PermissionsExt;
    init_tracing();
    let sockets = tempfile::tempdir().expect("tempdir");
    let socket = sockets.path().join("run").join("api.sock");
    let mut fleet = Fleet::start(
        1,
        &format!("api_socket = {:?}", socket.display().to_string()),
    )
    .await;
    fleet.wait_for_leader(&[1]).await;
    let client =
        Client::connect(Target::Unix(socket.clone()), Options::default()).expect("a client");
    the_whole_api(&client).await;
    let mode = std::fs::metadata(&socket)
        .expect("the socket file")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o660, "the socket's mode: {mode:o}");

    tracing::info!("--- a drain removes the socket file");
    fleet.stop(1).await;
    assert!(
        !socket.exists(),
        "{} is left after a drain",
        socket.display()
    );
    let down = client.hit(claim_hit("k9", "h9")).await;
    assert!(matches!(down, Err(Error::Unavailable(_))), "{down:?}");

    tracing::info!("--- a kill -9 leaves the file; the restarted node replaces it");
    fleet.restart(1);
    fleet.wait_for_leader(&[1]).await;
    fleet.kill(1);
    assert!(socket.exists(), "kill -9 removes nothing");
    fleet.restart(1);
    fleet.wait_for_leader(&[1]).await;
    let again = fleet
        .wait_for("the socket answers again", || async {
            client.hit(claim_hit("k1", "h7")).await.ok()
        })
        .await;
    assert_eq!(
        again,
        ankusa_fleet_client::Decision {
            outcome: Outcome::Duplicate {
                hook_id: "h1".into()
            },
            decided_by: DecidedBy::Fleet
        }
    );
}

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

fn fake_client(addr: String) -> Client {
    Client::connect(Target::Tcp(addr), Options::default()).expect("a client")
}

/// With nothing in flight a hit leaves at once in a frame of its own (its deadline is far
/// off, so no gather timer sends it); while a frame is in flight, the hits of 64 clones
/// gather, and all leave in the one frame after it, each answered with its own answer.
#[tokio::test]
async fn a_lone_hit_leaves_alone_and_hits_of_many_clones_share_the_next_frame() {
    init_tracing();
    let (addr, mut opened) = fake::start().await;
    let client = fake_client(addr);
    let calls = Calls::default();

    tracing::info!("--- a lone hit: a frame of its own, answered");
    let lone = calls.hit(&client, "lone", FAR_MS);
    let mut stream = fake::next_stream(&mut opened).await;
    let frame = stream.frame().await;
    assert_eq!(frame.len(), 1, "{frame:?}");
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
    let mut names: Vec<&str> = next.iter().map(|hit| hit.name.as_str()).collect();
    names.sort_unstable();
    let mut expected: Vec<String> = (0..64).map(|i| format!("clone-{i}")).collect();
    expected.sort_unstable();
    assert_eq!(names, expected, "the frame after the one in flight");

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
    let (addr, mut opened) = fake::start().await;
    let client = fake_client(addr);
    let calls = Calls::default();
    let held = calls.hit(&client, "held", 300);
    let mut stream = fake::next_stream(&mut opened).await;
    let held_frame = stream.frame().await;
    assert_eq!(held_frame.len(), 1, "{held_frame:?}");
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
    let (addr, mut opened) = fake::start().await;
    let client = fake_client(addr);
    let calls = Calls::default();
    let _held = calls.hit(&client, "held", FAR_MS);
    let mut stream = fake::next_stream(&mut opened).await;
    let held_frame = stream.frame().await;
    assert_eq!(held_frame.len(), 1, "{held_frame:?}");

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

/// `hit_many` through a follower: 1500 hits (two frames: the node takes at most 1024 in
/// one), answered in the order asked. Committed keys are probed at known places (each
/// answered with its own holder), and one hit without a tenant is refused on its own
/// while the rest are decided.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hit_many_answers_in_the_order_asked() {
    init_tracing();
    let fleet = Fleet::start(3, "").await;
    let leader = fleet.wait_for_leader(&[1, 2, 3]).await;
    let follower = (1..=3).find(|id| *id != leader).expect("a follower");
    let committed = keys("held", 15);
    fleet.commit_claims(&[1, 2, 3], TENANT, &committed, 8).await;

    const HITS: usize = 1500;
    const INVALID: usize = 1100;
    let probe_at = |i: usize| (i % 100 == 7).then(|| committed[i / 100].clone());
    let hits: Vec<pb::HitRequest> = (0..HITS)
        .map(|i| match probe_at(i) {
            Some(key) => claim_hit(&key, "another"),
            None if i == INVALID => {
                let mut bad = claim_hit("no-tenant", "h");
                bad.claim.as_mut().expect("claim").tenant.clear();
                bad
            }
            None => claim_hit(&format!("fresh-{i}"), "mine"),
        })
        .collect();
    let answers = client_of(&fleet, follower).hit_many(hits).await;
    assert_eq!(answers.len(), HITS);
    for (i, answer) in answers.into_iter().enumerate() {
        match probe_at(i) {
            Some(key) => assert_eq!(
                answer,
                fleet_says(Outcome::Duplicate {
                    hook_id: hook_of(&key)
                }),
                "hit {i}, a probe of {key}"
            ),
            None if i == INVALID => assert!(
                matches!(&answer, Err(Error::InvalidArgument(message)) if message.contains("tenant")),
                "hit {i}: {answer:?}"
            ),
            None => assert_eq!(answer, fleet_says(Outcome::Ok), "hit {i}, a fresh key"),
        }
    }
}
