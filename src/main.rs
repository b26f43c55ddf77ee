//! `ankusa-fleet`: parses the command line and runs the command it names; every command
//! lives in `ankusa_fleet::cmd`.

use std::path::PathBuf;

use clap::{Parser, Subcommand};

use ankusa_fleet::cmd;

/// mimalloc instead of glibc's malloc: the hot path allocates small buffers on one tokio
/// worker and frees them on another, which glibc's malloc handles poorly
/// (docs/decisions/015).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The version `--version` prints; a build that carries the nemesis's planted bugs says
/// so (the nemesis checks it before it plants one).
const VERSION: &str = if cfg!(feature = "planted-bugs") {
    concat!(env!("CARGO_PKG_VERSION"), " +planted-bugs")
} else {
    env!("CARGO_PKG_VERSION")
};

#[derive(Parser)]
#[command(
    version = VERSION,
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
    Bench(cmd::bench::BenchPlan),
    /// What one snapshot costs here (encode, store, load), apart from a fleet; prints a
    /// JSON summary.
    BenchSnapshot(cmd::bench::snapshot::SnapshotBenchPlan),
    /// What writing one queued settle to the disk costs, the settle queue's journal and
    /// the sled tree it replaced side by side; prints a JSON summary.
    BenchSettleQueue(cmd::bench::settle_queue::SettleQueueBenchPlan),
    /// Inspect or change membership through any node's raft_addr (with a fleet certificate).
    Cluster {
        #[command(subcommand)]
        command: cmd::cluster::ClusterCmd,
    },
    /// Back the fleet's state up to a file, or seed a node's empty data dir from one.
    Snapshot {
        #[command(subcommand)]
        command: cmd::snapshot::SnapshotCmd,
    },
    /// Make a fleet CA and one certificate per node, for [peer_tls] (reuses a CA already in
    /// --out).
    Certs(cmd::certs::CertsPlan),
    /// Runs `ankusa-fleet-nemesis` (beside this binary) with the arguments that follow: a
    /// fleet of its own under a seeded workload and fault schedule (docs/reliability.md).
    #[command(disable_help_flag = true)]
    Nemesis {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<std::ffi::OsString>,
    },
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    match run(Args::parse().command).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("Error: {}", cmd::one_line(&error));
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run(command: Cmd) -> anyhow::Result<()> {
    match command {
        Cmd::Serve { config } => cmd::serve::run(config).await,
        Cmd::Dev { data_dir } => cmd::dev::run(&data_dir).await,
        Cmd::Bench(plan) => cmd::print_json(&cmd::bench::run(plan).await?),
        Cmd::BenchSnapshot(plan) => cmd::print_json(&cmd::bench::snapshot::run(&plan)?),
        Cmd::BenchSettleQueue(plan) => {
            cmd::print_json(&cmd::bench::settle_queue::run(&plan).await?)
        }
        Cmd::Cluster { command } => cmd::cluster::run(command).await,
        Cmd::Snapshot { command } => cmd::snapshot::run(command).await,
        Cmd::Certs(plan) => cmd::certs::run(&plan),
        Cmd::Nemesis { args } => Err(cmd::nemesis::exec(&args)),
    }
}
