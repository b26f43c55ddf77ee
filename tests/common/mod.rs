//! Black-box harness: real `ankusa-fleet serve` processes, each with its own data dir, driven
//! over the public gRPC API. Every wait has a deadline; nothing sleeps and hopes.
//!
//! Every fleet listens on a loopback address of its own (`127.a.b.c`, never `127.0.0.1`), on
//! ports picked free there (bound on port 0). A port released by the harness and bound by a node
//! a moment later can be taken in between only by a bind on the same address, and no other test
//! binds that address: the port race between tests running in parallel is gone (a shared
//! `127.0.0.1` once lost it: another test's node took a raft port first). Outgoing connections
//! leave from `127.0.0.1`, so their ephemeral ports never collide with these listeners.
//!
//! The harness is split by what a test does with a fleet: `fleet.rs` starts, stops and
//! signals node processes and waits for conditions, `requests.rs` builds requests and makes
//! calls, `faults.rs` injects transport and disk faults, `observe.rs` reads status, metrics
//! and logs, `damage.rs` damages a stopped node's files and starts it from them. Every item
//! is reachable as `common::X`.
#![allow(dead_code)]

mod damage;
mod faults;
mod fleet;
mod observe;
mod requests;

// Each test binary uses part of the harness (as `dead_code` above says for items), so a
// re-export one binary never names is no error.
#[allow(unused_imports)]
pub use damage::*;
#[allow(unused_imports)]
pub use fleet::Start;
#[allow(unused_imports)]
pub use observe::*;
#[allow(unused_imports)]
pub use requests::*;

use std::net::Ipv4Addr;
use std::time::Duration;

/// Generous deadline for cluster-level conditions on a loaded 2-core machine.
pub const CONDITION_DEADLINE: Duration = Duration::from_secs(30);
/// Per-call timeout the tests ask for: long enough that a loaded machine still commits.
pub const CALL_TIMEOUT_MS: u32 = 10_000;

/// Waits until `check` yields `Some` (a condition outside any fleet: a lone process, a
/// file), or panics at [`CONDITION_DEADLINE`].
pub async fn wait_until<T>(what: &str, mut check: impl FnMut() -> Option<T>) -> T {
    let deadline = tokio::time::Instant::now() + CONDITION_DEADLINE;
    loop {
        if let Some(value) = check() {
            return value;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for: {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

pub fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new("info,openraft=warn"))
        .with_test_writer()
        .try_init();
}

/// Where a node listens: the launcher's ([`ankusa_fleet::cmd::launch`]); every test node serves
/// metrics.
pub use ankusa_fleet::cmd::launch::NodeSpec;

/// A fleet of node processes sharing one temp dir and one loopback address, started by the
/// one launcher ([`ankusa_fleet::cmd::launch::Fleet`], which it dereferences to: its `nodes`,
/// `start`, `kill`...).
pub struct Fleet {
    /// Declared first, so dropped first: the nodes stop before their dir goes.
    pub launch: ankusa_fleet::cmd::launch::Fleet,
    pub dir: tempfile::TempDir,
    pub ip: Ipv4Addr,
    pub initial: Vec<NodeSpec>,
}

impl std::ops::Deref for Fleet {
    type Target = ankusa_fleet::cmd::launch::Fleet;

    fn deref(&self) -> &Self::Target {
        &self.launch
    }
}

impl std::ops::DerefMut for Fleet {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.launch
    }
}
