//! The expiry queue: one entry per stored item, taken once the clock reaches its deadline.
//!
//! A binary min-heap by deadline, kept in fixed chunks of [`CHUNK`] entries rather than one
//! array. A heap in one array grows by doubling it: past 500k entries that copy held apply
//! on every node at once for 9-13 ms (docs/benchmarks.md, round 18), and each doubling
//! after takes twice as long. Here growing adds one chunk, and no entry is copied; an
//! entry costs what it did in the array.

use super::Due;

/// Entries per chunk (32 bytes each: 128 KiB a chunk).
const CHUNK: usize = 4096;

/// Expiry entries, soonest deadline first. Entries due in the same microsecond come out in
/// no particular order: each is swept on its own.
#[derive(Clone, Debug, Default)]
pub(super) struct ExpiryQueue {
    /// Each allocated with room for [`CHUNK`] entries, never more; kept once made, as an
    /// array's capacity is.
    chunks: Vec<Vec<Due>>,
    len: usize,
}

impl ExpiryQueue {
    pub(super) fn push(&mut self, due: Due) {
        let (chunk, _) = place(self.len);
        if chunk == self.chunks.len() {
            self.chunks.push(Vec::with_capacity(CHUNK));
        }
        self.chunks[chunk].push(due);
        self.len += 1;
        self.sift_up(self.len - 1);
    }

    /// Takes an entry whose deadline is at or before `clock_us`, if there is one: the
    /// soonest.
    pub(super) fn pop_due(&mut self, clock_us: u64) -> Option<Due> {
        if self.len == 0 || self.deadline(0) > clock_us {
            return None;
        }
        let last = self.len - 1;
        self.swap(0, last);
        let (chunk, _) = place(last);
        let due = self.chunks[chunk].pop();
        self.len = last;
        self.sift_down(0);
        due
    }

    fn deadline(&self, at: usize) -> u64 {
        let (chunk, offset) = place(at);
        self.chunks[chunk][offset].deadline_us
    }

    fn swap(&mut self, a: usize, b: usize) {
        let ((chunk_a, offset_a), (chunk_b, offset_b)) = (place(a), place(b));
        if chunk_a == chunk_b {
            self.chunks[chunk_a].swap(offset_a, offset_b);
            return;
        }
        let (low, high) = (chunk_a.min(chunk_b), chunk_a.max(chunk_b));
        let (front, back) = self.chunks.split_at_mut(high);
        let (in_low, in_high) = if chunk_a < chunk_b {
            (offset_a, offset_b)
        } else {
            (offset_b, offset_a)
        };
        std::mem::swap(&mut front[low][in_low], &mut back[0][in_high]);
    }

    fn sift_up(&mut self, mut at: usize) {
        while at > 0 {
            let parent = (at - 1) / 2;
            if self.deadline(at) >= self.deadline(parent) {
                break;
            }
            self.swap(at, parent);
            at = parent;
        }
    }

    fn sift_down(&mut self, mut at: usize) {
        loop {
            let left = 2 * at + 1;
            if left >= self.len {
                break;
            }
            let right = left + 1;
            let sooner = if right < self.len && self.deadline(right) < self.deadline(left) {
                right
            } else {
                left
            };
            if self.deadline(sooner) >= self.deadline(at) {
                break;
            }
            self.swap(at, sooner);
            at = sooner;
        }
    }
}

/// The chunk and the offset in it of the entry at `at`.
fn place(at: usize) -> (usize, usize) {
    (at / CHUNK, at % CHUNK)
}
