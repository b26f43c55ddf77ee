//! Linearizability of the fleet's charge answers, bucket by bucket: search for an order of
//! the calls, each placed between its invocation and its return, and a stamp for each, in
//! which a small sequential GCRA model gives every `allowed`, `rate_limited` and reset
//! answer the fleet gave.
//!
//! The model is written here from the contract (§3, §4, §10) and docs/fallback.md, not
//! taken from `state::rules`:
//! - an entry's time is the leader's stamp, taken within the call's span; the fleet's clock
//!   is the latest stamp applied, and an entry applies at `max(clock, stamp)`;
//! - a charge at `now` passes when `max(tat, now) + I − now ≤ C` and sets the TAT to
//!   `max(tat, now) + I`; otherwise nothing changes;
//! - a reset forgets the bucket (a TAT at or before now);
//! - a charge a node granted alone is handed over as an absorb: `min(max(tat, now) + I,
//!   now + C)`, never refused.
//!
//! The stamps are part of what the search chooses. A state is the pair (TAT, clock) on a
//! grid of [`GRID_US`], and a set of states stands for every stamp a call could have had:
//! the earliest one (best for what follows), and, where a later stamp leaves a fuller
//! bucket, every later one up to the call's return (a refusal that comes after may need
//! it). Times are widened by `STAMP_SLACK_US` and rounded outwards, and a refusal is
//! accepted one grid step early, so the rounding can only excuse, never accuse.
//!
//! Calls the fleet did not answer may still have charged it, at any time after their
//! invocation: an unknown charge (twice: its own late commit, and the hand-over if the
//! node granted it), a charge a node granted alone (twice, the same way) or refused alone
//! (once, its late commit). These form a pool, spent earliest invoked first: all of them
//! charge the same, so which ones were spent does not matter, only how many. They only
//! raise the TAT, which only a refusal needs, so the model spends them as late as it can:
//! just before a refusal that has too little in the bucket without them. An unknown reset
//! goes to a pool of its own, and may be spent just before any `allowed`: spent as late as
//! it can be, it leaves the emptiest bucket; spent earlier, it leaves the charges after it
//! in the bucket, which a refusal after them may need.
//!
//! A wall clock set off (the `clock` and `skew` faults) moves the fleet's time off real
//! time by at most the smaller of its offset and `max_clock_offset_ms` (contract §3): a
//! leader's stamps follow its monotonic clock within that bound. So a call that overlaps
//! such a drift ([`super::drifts`]) may carry a stamp that far outside its span, and
//! nothing else changes: the search goes on through the fault from the state it reached,
//! one search per tenant for the whole run, so a fleet whose clock froze or jumped further
//! than the bound shows as answers no stamps explain.

use std::collections::BTreeMap;

use super::budget::Bucket;
use super::{drift_at, search, Drift};
use crate::history::{Answer, Decided, Op, Outcome, Request};

/// The model's time step: stamps are compared to this precision.
pub const GRID_US: u64 = 1_000;
/// How far a stamp may lie outside its call's span as the nemesis timed it (the nodes'
/// wall clocks and the nemesis's monotonic clock, read microseconds apart).
const STAMP_SLACK_US: u64 = 2_000;
/// How far back from the op a failed search stopped at the report shows the bucket's ops.
pub const CONTEXT_US: u64 = 2_000_000;
/// Steps one bucket's search may take before it gives up.
const STEPS_MAX: u64 = 2_000_000;

/// One bucket as the model sees it, in grid steps.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
struct State {
    /// The TAT, never below the clock (a TAT at or before the clock is an empty bucket).
    tat: u64,
    /// The fleet's clock: the latest stamp applied.
    clock: u64,
    /// How many of the pool's charges were spent (the earliest invoked ones).
    charges: usize,
    /// How many of the pool's resets were spent.
    resets: usize,
}

/// What the fleet answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Said {
    Allowed,
    RateLimited,
    Reset,
}

/// One call the fleet answered, with its span in grid steps, widened, and the stamps it may
/// have carried (its span, widened further by a drift it overlaps).
#[derive(Clone, Debug)]
struct Call {
    op: usize,
    from: u64,
    to: u64,
    stamp_from: u64,
    stamp_to: u64,
    said: Said,
}

/// The stretch's pools and the bucket's shape, in grid steps.
struct Model {
    increment: u64,
    capacity: u64,
    /// When each pooled charge was invoked, earliest first.
    charges: Vec<u64>,
    /// When each pooled reset was invoked, earliest first.
    resets: Vec<u64>,
}

/// States reached at every clock from `from` to `to`, keeping a fixed fill (TAT − clock).
#[derive(Default)]
struct Diagonals(BTreeMap<(usize, usize, u64), Vec<(u64, u64)>>);

impl Diagonals {
    fn add(&mut self, state: State, fill: u64, from: u64, to: u64) {
        if from <= to {
            self.0
                .entry((state.charges, state.resets, fill))
                .or_default()
                .push((from, to));
        }
    }

    /// Every state on the diagonals, each clock once per (pools spent, fill).
    fn into_states(self, out: &mut Vec<State>) {
        for ((charges, resets, fill), mut spans) in self.0 {
            spans.sort_unstable();
            let mut next = 0;
            for (from, to) in spans {
                for clock in from.max(next)..=to {
                    out.push(State {
                        tat: clock + fill,
                        clock,
                        charges,
                        resets,
                    });
                }
                next = next.max(to + 1);
            }
        }
    }
}

impl Model {
    /// An `allowed` from `state`, where a stamp explains it.
    fn allowed(&self, state: &State, call: &Call, out: &mut Vec<State>, later: &mut Diagonals) {
        let latest = call.stamp_to;
        // The earliest stamp with room: the bucket must have drained to C − I.
        let at = state
            .clock
            .max(call.stamp_from)
            .max((state.tat + self.increment).saturating_sub(self.capacity));
        if at > latest {
            return;
        }
        out.push(State {
            tat: state.tat.max(at) + self.increment,
            clock: at,
            ..*state
        });
        // A stamp after the bucket emptied leaves it holding one increment, at any clock
        // up to the return.
        later.add(*state, self.increment, state.tat.max(at) + 1, latest);
    }

    /// An `allowed`, and also one with the next pooled reset just before it. Not only when
    /// the `allowed` needs it: a reset spent early leaves the charges after it in the
    /// bucket, which a later refusal may need, so no place for it beats the others.
    fn allowed_or_reset(
        &self,
        state: &State,
        call: &Call,
        out: &mut Vec<State>,
        later: &mut Diagonals,
    ) {
        self.allowed(state, call, out, later);
        let Some(invoked) = self.resets.get(state.resets) else {
            return;
        };
        let at = state.clock.max(*invoked);
        if at <= call.stamp_to {
            let emptied = State {
                tat: at,
                clock: at,
                resets: state.resets + 1,
                ..*state
            };
            self.allowed(&emptied, call, out, later);
        }
    }

    /// A `rate_limited` from `state`, spending as few pooled charges as it needs.
    fn rate_limited(
        &self,
        state: &State,
        call: &Call,
        out: &mut Vec<State>,
        later: &mut Diagonals,
    ) {
        let latest = call.stamp_to;
        let (increment, capacity) = (self.increment, self.capacity);
        let mut at = state.clock.max(call.stamp_from);
        for spent in 0..=self.charges.len() - state.charges {
            if spent > 0 {
                at = at.max(self.charges[state.charges + spent - 1]);
            }
            if at > latest {
                return;
            }
            let tat = if spent == 0 {
                state.tat
            } else {
                (state.tat.max(at) + spent as u64 * increment).min(at + capacity)
            };
            // Denied when max(tat, now) + I − now > C; one grid step early here.
            if tat + increment < at + capacity {
                continue;
            }
            let spent_state = State {
                charges: state.charges + spent,
                ..*state
            };
            // A pooled charge may add less than an increment (it landed on an emptier
            // bucket, or was capped), so with any spent the bucket may hold anything from
            // the least a refusal needs up to `tat`. Later clocks need no such range: each
            // of their TATs is reached here or on the diagonals below at an earlier clock.
            let least = if spent == 0 {
                tat
            } else {
                (at + capacity).saturating_sub(increment)
            };
            for tat in least..=tat {
                out.push(State {
                    tat,
                    clock: at,
                    ..spent_state
                });
            }
            if spent > 0 {
                let topped = state.tat + spent as u64 * increment;
                // Below the old TAT, the pooled charges overfill the bucket while the clock
                // is before `cap_ends`: a later stamp leaves it full at a later clock ...
                let cap_ends = topped.saturating_sub(capacity);
                let capped_to = latest.min(state.tat.min(cap_ends).saturating_sub(1));
                later.add(spent_state, capacity, at + 1, capped_to);
                // ... then the TAT stands at `topped` until the clock passes the old TAT ...
                let standing = at.max(cap_ends);
                if standing > at && standing < state.tat && standing <= latest {
                    out.push(State {
                        tat: topped,
                        clock: standing,
                        ..spent_state
                    });
                }
                // ... and past it, the pooled charges alone fill the bucket.
                let fill = (spent as u64 * increment).min(capacity);
                if fill + increment >= capacity {
                    later.add(spent_state, fill, (at + 1).max(state.tat), latest);
                }
            }
            return;
        }
    }

    /// A reset from `state`: the bucket empties at the earliest stamp.
    fn reset(state: &State, call: &Call, out: &mut Vec<State>) {
        let at = state.clock.max(call.stamp_from);
        if at <= call.stamp_to {
            out.push(State {
                tat: at,
                clock: at,
                ..*state
            });
        }
    }

    /// The states after `call`, from every state in `states`; `None` if no stamp explains
    /// its answer from any of them.
    fn apply(&self, states: &[State], call: &Call) -> Option<Vec<State>> {
        let mut out = Vec::new();
        let mut later = Diagonals::default();
        for state in states {
            match call.said {
                Said::Allowed => self.allowed_or_reset(state, call, &mut out, &mut later),
                Said::RateLimited => self.rate_limited(state, call, &mut out, &mut later),
                Said::Reset => Self::reset(state, call, &mut out),
            }
        }
        later.into_states(&mut out);
        let out = prune(out);
        (!out.is_empty()).then_some(out)
    }
}

/// Keeps, among states with one TAT, those no other beats: an earlier clock and fewer pooled
/// calls spent can do all that a later clock or more spent can.
fn prune(mut states: Vec<State>) -> Vec<State> {
    states.sort_unstable();
    states.dedup();
    let mut kept: Vec<State> = Vec::with_capacity(states.len());
    let mut group_from = 0;
    for state in states {
        if kept
            .get(group_from)
            .is_some_and(|first| first.tat != state.tat)
        {
            group_from = kept.len();
        }
        let beaten = kept[group_from..].iter().any(|other| {
            other.clock <= state.clock
                && other.charges <= state.charges
                && other.resets <= state.resets
        });
        if !beaten {
            kept.push(state);
        }
    }
    kept
}

/// What the search concluded for one tenant's bucket.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    Linearizable,
    /// No order and stamps explain the answers: the one the longest explained prefix could
    /// not go on with, and the bucket's ops up to [`CONTEXT_US`] before it, by id.
    NotLinearizable {
        ops: Vec<usize>,
        stuck: usize,
    },
    /// The search ran out of steps before it decided.
    Inconclusive,
}

/// One tenant's bucket, checked over the whole run.
#[derive(Clone, Debug)]
pub struct Checked {
    pub tenant: String,
    /// The fleet answers it checked.
    pub calls: usize,
    pub verdict: Verdict,
}

/// One tenant's fleet answers, and when its pooled charges and resets were invoked.
type Tenant = (Vec<Call>, Vec<u64>, Vec<u64>);

fn grid_down(us: u64) -> u64 {
    us.saturating_sub(STAMP_SLACK_US) / GRID_US
}

fn grid_up(us: u64) -> u64 {
    (us + STAMP_SLACK_US).div_ceil(GRID_US)
}

/// The verdict for every tenant's bucket in `history`; in each of `drifts` the fleet's
/// clock may have been off real time by up to its offset.
pub fn check(history: &[Op], bucket: Bucket, drifts: &[Drift]) -> Vec<Checked> {
    let mut tenants: BTreeMap<&str, Tenant> = BTreeMap::new();
    for op in history {
        let (tenant, said) = match (&op.request, &op.outcome) {
            (Request::Charge { tenant }, Outcome::Answered(Answer::Allowed, Decided::Fleet)) => {
                (tenant, Some(Said::Allowed))
            }
            (
                Request::Charge { tenant },
                Outcome::Answered(Answer::RateLimited, Decided::Fleet),
            ) => (tenant, Some(Said::RateLimited)),
            (Request::Reset { tenant }, Outcome::Answered(_, Decided::Fleet)) => {
                (tenant, Some(Said::Reset))
            }
            (Request::Charge { tenant } | Request::Reset { tenant }, _) => (tenant, None),
            _ => continue,
        };
        let (calls, charges, resets) = tenants.entry(tenant).or_default();
        let drift_us = drift_at(drifts, op.invoke_us, op.return_us);
        // A call applies at a stamp after its invocation, less any drift it met.
        let stamp_from = grid_down(op.invoke_us.saturating_sub(drift_us));
        let pooled = match (&op.request, &op.outcome, said) {
            (_, _, Some(said)) => {
                calls.push(Call {
                    op: op.id,
                    from: grid_down(op.invoke_us),
                    to: grid_up(op.return_us),
                    stamp_from,
                    stamp_to: grid_up(op.return_us + drift_us),
                    said,
                });
                (0, 0)
            }
            (_, Outcome::NotSent(_), None) => (0, 0),
            (Request::Charge { .. }, Outcome::Answered(Answer::RateLimited, _), None) => (1, 0),
            (Request::Charge { .. }, _, None) => (2, 0),
            (Request::Reset { .. }, _, None) => (0, 1),
            _ => (0, 0),
        };
        charges.extend(std::iter::repeat_n(stamp_from, pooled.0));
        resets.extend(std::iter::repeat_n(stamp_from, pooled.1));
    }
    let mut checked = Vec::new();
    for (tenant, (calls, mut charges, mut resets)) in tenants {
        if calls.is_empty() {
            continue;
        }
        charges.sort_unstable();
        resets.sort_unstable();
        let model = Model {
            increment: bucket.increment_us / GRID_US,
            capacity: bucket.capacity_us / GRID_US,
            charges,
            resets,
        };
        checked.push(Checked {
            tenant: tenant.to_owned(),
            calls: calls.len(),
            verdict: check_calls(&model, &calls),
        });
    }
    checked
}

fn check_calls(model: &Model, calls: &[Call]) -> Verdict {
    // The run's fleet starts empty.
    let initial = vec![State {
        tat: 0,
        clock: 0,
        charges: 0,
        resets: 0,
    }];
    match search::search(
        calls,
        |call| (call.from, call.to),
        initial,
        |states, call| model.apply(states, call),
        STEPS_MAX,
    ) {
        search::Found::Linearizable => Verdict::Linearizable,
        search::Found::NotLinearizable { stuck } => {
            let stuck = &calls[stuck];
            Verdict::NotLinearizable {
                ops: calls
                    .iter()
                    .filter(|call| {
                        call.to + CONTEXT_US / GRID_US >= stuck.from && call.from <= stuck.to
                    })
                    .map(|call| call.op)
                    .collect(),
                stuck: stuck.op,
            }
        }
        search::Found::Inconclusive => Verdict::Inconclusive,
    }
}

#[cfg(test)]
mod tests;
