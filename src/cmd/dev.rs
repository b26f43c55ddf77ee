//! `ankusa-fleet dev`: the embedded local 3-node fleet (cluster-configs/local-3) in child
//! processes ([`crate::cmd::launch`]), with peer TLS, until Ctrl-C.

use std::path::Path;
use std::time::Duration;

use anyhow::{bail, Context};

use crate::cmd::launch::{Fleet, NodeSpec, Options};
use crate::config::NodeConfig;

/// The local 3-node fleet `dev` starts, embedded so it needs nothing on disk.
const LOCAL_3: [&str; 3] = [
    include_str!("../../cluster-configs/local-3/node1.toml"),
    include_str!("../../cluster-configs/local-3/node2.toml"),
    include_str!("../../cluster-configs/local-3/node3.toml"),
];
/// How long `dev` waits for the fleet to elect a leader.
const LEADER_WAIT: Duration = Duration::from_secs(30);
/// How long `dev` lets its nodes drain before it kills them.
const CHILD_DRAIN_WAIT: Duration = Duration::from_secs(10);
/// How often `dev` looks for a node that exited.
const WATCH_EVERY: Duration = Duration::from_millis(200);

/// The embedded configs name their files under this folder; `dev` puts them under its own.
const LOCAL_3_ROOT: &str = "data/local-3/";

/// Adds the embedded node `template` to `fleet`, its files under the fleet's directory.
fn add_dev_node(fleet: &mut Fleet, template: &str) -> anyhow::Result<()> {
    let root = format!("{}/", fleet.dir().display());
    let text = template.replace(LOCAL_3_ROOT, &root);
    let config = NodeConfig::from_toml(&text)?;
    let spec = NodeSpec {
        id: config.node_id,
        api_addr: config.api_addr.to_string(),
        raft_addr: config.raft_addr.to_string(),
        metrics_addr: config.metrics_addr.map(|addr| addr.to_string()),
    };
    fleet.add(spec, &text)
}

/// Starts the embedded local 3-node fleet as child processes, waits for a leader, prints
/// where to connect, and runs until Ctrl-C; then its nodes drain (up to 10 s) and stop.
///
/// # Errors
/// When a child cannot start or no leader is elected within 30 s.
pub async fn run(data_root: &Path) -> anyhow::Result<()> {
    // Three nodes share this machine: each gets a third of the cores for its runtime
    // (unless TOKIO_WORKER_THREADS says otherwise), as each would have its own host's.
    let worker_threads = std::env::var("TOKIO_WORKER_THREADS").unwrap_or_else(|_| {
        let cores = std::thread::available_parallelism().map_or(1, usize::from);
        (cores / LOCAL_3.len()).max(1).to_string()
    });
    let mut fleet = Fleet::new(Options {
        ip: std::net::Ipv4Addr::LOCALHOST,
        env: vec![("TOKIO_WORKER_THREADS".to_owned(), worker_threads)],
        drain_on_drop: CHILD_DRAIN_WAIT,
        ..Options::new(std::env::current_exe()?, data_root.to_owned())
    })?;
    // The fleet's CA and node certificates, made once and reused on later runs.
    fleet.make_certs(LOCAL_3.len() as u64)?;
    for template in LOCAL_3 {
        add_dev_node(&mut fleet, template)?;
    }
    let ids: Vec<u64> = fleet.nodes.keys().copied().collect();
    for id in &ids {
        fleet.start(*id).context("starting a node")?;
    }
    let leader = fleet.wait_for_leader(&ids, LEADER_WAIT).await?;
    println!("ankusa-fleet: 3 nodes up (peer traffic over mutual TLS), leader is node {leader}");
    for node in fleet.nodes.values() {
        let metrics = node
            .spec
            .metrics_addr
            .as_ref()
            .map_or_else(|| "off".to_owned(), |addr| format!("http://{addr}/metrics"));
        println!(
            "  node {}  api {}  metrics {metrics}  log {}",
            node.spec.id,
            node.spec.api_addr,
            node.log_path.display()
        );
    }
    println!(
        "Edge calls go to the node on their host, e.g. grpc://{}",
        fleet.nodes[&ids[0]].spec.api_addr
    );
    println!(
        "Status: ankusa-fleet cluster status --config {}   (Ctrl-C stops the fleet)",
        fleet.nodes[&ids[0]].config_path.display()
    );
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => println!("stopping the fleet"),
        _ = terminate.recv() => println!("stopping the fleet"),
        (id, status) = watch(&mut fleet) => bail!("node {id} exited: {status}"),
    }
    Ok(())
}

/// Waits until a node exits by itself.
async fn watch(fleet: &mut Fleet) -> (u64, std::process::ExitStatus) {
    loop {
        if let Some(exited) = fleet.first_exited() {
            return exited;
        }
        tokio::time::sleep(WATCH_EVERY).await;
    }
}
