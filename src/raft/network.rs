//! Outgoing Raft traffic over tonic: openraft's `RaftNetwork` for append/vote/snapshot,
//! plus [`PeerClients`] for a follower handing proposals to the leader.
//!
//! Every call has a deadline (openraft's `hard_ttl`, or the proposal's remaining time).
//! Payloads are encoded by `crate::codec`; gRPC only carries bytes and the cluster id.
//!
//! AppendEntries, Vote and Propose travel as frames on one long-lived `Peer/Exchange`
//! stream per peer (`PeerStream`), matched to their answers by call id: a Raft message
//! then costs one HTTP/2 DATA frame each way instead of a new stream with headers and a
//! server task. InstallSnapshot (large chunks) stays a unary call. A stream that breaks is replaced on the next
//! call; calls still waiting on it fail as [`PeerError::Lost`] (maybe delivered).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use openraft::error::{
    InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, Unreachable,
};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::transport::{Channel, ClientTlsConfig};
use tonic::{Status, Streaming};

use super::clock_view::ClockView;
use super::faults::{Fault, Faults};
use super::{MemberNode, NodeId, ProposeRequest, ProposeResponse, TypeConfig};
use crate::clock::wall_clock_us;
use crate::codec;
use crate::limits::{APPEND_ENTRIES_BYTES_MAX, COMMAND_BYTES_MAX, PEER_MESSAGE_BYTES_MAX};
use crate::lock::lock;
use crate::pb::internal::peer_client::PeerClient;
use crate::pb::internal::{PeerFrame, PeerMethod, RaftMessage};
use crate::state::EncodedCommand;

/// How long to wait for a TCP connection to a peer before calling it unreachable.
const CONNECT_TIMEOUT: Duration = Duration::from_millis(500);
/// HTTP/2 pings on peer connections, and how long an unanswered one may wait.
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(1);
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(3);
/// A transport failure talking to a peer (its answer, if any, is unknown).
#[derive(Debug, thiserror::Error)]
pub enum PeerError {
    #[error("peer {addr} unreachable: {reason}")]
    Unreachable { addr: String, reason: String },
    #[error("peer {addr} did not answer within {timeout:?}")]
    Timeout { addr: String, timeout: Duration },
    #[error("peer {addr} refused the call: {reason}")]
    Refused { addr: String, reason: String },
    #[error("peer {addr} sent an unreadable answer: {reason}")]
    Garbled { addr: String, reason: String },
    #[error("connection to peer {addr} broke before it answered (the call may have taken effect): {reason}")]
    Lost { addr: String, reason: String },
}

impl PeerError {
    /// True when the request surely never reached the peer, so resending cannot apply it twice.
    pub fn surely_not_delivered(&self) -> bool {
        matches!(self, PeerError::Unreachable { .. })
    }
}

/// Cached gRPC channels to peers, and one `Exchange` stream per peer, by raft address
/// (tonic channels reconnect by themselves; a broken stream is reopened on the next call).
#[derive(Clone)]
pub struct PeerClients {
    cluster_id: Arc<str>,
    from_node_id: NodeId,
    faults: Faults,
    channels: Arc<Mutex<HashMap<String, PeerClient<Channel>>>>,
    links: Arc<Mutex<HashMap<String, LinkSlot>>>,
    /// `[peer_tls]`'s client side; plaintext when `None` (loopback fleets, tests).
    tls: Option<ClientTlsConfig>,
    /// Where the peers' clocks read from answers go, and what each call tells its receiver
    /// of its offset; none: frames carry no clock.
    clock: Option<ClockView>,
}

/// The stream to one peer, once open; callers wait on it while a stream is being opened,
/// so concurrent first calls share one stream.
type LinkSlot = Arc<tokio::sync::Mutex<Option<Arc<PeerStream>>>>;

/// The answer to one frame: the encoded payload, or the status the peer refused it with;
/// and the peer's wall clock as it answered (0: none).
type FrameAnswer = (Result<Vec<u8>, Status>, u64);

/// The calls waiting on one stream.
#[derive(Default)]
struct Waiting {
    next_call_id: u64,
    calls: HashMap<u64, oneshot::Sender<FrameAnswer>>,
    /// Why the stream ended, once it has: no call is registered after that.
    ended: Option<String>,
}

/// One open `Peer/Exchange` stream: frames go out through `frames`, answers come back on a
/// task that completes the waiting call with the same id.
struct PeerStream {
    frames: mpsc::UnboundedSender<PeerFrame>,
    waiting: Arc<Mutex<Waiting>>,
}

impl PeerStream {
    /// Starts the task that reads `answers` until the stream ends, then fails every call
    /// still waiting (dropping its sender) and refuses new ones.
    fn start(
        frames: mpsc::UnboundedSender<PeerFrame>,
        waiting: Arc<Mutex<Waiting>>,
        mut answers: Streaming<PeerFrame>,
    ) -> Self {
        let reader = waiting.clone();
        tokio::spawn(async move {
            let reason = loop {
                match answers.message().await {
                    Ok(Some(answer)) => {
                        let call = lock(&reader).calls.remove(&answer.call_id);
                        if let Some(call) = call {
                            let _ = call.send(frame_answer(answer));
                        }
                    }
                    Ok(None) => break "the peer closed the stream".to_owned(),
                    Err(status) => break status.message().to_owned(),
                }
            };
            let mut waiting = lock(&reader);
            waiting.ended = Some(reason);
            waiting.calls.clear();
        });
        Self { frames, waiting }
    }

    fn ended(&self) -> bool {
        lock(&self.waiting).ended.is_some()
    }

    /// Sends one call and waits for its answer. A call that never left (the stream had
    /// ended) is `Err(None)`; one whose answer was lost with the stream is `Err(Some(_))`.
    /// `sent` is dropped once the frame is queued on the stream (or surely never will be).
    async fn call(
        &self,
        mut frame: PeerFrame,
        sent: Option<oneshot::Sender<()>>,
    ) -> Result<FrameAnswer, Option<String>> {
        let (answer, answered) = oneshot::channel();
        let call_id = {
            let mut waiting = lock(&self.waiting);
            if waiting.ended.is_some() {
                return Err(None);
            }
            waiting.next_call_id += 1;
            let call_id = waiting.next_call_id;
            waiting.calls.insert(call_id, answer);
            call_id
        };
        // Forgets the call if this future is dropped (its deadline passed) before the answer.
        let _forget = Forget {
            waiting: &self.waiting,
            call_id,
        };
        frame.call_id = call_id;
        let queued = self.frames.send(frame);
        drop(sent);
        if queued.is_err() {
            return Err(None);
        }
        answered.await.map_err(|_| {
            let waiting = lock(&self.waiting);
            Some(waiting.ended.clone().unwrap_or_default())
        })
    }
}

/// Removes a call from the waiting map when its caller stops waiting.
struct Forget<'a> {
    waiting: &'a Mutex<Waiting>,
    call_id: u64,
}

impl Drop for Forget<'_> {
    fn drop(&mut self) {
        lock(self.waiting).calls.remove(&self.call_id);
    }
}

fn frame_answer(frame: PeerFrame) -> FrameAnswer {
    let result = if frame.error_code == 0 {
        Ok(frame.payload)
    } else {
        Err(Status::new(
            tonic::Code::from_i32(frame.error_code),
            frame.error_message,
        ))
    };
    (result, frame.wall_clock_us)
}

/// A refusal from the peer, as the caller sees it: `UNAVAILABLE` means it did not take the
/// call (surely not applied), anything else is a refusal with a reason.
fn refused(addr: String, status: &Status) -> PeerError {
    if status.code() == tonic::Code::Unavailable {
        PeerError::Unreachable {
            addr,
            reason: status.message().to_owned(),
        }
    } else {
        PeerError::Refused {
            addr,
            reason: format!("{:?}: {}", status.code(), status.message()),
        }
    }
}

impl PeerClients {
    /// Clients that stamp `cluster_id` and our id on every call; `faults` are consulted
    /// before each call (see [`Faults`]).
    pub fn new(cluster_id: &str, from_node_id: NodeId, faults: Faults) -> Self {
        Self {
            cluster_id: Arc::from(cluster_id),
            from_node_id,
            faults,
            channels: Arc::new(Mutex::new(HashMap::new())),
            links: Arc::new(Mutex::new(HashMap::new())),
            tls: None,
            clock: None,
        }
    }

    /// Stamps every call with this node's wall clock and reads the peers' from the answers
    /// into `clock`.
    pub fn with_clock(mut self, clock: ClockView) -> Self {
        self.clock = Some(clock);
        self
    }

    /// Calls peers over mutual TLS (`[peer_tls]`), or plaintext with `None`.
    pub fn with_tls(mut self, tls: Option<ClientTlsConfig>) -> Self {
        self.tls = tls;
        self
    }

    fn client(&self, raft_addr: &str) -> Result<PeerClient<Channel>, PeerError> {
        let mut channels = lock(&self.channels);
        if let Some(client) = channels.get(raft_addr) {
            return Ok(client.clone());
        }
        let endpoint = crate::tls::endpoint(raft_addr, self.tls.as_ref())
            .map_err(|e| PeerError::Unreachable {
                addr: raft_addr.to_owned(),
                reason: e.to_string(),
            })?
            .connect_timeout(CONNECT_TIMEOUT)
            .tcp_nodelay(true)
            // A peer that vanished without closing the connection (power loss, partition)
            // must end the Exchange stream, so the next call opens a new one.
            .http2_keep_alive_interval(KEEPALIVE_INTERVAL)
            .keep_alive_timeout(KEEPALIVE_TIMEOUT)
            .keep_alive_while_idle(true);
        let client = PeerClient::new(endpoint.connect_lazy())
            .max_decoding_message_size(PEER_MESSAGE_BYTES_MAX)
            .max_encoding_message_size(PEER_MESSAGE_BYTES_MAX);
        channels.insert(raft_addr.to_owned(), client.clone());
        Ok(client)
    }

    /// The stream to `raft_addr`: the open one, or a newly opened one (a stream that ended
    /// is replaced).
    async fn link(&self, raft_addr: &str) -> Result<Arc<PeerStream>, PeerError> {
        let slot = lock(&self.links)
            .entry(raft_addr.to_owned())
            .or_default()
            .clone();
        let mut link = slot.lock().await;
        match &*link {
            Some(stream) if !stream.ended() => return Ok(Arc::clone(stream)),
            _ => {}
        }
        let mut client = self.client(raft_addr)?;
        let (frames, outgoing) = mpsc::unbounded_channel();
        let waiting = Arc::new(Mutex::new(Waiting::default()));
        // A frame whose caller gave up (its deadline passed while the connection was slow)
        // is not sent late: only frames someone still waits for leave.
        let still_waited_for = Arc::clone(&waiting);
        let outgoing = UnboundedReceiverStream::new(outgoing).filter(move |frame: &PeerFrame| {
            let wanted = lock(&still_waited_for).calls.contains_key(&frame.call_id);
            std::future::ready(wanted)
        });
        let opened = match client.exchange(outgoing).await {
            Ok(answers) => Arc::new(PeerStream::start(frames, waiting, answers.into_inner())),
            Err(status) => {
                return Err(PeerError::Unreachable {
                    addr: raft_addr.to_owned(),
                    reason: status.message().to_owned(),
                })
            }
        };
        *link = Some(Arc::clone(&opened));
        Ok(opened)
    }

    /// One call to the peer at `raft_addr`; `sent` as in [`PeerStream::call`].
    async fn call_raw(
        &self,
        target: NodeId,
        raft_addr: &str,
        method: PeerMethod,
        payload: Vec<u8>,
        timeout: Duration,
        sent: Option<oneshot::Sender<()>>,
    ) -> Result<Vec<u8>, PeerError> {
        let addr = raft_addr.to_owned();
        match self.faults.outgoing(target) {
            Some(Fault::Drop) => {
                let reason = "fault injection: dropped".to_owned();
                return Err(PeerError::Unreachable { addr, reason });
            }
            Some(Fault::Blackhole) => {
                // Lost on the way: the calls behind it need not wait for it.
                drop(sent);
                tokio::time::sleep(timeout).await;
                return Err(PeerError::Timeout { addr, timeout });
            }
            Some(Fault::Delay(delay)) => tokio::time::sleep(delay.min(timeout)).await,
            None => {}
        }
        let call = async {
            if method == PeerMethod::InstallSnapshot {
                return self.call_unary(raft_addr, method, payload).await;
            }
            let stream = self.link(raft_addr).await?;
            self.call_on_stream(target, &stream, &addr, method, payload, sent)
                .await
        };
        match tokio::time::timeout(timeout, call).await {
            Err(_) => Err(PeerError::Timeout { addr, timeout }),
            Ok(answer) => answer,
        }
    }

    async fn call_on_stream(
        &self,
        target: NodeId,
        stream: &PeerStream,
        addr: &str,
        method: PeerMethod,
        payload: Vec<u8>,
        sent: Option<oneshot::Sender<()>>,
    ) -> Result<Vec<u8>, PeerError> {
        let sent_wall_us = wall_clock_us();
        let sent_at = tokio::time::Instant::now();
        let (receiver_offset_us, receiver_offset_clocks) = self
            .clock
            .as_ref()
            .map_or((0, 0), |clock| clock.offset_of(target));
        let frame = PeerFrame {
            method: method as i32,
            cluster_id: self.cluster_id.to_string(),
            from_node_id: self.from_node_id,
            payload,
            wall_clock_us: sent_wall_us,
            receiver_offset_us,
            receiver_offset_clocks,
            ..PeerFrame::default()
        };
        let answer = stream.call(frame, sent).await;
        if let (Some(clock), Ok((_, peer_wall_us))) = (&self.clock, &answer) {
            // The peer read its clock about halfway through the round trip.
            let round_trip = sent_at.elapsed();
            let half_trip_us = u64::try_from(round_trip.as_micros() / 2).unwrap_or(0);
            let midpoint_us = sent_wall_us.saturating_add(half_trip_us);
            clock.read_round_trip(target, *peer_wall_us, midpoint_us, round_trip);
        }
        match answer.map(|(result, _)| result) {
            Ok(Ok(answer)) => Ok(answer),
            Ok(Err(status)) => Err(refused(addr.to_owned(), &status)),
            Err(None) => Err(PeerError::Unreachable {
                addr: addr.to_owned(),
                reason: "stream to the peer ended before the call was sent".to_owned(),
            }),
            Err(Some(reason)) => Err(PeerError::Lost {
                addr: addr.to_owned(),
                reason,
            }),
        }
    }

    async fn call_unary(
        &self,
        raft_addr: &str,
        method: PeerMethod,
        payload: Vec<u8>,
    ) -> Result<Vec<u8>, PeerError> {
        let mut client = self.client(raft_addr)?;
        let message = RaftMessage {
            cluster_id: self.cluster_id.to_string(),
            from_node_id: self.from_node_id,
            payload,
        };
        let answer = match method {
            PeerMethod::AppendEntries => client.append_entries(message).await,
            PeerMethod::Vote => client.vote(message).await,
            PeerMethod::InstallSnapshot => client.install_snapshot(message).await,
            PeerMethod::Propose => client.propose(message).await,
            PeerMethod::Unspecified => Err(Status::invalid_argument("method: not set")),
        };
        answer
            .map(|response| response.into_inner().payload)
            .map_err(|status| refused(raft_addr.to_owned(), &status))
    }

    async fn call<Req: Serialize, Resp: DeserializeOwned>(
        &self,
        target: NodeId,
        raft_addr: &str,
        method: PeerMethod,
        request: &Req,
        timeout: Duration,
        sent: Option<oneshot::Sender<()>>,
    ) -> Result<Resp, PeerError> {
        let garbled = |e: codec::CodecError| PeerError::Garbled {
            addr: raft_addr.to_owned(),
            reason: e.to_string(),
        };
        let payload = codec::encode(request).map_err(garbled)?;
        let answer = self
            .call_raw(target, raft_addr, method, payload, timeout, sent)
            .await?;
        codec::decode(&answer).map_err(garbled)
    }

    /// Hands a batch of commands to the node at `raft_addr` (believed to be the leader).
    /// `sent` is dropped once the batch is on the peer stream: batches handed over in turn
    /// (`node::order`) reach the peer in that order.
    ///
    /// # Errors
    /// A transport failure; the batch may or may not have been applied unless
    /// [`PeerError::surely_not_delivered`] says otherwise.
    pub async fn propose(
        &self,
        target: NodeId,
        raft_addr: &str,
        request: &ProposeRequest<&[EncodedCommand]>,
        timeout: Duration,
        sent: Option<oneshot::Sender<()>>,
    ) -> Result<ProposeResponse, PeerError> {
        let method = PeerMethod::Propose;
        self.call(target, raft_addr, method, request, timeout, sent)
            .await
    }
}

impl RaftNetworkFactory<TypeConfig> for PeerClients {
    type Network = PeerConnection;

    async fn new_client(&mut self, target: NodeId, node: &MemberNode) -> Self::Network {
        PeerConnection {
            clients: self.clone(),
            target,
            raft_addr: node.raft_addr.clone(),
        }
    }
}

/// openraft's connection to one peer (cheap to clone: clones share the stream).
#[derive(Clone)]
pub struct PeerConnection {
    clients: PeerClients,
    target: NodeId,
    raft_addr: String,
}

type RpcResult<Resp, E> = Result<Resp, RPCError<NodeId, MemberNode, RaftError<NodeId, E>>>;

impl PeerConnection {
    async fn rpc<Req, Resp, E>(
        &self,
        method: PeerMethod,
        request: &Req,
        option: &RPCOption,
    ) -> RpcResult<Resp, E>
    where
        Req: Serialize,
        Resp: DeserializeOwned,
        E: std::error::Error + DeserializeOwned,
    {
        let answer: Result<Result<Resp, RaftError<NodeId, E>>, PeerError> = self
            .clients
            .call(
                self.target,
                &self.raft_addr,
                method,
                request,
                option.hard_ttl(),
                None,
            )
            .await;
        match answer {
            Ok(Ok(response)) => Ok(response),
            Ok(Err(remote)) => Err(RPCError::RemoteError(RemoteError::new(self.target, remote))),
            Err(e @ PeerError::Unreachable { .. }) => {
                Err(RPCError::Unreachable(Unreachable::new(&e)))
            }
            Err(e) => Err(RPCError::Network(NetworkError::new(&e))),
        }
    }
}

/// `Some` when `rpc` would not fit one peer message: openraft then sends fewer entries at
/// once (the hint), at once. A bound from the command counts is checked first, so the usual
/// `AppendEntries` is not encoded twice.
fn too_large(rpc: &AppendEntriesRequest<TypeConfig>) -> Option<openraft::error::PayloadTooLarge> {
    let commands: usize = rpc
        .entries
        .iter()
        .map(|entry| match &entry.payload {
            openraft::EntryPayload::Normal(request) => request.commands.len(),
            _ => 1,
        })
        .sum();
    if commands.saturating_mul(COMMAND_BYTES_MAX) <= APPEND_ENTRIES_BYTES_MAX {
        return None;
    }
    let bytes = codec::encoded_len(rpc).ok()?;
    if bytes <= APPEND_ENTRIES_BYTES_MAX || rpc.entries.len() <= 1 {
        return None;
    }
    metrics::counter!("ankusa_append_entries_split_total").increment(1);
    let hint = (rpc.entries.len() as u64 / 2).max(1);
    Some(openraft::error::PayloadTooLarge::new_entries_hint(hint))
}

impl RaftNetwork<TypeConfig> for PeerConnection {
    /// Sent as it is: the commit clamp and the commit-only shortcut are
    /// `raft::durability::network`'s, around this transport.
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> RpcResult<AppendEntriesResponse<NodeId>, openraft::error::Infallible> {
        if let Some(too_large) = too_large(&rpc) {
            return Err(RPCError::PayloadTooLarge(too_large));
        }
        self.rpc(PeerMethod::AppendEntries, &rpc, &option).await
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> RpcResult<InstallSnapshotResponse<NodeId>, InstallSnapshotError> {
        self.rpc(PeerMethod::InstallSnapshot, &rpc, &option).await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> RpcResult<VoteResponse<NodeId>, openraft::error::Infallible> {
        self.rpc(PeerMethod::Vote, &rpc, &option).await
    }
}

#[cfg(test)]
mod tests;
