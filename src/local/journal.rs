//! An append-only journal of keyed records: the local engine's claim index on disk
//! ([`Claims`]), and the settle queue ([`crate::local::settle_queue`]).
//!
//! Every change appends one record `(key, value or none)`; the last record of a key wins. Appending only copies bytes into a buffer under a mutex: a flusher thread writes
//! what gathered and `fdatasync`s it, so records that arrive during one sync share the next
//! (group commit). A caller that must not answer before its record is on disk awaits
//! [`Journal::sync`] (settles do); one that may answer first does not (hits: a crash can lose
//! the last flush's claims, typically well under a millisecond of them, and a lost claim
//! only ever makes a later hit *allowed*, a delivery twice, never a false `duplicate`).
//!
//! On open the journal is replayed (a torn last append is cut off and logged; any other
//! damage, such as a flipped bit, refuses to open: what follows it may be committed
//! claims), expired claims are dropped, and the live set is written to a fresh file
//! (compaction). While
//! running, the owner compacts it again when [`Journal::append`] says it grew enough:
//! it hands over the encoded live set, which the flusher writes to a new file and swaps in
//! atomically (write, fsync, rename, fsync the directory).
//!
//! Records are framed by [`crate::storage::record`]; a body is the bincode of
//! `(Key, Option<Value>)` of its [`Entry`]: `(ClaimKey, Option<ClaimRecord>)` for claims.
//!
//! A file of our own, not a sled tree: sled's per-insert work is costly on the hot path and
//! its flush does not reach the disk (docs/decisions/014).

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::hash::Hash;
use std::io::{BufReader, Write};
use std::marker::PhantomData;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::codec;
use crate::lock::lock;
use crate::state::{ClaimKey, ClaimRecord};
use crate::storage::record::{self, Stop};

/// A journal smaller than this is never compacted while running.
const COMPACT_BYTES_MIN: u64 = 64 * 1024 * 1024;
/// A record longer than this is corrupt (the longest valid one is a few KiB).
const RECORD_BYTES_MAX: usize = 1024 * 1024;
/// The flusher syncs at most once per interval, so a busy node does not spend its CPU on
/// back-to-back syncs (docs/decisions/014); a settle waits at most this much longer.
const FLUSH_INTERVAL: Duration = Duration::from_millis(1);

/// What one journal keeps: its records' key and value, and its name in errors and logs.
pub trait Entry {
    type Key: Hash + Eq + Serialize + DeserializeOwned;
    type Value: Serialize + DeserializeOwned;
    /// Names the journal in errors and logs ("claim journal").
    const NAME: &'static str;
    /// Names its flusher thread.
    const THREAD: &'static str;
    /// Whether a value replayed on open still counts at `now_us`.
    fn live(value: &Self::Value, now_us: u64) -> bool;
}

/// The claim index: a claim's current record by its key; expired claims are dropped on
/// open.
pub struct Claims;

impl Entry for Claims {
    type Key = ClaimKey;
    type Value = ClaimRecord;
    const NAME: &'static str = "claim journal";
    const THREAD: &'static str = "claim-journal";

    fn live(record: &ClaimRecord, now_us: u64) -> bool {
        record.expires_at_us > now_us
    }
}

/// The journal could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    #[error("{name} {path}: {source}")]
    Io {
        name: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("journal record: {0}")]
    Codec(#[from] codec::CodecError),
    #[error("journal record: {0}")]
    TooLarge(#[from] record::TooLarge),
    #[error("{name} {path} stopped after a write failed: {reason}")]
    Failed {
        name: &'static str,
        path: PathBuf,
        reason: String,
    },
    /// Damage no crash leaves (a flipped bit, data after a damaged record): the records
    /// after it may be claims or settles already answered for, so the journal is not cut
    /// there.
    #[error(
        "{name} {path} is damaged at byte {offset} ({reason}), and not as a crash \
         leaves a last append; refusing to drop what follows"
    )]
    Damaged {
        name: &'static str,
        path: PathBuf,
        offset: u64,
        reason: String,
    },
}

/// What the flusher has to do next.
#[derive(Default)]
struct Pending {
    /// Encoded records not yet written.
    bytes: Vec<u8>,
    /// A live set to replace the file with, before `bytes` are appended.
    compaction: Option<Compaction>,
    /// Bytes in the file plus those pending: what the next compaction is measured against.
    journal_bytes: u64,
    /// Size of the last compacted file (the live set then).
    compacted_bytes: u64,
    /// Records appended so far (the last one's sequence number).
    appended: u64,
    /// Set when a write failed: the journal takes no more records.
    failed: Option<String>,
    stop: bool,
}

/// A requested compaction: the encoded live set, and the records it superseded that were
/// not written yet (they go to the old file if the new one cannot be put in place, so a
/// failed compaction loses nothing).
struct Compaction {
    live: Vec<u8>,
    superseded: Vec<u8>,
}

/// What the flusher publishes after every write: records on disk, and whether it failed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Flushed {
    upto: u64,
    failed: bool,
}

struct Shared {
    name: &'static str,
    path: PathBuf,
    pending: Mutex<Pending>,
    wake: Condvar,
    flushed: tokio::sync::watch::Sender<Flushed>,
}

impl Shared {
    fn failed(&self, reason: String) -> JournalError {
        JournalError::Failed {
            name: self.name,
            path: self.path.clone(),
            reason,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Pending> {
        // A panic while holding the lock leaves plain bytes behind: still usable.
        lock(&self.pending)
    }
}

/// An open journal and its flusher thread.
pub struct Journal<E: Entry> {
    shared: Arc<Shared>,
    flusher: Option<JoinHandle<()>>,
    entry: PhantomData<E>,
}

/// The claim index's journal.
pub type ClaimJournal = Journal<Claims>;

impl<E: Entry> Journal<E> {
    /// Opens (or creates) the journal at `path`, replays it and compacts it; returns the
    /// journal and the records live at `now_us`.
    ///
    /// # Errors
    /// When the file cannot be read, written or synced.
    #[allow(clippy::type_complexity)]
    pub fn open(path: &Path, now_us: u64) -> Result<(Self, Vec<(E::Key, E::Value)>), JournalError> {
        let io = |source| JournalError::Io {
            name: E::NAME,
            path: path.to_owned(),
            source,
        };
        let Replayed { live, damaged } = replay::<E>(path, now_us)?;
        if damaged {
            // Keep the evidence: the rewrite below drops what followed the damage.
            let aside = path.with_extension(format!("damaged-{now_us}"));
            std::fs::copy(path, &aside).map_err(io)?;
            tracing::warn!(path = %path.display(), kept = %aside.display(), "{}: the damaged file is kept aside", E::NAME);
        }
        let bytes = encode_all::<E>(live.iter().map(|(key, value)| (key, Some(value))))?;
        replace_file(path, &bytes).map_err(io)?;
        let file = OpenOptions::new().append(true).open(path).map_err(io)?;
        let shared = Arc::new(Shared {
            name: E::NAME,
            path: path.to_owned(),
            pending: Mutex::new(Pending {
                journal_bytes: bytes.len() as u64,
                compacted_bytes: bytes.len() as u64,
                ..Pending::default()
            }),
            wake: Condvar::new(),
            flushed: tokio::sync::watch::Sender::new(Flushed::default()),
        });
        let flusher = {
            let shared = shared.clone();
            std::thread::Builder::new()
                .name(E::THREAD.to_owned())
                .spawn(move || flush_loop(&shared, file))
                .map_err(io)?
        };
        Ok((
            Self {
                shared,
                flusher: Some(flusher),
                entry: PhantomData,
            },
            live,
        ))
    }

    /// Appends the key's current value (`None`: it is gone). Returns true when the
    /// journal grew to over twice its last compacted size (and past a floor): time to hand
    /// [`Journal::compact`] the live set. (Decided under the same lock: no second one per hit.)
    ///
    /// # Errors
    /// When an earlier write failed (the disk is not taking records).
    pub fn append(&self, key: &E::Key, value: Option<&E::Value>) -> Result<bool, JournalError> {
        let mut pending = self.shared.lock();
        if let Some(reason) = &pending.failed {
            return Err(self.shared.failed(reason.clone()));
        }
        let before = pending.bytes.len();
        encode_record::<E>(&mut pending.bytes, key, value)?;
        pending.journal_bytes += (pending.bytes.len() - before) as u64;
        pending.appended += 1;
        let wants_compaction = pending.compaction.is_none()
            && pending.journal_bytes > COMPACT_BYTES_MIN.max(2 * pending.compacted_bytes);
        drop(pending);
        // The flusher sleeps only on an empty buffer: the first record wakes it (a wake-up
        // per record would cost a futex call each).
        if before == 0 {
            self.shared.wake.notify_one();
        }
        Ok(wants_compaction)
    }

    /// Replaces the journal with `live`, the current value of every live key. Call it
    /// while holding whatever orders the appends (the engine's state lock): records
    /// appended before are covered by `live`, records appended after follow it.
    ///
    /// # Errors
    /// When a record does not encode.
    pub fn compact<'a>(
        &self,
        live: impl Iterator<Item = (&'a E::Key, &'a E::Value)>,
    ) -> Result<(), JournalError>
    where
        E::Key: 'a,
        E::Value: 'a,
    {
        let live = encode_all::<E>(live.map(|(key, value)| (key, Some(value))))?;
        let mut pending = self.shared.lock();
        let mut superseded = match pending.compaction.take() {
            Some(earlier) => earlier.superseded,
            None => Vec::new(),
        };
        superseded.append(&mut pending.bytes);
        pending.journal_bytes = live.len() as u64;
        pending.compacted_bytes = live.len() as u64;
        pending.compaction = Some(Compaction { live, superseded });
        drop(pending);
        self.shared.wake.notify_one();
        Ok(())
    }

    /// Waits until every record appended so far is on disk.
    ///
    /// # Errors
    /// When a write failed.
    pub async fn sync(&self) -> Result<(), JournalError> {
        let target = self.shared.lock().appended;
        let mut flushed = self.shared.flushed.subscribe();
        let reached = flushed
            .wait_for(|flushed| flushed.failed || flushed.upto >= target)
            .await
            .map(|flushed| !flushed.failed);
        match reached {
            Ok(true) => Ok(()),
            // Failed, or the flusher is gone (only when the journal is being dropped).
            _ => {
                let reason = self.shared.lock().failed.clone();
                Err(self
                    .shared
                    .failed(reason.unwrap_or_else(|| "the journal closed".to_owned())))
            }
        }
    }
}

impl<E: Entry> Drop for Journal<E> {
    fn drop(&mut self) {
        self.shared.lock().stop = true;
        self.shared.wake.notify_one();
        if let Some(flusher) = self.flusher.take() {
            let _ = flusher.join();
        }
    }
}

/// The flusher: takes what gathered, writes it, syncs it; repeats until stopped and drained.
fn flush_loop(shared: &Shared, mut file: File) {
    let _guard = FailOnPanic(shared);
    let mut last = Instant::now();
    loop {
        // At most one sync per interval: what arrives meanwhile shares the next one.
        let since = last.elapsed();
        if since < FLUSH_INTERVAL && !shared.lock().stop {
            std::thread::sleep(FLUSH_INTERVAL - since);
        }
        last = Instant::now();
        let taken = {
            let mut pending = shared.lock();
            while pending.bytes.is_empty() && pending.compaction.is_none() && !pending.stop {
                pending = crate::lock::wait(&shared.wake, pending);
            }
            if pending.bytes.is_empty() && pending.compaction.is_none() {
                return; // stopped and drained
            }
            (
                pending.compaction.take(),
                std::mem::take(&mut pending.bytes),
                pending.appended,
            )
        };
        let (compaction, bytes, upto) = taken;
        let written = write_out(shared.name, &shared.path, &mut file, compaction, &bytes);
        let failed = written.is_err();
        if let Err(e) = written {
            tracing::error!(path = %shared.path.display(), error = %e, "{} write failed; it takes no more records", shared.name);
            let mut pending = shared.lock();
            pending.failed = Some(e.to_string());
            pending.bytes.clear();
        }
        shared.flushed.send_replace(Flushed { upto, failed });
        if failed {
            return;
        }
    }
}

/// Marks the journal failed if the flusher panics, so no `sync` waits for it forever.
struct FailOnPanic<'a>(&'a Shared);

impl Drop for FailOnPanic<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.lock().failed = Some("the flusher thread panicked".to_owned());
            self.0.flushed.send_modify(|flushed| flushed.failed = true);
        }
    }
}

fn write_out(
    name: &str,
    path: &Path,
    file: &mut File,
    compaction: Option<Compaction>,
    bytes: &[u8],
) -> std::io::Result<()> {
    let mut unsynced = !bytes.is_empty();
    if let Some(Compaction { live, superseded }) = compaction {
        match put_in_place(path, &live) {
            Ok(()) => {
                *file = OpenOptions::new().append(true).open(path)?;
                tracing::info!(path = %path.display(), live_bytes = live.len(), "{name} compacted");
            }
            Err(Placed::No(e)) => {
                // The old file is still the journal: it gets what the live set covered.
                tracing::warn!(path = %path.display(), error = %e, "{name} compaction failed; the journal keeps growing");
                file.write_all(&superseded)?;
                unsynced = true;
            }
            Err(Placed::NameNotSynced(e)) => {
                // The new file is the journal now; its name may not survive a power cut.
                *file = OpenOptions::new().append(true).open(path)?;
                return Err(e);
            }
        }
    }
    if unsynced {
        file.write_all(bytes)?;
        file.sync_data()?;
    }
    Ok(())
}

/// Writes `bytes` as the whole content of `path`, atomically and durably.
fn replace_file(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    put_in_place(path, bytes).map_err(|(Placed::No(e) | Placed::NameNotSynced(e))| e)
}

/// How far [`put_in_place`] got when it failed.
enum Placed {
    /// Before the rename: `path` is as it was.
    No(std::io::Error),
    /// Syncing the directory after the rename: the new file is in place.
    NameNotSynced(std::io::Error),
}

/// Writes `bytes` to a temporary file, syncs it and renames it over `path`, then syncs the
/// directory.
fn put_in_place(path: &Path, bytes: &[u8]) -> Result<(), Placed> {
    let tmp = path.with_extension("compacting");
    let written = File::create(&tmp).and_then(|mut file| {
        file.write_all(bytes)?;
        file.sync_all()
    });
    if let Err(e) = written.and_then(|()| std::fs::rename(&tmp, path)) {
        let _ = std::fs::remove_file(&tmp);
        return Err(Placed::No(e));
    }
    crate::storage::sync_dir(crate::storage::parent_dir(path)).map_err(Placed::NameNotSynced)
}

fn encode_record<E: Entry>(
    out: &mut Vec<u8>,
    key: &E::Key,
    value: Option<&E::Value>,
) -> Result<(), JournalError> {
    let body = codec::encode(&(key, value))?;
    record::push(out, &[&body])?;
    Ok(())
}

fn encode_all<'a, E: Entry>(
    records: impl Iterator<Item = (&'a E::Key, Option<&'a E::Value>)>,
) -> Result<Vec<u8>, JournalError>
where
    E::Key: 'a,
    E::Value: 'a,
{
    let mut out = Vec::new();
    for (key, value) in records {
        encode_record::<E>(&mut out, key, value)?;
    }
    Ok(out)
}

/// What a replay found.
struct Replayed<E: Entry> {
    live: Vec<(E::Key, E::Value)>,
    /// A torn last append ended the replay before the end of the file.
    damaged: bool,
}

/// Reads every whole, intact record of `path` (a missing file is empty); the last record
/// of a key wins; values not [`Entry::live`] at `now_us` are left out. A torn last append (the file
/// ends inside the record, or zeros follow from a sector boundary in it: what a crash
/// leaves of a write that was never synced, so never answered for) ends the replay: it is
/// reported and dropped. Any other damage fails the replay (`JournalError::Damaged`), as
/// does an I/O error: dropping the rest would delete good records, committed claims among
/// them.
fn replay<E: Entry>(path: &Path, now_us: u64) -> Result<Replayed<E>, JournalError> {
    let io = |source| JournalError::Io {
        name: E::NAME,
        path: path.to_owned(),
        source,
    };
    let file = match File::open(path) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Ok(Replayed {
                live: Vec::new(),
                damaged: false,
            })
        }
        Err(e) => return Err(io(e)),
    };
    let mut records =
        record::Records::new(BufReader::with_capacity(1 << 20, file), RECORD_BYTES_MAX);
    let mut live: HashMap<E::Key, E::Value> = HashMap::new();
    let mut damaged = false;
    loop {
        let offset = records.offset();
        let reason = match records.next_body().map_err(io)? {
            Ok(body) => match codec::decode::<(E::Key, Option<E::Value>)>(body) {
                Ok((key, Some(value))) => {
                    live.insert(key, value);
                    continue;
                }
                Ok((key, None)) => {
                    live.remove(&key);
                    continue;
                }
                // Its checksum holds: written like this, no crash made it.
                Err(e) => {
                    return Err(JournalError::Damaged {
                        name: E::NAME,
                        path: path.to_owned(),
                        offset,
                        reason: format!("a record that checks does not decode: {e}"),
                    })
                }
            },
            Err(Stop::End) => break,
            // The journal's records are never empty: zeros here are blocks a crash left
            // allocated but unwritten, if only zeros follow.
            Err(Stop::Zeros) => "a zero-length record header".to_owned(),
            Err(Stop::Torn(reason)) => reason,
        };
        let tail = read_from(path, offset).map_err(io)?;
        if !record::is_torn_append(&tail, offset, RECORD_BYTES_MAX) {
            return Err(JournalError::Damaged {
                name: E::NAME,
                path: path.to_owned(),
                offset,
                reason,
            });
        }
        tracing::warn!(path = %path.display(), offset, reason, "{}: dropped a torn last append", E::NAME);
        damaged = true;
        break;
    }
    Ok(Replayed {
        live: live
            .into_iter()
            .filter(|(_, value)| E::live(value, now_us))
            .collect(),
        damaged,
    })
}

/// The bytes of `path` from `offset` to its end.
fn read_from(path: &Path, offset: u64) -> std::io::Result<Vec<u8>> {
    use std::io::{Read, Seek, SeekFrom};
    let mut file = File::open(path)?;
    file.seek(SeekFrom::Start(offset))?;
    let mut tail = Vec::new();
    file.read_to_end(&mut tail)?;
    Ok(tail)
}

#[cfg(test)]
mod tests;
