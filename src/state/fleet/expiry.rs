//! The expiry queue: one entry per stored item, taken once the clock reaches its deadline.
//!
//! The entries are kept by the millisecond their deadline falls in, each millisecond's in a
//! small vector of its own in a B-tree. A binary heap of all of them grew by doubling one
//! array: past 500k entries that copy held apply on every node at once for 9-13 ms
//! (docs/benchmarks.md, round 18), and each doubling after takes twice as long. Here
//! nothing large is ever copied, and taking what is due reads the earliest millisecond
//! only, where a heap's pop walks its whole depth.

use std::collections::BTreeMap;

use super::Due;

/// Microseconds per slot of the queue.
const SLOT_US: u64 = 1_000;

/// Expiry entries by deadline, soonest millisecond first; within one millisecond in no
/// order (each is swept on its own, so their order changes nothing).
#[derive(Clone, Debug, Default)]
pub(super) struct ExpiryQueue {
    slots: BTreeMap<u64, Vec<Due>>,
}

impl ExpiryQueue {
    pub(super) fn push(&mut self, due: Due) {
        let slot = due.deadline_us / SLOT_US;
        self.slots.entry(slot).or_default().push(due);
    }

    /// Takes an entry whose deadline is at or before `clock_us`, if there is one.
    pub(super) fn pop_due(&mut self, clock_us: u64) -> Option<Due> {
        let mut first = self.slots.first_entry()?;
        let slot_end_us = first.key().saturating_add(1).saturating_mul(SLOT_US);
        let dues = first.get_mut();
        let due = if slot_end_us <= clock_us.saturating_add(1) {
            // The clock is past the whole millisecond: every entry in it is due.
            dues.pop()
        } else {
            let at = dues.iter().rposition(|due| due.deadline_us <= clock_us)?;
            Some(dues.swap_remove(at))
        };
        if dues.is_empty() {
            first.remove();
        }
        due
    }
}
