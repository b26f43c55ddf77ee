//! How the latest snapshot is laid out in its sled tree: a record (meta, generation,
//! length) under `CURRENT_KEY` and the encoded bytes in `CHUNK_BYTES` pieces under
//! `chunk_key`.
//!
//! In chunks, sled copies one megabyte at a time on the way in, never the whole snapshot
//! (docs/decisions has the measurement).
//!
//! A write puts the new generation's chunks first and the record last: sled recovers a
//! prefix of its writes after a crash, so the record never names chunks that are not there.
//! Chunks of any other generation are leftovers and are removed.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use openraft::StorageIOError;
use serde::{Deserialize, Serialize};

use crate::codec;
use crate::raft::{SnapshotMeta, StorageError};
use crate::storage::sled_disk::SledDisk;

/// The sled tree holding the latest snapshot (laid out by this module).
pub(crate) const SNAPSHOT_TREE: &str = "snapshots";

/// The state machine could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum StateStoreError {
    #[error("sled: {0}")]
    Sled(#[from] sled::Error),
    #[error("syncing sled to the disk: {0}")]
    Sync(#[from] std::io::Error),
    #[error("the thread reading the snapshot failed: {0}")]
    Reader(String),
    #[error("stored snapshot is unreadable: {0}")]
    Snapshot(#[from] crate::raft::snapshot::SnapshotFormatError),
    #[error("stored snapshot metadata is unreadable: {0}")]
    Meta(#[from] codec::CodecError),
    #[error(
        "stored snapshot has {found_bytes} bytes in its chunks, its record says {expected_bytes}"
    )]
    Chunks {
        expected_bytes: u64,
        found_bytes: u64,
    },
}

/// The latest snapshot: metadata plus the encoded (checksummed) body.
pub(crate) struct StoredSnapshot {
    pub(crate) meta: SnapshotMeta,
    pub(crate) data: Vec<u8>,
}

/// The node's stored snapshot: its sled tree, its size, and the turns writes take (cheap
/// to clone: clones share one store).
#[derive(Clone)]
pub struct SnapshotStore {
    inner: Arc<StoreInner>,
}

struct StoreInner {
    tree: sled::Tree,
    disk: SledDisk,
    /// Size of the current snapshot (0: none yet).
    bytes: AtomicU64,
    /// Tells the snapshots this node builds apart.
    seq: AtomicU64,
    /// Held while a snapshot is written (see [`SnapshotStore::persist`]).
    writing: Mutex<()>,
}

impl SnapshotStore {
    /// Opens the snapshot tree of `disk`, with the snapshot it holds, if any.
    ///
    /// # Errors
    /// When sled fails or the stored record or chunks do not add up.
    pub(crate) fn open(disk: &SledDisk) -> Result<(Self, Option<StoredSnapshot>), StateStoreError> {
        let tree = disk.db().open_tree(SNAPSHOT_TREE)?;
        let current = read(&tree)?;
        let bytes = current
            .as_ref()
            .map_or(0, |stored| stored.data.len() as u64);
        let store = Self {
            inner: Arc::new(StoreInner {
                tree,
                disk: disk.clone(),
                bytes: AtomicU64::new(bytes),
                seq: AtomicU64::new(0),
                writing: Mutex::new(()),
            }),
        };
        Ok((store, current))
    }

    /// Size in bytes of the current snapshot, built here or installed (0: none yet).
    pub fn bytes(&self) -> u64 {
        self.inner.bytes.load(Ordering::Relaxed)
    }

    /// A number no other snapshot built by this process has.
    pub(crate) fn next_seq(&self) -> u64 {
        self.inner.seq.fetch_add(1, Ordering::Relaxed)
    }

    /// The current snapshot, if any.
    ///
    /// # Errors
    /// As [`read`].
    pub(crate) fn current(&self) -> Result<Option<StoredSnapshot>, StateStoreError> {
        read(&self.inner.tree)
    }

    /// The current snapshot, if any, read between writes (a write that removes the chunks
    /// being read cannot come in between), off the async runtime.
    ///
    /// # Errors
    /// As [`read`].
    pub(crate) async fn current_between_writes(
        &self,
    ) -> Result<Option<StoredSnapshot>, StateStoreError> {
        let inner = Arc::clone(&self.inner);
        tokio::task::spawn_blocking(move || {
            let _no_write_meanwhile = crate::lock::lock(&inner.writing);
            read(&inner.tree)
        })
        .await
        .map_err(|e| StateStoreError::Reader(e.to_string()))?
    }

    /// Writes `data` as the current snapshot and syncs it to the disk (openraft purges the
    /// log it covers once this returns), off the async runtime; hands `data` back (it is
    /// moved to the blocking thread, not copied).
    ///
    /// openraft builds snapshots in a task of their own, so a build can finish while an
    /// installed snapshot is being stored: writes take turns, and one older than the stored
    /// snapshot is not written (openraft drops an older build too), so the stored snapshot
    /// never goes back behind a log that may already be purged.
    ///
    /// # Errors
    /// When sled fails or its files cannot be synced.
    pub async fn persist(
        &self,
        meta: &SnapshotMeta,
        data: Vec<u8>,
    ) -> Result<Vec<u8>, StorageError> {
        let signature = meta.signature();
        let inner = Arc::clone(&self.inner);
        let meta = meta.clone();
        let written = tokio::task::spawn_blocking(move || {
            let _one_at_a_time = crate::lock::lock(&inner.writing);
            if write(&inner.tree, &inner.disk, &meta, &data)? {
                inner.bytes.store(data.len() as u64, Ordering::Relaxed);
            } else {
                tracing::info!(
                    snapshot_id = %meta.snapshot_id,
                    "not stored: a newer snapshot is already stored"
                );
            }
            Ok(data)
        })
        .await
        .map_err(|e| StorageIOError::write_snapshot(Some(signature.clone()), &e))?;
        written.map_err(|e: StateStoreError| {
            StorageIOError::write_snapshot(Some(signature), &e).into()
        })
    }
}

/// The record naming the current snapshot.
const CURRENT_KEY: &[u8] = b"current-chunked";
/// Every chunk key starts with this (not a prefix of the record's key).
const CHUNK_PREFIX: &[u8] = b"chunk/";
/// Bytes per chunk.
const CHUNK_BYTES: usize = 1 << 20;

/// What [`CURRENT_KEY`] holds.
#[derive(Serialize, Deserialize)]
struct CurrentRecord {
    meta: SnapshotMeta,
    /// Tells this snapshot's chunks from a previous one's.
    generation: u64,
    len_bytes: u64,
}

fn generation_prefix(generation: u64) -> Vec<u8> {
    let mut prefix = CHUNK_PREFIX.to_vec();
    prefix.extend_from_slice(&generation.to_be_bytes());
    prefix
}

/// Big-endian numbers, so a scan returns the chunks in order.
fn chunk_key(generation: u64, index: u64) -> Vec<u8> {
    let mut key = generation_prefix(generation);
    key.extend_from_slice(&index.to_be_bytes());
    key
}

fn read_record(tree: &sled::Tree) -> Result<Option<CurrentRecord>, StateStoreError> {
    match tree.get(CURRENT_KEY)? {
        Some(bytes) => Ok(Some(codec::decode(&bytes)?)),
        None => Ok(None),
    }
}

/// The current snapshot, if any.
///
/// # Errors
/// When sled fails, the record does not decode, or the chunks do not add up to its length.
pub(crate) fn read(tree: &sled::Tree) -> Result<Option<StoredSnapshot>, StateStoreError> {
    let Some(record) = read_record(tree)? else {
        return Ok(None);
    };
    let expected_bytes = record.len_bytes;
    // The length is read from disk: it sizes nothing until the chunks really add up to it.
    let mut data = Vec::new();
    for chunk in tree.scan_prefix(generation_prefix(record.generation)) {
        let (_, chunk) = chunk?;
        data.extend_from_slice(&chunk);
        if data.len() as u64 > expected_bytes {
            break;
        }
    }
    if data.len() as u64 != expected_bytes {
        return Err(StateStoreError::Chunks {
            expected_bytes,
            found_bytes: data.len() as u64,
        });
    }
    Ok(Some(StoredSnapshot {
        meta: record.meta,
        data,
    }))
}

/// Makes `meta` and `data` the current snapshot and syncs it to the disk; `false`, and nothing
/// written, when the stored snapshot covers a later log id than `meta` (the caller makes
/// writes take turns).
///
/// # Errors
/// When sled fails or its files cannot be synced.
pub(crate) fn write(
    tree: &sled::Tree,
    disk: &SledDisk,
    meta: &SnapshotMeta,
    data: &[u8],
) -> Result<bool, StateStoreError> {
    let previous = read_record(tree)?;
    if previous
        .as_ref()
        .is_some_and(|record| record.meta.last_log_id > meta.last_log_id)
    {
        return Ok(false);
    }
    let previous = previous.map(|record| record.generation);
    remove_chunks_except(tree, previous)?;
    let generation = previous.map_or(0, |generation| generation.wrapping_add(1));
    for (index, chunk) in (0u64..).zip(data.chunks(CHUNK_BYTES)) {
        tree.insert(chunk_key(generation, index), chunk)?;
    }
    let record = CurrentRecord {
        meta: meta.clone(),
        generation,
        len_bytes: data.len() as u64,
    };
    tree.insert(CURRENT_KEY, codec::encode(&record)?)?;
    disk.flush_to_disk()?;
    remove_chunks_except(tree, Some(generation))?;
    Ok(true)
}

/// Removes every chunk that does not belong to generation `keep`.
fn remove_chunks_except(tree: &sled::Tree, keep: Option<u64>) -> Result<(), StateStoreError> {
    let kept = keep.map(generation_prefix);
    for item in tree.scan_prefix(CHUNK_PREFIX).keys() {
        let key = item?;
        if kept.as_ref().is_some_and(|kept| key.starts_with(kept)) {
            continue;
        }
        tree.remove(key)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn open() -> (tempfile::TempDir, SledDisk, sled::Tree) {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = SledDisk::open(&dir.path().join("db"), 1 << 20).expect("sled");
        let tree = db.db().open_tree("snapshots").expect("tree");
        (dir, db, tree)
    }

    fn meta(id: &str) -> SnapshotMeta {
        SnapshotMeta {
            last_log_id: None,
            last_membership: Default::default(),
            snapshot_id: id.to_owned(),
        }
    }

    fn chunk_keys(tree: &sled::Tree) -> usize {
        tree.scan_prefix(CHUNK_PREFIX).count()
    }

    #[test]
    fn a_snapshot_reads_back_whole_and_replaces_the_one_before() {
        let (_dir, db, tree) = open();
        assert!(read(&tree).expect("read").is_none());
        let big: Vec<u8> = (0..CHUNK_BYTES * 2 + 5).map(|i| (i % 251) as u8).collect();
        write(&tree, &db, &meta("a"), &big).expect("write");
        assert_eq!(chunk_keys(&tree), 3);
        let stored = read(&tree).expect("read").expect("a snapshot");
        assert_eq!(stored.meta.snapshot_id, "a");
        assert_eq!(stored.data, big);

        write(&tree, &db, &meta("b"), b"small").expect("write");
        assert_eq!(chunk_keys(&tree), 1, "the older chunks are gone");
        let stored = read(&tree).expect("read").expect("a snapshot");
        assert_eq!(stored.meta.snapshot_id, "b");
        assert_eq!(stored.data, b"small");
    }

    #[test]
    fn a_missing_chunk_is_refused_and_leftovers_are_cleared() {
        let (_dir, db, tree) = open();
        let data = vec![7u8; CHUNK_BYTES + 1];
        write(&tree, &db, &meta("a"), &data).expect("write");
        // A crash in the middle of the next write leaves chunks nobody names.
        tree.insert(chunk_key(1, 0), &b"torn"[..]).expect("insert");
        assert_eq!(read(&tree).expect("read").expect("a snapshot").data, data);

        tree.remove(chunk_key(0, 1)).expect("remove");
        assert!(matches!(
            read(&tree),
            Err(StateStoreError::Chunks {
                expected_bytes,
                found_bytes,
            }) if expected_bytes == data.len() as u64 && found_bytes == CHUNK_BYTES as u64
        ));

        write(&tree, &db, &meta("b"), b"b").expect("write");
        assert_eq!(
            chunk_keys(&tree),
            1,
            "the leftover and the old chunk are gone"
        );
        assert_eq!(read(&tree).expect("read").expect("a snapshot").data, b"b");
    }

    /// A build that finishes after a newer snapshot was installed does not replace it: the
    /// stored snapshot, and the size the snapshot policy reads, stay the newer one.
    #[tokio::test]
    async fn an_older_snapshot_never_replaces_a_newer_stored_one() {
        let (_dir, db, _tree) = open();
        let (snapshots, _) = SnapshotStore::open(&db).expect("open");
        let meta = |index: u64| SnapshotMeta {
            last_log_id: Some(openraft::LogId::new(
                openraft::CommittedLeaderId::new(1, 1),
                index,
            )),
            last_membership: Default::default(),
            snapshot_id: format!("1-1-{index}"),
        };
        let stored_index = || {
            snapshots
                .current()
                .expect("read")
                .and_then(|stored| stored.meta.last_log_id)
                .map(|log_id| log_id.index)
        };
        snapshots
            .persist(&meta(10), vec![10; 100])
            .await
            .expect("persist");
        assert_eq!((stored_index(), snapshots.bytes()), (Some(10), 100));
        snapshots
            .persist(&meta(5), vec![5; 50])
            .await
            .expect("persist");
        assert_eq!((stored_index(), snapshots.bytes()), (Some(10), 100));
        snapshots
            .persist(&meta(12), vec![12; 120])
            .await
            .expect("persist");
        assert_eq!((stored_index(), snapshots.bytes()), (Some(12), 120));
    }
}
