//! The commands of the `ankusa-fleet` binary besides the node's own start-up (`server`):
//! one module per command. `main.rs` parses the command line and calls one of them.
//!
//! - [`serve`]: run one node;
//! - [`dev`]: a local 3-node fleet in child processes;
//! - [`cluster`]: membership through any node's `raft_addr`;
//! - [`snapshot`]: backup (`save`) and restore of the fleet's state;
//! - [`certs`]: the fleet CA and its certificates;
//! - [`bench`](mod@bench): the load generator and the two storage benchmarks;
//! - [`nemesis`]: runs the `ankusa-fleet-nemesis` binary (a crate of its own).

pub mod bench;
pub mod certs;
pub mod cluster;
pub mod dev;
pub mod nemesis;
pub mod serve;
pub mod snapshot;

/// Prints a command's summary as pretty JSON on stdout.
///
/// # Errors
/// When the summary cannot be serialized.
pub fn print_json(summary: &impl serde::Serialize) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string_pretty(summary)?);
    Ok(())
}
