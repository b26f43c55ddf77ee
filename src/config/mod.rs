//! Node configuration: the TOML file format (contract §15) → validation → [`NodeConfig`].
//!
//! Every limit the node enforces is named here with its unit and checked at start-up, so a
//! bad file fails before the node serves anything. This module never opens sockets or files
//! other than the config file itself.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use crate::planted::Planted;
use crate::state::check::Ceilings;
use crate::state::{NodeId, StateLimits};

/// One initial voter as listed in the file.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct MemberConfig {
    pub id: NodeId,
    pub api_addr: String,
    pub raft_addr: String,
}

/// The file as written by an operator; optional keys fall back to [`Defaults`].
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfigFile {
    pub node_id: NodeId,
    pub api_addr: String,
    pub raft_addr: String,
    pub data_dir: PathBuf,
    #[serde(default)]
    pub members: Vec<MemberConfig>,
    /// Raft traffic carrying another cluster id is refused.
    pub cluster_id: Option<String>,
    pub timeout_ms_default: Option<u32>,
    pub claim_ttl_ms_default: Option<u64>,
    pub voters_max: Option<usize>,
    pub heartbeat_ms: Option<u64>,
    pub election_timeout_ms_min: Option<u64>,
    pub election_timeout_ms_max: Option<u64>,
    /// How far this node's wall clock may be from a quorum's median, and how far a leader's
    /// stamps may run from its monotonic clock (contract §3).
    pub max_clock_offset_ms: Option<u64>,
    pub batch_commands_max: Option<usize>,
    pub queue_depth_max: Option<usize>,
    pub proposals_in_flight_max: Option<usize>,
    pub forwards_in_flight_max: Option<usize>,
    pub batch_linger_us: Option<u64>,
    pub snapshot_logs_since_last: Option<u64>,
    /// A snapshot also waits until the log written since the last one reaches this percent
    /// of that snapshot's size (0: entries alone decide).
    pub snapshot_log_percent: Option<u64>,
    /// Log entries kept behind a snapshot, so a briefly lagging follower needs no snapshot.
    pub snapshot_logs_kept: Option<u64>,
    pub metrics_addr: Option<String>,
    /// A Unix socket serving the same API as `api_addr`, without TLS, for an edge on this
    /// host (e.g. `/run/ankusa-fleet/api.sock`).
    pub api_socket: Option<PathBuf>,
    /// `text` (the default) or `json`: one JSON object per line.
    pub log_format: Option<LogFormat>,
    /// Limits for Envoy's rate limit service, in envoyproxy/ratelimit's YAML format.
    pub rate_limits_file: Option<PathBuf>,
    /// Local fallback charges: `fair_share` (capacity / voters) or `full` (whole capacity).
    pub fallback_budget: Option<FallbackBudget>,
    /// Lets the Admin `SetFaults` call drop, black-hole or delay Raft traffic. For fault
    /// tests only; never set it on a production node.
    #[serde(default)]
    pub fault_injection: bool,
    /// A known bug to plant, so a test can show the nemesis catches it; only with
    /// `fault_injection = true`, in a build with the `planted-bugs` feature.
    pub planted_bug: Option<PlantedBug>,
    /// Mutual TLS on `raft_addr` (required unless it is a loopback address).
    pub peer_tls: Option<PeerTlsFiles>,
    /// TLS on `api_addr` (optional: an edge on loopback may go without).
    pub api_tls: Option<ApiTlsFiles>,
    /// Lets a node whose `raft_addr` is not loopback run without `[peer_tls]`: anyone who
    /// reaches that address can then rewrite the node's log. Named so nobody sets it by
    /// accident.
    #[serde(default)]
    pub insecure_peer_traffic: bool,
    /// Lets a node whose `api_addr` is not loopback serve the edge API without `[api_tls]`
    /// and its `client_ca_file`: anyone who reaches that address can then spend, reset and
    /// claim for every tenant. Named so nobody sets it by accident.
    #[serde(default)]
    pub insecure_edge_api: bool,
    /// How long SIGTERM waits for calls in flight before the node stops anyway.
    pub drain_timeout_ms: Option<u64>,
    /// Live claims the fleet holds at most (stamped by the leader into every entry).
    pub claims_max: Option<u64>,
    /// Live buckets the fleet holds at most.
    pub buckets_max: Option<u64>,
    /// Live claims of one tenant at most.
    pub tenant_claims_max: Option<u64>,
    /// Live buckets of one owner (tenant, check_rate entity, Envoy domain) at most.
    pub tenant_buckets_max: Option<u64>,
    /// Longest claim `ttl_ms` / `pending_ttl_ms` a call may ask for (at most 30 days).
    pub ttl_ms_max: Option<u64>,
    /// Longest `capacity_us` (and check_rate window) a call may ask for (at most a year).
    pub capacity_us_max: Option<u64>,
}

/// `[peer_tls]`: both ends of every Raft connection present a certificate signed by
/// `ca_file` (a PEM bundle: several CAs while one is being rotated out).
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct PeerTlsFiles {
    pub ca_file: PathBuf,
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
}

/// `[api_tls]`: the edge API serves TLS only; with `client_ca_file`, edge clients must
/// present a certificate signed by it.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ApiTlsFiles {
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
    pub client_ca_file: Option<PathBuf>,
}

/// How much of a bucket's capacity a node grants on its own while the fleet is unreachable.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FallbackBudget {
    /// `capacity / voters` (never below one increment): a partitioned fleet admits at most
    /// about one extra budget in total, however the nodes are split.
    #[default]
    FairShare,
    /// The whole capacity on each cut-off node (the seed's node scope): up to one extra
    /// budget per cut-off node.
    Full,
}

/// How the node writes its log lines (`log_format`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line (tracing-subscriber's JSON output).
    Json,
}

pub use crate::planted::PlantedBug;

/// Defaults for every optional key.
pub struct Defaults;

impl Defaults {
    pub const CLUSTER_ID: &'static str = "ankusa-fleet";
    pub const TIMEOUT_MS: u32 = 1_000;
    /// One day: providers retry for hours, rarely for days.
    pub const CLAIM_TTL_MS: u64 = 86_400_000;
    pub const VOTERS_MAX: usize = 5;
    pub const HEARTBEAT_MS: u64 = 50;
    pub const ELECTION_TIMEOUT_MS_MIN: u64 = 300;
    pub const ELECTION_TIMEOUT_MS_MAX: u64 = 600;
    /// Far above NTP's error (milliseconds), far below a step that empties buckets (minutes).
    pub const MAX_CLOCK_OFFSET_MS: u64 = 500;
    pub const BATCH_COMMANDS_MAX: usize = 512;
    pub const QUEUE_DEPTH_MAX: usize = 16_384;
    pub const PROPOSALS_IN_FLIGHT_MAX: usize = 1;
    pub const FORWARDS_IN_FLIGHT_MAX: usize = 2;
    pub const BATCH_LINGER_US: u64 = 1_000;
    pub const SNAPSHOT_LOGS_SINCE_LAST: u64 = 5_000;
    pub const SNAPSHOT_LOGS_KEPT: u64 = 1_000;
    /// As Redis' `auto-aof-rewrite-percentage 100`: rewrite once the log doubled since.
    pub const SNAPSHOT_LOG_PERCENT: u64 = 100;
    /// Longer than the longest call deadline the API accepts, so a drain answers every
    /// call in flight (systemd's `TimeoutStopSec` must exceed it: docs/operations.md).
    pub const DRAIN_TIMEOUT_MS: u64 = 65_000;
    /// Sized for a 4 GiB node (docs/operations.md, "Sizing the state limits"): a live claim
    /// costs about 430 bytes of memory, so about 1.3 GiB of claims, with room for buckets,
    /// a snapshot's encoded copy and the log's tail.
    pub const CLAIMS_MAX: u64 = 3_000_000;
    /// A live bucket costs about 290 bytes: about 0.55 GiB of buckets.
    pub const BUCKETS_MAX: u64 = 2_000_000;
    /// A quarter of `CLAIMS_MAX`: one tenant's flood leaves room for the others.
    pub const TENANT_CLAIMS_MAX: u64 = 750_000;
    /// A quarter of `BUCKETS_MAX` (an Envoy domain's descriptors, an entity's operations).
    pub const TENANT_BUCKETS_MAX: u64 = 500_000;
    /// Seven days: past any provider's retries; a flood of claims holds its room a week.
    pub const TTL_MS_MAX: u64 = 7 * 86_400_000;
    /// 31 days: a monthly quota's burst still fits (and an Envoy day twice over), and a
    /// flood of buckets holds its room for a month at most, not a year.
    pub const CAPACITY_US_MAX: u64 = 31 * 86_400_000_000;
}

/// The most commands one log entry may carry: at most `limits::COMMAND_BYTES_MAX` each, an
/// entry then stays well within `limits::PEER_MESSAGE_BYTES_MAX`.
pub const BATCH_COMMANDS_MAX_MAX: usize = 2_048;

/// The largest `max_clock_offset_ms`: a minute of fleet time a bad clock may add.
pub const MAX_CLOCK_OFFSET_MS_MAX: u64 = 60_000;

/// The longest a busy batch may be told to wait (`batch_linger_us`).
pub const BATCH_LINGER_US_MAX: u64 = 100_000;

pub use crate::contract::TIMEOUT_MS_MAX;

/// A config that failed validation; the message names the key.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("parsing {path}: {source}")]
    Parse {
        path: PathBuf,
        source: Box<toml::de::Error>,
    },
    #[error("config key `{field}`: {reason}")]
    Invalid { field: String, reason: String },
}

fn invalid(field: impl Into<String>, reason: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        field: field.into(),
        reason: reason.into(),
    }
}

/// The bug a `planted_bug` key plants: only with `fault_injection = true`, and only in a
/// build with the `planted-bugs` feature (a release build refuses the key at load).
fn planted(bug: Option<PlantedBug>, fault_injection: bool) -> Result<Planted, ConfigError> {
    let Some(bug) = bug else {
        return Ok(Planted::default());
    };
    if !fault_injection {
        return Err(invalid("planted_bug", "needs fault_injection = true"));
    }
    Planted::new(bug).ok_or_else(|| {
        invalid(
            "planted_bug",
            "this build has no planted bugs: they need the `planted-bugs` cargo feature \
             (the nemesis's test builds have it, a release build does not)",
        )
    })
}

/// The longest path a Unix socket address holds (`sun_path` is 108 bytes on Linux, one of
/// them the terminating NUL).
const SOCKET_PATH_BYTES_MAX: usize = 107;

/// A socket path must be a file name that fits in a socket address.
fn check_socket_path(field: &str, path: PathBuf) -> Result<PathBuf, ConfigError> {
    let len = path.as_os_str().len();
    if len == 0 || path.file_name().is_none() {
        return Err(invalid(field, "must name a socket file"));
    }
    if len > SOCKET_PATH_BYTES_MAX {
        return Err(invalid(
            field,
            format!("{len} bytes is over the {SOCKET_PATH_BYTES_MAX} a Unix socket path may have"),
        ));
    }
    Ok(path)
}

/// A validated node configuration.
#[derive(Clone, Debug)]
pub struct NodeConfig {
    pub node_id: NodeId,
    pub api_addr: SocketAddr,
    pub raft_addr: SocketAddr,
    pub data_dir: PathBuf,
    pub members: Vec<MemberConfig>,
    pub cluster_id: String,
    pub timeout_default: Duration,
    pub claim_ttl_ms_default: u64,
    pub voters_max: usize,
    pub heartbeat_ms: u64,
    pub election_timeout_ms_min: u64,
    pub election_timeout_ms_max: u64,
    pub max_clock_offset_ms: u64,
    pub batch_commands_max: usize,
    pub queue_depth_max: usize,
    pub proposals_in_flight_max: usize,
    pub forwards_in_flight_max: usize,
    /// How long a busy batch may wait for the callers the last one answered (0: never
    /// waits).
    pub batch_linger_us: u64,
    /// Fewest log entries between two snapshots.
    pub snapshot_logs_since_last: u64,
    /// Log bytes written since the last snapshot, in percent of its size, before the next
    /// one (0: only `snapshot_logs_since_last` counts). Snapshot work then grows with the
    /// log written, not with the state times the entries.
    pub snapshot_log_percent: u64,
    pub snapshot_logs_kept: u64,
    pub metrics_addr: Option<SocketAddr>,
    /// The edge API on a Unix socket too (no TLS: only who may open the file connects).
    pub api_socket: Option<PathBuf>,
    pub log_format: LogFormat,
    pub rate_limits_file: Option<PathBuf>,
    pub fallback_budget: FallbackBudget,
    pub fault_injection: bool,
    /// The bug the node plays (`crate::planted`): none unless the config names one.
    pub planted_bug: Planted,
    pub peer_tls: Option<PeerTlsFiles>,
    pub api_tls: Option<ApiTlsFiles>,
    pub insecure_peer_traffic: bool,
    /// Set, and edge clients are not authenticated (no `client_ca_file`): the node warns
    /// at start.
    pub insecure_edge_api: bool,
    /// How long a drain (SIGTERM, SIGINT) waits for calls in flight.
    pub drain_timeout: Duration,
    /// How many claims and buckets the fleet admits (stamped into entries this node
    /// proposes while it leads).
    pub state_limits: StateLimits,
    /// The node's ceilings under the contract's ttl and capacity maxima.
    pub ceilings: Ceilings,
}

impl NodeConfig {
    /// Reads and validates a TOML file.
    ///
    /// # Errors
    /// When the file cannot be read, is not TOML of the expected shape, or a value is out of
    /// range (the error names the key).
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        Self::from_toml(&text).map_err(|e| match e {
            ConfigError::Parse { source, .. } => ConfigError::Parse {
                path: path.to_owned(),
                source,
            },
            other => other,
        })
    }

    /// Parses and validates TOML text.
    ///
    /// # Errors
    /// As [`NodeConfig::load`].
    pub fn from_toml(text: &str) -> Result<Self, ConfigError> {
        let file: ConfigFile = toml::from_str(text).map_err(|source| ConfigError::Parse {
            path: PathBuf::from("<text>"),
            source: Box::new(source),
        })?;
        Self::validate(file)
    }

    /// Checks every key and fills the defaults.
    ///
    /// # Errors
    /// The first invalid key, by name.
    pub fn validate(file: ConfigFile) -> Result<Self, ConfigError> {
        if file.node_id == 0 {
            return Err(invalid(
                "node_id",
                "must be at least 1 (0 means no leader on the wire)",
            ));
        }
        let api_addr = parse_addr("api_addr", &file.api_addr)?;
        let raft_addr = parse_addr("raft_addr", &file.raft_addr)?;
        validate_members(&file)?;
        check_peer_security(&file, raft_addr)?;
        check_edge_tls(&file, api_addr)?;
        let insecure_edge_api = file.insecure_edge_api && !edge_authenticated(&file);
        let drain_timeout = drain_timeout(&file)?;
        let timing = RaftTiming::of(&file)?;
        let timeout_default = timeout_default(&file)?;
        let claim_ttl_ms_default = claim_ttl_ms_default(&file)?;
        let ceilings = ceilings(&file)?;
        let state_limits = state_limits(&file)?;
        within_ttl_ms_max(claim_ttl_ms_default, &ceilings)?;
        let voters_max = voters_max(&file)?;
        let cluster_id = cluster_id(&file)?;
        let max_clock_offset_ms = max_clock_offset_ms(&file)?;
        let batch_commands_max = batch_commands_max(&file)?;
        let tuning = Tuning::of(&file)?;
        Ok(NodeConfig {
            node_id: file.node_id,
            api_addr,
            raft_addr,
            data_dir: file.data_dir,
            members: file.members,
            cluster_id,
            timeout_default,
            claim_ttl_ms_default,
            voters_max,
            heartbeat_ms: timing.heartbeat_ms,
            election_timeout_ms_min: timing.election_timeout_ms_min,
            election_timeout_ms_max: timing.election_timeout_ms_max,
            max_clock_offset_ms,
            batch_commands_max,
            queue_depth_max: tuning.queue_depth_max,
            forwards_in_flight_max: tuning.forwards_in_flight_max,
            proposals_in_flight_max: tuning.proposals_in_flight_max,
            batch_linger_us: tuning.batch_linger_us,
            snapshot_logs_since_last: tuning.snapshot_logs_since_last,
            snapshot_log_percent: tuning.snapshot_log_percent,
            snapshot_logs_kept: tuning.snapshot_logs_kept,
            fallback_budget: file.fallback_budget.unwrap_or_default(),
            fault_injection: file.fault_injection,
            planted_bug: planted(file.planted_bug, file.fault_injection)?,
            peer_tls: file.peer_tls,
            api_tls: file.api_tls,
            insecure_peer_traffic: file.insecure_peer_traffic,
            insecure_edge_api,
            drain_timeout,
            metrics_addr: file
                .metrics_addr
                .as_deref()
                .map(|a| parse_addr("metrics_addr", a))
                .transpose()?,
            api_socket: file
                .api_socket
                .map(|path| check_socket_path("api_socket", path))
                .transpose()?,
            log_format: file.log_format.unwrap_or_default(),
            rate_limits_file: file.rate_limits_file,
            state_limits,
            ceilings,
        })
    }

    /// True when this node is one of the configured initial voters (it may then form the
    /// cluster on first start).
    pub fn is_initial_member(&self) -> bool {
        self.members.iter().any(|m| m.id == self.node_id)
    }
}

/// Without `[peer_tls]`, raft_addr must be loopback unless `insecure_peer_traffic` says
/// that anyone who reaches it may rewrite this node's log.
fn check_peer_security(file: &ConfigFile, raft_addr: SocketAddr) -> Result<(), ConfigError> {
    if file.peer_tls.is_none() && !raft_addr.ip().is_loopback() && !file.insecure_peer_traffic {
        return Err(invalid(
            "peer_tls",
            format!(
                "raft_addr {raft_addr} is not a loopback address: set [peer_tls] (see \
                 `ankusa-fleet certs`), or insecure_peer_traffic = true to let anyone who \
                 reaches it rewrite this node's log"
            ),
        ));
    }
    Ok(())
}

/// How long a stopping node waits for calls in flight (0: it stops at once).
fn drain_timeout(file: &ConfigFile) -> Result<Duration, ConfigError> {
    let drain_timeout_ms = file.drain_timeout_ms.unwrap_or(Defaults::DRAIN_TIMEOUT_MS);
    if drain_timeout_ms > DRAIN_TIMEOUT_MS_MAX {
        return Err(invalid(
            "drain_timeout_ms",
            format!("must be at most {DRAIN_TIMEOUT_MS_MAX} (0: stop at once)"),
        ));
    }
    Ok(Duration::from_millis(drain_timeout_ms))
}

fn voters_max(file: &ConfigFile) -> Result<usize, ConfigError> {
    let voters_max = file.voters_max.unwrap_or(Defaults::VOTERS_MAX);
    if voters_max == 0 {
        return Err(invalid("voters_max", "must be at least 1"));
    }
    Ok(voters_max)
}

fn cluster_id(file: &ConfigFile) -> Result<String, ConfigError> {
    let cluster_id = file
        .cluster_id
        .as_deref()
        .unwrap_or(Defaults::CLUSTER_ID)
        .to_owned();
    crate::identity::check_cluster_id(&cluster_id)
        .map_err(|reason| invalid("cluster_id", &reason))?;
    Ok(cluster_id)
}

/// The batching and snapshot settings, checked, with their defaults filled.
struct Tuning {
    queue_depth_max: usize,
    forwards_in_flight_max: usize,
    proposals_in_flight_max: usize,
    batch_linger_us: u64,
    snapshot_logs_since_last: u64,
    snapshot_log_percent: u64,
    snapshot_logs_kept: u64,
}

impl Tuning {
    fn of(file: &ConfigFile) -> Result<Self, ConfigError> {
        Ok(Self {
            queue_depth_max: positive(
                "queue_depth_max",
                file.queue_depth_max,
                Defaults::QUEUE_DEPTH_MAX,
            )?,
            forwards_in_flight_max: positive(
                "forwards_in_flight_max",
                file.forwards_in_flight_max,
                Defaults::FORWARDS_IN_FLIGHT_MAX,
            )?,
            proposals_in_flight_max: positive(
                "proposals_in_flight_max",
                file.proposals_in_flight_max,
                Defaults::PROPOSALS_IN_FLIGHT_MAX,
            )?,
            // A batch that waits longer only adds latency.
            batch_linger_us: at_most(
                "batch_linger_us",
                file.batch_linger_us,
                Defaults::BATCH_LINGER_US,
                BATCH_LINGER_US_MAX,
                "0 turns it off",
            )?,
            snapshot_logs_since_last: file
                .snapshot_logs_since_last
                .unwrap_or(Defaults::SNAPSHOT_LOGS_SINCE_LAST)
                .max(1),
            snapshot_log_percent: at_most(
                "snapshot_log_percent",
                file.snapshot_log_percent,
                Defaults::SNAPSHOT_LOG_PERCENT,
                SNAPSHOT_LOG_PERCENT_MAX,
                "0: entries alone decide",
            )?,
            snapshot_logs_kept: file
                .snapshot_logs_kept
                .unwrap_or(Defaults::SNAPSHOT_LOGS_KEPT),
        })
    }
}

/// The Raft timers: a heartbeat shorter than the shortest election timeout (or followers
/// would call elections while the leader is well), and a range of election timeouts
/// above it (so that candidates' timers spread).
struct RaftTiming {
    heartbeat_ms: u64,
    election_timeout_ms_min: u64,
    election_timeout_ms_max: u64,
}

impl RaftTiming {
    /// The timers `file` sets, the defaults for the rest, checked together.
    fn of(file: &ConfigFile) -> Result<Self, ConfigError> {
        let election_timeout_ms_min = file
            .election_timeout_ms_min
            .unwrap_or(Defaults::ELECTION_TIMEOUT_MS_MIN);
        let election_timeout_ms_max = file
            .election_timeout_ms_max
            .unwrap_or(Defaults::ELECTION_TIMEOUT_MS_MAX);
        let heartbeat_ms = file.heartbeat_ms.unwrap_or(Defaults::HEARTBEAT_MS);
        if heartbeat_ms == 0 || heartbeat_ms >= election_timeout_ms_min {
            return Err(invalid(
                "heartbeat_ms",
                "must be at least 1 and below election_timeout_ms_min",
            ));
        }
        if election_timeout_ms_max <= election_timeout_ms_min {
            return Err(invalid(
                "election_timeout_ms_max",
                "must be above election_timeout_ms_min",
            ));
        }
        Ok(Self {
            heartbeat_ms,
            election_timeout_ms_min,
            election_timeout_ms_max,
        })
    }
}

/// The deadline of a call that sends `timeout_ms = 0`.
fn timeout_default(file: &ConfigFile) -> Result<Duration, ConfigError> {
    let timeout_ms = file.timeout_ms_default.unwrap_or(Defaults::TIMEOUT_MS);
    if timeout_ms == 0 || timeout_ms > TIMEOUT_MS_MAX {
        return Err(invalid("timeout_ms_default", "must be between 1 and 60000"));
    }
    Ok(Duration::from_millis(u64::from(timeout_ms)))
}

/// The TTL of a claim a settle with `ttl_ms = 0` re-creates, within the contract's TTLs
/// (and, once the ceilings are read, [`within_ttl_ms_max`]).
fn claim_ttl_ms_default(file: &ConfigFile) -> Result<u64, ConfigError> {
    let claim_ttl_ms_default = file.claim_ttl_ms_default.unwrap_or(Defaults::CLAIM_TTL_MS);
    if claim_ttl_ms_default == 0 || claim_ttl_ms_default > crate::contract::TTL_MS_MAX {
        return Err(invalid(
            "claim_ttl_ms_default",
            "must be between 1 ms and 30 days",
        ));
    }
    Ok(claim_ttl_ms_default)
}

/// The default claim TTL may not pass the node's own ceiling, or its settles would refuse
/// themselves.
fn within_ttl_ms_max(claim_ttl_ms_default: u64, ceilings: &Ceilings) -> Result<(), ConfigError> {
    if claim_ttl_ms_default > ceilings.ttl_ms_max {
        return Err(invalid(
            "claim_ttl_ms_default",
            format!("must be at most ttl_ms_max ({} ms)", ceilings.ttl_ms_max),
        ));
    }
    Ok(())
}

/// How far a node's wall clock may be from the median of a quorum's before it stops
/// leading (and a leader's stamps from its monotonic clock).
fn max_clock_offset_ms(file: &ConfigFile) -> Result<u64, ConfigError> {
    let field = "max_clock_offset_ms";
    let n = count_max(
        field,
        file.max_clock_offset_ms,
        Defaults::MAX_CLOCK_OFFSET_MS,
    )?;
    if n > MAX_CLOCK_OFFSET_MS_MAX {
        return Err(invalid(
            field,
            format!("must be at most {MAX_CLOCK_OFFSET_MS_MAX}"),
        ));
    }
    Ok(n)
}

/// Commands in one log entry or forward.
fn batch_commands_max(file: &ConfigFile) -> Result<usize, ConfigError> {
    let field = "batch_commands_max";
    let n = positive(field, file.batch_commands_max, Defaults::BATCH_COMMANDS_MAX)?;
    // One entry must fit one peer message, whatever its commands.
    if n > BATCH_COMMANDS_MAX_MAX {
        return Err(invalid(
            field,
            format!("must be at most {BATCH_COMMANDS_MAX_MAX}"),
        ));
    }
    Ok(n)
}

fn positive(field: &str, value: Option<usize>, default: usize) -> Result<usize, ConfigError> {
    match value {
        Some(0) => Err(invalid(field, "must be at least 1")),
        Some(v) => Ok(v),
        None => Ok(default),
    }
}

fn count_max(field: &str, value: Option<u64>, default: u64) -> Result<u64, ConfigError> {
    match value {
        Some(0) => Err(invalid(field, "must be at least 1")),
        Some(v) => Ok(v),
        None => Ok(default),
    }
}

fn state_limits(file: &ConfigFile) -> Result<StateLimits, ConfigError> {
    let limits = StateLimits {
        claims_max: count_max("claims_max", file.claims_max, Defaults::CLAIMS_MAX)?,
        buckets_max: count_max("buckets_max", file.buckets_max, Defaults::BUCKETS_MAX)?,
        tenant_claims_max: count_max(
            "tenant_claims_max",
            file.tenant_claims_max,
            Defaults::TENANT_CLAIMS_MAX.min(file.claims_max.unwrap_or(Defaults::CLAIMS_MAX)),
        )?,
        tenant_buckets_max: count_max(
            "tenant_buckets_max",
            file.tenant_buckets_max,
            Defaults::TENANT_BUCKETS_MAX.min(file.buckets_max.unwrap_or(Defaults::BUCKETS_MAX)),
        )?,
    };
    if limits.tenant_claims_max > limits.claims_max {
        return Err(invalid("tenant_claims_max", "must be at most claims_max"));
    }
    if limits.tenant_buckets_max > limits.buckets_max {
        return Err(invalid("tenant_buckets_max", "must be at most buckets_max"));
    }
    Ok(limits)
}

/// The shortest `capacity_us_max`: a second, so the rate of any bucket can still be set.
const CAPACITY_US_MAX_MIN: u64 = 1_000_000;

fn ceilings(file: &ConfigFile) -> Result<Ceilings, ConfigError> {
    let ttl_ms_max = file.ttl_ms_max.unwrap_or(Defaults::TTL_MS_MAX);
    if ttl_ms_max == 0 || ttl_ms_max > crate::contract::TTL_MS_MAX {
        return Err(invalid(
            "ttl_ms_max",
            format!(
                "must be between 1 and {} (30 days, the contract's)",
                crate::contract::TTL_MS_MAX
            ),
        ));
    }
    let capacity_us_max = file.capacity_us_max.unwrap_or(Defaults::CAPACITY_US_MAX);
    if !(CAPACITY_US_MAX_MIN..=crate::contract::YEAR_US).contains(&capacity_us_max) {
        return Err(invalid(
            "capacity_us_max",
            format!(
                "must be between {CAPACITY_US_MAX_MIN} (one second) and {} (one year, the \
                 contract's)",
                crate::contract::YEAR_US
            ),
        ));
    }
    Ok(Ceilings {
        ttl_ms_max,
        capacity_us_max,
    })
}

/// The longest drain: ten minutes, past which an orchestrator has long given up.
const DRAIN_TIMEOUT_MS_MAX: u64 = 600_000;

/// The largest `snapshot_log_percent`: beyond it the log (and a restart's replay) would grow
/// to many times the state before a snapshot.
const SNAPSHOT_LOG_PERCENT_MAX: u64 = 1_000;

/// `value`, or `default` when absent; more than `max` is refused, `zero` saying what 0 does.
fn at_most(
    field: &str,
    value: Option<u64>,
    default: u64,
    max: u64,
    zero: &str,
) -> Result<u64, ConfigError> {
    match value {
        Some(v) if v > max => Err(invalid(field, format!("must be at most {max} ({zero})"))),
        Some(v) => Ok(v),
        None => Ok(default),
    }
}

fn parse_addr(field: &str, text: &str) -> Result<SocketAddr, ConfigError> {
    text.parse()
        .map_err(|_| invalid(field, format!("`{text}` is not an ip:port address")))
}

/// True when edge clients must present a certificate (`[api_tls]` with `client_ca_file`).
fn edge_authenticated(file: &ConfigFile) -> bool {
    file.api_tls
        .as_ref()
        .is_some_and(|tls| tls.client_ca_file.is_some())
}

/// A non-loopback `api_addr` serves only clients with a certificate of `client_ca_file`,
/// unless `insecure_edge_api = true` says otherwise: an unauthenticated caller there may
/// spend, reset and claim for every tenant.
fn check_edge_tls(file: &ConfigFile, api_addr: SocketAddr) -> Result<(), ConfigError> {
    if api_addr.ip().is_loopback() || edge_authenticated(file) || file.insecure_edge_api {
        return Ok(());
    }
    let missing = match file.api_tls {
        None => "set [api_tls] with client_ca_file",
        Some(_) => "set client_ca_file in [api_tls]",
    };
    Err(invalid(
        "api_tls",
        format!(
            "api_addr {api_addr} is not a loopback address: {missing} (edge clients then \
             present a certificate of that CA), or insecure_edge_api = true to let anyone \
             who reaches it spend, reset and claim for every tenant"
        ),
    ))
}

fn validate_members(file: &ConfigFile) -> Result<(), ConfigError> {
    let mut ids = BTreeSet::new();
    for (i, member) in file.members.iter().enumerate() {
        if member.id == 0 {
            return Err(invalid(format!("members[{i}].id"), "must be at least 1"));
        }
        if !ids.insert(member.id) {
            return Err(invalid(
                format!("members[{i}].id"),
                format!("id {} is listed twice", member.id),
            ));
        }
        parse_addr(&format!("members[{i}].api_addr"), &member.api_addr)?;
        parse_addr(&format!("members[{i}].raft_addr"), &member.raft_addr)?;
        if member.id == file.node_id
            && (member.api_addr != file.api_addr || member.raft_addr != file.raft_addr)
        {
            return Err(invalid(
                format!("members[{i}]"),
                "this node's entry must repeat its own api_addr and raft_addr",
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
