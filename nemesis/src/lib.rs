//! The nemesis: a fleet of `ankusa-fleet serve` child processes (started by
//! [`ankusa_fleet::cmd::launch`]), a seeded workload and a seeded fault schedule, and checkers
//! over the history it records (docs/reliability.md). A crate of its own, so the node's
//! library and binary carry none of it; the `ankusa-fleet-nemesis` binary runs it.

pub mod check;
pub mod fleet;
pub mod frames;
pub mod history;
mod inflict;
pub mod schedule;
pub mod workload;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::time::Duration;

use anyhow::Context;
use tokio::sync::watch;
use tokio::time::Instant;

use check::{Downtime, Findings};
use fleet::Fleet;
use history::{Decided, Op, Outcome, Recorder};
use inflict::inflict;
use schedule::{Fault, Planned, Target};

/// What to run.
#[derive(Clone, Debug)]
pub struct Plan {
    /// The `ankusa-fleet` binary the fleet's nodes run.
    pub exe: PathBuf,
    pub seed: u64,
    pub duration: Duration,
    pub nodes: u64,
    pub clients_per_node: usize,
    /// What a call may take beyond its timeout.
    pub deadline_slack: Duration,
    /// A known bug every node plays (`ankusa_fleet::config::PlantedBug`, as the config
    /// spells it), to show the checkers catch it.
    pub planted_bug: Option<String>,
    /// The fault kinds to draw from (names of `schedule::KINDS`).
    pub kinds: Vec<String>,
    /// Claims travel in `HitBatch` frames, one stream per node shared by its clients
    /// (`frames`), instead of a unary `Hit` each.
    pub frames: bool,
}

/// A fault as it happened: on which nodes (none: skipped, there was no leader to take),
/// from when to when (µs since the run began), and what else the report should say.
#[derive(Clone, Debug)]
pub struct Applied {
    pub planned: Planned,
    pub nodes: Vec<u64>,
    pub note: String,
    /// Whether a node it took led when it began or ended.
    pub led: bool,
    /// A wall clock it set off by this much (ms), if any.
    pub clock_offset_ms: i64,
    /// For a clock set off within the bound: why the node said it stood down, if it did.
    pub stood_down: Option<String>,
    pub from_us: u64,
    pub to_us: u64,
}

/// What a run found.
pub struct Outcomes {
    pub history: Vec<Op>,
    pub applied: Vec<Applied>,
    pub findings: Findings,
    pub dir: PathBuf,
    /// With `--frames`: frames sent, the claims they carried, and the most in one.
    pub frames_sent: Option<(u64, u64, u64)>,
}

/// How long the healed fleet may take to hand over every local decision.
const RECONCILE_WAIT: Duration = Duration::from_secs(30);
/// The client id of the final probes.
const PROBE_CLIENT: usize = 1_000;
/// How long a killed or paused node may take to answer again once the fault ends.
const BACK_WAIT: Duration = Duration::from_secs(20);
/// How long the healed fleet's replicas may take to apply the same log index.
const CONVERGE_WAIT: Duration = Duration::from_secs(30);

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
    let extra = plan
        .planted_bug
        .as_ref()
        .map(|bug| format!("planted_bug = \"{bug}\""))
        .unwrap_or_default();
    let mut fleet = Fleet::start(&plan.exe, &dir, plan.nodes, &extra).await?;
    let kinds: Vec<&str> = plan.kinds.iter().map(String::as_str).collect();
    if let Some(unknown) = kinds.iter().find(|kind| !schedule::KINDS.contains(kind)) {
        anyhow::bail!(
            "--faults: `{unknown}` is not a fault kind (one of {:?})",
            schedule::KINDS
        );
    }
    let schedule = schedule::plan(plan.seed, plan.duration.as_millis() as u64, &kinds);
    let recorder = Recorder::new();
    let (stop, stopped) = watch::channel(false);
    let mut clients = Vec::new();
    let mut streams = Vec::new();
    for (n, node) in fleet.ids().into_iter().enumerate() {
        let frames = plan
            .frames
            .then(|| frames::Frames::connect(fleet.api_addr(node)))
            .transpose()?;
        streams.extend(frames.clone());
        for c in 0..plan.clients_per_node {
            let client = workload::Client {
                id: n * plan.clients_per_node + c,
                node,
                api_addr: fleet.api_addr(node).to_owned(),
                seed: plan.seed,
                clients_per_node: plan.clients_per_node as u64,
                frames: frames.clone(),
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
    // A healed fleet agrees on a leader. One that does not has lost something it should
    // not (a node's Raft core stopped on a log that went back, say): that is a finding,
    // and the probes go to whichever leader some node still names.
    let mut recovery = None;
    let leader = match fleet.wait_for_leader(BACK_WAIT).await {
        Ok(leader) => Some(leader),
        Err(e) => {
            let named = fleet.any_leader().await;
            recovery = Some(format!(
                "after the heal: {e:#}; some node names {named:?} (none: no final probes); \
                 the nodes' logs say why"
            ));
            named
        }
    };
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
    if let Some(leader) = leader {
        let prober = workload::Client {
            id: PROBE_CLIENT,
            node: leader,
            api_addr: fleet.api_addr(leader).to_owned(),
            seed: plan.seed,
            clients_per_node: plan.clients_per_node as u64,
            frames: None,
        };
        prober.probe(&recorder, &keys).await;
    }
    let history = recorder.history();
    let downtimes: Vec<Downtime> = applied
        .iter()
        .filter(|fault| {
            matches!(
                fault.planned.fault,
                Fault::Pause { .. } | Fault::Kill { .. } | Fault::Lost { .. }
            )
        })
        .flat_map(|fault| {
            fault.nodes.iter().map(|node| Downtime {
                node: *node,
                from_us: fault.from_us,
                to_us: fault.to_us,
            })
        })
        .collect();
    let set_off: Vec<check::SetOff> = applied
        .iter()
        .filter(|fault| fault.clock_offset_ms != 0)
        .flat_map(|fault| {
            fault.nodes.iter().map(|node| check::SetOff {
                node: *node,
                from_us: fault.from_us,
                to_us: fault.to_us,
                offset_us: fault.clock_offset_ms * 1_000,
            })
        })
        .collect();
    let fault_spans: Vec<(u64, u64)> = applied
        .iter()
        .map(|fault| (fault.from_us, fault.to_us))
        .collect();
    let converged = fleet.wait_converged(CONVERGE_WAIT).await;
    let checking = Instant::now();
    let mut findings = check::all(&check::Run {
        history: &history,
        downtimes: &downtimes,
        slack_us: plan.deadline_slack.as_micros() as u64,
        settled_by_us,
        set_off: &set_off,
        bound_us: workload::MAX_CLOCK_OFFSET_MS * 1_000,
        faults: &fault_spans,
        bucket: workload::BUCKET,
        voters: plan.nodes,
    });
    findings.checked_in = checking.elapsed();
    for fault in &applied {
        if let Some(reason) = &fault.stood_down {
            findings.anomalies.push(check::Anomaly {
                checker: "skew below the bound",
                detail: format!(
                    "node {:?}, its clock {} ms off (the bound is {} ms), stood down: {reason}",
                    fault.nodes,
                    fault.clock_offset_ms,
                    workload::MAX_CLOCK_OFFSET_MS
                ),
                ops: Vec::new(),
            });
        }
    }
    if !reconciled {
        findings.anomalies.push(check::Anomaly {
            checker: "reconciled after heal",
            detail: format!(
                "some node still had local decisions to hand over {RECONCILE_WAIT:?} after the heal"
            ),
            ops: Vec::new(),
        });
    }
    if let Some(detail) = recovery {
        findings.anomalies.push(check::Anomaly {
            checker: "recovery",
            detail,
            ops: Vec::new(),
        });
    }
    match converged {
        Ok((index, replicas)) => findings.converged = Some((index, replicas)),
        Err(detail) => findings.anomalies.push(check::Anomaly {
            checker: "convergence",
            detail,
            ops: Vec::new(),
        }),
    }
    let frames_sent = plan.frames.then(|| {
        streams
            .iter()
            .fold((0, 0, 0), |(frames, hits, largest), stream| {
                let sent = stream.sent();
                (
                    frames + sent.frames.load(Ordering::Relaxed),
                    hits + sent.hits.load(Ordering::Relaxed),
                    largest.max(sent.largest.load(Ordering::Relaxed)),
                )
            })
    });
    Ok(Outcomes {
        history,
        applied,
        findings,
        dir,
        frames_sent,
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

/// Waits until one of `voters` leads, as every one of them sees it.
async fn wait_for_leader_among(fleet: &Fleet, voters: &[u64]) -> Option<u64> {
    let deadline = Instant::now() + BACK_WAIT;
    while Instant::now() < deadline {
        let mut agreed = None;
        for id in voters {
            let seen = fleet.status(*id).await.map(|status| status.leader_id);
            match (seen, agreed) {
                (Some(leader), None) if voters.contains(&leader) => agreed = Some(leader),
                (Some(leader), Some(agreed_on)) if leader == agreed_on => {}
                _ => {
                    agreed = None;
                    break;
                }
            }
        }
        if agreed.is_some() {
            return agreed;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    None
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
        for kind in schedule::KINDS {
            faults.insert(kind, 0);
        }
        let mut skipped = 0;
        for fault in &self.applied {
            if fault.nodes.is_empty() {
                // Its target was the leader, and no leader was agreed on at the time.
                skipped += 1;
            } else {
                *faults.entry(fault.planned.fault.kind()).or_default() += 1;
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
        if let Some((frames, hits, largest)) = self.frames_sent {
            let _ = writeln!(
                out,
                "frames: {hits} claims in {frames} HitBatch frames, at most {largest} in one"
            );
        }
        let mut by_checker: BTreeMap<&str, usize> = BTreeMap::new();
        for checker in [
            "linearizability",
            "duplicate without a commit",
            "committed claim lost",
            "budget",
            "deadline",
            "reconciled after heal",
            "recovery",
            "convergence",
            "linearizability inconclusive",
            "bucket linearizability",
            "bucket linearizability inconclusive",
            "skew below the bound",
        ] {
            by_checker.insert(checker, 0);
        }
        for anomaly in &self.findings.anomalies {
            *by_checker.entry(anomaly.checker).or_default() += 1;
        }
        let _ = writeln!(
            out,
            "anomalies: {by_checker:?} ({} claim keys and {} buckets ({} fleet answers) checked for linearizability in {:.1} s, {} keys inconclusive: {:?})",
            self.findings.keys_checked,
            self.findings.buckets_checked.0,
            self.findings.buckets_checked.1,
            self.findings.checked_in.as_secs_f64(),
            self.findings.inconclusive_keys.len(),
            self.findings.inconclusive_keys
        );
        let (tally, latest_us) = &self.findings.lateness;
        let tally: BTreeMap<&str, u64> = tally.iter().copied().collect();
        let _ = writeln!(
            out,
            "deadlines: {tally:?} (calls that ran to their timeout, from nodes up throughout, by how far past it they returned; the latest {latest_us} µs past)"
        );
        if let Some((index, replicas)) = self.findings.converged {
            let _ = writeln!(
                out,
                "converged: {replicas} replicas at log index {index} with one state digest"
            );
        }
        let _ = writeln!(out, "schedule:");
        for fault in &self.applied {
            let _ = writeln!(
                out,
                "  {:>8} µs .. {:>8} µs  nodes {:?}  {:?}  {}",
                fault.from_us, fault.to_us, fault.nodes, fault.planned.fault, fault.note
            );
        }
        if !self.findings.anomalies.is_empty() {
            let _ = writeln!(
                out,
                "replay: ankusa-fleet-nemesis --seed {} --duration-s {} --nodes {} --clients {} --deadline-slack-ms {} --faults {}{}{}",
                plan.seed,
                plan.duration.as_secs(),
                plan.nodes,
                plan.clients_per_node,
                plan.deadline_slack.as_millis(),
                plan.kinds.join(","),
                if plan.frames { " --frames" } else { "" },
                plan.planted_bug
                    .as_ref()
                    .map(|bug| format!(" --plant-bug {bug}"))
                    .unwrap_or_default()
            );
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
                .filter(|fault| !fault.nodes.is_empty())
                .count(),
            self.findings.anomalies.len()
        );
        out
    }
}
