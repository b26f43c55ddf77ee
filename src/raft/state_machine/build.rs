//! How a snapshot is built: the state frozen under the lock, encoded on a thread of its
//! own while apply goes on, then stored ([`crate::raft::snapshot::store`]).

use std::io::Cursor;

use openraft::{RaftSnapshotBuilder, StorageIOError};

use super::StateMachineStore;
use crate::raft::{Snapshot, SnapshotMeta, StorageError, TypeConfig};

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
                let data = crate::raft::snapshot::encode_live(last_applied, &membership, &frozen);
                drop(frozen);
                let _ = done.send((last_applied, membership, data));
            });
        let encoded = match started_thread {
            Ok(_) => encoded
                .await
                .map_err(|e| StorageIOError::write_snapshot(None, &e)),
            Err(e) => Err(StorageIOError::write_snapshot(None, &e)),
        };
        // Whether or not the encode went well, the frozen copy is gone now, and apply folds
        // the overlays back into the maps a step per batch (`FleetState::thaw_some`): a
        // whole overlay folded here at once held apply up for up to 10 ms
        // (docs/benchmarks.md, round 18), and a fold in steps of its own would have to win
        // the lock from apply again for each one.
        let encoded = encoded?;
        let (last_applied, membership, data) = encoded;
        let seq = self.snapshots().next_seq();
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
        let data = self.snapshots().persist(&meta, data).await?;
        metrics::counter!("ankusa_snapshots_total", "event" => "built").increment(1);
        metrics::histogram!("ankusa_snapshot_seconds", "event" => "built")
            .record(started.elapsed().as_secs_f64());
        metrics::histogram!("ankusa_snapshot_size_bytes", "event" => "built")
            .record(data.len() as f64);
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
