//! The log store through its openraft interface: openraft's storage suite (on a stub and
//! on the real state machine), reopen, the vote, purge and truncation with the durable
//! mark, holes; and the helpers the WAL's and the writer's tests share.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Cursor;

use openraft::storage::{RaftLogStorageExt, RaftStateMachine};
use openraft::testing::{StoreBuilder, Suite};
use openraft::{CommittedLeaderId, EntryPayload, Membership, RaftSnapshotBuilder};
use tempfile::TempDir;
use tokio::sync::Mutex;

use super::*;
use crate::raft::state_machine::StateMachineStore;
use crate::raft::{MemberNode, Snapshot, SnapshotMeta, StoredMembership};
use crate::state::{Command, EncodedCommand, FleetRequest, FleetResponse};
use crate::storage::sled_disk::SledDisk;

/// The node the tests' stores belong to, which also made their entries (`log_id`).
pub(super) const NODE: NodeId = 0;

/// Lifts a log-writer hold when dropped, so a failing test does not leave the writer
/// (and the store's drop, which joins it) waiting forever.
pub(super) struct Release(pub(super) Faults);

impl Drop for Release {
    fn drop(&mut self) {
        let _ = self.0.hold_log_writes(false);
    }
}

pub(super) fn open_store(path: &Path) -> Result<LogStore> {
    LogStore::open(path, NODE, Faults::new(false))
}

pub(super) fn log_id(term: u64, index: u64) -> LogId {
    LogId::new(CommittedLeaderId::new(term, NODE), index)
}

/// An entry carrying a real fleet payload, so the codec path is exercised end to end.
pub(super) fn request_entry(term: u64, index: u64) -> Entry {
    let request = FleetRequest {
        now_us: 1_000 * index,
        limits: crate::state::StateLimits::UNLIMITED,
        commands: EncodedCommand::encode_all(&[Command::Reset {
            tenant: "tenant-a".into(),
        }])
        .expect("encode")
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

/// The term the tests' stores have voted in: past every entry they append.
pub(super) const VOTED_TERM: u64 = 50;

/// A temp dir and the vote store's path in it, the vote store made and holding a vote of
/// [`VOTED_TERM`]: a node has saved a vote of term T before it holds an entry of term T,
/// and the store refuses to open a log newer than its vote.
pub(super) fn scratch() -> (TempDir, PathBuf) {
    let dir = TempDir::new().expect("temp dir");
    let path = dir.path().join("raft-log.redb");
    let db = Database::create(&path).expect("vote store");
    create_tables(&db).expect("tables");
    let vote = Vote::new(VOTED_TERM, NODE);
    store_meta(&db, VOTE_KEY, &vote, Durability::Immediate).expect("vote");
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

    async fn applied_state(&mut self) -> Result<(Option<LogId>, StoredMembership), StorageError> {
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
        let (last_applied, membership) =
            decode(&data).map_err(|e| StorageIOError::read_snapshot(Some(meta.signature()), &e))?;
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

/// The log store and the fleet's own state machine (`StateMachineStore`, its snapshots in
/// sled), each build in a temp dir of its own.
struct RealStoresBuilder;

impl StoreBuilder<TypeConfig, LogStore, StateMachineStore, (SledDisk, TempDir)>
    for RealStoresBuilder
{
    async fn build(
        &self,
    ) -> Result<((SledDisk, TempDir), LogStore, StateMachineStore), StorageError> {
        let dir = TempDir::new().map_err(|e| StorageIOError::write(&e))?;
        let store = open_store(&dir.path().join("raft-log.redb")).map_err(write_logs_error)?;
        let disk = SledDisk::open(&dir.path().join("state.sled"), 1 << 20)
            .map_err(|e| StorageIOError::write(&e))?;
        // The suite applies entries its log store never holds (a state machine ahead of an
        // empty log, from `last_membership_in_log` on), which on this log's durable mark
        // would wait forever: the state machine waits on a mark that holds everything. The
        // durability rule has tests of its own (`raft::durability`, `raft::state_machine`).
        let state = StateMachineStore::open(
            &disk,
            DurableLog::everything(),
            crate::planted::Planted::default(),
        )
        .map_err(|e| StorageIOError::write(&e))?;
        // Dropped in this order: sled closes before its directory goes.
        Ok(((disk, dir), store, state))
    }
}

/// openraft's suite on the stores a node runs on: the log store, and the real state
/// machine rather than [`MemStateMachine`], so its applied state, membership and
/// snapshots (built, stored in sled, read back, installed) are held to openraft's
/// expectations too.
#[test]
fn passes_openraft_storage_suite_with_the_real_state_machine() {
    Suite::test_all(RealStoresBuilder).expect("openraft storage suite, real state machine");
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
pub(super) fn segment_files(wal_dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(wal_dir)
        .expect("list")
        .map(|item| item.expect("item").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "wal"))
        .collect()
}

/// Copies the store at `path` (the redb file and the WAL directory) to `copy`.
pub(super) fn copy_store(path: &Path, copy: &Path) {
    std::fs::copy(path, copy).expect("copy redb");
    let wal_copy = copy.with_extension("wal");
    std::fs::create_dir_all(&wal_copy).expect("wal dir");
    for segment in segment_files(&path.with_extension("wal")) {
        let name = segment.file_name().expect("name");
        std::fs::copy(&segment, wal_copy.join(name)).expect("copy segment");
    }
}

/// Tells `told` the entry's index once its append counts as this node's copy.
pub(super) fn report(told: &std::sync::mpsc::Sender<u64>, index: u64) -> writer::OnDurable {
    let told = told.clone();
    Box::new(move |result: io::Result<()>| {
        result.expect("append");
        let _ = told.send(index);
    })
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

/// A vote store whose vote is older than the log beside it (emptied, replaced) lost votes;
/// one cut short or with a flipped bit that redb itself would read back without complaint
/// fails its integrity check. Each refuses to open, naming the file, and leaves it as it
/// was; a flipped bit in redb's choice between its two commit slots reads the same data.
#[tokio::test]
async fn a_damaged_vote_store_refuses_to_open() {
    let (_dir, path) = scratch();
    // A purge point whose encoding is easy to find in the file.
    let purged = log_id(1, 0x5a5a_5a5a_5a5a);
    {
        let db = Database::create(&path).expect("vote store");
        store_meta(&db, LAST_PURGED_KEY, &purged, Durability::Immediate).expect("purge point");
    }
    let bytes = std::fs::read(&path).expect("read");
    let needle = encode(&purged).expect("encode");
    let values: Vec<usize> = bytes
        .windows(needle.len())
        .enumerate()
        .filter(|(_, window)| *window == needle.as_slice())
        .map(|(at, _)| at)
        .collect();
    assert!(!values.is_empty(), "the purge point is in the file");
    let refused = |damaged: &[u8], what: &str| {
        std::fs::write(&path, damaged).expect("damage");
        let error = open_store(&path)
            .err()
            .unwrap_or_else(|| panic!("{what}: opened"));
        assert!(
            error.to_string().contains(&path.display().to_string()),
            "{what}: {error}"
        );
        assert_eq!(
            std::fs::read(&path).expect("read"),
            damaged,
            "{what}: untouched"
        );
    };
    refused(&bytes[..bytes.len() / 2], "cut in half");
    refused(&bytes[..bytes.len() - 1], "cut by a byte");
    // The newest copy of the value is the live one; older pages may hold stale copies.
    let mut flipped = bytes.clone();
    flipped[values[values.len() - 1] + 3] ^= 0x10;
    refused(&flipped, "a flipped bit in the purge point");
    std::fs::write(&path, &bytes).expect("undamaged");
    let mut store = open_store(&path).expect("the undamaged store opens");
    assert_eq!(
        store
            .get_log_state()
            .await
            .expect("state")
            .last_purged_log_id,
        Some(purged)
    );
    drop(store);
    let mut slot = bytes.clone();
    slot[9] ^= 0x01; // redb's "god byte": which commit slot is the newest
    std::fs::write(&path, &slot).expect("damage");
    if let Ok(mut store) = open_store(&path) {
        assert_eq!(
            store
                .get_log_state()
                .await
                .expect("state")
                .last_purged_log_id,
            Some(purged)
        );
        assert_eq!(
            store.read_vote().await.expect("vote"),
            Some(Vote::new(VOTED_TERM, NODE))
        );
    }
}

/// An emptied vote store beside a log of term 1: the node would not know it voted.
#[tokio::test]
async fn a_vote_older_than_the_log_refuses_to_open() {
    let (_dir, path) = scratch();
    {
        let mut store = open_store(&path).expect("open");
        store
            .blocking_append(vec![request_entry(1, 0), request_entry(1, 1)])
            .await
            .expect("append");
    }
    std::fs::write(&path, b"").expect("empty the vote store");
    let refused = open_store(&path).expect_err("opened with no vote");
    assert!(
        refused.to_string().contains("votes were lost")
            && refused.to_string().contains(&path.display().to_string()),
        "{refused}"
    );
}
