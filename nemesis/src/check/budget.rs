//! Budgets: no stretch of time saw more allowed charges on a tenant's bucket than its GCRA
//! allowance grants (contract §4), counting the fleet's answers and, node by node, the
//! answers a node decided alone (the fallback budget, contract §7).
//!
//! [`refusals`] checks the other way: no refusal while the bucket had room.
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
//! A leader's clock set off moves the fleet's time off real time by at most
//! `max_clock_offset_ms` (contract §3, [`super::drifts`]): set forward, the stamps run ahead
//! by at most that; set back, they stand still for at most that. Either way the bucket
//! gains at most that much time it had not earned, so each drift inside a stretch adds its
//! offset to the stretch's time. A node's own buckets run on its own wall clock: one set
//! forward may fill them (at most their capacity), and they start from the replica's TATs,
//! so the fleet's drifts count for them too.

use std::collections::BTreeMap;

use super::{drift_within, Anomaly, Downtime, Drift, SetOff};
use crate::history::{Answer, Decided, Op, Outcome, Request};

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
    /// When the fleet's clock may be off real time, and by how much.
    pub drifts: &'a [Drift],
    /// The wall clocks set off: a node's own buckets run on its own, leader or not.
    pub set_off: &'a [SetOff],
    /// (from, to) of every fault.
    pub faults: &'a [(u64, u64)],
    /// Every time a node was down or restarting.
    pub downtimes: &'a [Downtime],
}

/// The first stretch of `allowed` over its allowance, if any: `capacity` is the bucket's
/// `C`; `resets` (from, to) are as in the module docs, and each of `refills` gave the
/// bucket its offset in unearned time, in its span.
fn over_allowance(
    allowed: &Allowed,
    increment_us: u64,
    capacity_us: u64,
    resets: &[(u64, u64)],
    refills: &[Drift],
) -> Option<(u64, u64, Vec<usize>)> {
    let mut by_return = allowed.clone();
    by_return.sort_by_key(|(_, return_us, _)| *return_us);
    let reset_between = |a: u64, b: u64| resets.iter().any(|(from, to)| *from <= b && *to >= a);
    for (a, _, _) in allowed {
        let mut inside = Vec::new();
        for (invoke_us, return_us, op) in &by_return {
            if invoke_us < a {
                continue;
            }
            let b = *return_us;
            if reset_between(*a, b) {
                break;
            }
            inside.push(*op);
            let allowance =
                (capacity_us + drift_within(refills, *a, b) + (b - a)) / increment_us + 1;
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
        let mut refills = run.drifts.to_vec();
        let capacity_us = match decider {
            None => run.bucket.capacity_us,
            Some(node) => {
                refills.extend(run.set_off.iter().filter(|clock| clock.node == *node).map(
                    |clock| Drift {
                        from_us: clock.from_us,
                        to_us: clock.to_us + super::SET_RIGHT_MARGIN_US,
                        off_us: clock.offset_us.unsigned_abs().min(share_us),
                    },
                ));
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

/// One tenant's fleet refusals, and the charges that may have taken effect (invoke, return;
/// `u64::MAX`: at any time after).
type RefusalsAndCharges<'h> = (Vec<&'h Op>, Vec<(u64, u64)>);

/// How far back a refusal's justification is looked for.
const REFUSAL_LOOKBACK_US: u64 = 30_000_000;

/// Refusals the bucket cannot have made: the other half of GCRA, beside the budgets.
///
/// The fleet refuses a charge at time `t` only if its TAT is past `t + C − I`. The TAT
/// never leads the clock by more than `C`, and a charge at `u` sets it to
/// `max(TAT, u) + I`. So for any earlier `s`, the TAT at `t` is at most
/// `max(s + C, t) + I · N(s)`, where `N(s)` counts the charges that may have taken effect
/// in between. A refusal therefore needs, for every `s` before it,
/// `min(t − s, C) < I · (N(s) + 1)`. A refusal with fewer charges behind it than that had
/// room. Time idle beyond `C` adds no room: a full bucket holds `C / I` charges.
///
/// `N` counts every allowed charge that may have reached the fleet, up to the refusal's
/// return:
/// - a charge a node granted alone counts twice: its proposal may commit late, and the
///   node hands the charge over as well;
/// - an unknown charge counts once.
///
/// Resets only lower a TAT. Where the fleet's clock may lag real time (`drifts`), the time
/// between `s` and the refusal counts that much less.
pub fn refusals(history: &[Op], bucket: Bucket, drifts: &[Drift]) -> Vec<Anomaly> {
    let increment_us = bucket.increment_us;
    let mut by_tenant: BTreeMap<&str, RefusalsAndCharges<'_>> = BTreeMap::new();
    for op in history {
        let Request::Charge { tenant } = &op.request else {
            continue;
        };
        let (refused, took) = by_tenant.entry(tenant.as_str()).or_default();
        match &op.outcome {
            Outcome::Answered(Answer::RateLimited, Decided::Fleet) => refused.push(op),
            Outcome::Answered(Answer::Allowed, Decided::Fleet) => {
                took.push((op.invoke_us, op.return_us));
            }
            Outcome::Answered(Answer::Allowed, Decided::Local) => {
                took.push((op.invoke_us, u64::MAX));
                took.push((op.invoke_us, u64::MAX));
            }
            Outcome::Unknown(_) => took.push((op.invoke_us, u64::MAX)),
            _ => {}
        }
    }
    let mut anomalies = Vec::new();
    for (tenant, (refused, took)) in by_tenant {
        for op in refused {
            let (at_us, by_us) = (op.invoke_us, op.return_us);
            let since = at_us.saturating_sub(REFUSAL_LOOKBACK_US);
            // Charges that may have come before it, by return: those returned before the
            // refusal began are the candidates for `s`; the others always count.
            let mut before: Vec<u64> = Vec::new();
            let mut always = 0u64;
            for (invoke_us, return_us) in &took {
                if *invoke_us >= by_us || *return_us <= since {
                    continue;
                }
                if *return_us < at_us {
                    before.push(*return_us);
                } else {
                    always += 1;
                }
            }
            before.sort_unstable_by(|a, b| b.cmp(a));
            // s just after the k-th latest return: N(s) = always + k.
            let had_room = before.iter().enumerate().find(|(k, s)| {
                let lag_us = drift_within(drifts, **s, by_us);
                (at_us - **s).saturating_sub(lag_us).min(bucket.capacity_us)
                    >= increment_us * (always + *k as u64 + 2)
            });
            if let Some((k, s)) = had_room {
                anomalies.push(Anomaly {
                    checker: "budget",
                    detail: format!(
                        "tenant {tenant}: op {} refused by the fleet at {at_us} µs with at most {} \
                         charges in the {} µs before it (one per {increment_us} µs refills)",
                        op.id,
                        always + k as u64,
                        at_us - s
                    ),
                    ops: vec![op.id],
                });
            }
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
            drifts: &[],
            set_off: &[],
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
    /// stretch's ends; a twelfth is over. A reset between them, or a clock set off by at
    /// least one increment, explains it; one set off by less does not.
    #[test]
    fn a_burst_over_the_capacity_is_caught_unless_a_reset_or_drift_explains_it() {
        let burst = |count: usize, decided: Decided| -> Vec<Op> {
            (0..count)
                .map(|i| charge(i, i as u64 * 1_000, decided))
                .collect()
        };
        assert!(budgets(&burst(11, Decided::Fleet), &quiet()).is_empty());
        let over = budgets(&burst(12, Decided::Fleet), &quiet());
        assert_eq!(over.len(), 1, "{over:?}");
        assert_eq!(over[0].checker, "budget");
        let drifted = |off_us: u64| {
            budgets(
                &burst(12, Decided::Fleet),
                &Budgets {
                    drifts: &[Drift {
                        from_us: 5_000,
                        to_us: 6_000,
                        off_us,
                    }],
                    ..quiet()
                },
            )
        };
        assert!(drifted(100_000).is_empty());
        assert_eq!(drifted(50_000).len(), 1);

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

    /// A refusal needs enough charges behind it: one after a quiet second had room.
    #[test]
    fn a_refusal_with_room_in_the_bucket_is_caught() {
        let refused = |id: usize, at_us: u64| Op {
            outcome: Outcome::Answered(Answer::RateLimited, Decided::Fleet),
            ..charge(id, at_us, Decided::Fleet)
        };
        // Ten charges at once fill the bucket; a refusal right after is justified.
        let mut history: Vec<Op> = (0..10)
            .map(|i| charge(i, 1_000 + i as u64, Decided::Fleet))
            .collect();
        history.push(refused(10, 20_000));
        assert!(refusals(&history, BUCKET, &[]).is_empty());
        // Two seconds later the bucket has refilled: a refusal then had room.
        history.push(refused(11, 2_100_000));
        let found = refusals(&history, BUCKET, &[]);
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].ops, vec![11]);
        // A clock set off in between lets the fleet's time lag by at most its drift: half a
        // second of lag still leaves room two seconds on, a lag as long as the quiet time
        // does not.
        let lagged = |off_us: u64| {
            let drift = Drift {
                from_us: 1_500_000,
                to_us: 2_000_000,
                off_us,
            };
            refusals(&history, BUCKET, &[drift]).len()
        };
        assert_eq!(lagged(500_000), 1);
        assert_eq!(lagged(2_000_000), 0);
        // Nor does it have room if a node's own charges may have been handed to the fleet
        // meanwhile.
        history.extend((0..20).map(|i| charge(100 + i, 2_000_000, Decided::Local)));
        assert!(refusals(&history, BUCKET, &[]).is_empty());
    }

    /// Two drifts in a row add up: the fleet's time may run ahead by one's offset, then
    /// stand still for the next one's, so a refusal after both may have lost both.
    #[test]
    fn two_drifts_in_a_row_add_their_offsets() {
        let refused = |id: usize, at_us: u64| Op {
            outcome: Outcome::Answered(Answer::RateLimited, Decided::Fleet),
            ..charge(id, at_us, Decided::Fleet)
        };
        let mut history: Vec<Op> = (0..10)
            .map(|i| charge(i, 1_899_000, Decided::Fleet))
            .collect();
        history.extend(
            [2_250_000, 2_350_000, 2_450_000].map(|at_us| charge(20, at_us, Decided::Fleet)),
        );
        history.push(refused(30, 2_770_000));
        let ahead = Drift {
            from_us: 1_000_000,
            to_us: 3_250_000,
            off_us: 250_000,
        };
        let behind = Drift {
            from_us: 2_500_000,
            to_us: 5_250_000,
            off_us: 250_000,
        };
        assert_eq!(refusals(&history, BUCKET, &[ahead]).len(), 1);
        assert!(refusals(&history, BUCKET, &[ahead, behind]).is_empty());
    }

    /// Idle time beyond the capacity adds no room: a long quiet spell, then a burst that
    /// fills the bucket, then a refusal, is a bucket doing its job.
    #[test]
    fn a_refusal_after_a_burst_that_follows_a_quiet_spell_had_no_room() {
        let refused = |id: usize, at_us: u64| Op {
            outcome: Outcome::Answered(Answer::RateLimited, Decided::Fleet),
            ..charge(id, at_us, Decided::Fleet)
        };
        let mut history = vec![charge(0, 1_000, Decided::Fleet)];
        history.extend((1..=10).map(|i| charge(i, 5_000_000 + i as u64 * 1_000, Decided::Fleet)));
        history.push(refused(11, 5_050_000));
        assert!(refusals(&history, BUCKET, &[]).is_empty());
        // Five grants a node made alone fill it too: each may be charged twice (its late
        // commit, and the hand-over).
        let mut history = vec![charge(0, 1_000, Decided::Fleet)];
        history.extend((1..=5).map(|i| charge(i, 5_000_000 + i as u64 * 1_000, Decided::Local)));
        history.push(refused(6, 5_050_000));
        assert!(refusals(&history, BUCKET, &[]).is_empty());
        // Four do not.
        history.remove(5);
        assert_eq!(refusals(&history, BUCKET, &[]).len(), 1);
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
