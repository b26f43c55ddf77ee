//! The one launcher of child-process fleets: `ankusa-fleet serve` processes on loopback,
//! each from a config written into the fleet's directory, with its log beside it and, when
//! asked, the fleet's peer certificates (`cmd::certs::make_certs`). `dev`, the cluster tests
//! and the nemesis start their fleets here and differ only in [`Options`], the configs they
//! add and what they do with the nodes.
//!
//! It starts, signals, kills and restarts processes, reads their status and waits for a
//! leader; it never talks to a node's `Admin` service, and it never sleeps and hopes: every
//! wait has a deadline. A dropped [`Fleet`] stops every node it started.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use anyhow::Context;
use tokio::time::Instant;

use crate::pb;

/// How long a status call may take to connect, and then to answer.
const STATUS_CONNECT_TIMEOUT: Duration = Duration::from_millis(500);
const STATUS_TIMEOUT: Duration = Duration::from_secs(2);
/// How often a wait looks again.
const POLL: Duration = Duration::from_millis(50);

/// Where one node listens.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeSpec {
    pub id: u64,
    pub api_addr: String,
    pub raft_addr: String,
    /// Where the node serves Prometheus metrics, if it does.
    pub metrics_addr: Option<String>,
}

/// One node of a fleet: its files, and its process while it runs.
#[derive(Debug)]
pub struct Node {
    pub spec: NodeSpec,
    pub config_path: PathBuf,
    /// Every run of the node appends here (stdout and stderr).
    pub log_path: PathBuf,
    pub data_dir: PathBuf,
    child: Option<Child>,
}

impl Node {
    /// Whether the node's process was started and not yet seen exiting (it may be paused).
    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// The process id of the running child, if it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }
}

/// What differs between the fleets the launcher starts.
#[derive(Clone, Debug)]
pub struct Options {
    /// The `ankusa-fleet` binary the nodes run.
    pub exe: PathBuf,
    /// The fleet's directory: configs, logs, data dirs and certificates (made if missing,
    /// never removed: its owner decides).
    pub dir: PathBuf,
    /// The address [`Fleet::free_specs`] picks ports on, and that the certificates name.
    pub ip: Ipv4Addr,
    /// Environment every node process gets.
    pub env: Vec<(String, String)>,
    /// How long a dropped fleet lets its nodes drain after SIGTERM before it kills them;
    /// zero kills them at once.
    pub drain_on_drop: Duration,
}

impl Options {
    /// A fleet of `exe` in `dir` on an address of its own ([`own_loopback_ip`]), killed
    /// when dropped.
    pub fn new(exe: PathBuf, dir: PathBuf) -> Self {
        Self {
            exe,
            dir,
            ip: own_loopback_ip(),
            env: Vec::new(),
            drain_on_drop: Duration::ZERO,
        }
    }
}

/// A loopback address no other fleet of this process uses, and (by the process id in its
/// second octet) most likely none of another process either.
///
/// Ports picked free on it ([`Fleet::free_specs`]) can be taken before a node binds them
/// only by a bind on the same address, and nothing else binds it. Outgoing connections
/// leave from `127.0.0.1`, so their ephemeral ports never collide with these listeners, not
/// even while a killed node is down.
pub fn own_loopback_ip() -> Ipv4Addr {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let pid_octet = 1 + (std::process::id() % 254) as u8;
    Ipv4Addr::new(127, pid_octet, (n / 254 % 256) as u8, 1 + (n % 254) as u8)
}

/// Node processes started from one directory; stopped when dropped.
pub struct Fleet {
    options: Options,
    pub nodes: BTreeMap<u64, Node>,
    /// The fleet's CA and certificates, when its generated configs get `[peer_tls]`.
    certs: Option<PathBuf>,
    /// Whether generated configs get `[api_tls]` too (with [`Fleet::certs`]).
    pub api_tls: bool,
}

impl Fleet {
    /// An empty fleet.
    ///
    /// # Errors
    /// When its directory cannot be made.
    pub fn new(options: Options) -> anyhow::Result<Self> {
        std::fs::create_dir_all(&options.dir)
            .with_context(|| format!("creating {}", options.dir.display()))?;
        Ok(Self {
            options,
            nodes: BTreeMap::new(),
            certs: None,
            api_tls: false,
        })
    }

    /// The fleet's directory.
    pub fn dir(&self) -> &Path {
        &self.options.dir
    }

    /// The address the fleet's free ports are on.
    pub fn ip(&self) -> Ipv4Addr {
        self.options.ip
    }

    /// The folder of the fleet's certificates, if it has them.
    pub fn certs(&self) -> Option<&Path> {
        self.certs.as_deref()
    }

    /// Makes the fleet's CA and certificates for nodes `1..=nodes` in `<dir>/certs`
    /// (reusing what is there), naming the fleet's address too where the loopback names
    /// every certificate carries do not cover it; generated configs then get `[peer_tls]`.
    ///
    /// # Errors
    /// When the certificates cannot be made or written.
    pub fn make_certs(&mut self, nodes: u64) -> anyhow::Result<()> {
        let out = self.options.dir.join("certs");
        let ip = self.options.ip;
        let hosts = if ip == Ipv4Addr::LOCALHOST {
            Vec::new()
        } else {
            (1..=nodes).map(|id| (id, ip.to_string())).collect()
        };
        crate::cmd::certs::make_certs(&crate::cmd::certs::CertsPlan {
            hosts,
            ..crate::cmd::certs::CertsPlan::new(
                out.clone(),
                nodes,
                crate::config::Defaults::CLUSTER_ID,
            )
        })?;
        self.certs = Some(out);
        Ok(())
    }

    /// Generated configs get `[peer_tls]` from certificates made elsewhere into `dir`
    /// (`ca.pem`, `nodeN.pem`, `nodeN.key`).
    pub fn use_certs(&mut self, dir: PathBuf) {
        self.certs = Some(dir);
    }

    /// Specs for nodes `ids` with ports that were free on the fleet's address and differ
    /// from each other and from every port of the fleet's nodes: all listeners are held
    /// until every port is picked. `metrics` gives each a metrics address too.
    ///
    /// # Errors
    /// When no port can be bound there.
    pub fn free_specs(
        &self,
        ids: impl IntoIterator<Item = u64>,
        metrics: bool,
    ) -> anyhow::Result<Vec<NodeSpec>> {
        let taken: Vec<&str> = self
            .nodes
            .values()
            .flat_map(|node| {
                let spec = &node.spec;
                [
                    Some(&spec.api_addr),
                    Some(&spec.raft_addr),
                    spec.metrics_addr.as_ref(),
                ]
            })
            .flatten()
            .map(String::as_str)
            .collect();
        let mut held = Vec::new();
        let mut pick = || -> anyhow::Result<String> {
            loop {
                let listener = TcpListener::bind((self.options.ip, 0))
                    .with_context(|| format!("binding a port on {}", self.options.ip))?;
                let addr = listener.local_addr()?.to_string();
                held.push(listener);
                if !taken.contains(&addr.as_str()) {
                    return Ok(addr);
                }
            }
        };
        ids.into_iter()
            .map(|id| {
                Ok(NodeSpec {
                    id,
                    api_addr: pick()?,
                    raft_addr: pick()?,
                    metrics_addr: if metrics { Some(pick()?) } else { None },
                })
            })
            .collect()
    }

    /// The config of `node` with `members` as its initial voters (none: it joins later),
    /// its data dir in the fleet's directory, `extra` (top-level keys) after its addresses,
    /// and `[peer_tls]` (and `[api_tls]`) when the fleet has certificates.
    pub fn config_text(&self, node: &NodeSpec, members: &[NodeSpec], extra: &str) -> String {
        let data_dir = self.data_dir(node.id);
        let mut text = format!(
            "node_id = {}\napi_addr = \"{}\"\nraft_addr = \"{}\"\n",
            node.id, node.api_addr, node.raft_addr
        );
        if let Some(metrics_addr) = &node.metrics_addr {
            text.push_str(&format!("metrics_addr = \"{metrics_addr}\"\n"));
        }
        text.push_str(&format!(
            "data_dir = {:?}\n{extra}\n",
            data_dir.display().to_string()
        ));
        for member in members {
            text.push_str(&format!(
                "\n[[members]]\nid = {}\napi_addr = \"{}\"\nraft_addr = \"{}\"\n",
                member.id, member.api_addr, member.raft_addr
            ));
        }
        if let Some(certs) = &self.certs {
            let file = |name: String| certs.join(name).display().to_string();
            text.push_str(&format!(
                "\n[peer_tls]\nca_file = {:?}\ncert_file = {:?}\nkey_file = {:?}\n",
                file("ca.pem".to_owned()),
                file(format!("node{}.pem", node.id)),
                file(format!("node{}.key", node.id)),
            ));
            if self.api_tls {
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

    /// Node `id`'s data dir: `<dir>/node<id>`, as every generated config names it.
    pub fn data_dir(&self, id: u64) -> PathBuf {
        self.options.dir.join(format!("node{id}"))
    }

    /// Adds node `spec` with a generated config ([`Fleet::config_text`]), not started.
    ///
    /// # Errors
    /// As [`Fleet::add`].
    pub fn add_node(
        &mut self,
        spec: NodeSpec,
        members: &[NodeSpec],
        extra: &str,
    ) -> anyhow::Result<()> {
        let text = self.config_text(&spec, members, extra);
        self.add(spec, &text)
    }

    /// Adds node `spec` with config `text`, written to `<dir>/node<id>.toml`; its log
    /// `<dir>/node<id>.log` starts empty. The node is not started ([`Fleet::start`]).
    ///
    /// # Errors
    /// When the node is in the fleet already, or a file cannot be written.
    pub fn add(&mut self, spec: NodeSpec, text: &str) -> anyhow::Result<()> {
        let id = spec.id;
        anyhow::ensure!(
            !self.nodes.contains_key(&id),
            "node {id} is in the fleet already"
        );
        let config_path = self.options.dir.join(format!("node{id}.toml"));
        std::fs::write(&config_path, text)
            .with_context(|| format!("writing {}", config_path.display()))?;
        let log_path = self.options.dir.join(format!("node{id}.log"));
        std::fs::File::create(&log_path)
            .with_context(|| format!("creating {}", log_path.display()))?;
        let node = Node {
            spec,
            config_path,
            log_path,
            data_dir: self.data_dir(id),
            child: None,
        };
        self.nodes.insert(id, node);
        Ok(())
    }

    fn node_mut(&mut self, id: u64) -> anyhow::Result<&mut Node> {
        self.nodes
            .get_mut(&id)
            .with_context(|| format!("no node {id} in the fleet"))
    }

    /// Starts node `id` (again) from its config and data dir, its output appended to its
    /// log.
    ///
    /// # Errors
    /// When it runs already or cannot be started.
    pub fn start(&mut self, id: u64) -> anyhow::Result<()> {
        let exe = self.options.exe.clone();
        let env = self.options.env.clone();
        let node = self.node_mut(id)?;
        anyhow::ensure!(node.child.is_none(), "node {id} runs already");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&node.log_path)
            .with_context(|| format!("opening {}", node.log_path.display()))?;
        let child = Command::new(&exe)
            .args(["serve", "--config"])
            .arg(&node.config_path)
            .envs(env)
            .stdout(Stdio::from(log.try_clone()?))
            .stderr(Stdio::from(log))
            .spawn()
            .with_context(|| format!("starting node {id} ({})", exe.display()))?;
        node.child = Some(child);
        Ok(())
    }

    /// SIGKILL: node `id` dies at once, losing whatever it had not fsynced; a no-op when it
    /// does not run.
    pub fn kill(&mut self, id: u64) {
        if let Some(mut child) = self.nodes.get_mut(&id).and_then(|node| node.child.take()) {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    fn signal(&mut self, id: u64, signal: libc::c_int) -> std::io::Result<()> {
        let not_running = || std::io::Error::other(format!("node {id} does not run"));
        let child = self
            .nodes
            .get_mut(&id)
            .and_then(|node| node.child.as_mut())
            .ok_or_else(not_running)?;
        // A child already reaped (by `try_wait` here or before: std keeps its status) has a
        // pid the kernel may have given to another process. Only this process reaps its
        // children, so one not reaped now stays ours until the signal is sent.
        if child.try_wait()?.is_some() {
            return Err(not_running());
        }
        let pid = libc::pid_t::try_from(child.id()).map_err(std::io::Error::other)?;
        // SAFETY: kill(2) on a child we spawned and have not reaped (checked above); it
        // touches no memory of ours.
        if unsafe { libc::kill(pid, signal) } == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        }
    }

    /// SIGTERM: node `id` drains and exits.
    ///
    /// # Errors
    /// When it does not run or the signal cannot be sent.
    pub fn terminate(&mut self, id: u64) -> std::io::Result<()> {
        self.signal(id, libc::SIGTERM)
    }

    /// SIGSTOP: node `id` freezes (no answer, no timer) until [`Fleet::resume`].
    ///
    /// # Errors
    /// As [`Fleet::terminate`].
    pub fn pause(&mut self, id: u64) -> std::io::Result<()> {
        self.signal(id, libc::SIGSTOP)
    }

    /// SIGCONT after [`Fleet::pause`].
    ///
    /// # Errors
    /// As [`Fleet::terminate`].
    pub fn resume(&mut self, id: u64) -> std::io::Result<()> {
        self.signal(id, libc::SIGCONT)
    }

    /// Node `id`'s exit status if its process ended, without reaping a running one; the
    /// node still counts as running until [`Fleet::take_exited`].
    ///
    /// # Errors
    /// When the process cannot be asked.
    pub fn try_wait(&mut self, id: u64) -> anyhow::Result<Option<ExitStatus>> {
        match self.node_mut(id)?.child.as_mut() {
            Some(child) => Ok(child.try_wait()?),
            None => Ok(None),
        }
    }

    /// Node `id`'s exit status if its process ended; the node then no longer runs.
    ///
    /// # Errors
    /// As [`Fleet::try_wait`].
    pub fn take_exited(&mut self, id: u64) -> anyhow::Result<Option<ExitStatus>> {
        let status = self.try_wait(id)?;
        if status.is_some() {
            self.node_mut(id)?.child = None;
        }
        Ok(status)
    }

    /// The first node (by id) whose process ended by itself, with its exit status.
    pub fn first_exited(&mut self) -> Option<(u64, ExitStatus)> {
        self.nodes.iter_mut().find_map(|(id, node)| {
            let status = node.child.as_mut()?.try_wait().ok()??;
            Some((*id, status))
        })
    }

    /// Node `id`'s status through the edge API, if it answers in time.
    pub async fn status(&self, id: u64) -> Option<pb::StatusResponse> {
        let api_addr = &self.nodes.get(&id)?.spec.api_addr;
        let endpoint = tonic::transport::Channel::from_shared(format!("http://{api_addr}")).ok()?;
        let channel = endpoint
            .connect_timeout(STATUS_CONNECT_TIMEOUT)
            .connect()
            .await
            .ok()?;
        let mut client = pb::fleet_client::FleetClient::new(channel);
        let call = client.status(pb::StatusRequest {});
        let response = tokio::time::timeout(STATUS_TIMEOUT, call)
            .await
            .ok()?
            .ok()?;
        Some(response.into_inner())
    }

    /// The leader every node among `ids` names, if they all answer and agree on one.
    pub async fn leader(&self, ids: &[u64]) -> Option<u64> {
        let mut leaders = Vec::new();
        for id in ids {
            leaders.push(self.status(*id).await?.leader_id);
        }
        let first = *leaders.first()?;
        (first != 0 && leaders.iter().all(|l| *l == first)).then_some(first)
    }

    /// Waits until every node among `ids` names the same leader; returns it.
    ///
    /// # Errors
    /// When they do not within `within`.
    pub async fn wait_for_leader(&self, ids: &[u64], within: Duration) -> anyhow::Result<u64> {
        let deadline = Instant::now() + within;
        loop {
            if let Some(leader) = self.leader(ids).await {
                return Ok(leader);
            }
            if Instant::now() > deadline {
                anyhow::bail!("nodes {ids:?} agreed on no leader within {within:?}");
            }
            tokio::time::sleep(POLL).await;
        }
    }
}

impl Drop for Fleet {
    /// Stops every running node: resumed if paused, then SIGTERM and up to
    /// `drain_on_drop` to exit, then SIGKILL.
    fn drop(&mut self) {
        let draining = !self.options.drain_on_drop.is_zero();
        let ids: Vec<u64> = self.nodes.keys().copied().collect();
        for id in ids {
            let _ = self.resume(id);
            if draining {
                let _ = self.terminate(id);
            }
        }
        let deadline = std::time::Instant::now() + self.options.drain_on_drop;
        for node in self.nodes.values_mut() {
            let Some(mut child) = node.child.take() else {
                continue;
            };
            while draining
                && std::time::Instant::now() < deadline
                && matches!(child.try_wait(), Ok(None))
            {
                std::thread::sleep(POLL);
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
