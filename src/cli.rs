//! The operator commands beside `serve`: `dev` (a local 3-node fleet in child processes)
//! and `cluster status|add|remove` (membership through any node's API).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use crate::config::NodeConfig;
use crate::pb;
use crate::pb::fleet_client::FleetClient;
use crate::pb::internal::admin_client::AdminClient;
use crate::pb::internal::{AddMemberRequest, RemoveMemberRequest};

/// The local 3-node fleet `dev` starts, embedded so it needs nothing on disk.
const LOCAL_3: [&str; 3] = [
    include_str!("../cluster-configs/local-3/node1.toml"),
    include_str!("../cluster-configs/local-3/node2.toml"),
    include_str!("../cluster-configs/local-3/node3.toml"),
];
/// How long `dev` waits for the fleet to elect a leader.
const LEADER_WAIT: Duration = Duration::from_secs(30);

/// Asks the node at `api_addr` for its status.
///
/// # Errors
/// When the node cannot be reached.
pub async fn status(api_addr: &str) -> anyhow::Result<pb::StatusResponse> {
    let mut client = FleetClient::connect(format!("http://{api_addr}"))
        .await
        .with_context(|| format!("connecting to {api_addr}"))?;
    Ok(client.status(pb::StatusRequest {}).await?.into_inner())
}

/// Prints a node's status as a small table (a closed pipe, e.g. `| head`, is not an error).
pub fn print_status(status: &pb::StatusResponse) {
    use std::io::Write;
    let leader = match status.leader_id {
        0 => "none known".to_owned(),
        id => id.to_string(),
    };
    let mut out = std::io::stdout().lock();
    let _ = writeln!(
        out,
        "node {}  leader {}  term {}  last_applied {}{}",
        status.node_id,
        leader,
        status.term,
        status.last_applied,
        if status.degraded { "  (degraded)" } else { "" }
    );
    for member in &status.members {
        let role = if member.voter { "voter" } else { "learner" };
        let _ = writeln!(
            out,
            "  {:>4}  {:<8} api {:<22} raft {}",
            member.id, role, member.api_addr, member.raft_addr
        );
    }
}

/// Adds a member through the node at `api_addr` (forwarded to the leader).
///
/// # Errors
/// When the node cannot be reached or the change is refused.
pub async fn add(api_addr: &str, request: AddMemberRequest) -> anyhow::Result<String> {
    let mut admin = AdminClient::connect(format!("http://{api_addr}")).await?;
    Ok(admin.add_member(request).await?.into_inner().message)
}

/// Removes a member through the node at `api_addr` (forwarded to the leader).
///
/// # Errors
/// When the node cannot be reached or the change is refused.
pub async fn remove(api_addr: &str, id: u64) -> anyhow::Result<String> {
    let mut admin = AdminClient::connect(format!("http://{api_addr}")).await?;
    Ok(admin
        .remove_member(RemoveMemberRequest { id })
        .await?
        .into_inner()
        .message)
}

/// Child node processes, killed when dropped.
struct Children(Vec<Child>);

impl Drop for Children {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn write_dev_config(
    template: &str,
    data_root: &Path,
    n: usize,
) -> anyhow::Result<(PathBuf, NodeConfig)> {
    let data_dir = data_root.join(format!("node{}", n + 1));
    let text = template.replace(
        &format!("data_dir = \"data/local-3/node{}\"", n + 1),
        &format!("data_dir = {:?}", data_dir.display().to_string()),
    );
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
pub async fn dev(data_root: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(data_root)
        .with_context(|| format!("creating {}", data_root.display()))?;
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
        api_addrs.push(config.api_addr.to_string());
    }
    let leader = wait_for_leader(&api_addrs).await?;
    println!("ankusa-fleet: 3 nodes up, leader is node {leader}");
    for (n, addr) in api_addrs.iter().enumerate() {
        println!(
            "  node {}  api {addr}  log {}",
            n + 1,
            data_root.join(format!("node{}.log", n + 1)).display()
        );
    }
    println!(
        "Edge calls go to the node on their host, e.g. grpc://{}",
        api_addrs[0]
    );
    println!(
        "Status: ankusa-fleet cluster status --addr {}   (Ctrl-C stops the fleet)",
        api_addrs[0]
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
