//! The nemesis as CI runs it (docs/reliability.md): short seeded runs against fleets of
//! its own (child processes of the `ankusa-fleet` binary beside `ankusa-fleet-nemesis`, which
//! a root-level `cargo test --all-targets` builds with the `planted-bugs` feature: this
//! package's dev-dependency turns it on). A clean fleet shows no anomaly, and
//! each planted bug makes the nemesis report anomalies and exit non-zero; the report ends
//! with the one summary line `nemesis seed S: N ops, F faults, A anomalies`.

use std::path::PathBuf;
use std::process::Command;

/// What a call may take beyond its timeout here: a debug build on a shared 2-core machine,
/// with other tests' fleets running beside it, stalls for a few hundred milliseconds now
/// and then (docs/reliability.md): here the deadline check only catches calls that hang.
const CI_DEADLINE_SLACK_MS: &str = "1000";

/// A seed whose 30 s plan holds every kind: lost writes (the leader's, then the
/// followers', so nodes cut off queue settles), a split, a kill of the leader, a skew within
/// the bound, the leader's clock set 90 minutes forward, a pause of the leader and a
/// membership change.
const SEED: &str = "162";

/// The `ankusa-fleet` binary the nemesis launches: cargo puts it beside the nemesis's own.
/// It must carry the planted bugs (`--version` says so) and be newer than every source
/// file of the node: cargo rebuilds it for a root-level `cargo test`, not for this package's
/// tests alone, which would otherwise run an old node without a word.
fn fleet_bin() -> PathBuf {
    let bin =
        PathBuf::from(env!("CARGO_BIN_EXE_ankusa-fleet-nemesis")).with_file_name("ankusa-fleet");
    let build = "a root-level `cargo test --all-targets` builds it; alone, `cargo build --bin \
                 ankusa-fleet --features planted-bugs` first";
    assert!(bin.is_file(), "no {} ({build})", bin.display());
    let version = Command::new(&bin)
        .arg("--version")
        .output()
        .expect("run ankusa-fleet --version");
    let version = String::from_utf8_lossy(&version.stdout);
    assert!(
        version.contains("+planted-bugs"),
        "{} has no planted bugs ({}): {build}",
        bin.display(),
        version.trim()
    );
    let built = modified(&bin);
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let newest = [
        newest_source(&root.join("src"), "rs"),
        newest_source(&root.join("client").join("src"), "rs"),
        newest_source(&root.join("proto"), "proto"),
        modified(&root.join("build.rs")),
    ]
    .into_iter()
    .max()
    .expect("four times");
    assert!(
        built >= newest,
        "{} is older than the node's sources: {build}",
        bin.display()
    );
    bin
}

fn modified(path: &std::path::Path) -> std::time::SystemTime {
    std::fs::metadata(path)
        .and_then(|metadata| metadata.modified())
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The newest modification time of the files under `dir` whose names end in `.{extension}`
/// (what cargo compiles into the node; an editor's scratch file is not), following no link.
fn newest_source(dir: &std::path::Path, extension: &str) -> std::time::SystemTime {
    let mut newest = std::time::SystemTime::UNIX_EPOCH;
    for entry in std::fs::read_dir(dir).expect("read the node's sources") {
        let path = entry.expect("a dir entry").path();
        let kind = std::fs::symlink_metadata(&path)
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
            .file_type();
        if kind.is_dir() {
            newest = newest.max(newest_source(&path, extension));
        } else if kind.is_file() && path.extension().is_some_and(|e| e == extension) {
            newest = newest.max(modified(&path));
        }
    }
    newest
}

/// A binary that answers `--version` as a node built without the planted bugs does: the
/// nemesis refuses to plant one with it, at once and in one line.
#[test]
fn a_planted_bug_on_a_node_without_them_is_refused_at_once() {
    let dir = std::env::temp_dir().join(format!("nemesis-no-bugs-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temp dir");
    let fake = dir.join("ankusa-fleet");
    std::fs::write(&fake, "#!/bin/sh\necho 'ankusa-fleet 0.1.0'\n").expect("write the fake node");
    let mut permissions = std::fs::metadata(&fake)
        .expect("its metadata")
        .permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut permissions, 0o755);
    std::fs::set_permissions(&fake, permissions).expect("make it executable");
    let output = Command::new(env!("CARGO_BIN_EXE_ankusa-fleet-nemesis"))
        .arg("--bin")
        .arg(&fake)
        .args(["--seed", "1", "--plant-bug", "one_charge_over"])
        .output()
        .expect("run the nemesis");
    let _ = std::fs::remove_dir_all(&dir);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("--plant-bug needs an ankusa-fleet built with the `planted-bugs` feature")
            && stderr.contains("(ankusa-fleet 0.1.0)")
            && !stderr.contains("  ")
            && stderr.trim_end().lines().count() == 1,
        "one clean line: {stderr}"
    );
}

struct Run {
    success: bool,
    report: String,
    /// The summary line's ops, faults and anomalies.
    counts: (u64, u64, u64),
}

/// Runs the nemesis for `seed` and `duration_s`, with every fault kind or only `faults`
/// (comma-separated), and with `planted_bug` planted in every node.
fn nemesis(seed: &str, duration_s: &str, faults: Option<&str>, planted_bug: Option<&str>) -> Run {
    nemesis_with(seed, duration_s, faults, planted_bug, &[])
}

/// [`nemesis`], with `more` arguments.
fn nemesis_with(
    seed: &str,
    duration_s: &str,
    faults: Option<&str>,
    planted_bug: Option<&str>,
    more: &[&str],
) -> Run {
    let mut command = Command::new(env!("CARGO_BIN_EXE_ankusa-fleet-nemesis"));
    command
        .arg("--bin")
        .arg(fleet_bin())
        .args(["--seed", seed, "--duration-s", duration_s])
        .args(["--deadline-slack-ms", CI_DEADLINE_SLACK_MS])
        .args(more);
    if let Some(kinds) = faults {
        command.args(["--faults", kinds]);
    }
    if let Some(bug) = planted_bug {
        command.args(["--plant-bug", bug]);
    }
    let output = command.output().expect("run the nemesis");
    let report = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    let last = String::from_utf8_lossy(&output.stdout)
        .lines()
        .last()
        .unwrap_or_default()
        .to_owned();
    let words: Vec<&str> = last.split_whitespace().collect();
    assert_eq!(words.len(), 9, "the summary line: {report}");
    assert_eq!(
        (words[0], words[1], words[2], words[4], words[6], words[8]),
        (
            "nemesis",
            "seed",
            format!("{seed}:").as_str(),
            "ops,",
            "faults,",
            "anomalies"
        ),
        "{report}"
    );
    let number = |at: usize| -> u64 { words[at].parse().expect("a count") };
    // A failing run keeps its fleet's dir for reading; the test has read what it needs.
    if let Some(dir) = report
        .lines()
        .find_map(|line| line.split(", fleet in ").nth(1))
    {
        let _ = std::fs::remove_dir_all(dir.trim());
    }
    Run {
        success: output.status.success(),
        counts: (number(3), number(5), number(7)),
        report,
    }
}

/// How many anomalies the report counts for `checker`.
fn anomalies_of(report: &str, checker: &str) -> u64 {
    let line = report
        .lines()
        .find(|line| line.starts_with("anomalies: "))
        .expect("the anomalies line");
    let at = line
        .find(&format!("\"{checker}\": "))
        .unwrap_or_else(|| panic!("{checker} in {line}"));
    line[at + checker.len() + 4..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect::<String>()
        .parse()
        .expect("a count")
}

/// Every checker must find nothing, the bucket search included (docs/reliability.md,
/// round 14, settled the refusals it could not explain in round 13).
#[test]
fn a_ci_sized_nemesis_run_finds_no_anomaly() {
    let run = nemesis(SEED, "30", None, None);
    let (ops, faults, anomalies) = run.counts;
    assert!(ops > 500, "a workload that did something: {}", run.report);
    assert!(faults >= 3, "faults that happened: {}", run.report);
    assert_eq!(anomalies, 0, "{}", run.report);
    assert!(run.success, "{}", run.report);
}

/// A node that answers `duplicate` for a pending claim lets a webhook be dropped: the
/// nemesis must say so and fail. The bug shows only where claims collide, so each node has
/// 8 clients: with the default 2 a loaded CI run saw no `pending` answer in 20 s.
#[test]
fn a_planted_duplicate_for_a_pending_claim_is_reported() {
    let run = nemesis_with(
        "11",
        "20",
        None,
        Some("duplicate_for_pending"),
        &["--clients", "8"],
    );
    assert!(!run.success, "{}", run.report);
    assert!(run.counts.2 > 0, "{}", run.report);
    assert!(
        anomalies_of(&run.report, "duplicate without a commit") > 0,
        "{}",
        run.report
    );
}

/// A node that applies entries with its own clock instead of the leader's stamp drifts
/// from the others: the healed replicas' state digests differ at one log index.
#[test]
fn a_planted_own_clock_is_reported_by_the_convergence_checker() {
    let run = nemesis("4", "15", Some("partition"), Some("own_clock"));
    assert!(!run.success, "{}", run.report);
    assert!(
        anomalies_of(&run.report, "convergence") > 0,
        "{}",
        run.report
    );
}

/// Followers that acknowledge appends before their fsync let the leader commit what a
/// majority then loses: the `lost` fault on the followers shows it. The same seed and
/// schedule without the bug is clean, so it is the bug the checkers see.
#[test]
fn a_planted_early_follower_ack_is_reported_and_the_same_run_without_it_is_clean() {
    let bugged = nemesis("3", "20", Some("lost"), Some("early_follower_ack"));
    assert!(!bugged.success, "{}", bugged.report);
    assert!(
        bugged
            .report
            .lines()
            .any(|line| line.contains("Lost { followers: true }")),
        "the schedule loses the followers' writes: {}",
        bugged.report
    );
    let lost_or_diverged = anomalies_of(&bugged.report, "committed claim lost")
        + anomalies_of(&bugged.report, "linearizability")
        + anomalies_of(&bugged.report, "convergence");
    assert!(lost_or_diverged > 0, "{}", bugged.report);

    let clean = nemesis("3", "20", Some("lost"), None);
    assert!(clean.success, "{}", clean.report);
    assert_eq!(clean.counts.2, 0, "{}", clean.report);
}

/// A node that answers a settle `queued` but never writes it down loses the commit when
/// its own proposal dies with the partition: on a key only that node's clients use, the
/// final probe finds no commit where the checker requires one. The same run without the
/// bug is clean.
#[test]
fn a_planted_forgotten_queued_settle_is_reported_and_the_same_run_without_it_is_clean() {
    let bugged = nemesis("5", "20", Some("partition"), Some("forget_queued_settle"));
    assert!(!bugged.success, "{}", bugged.report);
    assert!(
        anomalies_of(&bugged.report, "linearizability") > 0,
        "{}",
        bugged.report
    );

    let clean = nemesis("5", "20", Some("partition"), None);
    assert!(clean.success, "{}", clean.report);
    assert_eq!(clean.counts.2, 0, "{}", clean.report);
}

/// A fleet that grants one charge more than a bucket holds stays within the budget
/// checker's margin (it allows one more for where a stretch's ends fall), but no order
/// and stamps of the charges explain it: the bucket search reports it. The extra charge
/// shows only in a bucket driven to its limit: 4 clients a node send charges faster than
/// the buckets refill even on a loaded machine (with 2, about as fast, and a slow run
/// left every bucket short of its limit and the bug unseen).
#[test]
fn a_planted_extra_charge_is_reported_by_the_bucket_search() {
    let run = nemesis_with(
        "11",
        "20",
        Some("pause"),
        Some("one_charge_over"),
        &["--clients", "4"],
    );
    assert!(!run.success, "{}", run.report);
    assert!(
        anomalies_of(&run.report, "bucket linearizability") > 0,
        "{}",
        run.report
    );
}

/// A fleet whose time follows its leader's wall clock unbounded (as before
/// `max_clock_offset_ms`) freezes every bucket once a leader's clock runs 90 minutes ahead:
/// the checkers allow a clock set off no more than the bound, so they report it. The same
/// run with bounded time is clean: buckets refill at real rate through the skewed leader,
/// and no pending claim ends early. Seed 13's clock faults include one on the leader, set
/// forward.
#[test]
fn a_planted_unbounded_clock_is_reported_and_the_same_run_without_it_is_clean() {
    let bugged = nemesis("13", "20", Some("clock"), Some("unbounded_clock"));
    assert!(!bugged.success, "{}", bugged.report);
    assert!(
        bugged
            .report
            .lines()
            .any(|line| line.contains("Clock { target: Leader, forward: true }")),
        "the schedule sets the leader's clock forward: {}",
        bugged.report
    );
    let bucket_or_budget = anomalies_of(&bugged.report, "bucket linearizability")
        + anomalies_of(&bugged.report, "budget");
    assert!(bucket_or_budget > 0, "{}", bugged.report);

    let clean = nemesis("13", "20", Some("clock"), None);
    assert!(clean.success, "{}", clean.report);
    assert_eq!(clean.counts.2, 0, "{}", clean.report);
}

/// The claims of each node's clients in `HitBatch` frames (`--frames`): the frames really
/// carried several claims, a run is as clean as with unary calls, and a planted duplicate
/// for a pending claim is still reported.
#[test]
fn claims_in_frames_run_clean_and_a_planted_duplicate_is_still_reported() {
    let run = nemesis_with(SEED, "20", None, None, &["--frames", "--clients", "8"]);
    let (ops, _, anomalies) = run.counts;
    assert!(ops > 300, "a workload that did something: {}", run.report);
    let frames_line = run
        .report
        .lines()
        .find(|line| line.starts_with("frames: "))
        .unwrap_or_else(|| panic!("the frames line: {}", run.report));
    let words: Vec<&str> = frames_line.split_whitespace().collect();
    let (claims, frames, largest): (u64, u64, u64) = (
        words[1].parse().expect("claims"),
        words[4].parse().expect("frames"),
        words[9].parse().expect("largest"),
    );
    assert!(
        frames > 0 && claims > frames && largest > 1,
        "claims shared frames: {frames_line}"
    );
    assert_eq!(anomalies, 0, "{}", run.report);

    let bugged = nemesis_with(
        "11",
        "20",
        None,
        Some("duplicate_for_pending"),
        &["--frames", "--clients", "8"],
    );
    assert!(!bugged.success, "{}", bugged.report);
    assert!(
        anomalies_of(&bugged.report, "duplicate without a commit") > 0,
        "{}",
        bugged.report
    );
}

/// `ankusa-fleet nemesis …` still works: it runs `ankusa-fleet-nemesis` (beside it) with the
/// same arguments, whose usage then answers.
#[test]
fn ankusa_fleet_nemesis_passes_its_arguments_through() {
    let output = Command::new(fleet_bin())
        .args(["nemesis", "--help"])
        .output()
        .expect("run ankusa-fleet nemesis --help");
    let usage = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{usage}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        usage.contains("ankusa-fleet-nemesis")
            && usage.contains("--seed")
            && usage.contains("--bin"),
        "the nemesis's usage: {usage}"
    );
    // Its exit code comes back too: a usage error is clap's 2.
    let refused = Command::new(fleet_bin())
        .args(["nemesis", "--seed", "1", "--nodes", "9"])
        .output()
        .expect("run ankusa-fleet nemesis with too many nodes");
    assert_eq!(
        refused.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
}
