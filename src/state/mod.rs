//! The replicated state machine, pure: its vocabulary ([`model`]), the container of
//! buckets and claims with its expiry ([`FleetState`], in `fleet` and `shards`), and the
//! rules that apply commands to it ([`rules`]), and the input rules a command must meet
//! before a leader proposes it ([`check`]).
//!
//! Nothing under `state/` does IO, reads a clock or imports raft, openraft, tokio, tonic
//! or sled: openraft's state-machine store is `raft::state_machine`, snapshots are in
//! `raft::snapshot`. So every rule is testable alone, and every replica that applies the same
//! entries reaches the same state.

pub mod check;
mod encoded;
mod fleet;
pub mod model;
pub mod rules;
mod shards;

pub use encoded::EncodedCommand;
pub use fleet::{FleetState, LiveImage, StateImage, BUCKET_BYTES_ESTIMATE, CLAIM_BYTES_ESTIMATE};
pub use model::*;
