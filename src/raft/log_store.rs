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

mod vote_check;
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
use crate::planted::{Planted, PlantedBug};
use crate::raft::faults::Faults;
use crate::raft::{Entry, LogId, NodeId, StorageError, TypeConfig};
use crate::storage::unless_panic;

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
    #[error("log record kind {kind} is no entry kind this build reads")]
    UnknownEntryKind { kind: u8 },
    #[error("a log record of {len_bytes} bytes does not fit its 32-bit length")]
    RecordTooLarge { len_bytes: usize },
    /// The vote store (the redb file) is damaged, or does not fit the log beside it.
    #[error("vote store {path} is damaged: {reason}")]
    VoteStore { path: PathBuf, reason: String },
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
    /// The bug this node plays (`crate::planted`); `EarlyFollowerAck` reports every
    /// append before its fsync, a follower's too.
    planted: Planted,
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
        vote_check::check_vote_store(path)?;
        let (db, purged, vote) = unless_panic(|| -> Result<_> {
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
            let vote: Option<Vote<NodeId>> = load_meta(&db, VOTE_KEY)?;
            Ok((db, purged, vote))
        })
        .map_err(|panic| vote_check::damaged(path, format!("redb panicked: {panic}")))?
        .map_err(|e| match e {
            LogStoreError::Codec { what, source } => {
                vote_check::damaged(path, format!("{what} does not decode: {source}"))
            }
            LogStoreError::Redb { source } => open_error(source),
            other => other,
        })?;
        let purged_upto = purged.map(|log_id| log_id.index);
        let wal = wal::Wal::open(&path.with_extension("wal"), purged_upto, segment_bytes)?;
        vote_check::check_vote_covers_log(path, vote, wal.last_log_id())?;
        let disk = Disk { db, wal };
        let mark = crate::raft::durability::DurableMark::new(log_state(&disk)?.last_log_id);
        let disk = Arc::new(disk);
        let tail = Arc::new(std::sync::Mutex::new(writer::Tail::new(purged_upto)));
        let planted = faults.planted();
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
            planted,
        })
    }

    /// The last purged log id: the stored snapshot must reach it. Blocking (a redb read):
    /// call it at start-up.
    ///
    /// # Errors
    /// When redb fails or the id does not decode.
    pub fn last_purged(&self) -> Result<Option<LogId>, LogStoreError> {
        load_meta(&self.disk.db, LAST_PURGED_KEY)
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
        // The planted bug (fault injection only) breaks the rule on purpose, for the
        // nemesis to catch.
        self.planted.is(PlantedBug::EarlyFollowerAck)
            || crate::raft::durability::reports_early(*lock(&self.vote), self.node_id, entries)
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
    let mut txn = db.begin_write()?;
    txn.set_two_phase_commit(true);
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
    // Two-phase: after a crash redb then never falls back to the previous commit because
    // the last one does not check (a flipped bit, not a torn commit): it refuses instead.
    txn.set_two_phase_commit(true);
    txn.open_table(META_TABLE)?.insert(key, bytes.as_slice())?;
    txn.commit()?;
    // And a commit that changes nothing: both of redb's commit slots then name this data,
    // so a flipped bit in the header's choice between them reads the same vote, not the
    // one before.
    let mut again = db.begin_write()?;
    again.set_durability(durability);
    again.set_two_phase_commit(true);
    again.commit()?;
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
mod tests;
