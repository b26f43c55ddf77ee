//! Start-up and shutdown of one node process: open the stores, start Raft, serve the
//! public API (`Fleet`, health) on `api_addr` and Raft traffic and administration (`Peer`,
//! `Admin`) on `raft_addr`, each with its TLS and limits ([`crate::limits`]), form the
//! cluster on first start, and drain on the way out. Start-up never waits for peers.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tonic_health::server::HealthReporter;

use crate::accept::{MemberSources, UnixSocket};
use crate::api::admin::AdminService;
use crate::api::drain::DrainGate;
use crate::api::envoy::EnvoyService;
use crate::api::validate::RequestDefaults;
use crate::api::FleetService;
use crate::clock::{Clock, LocalTime, SystemClock};
use crate::config::NodeConfig;
use crate::local::reconcile;
use crate::local::Fallback;
use crate::local::LocalEngine;
use crate::node::propose::{BatchLimits, Proposer};
use crate::node::router::Router;
use crate::node::{Node, NodeParts};
use crate::pb;
use crate::raft::clock_view::{self, ClockView};
use crate::raft::durability::network::DurableNetwork;
use crate::raft::faults::Faults;
use crate::raft::log_store::{DurableLog, LogBytes, LogStore};
use crate::raft::network::PeerClients;
use crate::raft::service::PeerService;
use crate::raft::state_machine::policy::{self, SnapshotPolicy};
use crate::raft::state_machine::StateMachineStore;
use crate::raft::{MemberNode, Raft};
use crate::storage::layout::{NODE_SCOPE_JOURNAL, RAFT_LOG_FILE, RESTORE_MARKER, STATE_SLED_DIR};
use crate::storage::sled_disk::SledDisk;
use crate::storage::unless_panic;
use crate::tls::{ApiTls, PeerTls};

mod follow;
mod serve;

use follow::{follow_members, follow_raft};
use serve::{serve_api, serve_peers};

/// sled's page cache (default 1 GiB): it holds the latest snapshot and the node-scope and
/// fallback claim indexes, all read rarely; the live state is in memory already.
const SLED_CACHE_BYTES: u64 = 64 * 1024 * 1024;
/// How long a stopping node waits for its servers' connections to close by themselves.
const SERVERS_STOP_WAIT: Duration = Duration::from_secs(2);
/// The exit status of a node whose Raft core stopped (after its drain), for its
/// supervisor to start it again: 0 is a requested stop, 1 a start refused.
pub const RAFT_CORE_STOPPED_EXIT_CODE: i32 = 3;
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
    #[error(
        "data dir {path}: a `snapshot restore` into it did not finish ({marker} is there): \
         empty the data dir and restore again"
    )]
    RestoreIncomplete { path: String, marker: String },
    #[error("raft log store: {0}")]
    LogStore(#[from] crate::raft::log_store::LogStoreError),
    #[error("sled store {path}: {reason}")]
    Sled { path: String, reason: String },
    /// The snapshot (its record in `state.sled`, its file in `snapshot/`) does not read, or
    /// does not fit the log.
    #[error("state machine, from the snapshot in {path} (sled tree `snapshots`): {reason}")]
    State { path: String, reason: String },
    #[error("local engine: {0}")]
    Local(#[from] crate::local::LocalError),
    #[error("raft config: {0}")]
    RaftConfig(#[from] openraft::ConfigError),
    #[error("raft: {0}")]
    Raft(#[from] openraft::error::Fatal<crate::raft::NodeId>),
    #[error("{0}")]
    Tls(#[from] crate::tls::TlsError),
    #[error("grpc reflection: {0}")]
    Reflection(#[source] tonic_reflection::server::Error),
    #[error("{0}")]
    RateLimits(#[from] crate::api::envoy::limits_file::LimitsError),
    #[error(
        "rate_limits_file: a limit's unit is {unit_us} us, past config key `capacity_us_max` \
         ({capacity_us_max} us)"
    )]
    RateLimitUnit { unit_us: u64, capacity_us_max: u64 },
}

/// The listening sockets of a node (bound before start, so tests can use port 0).
pub struct Listeners {
    pub api: TcpListener,
    pub raft: TcpListener,
    /// `api_socket`, when configured.
    pub api_socket: Option<UnixSocket>,
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
        let api_socket = config
            .api_socket
            .as_deref()
            .map(|path| {
                UnixSocket::bind(path).map_err(|source| StartError::Bind {
                    addr: format!("api_socket {}", path.display()),
                    source,
                })
            })
            .transpose()?;
        Ok(Self {
            api: bind(config.api_addr).await?,
            raft: bind(config.raft_addr).await?,
            api_socket,
        })
    }
}

/// A started node: its servers run until [`RunningNode::drain`] or
/// [`RunningNode::shutdown`].
pub struct RunningNode {
    pub node: Arc<Node>,
    /// Why the Raft core stopped, once it did without being told to (`follow_raft`).
    core_stopped: watch::Receiver<Option<String>>,
    stop: watch::Sender<bool>,
    servers: Vec<JoinHandle<()>>,
    gate: DrainGate,
    health: tonic_health::server::HealthReporter,
    disk: SledDisk,
    drain_timeout: Duration,
}

fn raft_config(config: &NodeConfig) -> Result<openraft::Config, openraft::ConfigError> {
    openraft::Config {
        cluster_name: config.cluster_id.clone(),
        heartbeat_interval: config.heartbeat_ms,
        election_timeout_min: config.election_timeout_ms_min,
        election_timeout_max: config.election_timeout_ms_max,
        install_snapshot_timeout: INSTALL_SNAPSHOT_TIMEOUT_MS,
        // `raft::state_machine::policy` decides when (entries and log size, not entries alone).
        snapshot_policy: openraft::SnapshotPolicy::Never,
        max_in_snapshot_log_to_keep: config.snapshot_logs_kept,
        ..openraft::Config::default()
    }
    .validate()
}

/// Creates the data dir, mode 0700 (also an existing one: `storage::create_private_dir`),
/// and makes its name durable in its parent.
fn open_dir(path: &Path) -> Result<(), StartError> {
    crate::storage::create_private_dir(path).map_err(|source| StartError::DataDir {
        path: path.display().to_string(),
        source,
    })?;
    sync_dir(crate::storage::parent_dir(path))
}

/// fsyncs a directory ([`crate::storage::sync_dir`]); the error names it.
fn sync_dir(path: &Path) -> Result<(), StartError> {
    crate::storage::sync_dir(path).map_err(|source| StartError::DataDir {
        path: path.display().to_string(),
        source,
    })
}

/// Opens `state.sled`; sled's errors and panics name it.
fn open_sled(path: &Path) -> Result<SledDisk, StartError> {
    let reason = match unless_panic(|| SledDisk::open(path, SLED_CACHE_BYTES)) {
        Ok(Ok(disk)) => return Ok(disk),
        Ok(Err(e)) => e.to_string(),
        Err(panic) => format!("sled panicked: {panic}"),
    };
    Err(StartError::Sled {
        path: path.display().to_string(),
        reason,
    })
}

/// The state machine from the snapshot in `disk` (at `path`), which must cover the log up
/// to `purged`: the log no longer has those entries. A snapshot is stored (and synced)
/// before the log it covers is purged, so one that does not reach the purge point is one
/// sled lost: it recovers a prefix of its writes from a damaged file without a word.
fn open_state(
    path: &Path,
    disk: &SledDisk,
    durable: &crate::raft::durability::DurableLog,
    purged: Option<crate::raft::LogId>,
    planted: crate::planted::Planted,
) -> Result<StateMachineStore, StartError> {
    let failed = |reason: String| StartError::State {
        path: path.display().to_string(),
        reason,
    };
    let state = match unless_panic(|| StateMachineStore::open(disk, durable.clone(), planted)) {
        Ok(Ok(state)) => state,
        Ok(Err(e)) => return Err(failed(e.to_string())),
        Err(panic) => return Err(failed(format!("sled panicked: {panic}"))),
    };
    let applied = state.lock().last_applied;
    if purged.map(|id| id.index) > applied.map(|id| id.index) {
        return Err(failed(format!(
            "it reaches log index {}, but the log is purged up to {}: the entries between are \
             gone (the snapshot was lost or went back to an older one)",
            applied.map_or_else(|| "none".to_owned(), |id| id.index.to_string()),
            purged.map_or(0, |id| id.index),
        )));
    }
    Ok(state)
}

/// Opens the stores, starts Raft and both servers, and forms the cluster on first start.
///
/// # Errors
/// When a store cannot be opened or Raft refuses the configuration. Unreachable peers are
/// not an error: the node starts and serves anyway.
pub async fn start(config: NodeConfig, listeners: Listeners) -> Result<RunningNode, StartError> {
    let peer_tls = config.peer_tls.as_ref().map(PeerTls::load).transpose()?;
    let api_tls = config.api_tls.as_ref().map(ApiTls::load).transpose()?;
    warn_if_insecure(&config, peer_tls.is_some());
    // The limits file is checked before anything touches the data dir.
    let envoy_limits = Arc::new(envoy_limits(&config)?);
    let core = start_core(&config, peer_tls.as_ref()).await?;
    let (raft, node) = (core.raft, core.node);
    // After every store is open, before anything is served.
    settle_data_dir(&config.data_dir)?;
    let (stop, stopped) = watch::channel(false);
    let (core_stop_sender, core_stopped) = watch::channel(None);
    let gate = DrainGate::default();
    let served = Served {
        config: &config,
        raft: &raft,
        node: &node,
        proposer: core.proposer,
        faults: core.faults,
        clock: &core.clock,
        peer_tls: peer_tls.as_ref(),
        api_tls: api_tls.as_ref(),
        envoy_limits,
        gate: &gate,
    };
    let (mut servers, health) = spawn_servers(served, listeners, &stopped).await?;
    servers.extend([
        spawn_snapshot_policy(
            &raft,
            &config,
            core.log_bytes,
            core.snapshot_state,
            stopped.clone(),
        ),
        tokio::spawn(follow_raft(
            raft.clone(),
            config.node_id,
            // A leader that heard from no quorum for two election timeouts is cut off.
            Duration::from_millis(2 * config.election_timeout_ms_max),
            health.clone(),
            gate.clone(),
            core_stop_sender,
            stopped.clone(),
        )),
        tokio::spawn(clock_view::watch(
            raft.clone(),
            core.clock,
            // Often enough that a skewed leader stands down within an election timeout.
            Duration::from_millis(config.heartbeat_ms.max(10)),
            stopped.clone(),
        )),
        tokio::spawn(reconcile::run(node.clone(), stopped)),
    ]);
    form_cluster_once(&raft, &config).await?;
    tracing::info!(node_id = config.node_id, api_addr = %config.api_addr, raft_addr = %config.raft_addr, "node started");
    Ok(RunningNode {
        node,
        core_stopped,
        stop,
        servers,
        gate,
        health,
        disk: core.disk,
        drain_timeout: config.drain_timeout,
    })
}

/// What [`start_core`] started: Raft and the node around it, and what the servers and the
/// node's tasks take of the stores.
struct Core {
    raft: Raft,
    node: Arc<Node>,
    proposer: Proposer,
    faults: Faults,
    clock: ClockView,
    disk: SledDisk,
    /// The log's size as it grows, for the snapshot policy.
    log_bytes: LogBytes,
    /// The state machine's handle the snapshot policy reads.
    snapshot_state: StateMachineStore,
}

/// Opens the stores and starts Raft, the proposer and the node on them; serves nothing.
async fn start_core(config: &NodeConfig, peer_tls: Option<&PeerTls>) -> Result<Core, StartError> {
    let Stores {
        faults,
        log_store,
        log_bytes,
        durable,
        disk,
        state,
        max_clock_offset,
        clocks,
        local_time,
        local,
    } = open_stores(config)?;
    let snapshot_state = state.clone();
    let clock = ClockView::new(config.node_id, max_clock_offset);
    let peers = PeerClients::new(&config.cluster_id, config.node_id, faults.clone())
        .with_tls(peer_tls.map(PeerTls::client))
        .with_clock(clock.clone());
    let network = DurableNetwork::new(peers.clone(), durable.clone())
        .answering_commit_only(std::time::Duration::from_millis(config.heartbeat_ms));
    let raft = Raft::new(
        config.node_id,
        Arc::new(raft_config(config)?),
        network,
        log_store,
        state.clone(),
    )
    .await?;
    let router = Router::new(
        config.node_id,
        raft.clone(),
        peers,
        config.state_limits,
        clock.clone(),
        clocks.clone(),
    );
    let proposer = Proposer::start(Arc::new(router), batch_limits(config), config.ceilings);
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
            local_time,
        )?,
        voters_max: config.voters_max,
        durable,
        planted_bug: config.planted_bug,
        clock: clock.clone(),
        clocks,
    }));
    Ok(Core {
        raft,
        node,
        proposer,
        faults,
        clock,
        disk,
        log_bytes,
        snapshot_state,
    })
}

/// Says once at start what an insecure setting lets anyone do (`insecure_peer_traffic`
/// says nothing once `[peer_tls]` is loaded: the peers are authenticated then).
fn warn_if_insecure(config: &NodeConfig, peer_tls_loaded: bool) {
    if !peer_tls_loaded && config.insecure_peer_traffic {
        tracing::warn!(raft_addr = %config.raft_addr, "insecure_peer_traffic = true: Raft traffic is plaintext and unauthenticated; anyone who reaches raft_addr can rewrite this node's log");
    }
    if config.insecure_edge_api {
        tracing::warn!(api_addr = %config.api_addr, "insecure_edge_api = true: edge clients are not authenticated; anyone who reaches api_addr can spend, reset and claim for every tenant");
    }
}

/// The proposer's queue and batch limits, as configured.
fn batch_limits(config: &NodeConfig) -> BatchLimits {
    BatchLimits {
        batch_commands_max: config.batch_commands_max,
        queue_depth_max: config.queue_depth_max,
        proposals_in_flight_max: config.proposals_in_flight_max,
        forwards_in_flight_max: config.forwards_in_flight_max,
        linger: std::time::Duration::from_micros(config.batch_linger_us),
    }
}

/// Once every store's file and directory exists: their names reach the disk before
/// anything is acknowledged (a vote, an entry), or a power cut could lose a whole file;
/// and files an older version or a wider umask left readable become the node user's alone.
fn settle_data_dir(data_dir: &Path) -> Result<(), StartError> {
    sync_dir(data_dir)?;
    crate::storage::make_tree_private(data_dir).map_err(|source| StartError::DataDir {
        path: data_dir.display().to_string(),
        source,
    })
}

/// The task that asks for a snapshot once enough entries came since the last one and the
/// log has grown past the configured share of the last snapshot's size (`SnapshotPolicy`).
fn spawn_snapshot_policy(
    raft: &Raft,
    config: &NodeConfig,
    log_bytes: LogBytes,
    state: StateMachineStore,
    stopped: watch::Receiver<bool>,
) -> JoinHandle<()> {
    let rule = SnapshotPolicy {
        logs_since_last: config.snapshot_logs_since_last,
        log_percent: config.snapshot_log_percent,
    };
    tokio::spawn(policy::run(
        raft.clone(),
        config.node_id,
        log_bytes,
        state,
        rule,
        stopped,
    ))
}

/// The parts of a started node its servers answer with.
struct Served<'a> {
    config: &'a NodeConfig,
    raft: &'a Raft,
    node: &'a Arc<Node>,
    proposer: Proposer,
    faults: Faults,
    clock: &'a ClockView,
    peer_tls: Option<&'a PeerTls>,
    api_tls: Option<&'a ApiTls>,
    envoy_limits: Arc<crate::api::envoy::limits_file::Limits>,
    gate: &'a DrainGate,
}

/// Spawns the node's two gRPC servers (`Peer` and `Admin` on `raft_addr`; `Fleet`, Envoy's
/// service and health on `api_addr`) and the task that gives members' addresses connection
/// places of their own on `raft_addr`. Returns their tasks and the health reporter, which
/// says NOT_SERVING until `follow_raft` sees a leader.
async fn spawn_servers(
    served: Served<'_>,
    listeners: Listeners,
    stopped: &watch::Receiver<bool>,
) -> Result<(Vec<JoinHandle<()>>, HealthReporter), StartError> {
    let Served {
        config,
        raft,
        node,
        proposer,
        faults,
        clock,
        peer_tls,
        api_tls,
        envoy_limits,
        gate,
    } = served;
    let (health, health_service) = tonic_health::server::health_reporter();
    // Until the node knows a leader (see `follow_raft`).
    health
        .set_not_serving::<pb::fleet_server::FleetServer<FleetService>>()
        .await;
    let admin = AdminService::new(
        node.clone(),
        config.cluster_id.clone(),
        faults.clone(),
        peer_tls.is_some(),
    );
    // Members' addresses get connection places of their own on raft_addr: the config's
    // initial members at once, then the membership as it changes.
    let members = MemberSources::default();
    let initial: Vec<String> = config.members.iter().map(|m| m.raft_addr.clone()).collect();
    members.set(initial.iter().map(String::as_str));
    let peer = PeerService::new(
        raft.clone(),
        config.cluster_id.clone(),
        Arc::new(proposer),
        faults,
        peer_tls.is_some(),
        config.members.iter().map(|member| member.id).collect(),
    )
    .with_clock(clock.clone());
    let fleet = FleetService::new(node.clone(), request_defaults(config), gate.clone());
    let envoy = EnvoyService::new(
        node.clone(),
        envoy_limits,
        config.timeout_default,
        gate.clone(),
    );
    let servers = vec![
        tokio::spawn(follow_members(
            raft.clone(),
            members.clone(),
            initial,
            stopped.clone(),
        )),
        tokio::spawn(serve_peers(
            peer,
            admin,
            peer_tls,
            (listeners.raft, members),
            stopped.clone(),
        )?),
        tokio::spawn(serve_api(
            fleet,
            envoy,
            health_service,
            api_tls,
            (listeners.api, listeners.api_socket),
            stopped.clone(),
        )?),
    ];
    Ok((servers, health))
}

/// What a node keeps on disk, opened: the Raft log and vote, the state machine from its
/// snapshot, and the node-scope engine on the node's bounded local time.
struct Stores {
    faults: Faults,
    log_store: LogStore,
    /// The log's size as it grows, for the snapshot policy.
    log_bytes: LogBytes,
    durable: DurableLog,
    disk: SledDisk,
    state: StateMachineStore,
    max_clock_offset: Duration,
    /// The machine's clocks: the leader's stamps, the local time and reconciliation's
    /// round numbers read them.
    clocks: Arc<dyn Clock>,
    local_time: Arc<LocalTime>,
    local: LocalEngine,
}

/// Opens the stores of `config.data_dir` (refused while a restore is incomplete).
fn open_stores(config: &NodeConfig) -> Result<Stores, StartError> {
    if config.data_dir.join(RESTORE_MARKER).exists() {
        return Err(StartError::RestoreIncomplete {
            path: config.data_dir.display().to_string(),
            marker: RESTORE_MARKER.to_owned(),
        });
    }
    open_dir(&config.data_dir)?;
    let faults = Faults::new(config.fault_injection).planting(config.planted_bug);
    let log_store = LogStore::open(
        &config.data_dir.join(RAFT_LOG_FILE),
        config.node_id,
        faults.clone(),
    )?;
    let durable = log_store.durable();
    let log_bytes = log_store.log_bytes();
    let purged = log_store.last_purged()?;
    let sled_path = config.data_dir.join(STATE_SLED_DIR);
    let disk = open_sled(&sled_path)?;
    let state = open_state(&sled_path, &disk, &durable, purged, faults.planted())?;
    // The planted `unbounded_clock` plays the fleet before its time was bounded: no bound.
    let max_clock_offset = if faults
        .planted()
        .is(crate::planted::PlantedBug::UnboundedClock)
    {
        Duration::MAX
    } else {
        Duration::from_millis(config.max_clock_offset_ms)
    };
    // Both local engines decide by it (docs/decisions/026, addendum).
    let clocks: Arc<dyn Clock> = Arc::new(SystemClock::default());
    let local_time = Arc::new(LocalTime::new(clocks.clone(), max_clock_offset));
    let local = LocalEngine::open(
        &config.data_dir.join(NODE_SCOPE_JOURNAL),
        config.node_id,
        local_time.clone(),
    )?;
    Ok(Stores {
        faults,
        log_store,
        log_bytes,
        durable,
        disk,
        state,
        max_clock_offset,
        clocks,
        local_time,
        local,
    })
}

/// Envoy's rate limits from `rate_limits_file` (none: every descriptor answers OK),
/// checked against the state's ceilings.
fn envoy_limits(config: &NodeConfig) -> Result<crate::api::envoy::limits_file::Limits, StartError> {
    let Some(path) = &config.rate_limits_file else {
        tracing::info!(
            "no rate_limits_file: Envoy's ShouldRateLimit answers OK to every descriptor"
        );
        return Ok(crate::api::envoy::limits_file::Limits::default());
    };
    let limits = crate::api::envoy::limits_file::Limits::load(path)?;
    let capacity_us_max = config.ceilings.capacity_us_max;
    if limits.longest_unit_us() > capacity_us_max {
        return Err(StartError::RateLimitUnit {
            unit_us: limits.longest_unit_us(),
            capacity_us_max,
        });
    }
    tracing::info!(path = %path.display(), domains = limits.domains(), "Envoy rate limits loaded");
    Ok(limits)
}

/// On a pristine node listed among the initial members, proposes the initial membership.
/// Every initial member does this; openraft makes repeats with the same config safe, so
/// the cluster forms exactly once whatever order the nodes start in.
async fn form_cluster_once(raft: &Raft, config: &NodeConfig) -> Result<(), StartError> {
    if !config.is_initial_member() || raft.is_initialized().await? {
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

async fn until_stopped(mut stopped: watch::Receiver<bool>) {
    let _ = stopped.wait_for(|stop| *stop).await;
}

fn request_defaults(config: &NodeConfig) -> RequestDefaults {
    RequestDefaults {
        timeout: config.timeout_default,
        claim_ttl_ms: config.claim_ttl_ms_default,
        ceilings: config.ceilings,
    }
}

impl RunningNode {
    /// Waits until the Raft core stops without being told to, and says why. The node cannot
    /// take part in the fleet any more: the caller drains it and exits with
    /// [`RAFT_CORE_STOPPED_EXIT_CODE`], so its supervisor starts it again from its data dir.
    /// Pending forever if the core never stops.
    pub async fn raft_core_stopped(&self) -> String {
        let mut core_stopped = self.core_stopped.clone();
        let why = core_stopped
            .wait_for(Option::is_some)
            .await
            .map(|why| why.clone().unwrap_or_default());
        match why {
            Ok(why) => why,
            // `follow_raft` ended without a stop: the node is stopping anyway.
            Err(_) => std::future::pending().await,
        }
    }

    /// The graceful stop (SIGTERM, SIGINT): health turns `NOT_SERVING`, new edge calls are
    /// refused `UNAVAILABLE`, the calls in flight are answered (within their deadlines, at
    /// most `drain_timeout`), then [`RunningNode::shutdown`] flushes the stores. Raft keeps
    /// running meanwhile, so those calls can still commit and peers can still reach the
    /// leader.
    pub async fn drain(self) {
        self.gate.begin();
        self.health
            .set_not_serving::<pb::fleet_server::FleetServer<FleetService>>()
            .await;
        self.health
            .set_service_status("", tonic_health::ServingStatus::NotServing)
            .await;
        let in_flight = self.gate.in_flight();
        tracing::info!(in_flight, drain_timeout = ?self.drain_timeout, "draining: refusing new calls");
        if self.gate.until_idle(self.drain_timeout).await {
            tracing::info!("drained: every call in flight was answered");
        } else {
            let in_flight = self.gate.in_flight();
            tracing::warn!(in_flight, "drain timed out with calls still in flight");
        }
        self.shutdown().await;
    }

    /// Stops serving, shuts Raft down and waits for the servers to finish.
    pub async fn shutdown(self) {
        // Without a drain first, edge calls must still stop here: one decided after the
        // journals' last sync below could be lost.
        self.gate.begin();
        let _ = self.stop.send(true);
        if let Err(e) = self.node.raft().shutdown().await {
            tracing::warn!(error = %e, "raft shutdown");
        }
        // A server stops gracefully once its connections close, and peers keep theirs open
        // (one Exchange stream each): past one shared deadline the rest are aborted. Edge
        // calls were answered already (the drain), Raft is down.
        let deadline = tokio::time::Instant::now() + SERVERS_STOP_WAIT;
        for mut server in self.servers {
            if tokio::time::timeout_at(deadline, &mut server)
                .await
                .is_err()
            {
                server.abort();
            }
        }
        // The claim journals flush in the background: the last records reach the disk here.
        if let Err(e) = self.node.sync_local().await {
            tracing::error!(error = %e, "claim journal sync at shutdown");
        }
        // The settle queue syncs each settle before it is answered; this also makes the
        // removals of applied ones durable, so a restart does not hand them over again.
        if let Err(e) = self.node.fallback().queue.sync().await {
            tracing::error!(error = %e, "settle queue sync at shutdown");
        }
        // sled's last writes (the snapshot is already durable: `SledDisk::flush_to_disk`).
        let disk = self.disk.clone();
        match tokio::task::spawn_blocking(move || disk.flush_to_disk()).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => tracing::error!(error = %e, "sled flush at shutdown"),
            Err(e) => tracing::error!(error = %e, "sled flush at shutdown"),
        }
    }
}
