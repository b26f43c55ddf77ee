//! Node processes through the one launcher ([`ankusa_fleet::cmd::launch`]): the tests' configs
//! and certificates, start, restart, kill, signals, exit, and the waits for cluster
//! conditions (a leader, an applied index), each failing with the node logs.

use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::time::Duration;

use ankusa_fleet::cmd::launch;
use tokio::time::Instant;

use super::{Fleet, NodeSpec, CONDITION_DEADLINE};

/// Node ids that get a certificate in a TLS fleet (initial voters and nodes added later).
const CERTIFIED_NODES: u64 = 7;

impl Fleet {
    /// An empty fleet on its own loopback address, in a temp dir of its own.
    fn empty_without_certs() -> Fleet {
        let dir = tempfile::tempdir().expect("tempdir");
        let options = launch::Options {
            env: vec![
                // check_rate's per-call events (contract §11) are at debug, under their own
                // target.
                (
                    "RUST_LOG".to_owned(),
                    "info,openraft=warn,check_rate=debug".to_owned(),
                ),
                // An error a node exits with stays one readable line in its log (anyhow
                // would add a backtrace when CI sets RUST_BACKTRACE); panics keep theirs.
                ("RUST_LIB_BACKTRACE".to_owned(), "0".to_owned()),
            ],
            ..launch::Options::new(
                PathBuf::from(env!("CARGO_BIN_EXE_ankusa-fleet")),
                dir.path().to_owned(),
            )
        };
        let launch = launch::Fleet::new(options).expect("a fleet dir");
        Fleet {
            ip: launch.ip(),
            launch,
            dir,
            initial: Vec::new(),
        }
    }

    /// An empty fleet; with `tls`, its certificates.
    fn empty(tls: bool) -> Fleet {
        let mut fleet = Self::empty_without_certs();
        if tls {
            fleet
                .launch
                .make_certs(CERTIFIED_NODES)
                .expect("make certificates");
        }
        fleet
    }

    /// An empty fleet whose certificates `make` writes into its `certs` folder (`ca.pem`,
    /// `nodeN.pem`, `nodeN.key`, `admin.pem`, `admin.key`), for the fleet's address.
    fn empty_with_certs(make: impl FnOnce(&std::path::Path, Ipv4Addr)) -> Fleet {
        let mut fleet = Self::empty_without_certs();
        let out = fleet.dir.path().join("certs");
        std::fs::create_dir_all(&out).expect("certs dir");
        make(&out, fleet.ip);
        fleet.launch.use_certs(out);
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
    fn with_initial_voters(self, n: u64, extra: &str) -> Fleet {
        let running: Vec<u64> = (1..=n).collect();
        self.with_some_voters(n, &running, extra)
    }

    /// Writes the configs of `n` initial voters in this empty fleet, and starts those in
    /// `running`.
    fn with_some_voters(mut self, n: u64, running: &[u64], extra: &str) -> Fleet {
        let initial = self.launch.free_specs(1..=n, true).expect("free ports");
        self.initial = initial.clone();
        for node in &initial {
            self.launch
                .add_node(node.clone(), &initial, extra)
                .expect("write config");
            if running.contains(&node.id) {
                self.launch.start(node.id).expect("spawn node");
            }
        }
        self
    }

    /// Starts `n` initial voters with `[peer_tls]` and `[api_tls]`.
    pub fn start_with_api_tls(n: u64, extra: &str) -> Fleet {
        let mut fleet = Fleet::empty(true);
        fleet.launch.api_tls = true;
        fleet.with_initial_voters(n, extra)
    }

    /// A certificate file of this fleet's (`ca.pem`, `admin.key`, ...).
    pub fn cert_file(&self, name: &str) -> PathBuf {
        self.launch.certs().expect("a TLS fleet").join(name)
    }

    /// Where a `cluster` command reaches node `id`'s `Admin` service, with the fleet's
    /// `admin` certificate when it runs TLS.
    pub fn admin_target(&self, id: u64) -> ankusa_fleet::cmd::cluster::AdminTarget {
        let file = |name: &str| self.launch.certs().map(|dir| dir.join(name));
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

    /// Writes every config of an `n`-voter fleet but starts only the nodes in `running`; the
    /// others can be started later with [`Fleet::restart`].
    pub fn start_some(n: u64, running: &[u64], extra: &str) -> Fleet {
        Fleet::empty(true).with_some_voters(n, running, extra)
    }

    /// Writes a config and starts a node process (a joining node passes `members = []`).
    pub fn add_process(&mut self, node: NodeSpec, members: &[NodeSpec], extra: &str) {
        let id = node.id;
        self.launch
            .add_node(node, members, extra)
            .expect("write config");
        self.launch.start(id).expect("spawn node");
    }

    /// A spec for a new node with fresh ports.
    pub fn new_spec(&self, id: u64) -> NodeSpec {
        self.launch
            .free_specs([id], true)
            .expect("free ports")
            .remove(0)
    }

    /// The process id of a running node.
    pub fn pid(&self, id: u64) -> Option<u32> {
        self.nodes[&id].pid()
    }

    /// SIGKILL: no shutdown, no flush.
    pub fn kill(&mut self, id: u64) {
        assert!(self.nodes.contains_key(&id), "known node");
        self.launch.kill(id);
    }

    /// Starts a killed node again from its data dir, same ports.
    pub fn restart(&mut self, id: u64) {
        self.launch
            .start(id)
            .unwrap_or_else(|e| panic!("restart node {id}: {e:#}"));
    }

    pub fn api_addr(&self, id: u64) -> String {
        self.nodes[&id].spec.api_addr.clone()
    }

    /// Waits until every node among `ids` names the same leader; returns it.
    pub async fn wait_for_leader(&self, ids: &[u64]) -> u64 {
        match self.launch.wait_for_leader(ids, CONDITION_DEADLINE).await {
            Ok(leader) => leader,
            Err(e) => self.fail(&format!(
                "timed out waiting for: one leader known to all ({e:#})"
            )),
        }
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

    /// The exit status of node `id` if its process ended (without reaping a running one).
    pub fn try_exit_status(&mut self, id: u64) -> Option<std::process::ExitStatus> {
        self.launch.try_wait(id).expect("try_wait")
    }

    /// SIGTERM: the node drains and exits.
    pub fn terminate(&mut self, id: u64) {
        self.launch
            .terminate(id)
            .unwrap_or_else(|e| panic!("SIGTERM to node {id}: {e}"));
    }

    /// Waits (with the harness deadline) for node `id` to exit by itself; its exit status.
    pub async fn wait_exit(&mut self, id: u64) -> std::process::ExitStatus {
        assert!(self.nodes[&id].is_running(), "node runs");
        let deadline = Instant::now() + CONDITION_DEADLINE;
        loop {
            if let Some(status) = self.launch.take_exited(id).expect("try_wait") {
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
        self.launch.data_dir(id)
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
            if let Some(status) = self.launch.take_exited(id).expect("try_wait") {
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
