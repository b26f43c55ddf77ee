//! The peer transport against a stub `Peer` server on loopback: which path a call takes,
//! that answers find their calls, and what a broken stream means for a call in flight.

use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::Stream;
use tokio::net::TcpListener;
use tokio_stream::wrappers::{TcpListenerStream, UnboundedReceiverStream};
use tonic::{Request, Response, Status, Streaming};

use super::*;
use crate::pb::internal::peer_server::{Peer, PeerServer};
use crate::raft::durability::network::tests::append;

/// How the stub serves `Exchange`.
#[derive(Clone, Copy)]
enum Mode {
    /// Answers every frame with its payload behind `stream:`, the later calls first.
    Streams,
    /// Like a build without `Exchange`: `UNIMPLEMENTED`.
    UnaryOnly,
    /// Takes the first frame, then breaks the stream without answering it.
    HangUp,
    /// Answers every frame as a follower that accepts every `AppendEntries`.
    Accepts,
}

#[derive(Clone)]
struct Stub {
    mode: Mode,
    streams_opened: Arc<AtomicUsize>,
    unary_calls: Arc<AtomicUsize>,
    frames: Arc<AtomicUsize>,
    /// `Accepts`: each `AppendEntries` taken, as (index it starts after, entry count).
    appends: Arc<std::sync::Mutex<Vec<(u64, usize)>>>,
}

impl Stub {
    fn unary(&self, request: Request<RaftMessage>) -> Result<Response<RaftMessage>, Status> {
        self.unary_calls.fetch_add(1, Ordering::SeqCst);
        let mut payload = b"unary:".to_vec();
        payload.extend(request.into_inner().payload);
        Ok(Response::new(RaftMessage {
            payload,
            ..RaftMessage::default()
        }))
    }
}

type Frames = Pin<Box<dyn Stream<Item = Result<PeerFrame, Status>> + Send>>;

#[tonic::async_trait]
impl Peer for Stub {
    async fn append_entries(
        &self,
        request: Request<RaftMessage>,
    ) -> Result<Response<RaftMessage>, Status> {
        self.unary(request)
    }
    async fn vote(&self, request: Request<RaftMessage>) -> Result<Response<RaftMessage>, Status> {
        self.unary(request)
    }
    async fn install_snapshot(
        &self,
        request: Request<RaftMessage>,
    ) -> Result<Response<RaftMessage>, Status> {
        self.unary(request)
    }
    async fn propose(
        &self,
        request: Request<RaftMessage>,
    ) -> Result<Response<RaftMessage>, Status> {
        self.unary(request)
    }

    type ExchangeStream = Frames;

    async fn exchange(
        &self,
        request: Request<Streaming<PeerFrame>>,
    ) -> Result<Response<Frames>, Status> {
        let mut calls = request.into_inner();
        match self.mode {
            Mode::UnaryOnly => Err(Status::unimplemented("no Exchange here")),
            Mode::HangUp => {
                self.streams_opened.fetch_add(1, Ordering::SeqCst);
                let broken = async move {
                    let _first = calls.message().await;
                    Err(Status::aborted("stub hung up"))
                };
                Ok(Response::new(Box::pin(futures::stream::once(broken))))
            }
            Mode::Accepts => {
                let (answers, outbound) = mpsc::unbounded_channel();
                let (frames, appends) = (Arc::clone(&self.frames), Arc::clone(&self.appends));
                tokio::spawn(async move {
                    while let Ok(Some(frame)) = calls.message().await {
                        let request: AppendEntriesRequest<TypeConfig> =
                            codec::decode(&frame.payload).expect("an AppendEntries");
                        let prev = request.prev_log_id.map_or(0, |id| id.index);
                        let taken = (prev, request.entries.len());
                        appends.lock().expect("appends").push(taken);
                        frames.fetch_add(1, Ordering::SeqCst);
                        let accepted: Result<AppendEntriesResponse<NodeId>, RaftError<NodeId>> =
                            Ok(AppendEntriesResponse::Success);
                        let _ = answers.send(Ok(PeerFrame {
                            call_id: frame.call_id,
                            payload: codec::encode(&accepted).expect("encode"),
                            ..PeerFrame::default()
                        }));
                    }
                });
                Ok(Response::new(Box::pin(UnboundedReceiverStream::new(
                    outbound,
                ))))
            }
            Mode::Streams => {
                self.streams_opened.fetch_add(1, Ordering::SeqCst);
                let (answers, outbound) = mpsc::unbounded_channel();
                tokio::spawn(async move {
                    while let Ok(Some(frame)) = calls.message().await {
                        let answers = answers.clone();
                        tokio::spawn(async move {
                            // Payload n waits (10 - n) ms: later calls are answered first.
                            let n = u64::from(frame.payload.first().copied().unwrap_or(0));
                            tokio::time::sleep(Duration::from_millis(10u64.saturating_sub(n)))
                                .await;
                            let mut payload = b"stream:".to_vec();
                            payload.extend(frame.payload);
                            let _ = answers.send(Ok(PeerFrame {
                                call_id: frame.call_id,
                                payload,
                                ..PeerFrame::default()
                            }));
                        });
                    }
                });
                Ok(Response::new(Box::pin(UnboundedReceiverStream::new(
                    outbound,
                ))))
            }
        }
    }
}

/// Serves a stub on a free loopback port; returns it and its address.
async fn serve(mode: Mode) -> (Stub, String) {
    let stub = Stub {
        mode,
        streams_opened: Arc::default(),
        unary_calls: Arc::default(),
        frames: Arc::default(),
        appends: Arc::default(),
    };
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr").to_string();
    let service = PeerServer::new(stub.clone());
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming(TcpListenerStream::new(listener)),
    );
    (stub, addr)
}

fn clients() -> PeerClients {
    PeerClients::new("test-cluster", 1, Faults::new(false))
}

const DEADLINE: Duration = Duration::from_secs(10);

#[tokio::test]
async fn concurrent_calls_share_one_stream_and_each_gets_its_own_answer() {
    let (stub, addr) = serve(Mode::Streams).await;
    let clients = clients();
    let calls = (0..10u8).map(|n| {
        let clients = clients.clone();
        let addr = addr.clone();
        async move {
            let answer = clients
                .call_raw(2, &addr, PeerMethod::Propose, vec![n, 7], DEADLINE, None)
                .await
                .expect("answered");
            (n, answer)
        }
    });
    let answers = futures::future::join_all(calls).await;
    for (n, answer) in answers {
        assert_eq!(answer, [b"stream:".as_slice(), &[n, 7]].concat());
    }
    assert_eq!(stub.streams_opened.load(Ordering::SeqCst), 1);
    assert_eq!(stub.unary_calls.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn install_snapshot_stays_unary() {
    let (stub, addr) = serve(Mode::Streams).await;
    let answer = clients()
        .call_raw(
            2,
            &addr,
            PeerMethod::InstallSnapshot,
            vec![1],
            DEADLINE,
            None,
        )
        .await
        .expect("answered");
    assert_eq!(answer, b"unary:\x01");
    assert_eq!(stub.streams_opened.load(Ordering::SeqCst), 0);
}

/// Raft messages other than InstallSnapshot travel only on the Exchange stream: a peer
/// that refuses it is unreachable, and nothing falls back to unary calls.
#[tokio::test]
async fn a_peer_without_exchange_is_unreachable_and_never_called_unary() {
    let (stub, addr) = serve(Mode::UnaryOnly).await;
    let clients = clients();
    for n in 0..3u8 {
        let error = clients
            .call_raw(2, &addr, PeerMethod::AppendEntries, vec![n], DEADLINE, None)
            .await
            .expect_err("no stream, no call");
        assert!(matches!(error, PeerError::Unreachable { .. }), "{error}");
    }
    assert_eq!(stub.unary_calls.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn a_call_whose_stream_breaks_is_lost_not_undelivered_and_the_next_call_reopens() {
    let (stub, addr) = serve(Mode::HangUp).await;
    let clients = clients();
    let error = clients
        .call_raw(2, &addr, PeerMethod::Propose, vec![1], DEADLINE, None)
        .await
        .expect_err("the stub never answers");
    assert!(
        matches!(error, PeerError::Lost { .. }),
        "unexpected error: {error}"
    );
    // The batch may have been applied: a follower must not resend it.
    assert!(!error.surely_not_delivered());
    let again = clients
        .call_raw(2, &addr, PeerMethod::Propose, vec![2], DEADLINE, None)
        .await
        .expect_err("the stub never answers");
    assert!(matches!(again, PeerError::Lost { .. }), "{again}");
    assert_eq!(stub.streams_opened.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn a_peer_that_is_not_listening_is_unreachable() {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr").to_string();
    drop(listener);
    let error = clients()
        .call_raw(2, &addr, PeerMethod::Vote, vec![1], DEADLINE, None)
        .await
        .expect_err("nobody listens");
    assert!(error.surely_not_delivered(), "unexpected error: {error}");
}

#[tokio::test]
async fn an_unanswered_call_times_out_and_is_forgotten() {
    let (_stub, addr) = serve(Mode::Streams).await;
    let clients = clients();
    let opened = clients
        .call_raw(2, &addr, PeerMethod::Propose, vec![9], DEADLINE, None)
        .await
        .expect("answered");
    assert_eq!(opened, b"stream:\x09");
    // Payload 0 is answered after 10 ms; a 1 ms deadline passes first.
    let error = clients
        .call_raw(
            2,
            &addr,
            PeerMethod::Propose,
            vec![0],
            Duration::from_millis(1),
            None,
        )
        .await
        .expect_err("deadline first");
    assert!(matches!(error, PeerError::Timeout { .. }), "{error}");
    let slot = lock(&clients.links).get(&addr).cloned().expect("a link");
    let Some(stream) = slot.lock().await.clone() else {
        panic!("calls went over a stream");
    };
    assert!(
        lock(&stream.waiting).calls.is_empty(),
        "the timed-out call is forgotten"
    );
    // Its late answer finds nobody waiting and the stream goes on serving.
    let answer = clients
        .call_raw(2, &addr, PeerMethod::Propose, vec![8], DEADLINE, None)
        .await
        .expect("answered");
    assert_eq!(answer, b"stream:\x08");
}

/// Sends `append(term, prev, entries)` through `peer` and expects it accepted.
async fn append_ok(peer: &mut PeerConnection, term: u64, prev: u64, entries: &[u64]) {
    let response = peer
        .append_entries(append(term, prev, entries), RPCOption::new(DEADLINE))
        .await;
    assert!(
        matches!(response, Ok(AppendEntriesResponse::Success)),
        "{response:?}"
    );
}

/// A stub follower that accepts every `AppendEntries`, and its address as a member.
async fn accepting_follower() -> (Stub, MemberNode) {
    let (stub, addr) = serve(Mode::Accepts).await;
    let node = MemberNode {
        api_addr: String::new(),
        raft_addr: addr,
    };
    (stub, node)
}

/// The plain transport sends every `AppendEntries` as it is, a commit-only one included:
/// answering those here is `raft::durability::network`'s, around it.
#[tokio::test]
async fn every_append_goes_out_as_it_is() {
    let (stub, node) = accepting_follower().await;
    let mut peer = clients().new_client(2, &node).await;
    append_ok(&mut peer, 1, 4, &[5, 6]).await;
    append_ok(&mut peer, 1, 6, &[]).await;
    assert_eq!(stub.frames.load(Ordering::SeqCst), 2);
    assert_eq!(
        *stub.appends.lock().expect("appends"),
        vec![(4, 2), (6, 0)],
        "(prev index, entries) as sent"
    );
}

#[test]
fn an_append_too_large_for_one_message_asks_openraft_for_fewer_entries() {
    use crate::state::{
        ClaimKey, Command, FleetRequest, HookId, SettleOutcome, SourceId, TenantId,
    };
    let big = "k".repeat(1024);
    let command = Command::Settle {
        key: ClaimKey {
            tenant: TenantId::from(big.as_str()),
            source_id: SourceId::from(big.as_str()),
            key: big.as_str().into(),
        },
        hook_id: HookId::from(big.as_str()),
        outcome: SettleOutcome::Commit,
        ttl_ms: 1,
        node: 1,
    };
    let encoded = crate::state::EncodedCommand::encode(&command).expect("encode");
    let entry = |index: u64, commands: usize| crate::raft::Entry {
        log_id: openraft::LogId::new(openraft::CommittedLeaderId::new(1, 1), index),
        payload: openraft::EntryPayload::Normal(FleetRequest {
            now_us: 1,
            limits: crate::state::StateLimits::UNLIMITED,
            commands: std::sync::Arc::from(vec![encoded.clone(); commands]),
        }),
    };
    let request = |entries| AppendEntriesRequest::<TypeConfig> {
        vote: openraft::Vote::new_committed(1, 1),
        prev_log_id: None,
        entries,
        leader_commit: None,
    };
    // 40 entries of 512 four-KiB commands: about 80 MiB, past one message.
    let large = request((1..=40).map(|i| entry(i, 512)).collect());
    let hint = super::too_large(&large).expect("too large for one message");
    assert!(hint.to_string().contains("20"), "{hint}");
    // A handful of small entries is sent as it is, without a second encoding.
    assert!(super::too_large(&request((1..=5).map(|i| entry(i, 3)).collect())).is_none());
    // One entry is never split (it cannot be): batch_commands_max keeps it within bounds.
    assert!(super::too_large(&request(vec![entry(1, 2_048)])).is_none());
}
