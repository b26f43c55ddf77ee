//! The durable Raft log of one node: log entries and the committed log id in a segmented
//! write-ahead log (module `wal`, a directory beside the redb file), the vote and the last
//! purged log id in one small redb file.
//!
//! It owns that file and nothing else: it never looks inside an entry's payload (entries
//! are bytes made by [`crate::codec`]), and the state machine lives elsewhere.
//!
//! It must never acknowledge data that is not on disk: [`RaftLogStorage::save_vote`],
//! `truncate` and `purge` return, and `append`'s callback fires, only after the data is
//! fsynced (the WAL's `fdatasync`, or a redb commit made with [`Durability::Immediate`]). Raft's
//! safety rests on that: a vote or a log entry that a peer was told about must survive a
//! crash. One exception, on purpose: a leader's own new entries are reported at once, so
//! it replicates them while it flushes them; what would make such an entry visible waits on
//! the [`DurableLog`] mark instead, and a restarted leader never resumes its old term (see
//! `append` and `read_vote` below, and docs/storage.md). It must never leave a hole in the
//! log either: appends that are not contiguous
//! with the stored log are refused (entries at or below the purge point are dropped, they
//! are already in a snapshot), and reads check the indexes they return.
//!
//! Writes go through one writer thread in order (module `writer`); `append` returns once its
//! entries are queued and in the tail that reads are served from, and its callback fires
//! after their fsync. Reads of older entries run in [`tokio::task::spawn_blocking`], so
//! the async runtime is never blocked by file IO.
//!
//! docs/decisions has why entries are in a WAL and not in redb.

mod wal;
mod writer;

pub use crate::raft::durability::{DurableLog, NotDurable};

use std::fmt::Debug;
use std::io;
use std::ops::{Bound, RangeBounds};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use openraft::storage::{LogFlushed, LogState, RaftLogStorage};
use openraft::{OptionalSend, RaftLogReader, StorageIOError, Vote};
use redb::{Database, Durability, ReadableTable, TableDefinition};
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::codec::{decode, encode, CodecError};
use crate::lock::lock;
use crate::raft::faults::Faults;
use crate::raft::{Entry, LogId, NodeId, StorageError, TypeConfig};

/// Small named records: [`VOTE_KEY`], [`LAST_PURGED_KEY`].
const META_TABLE: TableDefinition<&str, &[u8]> = TableDefinition::new("meta");
const VOTE_KEY: &str = "vote";
/// redb page cache (the file holds the vote and the purge point only).
const LOG_CACHE_BYTES: usize = 32 * 1024 * 1024;
const LAST_PURGED_KEY: &str = "last_purged_log_id";

/// Why the log store failed. Turned into an [`openraft::StorageError`] at the trait boundary,
/// which makes openraft stop the node rather than run on a log it cannot trust.
#[derive(Debug, thiserror::Error)]
pub enum LogStoreError {
    #[error("open log store {path}: {source}")]
    Open {
        path: PathBuf,
        #[source]
        source: Box<redb::Error>,
    },
    /// Boxed: `redb::Error` is large and every `Result` here would carry its size.
    #[error("redb: {source}")]
    Redb { source: Box<redb::Error> },
    #[error("{what}: {source}")]
    Codec {
        what: &'static str,
        #[source]
        source: CodecError,
    },
    #[error("append would leave a hole: expected index {expected_index}, got {got_index}")]
    AppendGap { expected_index: u64, got_index: u64 },
    #[error("stored log has a hole: index {got_index} follows {previous_index}")]
    ReadGap { previous_index: u64, got_index: u64 },
    #[error("entry stored under index {key_index} has log id index {entry_index}")]
    MisfiledEntry { key_index: u64, entry_index: u64 },
    #[error("truncate at {index} would remove purged entries (last purged {last_purged_index})")]
    TruncatePurged { index: u64, last_purged_index: u64 },
    #[error("blocking log store task failed: {source}")]
    Join {
        #[from]
        source: tokio::task::JoinError,
    },
    #[error("the log writer thread: {source}")]
    Writer { source: io::Error },
    #[error("the log writer thread is gone")]
    WriterGone,
    #[error("write-ahead log {path}: {reason}")]
    Wal { path: PathBuf, reason: String },
    #[error("a log record of {len_bytes} bytes does not fit its 32-bit length")]
    RecordTooLarge { len_bytes: usize },
}

macro_rules! from_redb {
    ($($error:ty),*) => {$(
        impl From<$error> for LogStoreError {
            fn from(error: $error) -> Self {
                Self::Redb { source: Box::new(error.into()) }
            }
        }
    )*};
}
from_redb!(
    redb::Error,
    redb::DatabaseError,
    redb::TransactionError,
    redb::TableError,
    redb::StorageError,
    redb::CommitError
);

type Result<T, E = LogStoreError> = std::result::Result<T, E>;

/// The two files behind a log store.
pub(super) struct Disk {
    /// Vote and purge point.
    db: Database,
    /// Entries and the committed id.
    wal: wal::Wal,
}

/// The Raft log store of one node. Cloning is cheap (one `Arc`); clones share the files,
/// which is how openraft's log readers read while the core writes.
#[derive(Clone)]
pub struct LogStore {
    disk: Arc<Disk>,
    /// Recent entries, including those not yet durable; reads look here first.
    tail: Arc<std::sync::Mutex<writer::Tail>>,
    /// Makes every change durable, in order.
    writer: Arc<writer::Writer>,
    /// The latest committed id openraft reported, not yet written; the next append's
    /// transaction carries it to disk (see [`RaftLogStorage::save_committed`] below).
    committed: Arc<std::sync::Mutex<Option<Option<LogId>>>>,
    /// This node's id: entries it appends as the current term's leader are its own.
    node_id: NodeId,
    /// The vote as last saved (or read at start-up).
    vote: Arc<std::sync::Mutex<Option<Vote<NodeId>>>>,
    /// How far the WAL is fsynced; moved by the writer.
    mark: crate::raft::durability::DurableMark,
}

/// Reads how many bytes of a node's log lie after an index (cheap to clone).
#[derive(Clone)]
pub struct LogBytes {
    disk: Arc<Disk>,
}

impl LogBytes {
    /// Bytes of log written after entry `index` (all of it for `None`); entries still on
    /// their way to disk are not counted yet. `None` while the log's writer holds it (a
    /// purge or truncation doing its disk IO): this never blocks.
    pub fn after(&self, index: Option<u64>) -> Option<u64> {
        self.disk.wal.try_bytes_after(index)
    }
}

impl Debug for LogStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogStore").finish_non_exhaustive()
    }
}

impl LogStore {
    /// Opens (or creates) the log store at `path` (the redb file; the WAL is the directory
    /// beside it, `path` with the extension `wal`), replays the WAL and makes sure the redb
    /// tables exist, so reads never meet a missing table.
    ///
    /// Blocking (file IO, maybe a redb repair or a torn WAL append to clear after a crash):
    /// call it at start-up, before the node serves traffic, or from `spawn_blocking`.
    ///
    /// `node_id` is this node's; `faults` may hold the writer in fault tests.
    ///
    /// # Errors
    /// When a file cannot be opened or created, the redb file is already open in another
    /// process, or the WAL has a hole or an unreadable record before its last append.
    pub fn open(path: &Path, node_id: NodeId, faults: Faults) -> Result<LogStore, LogStoreError> {
        Self::open_with_segment_bytes(path, node_id, faults, wal::SEGMENT_BYTES)
    }

    fn open_with_segment_bytes(
        path: &Path,
        node_id: NodeId,
        faults: Faults,
        segment_bytes: u64,
    ) -> Result<LogStore> {
        let open_error = |source: Box<redb::Error>| LogStoreError::Open {
            path: path.to_path_buf(),
            source,
        };
        // redb's default page cache is 1 GiB; it only holds the vote and the purge point.
        let db = Database::builder()
            .set_cache_size(LOG_CACHE_BYTES)
            .create(path)
            .map_err(|e| open_error(Box::new(e.into())))?;
        create_tables(&db).map_err(|e| match e {
            LogStoreError::Redb { source } => open_error(source),
            other => other,
        })?;
        let purged: Option<LogId> = load_meta(&db, LAST_PURGED_KEY)?;
        let purged_upto = purged.map(|log_id| log_id.index);
        let wal = wal::Wal::open(&path.with_extension("wal"), purged_upto, segment_bytes)?;
        let disk = Disk { db, wal };
        let mark = crate::raft::durability::DurableMark::new(log_state(&disk)?.last_log_id);
        let disk = Arc::new(disk);
        let tail = Arc::new(std::sync::Mutex::new(writer::Tail::new(purged_upto)));
        let writer =
            writer::Writer::start(Arc::clone(&disk), Arc::clone(&tail), mark.clone(), faults)
                .map_err(|source| LogStoreError::Writer { source })?;
        Ok(LogStore {
            disk,
            tail,
            writer: Arc::new(writer),
            committed: Arc::default(),
            node_id,
            vote: Arc::default(),
            mark,
        })
    }

    /// How far this log is on disk: what the state machine and the peer traffic wait on.
    pub fn durable(&self) -> DurableLog {
        self.mark.reader()
    }

    /// How much log lies after an index: what the snapshot policy weighs against the last
    /// snapshot's size.
    pub fn log_bytes(&self) -> LogBytes {
        LogBytes {
            disk: Arc::clone(&self.disk),
        }
    }

    /// Whether `entries` are this node's own, appended as the current leader: the vote is
    /// committed, names this node, and every entry carries that leader id (term and node).
    /// openraft saves a newer vote before it appends a new leader's entries, so a
    /// follower's entries, and a new leader's entries from older terms, never are.
    fn appended_as_leader(&self, entries: &[Entry]) -> bool {
        crate::raft::durability::reports_early(*lock(&self.vote), self.node_id, entries)
    }

    /// Runs `work` on the writer thread, after every change queued before it.
    async fn write<F>(&self, work: F) -> Result<()>
    where
        F: FnOnce(&Disk) -> Result<()> + Send + 'static,
    {
        let (done, answer) = tokio::sync::oneshot::channel();
        let job = writer::Job::Other {
            work: Box::new(work),
            done,
        };
        if self.writer.submit(job).is_err() {
            return Err(LogStoreError::WriterGone);
        }
        answer.await.map_err(|_| LogStoreError::WriterGone)?
    }

    /// Puts `entries` in the tail (readable at once) and queues them for the writer, which
    /// calls `on_durable` after their fsync; never before, since the callback tells openraft
    /// the entries may be counted towards a quorum.
    fn append_then_notify(&self, entries: Vec<Entry>, on_durable: writer::OnDurable) -> Result<()> {
        if let Err(e) = lock(&self.tail).push(&entries) {
            on_durable(Err(io::Error::other(e.to_string())));
            return Err(e);
        }
        let job = writer::Job::Append {
            entries,
            committed: self.take_committed(),
            done: on_durable,
        };
        if let Err(writer::Job::Append { done, .. }) = self.writer.submit(job) {
            done(Err(io::Error::other("the log writer thread is gone")));
            return Err(LogStoreError::WriterGone);
        }
        Ok(())
    }

    /// Appends `entries`; `notify` is told once they count as this node's copy: at once
    /// (once queued) for the leader's own entries, after their fsync for any others.
    fn append_entries(&self, entries: Vec<Entry>, notify: writer::OnDurable) -> Result<()> {
        if !self.appended_as_leader(&entries) {
            return self.append_then_notify(entries, notify);
        }
        // The writer logs a failed write and fails the durable mark.
        match self.append_then_notify(entries, Box::new(|_| {})) {
            Ok(()) => {
                notify(Ok(()));
                Ok(())
            }
            Err(e) => {
                notify(Err(io::Error::other(e.to_string())));
                Err(e)
            }
        }
    }

    /// Entries in `bounds`: the part at or above the tail's first index from the tail, the
    /// part below it from the WAL (the tail only lets go of entries once they are durable).
    async fn read(&self, (start, end): (Bound<u64>, Bound<u64>)) -> Result<Vec<Entry>> {
        if range_is_empty((start, end)) {
            return Ok(Vec::new());
        }
        let from = first_index(start);
        let (tail_first, from_tail, purged_upto) = {
            let tail = lock(&self.tail);
            let from_tail = match tail.first_index() {
                Some(first) if !range_is_empty((Bound::Included(from.max(first)), end)) => {
                    tail.read(from.max(first), end)
                }
                _ => Vec::new(),
            };
            (tail.first_index(), from_tail, tail.purged_upto())
        };
        let below_tail = match tail_first {
            Some(first) if from >= first => return Ok(from_tail),
            Some(first) => {
                let end = match end {
                    Bound::Excluded(index) | Bound::Included(index) if index < first => end,
                    _ => Bound::Excluded(first),
                };
                (Bound::Included(from), end)
            }
            None => (Bound::Included(from), end),
        };
        let mut entries = self
            .blocking(move |disk| read_entries(disk, below_tail))
            .await?;
        match (entries.last(), from_tail.first()) {
            (Some(last), Some(next)) => check_follows(last.log_id.index, next.log_id.index)?,
            // Nothing in the WAL below the tail, though `[from, first)` was not purged: a hole
            // (openraft would replicate the tail as if it followed `from - 1`).
            (None, Some(next)) if from > 0 && purged_upto.is_none_or(|purged| from > purged) => {
                check_follows(from - 1, next.log_id.index)?;
            }
            _ => {}
        }
        entries.extend(from_tail);
        Ok(entries)
    }

    /// Runs `work` on the blocking pool: file IO must not stall the runtime.
    async fn blocking<T, F>(&self, work: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&Disk) -> Result<T> + Send + 'static,
    {
        let disk = Arc::clone(&self.disk);
        tokio::task::spawn_blocking(move || work(&disk)).await?
    }

    fn committed_slot(&self) -> std::sync::MutexGuard<'_, Option<Option<LogId>>> {
        lock(&self.committed)
    }

    fn take_committed(&self) -> Option<Option<LogId>> {
        self.committed_slot().take()
    }
}

fn create_tables(db: &Database) -> Result<()> {
    let txn = db.begin_write()?;
    txn.open_table(META_TABLE)?;
    txn.commit()?;
    Ok(())
}

fn encode_as<T: Serialize>(value: &T, what: &'static str) -> Result<Vec<u8>> {
    encode(value).map_err(|source| LogStoreError::Codec { what, source })
}

fn decode_as<T: DeserializeOwned>(bytes: &[u8], what: &'static str) -> Result<T> {
    decode(bytes).map_err(|source| LogStoreError::Codec { what, source })
}

fn read_meta<T, Table>(meta: &Table, key: &'static str) -> Result<Option<T>>
where
    T: DeserializeOwned,
    Table: ReadableTable<&'static str, &'static [u8]>,
{
    match meta.get(key)? {
        Some(bytes) => Ok(Some(decode_as(bytes.value(), key)?)),
        None => Ok(None),
    }
}

fn load_meta<T: DeserializeOwned>(db: &Database, key: &'static str) -> Result<Option<T>> {
    let txn = db.begin_read()?;
    read_meta(&txn.open_table(META_TABLE)?, key)
}

fn store_meta<T: Serialize>(
    db: &Database,
    key: &'static str,
    value: &T,
    durability: Durability,
) -> Result<()> {
    let bytes = encode_as(value, key)?;
    let mut txn = db.begin_write()?;
    txn.set_durability(durability);
    txn.open_table(META_TABLE)?.insert(key, bytes.as_slice())?;
    txn.commit()?;
    Ok(())
}

/// Reads the entries in `range` from the WAL, checking they are contiguous: a hole would
/// make openraft replicate a log that is not the leader's.
fn read_entries(disk: &Disk, range: (Bound<u64>, Bound<u64>)) -> Result<Vec<Entry>> {
    if range_is_empty(range) {
        return Ok(Vec::new());
    }
    let from = first_index(range.0);
    let to = match range.1 {
        Bound::Included(index) => Some(index.saturating_add(1)),
        Bound::Excluded(index) => Some(index),
        Bound::Unbounded => None,
    };
    let entries = disk.wal.read(from, to)?;
    for pair in entries.windows(2) {
        check_follows(pair[0].log_id.index, pair[1].log_id.index)?;
    }
    Ok(entries)
}

/// The first index a range's start bound admits.
fn first_index(start: Bound<u64>) -> u64 {
    match start {
        Bound::Included(index) => index,
        Bound::Excluded(index) => index.saturating_add(1),
        Bound::Unbounded => 0,
    }
}

/// Like `BTreeMap`, the reads want `start <= end`; openraft may ask for an empty range.
fn range_is_empty((start, end): (Bound<u64>, Bound<u64>)) -> bool {
    let first = first_index(start);
    match end {
        Bound::Included(index) => first > index,
        Bound::Excluded(index) => first >= index,
        Bound::Unbounded => false,
    }
}

fn check_follows(previous_index: u64, got_index: u64) -> Result<()> {
    if previous_index.checked_add(1) != Some(got_index) {
        return Err(LogStoreError::ReadGap {
            previous_index,
            got_index,
        });
    }
    Ok(())
}

fn log_state(disk: &Disk) -> Result<LogState<TypeConfig>> {
    let last_purged_log_id: Option<LogId> = load_meta(&disk.db, LAST_PURGED_KEY)?;
    Ok(LogState {
        last_purged_log_id,
        last_log_id: disk.wal.last_log_id().or(last_purged_log_id),
    })
}

/// Removes `[index, ..)` durably. Purged entries are committed, so cutting into them means
/// the caller is confused; refuse rather than lose the purge point.
fn truncate_durably(disk: &Disk, index: u64) -> Result<()> {
    let last_purged: Option<LogId> = load_meta(&disk.db, LAST_PURGED_KEY)?;
    if let Some(last_purged) = last_purged.filter(|purged| purged.index >= index) {
        return Err(LogStoreError::TruncatePurged {
            index,
            last_purged_index: last_purged.index,
        });
    }
    disk.wal.truncate(index)
}

/// Records `log_id` as purged (durably, first: a crash can never show a log that starts
/// after an older purge point), then lets the WAL drop what it no longer needs. The purge
/// point only moves forward.
fn purge_durably(disk: &Disk, log_id: LogId) -> Result<()> {
    let last_purged: Option<LogId> = load_meta(&disk.db, LAST_PURGED_KEY)?;
    if last_purged.is_some_and(|purged| purged >= log_id) {
        tracing::debug!(%log_id, "purge point already reached");
        return Ok(());
    }
    store_meta(&disk.db, LAST_PURGED_KEY, &log_id, Durability::Immediate)?;
    disk.wal.purge(log_id.index)
}

fn write_logs_error(error: LogStoreError) -> StorageError {
    StorageIOError::write_logs(&error).into()
}

fn read_logs_error(error: LogStoreError) -> StorageError {
    StorageIOError::read_logs(&error).into()
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, StorageError> {
        let bounds = (range.start_bound().cloned(), range.end_bound().cloned());
        self.read(bounds).await.map_err(read_logs_error)
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = Self;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError> {
        let mut state = self.blocking(log_state).await.map_err(read_logs_error)?;
        // Appended entries count before they are durable (openraft tracks their flush).
        if let Some(last) = lock(&self.tail).last_log_id() {
            state.last_log_id = state.last_log_id.max(Some(last));
        }
        Ok(state)
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    /// Durable before it returns: a node must never vote twice in a term, even across a crash.
    async fn save_vote(&mut self, vote: &Vote<NodeId>) -> Result<(), StorageError> {
        let vote = *vote;
        self.write(move |disk| store_meta(&disk.db, VOTE_KEY, &vote, Durability::Immediate))
            .await
            .map_err(|e| StorageIOError::<NodeId>::write_vote(&e))?;
        *lock(&self.vote) = Some(vote);
        Ok(())
    }

    /// The saved vote, except that a committed vote for this node comes back uncommitted.
    /// openraft 0.9.25 restarts a node whose vote says it leads as that leader at once
    /// (`Engine::startup`); but a leader's entries are replicated before they are durable
    /// here, so after a crash it could append a different entry under a log id a follower
    /// already holds. Uncommitted, the vote still says "I voted for myself in this term"
    /// (it grants only a greater leader id, as before), and the node must win a new term
    /// before it leads again.
    async fn read_vote(&mut self) -> Result<Option<Vote<NodeId>>, StorageError> {
        let saved: Option<Vote<NodeId>> = self
            .blocking(|disk| load_meta(&disk.db, VOTE_KEY))
            .await
            .map_err(|e| StorageIOError::read_vote(&e))?;
        let vote = saved.map(|vote| {
            if vote.is_committed() && vote.leader_id().voted_for() == Some(self.node_id) {
                Vote::new(vote.leader_id().get_term(), self.node_id)
            } else {
                vote
            }
        });
        *lock(&self.vote) = vote;
        Ok(vote)
    }

    /// Kept in memory and written by the next append's transaction: no transaction of its
    /// own on the hot path. The committed id is only a hint that lets a restarted node
    /// re-apply sooner; losing the latest one in a crash leaves an older (smaller) value,
    /// which is always safe, and openraft learns the real one from the leader.
    async fn save_committed(&mut self, committed: Option<LogId>) -> Result<(), StorageError> {
        *self.committed_slot() = Some(committed);
        Ok(())
    }

    async fn read_committed(&mut self) -> Result<Option<LogId>, StorageError> {
        // The newest one saved (not yet written), else the newest one the WAL holds.
        let pending = *self.committed_slot();
        Ok(pending.or_else(|| self.disk.wal.committed()).flatten())
    }

    /// Returns once the entries are readable (in the tail) and queued; `callback` fires after
    /// their fsync. On failure the callback gets the error too, so no waiter hangs.
    ///
    /// Except for the leader's own entries (this node leads the current term and made
    /// them): their callback fires at once, so openraft replicates them while the writer
    /// flushes them. openraft then counts this node's copy before it is durable; what would
    /// show the commit waits on [`LogStore::durable`] instead, and a failed write fails
    /// those waits.
    async fn append<I>(
        &mut self,
        entries: I,
        callback: LogFlushed<TypeConfig>,
    ) -> Result<(), StorageError>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let entries: Vec<Entry> = entries.into_iter().collect();
        let notify = Box::new(move |result| callback.log_io_completed(result));
        self.append_entries(entries, notify)
            .map_err(write_logs_error)
    }

    async fn truncate(&mut self, log_id: LogId) -> Result<(), StorageError> {
        lock(&self.tail).truncate(log_id.index);
        let mark = self.mark.clone();
        self.write(move |disk| {
            truncate_durably(disk, log_id.index)?;
            mark.set(log_state(disk)?.last_log_id);
            Ok(())
        })
        .await
        .map_err(write_logs_error)
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), StorageError> {
        lock(&self.tail).purge(log_id.index);
        let mark = self.mark.clone();
        self.write(move |disk| {
            purge_durably(disk, log_id)?;
            // A snapshot installed over a log that ended lower: the mark must stay an id
            // in this log (the commit index a leader sends is capped at it).
            mark.raise_to(log_id.index, log_state(disk)?.last_log_id);
            Ok(())
        })
        .await
        .map_err(write_logs_error)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};
    use std::io::Cursor;

    use openraft::storage::{RaftLogStorageExt, RaftStateMachine};
    use openraft::testing::{StoreBuilder, Suite};
    use openraft::{CommittedLeaderId, EntryPayload, Membership, RaftSnapshotBuilder};
    use tempfile::TempDir;
    use tokio::sync::Mutex;

    use super::*;
    use crate::raft::{MemberNode, Snapshot, SnapshotMeta, StoredMembership};
    use crate::state::{Command, FleetRequest, FleetResponse};

    /// The node the tests' stores belong to, which also made their entries (`log_id`).
    const NODE: NodeId = 0;

    /// Lifts a log-writer hold when dropped, so a failing test does not leave the writer
    /// (and the store's drop, which joins it) waiting forever.
    struct Release(Faults);

    impl Drop for Release {
        fn drop(&mut self) {
            let _ = self.0.hold_log_writes(false);
        }
    }

    fn open_store(path: &Path) -> Result<LogStore> {
        LogStore::open(path, NODE, Faults::new(false))
    }

    fn log_id(term: u64, index: u64) -> LogId {
        LogId::new(CommittedLeaderId::new(term, NODE), index)
    }

    /// An entry carrying a real fleet payload, so the codec path is exercised end to end.
    fn request_entry(term: u64, index: u64) -> Entry {
        let request = FleetRequest {
            now_us: 1_000 * index,
            commands: vec![Command::Reset {
                tenant: "tenant-a".into(),
            }]
            .into(),
        };
        Entry {
            log_id: log_id(term, index),
            payload: EntryPayload::Normal(request),
        }
    }

    fn membership_entry(term: u64, index: u64) -> Entry {
        let voters = BTreeSet::from([1]);
        let nodes = BTreeMap::from([(1, MemberNode::default())]);
        Entry {
            log_id: log_id(term, index),
            payload: EntryPayload::Membership(Membership::new(vec![voters], nodes)),
        }
    }

    fn scratch() -> (TempDir, PathBuf) {
        let dir = TempDir::new().expect("temp dir");
        let path = dir.path().join("raft-log.redb");
        (dir, path)
    }

    /// The minimal state machine openraft's suite needs: it tracks the applied log id and
    /// membership, and snapshots are the encoded pair.
    #[derive(Default)]
    struct SmState {
        last_applied: Option<LogId>,
        membership: StoredMembership,
        snapshot: Option<(SnapshotMeta, Vec<u8>)>,
        snapshots_built: u64,
    }

    #[derive(Clone, Default)]
    struct MemStateMachine {
        state: Arc<Mutex<SmState>>,
    }

    impl RaftSnapshotBuilder<TypeConfig> for MemStateMachine {
        async fn build_snapshot(&mut self) -> Result<Snapshot, StorageError> {
            let mut state = self.state.lock().await;
            let data = encode(&(state.last_applied, state.membership.clone()))
                .map_err(|e| StorageIOError::read_state_machine(&e))?;
            state.snapshots_built += 1;
            let meta = SnapshotMeta {
                last_log_id: state.last_applied,
                last_membership: state.membership.clone(),
                snapshot_id: format!("snapshot-{}", state.snapshots_built),
            };
            state.snapshot = Some((meta.clone(), data.clone()));
            Ok(Snapshot {
                meta,
                snapshot: Box::new(Cursor::new(data)),
            })
        }
    }

    impl RaftStateMachine<TypeConfig> for MemStateMachine {
        type SnapshotBuilder = Self;

        async fn applied_state(
            &mut self,
        ) -> Result<(Option<LogId>, StoredMembership), StorageError> {
            let state = self.state.lock().await;
            Ok((state.last_applied, state.membership.clone()))
        }

        async fn apply<I>(&mut self, entries: I) -> Result<Vec<FleetResponse>, StorageError>
        where
            I: IntoIterator<Item = Entry> + OptionalSend,
            I::IntoIter: OptionalSend,
        {
            let mut state = self.state.lock().await;
            let mut responses = Vec::new();
            for entry in entries {
                state.last_applied = Some(entry.log_id);
                if let EntryPayload::Membership(membership) = entry.payload {
                    state.membership = StoredMembership::new(Some(entry.log_id), membership);
                }
                responses.push(FleetResponse::default());
            }
            Ok(responses)
        }

        async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
            self.clone()
        }

        async fn begin_receiving_snapshot(&mut self) -> Result<Box<Cursor<Vec<u8>>>, StorageError> {
            Ok(Box::new(Cursor::new(Vec::new())))
        }

        async fn install_snapshot(
            &mut self,
            meta: &SnapshotMeta,
            snapshot: Box<Cursor<Vec<u8>>>,
        ) -> Result<(), StorageError> {
            let data = snapshot.into_inner();
            let (last_applied, membership) = decode(&data)
                .map_err(|e| StorageIOError::read_snapshot(Some(meta.signature()), &e))?;
            let mut state = self.state.lock().await;
            state.last_applied = last_applied;
            state.membership = membership;
            state.snapshot = Some((meta.clone(), data));
            Ok(())
        }

        async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot>, StorageError> {
            let state = self.state.lock().await;
            Ok(state.snapshot.as_ref().map(|(meta, data)| Snapshot {
                meta: meta.clone(),
                snapshot: Box::new(Cursor::new(data.clone())),
            }))
        }
    }

    /// Each build gets a fresh redb file in its own temp dir, removed when the suite drops
    /// the guard.
    struct TempDirBuilder;

    impl StoreBuilder<TypeConfig, LogStore, MemStateMachine, TempDir> for TempDirBuilder {
        async fn build(&self) -> Result<(TempDir, LogStore, MemStateMachine), StorageError> {
            let dir = TempDir::new().map_err(|e| StorageIOError::write(&e))?;
            let store = open_store(&dir.path().join("raft-log.redb")).map_err(write_logs_error)?;
            Ok((dir, store, MemStateMachine::default()))
        }
    }

    #[test]
    fn passes_openraft_storage_suite() {
        Suite::test_all(TempDirBuilder).expect("openraft storage suite");
    }

    #[tokio::test]
    async fn reopen_keeps_entries_vote_and_committed() {
        let (_dir, path) = scratch();
        let mut entries = vec![membership_entry(1, 0)];
        entries.extend((1..=5).map(|index| request_entry(1, index)));
        {
            let mut store = open_store(&path).expect("open");
            store
                .blocking_append(entries[..5].to_vec())
                .await
                .expect("append");
            store.save_vote(&Vote::new(3, 7)).await.expect("vote");
            store
                .save_committed(Some(log_id(1, 4)))
                .await
                .expect("committed");
            // The committed id rides on the next append's transaction.
            store
                .blocking_append(entries[5..].to_vec())
                .await
                .expect("append");
        }
        let mut store = open_store(&path).expect("reopen");
        assert_eq!(
            store.read_vote().await.expect("vote"),
            Some(Vote::new(3, 7))
        );
        assert_eq!(store.try_get_log_entries(..).await.expect("read"), entries);
        assert_eq!(
            store.read_committed().await.expect("committed"),
            Some(log_id(1, 4))
        );
        let state = store.get_log_state().await.expect("state");
        assert_eq!(state.last_purged_log_id, None);
        assert_eq!(state.last_log_id, Some(log_id(1, 5)));
    }

    #[tokio::test]
    async fn reopen_keeps_purge_point() {
        let (_dir, path) = scratch();
        let entries: Vec<Entry> = (0..=5).map(|index| request_entry(1, index)).collect();
        {
            let mut store = open_store(&path).expect("open");
            store
                .blocking_append(entries.clone())
                .await
                .expect("append");
            store.purge(log_id(1, 3)).await.expect("purge");
        }
        let mut store = open_store(&path).expect("reopen");
        let state = store.get_log_state().await.expect("state");
        assert_eq!(state.last_purged_log_id, Some(log_id(1, 3)));
        assert_eq!(state.last_log_id, Some(log_id(1, 5)));
        assert_eq!(
            store.try_get_log_entries(..).await.expect("read"),
            entries[4..]
        );

        store.purge(log_id(1, 9)).await.expect("purge past the end");
        drop(store);
        let mut store = open_store(&path).expect("reopen");
        let state = store.get_log_state().await.expect("state");
        assert_eq!(state.last_purged_log_id, Some(log_id(1, 9)));
        assert_eq!(state.last_log_id, Some(log_id(1, 9)));
        let next = vec![request_entry(2, 10)];
        store
            .blocking_append(next)
            .await
            .expect("append after purge point");
    }

    /// The segment files in a WAL directory (not the spare being made beside them).
    fn segment_files(wal_dir: &Path) -> Vec<PathBuf> {
        std::fs::read_dir(wal_dir)
            .expect("list")
            .map(|item| item.expect("item").path())
            .filter(|path| path.extension().is_some_and(|ext| ext == "wal"))
            .collect()
    }

    /// Copies the store at `path` (the redb file and the WAL directory) to `copy`.
    fn copy_store(path: &Path, copy: &Path) {
        std::fs::copy(path, copy).expect("copy redb");
        let wal_copy = copy.with_extension("wal");
        std::fs::create_dir_all(&wal_copy).expect("wal dir");
        for segment in segment_files(&path.with_extension("wal")) {
            let name = segment.file_name().expect("name");
            std::fs::copy(&segment, wal_copy.join(name)).expect("copy segment");
        }
    }

    /// Tells `told` the entry's index once its append counts as this node's copy.
    fn report(told: &std::sync::mpsc::Sender<u64>, index: u64) -> writer::OnDurable {
        let told = told.clone();
        Box::new(move |result: io::Result<()>| {
            result.expect("append");
            let _ = told.send(index);
        })
    }

    /// While this node leads the current term, its own entries count as soon as they are
    /// queued (the writer is held here, so they are not even written); an older term's
    /// entry, and a follower's, count only after their fsync. The durable mark moves only
    /// with the writer.
    #[tokio::test]
    async fn only_the_current_leaders_own_entries_are_reported_before_their_fsync() {
        let (_dir, path) = scratch();
        let faults = Faults::new(true);
        let mut store = LogStore::open(&path, NODE, faults.clone()).expect("open");
        let _release = Release(faults.clone());
        let durable = store.durable();
        let (told, heard) = std::sync::mpsc::channel();
        let wait = std::time::Duration::from_secs(30);

        store
            .save_vote(&Vote::new_committed(2, NODE))
            .await
            .expect("vote");
        faults.hold_log_writes(true).expect("hold");
        store
            .append_entries(vec![request_entry(1, 1)], report(&told, 1))
            .expect("append an older term's entry");
        store
            .append_entries(vec![request_entry(2, 2)], report(&told, 2))
            .expect("append its own entry");
        assert_eq!(heard.try_recv().ok(), Some(2), "its own entry, at once");
        assert!(
            heard.try_recv().is_err(),
            "the older entry waits for the writer"
        );
        assert_eq!(
            durable.last(),
            None,
            "nothing is durable while the writer is held"
        );
        faults.hold_log_writes(false).expect("release");
        assert_eq!(heard.recv_timeout(wait).ok(), Some(1));
        durable.wait_for(2).await.expect("durable");
        assert_eq!(durable.last(), Some(log_id(2, 2)));

        store
            .save_vote(&Vote::new_committed(3, 7))
            .await
            .expect("a follower's vote");
        faults.hold_log_writes(true).expect("hold");
        store
            .append_entries(vec![request_entry(3, 3)], report(&told, 3))
            .expect("append the leader's entry as a follower");
        assert!(
            heard.try_recv().is_err(),
            "a follower's entry waits for the writer"
        );
        faults.hold_log_writes(false).expect("release");
        assert_eq!(heard.recv_timeout(wait).ok(), Some(3));
        assert_eq!(durable.last(), Some(log_id(3, 3)));
    }

    /// A committed vote for this node reads back uncommitted after a restart (the node must
    /// win a new term before it leads again); anyone else's committed vote reads back as saved.
    #[tokio::test]
    async fn a_restarted_leader_does_not_resume_its_term() {
        let (_dir, path) = scratch();
        {
            let mut store = open_store(&path).expect("open");
            store
                .save_vote(&Vote::new_committed(4, 7))
                .await
                .expect("vote");
        }
        let mut store = open_store(&path).expect("reopen");
        assert_eq!(
            store.read_vote().await.expect("read"),
            Some(Vote::new_committed(4, 7))
        );
        store
            .save_vote(&Vote::new_committed(5, NODE))
            .await
            .expect("vote");
        drop(store);
        let mut store = open_store(&path).expect("reopen");
        assert_eq!(
            store.read_vote().await.expect("read"),
            Some(Vote::new(5, NODE))
        );
    }

    /// A purge past the end of the log (a snapshot installed over a shorter log) moves the
    /// durable mark to the purge point, so it stays an id in this log.
    #[tokio::test]
    async fn a_purge_past_the_log_moves_the_durable_mark_to_it() {
        let (_dir, path) = scratch();
        let mut store = open_store(&path).expect("open");
        let durable = store.durable();
        let entries: Vec<Entry> = (1..=3).map(|index| request_entry(1, index)).collect();
        store.blocking_append(entries).await.expect("append");
        store.purge(log_id(2, 10)).await.expect("purge");
        assert_eq!(durable.last(), Some(log_id(2, 10)));
        store.purge(log_id(2, 10)).await.expect("purge again");
        assert_eq!(durable.last(), Some(log_id(2, 10)));
    }

    /// Truncation moves the durable mark back to the last entry left, so a later entry at
    /// the same index is not taken as durable before it is written.
    #[tokio::test]
    async fn truncation_moves_the_durable_mark_back() {
        let (_dir, path) = scratch();
        let mut store = open_store(&path).expect("open");
        let durable = store.durable();
        let entries: Vec<Entry> = (1..=5).map(|index| request_entry(1, index)).collect();
        store.blocking_append(entries).await.expect("append");
        assert_eq!(durable.last(), Some(log_id(1, 5)));
        store.truncate(log_id(1, 3)).await.expect("truncate");
        assert_eq!(durable.last(), Some(log_id(1, 2)));
        drop(store);
        let store = open_store(&path).expect("reopen");
        assert_eq!(store.durable().last(), Some(log_id(1, 2)), "read at open");
    }

    /// At the moment the callback fires, a byte copy of the files (what a crash right then
    /// would leave) already opens with the entries in it.
    #[tokio::test]
    async fn append_notifies_only_after_entries_survive_a_reopen() {
        let (dir, path) = scratch();
        let copy_path = dir.path().join("copy-at-callback.redb");
        let store = open_store(&path).expect("open");
        let entries: Vec<Entry> = (0..3).map(|index| request_entry(1, index)).collect();
        let (seen, seen_at_callback) = std::sync::mpsc::channel();
        let source = path.clone();
        store
            .append_entries(
                entries.clone(),
                Box::new(move |result| {
                    result.expect("append result");
                    copy_store(&source, &copy_path);
                    let copy = open_store(&copy_path).expect("open copy");
                    let all = (Bound::Unbounded, Bound::Unbounded);
                    let _ = seen.send(read_entries(&copy.disk, all).expect("read copy"));
                }),
            )
            .expect("append");
        let seen_at_callback = seen_at_callback
            .recv_timeout(std::time::Duration::from_secs(30))
            .expect("the callback fires");
        assert_eq!(seen_at_callback, entries);
    }

    #[tokio::test]
    async fn append_refuses_a_hole() {
        let (_dir, path) = scratch();
        let mut store = open_store(&path).expect("open");
        let first: Vec<Entry> = (0..=2).map(|index| request_entry(1, index)).collect();
        store.blocking_append(first.clone()).await.expect("append");

        let gap = store.blocking_append(vec![request_entry(1, 4)]).await;
        assert!(gap.is_err(), "gap after the last entry accepted");
        let inner_gap = vec![request_entry(1, 3), request_entry(1, 5)];
        assert!(store.blocking_append(inner_gap).await.is_err());
        assert_eq!(store.try_get_log_entries(..).await.expect("read"), first);

        store.purge(log_id(1, 7)).await.expect("purge");
        let purged_again = vec![
            request_entry(1, 6),
            request_entry(1, 7),
            request_entry(1, 8),
        ];
        store
            .blocking_append(purged_again)
            .await
            .expect("append over the purge point");
        let stored = store.try_get_log_entries(..).await.expect("read");
        assert_eq!(
            stored,
            vec![request_entry(1, 8)],
            "purged entries must not come back"
        );
        assert!(store.truncate(log_id(1, 7)).await.is_err());
    }

    /// Small segments: appends roll over, reads cross segments, purge drops whole segments,
    /// truncation cuts inside one and drops the later ones, and all of it survives a reopen.
    #[tokio::test]
    async fn segments_roll_purge_and_truncate_across_reopens() {
        let (dir, path) = scratch();
        let wal_dir = path.with_extension("wal");
        let segments = || segment_files(&wal_dir).len();
        let entries: Vec<Entry> = (0..40).map(|index| request_entry(1, index)).collect();
        {
            let mut store = LogStore::open_with_segment_bytes(&path, NODE, Faults::new(false), 256)
                .expect("open");
            for chunk in entries.chunks(3) {
                store.blocking_append(chunk.to_vec()).await.expect("append");
            }
            assert!(
                segments() > 3,
                "appends rolled over: {} segments",
                segments()
            );
            assert_eq!(store.try_get_log_entries(..).await.expect("read"), entries);
            assert_eq!(
                store.try_get_log_entries(5..33).await.expect("read"),
                entries[5..33]
            );
        }
        let before_purge = segments();
        {
            let mut store = LogStore::open_with_segment_bytes(&path, NODE, Faults::new(false), 256)
                .expect("reopen");
            assert_eq!(store.try_get_log_entries(..).await.expect("read"), entries);
            store.purge(log_id(1, 20)).await.expect("purge");
            assert!(segments() < before_purge, "purge dropped whole segments");
            store.truncate(log_id(1, 30)).await.expect("truncate");
            let replaced: Vec<Entry> = (30..35).map(|index| request_entry(2, index)).collect();
            store
                .blocking_append(replaced)
                .await
                .expect("append after truncate");
        }
        let mut store = LogStore::open_with_segment_bytes(&path, NODE, Faults::new(false), 256)
            .expect("reopen");
        let mut expected = entries[21..30].to_vec();
        expected.extend((30..35).map(|index| request_entry(2, index)));
        assert_eq!(store.try_get_log_entries(..).await.expect("read"), expected);
        let state = store.get_log_state().await.expect("state");
        assert_eq!(state.last_purged_log_id, Some(log_id(1, 20)));
        assert_eq!(state.last_log_id, Some(log_id(2, 34)));
        drop(dir);
    }

    /// What the snapshot policy reads: the bytes of every record after an index, across
    /// segment boundaries and after a truncation, each entry's counted once.
    #[tokio::test]
    async fn log_bytes_count_the_records_after_an_index() {
        let (_dir, path) = scratch();
        let record_len = |entry: &Entry| {
            let mut buf = Vec::new();
            wal::push_record(
                &mut buf,
                wal::KIND_ENTRY,
                &encode_as(entry, "entry").expect("encode"),
            )
            .expect("record");
            buf.len() as u64
        };
        let after = |entries: &[Entry], index: u64| -> u64 {
            entries
                .iter()
                .filter(|entry| entry.log_id.index > index)
                .map(record_len)
                .sum()
        };
        let mut store =
            LogStore::open_with_segment_bytes(&path, NODE, Faults::new(false), 256).expect("open");
        let bytes = store.log_bytes();
        assert_eq!(bytes.after(None), Some(0), "an empty log");
        let mut entries: Vec<Entry> = (1..=40).map(|index| request_entry(1, index)).collect();
        for chunk in entries.chunks(3) {
            store.blocking_append(chunk.to_vec()).await.expect("append");
        }
        assert!(
            segment_files(&path.with_extension("wal")).len() > 3,
            "rolled over"
        );
        assert_eq!(bytes.after(None), Some(after(&entries, 0)));
        for index in [1, 7, 20, 39] {
            assert_eq!(
                bytes.after(Some(index)),
                Some(after(&entries, index)),
                "after {index}"
            );
        }
        assert_eq!(bytes.after(Some(40)), Some(0));
        assert_eq!(bytes.after(Some(u64::MAX)), Some(0));
        store.truncate(log_id(1, 30)).await.expect("truncate");
        entries.truncate(29);
        let replaced: Vec<Entry> = (30..=33).map(|index| request_entry(2, index)).collect();
        store
            .blocking_append(replaced.clone())
            .await
            .expect("append");
        entries.extend(replaced);
        assert_eq!(bytes.after(Some(25)), Some(after(&entries, 25)));
    }

    /// The next segment's file is made ahead (zeros, fsynced) and becomes the new segment
    /// when the log rolls over: the very file, not a copy.
    #[tokio::test]
    async fn the_next_segment_is_made_ahead_and_taken_when_the_log_rolls() {
        use std::os::unix::fs::MetadataExt;
        let (_dir, path) = scratch();
        let wal_dir = path.with_extension("wal");
        let spare = wal_dir.join("next-segment.spare");
        let mut store =
            LogStore::open_with_segment_bytes(&path, NODE, Faults::new(false), 256).expect("open");
        store
            .blocking_append(vec![request_entry(1, 0)])
            .await
            .expect("append");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while !spare.exists() {
            assert!(std::time::Instant::now() < deadline, "no spare was made");
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        let spare_inode = std::fs::metadata(&spare).expect("spare").ino();
        let before = segment_files(&wal_dir);
        let mut next = 1;
        while segment_files(&wal_dir).len() == before.len() {
            assert!(next < 50, "the log never rolled over");
            store
                .blocking_append(vec![request_entry(1, next)])
                .await
                .expect("append");
            next += 1;
        }
        let rolled: Vec<PathBuf> = segment_files(&wal_dir)
            .into_iter()
            .filter(|segment| !before.contains(segment))
            .collect();
        assert_eq!(rolled.len(), 1);
        assert_eq!(
            std::fs::metadata(&rolled[0]).expect("segment").ino(),
            spare_inode
        );
        let all: Vec<Entry> = (0..next).map(|index| request_entry(1, index)).collect();
        assert_eq!(store.try_get_log_entries(..).await.expect("read"), all);
    }

    /// A crash in the middle of an append leaves a torn record at the end of the last
    /// segment: the store opens with everything before it, clears the rest, and appends
    /// continue from there. The same damage anywhere but the last segment refuses to open.
    #[tokio::test]
    async fn a_torn_last_append_is_cut_and_damage_elsewhere_refuses_to_open() {
        let (_dir, path) = scratch();
        let wal_dir = path.with_extension("wal");
        let entries: Vec<Entry> = (0..6).map(|index| request_entry(1, index)).collect();
        {
            let mut store = open_store(&path).expect("open");
            store
                .blocking_append(entries[..4].to_vec())
                .await
                .expect("append");
            store
                .blocking_append(entries[4..].to_vec())
                .await
                .expect("append");
        }
        let segment = wal_dir.join(format!("{:020}.wal", 0));
        let bytes = std::fs::read(&segment).expect("read");
        let used = bytes.iter().rposition(|byte| *byte != 0).expect("records") + 1;
        // Flip a byte inside the last record: its checksum fails, as after a torn write.
        let mut torn = bytes.clone();
        torn[used - 3] ^= 0xff;
        std::fs::write(&segment, &torn).expect("tear");
        {
            let mut store = open_store(&path).expect("open after the tear");
            assert_eq!(
                store.try_get_log_entries(..).await.expect("read"),
                entries[..5],
                "everything before the torn record"
            );
            store
                .blocking_append(vec![request_entry(2, 5)])
                .await
                .expect("append");
        }
        let mut store = open_store(&path).expect("reopen");
        let mut expected = entries[..5].to_vec();
        expected.push(request_entry(2, 5));
        assert_eq!(store.try_get_log_entries(..).await.expect("read"), expected);
        drop(store);

        // The same damage in a segment that is not the last one.
        let mut damaged = std::fs::read(&segment).expect("read");
        damaged[20] ^= 0xff;
        std::fs::write(&segment, &damaged).expect("damage");
        std::fs::write(wal_dir.join(format!("{:020}.wal", 6)), vec![0u8; 64]).expect("later");
        assert!(open_store(&path).is_err(), "a hole must not be served");
    }

    /// A record whose checksum holds but whose entry does not continue the log is no torn
    /// write: the store refuses to open instead of cutting the log there.
    #[tokio::test]
    async fn a_sound_record_out_of_order_refuses_to_open() {
        let (_dir, path) = scratch();
        {
            let mut store = open_store(&path).expect("open");
            let entries: Vec<Entry> = (0..3).map(|index| request_entry(1, index)).collect();
            store.blocking_append(entries).await.expect("append");
        }
        let segment = path.with_extension("wal").join(format!("{:020}.wal", 0));
        let mut bytes = std::fs::read(&segment).expect("read");
        let used = bytes.iter().rposition(|byte| *byte != 0).expect("records") + 1;
        let mut record = Vec::new();
        let misplaced = encode(&request_entry(1, 7)).expect("encode");
        wal::push_record(&mut record, wal::KIND_ENTRY, &misplaced).expect("record");
        bytes[used..used + record.len()].copy_from_slice(&record);
        std::fs::write(&segment, &bytes).expect("write");
        let refused = open_store(&path).expect_err("entry 7 after entry 2");
        assert!(
            refused.to_string().contains("entry 7 where 3 belongs"),
            "{refused}"
        );
    }

    #[tokio::test]
    async fn empty_and_inverted_ranges_read_nothing() {
        let (_dir, path) = scratch();
        let mut store = open_store(&path).expect("open");
        store
            .blocking_append(vec![request_entry(1, 0)])
            .await
            .expect("append");
        assert!(store
            .try_get_log_entries(3..3)
            .await
            .expect("empty")
            .is_empty());
        let inverted = (Bound::Included(5), Bound::Excluded(2));
        assert!(store
            .try_get_log_entries(inverted)
            .await
            .expect("inverted")
            .is_empty());
    }
}
