//! Incoming Raft traffic: the `Peer` gRPC service on `raft_addr`. It checks the cluster id
//! (and, in fault tests, the sender's fault rule),
//! decodes the openraft message, hands it to the local `Raft` (or, for `Propose`, to the
//! node's proposal queue) and encodes the answer.
//!
//! It never applies anything itself and never serves edge calls.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use serde::de::DeserializeOwned;
use serde::Serialize;
use tonic::{Request, Response, Status};

use super::faults::{Fault, Faults};
use super::{ProposeRequest, ProposeResponse, Raft};
use crate::codec;
use crate::pb::internal::peer_server::Peer;
use crate::pb::internal::RaftMessage;

/// Where `Propose` calls go: the node's proposal queue (implemented by `node`).
pub trait ProposalSink: Send + Sync + 'static {
    /// Commits the batch (or refuses it) and returns one answer per command.
    fn propose(
        &self,
        request: ProposeRequest,
    ) -> Pin<Box<dyn Future<Output = ProposeResponse> + Send + 'static>>;
}

/// The peer-facing gRPC service.
pub struct PeerService {
    raft: Raft,
    cluster_id: String,
    proposals: Arc<dyn ProposalSink>,
    faults: Faults,
}

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
            cluster_id,
            proposals,
            faults,
        }
    }

    /// Checks the cluster id, applies any fault rule for the sender, decodes the payload.
    async fn open<T: DeserializeOwned>(&self, request: Request<RaftMessage>) -> Result<T, Status> {
        let message = request.into_inner();
        match self.faults.get(message.from_node_id) {
            Some(Fault::Drop) => return Err(Status::unavailable("fault injection: dropped")),
            Some(Fault::Blackhole) => std::future::pending::<()>().await,
            Some(Fault::Delay(delay)) => tokio::time::sleep(delay).await,
            None => {}
        }
        if message.cluster_id != self.cluster_id {
            tracing::warn!(from_node_id = message.from_node_id, cluster_id = %message.cluster_id, "refused raft traffic from another cluster");
            return Err(Status::permission_denied(format!(
                "cluster_id `{}` is not this node's cluster `{}`",
                message.cluster_id, self.cluster_id
            )));
        }
        codec::decode(&message.payload)
            .map_err(|e| Status::invalid_argument(format!("payload: {e}")))
    }

    fn seal<T: Serialize>(&self, value: &T) -> Result<Response<RaftMessage>, Status> {
        let payload = codec::encode(value).map_err(|e| Status::internal(format!("encode: {e}")))?;
        Ok(Response::new(RaftMessage {
            cluster_id: self.cluster_id.clone(),
            from_node_id: 0,
            payload,
        }))
    }
}

#[tonic::async_trait]
impl Peer for PeerService {
    async fn append_entries(
        &self,
        request: Request<RaftMessage>,
    ) -> Result<Response<RaftMessage>, Status> {
        let rpc = self.open(request).await?;
        let answer = self.raft.append_entries(rpc).await;
        self.seal(&answer)
    }

    async fn vote(&self, request: Request<RaftMessage>) -> Result<Response<RaftMessage>, Status> {
        let rpc = self.open(request).await?;
        let answer = self.raft.vote(rpc).await;
        self.seal(&answer)
    }

    async fn install_snapshot(
        &self,
        request: Request<RaftMessage>,
    ) -> Result<Response<RaftMessage>, Status> {
        let rpc = self.open(request).await?;
        let answer = self.raft.install_snapshot(rpc).await;
        self.seal(&answer)
    }

    async fn propose(
        &self,
        request: Request<RaftMessage>,
    ) -> Result<Response<RaftMessage>, Status> {
        let proposal: ProposeRequest = self.open(request).await?;
        let answer = self.proposals.propose(proposal).await;
        self.seal(&answer)
    }
}
