//! The WAL through the log store: segments roll, purge and truncate across reopens,
//! the bytes after an index, the spare segment, and what replay does with damage.

use openraft::storage::{RaftLogStorage, RaftLogStorageExt};
use openraft::{EntryPayload, RaftLogReader};

use super::*;
use crate::raft::log_store::tests::*;
use crate::raft::log_store::*;
use crate::state::{Command, EncodedCommand, FleetRequest};

/// Small segments: appends roll over, reads cross segments, purge drops whole segments,
/// truncation cuts inside one and drops the later ones, and all of it survives a reopen.
#[tokio::test]
async fn segments_roll_purge_and_truncate_across_reopens() {
    let (dir, path) = scratch();
    let wal_dir = path.with_extension("wal");
    let segments = || segment_files(&wal_dir).len();
    let entries: Vec<Entry> = (0..40).map(|index| request_entry(1, index)).collect();
    {
        let mut store =
            LogStore::open_with_segment_bytes(&path, NODE, Faults::new(false), 256).expect("open");
        for chunk in entries.chunks(3) {
            store.blocking_append(chunk.to_vec()).await.expect("append");
        }
        assert!(
            segments() > 3,
            "appends rolled over: {} segments",
            segments()
        );
        assert_eq!(store.try_get_log_entries(..).await.expect("read"), entries);
        assert_eq!(
            store.try_get_log_entries(5..33).await.expect("read"),
            entries[5..33]
        );
    }
    let before_purge = segments();
    {
        let mut store = LogStore::open_with_segment_bytes(&path, NODE, Faults::new(false), 256)
            .expect("reopen");
        assert_eq!(store.try_get_log_entries(..).await.expect("read"), entries);
        store.purge(log_id(1, 20)).await.expect("purge");
        assert!(segments() < before_purge, "purge dropped whole segments");
        store.truncate(log_id(1, 30)).await.expect("truncate");
        let replaced: Vec<Entry> = (30..35).map(|index| request_entry(2, index)).collect();
        store
            .blocking_append(replaced)
            .await
            .expect("append after truncate");
    }
    let mut store =
        LogStore::open_with_segment_bytes(&path, NODE, Faults::new(false), 256).expect("reopen");
    let mut expected = entries[21..30].to_vec();
    expected.extend((30..35).map(|index| request_entry(2, index)));
    assert_eq!(store.try_get_log_entries(..).await.expect("read"), expected);
    let state = store.get_log_state().await.expect("state");
    assert_eq!(state.last_purged_log_id, Some(log_id(1, 20)));
    assert_eq!(state.last_log_id, Some(log_id(2, 34)));
    drop(dir);
}

/// What the snapshot policy reads: the bytes of every record after an index, across
/// segment boundaries and after a truncation, each entry's counted once.
#[tokio::test]
async fn log_bytes_count_the_records_after_an_index() {
    let (_dir, path) = scratch();
    let record_len = |entry: &Entry| {
        let mut buf = Vec::new();
        wal::push_record(
            &mut buf,
            wal::KIND_ENTRY,
            &encode_as(entry, "entry").expect("encode"),
        )
        .expect("record");
        buf.len() as u64
    };
    let after = |entries: &[Entry], index: u64| -> u64 {
        entries
            .iter()
            .filter(|entry| entry.log_id.index > index)
            .map(record_len)
            .sum()
    };
    let mut store =
        LogStore::open_with_segment_bytes(&path, NODE, Faults::new(false), 256).expect("open");
    let bytes = store.log_bytes();
    assert_eq!(bytes.after(None), Some(0), "an empty log");
    let mut entries: Vec<Entry> = (1..=40).map(|index| request_entry(1, index)).collect();
    for chunk in entries.chunks(3) {
        store.blocking_append(chunk.to_vec()).await.expect("append");
    }
    assert!(
        segment_files(&path.with_extension("wal")).len() > 3,
        "rolled over"
    );
    assert_eq!(bytes.after(None), Some(after(&entries, 0)));
    for index in [1, 7, 20, 39] {
        assert_eq!(
            bytes.after(Some(index)),
            Some(after(&entries, index)),
            "after {index}"
        );
    }
    assert_eq!(bytes.after(Some(40)), Some(0));
    assert_eq!(bytes.after(Some(u64::MAX)), Some(0));
    store.truncate(log_id(1, 30)).await.expect("truncate");
    entries.truncate(29);
    let replaced: Vec<Entry> = (30..=33).map(|index| request_entry(2, index)).collect();
    store
        .blocking_append(replaced.clone())
        .await
        .expect("append");
    entries.extend(replaced);
    assert_eq!(bytes.after(Some(25)), Some(after(&entries, 25)));
}

/// The next segment's file is made ahead (zeros, fsynced) and becomes the new segment
/// when the log rolls over: the very file, not a copy.
#[tokio::test]
async fn the_next_segment_is_made_ahead_and_taken_when_the_log_rolls() {
    use std::os::unix::fs::MetadataExt;
    let (_dir, path) = scratch();
    let wal_dir = path.with_extension("wal");
    let spare = wal_dir.join("next-segment.spare");
    let mut store =
        LogStore::open_with_segment_bytes(&path, NODE, Faults::new(false), 256).expect("open");
    store
        .blocking_append(vec![request_entry(1, 0)])
        .await
        .expect("append");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !spare.exists() {
        assert!(std::time::Instant::now() < deadline, "no spare was made");
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    let spare_inode = std::fs::metadata(&spare).expect("spare").ino();
    let before = segment_files(&wal_dir);
    let mut next = 1;
    while segment_files(&wal_dir).len() == before.len() {
        assert!(next < 50, "the log never rolled over");
        store
            .blocking_append(vec![request_entry(1, next)])
            .await
            .expect("append");
        next += 1;
    }
    let rolled: Vec<PathBuf> = segment_files(&wal_dir)
        .into_iter()
        .filter(|segment| !before.contains(segment))
        .collect();
    assert_eq!(rolled.len(), 1);
    assert_eq!(
        std::fs::metadata(&rolled[0]).expect("segment").ino(),
        spare_inode
    );
    let all: Vec<Entry> = (0..next).map(|index| request_entry(1, index)).collect();
    assert_eq!(store.try_get_log_entries(..).await.expect("read"), all);
}

/// An entry whose record spans more than a sector, so a torn write can cut it at a sector
/// boundary.
fn long_entry(index: u64) -> Entry {
    let request = FleetRequest {
        now_us: 1_000 * index,
        limits: crate::state::StateLimits::UNLIMITED,
        commands: EncodedCommand::encode_all(&[Command::Reset {
            tenant: "t".repeat(700).into(),
        }])
        .expect("encode")
        .into(),
    };
    Entry {
        log_id: log_id(1, index),
        payload: EntryPayload::Normal(request),
    }
}

/// Six long entries, appended as four then two; the segment's path, its bytes and where
/// each record starts.
async fn six_long_entries(path: &Path) -> (Vec<Entry>, PathBuf, Vec<u8>, Vec<usize>) {
    let entries: Vec<Entry> = (0..6).map(long_entry).collect();
    {
        let mut store = open_store(path).expect("open");
        for part in [&entries[..4], &entries[4..]] {
            store.blocking_append(part.to_vec()).await.expect("append");
        }
    }
    let segment = path.with_extension("wal").join(format!("{:020}.wal", 0));
    let bytes = std::fs::read(&segment).expect("read");
    let mut starts = Vec::new();
    let mut at = 0;
    while let Ok((_, next)) = record::read_at(&bytes, at, bytes.len()) {
        starts.push(at);
        at = next;
    }
    (entries, segment, bytes, starts)
}

/// A crash in the middle of an append leaves a torn record at the end of the last
/// segment: the write stopped at a sector boundary inside it, zeros after. The store opens
/// with everything before it, clears the rest, and appends continue from there.
#[tokio::test]
async fn a_torn_last_append_is_cut() {
    let (_dir, path) = scratch();
    let (entries, segment, bytes, starts) = six_long_entries(&path).await;
    let last = starts[5];
    let cut = (last as u64 + 1).next_multiple_of(record::SECTOR_BYTES) as usize;
    let mut torn = bytes.clone();
    torn[cut..].fill(0);
    std::fs::write(&segment, &torn).expect("tear");
    {
        let mut store = open_store(&path).expect("open after the tear");
        assert_eq!(
            store.try_get_log_entries(..).await.expect("read"),
            entries[..5],
            "everything before the torn record"
        );
        store
            .blocking_append(vec![request_entry(2, 5)])
            .await
            .expect("append");
    }
    let mut store = open_store(&path).expect("reopen");
    let mut expected = entries[..5].to_vec();
    expected.push(request_entry(2, 5));
    assert_eq!(store.try_get_log_entries(..).await.expect("read"), expected);
}

/// A crash in the middle of a truncation, which zeroes forward from the cut and fsyncs at
/// the end, leaves zeros from the cut on and stale records after them: the store opens
/// with everything before the cut.
#[tokio::test]
async fn a_truncation_stopped_part_way_opens_with_what_was_before_the_cut() {
    let (_dir, path) = scratch();
    let (entries, segment, bytes, starts) = six_long_entries(&path).await;
    let mut cut_part_way = bytes.clone();
    // The first sector of the cut zeroed, the stale records after it still there.
    let cut = starts[3];
    cut_part_way[cut..cut + record::SECTOR_BYTES as usize].fill(0);
    std::fs::write(&segment, &cut_part_way).expect("cut part way");
    let mut store = open_store(&path).expect("open after the unfinished truncation");
    assert_eq!(
        store.try_get_log_entries(..).await.expect("read"),
        entries[..3],
        "everything before the cut, nothing after it"
    );
    drop(store);
    // Data in the zeros after the last record (past a whole zero header) holds nothing
    // acknowledged either: the store opens with every entry.
    let (_dir, path) = scratch();
    let (entries, segment, bytes, _) = six_long_entries(&path).await;
    let used = bytes.iter().rposition(|byte| *byte != 0).expect("records") + 1;
    let mut stray = bytes.clone();
    stray[used + 5000] ^= 0x10;
    std::fs::write(&segment, &stray).expect("stray bit");
    let mut store = open_store(&path).expect("open with a stray bit after the records");
    assert_eq!(store.try_get_log_entries(..).await.expect("read"), entries);
}

/// A flipped bit in a record is no torn write, in the last record as in any other, and neither is a
/// segment cut short: each refuses to open, naming the segment, instead of dropping
/// acknowledged entries.
#[tokio::test]
async fn a_flipped_bit_or_a_segment_cut_short_refuses_to_open() {
    let (_dir, path) = scratch();
    let (_, segment, bytes, starts) = six_long_entries(&path).await;
    let used = bytes.iter().rposition(|byte| *byte != 0).expect("records") + 1;
    let flipped_at = |at: usize| {
        let mut flipped = bytes.clone();
        flipped[at] ^= 0x10;
        flipped
    };
    let cases = [
        ("a bit in the last record's body", flipped_at(used - 100)),
        (
            "a bit in the last record's length",
            flipped_at(starts[5] + 2),
        ),
        (
            "a bit in the last record's checksum",
            flipped_at(starts[5] + 5),
        ),
        ("a bit in a record before it", flipped_at(starts[2] + 300)),
        (
            "the segment cut inside its last record",
            bytes[..used - 100].to_vec(),
        ),
        (
            "the segment cut after its records",
            bytes[..used + 4096].to_vec(),
        ),
    ];
    for (what, damaged) in cases {
        std::fs::write(&segment, &damaged).expect("damage");
        let refused = open_store(&path)
            .err()
            .unwrap_or_else(|| panic!("{what}: opened"));
        assert!(
            refused.to_string().contains(&segment.display().to_string()),
            "{what}: {refused}"
        );
    }
    std::fs::write(&segment, &bytes).expect("undamaged");
    open_store(&path).expect("the undamaged segment opens");
}

/// Damage anywhere but the last segment refuses to open, even one that looks torn.
#[tokio::test]
async fn damage_in_a_segment_before_the_last_refuses_to_open() {
    let (_dir, path) = scratch();
    let (_, segment, bytes, starts) = six_long_entries(&path).await;
    let cut = (starts[5] as u64 + 1).next_multiple_of(record::SECTOR_BYTES) as usize;
    let mut torn = bytes.clone();
    torn[cut..].fill(0);
    std::fs::write(&segment, &torn).expect("tear");
    let later = path.with_extension("wal").join(format!("{:020}.wal", 6));
    std::fs::write(&later, vec![0u8; wal::SEGMENT_BYTES as usize]).expect("later");
    let refused = open_store(&path).expect_err("a hole must not be served");
    assert!(
        refused.to_string().contains(&segment.display().to_string()),
        "{refused}"
    );
}

/// A log of entries 0..3, then one more record of `kind` holding `payload`, written into
/// the segment's zeroed room as the writer would have written it.
async fn three_entries_then_record(path: &std::path::Path, kind: u8, payload: &[u8]) {
    {
        let mut store = open_store(path).expect("open");
        let entries: Vec<Entry> = (0..3).map(|index| request_entry(1, index)).collect();
        store.blocking_append(entries).await.expect("append");
    }
    let segment = path.with_extension("wal").join(format!("{:020}.wal", 0));
    let mut bytes = std::fs::read(&segment).expect("read");
    let used = bytes.iter().rposition(|byte| *byte != 0).expect("records") + 1;
    let mut record = Vec::new();
    wal::push_record(&mut record, kind, payload).expect("record");
    bytes[used..used + record.len()].copy_from_slice(&record);
    std::fs::write(&segment, &bytes).expect("write");
}

/// A record whose checksum holds but whose entry does not continue the log is no torn
/// write: the store refuses to open instead of cutting the log there.
#[tokio::test]
async fn a_sound_record_out_of_order_refuses_to_open() {
    let (_dir, path) = scratch();
    let misplaced = encode(&request_entry(1, 7)).expect("encode");
    three_entries_then_record(&path, wal::KIND_ENTRY, &misplaced).await;
    let refused = open_store(&path).expect_err("entry 7 after entry 2");
    assert!(
        refused.to_string().contains("entry 7 where 3 belongs"),
        "{refused}"
    );
}

/// An entry written before entries carried state limits (record kind 0) still reads, as a
/// request with no limit: it applies as it did when it was written.
#[test]
fn a_v1_entry_reads_back_with_no_limit() {
    let commands = vec![Command::Reset { tenant: "t".into() }];
    let old = openraft::Entry::<wal::TypeConfigV1> {
        log_id: log_id(1, 3),
        payload: EntryPayload::Normal(wal::FleetRequestV1 {
            now_us: 42,
            commands: commands.clone(),
        }),
    };
    let bytes = encode_as(&old, "entry").expect("encode");
    let entry = wal::decode_entry(wal::KIND_ENTRY_V1, &bytes).expect("decodes");
    let want = FleetRequest {
        now_us: 42,
        limits: crate::state::StateLimits::UNLIMITED,
        commands: EncodedCommand::encode_all(&commands)
            .expect("encode")
            .into(),
    };
    assert_eq!(entry.log_id, log_id(1, 3));
    assert!(matches!(entry.payload, EntryPayload::Normal(got) if got == want));
    assert!(
        wal::decode_entry(wal::KIND_ENTRY, &bytes).is_err(),
        "a v1 record is not a current one"
    );
}

/// A log the previous version wrote (record kind 2: commands in line) replays after an
/// upgrade: its entries read back in the current form, each command the bytes the current
/// version would have written, so they apply as they did.
#[tokio::test]
async fn a_log_the_previous_version_wrote_replays_after_an_upgrade() {
    let (_dir, path) = scratch();
    let old = openraft::Entry::<wal::TypeConfigV2> {
        log_id: log_id(1, 3),
        payload: EntryPayload::Normal(wal::FleetRequestV2 {
            now_us: 3_000,
            limits: crate::state::StateLimits::UNLIMITED,
            commands: vec![Command::Reset {
                tenant: "tenant-a".into(),
            }],
        }),
    };
    let payload = encode(&old).expect("encode");
    three_entries_then_record(&path, wal::KIND_ENTRY_V2, &payload).await;
    let mut store = open_store(&path).expect("a kind-2 record replays");
    let want: Vec<Entry> = (0..4).map(|index| request_entry(1, index)).collect();
    assert_eq!(store.try_get_log_entries(..).await.expect("read"), want);
}

/// A record of a kind this build does not know (one a newer version wrote, after a
/// downgrade) refuses the log, naming the kind: it is never skipped.
#[tokio::test]
async fn a_record_of_an_unknown_kind_refuses_the_log_naming_it() {
    let (_dir, path) = scratch();
    let payload = encode(&request_entry(1, 3)).expect("encode");
    three_entries_then_record(&path, wal::KIND_ENTRY + 1, &payload).await;
    let refused = open_store(&path).expect_err("an unknown kind");
    let kind = wal::KIND_ENTRY + 1;
    assert!(
        refused.to_string().contains(&format!(
            "unknown kind {kind} (written by a newer version?)"
        )),
        "{refused}"
    );
}
