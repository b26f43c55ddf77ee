//! The one table from errors to gRPC status codes: every error that leaves a service
//! (`Fleet` and its codec, `Admin`, `Peer`, Envoy's `RateLimitService`, and the connection
//! guard in front of them all) becomes a [`Status`] here, from a typed error, with the
//! error's `Display` as the message. Each error type has one `match` that picks its code;
//! the services return their own error types and convert with `Status::from` (or `?`) at
//! the boundary.
//!
//! It decides codes and nothing else: what is refused, and the words, are the error
//! types' own, beside the code that refuses. (The edge's readers of `HitStream` and
//! `HitBatch` replies, `api::stream_reply_result` and `batch::answer_result`, turn an
//! error carried in a reply back into the `Status` it was; they refuse nothing.)

use tonic::{Code, Status};

use super::admin::{AdminError, LEADER_RAFT_ADDR_HEADER};
use super::drain::Draining;
use super::envoy::EnvoyError;
use super::validate::InvalidArgument;
use super::wire::WireError;
use crate::accept::NoPlace;
use crate::node::NodeError;
use crate::raft::service::PeerCallError;
use crate::state::Refusal;

/// The status of `error`, with its `Display` as the message.
fn status(code: Code, error: &impl std::fmt::Display) -> Status {
    Status::new(code, error.to_string())
}

/// The node's errors, as the `Fleet`, `Admin` and Envoy services answer them.
pub fn status_of(error: NodeError) -> Status {
    status(node_code(&error), &error)
}

fn node_code(error: &NodeError) -> Code {
    match error {
        // Calls that can be answered locally are (contract §7); what reaches here is a
        // reset, which the fleet could not take in time (contract §10), or an admin call.
        NodeError::Unavailable { .. }
        | NodeError::Overloaded { .. }
        | NodeError::NotLeader { .. } => Code::Unavailable,
        NodeError::Membership { .. } | NodeError::MembershipRejected(_) => Code::FailedPrecondition,
        NodeError::Local(_)
        | NodeError::Fatal { .. }
        | NodeError::Failed(_)
        | NodeError::Command(_) => Code::Internal,
        NodeError::Refused {
            refusal: Refusal::Exhausted { .. },
        } => Code::ResourceExhausted,
        NodeError::Refused {
            refusal: Refusal::Invalid { .. },
        } => Code::InvalidArgument,
    }
}

impl From<NodeError> for Status {
    fn from(error: NodeError) -> Self {
        status_of(error)
    }
}

/// A request field that broke an input rule (contract §9).
impl From<InvalidArgument> for Status {
    fn from(error: InvalidArgument) -> Self {
        status(Code::InvalidArgument, &error)
    }
}

/// A call that came once the node began to drain: the edge retries on another node.
impl From<Draining> for Status {
    fn from(error: Draining) -> Self {
        status(Code::Unavailable, &error)
    }
}

/// A call on a connection that found no established place free (every service's).
impl From<NoPlace> for Status {
    fn from(error: NoPlace) -> Self {
        status(Code::Unavailable, &error)
    }
}

/// A request message that does not decode, or breaks a `HitBatch` frame's own rules.
impl From<WireError> for Status {
    fn from(error: WireError) -> Self {
        let code = match &error {
            WireError::Undecodable { .. } | WireError::TooManyHits => Code::InvalidArgument,
            WireError::HitTooLarge { .. } => Code::OutOfRange,
        };
        status(code, &error)
    }
}

impl From<AdminError> for Status {
    fn from(error: AdminError) -> Self {
        let code = match &error {
            AdminError::Identity { .. }
            | AdminError::AdminOnly { .. }
            | AdminError::OtherCluster { .. } => Code::PermissionDenied,
            AdminError::Invalid(_) => Code::InvalidArgument,
            AdminError::NoLeader => Code::Unavailable,
            AdminError::NotLeader { .. }
            | AdminError::DigestNeedsFaults
            | AdminError::FaultsOff(_) => Code::FailedPrecondition,
            AdminError::StopRaftCore(_) => Code::Internal,
            AdminError::Node(error) => node_code(error),
        };
        let mut status = status(code, &error);
        // The `cluster` and `snapshot` commands retry at the address in this header.
        if let AdminError::NotLeader { leader_raft_addr } = &error {
            if let Ok(value) = leader_raft_addr.parse() {
                status.metadata_mut().insert(LEADER_RAFT_ADDR_HEADER, value);
            }
        }
        status
    }
}

impl From<EnvoyError> for Status {
    fn from(error: EnvoyError) -> Self {
        let code = match &error {
            EnvoyError::Draining(_) => Code::Unavailable,
            EnvoyError::Invalid(_) => Code::InvalidArgument,
            EnvoyError::Node(error) => node_code(error),
        };
        status(code, &error)
    }
}

/// The `Peer` service's refusals (its error type lives in `raft::service`, which does not
/// import `api`: the table imports it).
impl From<PeerCallError> for Status {
    fn from(error: PeerCallError) -> Self {
        let code = match &error {
            PeerCallError::Identity(_)
            | PeerCallError::AdminCaller
            | PeerCallError::AdminCalls { .. }
            | PeerCallError::NotAsItself { .. }
            | PeerCallError::NotMember { .. }
            | PeerCallError::Learner { .. }
            | PeerCallError::OtherCluster { .. }
            | PeerCallError::VoteOfAnother { .. } => Code::PermissionDenied,
            PeerCallError::Dropped => Code::Unavailable,
            PeerCallError::ClockSkew { .. } => Code::FailedPrecondition,
            PeerCallError::Snapshot(_)
            | PeerCallError::ProposeTooLarge { .. }
            | PeerCallError::TooManyCommands { .. }
            | PeerCallError::MethodNotSet
            | PeerCallError::NotAMethod { .. }
            | PeerCallError::PastBound { .. }
            | PeerCallError::EntryDoesNotDecode { .. }
            | PeerCallError::Payload(_) => Code::InvalidArgument,
            PeerCallError::Encode(_) => Code::Internal,
        };
        status(code, &error)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::CodecError;
    use crate::identity::IdentityError;
    use crate::node::FleetUnavailable;
    use crate::pb::internal::PeerMethod;
    use crate::raft::faults::FaultInjectionOff;
    use crate::raft::snapshot::intake::SnapshotRefused;
    use crate::state::StateLimit;

    fn invalid() -> InvalidArgument {
        InvalidArgument {
            field: "claim.tenant".to_owned(),
            reason: "must not be empty".to_owned(),
        }
    }

    fn node_errors() -> Vec<(NodeError, Code)> {
        vec![
            (
                NodeError::Unavailable {
                    why: FleetUnavailable::NoLeader,
                },
                Code::Unavailable,
            ),
            (
                NodeError::Overloaded { retry_after_ms: 5 },
                Code::Unavailable,
            ),
            (
                NodeError::NotLeader {
                    leader_raft_addr: None,
                },
                Code::Unavailable,
            ),
            (
                NodeError::Membership {
                    reason: "x".to_owned(),
                },
                Code::FailedPrecondition,
            ),
            (
                NodeError::Fatal {
                    reason: "x".to_owned(),
                },
                Code::Internal,
            ),
            (
                NodeError::Failed(Box::new(std::io::Error::other("x"))),
                Code::Internal,
            ),
            (
                NodeError::Command(crate::codec::CodecError::Trailing { trailing_bytes: 1 }),
                Code::Internal,
            ),
            (
                NodeError::MembershipRejected(Box::new(openraft::error::RaftError::Fatal(
                    openraft::error::Fatal::Stopped,
                ))),
                Code::FailedPrecondition,
            ),
            (
                NodeError::Refused {
                    refusal: Refusal::Exhausted {
                        limit: StateLimit::ClaimsMax,
                    },
                },
                Code::ResourceExhausted,
            ),
            (
                NodeError::Refused {
                    refusal: Refusal::Invalid {
                        field: "commands[0].tenant".to_owned(),
                        reason: "x".to_owned(),
                    },
                },
                Code::InvalidArgument,
            ),
        ]
    }

    /// Each error kind gets its code, and its `Display` as the message.
    fn assert_table<E: std::fmt::Display>(cases: Vec<(E, Code)>, to_status: fn(E) -> Status) {
        for (error, code) in cases {
            let message = error.to_string();
            let status = to_status(error);
            assert_eq!(status.code(), code, "{message}");
            assert_eq!(status.message(), message);
        }
    }

    #[test]
    fn node_errors_get_their_codes() {
        assert_table(node_errors(), status_of);
        let unavailable = status_of(NodeError::Unavailable {
            why: FleetUnavailable::NoSnapshot { index: 7 },
        });
        assert_eq!(
            unavailable.message(),
            "the fleet did not answer in time: no snapshot covered log index 7 in time"
        );
    }

    #[test]
    fn edge_refusals_get_their_codes() {
        assert_table(vec![(invalid(), Code::InvalidArgument)], Status::from);
        assert_table(vec![(Draining, Code::Unavailable)], Status::from);
        assert_table(
            vec![
                (WireError::TooManyHits, Code::InvalidArgument),
                (
                    WireError::HitTooLarge { index: 1, bytes: 9 },
                    Code::OutOfRange,
                ),
            ],
            Status::from,
        );
        let envoy = vec![
            (EnvoyError::Draining(Draining), Code::Unavailable),
            (EnvoyError::Invalid(invalid()), Code::InvalidArgument),
        ]
        .into_iter()
        .chain(
            node_errors()
                .into_iter()
                .map(|(error, code)| (EnvoyError::Node(error), code)),
        )
        .collect();
        assert_table(envoy, Status::from);
    }

    #[tokio::test]
    async fn admin_refusals_get_their_codes() {
        let aborted = tokio::spawn(std::future::pending::<()>());
        aborted.abort();
        let join_error = aborted.await.expect_err("aborted");
        let admin = vec![
            (
                AdminError::Identity {
                    method: "AddMember",
                    source: IdentityError::NoCertificate,
                },
                Code::PermissionDenied,
            ),
            (
                AdminError::AdminOnly {
                    id: 2,
                    method: "AddMember",
                    cluster_id: "c".to_owned(),
                },
                Code::PermissionDenied,
            ),
            (
                AdminError::OtherCluster {
                    cluster_id: "d".to_owned(),
                    ours: "c".to_owned(),
                },
                Code::PermissionDenied,
            ),
            (AdminError::Invalid(invalid()), Code::InvalidArgument),
            (AdminError::NoLeader, Code::Unavailable),
            (AdminError::DigestNeedsFaults, Code::FailedPrecondition),
            (
                AdminError::FaultsOff(FaultInjectionOff),
                Code::FailedPrecondition,
            ),
            (AdminError::StopRaftCore(join_error), Code::Internal),
        ]
        .into_iter()
        .chain(node_errors().into_iter().map(|(error, code)| {
            let error = AdminError::from(error);
            // A node's "not the leader" is the admin's own answer.
            let code = match error {
                AdminError::NoLeader => Code::Unavailable,
                _ => code,
            };
            (error, code)
        }))
        .collect();
        assert_table(admin, Status::from);
        let status = Status::from(AdminError::from(NodeError::NotLeader {
            leader_raft_addr: Some("127.0.0.1:7001".to_owned()),
        }));
        assert_eq!(status.code(), Code::FailedPrecondition);
        assert_eq!(
            status
                .metadata()
                .get(LEADER_RAFT_ADDR_HEADER)
                .map(|v| v.to_str().ok()),
            Some(Some("127.0.0.1:7001"))
        );
    }

    #[test]
    fn peer_refusals_get_their_codes() {
        let method = PeerMethod::Vote;
        let codec = || CodecError::Trailing { trailing_bytes: 1 };
        let peer = vec![
            (
                PeerCallError::Identity(IdentityError::NoCertificate),
                Code::PermissionDenied,
            ),
            (PeerCallError::AdminCaller, Code::PermissionDenied),
            (PeerCallError::AdminCalls { method }, Code::PermissionDenied),
            (
                PeerCallError::NotAsItself {
                    id: 2,
                    method,
                    from_node_id: 3,
                },
                Code::PermissionDenied,
            ),
            (
                PeerCallError::NotMember { id: 2, method },
                Code::PermissionDenied,
            ),
            (
                PeerCallError::Learner { id: 2, method },
                Code::PermissionDenied,
            ),
            (
                PeerCallError::OtherCluster {
                    cluster_id: "d".to_owned(),
                    ours: "c".to_owned(),
                },
                Code::PermissionDenied,
            ),
            (
                PeerCallError::VoteOfAnother {
                    field: "vote.leader_id.node_id",
                    id: 2,
                    vote_node_id: 3,
                },
                Code::PermissionDenied,
            ),
            (PeerCallError::Dropped, Code::Unavailable),
            (
                PeerCallError::ClockSkew {
                    reason: "x".to_owned(),
                },
                Code::FailedPrecondition,
            ),
            (
                PeerCallError::Snapshot(SnapshotRefused {
                    field: "data",
                    reason: "x".to_owned(),
                }),
                Code::InvalidArgument,
            ),
            (
                PeerCallError::ProposeTooLarge { bytes: 1 },
                Code::InvalidArgument,
            ),
            (
                PeerCallError::TooManyCommands { count: 1 },
                Code::InvalidArgument,
            ),
            (PeerCallError::MethodNotSet, Code::InvalidArgument),
            (
                PeerCallError::NotAMethod { method: 99 },
                Code::InvalidArgument,
            ),
            (
                PeerCallError::PastBound {
                    field: "vote.term".to_owned(),
                    value: u64::MAX,
                },
                Code::InvalidArgument,
            ),
            (
                PeerCallError::EntryDoesNotDecode {
                    entry: 0,
                    command: 1,
                    source: codec(),
                },
                Code::InvalidArgument,
            ),
            (PeerCallError::Payload(codec()), Code::InvalidArgument),
            (PeerCallError::Encode(codec()), Code::Internal),
        ];
        assert_table(peer, Status::from);
        // The refusals an operator reads in a peer's log and a rogue caller receives, word
        // for word.
        let words = [
            (
                PeerCallError::AdminCalls { method },
                "identity admin may not call Peer/PEER_METHOD_VOTE: only member nodes may",
            ),
            (
                PeerCallError::AdminCaller,
                "identity admin may not call Peer: only member nodes may",
            ),
            (
                PeerCallError::NotAsItself {
                    id: 2,
                    method,
                    from_node_id: 3,
                },
                "identity node 2 may not call Peer/PEER_METHOD_VOTE as from_node_id 3",
            ),
            (
                PeerCallError::NotMember { id: 2, method },
                "identity node 2 may not call Peer/PEER_METHOD_VOTE: it is not a member of this fleet",
            ),
            (
                PeerCallError::Learner { id: 2, method },
                "identity node 2 is a learner and may not call Peer/PEER_METHOD_VOTE",
            ),
            (
                PeerCallError::VoteOfAnother {
                    field: "vote.leader_id.node_id",
                    id: 2,
                    vote_node_id: 3,
                },
                "vote.leader_id.node_id: identity node 2 may not send a vote of node 3",
            ),
            (PeerCallError::Dropped, "fault injection: dropped"),
        ];
        for (error, message) in words {
            assert_eq!(Status::from(error).message(), message);
        }
    }
}
