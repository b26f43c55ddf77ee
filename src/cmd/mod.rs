//! The commands of the `ankusa-fleet` binary besides the node's own start-up (`server`):
//! one module per command. `main.rs` parses the command line and calls one of them.
//!
//! - [`serve`]: run one node;
//! - [`dev`]: a local 3-node fleet in child processes, started by [`launch`], the one
//!   launcher of child-process fleets (the tests and the nemesis use it too);
//! - [`cluster`]: membership through any node's `raft_addr`;
//! - [`snapshot`]: backup (`save`) and restore of the fleet's state;
//! - [`certs`]: the fleet CA and its certificates;
//! - [`bench`](mod@bench): the load generator and the two storage benchmarks;
//! - [`nemesis`]: runs the `ankusa-fleet-nemesis` binary (a crate of its own).

pub mod bench;
pub mod certs;
pub mod cluster;
pub mod dev;
pub mod launch;
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

/// An error as one line: its message, then each cause its message does not already hold.
/// (Most of the node's errors name their cause in their message and also keep it as their
/// `source`, for code that walks the chain; printed whole, the chain would say it twice.)
pub fn one_line(error: &anyhow::Error) -> String {
    let mut text = error.to_string();
    for cause in error.chain().skip(1) {
        let cause = cause.to_string();
        if !text.contains(&cause) {
            text.push_str(": ");
            text.push_str(&cause);
        }
    }
    text
}

#[cfg(test)]
mod tests {
    use super::one_line;

    #[derive(Debug, thiserror::Error)]
    #[error("raft log store: {0}")]
    struct Outer(#[source] std::io::Error);

    #[test]
    fn a_cause_already_in_the_message_is_said_once_and_a_context_s_cause_is_kept() {
        let io = || std::io::Error::other("segment 7 is damaged");
        let typed = anyhow::Error::new(Outer(io()));
        assert_eq!(one_line(&typed), "raft log store: segment 7 is damaged");
        let with_context = anyhow::Error::new(io()).context("writing data/node1.toml");
        assert_eq!(
            one_line(&with_context),
            "writing data/node1.toml: segment 7 is damaged"
        );
    }
}
