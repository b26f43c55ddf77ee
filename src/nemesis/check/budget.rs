//! Budgets: no stretch of time saw more allowed charges on a tenant's bucket than its GCRA
//! allowance grants (contract §4), counting the fleet's answers and, node by node, the
//! answers a node decided alone (the fallback budget, contract §7).
//!
//! A GCRA bucket of capacity `C` and increment `I` admits `n` charges in a stretch `[a, b]`
//! only if `n · I ≤ C + (b − a)`: each charge moves its TAT on by `I`, and the TAT may lead
//! the clock by at most `C`. The checker allows `⌊(C + (b − a)) / I⌋ + 1` (the `+ 1` is a
//! margin for clock granularity). It counts the allowed charges that surely took effect
//! inside a stretch (invoked at or after `a`, returned by `b`) and compares, over every
//! stretch that starts at a charge's invocation and ends at a charge's return.
//!
//! A stretch a reset may have touched proves nothing (the bucket was emptied) and is
//! skipped. For the fleet's bucket that is any reset of the tenant: an answered one between
//! its invocation and return, an unknown one until a few seconds after the fault it met
//! ended (its proposal may commit late, never after the healed fleet settles). A node's
//! own buckets are emptied only by a reset sent to that node (it clears them before it
//! proposes) and by a restart (they live in memory).
//!
//! A leader's clock set off refills a bucket once: set forward, the fleet's clock jumps at
//! once; set back, the leader's stamps stand still (the clock never goes back) and jump
//! when its clock is set right again. Either way the bucket gains at most `C` it had not
//! earned, so each such refill inside a stretch adds one `C`.

use std::collections::BTreeMap;

use super::{Anomaly, Downtime};
use crate::nemesis::history::{Answer, Decided, Op, Outcome, Request};

/// One bucket's shape, as the workload charges it.
#[derive(Clone, Copy, Debug)]
pub struct Bucket {
    pub increment_us: u64,
    pub capacity_us: u64,
}

/// Charges allowed on one bucket by one decider, as (invoke, return, op id).
type Allowed = Vec<(u64, u64, usize)>;
/// A tenant's bucket as one decider sees it: the fleet's (`None`) or a node's own.
type Decider = (String, Option<u64>);

/// How long after the fault it met an unknown reset may still take effect in the fleet.
const LATE_RESET_US: u64 = 5_000_000;

/// What the budget checker needs besides the history.
pub struct Budgets<'a> {
    pub bucket: Bucket,
    /// Voters sharing the bucket in a fallback (the fewest there were: the largest share).
    pub voters: u64,
    /// (from, to): a leader's wall clock was set off in between, forward or back.
    pub refills: &'a [(u64, u64)],
    /// (node, from, to): that node's wall clock was set off in between. Its own buckets
    /// run on it, leader or not.
    pub skewed: &'a [(u64, u64, u64)],
    /// (from, to) of every fault.
    pub faults: &'a [(u64, u64)],
    /// Every time a node was down or restarting.
    pub downtimes: &'a [Downtime],
}

/// The first stretch of `allowed` over its allowance, if any: `capacity` is the bucket's
/// `C`; `resets` (from, to) and `refills` (from, to) are as in the module docs.
fn over_allowance(
    allowed: &Allowed,
    increment_us: u64,
    capacity_us: u64,
    resets: &[(u64, u64)],
    refills: &[(u64, u64)],
) -> Option<(u64, u64, Vec<usize>)> {
    let mut by_return = allowed.clone();
    by_return.sort_by_key(|(_, return_us, _)| *return_us);
    let overlaps = |spans: &[(u64, u64)], a: u64, b: u64| {
        spans
            .iter()
            .filter(|(from, to)| *from <= b && *to >= a)
            .count() as u64
    };
    for (a, _, _) in allowed {
        let mut inside = Vec::new();
        for (invoke_us, return_us, op) in &by_return {
            if invoke_us < a {
                continue;
            }
            let b = *return_us;
            if overlaps(resets, *a, b) > 0 {
                break;
            }
            inside.push(*op);
            let fills = 1 + overlaps(refills, *a, b);
            let allowance = (capacity_us * fills + (b - a)) / increment_us + 1;
            if inside.len() as u64 > allowance {
                return Some((*a, b, inside));
            }
        }
    }
    None
}

/// The budget anomalies of `history`: the fleet's answers per tenant against the whole
/// bucket, and each node's own answers against its fallback share (`capacity / voters`,
/// never below one increment).
pub fn budgets(history: &[Op], run: &Budgets<'_>) -> Vec<Anomaly> {
    // (tenant, decider: None for the fleet, Some(node) for a node alone) -> allowed.
    let mut allowed: BTreeMap<Decider, Allowed> = BTreeMap::new();
    let mut resets: BTreeMap<Decider, Vec<(u64, u64)>> = BTreeMap::new();
    let fault_end = |at_us: u64| {
        run.faults
            .iter()
            .filter(|(from, to)| *from <= at_us && at_us <= *to)
            .map(|(_, to)| *to)
            .max()
            .unwrap_or(at_us)
    };
    for op in history {
        match (&op.request, &op.outcome) {
            (Request::Charge { tenant }, Outcome::Answered(Answer::Allowed, decided)) => {
                let decider = match decided {
                    Decided::Fleet => None,
                    Decided::Local => Some(op.node),
                };
                allowed.entry((tenant.clone(), decider)).or_default().push((
                    op.invoke_us,
                    op.return_us,
                    op.id,
                ));
            }
            (Request::Reset { .. }, Outcome::NotSent(_)) => {}
            (Request::Reset { tenant }, outcome) => {
                // The node clears its own buckets before it proposes: within the call.
                resets
                    .entry((tenant.clone(), Some(op.node)))
                    .or_default()
                    .push((op.invoke_us, op.return_us));
                let to_us = match outcome {
                    Outcome::Answered(..) => op.return_us,
                    _ => fault_end(op.return_us).max(op.return_us) + LATE_RESET_US,
                };
                resets
                    .entry((tenant.clone(), None))
                    .or_default()
                    .push((op.invoke_us, to_us));
            }
            _ => {}
        }
    }
    let share_us = (run.bucket.capacity_us / run.voters.max(1)).max(run.bucket.increment_us);
    let mut anomalies = Vec::new();
    for ((tenant, decider), charges) in &allowed {
        let mut emptied = resets
            .get(&(tenant.clone(), *decider))
            .cloned()
            .unwrap_or_default();
        let mut refills = run.refills.to_vec();
        let capacity_us = match decider {
            None => run.bucket.capacity_us,
            Some(node) => {
                refills.extend(
                    run.skewed
                        .iter()
                        .filter(|(skewed, _, _)| skewed == node)
                        .map(|(_, from, to)| (*from, *to)),
                );
                // A restart empties a node's own buckets too.
                emptied.extend(
                    run.downtimes
                        .iter()
                        .filter(|down| down.node == *node)
                        .map(|down| (down.from_us, down.to_us)),
                );
                share_us
            }
        };
        let increment_us = run.bucket.increment_us;
        if let Some((a, b, ops)) =
            over_allowance(charges, increment_us, capacity_us, &emptied, &refills)
        {
            let who = match decider {
                None => "the fleet".to_owned(),
                Some(node) => format!("node {node} alone"),
            };
            anomalies.push(Anomaly {
                checker: "budget",
                detail: format!(
                    "tenant {tenant}: {who} allowed {} charges between {a} µs and {b} µs, \
                     more than a bucket of {capacity_us} µs capacity and {increment_us} µs \
                     per charge admits",
                    ops.len(),
                ),
                ops,
            });
        }
    }
    anomalies
}

#[cfg(test)]
mod tests {
    use super::*;

    const BUCKET: Bucket = Bucket {
        increment_us: 100_000,
        capacity_us: 1_000_000,
    };

    fn quiet() -> Budgets<'static> {
        Budgets {
            bucket: BUCKET,
            voters: 3,
            refills: &[],
            skewed: &[],
            faults: &[],
            downtimes: &[],
        }
    }

    fn charge(id: usize, at_us: u64, decided: Decided) -> Op {
        Op {
            id,
            client: 0,
            node: 1,
            request: Request::Charge { tenant: "t".into() },
            timeout_ms: 100,
            invoke_us: at_us,
            return_us: at_us + 1_000,
            outcome: Outcome::Answered(Answer::Allowed, decided),
        }
    }

    /// Eleven charges in 10 ms: the fleet's bucket admits ten at once, plus one for the
    /// stretch's ends; a twelfth is over. A reset between them, or a clock set off, explains it.
    #[test]
    fn a_burst_over_the_capacity_is_caught_unless_a_reset_or_jump_explains_it() {
        let burst = |count: usize, decided: Decided| -> Vec<Op> {
            (0..count)
                .map(|i| charge(i, i as u64 * 1_000, decided))
                .collect()
        };
        assert!(budgets(&burst(11, Decided::Fleet), &quiet()).is_empty());
        let over = budgets(&burst(12, Decided::Fleet), &quiet());
        assert_eq!(over.len(), 1, "{over:?}");
        assert_eq!(over[0].checker, "budget");
        let jumped = Budgets {
            refills: &[(5_000, 6_000)],
            ..quiet()
        };
        assert!(budgets(&burst(12, Decided::Fleet), &jumped).is_empty());

        let mut with_reset = burst(12, Decided::Fleet);
        with_reset.push(Op {
            id: 99,
            request: Request::Reset { tenant: "t".into() },
            outcome: Outcome::Answered(Answer::Reset, Decided::Fleet),
            ..charge(99, 5_500, Decided::Fleet)
        });
        assert!(budgets(&with_reset, &quiet()).is_empty());

        // A node alone has a third of the capacity with 3 voters: 3 at once, plus one.
        assert!(budgets(&burst(4, Decided::Local), &quiet()).is_empty());
        assert_eq!(budgets(&burst(5, Decided::Local), &quiet()).len(), 1);
        // A restart of that node empties its buckets; another node's does not.
        let restarted = |node: u64| Budgets {
            downtimes: if node == 1 {
                &[Downtime {
                    node: 1,
                    from_us: 2_000,
                    to_us: 2_500,
                }]
            } else {
                &[Downtime {
                    node: 2,
                    from_us: 2_000,
                    to_us: 2_500,
                }]
            },
            ..quiet()
        };
        assert!(budgets(&burst(5, Decided::Local), &restarted(1)).is_empty());
        assert_eq!(budgets(&burst(5, Decided::Local), &restarted(2)).len(), 1);
    }

    /// An unknown reset may take effect until a while after the fault it met, not forever.
    #[test]
    fn an_unknown_reset_excuses_only_the_time_around_its_fault() {
        let mut history: Vec<Op> = (0..12)
            .map(|i| charge(i, 60_000_000 + i as u64 * 1_000, Decided::Fleet))
            .collect();
        history.push(Op {
            id: 99,
            request: Request::Reset { tenant: "t".into() },
            outcome: Outcome::Unknown("no answer".into()),
            ..charge(99, 1_000_000, Decided::Fleet)
        });
        let faulted = Budgets {
            faults: &[(500_000, 3_000_000)],
            ..quiet()
        };
        assert_eq!(budgets(&history, &faulted).len(), 1, "long after the fault");
        let longer = Budgets {
            faults: &[(500_000, 58_000_000)],
            ..quiet()
        };
        assert!(budgets(&history, &longer).is_empty(), "within its fault");
    }

    /// Charges at the bucket's rate never go over, however long the run.
    #[test]
    fn charges_at_the_rate_are_within_the_allowance() {
        let steady: Vec<Op> = (0..200)
            .map(|i| charge(i, 1_000_000 + i as u64 * 100_000, Decided::Fleet))
            .collect();
        assert!(budgets(&steady, &quiet()).is_empty());
        let mut twice = steady.clone();
        twice.extend((0..200).map(|i| {
            charge(
                200 + i,
                1_000_000 + i as u64 * 100_000 + 50_000,
                Decided::Fleet,
            )
        }));
        assert_eq!(budgets(&twice, &quiet()).len(), 1, "twice the rate");
    }
}
