//! Settles the fleet did not take in time, kept on this node's disk until the fleet applies
//! them (contract §6: a settle is never lost, also across a restart of this node).
//!
//! An append-only [`Journal`] of its own, `settle-queue.journal` in the data dir, with its
//! own flusher thread: a settle is appended and its record synced (one `fdatasync`, shared
//! by the settles that arrive meanwhile) before the edge is told `QUEUED`. Removing it
//! after the fleet answered appends a removal that nobody waits for (the flusher syncs it
//! within about a millisecond; a crash before that hands the applied settle over again,
//! which applies it again: the same hook, the same outcome). Order is kept: keys are
//! sequence numbers, and [`SettleQueue::all`] lists them oldest first. The settles waiting
//! are also held in memory, as the journal's live set.
//!
//! Before this journal the queue was a sled tree in `state.sled`, whose flush writes and
//! syncs the whole store (tens of milliseconds behind a busy disk, past a settle's
//! deadline); [`SettleQueue::open`] moves what a node of that version left there into the
//! journal once (docs/storage.md).

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

use super::journal::{Entry, Journal, JournalError};
use super::LocalError;
use crate::clock::wall_clock_us;
use crate::codec;
use crate::lock::lock;
use crate::state::{ClaimKey, HookId, SettleOutcome};
use crate::storage::layout::SETTLE_QUEUE_MOVED;
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
    /// Opens the queue's journal at `path`; what a previous run left is still there. On
    /// the first start after an upgrade, what a node of the previous version left in
    /// `legacy`'s sled tree is moved into the journal (see `SettleQueue::move_legacy`).
    ///
    /// # Errors
    /// When the journal cannot be read, written or synced (a record numbered `u64::MAX`,
    /// which no queue reaches, is damage too), or the legacy tree cannot be read (sled
    /// fails or panics, or a record does not decode).
    pub fn open(path: &Path, legacy: &SledDisk) -> Result<Self, LocalError> {
        let (journal, live) = Journal::<Queued>::open(path, wall_clock_us())?;
        let settles: BTreeMap<u64, QueuedSettle> = live.into_iter().collect();
        let next = match settles.last_key_value() {
            None => 0,
            Some((seq, _)) => seq.checked_add(1).ok_or_else(|| JournalError::Damaged {
                name: Queued::NAME,
                path: path.to_owned(),
                offset: 0,
                reason: format!("a settle numbered {seq}, past any queue's count"),
            })?,
        };
        let queue = Self {
            journal,
            waiting: Mutex::new(Waiting { settles, next }),
        };
        let moved = crate::storage::parent_dir(path).join(SETTLE_QUEUE_MOVED);
        queue.move_legacy(legacy, &moved)?;
        Ok(queue)
    }

    /// Moves the settles of the legacy sled tree into the journal, oldest first, once:
    /// synced, then the marker `moved` written and synced, then the tree dropped. A crash
    /// before the marker moves them again on the next start (the same settles queued
    /// twice: applied twice at worst, the same hook with the same outcome). With the
    /// marker there, an empty tree (a crash before its drop) is dropped, and settles in it
    /// refuse the start ([`LocalError::MovedTwice`]): a node of the previous version ran
    /// here since and answered `QUEUED` for them, or sled brought a dropped tree back from
    /// a damaged file (docs/storage.md); applying them, or not, could each be wrong.
    fn move_legacy(&self, disk: &SledDisk, moved: &Path) -> Result<(), LocalError> {
        let marker = |source| LocalError::Marker {
            path: moved.to_owned(),
            source,
        };
        let names = unless_panic(|| disk.db().tree_names()).map_err(LocalError::QueuePanicked)?;
        if !names
            .iter()
            .any(|name| name.as_ref() == LEGACY_TREE.as_bytes())
        {
            return Ok(()); // no sled queue: nothing to move
        }
        let legacy = unless_panic(|| {
            disk.db()
                .open_tree(LEGACY_TREE)
                .map_err(LocalError::from)
                .and_then(|tree| legacy_settles(&tree))
        })
        .map_err(LocalError::QueuePanicked)??;
        if moved.try_exists().map_err(marker)? {
            if !legacy.is_empty() {
                return Err(LocalError::MovedTwice {
                    settles: legacy.len(),
                    marker: moved.to_owned(),
                });
            }
        } else {
            self.push_blocking(&legacy)?;
            std::fs::File::create(moved)
                .and_then(|file| file.sync_all())
                .and_then(|()| crate::storage::sync_dir(crate::storage::parent_dir(moved)))
                .map_err(marker)?;
        }
        unless_panic(|| disk.db().drop_tree(LEGACY_TREE)).map_err(LocalError::QueuePanicked)??;
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
        // Unconstrained: called from a runtime's task at start-up, a `sync` that ran out of
        // tokio's cooperative budget would hand its wake-up to a scheduler that `block_on`
        // never returns to.
        futures::executor::block_on(tokio::task::unconstrained(self.journal.sync()))?;
        Ok(())
    }

    /// Journals the settle, then keeps it in memory (a settle the journal did not take is
    /// not queued); compacts the journal when it grew enough, under the same lock, so the
    /// live set and the appends stay in order.
    fn append(&self, settle: &QueuedSettle) -> Result<(), LocalError> {
        let mut waiting = lock(&self.waiting);
        let seq = waiting.next;
        let compact = self.journal.append(&seq, Some(settle))?;
        waiting.next += 1;
        waiting.settles.insert(seq, settle.clone());
        if compact {
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
        if waiting.settles.remove(&seq).is_some() && self.journal.append(&seq, None)? {
            self.journal.compact(waiting.settles.iter())?;
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
        // A key of another length is damage too: the record is then named by its place.
        let seq =
            <[u8; 8]>::try_from(key.as_ref()).map_or(settles.len() as u64, u64::from_be_bytes);
        let settle = codec::decode(&value).map_err(|source| LocalError::Record { seq, source })?;
        settles.push(settle);
    }
    Ok(settles)
}

#[cfg(test)]
pub(crate) mod tests {
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

    /// sled lets go of its file lock from a thread of its own, a moment after the last
    /// handle is dropped: a reopen waits for it, within a deadline.
    pub(crate) fn sled(dir: &Path) -> SledDisk {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        loop {
            match SledDisk::open(&dir.join(STATE_SLED_DIR), 1 << 20) {
                Ok(disk) => return disk,
                Err(e) if std::time::Instant::now() < deadline => {
                    tracing::debug!(error = %e, "state.sled still locked");
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
                Err(e) => panic!("sled: {e:?}"),
            }
        }
    }

    fn open(dir: &Path) -> (SettleQueue, SledDisk) {
        let disk = sled(dir);
        let queue = SettleQueue::open(&dir.join(SETTLE_QUEUE_JOURNAL), &disk).expect("queue");
        (queue, disk)
    }

    /// Writes `settles` into the legacy sled tree, as a node of the previous version did.
    fn legacy(dir: &Path, settles: &[(u64, &QueuedSettle)]) {
        let disk = sled(dir);
        let tree = disk.db().open_tree(LEGACY_TREE).expect("tree");
        for (seq, one) in settles {
            tree.insert(seq.to_be_bytes(), codec::encode(*one).expect("encode"))
                .expect("insert");
        }
        disk.flush_to_disk().expect("flush");
    }

    fn has_legacy_tree(disk: &SledDisk) -> bool {
        let names = disk.db().tree_names();
        names
            .iter()
            .any(|name| name.as_ref() == LEGACY_TREE.as_bytes())
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
        {
            let (queue, _disk) = open(dir.path());
            assert_eq!(outcomes(&queue), vec![b.clone(), c.clone()]);
            // New settles follow the ones left.
            queue.push(&a).await.expect("push");
            assert_eq!(outcomes(&queue), vec![b.clone(), c.clone(), a.clone()]);
            assert_eq!(queue.len(), 3);
            // The newest removed: its number is given again after a reopen, and no record
            // of the removed settle comes back with it (the reopen rewrote the live set).
            let newest = queue.all()[2].0;
            queue.remove(newest).expect("remove");
            queue.sync().await.expect("sync");
        }
        let (queue, _disk) = open(dir.path());
        assert_eq!(outcomes(&queue), vec![b.clone(), c.clone()]);
        queue.push(&c).await.expect("push");
        assert_eq!(outcomes(&queue), vec![b, c.clone(), c]);
    }

    #[tokio::test]
    async fn a_queue_left_in_state_sled_moves_into_the_journal_once() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (a, b) = (
            settle("a", SettleOutcome::Commit),
            settle("b", SettleOutcome::Release),
        );
        // What a node of the previous version left: big-endian sequence numbers.
        legacy(dir.path(), &[(7, &a), (9, &b)]);
        {
            let (queue, disk) = open(dir.path());
            assert_eq!(outcomes(&queue), vec![a.clone(), b.clone()]);
            assert!(!has_legacy_tree(&disk), "the legacy tree is dropped");
            assert!(dir.path().join(SETTLE_QUEUE_MOVED).exists(), "the marker");
        }
        // Settles in the tree again (a node of the previous version ran here since, or
        // sled brought the tree back): not moved twice, not dropped either, the start
        // refused; an empty tree is dropped.
        legacy(dir.path(), &[(7, &a), (9, &b)]);
        let disk = sled(dir.path());
        let refused = SettleQueue::open(&dir.path().join(SETTLE_QUEUE_JOURNAL), &disk);
        assert!(
            matches!(refused, Err(LocalError::MovedTwice { settles: 2, .. })),
            "{:?}",
            refused.err()
        );
        disk.db().drop_tree(LEGACY_TREE).expect("drop");
        disk.db().open_tree(LEGACY_TREE).expect("an empty tree");
        let queue = SettleQueue::open(&dir.path().join(SETTLE_QUEUE_JOURNAL), &disk).expect("open");
        assert_eq!(outcomes(&queue), vec![a, b], "moved once, not twice");
        assert!(!has_legacy_tree(&disk), "the empty tree is dropped");
    }

    #[test]
    fn a_node_that_never_had_the_sled_queue_moves_nothing_and_makes_no_tree() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (queue, disk) = open(dir.path());
        assert!(queue.is_empty());
        assert!(!has_legacy_tree(&disk));
        assert!(!dir.path().join(SETTLE_QUEUE_MOVED).exists());
    }

    #[test]
    fn a_legacy_record_that_does_not_decode_is_an_error_naming_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        {
            let disk = sled(dir.path());
            let tree = disk.db().open_tree(LEGACY_TREE).expect("tree");
            tree.insert(5u64.to_be_bytes(), &[0xff; 3]).expect("insert");
            disk.flush_to_disk().expect("flush");
        }
        let disk = sled(dir.path());
        let refused = SettleQueue::open(&dir.path().join(SETTLE_QUEUE_JOURNAL), &disk);
        assert!(
            matches!(refused, Err(LocalError::Record { seq: 5, .. })),
            "{:?}",
            refused.err()
        );
    }
}
