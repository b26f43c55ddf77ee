//! openraft glue only: the type configuration; the durable log store ([`log_store`]: a
//! segmented WAL plus redb, really fsynced) and the rule of when an entry counts as durable
//! ([`durability`]); the state-machine store that applies entries and builds snapshots
//! ([`state_machine`]); the snapshot format, its store in sled and its intake
//! ([`snapshot`]); the tonic network between peers ([`network`], one Exchange stream per
//! peer) and the peer-facing service ([`service`]); what the peers' frames tell of their
//! wall clocks ([`clock_view`]); fault injection ([`faults`]) and the Raft gauges
//! ([`gauges`]).
//!
//! Nothing here knows the fleet's rules; it moves entries and snapshots.

// `declare_raft_types!` names `Cursor` unqualified for the default snapshot data type.
use std::io::Cursor;

use serde::{Deserialize, Serialize};

use crate::state::{FleetRequest, FleetResponse};

pub mod clock_view;
pub mod durability;
pub mod faults;
pub mod gauges;
pub mod log_store;
pub mod network;
pub mod service;
pub mod snapshot;
pub mod state_machine;

/// What openraft stores per member: where to reach it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberNode {
    /// Edge-facing gRPC address (`host:port`).
    pub api_addr: String,
    /// Peer-facing gRPC address for Raft traffic (`host:port`).
    pub raft_addr: String,
}

openraft::declare_raft_types!(
    /// The fleet's openraft configuration: entries carry a [`FleetRequest`].
    pub TypeConfig:
        D = FleetRequest,
        R = FleetResponse,
        Node = MemberNode,
);

/// The Raft handle of one node.
pub type Raft = openraft::Raft<TypeConfig>;
/// Our node id type.
pub type NodeId = u64;
/// The stored-log id type.
pub type LogId = openraft::LogId<NodeId>;
/// openraft's storage error for this config.
pub type StorageError = openraft::StorageError<NodeId>;
/// A Raft snapshot of this config.
pub type Snapshot = openraft::storage::Snapshot<TypeConfig>;
/// Snapshot metadata of this config.
pub type SnapshotMeta = openraft::SnapshotMeta<NodeId, MemberNode>;
/// Membership as stored in the state machine.
pub type StoredMembership = openraft::StoredMembership<NodeId, MemberNode>;
/// A log entry of this config.
pub type Entry = openraft::Entry<TypeConfig>;

/// A batch of edge commands a follower hands to the leader (the Peer `Propose` RPC), each
/// as the bytes the follower encoded it to ([`crate::state::EncodedCommand`]). A follower
/// sends from the batch's shared slice (`ProposeRequest<&[EncodedCommand]>`, the same
/// bytes); the leader decodes each command only to re-check it and proposes the bytes it
/// received.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ProposeRequest<C = Vec<crate::state::EncodedCommand>> {
    pub commands: C,
    /// What is left of the callers' deadline when the batch was sent.
    pub timeout_ms: u64,
}

/// Why a node did not take a proposal.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum ProposeRefusal {
    /// The receiver is not the leader; `leader_id` is its best guess.
    #[error("not the leader (leader: {leader_id:?})")]
    NotLeader { leader_id: Option<NodeId> },
    /// The queue is full: try again after `retry_after_ms`.
    #[error("overloaded, retry after {retry_after_ms} ms")]
    Overloaded { retry_after_ms: u64 },
    /// No commit within the deadline (the batch may still commit later).
    #[error("not committed in time: {reason}")]
    Unavailable { reason: String },
    /// The node hit a fatal error and stopped serving.
    #[error("fatal: {reason}")]
    Fatal { reason: String },
}

/// One answer per command, in order, or the reason the batch was not taken.
pub type ProposeResponse = Result<Vec<crate::state::Answer>, ProposeRefusal>;
