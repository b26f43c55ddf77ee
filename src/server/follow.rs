//! What a running node keeps following: the membership (whose addresses get connection
//! places of their own on `raft_addr`), and the Raft core, into the `Fleet` health status
//! and the Raft gauges (a known leader, a cut-off leader, a core that stopped, which the
//! process then drains on).

use std::time::Duration;

use tokio::sync::watch;

use crate::accept::MemberSources;
use crate::api::drain::DrainGate;
use crate::api::FleetService;
use crate::pb;
use crate::raft::Raft;

/// How often `follow_members` looks at the membership.
const FOLLOW_MEMBERS_EVERY: Duration = Duration::from_secs(1);

/// Keeps `members` (the addresses with connection places of their own on `raft_addr`) to
/// the current membership, voters and learners, plus the config's initial members (set
/// before): a member the config lists keeps its places while it is being added.
pub(super) async fn follow_members(
    raft: Raft,
    members: MemberSources,
    initial: Vec<String>,
    mut stopped: watch::Receiver<bool>,
) {
    let metrics = raft.metrics();
    let mut seen = None;
    let mut tick = tokio::time::interval(FOLLOW_MEMBERS_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        {
            let now = metrics.borrow();
            let membership = &now.membership_config;
            if seen != Some(*membership.log_id()) {
                seen = Some(*membership.log_id());
                let current = membership.nodes().map(|(_, node)| node.raft_addr.as_str());
                // Each member once (the initial ones are in the membership too, mostly).
                let all: std::collections::BTreeSet<&str> =
                    current.chain(initial.iter().map(String::as_str)).collect();
                members.set(all);
            }
        }
        tokio::select! {
            _ = tick.tick() => {}
            _ = stopped.changed() => return,
        }
    }
}

/// How often `follow_raft` reads openraft's metrics.
const FOLLOW_RAFT_EVERY: Duration = Duration::from_millis(100);

/// Follows openraft's metrics while the node runs: the Raft gauges (`raft::gauges`), and
/// the health of `ankusa.fleet.v1.Fleet`, `SERVING` only while this node knows a leader
/// (and, when it leads, a quorum acknowledged it within `lease`) and is not draining, so a
/// load balancer can prefer nodes in touch with the fleet. The
/// overall health ("") stays `SERVING` until the drain: the node can always answer its
/// edge, from its own state if it must.
///
/// A Raft core that stops while the node has not been told to stop (a fatal storage
/// error, a panic, `stop_raft_core`) ends the following: `Fleet` turns `NOT_SERVING`,
/// `ankusa_raft_core_running` 0, and `core_stopped` gets the reason, on which the process
/// drains and exits ([`RunningNode::raft_core_stopped`](super::RunningNode::raft_core_stopped)). A node without its core would
/// otherwise stay up, frozen at its last applied entry, and look healthy.
pub(super) async fn follow_raft(
    raft: Raft,
    node_id: crate::raft::NodeId,
    lease: Duration,
    health: tonic_health::server::HealthReporter,
    gate: DrainGate,
    core_stopped: watch::Sender<Option<String>>,
    mut stopped: watch::Receiver<bool>,
) {
    type Fleet = pb::fleet_server::FleetServer<FleetService>;
    let metrics = raft.metrics();
    let mut gauges = crate::raft::gauges::Gauges::default();
    let mut serving = None;
    // When this node began to lead, and in which term: a new leader has heard from no
    // quorum yet (openraft says `None`), which is not being cut off.
    let mut leading_since: Option<(u64, tokio::time::Instant)> = None;
    // openraft publishes its metrics on every turn of its loop, thousands of times a
    // second under load: they are read on a tick instead.
    let mut tick = tokio::time::interval(FOLLOW_RAFT_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    crate::raft::gauges::export_core_running(true);
    loop {
        metrics::gauge!("ankusa_edge_calls_in_flight").set(gate.in_flight() as f64);
        if reported_core_stop(&metrics, &health, &core_stopped, &stopped).await {
            return;
        }
        let leader_known = {
            let now = metrics.borrow();
            gauges.export(&now, node_id);
            if now.current_leader != Some(node_id) {
                leading_since = None;
            } else if leading_since.is_none_or(|(term, _)| term != now.current_term) {
                leading_since = Some((now.current_term, tokio::time::Instant::now()));
            }
            let heard_from_quorum = match now.millis_since_quorum_ack {
                Some(ms) => u128::from(ms) < lease.as_millis(),
                None => leading_since.is_some_and(|(_, since)| since.elapsed() < lease),
            };
            match now.current_leader {
                // A leader cut off from its followers keeps calling itself leader (openraft
                // does not step it down).
                Some(leader) if leader == node_id => heard_from_quorum,
                Some(_) => true,
                None => false,
            }
        };
        let serve = leader_known && !gate.is_draining();
        if serving != Some(serve) {
            if serve {
                health.set_serving::<Fleet>().await;
                // A drain that began meanwhile has the last word.
                if gate.is_draining() {
                    health.set_not_serving::<Fleet>().await;
                }
            } else {
                health.set_not_serving::<Fleet>().await;
            }
            serving = Some(serve);
        }
        tokio::select! {
            _ = tick.tick() => {}
            _ = stopped.changed() => return,
        }
    }
}

/// Reports a Raft core that stopped while this node was not told to stop (its own
/// shutdown stops Raft too, and that is no failure): `ankusa_raft_core_running` 0, `Fleet`
/// health `NOT_SERVING`, and the reason to `core_stopped`. True if it reported one.
async fn reported_core_stop(
    metrics: &watch::Receiver<crate::raft::gauges::Metrics>,
    health: &tonic_health::server::HealthReporter,
    core_stopped: &watch::Sender<Option<String>>,
    stopped: &watch::Receiver<bool>,
) -> bool {
    let Some(why) = crate::raft::gauges::core_stopped(metrics).filter(|_| !*stopped.borrow())
    else {
        return false;
    };
    crate::raft::gauges::export_core_running(false);
    tracing::error!(reason = %why, "the Raft core stopped: this node drains and exits");
    health
        .set_not_serving::<pb::fleet_server::FleetServer<FleetService>>()
        .await;
    core_stopped.send_replace(Some(why));
    true
}
