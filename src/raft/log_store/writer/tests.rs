//! The writer's callbacks: when an append counts as this node's copy.

use openraft::storage::RaftLogStorage;

use super::*;
use crate::raft::log_store::tests::*;
use crate::raft::log_store::*;

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
