//! The openraft state machine: applies committed entries to the in-memory [`FleetState`]
//! and keeps the latest snapshot in sled.
//!
//! Applying never reads a clock (the entry carries the leader's time). A snapshot is the
//! point-in-time state encoded from a frozen copy (no copy of the state), then written to
//! sled in chunks ([`crate::snapshot::store`]); installing a snapshot replaces the state, it never merges into
//! it.

use std::io::Cursor;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use openraft::storage::RaftStateMachine;
use openraft::{EntryPayload, RaftSnapshotBuilder, StorageIOError};

use crate::raft::log_store::DurableLog;
use crate::raft::{
    Entry, LogId, MemberNode, NodeId, Snapshot, SnapshotMeta, StorageError, StoredMembership,
    TypeConfig,
};
use crate::snapshot::store::{self as chunks, StoredSnapshot, SNAPSHOT_TREE};
use crate::snapshot::{self, SnapshotBody};
use crate::state::rules;
use crate::state::{FleetResponse, FleetState};
use crate::storage::sled_disk::SledDisk;

pub use crate::snapshot::store::StateStoreError;

/// What the state machine has applied.
#[derive(Debug, Default)]
pub struct Applied {
    pub state: FleetState,
    pub last_applied: Option<LogId>,
    pub membership: StoredMembership,
}

struct Inner {
    /// How far this node's log is fsynced: nothing is applied beyond it.
    durable: DurableLog,
    applied: Mutex<Applied>,
    snapshots: sled::Tree,
    disk: SledDisk,
    snapshot_seq: AtomicU64,
    /// Size of the current snapshot (0: none yet).
    snapshot_bytes: AtomicU64,
    /// Held while a snapshot is written (see [`StateMachineStore::persist`]).
    persisting: Mutex<()>,
}

/// The fleet state machine (cheap to clone: all clones share one state).
#[derive(Clone)]
pub struct StateMachineStore {
    inner: Arc<Inner>,
}

impl StateMachineStore {
    /// Opens the state machine on `db`, resuming from its stored snapshot if any; openraft
    /// then replays the log after the snapshot.
    ///
    /// # Errors
    /// When sled fails or the stored snapshot fails its checksum (a node must not serve from
    /// a state it cannot trust).
    /// Entries are applied only once `durable` says they are on this node's disk.
    pub fn open(disk: &SledDisk, durable: DurableLog) -> Result<Self, StateStoreError> {
        let snapshots = disk.db().open_tree(SNAPSHOT_TREE)?;
        let mut applied = Applied::default();
        let mut snapshot_bytes = 0;
        if let Some(stored) = chunks::read(&snapshots)? {
            snapshot_bytes = stored.data.len() as u64;
            let body = snapshot::decode(&stored.data)?;
            drop(stored);
            applied = applied_from_body(body);
            tracing::info!(last_applied = ?applied.last_applied, "state machine resumed from snapshot");
        }
        Ok(Self {
            inner: Arc::new(Inner {
                durable,
                applied: Mutex::new(applied),
                snapshots,
                disk: disk.clone(),
                snapshot_seq: AtomicU64::new(0),
                snapshot_bytes: AtomicU64::new(snapshot_bytes),
                persisting: Mutex::new(()),
            }),
        })
    }

    /// Size in bytes of the current snapshot, built here or installed (0: none yet).
    pub fn snapshot_bytes(&self) -> u64 {
        self.inner.snapshot_bytes.load(Ordering::Relaxed)
    }

    /// Locks the applied state for a short read (never hold it across an await).
    pub fn lock(&self) -> MutexGuard<'_, Applied> {
        // A panic while applying leaves a state nobody can trust.
        crate::lock::lock_or_stop(&self.inner.applied, "state machine")
    }

    fn load_current(&self) -> Result<Option<StoredSnapshot>, StorageError> {
        chunks::read(&self.inner.snapshots)
            .map_err(|e| StorageIOError::read_snapshot(None, &e).into())
    }

    /// Writes `data` as the current snapshot and syncs it to the disk (openraft purges the
    /// log it covers once this returns), off the async runtime; hands
    /// `data` back (it is moved to the blocking thread, not copied).
    ///
    /// openraft builds snapshots in a task of their own, so a build can finish while an
    /// installed snapshot is being stored: writes take turns, and one older than the stored
    /// snapshot is not written (openraft drops an older build too), so the stored snapshot
    /// never goes back behind a log that may already be purged.
    async fn persist(&self, meta: &SnapshotMeta, data: Vec<u8>) -> Result<Vec<u8>, StorageError> {
        let signature = meta.signature();
        let inner = self.inner.clone();
        let meta = meta.clone();
        let written = tokio::task::spawn_blocking(move || {
            let _one_at_a_time = crate::lock::lock(&inner.persisting);
            if chunks::write(&inner.snapshots, &inner.disk, &meta, &data)? {
                inner
                    .snapshot_bytes
                    .store(data.len() as u64, Ordering::Relaxed);
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

/// Lowers the calling thread to the lowest CPU priority (nice 19). Best effort: a thread
/// that keeps its priority only competes more with the ones serving calls.
fn lower_this_threads_priority() {
    // SAFETY: setpriority only reads its three integer arguments; on Linux `who = 0` with
    // PRIO_PROCESS names the calling thread, and nothing else is touched.
    let rc = unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, 19) };
    if rc != 0 {
        tracing::debug!("could not lower the snapshot thread's priority");
    }
}

fn applied_from_body(body: SnapshotBody) -> Applied {
    Applied {
        state: FleetState::from_image(body.image),
        last_applied: body.last_applied,
        membership: body.membership,
    }
}

impl RaftSnapshotBuilder<TypeConfig> for StateMachineStore {
    /// Freezes the state under the lock (the maps' shards are shared, nothing is copied),
    /// then encodes the frozen copy on a thread of its own at the lowest CPU priority with
    /// no lock held: apply goes on meanwhile, its changes kept in the maps' overlays, folded
    /// back in afterwards. The snapshot costs its encoded size plus what changed during the
    /// encode.
    async fn build_snapshot(&mut self) -> Result<Snapshot, StorageError> {
        let started = std::time::Instant::now();
        let (frozen, last_applied, membership) = {
            let mut applied = self.lock();
            let frozen = applied.state.freeze();
            (frozen, applied.last_applied, applied.membership.clone())
        };
        // On a thread of its own at the lowest CPU priority: nothing waits for the encode
        // any more, so on a busy host the threads serving calls go first.
        let (done, encoded) = tokio::sync::oneshot::channel();
        let started_thread = std::thread::Builder::new()
            .name("snapshot-encode".to_owned())
            .spawn(move || {
                lower_this_threads_priority();
                let data = snapshot::encode_live(last_applied, &membership, &frozen);
                drop(frozen);
                let _ = done.send((last_applied, membership, data));
            });
        let encoded = match started_thread {
            Ok(_) => encoded
                .await
                .map_err(|e| StorageIOError::write_snapshot(None, &e)),
            Err(e) => Err(StorageIOError::write_snapshot(None, &e)),
        };
        // Whether or not the encode went well, the overlays go back into the maps.
        self.lock().state.thaw();
        let encoded = encoded?;
        let (last_applied, membership, data) = encoded;
        let seq = self.inner.snapshot_seq.fetch_add(1, Ordering::Relaxed);
        let snapshot_id = match last_applied {
            Some(log_id) => format!("{}-{}-{seq}", log_id.leader_id, log_id.index),
            None => format!("empty-{seq}"),
        };
        let meta = SnapshotMeta {
            last_log_id: last_applied,
            last_membership: membership,
            snapshot_id,
        };
        let data = data.map_err(|e| StorageIOError::write_snapshot(Some(meta.signature()), &e))?;
        let encoded_ms = started.elapsed().as_millis();
        let data = self.persist(&meta, data).await?;
        tracing::info!(
            snapshot_id = %meta.snapshot_id,
            size_bytes = data.len(),
            encoded_ms,
            stored_ms = started.elapsed().as_millis() - encoded_ms,
            "snapshot built"
        );
        Ok(Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(data)),
        })
    }
}

impl RaftStateMachine<TypeConfig> for StateMachineStore {
    type SnapshotBuilder = Self;

    async fn applied_state(&mut self) -> Result<(Option<LogId>, StoredMembership), StorageError> {
        let applied = self.lock();
        Ok((applied.last_applied, applied.membership.clone()))
    }

    /// Waits until the entries are durable in this node's log first (the durability rule's
    /// part 3, [`crate::raft::durability`]): an applied entry is an answer, a snapshot and
    /// a local read.
    async fn apply<I>(&mut self, entries: I) -> Result<Vec<FleetResponse>, StorageError>
    where
        I: IntoIterator<Item = Entry> + Send,
    {
        let entries: Vec<Entry> = entries.into_iter().collect();
        crate::raft::durability::wait_to_apply(&self.inner.durable, &entries)
            .await
            .map_err(|e| StorageIOError::write_logs(&e))?;
        let mut applied = self.lock();
        let mut responses = Vec::with_capacity(entries.len());
        for entry in entries {
            applied.last_applied = Some(entry.log_id);
            let response = match entry.payload {
                EntryPayload::Blank => FleetResponse::default(),
                EntryPayload::Normal(request) => FleetResponse {
                    answers: rules::apply_batch(
                        &mut applied.state,
                        &request.commands,
                        request.now_us,
                    ),
                },
                EntryPayload::Membership(membership) => {
                    applied.membership = StoredMembership::new(Some(entry.log_id), membership);
                    FleetResponse::default()
                }
            };
            responses.push(response);
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
        let body = snapshot::decode(&data)
            .map_err(|e| StorageIOError::read_snapshot(Some(meta.signature()), &e))?;
        // The bytes are stored, then let go before the state is built from the body.
        drop(self.persist(meta, data).await?);
        let mut applied = applied_from_body(body);
        // The meta is authoritative for what the snapshot covers.
        applied.last_applied = meta.last_log_id;
        applied.membership = meta.last_membership.clone();
        *self.lock() = applied;
        tracing::info!(snapshot_id = %meta.snapshot_id, "snapshot installed");
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot>, StorageError> {
        Ok(self.load_current()?.map(|stored| Snapshot {
            meta: stored.meta,
            snapshot: Box::new(Cursor::new(stored.data)),
        }))
    }
}

/// The member addresses a state machine's membership knows, voters first.
pub fn members(membership: &StoredMembership) -> Vec<(NodeId, MemberNode, bool)> {
    let config = membership.membership();
    let voters: std::collections::BTreeSet<NodeId> = config.voter_ids().collect();
    config
        .nodes()
        .map(|(id, node)| (*id, node.clone(), voters.contains(id)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An entry is applied only once this node's log holds it durably: before the log has
    /// it, `apply` stays pending; once it is appended and fsynced, it applies.
    #[tokio::test]
    async fn apply_waits_until_the_entries_are_durable_in_the_log() {
        use futures::FutureExt;
        use openraft::storage::RaftLogStorageExt;

        use crate::raft::faults::Faults;
        use crate::raft::log_store::LogStore;

        let dir = tempfile::tempdir().expect("tempdir");
        let mut log = LogStore::open(&dir.path().join("raft-log.redb"), 1, Faults::new(false))
            .expect("open log");
        let disk = SledDisk::open(&dir.path().join("state.sled"), 1 << 20).expect("sled");
        let mut state = StateMachineStore::open(&disk, log.durable()).expect("open state");
        let entry = Entry {
            log_id: LogId::new(openraft::CommittedLeaderId::new(1, 1), 1),
            payload: EntryPayload::Blank,
        };
        let mut apply = Box::pin(state.apply(vec![entry.clone()]));
        assert!(
            (&mut apply).now_or_never().is_none(),
            "applied an entry the log does not hold"
        );
        log.blocking_append(vec![entry.clone()])
            .await
            .expect("append");
        apply.await.expect("applied once durable");
        assert_eq!(state.lock().last_applied, Some(entry.log_id));
    }

    /// A build that finishes after a newer snapshot was installed does not replace it: the
    /// stored snapshot, and the size the snapshot policy reads, stay the newer one.
    #[tokio::test]
    async fn an_older_snapshot_never_replaces_a_newer_stored_one() {
        let dir = tempfile::tempdir().expect("tempdir");
        let disk = SledDisk::open(&dir.path().join("state.sled"), 1 << 20).expect("sled");
        let state = StateMachineStore::open(&disk, DurableLog::everything()).expect("open");
        let meta = |index: u64| SnapshotMeta {
            last_log_id: Some(LogId::new(openraft::CommittedLeaderId::new(1, 1), index)),
            last_membership: StoredMembership::default(),
            snapshot_id: format!("1-1-{index}"),
        };
        let stored_index = || {
            chunks::read(&state.inner.snapshots)
                .expect("read")
                .and_then(|stored| stored.meta.last_log_id)
                .map(|log_id| log_id.index)
        };
        state
            .persist(&meta(10), vec![10; 100])
            .await
            .expect("persist");
        assert_eq!((stored_index(), state.snapshot_bytes()), (Some(10), 100));
        state.persist(&meta(5), vec![5; 50]).await.expect("persist");
        assert_eq!((stored_index(), state.snapshot_bytes()), (Some(10), 100));
        state
            .persist(&meta(12), vec![12; 120])
            .await
            .expect("persist");
        assert_eq!((stored_index(), state.snapshot_bytes()), (Some(12), 120));
    }
}
