//! Backup and restore (`ankusa-fleet snapshot save|restore`): a fleet that lost every disk
//! comes back from one file with its committed claims and spent budgets, and `restore`
//! refuses a file or a data dir it cannot trust, writing nothing.

mod common;

use std::path::{Path, PathBuf};
use std::process::Output;

use ankusa_fleet::pb;
use common::*;

const TENANT: &str = "acme";
/// One hook token per hour, ten in the bucket: nothing refills while the test runs.
const HOUR_US: u64 = 3_600_000_000;
const BUDGET: u64 = 10;

fn budget_hit() -> pb::HitRequest {
    hit(vec![hooks("budgeted", HOUR_US, BUDGET * HOUR_US)], None)
}

/// Sends `n` budget charges through node `id`; returns the answers as (outcome, decider).
async fn charge(fleet: &Fleet, id: u64, n: u64) -> Vec<(Outcome, i32)> {
    let mut client = fleet.client(id).await;
    let mut answers = Vec::new();
    for _ in 0..n {
        answers.push(send_hit(&mut client, budget_hit()).await);
    }
    answers
}

fn fleet_allowed() -> (Outcome, i32) {
    (Outcome::Allowed, pb::DecidedBy::Fleet as i32)
}

/// Runs `ankusa-fleet snapshot ARGS...` to its end.
fn snapshot_command(args: &[&std::ffi::OsStr]) -> Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_ankusa-fleet"))
        .arg("snapshot")
        .args(args)
        .env("RUST_LIB_BACKTRACE", "0")
        .output()
        .expect("run ankusa-fleet snapshot")
}

fn text(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// `snapshot save --addr API_ADDR` through node `via` with the fleet's admin certificate
/// (the command finds the node's raft_addr in its Status).
fn save(fleet: &Fleet, via: u64, file: &Path) -> Output {
    let api_addr = fleet.api_addr(via);
    let (ca, cert, key) = (
        fleet.cert_file("ca.pem"),
        fleet.cert_file("admin.pem"),
        fleet.cert_file("admin.key"),
    );
    snapshot_command(&[
        "save".as_ref(),
        "--addr".as_ref(),
        api_addr.as_ref(),
        "--ca".as_ref(),
        ca.as_os_str(),
        "--cert".as_ref(),
        cert.as_os_str(),
        "--key".as_ref(),
        key.as_os_str(),
        file.as_os_str(),
    ])
}

fn restore(config: &Path, file: &Path) -> Output {
    snapshot_command(&[
        "restore".as_ref(),
        "--config".as_ref(),
        config.as_os_str(),
        file.as_os_str(),
    ])
}

/// Asserts that `restore --config config file` fails, says `expected`, and leaves no data
/// dir at `data_dir` when there was none before.
fn assert_refused(fleet: &Fleet, config: &Path, file: &Path, expected: &str, data_dir: &Path) {
    let existed = data_dir.exists();
    let output = restore(config, file);
    let said = text(&output);
    if output.status.success() || !said.contains(expected) {
        fleet.fail(&format!(
            "restore of {} with {}: expected a refusal saying `{expected}`, got {}: {said}",
            file.display(),
            config.display(),
            output.status
        ));
    }
    assert_eq!(
        data_dir.exists(),
        existed,
        "a refused restore wrote {}: {said}",
        data_dir.display()
    );
}

/// A copy of node 1's config under `name` with `node_id` set to `node_id` and its data dir
/// moved to `DIR/name.data`; returns the config's path and that data dir.
fn altered_config(fleet: &Fleet, name: &str, node_id: u64) -> (PathBuf, PathBuf) {
    let original = std::fs::read_to_string(&fleet.nodes[&1].config_path).expect("read config");
    let data_dir = fleet.dir.path().join(format!("{name}.data"));
    let altered = original
        .replacen("node_id = 1\n", &format!("node_id = {node_id}\n"), 1)
        .replacen(
            &format!("data_dir = {:?}", fleet.data_dir(1).display().to_string()),
            &format!("data_dir = {:?}", data_dir.display().to_string()),
            1,
        );
    assert_ne!(altered, original, "the config's node_id and data_dir lines");
    let path = fleet.dir.path().join(format!("{name}.toml"));
    std::fs::write(&path, altered).expect("write config");
    (path, data_dir)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_that_lost_every_disk_comes_back_from_a_backup() {
    init_tracing();
    let mut fleet = Fleet::start(3, "").await;
    let first_leader = fleet.wait_for_leader(&[1, 2, 3]).await;

    // With the term above 1, a restored fleet that started its terms over from 0 would
    // elect a leader whose entries sort below the ones the snapshot covers.
    tracing::info!("--- kill -9 leader {first_leader} and restart it: a new term");
    fleet.kill(first_leader);
    let others: Vec<u64> = (1..=3).filter(|id| *id != first_leader).collect();
    fleet.wait_for_leader(&others).await;
    fleet.restart(first_leader);
    let leader = fleet.wait_for_leader(&[1, 2, 3]).await;
    let follower = (1..=3).find(|id| *id != leader).expect("a follower");

    tracing::info!("--- commit claims through every node and spend 6 of 10 tokens");
    let committed = keys("before", 30);
    fleet.commit_claims(&[1, 2, 3], TENANT, &committed, 6).await;
    let spent = charge(&fleet, follower, 6).await;
    assert_eq!(spent, vec![fleet_allowed(); 6], "the first six charges");

    tracing::info!("--- save through follower {follower} (it forwards to the leader)");
    let file = fleet.dir.path().join("fleet.snapshot");
    let output = save(&fleet, follower, &file);
    let said = text(&output);
    if !output.status.success() || !said.contains("saved") {
        fleet.fail(&format!("snapshot save: {}: {said}", output.status));
    }
    tracing::info!(said = said.trim(), "saved");
    let mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(&file)
            .expect("the saved file")
            .permissions(),
    );
    assert_eq!(mode & 0o777, 0o600, "the backup's mode: {mode:o}");
    let saved_term = fleet.status(leader).await.expect("the leader answers").term;
    assert!(saved_term > 1, "the failover left term {saved_term}");

    tracing::info!("--- after the backup: more claims, which the file does not hold");
    let after = keys("after", 5);
    fleet.commit_claims(&[1, 2, 3], TENANT, &after, 5).await;

    tracing::info!("--- restore refuses what it cannot trust, and writes nothing");
    let bytes = std::fs::read(&file).expect("read the snapshot file");
    let mut flipped = bytes.clone();
    let last = flipped.len() - 1;
    flipped[last] ^= 0x01;
    let flipped_file = fleet.dir.path().join("flipped.snapshot");
    std::fs::write(&flipped_file, &flipped).expect("write");
    let cut_file = fleet.dir.path().join("cut.snapshot");
    std::fs::write(&cut_file, &bytes[..bytes.len() / 2]).expect("write");
    let (stranger, stranger_dir) = altered_config(&fleet, "stranger", 9);
    let (moved, moved_dir) = altered_config(&fleet, "moved", 2);
    let node1 = fleet.nodes[&1].config_path.clone();
    assert_refused(&fleet, &node1, &file, "is not empty", &fleet.data_dir(1));
    assert_refused(&fleet, &stranger, &flipped_file, "checksum", &stranger_dir);
    assert_refused(&fleet, &stranger, &cut_file, "cut.snapshot", &stranger_dir);
    assert_refused(&fleet, &stranger, &file, "node_id: 9", &stranger_dir);
    assert_refused(&fleet, &moved, &file, "api_addr", &moved_dir);

    tracing::info!("--- stop every node and wipe every data dir");
    for id in 1..=3 {
        fleet.stop(id).await;
        std::fs::remove_dir_all(fleet.data_dir(id)).expect("wipe the data dir");
    }

    tracing::info!("--- a data dir whose restore did not finish does not start");
    std::fs::create_dir_all(fleet.data_dir(1)).expect("data dir");
    std::fs::write(fleet.data_dir(1).join("restore-incomplete"), b"").expect("marker");
    match fleet.restart_watched(1).await {
        (Start::Exited { status, output }, _) => assert!(
            !status.success() && output.contains("restore-incomplete"),
            "{status}: {output}"
        ),
        (Start::Serving, _) => fleet.fail("node 1 started from a half-restored data dir"),
    }
    std::fs::remove_dir_all(fleet.data_dir(1)).expect("wipe the data dir");

    tracing::info!("--- restore every node from the file and start it");
    for id in 1..=3 {
        let config = fleet.nodes[&id].config_path.clone();
        let output = restore(&config, &file);
        if !output.status.success() {
            fleet.fail(&format!("restore node {id}: {}", text(&output)));
        }
        fleet.restart(id);
    }
    let new_leader = fleet.wait_for_leader(&[1, 2, 3]).await;
    let term = fleet
        .status(new_leader)
        .await
        .expect("the leader answers")
        .term;
    tracing::info!(new_leader, term, "the restored fleet elected a leader");
    assert!(
        term > saved_term,
        "the restored fleet leads in term {term}, not after the backup's {saved_term}"
    );

    tracing::info!("--- the committed claims are duplicates on every node");
    for id in 1..=3 {
        fleet.assert_duplicates(id, TENANT, &committed, 8).await;
    }

    tracing::info!("--- the spent budget is still spent: exactly 4 more pass");
    let rest = charge(&fleet, new_leader, 5).await;
    assert_eq!(
        rest[..4],
        vec![fleet_allowed(); 4],
        "the four tokens the backup left"
    );
    if !matches!(rest[4], (Outcome::RateLimited(_), d) if d == pb::DecidedBy::Fleet as i32) {
        fleet.fail(&format!("the eleventh charge answered {:?}", rest[4]));
    }

    tracing::info!("--- what came after the backup is not in it; the fleet commits anew");
    fleet.commit_claims(&[1, 2, 3], TENANT, &after, 5).await;
}
