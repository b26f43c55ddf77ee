//! The openraft state machine: applies committed entries to the in-memory [`FleetState`]
//! and keeps the latest snapshot in sled.
//!
//! Applying never reads a clock (the entry carries the leader's time). When to take a
//! snapshot is [`policy`], building one off the hot path is `build` (both next to the state
//! they read); the format and keeping one in sled are [`crate::raft::snapshot`]'s.
//! Installing one replaces the state, it never merges into it.

mod build;
pub mod policy;

use std::io::Cursor;
use std::sync::{Arc, Mutex, MutexGuard};

use openraft::storage::RaftStateMachine;
use openraft::{AnyError, EntryPayload, StorageIOError};

use crate::planted::{Planted, PlantedBug};
use crate::raft::log_store::DurableLog;
use crate::raft::snapshot::store::SnapshotStore;
use crate::raft::snapshot::{self, SnapshotBody};
use crate::raft::{
    Entry, LogId, MemberNode, NodeId, Snapshot, SnapshotMeta, StorageError, StoredMembership,
    TypeConfig,
};
use crate::state::rules;
use crate::state::{Command, EncodedCommand, FleetResponse, FleetState};
use crate::storage::sled_disk::SledDisk;

pub use crate::raft::snapshot::store::StateStoreError;

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
    /// The bug this node plays (`crate::planted`); `OwnClock` applies with this node's
    /// wall clock instead of the leader's stamp.
    planted: Planted,
    applied: Mutex<Applied>,
    snapshots: SnapshotStore,
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
    /// `planted` is a known bug to play (`raft::faults::Faults::planted`).
    pub fn open(
        disk: &SledDisk,
        durable: DurableLog,
        planted: Planted,
    ) -> Result<Self, StateStoreError> {
        let (snapshots, current) = SnapshotStore::open(disk)?;
        let mut applied = Applied::default();
        if let Some(stored) = current {
            let body = stored.decode()?;
            drop(stored);
            applied = applied_from_body(body);
            tracing::info!(last_applied = ?applied.last_applied, "state machine resumed from snapshot");
        }
        Ok(Self {
            inner: Arc::new(Inner {
                durable,
                planted,
                applied: Mutex::new(applied),
                snapshots,
            }),
        })
    }

    /// Size in bytes of the current snapshot, built here or installed (0: none yet).
    pub fn snapshot_bytes(&self) -> u64 {
        self.inner.snapshots.bytes()
    }

    /// Locks the applied state for a short read (never hold it across an await).
    pub fn lock(&self) -> MutexGuard<'_, Applied> {
        // A panic while applying leaves a state nobody can trust.
        crate::lock::lock_or_stop(&self.inner.applied, "state machine")
    }

    /// Where this node's snapshot is kept.
    pub(crate) fn snapshots(&self) -> &SnapshotStore {
        &self.inner.snapshots
    }
}

/// An entry's commands, decoded to be applied. Every command was decoded before its entry
/// was written here (by the leader when it checked a forwarded one or built its own, by
/// this node when `AppendEntries` brought it), so one that does not decode now is a broken
/// invariant: the node stops rather than apply part of an entry.
fn decoded(log_id: LogId, commands: &[EncodedCommand]) -> Result<Vec<Command>, StorageError> {
    commands
        .iter()
        .enumerate()
        .map(|(i, command)| {
            command.decode().map_err(|e| {
                let reason = format!("entry {} command {i} does not decode: {e}", log_id.index);
                StorageIOError::apply(log_id, AnyError::error(reason)).into()
            })
        })
        .collect()
}

fn applied_from_body(body: SnapshotBody) -> Applied {
    Applied {
        state: FleetState::from_image(body.image),
        last_applied: body.last_applied,
        membership: body.membership,
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
                EntryPayload::Normal(request) => {
                    let now_us = if self.inner.planted.is(PlantedBug::OwnClock) {
                        crate::clock::wall_clock_us()
                    } else {
                        request.now_us
                    };
                    let commands = decoded(entry.log_id, &request.commands)?;
                    FleetResponse {
                        answers: rules::apply_batch_within(
                            &mut applied.state,
                            &commands,
                            now_us,
                            &request.limits,
                        ),
                    }
                }
                EntryPayload::Membership(membership) => {
                    applied.membership = StoredMembership::new(Some(entry.log_id), membership);
                    FleetResponse::default()
                }
            };
            responses.push(response);
        }
        // After a snapshot's encode: one step of folding its overlays back in, under the
        // hold of the lock this batch already took (nothing once the fold is done).
        applied.state.thaw_some(FleetState::THAW_STEP_ITEMS);
        let (buckets, claims) = applied.state.len();
        metrics::gauge!("ankusa_state_claims").set(claims as f64);
        metrics::gauge!("ankusa_state_buckets").set(buckets as f64);
        metrics::gauge!("ankusa_state_bytes_estimate").set(applied.state.bytes_estimate() as f64);
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
        let started = std::time::Instant::now();
        let data = snapshot.into_inner();
        let size_bytes = data.len();
        let body = snapshot::decode(&data)
            .map_err(|e| StorageIOError::read_snapshot(Some(meta.signature()), &e))?;
        // The bytes are stored, then let go before the state is built from the body.
        drop(self.inner.snapshots.persist(meta, data).await?);
        let mut applied = applied_from_body(body);
        // The meta is authoritative for what the snapshot covers.
        applied.last_applied = meta.last_log_id;
        applied.membership = meta.last_membership.clone();
        *self.lock() = applied;
        metrics::counter!("ankusa_snapshots_total", "event" => "installed").increment(1);
        metrics::histogram!("ankusa_snapshot_seconds", "event" => "installed")
            .record(started.elapsed().as_secs_f64());
        metrics::histogram!("ankusa_snapshot_size_bytes", "event" => "installed")
            .record(size_bytes as f64);
        tracing::info!(snapshot_id = %meta.snapshot_id, "snapshot installed");
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot>, StorageError> {
        let current = self
            .inner
            .snapshots
            .current()
            .map_err(|e| StorageIOError::read_snapshot(None, &e))?;
        Ok(current.map(|stored| Snapshot {
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
        let mut state =
            StateMachineStore::open(&disk, log.durable(), crate::planted::Planted::default())
                .expect("open state");
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
}
