//! The nemesis's own fleet: `ankusa-fleet serve` child processes started by
//! [`ankusa_fleet::cmd::launch`] in a directory of their own, with fault injection on; and what the
//! nemesis does to them.

use std::path::Path;
use std::time::Duration;

use anyhow::Context;
use tokio::time::Instant;

use ankusa_fleet::cmd::cluster::AdminTarget;
use ankusa_fleet::cmd::launch;
use ankusa_fleet::pb;
use ankusa_fleet::pb::internal::{
    AddMemberRequest, ClusterStatusRequest, FaultDirection, FaultKind, PeerFault, SetFaultsRequest,
};

/// How long the fleet may take to elect its first leader.
const LEADER_WAIT: Duration = Duration::from_secs(30);
/// How long an admin call to a node may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(2);
/// How long a membership change may take (a joining node may catch up first).
const MEMBERSHIP_WAIT: Duration = Duration::from_secs(20);

/// A fleet of child processes: `core` members from the start, and one spare node (id
/// `core + 1`, no members in its config) that the `membership` fault adds and removes.
pub struct Fleet {
    nodes: launch::Fleet,
    core: u64,
    /// Whether the spare is a member now (added and not yet removed).
    spare_member: bool,
}

/// One transport fault rule on a node: traffic with `peer` in `direction` gets `kind`.
#[derive(Clone, Copy, Debug)]
pub struct Rule {
    pub peer: u64,
    pub kind: FaultKind,
    pub delay_ms: u64,
    pub direction: FaultDirection,
}

impl Rule {
    /// `kind` both ways with `peer`.
    pub fn both(peer: u64, kind: FaultKind) -> Self {
        Self {
            peer,
            kind,
            delay_ms: 0,
            direction: FaultDirection::Both,
        }
    }
}

impl Fleet {
    /// Starts `count` nodes of `exe` under `dir` and waits for a leader; `extra` is added
    /// to every node's config (e.g. a `planted_bug`).
    ///
    /// # Errors
    /// When a node cannot be started or no leader is elected in time.
    pub async fn start(exe: &Path, dir: &Path, count: u64, extra: &str) -> anyhow::Result<Self> {
        let mut nodes = launch::Fleet::new(launch::Options {
            env: vec![("TOKIO_WORKER_THREADS".to_owned(), "1".to_owned())],
            ..launch::Options::new(exe.to_owned(), dir.to_owned())
        })?;
        let specs = nodes.free_specs(1..=count + 1, false)?;
        let extra = format!(
            "fault_injection = true\nmax_clock_offset_ms = {}\n{extra}",
            crate::workload::MAX_CLOCK_OFFSET_MS,
        );
        let (core, spare) = specs.split_at(count as usize);
        for spec in core {
            nodes.add_node(spec.clone(), core, &extra)?;
        }
        // The spare starts with no members: it joins when the fleet adds it.
        nodes.add_node(spare[0].clone(), &[], &extra)?;
        for id in 1..=count {
            nodes.start(id)?;
        }
        let fleet = Self {
            nodes,
            core: count,
            spare_member: false,
        };
        fleet.wait_for_leader(LEADER_WAIT).await?;
        Ok(fleet)
    }

    /// The ids of the nodes that were members from the start.
    pub fn ids(&self) -> Vec<u64> {
        (1..=self.core).collect()
    }

    /// The ids of every member now: the core, and the spare while it is one.
    pub fn members(&self) -> Vec<u64> {
        let mut ids = self.ids();
        if self.spare_member {
            ids.push(self.spare());
        }
        ids
    }

    /// The spare node's id.
    pub fn spare(&self) -> u64 {
        self.core + 1
    }

    fn admin_target(&self, id: u64) -> AdminTarget {
        AdminTarget {
            addr: Some(self.nodes.nodes[&id].spec.raft_addr.clone()),
            ..AdminTarget::default()
        }
    }

    /// Starts the spare on an empty data dir and asks the fleet, through node `via`, to add
    /// it: as a learner, or as a voter (a learner already is promoted). The admin answer.
    ///
    /// # Errors
    /// When the spare cannot be started or the fleet refuses.
    pub async fn add_spare(&mut self, via: u64, voter: bool) -> anyhow::Result<String> {
        let spare = self.spare();
        if !self.is_up(spare) {
            self.nodes.start(spare)?;
        }
        let node = &self.nodes.nodes[&spare].spec;
        let request = AddMemberRequest {
            cluster_id: String::new(),
            id: spare,
            api_addr: node.api_addr.clone(),
            raft_addr: node.raft_addr.clone(),
            voter,
        };
        let answer = tokio::time::timeout(
            MEMBERSHIP_WAIT,
            ankusa_fleet::cmd::cluster::add(&self.admin_target(via), request),
        )
        .await
        .context("AddMember timed out");
        // An answer lost on the way does not mean the change was not made.
        self.spare_member = self.spare_listed().await.unwrap_or(true);
        answer?
    }

    /// Whether the leader lists the spare as a member (`None`: no leader answered).
    async fn spare_listed(&self) -> Option<bool> {
        let leader = self.any_leader().await?;
        let status = self.status(leader).await?;
        Some(
            status
                .members
                .iter()
                .any(|member| member.id == self.spare()),
        )
    }

    /// Asks the fleet, through node `via`, to remove the spare; once removed, stops it and
    /// wipes its data dir (a later add starts it afresh). The admin answer.
    ///
    /// # Errors
    /// When the fleet refuses or does not answer.
    pub async fn remove_spare(&mut self, via: u64) -> anyhow::Result<String> {
        let spare = self.spare();
        let answer = tokio::time::timeout(
            MEMBERSHIP_WAIT,
            ankusa_fleet::cmd::cluster::remove(&self.admin_target(via), spare),
        )
        .await
        .context("RemoveMember timed out")
        .and_then(|answer| answer);
        // A removal whose answer was lost, or a spare that never joined, counts as
        // removed once the leader no longer lists it.
        let answer = match answer {
            Ok(answer) => answer,
            Err(e) => match self.spare_listed().await {
                Some(false) => format!("not a member ({e:#})"),
                _ => return Err(e),
            },
        };
        self.spare_member = false;
        self.kill(spare);
        let data_dir = self.nodes.data_dir(spare);
        std::fs::remove_dir_all(&data_dir)
            .or_else(|e| match e.kind() {
                std::io::ErrorKind::NotFound => Ok(()),
                _ => Err(e),
            })
            .with_context(|| format!("wiping {}", data_dir.display()))?;
        Ok(answer)
    }

    /// Node `id`'s applied index and state digest, if it answers in time.
    pub async fn digest(&self, id: u64) -> Option<(u64, u64)> {
        let target = self.admin_target(id);
        let call = async {
            let request = ClusterStatusRequest {
                cluster_id: target.cluster_id()?,
                digest: true,
            };
            let status = target.connect().await?.cluster_status(request).await?;
            let status = status.into_inner();
            anyhow::Ok((status.digest_index, status.state_digest))
        };
        tokio::time::timeout(CALL_TIMEOUT, call).await.ok()?.ok()
    }

    /// Node `id`'s edge address.
    pub fn api_addr(&self, id: u64) -> &str {
        &self.nodes.nodes[&id].spec.api_addr
    }

    /// Where node `id` writes its log.
    pub fn log_path(&self, id: u64) -> &Path {
        &self.nodes.nodes[&id].log_path
    }

    /// Whether node `id` runs (it may be paused).
    pub fn is_up(&self, id: u64) -> bool {
        self.nodes.nodes[&id].is_running()
    }

    /// Node `id`'s status, if it answers in time.
    pub async fn status(&self, id: u64) -> Option<pb::StatusResponse> {
        self.nodes.status(id).await
    }

    /// The leader every running core node answers with, if they all agree on one.
    pub async fn leader(&self) -> Option<u64> {
        self.nodes.leader(&self.running(self.ids())).await
    }

    /// Those of `ids` that run (some may be paused).
    fn running(&self, ids: Vec<u64>) -> Vec<u64> {
        ids.into_iter().filter(|id| self.is_up(*id)).collect()
    }

    /// A leader some running node names, if any (whether or not the others agree).
    pub async fn any_leader(&self) -> Option<u64> {
        for id in self.members() {
            if let Some(status) = self.status(id).await {
                if status.leader_id != 0 {
                    return Some(status.leader_id);
                }
            }
        }
        None
    }

    /// Waits until the running core nodes agree on a leader.
    ///
    /// # Errors
    /// When they do not within `wait`.
    pub async fn wait_for_leader(&self, wait: Duration) -> anyhow::Result<u64> {
        let running = self.running(self.ids());
        self.nodes.wait_for_leader(&running, wait).await
    }

    /// SIGSTOP: node `id` freezes until [`Fleet::resume`] (a no-op if it does not run).
    pub fn pause(&mut self, id: u64) {
        let _ = self.nodes.pause(id);
    }

    /// SIGCONT after [`Fleet::pause`].
    pub fn resume(&mut self, id: u64) {
        let _ = self.nodes.resume(id);
    }

    /// SIGKILL: node `id` dies at once, losing whatever it had not fsynced.
    pub fn kill(&mut self, id: u64) {
        self.nodes.kill(id);
    }

    /// Starts node `id` again on its data dir, unless it runs. A node that exited by
    /// itself (a stopped Raft core exits 3, as a supervisor would then see it) is started
    /// again too.
    ///
    /// # Errors
    /// When it cannot be started.
    pub fn restart(&mut self, id: u64) -> anyhow::Result<()> {
        if let Some(status) = self.nodes.take_exited(id)? {
            tracing::warn!(id, %status, "node exited by itself; starting it again");
        }
        if self.is_up(id) {
            return Ok(());
        }
        self.nodes.start(id)
    }

    /// Sets node `id`'s transport fault rules, log-writer hold and wall-clock offset (each
    /// call replaces all three).
    ///
    /// # Errors
    /// When the node cannot be reached.
    pub async fn set_faults(
        &self,
        id: u64,
        rules: &[Rule],
        hold_log_writes: bool,
        clock_offset_ms: i64,
    ) -> anyhow::Result<()> {
        let target = self.admin_target(id);
        let request = SetFaultsRequest {
            cluster_id: target.cluster_id()?,
            faults: rules
                .iter()
                .map(|rule| PeerFault {
                    peer_id: rule.peer,
                    kind: rule.kind as i32,
                    delay_ms: rule.delay_ms,
                    direction: rule.direction as i32,
                })
                .collect(),
            hold_log_writes,
            clock_offset_ms,
            stop_raft_core: false,
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

    /// Waits until every member has applied the same log index; then their state digests
    /// must agree. `Err` names what differs: digests at one index (an anomaly), or indexes
    /// that never met within `wait`.
    pub async fn wait_converged(&self, wait: Duration) -> Result<(u64, usize), String> {
        let deadline = Instant::now() + wait;
        let mut last = Vec::new();
        while Instant::now() < deadline {
            let mut seen = Vec::new();
            for id in self.members() {
                seen.push((id, self.digest(id).await));
            }
            let indexes: Vec<Option<u64>> = seen
                .iter()
                .map(|(_, digest)| digest.map(|(index, _)| index))
                .collect();
            if let Some(Some(index)) = indexes.first() {
                if indexes.iter().all(|other| *other == Some(*index)) {
                    let first = seen[0].1;
                    if seen.iter().all(|(_, digest)| *digest == first) {
                        return Ok((*index, seen.len()));
                    }
                    return Err(format!(
                        "at log index {index} the replicas' state digests differ: {seen:?} (node, (index, digest))"
                    ));
                }
            }
            last = seen;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Err(format!(
            "the replicas never applied the same index within {wait:?}: {last:?} (node, (index, digest))"
        ))
    }

    /// Heals everything: every node runs and answers, no fault rule, no hold.
    ///
    /// # Errors
    /// When a node cannot be restarted or reached.
    pub async fn heal(&mut self) -> anyhow::Result<()> {
        for id in self.members() {
            self.resume(id);
            self.restart(id)?;
        }
        for id in self.members() {
            let deadline = Instant::now() + LEADER_WAIT;
            while let Err(e) = self.set_faults(id, &[], false, 0).await {
                if Instant::now() > deadline {
                    return Err(e.context(format!("healing node {id}")));
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        Ok(())
    }
}
