//! `ankusa-fleet-nemesis`: start a fleet of its own, run a seeded workload under a seeded
//! fault schedule, check the history (`ankusa_fleet_nemesis`); exits 0 if and only if no
//! anomaly was found (docs/reliability.md). `ankusa-fleet nemesis …` runs this binary with
//! the same arguments.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;

use ankusa_fleet_nemesis as nemesis;

/// The binary's arguments.
#[derive(Debug, Parser)]
#[command(
    version,
    about = "Start a fleet of its own, run a seeded workload under a seeded fault schedule, \
             check the history; exits 0 if and only if no anomaly was found \
             (docs/reliability.md)"
)]
struct NemesisArgs {
    /// The `ankusa-fleet` binary the nodes run (default: the one beside this executable).
    #[arg(long)]
    bin: Option<PathBuf>,
    #[arg(long)]
    seed: u64,
    #[arg(long, default_value_t = 60)]
    duration_s: u64,
    #[arg(long, default_value_t = 3, value_parser = clap::builder::RangedU64ValueParser::<u64>::new().range(3..=5))]
    nodes: u64,
    /// Clients per node.
    #[arg(long, default_value_t = 2)]
    clients: usize,
    /// What a call may take beyond its timeout_ms before the deadline checker objects.
    #[arg(long, default_value_t = 5)]
    deadline_slack_ms: u64,
    /// Plant a known bug in every node (duplicate_for_pending, forget_queued_settle,
    /// own_clock, early_follower_ack, one_charge_over, unbounded_clock), to see the
    /// checkers catch it. Needs an `ankusa-fleet` built with the `planted-bugs` feature.
    #[arg(long)]
    plant_bug: Option<String>,
    /// The fault kinds to draw from, comma-separated: partition, pause, kill, lost,
    /// membership, clock, skew (default: all).
    #[arg(long, value_delimiter = ',', value_parser = clap::builder::PossibleValuesParser::new(nemesis::schedule::KINDS))]
    faults: Option<Vec<String>>,
    /// Send the claims in `HitBatch` frames, one stream per node shared by its clients,
    /// instead of a unary `Hit` each.
    #[arg(long)]
    frames: bool,
}

/// The `ankusa-fleet` beside this executable (cargo puts both binaries in one folder, and
/// an install puts them side by side).
fn default_bin() -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe().context("finding this executable")?;
    Ok(exe.with_file_name("ankusa-fleet"))
}

/// Checks that `exe` carries the planted bugs (`--version` says `+planted-bugs`): a node
/// built without them refuses a config that plants one, and the fleet would elect no leader.
fn check_planted_bugs(exe: &std::path::Path) -> anyhow::Result<()> {
    let output = std::process::Command::new(exe)
        .arg("--version")
        .output()
        .with_context(|| format!("running {} --version", exe.display()))?;
    let version = String::from_utf8_lossy(&output.stdout);
    anyhow::ensure!(
        version.contains("+planted-bugs"),
        "--plant-bug needs an ankusa-fleet built with the `planted-bugs` feature, and {} is \
         not ({}): build it with `cargo build --bin ankusa-fleet --features planted-bugs` (add \
         --release for a release build)",
        exe.display(),
        version.trim()
    );
    Ok(())
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    match run(NemesisArgs::parse()).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("Error: {}", ankusa_fleet::cmd::one_line(&error));
            std::process::ExitCode::FAILURE
        }
    }
}

/// Runs the plan and prints its report. A run with an anomaly writes the whole history
/// beside the fleet's logs and exits 1; a clean run removes its directory.
async fn run(args: NemesisArgs) -> anyhow::Result<()> {
    let exe = match args.bin {
        Some(bin) => bin,
        None => default_bin()?,
    };
    anyhow::ensure!(
        exe.is_file(),
        "no ankusa-fleet binary at {} (build it, e.g. `cargo build --bin ankusa-fleet`, or \
         name one with --bin)",
        exe.display()
    );
    if args.plant_bug.is_some() {
        check_planted_bugs(&exe)?;
    }
    let plan = nemesis::Plan {
        exe,
        seed: args.seed,
        duration: Duration::from_secs(args.duration_s),
        nodes: args.nodes,
        clients_per_node: args.clients,
        deadline_slack: Duration::from_millis(args.deadline_slack_ms),
        planted_bug: args.plant_bug,
        frames: args.frames,
        kinds: args.faults.unwrap_or_else(|| {
            nemesis::schedule::KINDS
                .iter()
                .map(|kind| (*kind).to_owned())
                .collect()
        }),
    };
    let outcomes = nemesis::run(&plan).await?;
    let failed = !outcomes.findings.anomalies.is_empty();
    if failed {
        // The whole history beside the fleet's logs, for reading the failure.
        let path = outcomes.dir.join("history.txt");
        let text: String = outcomes
            .history
            .iter()
            .map(|op| format!("{op:?}\n"))
            .collect();
        if std::fs::write(&path, text).is_ok() {
            println!("history: {}", path.display());
        }
    }
    // The report ends with the summary line.
    print!("{}", outcomes.report(&plan));
    if failed {
        std::process::exit(1);
    }
    let _ = std::fs::remove_dir_all(&outcomes.dir);
    Ok(())
}
