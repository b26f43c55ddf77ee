//! Settles the fleet did not take in time, kept on this node's disk until the fleet applies
//! them (contract §6: a settle is never lost, also across a restart of this node).
//!
//! An append-only [`Journal`] of its own, `settle-queue.journal` in the data dir: a settle
//! is appended and its record synced (one `fdatasync`, shared by the settles that arrive
//! meanwhile) before the edge is told `QUEUED`; removing it after the fleet answered appends
//! a removal, not synced (a crash may hand an applied settle over again, which applies it
//! again: the same hook, the same outcome). Order is kept: keys are sequence numbers, and
//! [`SettleQueue::all`] lists them oldest first. The settles waiting are also held in
//! memory, as the journal's live set.
//!
//! Before this journal the queue was a sled tree in `state.sled`, whose flush writes and
//! syncs the whole store (tens of milliseconds behind a busy disk, past a settle's
//! deadline); [`SettleQueue::open`] moves what a node of that version left there into the
//! journal (docs/storage.md).

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

use super::journal::{Entry, Journal};
use super::LocalError;
use crate::codec;
use crate::lock::lock;
use crate::state::{ClaimKey, HookId, SettleOutcome};
use crate::storage::sled_disk::SledDisk;
use crate::storage::unless_panic;

/// The sled tree the queue was kept in before its journal (read once, to move it).
const LEGACY_TREE: &str = "settle_queue";

/// One settle waiting for the fleet.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueuedSettle {
    pub key: ClaimKey,
    pub hook_id: HookId,
    pub outcome: SettleOutcome,
    pub ttl_ms: u64,
}

/// The queue's journal records: a settle by its sequence number; a queued settle stays
/// until it is removed, whatever the time.
pub struct Queued;

impl Entry for Queued {
    type Key = u64;
    type Value = QueuedSettle;
    const NAME: &'static str = "settle queue";
    const THREAD: &'static str = "settle-queue";

    fn live(_: &QueuedSettle, _: u64) -> bool {
        true
    }
}

/// The settles waiting, by sequence number, and the next number to give.
#[derive(Default)]
struct Waiting {
    settles: BTreeMap<u64, QueuedSettle>,
    next: u64,
}

/// The on-disk queue of settles.
pub struct SettleQueue {
    journal: Journal<Queued>,
    waiting: Mutex<Waiting>,
}

impl SettleQueue {
    /// Opens the queue's journal at `path`; what a previous run left is still there, and
    /// so is what a node of the previous version left in `legacy`'s sled tree, moved into
    /// the journal now (synced, then the tree emptied and flushed).
    ///
    /// # Errors
    /// When the journal cannot be read, written or synced, or the legacy tree cannot be
    /// read (sled fails or panics, or a record does not decode).
    pub fn open(path: &Path, legacy: &SledDisk) -> Result<Self, LocalError> {
        let (journal, live) = Journal::<Queued>::open(path, 0)?;
        let settles: BTreeMap<u64, QueuedSettle> = live.into_iter().collect();
        let next = settles.last_key_value().map_or(0, |(seq, _)| seq + 1);
        let queue = Self {
            journal,
            waiting: Mutex::new(Waiting { settles, next }),
        };
        queue.move_legacy(legacy)?;
        Ok(queue)
    }

    /// Moves the settles of the legacy sled tree into the journal, oldest first.
    fn move_legacy(&self, disk: &SledDisk) -> Result<(), LocalError> {
        let tree = unless_panic(|| disk.db().open_tree(LEGACY_TREE))
            .map_err(LocalError::QueuePanicked)??;
        let legacy =
            unless_panic(|| legacy_settles(&tree)).map_err(LocalError::QueuePanicked)??;
        if legacy.is_empty() {
            return Ok(());
        }
        self.push_blocking(&legacy)?;
        tree.clear()?;
        disk.flush_to_disk()?;
        tracing::info!(
            settles = legacy.len(),
            "settle queue: moved from state.sled into its journal"
        );
        Ok(())
    }

    /// Appends a settle and waits until it is on disk.
    ///
    /// # Errors
    /// When the journal cannot write or sync it: the caller must not answer `QUEUED`.
    pub async fn push(&self, settle: &QueuedSettle) -> Result<(), LocalError> {
        self.append(settle)?;
        self.journal.sync().await?;
        Ok(())
    }

    /// Appends `settles` and waits until they are on disk, blocking (at start-up).
    ///
    /// # Errors
    /// As [`SettleQueue::push`].
    pub fn push_blocking(&self, settles: &[QueuedSettle]) -> Result<(), LocalError> {
        for settle in settles {
            self.append(settle)?;
        }
        futures::executor::block_on(self.journal.sync())?;
        Ok(())
    }

    fn append(&self, settle: &QueuedSettle) -> Result<(), LocalError> {
        let mut waiting = lock(&self.waiting);
        let seq = waiting.next;
        waiting.next += 1;
        waiting.settles.insert(seq, settle.clone());
        self.persist(&waiting, seq)
    }

    /// Journals `seq`'s current value (or its absence); compacts the journal when it grew
    /// enough, under the same lock, so the live set and the appends stay in order.
    fn persist(&self, waiting: &Waiting, seq: u64) -> Result<(), LocalError> {
        if self.journal.append(&seq, waiting.settles.get(&seq))? {
            self.journal.compact(waiting.settles.iter())?;
        }
        Ok(())
    }

    /// Everything queued, oldest first, with the sequence numbers to remove them by.
    pub fn all(&self) -> Vec<(u64, QueuedSettle)> {
        lock(&self.waiting)
            .settles
            .iter()
            .map(|(seq, settle)| (*seq, settle.clone()))
            .collect()
    }

    /// Removes a settle the fleet applied.
    ///
    /// # Errors
    /// When the journal takes no more records (an earlier write failed).
    pub fn remove(&self, seq: u64) -> Result<(), LocalError> {
        let mut waiting = lock(&self.waiting);
        if waiting.settles.remove(&seq).is_some() {
            self.persist(&waiting, seq)?;
        }
        Ok(())
    }

    /// Waits until every removal so far is on disk (at shutdown, so a restart does not
    /// hand applied settles over again).
    ///
    /// # Errors
    /// When a write failed.
    pub async fn sync(&self) -> Result<(), LocalError> {
        Ok(self.journal.sync().await?)
    }

    /// Number of settles waiting.
    pub fn len(&self) -> usize {
        lock(&self.waiting).settles.len()
    }

    /// True when nothing waits.
    pub fn is_empty(&self) -> bool {
        lock(&self.waiting).settles.is_empty()
    }
}

/// The settles of the legacy sled tree, oldest first (its keys are big-endian sequence
/// numbers).
fn legacy_settles(tree: &sled::Tree) -> Result<Vec<QueuedSettle>, LocalError> {
    let mut settles = Vec::new();
    for item in tree.iter() {
        let (key, value) = item?;
        let seq = <[u8; 8]>::try_from(key.as_ref()).map_or(0, u64::from_be_bytes);
        let settle = codec::decode(&value).map_err(|source| LocalError::Record { seq, source })?;
        settles.push(settle);
    }
    Ok(settles)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::layout::{SETTLE_QUEUE_JOURNAL, STATE_SLED_DIR};

    fn settle(key: &str, outcome: SettleOutcome) -> QueuedSettle {
        QueuedSettle {
            key: ClaimKey {
                tenant: "acme".into(),
                source_id: "stripe".into(),
                key: key.into(),
            },
            hook_id: HookId::from(format!("hook-{key}").as_str()),
            outcome,
            ttl_ms: 60_000,
        }
    }

    fn open(dir: &Path) -> (SettleQueue, SledDisk) {
        let disk = SledDisk::open(&dir.join(STATE_SLED_DIR), 1 << 20).expect("sled");
        let queue = SettleQueue::open(&dir.join(SETTLE_QUEUE_JOURNAL), &disk).expect("queue");
        (queue, disk)
    }

    fn outcomes(queue: &SettleQueue) -> Vec<QueuedSettle> {
        queue.all().into_iter().map(|(_, settle)| settle).collect()
    }

    #[tokio::test]
    async fn settles_stay_in_order_across_a_reopen_until_removed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (a, b, c) = (
            settle("a", SettleOutcome::Commit),
            settle("b", SettleOutcome::Release),
            settle("c", SettleOutcome::Commit),
        );
        {
            let (queue, _disk) = open(dir.path());
            for one in [&a, &b, &c] {
                queue.push(one).await.expect("push");
            }
            let first = queue.all()[0].0;
            queue.remove(first).expect("remove");
            queue.sync().await.expect("sync");
            assert_eq!(outcomes(&queue), vec![b.clone(), c.clone()]);
        }
        let (queue, _disk) = open(dir.path());
        assert_eq!(outcomes(&queue), vec![b.clone(), c.clone()]);
        // New settles follow the ones left, never reusing a number.
        queue.push(&a).await.expect("push");
        assert_eq!(outcomes(&queue), vec![b, c, a]);
        assert_eq!(queue.len(), 3);
    }

    #[tokio::test]
    async fn a_queue_left_in_state_sled_moves_into_the_journal_once() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (a, b) = (
            settle("a", SettleOutcome::Commit),
            settle("b", SettleOutcome::Release),
        );
        {
            // What a node of the previous version left: big-endian sequence numbers.
            let disk = SledDisk::open(&dir.path().join(STATE_SLED_DIR), 1 << 20).expect("sled");
            let tree = disk.db().open_tree(LEGACY_TREE).expect("tree");
            for (seq, one) in [(7u64, &a), (9, &b)] {
                tree.insert(seq.to_be_bytes(), codec::encode(one).expect("encode"))
                    .expect("insert");
            }
            disk.flush_to_disk().expect("flush");
        }
        {
            let (queue, disk) = open(dir.path());
            assert_eq!(outcomes(&queue), vec![a.clone(), b.clone()]);
            let tree = disk.db().open_tree(LEGACY_TREE).expect("tree");
            assert!(tree.is_empty(), "the legacy tree is emptied");
        }
        let (queue, _disk) = open(dir.path());
        assert_eq!(outcomes(&queue), vec![a, b], "moved once, not twice");
    }

    #[test]
    fn a_legacy_record_that_does_not_decode_is_an_error_naming_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        {
            let disk = SledDisk::open(&dir.path().join(STATE_SLED_DIR), 1 << 20).expect("sled");
            let tree = disk.db().open_tree(LEGACY_TREE).expect("tree");
            tree.insert(5u64.to_be_bytes(), &[0xff; 3]).expect("insert");
            disk.flush_to_disk().expect("flush");
        }
        let disk = SledDisk::open(&dir.path().join(STATE_SLED_DIR), 1 << 20).expect("sled");
        let refused = SettleQueue::open(&dir.path().join(SETTLE_QUEUE_JOURNAL), &disk);
        assert!(
            matches!(refused, Err(LocalError::Record { seq: 5, .. })),
            "{:?}",
            refused.err()
        );
    }
}
