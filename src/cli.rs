//! The operator commands beside `serve`: `dev` (a local 3-node fleet in child processes,
//! with peer TLS) and `cluster status|add|remove` (membership through any node's
//! `raft_addr`, with a certificate of the fleet CA).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use crate::config::NodeConfig;
use crate::pb;
use crate::pb::fleet_client::FleetClient;
use crate::pb::internal::admin_client::AdminClient;
use crate::pb::internal::{
    AddMemberRequest, ClusterStatusRequest, ClusterStatusResponse, RemoveMemberRequest,
};

/// The local 3-node fleet `dev` starts, embedded so it needs nothing on disk.
const LOCAL_3: [&str; 3] = [
    include_str!("../cluster-configs/local-3/node1.toml"),
    include_str!("../cluster-configs/local-3/node2.toml"),
    include_str!("../cluster-configs/local-3/node3.toml"),
];
/// How long `dev` waits for the fleet to elect a leader.
const LEADER_WAIT: Duration = Duration::from_secs(30);

/// Where a `cluster` command connects and with which certificate.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct AdminTarget {
    /// A node's `raft_addr` (default: that of `--config`'s node).
    #[arg(long)]
    pub addr: Option<String>,
    #[command(flatten)]
    pub credentials: Credentials,
}

/// The fleet certificate an `Admin` call presents, from files or from a node's config, and
/// the fleet it names.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct Credentials {
    /// Use this node's `raft_addr` and `[peer_tls]` (its CA; its node certificate unless
    /// `--cert` and `--key` name another: a node's may only read `cluster status`).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// The fleet CA (PEM) that the node's certificate must chain to.
    #[arg(long, requires = "cert", requires = "key")]
    pub ca: Option<PathBuf>,
    /// The certificate to present (e.g. `admin.pem` from `ankusa-fleet certs`: only the
    /// admin identity may add, remove, or save a backup).
    #[arg(long, requires = "key")]
    pub cert: Option<PathBuf>,
    /// The certificate's private key.
    #[arg(long, requires = "cert")]
    pub key: Option<PathBuf>,
    /// The fleet's `cluster_id` (default: `--config`'s, else the default `ankusa-fleet`).
    #[arg(long)]
    pub cluster_id: Option<String>,
}

/// How long a `cluster` command waits to connect.
const ADMIN_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

impl AdminTarget {
    /// The cluster id the call names: `--cluster-id`, else `--config`'s, else the default.
    ///
    /// # Errors
    /// When `--config` cannot be read.
    pub fn cluster_id(&self) -> anyhow::Result<String> {
        let credentials = &self.credentials;
        if let Some(cluster_id) = &credentials.cluster_id {
            return Ok(cluster_id.clone());
        }
        Ok(match &credentials.config {
            Some(path) => NodeConfig::load(path)?.cluster_id,
            None => crate::config::Defaults::CLUSTER_ID.to_owned(),
        })
    }

    /// Connects to the node's `Admin` service: TLS with `--ca/--cert/--key` or the config's
    /// `[peer_tls]`, plaintext otherwise (a loopback fleet without `[peer_tls]`).
    ///
    /// # Errors
    /// When no address is given, a file cannot be used, or the node cannot be reached.
    pub async fn connect(&self) -> anyhow::Result<AdminClient<tonic::transport::Channel>> {
        self.connect_to(None).await
    }

    /// As [`AdminTarget::connect`], to `addr` instead of the target's own address when
    /// given (the leader a follower named).
    async fn connect_to(
        &self,
        addr: Option<&str>,
    ) -> anyhow::Result<AdminClient<tonic::transport::Channel>> {
        let credentials = &self.credentials;
        let config = credentials
            .config
            .as_deref()
            .map(NodeConfig::load)
            .transpose()?;
        let addr = match (addr, &self.addr, &config) {
            (Some(addr), _, _) => addr.to_owned(),
            (None, Some(addr), _) => addr.clone(),
            (None, None, Some(config)) => config.raft_addr.to_string(),
            (None, None, None) => bail!("give --addr RAFT_ADDR or --config NODE.toml"),
        };
        let tls = match (
            &credentials.ca,
            &credentials.cert,
            &credentials.key,
            &config,
        ) {
            (Some(ca), Some(cert), Some(key), _) => {
                Some(crate::tls::client_from_files(ca, Some((cert, key)))?)
            }
            (None, Some(_), Some(_), None) => {
                bail!("--cert needs --ca, or a --config with [peer_tls] for its ca_file")
            }
            (None, Some(cert), Some(key), Some(config)) => {
                let Some(files) = &config.peer_tls else {
                    bail!("--cert needs --ca, or a --config with [peer_tls] for its ca_file");
                };
                Some(crate::tls::client_from_files(
                    &files.ca_file,
                    Some((cert, key)),
                )?)
            }
            (_, _, _, Some(config)) => config
                .peer_tls
                .as_ref()
                .map(|files| crate::tls::PeerTls::load(files).map(|tls| tls.client()))
                .transpose()?,
            _ => None,
        };
        let channel = crate::tls::endpoint(&addr, tls.as_ref())?
            .connect_timeout(ADMIN_CONNECT_TIMEOUT)
            .connect()
            .await
            .with_context(|| format!("connecting to {addr}"))?;
        Ok(AdminClient::new(channel)
            .max_decoding_message_size(crate::limits::API_RESPONSE_BYTES_MAX))
    }
}

/// Calls `call` on the target node; when it answers that it is not the leader and names the
/// leader's `raft_addr`, calls the leader there (a follower no longer forwards: it could
/// only do so with its own node certificate).
///
/// # Errors
/// When a node cannot be reached, the call is refused, or the leader moved more than
/// three times.
pub async fn on_leader<T, F, Fut>(target: &AdminTarget, mut call: F) -> anyhow::Result<T>
where
    F: FnMut(AdminClient<tonic::transport::Channel>) -> Fut,
    Fut: std::future::Future<Output = Result<T, tonic::Status>>,
{
    let mut leader: Option<String> = None;
    for _ in 0..=LEADER_HOPS_MAX {
        let client = target.connect_to(leader.as_deref()).await?;
        let status = match call(client).await {
            Ok(answer) => return Ok(answer),
            Err(status) => status,
        };
        let named = status
            .metadata()
            .get(crate::api::admin::LEADER_RAFT_ADDR_HEADER)
            .and_then(|value| value.to_str().ok())
            .map(str::to_owned);
        match named {
            Some(addr) if leader.as_deref() != Some(addr.as_str()) => leader = Some(addr),
            _ => return Err(status.into()),
        }
    }
    bail!("the leader moved {LEADER_HOPS_MAX} times during the call; retry")
}

/// The most "not the leader" answers [`on_leader`] follows.
const LEADER_HOPS_MAX: usize = 3;

/// Asks the node at `api_addr` for its status (the edge API's `Status`).
///
/// # Errors
/// When the node cannot be reached.
pub async fn status(api_addr: &str) -> anyhow::Result<pb::StatusResponse> {
    let mut client = FleetClient::connect(format!("http://{api_addr}"))
        .await
        .with_context(|| format!("connecting to {api_addr}"))?
        .max_decoding_message_size(crate::limits::API_RESPONSE_BYTES_MAX);
    Ok(client.status(pb::StatusRequest {}).await?.into_inner())
}

/// A node's view of the fleet through its `Admin` service.
///
/// # Errors
/// When the node cannot be reached or refuses the certificate.
pub async fn cluster_status(target: &AdminTarget) -> anyhow::Result<ClusterStatusResponse> {
    let mut admin = target.connect().await?;
    Ok(admin
        .cluster_status(ClusterStatusRequest {
            cluster_id: target.cluster_id()?,
            digest: false,
        })
        .await?
        .into_inner())
}

/// Prints a node's status as a small table (a closed pipe, e.g. `| head`, is not an error).
pub fn print_status(status: &ClusterStatusResponse) {
    use std::io::Write;
    let leader = match status.leader_id {
        0 => "none known".to_owned(),
        id => id.to_string(),
    };
    let mut out = std::io::stdout().lock();
    let _ = writeln!(
        out,
        "node {}  leader {}  term {}  last_applied {}",
        status.node_id, leader, status.term, status.last_applied,
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

/// Adds a member through `target` (on the leader, which `target` names if it is not).
///
/// # Errors
/// When the node cannot be reached or the change is refused.
pub async fn add(target: &AdminTarget, mut request: AddMemberRequest) -> anyhow::Result<String> {
    request.cluster_id = target.cluster_id()?;
    on_leader(target, |mut admin| {
        let request = request.clone();
        async move { Ok(admin.add_member(request).await?.into_inner().message) }
    })
    .await
}

/// Removes a member through `target` (on the leader, which `target` names if it is not).
///
/// # Errors
/// When the node cannot be reached or the change is refused.
pub async fn remove(target: &AdminTarget, id: u64) -> anyhow::Result<String> {
    let request = RemoveMemberRequest {
        cluster_id: target.cluster_id()?,
        id,
    };
    on_leader(target, |mut admin| {
        let request = request.clone();
        async move { Ok(admin.remove_member(request).await?.into_inner().message) }
    })
    .await
}

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
pub async fn dev(data_root: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(data_root)
        .with_context(|| format!("creating {}", data_root.display()))?;
    // The fleet's CA and node certificates, made once and reused on later runs.
    crate::tls::make_certs(&crate::tls::CertsPlan::new(
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
