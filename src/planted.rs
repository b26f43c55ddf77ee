//! Known bugs a node can be told to play (`planted_bug` in its config), for the nemesis's
//! own tests: a checker that cannot catch a planted bug proves nothing.
//!
//! They exist only in a build with the `planted-bugs` cargo feature (the nemesis's test
//! builds turn it on; a release build does not). Every check asks [`Planted::is`]: without
//! the feature a [`Planted`] holds nothing and the answer is the constant `false`, so the
//! checks on the hot paths (`Node::hit`, the stores) compile away, and `config` refuses a
//! `planted_bug` at load.

use serde::Deserialize;

/// A known bug, as the config names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PlantedBug {
    /// Answer `duplicate` (naming the holder) for a claim held pending.
    DuplicateForPending,
    /// Answer a settle `queued` without writing it to the settle queue.
    ForgetQueuedSettle,
    /// Apply entries with this node's own wall clock instead of the leader's stamp.
    OwnClock,
    /// Report a follower's appended entries to openraft before they are fsynced, so the
    /// leader counts them towards a quorum while they could still be lost.
    EarlyFollowerAck,
    /// Grant one charge more than a bucket holds: every charge of a hit goes on with its
    /// capacity raised by one increment.
    OneChargeOver,
    /// Stamp entries with the leader's wall clock as it reads, and never stand down for a
    /// clock off from the others: the fleet's time before `max_clock_offset_ms` bounded it.
    UnboundedClock,
}

/// Whether this build can plant bugs (the `planted-bugs` feature).
pub const AVAILABLE: bool = cfg!(feature = "planted-bugs");

/// The bug a node plays, if any (`Default`: none). Empty (a zero-sized type) without the
/// `planted-bugs` feature.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Planted {
    #[cfg(feature = "planted-bugs")]
    bug: Option<PlantedBug>,
}

impl Planted {
    /// `bug` planted; `None` where this build has no planted bugs (`config` refuses a
    /// `planted_bug` there before it gets here).
    pub fn new(bug: PlantedBug) -> Option<Self> {
        #[cfg(feature = "planted-bugs")]
        return Some(Self { bug: Some(bug) });
        #[cfg(not(feature = "planted-bugs"))]
        {
            let _ = bug;
            None
        }
    }

    /// Whether the node plays `bug`: always `false` without the feature.
    #[inline(always)]
    pub fn is(self, bug: PlantedBug) -> bool {
        #[cfg(feature = "planted-bugs")]
        return self.bug == Some(bug);
        #[cfg(not(feature = "planted-bugs"))]
        {
            let _ = bug;
            false
        }
    }
}
