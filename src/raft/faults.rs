//! Fault injection in the Raft transport, for fault tests: per peer, drop (unreachable at
//! once), black-hole (no answer until the caller's deadline) or delay traffic, both for
//! calls this node makes and calls it receives. Off unless the node's config says
//! `fault_injection = true`; then set through the Admin `SetFaults` call.
//!
//! A partition between A and B is a rule on each side; isolating a node is a rule for every
//! peer on that node alone (it covers both directions there). A rule may cover one
//! direction only: calls this node makes to the peer (its answers included), or calls the
//! peer makes to it. That is a one-way link.
//!
//! One rule is about the disk, not the network: holding the log writer keeps appended
//! entries in memory, neither written nor fsynced, until the hold is lifted. A node killed
//! meanwhile loses them, as it would in a power cut.
//!
//! Three more are about the node itself: an offset on its wall clock ([`crate::clock`]), a
//! stop of its Raft core (the Admin call stops it; [`Faults::may_stop_raft_core`] only says
//! whether it may), and a known bug it plays for the nemesis's own tests
//! ([`crate::planted`], set in the config, never through the Admin call).

use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex, RwLock};
use std::time::Duration;

use super::NodeId;
use crate::planted::Planted;

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

/// Which traffic with a peer a rule covers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Direction {
    /// Both ways.
    #[default]
    Both,
    /// Only calls this node makes to the peer.
    Outgoing,
    /// Only calls the peer makes to this node.
    Incoming,
}

/// A fault rule sent to a node whose config does not allow them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("fault injection is off (config key fault_injection)")]
pub struct FaultInjectionOff;

/// The node's fault rules, shared by its peer client and peer service.
#[derive(Clone, Default)]
pub struct Faults {
    enabled: bool,
    rules: Arc<RwLock<HashMap<NodeId, (Fault, Direction)>>>,
    planted: Planted,
    /// Whether the log writer is held, and how it learns the hold was lifted.
    log_hold: Arc<(Mutex<bool>, Condvar)>,
}

impl Faults {
    /// Rules that can be set (`fault_injection = true`) or not.
    pub fn new(enabled: bool) -> Self {
        Self {
            enabled,
            rules: Arc::default(),
            planted: Planted::default(),
            log_hold: Arc::default(),
        }
    }

    /// The same rules, with `planted` (it takes effect only with fault injection on).
    pub fn planting(self, planted: Planted) -> Self {
        Self { planted, ..self }
    }

    /// Whether fault injection is on (`fault_injection = true`).
    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// The bug this node plays, if any (never without fault injection).
    pub fn planted(&self) -> Planted {
        if self.enabled {
            self.planted
        } else {
            Planted::default()
        }
    }

    /// Replaces every rule; an empty map heals.
    ///
    /// # Errors
    /// When fault injection is not enabled in this node's config.
    pub fn set(&self, rules: HashMap<NodeId, (Fault, Direction)>) -> Result<(), FaultInjectionOff> {
        if !self.enabled {
            return Err(FaultInjectionOff);
        }
        let mut current = crate::lock::write(&self.rules);
        tracing::info!(?rules, "fault rules set");
        *current = rules;
        Ok(())
    }

    /// The rule for calls this node makes to `peer`, if any.
    pub fn outgoing(&self, peer: NodeId) -> Option<Fault> {
        self.rule(peer, Direction::Outgoing)
    }

    /// The rule for calls `peer` makes to this node, if any.
    pub fn incoming(&self, peer: NodeId) -> Option<Fault> {
        self.rule(peer, Direction::Incoming)
    }

    fn rule(&self, peer: NodeId, direction: Direction) -> Option<Fault> {
        if !self.enabled {
            return None;
        }
        let rules = crate::lock::read(&self.rules);
        rules
            .get(&peer)
            .filter(|(_, covers)| *covers == Direction::Both || *covers == direction)
            .map(|(fault, _)| *fault)
    }

    /// Sets this node's wall-clock offset (see [`crate::clock`]); 0 heals.
    ///
    /// # Errors
    /// When fault injection is not enabled in this node's config.
    pub fn set_clock_offset_ms(&self, offset_ms: i64) -> Result<(), FaultInjectionOff> {
        if !self.enabled {
            return Err(FaultInjectionOff);
        }
        if crate::clock::set_fault_offset_ms(offset_ms) {
            tracing::info!(offset_ms, "wall clock offset set");
        }
        Ok(())
    }

    /// Whether this node's Raft core may be stopped on purpose (the Admin call does it, as
    /// a fatal error would: the node then reports it, drains and exits).
    ///
    /// # Errors
    /// When fault injection is not enabled in this node's config.
    pub fn may_stop_raft_core(&self) -> Result<(), FaultInjectionOff> {
        if !self.enabled {
            return Err(FaultInjectionOff);
        }
        tracing::warn!("stopping the Raft core on purpose (fault injection)");
        Ok(())
    }

    /// Holds (`true`) or releases the log writer: while held, appends wait in memory.
    ///
    /// # Errors
    /// When fault injection is not enabled in this node's config.
    pub fn hold_log_writes(&self, hold: bool) -> Result<(), FaultInjectionOff> {
        if !self.enabled {
            return Err(FaultInjectionOff);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::planted::PlantedBug;

    /// A one-way rule covers only its direction; a both-ways rule covers both; nothing is
    /// covered with fault injection off, and a planted bug shows only with it on.
    #[test]
    fn rules_cover_their_direction_only() {
        let faults = Faults::new(true);
        let rules = HashMap::from([
            (2, (Fault::Drop, Direction::Outgoing)),
            (3, (Fault::Blackhole, Direction::Incoming)),
            (4, (Fault::Drop, Direction::Both)),
        ]);
        faults.set(rules).expect("fault injection is on");
        assert_eq!(
            (faults.outgoing(2), faults.incoming(2)),
            (Some(Fault::Drop), None)
        );
        assert_eq!(
            (faults.outgoing(3), faults.incoming(3)),
            (None, Some(Fault::Blackhole))
        );
        assert_eq!(
            (faults.outgoing(4), faults.incoming(4)),
            (Some(Fault::Drop), Some(Fault::Drop))
        );
        assert_eq!((faults.outgoing(5), faults.incoming(5)), (None, None));

        // Planted where the build has planted bugs (`planted-bugs`), none otherwise.
        let own_clock = Planted::new(PlantedBug::OwnClock).unwrap_or_default();
        let off = Faults::new(false).planting(own_clock);
        assert!(off.set(HashMap::new()).is_err());
        assert!(off.set_clock_offset_ms(1).is_err());
        assert!(off.may_stop_raft_core().is_err());
        assert!(Faults::new(true).may_stop_raft_core().is_ok());
        assert!(!off.planted().is(PlantedBug::OwnClock));
        let on = Faults::new(true).planting(own_clock);
        assert_eq!(
            on.planted().is(PlantedBug::OwnClock),
            crate::planted::AVAILABLE
        );
    }
}
