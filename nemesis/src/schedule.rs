//! The fault schedule, drawn from the seed alone: the same seed (and the same choice of
//! kinds) gives the same schedule; which node a fault lands on may depend on who leads at
//! that moment.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Which node a fault takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    /// Whoever leads when the fault begins.
    Leader,
    /// The n-th node (taken modulo the fleet size, from 1).
    Node(u64),
}

/// One kind of fault.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Cut the target off from every peer, both ways: refused at once
    /// (`blackhole = false`) or never answered.
    Isolate { target: Target, blackhole: bool },
    /// Cut the target's links one way only: the calls it makes to every peer
    /// (`outgoing`), or the calls every peer makes to it.
    OneWay {
        target: Target,
        blackhole: bool,
        outgoing: bool,
    },
    /// Split the fleet in two: a minority of `(n - 1) / 2` nodes, with the leader in it or
    /// not, cut off both ways from the majority.
    Split { with_leader: bool, blackhole: bool },
    /// Delay every Raft message to and from the target.
    Delay { target: Target, delay_ms: u64 },
    /// SIGSTOP the target, longer than an election timeout.
    Pause { target: Target },
    /// kill -9 the target; it restarts when the fault ends.
    Kill { target: Target },
    /// Hold log writers, then kill: the leader alone (`followers = false`), or every
    /// follower, with the leader cut off while they restart and elect one of their own.
    /// What was never fsynced is lost.
    Lost { followers: bool },
    /// Add the spare node as a learner, promote it to voter halfway, remove it at the end.
    Membership,
    /// Set the target's wall clock forward or back by more than the pending TTL.
    Clock { target: Target, forward: bool },
    /// Set the target's wall clock forward or back by half of `max_clock_offset_ms`: within
    /// the bound, so nothing may change.
    Skew { target: Target, forward: bool },
}

/// Every kind, as the report names them.
pub const KINDS: [&str; 7] = [
    "partition",
    "pause",
    "kill",
    "lost",
    "membership",
    "clock",
    "skew",
];

impl Fault {
    /// The kind's name in the report.
    pub fn kind(&self) -> &'static str {
        match self {
            Fault::Isolate { .. }
            | Fault::OneWay { .. }
            | Fault::Split { .. }
            | Fault::Delay { .. } => "partition",
            Fault::Pause { .. } => "pause",
            Fault::Kill { .. } => "kill",
            Fault::Lost { .. } => "lost",
            Fault::Membership => "membership",
            Fault::Clock { .. } => "clock",
            Fault::Skew { .. } => "skew",
        }
    }
}

/// One fault of the schedule: when it begins and how long it lasts, from the run's start.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Planned {
    pub at_ms: u64,
    pub for_ms: u64,
    pub fault: Fault,
}

/// Nothing happens in the first and last seconds: the fleet starts, and ends healed.
const QUIET_MS: u64 = 2_000;

/// The schedule of a run of `duration_ms` for `seed`, with faults of `kinds` only (names
/// from [`KINDS`], others are ignored; the same kinds in the same order give the same
/// schedule): faults one at a time, a healed gap between them.
pub fn plan(seed: u64, duration_ms: u64, kinds: &[&str]) -> Vec<Planned> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut schedule = Vec::new();
    let mut at_ms = QUIET_MS;
    let kinds: Vec<&str> = kinds
        .iter()
        .copied()
        .filter(|kind| KINDS.contains(kind))
        .collect();
    if kinds.is_empty() {
        return schedule;
    }
    let target = |rng: &mut StdRng| {
        if rng.gen_bool(0.5) {
            Target::Leader
        } else {
            Target::Node(rng.gen_range(1..=5))
        }
    };
    loop {
        let fault = match kinds[rng.gen_range(0..kinds.len())] {
            "partition" => match rng.gen_range(0..4) {
                0 => Fault::Isolate {
                    target: target(&mut rng),
                    blackhole: rng.gen_bool(0.5),
                },
                1 => Fault::OneWay {
                    target: target(&mut rng),
                    blackhole: rng.gen_bool(0.5),
                    outgoing: rng.gen_bool(0.5),
                },
                2 => Fault::Split {
                    with_leader: rng.gen_bool(0.5),
                    blackhole: rng.gen_bool(0.5),
                },
                _ => Fault::Delay {
                    target: target(&mut rng),
                    delay_ms: rng.gen_range(20..=300),
                },
            },
            "pause" => Fault::Pause {
                target: target(&mut rng),
            },
            "kill" => Fault::Kill {
                target: target(&mut rng),
            },
            "lost" => Fault::Lost {
                followers: rng.gen_bool(0.5),
            },
            "membership" => Fault::Membership,
            "clock" => Fault::Clock {
                target: target(&mut rng),
                forward: rng.gen_bool(0.5),
            },
            "skew" => Fault::Skew {
                target: target(&mut rng),
                forward: rng.gen_bool(0.5),
            },
            // Only names of KINDS are left (filtered above).
            _ => continue,
        };
        let for_ms = rng.gen_range(800..=3_000);
        if at_ms + for_ms + QUIET_MS > duration_ms {
            break;
        }
        schedule.push(Planned {
            at_ms,
            for_ms,
            fault,
        });
        at_ms += for_ms + rng.gen_range(500..=2_000);
    }
    schedule
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_seed_gives_the_same_schedule_and_every_kind_comes_up() {
        assert_eq!(plan(7, 60_000, &KINDS), plan(7, 60_000, &KINDS));
        assert_ne!(plan(7, 60_000, &KINDS), plan(8, 60_000, &KINDS));
        let long = plan(7, 600_000, &KINDS);
        for kind in KINDS {
            assert!(
                long.iter().any(|planned| planned.fault.kind() == kind),
                "{kind} in {long:?}"
            );
        }
        for variant in ["Isolate", "OneWay", "Split", "Delay"] {
            assert!(
                long.iter()
                    .any(|planned| format!("{:?}", planned.fault).starts_with(variant)),
                "{variant} in {long:?}"
            );
        }
        assert!(long
            .windows(2)
            .all(|pair| pair[0].at_ms + pair[0].for_ms < pair[1].at_ms));
    }

    #[test]
    fn a_choice_of_kinds_gives_only_those() {
        let lost = plan(3, 120_000, &["lost"]);
        assert!(!lost.is_empty());
        assert!(lost.iter().all(|planned| planned.fault.kind() == "lost"));
        assert!(plan(3, 120_000, &[]).is_empty());
        assert!(plan(3, 120_000, &["typo"]).is_empty());
    }
}
