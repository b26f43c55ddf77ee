//! Outgoing Raft traffic over tonic: openraft's `RaftNetwork` for append/vote/snapshot,
//! plus [`PeerClients`] for a follower handing proposals to the leader.
//!
//! Every call has a deadline (openraft's `hard_ttl`, or the proposal's remaining time).
//! Payloads are encoded by `crate::codec`; gRPC only carries bytes and the cluster id.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

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
use tonic::transport::{Channel, Endpoint};

use super::faults::{Fault, Faults};
use super::{MemberNode, NodeId, ProposeRequest, ProposeResponse, TypeConfig};
use crate::codec;
use crate::pb::internal::peer_client::PeerClient;
use crate::pb::internal::RaftMessage;

/// How long to wait for a TCP connection to a peer before calling it unreachable.
const CONNECT_TIMEOUT: Duration = Duration::from_millis(500);

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
}

impl PeerError {
    /// True when the request surely never reached the peer, so resending cannot apply it twice.
    pub fn surely_not_delivered(&self) -> bool {
        matches!(self, PeerError::Unreachable { .. })
    }
}

/// Cached gRPC channels to peers, by raft address (tonic channels reconnect by themselves).
#[derive(Clone)]
pub struct PeerClients {
    cluster_id: Arc<str>,
    from_node_id: NodeId,
    faults: Faults,
    channels: Arc<Mutex<HashMap<String, PeerClient<Channel>>>>,
}

/// Which Peer RPC to call.
#[derive(Clone, Copy, Debug)]
enum Method {
    AppendEntries,
    Vote,
    InstallSnapshot,
    Propose,
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
        }
    }

    fn client(&self, raft_addr: &str) -> Result<PeerClient<Channel>, PeerError> {
        let mut channels = match self.channels.lock() {
            Ok(guard) => guard,
            Err(poisoned) => poisoned.into_inner(),
        };
        if let Some(client) = channels.get(raft_addr) {
            return Ok(client.clone());
        }
        let endpoint = Endpoint::from_shared(format!("http://{raft_addr}"))
            .map_err(|e| PeerError::Unreachable {
                addr: raft_addr.to_owned(),
                reason: e.to_string(),
            })?
            .connect_timeout(CONNECT_TIMEOUT)
            .tcp_nodelay(true);
        let client = PeerClient::new(endpoint.connect_lazy())
            .max_decoding_message_size(usize::MAX)
            .max_encoding_message_size(usize::MAX);
        channels.insert(raft_addr.to_owned(), client.clone());
        Ok(client)
    }

    async fn call_raw(
        &self,
        target: NodeId,
        raft_addr: &str,
        method: Method,
        payload: Vec<u8>,
        timeout: Duration,
    ) -> Result<Vec<u8>, PeerError> {
        let addr = raft_addr.to_owned();
        match self.faults.get(target) {
            Some(Fault::Drop) => {
                let reason = "fault injection: dropped".to_owned();
                return Err(PeerError::Unreachable { addr, reason });
            }
            Some(Fault::Blackhole) => {
                tokio::time::sleep(timeout).await;
                return Err(PeerError::Timeout { addr, timeout });
            }
            Some(Fault::Delay(delay)) => tokio::time::sleep(delay.min(timeout)).await,
            None => {}
        }
        let mut client = self.client(raft_addr)?;
        let message = RaftMessage {
            cluster_id: self.cluster_id.to_string(),
            from_node_id: self.from_node_id,
            payload,
        };
        let call = async {
            match method {
                Method::AppendEntries => client.append_entries(message).await,
                Method::Vote => client.vote(message).await,
                Method::InstallSnapshot => client.install_snapshot(message).await,
                Method::Propose => client.propose(message).await,
            }
        };
        match tokio::time::timeout(timeout, call).await {
            Err(_) => Err(PeerError::Timeout { addr, timeout }),
            Ok(Err(status)) if status.code() == tonic::Code::Unavailable => {
                Err(PeerError::Unreachable {
                    addr,
                    reason: status.message().to_owned(),
                })
            }
            Ok(Err(status)) => Err(PeerError::Refused {
                addr,
                reason: format!("{:?}: {}", status.code(), status.message()),
            }),
            Ok(Ok(response)) => Ok(response.into_inner().payload),
        }
    }

    async fn call<Req: Serialize, Resp: DeserializeOwned>(
        &self,
        target: NodeId,
        raft_addr: &str,
        method: Method,
        request: &Req,
        timeout: Duration,
    ) -> Result<Resp, PeerError> {
        let garbled = |e: codec::CodecError| PeerError::Garbled {
            addr: raft_addr.to_owned(),
            reason: e.to_string(),
        };
        let payload = codec::encode(request).map_err(garbled)?;
        let answer = self
            .call_raw(target, raft_addr, method, payload, timeout)
            .await?;
        codec::decode(&answer).map_err(garbled)
    }

    /// Hands a batch of commands to the node at `raft_addr` (believed to be the leader).
    ///
    /// # Errors
    /// A transport failure; the batch may or may not have been applied unless
    /// [`PeerError::surely_not_delivered`] says otherwise.
    pub async fn propose(
        &self,
        target: NodeId,
        raft_addr: &str,
        request: &ProposeRequest,
        timeout: Duration,
    ) -> Result<ProposeResponse, PeerError> {
        self.call(target, raft_addr, Method::Propose, request, timeout)
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

/// openraft's connection to one peer.
pub struct PeerConnection {
    clients: PeerClients,
    target: NodeId,
    raft_addr: String,
}

type RpcResult<Resp, E> = Result<Resp, RPCError<NodeId, MemberNode, RaftError<NodeId, E>>>;

impl PeerConnection {
    async fn rpc<Req, Resp, E>(
        &self,
        method: Method,
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

impl RaftNetwork<TypeConfig> for PeerConnection {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> RpcResult<AppendEntriesResponse<NodeId>, openraft::error::Infallible> {
        self.rpc(Method::AppendEntries, &rpc, &option).await
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> RpcResult<InstallSnapshotResponse<NodeId>, InstallSnapshotError> {
        self.rpc(Method::InstallSnapshot, &rpc, &option).await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> RpcResult<VoteResponse<NodeId>, openraft::error::Infallible> {
        self.rpc(Method::Vote, &rpc, &option).await
    }
}
