//! The `Admin` service: membership for the `cluster` commands, backups for `snapshot save`,
//! and fault rules for the fault tests. Served on `raft_addr` only, beside the `Peer`
//! service and behind the same `[peer_tls]`: what changes or reads out the fleet
//! (`AddMember`, `RemoveMember`, `SaveSnapshot`, `SetFaults`) only for the admin identity
//! (a backup holds every tenant's claims and budgets), `ClusterStatus` for a node identity
//! too. A follower does not forward: it answers with the leader's `raft_addr`.
//!
//! It never serves edge calls.

use std::sync::Arc;

use tonic::{Request, Response, Status};

use super::validate::InvalidArgument;
use crate::node::{Node, NodeError};
use crate::pb;
use crate::pb::internal::admin_server::Admin;
use crate::pb::internal::{
    AddMemberRequest, AdminResponse, ClusterMember, ClusterStatusRequest, ClusterStatusResponse,
    RemoveMemberRequest, SaveSnapshotRequest, SetFaultsRequest, SnapshotChunk,
};
use crate::raft::faults::{Direction, Fault, FaultInjectionOff, Faults};
use crate::raft::{MemberNode, NodeId};

/// The metadata key of a "not the leader" answer that names the leader's `raft_addr`: the
/// `cluster` and `snapshot` commands retry there.
pub const LEADER_RAFT_ADDR_HEADER: &str = "x-ankusa-leader-raft-addr";

/// What `Admin` refuses (its codes are in `api::status`).
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    /// The connection's certificate names no identity of this fleet.
    #[error("Admin/{method}: {source}")]
    Identity {
        method: &'static str,
        #[source]
        source: crate::identity::IdentityError,
    },
    /// A node identity called a method only the admin identity may.
    #[error(
        "identity node {id} may not call Admin/{method}: only the admin identity \
         (spiffe://{cluster_id}/admin) may"
    )]
    AdminOnly {
        id: NodeId,
        method: &'static str,
        cluster_id: String,
    },
    /// A request meant for another fleet (two fleets under one CA); `cluster_id` as
    /// `identity::shown` prints the caller's.
    #[error("cluster_id: {cluster_id} is not this node's cluster `{ours}`")]
    OtherCluster { cluster_id: String, ours: String },
    #[error(transparent)]
    Invalid(#[from] InvalidArgument),
    /// A call only the leader serves, on a follower that knows no leader.
    #[error("no leader known; retry once the fleet has elected one")]
    NoLeader,
    /// A call only the leader serves, on a follower: the caller retries at the leader's
    /// `raft_addr` (also in [`LEADER_RAFT_ADDR_HEADER`]). A follower does not call the
    /// leader itself: it would have to present its own node certificate for the caller's
    /// request.
    #[error(
        "this node is not the leader: send the call to the leader's raft_addr {leader_raft_addr}"
    )]
    NotLeader { leader_raft_addr: String },
    /// A state digest, from a node whose config does not allow fault injection.
    #[error("digest: needs fault_injection = true in the node's config")]
    DigestNeedsFaults,
    #[error(transparent)]
    FaultsOff(#[from] FaultInjectionOff),
    /// `stop_raft_core`: the Raft core's task did not end cleanly.
    #[error("stop_raft_core: {0}")]
    StopRaftCore(#[source] tokio::task::JoinError),
    #[error(transparent)]
    Node(NodeError),
}

/// A node error, with "not the leader" as the answer that names the leader.
impl From<NodeError> for AdminError {
    fn from(error: NodeError) -> Self {
        match error {
            NodeError::NotLeader {
                leader_raft_addr: Some(leader_raft_addr),
            } => AdminError::NotLeader { leader_raft_addr },
            NodeError::NotLeader {
                leader_raft_addr: None,
            } => AdminError::NoLeader,
            error => AdminError::Node(error),
        }
    }
}

fn invalid(field: impl Into<String>, reason: String) -> AdminError {
    AdminError::Invalid(InvalidArgument {
        field: field.into(),
        reason,
    })
}

/// Who may call a method of `Admin`.
#[derive(Clone, Copy)]
enum Allowed {
    /// Changes or reads out the fleet: `AddMember`, `RemoveMember`, `SaveSnapshot`,
    /// `SetFaults`.
    AdminOnly,
    /// `ClusterStatus`: the admin and any node of the fleet.
    AdminOrNode,
}

/// Bytes per `SnapshotChunk`: well under what a client decodes in one message
/// ([`crate::limits::API_RESPONSE_BYTES_MAX`]).
const SNAPSHOT_CHUNK_BYTES: usize = 256 * 1024;

/// The chunks of a backup, from this node or forwarded from the leader's.
type SnapshotChunks =
    std::pin::Pin<Box<dyn futures::Stream<Item = Result<SnapshotChunk, Status>> + Send>>;

/// Membership administration for the `cluster` CLI, backups and fault rules.
pub struct AdminService {
    node: Arc<Node>,
    cluster_id: String,
    faults: Faults,
    /// `raft_addr` serves TLS: every caller has a certificate whose identity is checked.
    tls: bool,
    refusals: crate::identity::RefusalLog,
}

impl AdminService {
    /// Serves membership changes of `node` in fleet `cluster_id`; with `tls`, only to the
    /// identities each method allows.
    pub fn new(node: Arc<Node>, cluster_id: String, faults: Faults, tls: bool) -> Self {
        Self {
            node,
            cluster_id,
            faults,
            tls,
            refusals: crate::identity::RefusalLog::default(),
        }
    }

    /// Refuses `method` unless the connection's certificate names an identity `allowed`
    /// (every caller is allowed on a plaintext `raft_addr`). Nothing of the request has been
    /// looked at yet.
    /// Returns the caller's address, for [`AdminService::same_cluster`].
    fn authorize<T>(
        &self,
        request: &Request<T>,
        method: &'static str,
        allowed: Allowed,
    ) -> Result<Option<std::net::SocketAddr>, AdminError> {
        use crate::identity::{Caller, Identity};
        let remote = request.remote_addr();
        let refusal = match crate::identity::caller_of(request, self.tls, &self.cluster_id) {
            Err(source) => AdminError::Identity { method, source },
            Ok(Caller::Unauthenticated | Caller::Verified(Identity::Admin)) => return Ok(remote),
            Ok(Caller::Verified(Identity::Node(id))) => match allowed {
                Allowed::AdminOrNode => return Ok(remote),
                Allowed::AdminOnly => AdminError::AdminOnly {
                    id,
                    method,
                    cluster_id: self.cluster_id.clone(),
                },
            },
        };
        self.refusals.once(remote, &refusal.to_string());
        Err(refusal)
    }

    /// A request meant for another fleet (two fleets under one CA) is refused (logged once
    /// per connection, from `remote`).
    fn same_cluster(
        &self,
        remote: Option<std::net::SocketAddr>,
        cluster_id: &str,
    ) -> Result<(), AdminError> {
        if cluster_id == self.cluster_id {
            return Ok(());
        }
        let refusal = AdminError::OtherCluster {
            cluster_id: crate::identity::shown(cluster_id),
            ours: self.cluster_id.clone(),
        };
        self.refusals.once(
            remote,
            &format!("an Admin call for another cluster: {refusal}"),
        );
        Err(refusal)
    }
}

#[tonic::async_trait]
impl Admin for AdminService {
    type SaveSnapshotStream = SnapshotChunks;

    async fn save_snapshot(
        &self,
        request: Request<SaveSnapshotRequest>,
    ) -> Result<Response<SnapshotChunks>, Status> {
        let remote = self.authorize(&request, "SaveSnapshot", Allowed::AdminOnly)?;
        let save = request.into_inner();
        self.same_cluster(remote, &save.cluster_id)?;
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
            Err(e) => Err(AdminError::from(e).into()),
        }
    }

    async fn add_member(
        &self,
        request: Request<AddMemberRequest>,
    ) -> Result<Response<AdminResponse>, Status> {
        let remote = self.authorize(&request, "AddMember", Allowed::AdminOnly)?;
        let add = request.into_inner();
        self.same_cluster(remote, &add.cluster_id)?;
        if add.id == 0 {
            return Err(invalid("id", "must be at least 1".to_owned()).into());
        }
        for (field, addr) in [("api_addr", &add.api_addr), ("raft_addr", &add.raft_addr)] {
            if addr.parse::<std::net::SocketAddr>().is_err() {
                let reason = format!("`{addr}` is not an ip:port address");
                return Err(invalid(field, reason).into());
            }
        }
        let member = MemberNode {
            api_addr: add.api_addr.clone(),
            raft_addr: add.raft_addr.clone(),
        };
        match self.node.add_member(add.id, member, add.voter).await {
            Ok(message) => Ok(Response::new(AdminResponse { message })),
            Err(e) => Err(AdminError::from(e).into()),
        }
    }

    async fn remove_member(
        &self,
        request: Request<RemoveMemberRequest>,
    ) -> Result<Response<AdminResponse>, Status> {
        let remote = self.authorize(&request, "RemoveMember", Allowed::AdminOnly)?;
        let remove = request.into_inner();
        self.same_cluster(remote, &remove.cluster_id)?;
        match self.node.remove_member(remove.id).await {
            Ok(message) => Ok(Response::new(AdminResponse { message })),
            Err(e) => Err(AdminError::from(e).into()),
        }
    }

    async fn cluster_status(
        &self,
        request: Request<ClusterStatusRequest>,
    ) -> Result<Response<ClusterStatusResponse>, Status> {
        let remote = self.authorize(&request, "ClusterStatus", Allowed::AdminOrNode)?;
        self.same_cluster(remote, &request.get_ref().cluster_id)?;
        let status = self.node.status();
        // The digest reads every item under the state lock: a check for fault tests, not a
        // call for anyone holding a fleet certificate to make at will.
        let (digest_index, state_digest) = match (request.get_ref().digest, self.faults.enabled()) {
            (false, _) => (0, 0),
            (true, true) => self.node.state_digest(),
            (true, false) => return Err(AdminError::DigestNeedsFaults.into()),
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
        let remote = self.authorize(&request, "SetFaults", Allowed::AdminOnly)?;
        let request = request.into_inner();
        self.same_cluster(remote, &request.cluster_id)?;
        let mut rules = std::collections::HashMap::new();
        for (i, fault) in request.faults.into_iter().enumerate() {
            let rule = match pb::internal::FaultKind::try_from(fault.kind) {
                Ok(pb::internal::FaultKind::Drop) => Fault::Drop,
                Ok(pb::internal::FaultKind::Blackhole) => Fault::Blackhole,
                Ok(pb::internal::FaultKind::Delay) => {
                    Fault::Delay(std::time::Duration::from_millis(fault.delay_ms))
                }
                _ => {
                    let reason = "must be DROP, BLACKHOLE or DELAY".to_owned();
                    return Err(invalid(format!("faults[{i}].kind"), reason).into());
                }
            };
            let direction = match pb::internal::FaultDirection::try_from(fault.direction) {
                Ok(pb::internal::FaultDirection::Both) => Direction::Both,
                Ok(pb::internal::FaultDirection::Outgoing) => Direction::Outgoing,
                Ok(pb::internal::FaultDirection::Incoming) => Direction::Incoming,
                Err(_) => {
                    let reason = "must be BOTH, OUTGOING or INCOMING".to_owned();
                    return Err(invalid(format!("faults[{i}].direction"), reason).into());
                }
            };
            rules.insert(fault.peer_id, (rule, direction));
        }
        if request.clock_offset_ms.unsigned_abs() > crate::contract::TTL_MS_MAX {
            let reason = format!(
                "{} is beyond ±{} (30 days)",
                request.clock_offset_ms,
                crate::contract::TTL_MS_MAX
            );
            return Err(invalid("clock_offset_ms", reason).into());
        }
        let count = rules.len();
        self.faults.set(rules).map_err(AdminError::from)?;
        self.faults
            .hold_log_writes(request.hold_log_writes)
            .map_err(AdminError::from)?;
        self.faults
            .set_clock_offset_ms(request.clock_offset_ms)
            .map_err(AdminError::from)?;
        let stopped = if request.stop_raft_core {
            self.faults.may_stop_raft_core().map_err(AdminError::from)?;
            self.node
                .raft()
                .shutdown()
                .await
                .map_err(AdminError::StopRaftCore)?;
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
