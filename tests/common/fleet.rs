//! Node processes: configs and certificates, start, restart, kill, signals, exit, and the
//! waits for cluster conditions (a leader, an applied index).

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, TcpListener};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use super::{Fleet, NodeSpec, TestNode, CONDITION_DEADLINE};

/// A loopback address no other fleet of this process uses, and (by the process id in its
/// second octet) most likely none of another test process either.
fn fleet_ip() -> Ipv4Addr {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let pid_octet = 1 + (std::process::id() % 254) as u8;
    Ipv4Addr::new(127, pid_octet, (n / 254 % 256) as u8, 1 + (n % 254) as u8)
}

/// Node ids that get a certificate in a TLS fleet (initial voters and nodes added later).
const CERTIFIED_NODES: u64 = 7;

impl Fleet {
    /// An empty fleet on its own loopback address; with `tls`, its certificates.
    fn empty(tls: bool) -> Fleet {
        if tls {
            Self::empty_with_certs(|out, ip| {
                ankusa_fleet::cmd::certs::make_certs(&ankusa_fleet::cmd::certs::CertsPlan {
                    hosts: (1..=CERTIFIED_NODES)
                        .map(|id| (id, ip.to_string()))
                        .collect(),
                    ..ankusa_fleet::cmd::certs::CertsPlan::new(
                        out.to_owned(),
                        CERTIFIED_NODES,
                        ankusa_fleet::config::Defaults::CLUSTER_ID,
                    )
                })
                .expect("make certificates");
            })
        } else {
            Self::empty_without_certs()
        }
    }

    /// An empty fleet whose certificates `make` writes into its `certs` folder (`ca.pem`,
    /// `nodeN.pem`, `nodeN.key`, `admin.pem`, `admin.key`), for the fleet's address.
    fn empty_with_certs(make: impl FnOnce(&std::path::Path, Ipv4Addr)) -> Fleet {
        let mut fleet = Self::empty_without_certs();
        let out = fleet.dir.path().join("certs");
        std::fs::create_dir_all(&out).expect("certs dir");
        make(&out, fleet.ip);
        fleet.certs = Some(out);
        fleet
    }

    /// Starts `n` initial voters with `[peer_tls]` from the certificates `make` writes (as
    /// [`Fleet::empty_with_certs`]).
    pub fn start_with_certs(
        n: u64,
        extra: &str,
        make: impl FnOnce(&std::path::Path, Ipv4Addr),
    ) -> Fleet {
        Self::empty_with_certs(make).with_initial_voters(n, extra)
    }

    /// Starts `n` initial voters in this empty fleet; `extra` is appended to every config.
    fn with_initial_voters(mut self, n: u64, extra: &str) -> Fleet {
        let initial = specs(self.ip, 1..=n, &[]);
        self.initial = initial.clone();
        for node in &initial {
            self.add_process(node.clone(), &initial, extra);
        }
        self
    }

    fn empty_without_certs() -> Fleet {
        let dir = tempfile::tempdir().expect("tempdir");
        let ip = fleet_ip();
        Fleet {
            dir,
            ip,
            nodes: BTreeMap::new(),
            initial: Vec::new(),
            certs: None,
            api_tls: false,
        }
    }

    /// Starts `n` initial voters with `[peer_tls]` and `[api_tls]`.
    pub fn start_with_api_tls(n: u64, extra: &str) -> Fleet {
        let mut fleet = Fleet::empty(true);
        fleet.api_tls = true;
        fleet.with_initial_voters(n, extra)
    }

    /// A certificate file of this fleet's (`ca.pem`, `admin.key`, ...).
    pub fn cert_file(&self, name: &str) -> PathBuf {
        self.certs.as_ref().expect("a TLS fleet").join(name)
    }

    /// Where a `cluster` command reaches node `id`'s `Admin` service, with the fleet's
    /// `admin` certificate when it runs TLS.
    pub fn admin_target(&self, id: u64) -> ankusa_fleet::cmd::cluster::AdminTarget {
        let file = |name: &str| self.certs.as_ref().map(|dir| dir.join(name));
        ankusa_fleet::cmd::cluster::AdminTarget {
            addr: Some(self.nodes[&id].spec.raft_addr.clone()),
            credentials: ankusa_fleet::cmd::cluster::Credentials {
                config: None,
                ca: file("ca.pem"),
                cert: file("admin.pem"),
                key: file("admin.key"),
                cluster_id: None,
            },
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
        Fleet::empty(tls).with_initial_voters(n, extra)
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
        // check_rate's per-call events (contract §11) are at debug, under their own target.
        .env("RUST_LOG", "info,openraft=warn,check_rate=debug")
        // An error a node exits with stays one readable line in its log (anyhow would add a
        // backtrace when CI sets RUST_BACKTRACE); panics keep theirs.
        .env("RUST_LIB_BACKTRACE", "0")
        .stdout(Stdio::from(log.try_clone().expect("log")))
        .stderr(Stdio::from(log))
        .spawn()
        .expect("spawn node");
    node.child = Some(child);
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

    /// Sends `signal` (`-TERM`, `-STOP`, `-CONT`) to node `id`, which must run.
    pub(super) fn signal(&self, id: u64, signal: &str) {
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
}

/// How a node's start from its data dir ended.
#[derive(Debug)]
pub enum Start {
    /// It serves: it logged `node started`.
    Serving,
    /// It exited before serving, with `status`; `output` is what it wrote meanwhile (its
    /// stdout and stderr go to its log).
    Exited {
        status: std::process::ExitStatus,
        output: String,
    },
}

impl Fleet {
    /// Node `id`'s data dir.
    pub fn data_dir(&self, id: u64) -> PathBuf {
        self.dir.path().join(format!("node{id}"))
    }

    /// What node `id` logged from byte `from` of its log on.
    pub fn log_since(&self, id: u64, from: usize) -> String {
        let log = std::fs::read(&self.nodes[&id].log_path).unwrap_or_default();
        String::from_utf8_lossy(log.get(from..).unwrap_or_default()).into_owned()
    }

    /// How long node `id`'s log is now (for [`Fleet::log_since`]).
    pub fn log_len(&self, id: u64) -> usize {
        std::fs::metadata(&self.nodes[&id].log_path).map_or(0, |m| m.len() as usize)
    }

    /// SIGTERM, and the harness deadline for a clean exit (status 0).
    pub async fn stop(&mut self, id: u64) {
        self.terminate(id);
        let status = self.wait_exit(id).await;
        if !status.success() {
            self.fail(&format!("node {id} stopped with {status}"));
        }
    }

    /// Starts node `id` again from its data dir and waits (with the harness deadline) until
    /// it serves or exits; returns which, with the log it wrote from `from` on.
    pub async fn restart_watched(&mut self, id: u64) -> (Start, usize) {
        let from = self.log_len(id);
        self.restart(id);
        let deadline = Instant::now() + CONDITION_DEADLINE;
        loop {
            let node = self.nodes.get_mut(&id).expect("known node");
            let child = node.child.as_mut().expect("node runs");
            if let Some(status) = child.try_wait().expect("try_wait") {
                node.child = None;
                let output = self.log_since(id, from);
                return (Start::Exited { status, output }, from);
            }
            if self.log_since(id, from).contains("node started") {
                return (Start::Serving, from);
            }
            if Instant::now() > deadline {
                self.fail(&format!("node {id} neither served nor exited"));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}
