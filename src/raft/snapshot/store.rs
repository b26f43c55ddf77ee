//! How the latest snapshot is stored: its bytes in a file of their own beside the sled
//! store (`SNAPSHOT_DIR/<generation>.snapshot`), and a record naming it (meta, generation,
//! length) in sled's `snapshots` tree under the key `current-file`.
//!
//! A write puts the file first (written in flushed steps, fsynced, renamed into place, its
//! directory fsynced) and the record last, so the record never names a file that is not
//! whole on the disk; files of any other generation are removed once the record is.
//!
//! Until 2026-12-06 the bytes were 1 MiB chunks in the tree itself (a record under
//! `current-chunked`, chunks under `chunk/<generation>/<index>`): sled rewrote the
//! tree's nodes around them as blobs of 7-9 MB, twice the snapshot's bytes in all, and
//! flushed them at once. Such a snapshot is still read; the next write replaces it and
//! removes its chunks (docs/storage.md, decision 029).

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use openraft::StorageIOError;
use serde::{Deserialize, Serialize};

use crate::codec;
use crate::raft::snapshot::intake::SNAPSHOT_BYTES_MAX;
use crate::raft::{LogId, SnapshotMeta, StorageError};
use crate::storage::layout::SNAPSHOT_DIR;
use crate::storage::sled_disk::SledDisk;
use crate::storage::{create_private_dir, parent_dir, sync_dir, write_in_flushed_steps};

/// The sled tree holding the record naming the latest snapshot (laid out by this module).
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
    #[error("stored snapshot {path}: {reason}")]
    File { path: PathBuf, reason: String },
}

fn file_error(path: &Path, what: &str, source: impl std::fmt::Display) -> StateStoreError {
    StateStoreError::File {
        path: path.to_path_buf(),
        reason: format!("{what}: {source}"),
    }
}

/// The latest snapshot: metadata plus the encoded (checksummed) body.
pub(crate) struct StoredSnapshot {
    pub(crate) meta: SnapshotMeta,
    pub(crate) data: Vec<u8>,
    /// The file it was read from (`None`: chunks of the layout before).
    pub(crate) file: Option<PathBuf>,
}

impl StoredSnapshot {
    /// The snapshot's body, checked (its CRC-32 and length); an error names the file.
    ///
    /// # Errors
    /// When the bytes do not decode as a snapshot.
    pub(crate) fn decode(&self) -> Result<crate::raft::snapshot::SnapshotBody, StateStoreError> {
        crate::raft::snapshot::decode(&self.data).map_err(|e| match &self.file {
            Some(path) => file_error(path, "unreadable", e),
            None => StateStoreError::Snapshot(e),
        })
    }
}

/// The node's stored snapshot: its sled tree and directory, its size, and the turns writes
/// take (cheap to clone: clones share one store).
#[derive(Clone)]
pub struct SnapshotStore {
    inner: Arc<StoreInner>,
}

struct StoreInner {
    tree: sled::Tree,
    disk: SledDisk,
    /// Where the snapshot's file is ([`files_dir`]).
    files: PathBuf,
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
    /// When sled fails or the stored record and its file or chunks do not add up.
    pub(crate) fn open(disk: &SledDisk) -> Result<(Self, Option<StoredSnapshot>), StateStoreError> {
        let tree = disk.db().open_tree(SNAPSHOT_TREE)?;
        let files = files_dir(disk);
        let current = read(&tree, &files)?;
        let bytes = current
            .as_ref()
            .map_or(0, |stored| stored.data.len() as u64);
        let store = Self {
            inner: Arc::new(StoreInner {
                tree,
                disk: disk.clone(),
                files,
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
        read(&self.inner.tree, &self.inner.files)
    }

    /// The current snapshot, if any, read between writes (a write that removes the file or
    /// chunks being read cannot come in between), off the async runtime.
    ///
    /// # Errors
    /// As [`read`].
    pub(crate) async fn current_between_writes(
        &self,
    ) -> Result<Option<StoredSnapshot>, StateStoreError> {
        let inner = Arc::clone(&self.inner);
        tokio::task::spawn_blocking(move || {
            let _no_write_meanwhile = crate::lock::lock(&inner.writing);
            read(&inner.tree, &inner.files)
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
            if write(&inner.tree, &inner.disk, &inner.files, &meta, &data)? {
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

/// The record naming the current snapshot's file.
const FILE_RECORD_KEY: &[u8] = b"current-file";
/// The record of the layout before (chunks in the tree): read, never written.
const CHUNKED_RECORD_KEY: &[u8] = b"current-chunked";
/// Every chunk key of the layout before starts with this (not a prefix of the records' keys).
const CHUNK_PREFIX: &[u8] = b"chunk/";
/// The name a snapshot file ends with; while it is being written, [`STAGING_SUFFIX`].
const FILE_SUFFIX: &str = ".snapshot";
const STAGING_SUFFIX: &str = ".snapshot.tmp";

/// What either record holds.
#[derive(Serialize, Deserialize)]
struct CurrentRecord {
    meta: SnapshotMeta,
    /// Names the file (the chunks, in the layout before).
    generation: u64,
    len_bytes: u64,
}

/// The directory of `disk`'s snapshot files: [`SNAPSHOT_DIR`] beside the sled store.
pub(crate) fn files_dir(disk: &SledDisk) -> PathBuf {
    parent_dir(disk.dir()).join(SNAPSHOT_DIR)
}

/// The keys of generation `generation`'s chunks in the layout before start with this; the
/// chunk's index follows, big-endian, so a scan returns them in order.
fn generation_prefix(generation: u64) -> Vec<u8> {
    let mut prefix = CHUNK_PREFIX.to_vec();
    prefix.extend_from_slice(&generation.to_be_bytes());
    prefix
}

fn file_path(files: &Path, generation: u64) -> PathBuf {
    files.join(format!("{generation}{FILE_SUFFIX}"))
}

fn read_record(tree: &sled::Tree, key: &[u8]) -> Result<Option<CurrentRecord>, StateStoreError> {
    match tree.get(key)? {
        Some(bytes) => Ok(Some(codec::decode(&bytes)?)),
        None => Ok(None),
    }
}

/// The current snapshot, if any.
///
/// # Errors
/// When sled fails, the record does not decode, or its file (or chunks) do not add up to
/// its length.
pub(crate) fn read(
    tree: &sled::Tree,
    files: &Path,
) -> Result<Option<StoredSnapshot>, StateStoreError> {
    let named = || read_record(tree, FILE_RECORD_KEY);
    if !Records::read(tree)?.chunks_are_newer() {
        return read_named(files, named);
    }
    match read_chunked(tree) {
        Ok(Some(stored)) => Ok(Some(stored)),
        // The one write that moves a snapshot from chunks to a file may have removed them
        // since the records were read: the file's record is there now.
        other => match read_named(files, named)? {
            Some(stored) => Ok(Some(stored)),
            None => other,
        },
    }
}

/// Both records as stored: the file's and the chunks' of the layout before (a node
/// downgraded after the upgrade stores chunks again, beside the file's record).
struct Records {
    file: Option<CurrentRecord>,
    chunked: Option<CurrentRecord>,
}

impl Records {
    fn read(tree: &sled::Tree) -> Result<Self, StateStoreError> {
        Ok(Self {
            file: read_record(tree, FILE_RECORD_KEY)?,
            chunked: read_record(tree, CHUNKED_RECORD_KEY)?,
        })
    }

    /// Whether the chunks' record is the snapshot to read: there is one, and no file
    /// record covers as much of the log.
    fn chunks_are_newer(&self) -> bool {
        self.chunked.as_ref().is_some_and(|chunked| {
            (self.file.as_ref()).is_none_or(|file| chunked.meta.last_log_id > file.meta.last_log_id)
        })
    }

    /// The log covered by the snapshot to read, if there is one.
    fn covered(&self) -> Option<Option<LogId>> {
        let newest = if self.chunks_are_newer() {
            &self.chunked
        } else {
            &self.file
        };
        newest.as_ref().map(|record| record.meta.last_log_id)
    }

    /// A generation past both records': no file a record may still name is written over.
    fn next_generation(&self) -> u64 {
        [&self.file, &self.chunked]
            .into_iter()
            .flatten()
            .map(|record| record.generation.wrapping_add(1))
            .max()
            .unwrap_or(0)
    }
}

/// Refuses a snapshot of `bytes` over [`SNAPSHOT_BYTES_MAX`], naming `path`.
fn within_bound(path: &Path, bytes: u64) -> Result<(), StateStoreError> {
    if bytes > SNAPSHOT_BYTES_MAX {
        let reason = format!("{bytes} bytes, over the {SNAPSHOT_BYTES_MAX} a snapshot may have");
        return Err(file_error(path, "length", reason));
    }
    Ok(())
}

/// The snapshot whose file the record from `record` names, if there is a record.
///
/// A reader that does not take turns with writes (openraft's `get_current_snapshot`) can
/// find the file its record named removed by a write that finished meanwhile: the record,
/// read again, then names a newer file, which is read instead.
fn read_named(
    files: &Path,
    mut record: impl FnMut() -> Result<Option<CurrentRecord>, StateStoreError>,
) -> Result<Option<StoredSnapshot>, StateStoreError> {
    let mut missing = None;
    loop {
        let Some(record) = record()? else {
            return Ok(None);
        };
        let path = file_path(files, record.generation);
        let file = match open_regular(&path) {
            Ok(file) => file,
            Err(e) if e.kind() == io::ErrorKind::NotFound && missing != Some(record.generation) => {
                missing = Some(record.generation);
                continue;
            }
            Err(e) => return Err(file_error(&path, "open", e)),
        };
        let data = read_file(file, &path, record.len_bytes)?;
        return Ok(Some(StoredSnapshot {
            meta: record.meta,
            data,
            file: Some(path),
        }));
    }
}

/// Opens `path` if it is a regular file. The open does not block (a FIFO put in its place
/// would block a plain open until something writes to it), does not make a terminal put
/// there the node's controlling one, and the type is read from the opened file, so nothing
/// can be swapped in between the check and the open. The read that follows blocks as
/// usual: a network filesystem may answer a non-blocking read with `EAGAIN`.
fn open_regular(path: &Path) -> io::Result<File> {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::OpenOptionsExt;
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)?;
    if !file.metadata()?.is_file() {
        return Err(io::Error::other("not a regular file"));
    }
    let fd = file.as_raw_fd();
    // SAFETY: `fd` is the open descriptor `file` owns for the whole block; F_GETFL and
    // F_SETFL read and set its status flags and touch no memory.
    let cleared = unsafe {
        let flags = libc::fcntl(fd, libc::F_GETFL);
        flags >= 0 && libc::fcntl(fd, libc::F_SETFL, flags & !libc::O_NONBLOCK) == 0
    };
    if !cleared {
        return Err(io::Error::last_os_error());
    }
    Ok(file)
}

/// The bytes of `file` (at `path`), which must be `expected_bytes` long and within
/// [`SNAPSHOT_BYTES_MAX`]: the length is read from disk, so it sizes nothing until the file
/// really has it, and a sparse file of any length sizes nothing past the bound.
fn read_file(mut file: File, path: &Path, expected_bytes: u64) -> Result<Vec<u8>, StateStoreError> {
    let found_bytes = file
        .metadata()
        .map_err(|e| file_error(path, "stat", e))?
        .len();
    if found_bytes != expected_bytes {
        let reason = format!("{found_bytes} bytes, its record says {expected_bytes}");
        return Err(file_error(path, "length", reason));
    }
    within_bound(path, found_bytes)?;
    let mut data = Vec::new();
    let capacity = usize::try_from(found_bytes).unwrap_or(usize::MAX);
    data.try_reserve_exact(capacity)
        .map_err(|e| file_error(path, "read", e))?;
    file.read_to_end(&mut data)
        .map_err(|e| file_error(path, "read", e))?;
    if data.len() as u64 != expected_bytes {
        let reason = format!(
            "read {} bytes, its record says {expected_bytes}",
            data.len()
        );
        return Err(file_error(path, "length", reason));
    }
    Ok(data)
}

/// The current snapshot in the layout before, if any.
fn read_chunked(tree: &sled::Tree) -> Result<Option<StoredSnapshot>, StateStoreError> {
    let Some(record) = read_record(tree, CHUNKED_RECORD_KEY)? else {
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
        file: None,
    }))
}

/// Makes `meta` and `data` the current snapshot and syncs it to the disk; `false`, and nothing
/// written, when the stored snapshot covers a later log id than `meta` (the caller makes
/// writes take turns).
///
/// # Errors
/// When the file cannot be written, sled fails or its files cannot be synced.
pub(crate) fn write(
    tree: &sled::Tree,
    disk: &SledDisk,
    files: &Path,
    meta: &SnapshotMeta,
    data: &[u8],
) -> Result<bool, StateStoreError> {
    // Refused here rather than at the next start, where it would not read back.
    within_bound(files, data.len() as u64)?;
    let records = Records::read(tree)?;
    if records.covered().flatten() > meta.last_log_id {
        return Ok(false);
    }
    let generation = records.next_generation();
    write_file(files, generation, data)?;
    let record = CurrentRecord {
        meta: meta.clone(),
        generation,
        len_bytes: data.len() as u64,
    };
    // The record first: sled recovers a prefix of its writes, so the chunks of the layout
    // before are never gone while their record is the newest one.
    tree.insert(FILE_RECORD_KEY, codec::encode(&record)?)?;
    tree.remove(CHUNKED_RECORD_KEY)?;
    for key in tree.scan_prefix(CHUNK_PREFIX).keys() {
        tree.remove(key?)?;
    }
    disk.flush_to_disk()?;
    // The snapshot is stored: a leftover that cannot be removed now is tried again by the
    // next write, and does not fail this one.
    if let Err(e) = remove_files_except(files, generation) {
        tracing::warn!(error = %e, "snapshot stored; older snapshot files left in place");
    }
    Ok(true)
}

/// Writes `data` as generation `generation`'s file: under a staging name, in flushed
/// steps, fsynced, renamed into place, and the directory (made if need be) fsynced.
fn write_file(files: &Path, generation: u64, data: &[u8]) -> Result<(), StateStoreError> {
    let made = !files.is_dir();
    create_private_dir(files).map_err(|e| file_error(files, "create", e))?;
    if made {
        let parent = parent_dir(files);
        sync_dir(parent).map_err(|e| file_error(parent, "fsync", e))?;
    }
    let path = file_path(files, generation);
    let staging = files.join(format!("{generation}{STAGING_SUFFIX}"));
    let file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(&staging)
        .map_err(|e| file_error(&staging, "create", e))?;
    let step = |file: &File, from: u64, to: u64| {
        let bytes = &data[from as usize..to as usize];
        file.write_all_at(bytes, from)
    };
    write_in_flushed_steps(&file, data.len() as u64, step)
        .and_then(|()| file.sync_all())
        .map_err(|e| file_error(&staging, "write", e))?;
    fs::rename(&staging, &path).map_err(|e| file_error(&path, "rename", e))?;
    sync_dir(files).map_err(|e| file_error(files, "fsync", e))
}

/// Removes every snapshot file (and staging file) of a generation other than `keep`: the
/// snapshots before, and what a crash in the middle of a write left. One that cannot be
/// removed does not keep the others; the first error is returned after.
fn remove_files_except(files: &Path, keep: u64) -> Result<(), StateStoreError> {
    let entries = fs::read_dir(files).map_err(|e| file_error(files, "list", e))?;
    let mut first_error = None;
    let mut removed = false;
    for entry in entries {
        let entry = entry.map_err(|e| file_error(files, "list", e))?;
        if !entry.file_type().is_ok_and(|kind| kind.is_file()) {
            continue;
        }
        let name = entry.file_name();
        let name = name.to_string_lossy();
        let generation = name
            .strip_suffix(STAGING_SUFFIX)
            .or_else(|| name.strip_suffix(FILE_SUFFIX))
            .and_then(|generation| generation.parse::<u64>().ok());
        if generation.is_some_and(|generation| generation != keep) || name.ends_with(STAGING_SUFFIX)
        {
            let path = entry.path();
            match fs::remove_file(&path) {
                Ok(()) => removed = true,
                Err(e) => {
                    first_error.get_or_insert(file_error(&path, "remove", e));
                }
            }
        }
    }
    if removed {
        sync_dir(files).map_err(|e| file_error(files, "fsync", e))?;
    }
    first_error.map_or(Ok(()), Err)
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

    /// The non-blocking open is for the open alone: the file it hands back reads as usual.
    #[test]
    fn a_regular_file_is_opened_for_blocking_reads() {
        use std::os::fd::AsRawFd;
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("file");
        fs::write(&path, b"bytes").expect("write");
        let file = open_regular(&path).expect("open");
        // SAFETY: `file` owns the descriptor for the call; F_GETFL touches no memory.
        let flags = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_GETFL) };
        assert!(flags >= 0, "fcntl: {}", io::Error::last_os_error());
        assert_eq!(flags & libc::O_NONBLOCK, 0, "flags {flags:#x}");
    }

    fn meta(id: &str) -> SnapshotMeta {
        SnapshotMeta {
            last_log_id: None,
            last_membership: Default::default(),
            snapshot_id: id.to_owned(),
        }
    }

    /// The stored snapshot, which must be there.
    fn current(tree: &sled::Tree, files: &Path) -> StoredSnapshot {
        read(tree, files).expect("read").expect("a snapshot")
    }

    /// The files in the snapshot directory, by name.
    fn file_names(db: &SledDisk) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(files_dir(db))
            .expect("list")
            .map(|entry| {
                entry
                    .expect("entry")
                    .file_name()
                    .to_string_lossy()
                    .into_owned()
            })
            .collect();
        names.sort();
        names
    }

    /// A chunk's key in the layout before.
    fn chunk_key(generation: u64, index: u64) -> Vec<u8> {
        let mut key = generation_prefix(generation);
        key.extend_from_slice(&index.to_be_bytes());
        key
    }

    /// Stores the record of the layout before, naming generation `generation`'s chunks.
    fn put_chunked_record(tree: &sled::Tree, meta: SnapshotMeta, generation: u64, len_bytes: u64) {
        let record = CurrentRecord {
            meta,
            generation,
            len_bytes,
        };
        tree.insert(CHUNKED_RECORD_KEY, codec::encode(&record).expect("encode"))
            .expect("record");
    }

    /// Metadata of a snapshot up to log index `index`.
    fn meta_at(index: u64, id: &str) -> SnapshotMeta {
        SnapshotMeta {
            last_log_id: Some(openraft::LogId::new(
                openraft::CommittedLeaderId::new(1, 1),
                index,
            )),
            ..meta(id)
        }
    }

    #[test]
    fn a_snapshot_reads_back_whole_and_replaces_the_one_before() {
        let (_dir, db, tree) = open();
        let files = files_dir(&db);
        assert!(read(&tree, &files).expect("read").is_none());
        let step = crate::storage::FLUSH_STEP_BYTES as usize;
        let big: Vec<u8> = (0..step * 2 + 5).map(|i| (i % 251) as u8).collect();
        assert!(write(&tree, &db, &files, &meta("a"), &big).expect("write"));
        assert_eq!(file_names(&db), ["0.snapshot"]);
        let stored = current(&tree, &files);
        assert_eq!(stored.meta.snapshot_id, "a");
        assert_eq!(stored.data, big);

        assert!(write(&tree, &db, &files, &meta("b"), b"small").expect("write"));
        assert_eq!(file_names(&db), ["1.snapshot"], "the older file is gone");
        let stored = current(&tree, &files);
        assert_eq!(stored.meta.snapshot_id, "b");
        assert_eq!(stored.data, b"small");
    }

    #[test]
    fn a_short_or_missing_file_is_refused_by_name_and_leftovers_are_cleared() {
        let (_dir, db, tree) = open();
        let files = files_dir(&db);
        write(&tree, &db, &files, &meta("a"), &[7u8; 100]).expect("write");
        // Crashes in the middle of writes leave files nobody names.
        fs::write(files.join("7.snapshot.tmp"), b"torn").expect("leftover");
        fs::write(files.join("9.snapshot"), b"torn").expect("leftover");
        assert_eq!(current(&tree, &files).data, [7u8; 100]);

        let path = files.join("0.snapshot");
        let refused = |expected: &str| match read(&tree, &files) {
            Err(e @ StateStoreError::File { .. }) => {
                let message = e.to_string();
                assert!(message.contains(&path.display().to_string()), "{message}");
                assert!(message.contains(expected), "{message}");
            }
            other => panic!(
                "{expected}: {:?}",
                other.map(|stored| stored.map(|s| s.data))
            ),
        };
        fs::write(&path, [7u8; 99]).expect("cut the file short");
        refused("99 bytes, its record says 100");
        fs::remove_file(&path).expect("remove");
        refused("open");
        fs::create_dir(&path).expect("a directory in its place");
        refused("not a regular file");
        fs::remove_dir(&path).expect("remove");
        // A FIFO would block a plain open until something opened it to write. The read runs
        // on a thread of its own, so an open that blocks fails here instead of hanging the
        // suite. (This holds for a check of the path before the open too; a FIFO swapped in
        // between such a check and a plain open, the race that checking the opened file
        // closes, is not staged.)
        let fifo = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).expect("path");
        // SAFETY: `fifo` is a NUL-terminated path that outlives the call.
        let made = unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) };
        assert_eq!(made, 0, "mkfifo: {}", io::Error::last_os_error());
        let (answer, answered) = std::sync::mpsc::channel();
        let (reader_tree, reader_files) = (tree.clone(), files.clone());
        std::thread::spawn(move || {
            let outcome = read(&reader_tree, &reader_files).map(|stored| stored.is_some());
            answer.send(outcome.map_err(|e| e.to_string())).ok();
        });
        match answered.recv_timeout(std::time::Duration::from_secs(30)) {
            Ok(Err(message)) => assert!(message.contains("not a regular file"), "{message}"),
            Ok(Ok(found)) => panic!("a FIFO was read as a snapshot (found: {found})"),
            Err(e) => panic!("the read of a FIFO did not return: {e}"),
        }
        fs::remove_file(&path).expect("remove");
        // A sparse file as long as a forged record says, past what a snapshot may have.
        let forged = CurrentRecord {
            meta: meta("a"),
            generation: 0,
            len_bytes: SNAPSHOT_BYTES_MAX + 1,
        };
        tree.insert(FILE_RECORD_KEY, codec::encode(&forged).expect("encode"))
            .expect("record");
        File::create(&path)
            .and_then(|file| file.set_len(SNAPSHOT_BYTES_MAX + 1))
            .expect("a sparse file");
        refused("over the");

        write(&tree, &db, &files, &meta("b"), b"b").expect("write");
        assert_eq!(file_names(&db), ["1.snapshot"], "the leftovers are gone");
        assert_eq!(current(&tree, &files).data, b"b");
    }

    /// A data dir from before the snapshot's file: its chunks are read, a missing one is
    /// refused, and the next write moves the snapshot to a file and removes every chunk.
    #[test]
    fn a_snapshot_in_chunks_is_read_and_the_next_write_replaces_it() {
        let (_dir, db, tree) = open();
        let files = files_dir(&db);
        put_chunked_record(&tree, meta("chunked"), 4, 7);
        tree.insert(chunk_key(4, 0), &b"chu"[..]).expect("chunk");
        tree.insert(chunk_key(4, 1), &b"nked"[..]).expect("chunk");
        tree.insert(chunk_key(3, 0), &b"old"[..]).expect("leftover");
        let stored = current(&tree, &files);
        assert_eq!(
            (stored.meta.snapshot_id.as_str(), &stored.data[..]),
            ("chunked", &b"chunked"[..])
        );

        tree.remove(chunk_key(4, 1)).expect("remove");
        assert!(matches!(
            read(&tree, &files),
            Err(StateStoreError::Chunks {
                expected_bytes: 7,
                found_bytes: 3,
            })
        ));

        assert!(write(&tree, &db, &files, &meta("file"), b"file").expect("write"));
        assert_eq!(
            tree.scan_prefix(CHUNK_PREFIX).count(),
            0,
            "every chunk is gone"
        );
        assert!(tree.get(CHUNKED_RECORD_KEY).expect("get").is_none());
        assert_eq!(file_names(&db), ["5.snapshot"]);
        let stored = current(&tree, &files);
        assert_eq!(
            (stored.meta.snapshot_id.as_str(), &stored.data[..]),
            ("file", &b"file"[..])
        );
    }

    /// A node downgraded after the upgrade stores chunks again (the older binary knows no
    /// file record): the newer of the two records is read, and the next write goes past
    /// both records' generations.
    #[test]
    fn chunks_newer_than_the_file_are_read_and_replaced() {
        let (_dir, db, tree) = open();
        let files = files_dir(&db);
        write(&tree, &db, &files, &meta_at(10, "file"), b"file").expect("write");
        write(&tree, &db, &files, &meta_at(11, "file"), b"file").expect("write");
        put_chunked_record(&tree, meta_at(20, "chunks"), 0, 6);
        tree.insert(chunk_key(0, 0), &b"chunks"[..]).expect("chunk");
        let stored = current(&tree, &files);
        assert_eq!(stored.data, b"chunks");
        assert!(!write(&tree, &db, &files, &meta_at(15, "older"), b"older").expect("write"));

        assert!(write(&tree, &db, &files, &meta_at(30, "new"), b"new").expect("write"));
        assert_eq!(file_names(&db), ["2.snapshot"], "past generation 1's file");
        assert_eq!(current(&tree, &files).data, b"new");
    }

    /// A reader that does not take turns with writes (openraft's `get_current_snapshot`):
    /// when the file its record named is gone, the record read again names the newer file
    /// the write that removed it left; a record that names a missing file twice is refused.
    #[test]
    fn a_read_whose_file_a_write_removed_reads_the_newer_one() {
        let (_dir, db, tree) = open();
        let files = files_dir(&db);
        write(&tree, &db, &files, &meta("a"), b"a").expect("write");
        write(&tree, &db, &files, &meta("b"), b"b").expect("write");
        let named = |generation: u64, id: &str| CurrentRecord {
            meta: meta(id),
            generation,
            len_bytes: 1,
        };
        // Generation 0's file is gone (replaced by 1's) after its record was read.
        let mut records = vec![named(1, "b"), named(0, "a")];
        let stored = read_named(&files, || Ok(records.pop()))
            .expect("read")
            .expect("a snapshot");
        assert_eq!(
            (stored.meta.snapshot_id.as_str(), &stored.data[..]),
            ("b", &b"b"[..])
        );

        let mut records = vec![named(0, "a"), named(0, "a")];
        match read_named(&files, || Ok(records.pop())) {
            Err(StateStoreError::File { path, reason }) => {
                assert_eq!(path, files.join("0.snapshot"));
                assert!(reason.starts_with("open"), "{reason}");
            }
            other => panic!("{:?}", other.map(|stored| stored.map(|s| s.data))),
        }
    }

    /// A build that finishes after a newer snapshot was installed does not replace it: the
    /// stored snapshot, and the size the snapshot policy reads, stay the newer one.
    #[tokio::test]
    async fn an_older_snapshot_never_replaces_a_newer_stored_one() {
        let (_dir, db, _tree) = open();
        let (snapshots, _) = SnapshotStore::open(&db).expect("open");
        let meta = |index: u64| meta_at(index, &format!("1-1-{index}"));
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
