//! The node's wall clock, in the microseconds the state machine counts in.
//!
//! The leader stamps each batch with it (contract §3) and the node-local engine decides
//! with it; nothing else reads the time of day.
//!
//! Fault injection can set it off by an offset, to play a node whose clock is wrong (the
//! nemesis's `clock` fault). The offset is process-wide: one node per process, as `serve`
//! runs.

use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// The fault-injection offset, in microseconds (0 unless a fault set it).
static FAULT_OFFSET_US: AtomicI64 = AtomicI64::new(0);

/// Microseconds since the Unix epoch on this node's wall clock.
pub fn wall_clock_us() -> u64 {
    let now_us = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
        .unwrap_or(0);
    now_us.saturating_add_signed(FAULT_OFFSET_US.load(Ordering::Relaxed))
}

/// Sets the wall clock's offset (only `raft::faults` calls this, with fault injection on);
/// `true` if it changed.
pub(crate) fn set_fault_offset_ms(offset_ms: i64) -> bool {
    let offset_us = offset_ms.saturating_mul(1_000);
    FAULT_OFFSET_US.swap(offset_us, Ordering::Relaxed) != offset_us
}
