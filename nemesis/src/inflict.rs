//! How the nemesis inflicts one planned fault on the fleet (partitions, pauses, kills, lost
//! writes, membership changes, clocks set off) and what it records of it ([`Applied`]).

use std::time::Duration;

use tokio::time::Instant;

use super::fleet::{Fleet, Rule};
use super::history::Recorder;
use super::schedule::{Fault, Planned};
use super::{resolve, wait_back, wait_for_leader_among, workload, Applied, BACK_WAIT};
use ankusa_fleet::pb::internal::{FaultDirection, FaultKind};

/// How often a node's status is read while its clock is skewed within the bound.
const SKEW_READ_EVERY: Duration = Duration::from_millis(250);

/// Rules on node `id` cutting it off from each of `peers` with `kind`, in `direction`.
fn cut(peers: &[u64], kind: FaultKind, direction: FaultDirection) -> Vec<Rule> {
    peers
        .iter()
        .map(|peer| Rule {
            peer: *peer,
            kind,
            delay_ms: 0,
            direction,
        })
        .collect()
}

/// Sets node `id`'s transport rules and clock offset for `lasts`, then clears them. A node
/// that cannot be reached keeps none anyway (the heal clears every node once more).
async fn for_a_while(
    fleet: &Fleet,
    id: u64,
    rules: &[Rule],
    clock_offset_ms: i64,
    lasts: Duration,
) {
    let _ = fleet.set_faults(id, rules, false, clock_offset_ms).await;
    tokio::time::sleep(lasts).await;
    let _ = fleet.set_faults(id, &[], false, 0).await;
}

/// A clock offset of `ms`, ahead or behind.
fn forward_or_back(forward: bool, ms: i64) -> i64 {
    if forward {
        ms
    } else {
        -ms
    }
}

fn cut_kind(blackhole: bool) -> FaultKind {
    if blackhole {
        FaultKind::Blackhole
    } else {
        FaultKind::Drop
    }
}

/// Inflicts one fault for its time, then lifts it; what it did goes into the `Applied`.
pub(super) async fn inflict(fleet: &mut Fleet, recorder: &Recorder, planned: &Planned) -> Applied {
    let lasts = Duration::from_millis(planned.for_ms);
    let from_us = recorder.now_us();
    let leader = fleet.leader().await;
    let target = match planned.fault {
        Fault::Isolate { target, .. }
        | Fault::OneWay { target, .. }
        | Fault::Delay { target, .. }
        | Fault::Pause { target }
        | Fault::Kill { target }
        | Fault::Clock { target, .. }
        | Fault::Skew { target, .. } => resolve(fleet, target).await,
        Fault::Split { .. } | Fault::Lost { .. } | Fault::Membership => leader,
    };
    let mut applied = Applied {
        planned: *planned,
        nodes: Vec::new(),
        note: String::new(),
        led: false,
        clock_offset_ms: 0,
        stood_down: None,
        from_us,
        to_us: from_us,
    };
    let Some(id) = target else {
        tokio::time::sleep(lasts).await;
        applied.to_us = recorder.now_us();
        return applied;
    };
    let members = fleet.members();
    let peers: Vec<u64> = members.iter().copied().filter(|peer| *peer != id).collect();
    let both = FaultDirection::Both;
    let mut note = String::new();
    let nodes = match planned.fault {
        Fault::Isolate { blackhole, .. } | Fault::OneWay { blackhole, .. } => {
            let direction = match planned.fault {
                Fault::OneWay { outgoing: true, .. } => FaultDirection::Outgoing,
                Fault::OneWay { .. } => FaultDirection::Incoming,
                _ => both,
            };
            let rules = cut(&peers, cut_kind(blackhole), direction);
            for_a_while(fleet, id, &rules, 0, lasts).await;
            vec![id]
        }
        Fault::Split {
            with_leader,
            blackhole,
        } => {
            // The minority: (n - 1) / 2 nodes, the leader first when it is in it.
            let size = (members.len() - 1) / 2;
            let mut minority: Vec<u64> = if with_leader { vec![id] } else { Vec::new() };
            minority.extend(peers.iter().copied());
            minority.truncate(size);
            let majority: Vec<u64> = members
                .iter()
                .copied()
                .filter(|node| !minority.contains(node))
                .collect();
            for node in &members {
                let other_side = if minority.contains(node) {
                    &majority
                } else {
                    &minority
                };
                let rules = cut(other_side, cut_kind(blackhole), both);
                let _ = fleet.set_faults(*node, &rules, false, 0).await;
            }
            tokio::time::sleep(lasts).await;
            for node in &members {
                let _ = fleet.set_faults(*node, &[], false, 0).await;
            }
            note = format!("minority {minority:?}, majority {majority:?}");
            minority
        }
        Fault::Delay { delay_ms, .. } => {
            let rules: Vec<Rule> = peers
                .iter()
                .map(|peer| Rule {
                    delay_ms,
                    ..Rule::both(*peer, FaultKind::Delay)
                })
                .collect();
            for_a_while(fleet, id, &rules, 0, lasts).await;
            vec![id]
        }
        Fault::Pause { .. } => {
            fleet.pause(id);
            tokio::time::sleep(lasts).await;
            fleet.resume(id);
            wait_back(fleet, id).await;
            vec![id]
        }
        Fault::Kill { .. } => {
            fleet.kill(id);
            tokio::time::sleep(lasts).await;
            let _ = fleet.restart(id);
            wait_back(fleet, id).await;
            vec![id]
        }
        Fault::Lost { followers: false } => {
            let _ = fleet.set_faults(id, &[], true, 0).await;
            tokio::time::sleep(lasts.min(Duration::from_millis(500))).await;
            fleet.kill(id);
            tokio::time::sleep(lasts).await;
            let _ = fleet.restart(id);
            wait_back(fleet, id).await;
            vec![id]
        }
        Fault::Lost { followers: true } if peers.is_empty() => Vec::new(),
        Fault::Lost { followers: true } => {
            // Every follower holds its writer: nothing it appends reaches its disk, so the
            // leader can commit nothing (it needs a follower's durable copy for a quorum).
            // Then the followers die, losing what they held, and elect a leader of
            // their own while the old one is cut off: had the leader counted an unsynced
            // copy, the new term would not have that entry.
            let mut failed = Vec::new();
            for follower in &peers {
                if fleet.set_faults(*follower, &[], true, 0).await.is_err() {
                    failed.push(*follower);
                }
            }
            tokio::time::sleep(lasts.min(Duration::from_millis(1_000))).await;
            let _ = fleet
                .set_faults(id, &cut(&peers, FaultKind::Drop, both), false, 0)
                .await;
            for follower in &peers {
                fleet.kill(*follower);
            }
            for follower in &peers {
                let _ = fleet.restart(*follower);
            }
            let elected = wait_for_leader_among(fleet, &peers).await;
            note = format!(
                "leader {id} cut off; the followers elected {elected:?}; holds that failed: {failed:?}"
            );
            tokio::time::sleep(lasts.saturating_sub(Duration::from_millis(1_000))).await;
            let _ = fleet.set_faults(id, &[], false, 0).await;
            // The followers were down; the leader was not (it answers alone meanwhile).
            peers.clone()
        }
        Fault::Membership => {
            let step = |what: &str, answer: anyhow::Result<String>| match answer {
                Ok(message) => format!("{what}: {message}; "),
                Err(e) => format!("{what} failed: {e:#}; "),
            };
            if !fleet.members().contains(&fleet.spare()) {
                let added = fleet.add_spare(id, false).await;
                note += &step("add as learner", added);
            }
            tokio::time::sleep(lasts / 2).await;
            let via = fleet.leader().await.unwrap_or(id);
            let promoted = fleet.add_spare(via, true).await;
            note += &step("promote", promoted);
            tokio::time::sleep(lasts / 2).await;
            let deadline = Instant::now() + BACK_WAIT;
            loop {
                let via = fleet.leader().await.unwrap_or(id);
                match fleet.remove_spare(via).await {
                    Ok(message) => {
                        note += &step("remove", Ok(message));
                        break;
                    }
                    Err(e) if Instant::now() > deadline => {
                        note += &step("remove", Err(e));
                        break;
                    }
                    Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
                }
            }
            vec![fleet.spare()]
        }
        Fault::Clock { forward, .. } => {
            let offset_ms = forward_or_back(forward, workload::CLOCK_SKEW_MS);
            applied.clock_offset_ms = offset_ms;
            for_a_while(fleet, id, &[], offset_ms, lasts).await;
            vec![id]
        }
        Fault::Skew { forward, .. } => {
            let offset_ms = forward_or_back(forward, workload::SMALL_SKEW_MS);
            applied.clock_offset_ms = offset_ms;
            let _ = fleet.set_faults(id, &[], false, offset_ms).await;
            // Within the bound nothing may change: the node must not stand down for its
            // clock, read every quarter second while the skew lasts. Two reads in a row
            // must say so: one reading taken over a stalled round trip can be off by half
            // of it, and a node that stands down for that stands up again at the next.
            let ends = tokio::time::Instant::now() + lasts;
            let mut said_before = None;
            while applied.stood_down.is_none() && tokio::time::Instant::now() < ends {
                let said = fleet
                    .status(id)
                    .await
                    .map(|status| status.degraded_reason)
                    .filter(|reason| reason.contains("clock offset"));
                if said_before.is_some() && said.is_some() {
                    applied.stood_down = said.clone();
                }
                said_before = said;
                tokio::time::sleep_until(ends.min(tokio::time::Instant::now() + SKEW_READ_EVERY))
                    .await;
            }
            tokio::time::sleep_until(ends).await;
            let _ = fleet.set_faults(id, &[], false, 0).await;
            vec![id]
        }
    };
    let leader_after = fleet.leader().await;
    applied.led = [leader, leader_after]
        .iter()
        .any(|led| led.is_some_and(|led| nodes.contains(&led)));
    applied.nodes = nodes;
    applied.note = note;
    applied.to_us = recorder.now_us();
    applied
}
