//! Start-up and shutdown of one node process: open the stores, start Raft, serve the
//! public API on `api_addr` and Raft traffic on `raft_addr`, form the cluster on first
//! start. Start-up never waits for peers.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::transport::Server;

use crate::api::validate::RequestDefaults;
use crate::api::{AdminService, FleetService};
use crate::config::NodeConfig;
use crate::fallback::Fallback;
use crate::fallback::LocalEngine;
use crate::node::propose::{BatchLimits, Proposer, Router};
use crate::node::snapshots::{self, SnapshotPolicy};
use crate::node::{reconcile, Node, NodeParts};
use crate::pb;
use crate::raft::faults::Faults;
use crate::raft::log_store::LogStore;
use crate::raft::network::PeerClients;
use crate::raft::service::PeerService;
use crate::raft::{MemberNode, Raft};
use crate::state::sled_disk::SledDisk;
use crate::state::store::StateMachineStore;

/// Largest gRPC message between peers (snapshot chunks, big batches).
const PEER_MESSAGE_BYTES_MAX: usize = 64 * 1024 * 1024;
/// sled's page cache (default 1 GiB): it holds the latest snapshot and the node-scope and
/// fallback claim indexes, all read rarely; the live state is in memory already.
const SLED_CACHE_BYTES: u64 = 64 * 1024 * 1024;
/// How long a snapshot chunk may take to install on a receiving node.
const INSTALL_SNAPSHOT_TIMEOUT_MS: u64 = 10_000;

/// A node could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("data dir {path}: {source}")]
    DataDir {
        path: String,
        source: std::io::Error,
    },
    #[error("binding {addr}: {source}")]
    Bind {
        addr: String,
        source: std::io::Error,
    },
    #[error("raft log store: {0}")]
    LogStore(String),
    #[error("sled: {0}")]
    Sled(#[from] sled::Error),
    #[error("state machine: {0}")]
    State(#[from] crate::state::store::StateStoreError),
    #[error("node claim index: {0}")]
    Local(#[from] crate::fallback::LocalError),
    #[error("raft config: {0}")]
    RaftConfig(#[from] openraft::ConfigError),
    #[error("raft: {0}")]
    Raft(String),
}

/// The two listening sockets of a node (bound before start, so tests can use port 0).
pub struct Listeners {
    pub api: TcpListener,
    pub raft: TcpListener,
}

impl Listeners {
    /// Binds the configured addresses.
    ///
    /// # Errors
    /// When an address is taken or not local.
    pub async fn bind(config: &NodeConfig) -> Result<Self, StartError> {
        let bind = |addr: std::net::SocketAddr| async move {
            TcpListener::bind(addr)
                .await
                .map_err(|source| StartError::Bind {
                    addr: addr.to_string(),
                    source,
                })
        };
        Ok(Self {
            api: bind(config.api_addr).await?,
            raft: bind(config.raft_addr).await?,
        })
    }
}

/// A started node: its servers run until [`RunningNode::shutdown`].
pub struct RunningNode {
    pub node: Arc<Node>,
    stop: watch::Sender<bool>,
    servers: Vec<JoinHandle<()>>,
}

fn raft_config(config: &NodeConfig) -> Result<openraft::Config, openraft::ConfigError> {
    openraft::Config {
        cluster_name: config.cluster_id.clone(),
        heartbeat_interval: config.heartbeat_ms,
        election_timeout_min: config.election_timeout_ms_min,
        election_timeout_max: config.election_timeout_ms_max,
        install_snapshot_timeout: INSTALL_SNAPSHOT_TIMEOUT_MS,
        // `node::snapshots` decides when (entries and log size, not entries alone).
        snapshot_policy: openraft::SnapshotPolicy::Never,
        max_in_snapshot_log_to_keep: config.snapshot_logs_kept,
        ..openraft::Config::default()
    }
    .validate()
}

/// Creates the data dir and makes its name durable in its parent.
fn open_dir(path: &Path) -> Result<(), StartError> {
    std::fs::create_dir_all(path).map_err(|source| StartError::DataDir {
        path: path.display().to_string(),
        source,
    })?;
    let parent = match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    };
    sync_dir(parent)
}

/// fsyncs a directory, so the names created in it survive a power cut (a new file is not
/// durable until its directory entry is).
fn sync_dir(path: &Path) -> Result<(), StartError> {
    std::fs::File::open(path)
        .and_then(|dir| dir.sync_all())
        .map_err(|source| StartError::DataDir {
            path: path.display().to_string(),
            source,
        })
}

/// Opens the stores, starts Raft and both servers, and forms the cluster on first start.
///
/// # Errors
/// When a store cannot be opened or Raft refuses the configuration. Unreachable peers are
/// not an error: the node starts and serves anyway.
pub async fn start(config: NodeConfig, listeners: Listeners) -> Result<RunningNode, StartError> {
    open_dir(&config.data_dir)?;
    let faults = Faults::new(config.fault_injection);
    let log_store = LogStore::open(
        &config.data_dir.join("raft-log.redb"),
        config.node_id,
        faults.clone(),
    )
    .map_err(|e| StartError::LogStore(e.to_string()))?;
    let durable = log_store.durable();
    let log_bytes = log_store.log_bytes();
    let disk = SledDisk::open(&config.data_dir.join("state.sled"), SLED_CACHE_BYTES)?;
    let state = StateMachineStore::open(&disk, durable.clone())?;
    let snapshot_state = state.clone();
    let local = LocalEngine::open(
        &config.data_dir.join(crate::fallback::NODE_SCOPE_JOURNAL),
        config.node_id,
    )?;
    let peers = PeerClients::new(
        &config.cluster_id,
        config.node_id,
        faults.clone(),
        durable.clone(),
    )
    .answering_commit_only(std::time::Duration::from_millis(config.heartbeat_ms));
    let raft = Raft::new(
        config.node_id,
        Arc::new(raft_config(&config)?),
        peers.clone(),
        log_store,
        state.clone(),
    )
    .await
    .map_err(|e| StartError::Raft(e.to_string()))?;
    let limits = BatchLimits {
        batch_commands_max: config.batch_commands_max,
        queue_depth_max: config.queue_depth_max,
        proposals_in_flight_max: config.proposals_in_flight_max,
        forwards_in_flight_max: config.forwards_in_flight_max,
        linger: std::time::Duration::from_micros(config.batch_linger_us),
    };
    let proposer = Proposer::start(
        Arc::new(Router::new(config.node_id, raft.clone(), peers)),
        limits,
    );
    let node = Arc::new(Node::new(NodeParts {
        id: config.node_id,
        raft: raft.clone(),
        state,
        proposer: proposer.clone(),
        local,
        fallback: Fallback::open(
            &config.data_dir,
            &disk,
            config.node_id,
            config.fallback_budget,
        )?,
        voters_max: config.voters_max,
        durable,
    }));
    // Every store's file and directory now exists; their names reach the disk before
    // anything is acknowledged (a vote, an entry), or a power cut could lose a whole file.
    sync_dir(&config.data_dir)?;
    let (stop, stopped) = watch::channel(false);
    let servers = vec![
        tokio::spawn(serve_peers(
            raft.clone(),
            &config,
            proposer,
            faults.clone(),
            listeners.raft,
            stopped.clone(),
        )),
        tokio::spawn(serve_api(
            node.clone(),
            &config,
            faults,
            listeners.api,
            stopped.clone(),
        )),
        tokio::spawn(snapshots::run(
            raft.clone(),
            log_bytes,
            snapshot_state,
            SnapshotPolicy {
                logs_since_last: config.snapshot_logs_since_last,
                log_percent: config.snapshot_log_percent,
            },
            stopped.clone(),
        )),
        tokio::spawn(reconcile::run(node.clone(), stopped)),
    ];
    form_cluster_once(&raft, &config).await?;
    tracing::info!(node_id = config.node_id, api_addr = %config.api_addr, raft_addr = %config.raft_addr, "node started");
    Ok(RunningNode {
        node,
        stop,
        servers,
    })
}

/// On a pristine node listed among the initial members, proposes the initial membership.
/// Every initial member does this; openraft makes repeats with the same config safe, so
/// the cluster forms exactly once whatever order the nodes start in.
async fn form_cluster_once(raft: &Raft, config: &NodeConfig) -> Result<(), StartError> {
    if !config.is_initial_member()
        || raft
            .is_initialized()
            .await
            .map_err(|e| StartError::Raft(e.to_string()))?
    {
        return Ok(());
    }
    let members: BTreeMap<u64, MemberNode> = config
        .members
        .iter()
        .map(|m| {
            let node = MemberNode {
                api_addr: m.api_addr.clone(),
                raft_addr: m.raft_addr.clone(),
            };
            (m.id, node)
        })
        .collect();
    match raft.initialize(members).await {
        Ok(()) => tracing::info!("initial membership proposed"),
        Err(e) => tracing::info!(error = %e, "cluster already formed"),
    }
    Ok(())
}

/// Accepted connections with Nagle's algorithm off: small request/answer messages would
/// otherwise wait for delayed ACKs (about 40 ms on Linux). `Server::tcp_nodelay` only
/// applies to listeners tonic binds itself, not to an incoming stream.
fn incoming(
    listener: TcpListener,
) -> impl tokio_stream::Stream<Item = std::io::Result<tokio::net::TcpStream>> {
    use tokio_stream::StreamExt;
    TcpListenerStream::new(listener).map(|accepted| {
        let stream = accepted?;
        stream.set_nodelay(true)?;
        Ok(stream)
    })
}

async fn until_stopped(mut stopped: watch::Receiver<bool>) {
    let _ = stopped.wait_for(|stop| *stop).await;
}

fn serve_peers(
    raft: Raft,
    config: &NodeConfig,
    proposer: Proposer,
    faults: Faults,
    listener: TcpListener,
    stopped: watch::Receiver<bool>,
) -> impl std::future::Future<Output = ()> + Send + 'static {
    let service = PeerService::new(raft, config.cluster_id.clone(), Arc::new(proposer), faults);
    let server = pb::internal::peer_server::PeerServer::new(service)
        .max_decoding_message_size(PEER_MESSAGE_BYTES_MAX)
        .max_encoding_message_size(PEER_MESSAGE_BYTES_MAX);
    async move {
        let served = Server::builder()
            .add_service(server)
            .serve_with_incoming_shutdown(incoming(listener), until_stopped(stopped))
            .await;
        if let Err(e) = served {
            tracing::error!(error = %e, "raft server stopped");
        }
    }
}

fn serve_api(
    node: Arc<Node>,
    config: &NodeConfig,
    faults: Faults,
    listener: TcpListener,
    stopped: watch::Receiver<bool>,
) -> impl std::future::Future<Output = ()> + Send + 'static {
    let defaults = RequestDefaults {
        timeout: config.timeout_default,
        claim_ttl_ms: config.claim_ttl_ms_default,
    };
    let fleet = pb::fleet_server::FleetServer::new(FleetService::new(node.clone(), defaults));
    let admin = pb::internal::admin_server::AdminServer::new(AdminService::new(node, faults));
    async move {
        let (health, health_service) = tonic_health::server::health_reporter();
        health
            .set_serving::<pb::fleet_server::FleetServer<FleetService>>()
            .await;
        let served = Server::builder()
            .add_service(health_service)
            .add_service(fleet)
            .add_service(admin)
            .serve_with_incoming_shutdown(incoming(listener), until_stopped(stopped))
            .await;
        if let Err(e) = served {
            tracing::error!(error = %e, "api server stopped");
        }
    }
}

impl RunningNode {
    /// Stops serving, shuts Raft down and waits for the servers to finish.
    pub async fn shutdown(self) {
        let _ = self.stop.send(true);
        if let Err(e) = self.node.raft().shutdown().await {
            tracing::warn!(error = %e, "raft shutdown");
        }
        for server in self.servers {
            let _ = tokio::time::timeout(Duration::from_secs(5), server).await;
        }
        // The claim journals flush in the background: the last records reach the disk here.
        if let Err(e) = self.node.sync_local().await {
            tracing::error!(error = %e, "claim journal sync at shutdown");
        }
    }
}
