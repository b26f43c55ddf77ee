//! The journal against its promises: the last record of a key wins, removals and expiry
//! hold across a reopen, a torn last append is cut off (never the records before it) and
//! other damage refuses to open, and compaction keeps exactly the live set while later
//! appends follow it.

use super::*;
use crate::state::{ClaimState, HookId};

const NOW_US: u64 = 1_000_000_000;

fn key(name: &str) -> ClaimKey {
    ClaimKey {
        tenant: "acme".into(),
        source_id: "stripe".into(),
        key: name.into(),
    }
}

fn record(hook: &str, state: ClaimState, expires_at_us: u64) -> ClaimRecord {
    ClaimRecord {
        hook_id: HookId::from(hook),
        node: 1,
        state,
        expires_at_us,
        ttl_ms: 60_000,
    }
}

fn live(hook: &str) -> ClaimRecord {
    record(hook, ClaimState::Pending, NOW_US + 60_000_000)
}

fn sorted(mut claims: Vec<(ClaimKey, ClaimRecord)>) -> Vec<(ClaimKey, ClaimRecord)> {
    claims.sort_by(|a, b| a.0.cmp(&b.0));
    claims
}

fn reopen(path: &Path) -> Vec<(ClaimKey, ClaimRecord)> {
    let (_journal, claims) = ClaimJournal::open(path, NOW_US).expect("reopen");
    sorted(claims)
}

#[tokio::test]
async fn the_last_record_of_a_key_wins_across_a_reopen() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("claims.journal");
    let (journal, claims) = ClaimJournal::open(&path, NOW_US).expect("open");
    assert!(claims.is_empty(), "a new journal is empty");
    let committed = record("hook-a", ClaimState::Committed, NOW_US + 90_000_000);
    journal
        .append(&key("a"), Some(&live("hook-a")))
        .expect("append");
    journal.append(&key("a"), Some(&committed)).expect("append");
    journal
        .append(&key("b"), Some(&live("hook-b")))
        .expect("append");
    journal.append(&key("b"), None).expect("append");
    journal
        .append(&key("c"), Some(&live("hook-c")))
        .expect("append");
    journal.sync().await.expect("sync");
    drop(journal);
    assert_eq!(
        reopen(&path),
        vec![(key("a"), committed), (key("c"), live("hook-c"))]
    );
}

#[tokio::test]
async fn expired_claims_are_dropped_on_open() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("claims.journal");
    let (journal, _) = ClaimJournal::open(&path, NOW_US).expect("open");
    let stale = record("hook-old", ClaimState::Committed, NOW_US);
    journal.append(&key("old"), Some(&stale)).expect("append");
    journal
        .append(&key("new"), Some(&live("hook-new")))
        .expect("append");
    drop(journal); // dropping drains the flusher
    assert_eq!(reopen(&path), vec![(key("new"), live("hook-new"))]);
}

/// Three records on disk, then `damage` applied to the file's bytes; the path and where
/// each record ends.
async fn three_records_then(
    damage: impl FnOnce(&mut Vec<u8>, &[usize]),
) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("claims.journal");
    let (journal, _) = ClaimJournal::open(&path, NOW_US).expect("open");
    let mut ends = Vec::new();
    for name in ["a", "b", "c"] {
        journal
            .append(&key(name), Some(&live(&format!("hook-{name}"))))
            .expect("append");
        journal.sync().await.expect("sync");
        ends.push(std::fs::metadata(&path).expect("stat").len() as usize);
    }
    drop(journal);
    let mut bytes = std::fs::read(&path).expect("read");
    damage(&mut bytes, &ends);
    std::fs::write(&path, &bytes).expect("write");
    (dir, path)
}

/// Three records on disk, then `damage` (a torn last append) applied to the file's bytes:
/// the journal opens, keeps the damaged file aside, and reads back the same after.
async fn damaged(damage: impl FnOnce(&mut Vec<u8>, &[usize])) -> Vec<(ClaimKey, ClaimRecord)> {
    let (dir, path) = three_records_then(damage).await;
    let claims = reopen(&path);
    let kept_aside = std::fs::read_dir(dir.path())
        .expect("list")
        .filter_map(Result::ok)
        .any(|entry| entry.file_name().to_string_lossy().contains(".damaged-"));
    assert!(kept_aside, "the damaged file is kept aside for inspection");
    // The damaged file was replaced by the live set: appending and reopening works.
    let (journal, again) = ClaimJournal::open(&path, NOW_US).expect("open again");
    assert_eq!(sorted(again), claims, "the cut file reads back the same");
    journal
        .append(&key("d"), Some(&live("hook-d")))
        .expect("append");
    drop(journal);
    assert!(reopen(&path).contains(&(key("d"), live("hook-d"))));
    claims
}

#[tokio::test]
async fn a_torn_tail_loses_only_the_torn_record() {
    let claims = damaged(|bytes, ends| bytes.truncate(ends[2] - 3)).await;
    assert_eq!(
        claims,
        vec![(key("a"), live("hook-a")), (key("b"), live("hook-b"))]
    );
}

#[tokio::test]
async fn a_header_cut_short_loses_only_its_record() {
    let claims = damaged(|bytes, ends| bytes.truncate(ends[1] + 3)).await;
    assert_eq!(
        claims,
        vec![(key("a"), live("hook-a")), (key("b"), live("hook-b"))]
    );
}

#[tokio::test]
async fn a_zero_tail_left_by_a_crash_is_dropped() {
    // Blocks a crash left allocated but unwritten read as zeros.
    let claims = damaged(|bytes, _| bytes.extend_from_slice(&[0; 4096])).await;
    assert_eq!(
        claims,
        vec![
            (key("a"), live("hook-a")),
            (key("b"), live("hook-b")),
            (key("c"), live("hook-c"))
        ]
    );
}

/// A flipped bit is no torn append, in the last record as in one before it, and neither
/// is data after a zero length: the journal refuses to open, naming its file and where,
/// and leaves the file as it was.
#[tokio::test]
async fn damage_no_crash_leaves_refuses_to_open() {
    type Damage = Box<dyn FnOnce(&mut Vec<u8>, &[usize])>;
    let cases: [(&str, Damage); 4] = [
        (
            "a bit in the second record",
            Box::new(|b, ends| b[ends[1] - 2] ^= 0x10),
        ),
        (
            "a bit in the last record",
            Box::new(|b, ends| b[ends[2] - 2] ^= 0x10),
        ),
        (
            "a bit in the last header",
            Box::new(|b, ends| b[ends[1] + 5] ^= 0x10),
        ),
        (
            "zeros, then data",
            Box::new(|b, _| {
                let mut again = b.clone();
                b.extend_from_slice(&[0; 16]);
                b.append(&mut again);
            }),
        ),
    ];
    for (what, damage) in cases {
        let (_dir, path) = three_records_then(damage).await;
        let before = std::fs::read(&path).expect("read");
        let refused = ClaimJournal::open(&path, NOW_US)
            .err()
            .unwrap_or_else(|| panic!("{what}: opened"));
        assert!(
            matches!(&refused, JournalError::Damaged { path: named, .. } if *named == path),
            "{what}: {refused}"
        );
        assert!(refused.to_string().contains(&path.display().to_string()));
        assert_eq!(
            std::fs::read(&path).expect("read"),
            before,
            "{what}: untouched"
        );
    }
}

#[tokio::test]
async fn compaction_keeps_the_live_set_and_later_appends_follow_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("claims.journal");
    let (journal, _) = ClaimJournal::open(&path, NOW_US).expect("open");
    for round in 0..200 {
        journal
            .append(&key("hot"), Some(&live(&format!("hook-{round}"))))
            .expect("append");
    }
    journal.sync().await.expect("sync");
    let grown = std::fs::metadata(&path).expect("stat").len();
    let before = live("hook-199");
    journal
        .compact([(&key("hot"), &before)].into_iter())
        .expect("compact");
    journal
        .append(&key("after"), Some(&live("hook-after")))
        .expect("append");
    // The same key again after the compaction: this record must win over the live set's.
    let hot = live("hook-200");
    journal.append(&key("hot"), Some(&hot)).expect("append");
    journal.sync().await.expect("sync");
    let compacted = std::fs::metadata(&path).expect("stat").len();
    assert!(
        compacted * 50 < grown,
        "200 records of one key shrink to 3: {grown} -> {compacted} bytes"
    );
    drop(journal);
    assert_eq!(
        reopen(&path),
        vec![(key("after"), live("hook-after")), (key("hot"), hot)]
    );
}

#[tokio::test]
async fn a_failed_compaction_loses_nothing_and_the_journal_goes_on() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("claims.journal");
    let (journal, _) = ClaimJournal::open(&path, NOW_US).expect("open");
    journal
        .append(&key("a"), Some(&live("hook-a")))
        .expect("append");
    journal.sync().await.expect("sync");
    // A directory where the compacted file would be written: the compaction cannot happen.
    let blocker = path.with_extension("compacting");
    std::fs::create_dir(&blocker).expect("block the compaction");
    journal
        .append(&key("b"), Some(&live("hook-b")))
        .expect("append");
    journal
        .compact([(&key("a"), &live("hook-a")), (&key("b"), &live("hook-b"))].into_iter())
        .expect("compact");
    journal
        .append(&key("c"), Some(&live("hook-c")))
        .expect("append");
    journal
        .sync()
        .await
        .expect("the journal still takes records");
    drop(journal);
    std::fs::remove_dir(&blocker).expect("unblock");
    assert_eq!(
        reopen(&path),
        vec![
            (key("a"), live("hook-a")),
            (key("b"), live("hook-b")),
            (key("c"), live("hook-c")),
        ]
    );
}

#[test]
fn a_journal_that_cannot_be_read_does_not_open() {
    let dir = tempfile::tempdir().expect("tempdir");
    // A directory opens but does not read: an I/O error, not damage to cut off.
    let path = dir.path().join("claims.journal");
    std::fs::create_dir(&path).expect("mkdir");
    assert!(matches!(
        ClaimJournal::open(&path, NOW_US),
        Err(JournalError::Io { .. })
    ));
}

#[tokio::test]
async fn sync_with_nothing_pending_returns() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (journal, _) =
        ClaimJournal::open(&dir.path().join("claims.journal"), NOW_US).expect("open");
    tokio::time::timeout(std::time::Duration::from_secs(30), journal.sync())
        .await
        .expect("an idle journal syncs at once")
        .expect("sync");
}

#[test]
fn a_failed_compaction_writes_what_it_superseded_to_the_old_file() {
    // The flusher's step on its own (the test above cannot force the records it superseded
    // to still be unwritten when it runs).
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("claims.journal");
    let mut old = Vec::new();
    encode_record::<Claims>(&mut old, &key("a"), Some(&live("hook-a"))).expect("encode");
    std::fs::write(&path, &old).expect("write");
    let mut superseded = Vec::new();
    encode_record::<Claims>(&mut superseded, &key("b"), Some(&live("hook-b"))).expect("encode");
    let mut later = Vec::new();
    encode_record::<Claims>(&mut later, &key("c"), Some(&live("hook-c"))).expect("encode");
    let live_set = encode_all::<Claims>(
        [
            (&key("a"), Some(&live("hook-a"))),
            (&key("b"), Some(&live("hook-b"))),
        ]
        .into_iter(),
    )
    .expect("encode");
    std::fs::create_dir(path.with_extension("compacting")).expect("block the compaction");
    let mut file = OpenOptions::new().append(true).open(&path).expect("open");
    let compaction = Compaction {
        live: live_set,
        superseded: superseded.clone(),
    };
    write_out(Claims::NAME, &path, &mut file, Some(compaction), &later).expect("written");
    let expected = [old, superseded, later].concat();
    assert_eq!(std::fs::read(&path).expect("read"), expected);
}
