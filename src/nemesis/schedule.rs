//! The fault schedule, drawn from the seed alone: the same seed gives the same schedule
//! (which node a fault lands on may depend on who leads at that moment).

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
    /// Cut the target off from every peer: refused at once (`blackhole = false`) or never
    /// answered.
    Partition { target: Target, blackhole: bool },
    /// Delay every Raft message to and from the target.
    Delay { target: Target, delay_ms: u64 },
    /// SIGSTOP the target, longer than an election timeout.
    Pause { target: Target },
    /// kill -9 the target; it restarts when the fault ends.
    Kill { target: Target },
    /// Hold the leader's log writer, then kill it: it loses what it never fsynced.
    Lost,
}

impl Fault {
    /// The kind's name in the report.
    pub fn kind(&self) -> &'static str {
        match self {
            Fault::Partition { .. } | Fault::Delay { .. } => "partition",
            Fault::Pause { .. } => "pause",
            Fault::Kill { .. } => "kill",
            Fault::Lost => "lost",
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

/// The schedule of a run of `duration_ms` for `seed`: faults one at a time, a healed gap
/// between them.
pub fn plan(seed: u64, duration_ms: u64) -> Vec<Planned> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut schedule = Vec::new();
    let mut at_ms = QUIET_MS;
    let target = |rng: &mut StdRng| {
        if rng.gen_bool(0.5) {
            Target::Leader
        } else {
            Target::Node(rng.gen_range(1..=5))
        }
    };
    loop {
        let fault = match rng.gen_range(0..5) {
            0 => Fault::Partition {
                target: target(&mut rng),
                blackhole: rng.gen_bool(0.5),
            },
            1 => Fault::Delay {
                target: target(&mut rng),
                delay_ms: rng.gen_range(20..=300),
            },
            2 => Fault::Pause {
                target: target(&mut rng),
            },
            3 => Fault::Kill {
                target: target(&mut rng),
            },
            _ => Fault::Lost,
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
        assert_eq!(plan(7, 60_000), plan(7, 60_000));
        assert_ne!(plan(7, 60_000), plan(8, 60_000));
        let long = plan(7, 600_000);
        for kind in ["partition", "pause", "kill", "lost"] {
            assert!(
                long.iter().any(|planned| planned.fault.kind() == kind),
                "{kind} in {long:?}"
            );
        }
        assert!(long
            .windows(2)
            .all(|pair| pair[0].at_ms + pair[0].for_ms < pair[1].at_ms));
    }
}
