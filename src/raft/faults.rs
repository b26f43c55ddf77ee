//! Fault injection in the Raft transport, for fault tests: per peer, drop (unreachable at
//! once), black-hole (no answer until the caller's deadline) or delay traffic, both for
//! calls this node makes and calls it receives. Off unless the node's config says
//! `fault_injection = true`; then set through the Admin `SetFaults` call.
//!
//! A partition between A and B is a rule on each side; isolating a node is a rule for every
//! peer on that node alone (it covers both directions there).
//!
//! One rule is about the disk, not the network: holding the log writer keeps appended
//! entries in memory, neither written nor fsynced, until the hold is lifted. A node killed
//! meanwhile loses them, as it would in a power cut.

use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex, RwLock};
use std::time::Duration;

use super::NodeId;

/// What happens to traffic with one peer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Refused at once, as if the peer were down.
    Drop,
    /// Never answered: the caller waits until its own deadline.
    Blackhole,
    /// Delivered after a delay.
    Delay(Duration),
}

/// The node's fault rules, shared by its peer client and peer service.
#[derive(Clone, Default)]
pub struct Faults {
    enabled: bool,
    rules: Arc<RwLock<HashMap<NodeId, Fault>>>,
    /// Whether the log writer is held, and how it learns the hold was lifted.
    log_hold: Arc<(Mutex<bool>, Condvar)>,
}

impl Faults {
    /// Rules that can be set (`fault_injection = true`) or not.
    pub fn new(enabled: bool) -> Self {
        Self {
            enabled,
            rules: Arc::default(),
            log_hold: Arc::default(),
        }
    }

    /// Replaces every rule; an empty map heals.
    ///
    /// # Errors
    /// When fault injection is not enabled in this node's config.
    pub fn set(&self, rules: HashMap<NodeId, Fault>) -> Result<(), &'static str> {
        if !self.enabled {
            return Err("fault injection is off (config key fault_injection)");
        }
        let mut current = crate::lock::write(&self.rules);
        tracing::info!(?rules, "fault rules set");
        *current = rules;
        Ok(())
    }

    /// The rule for traffic with `peer`, if any.
    pub fn get(&self, peer: NodeId) -> Option<Fault> {
        if !self.enabled {
            return None;
        }
        let rules = crate::lock::read(&self.rules);
        rules.get(&peer).copied()
    }

    /// Holds (`true`) or releases the log writer: while held, appends wait in memory.
    ///
    /// # Errors
    /// When fault injection is not enabled in this node's config.
    pub fn hold_log_writes(&self, hold: bool) -> Result<(), &'static str> {
        if !self.enabled {
            return Err("fault injection is off (config key fault_injection)");
        }
        let (held, changed) = &*self.log_hold;
        *crate::lock::lock(held) = hold;
        changed.notify_all();
        tracing::info!(hold, "log writer hold set");
        Ok(())
    }

    /// Blocks the calling thread (the log writer) while the log writer is held.
    pub fn wait_while_log_held(&self) {
        if !self.enabled {
            return;
        }
        let (held, changed) = &*self.log_hold;
        let guard = crate::lock::lock(held);
        let _released = crate::lock::wait_while(changed, guard, |held| *held);
    }
}
