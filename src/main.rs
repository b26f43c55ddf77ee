//! `ankusa-fleet`: parse args → load config → init telemetry → run.

use std::path::PathBuf;

use clap::{Parser, Subcommand};

use ankusa_fleet::config::{LogFormat, NodeConfig};
use ankusa_fleet::pb::internal::AddMemberRequest;
use ankusa_fleet::{bench, cli, server};

/// mimalloc instead of glibc's malloc: the hot path allocates small buffers on one tokio
/// worker and frees them on another, which glibc's malloc handles poorly
/// (docs/decisions/015).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    version,
    about = "Replicated rate limiting and webhook dedupe for an edge fleet"
)]
struct Args {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run one node.
    Serve {
        #[arg(long)]
        config: PathBuf,
    },
    /// Run a local 3-node fleet on loopback (child processes) until Ctrl-C.
    Dev {
        /// Where the nodes keep their data, configs and logs.
        #[arg(long, default_value = "data/dev")]
        data_dir: PathBuf,
    },
    /// Load against a running fleet (or Redis running hit.lua, with the redis-bench
    /// feature), closed or open loop; prints a JSON summary.
    Bench(bench::BenchPlan),
    /// What one snapshot costs here (encode, store, load), apart from a fleet; prints a
    /// JSON summary.
    BenchSnapshot(ankusa_fleet::raft::snapshot::bench::SnapshotBenchPlan),
    /// What writing one queued settle to the disk costs, the settle queue's journal and
    /// the sled tree it replaced side by side; prints a JSON summary.
    BenchSettleQueue(ankusa_fleet::local::bench::SettleQueueBenchPlan),
    /// Inspect or change membership through any node's raft_addr (with a fleet certificate).
    Cluster {
        #[command(subcommand)]
        command: ClusterCmd,
    },
    /// Back the fleet's state up to a file, or seed a node's empty data dir from one.
    Snapshot {
        #[command(subcommand)]
        command: SnapshotCmd,
    },
    /// Make a fleet CA and one certificate per node, for [peer_tls] (reuses a CA already in
    /// --out).
    Certs(ankusa_fleet::tls::CertsPlan),
    /// Start a fleet of its own, run a seeded workload under a seeded fault schedule, check
    /// the history; exits 0 if and only if no anomaly was found (docs/reliability.md).
    Nemesis {
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
        /// checkers catch it.
        #[arg(long)]
        plant_bug: Option<String>,
        /// The fault kinds to draw from, comma-separated: partition, pause, kill, lost,
        /// membership, clock, skew (default: all).
        #[arg(long, value_delimiter = ',', value_parser = clap::builder::PossibleValuesParser::new(ankusa_fleet::nemesis::schedule::KINDS))]
        faults: Option<Vec<String>>,
        /// Send the claims in `HitBatch` frames, one stream per node shared by its clients,
        /// instead of a unary `Hit` each.
        #[arg(long)]
        frames: bool,
    },
}

#[derive(Subcommand)]
enum SnapshotCmd {
    /// Write a snapshot covering everything the fleet answered before the call to FILE,
    /// taken on the leader through any node (its Admin service on raft_addr, with a fleet
    /// certificate).
    Save {
        #[command(flatten)]
        target: ankusa_fleet::backup::SaveTarget,
        file: PathBuf,
    },
    /// Seed the empty data dir of the node NODE.toml describes from FILE (every member is
    /// restored from the same file, then started).
    Restore {
        #[arg(long)]
        config: PathBuf,
        file: PathBuf,
    },
}

#[derive(Subcommand)]
enum ClusterCmd {
    /// Show a node's view of the fleet.
    Status {
        #[command(flatten)]
        target: cli::AdminTarget,
    },
    /// Add a node: it catches up as a learner, then becomes a voter unless --learner.
    Add {
        #[command(flatten)]
        target: cli::AdminTarget,
        #[arg(long)]
        id: u64,
        #[arg(long)]
        api_addr: String,
        #[arg(long)]
        raft_addr: String,
        #[arg(long)]
        learner: bool,
    },
    /// Remove a node from the fleet.
    Remove {
        #[command(flatten)]
        target: cli::AdminTarget,
        #[arg(long)]
        id: u64,
    },
}

/// Log lines to stderr, filtered by RUST_LOG (default `info,openraft=warn`): text, or one
/// JSON object per line.
fn init_telemetry(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,openraft=warn"));
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => logs.with_ansi(ansi).init(),
        LogFormat::Json => logs.json().init(),
    }
}

/// Turns transparent huge pages off for this process (as Redis asks of its hosts): mimalloc
/// asks for huge pages on its arenas, and a fault on one zeroes 2 MiB on the thread that
/// touched it, often the one applying entries (docs/decisions/016). Best effort: a kernel
/// without the call keeps its default.
#[cfg(target_os = "linux")]
fn disable_transparent_huge_pages() {
    // SAFETY: PR_SET_THP_DISABLE reads its integer arguments only and sets a flag on this
    // process' memory map; it touches no memory of ours.
    let rc = unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) };
    if rc != 0 {
        tracing::debug!(error = %std::io::Error::last_os_error(), "transparent huge pages stay as the kernel sets them");
    }
}

/// Transparent huge pages are a Linux feature; elsewhere there is nothing to turn off.
#[cfg(not(target_os = "linux"))]
fn disable_transparent_huge_pages() {}

async fn serve(path: PathBuf) -> anyhow::Result<()> {
    let config = NodeConfig::load(&path)?;
    init_telemetry(config.log_format);
    disable_transparent_huge_pages();
    if let Some(addr) = config.metrics_addr {
        ankusa_fleet::telemetry::serve_metrics(addr)?;
    }
    let listeners = server::Listeners::bind(&config).await?;
    // After the bind: `api_socket`'s directory and file keep the modes that let the edge's
    // group in. From here on every file the stores create is the node user's alone.
    ankusa_fleet::storage::set_private_umask();
    let running = server::start(config, listeners).await?;
    // SIGTERM is what systemd and Kubernetes send; SIGINT is Ctrl-C. Both drain, and so
    // does a Raft core that stopped: the node then exits non-zero to be started again.
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let core_stopped = tokio::select! {
        _ = tokio::signal::ctrl_c() => {
            tracing::info!(signal = "SIGINT", "shutting down");
            None
        }
        _ = terminate.recv() => {
            tracing::info!(signal = "SIGTERM", "shutting down");
            None
        }
        why = running.raft_core_stopped() => Some(why),
    };
    // A second signal during the drain stops the node at once (as an operator who presses
    // Ctrl-C twice expects); the claim journals and the log are fsynced as they go.
    tokio::spawn(async move {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = terminate.recv() => {}
        }
        tracing::warn!("second signal: stopping without finishing the drain");
        std::process::exit(1);
    });
    running.drain().await;
    if let Some(why) = core_stopped {
        tracing::error!(
            reason = %why,
            exit_code = server::RAFT_CORE_STOPPED_EXIT_CODE,
            "stopped: the Raft core had stopped"
        );
        std::process::exit(server::RAFT_CORE_STOPPED_EXIT_CODE);
    }
    tracing::info!("stopped");
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    match args.command {
        Cmd::Serve { config } => serve(config).await,
        Cmd::Dev { data_dir } => cli::dev(&data_dir).await,
        Cmd::Bench(plan) => {
            let summary = bench::run(plan).await?;
            println!("{}", serde_json::to_string_pretty(&summary)?);
            Ok(())
        }
        Cmd::BenchSnapshot(plan) => {
            let summary = ankusa_fleet::raft::snapshot::bench::run(&plan)?;
            println!("{}", serde_json::to_string_pretty(&summary)?);
            Ok(())
        }
        Cmd::BenchSettleQueue(plan) => {
            let summary = ankusa_fleet::local::bench::run(&plan).await?;
            println!("{}", serde_json::to_string_pretty(&summary)?);
            Ok(())
        }
        Cmd::Nemesis {
            seed,
            duration_s,
            nodes,
            clients,
            deadline_slack_ms,
            plant_bug,
            faults,
            frames,
        } => {
            let plan = ankusa_fleet::nemesis::Plan {
                seed,
                duration: std::time::Duration::from_secs(duration_s),
                nodes,
                clients_per_node: clients,
                deadline_slack: std::time::Duration::from_millis(deadline_slack_ms),
                planted_bug: plant_bug,
                frames,
                kinds: faults.unwrap_or_else(|| {
                    ankusa_fleet::nemesis::schedule::KINDS
                        .iter()
                        .map(|kind| (*kind).to_owned())
                        .collect()
                }),
            };
            let outcomes = ankusa_fleet::nemesis::run(&plan).await?;
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
        Cmd::Certs(plan) => {
            for path in ankusa_fleet::tls::make_certs(&plan)? {
                println!("wrote {}", path.display());
            }
            Ok(())
        }
        Cmd::Snapshot { command } => match command {
            SnapshotCmd::Save { target, file } => {
                let summary = ankusa_fleet::backup::save(&target, &file).await?;
                println!("saved {}: {summary}", file.display());
                Ok(())
            }
            SnapshotCmd::Restore { config, file } => {
                let config = NodeConfig::load(&config)?;
                let summary = ankusa_fleet::backup::restore(&config, &file).await?;
                println!(
                    "restored node {} in {} from {}: {summary}",
                    config.node_id,
                    config.data_dir.display(),
                    file.display()
                );
                Ok(())
            }
        },
        Cmd::Cluster { command } => match command {
            ClusterCmd::Status { target } => {
                cli::print_status(&cli::cluster_status(&target).await?);
                Ok(())
            }
            ClusterCmd::Add {
                target,
                id,
                api_addr,
                raft_addr,
                learner,
            } => {
                let request = AddMemberRequest {
                    cluster_id: String::new(),
                    id,
                    api_addr,
                    raft_addr,
                    voter: !learner,
                };
                println!("{}", cli::add(&target, request).await?);
                Ok(())
            }
            ClusterCmd::Remove { target, id } => {
                println!("{}", cli::remove(&target, id).await?);
                Ok(())
            }
        },
    }
}
