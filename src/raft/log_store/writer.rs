//! The log store's write side: one thread that makes every change durable in the order it
//! was asked for, and the tail of recent entries that reads are served from.
//!
//! `append` puts its entries in the [`Tail`] and queues them, then returns; the writer
//! commits them with an fsync and only then calls openraft's callback, which is what counts
//! this node's copy towards a quorum. Replication reads recent entries from the tail, with
//! no redb transaction and no decoding. Truncation, purge and the vote go through the same
//! queue, so nothing overtakes an append, and their callers wait for them to be durable.
//!
//! After every append the writer moves the [`DurableMark`] to the last entry it fsynced
//! (before it calls the callbacks), and appends queued behind one share its fsync. openraft
//! 0.9.25 waits for an append's callback before it replicates the entries
//! (`RaftCore::append_to_log`); for a leader's own entries the log store calls it at once
//! instead (see `LogStore::append`), so the leader's flush overlaps replication and
//! several appends can be queued here at a time.

use std::collections::BTreeMap;
use std::io;
use std::ops::Bound;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use super::{Disk, LogStoreError, Result};
use crate::lock::lock;
use crate::raft::durability::DurableMark;
use crate::raft::faults::Faults;
use crate::raft::{Entry, LogId};

/// Durable entries kept in the tail beyond those still being written (for replication of
/// recent entries; a follower further behind is served from redb). At most
/// `batch_commands_max` commands each: 256 full entries are ~32 MiB, typical ones ~2 MiB.
const TAIL_DURABLE_KEPT: usize = 256;

/// One recent entry, and whether the writer has made it durable.
struct TailEntry {
    entry: Entry,
    durable: bool,
}

/// The newest entries of the log: every entry not yet durable, and up to
/// [`TAIL_DURABLE_KEPT`] durable ones before them. Contiguous: appends add at the top,
/// truncation removes a suffix, purge and eviction a prefix.
#[derive(Default)]
pub(super) struct Tail {
    entries: BTreeMap<u64, TailEntry>,
    /// The last purged index: entries at or below it are in a snapshot and never held.
    purged_upto: Option<u64>,
}

impl Tail {
    /// An empty tail over a log purged up to `purged_upto`.
    pub(super) fn new(purged_upto: Option<u64>) -> Self {
        Self {
            entries: BTreeMap::new(),
            purged_upto,
        }
    }

    /// The first index held, if any: everything below it is in redb (or purged).
    pub(super) fn first_index(&self) -> Option<u64> {
        self.entries.keys().next().copied()
    }

    /// The last purged index (entries at or below it are in a snapshot).
    pub(super) fn purged_upto(&self) -> Option<u64> {
        self.purged_upto
    }

    pub(super) fn last_log_id(&self) -> Option<LogId> {
        self.entries
            .values()
            .next_back()
            .map(|held| held.entry.log_id)
    }

    /// Adds appended entries, all or none: refuses a batch that would leave a hole.
    pub(super) fn push(&mut self, entries: &[Entry]) -> Result<()> {
        let admitted = || {
            entries.iter().filter(|entry| {
                self.purged_upto
                    .is_none_or(|purged| entry.log_id.index > purged)
            })
        };
        let mut last = self.entries.keys().next_back().copied();
        for entry in admitted() {
            let index = entry.log_id.index;
            if let Some(expected_index) = last.map(|last| last + 1).filter(|want| *want != index) {
                return Err(LogStoreError::AppendGap {
                    expected_index,
                    got_index: index,
                });
            }
            last = Some(index);
        }
        let admitted: Vec<&Entry> = admitted().collect();
        for entry in admitted {
            let index = entry.log_id.index;
            self.entries.insert(
                index,
                TailEntry {
                    entry: entry.clone(),
                    durable: false,
                },
            );
        }
        Ok(())
    }

    /// Clones of the held entries in `[from, to)`.
    pub(super) fn read(&self, from: u64, to: Bound<u64>) -> Vec<Entry> {
        self.entries
            .range((Bound::Included(from), to))
            .map(|(_, held)| held.entry.clone())
            .collect()
    }

    /// Drops `[index, ..)`.
    pub(super) fn truncate(&mut self, index: u64) {
        self.entries.split_off(&index);
    }

    /// Drops `..=index`; the purge point only moves forward.
    pub(super) fn purge(&mut self, index: u64) {
        self.entries = self.entries.split_off(&(index.saturating_add(1)));
        self.purged_upto = self.purged_upto.max(Some(index));
    }

    /// Marks `written` durable where the tail still holds those very entries (a truncation
    /// meanwhile may have replaced them), then lets go of old durable ones.
    fn mark_durable(&mut self, written: &[LogId]) {
        for log_id in written {
            if let Some(held) = self.entries.get_mut(&log_id.index) {
                if held.entry.log_id == *log_id {
                    held.durable = true;
                }
            }
        }
        let not_durable = self.entries.values().filter(|held| !held.durable).count();
        while self.entries.len() > not_durable + TAIL_DURABLE_KEPT {
            match self.entries.first_entry() {
                Some(first) if first.get().durable => {
                    first.remove();
                }
                _ => break,
            }
        }
    }
}

/// A durable change made on the writer thread.
pub(super) type Work = Box<dyn FnOnce(&Disk) -> Result<()> + Send>;
/// Told the outcome once an append is durable (or failed).
pub(super) type OnDurable = Box<dyn FnOnce(io::Result<()>) + Send>;

/// A change for the writer thread.
pub(super) enum Job {
    /// Entries to commit durably (they are in the tail already), the committed id to carry
    /// along, and who to tell once they are on disk.
    Append {
        entries: Vec<Entry>,
        committed: Option<Option<LogId>>,
        done: OnDurable,
    },
    /// Any other durable change (vote, truncate, purge), answered on `done`.
    Other {
        work: Work,
        done: tokio::sync::oneshot::Sender<Result<()>>,
    },
}

/// The writer thread; dropping the handle lets it finish the queue, then joins it.
pub(super) struct Writer {
    jobs: Option<mpsc::Sender<Job>>,
    thread: Option<JoinHandle<()>>,
}

impl Writer {
    pub(super) fn start(
        disk: Arc<Disk>,
        tail: Arc<Mutex<Tail>>,
        mark: DurableMark,
        faults: Faults,
    ) -> io::Result<Self> {
        let (jobs, queue) = mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("raft-log-writer".to_owned())
            .spawn(move || write_loop(&disk, &tail, &mark, &faults, &queue))?;
        Ok(Self {
            jobs: Some(jobs),
            thread: Some(thread),
        })
    }

    /// Queues `job`; gives it back if the writer is gone.
    pub(super) fn submit(&self, job: Job) -> std::result::Result<(), Job> {
        match &self.jobs {
            Some(jobs) => jobs.send(job).map_err(|mpsc::SendError(job)| job),
            None => Err(job),
        }
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        self.jobs = None;
        if let Some(thread) = self.thread.take() {
            // Dropped on the writer thread itself (a job holding the last store): it exits
            // by itself once the queue is empty; joining it here would never return.
            if thread.thread().id() != std::thread::current().id() {
                let _ = thread.join();
            }
        }
    }
}

fn write_loop(
    disk: &Disk,
    tail: &Mutex<Tail>,
    mark: &DurableMark,
    faults: &Faults,
    queue: &mpsc::Receiver<Job>,
) {
    let mut next = queue.recv().ok();
    while let Some(job) = next.take() {
        match job {
            Job::Other { work, done } => {
                let _ = done.send(work(disk));
            }
            Job::Append {
                mut entries,
                mut committed,
                done,
            } => {
                // Every append queued behind this one joins its transaction and fsync.
                let mut callbacks = vec![done];
                while let Ok(job) = queue.try_recv() {
                    match job {
                        Job::Append {
                            entries: more,
                            committed: later,
                            done,
                        } => {
                            entries.extend(more);
                            committed = later.or(committed);
                            callbacks.push(done);
                        }
                        other => {
                            next = Some(other);
                            break;
                        }
                    }
                }
                write_appends(disk, tail, mark, faults, (&entries, committed), callbacks);
            }
        }
        if next.is_none() {
            next = queue.recv().ok();
        }
    }
}

/// Writes gathered appends in one transaction and one fsync, marks them durable (or the log
/// failed), and tells every caller.
fn write_appends(
    disk: &Disk,
    tail: &Mutex<Tail>,
    mark: &DurableMark,
    faults: &Faults,
    (entries, committed): (&[Entry], Option<Option<LogId>>),
    callbacks: Vec<OnDurable>,
) {
    // Fault tests only: the entries stay in memory, unwritten, as if the power
    // were about to go.
    faults.wait_while_log_held();
    let started = std::time::Instant::now();
    let result = disk.wal.append(entries, committed);
    metrics::histogram!("ankusa_log_flush_seconds").record(started.elapsed().as_secs_f64());
    match &result {
        Ok(()) => {
            let written: Vec<LogId> = entries.iter().map(|entry| entry.log_id).collect();
            lock(tail).mark_durable(&written);
            if let Some(last) = written.last() {
                mark.set(Some(*last));
            }
        }
        Err(e) => {
            tracing::error!(error = %e, "raft log append failed");
            mark.fail(&e.to_string());
        }
    }
    let outcome = result.map_err(|e| io::Error::other(e.to_string()));
    for done in callbacks {
        done(match &outcome {
            Ok(()) => Ok(()),
            Err(e) => Err(io::Error::other(e.to_string())),
        });
    }
}

#[cfg(test)]
mod tests;
