//! Incoming Raft traffic: the `Peer` gRPC service on `raft_addr`. It checks the cluster id
//! (and, in fault tests, the sender's fault rule),
//! decodes the openraft message, hands it to the local `Raft` (or, for `Propose`, to the
//! node's proposal queue) and encodes the answer. Calls arrive as unary RPCs or as frames
//! on a peer's long-lived `Exchange` stream; both take the same path ([`PeerService`]'s
//! `admit` then `dispatch`).
//!
//! It never applies anything itself and never serves edge calls.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use futures::Stream;
use openraft::raft::{AppendEntriesRequest, InstallSnapshotRequest, VoteRequest};
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::sync::{mpsc, Semaphore};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use super::faults::{Fault, Faults};
use super::{NodeId, ProposeRequest, ProposeResponse, Raft, TypeConfig};
use crate::codec;
use crate::lock::lock;
use crate::pb::internal::peer_server::Peer;
use crate::pb::internal::{PeerFrame, PeerMethod, RaftMessage};
use crate::raft::snapshot::HEADER_LEN;

/// Where `Propose` calls go: the node's proposal queue (implemented by `node`).
pub trait ProposalSink: Send + Sync + 'static {
    /// Commits the batch (or refuses it) and returns one answer per command.
    fn propose(
        &self,
        request: ProposeRequest,
    ) -> Pin<Box<dyn Future<Output = ProposeResponse> + Send + 'static>>;
}

/// Call frames of one `Exchange` stream being answered at once. The stream is read no
/// further while this many wait (HTTP/2 flow control then holds the sender back), so a peer
/// cannot make a node spawn a task and queue an answer for every frame it sends.
pub const EXCHANGE_FRAMES_IN_FLIGHT_MAX: usize = 256;

/// The largest snapshot a node receives. A chunk is written at the offset its sender names;
/// offsets are also held to what was received so far ([`SnapshotIntake`]), so memory grows
/// only with bytes a peer really sent.
/// 4 GiB: `codec::decode`'s largest tier (64 GiB) covers 16 times that, so a snapshot this
/// node admits is one it can also decode.
pub const SNAPSHOT_BYTES_MAX: u64 = 4 << 30;

/// The peer-facing gRPC service (cheap to clone: every clone serves the same node).
#[derive(Clone)]
pub struct PeerService {
    raft: Raft,
    cluster_id: Arc<str>,
    proposals: Arc<dyn ProposalSink>,
    faults: Faults,
    intake: Arc<std::sync::Mutex<SnapshotIntake>>,
}

/// The snapshot being received: its id, how many bytes of it arrived, its header and the
/// running checksum of its body. openraft writes a chunk at its offset into an in-memory
/// buffer, and a snapshot that fails to install stops its Raft core; so an offset past what
/// arrived (which would grow the buffer to a size the sender only claimed) is refused, and
/// so is a last chunk whose snapshot does not match its own header: it never reaches
/// openraft.
#[derive(Default)]
pub struct SnapshotIntake {
    snapshot_id: String,
    received_bytes: u64,
    header: Vec<u8>,
    body_crc: crc32fast::Hasher,
}

impl SnapshotIntake {
    /// Admits a chunk that starts a snapshot (offset 0) or continues the current one at or
    /// before its end, within [`SNAPSHOT_BYTES_MAX`]; the last one (`done`) only if the
    /// whole snapshot checks against its header. A chunk sent again (a retry) is admitted;
    /// only bytes past what arrived count toward the checksum.
    ///
    /// # Errors
    /// The field that is out of bounds, for an `INVALID_ARGUMENT` answer.
    pub fn admit(
        &mut self,
        snapshot_id: &str,
        offset: u64,
        data: &[u8],
        done: bool,
    ) -> Result<(), String> {
        let end = u64::try_from(data.len())
            .ok()
            .and_then(|len| offset.checked_add(len))
            .filter(|end| *end <= SNAPSHOT_BYTES_MAX)
            .ok_or_else(|| format!("offset: a chunk ending past {SNAPSHOT_BYTES_MAX} bytes"))?;
        if offset == 0 {
            *self = Self {
                snapshot_id: snapshot_id.to_owned(),
                ..Self::default()
            };
        } else if snapshot_id != self.snapshot_id {
            return Err(format!(
                "meta.snapshot_id: `{snapshot_id}` was not started with a chunk at offset 0"
            ));
        } else if offset > self.received_bytes {
            return Err(format!(
                "offset: {offset} is past the {} bytes received of snapshot `{snapshot_id}`",
                self.received_bytes
            ));
        }
        let seen = usize::try_from(self.received_bytes - offset).unwrap_or(usize::MAX);
        if let Some(fresh) = data.get(seen..) {
            let into_header = fresh.len().min(HEADER_LEN - self.header.len());
            self.header.extend_from_slice(&fresh[..into_header]);
            self.body_crc.update(&fresh[into_header..]);
        }
        self.received_bytes = self.received_bytes.max(end);
        if done {
            let body_bytes = self.received_bytes.saturating_sub(HEADER_LEN as u64);
            crate::raft::snapshot::check_header(
                &self.header,
                body_bytes,
                self.body_crc.clone().finalize(),
            )
            .map_err(|e| format!("data: the received snapshot does not check: {e}"))?;
        }
        Ok(())
    }
}

/// The answers an `Exchange` stream sends back.
type FrameStream = Pin<Box<dyn Stream<Item = Result<PeerFrame, Status>> + Send>>;

impl PeerService {
    /// Serves `raft` to peers of `cluster_id`.
    pub fn new(
        raft: Raft,
        cluster_id: String,
        proposals: Arc<dyn ProposalSink>,
        faults: Faults,
    ) -> Self {
        Self {
            raft,
            cluster_id: Arc::from(cluster_id),
            proposals,
            faults,
            intake: Arc::default(),
        }
    }

    /// Applies any fault rule for the sender, then checks the cluster id. `None` means the
    /// call is black-holed: it is never answered.
    async fn admit(&self, cluster_id: &str, from_node_id: NodeId) -> Option<Result<(), Status>> {
        match self.faults.incoming(from_node_id) {
            Some(Fault::Drop) => return Some(Err(Status::unavailable("fault injection: dropped"))),
            Some(Fault::Blackhole) => return None,
            Some(Fault::Delay(delay)) => tokio::time::sleep(delay).await,
            None => {}
        }
        if cluster_id != &*self.cluster_id {
            tracing::warn!(
                from_node_id,
                cluster_id,
                "refused raft traffic from another cluster"
            );
            return Some(Err(Status::permission_denied(format!(
                "cluster_id `{cluster_id}` is not this node's cluster `{}`",
                self.cluster_id
            ))));
        }
        Some(Ok(()))
    }

    /// Decodes one admitted call, hands it to Raft (or the proposal queue) and encodes the
    /// answer.
    async fn dispatch(&self, method: PeerMethod, payload: &[u8]) -> Result<Vec<u8>, Status> {
        match method {
            PeerMethod::AppendEntries => {
                let request: AppendEntriesRequest<TypeConfig> = open(payload)?;
                bounded_vote("vote", &request.vote)?;
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
                seal(&self.raft.append_entries(request).await)
            }
            PeerMethod::Vote => {
                let request: VoteRequest<NodeId> = open(payload)?;
                bounded_vote("vote", &request.vote)?;
                bounded_log_id("last_log_id", request.last_log_id.as_ref())?;
                seal(&self.raft.vote(request).await)
            }
            PeerMethod::InstallSnapshot => {
                let request: InstallSnapshotRequest<TypeConfig> = open(payload)?;
                bounded_vote("vote", &request.vote)?;
                bounded_log_id("meta.last_log_id", request.meta.last_log_id.as_ref())?;
                bounded_log_id(
                    "meta.last_membership.log_id",
                    request.meta.last_membership.log_id().as_ref(),
                )?;
                lock(&self.intake)
                    .admit(
                        &request.meta.snapshot_id,
                        request.offset,
                        &request.data,
                        request.done,
                    )
                    .map_err(Status::invalid_argument)?;
                seal(&self.raft.install_snapshot(request).await)
            }
            PeerMethod::Propose => seal(&self.proposals.propose(open(payload)?).await),
            PeerMethod::Unspecified => Err(Status::invalid_argument("method: not set")),
        }
    }

    /// One unary call, start to end.
    async fn unary(
        &self,
        method: PeerMethod,
        request: Request<RaftMessage>,
    ) -> Result<Response<RaftMessage>, Status> {
        let message = request.into_inner();
        match self.admit(&message.cluster_id, message.from_node_id).await {
            Some(admitted) => admitted?,
            None => std::future::pending().await,
        }
        let payload = self.dispatch(method, &message.payload).await?;
        Ok(Response::new(RaftMessage {
            cluster_id: self.cluster_id.to_string(),
            from_node_id: 0,
            payload,
        }))
    }

    /// Answers one call frame of an `Exchange` stream; `None` if it is black-holed.
    async fn answer_frame(&self, frame: PeerFrame) -> Option<PeerFrame> {
        let outcome = match self.admit(&frame.cluster_id, frame.from_node_id).await? {
            Ok(()) => match PeerMethod::try_from(frame.method) {
                Ok(method) => self.dispatch(method, &frame.payload).await,
                Err(_) => Err(Status::invalid_argument(format!(
                    "method: {} is not a Peer method",
                    frame.method
                ))),
            },
            Err(refused) => Err(refused),
        };
        Some(match outcome {
            Ok(payload) => PeerFrame {
                call_id: frame.call_id,
                payload,
                ..PeerFrame::default()
            },
            Err(status) => PeerFrame {
                call_id: frame.call_id,
                error_code: status.code() as i32,
                error_message: status.message().to_owned(),
                ..PeerFrame::default()
            },
        })
    }
}

/// The largest term and log index a peer may name. Terms grow by one per election and
/// indexes by one per entry, so no fleet comes near it; a message past it is garbage, and
/// openraft's `term + 1` and `index + 1` would overflow on it.
pub const TERM_OR_INDEX_MAX: u64 = 1 << 62;

fn out_of_bounds(field: &str, value: u64) -> Status {
    Status::invalid_argument(format!("{field}: {value} is past {TERM_OR_INDEX_MAX}"))
}

fn bounded_vote(field: &str, vote: &openraft::Vote<NodeId>) -> Result<(), Status> {
    match vote.leader_id.term {
        term if term > TERM_OR_INDEX_MAX => Err(out_of_bounds(&format!("{field}.term"), term)),
        _ => Ok(()),
    }
}

fn bounded_log_id(field: &str, log_id: Option<&super::LogId>) -> Result<(), Status> {
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

fn open<T: DeserializeOwned>(payload: &[u8]) -> Result<T, Status> {
    codec::decode(payload).map_err(|e| Status::invalid_argument(format!("payload: {e}")))
}

fn seal<T: Serialize>(value: &T) -> Result<Vec<u8>, Status> {
    codec::encode(value).map_err(|e| Status::internal(format!("encode: {e}")))
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
                let service = service.clone();
                let answers = answers.clone();
                tokio::spawn(async move {
                    if let Some(answer) = service.answer_frame(frame).await {
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

    fn chunks_of(snapshot: &[u8], size: usize) -> Vec<(u64, &[u8], bool)> {
        let count = snapshot.chunks(size).count();
        snapshot
            .chunks(size)
            .enumerate()
            .map(|(i, chunk)| ((i * size) as u64, chunk, i + 1 == count))
            .collect()
    }

    fn a_snapshot() -> Vec<u8> {
        crate::raft::snapshot::encode(&crate::raft::snapshot::SnapshotBody::default())
            .expect("encode")
    }

    #[test]
    fn terms_and_indexes_past_the_bound_are_refused_by_field() {
        let past = TERM_OR_INDEX_MAX + 1;
        let err = bounded_vote("vote", &openraft::Vote::new(past, 1)).expect_err("past");
        assert!(err.message().starts_with("vote.term"), "{err:?}");
        assert!(bounded_vote("vote", &openraft::Vote::new(TERM_OR_INDEX_MAX, 1)).is_ok());
        let index = crate::raft::LogId::new(openraft::CommittedLeaderId::new(1, 1), u64::MAX);
        let err = bounded_log_id("prev_log_id", Some(&index)).expect_err("past");
        assert!(err.message().starts_with("prev_log_id.index"), "{err:?}");
        assert_eq!(err.code(), tonic::Code::InvalidArgument);
        let term = crate::raft::LogId::new(openraft::CommittedLeaderId::new(past, 1), 1);
        let err = bounded_log_id("meta.last_log_id", Some(&term)).expect_err("past");
        assert!(
            err.message().starts_with("meta.last_log_id.term"),
            "{err:?}"
        );
        assert!(bounded_log_id("leader_commit", None).is_ok());
    }

    #[test]
    fn a_whole_snapshot_is_admitted_chunk_by_chunk_even_with_a_retry() {
        let snapshot = a_snapshot();
        let mut intake = SnapshotIntake::default();
        let chunks = chunks_of(&snapshot, 7);
        for (n, (offset, chunk, done)) in chunks.iter().enumerate() {
            intake.admit("s1", *offset, chunk, *done).expect("admitted");
            if n == 2 {
                // openraft resends a chunk whose answer it did not get.
                let (offset, chunk, _) = chunks[1];
                intake.admit("s1", offset, chunk, false).expect("a retry");
            }
        }
    }

    #[test]
    fn offsets_past_what_arrived_and_unchecked_snapshots_are_refused() {
        let snapshot = a_snapshot();
        let mut intake = SnapshotIntake::default();
        let err = intake.admit("s1", 1 << 20, b"x", false).expect_err("a gap");
        assert!(err.starts_with("meta.snapshot_id"), "{err}");
        intake
            .admit("s1", 0, &snapshot[..10], false)
            .expect("first");
        let err = intake
            .admit("s1", 11, &snapshot[11..], true)
            .expect_err("a gap");
        assert!(err.starts_with("offset"), "{err}");
        let err = intake
            .admit("s2", 10, &snapshot[10..], true)
            .expect_err("another id");
        assert!(err.starts_with("meta.snapshot_id"), "{err}");
        let err = intake
            .admit("s1", u64::MAX, b"xy", false)
            .expect_err("overflow");
        assert!(err.starts_with("offset"), "{err}");
        let mut flipped = snapshot.clone();
        let last = flipped.len() - 1;
        flipped[last] ^= 1;
        let err = intake
            .admit("s1", 10, &flipped[10..], true)
            .expect_err("a flipped bit");
        assert!(err.starts_with("data"), "{err}");
        let err = SnapshotIntake::default()
            .admit("s3", 0, &[0xff; 25], true)
            .expect_err("25 bytes of 0xff");
        assert!(err.starts_with("data"), "{err}");
    }
}
