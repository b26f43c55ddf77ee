//! ankusa-fleet: replicated GCRA rate limiting and two-phase webhook dedupe for an edge
//! fleet, with no external store. What it promises is docs/contract.md; the folders follow
//! a hit (docs/architecture.md).
//!
//! # How a hit flows
//!
//! 1. [`api`]: the edge calls `Fleet.Hit` on its local node; [`api::FleetService`]
//!    validates the request ([`api::validate::hit`], contract §9) into a
//!    [`node::request::HitInput`].
//! 2. [`node`]: [`node::Node::hit`] takes the route [`node::route::route`] gives it:
//!    node-scoped parts go to [`local::LocalEngine`], fleet-scoped parts become a
//!    [`state::Command`], encoded once ([`state::EncodedCommand`]: every later hop carries
//!    those bytes) and queued on the [`node::propose::Proposer`], and a fleet that does not
//!    answer in time is answered for by [`local::Fallback`].
//! 3. The batcher drains the queue into one batch; [`node::router::Router`] commits it:
//!    on the leader as one `Raft::client_write` of a [`state::FleetRequest`] stamped with the
//!    leader's clock; on a follower as one `Propose` frame on the peer's `Exchange` stream
//!    ([`raft::network::PeerClients::propose`]) that the leader's
//!    [`raft::service::PeerService`] feeds into its own queue.
//! 4. [`raft`]: openraft appends the entry to [`raft::log_store::LogStore`] (fsynced) on a
//!    majority, under the rule of [`raft::durability`]; then
//!    [`raft::state_machine::StateMachineStore`] applies it on every node with
//!    [`state::rules::apply_batch`].
//! 5. [`state`]: pure rules, the entry's time, no IO. The answers travel back the same
//!    way, one per caller, marked `DECIDED_BY_FLEET`.
//!
//! Snapshots ([`raft::snapshot`]) encode a frozen point-in-time copy of the state off the
//! async runtime, while apply goes on, and are kept in sled; a restarting node loads its
//! snapshot and replays the log after it.

// openraft's trait signatures fix `StorageError`/`RaftError` (over 128 bytes) as the error
// types of the storage and network paths; boxing them locally would only add copies.
#![allow(clippy::result_large_err)]

pub mod accept;
pub mod api;
pub mod clock;
pub mod cmd;
pub mod codec;
pub mod config;
pub mod contract;
pub mod identity;
pub mod limits;
pub mod local;
pub mod lock;
pub mod node;
pub mod planted;
pub mod raft;
pub mod server;
pub mod state;
pub mod storage;
pub mod telemetry;
pub mod tls;

/// Generated protobuf and gRPC code.
#[allow(clippy::all, missing_docs)]
pub mod pb {
    tonic::include_proto!("ankusa.fleet.v1");

    /// The edge API's file descriptors, for gRPC reflection.
    pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("fleet_descriptor");

    /// The descriptors of Envoy's `envoy.service.ratelimit.v3.RateLimitService` and the
    /// files it imports (cut by build.rs from the set envoy-types ships), for reflection.
    pub const ENVOY_RLS_DESCRIPTOR_SET: &[u8] =
        tonic::include_file_descriptor_set!("envoy_rls_descriptor");

    /// Node-to-node and administration services.
    pub mod internal {
        tonic::include_proto!("ankusa.fleet.internal.v1");
    }
}
