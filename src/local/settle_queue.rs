//! Settles the fleet did not take in time, kept on this node's disk until the fleet applies
//! them (contract §6: a settle is never lost, also across a restart of this node).
//!
//! Written and synced to the disk ([`SledDisk::flush_to_disk`]) before the edge is told
//! `QUEUED`; removed only after the fleet
//! answered it. Order is kept: keys are a big-endian sequence number.

use serde::{Deserialize, Serialize};

use super::LocalError;
use crate::codec;
use crate::state::{ClaimKey, HookId, SettleOutcome};
use crate::storage::sled_disk::SledDisk;
use crate::storage::unless_panic;

/// The sled tree of queued settles.
const QUEUE_TREE: &str = "settle_queue";

/// One settle waiting for the fleet.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueuedSettle {
    pub key: ClaimKey,
    pub hook_id: HookId,
    pub outcome: SettleOutcome,
    pub ttl_ms: u64,
}

/// The on-disk queue of settles.
pub struct SettleQueue {
    disk: SledDisk,
    tree: sled::Tree,
}

impl SettleQueue {
    /// Opens the queue in `disk`; what a previous run left is still there.
    ///
    /// # Errors
    /// When sled fails.
    pub fn open(disk: &SledDisk) -> Result<Self, LocalError> {
        let tree = unless_panic(|| disk.db().open_tree(QUEUE_TREE))
            .map_err(LocalError::QueuePanicked)??;
        Ok(Self {
            disk: disk.clone(),
            tree,
        })
    }

    /// Appends a settle and syncs it to the disk before returning.
    ///
    /// # Errors
    /// When sled cannot write it or it cannot be synced: the caller must not answer `QUEUED`.
    pub async fn push(&self, settle: &QueuedSettle) -> Result<(), LocalError> {
        self.insert(settle)?;
        let disk = self.disk.clone();
        tokio::task::spawn_blocking(move || disk.flush_to_disk())
            .await
            .map_err(std::io::Error::other)??;
        Ok(())
    }

    /// Appends `settles` and syncs them to the disk, blocking (at start-up).
    ///
    /// # Errors
    /// As [`SettleQueue::push`].
    pub fn push_blocking(&self, settles: &[QueuedSettle]) -> Result<(), LocalError> {
        for settle in settles {
            self.insert(settle)?;
        }
        self.disk.flush_to_disk()?;
        Ok(())
    }

    fn insert(&self, settle: &QueuedSettle) -> Result<(), LocalError> {
        let seq = self.disk.db().generate_id()?;
        self.tree
            .insert(seq.to_be_bytes(), codec::encode(settle)?)?;
        Ok(())
    }

    /// As [`SettleQueue::all`], a panic in sled (reading a damaged file) an error too.
    ///
    /// # Errors
    /// As [`SettleQueue::all`], or when sled panicked.
    pub fn all_checked(&self) -> Result<Vec<(u64, QueuedSettle)>, LocalError> {
        unless_panic(|| self.all()).map_err(LocalError::QueuePanicked)?
    }

    /// Everything queued, oldest first, with the sequence numbers to remove them by.
    ///
    /// # Errors
    /// When sled fails or a record does not decode.
    pub fn all(&self) -> Result<Vec<(u64, QueuedSettle)>, LocalError> {
        let mut queued = Vec::new();
        for item in self.tree.iter() {
            let (key, value) = item?;
            let mut seq = [0u8; 8];
            if key.len() == 8 {
                seq.copy_from_slice(&key);
            }
            let seq = u64::from_be_bytes(seq);
            let settle =
                codec::decode(&value).map_err(|source| LocalError::Record { seq, source })?;
            queued.push((seq, settle));
        }
        Ok(queued)
    }

    /// Removes a settle the fleet applied.
    ///
    /// # Errors
    /// When sled fails.
    pub fn remove(&self, seq: u64) -> Result<(), LocalError> {
        self.tree.remove(seq.to_be_bytes())?;
        Ok(())
    }

    /// Number of settles waiting.
    pub fn len(&self) -> usize {
        self.tree.len()
    }

    /// True when nothing waits.
    pub fn is_empty(&self) -> bool {
        self.tree.is_empty()
    }
}
