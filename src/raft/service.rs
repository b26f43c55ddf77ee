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
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use super::faults::{Fault, Faults};
use super::{NodeId, ProposeRequest, ProposeResponse, Raft};
use crate::codec;
use crate::pb::internal::peer_server::Peer;
use crate::pb::internal::{PeerFrame, PeerMethod, RaftMessage};

/// Where `Propose` calls go: the node's proposal queue (implemented by `node`).
pub trait ProposalSink: Send + Sync + 'static {
    /// Commits the batch (or refuses it) and returns one answer per command.
    fn propose(
        &self,
        request: ProposeRequest,
    ) -> Pin<Box<dyn Future<Output = ProposeResponse> + Send + 'static>>;
}

/// The peer-facing gRPC service (cheap to clone: every clone serves the same node).
#[derive(Clone)]
pub struct PeerService {
    raft: Raft,
    cluster_id: Arc<str>,
    proposals: Arc<dyn ProposalSink>,
    faults: Faults,
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
        }
    }

    /// Applies any fault rule for the sender, then checks the cluster id. `None` means the
    /// call is black-holed: it is never answered.
    async fn admit(&self, cluster_id: &str, from_node_id: NodeId) -> Option<Result<(), Status>> {
        match self.faults.get(from_node_id) {
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
            PeerMethod::AppendEntries => seal(&self.raft.append_entries(open(payload)?).await),
            PeerMethod::Vote => seal(&self.raft.vote(open(payload)?).await),
            PeerMethod::InstallSnapshot => seal(&self.raft.install_snapshot(open(payload)?).await),
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
    /// never holds up an `AppendEntries` behind it; answers go back as they are ready.
    async fn exchange(
        &self,
        request: Request<Streaming<PeerFrame>>,
    ) -> Result<Response<Self::ExchangeStream>, Status> {
        let mut calls = request.into_inner();
        let (answers, outbound) = mpsc::unbounded_channel();
        let service = self.clone();
        tokio::spawn(async move {
            while let Ok(Some(frame)) = calls.message().await {
                let service = service.clone();
                let answers = answers.clone();
                tokio::spawn(async move {
                    if let Some(answer) = service.answer_frame(frame).await {
                        // The caller hung up: nobody is left to read the answer.
                        let _ = answers.send(Ok(answer));
                    }
                });
            }
        });
        Ok(Response::new(Box::pin(UnboundedReceiverStream::new(
            outbound,
        ))))
    }
}
