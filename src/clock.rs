//! The node's wall clock, in the microseconds the state machine counts in.
//!
//! The leader stamps each batch with it (contract §3) and the node-local engine decides
//! with it; nothing else reads the time of day.

use std::time::{SystemTime, UNIX_EPOCH};

/// Microseconds since the Unix epoch on this node's wall clock.
pub fn wall_clock_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}
