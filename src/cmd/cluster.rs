//! `ankusa-fleet cluster status|add|remove`: membership through any node's `raft_addr`,
//! with a certificate of the fleet CA; and the calls to a node's `Admin` and `Fleet`
//! services that `snapshot save`, the nemesis and the tests share (`AdminTarget`,
//! `on_leader`, `status`).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context};

use crate::config::NodeConfig;
use crate::pb;
use crate::pb::fleet_client::FleetClient;
use crate::pb::internal::admin_client::AdminClient;
use crate::pb::internal::{
    AddMemberRequest, ClusterStatusRequest, ClusterStatusResponse, RemoveMemberRequest,
};

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

/// The `cluster` subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum ClusterCmd {
    /// Show a node's view of the fleet.
    Status {
        #[command(flatten)]
        target: AdminTarget,
    },
    /// Add a node: it catches up as a learner, then becomes a voter unless --learner.
    Add {
        #[command(flatten)]
        target: AdminTarget,
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
        target: AdminTarget,
        #[arg(long)]
        id: u64,
    },
}

/// Runs one `cluster` subcommand and prints its outcome.
///
/// # Errors
/// When no node answers, the certificate is refused, or the change is refused.
pub async fn run(command: ClusterCmd) -> anyhow::Result<()> {
    match command {
        ClusterCmd::Status { target } => print_status(&cluster_status(&target).await?),
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
            println!("{}", add(&target, request).await?);
        }
        ClusterCmd::Remove { target, id } => println!("{}", remove(&target, id).await?),
    }
    Ok(())
}
