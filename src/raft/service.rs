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
use crate::pb::internal::peer_server::Peer;
use crate::pb::internal::{PeerFrame, PeerMethod, RaftMessage};
use crate::raft::snapshot::intake::{self, SnapshotIntake};

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

/// The peer-facing gRPC service (cheap to clone: every clone serves the same node).
#[derive(Clone)]
pub struct PeerService {
    raft: Raft,
    cluster_id: Arc<str>,
    proposals: Arc<dyn ProposalSink>,
    faults: Faults,
    intake: Arc<std::sync::Mutex<SnapshotIntake>>,
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
                let answer = intake::receive(&self.raft, &self.intake, request)
                    .await
                    .map_err(|refused| Status::invalid_argument(refused.to_string()))?;
                seal(&answer)
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
    async fn exchange(
        &self,
        request: Request<Streaming<PeerFrame>>,
    ) -> Result<Response<Self::ExchangeStream>, Status> {
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
                let service = service.clone();
                let answers = answers.clone();
                tokio::spawn(async move {
                    if let Some(answer) = service.answer_frame(frame).await {
                        // The caller hung up: nobody is left to read the answer.
                        let _ = answers.send(Ok(answer)).await;
                    }
                    drop(permit);
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
}
