//! Every file and folder of a node's data dir, by name. The server opens them, backup and
//! restore write them, the local stores keep theirs there: each names them from here, so
//! none of them needs another for a file name.

/// The Raft log and vote store.
pub const RAFT_LOG_FILE: &str = "raft-log.redb";
/// The sled store: the record naming the snapshot (before `SNAPSHOT_DIR`, the snapshot's
/// bytes too; before `SETTLE_QUEUE_JOURNAL`, the settle queue).
pub const STATE_SLED_DIR: &str = "state.sled";
/// The current snapshot's bytes, one file named by its generation (`<generation>.snapshot`);
/// the record naming it is in `STATE_SLED_DIR` (`raft::snapshot::store`).
pub const SNAPSHOT_DIR: &str = "snapshot";
/// The journal of node-scope claims.
pub const NODE_SCOPE_JOURNAL: &str = "node-claims.journal";
/// The journal of claims the local fallback took, until reconciled.
pub const FALLBACK_JOURNAL: &str = "fallback-claims.journal";
/// The settles queued while the fleet did not answer, until it applies them.
pub const SETTLE_QUEUE_JOURNAL: &str = "settle-queue.journal";
/// There once the settle queue of the previous version (a sled tree in `STATE_SLED_DIR`)
/// was moved into `SETTLE_QUEUE_JOURNAL`: that tree is never read again.
pub const SETTLE_QUEUE_MOVED: &str = "settle-queue.moved";
/// There while `snapshot restore` writes the data dir; a node does not start while it is.
pub const RESTORE_MARKER: &str = "restore-incomplete";
