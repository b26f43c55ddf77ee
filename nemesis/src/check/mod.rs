//! The checkers a nemesis history goes through; each returns the anomalies it found.

pub mod bucket;
pub mod budget;
pub mod claims;
pub mod lin;
mod search;

use crate::history::Op;

/// Something a checker found that the contract forbids.
#[derive(Clone, Debug)]
pub struct Anomaly {
    /// Which checker found it.
    pub checker: &'static str,
    pub detail: String,
    /// The ops involved, by id.
    pub ops: Vec<usize>,
}

/// A time a node could not answer: paused, or down until restarted (microseconds since
/// the run began).
#[derive(Clone, Copy, Debug)]
pub struct Downtime {
    pub node: u64,
    pub from_us: u64,
    pub to_us: u64,
}

/// A wall clock set off during a run (the `clock` and `skew` faults): on which node, from
/// when until it was set right (µs since the run began), and by how much (µs, positive:
/// ahead).
#[derive(Clone, Copy, Debug)]
pub struct SetOff {
    pub node: u64,
    pub from_us: u64,
    pub to_us: u64,
    pub offset_us: i64,
}

/// A time in which the fleet's clock may be off real time (µs since the run began), and by
/// how much at most.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Drift {
    pub from_us: u64,
    pub to_us: u64,
    pub off_us: u64,
}

/// How long after a clock is set right an entry stamped before it may still apply.
pub const SET_RIGHT_MARGIN_US: u64 = 1_000_000;

/// When the fleet's clock may be off real time, and by how much, for clocks `set_off` in a
/// fleet whose `max_clock_offset_ms` is `bound_us` (contract §3): a leader's stamps follow
/// its monotonic clock within the bound, so a clock set off moves the fleet's time by at
/// most the smaller of its offset and the bound. That lasts while the clock is off, and
/// after it is set right until real time has caught up with the stamps taken meanwhile
/// (or a stamp from before has applied).
pub fn drifts(set_off: &[SetOff], bound_us: u64) -> Vec<Drift> {
    set_off
        .iter()
        .map(|clock| {
            let off_us = clock.offset_us.unsigned_abs().min(bound_us);
            Drift {
                from_us: clock.from_us,
                to_us: clock.to_us + off_us + SET_RIGHT_MARGIN_US,
                off_us,
            }
        })
        .collect()
}

/// How far off real time the fleet's clock may be at one moment from `from_us` to `to_us`:
/// the largest offset of the drifts overlapping that time (a stamp is never further off).
pub fn drift_at(drifts: &[Drift], from_us: u64, to_us: u64) -> u64 {
    offsets_overlapping(drifts, from_us, to_us)
        .max()
        .unwrap_or(0)
}

/// How far the drifts overlapping `from_us` to `to_us` may have moved the fleet's clock
/// off real time over that time: their offsets added up, since the fleet's time may run
/// ahead in one and stand still in the next.
pub fn drift_within(drifts: &[Drift], from_us: u64, to_us: u64) -> u64 {
    offsets_overlapping(drifts, from_us, to_us).sum()
}

/// The offsets of the drifts that overlap `from_us` to `to_us`.
fn offsets_overlapping(
    drifts: &[Drift],
    from_us: u64,
    to_us: u64,
) -> impl Iterator<Item = u64> + '_ {
    drifts
        .iter()
        .filter(move |drift| drift.from_us <= to_us && drift.to_us >= from_us)
        .map(|drift| drift.off_us)
}

/// What every call may take beyond its `timeout_ms` (contract §7: a few milliseconds of
/// local work).
pub const DEADLINE_SLACK_US: u64 = 5_000;

/// Calls to a node that was up throughout which returned later than their timeout allows.
pub fn deadlines(history: &[Op], downtimes: &[Downtime], slack_us: u64) -> Vec<Anomaly> {
    history
        .iter()
        .filter(|op| {
            let took_us = op.return_us.saturating_sub(op.invoke_us);
            let was_down = downtimes.iter().any(|down| {
                down.node == op.node && down.from_us < op.return_us && down.to_us > op.invoke_us
            });
            !was_down && took_us > op.timeout_ms * 1_000 + slack_us
        })
        .map(|op| Anomaly {
            checker: "deadline",
            detail: format!(
                "op {} on node {}: {:?} took {} ms with timeout_ms {}",
                op.id,
                op.node,
                op.request,
                (op.return_us - op.invoke_us) / 1_000,
                op.timeout_ms
            ),
            ops: vec![op.id],
        })
        .collect()
}

/// How close to its timeout a call must end to count as one that ran to it: past the
/// largest local reserve (a settle's 25 ms), so every call the fleet did not answer in
/// time is among them.
const RAN_TO_TIMEOUT_US: u64 = 30_000;
/// The bounds (µs past the timeout) of the lateness tally, and its names.
const LATENESS_BOUNDS: [(u64, &str); 4] = [
    (0, "in time"),
    (1_000, "<=1ms"),
    (2_000, "<=2ms"),
    (5_000, "<=5ms"),
];

/// How late the calls that ran to their timeout came, from nodes up throughout: a tally by
/// how far past the timeout each returned, and the latest (µs past it, if any was late).
pub fn lateness(history: &[Op], downtimes: &[Downtime]) -> (Vec<(&'static str, u64)>, u64) {
    let mut tally: Vec<(&'static str, u64)> = LATENESS_BOUNDS
        .iter()
        .map(|(_, name)| (*name, 0))
        .chain(std::iter::once((">5ms", 0)))
        .collect();
    let mut latest_us = 0;
    for op in history {
        let took_us = op.return_us.saturating_sub(op.invoke_us);
        let timeout_us = op.timeout_ms * 1_000;
        let was_down = downtimes.iter().any(|down| {
            down.node == op.node && down.from_us < op.return_us && down.to_us > op.invoke_us
        });
        if was_down || took_us + RAN_TO_TIMEOUT_US < timeout_us {
            continue;
        }
        let late_us = took_us.saturating_sub(timeout_us);
        latest_us = latest_us.max(late_us);
        let at = LATENESS_BOUNDS
            .iter()
            .position(|(bound, _)| late_us <= *bound)
            .unwrap_or(LATENESS_BOUNDS.len());
        tally[at].1 += 1;
    }
    (tally, latest_us)
}

/// What the checkers concluded.
#[derive(Debug, Default)]
pub struct Findings {
    pub anomalies: Vec<Anomaly>,
    /// Keys whose linearizability search ran out of steps (not anomalies).
    pub inconclusive_keys: Vec<String>,
    /// Keys checked for linearizability.
    pub keys_checked: usize,
    /// Buckets checked for linearizability, and the fleet answers in them.
    pub buckets_checked: (usize, usize),
    /// How long the checkers took.
    pub checked_in: std::time::Duration,
    /// The log index every replica reached with one state digest, and how many replicas.
    pub converged: Option<(u64, usize)>,
    /// The calls that ran to their timeout, by how late they came ([`lateness`]), and the
    /// latest (µs past its timeout).
    pub lateness: (Vec<(&'static str, u64)>, u64),
}

/// What the checkers need to know of a run besides its history.
pub struct Run<'a> {
    pub history: &'a [Op],
    /// When nodes could not answer (the deadline checker spares them).
    pub downtimes: &'a [Downtime],
    /// What a call may take beyond its timeout.
    pub slack_us: u64,
    /// Every queued settle must have reached the fleet by then (the healed fleet had
    /// handed over every local decision).
    pub settled_by_us: u64,
    /// The wall clocks set off during the run.
    pub set_off: &'a [SetOff],
    /// The fleet's `max_clock_offset_ms`, in µs.
    pub bound_us: u64,
    /// (from, to) of every fault.
    pub faults: &'a [(u64, u64)],
    /// The charges' bucket, and how many voters share it in a fallback.
    pub bucket: budget::Bucket,
    pub voters: u64,
}

/// Runs every checker over the run's history.
pub fn all(run: &Run<'_>) -> Findings {
    let history = run.history;
    let mut findings = Findings::default();
    let drifts = drifts(run.set_off, run.bound_us);
    for (key, verdict) in lin::check(history, run.settled_by_us) {
        findings.keys_checked += 1;
        match verdict {
            lin::Verdict::Linearizable => {}
            // Not a proof either way: it fails the run, so nothing passes unchecked.
            lin::Verdict::Inconclusive => {
                findings.anomalies.push(Anomaly {
                    checker: "linearizability inconclusive",
                    detail: format!("claim key {key}: the search ran out of steps"),
                    ops: Vec::new(),
                });
                findings.inconclusive_keys.push(key);
            }
            lin::Verdict::NotLinearizable { ops } => findings.anomalies.push(Anomaly {
                checker: "linearizability",
                detail: format!(
                    "claim key {key}: no order of its {} calls explains the fleet's answers",
                    ops.len()
                ),
                ops,
            }),
        }
    }
    for checked in bucket::check(history, run.bucket, &drifts) {
        findings.buckets_checked.0 += 1;
        findings.buckets_checked.1 += checked.calls;
        let stretch = format!(
            "tenant {} ({} fleet answers)",
            checked.tenant, checked.calls
        );
        match checked.verdict {
            bucket::Verdict::Linearizable => {}
            bucket::Verdict::Inconclusive => findings.anomalies.push(Anomaly {
                checker: "bucket linearizability inconclusive",
                detail: format!("{stretch}: the search ran out of steps"),
                ops: Vec::new(),
            }),
            bucket::Verdict::NotLinearizable { ops, stuck } => findings.anomalies.push(Anomaly {
                checker: "bucket linearizability",
                detail: format!(
                    "{stretch}: no order and stamps explain the fleet's answers; the longest \
                     explained prefix stops before op {stuck}"
                ),
                ops,
            }),
        }
    }
    findings
        .anomalies
        .extend(claims::duplicates_without_a_commit(history));
    findings
        .anomalies
        .extend(claims::committed_claims_lost(history));
    findings
        .anomalies
        .extend(deadlines(history, run.downtimes, run.slack_us));
    findings.lateness = lateness(history, run.downtimes);
    findings
        .anomalies
        .extend(budget::refusals(history, run.bucket, &drifts));
    findings.anomalies.extend(budget::budgets(
        history,
        &budget::Budgets {
            bucket: run.bucket,
            voters: run.voters,
            drifts: &drifts,
            set_off: run.set_off,
            faults: run.faults,
            downtimes: run.downtimes,
        },
    ));
    findings
}

/// Histories for the checkers' tests: calls on one key `k`.
#[cfg(test)]
pub(crate) mod fixtures {
    use crate::history::{Op, Outcome, Request};

    /// Call `id` (its own client) on node 1, from `span.0` to `span.1`.
    pub(crate) fn op(id: usize, request: Request, span: (u64, u64), outcome: Outcome) -> Op {
        Op {
            id,
            client: id,
            node: 1,
            request,
            timeout_ms: 100,
            invoke_us: span.0,
            return_us: span.1,
            outcome,
        }
    }

    pub(crate) fn claim(hook: &str) -> Request {
        Request::Claim {
            key: "k".into(),
            hook: hook.into(),
        }
    }

    pub(crate) fn commit(hook: &str) -> Request {
        Request::Settle {
            key: "k".into(),
            hook: hook.into(),
            commit: true,
        }
    }
}
