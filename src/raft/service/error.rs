//! What the `Peer` service refuses, as a typed error (its gRPC codes are in `api::status`).

use super::{PROPOSE_BYTES_MAX, TERM_OR_INDEX_MAX};
use crate::codec::CodecError;
use crate::identity::IdentityError;
use crate::pb::internal::PeerMethod;
use crate::raft::snapshot::intake::SnapshotRefused;
use crate::raft::NodeId;

/// What the `Peer` service refuses. Its gRPC codes are in `api::status`, the one table of
/// them (this module does not import `api`: the table imports this type); each refusal's
/// words are what the caller reads and what the refusal log writes.
#[derive(Debug, thiserror::Error)]
pub enum PeerCallError {
    /// The connection's certificate names no identity of this fleet.
    #[error("Peer: {0}")]
    Identity(#[source] IdentityError),
    /// The admin identity, refused before the call's message is read.
    #[error("identity admin may not call Peer: only member nodes may")]
    AdminCaller,
    #[error("identity admin may not call Peer/{}: only member nodes may", .method.as_str_name())]
    AdminCalls { method: PeerMethod },
    /// A node that sends as another.
    #[error(
        "identity node {id} may not call Peer/{} as from_node_id {from_node_id}",
        .method.as_str_name()
    )]
    NotAsItself {
        id: NodeId,
        method: PeerMethod,
        from_node_id: NodeId,
    },
    #[error(
        "identity node {id} may not call Peer/{}: it is not a member of this fleet",
        .method.as_str_name()
    )]
    NotMember { id: NodeId, method: PeerMethod },
    /// A learner sends no Vote, AppendEntries or InstallSnapshot.
    #[error("identity node {id} is a learner and may not call Peer/{}", .method.as_str_name())]
    Learner { id: NodeId, method: PeerMethod },
    /// Traffic of another fleet; `cluster_id` as `identity::shown` prints the caller's.
    #[error(
        "refused raft traffic from another cluster: cluster_id {cluster_id} is not this \
         node's cluster `{ours}`"
    )]
    OtherCluster { cluster_id: String, ours: String },
    /// A vote that is not the caller's own: a node campaigns and leads only as itself.
    #[error("{field}: identity node {id} may not send a vote of node {vote_node_id}")]
    VoteOfAnother {
        field: &'static str,
        id: NodeId,
        vote_node_id: NodeId,
    },
    /// A fault rule drops the sender's calls.
    #[error("fault injection: dropped")]
    Dropped,
    /// A vote refused to a candidate whose clock is too far from this node's.
    #[error("wall_clock_us: {reason}")]
    ClockSkew { reason: String },
    #[error("{0}")]
    Snapshot(#[source] SnapshotRefused),
    #[error("payload: {bytes} bytes, a Propose is at most {PROPOSE_BYTES_MAX}")]
    ProposeTooLarge { bytes: usize },
    #[error(
        "commands: {count} commands, a Propose carries at most {}",
        crate::config::BATCH_COMMANDS_MAX_MAX
    )]
    TooManyCommands { count: usize },
    #[error("method: not set")]
    MethodNotSet,
    #[error("method: {method} is not a Peer method")]
    NotAMethod { method: i32 },
    /// A term or log index past [`TERM_OR_INDEX_MAX`].
    #[error("{field}: {value} is past {TERM_OR_INDEX_MAX}")]
    PastBound { field: String, value: u64 },
    /// An entry the follower could not apply.
    #[error(
        "entries[{entry}].payload.commands[{command}]: does not decode to one command: {source}"
    )]
    EntryDoesNotDecode {
        entry: usize,
        command: usize,
        #[source]
        source: CodecError,
    },
    #[error("payload: {0}")]
    Payload(#[source] CodecError),
    /// This node's answer did not encode.
    #[error("encode: {0}")]
    Encode(#[source] CodecError),
}
