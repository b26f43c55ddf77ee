//! The Raft log's entries: an append-only, segmented write-ahead log.
//!
//! A segment is one file, `<first index, 20 digits>.wal`, created full of zeros (written,
//! fsynced, then renamed into place; the next one is made ahead on a thread of its own) so
//! that appending to it is a `pwrite` and an
//! `fdatasync` that has no file size or block allocation to record: one device flush, no
//! metadata write. Records are framed by [`crate::storage::record`]; a body is a kind
//! byte and the encoded value: an entry, or the committed log id. A zero length ends a
//! segment's records.
//!
//! Replay at open reads every segment from the start and keeps records while their length
//! fits the file and their checksum holds. In the last segment the first record that fails
//! may be where a crash tore an append (never acknowledged: the callback fires after the
//! fsync): if it looks like one ([`record::is_torn_append`]: the write stopped at a sector
//! boundary inside that record, zeros after it), everything from there on is zeroed; so is
//! everything after a whole zero header there, which is where an unfinished truncation
//! (zeroing forward from the cut) stopped.
//! Anything else is corruption: a failing record in another segment, one in the last
//! segment with data in every sector (a flipped bit) or data after it, a segment shorter
//! than it was made (segments are made full size, so only damage shortens one), and a
//! record that checks but does not fit the log (an entry out of index order, a term that
//! goes down, an unknown kind). On corruption the log refuses to open, naming the segment,
//! rather than serve a log that lost acknowledged entries or has a hole.
//!
//! Only the writer thread changes the log; readers take the lock, read durable records and
//! let go. Truncation zeroes the cut records (and removes whole segments after them) before
//! it returns; purge removes segments whose entries are all at or below the purge point
//! (which the caller has already made durable).

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io;
use std::io::Cursor;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;

use super::{decode_as, encode_as, LogStoreError, Result};
use crate::lock::{lock, try_lock};
use crate::raft::{Entry, LogId};
use crate::storage::record;

/// Size a segment is created with (zeros); a segment rolls over once its records reach it.
pub(super) const SEGMENT_BYTES: u64 = 16 * 1024 * 1024;
/// An entry as written before entries carried the leader's state limits (read only: its
/// commands apply with no limit, as they did when it was written).
pub(super) const KIND_ENTRY_V1: u8 = 0;
const KIND_COMMITTED: u8 = 1;
/// An entry whose request carries the leader's state limits, its commands encoded in line
/// (read only: written before commands were carried as their bytes).
pub(super) const KIND_ENTRY_V2: u8 = 2;
/// An entry whose commands are each a byte string, the bytes the proposing node encoded
/// (`FleetRequest::commands`, [`crate::state::EncodedCommand`]): the only kind written.
pub(super) const KIND_ENTRY: u8 = 3;

/// An entry's payload as [`KIND_ENTRY_V1`] encodes it: no limits.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(super) struct FleetRequestV1 {
    pub now_us: u64,
    pub commands: Vec<crate::state::Command>,
}

/// An entry's payload as [`KIND_ENTRY_V2`] encodes it: commands in line.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(super) struct FleetRequestV2 {
    pub now_us: u64,
    pub limits: crate::state::StateLimits,
    pub commands: Vec<crate::state::Command>,
}

openraft::declare_raft_types!(
    /// The type configuration [`KIND_ENTRY_V1`] records were encoded with.
    pub(super) TypeConfigV1:
        D = FleetRequestV1,
        R = crate::state::FleetResponse,
        Node = crate::raft::MemberNode,
);

openraft::declare_raft_types!(
    /// The type configuration [`KIND_ENTRY_V2`] records were encoded with.
    pub(super) TypeConfigV2:
        D = FleetRequestV2,
        R = crate::state::FleetResponse,
        Node = crate::raft::MemberNode,
);

/// Whether `kind` is an entry record this build reads.
pub(super) fn is_entry(kind: u8) -> bool {
    matches!(kind, KIND_ENTRY | KIND_ENTRY_V2 | KIND_ENTRY_V1)
}

/// Decodes an entry record of any kind this build reads into the current form. An older
/// kind's commands are encoded here, once per read: the same bytes the current kind would
/// hold, so they apply exactly as they did when written.
pub(super) fn decode_entry(kind: u8, payload: &[u8]) -> Result<Entry> {
    match kind {
        KIND_ENTRY => decode_as(payload, "log entry"),
        KIND_ENTRY_V2 => {
            let old: openraft::Entry<TypeConfigV2> = decode_as(payload, "log entry (kind 2)")?;
            upgraded(old.log_id, old.payload, |request| {
                (request.now_us, request.limits, request.commands)
            })
        }
        KIND_ENTRY_V1 => {
            let old: openraft::Entry<TypeConfigV1> = decode_as(payload, "log entry (kind 0)")?;
            upgraded(old.log_id, old.payload, |request| {
                let limits = crate::state::StateLimits::UNLIMITED;
                (request.now_us, limits, request.commands)
            })
        }
        kind => Err(LogStoreError::UnknownEntryKind { kind }),
    }
}

/// An old entry in the current form: `parts` gives its stamp, limits and commands.
fn upgraded<D>(
    log_id: LogId,
    payload: openraft::EntryPayload<
        impl openraft::RaftTypeConfig<
            D = D,
            NodeId = crate::raft::NodeId,
            Node = crate::raft::MemberNode,
        >,
    >,
    parts: impl FnOnce(D) -> (u64, crate::state::StateLimits, Vec<crate::state::Command>),
) -> Result<Entry> {
    let payload = match payload {
        openraft::EntryPayload::Blank => openraft::EntryPayload::Blank,
        openraft::EntryPayload::Membership(m) => openraft::EntryPayload::Membership(m),
        openraft::EntryPayload::Normal(request) => {
            let (now_us, limits, commands) = parts(request);
            let commands =
                crate::state::EncodedCommand::encode_all(&commands).map_err(|source| {
                    LogStoreError::Codec {
                        what: "log entry (an old kind's command)",
                        source,
                    }
                })?;
            openraft::EntryPayload::Normal(crate::state::FleetRequest {
                now_us,
                limits,
                commands: commands.into(),
            })
        }
    };
    Ok(Entry { log_id, payload })
}
const SUFFIX: &str = ".wal";
/// The next segment's file once made (zeros, fsynced), and while it is being made.
const SPARE: &str = "next-segment.spare";
const SPARE_STAGING: &str = "next-segment.spare.tmp";
static ZEROS: [u8; 64 * 1024] = [0; 64 * 1024];

/// Which end of the log deleting segments starts from.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Order {
    OldestFirst,
    NewestFirst,
}

/// Where one entry's record lies in its segment.
#[derive(Clone, Copy)]
struct Span {
    offset: u64,
    len: u64,
    log_id: LogId,
}

struct Segment {
    first_index: u64,
    path: PathBuf,
    file: Arc<File>,
    /// Where the next record goes (everything after it is zeros).
    end: u64,
    /// One span per entry, `first_index` onwards, consecutive.
    spans: Vec<Span>,
}

impl Segment {
    /// The index the next entry here must have (an empty segment, left by a failed first
    /// write, expects its own first index): segments stay contiguous.
    fn next_index(&self) -> u64 {
        self.first_index + self.spans.len() as u64
    }

    fn last_log_id(&self) -> Option<LogId> {
        self.spans.last().map(|span| span.log_id)
    }
}

struct State {
    /// By first index; the last one is the one appended to.
    segments: BTreeMap<u64, Segment>,
    /// Entries at or below this index are in a snapshot: never appended, never kept.
    purged_upto: Option<u64>,
    /// The newest committed id written (replayed at open), if any.
    committed: Option<Option<LogId>>,
}

/// The segmented log of one node.
pub(super) struct Wal {
    dir: PathBuf,
    segment_bytes: u64,
    state: Mutex<State>,
    /// The next segment's file, being made ahead (see `prepare_spare`).
    spare: Mutex<Option<JoinHandle<io::Result<PathBuf>>>>,
}

impl Drop for Wal {
    fn drop(&mut self) {
        if let Some(spare) = lock(&self.spare).take() {
            let _ = spare.join();
        }
    }
}

/// A file of `bytes` zeros, fsynced, opened for reading and writing.
///
/// Made ahead (`paced`), the zeros are flushed a step at a time
/// ([`crate::storage::write_in_flushed_steps`]): the nodes roll their segments at the same
/// index, and three segments zeroed in one flush each held every node's appends. Made in
/// line, an append is already waiting for it, and one flush makes it soonest (24 ms for
/// 16 MiB here, against 50-64 ms in steps with the other nodes' logs on the same disk).
fn zeroed_file(path: &Path, bytes: u64, paced: bool) -> io::Result<File> {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)?;
    if paced {
        crate::storage::write_in_flushed_steps(&file, bytes, write_zeros)?;
    } else {
        write_zeros(&file, 0, bytes)?;
    }
    file.sync_all()?;
    Ok(file)
}

fn io_error(path: &Path, what: &str, source: io::Error) -> LogStoreError {
    LogStoreError::Wal {
        path: path.to_path_buf(),
        reason: format!("{what}: {source}"),
    }
}

fn corrupt(path: &Path, reason: String) -> LogStoreError {
    LogStoreError::Wal {
        path: path.to_path_buf(),
        reason,
    }
}

fn segment_name(first_index: u64) -> String {
    format!("{first_index:020}{SUFFIX}")
}

fn sync_dir(dir: &Path) -> Result<()> {
    crate::storage::sync_dir(dir).map_err(|e| io_error(dir, "fsync directory", e))
}

/// Writes zeros over `[from, to)` of `file`.
fn zero(file: &File, path: &Path, from: u64, to: u64) -> Result<()> {
    write_zeros(file, from, to).map_err(|e| io_error(path, "zero", e))
}

fn write_zeros(file: &File, from: u64, to: u64) -> io::Result<()> {
    let mut at = from;
    while at < to {
        let n = (to - at).min(ZEROS.len() as u64);
        file.write_all_at(&ZEROS[..n as usize], at)?;
        at += n;
    }
    Ok(())
}

/// The records of one append: each entry's, then the committed id's if any, and where
/// each entry's record lies in them.
fn records(admitted: &[&Entry], committed: Option<Option<LogId>>) -> Result<(Vec<u8>, Vec<Span>)> {
    let mut buf = Vec::new();
    let mut spans = Vec::with_capacity(admitted.len());
    for entry in admitted {
        let offset = buf.len() as u64;
        push_record(&mut buf, KIND_ENTRY, &encode_as(*entry, "log entry")?)?;
        spans.push(Span {
            offset,
            len: buf.len() as u64 - offset,
            log_id: entry.log_id,
        });
    }
    if let Some(committed) = committed {
        push_record(
            &mut buf,
            KIND_COMMITTED,
            &encode_as(&committed, "committed")?,
        )?;
    }
    Ok((buf, spans))
}

/// Appends one record (the kind byte, then `payload`) to `buf`.
pub(super) fn push_record(buf: &mut Vec<u8>, kind: u8, payload: &[u8]) -> Result<()> {
    record::push(buf, &[&[kind], payload]).map_err(|e| LogStoreError::RecordTooLarge {
        len_bytes: e.len_bytes,
    })
}

/// One record read back: its kind and payload, and where the next one starts; `None`
/// where the records stop (zeros, the end, or a torn or corrupt record).
fn read_record(bytes: &[u8], at: usize) -> Option<(u8, &[u8], usize)> {
    let (body, next) = record::read_at(bytes, at, bytes.len()).ok()?;
    let (kind, payload) = body.split_first()?;
    Some((*kind, payload, next))
}

impl Wal {
    /// Opens (or creates) the log in `dir`, replays it and drops segments wholly at or below
    /// `purged_upto`.
    pub(super) fn open(dir: &Path, purged_upto: Option<u64>, segment_bytes: u64) -> Result<Wal> {
        fs::create_dir_all(dir).map_err(|e| io_error(dir, "create directory", e))?;
        let mut firsts = Vec::new();
        for item in fs::read_dir(dir).map_err(|e| io_error(dir, "list", e))? {
            let item = item.map_err(|e| io_error(dir, "list", e))?;
            let name = item.file_name().to_string_lossy().into_owned();
            if name.ends_with(".tmp") || name == SPARE {
                // A segment that was being created when the node stopped, or a spare.
                fs::remove_file(item.path()).map_err(|e| io_error(&item.path(), "remove", e))?;
            } else if let Some(first) = name
                .strip_suffix(SUFFIX)
                .and_then(|digits| digits.parse::<u64>().ok())
            {
                firsts.push(first);
            }
        }
        firsts.sort_unstable();
        let mut segments = BTreeMap::new();
        let mut committed = None;
        let count = firsts.len();
        for (position, first_index) in firsts.into_iter().enumerate() {
            let is_last = position + 1 == count;
            let path = dir.join(segment_name(first_index));
            let (segment, seen_committed) =
                replay::segment(&path, first_index, is_last, segment_bytes)?;
            committed = seen_committed.or(committed);
            segments.insert(first_index, segment);
        }
        let wal = Wal {
            dir: dir.to_path_buf(),
            segment_bytes,
            state: Mutex::new(State {
                segments,
                purged_upto,
                committed,
            }),
            spare: Mutex::new(None),
        };
        {
            let mut state = wal.lock();
            wal.drop_segments(&mut state, Order::OldestFirst, |segment| {
                segment.spans.is_empty()
                    || purged_upto.is_some_and(|p| segment.next_index() <= p + 1)
            })?;
            replay::check_contiguous(dir, &state)?;
            if let (Some(purged), Some(first)) = (purged_upto, state.segments.keys().next()) {
                if *first > purged + 1 {
                    return Err(corrupt(
                        dir,
                        format!("log starts at {first}, after the purge point {purged}: a hole"),
                    ));
                }
            }
        }
        Ok(wal)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Changed only by the writer thread, a step at a time.
        lock(&self.state)
    }

    /// The newest committed id written, if any (a hint: it may lag).
    pub(super) fn committed(&self) -> Option<Option<LogId>> {
        self.lock().committed
    }

    pub(super) fn last_log_id(&self) -> Option<LogId> {
        self.lock()
            .segments
            .values()
            .rev()
            .find_map(Segment::last_log_id)
    }

    /// Appends the entries past the purge point (they must continue the log: a hole is
    /// refused) and the committed id, with one write and one fsync. Entries at or below the
    /// purge point are skipped: they are committed and in a snapshot, so by log matching
    /// they are the entries that were purged (openraft's storage suite appends such).
    pub(super) fn append(&self, entries: &[Entry], committed: Option<Option<LogId>>) -> Result<()> {
        if entries.is_empty() && committed.is_none() {
            return Ok(());
        }
        let (admitted, target) = {
            let state = self.lock();
            let purged = state.purged_upto;
            let admitted: Vec<&Entry> = entries
                .iter()
                .filter(|entry| purged.is_none_or(|p| entry.log_id.index > p))
                .collect();
            let last = state.segments.values().next_back();
            let mut next = last.map(Segment::next_index).or(purged.map(|p| p + 1));
            for entry in &admitted {
                if let Some(expected_index) = next.filter(|want| *want != entry.log_id.index) {
                    return Err(LogStoreError::AppendGap {
                        expected_index,
                        got_index: entry.log_id.index,
                    });
                }
                next = Some(entry.log_id.index + 1);
            }
            let target = last.map(|segment| (segment.first_index, segment.end));
            (admitted, target)
        };
        let (buf, spans) = records(&admitted, committed)?;
        let first_new = admitted.first().map(|entry| entry.log_id.index);
        let (first_index, end) = match (target, first_new) {
            // A segment is full once a write would pass its size; a write with no entry
            // (only the committed id) still goes in, past the size if need be.
            (Some((first_index, end)), None) => (first_index, end),
            (Some((first_index, end)), Some(_)) if end + buf.len() as u64 <= self.segment_bytes => {
                (first_index, end)
            }
            (_, Some(first_new)) => (self.create_segment(first_new)?, 0),
            // Nothing to write into and no entry to start a segment with: the committed
            // id is only a hint, the next append carries a newer one.
            (None, None) => return Ok(()),
        };
        let (file, path) = {
            let state = self.lock();
            let segment = &state.segments[&first_index];
            (Arc::clone(&segment.file), segment.path.clone())
        };
        file.write_all_at(&buf, end)
            .map_err(|e| io_error(&path, "write", e))?;
        file.sync_data().map_err(|e| io_error(&path, "fsync", e))?;
        let mut state = self.lock();
        if let Some(segment) = state.segments.get_mut(&first_index) {
            segment.spans.extend(spans.into_iter().map(|span| Span {
                offset: span.offset + end,
                ..span
            }));
            segment.end = end + buf.len() as u64;
        }
        state.committed = committed.or(state.committed);
        Ok(())
    }

    /// Creates the segment whose first entry will be `first_index`: zeros, fsynced, renamed
    /// into place and the directory fsynced, so it is whole before any record counts on it.
    fn create_segment(&self, first_index: u64) -> Result<u64> {
        let path = self.dir.join(segment_name(first_index));
        let file = match self.take_spare() {
            Some(spare) => {
                fs::rename(&spare, &path).map_err(|e| io_error(&path, "rename", e))?;
                OpenOptions::new()
                    .read(true)
                    .write(true)
                    .open(&path)
                    .map_err(|e| io_error(&path, "open", e))?
            }
            None => {
                let staging = self.dir.join(format!("{}.tmp", segment_name(first_index)));
                let file = zeroed_file(&staging, self.segment_bytes, false)
                    .map_err(|e| io_error(&staging, "create", e))?;
                fs::rename(&staging, &path).map_err(|e| io_error(&path, "rename", e))?;
                file
            }
        };
        sync_dir(&self.dir)?;
        self.prepare_spare();
        self.lock().segments.insert(
            first_index,
            Segment {
                first_index,
                path,
                file: Arc::new(file),
                end: 0,
                spans: Vec::new(),
            },
        );
        Ok(first_index)
    }

    /// The spare segment, if one is ready (zeros written and fsynced under its own name).
    fn take_spare(&self) -> Option<PathBuf> {
        let mut spare = lock(&self.spare);
        if !spare.as_ref().is_some_and(JoinHandle::is_finished) {
            return None;
        }
        match spare.take().map(JoinHandle::join) {
            Some(Ok(Ok(path))) => Some(path),
            Some(Ok(Err(e))) => {
                tracing::warn!(error = %e, "spare log segment not made; creating one in line");
                None
            }
            _ => None,
        }
    }

    /// Starts making the next segment's file on a thread of its own, unless one is on its
    /// way: zeroing 16 MiB and its fsync take 20-25 ms that appends would otherwise wait.
    fn prepare_spare(&self) {
        let mut spare = lock(&self.spare);
        if spare.is_some() {
            return;
        }
        let (staging, ready) = (self.dir.join(SPARE_STAGING), self.dir.join(SPARE));
        let bytes = self.segment_bytes;
        let made = std::thread::Builder::new()
            .name("raft-log-spare".to_owned())
            .spawn(move || {
                zeroed_file(&staging, bytes, true)?;
                fs::rename(&staging, &ready)?;
                Ok(ready)
            });
        match made {
            Ok(handle) => *spare = Some(handle),
            Err(e) => tracing::warn!(error = %e, "no thread for a spare log segment"),
        }
    }

    /// Bytes of log written after entry `index` (every entry's for `None`), the committed
    /// ids written between them included: how much log a snapshot at `index` has behind it.
    /// `None` when the writer holds the log right now: a purge or a truncation holds it
    /// through its disk IO, and the caller (on an async runtime) must not wait for that.
    pub(super) fn try_bytes_after(&self, index: Option<u64>) -> Option<u64> {
        let state = try_lock(&self.state)?;
        let bytes = state
            .segments
            .values()
            .map(|segment| {
                let skipped = index.map_or(0, |index| {
                    let skipped = index.saturating_add(1).saturating_sub(segment.first_index);
                    usize::try_from(skipped).unwrap_or(usize::MAX)
                });
                match (segment.spans.get(skipped), segment.spans.last()) {
                    (Some(first), Some(last)) => last.offset + last.len - first.offset,
                    _ => 0,
                }
            })
            .sum();
        Some(bytes)
    }

    /// The entries with indexes in `[from, to)` that the log holds (purged ones are gone;
    /// the caller checks the result has no hole).
    pub(super) fn read(&self, from: u64, to: Option<u64>) -> Result<Vec<Entry>> {
        let state = self.lock();
        let from = match state.purged_upto {
            Some(purged) => from.max(purged.saturating_add(1)),
            None => from,
        };
        let mut entries = Vec::new();
        for segment in state.segments.values() {
            let seg_end = segment.next_index();
            let lo = from.max(segment.first_index);
            let hi = to.map_or(seg_end, |to| to.min(seg_end));
            if lo >= hi {
                continue;
            }
            let spans = &segment.spans
                [(lo - segment.first_index) as usize..(hi - segment.first_index) as usize];
            let (Some(first), Some(last)) = (spans.first(), spans.last()) else {
                continue;
            };
            let mut bytes = vec![0; (last.offset + last.len - first.offset) as usize];
            segment
                .file
                .read_exact_at(&mut bytes, first.offset)
                .map_err(|e| io_error(&segment.path, "read", e))?;
            for span in spans {
                let at = (span.offset - first.offset) as usize;
                let Some((kind, payload, _)) =
                    read_record(&bytes, at).filter(|(kind, _, _)| is_entry(*kind))
                else {
                    return Err(corrupt(
                        &segment.path,
                        format!("record of entry {} does not check", span.log_id.index),
                    ));
                };
                let entry = decode_entry(kind, payload)?;
                if entry.log_id != span.log_id {
                    return Err(LogStoreError::MisfiledEntry {
                        key_index: span.log_id.index,
                        entry_index: entry.log_id.index,
                    });
                }
                entries.push(entry);
            }
        }
        Ok(entries)
    }

    /// Removes `[index, ..)` durably: later segments are deleted, the cut part of the
    /// segment holding `index` is zeroed and fsynced.
    pub(super) fn truncate(&self, index: u64) -> Result<()> {
        let mut state = self.lock();
        // Newest first: a crash part way leaves a log that ends early, never one with a hole.
        self.drop_segments(&mut state, Order::NewestFirst, |segment| {
            segment.first_index >= index
        })?;
        if let Some(segment) = state.segments.values_mut().next_back() {
            let keep = index.saturating_sub(segment.first_index);
            if let Some(cut) = usize::try_from(keep)
                .ok()
                .and_then(|keep| segment.spans.get(keep).copied())
            {
                zero(&segment.file, &segment.path, cut.offset, segment.end)?;
                segment
                    .file
                    .sync_data()
                    .map_err(|e| io_error(&segment.path, "fsync", e))?;
                segment.end = cut.offset;
                segment.spans.truncate(keep as usize);
            }
        }
        Ok(())
    }

    /// Forgets entries up to `index` (already durable as the purge point in the meta
    /// table): segments whose entries are all at or below it are deleted.
    pub(super) fn purge(&self, index: u64) -> Result<()> {
        let mut state = self.lock();
        state.purged_upto = state.purged_upto.max(Some(index));
        // Oldest first: a crash part way leaves a log that starts late (open drops the
        // rest of what the durable purge point covers), never one with a hole.
        self.drop_segments(&mut state, Order::OldestFirst, |segment| {
            segment.next_index() <= index + 1
        })
    }

    /// Deletes every segment `doomed` picks, in `order`, then fsyncs the directory.
    fn drop_segments(
        &self,
        state: &mut State,
        order: Order,
        doomed: impl Fn(&Segment) -> bool,
    ) -> Result<()> {
        let mut firsts: Vec<u64> = state
            .segments
            .values()
            .filter(|segment| doomed(segment))
            .map(|segment| segment.first_index)
            .collect();
        if firsts.is_empty() {
            return Ok(());
        }
        if order == Order::NewestFirst {
            firsts.reverse();
        }
        for first in firsts {
            if let Some(segment) = state.segments.remove(&first) {
                fs::remove_file(&segment.path).map_err(|e| io_error(&segment.path, "remove", e))?;
            }
        }
        sync_dir(&self.dir)
    }
}

mod replay;
#[cfg(test)]
mod tests;
