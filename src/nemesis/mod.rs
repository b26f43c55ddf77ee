//! The nemesis: a fleet of child processes, a seeded workload and a seeded fault schedule,
//! and checkers over the history it records (docs/reliability.md).

pub mod check;
pub mod fleet;
pub mod history;
pub mod schedule;
pub mod workload;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use tokio::sync::watch;
use tokio::time::Instant;

use check::{Downtime, Findings};
use fleet::Fleet;
use history::{Decided, Op, Outcome, Recorder};
use schedule::{Fault, Planned, Target};

use crate::pb::internal::FaultKind;

/// What to run.
#[derive(Clone, Debug)]
pub struct Plan {
    pub seed: u64,
    pub duration: Duration,
    pub nodes: u64,
    pub clients_per_node: usize,
    /// What a call may take beyond its timeout.
    pub deadline_slack: Duration,
    /// A known bug every node plays (`config::PlantedBug`, as the config spells it), to
    /// show the checkers catch it.
    pub planted_bug: Option<String>,
}

/// A fault as it happened: on which node, from when to when (µs since the run began).
#[derive(Clone, Debug)]
pub struct Applied {
    pub planned: Planned,
    pub node: Option<u64>,
    pub from_us: u64,
    pub to_us: u64,
}

/// What a run found.
pub struct Outcomes {
    pub history: Vec<Op>,
    pub applied: Vec<Applied>,
    pub findings: Findings,
    pub dir: PathBuf,
}

/// How long the healed fleet may take to hand over every local decision.
const RECONCILE_WAIT: Duration = Duration::from_secs(30);
/// The client id of the final probes.
const PROBE_CLIENT: usize = 1_000;
/// How long a killed or paused node may take to answer again once the fault ends.
const BACK_WAIT: Duration = Duration::from_secs(20);

/// Runs the nemesis: a fleet, the workload and the schedule for `plan.duration`, then a
/// heal and the checkers.
///
/// # Errors
/// When the fleet cannot be started or healed (the run proves nothing then).
pub async fn run(plan: &Plan) -> anyhow::Result<Outcomes> {
    let dir = std::env::temp_dir().join(format!(
        "ankusa-nemesis-{}-{}",
        plan.seed,
        std::process::id()
    ));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let exe = std::env::current_exe()?;
    let extra = plan
        .planted_bug
        .as_ref()
        .map(|bug| format!("planted_bug = \"{bug}\""))
        .unwrap_or_default();
    let mut fleet = Fleet::start(&exe, &dir, plan.nodes, &extra).await?;
    let schedule = schedule::plan(plan.seed, plan.duration.as_millis() as u64);
    let recorder = Recorder::new();
    let (stop, stopped) = watch::channel(false);
    let mut clients = Vec::new();
    for (n, node) in fleet.ids().into_iter().enumerate() {
        for c in 0..plan.clients_per_node {
            let client = workload::Client {
                id: n * plan.clients_per_node + c,
                node,
                api_addr: fleet.api_addr(node).to_owned(),
                seed: plan.seed,
            };
            clients.push(tokio::spawn(client.run(recorder.clone(), stopped.clone())));
        }
    }
    let started = Instant::now();
    let mut applied = Vec::new();
    for planned in &schedule {
        tokio::time::sleep_until(started + Duration::from_millis(planned.at_ms)).await;
        applied.push(inflict(&mut fleet, &recorder, planned).await);
    }
    tokio::time::sleep_until(started + plan.duration).await;
    let _ = stop.send(true);
    for client in clients {
        let _ = client.await;
    }
    fleet.heal().await?;
    let leader = fleet.wait_for_leader(BACK_WAIT).await?;
    let reconciled = fleet.wait_reconciled(RECONCILE_WAIT).await;
    // From here on every queued settle must have reached the fleet.
    let settled_by_us = recorder.now_us();
    let mut keys: Vec<String> = recorder
        .history()
        .into_iter()
        .filter_map(|op| match op.request {
            history::Request::Claim { key, .. } => Some(key),
            _ => None,
        })
        .collect();
    keys.sort();
    keys.dedup();
    let prober = workload::Client {
        id: PROBE_CLIENT,
        node: leader,
        api_addr: fleet.api_addr(leader).to_owned(),
        seed: plan.seed,
    };
    prober.probe(&recorder, &keys).await;
    let history = recorder.history();
    let downtimes: Vec<Downtime> = applied
        .iter()
        .filter(|fault| {
            matches!(
                fault.planned.fault,
                Fault::Pause { .. } | Fault::Kill { .. } | Fault::Lost
            )
        })
        .filter_map(|fault| {
            fault.node.map(|node| Downtime {
                node,
                from_us: fault.from_us,
                to_us: fault.to_us,
            })
        })
        .collect();
    let checking = Instant::now();
    let mut findings = check::all(
        &history,
        &downtimes,
        plan.deadline_slack.as_micros() as u64,
        settled_by_us,
    );
    findings.checked_in = checking.elapsed();
    if !reconciled {
        findings.anomalies.push(check::Anomaly {
            checker: "reconciled after heal",
            detail: format!(
                "some node still had local decisions to hand over {RECONCILE_WAIT:?} after the heal"
            ),
            ops: Vec::new(),
        });
    }
    Ok(Outcomes {
        history,
        applied,
        findings,
        dir,
    })
}

async fn resolve(fleet: &Fleet, target: Target) -> Option<u64> {
    let ids = fleet.ids();
    match target {
        Target::Leader => fleet.leader().await,
        Target::Node(n) => Some(ids[((n - 1) % ids.len() as u64) as usize]),
    }
}

/// Waits until node `id` answers again (a restarted node's start-up counts as down).
async fn wait_back(fleet: &Fleet, id: u64) {
    let deadline = Instant::now() + BACK_WAIT;
    while Instant::now() < deadline && fleet.status(id).await.is_none() {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Inflicts one fault for its time, then lifts it.
async fn inflict(fleet: &mut Fleet, recorder: &Recorder, planned: &Planned) -> Applied {
    let lasts = Duration::from_millis(planned.for_ms);
    let target = match planned.fault {
        Fault::Partition { target, .. }
        | Fault::Delay { target, .. }
        | Fault::Pause { target }
        | Fault::Kill { target } => target,
        Fault::Lost => Target::Leader,
    };
    let node = resolve(fleet, target).await;
    let from_us = recorder.now_us();
    if let Some(id) = node {
        let peers: Vec<u64> = fleet.ids().into_iter().filter(|peer| *peer != id).collect();
        let rules = |kind: FaultKind, delay_ms: u64| -> Vec<(u64, FaultKind, u64)> {
            peers.iter().map(|peer| (*peer, kind, delay_ms)).collect()
        };
        match planned.fault {
            Fault::Partition { blackhole, .. } => {
                let kind = if blackhole {
                    FaultKind::Blackhole
                } else {
                    FaultKind::Drop
                };
                let _ = fleet.set_faults(id, &rules(kind, 0), false).await;
                tokio::time::sleep(lasts).await;
                let _ = fleet.set_faults(id, &[], false).await;
            }
            Fault::Delay { delay_ms, .. } => {
                let _ = fleet
                    .set_faults(id, &rules(FaultKind::Delay, delay_ms), false)
                    .await;
                tokio::time::sleep(lasts).await;
                let _ = fleet.set_faults(id, &[], false).await;
            }
            Fault::Pause { .. } => {
                fleet.pause(id);
                tokio::time::sleep(lasts).await;
                fleet.resume(id);
                wait_back(fleet, id).await;
            }
            Fault::Kill { .. } => {
                fleet.kill(id);
                tokio::time::sleep(lasts).await;
                let _ = fleet.restart(id);
                wait_back(fleet, id).await;
            }
            Fault::Lost => {
                let _ = fleet.set_faults(id, &[], true).await;
                tokio::time::sleep(lasts.min(Duration::from_millis(500))).await;
                fleet.kill(id);
                tokio::time::sleep(lasts).await;
                let _ = fleet.restart(id);
                wait_back(fleet, id).await;
            }
        }
    } else {
        tokio::time::sleep(lasts).await;
    }
    Applied {
        planned: *planned,
        node,
        from_us,
        to_us: recorder.now_us(),
    }
}

impl Outcomes {
    /// The report: faults by kind, operations by outcome, anomalies by checker, what is
    /// needed to read a failure, and the one summary line last.
    pub fn report(&self, plan: &Plan) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "nemesis: seed {}, {} nodes, {} s, fleet in {}",
            plan.seed,
            plan.nodes,
            plan.duration.as_secs(),
            self.dir.display()
        );
        let mut faults: BTreeMap<&str, usize> = BTreeMap::new();
        for kind in ["partition", "pause", "kill", "lost"] {
            faults.insert(kind, 0);
        }
        let mut skipped = 0;
        for fault in &self.applied {
            match fault.node {
                Some(_) => *faults.entry(fault.planned.fault.kind()).or_default() += 1,
                // Its target was the leader, and no leader was agreed on at the time.
                None => skipped += 1,
            }
        }
        let _ = writeln!(
            out,
            "faults: {faults:?} ({skipped} skipped: no leader to take)"
        );
        let (mut fleet, mut local, mut unknown, mut not_sent) = (0, 0, 0, 0);
        for op in &self.history {
            match op.outcome {
                Outcome::Answered(_, Decided::Fleet) => fleet += 1,
                Outcome::Answered(_, Decided::Local) => local += 1,
                Outcome::Unknown(_) => unknown += 1,
                Outcome::NotSent(_) => not_sent += 1,
            }
        }
        let queued = self
            .history
            .iter()
            .filter(|op| matches!(op.outcome, Outcome::Answered(history::Answer::Queued, _)))
            .count();
        let _ = writeln!(
            out,
            "ops: {} (decided by the fleet {fleet}, locally {local} of which {queued} queued settles, unknown {unknown}, not sent {not_sent})",
            self.history.len()
        );
        let mut by_checker: BTreeMap<&str, usize> = BTreeMap::new();
        for checker in [
            "linearizability",
            "duplicate without a commit",
            "committed claim lost",
            "deadline",
            "reconciled after heal",
            "linearizability inconclusive",
        ] {
            by_checker.insert(checker, 0);
        }
        for anomaly in &self.findings.anomalies {
            *by_checker.entry(anomaly.checker).or_default() += 1;
        }
        let _ = writeln!(
            out,
            "anomalies: {by_checker:?} ({} claim keys checked for linearizability in {:.1} s, {} inconclusive: {:?})",
            self.findings.keys_checked,
            self.findings.checked_in.as_secs_f64(),
            self.findings.inconclusive_keys.len(),
            self.findings.inconclusive_keys
        );
        if !self.findings.anomalies.is_empty() {
            let _ = writeln!(
                out,
                "replay: ankusa-fleet nemesis --seed {} --duration-s {} --nodes {} --clients {} --deadline-slack-ms {}{}",
                plan.seed,
                plan.duration.as_secs(),
                plan.nodes,
                plan.clients_per_node,
                plan.deadline_slack.as_millis(),
                plan.planted_bug
                    .as_ref()
                    .map(|bug| format!(" --plant-bug {bug}"))
                    .unwrap_or_default()
            );
            let _ = writeln!(out, "schedule:");
            for fault in &self.applied {
                let _ = writeln!(
                    out,
                    "  {:>8} µs .. {:>8} µs  node {:?}  {:?}",
                    fault.from_us, fault.to_us, fault.node, fault.planned.fault
                );
            }
            for anomaly in &self.findings.anomalies {
                let _ = writeln!(out, "anomaly ({}): {}", anomaly.checker, anomaly.detail);
                for id in anomaly.ops.iter().take(200) {
                    if let Some(op) = self.history.get(*id) {
                        let _ = writeln!(
                            out,
                            "    op {:>6} client {:>2} node {} [{} .. {}] {:?} -> {:?}",
                            op.id,
                            op.client,
                            op.node,
                            op.invoke_us,
                            op.return_us,
                            op.request,
                            op.outcome
                        );
                    }
                }
            }
        }
        let _ = writeln!(
            out,
            "nemesis seed {}: {} ops, {} faults, {} anomalies",
            plan.seed,
            self.history.len(),
            self.applied
                .iter()
                .filter(|fault| fault.node.is_some())
                .count(),
            self.findings.anomalies.len()
        );
        out
    }
}
