//! `ankusa-fleet dev`: the embedded local 3-node fleet (cluster-configs/local-3) in child
//! processes, with peer TLS, until Ctrl-C.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use crate::cmd::cluster::status;
use crate::config::NodeConfig;

/// The local 3-node fleet `dev` starts, embedded so it needs nothing on disk.
const LOCAL_3: [&str; 3] = [
    include_str!("../../cluster-configs/local-3/node1.toml"),
    include_str!("../../cluster-configs/local-3/node2.toml"),
    include_str!("../../cluster-configs/local-3/node3.toml"),
];
/// How long `dev` waits for the fleet to elect a leader.
const LEADER_WAIT: Duration = Duration::from_secs(30);

/// Child node processes, stopped when dropped: SIGTERM (each drains), then SIGKILL for any
/// still running after `CHILD_DRAIN_WAIT`.
struct Children(Vec<Child>);

/// How long `dev` lets its nodes drain before it kills them.
const CHILD_DRAIN_WAIT: Duration = Duration::from_secs(10);

impl Drop for Children {
    fn drop(&mut self) {
        for child in &self.0 {
            if let Ok(pid) = libc::pid_t::try_from(child.id()) {
                // SAFETY: kill(2) with a pid we spawned and have not reaped; it touches no
                // memory of ours.
                unsafe { libc::kill(pid, libc::SIGTERM) };
            }
        }
        let deadline = Instant::now() + CHILD_DRAIN_WAIT;
        for child in &mut self.0 {
            while Instant::now() < deadline && matches!(child.try_wait(), Ok(None)) {
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The embedded configs name their files under this folder; `dev` puts them under its own.
const LOCAL_3_ROOT: &str = "data/local-3/";

fn write_dev_config(
    template: &str,
    data_root: &Path,
    n: usize,
) -> anyhow::Result<(PathBuf, NodeConfig)> {
    let root = format!("{}/", data_root.display());
    let text = template.replace(LOCAL_3_ROOT, &root);
    let config = NodeConfig::from_toml(&text)?;
    let path = data_root.join(format!("node{}.toml", n + 1));
    std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
    Ok((path, config))
}

/// Starts the embedded local 3-node fleet as child processes, waits for a leader, prints
/// where to connect, and runs until Ctrl-C (then stops the children).
///
/// # Errors
/// When a child cannot start or no leader is elected within 30 s.
pub async fn run(data_root: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(data_root)
        .with_context(|| format!("creating {}", data_root.display()))?;
    // The fleet's CA and node certificates, made once and reused on later runs.
    crate::cmd::certs::make_certs(&crate::cmd::certs::CertsPlan::new(
        data_root.join("certs"),
        LOCAL_3.len() as u64,
        crate::config::Defaults::CLUSTER_ID,
    ))?;
    let exe = std::env::current_exe()?;
    // Three nodes share this machine: each gets a third of the cores for its runtime
    // (unless TOKIO_WORKER_THREADS says otherwise), as each would have its own host's.
    let worker_threads = std::env::var("TOKIO_WORKER_THREADS").unwrap_or_else(|_| {
        let cores = std::thread::available_parallelism().map_or(1, usize::from);
        (cores / LOCAL_3.len()).max(1).to_string()
    });
    let mut children = Children(Vec::new());
    let mut api_addrs = Vec::new();
    for (n, template) in LOCAL_3.iter().enumerate() {
        let (path, config) = write_dev_config(template, data_root, n)?;
        let log = std::fs::File::create(data_root.join(format!("node{}.log", n + 1)))?;
        let child = Command::new(&exe)
            .args(["serve", "--config"])
            .arg(&path)
            .env("TOKIO_WORKER_THREADS", &worker_threads)
            .stdout(Stdio::from(log.try_clone()?))
            .stderr(Stdio::from(log))
            .spawn()
            .context("starting a node")?;
        children.0.push(child);
        api_addrs.push((config.api_addr.to_string(), config.metrics_addr));
    }
    let (api_addrs, metrics_addrs): (Vec<String>, Vec<_>) = api_addrs.into_iter().unzip();
    let leader = wait_for_leader(&api_addrs).await?;
    println!("ankusa-fleet: 3 nodes up (peer traffic over mutual TLS), leader is node {leader}");
    for (n, (addr, metrics)) in api_addrs.iter().zip(&metrics_addrs).enumerate() {
        let metrics =
            metrics.map_or_else(|| "off".to_owned(), |addr| format!("http://{addr}/metrics"));
        println!(
            "  node {}  api {addr}  metrics {metrics}  log {}",
            n + 1,
            data_root.join(format!("node{}.log", n + 1)).display()
        );
    }
    println!(
        "Edge calls go to the node on their host, e.g. grpc://{}",
        api_addrs[0]
    );
    println!(
        "Status: ankusa-fleet cluster status --config {}   (Ctrl-C stops the fleet)",
        data_root.join("node1.toml").display()
    );
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => println!("stopping the fleet"),
        _ = terminate.recv() => println!("stopping the fleet"),
        exited = watch_children(&mut children) => bail!("a node exited: {exited}"),
    }
    Ok(())
}

async fn watch_children(children: &mut Children) -> String {
    loop {
        for child in &mut children.0 {
            if let Ok(Some(status)) = child.try_wait() {
                return status.to_string();
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn wait_for_leader(api_addrs: &[String]) -> anyhow::Result<u64> {
    let started = Instant::now();
    while started.elapsed() < LEADER_WAIT {
        let mut leaders = Vec::new();
        for addr in api_addrs {
            if let Ok(status) = status(addr).await {
                leaders.push(status.leader_id);
            }
        }
        if leaders.len() == api_addrs.len()
            && leaders[0] != 0
            && leaders.iter().all(|l| *l == leaders[0])
        {
            return Ok(leaders[0]);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    bail!("no leader elected within {LEADER_WAIT:?}")
}
