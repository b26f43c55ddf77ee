//! The `Admin` service: membership for the `cluster` commands, backups for `snapshot save`,
//! and fault rules for the fault tests. Served on `raft_addr` only, beside the `Peer`
//! service and behind the same `[peer_tls]`: whoever calls it holds a certificate of the
//! fleet CA (a backup holds every tenant's claims and budgets). A follower forwards a
//! membership change or a backup to the leader's `raft_addr`, with this node's own
//! certificate.
//!
//! It never serves edge calls.

use std::sync::Arc;

use tonic::transport::ClientTlsConfig;
use tonic::{Request, Response, Status};

use super::status_of;
use crate::node::{Node, NodeError};
use crate::pb;
use crate::pb::internal::admin_client::AdminClient;
use crate::pb::internal::admin_server::Admin;
use crate::pb::internal::{
    AddMemberRequest, AdminResponse, ClusterMember, ClusterStatusRequest, ClusterStatusResponse,
    RemoveMemberRequest, SaveSnapshotRequest, SetFaultsRequest, SnapshotChunk,
};
use crate::raft::faults::{Direction, Fault, Faults};
use crate::raft::MemberNode;

/// Marks a call one node forwarded to the leader: it is not forwarded again (two nodes with
/// crossed views of the leader, mid-election, would pass it back and forth).
const FORWARDED_HEADER: &str = "x-ankusa-forwarded";

fn was_forwarded<T>(request: &Request<T>) -> bool {
    request.metadata().contains_key(FORWARDED_HEADER)
}

/// The request to send on to the leader, marked as forwarded; refused if it already was.
fn forward_once<T>(forwarded: bool, message: T) -> Result<Request<T>, Status> {
    if forwarded {
        return Err(Status::unavailable(
            "forwarded to a node that is not the leader either; retry once the fleet has elected one",
        ));
    }
    let mut request = Request::new(message);
    request.metadata_mut().insert(
        FORWARDED_HEADER,
        tonic::metadata::MetadataValue::from_static("1"),
    );
    Ok(request)
}

/// How long a forward to the leader may take to connect.
const FORWARD_CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// Bytes per `SnapshotChunk`: well under what a client decodes in one message
/// ([`crate::limits::API_RESPONSE_BYTES_MAX`]).
const SNAPSHOT_CHUNK_BYTES: usize = 256 * 1024;

/// The chunks of a backup, from this node or forwarded from the leader's.
type SnapshotChunks =
    std::pin::Pin<Box<dyn futures::Stream<Item = Result<SnapshotChunk, Status>> + Send>>;

/// Membership administration for the `cluster` CLI; a follower forwards to the leader.
pub struct AdminService {
    node: Arc<Node>,
    cluster_id: String,
    faults: Faults,
    /// How this node calls another's `raft_addr` (`[peer_tls]`'s client side).
    peer_tls: Option<ClientTlsConfig>,
}

impl AdminService {
    /// Serves membership changes of `node` in fleet `cluster_id`; forwards go out with
    /// `peer_tls`.
    pub fn new(
        node: Arc<Node>,
        cluster_id: String,
        faults: Faults,
        peer_tls: Option<ClientTlsConfig>,
    ) -> Self {
        Self {
            node,
            cluster_id,
            faults,
            peer_tls,
        }
    }

    /// A request meant for another fleet (two fleets under one CA) is refused.
    fn same_cluster(&self, cluster_id: &str) -> Result<(), Status> {
        if cluster_id == self.cluster_id {
            return Ok(());
        }
        tracing::warn!(cluster_id, "refused an Admin call for another cluster");
        Err(Status::permission_denied(format!(
            "cluster_id: `{cluster_id}` is not this node's cluster `{}`",
            self.cluster_id
        )))
    }

    async fn leader_admin(
        &self,
        leader_raft_addr: Option<String>,
    ) -> Result<AdminClient<tonic::transport::Channel>, Status> {
        let Some(addr) = leader_raft_addr else {
            return Err(Status::unavailable(
                "no leader known; retry once the fleet has elected one",
            ));
        };
        let unavailable = |e: String| Status::unavailable(format!("leader at {addr}: {e}"));
        let channel = crate::tls::endpoint(&addr, self.peer_tls.as_ref())
            .map_err(|e| unavailable(e.to_string()))?
            .connect_timeout(FORWARD_CONNECT_TIMEOUT)
            .connect()
            .await
            .map_err(|e| unavailable(e.to_string()))?;
        Ok(AdminClient::new(channel)
            .max_decoding_message_size(crate::limits::API_RESPONSE_BYTES_MAX))
    }
}

#[tonic::async_trait]
impl Admin for AdminService {
    type SaveSnapshotStream = SnapshotChunks;

    async fn save_snapshot(
        &self,
        request: Request<SaveSnapshotRequest>,
    ) -> Result<Response<SnapshotChunks>, Status> {
        let forwarded = was_forwarded(&request);
        let save = request.into_inner();
        self.same_cluster(&save.cluster_id)?;
        match self.node.backup().await {
            Ok((last, data)) => {
                tracing::info!(index = last.index, size_bytes = data.len(), "backup sent");
                let chunks: Vec<Result<SnapshotChunk, Status>> = data
                    .chunks(SNAPSHOT_CHUNK_BYTES)
                    .map(|piece| {
                        Ok(SnapshotChunk {
                            data: piece.to_vec(),
                        })
                    })
                    .collect();
                Ok(Response::new(Box::pin(futures::stream::iter(chunks))))
            }
            Err(NodeError::NotLeader { leader_raft_addr }) => {
                let save = forward_once(forwarded, save)?;
                let chunks = self
                    .leader_admin(leader_raft_addr)
                    .await?
                    .save_snapshot(save)
                    .await?
                    .into_inner();
                Ok(Response::new(Box::pin(chunks)))
            }
            Err(e) => Err(status_of(e)),
        }
    }

    async fn add_member(
        &self,
        request: Request<AddMemberRequest>,
    ) -> Result<Response<AdminResponse>, Status> {
        let forwarded = was_forwarded(&request);
        let add = request.into_inner();
        self.same_cluster(&add.cluster_id)?;
        if add.id == 0 {
            return Err(Status::invalid_argument("id: must be at least 1"));
        }
        for (field, addr) in [("api_addr", &add.api_addr), ("raft_addr", &add.raft_addr)] {
            if addr.parse::<std::net::SocketAddr>().is_err() {
                return Err(Status::invalid_argument(format!(
                    "{field}: `{addr}` is not an ip:port address"
                )));
            }
        }
        let member = MemberNode {
            api_addr: add.api_addr.clone(),
            raft_addr: add.raft_addr.clone(),
        };
        match self.node.add_member(add.id, member, add.voter).await {
            Ok(message) => Ok(Response::new(AdminResponse { message })),
            Err(NodeError::NotLeader { leader_raft_addr }) => {
                let add = forward_once(forwarded, add)?;
                self.leader_admin(leader_raft_addr)
                    .await?
                    .add_member(add)
                    .await
            }
            Err(e) => Err(status_of(e)),
        }
    }

    async fn remove_member(
        &self,
        request: Request<RemoveMemberRequest>,
    ) -> Result<Response<AdminResponse>, Status> {
        let forwarded = was_forwarded(&request);
        let remove = request.into_inner();
        self.same_cluster(&remove.cluster_id)?;
        match self.node.remove_member(remove.id).await {
            Ok(message) => Ok(Response::new(AdminResponse { message })),
            Err(NodeError::NotLeader { leader_raft_addr }) => {
                let remove = forward_once(forwarded, remove)?;
                self.leader_admin(leader_raft_addr)
                    .await?
                    .remove_member(remove)
                    .await
            }
            Err(e) => Err(status_of(e)),
        }
    }

    async fn cluster_status(
        &self,
        request: Request<ClusterStatusRequest>,
    ) -> Result<Response<ClusterStatusResponse>, Status> {
        self.same_cluster(&request.get_ref().cluster_id)?;
        let status = self.node.status();
        // The digest reads every item under the state lock: a check for fault tests, not a
        // call for anyone holding a fleet certificate to make at will.
        let (digest_index, state_digest) = match (request.get_ref().digest, self.faults.enabled()) {
            (false, _) => (0, 0),
            (true, true) => self.node.state_digest(),
            (true, false) => {
                return Err(Status::failed_precondition(
                    "digest: needs fault_injection = true in the node's config",
                ))
            }
        };
        Ok(Response::new(ClusterStatusResponse {
            state_digest,
            digest_index,
            node_id: status.node_id,
            leader_id: status.leader_id.unwrap_or(0),
            term: status.term,
            last_applied: status.last_applied,
            members: status
                .members
                .into_iter()
                .map(|(id, node, voter)| ClusterMember {
                    id,
                    api_addr: node.api_addr,
                    raft_addr: node.raft_addr,
                    voter,
                })
                .collect(),
        }))
    }

    async fn set_faults(
        &self,
        request: Request<SetFaultsRequest>,
    ) -> Result<Response<AdminResponse>, Status> {
        let request = request.into_inner();
        self.same_cluster(&request.cluster_id)?;
        let mut rules = std::collections::HashMap::new();
        for (i, fault) in request.faults.into_iter().enumerate() {
            let rule = match pb::internal::FaultKind::try_from(fault.kind) {
                Ok(pb::internal::FaultKind::Drop) => Fault::Drop,
                Ok(pb::internal::FaultKind::Blackhole) => Fault::Blackhole,
                Ok(pb::internal::FaultKind::Delay) => {
                    Fault::Delay(std::time::Duration::from_millis(fault.delay_ms))
                }
                _ => {
                    let message = format!("faults[{i}].kind: must be DROP, BLACKHOLE or DELAY");
                    return Err(Status::invalid_argument(message));
                }
            };
            let direction = match pb::internal::FaultDirection::try_from(fault.direction) {
                Ok(pb::internal::FaultDirection::Both) => Direction::Both,
                Ok(pb::internal::FaultDirection::Outgoing) => Direction::Outgoing,
                Ok(pb::internal::FaultDirection::Incoming) => Direction::Incoming,
                Err(_) => {
                    let message =
                        format!("faults[{i}].direction: must be BOTH, OUTGOING or INCOMING");
                    return Err(Status::invalid_argument(message));
                }
            };
            rules.insert(fault.peer_id, (rule, direction));
        }
        if request.clock_offset_ms.unsigned_abs() > crate::contract::TTL_MS_MAX {
            let message = format!(
                "clock_offset_ms: {} is beyond ±{} (30 days)",
                request.clock_offset_ms,
                crate::contract::TTL_MS_MAX
            );
            return Err(Status::invalid_argument(message));
        }
        let count = rules.len();
        self.faults
            .set(rules)
            .map_err(Status::failed_precondition)?;
        self.faults
            .hold_log_writes(request.hold_log_writes)
            .map_err(Status::failed_precondition)?;
        self.faults
            .set_clock_offset_ms(request.clock_offset_ms)
            .map_err(Status::failed_precondition)?;
        let stopped = if request.stop_raft_core {
            self.faults
                .may_stop_raft_core()
                .map_err(Status::failed_precondition)?;
            self.node
                .raft()
                .shutdown()
                .await
                .map_err(|e| Status::internal(format!("stop_raft_core: {e}")))?;
            ", Raft core stopped"
        } else {
            ""
        };
        let held = if request.hold_log_writes {
            ", log writer held"
        } else {
            ""
        };
        let offset = match request.clock_offset_ms {
            0 => String::new(),
            offset_ms => format!(", wall clock off by {offset_ms} ms"),
        };
        Ok(Response::new(AdminResponse {
            message: format!("{count} fault rules set{held}{offset}{stopped}"),
        }))
    }
}
