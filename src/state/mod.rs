//! The replicated state machine: the pure rules ([`rules`]), their vocabulary ([`model`])
//! and the openraft state-machine store that applies log entries and snapshots into sled
//! ([`store`]).
//!
//! [`rules`] and [`model`] never import tokio, tonic or sled: they are testable alone.

pub mod model;
pub mod rules;
mod shards;

pub use model::*;
pub use rules::{FleetState, LiveImage, StateImage};
