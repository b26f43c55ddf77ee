//! Why a call left the node unanswered: [`NodeError`], and [`FleetUnavailable`] when the
//! fleet could not take it in time (contract §7 then has the node answer from its own
//! state). Their gRPC codes are in `api::status`.

use openraft::error::{CheckIsLeaderError, ClientWriteError, RaftError};

use crate::local::LocalError;
use crate::raft::{MemberNode, NodeId, ProposeRefusal};
use crate::state::Refusal;

/// A call the node could not answer.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    #[error("the fleet did not answer in time: {why}")]
    Unavailable {
        #[source]
        why: FleetUnavailable,
    },
    #[error("overloaded, retry after {retry_after_ms} ms")]
    Overloaded { retry_after_ms: u64 },
    #[error("this node is not the leader (leader raft_addr: {leader_raft_addr:?})")]
    NotLeader { leader_raft_addr: Option<String> },
    /// This node refused a membership change (its own words).
    #[error("membership change refused: {reason}")]
    Membership { reason: String },
    /// openraft refused a membership change (boxed: openraft's error is large).
    #[error("membership change refused: {0}")]
    MembershipRejected(#[source] Box<RaftError<NodeId, ClientWriteError<NodeId, MemberNode>>>),
    #[error("local store: {0}")]
    Local(#[from] LocalError),
    /// Something that cannot happen on a sound node did (its own words, or a peer's).
    #[error("fatal: {reason}")]
    Fatal { reason: String },
    /// A store or openraft failed under a call: the cause, kept.
    #[error("fatal: {0}")]
    Failed(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// A command did not encode (never one of the crate's: see `EncodedCommand::encode`).
    #[error("fatal: command: {0}")]
    Command(#[source] crate::codec::CodecError),
    /// The fleet refused the command (a state limit, or the leader's re-check of its
    /// fields): nothing was written, and it is never decided locally instead.
    #[error("{refusal}")]
    Refused { refusal: Refusal },
}

/// Why the fleet could not take a call in time.
#[derive(Debug, thiserror::Error)]
pub enum FleetUnavailable {
    /// The proposal queue knew no leader to send the call to.
    #[error("no leader")]
    NoLeader,
    /// The proposal was not committed by its deadline (it may still commit later); the
    /// reason as the proposal queue or the leader gave it, text on the wire between nodes.
    #[error("{reason}")]
    NotCommitted { reason: String },
    /// A backup's linearizable read: no quorum confirmed the leadership in time.
    #[error("no quorum confirmed the leader in time")]
    NoQuorum,
    /// A backup: no snapshot covering the read was built in time.
    #[error("no snapshot covered log index {index} in time")]
    NoSnapshot { index: u64 },
    /// A backup's linearizable read failed (boxed: openraft's error is large).
    #[error("{0}")]
    Read(#[source] Box<RaftError<NodeId, CheckIsLeaderError<NodeId, MemberNode>>>),
}

impl NodeError {
    /// The fleet could not take the call (no leader, its deadline passed, or its queue is
    /// full): contract §7 has this node answer from its own state instead.
    pub(super) fn fleet_unavailable(&self) -> bool {
        matches!(
            self,
            NodeError::Unavailable { .. } | NodeError::Overloaded { .. }
        )
    }
}

impl From<crate::codec::CodecError> for NodeError {
    fn from(e: crate::codec::CodecError) -> Self {
        NodeError::Command(e)
    }
}

impl From<ProposeRefusal> for NodeError {
    fn from(refusal: ProposeRefusal) -> Self {
        match refusal {
            ProposeRefusal::NotLeader { .. } => NodeError::Unavailable {
                why: FleetUnavailable::NoLeader,
            },
            ProposeRefusal::Overloaded { retry_after_ms } => {
                NodeError::Overloaded { retry_after_ms }
            }
            ProposeRefusal::Unavailable { reason } => NodeError::Unavailable {
                why: FleetUnavailable::NotCommitted { reason },
            },
            ProposeRefusal::Fatal { reason } => NodeError::Fatal { reason },
        }
    }
}
