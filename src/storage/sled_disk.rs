//! sled, made to reach the disk. sled 0.34.7's flush writes its log file with
//! `sync_file_range`, which neither flushes the drive's cache nor records the file's size,
//! and it writes values over ~128 KiB (every 1 MiB snapshot chunk) to files of their own in
//! `blobs/` with no sync at all (`pagecache/blob_io.rs`). Neither survives a power cut. The
//! two things this node keeps in sled must: openraft purges the log a snapshot covers as
//! soon as the snapshot is stored, and a `QUEUED` settle is a promise (contract §6).
//! [`SledDisk::flush_to_disk`] flushes sled and then fsyncs what it wrote: its log and
//! config, every blob, and the directories that name them.

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// A sled database and the directory it lives in (cheap to clone).
#[derive(Clone)]
pub struct SledDisk {
    db: sled::Db,
    dir: Arc<PathBuf>,
    /// Write-once files (`blobs/*`, `snap.*`: created, written once from the start, never
    /// changed) already synced, with their length before that sync: a queued settle does not
    /// re-sync a snapshot's hundred blobs, and a file still being written when it was synced
    /// has grown since, so it is synced again.
    synced: Arc<Mutex<HashMap<PathBuf, u64>>>,
}

impl SledDisk {
    /// Opens (or creates) the database in `dir` with `cache_bytes` of page cache.
    ///
    /// # Errors
    /// When sled cannot open it.
    pub fn open(dir: &Path, cache_bytes: u64) -> sled::Result<Self> {
        let db = sled::Config::new()
            .path(dir)
            .cache_capacity(cache_bytes)
            .open()?;
        Ok(Self {
            db,
            dir: Arc::new(dir.to_path_buf()),
            synced: Arc::default(),
        })
    }

    /// The database.
    pub fn db(&self) -> &sled::Db {
        &self.db
    }

    /// The directory the database is in.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Flushes sled and fsyncs its files; returns how many files and directories were
    /// synced. Blocking: call it off the async runtime.
    ///
    /// # Errors
    /// When sled cannot flush or a file cannot be synced: what was written may not be on
    /// the disk, so it must not be acknowledged.
    pub fn flush_to_disk(&self) -> io::Result<usize> {
        self.db.flush()?;
        let mut synced = crate::lock::lock(&self.synced);
        let mut present = HashMap::new();
        let count = sync_tree(&self.dir, &synced, &mut present)?;
        // Only what still exists is remembered: removed blobs do not pile up here.
        *synced = present;
        Ok(count)
    }
}

/// fsyncs every file under `dir` (sled's `db`, `conf`, `snap.*` and `blobs/*`) except the
/// write-once files `synced` at their present length, then each directory after the names in
/// it; collects the write-once files now on the disk in `present` and returns how many it
/// synced. A blob
/// that sled removes meanwhile (its value was replaced) is skipped: there is nothing of it
/// left to keep.
fn sync_tree(
    dir: &Path,
    synced: &HashMap<PathBuf, u64>,
    present: &mut HashMap<PathBuf, u64>,
) -> io::Result<usize> {
    let mut count = 0;
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let kind = entry.file_type()?;
        let path = entry.path();
        if kind.is_dir() {
            count += sync_tree(&path, synced, present)?;
            continue;
        }
        if !kind.is_file() {
            continue;
        }
        let write_once = path
            .parent()
            .is_some_and(|parent| parent.ends_with("blobs"))
            || entry.file_name().to_string_lossy().starts_with("snap.");
        // Read before the sync: what is written after it makes the file longer than this.
        let len = match entry.metadata() {
            Ok(metadata) => metadata.len(),
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        if write_once && synced.get(&path) == Some(&len) {
            present.insert(path, len);
            continue;
        }
        match File::open(&path) {
            Ok(file) => file.sync_all()?,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        }
        count += 1;
        if write_once {
            present.insert(path, len);
        }
    }
    File::open(dir)?.sync_all()?;
    Ok(count + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flush_syncs_the_log_and_every_blob_and_the_values_read_back() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("state.sled");
        let big = vec![7u8; 1 << 20];
        {
            let disk = SledDisk::open(&path, 1 << 20).expect("open");
            for key in ["a", "b", "c"] {
                disk.db().insert(key, big.as_slice()).expect("insert");
            }
            let synced = disk.flush_to_disk().expect("flush");
            let blobs = std::fs::read_dir(path.join("blobs"))
                .expect("blobs")
                .count();
            assert!(blobs >= 3, "1 MiB values are sled blobs: {blobs}");
            // db, conf, every blob, `blobs/` and the database's own directory.
            assert!(synced >= blobs + 4, "{synced} synced for {blobs} blobs");

            disk.db().insert("small", "value").expect("insert");
            let again = disk.flush_to_disk().expect("flush");
            assert!(
                again < synced && again >= 4,
                "the blobs already synced are not synced again: {again} after {synced}"
            );
            disk.db().insert("d", big.as_slice()).expect("insert");
            let with_new_blob = disk.flush_to_disk().expect("flush");
            assert!(
                with_new_blob > again,
                "a new blob is synced: {with_new_blob}"
            );
        }
        let disk = SledDisk::open(&path, 1 << 20).expect("reopen");
        for key in ["a", "b", "c"] {
            let value = disk.db().get(key).expect("read").expect("kept");
            assert_eq!(value.as_ref(), big.as_slice());
        }
    }
}
