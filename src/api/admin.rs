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

use super::status_of;
use crate::node::{Node, NodeError};
use crate::pb;
use crate::pb::internal::admin_server::Admin;
use crate::pb::internal::{
    AddMemberRequest, AdminResponse, ClusterMember, ClusterStatusRequest, ClusterStatusResponse,
    RemoveMemberRequest, SaveSnapshotRequest, SetFaultsRequest, SnapshotChunk,
};
use crate::raft::faults::{Direction, Fault, Faults};
use crate::raft::MemberNode;

/// The metadata key of a "not the leader" answer that names the leader's `raft_addr`: the
/// `cluster` and `snapshot` commands retry there.
pub const LEADER_RAFT_ADDR_HEADER: &str = "x-ankusa-leader-raft-addr";

/// The answer of a follower to a call only the leader serves: `FAILED_PRECONDITION` naming
/// the leader's `raft_addr` (also in [`LEADER_RAFT_ADDR_HEADER`]), or `UNAVAILABLE` while no
/// leader is known. A follower does not call the leader itself: it would have to present
/// its own node certificate for the caller's request.
fn not_leader(leader_raft_addr: Option<String>) -> Status {
    let Some(addr) = leader_raft_addr else {
        return Status::unavailable("no leader known; retry once the fleet has elected one");
    };
    let mut status = Status::failed_precondition(format!(
        "this node is not the leader: send the call to the leader's raft_addr {addr}"
    ));
    if let Ok(value) = addr.parse() {
        status.metadata_mut().insert(LEADER_RAFT_ADDR_HEADER, value);
    }
    status
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
        method: &str,
        allowed: Allowed,
    ) -> Result<Option<std::net::SocketAddr>, Status> {
        use crate::identity::{Caller, Identity};
        let remote = request.remote_addr();
        let refusal = match crate::identity::caller_of(request, self.tls, &self.cluster_id) {
            Err(e) => format!("Admin/{method}: {e}"),
            Ok(Caller::Unauthenticated | Caller::Verified(Identity::Admin)) => return Ok(remote),
            Ok(Caller::Verified(Identity::Node(id))) => match allowed {
                Allowed::AdminOrNode => return Ok(remote),
                Allowed::AdminOnly => format!(
                    "identity node {id} may not call Admin/{method}: only the admin identity \
                     (spiffe://{}/admin) may",
                    self.cluster_id
                ),
            },
        };
        self.refusals.once(remote, &refusal);
        Err(Status::permission_denied(refusal))
    }

    /// A request meant for another fleet (two fleets under one CA) is refused (logged once
    /// per connection, from `remote`).
    fn same_cluster(
        &self,
        remote: Option<std::net::SocketAddr>,
        cluster_id: &str,
    ) -> Result<(), Status> {
        if cluster_id == self.cluster_id {
            return Ok(());
        }
        let refusal = format!(
            "cluster_id: {} is not this node's cluster `{}`",
            crate::identity::shown(cluster_id),
            self.cluster_id
        );
        self.refusals.once(
            remote,
            &format!("an Admin call for another cluster: {refusal}"),
        );
        Err(Status::permission_denied(refusal))
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
            Err(NodeError::NotLeader { leader_raft_addr }) => Err(not_leader(leader_raft_addr)),
            Err(e) => Err(status_of(e)),
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
            Err(NodeError::NotLeader { leader_raft_addr }) => Err(not_leader(leader_raft_addr)),
            Err(e) => Err(status_of(e)),
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
            Err(NodeError::NotLeader { leader_raft_addr }) => Err(not_leader(leader_raft_addr)),
            Err(e) => Err(status_of(e)),
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
