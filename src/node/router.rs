//! Where a batch goes: the [`Router`] commits it through this node's Raft while it leads
//! (stamping the entry with a time bounded by the monotonic clock, contract §3,
//! docs/decisions/026), and by a `Propose` call to the leader otherwise.

use std::sync::Arc;
use std::time::Duration;

use openraft::error::ClientWriteError;
use tokio::sync::oneshot;
use tokio::time::Instant;

use super::order::SubmitTurn;
use super::propose::{reply_all, without_given_up, Queued};
use super::stamp::Stamps;
use crate::clock::Clock;
use crate::raft::clock_view::ClockView;
use crate::raft::network::PeerClients;
use crate::raft::{NodeId, ProposeRefusal, ProposeRequest, ProposeResponse, Raft};
use crate::state::{EncodedCommand, FleetRequest, StateLimits};

/// Routes batches to the leader: `client_write` when this node leads, a `Propose` call to
/// the leader otherwise.
pub struct Router {
    node_id: NodeId,
    raft: Raft,
    peers: PeerClients,
    /// The time stamped into each entry this node proposes while it leads.
    stamps: Stamps,
    /// This node's clock against its peers': past the bound it proposes nothing.
    clock: ClockView,
    /// Stamped into every entry this node proposes while it leads.
    limits: StateLimits,
}

impl Router {
    /// A router for node `node_id`, stamping `limits` into the entries it proposes, and
    /// the time read from `clocks`, bounded by `clock`'s `max_clock_offset_ms`.
    pub fn new(
        node_id: NodeId,
        raft: Raft,
        peers: PeerClients,
        limits: StateLimits,
        clock: ClockView,
        clocks: Arc<dyn Clock>,
    ) -> Self {
        Self {
            node_id,
            raft,
            peers,
            stamps: Stamps::new(clocks),
            clock,
            limits,
        }
    }

    /// Commits `batch` once `turn` comes (the batch made before it has been submitted),
    /// through this node's Raft while it leads, by a `Propose` to the leader otherwise.
    pub(super) async fn commit_batch(&self, mut batch: Vec<Queued>, mut turn: SubmitTurn) {
        // The commands move into one shared slice, sent as is by every attempt; each unit
        // keeps its count, to take its answers back out.
        let mut commands: Arc<[EncodedCommand]> = batch
            .iter_mut()
            .flat_map(|queued| std::mem::take(&mut queued.commands))
            .collect();
        loop {
            // Callers that gave up (answered locally at their deadline) are dropped before
            // every attempt: a command not yet sent must not take effect behind their back.
            commands = without_given_up(&mut batch, commands);
            let Some(deadline) = batch.iter().map(|queued| queued.deadline).max() else {
                return;
            };
            turn.wait(deadline).await;
            // Only the first attempt is ordered: the next batch goes once this one is sent.
            let submitted = turn.submitted();
            let leader = self.raft.metrics().borrow().current_leader;
            let outcome = match leader {
                Some(leader_id) => {
                    let sent_at = Instant::now();
                    let (role, outcome) = if leader_id == self.node_id {
                        let outcome = self.write_here(commands.clone(), deadline, submitted);
                        ("leader", outcome.await)
                    } else {
                        let outcome = self.forward(leader_id, &commands, deadline, submitted);
                        let outcome = outcome.await;
                        ("follower", outcome)
                    };
                    metrics::histogram!("ankusa_commit_seconds", "role" => role)
                        .record(sent_at.elapsed().as_secs_f64());
                    outcome
                }
                None => Err(ProposeRefusal::NotLeader { leader_id: None }),
            };
            let outcome = match outcome {
                Err(ProposeRefusal::NotLeader { .. }) => {
                    match self.wait_for_leader_change(leader, deadline).await {
                        Ok(()) => continue,
                        Err(refusal) => Err(refusal),
                    }
                }
                other => other,
            };
            return reply_all(batch, outcome);
        }
    }

    pub(super) fn is_leader(&self) -> bool {
        self.raft.metrics().borrow().current_leader == Some(self.node_id)
    }

    /// The time of the next entry ([`Stamps::next_us`]) in this node's current term.
    fn stamp_now_us(&self) -> u64 {
        let term = self.raft.metrics().borrow().current_term;
        self.stamps.next_us(term, self.clock.bound_us())
    }

    /// Writes one entry; `submitted` is dropped once openraft has it.
    async fn write_here(
        &self,
        commands: Arc<[EncodedCommand]>,
        deadline: Instant,
        submitted: Option<oneshot::Sender<()>>,
    ) -> ProposeResponse {
        if self.clock.skewed() {
            // Another node takes over (`clock_view::watch` stopped this one's heartbeats);
            // the batch waits for it.
            return Err(ProposeRefusal::NotLeader { leader_id: None });
        }
        let request = FleetRequest {
            now_us: self.stamp_now_us(),
            limits: self.limits,
            commands,
        };
        let written = async {
            let receiver = self.raft.client_write_ff(request).await;
            drop(submitted);
            match receiver {
                Ok(receiver) => receiver
                    .await
                    .map_err(|_| "the Raft core dropped the write".to_owned()),
                Err(fatal) => Err(fatal.to_string()),
            }
        };
        match tokio::time::timeout_at(deadline, written).await {
            Err(_elapsed) => Err(ProposeRefusal::Unavailable {
                reason: "deadline".to_owned(),
            }),
            Ok(Ok(Ok(written))) => Ok(written.data.answers),
            Ok(Ok(Err(ClientWriteError::ForwardToLeader(forward)))) => {
                Err(ProposeRefusal::NotLeader {
                    leader_id: forward.leader_id,
                })
            }
            Ok(Ok(Err(e))) => Err(ProposeRefusal::Fatal {
                reason: e.to_string(),
            }),
            Ok(Err(reason)) => Err(ProposeRefusal::Fatal { reason }),
        }
    }

    /// Hands the batch to the leader; `submitted` is dropped once it is on the peer stream.
    async fn forward(
        &self,
        leader_id: NodeId,
        commands: &[EncodedCommand],
        deadline: Instant,
        submitted: Option<oneshot::Sender<()>>,
    ) -> ProposeResponse {
        let raft_addr = {
            let metrics = self.raft.metrics();
            let metrics = metrics.borrow();
            metrics
                .membership_config
                .membership()
                .get_node(&leader_id)
                .map(|n| n.raft_addr.clone())
        };
        let Some(raft_addr) = raft_addr else {
            return Err(ProposeRefusal::NotLeader { leader_id: None });
        };
        let remaining = deadline.saturating_duration_since(Instant::now());
        let request = ProposeRequest {
            commands,
            timeout_ms: u64::try_from(remaining.as_millis()).unwrap_or(u64::MAX),
        };
        match self
            .peers
            .propose(leader_id, &raft_addr, &request, remaining, submitted)
            .await
        {
            Ok(response) => response,
            Err(e) if e.surely_not_delivered() => {
                tracing::debug!(leader_id, error = %e, "leader unreachable, waiting for another");
                Err(ProposeRefusal::NotLeader { leader_id: None })
            }
            Err(e) => Err(ProposeRefusal::Unavailable {
                reason: e.to_string(),
            }),
        }
    }

    /// Waits until the known leader differs from `seen` (or the deadline passes).
    async fn wait_for_leader_change(
        &self,
        seen: Option<NodeId>,
        deadline: Instant,
    ) -> Result<(), ProposeRefusal> {
        let mut metrics = self.raft.metrics();
        let changed = async {
            loop {
                if metrics.changed().await.is_err() {
                    return;
                }
                let leader = metrics.borrow().current_leader;
                if leader.is_some() && leader != seen {
                    return;
                }
            }
        };
        // A leader that refused (or could not be reached) may be re-elected under the same id:
        // re-check at least every few heartbeats.
        let recheck = Instant::now() + Duration::from_millis(100);
        let _ = tokio::time::timeout_at(deadline.min(recheck), changed).await;
        if Instant::now() >= deadline {
            return Err(ProposeRefusal::Unavailable {
                reason: if seen.is_some() {
                    "deadline"
                } else {
                    "no leader"
                }
                .to_owned(),
            });
        }
        Ok(())
    }
}
