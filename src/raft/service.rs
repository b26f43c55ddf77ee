//! Incoming Raft traffic: the `Peer` gRPC service on `raft_addr`. Before it decodes
//! anything it checks who is calling (with `[peer_tls]`: the node identity of the
//! connection's certificate, a member of the fleet, sending as itself; a learner sends no
//! Vote, AppendEntries or InstallSnapshot), the cluster id and, in fault tests, the sender's
//! fault rule. Then it decodes the openraft message, checks that the vote inside names the
//! caller, hands it to the local `Raft` (or, for `Propose`, to the node's proposal queue)
//! and encodes the answer. Calls arrive as unary RPCs or as frames on a peer's long-lived
//! `Exchange` stream; both take the same path ([`PeerService`]'s `admit` then `dispatch`).
//!
//! It never applies anything itself and never serves edge calls.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use futures::Stream;
use openraft::raft::{AppendEntriesRequest, InstallSnapshotRequest, VoteRequest};
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::sync::{mpsc, oneshot, Semaphore};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use super::clock_view::ClockView;
use super::faults::{Fault, Faults};
use super::{NodeId, ProposeRequest, ProposeResponse, Raft, TypeConfig};
use crate::clock::wall_clock_us;
use crate::codec;
use crate::identity::{Caller, Identity, RefusalLog};
use crate::pb::internal::peer_server::Peer;
use crate::pb::internal::{PeerFrame, PeerMethod, RaftMessage};
use crate::raft::snapshot::intake::{self, SnapshotIntake};

mod error;
pub use error::PeerCallError;

/// Where `Propose` calls go: the node's proposal queue (implemented by `node`).
pub trait ProposalSink: Send + Sync + 'static {
    /// Commits the batch (or refuses it) and returns one answer per command; `sender` is
    /// the node identity of the caller's certificate (`None` on a plaintext `raft_addr`).
    /// The batch enters the queue before this returns, so batches handed over in order are
    /// proposed in that order.
    fn propose(
        &self,
        request: ProposeRequest,
        sender: Option<NodeId>,
    ) -> Pin<Box<dyn Future<Output = ProposeResponse> + Send + 'static>>;
}

/// Call frames of one `Exchange` stream being answered at once. The stream is read no
/// further while this many wait (HTTP/2 flow control then holds the sender back), so a peer
/// cannot make a node spawn a task and queue an answer for every frame it sends.
pub const EXCHANGE_FRAMES_IN_FLIGHT_MAX: usize = 256;

/// The peer-facing gRPC service (cheap to clone: every clone serves the same node).
#[derive(Clone)]
pub struct PeerService {
    raft: Raft,
    cluster_id: Arc<str>,
    proposals: Arc<dyn ProposalSink>,
    faults: Faults,
    intake: Arc<std::sync::Mutex<SnapshotIntake>>,
    /// `raft_addr` serves TLS: every caller has a verified certificate to check.
    tls: bool,
    /// The config's `[[members]]`: who may call while this node knows no membership yet
    /// (its log is empty). A node that knows none of either (one joining a fleet) takes
    /// any node of its cluster until the leader's first entries tell it the membership.
    initial_members: Arc<[NodeId]>,
    refusals: Arc<RefusalLog>,
    /// Where the clocks of admitted frames' senders are read into; none: not read.
    clock: Option<ClockView>,
}

/// A `Propose` frame's place among its stream's: it waits for `after` (the one before it
/// entered the queue) and drops `entered` once it has.
struct ProposeTurn {
    after: oneshot::Receiver<()>,
    entered: oneshot::Sender<()>,
}

/// The answers an `Exchange` stream sends back.
type FrameStream = Pin<Box<dyn Stream<Item = Result<PeerFrame, Status>> + Send>>;

impl PeerService {
    /// Serves `raft` to peers of `cluster_id`; with `tls`, only to the node identities of
    /// its members (before it knows any membership, of `initial_members`).
    pub fn new(
        raft: Raft,
        cluster_id: String,
        proposals: Arc<dyn ProposalSink>,
        faults: Faults,
        tls: bool,
        initial_members: Vec<NodeId>,
    ) -> Self {
        let intake = Arc::default();
        intake::sweep_abandoned(&intake);
        Self {
            raft,
            cluster_id: Arc::from(cluster_id),
            proposals,
            faults,
            intake,
            tls,
            initial_members: initial_members.into(),
            refusals: Arc::default(),
            clock: None,
        }
    }

    /// Reads each admitted frame's sender clock into `clock`, stamps every answer with this
    /// node's, and refuses a vote to a candidate whose clock is past the bound.
    pub fn with_clock(mut self, clock: ClockView) -> Self {
        self.clock = Some(clock);
        self
    }

    /// Reads the clock `frame` carries; the reason to refuse it, for a vote request from a
    /// candidate whose clock is too far from this node's.
    fn read_clock(&self, method: PeerMethod, frame: &PeerFrame) -> Result<(), PeerCallError> {
        let Some(clock) = &self.clock else {
            return Ok(());
        };
        clock.read_arrival(frame.from_node_id, frame.wall_clock_us, wall_clock_us());
        // Only the leader's word on this node's offset counts: one member telling every
        // other that its clock is off must not make them all stand down.
        let from_leader = self.raft.metrics().borrow().current_leader == Some(frame.from_node_id);
        if from_leader {
            clock.told(frame.receiver_offset_us, frame.receiver_offset_clocks);
        }
        match clock.refuses_candidate(frame.wall_clock_us) {
            Some(reason) if method == PeerMethod::Vote => {
                metrics::counter!("ankusa_votes_refused_for_clock_total").increment(1);
                tracing::warn!(candidate = frame.from_node_id, %reason, "refused a vote");
                Err(PeerCallError::ClockSkew { reason })
            }
            _ => Ok(()),
        }
    }

    /// Who calls on the connection `request` came on; a certificate without an identity of
    /// this fleet is refused (and logged once per connection).
    fn caller<T>(&self, request: &Request<T>) -> Result<Caller, PeerCallError> {
        // `before_reading` read the certificate already and left what it found.
        if let Some(caller) = request.extensions().get::<Caller>() {
            return Ok(*caller);
        }
        crate::identity::caller_of(request, self.tls, &self.cluster_id).map_err(|e| {
            let refusal = PeerCallError::Identity(e);
            self.refusals
                .once(request.remote_addr(), &refusal.to_string());
            refusal
        })
    }

    /// May `caller` send `method` as `from_node_id`? Only a node identity, as itself, that
    /// is a member; a learner only `Propose`. Decided from the certificate, the frame's
    /// header and the membership: nothing of the payload is read.
    fn authorize(
        &self,
        caller: Caller,
        method: PeerMethod,
        from_node_id: NodeId,
    ) -> Result<(), PeerCallError> {
        let id = match caller {
            Caller::Unauthenticated => return Ok(()),
            Caller::Verified(Identity::Admin) => return Err(PeerCallError::AdminCalls { method }),
            Caller::Verified(Identity::Node(id)) => id,
        };
        if id != from_node_id {
            return Err(PeerCallError::NotAsItself {
                id,
                method,
                from_node_id,
            });
        }
        let (member, learner) = self.membership_of(id);
        // A leader's traffic is taken from a node this node does not know as a member yet:
        // a node behind a membership change (one joining the fleet, or cut off while the
        // leader was added) learns of its leader only from these very messages, so refusing
        // them would leave it behind for good. Raft's term rule decides whether it follows.
        let leader_traffic = matches!(
            method,
            PeerMethod::AppendEntries | PeerMethod::InstallSnapshot
        );
        if !member && !leader_traffic {
            return Err(PeerCallError::NotMember { id, method });
        }
        let leads = matches!(
            method,
            PeerMethod::Vote | PeerMethod::AppendEntries | PeerMethod::InstallSnapshot
        );
        if leads && learner {
            return Err(PeerCallError::Learner { id, method });
        }
        Ok(())
    }

    /// Whether node `id` is a member (of the membership this node knows; before it knows
    /// one, of the config's `[[members]]`, or any node when that is empty too), and whether
    /// it is a learner.
    fn membership_of(&self, id: NodeId) -> (bool, bool) {
        // Read under the metrics' lock, without copying: this runs for every frame.
        let metrics = self.raft.metrics();
        let metrics = metrics.borrow();
        let membership = metrics.membership_config.membership();
        if membership.nodes().next().is_none() {
            let member = self.initial_members.is_empty() || self.initial_members.contains(&id);
            return (member, false);
        }
        let voter = membership.voter_ids().any(|voter| voter == id);
        let learner = membership.learner_ids().any(|learner| learner == id);
        (voter || learner, learner)
    }

    /// The check of a call's connection before its message is read (a tonic interceptor on
    /// the `Peer` server): a certificate with no identity of this fleet and the admin
    /// identity are refused before the node receives and decodes up to
    /// `PEER_MESSAGE_BYTES_MAX` bytes for them. The rest (membership, sender, roles) is
    /// checked per call and frame, once the method is known.
    pub fn before_reading(&self) -> impl Fn(Request<()>) -> Result<Request<()>, Status> + Clone {
        let service = self.clone();
        move |mut request: Request<()>| {
            let refusal = match service.caller(&request)? {
                caller @ (Caller::Unauthenticated | Caller::Verified(Identity::Node(_))) => {
                    // Kept for the call itself, so the certificate is parsed once.
                    request.extensions_mut().insert(caller);
                    return Ok(request);
                }
                Caller::Verified(Identity::Admin) => PeerCallError::AdminCaller,
            };
            service
                .refusals
                .once(request.remote_addr(), &refusal.to_string());
            Err(refusal.into())
        }
    }

    /// Checks who calls (`authorize`), applies any fault rule for the sender, then checks
    /// the cluster id. `None` means the call is black-holed: it is never answered.
    async fn admit(
        &self,
        caller: Caller,
        remote: Option<std::net::SocketAddr>,
        method: PeerMethod,
        cluster_id: &str,
        from_node_id: NodeId,
    ) -> Option<Result<(), PeerCallError>> {
        if let Err(refusal) = self.authorize(caller, method, from_node_id) {
            self.refusals.once(remote, &refusal.to_string());
            return Some(Err(refusal));
        }
        match self.faults.incoming(from_node_id) {
            Some(Fault::Drop) => return Some(Err(PeerCallError::Dropped)),
            Some(Fault::Blackhole) => return None,
            Some(Fault::Delay(delay)) => tokio::time::sleep(delay).await,
            None => {}
        }
        if cluster_id != &*self.cluster_id {
            let refusal = PeerCallError::OtherCluster {
                cluster_id: crate::identity::shown(cluster_id),
                ours: self.cluster_id.to_string(),
            };
            self.refusals.once(remote, &refusal.to_string());
            return Some(Err(refusal));
        }
        Some(Ok(()))
    }

    /// Decodes one admitted call, hands it to Raft (or the proposal queue) and encodes the
    /// answer. `entered` is dropped once a `Propose`'s commands are in the queue (or it is
    /// refused).
    async fn dispatch(
        &self,
        caller: Caller,
        method: PeerMethod,
        payload: &[u8],
        entered: Option<oneshot::Sender<()>>,
    ) -> Result<Vec<u8>, PeerCallError> {
        match method {
            PeerMethod::AppendEntries => {
                let request = checked_append(caller, payload)?;
                seal(&self.raft.append_entries(request).await)
            }
            PeerMethod::Vote => {
                let request: VoteRequest<NodeId> = open(payload)?;
                bounded_vote("vote", &request.vote)?;
                sent_as_caller(caller, "vote.leader_id.node_id", &request.vote)?;
                bounded_log_id("last_log_id", request.last_log_id.as_ref())?;
                seal(&self.raft.vote(request).await)
            }
            PeerMethod::InstallSnapshot => {
                let request: InstallSnapshotRequest<TypeConfig> = open(payload)?;
                bounded_vote("vote", &request.vote)?;
                sent_as_caller(caller, "vote.leader_id.node_id", &request.vote)?;
                bounded_log_id("meta.last_log_id", request.meta.last_log_id.as_ref())?;
                bounded_log_id(
                    "meta.last_membership.log_id",
                    request.meta.last_membership.log_id().as_ref(),
                )?;
                let answer = intake::receive(&self.raft, &self.intake, request)
                    .await
                    .map_err(PeerCallError::Snapshot)?;
                seal(&answer)
            }
            PeerMethod::Propose => {
                if payload.len() > PROPOSE_BYTES_MAX {
                    return Err(PeerCallError::ProposeTooLarge {
                        bytes: payload.len(),
                    });
                }
                let request: ProposeRequest = open(payload)?;
                if request.commands.len() > crate::config::BATCH_COMMANDS_MAX_MAX {
                    return Err(PeerCallError::TooManyCommands {
                        count: request.commands.len(),
                    });
                }
                let sender = match caller {
                    Caller::Verified(Identity::Node(id)) => Some(id),
                    Caller::Verified(Identity::Admin) | Caller::Unauthenticated => None,
                };
                let answer = self.proposals.propose(request, sender);
                drop(entered);
                seal(&answer.await)
            }
            PeerMethod::Unspecified => Err(PeerCallError::MethodNotSet),
        }
    }

    /// One unary call, start to end.
    async fn unary(
        &self,
        method: PeerMethod,
        request: Request<RaftMessage>,
    ) -> Result<Response<RaftMessage>, Status> {
        let caller = self.caller(&request)?;
        let remote = request.remote_addr();
        let message = request.into_inner();
        let admitted = self
            .admit(
                caller,
                remote,
                method,
                &message.cluster_id,
                message.from_node_id,
            )
            .await;
        match admitted {
            Some(admitted) => admitted?,
            None => std::future::pending().await,
        }
        let payload = self
            .dispatch(caller, method, &message.payload, None)
            .await?;
        Ok(Response::new(RaftMessage {
            cluster_id: self.cluster_id.to_string(),
            from_node_id: 0,
            payload,
        }))
    }

    /// Answers one call frame of an `Exchange` stream; `None` if it is black-holed. A
    /// `Propose` frame comes with its turn: it waits for the stream's `Propose` before it to
    /// enter the queue, and lets the next one go once it has (or is refused), so one
    /// follower's forwards are proposed in the order it sent them.
    async fn answer_frame(
        &self,
        caller: Caller,
        remote: Option<std::net::SocketAddr>,
        frame: PeerFrame,
        turn: Option<ProposeTurn>,
    ) -> Option<PeerFrame> {
        let entered = match turn {
            Some(ProposeTurn { after, entered }) => {
                let _ = after.await;
                Some(entered)
            }
            None => None,
        };
        let outcome = match PeerMethod::try_from(frame.method) {
            Ok(method) => {
                let admitted = self
                    .admit(
                        caller,
                        remote,
                        method,
                        &frame.cluster_id,
                        frame.from_node_id,
                    )
                    .await?;
                match admitted.and_then(|()| self.read_clock(method, &frame)) {
                    Ok(()) => self.dispatch(caller, method, &frame.payload, entered).await,
                    Err(refused) => Err(refused),
                }
            }
            Err(_) => Err(PeerCallError::NotAMethod {
                method: frame.method,
            }),
        };
        // Only a node that reads clocks shows its own.
        let wall_clock_us = self.clock.as_ref().map_or(0, |_| wall_clock_us());
        Some(match outcome {
            Ok(payload) => PeerFrame {
                call_id: frame.call_id,
                payload,
                wall_clock_us,
                ..PeerFrame::default()
            },
            Err(refused) => {
                let status = Status::from(refused);
                PeerFrame {
                    call_id: frame.call_id,
                    error_code: status.code() as i32,
                    error_message: status.message().to_owned(),
                    wall_clock_us,
                    ..PeerFrame::default()
                }
            }
        })
    }
}

/// The largest `Propose` payload: a follower forwards at most
/// `config::BATCH_COMMANDS_MAX_MAX` commands of at most `limits::COMMAND_BYTES_MAX` each. A
/// larger one is refused before it is decoded.
pub const PROPOSE_BYTES_MAX: usize =
    crate::config::BATCH_COMMANDS_MAX_MAX * crate::limits::COMMAND_BYTES_MAX;

/// The largest term and log index a peer may name. Terms grow by one per election and
/// indexes by one per entry, so no fleet comes near it; a message past it is garbage, and
/// openraft's `term + 1` and `index + 1` would overflow on it.
pub const TERM_OR_INDEX_MAX: u64 = 1 << 62;

/// An `AppendEntries` call's request, decoded and checked before openraft gets it: its
/// vote is the caller's, its log ids are in bounds, and every command of every entry
/// decodes (`entries_decode`).
fn checked_append(
    caller: Caller,
    payload: &[u8],
) -> Result<AppendEntriesRequest<TypeConfig>, PeerCallError> {
    let request: AppendEntriesRequest<TypeConfig> = open(payload)?;
    bounded_vote("vote", &request.vote)?;
    sent_as_caller(caller, "vote.leader_id.node_id", &request.vote)?;
    bounded_log_id("prev_log_id", request.prev_log_id.as_ref())?;
    bounded_log_id("leader_commit", request.leader_commit.as_ref())?;
    if let Some(i) = request
        .entries
        .iter()
        .position(|entry| bounded_log_id("", Some(&entry.log_id)).is_err())
    {
        bounded_log_id(
            &format!("entries[{i}].log_id"),
            Some(&request.entries[i].log_id),
        )?;
    }
    entries_decode(&request.entries)?;
    Ok(request)
}

fn out_of_bounds(field: &str, value: u64) -> PeerCallError {
    PeerCallError::PastBound {
        field: field.to_owned(),
        value,
    }
}

fn bounded_vote(field: &str, vote: &openraft::Vote<NodeId>) -> Result<(), PeerCallError> {
    match vote.leader_id.term {
        term if term > TERM_OR_INDEX_MAX => Err(out_of_bounds(&format!("{field}.term"), term)),
        _ => Ok(()),
    }
}

fn bounded_log_id(field: &str, log_id: Option<&super::LogId>) -> Result<(), PeerCallError> {
    let Some(log_id) = log_id else {
        return Ok(());
    };
    if log_id.leader_id.term > TERM_OR_INDEX_MAX {
        return Err(out_of_bounds(
            &format!("{field}.term"),
            log_id.leader_id.term,
        ));
    }
    if log_id.index > TERM_OR_INDEX_MAX {
        return Err(out_of_bounds(&format!("{field}.index"), log_id.index));
    }
    Ok(())
}

/// With a verified node identity, the vote a Vote, AppendEntries or InstallSnapshot carries
/// must be the caller's own: a node campaigns and leads only as itself.
fn sent_as_caller(
    caller: Caller,
    field: &'static str,
    vote: &openraft::Vote<NodeId>,
) -> Result<(), PeerCallError> {
    match caller {
        Caller::Verified(Identity::Node(id)) if vote.leader_id.node_id != id => {
            Err(PeerCallError::VoteOfAnother {
                field,
                id,
                vote_node_id: vote.leader_id.node_id,
            })
        }
        _ => Ok(()),
    }
}

/// Every command of every entry must decode to one command before the entries reach the
/// log: a follower writes what it acknowledges, and an entry it cannot apply would stop
/// its Raft core at apply (and again at every restart, replaying it). Decoded only to be
/// checked; the log keeps the bytes the leader sent.
fn entries_decode(entries: &[super::Entry]) -> Result<(), PeerCallError> {
    for (i, entry) in entries.iter().enumerate() {
        let openraft::EntryPayload::Normal(request) = &entry.payload else {
            continue;
        };
        for (j, command) in request.commands.iter().enumerate() {
            if let Err(source) = command.decode() {
                return Err(PeerCallError::EntryDoesNotDecode {
                    entry: i,
                    command: j,
                    source,
                });
            }
        }
    }
    Ok(())
}

fn open<T: DeserializeOwned>(payload: &[u8]) -> Result<T, PeerCallError> {
    codec::decode(payload).map_err(PeerCallError::Payload)
}

fn seal<T: Serialize>(value: &T) -> Result<Vec<u8>, PeerCallError> {
    codec::encode(value).map_err(PeerCallError::Encode)
}

#[tonic::async_trait]
impl Peer for PeerService {
    async fn append_entries(
        &self,
        request: Request<RaftMessage>,
    ) -> Result<Response<RaftMessage>, Status> {
        self.unary(PeerMethod::AppendEntries, request).await
    }

    async fn vote(&self, request: Request<RaftMessage>) -> Result<Response<RaftMessage>, Status> {
        self.unary(PeerMethod::Vote, request).await
    }

    async fn install_snapshot(
        &self,
        request: Request<RaftMessage>,
    ) -> Result<Response<RaftMessage>, Status> {
        self.unary(PeerMethod::InstallSnapshot, request).await
    }

    async fn propose(
        &self,
        request: Request<RaftMessage>,
    ) -> Result<Response<RaftMessage>, Status> {
        self.unary(PeerMethod::Propose, request).await
    }

    type ExchangeStream = FrameStream;

    /// Every call frame is answered by its own task, so a `Propose` waiting for its commit
    /// never holds up an `AppendEntries` behind it; answers go back as they are ready. At
    /// most [`EXCHANGE_FRAMES_IN_FLIGHT_MAX`] frames are answered at once: each task holds a
    /// permit until its answer is queued, and the queue has room for every permit's answer.
    /// The frames being answered on one connection (all its `Exchange` streams) hold at
    /// most `limits::EXCHANGE_BYTES_IN_FLIGHT_MAX` bytes: a frame that does not fit waits,
    /// and its stream is read no further meanwhile.
    async fn exchange(
        &self,
        request: Request<Streaming<PeerFrame>>,
    ) -> Result<Response<Self::ExchangeStream>, Status> {
        // The connection's certificate is checked once, each frame's sender on its own.
        let caller = self.caller(&request)?;
        let remote = request.remote_addr();
        use crate::limits::EXCHANGE_BYTES_IN_FLIGHT_MAX;
        // The connection's budget, shared by its streams (one of its own for a stream
        // served without a guarded connection).
        let bytes_in_flight = match request.extensions().get::<crate::accept::Connection>() {
            Some(connection) => connection.frame_bytes(EXCHANGE_BYTES_IN_FLIGHT_MAX),
            None => Arc::new(Semaphore::new(EXCHANGE_BYTES_IN_FLIGHT_MAX)),
        };
        let mut calls = request.into_inner();
        let (answers, outbound) = mpsc::channel(EXCHANGE_FRAMES_IN_FLIGHT_MAX);
        let in_flight = Arc::new(Semaphore::new(EXCHANGE_FRAMES_IN_FLIGHT_MAX));
        let service = self.clone();
        tokio::spawn(async move {
            // The last `Propose` frame's signal that it entered the queue.
            let (entered, mut last_propose) = oneshot::channel();
            drop(entered);
            loop {
                let Ok(permit) = Arc::clone(&in_flight).acquire_owned().await else {
                    break;
                };
                let Ok(Some(frame)) = calls.message().await else {
                    break;
                };
                // A frame is at most a peer message, which the budget holds twice over.
                let bytes = prost::Message::encoded_len(&frame).min(EXCHANGE_BYTES_IN_FLIGHT_MAX);
                let bytes = u32::try_from(bytes).unwrap_or(u32::MAX);
                let Ok(bytes) = Arc::clone(&bytes_in_flight).acquire_many_owned(bytes).await else {
                    break;
                };
                let turn = (frame.method == PeerMethod::Propose as i32).then(|| {
                    let (entered, next) = oneshot::channel();
                    let after = std::mem::replace(&mut last_propose, next);
                    ProposeTurn { after, entered }
                });
                let service = service.clone();
                let answers = answers.clone();
                tokio::spawn(async move {
                    let answer = service.answer_frame(caller, remote, frame, turn).await;
                    if let Some(answer) = answer {
                        // The caller hung up: nobody is left to read the answer.
                        let _ = answers.send(Ok(answer)).await;
                    }
                    drop((permit, bytes));
                });
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(outbound))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_with_a_command_that_does_not_decode_is_refused_by_position() {
        use crate::state::{Command, EncodedCommand, FleetRequest, StateLimits};
        let good = EncodedCommand::encode(&Command::Reset { tenant: "t".into() }).expect("encode");
        let bad = EncodedCommand::from_bytes(bytes::Bytes::from_static(&[0x7f, 0x01, 0x02]));
        let entry = |index: u64, commands: Vec<EncodedCommand>| crate::raft::Entry {
            log_id: crate::raft::LogId::new(openraft::CommittedLeaderId::new(1, 1), index),
            payload: openraft::EntryPayload::Normal(FleetRequest {
                now_us: 1,
                limits: StateLimits::UNLIMITED,
                commands: commands.into(),
            }),
        };
        let sound = [
            entry(1, vec![good.clone()]),
            entry(2, vec![good.clone(), good.clone()]),
        ];
        assert!(entries_decode(&sound).is_ok());
        let rogue = [entry(1, vec![good.clone()]), entry(2, vec![good, bad])];
        let err = Status::from(entries_decode(&rogue).expect_err("a command that does not decode"));
        assert_eq!(err.code(), tonic::Code::InvalidArgument);
        assert!(
            err.message()
                .starts_with("entries[1].payload.commands[1]: does not decode"),
            "{err:?}"
        );
    }

    #[test]
    fn terms_and_indexes_past_the_bound_are_refused_by_field() {
        let past = TERM_OR_INDEX_MAX + 1;
        let err =
            Status::from(bounded_vote("vote", &openraft::Vote::new(past, 1)).expect_err("past"));
        assert!(err.message().starts_with("vote.term"), "{err:?}");
        assert!(bounded_vote("vote", &openraft::Vote::new(TERM_OR_INDEX_MAX, 1)).is_ok());
        let index = crate::raft::LogId::new(openraft::CommittedLeaderId::new(1, 1), u64::MAX);
        let err = Status::from(bounded_log_id("prev_log_id", Some(&index)).expect_err("past"));
        assert!(err.message().starts_with("prev_log_id.index"), "{err:?}");
        assert_eq!(err.code(), tonic::Code::InvalidArgument);
        let term = crate::raft::LogId::new(openraft::CommittedLeaderId::new(past, 1), 1);
        let err = Status::from(bounded_log_id("meta.last_log_id", Some(&term)).expect_err("past"));
        assert!(
            err.message().starts_with("meta.last_log_id.term"),
            "{err:?}"
        );
        assert!(bounded_log_id("leader_commit", None).is_ok());
    }
}
