//! The nemesis's own fleet: `ankusa-fleet serve` child processes on loopback, in a
//! directory of their own, with fault injection on; and what the nemesis does to them.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::Context;
use tokio::time::Instant;

use crate::cli::AdminTarget;
use crate::pb;
use crate::pb::internal::{FaultKind, PeerFault, SetFaultsRequest};

/// How long the fleet may take to elect its first leader.
const LEADER_WAIT: Duration = Duration::from_secs(30);
/// How long an admin or status call to a node may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(2);

/// One node of the fleet.
struct Node {
    api_addr: String,
    raft_addr: String,
    config: PathBuf,
    log: PathBuf,
    /// `None` while killed.
    child: Option<Child>,
}

/// A fleet of child processes.
pub struct Fleet {
    exe: PathBuf,
    nodes: BTreeMap<u64, Node>,
}

fn free_port() -> anyhow::Result<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(listener.local_addr()?.port())
}

impl Fleet {
    /// Starts `count` nodes under `dir` and waits for a leader.
    ///
    /// # Errors
    /// When a node cannot be started or no leader is elected in time.
    /// `extra` is added to every node's config (e.g. a `planted_bug`).
    pub async fn start(exe: &Path, dir: &Path, count: u64, extra: &str) -> anyhow::Result<Self> {
        let mut addrs = Vec::new();
        for id in 1..=count {
            addrs.push((
                id,
                format!("127.0.0.1:{}", free_port()?),
                format!("127.0.0.1:{}", free_port()?),
            ));
        }
        let members: String = addrs
            .iter()
            .map(|(id, api, raft)| {
                format!("\n[[members]]\nid = {id}\napi_addr = \"{api}\"\nraft_addr = \"{raft}\"\n")
            })
            .collect();
        let mut nodes = BTreeMap::new();
        for (id, api_addr, raft_addr) in &addrs {
            let data_dir = dir.join(format!("node{id}"));
            let config = dir.join(format!("node{id}.toml"));
            let text = format!(
                "node_id = {id}\napi_addr = \"{api_addr}\"\nraft_addr = \"{raft_addr}\"\ndata_dir = \"{}\"\nfault_injection = true\n{extra}\n{members}",
                data_dir.display()
            );
            std::fs::write(&config, text)
                .with_context(|| format!("writing {}", config.display()))?;
            nodes.insert(
                *id,
                Node {
                    api_addr: api_addr.clone(),
                    raft_addr: raft_addr.clone(),
                    config,
                    log: dir.join(format!("node{id}.log")),
                    child: None,
                },
            );
        }
        let mut fleet = Self {
            exe: exe.to_path_buf(),
            nodes,
        };
        for id in 1..=count {
            fleet.spawn(id)?;
        }
        fleet.wait_for_leader(LEADER_WAIT).await?;
        Ok(fleet)
    }

    fn spawn(&mut self, id: u64) -> anyhow::Result<()> {
        let node = self.nodes.get_mut(&id).context("no such node")?;
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&node.log)?;
        let child = Command::new(&self.exe)
            .args(["serve", "--config"])
            .arg(&node.config)
            .env("TOKIO_WORKER_THREADS", "1")
            .stdout(Stdio::from(log.try_clone()?))
            .stderr(Stdio::from(log))
            .spawn()
            .with_context(|| format!("starting node {id}"))?;
        node.child = Some(child);
        Ok(())
    }

    /// The node ids.
    pub fn ids(&self) -> Vec<u64> {
        self.nodes.keys().copied().collect()
    }

    /// Node `id`'s edge address.
    pub fn api_addr(&self, id: u64) -> &str {
        &self.nodes[&id].api_addr
    }

    /// Where node `id` writes its log.
    pub fn log_path(&self, id: u64) -> &Path {
        &self.nodes[&id].log
    }

    /// Whether node `id` runs (it may be paused).
    pub fn is_up(&self, id: u64) -> bool {
        self.nodes[&id].child.is_some()
    }

    /// Node `id`'s status, if it answers in time.
    pub async fn status(&self, id: u64) -> Option<pb::StatusResponse> {
        tokio::time::timeout(CALL_TIMEOUT, crate::cli::status(self.api_addr(id)))
            .await
            .ok()?
            .ok()
    }

    /// The leader every running node that answers agrees on, if any.
    pub async fn leader(&self) -> Option<u64> {
        let mut leader = None;
        for id in self.ids() {
            if !self.is_up(id) {
                continue;
            }
            let seen = self.status(id).await?.leader_id;
            if seen == 0 || leader.is_some_and(|l| l != seen) {
                return None;
            }
            leader = Some(seen);
        }
        leader
    }

    /// Waits until the running nodes agree on a leader.
    ///
    /// # Errors
    /// When they do not within `wait`.
    pub async fn wait_for_leader(&self, wait: Duration) -> anyhow::Result<u64> {
        let deadline = Instant::now() + wait;
        while Instant::now() < deadline {
            if let Some(leader) = self.leader().await {
                return Ok(leader);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        anyhow::bail!("no leader within {wait:?}")
    }

    fn signal(&self, id: u64, signal: libc::c_int) {
        if let Some(child) = &self.nodes[&id].child {
            if let Ok(pid) = libc::pid_t::try_from(child.id()) {
                // SAFETY: kill(2) on a child we spawned and have not reaped; it touches no
                // memory of ours.
                unsafe { libc::kill(pid, signal) };
            }
        }
    }

    /// SIGSTOP: node `id` freezes until [`Fleet::resume`].
    pub fn pause(&self, id: u64) {
        self.signal(id, libc::SIGSTOP);
    }

    /// SIGCONT after [`Fleet::pause`].
    pub fn resume(&self, id: u64) {
        self.signal(id, libc::SIGCONT);
    }

    /// SIGKILL: node `id` dies at once, losing whatever it had not fsynced.
    pub fn kill(&mut self, id: u64) {
        if let Some(mut child) = self.nodes.get_mut(&id).and_then(|node| node.child.take()) {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts node `id` again on its data dir.
    ///
    /// # Errors
    /// When it cannot be started.
    pub fn restart(&mut self, id: u64) -> anyhow::Result<()> {
        if self.is_up(id) {
            return Ok(());
        }
        self.spawn(id)
    }

    /// Sets node `id`'s transport fault rules (`(peer, kind, delay)`) and log-writer hold.
    ///
    /// # Errors
    /// When the node cannot be reached.
    pub async fn set_faults(
        &self,
        id: u64,
        rules: &[(u64, FaultKind, u64)],
        hold_log_writes: bool,
    ) -> anyhow::Result<()> {
        let target = AdminTarget {
            addr: Some(self.nodes[&id].raft_addr.clone()),
            config: None,
            ca: None,
            cert: None,
            key: None,
            cluster_id: None,
        };
        let request = SetFaultsRequest {
            cluster_id: target.cluster_id()?,
            faults: rules
                .iter()
                .map(|(peer_id, kind, delay_ms)| PeerFault {
                    peer_id: *peer_id,
                    kind: *kind as i32,
                    delay_ms: *delay_ms,
                })
                .collect(),
            hold_log_writes,
        };
        tokio::time::timeout(CALL_TIMEOUT, async {
            target.connect().await?.set_faults(request).await?;
            anyhow::Ok(())
        })
        .await
        .context("set_faults timed out")?
    }

    /// Waits until every node knows the leader and has handed everything it decided alone
    /// to the fleet (no node says `degraded`); `false` if that did not happen in `wait`.
    pub async fn wait_reconciled(&self, wait: Duration) -> bool {
        let deadline = Instant::now() + wait;
        while Instant::now() < deadline {
            let mut all = true;
            for id in self.ids() {
                match self.status(id).await {
                    Some(status) if status.leader_id != 0 && !status.degraded => {}
                    _ => all = false,
                }
            }
            if all {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        false
    }

    /// Heals everything: every node runs and answers, no fault rule, no hold.
    ///
    /// # Errors
    /// When a node cannot be restarted or reached.
    pub async fn heal(&mut self) -> anyhow::Result<()> {
        for id in self.ids() {
            self.resume(id);
            self.restart(id)?;
        }
        for id in self.ids() {
            let deadline = Instant::now() + LEADER_WAIT;
            while let Err(e) = self.set_faults(id, &[], false).await {
                if Instant::now() > deadline {
                    return Err(e.context(format!("healing node {id}")));
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        Ok(())
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        for id in self.ids() {
            self.resume(id);
            self.kill(id);
        }
    }
}
