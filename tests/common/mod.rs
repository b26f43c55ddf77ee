//! Black-box harness: real `ankusa-fleet serve` processes, each with its own data dir, driven
//! over the public gRPC API. Every wait has a deadline; nothing sleeps and hopes.
//!
//! Every fleet listens on a loopback address of its own (`127.a.b.c`, never `127.0.0.1`), on
//! ports picked free there (bound on port 0). A port released by the harness and bound by a node
//! a moment later can be taken in between only by a bind on the same address, and no other test
//! binds that address: the port race between tests running in parallel is gone (a shared
//! `127.0.0.1` once lost it: another test's node took a raft port first). Outgoing connections
//! leave from `127.0.0.1`, so their ephemeral ports never collide with these listeners.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, TcpListener};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use ankusa_fleet::pb;
use ankusa_fleet::pb::fleet_client::FleetClient;
use tokio::time::Instant;
use tonic::transport::Channel;

/// Generous deadline for cluster-level conditions on a loaded 2-core machine.
pub const CONDITION_DEADLINE: Duration = Duration::from_secs(30);
/// Per-call timeout the tests ask for: long enough that a loaded machine still commits.
pub const CALL_TIMEOUT_MS: u32 = 10_000;

pub fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new("info,openraft=warn"))
        .with_test_writer()
        .try_init();
}

/// A loopback address no other fleet of this process uses, and (by the process id in its
/// second octet) most likely none of another test process either.
fn fleet_ip() -> Ipv4Addr {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let pid_octet = 1 + (std::process::id() % 254) as u8;
    Ipv4Addr::new(127, pid_octet, (n / 254 % 256) as u8, 1 + (n % 254) as u8)
}

#[derive(Clone, Debug)]
pub struct NodeSpec {
    pub id: u64,
    pub api_addr: String,
    pub raft_addr: String,
    /// Where the node serves Prometheus metrics (every test node does).
    pub metrics_addr: String,
}

pub struct TestNode {
    pub spec: NodeSpec,
    pub config_path: PathBuf,
    pub log_path: PathBuf,
    child: Option<Child>,
}

impl TestNode {
    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }
}

/// A fleet of node processes sharing one temp dir and one loopback address.
pub struct Fleet {
    pub dir: tempfile::TempDir,
    pub ip: Ipv4Addr,
    pub nodes: BTreeMap<u64, TestNode>,
    pub initial: Vec<NodeSpec>,
    /// The fleet's CA and certificates (`ankusa-fleet certs`), when its nodes run with
    /// `[peer_tls]`: every fleet does unless started plaintext.
    pub certs: Option<PathBuf>,
    /// Whether new configs get `[api_tls]` (node certificates, edge certificates of the
    /// fleet CA required); the harness' own edge clients are plaintext, so such a fleet is
    /// driven by the test itself.
    pub api_tls: bool,
}

/// Node ids that get a certificate in a TLS fleet (initial voters and nodes added later).
const CERTIFIED_NODES: u64 = 7;

impl Fleet {
    /// An empty fleet on its own loopback address; with `tls`, its certificates.
    fn empty(tls: bool) -> Fleet {
        let dir = tempfile::tempdir().expect("tempdir");
        let ip = fleet_ip();
        let certs = tls.then(|| {
            let out = dir.path().join("certs");
            ankusa_fleet::tls::make_certs(&ankusa_fleet::tls::CertsPlan {
                out: out.clone(),
                nodes: CERTIFIED_NODES,
                hosts: (1..=CERTIFIED_NODES)
                    .map(|id| (id, ip.to_string()))
                    .collect(),
            })
            .expect("make certificates");
            out
        });
        Fleet {
            dir,
            ip,
            nodes: BTreeMap::new(),
            initial: Vec::new(),
            certs,
            api_tls: false,
        }
    }

    /// Starts `n` initial voters with `[peer_tls]` and `[api_tls]`.
    pub fn start_with_api_tls(n: u64, extra: &str) -> Fleet {
        let mut fleet = Fleet::empty(true);
        fleet.api_tls = true;
        let initial = specs(fleet.ip, 1..=n, &[]);
        fleet.initial = initial.clone();
        for node in &initial {
            fleet.add_process(node.clone(), &initial, extra);
        }
        fleet
    }

    /// A certificate file of this fleet's (`ca.pem`, `admin.key`, ...).
    pub fn cert_file(&self, name: &str) -> PathBuf {
        self.certs.as_ref().expect("a TLS fleet").join(name)
    }

    /// Where a `cluster` command reaches node `id`'s `Admin` service, with the fleet's
    /// `admin` certificate when it runs TLS.
    pub fn admin_target(&self, id: u64) -> ankusa_fleet::cli::AdminTarget {
        let file = |name: &str| self.certs.as_ref().map(|dir| dir.join(name));
        ankusa_fleet::cli::AdminTarget {
            addr: Some(self.nodes[&id].spec.raft_addr.clone()),
            config: None,
            ca: file("ca.pem"),
            cert: file("admin.pem"),
            key: file("admin.key"),
            cluster_id: None,
        }
    }

    /// The config text of `node` in this fleet.
    fn config_of(&self, node: &NodeSpec, members: &[NodeSpec], extra: &str) -> String {
        let data_dir = self.dir.path().join(format!("node{}", node.id));
        let mut text = config_text(node, &data_dir, members, extra);
        if let Some(certs) = &self.certs {
            text.push_str(&format!(
                "\n[peer_tls]\nca_file = {:?}\ncert_file = {:?}\nkey_file = {:?}\n",
                certs.join("ca.pem").display().to_string(),
                certs
                    .join(format!("node{}.pem", node.id))
                    .display()
                    .to_string(),
                certs
                    .join(format!("node{}.key", node.id))
                    .display()
                    .to_string(),
            ));
            if self.api_tls {
                let file = |name: String| certs.join(name).display().to_string();
                text.push_str(&format!(
                    "\n[api_tls]\ncert_file = {:?}\nkey_file = {:?}\nclient_ca_file = {:?}\n",
                    file(format!("node{}.pem", node.id)),
                    file(format!("node{}.key", node.id)),
                    file("ca.pem".to_owned()),
                ));
            }
        }
        text
    }
}

/// Specs for nodes `ids` on `ip`, with ports that were free there and differ from each other
/// and from every port in `taken`: all listeners are held until every port is picked.
fn specs(ip: Ipv4Addr, ids: impl IntoIterator<Item = u64>, taken: &[NodeSpec]) -> Vec<NodeSpec> {
    let mut held = Vec::new();
    let mut pick = || loop {
        let listener = TcpListener::bind((ip, 0)).expect("bind port 0");
        let addr = listener.local_addr().expect("local addr").to_string();
        held.push(listener);
        if !taken
            .iter()
            .any(|node| [&node.api_addr, &node.raft_addr, &node.metrics_addr].contains(&&addr))
        {
            return addr;
        }
    };
    ids.into_iter()
        .map(|id| NodeSpec {
            id,
            api_addr: pick(),
            raft_addr: pick(),
            metrics_addr: pick(),
        })
        .collect()
}

fn config_text(
    node: &NodeSpec,
    data_dir: &std::path::Path,
    members: &[NodeSpec],
    extra: &str,
) -> String {
    let mut text = format!(
        "node_id = {}\napi_addr = \"{}\"\nraft_addr = \"{}\"\nmetrics_addr = \"{}\"\n\
         data_dir = {:?}\n{extra}\n",
        node.id,
        node.api_addr,
        node.raft_addr,
        node.metrics_addr,
        data_dir.display().to_string()
    );
    for member in members {
        text.push_str(&format!(
            "\n[[members]]\nid = {}\napi_addr = \"{}\"\nraft_addr = \"{}\"\n",
            member.id, member.api_addr, member.raft_addr
        ));
    }
    text
}

impl Fleet {
    /// Starts `n` initial voters with `[peer_tls]`; `extra` is appended to every config
    /// (optional top-level keys).
    pub async fn start(n: u64, extra: &str) -> Fleet {
        Self::start_with(n, extra, true)
    }

    /// Starts `n` initial voters whose Raft traffic is plaintext (loopback allows it).
    pub async fn start_plain(n: u64, extra: &str) -> Fleet {
        Self::start_with(n, extra, false)
    }

    fn start_with(n: u64, extra: &str, tls: bool) -> Fleet {
        let mut fleet = Fleet::empty(tls);
        let initial = specs(fleet.ip, 1..=n, &[]);
        fleet.initial = initial.clone();
        for node in &initial {
            fleet.add_process(node.clone(), &initial, extra);
        }
        fleet
    }

    /// Writes a config and starts a node process (a joining node passes `members = []`).
    pub fn add_process(&mut self, node: NodeSpec, members: &[NodeSpec], extra: &str) {
        let config_path = self.dir.path().join(format!("node{}.toml", node.id));
        std::fs::write(&config_path, self.config_of(&node, members, extra)).expect("write config");
        let log_path = self.dir.path().join(format!("node{}.log", node.id));
        let mut test_node = TestNode {
            spec: node.clone(),
            config_path,
            log_path,
            child: None,
        };
        spawn(&mut test_node);
        self.nodes.insert(node.id, test_node);
    }

    /// A spec for a new node with fresh ports.
    pub fn new_spec(&self, id: u64) -> NodeSpec {
        let taken: Vec<NodeSpec> = self.nodes.values().map(|node| node.spec.clone()).collect();
        specs(self.ip, [id], &taken).remove(0)
    }

    /// The process id of a running node.
    pub fn pid(&self, id: u64) -> Option<u32> {
        self.nodes[&id].child.as_ref().map(Child::id)
    }

    /// SIGKILL: no shutdown, no flush.
    pub fn kill(&mut self, id: u64) {
        let node = self.nodes.get_mut(&id).expect("known node");
        if let Some(mut child) = node.child.take() {
            child.kill().expect("kill -9");
            child.wait().expect("reap");
        }
    }

    /// Starts a killed node again from its data dir, same ports.
    pub fn restart(&mut self, id: u64) {
        let node = self.nodes.get_mut(&id).expect("known node");
        assert!(node.child.is_none(), "node {id} still runs");
        spawn(node);
    }

    pub fn api_addr(&self, id: u64) -> String {
        self.nodes[&id].spec.api_addr.clone()
    }

    /// The value of the sample `name` (with its labels, as the exporter writes them) on node
    /// `id`'s metrics page; `None` while the page or the sample is not there.
    pub async fn metric(&self, id: u64, name: &str) -> Option<f64> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let addr = &self.nodes[&id].spec.metrics_addr;
        let mut stream = tokio::net::TcpStream::connect(addr).await.ok()?;
        let request = format!("GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n");
        stream.write_all(request.as_bytes()).await.ok()?;
        let mut page = String::new();
        stream.read_to_string(&mut page).await.ok()?;
        page.lines()
            .find_map(|line| line.strip_prefix(name)?.strip_prefix(' '))
            .and_then(|value| value.trim().parse().ok())
    }

    pub async fn client(&self, id: u64) -> FleetClient<Channel> {
        connect(&self.api_addr(id)).await
    }

    pub async fn status(&self, id: u64) -> Option<pb::StatusResponse> {
        let endpoint = Channel::from_shared(format!("http://{}", self.api_addr(id))).ok()?;
        let channel = endpoint
            .connect_timeout(Duration::from_millis(500))
            .connect()
            .await
            .ok()?;
        let mut client = FleetClient::new(channel);
        let call = client.status(pb::StatusRequest {});
        let response = tokio::time::timeout(Duration::from_secs(2), call)
            .await
            .ok()?
            .ok()?;
        Some(response.into_inner())
    }

    /// Waits until every running node among `ids` names the same leader; returns it.
    pub async fn wait_for_leader(&self, ids: &[u64]) -> u64 {
        self.wait_for("one leader known to all", || async {
            let mut leaders = Vec::new();
            for id in ids {
                leaders.push(self.status(*id).await?.leader_id);
            }
            let first = *leaders.first()?;
            (first != 0 && leaders.iter().all(|l| *l == first)).then_some(first)
        })
        .await
    }

    /// Waits until `check` yields `Some`, or panics with the node logs at the deadline.
    pub async fn wait_for<T, F, Fut>(&self, what: &str, mut check: F) -> T
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Option<T>>,
    {
        let deadline = Instant::now() + CONDITION_DEADLINE;
        loop {
            if let Some(value) = check().await {
                return value;
            }
            if Instant::now() > deadline {
                self.dump_logs();
                panic!("timed out waiting for: {what}");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits until node `id` knows `leader` and has applied at least `index`.
    pub async fn wait_caught_up(&self, id: u64, leader: u64, index: u64) {
        self.wait_for(&format!("node {id} applies index {index}"), || async {
            let status = self.status(id).await?;
            (status.leader_id == leader && status.last_applied >= index).then_some(())
        })
        .await;
    }

    pub fn dump_logs(&self) {
        for node in self.nodes.values() {
            let log = std::fs::read_to_string(&node.log_path).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(40).collect();
            eprintln!("---- node {} log (last 40 lines) ----", node.spec.id);
            for line in tail.into_iter().rev() {
                eprintln!("{line}");
            }
        }
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        for node in self.nodes.values_mut() {
            if let Some(mut child) = node.child.take() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

fn spawn(node: &mut TestNode) {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&node.log_path)
        .expect("open log");
    let child = Command::new(env!("CARGO_BIN_EXE_ankusa-fleet"))
        .args(["serve", "--config"])
        .arg(&node.config_path)
        .env("RUST_LOG", "info,openraft=warn")
        // An error a node exits with stays one readable line in its log (anyhow would add a
        // backtrace when CI sets RUST_BACKTRACE); panics keep theirs.
        .env("RUST_LIB_BACKTRACE", "0")
        .stdout(Stdio::from(log.try_clone().expect("log")))
        .stderr(Stdio::from(log))
        .spawn()
        .expect("spawn node");
    node.child = Some(child);
}

pub async fn connect(api_addr: &str) -> FleetClient<Channel> {
    let deadline = Instant::now() + CONDITION_DEADLINE;
    loop {
        if let Ok(client) = FleetClient::connect(format!("http://{api_addr}")).await {
            return client;
        }
        assert!(Instant::now() < deadline, "cannot connect to {api_addr}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

// ---- request builders ----

pub fn hooks(tenant: &str, increment_us: u64, capacity_us: u64) -> pb::Charge {
    pb::Charge {
        kind: pb::Kind::Hooks as i32,
        tenant: tenant.to_owned(),
        increment_us,
        capacity_us,
    }
}

pub fn claim(tenant: &str, key: &str, hook_id: &str) -> pb::Claim {
    pb::Claim {
        tenant: tenant.to_owned(),
        source_id: "stripe".to_owned(),
        key: key.to_owned(),
        hook_id: hook_id.to_owned(),
        ttl_ms: 3_600_000,
        pending_ttl_ms: 60_000,
    }
}

pub fn hit(charges: Vec<pb::Charge>, claim: Option<pb::Claim>) -> pb::HitRequest {
    pb::HitRequest {
        charges,
        claim,
        timeout_ms: CALL_TIMEOUT_MS,
        rate_limit_scope: pb::Scope::Fleet as i32,
        dedupe_scope: pb::Scope::Fleet as i32,
    }
}

pub fn settle(
    tenant: &str,
    key: &str,
    hook_id: &str,
    outcome: pb::SettleOutcome,
) -> pb::SettleRequest {
    pb::SettleRequest {
        tenant: tenant.to_owned(),
        source_id: "stripe".to_owned(),
        key: key.to_owned(),
        hook_id: hook_id.to_owned(),
        outcome: outcome as i32,
        timeout_ms: CALL_TIMEOUT_MS,
        dedupe_scope: pb::Scope::Fleet as i32,
        ttl_ms: 0,
    }
}

/// The outcome of a hit, flattened for assertions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    Allowed,
    Duplicate(String),
    Pending(u64),
    RateLimited(u64),
}

pub fn outcome(response: &pb::HitResponse) -> Outcome {
    use pb::hit_response::Outcome as O;
    match response.outcome.as_ref().expect("an outcome") {
        O::Allowed(_) => Outcome::Allowed,
        O::Duplicate(d) => Outcome::Duplicate(d.hook_id.clone()),
        O::Pending(p) => Outcome::Pending(p.retry_after_ms),
        O::RateLimited(r) => Outcome::RateLimited(r.retry_after_ms),
    }
}

/// Sends a hit and returns its outcome and who decided it.
pub async fn send_hit(
    client: &mut FleetClient<Channel>,
    request: pb::HitRequest,
) -> (Outcome, i32) {
    let response = client
        .hit(request)
        .await
        .expect("hit answered")
        .into_inner();
    (outcome(&response), response.decided_by)
}

// ---- helpers for the fault and membership tests ----

/// The hook id the helpers below store for `key`.
pub fn hook_of(key: &str) -> String {
    format!("hook-{key}")
}

/// `n` distinct idempotency keys starting with `prefix`.
pub fn keys(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}-{i}")).collect()
}

impl Fleet {
    /// How many lines of node `id`'s log (all its runs) contain `needle`.
    pub fn log_count(&self, id: u64, needle: &str) -> usize {
        let log = std::fs::read_to_string(&self.nodes[&id].log_path).unwrap_or_default();
        log.lines().filter(|line| line.contains(needle)).count()
    }

    /// Node `id`'s applied index, if it answers.
    pub async fn last_applied(&self, id: u64) -> Option<u64> {
        Some(self.status(id).await?.last_applied)
    }

    /// Panics with the node logs (the way `wait_for` does at its deadline).
    pub fn fail(&self, why: &str) -> ! {
        self.dump_logs();
        panic!("{why}");
    }

    /// Claims and commits every key (hit, then settle commit, hook `hook_of(key)`), spread
    /// round robin over the nodes in `via`, `concurrency` keys at a time. Every answer must
    /// be `allowed` / `settled`, decided by the fleet.
    pub async fn commit_claims(
        &self,
        via: &[u64],
        tenant: &str,
        keys: &[String],
        concurrency: usize,
    ) {
        let clients = self.clients(via).await;
        let failures = run_all(keys, concurrency, |i, key| {
            let mut client = clients[i % clients.len()].clone();
            async move { commit_claim(&mut client, tenant, &key).await }
        })
        .await;
        if let Some(first) = failures.first() {
            self.fail(&format!(
                "{} claims not committed, first: {first}",
                failures.len()
            ));
        }
    }

    /// Asserts that through node `id` every key answers `duplicate{hook_of(key)}`, decided
    /// by the fleet (a probe with another hook id, so a lost claim would show as `allowed`).
    pub async fn assert_duplicates(
        &self,
        id: u64,
        tenant: &str,
        keys: &[String],
        concurrency: usize,
    ) {
        let client = self.client(id).await;
        let failures = run_all(keys, concurrency, |_, key| {
            let mut client = client.clone();
            async move { probe_duplicate(&mut client, tenant, &key).await }
        })
        .await;
        if let Some(first) = failures.first() {
            self.fail(&format!(
                "node {id}: {} of {} keys not duplicate, first: {first}",
                failures.len(),
                keys.len()
            ));
        }
    }

    async fn clients(&self, ids: &[u64]) -> Vec<FleetClient<Channel>> {
        let mut clients = Vec::new();
        for id in ids {
            clients.push(self.client(*id).await);
        }
        clients
    }
}

/// Runs `work` for every key, `concurrency` at a time; returns the failures.
async fn run_all<F, Fut>(keys: &[String], concurrency: usize, work: F) -> Vec<String>
where
    F: Fn(usize, String) -> Fut,
    Fut: std::future::Future<Output = Result<(), String>>,
{
    use futures::StreamExt;
    let results: Vec<Result<(), String>> =
        futures::stream::iter(keys.iter().enumerate().map(|(i, key)| work(i, key.clone())))
            .buffer_unordered(concurrency.max(1))
            .collect()
            .await;
    results.into_iter().filter_map(Result::err).collect()
}

pub async fn commit_claim(
    client: &mut FleetClient<Channel>,
    tenant: &str,
    key: &str,
) -> Result<(), String> {
    let hook = hook_of(key);
    let response = client
        .hit(hit(vec![], Some(claim(tenant, key, &hook))))
        .await
        .map_err(|e| format!("hit {key}: {e}"))?
        .into_inner();
    let got = (outcome(&response), response.decided_by);
    if got != (Outcome::Allowed, pb::DecidedBy::Fleet as i32) {
        return Err(format!("hit {key}: {got:?}"));
    }
    let settled = client
        .settle(settle(tenant, key, &hook, pb::SettleOutcome::Commit))
        .await
        .map_err(|e| format!("settle {key}: {e}"))?
        .into_inner();
    let got = (settled.status, settled.decided_by);
    if got
        != (
            pb::SettleStatus::Settled as i32,
            pb::DecidedBy::Fleet as i32,
        )
    {
        return Err(format!("settle {key}: {got:?}"));
    }
    Ok(())
}

async fn probe_duplicate(
    client: &mut FleetClient<Channel>,
    tenant: &str,
    key: &str,
) -> Result<(), String> {
    let response = client
        .hit(hit(vec![], Some(claim(tenant, key, "hook-probe"))))
        .await
        .map_err(|e| format!("hit {key}: {e}"))?
        .into_inner();
    let got = (outcome(&response), response.decided_by);
    if got
        != (
            Outcome::Duplicate(hook_of(key)),
            pb::DecidedBy::Fleet as i32,
        )
    {
        return Err(format!("{key}: {got:?}"));
    }
    Ok(())
}

// ---- helpers shared by the semantics and validation tests ----

pub fn bytes(tenant: &str, increment_us: u64, capacity_us: u64) -> pb::Charge {
    pb::Charge {
        kind: pb::Kind::Bytes as i32,
        tenant: tenant.to_owned(),
        increment_us,
        capacity_us,
    }
}

pub fn reset(tenant: &str) -> pb::ResetRequest {
    pb::ResetRequest {
        tenant: tenant.to_owned(),
        timeout_ms: CALL_TIMEOUT_MS,
    }
}

pub fn check_rate(
    entity_id: &str,
    operation: &str,
    limit: u64,
    window_ms: u64,
) -> pb::CheckRateRequest {
    pb::CheckRateRequest {
        entity_id: entity_id.to_owned(),
        operation: operation.to_owned(),
        limit,
        window_ms,
        timeout_ms: CALL_TIMEOUT_MS,
        scope: pb::Scope::Fleet as i32,
    }
}

/// Sends a hit and returns the whole response (outcome, decided_by, local_reason).
pub async fn send_hit_full(
    client: &mut FleetClient<Channel>,
    request: pb::HitRequest,
) -> pb::HitResponse {
    client
        .hit(request)
        .await
        .expect("hit answered")
        .into_inner()
}

pub async fn send_settle(
    client: &mut FleetClient<Channel>,
    request: pb::SettleRequest,
) -> pb::SettleResponse {
    client
        .settle(request)
        .await
        .expect("settle answered")
        .into_inner()
}

pub async fn send_check_rate(
    client: &mut FleetClient<Channel>,
    request: pb::CheckRateRequest,
) -> pb::CheckRateResponse {
    client
        .check_rate(request)
        .await
        .expect("check_rate answered")
        .into_inner()
}

pub async fn send_reset(client: &mut FleetClient<Channel>, tenant: &str) {
    client.reset(reset(tenant)).await.expect("reset answered");
}

/// True when `message` names `field` as a whole token: `charges` is not named by
/// `charges[0].kind`, nor `ttl_ms` by `claim.ttl_ms`.
pub fn names_field(message: &str, field: &str) -> bool {
    let is_name_char = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '.';
    message.match_indices(field).any(|(at, _)| {
        let before = message[..at].chars().next_back();
        let after = message[at + field.len()..].chars().next();
        !before.is_some_and(is_name_char) && !after.is_some_and(|c| is_name_char(c) || c == '[')
    })
}

/// Raft progress as every node among `ids` reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Applied {
    pub term: u64,
    pub last_applied: u64,
}

impl Fleet {
    /// Waits until every node among `ids` reports the same term and `last_applied` (nothing
    /// in flight), and returns it.
    pub async fn wait_for_applied_in_step(&self, ids: &[u64]) -> Applied {
        self.wait_for("every node applied the same index", || async {
            let mut seen = Vec::new();
            for id in ids {
                let status = self.status(*id).await?;
                seen.push(Applied {
                    term: status.term,
                    last_applied: status.last_applied,
                });
            }
            let first = *seen.first()?;
            seen.iter().all(|s| *s == first).then_some(first)
        })
        .await
    }
}

impl Fleet {
    /// How many lines of node `id`'s log contain every one of `needles`.
    pub fn log_lines(&self, id: u64, needles: &[&str]) -> usize {
        let log = std::fs::read_to_string(&self.nodes[&id].log_path).unwrap_or_default();
        log.lines()
            .filter(|line| needles.iter().all(|needle| line.contains(needle)))
            .count()
    }
}

impl Fleet {
    /// Every snapshot node `id` logged as built (all its runs), in order: its last log index
    /// and its size. The state store names a snapshot `T{term}-N{leader}-{index}-{seq}`
    /// (e.g. `T1-N2-1180-55`) and logs `size_bytes` beside it.
    pub fn snapshots_built(&self, id: u64) -> Vec<(u64, u64)> {
        let log = std::fs::read_to_string(&self.nodes[&id].log_path).unwrap_or_default();
        let field = |line: &str, name: &str| -> Option<String> {
            let value = line.split(name).nth(1)?.split_whitespace().next()?;
            Some(value.to_string())
        };
        log.lines()
            .filter(|line| line.contains("snapshot built"))
            .filter_map(|line| {
                let index = field(line, "snapshot_id=")?
                    .rsplit('-')
                    .nth(1)?
                    .parse()
                    .ok()?;
                let size = field(line, "size_bytes=")?.parse().ok()?;
                Some((index, size))
            })
            .collect()
    }
}

impl Applied {
    /// Entries applied since `earlier`, or `None` when the term changed in between: a new
    /// leader appends an entry of its own, so the count then says nothing about requests.
    pub fn entries_since(&self, earlier: Applied) -> Option<u64> {
        (self.term == earlier.term).then(|| self.last_applied - earlier.last_applied)
    }
}

// ---- helpers for the fallback fault tests (process signals, transport faults) ----

impl TestNode {
    /// The process id of the running child, if it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }
}

impl Fleet {
    /// Writes every config of an `n`-voter fleet but starts only the nodes in `running`; the
    /// others can be started later with [`Fleet::restart`].
    pub fn start_some(n: u64, running: &[u64], extra: &str) -> Fleet {
        let mut fleet = Fleet::empty(true);
        let initial = specs(fleet.ip, 1..=n, &[]);
        fleet.initial = initial.clone();
        for node in &initial {
            let config_path = fleet.dir.path().join(format!("node{}.toml", node.id));
            std::fs::write(&config_path, fleet.config_of(node, &initial, extra))
                .expect("write config");
            let mut test_node = TestNode {
                spec: node.clone(),
                config_path,
                log_path: fleet.dir.path().join(format!("node{}.log", node.id)),
                child: None,
            };
            if running.contains(&node.id) {
                spawn(&mut test_node);
            }
            fleet.nodes.insert(node.id, test_node);
        }
        fleet
    }

    fn signal(&self, id: u64, signal: &str) {
        let pid = self.nodes[&id]
            .pid()
            .unwrap_or_else(|| panic!("node {id} does not run"));
        let status = Command::new("kill")
            .args([signal, &pid.to_string()])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill {signal} {pid} failed");
    }

    /// The exit status of node `id` if its process ended (without reaping a running one).
    pub fn try_exit_status(&mut self, id: u64) -> Option<std::process::ExitStatus> {
        let node = self.nodes.get_mut(&id).expect("known node");
        node.child.as_mut()?.try_wait().expect("try_wait")
    }

    /// SIGTERM: the node drains and exits.
    pub fn terminate(&self, id: u64) {
        self.signal(id, "-TERM");
    }

    /// Waits (with the harness deadline) for node `id` to exit by itself; its exit status.
    pub async fn wait_exit(&mut self, id: u64) -> std::process::ExitStatus {
        let deadline = Instant::now() + CONDITION_DEADLINE;
        loop {
            let node = self.nodes.get_mut(&id).expect("known node");
            let child = node.child.as_mut().expect("node runs");
            if let Some(status) = child.try_wait().expect("try_wait") {
                node.child = None;
                return status;
            }
            if Instant::now() > deadline {
                self.dump_logs();
                panic!("node {id} did not exit");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// SIGSTOP: the process freezes (no answer, no timer) until [`Fleet::resume`].
    pub fn pause(&self, id: u64) {
        self.signal(id, "-STOP");
    }

    /// SIGCONT after [`Fleet::pause`].
    pub fn resume(&self, id: u64) {
        self.signal(id, "-CONT");
    }

    /// Replaces node `id`'s transport fault rules (its config needs `fault_injection = true`);
    /// an empty list heals. A rule for peer P covers both directions at node `id`.
    pub async fn set_faults(&self, id: u64, faults: &[(u64, pb::internal::FaultKind)]) {
        let request = pb::internal::SetFaultsRequest {
            cluster_id: "ankusa-fleet".to_owned(),
            faults: faults
                .iter()
                .map(|(peer_id, kind)| pb::internal::PeerFault {
                    peer_id: *peer_id,
                    kind: *kind as i32,
                    delay_ms: 0,
                })
                .collect(),
            hold_log_writes: false,
        };
        self.send_faults(id, request).await;
    }

    /// Holds node `id`'s log writer (its appends stay in memory, unwritten, so a kill loses
    /// them) and clears its transport rules; [`Fleet::heal`] lifts the hold.
    pub async fn hold_log_writes(&self, id: u64) {
        let request = pb::internal::SetFaultsRequest {
            cluster_id: "ankusa-fleet".to_owned(),
            faults: Vec::new(),
            hold_log_writes: true,
        };
        self.send_faults(id, request).await;
    }

    async fn send_faults(&self, id: u64, request: pb::internal::SetFaultsRequest) {
        let mut admin = self
            .admin_target(id)
            .connect()
            .await
            .unwrap_or_else(|e| self.fail(&format!("admin client for node {id}: {e:#}")));
        if let Err(e) = admin.set_faults(request).await {
            self.fail(&format!("set_faults on node {id}: {e}"));
        }
    }

    /// Cuts node `id` off from every other node with `kind` rules set on `id` alone.
    pub async fn isolate(&self, id: u64, kind: pb::internal::FaultKind) {
        let faults: Vec<(u64, pb::internal::FaultKind)> = self
            .nodes
            .keys()
            .filter(|peer| **peer != id)
            .map(|peer| (*peer, kind))
            .collect();
        self.set_faults(id, &faults).await;
    }

    /// Clears node `id`'s fault rules.
    pub async fn heal(&self, id: u64) {
        self.set_faults(id, &[]).await;
    }
}

// ---- HitStream: the streaming twin of Hit ----

/// One open `HitStream`: requests go in, replies come back in request order.
pub struct HitStream {
    requests: tokio::sync::mpsc::Sender<pb::HitRequest>,
    replies: tonic::Streaming<pb::HitStreamReply>,
}

impl HitStream {
    pub async fn open(client: &mut FleetClient<Channel>) -> HitStream {
        let (requests, outgoing) = tokio::sync::mpsc::channel(64);
        let replies = client
            .hit_stream(tokio_stream::wrappers::ReceiverStream::new(outgoing))
            .await
            .expect("open a hit stream")
            .into_inner();
        HitStream { requests, replies }
    }

    /// Sends one request without waiting for its reply.
    pub async fn send(&mut self, request: pb::HitRequest) {
        self.requests
            .send(request)
            .await
            .expect("the hit stream takes requests");
    }

    /// The next reply: the answer, or the error reply as a status. Panics if the stream
    /// itself ended or failed (an error reply must not end it).
    pub async fn reply(&mut self) -> Result<pb::HitResponse, tonic::Status> {
        let reply = tokio::time::timeout(CONDITION_DEADLINE, self.replies.message())
            .await
            .expect("a reply within the deadline")
            .expect("the stream did not fail")
            .expect("the stream did not end");
        ankusa_fleet::api::stream_reply_result(reply)
    }

    /// Sends one request and waits for its reply.
    pub async fn hit(&mut self, request: pb::HitRequest) -> Result<pb::HitResponse, tonic::Status> {
        self.send(request).await;
        self.reply().await
    }
}
