//! Damaged data dirs (docs/storage.md, "Damaged files"): every kind of file a node keeps
//! is cut short and has bits flipped, and the node then either refuses to start (it exits
//! with status 1 and an error that names the file) or starts with its state right: every
//! claim committed before the damage still answers `duplicate`, and where it recovered
//! from a torn last append it logged so. Never a start with a state silently wrong, never
//! a crash.
//!
//! Each test builds real state through the API, stops the node cleanly and keeps a copy of
//! its data dir; every damage then starts the node from a fresh copy with that damage
//! done to one file. A single-node fleet answers from its own state alone, so nothing a
//! damaged node lost can come back from a peer before the checks.

mod common;

use std::path::{Path, PathBuf};

use ankusa_fleet::pb;
use common::*;

const TENANT: &str = "acme";
/// The log line of a WAL that cut a torn last append.
const WAL_TORN: &str = "log ends in a torn append or an unfinished truncation; zeroing it";
/// The log line of a claim journal that dropped a torn last append.
const JOURNAL_TORN: &str = "claim journal: dropped a torn last append";
/// The log line of a settle queue that dropped a torn last append.
const QUEUE_TORN: &str = "settle queue: dropped a torn last append";
/// The log line of a settle queue that lost a commit the fallback journal holds.
const REQUEUED: &str = "settle queue lost a queued commit";
/// Fallback calls wait this long for the fleet before answering locally.
const FALLBACK_TIMEOUT_MS: u32 = 300;

// ---- state ----

/// `n` keys starting with `prefix`, none a prefix of another (so a key found in a file's
/// bytes is that key).
fn named(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}-{i:03}")).collect()
}

fn node_scoped(mut request: pb::HitRequest) -> pb::HitRequest {
    request.rate_limit_scope = pb::Scope::Node as i32;
    request.dedupe_scope = pb::Scope::Node as i32;
    request
}

/// Claims and commits each key in node `id`'s own index (node scope).
async fn commit_node_claims(fleet: &Fleet, id: u64, keys: &[String]) {
    let mut client = fleet.client(id).await;
    for key in keys {
        let request = node_scoped(hit(vec![], Some(claim(TENANT, key, &hook_of(key)))));
        let got = send_hit(&mut client, request).await;
        if got != (Outcome::Allowed, pb::DecidedBy::Local as i32) {
            fleet.fail(&format!("node-scope hit {key}: {got:?}"));
        }
        let mut commit = settle(TENANT, key, &hook_of(key), pb::SettleOutcome::Commit);
        commit.dedupe_scope = pb::Scope::Node as i32;
        let settled = send_settle(&mut client, commit).await;
        if settled.status != pb::SettleStatus::Settled as i32 {
            fleet.fail(&format!("node-scope commit {key}: {settled:?}"));
        }
    }
}

/// A node-scope claim left pending: the journal's last record, which a torn append may lose.
async fn leave_node_claim_pending(fleet: &Fleet, id: u64, key: &str) {
    let mut client = fleet.client(id).await;
    let request = node_scoped(hit(vec![], Some(claim(TENANT, key, &hook_of(key)))));
    let got = send_hit(&mut client, request).await;
    if got.0 != Outcome::Allowed {
        fleet.fail(&format!("node-scope hit {key}: {got:?}"));
    }
}

/// Every key answers `duplicate{its hook}` from node `id`'s own index (a probe with
/// another hook, so a lost claim shows as `allowed`).
async fn assert_node_duplicates(fleet: &Fleet, id: u64, keys: &[String], what: &str) {
    let mut client = fleet.client(id).await;
    for key in keys {
        let request = node_scoped(hit(vec![], Some(claim(TENANT, key, "hook-probe"))));
        let got = send_hit(&mut client, request).await;
        if got
            != (
                Outcome::Duplicate(hook_of(key)),
                pb::DecidedBy::Local as i32,
            )
        {
            fleet.fail(&format!("{what}: node-scope {key} answered {got:?}"));
        }
    }
}

/// What a single node must still answer after a damaged start: `fleet` keys duplicate
/// from the fleet (itself), `node` keys from its own index.
struct Committed {
    fleet: Vec<String>,
    node: Vec<String>,
}

impl Committed {
    async fn assert_on(&self, fleet: &Fleet, id: u64, what: &str) {
        fleet.wait_for_leader(&[id]).await;
        fleet.assert_duplicates(id, TENANT, &self.fleet, 4).await;
        assert_node_duplicates(fleet, id, &self.node, what).await;
    }
}

/// A one-node fleet (`extra` in its config) with fleet claims and node-scope claims
/// committed, stopped cleanly; returns it, the pristine copy and what was committed.
async fn one_node(extra: &str, fleet_claims: usize) -> (Fleet, PathBuf, Committed) {
    init_tracing();
    let mut fleet = Fleet::start(1, extra).await;
    fleet.wait_for_leader(&[1]).await;
    let committed = Committed {
        fleet: named("fleet", fleet_claims),
        node: named("node", 8),
    };
    fleet.commit_claims(&[1], TENANT, &committed.fleet, 4).await;
    commit_node_claims(&fleet, 1, &committed.node).await;
    // The node journal's last record: a pending claim nothing depends on.
    leave_node_claim_pending(&fleet, 1, "node-pending").await;
    let pristine = keep_pristine(&mut fleet, 1).await;
    (fleet, pristine, committed)
}

/// Runs every damage on node 1 of a one-node fleet: refused, or started with `committed`
/// still duplicate (and, with `voted_in`, a term past it), then stopped.
async fn run_one_node(
    fleet: &mut Fleet,
    pristine: &Path,
    damages: Vec<Damage>,
    committed: &Committed,
    voted_in: Option<u64>,
) {
    for damage in damages {
        if start_damaged(fleet, 1, pristine, &damage).await.is_some() {
            committed.assert_on(fleet, 1, &damage.what).await;
            if let Some(term) = voted_in {
                let now = fleet.status(1).await.map(|status| status.term);
                if now.is_none_or(|now| now <= term) {
                    fleet.fail(&format!(
                        "{}: term {now:?} after a start from a vote of term {term}",
                        damage.what
                    ));
                }
            }
            fleet.stop(1).await;
        }
    }
}

// ---- the log's WAL segments ----

/// The newest segment of node `id`'s WAL, relative to the data dir.
fn last_segment(pristine: &Path) -> PathBuf {
    let mut segments: Vec<String> = std::fs::read_dir(pristine.join("raft-log.wal"))
        .expect("the WAL")
        .filter_map(Result::ok)
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .filter(|name| name.ends_with(".wal"))
        .collect();
    segments.sort();
    let last = segments.pop().expect("a segment");
    Path::new("raft-log.wal").join(last)
}

/// A cut anywhere and a flipped bit in any record of the last segment refuse (a segment is
/// made full size, and a flipped bit is no torn write); a torn append after the last record
/// (a write cut at a sector boundary, zeros after it), and stray data past a whole zero
/// header, are cut, logged, and nothing committed is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_wal_segment_refuses_and_a_torn_append_is_cut() {
    let (mut fleet, pristine, committed) = one_node("", 20).await;
    let segment = last_segment(&pristine);
    let bytes = pristine_bytes(&pristine, &segment);
    let found = records(&bytes);
    assert!(found.len() > 20, "{} records", found.len());
    let (last_start, used) = *found.last().expect("records");
    let (middle_start, middle_end) = found[found.len() / 2];
    // A torn append: its header and the data up to the next sector boundary written, the
    // rest of it never reached the disk (the segment's zeros).
    let sector_end = (used + 9).next_multiple_of(512);
    let torn = move |b: &mut Vec<u8>| {
        b[used..used + 4].copy_from_slice(&4000u32.to_le_bytes());
        b[used + 4..used + 8].copy_from_slice(&0x5eed_f00du32.to_le_bytes());
        b[used + 8..sector_end].fill(0xab);
    };
    let damages = vec![
        Damage::cut("inside the last record", &segment, used - 3, Expect::Refuse),
        Damage::cut("right after the records", &segment, used, Expect::Refuse),
        Damage::cut(
            "in the zeros after the records",
            &segment,
            used + 4096,
            Expect::Refuse,
        ),
        Damage::cut(
            "between records in the middle",
            &segment,
            middle_end,
            Expect::Refuse,
        ),
        Damage::flip(
            "a record in the middle",
            &segment,
            (middle_start + middle_end) / 2,
            Expect::Refuse,
        ),
        Damage::flip(
            "the last record",
            &segment,
            (last_start + used) / 2,
            Expect::Refuse,
        ),
        // Past a whole zero header nothing was acknowledged: zeroed like a torn tail.
        Damage::flip(
            "the zeros after the records",
            &segment,
            used + 700,
            Expect::Recover(WAL_TORN),
        ),
        Damage::new(
            "a torn append after the records",
            &segment,
            Expect::Recover(WAL_TORN),
            torn,
        ),
    ];
    run_one_node(&mut fleet, &pristine, damages, &committed, None).await;
}

// ---- the vote store ----

/// A cut vote store refuses (redb panics on one, or finds it fresh, and then the vote is
/// older than the log); a flipped bit either fails redb's integrity check or lands where
/// nothing is read; a flipped choice between redb's two commit slots reads the same vote.
/// A start is right only with every committed claim and a term past every term the node
/// voted in before (a vote gone back could vote twice in a term).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_vote_store_refuses_or_reads_the_vote_it_saved() {
    init_tracing();
    let mut fleet = Fleet::start(1, "").await;
    fleet.wait_for_leader(&[1]).await;
    let committed = Committed {
        fleet: named("fleet", 12),
        node: named("node", 4),
    };
    fleet.commit_claims(&[1], TENANT, &committed.fleet, 4).await;
    commit_node_claims(&fleet, 1, &committed.node).await;
    let term = fleet.status(1).await.expect("status").term;
    let pristine = keep_pristine(&mut fleet, 1).await;
    let file = Path::new("raft-log.redb");
    let bytes = pristine_bytes(&pristine, file);
    let len = bytes.len();
    let mut damages = vec![
        Damage::cut("emptied", file, 0, Expect::Refuse),
        Damage::cut("cut in half", file, len / 2, Expect::Refuse),
        Damage::cut("cut by a byte", file, len - 1, Expect::Refuse),
        Damage::new(
            "the commit slot choice flipped",
            file,
            Expect::Either,
            |b| b[9] ^= 0x01,
        ),
        Damage::flip("the middle of the file", file, len / 2, Expect::Either),
    ];
    // The keys' pages: a flipped bit there is in the live data or in a stale copy.
    for at in find_all(&bytes, b"vote").into_iter().take(3) {
        damages.push(Damage::flip(
            "beside the vote's key",
            file,
            at + 6,
            Expect::Either,
        ));
    }
    run_one_node(&mut fleet, &pristine, damages, &committed, Some(term)).await;
}

// ---- the snapshot (its file in snapshot/, its record in state.sled) ----

/// Snapshots every 10 entries, the log purged right up to each: a snapshot lost is then a
/// hole in the log.
const SNAPSHOTS: &str = "snapshot_logs_since_last = 10\nsnapshot_log_percent = 0\n\
                         snapshot_logs_kept = 0\nbatch_commands_max = 1";

/// sled recovers a prefix of its writes from a damaged `state.sled/db`: the snapshot's
/// record may be gone (the log no longer reaches back: refused) or an older one (the log
/// replays the rest, if that one's file is still there: right); a damaged `conf` refuses.
/// The snapshot's file cut short or with a bit flipped refuses, naming it (a missing file:
/// the unit tests of `raft::snapshot::store`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_snapshot_store_refuses_or_resumes_with_every_claim() {
    init_tracing();
    let mut fleet = Fleet::start(1, SNAPSHOTS).await;
    fleet.wait_for_leader(&[1]).await;
    let committed = Committed {
        fleet: named("fleet", 30),
        node: named("node", 4),
    };
    fleet
        .commit_claims(&[1], TENANT, &committed.fleet[..25], 4)
        .await;
    fleet
        .wait_for("a snapshot was built", || async {
            (!fleet.snapshots_built(1).is_empty()).then_some(())
        })
        .await;
    // And some claims only the log holds.
    fleet
        .commit_claims(&[1], TENANT, &committed.fleet[25..], 1)
        .await;
    commit_node_claims(&fleet, 1, &committed.node).await;
    let pristine = keep_pristine(&mut fleet, 1).await;
    let db = Path::new("state.sled/db");
    let bytes = pristine_bytes(&pristine, db);
    let len = bytes.len();
    let mut damages = vec![
        Damage::cut("state.sled/db emptied", db, 0, Expect::Refuse),
        Damage::cut(
            "state.sled/db in its first quarter",
            db,
            len / 4,
            Expect::Either,
        ),
        Damage::cut("state.sled/db in half", db, len / 2, Expect::Either),
        Damage::cut("state.sled/db near its end", db, len - 16, Expect::Either),
        Damage::flip("state.sled/db in its middle", db, len / 2, Expect::Either),
        Damage::flip("state.sled/db near its end", db, len - 40, Expect::Either),
        Damage::flip(
            "state.sled/conf",
            Path::new("state.sled/conf"),
            20,
            Expect::Refuse,
        ),
    ];
    let files: Vec<PathBuf> = std::fs::read_dir(pristine.join("snapshot"))
        .expect("the snapshot directory")
        .map(|entry| Path::new("snapshot").join(entry.expect("entry").file_name()))
        .collect();
    let [file] = &files[..] else {
        panic!("one snapshot file, found {files:?}");
    };
    let file_len = pristine_bytes(&pristine, file).len();
    assert_eq!(
        find_all(&pristine_bytes(&pristine, file), b"AKFS"),
        [0],
        "the file is one snapshot"
    );
    damages.extend([
        Damage::cut("the snapshot file emptied", file, 0, Expect::Refuse),
        Damage::cut(
            "the snapshot file in half",
            file,
            file_len / 2,
            Expect::Refuse,
        ),
        Damage::flip("the snapshot file's header", file, 10, Expect::Refuse),
        Damage::flip(
            "the snapshot file's body",
            file,
            file_len - 8,
            Expect::Refuse,
        ),
    ]);
    run_one_node(&mut fleet, &pristine, damages, &committed, None).await;
}

// ---- the node-scope claim journal ----

/// A journal cut anywhere reads as a torn last append: what follows the cut is dropped
/// and logged, everything before it is kept. A flipped bit is no torn append: refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_node_claim_journal_drops_only_a_torn_append_and_refuses_a_flipped_bit() {
    let (mut fleet, pristine, committed) = one_node("", 4).await;
    let journal = Path::new("node-claims.journal");
    let bytes = pristine_bytes(&pristine, journal);
    let found = records(&bytes);
    assert_eq!(records(&bytes).last().map(|r| r.1), Some(bytes.len()));
    let (last_start, end) = *found.last().expect("records");
    let (middle_start, middle_end) = found[found.len() / 2];
    let middle_cut = (middle_start + middle_end) / 2;
    // The node keys whose commit record lies wholly before the middle cut: a key's last
    // record is its commit.
    let before_cut: Vec<String> = committed
        .node
        .iter()
        .filter(|key| {
            found
                .iter()
                .rfind(|(start, end)| !find_all(&bytes[*start..*end], key.as_bytes()).is_empty())
                .is_some_and(|(_, end)| *end <= middle_cut)
        })
        .cloned()
        .collect();
    assert!(
        !before_cut.is_empty() && before_cut.len() < committed.node.len(),
        "the middle cut falls between commits: {before_cut:?}"
    );
    let torn = Expect::Recover(JOURNAL_TORN);
    let last_record = bytes[last_start..end].to_vec();
    let damages = vec![
        Damage::cut(
            "inside the last record's header",
            journal,
            last_start + 3,
            torn,
        ),
        Damage::cut("inside the last record's body", journal, end - 2, torn),
        Damage::new("zeros after the records", journal, torn, |b| {
            b.extend_from_slice(&[0; 4096])
        }),
        Damage::new("a torn append after the records", journal, torn, move |b| {
            b.extend_from_slice(&last_record[..last_record.len() / 2])
        }),
        Damage::flip(
            "a record in the middle",
            journal,
            (middle_start + middle_end) / 2,
            Expect::Refuse,
        ),
        Damage::flip("the last record", journal, end - 3, Expect::Refuse),
        Damage::flip(
            "the last record's length",
            journal,
            last_start + 1,
            Expect::Refuse,
        ),
    ];
    run_one_node(&mut fleet, &pristine, damages, &committed, None).await;

    // A cut in the middle: the claims after it are gone (nothing in the file can tell a
    // cut of synced records from a torn append), every one before it is kept.
    let cut = Damage::cut("inside a record in the middle", journal, middle_cut, torn);
    let log = start_damaged(&mut fleet, 1, &pristine, &cut)
        .await
        .expect("started");
    fleet.wait_for_leader(&[1]).await;
    fleet
        .assert_duplicates(1, TENANT, &committed.fleet, 4)
        .await;
    assert_node_duplicates(&fleet, 1, &before_cut, &cut.what).await;
    assert!(log.contains(&format!("offset={middle_start}")), "{log}");
    fleet.stop(1).await;
}

// ---- the fallback: its claim journal and the settle queue ----

/// A three-node fleet whose node 1, cut off (nodes 2 and 3 stopped), claimed and queued
/// commits locally; every node stopped cleanly, their data dirs kept.
struct CutOff {
    fleet: Fleet,
    pristine: Vec<PathBuf>,
    /// Committed through the fleet before the cut.
    before: Vec<String>,
    /// Claimed locally by node 1 and committed: answered `queued`.
    queued: Vec<String>,
}

fn local_hit(key: &str, hook_id: &str) -> pb::HitRequest {
    pb::HitRequest {
        timeout_ms: FALLBACK_TIMEOUT_MS,
        ..hit(vec![], Some(claim(TENANT, key, hook_id)))
    }
}

async fn cut_off() -> CutOff {
    init_tracing();
    let mut fleet = Fleet::start(3, "").await;
    fleet.wait_for_leader(&[1, 2, 3]).await;
    let before = named("before", 6);
    fleet.commit_claims(&[1, 2, 3], TENANT, &before, 3).await;
    fleet.wait_for_applied_in_step(&[1, 2, 3]).await;
    fleet.stop(2).await;
    fleet.stop(3).await;
    let queued = named("queued", 5);
    let mut client = fleet.client(1).await;
    for key in &queued {
        let (got, decided_by) = send_hit(&mut client, local_hit(key, &hook_of(key))).await;
        if (got.clone(), decided_by) != (Outcome::Allowed, pb::DecidedBy::Local as i32) {
            fleet.fail(&format!("local hit {key}: {got:?} {decided_by}"));
        }
        let mut commit = settle(TENANT, key, &hook_of(key), pb::SettleOutcome::Commit);
        commit.timeout_ms = FALLBACK_TIMEOUT_MS;
        let settled = send_settle(&mut client, commit).await;
        if settled.status != pb::SettleStatus::Queued as i32 {
            fleet.fail(&format!("local commit {key}: {settled:?}"));
        }
    }
    // The fallback journal's last record: a pending claim nothing depends on.
    let (got, _) = send_hit(&mut client, local_hit("queued-pending", "hook-pending")).await;
    if got != Outcome::Allowed {
        fleet.fail(&format!("local hit queued-pending: {got:?}"));
    }
    drop(client);
    let mut pristine = vec![keep_pristine(&mut fleet, 1).await];
    for id in [2, 3] {
        let copy = fleet.dir.path().join(format!("node{id}.pristine"));
        copy_dir(&fleet.data_dir(id), &copy);
        pristine.push(copy);
    }
    CutOff {
        fleet,
        pristine,
        before,
        queued,
    }
}

impl CutOff {
    /// Every damage to node 1: refused, or node 1 alone answers `local_duplicates` from its
    /// fallback index, and once nodes 2 and 3 are back and node 1 reconciled, the fleet
    /// answers every claim committed before the cut and every queued commit `duplicate`.
    async fn run(&mut self, damages: Vec<Damage>, local_duplicates: &[String]) {
        for damage in damages {
            let fleet = &mut self.fleet;
            for id in [2, 3] {
                restore(fleet, id, &self.pristine[id as usize - 1]);
            }
            if start_damaged(fleet, 1, &self.pristine[0], &damage)
                .await
                .is_none()
            {
                continue;
            }
            let mut client = fleet.client(1).await;
            for key in local_duplicates {
                let (got, decided_by) = send_hit(&mut client, local_hit(key, "hook-probe")).await;
                if got != Outcome::Duplicate(hook_of(key)) {
                    fleet.fail(&format!(
                        "{}: node 1 alone answered {key} {got:?} ({decided_by})",
                        damage.what
                    ));
                }
            }
            fleet.restart(2);
            fleet.restart(3);
            fleet.wait_for_leader(&[1, 2, 3]).await;
            fleet
                .wait_for(&format!("{}: node 1 reconciled", damage.what), || async {
                    let status = fleet.status(1).await?;
                    (status.leader_id != 0 && !status.degraded).then_some(())
                })
                .await;
            fleet.assert_duplicates(2, TENANT, &self.before, 3).await;
            fleet.assert_duplicates(2, TENANT, &self.queued, 3).await;
            for id in [1, 2, 3] {
                fleet.stop(id).await;
            }
        }
    }
}

/// The settle queue's journal like the claim journals: a torn last append is dropped, and
/// the commit it held is queued again from the fallback journal, as is every commit of a
/// queue emptied; a flipped bit refuses. After reconciliation every queued commit is a
/// duplicate in the fleet.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_settle_queue_refuses_or_loses_no_queued_commit() {
    let mut cut = cut_off().await;
    let queue = Path::new("settle-queue.journal");
    let bytes = pristine_bytes(&cut.pristine[0], queue);
    let found = records(&bytes);
    assert_eq!(found.len(), cut.queued.len(), "a record per queued settle");
    let (last_start, end) = *found.last().expect("records");
    assert_eq!(end, bytes.len(), "the records fill the file");
    let (middle_start, middle_end) = found[found.len() / 2];
    let torn = Expect::Recover(QUEUE_TORN);
    let damages = vec![
        Damage::cut("settle queue emptied", queue, 0, Expect::Recover(REQUEUED)),
        Damage::cut("inside the last queued settle", queue, end - 2, torn),
        Damage::new("zeros after the queued settles", queue, torn, |b| {
            b.extend_from_slice(&[0; 4096])
        }),
        Damage::flip(
            "a queued settle in the middle",
            queue,
            (middle_start + middle_end) / 2,
            Expect::Refuse,
        ),
        Damage::flip(
            "the last queued settle",
            queue,
            last_start + 12,
            Expect::Refuse,
        ),
    ];
    let local = cut.queued.clone();
    cut.run(damages, &local).await;
}

/// The fallback journal like the node's: a torn last append is dropped (the queued
/// commits then still answer locally and reach the fleet), a flipped bit refuses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_fallback_journal_drops_only_a_torn_append_and_refuses_a_flipped_bit() {
    let mut cut = cut_off().await;
    let journal = Path::new("fallback-claims.journal");
    let bytes = pristine_bytes(&cut.pristine[0], journal);
    let found = records(&bytes);
    assert_eq!(found.last().map(|r| r.1), Some(bytes.len()));
    let (last_start, end) = *found.last().expect("records");
    let (middle_start, middle_end) = found[found.len() / 2];
    let torn = Expect::Recover(JOURNAL_TORN);
    let damages = vec![
        Damage::cut("inside the last record", journal, end - 2, torn),
        Damage::new("zeros after the records", journal, torn, |b| {
            b.extend_from_slice(&[0; 4096])
        }),
        Damage::flip(
            "a record in the middle",
            journal,
            (middle_start + middle_end) / 2,
            Expect::Refuse,
        ),
        Damage::flip("the last record", journal, last_start + 12, Expect::Refuse),
    ];
    let local = cut.queued.clone();
    cut.run(damages, &local).await;
}
