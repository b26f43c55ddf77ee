//! Budgets: no stretch of time saw more allowed charges on a tenant's bucket than its GCRA
//! allowance grants (contract §4), counting the fleet's answers and, node by node, the
//! answers a node decided alone (the fallback budget, contract §7).
//!
//! A bucket of capacity `C` and increment `I` admits at most `C / I` charges at once and
//! one more per `I` after that: in a stretch `[a, b]`, at most `C / I + (b - a) / I + 1`
//! (the `+ 1` for where the stretch's ends fall). The checker counts the allowed charges
//! that surely took effect inside a stretch (invoked at or after `a`, returned by `b`) and
//! compares, over every stretch that starts at a charge's invocation and ends at a charge's
//! return. A stretch a reset may have touched proves nothing (the bucket was emptied) and
//! is skipped. A clock jump inside it (a wall clock set forward) refills the bucket once,
//! so it adds one `C / I`.

use std::collections::BTreeMap;

use super::Anomaly;
use crate::nemesis::history::{Answer, Decided, Op, Outcome, Request};

/// One bucket's shape, as the workload charges it.
#[derive(Clone, Copy, Debug)]
pub struct Bucket {
    pub increment_us: u64,
    pub capacity_us: u64,
}

/// Charges allowed on one bucket by one decider, as (invoke, return, op id).
type Allowed = Vec<(u64, u64, usize)>;

/// Every stretch of `allowed` over its allowance (the first one found per bucket and
/// decider). `burst` is what the bucket admits at once; `resets` (from, to) and `jumps`
/// (from, to) are as in the module docs.
fn over_allowance(
    allowed: &Allowed,
    bucket: Bucket,
    burst: u64,
    resets: &[(u64, u64)],
    jumps: &[(u64, u64)],
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
            let allowance =
                burst * (1 + overlaps(jumps, *a, b)) + (b - a) / bucket.increment_us + 1;
            if inside.len() as u64 > allowance {
                return Some((*a, b, inside));
            }
        }
    }
    None
}

/// The budget anomalies of `history`: the fleet's answers per tenant against the whole
/// bucket, and each node's own answers against its fallback share (`capacity / voters`,
/// never below one increment). `jumps` are the times a wall clock was set forward.
pub fn budgets(history: &[Op], bucket: Bucket, voters: u64, jumps: &[(u64, u64)]) -> Vec<Anomaly> {
    // (tenant, decider: None for the fleet, Some(node) for a node alone) -> allowed.
    let mut allowed: BTreeMap<(String, Option<u64>), Allowed> = BTreeMap::new();
    let mut resets: BTreeMap<String, Vec<(u64, u64)>> = BTreeMap::new();
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
                // An unknown reset may take effect at any time after its invocation.
                let to_us = match outcome {
                    Outcome::Answered(..) => op.return_us,
                    _ => u64::MAX,
                };
                resets
                    .entry(tenant.clone())
                    .or_default()
                    .push((op.invoke_us, to_us));
            }
            _ => {}
        }
    }
    let whole = bucket.capacity_us / bucket.increment_us;
    let share = (bucket.capacity_us / voters.max(1)).max(bucket.increment_us) / bucket.increment_us;
    let mut anomalies = Vec::new();
    for ((tenant, decider), charges) in &allowed {
        let burst = if decider.is_some() { share } else { whole };
        let tenant_resets = resets.get(tenant).map_or(&[][..], Vec::as_slice);
        if let Some((a, b, ops)) = over_allowance(charges, bucket, burst, tenant_resets, jumps) {
            let who = match decider {
                None => "the fleet".to_owned(),
                Some(node) => format!("node {node} alone"),
            };
            anomalies.push(Anomaly {
                checker: "budget",
                detail: format!(
                    "tenant {tenant}: {who} allowed {} charges between {a} µs and {b} µs, \
                     more than a bucket of {burst} at once and one per {} µs admits",
                    ops.len(),
                    bucket.increment_us
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
    /// stretch's ends; a twelfth is over. A reset between them, or a clock jump, explains it.
    #[test]
    fn a_burst_over_the_capacity_is_caught_unless_a_reset_or_jump_explains_it() {
        let burst = |count: usize, decided: Decided| -> Vec<Op> {
            (0..count)
                .map(|i| charge(i, i as u64 * 1_000, decided))
                .collect()
        };
        assert!(budgets(&burst(11, Decided::Fleet), BUCKET, 3, &[]).is_empty());
        let over = budgets(&burst(12, Decided::Fleet), BUCKET, 3, &[]);
        assert_eq!(over.len(), 1, "{over:?}");
        assert_eq!(over[0].checker, "budget");
        assert!(budgets(&burst(12, Decided::Fleet), BUCKET, 3, &[(5_000, 6_000)]).is_empty());

        let mut with_reset = burst(12, Decided::Fleet);
        with_reset.push(Op {
            id: 99,
            request: Request::Reset { tenant: "t".into() },
            outcome: Outcome::Answered(Answer::Reset, Decided::Fleet),
            ..charge(99, 5_500, Decided::Fleet)
        });
        assert!(budgets(&with_reset, BUCKET, 3, &[]).is_empty());

        // A node alone has a third of the capacity with 3 voters: 3 at once, plus one.
        assert!(budgets(&burst(4, Decided::Local), BUCKET, 3, &[]).is_empty());
        assert_eq!(budgets(&burst(5, Decided::Local), BUCKET, 3, &[]).len(), 1);
    }

    /// Charges at the bucket's rate never go over, however long the run.
    #[test]
    fn charges_at_the_rate_are_within_the_allowance() {
        let steady: Vec<Op> = (0..200)
            .map(|i| charge(i, 1_000_000 + i as u64 * 100_000, Decided::Fleet))
            .collect();
        assert!(budgets(&steady, BUCKET, 3, &[]).is_empty());
        let mut twice = steady.clone();
        twice.extend((0..200).map(|i| {
            charge(
                200 + i,
                1_000_000 + i as u64 * 100_000 + 50_000,
                Decided::Fleet,
            )
        }));
        assert_eq!(budgets(&twice, BUCKET, 3, &[]).len(), 1, "twice the rate");
    }
}
