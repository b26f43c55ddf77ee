//! Linearizability of the fleet's claim answers, key by key, in the style of Wing & Gong
//! and porcupine: search for an order of the calls, each placed between its invocation and
//! its return, in which a small sequential model of the contract gives every answer the
//! fleet gave.
//!
//! The model is written here from the contract (§5 and §6), not taken from
//! `state::rules`: a bug copied into both would pass. Claims in the checked key space never
//! expire within a run (their TTLs are longer), so the model has no clock. Not even a
//! leader's wall clock set forward past the pending TTL ends them: the fleet's time follows
//! the leader's monotonic clock within `max_clock_offset_ms` (contract §3), so a fleet
//! answer that treats a pending claim as expired is an anomaly like any other.
//!
//! A call whose outcome is unknown (an error, no answer in time) may have taken effect at
//! any time after its invocation, or never. So may a claim a node answered alone: the
//! fleet did not answer in time, but the proposal may still commit later, and a claim the
//! node allowed is handed to the fleet by reconciliation (unless settled first). Such calls have no return
//! time and may take no effect; the model is non-deterministic, and the search runs over
//! sets of states (as porcupine does). A `queued` settle is never lost (contract §6): it
//! takes effect, as a reconciled commit or a release, at some time between its invocation
//! and the moment the healed fleet had handed over every local decision.

use std::collections::{BTreeSet, HashMap};

use super::search;

use crate::history::{Answer, Decided, Op, Outcome, Request};

/// A hook, interned per key (the search compares and hashes these a great deal).
type Hook = u32;

/// The state of one claim key.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum Claim {
    Free,
    Pending(Hook),
    Committed(Hook),
}

/// What a call does to the key.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Effect {
    Claim(Hook),
    Commit(Hook),
    Release(Hook),
    /// A queued commit handed over late: it wins over another hook's pending claim (§7).
    ReconcileCommit(Hook),
}

/// The model's answer to one effect.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Said {
    Allowed,
    Pending,
    Duplicate(Hook),
    Settled,
    Recreated,
    Conflict(Hook),
    /// An answer the model never gives (the search fails on it).
    Impossible,
}

/// The contract's sequential claim: the answer and the next state.
fn step(state: &Claim, effect: &Effect) -> (Said, Claim) {
    use Claim::*;
    match (effect, state) {
        (Effect::Claim(hook), Free) => (Said::Allowed, Pending(*hook)),
        (Effect::Claim(hook), Pending(holder)) if holder == hook => (Said::Allowed, state.clone()),
        (Effect::Claim(_), Pending(_)) => (Said::Pending, state.clone()),
        (Effect::Claim(_), Committed(holder)) => (Said::Duplicate(*holder), state.clone()),
        (Effect::Commit(hook), Free) => (Said::Recreated, Committed(*hook)),
        (Effect::Commit(hook), Pending(holder)) if holder == hook => {
            (Said::Settled, Committed(*hook))
        }
        (Effect::Commit(hook), Committed(holder)) if holder == hook => {
            (Said::Settled, state.clone())
        }
        (Effect::Commit(_), Pending(holder) | Committed(holder)) => {
            (Said::Conflict(*holder), state.clone())
        }
        (Effect::Release(_), Free) => (Said::Settled, Free),
        (Effect::Release(hook), Pending(holder)) if holder == hook => (Said::Settled, Free),
        (Effect::Release(_), Pending(holder) | Committed(holder)) => {
            (Said::Conflict(*holder), state.clone())
        }
        (Effect::ReconcileCommit(hook), Pending(holder)) if holder != hook => {
            (Said::Recreated, Committed(*hook))
        }
        (Effect::ReconcileCommit(hook), _) => step(state, &Effect::Commit(*hook)),
    }
}

/// One call as the search sees it.
#[derive(Clone, Debug)]
struct Call {
    op: usize,
    invoke_us: u64,
    /// `None`: it may take effect at any time after its invocation.
    return_us: Option<u64>,
    /// The effects it may have had (one of them).
    effects: Vec<Effect>,
    /// The answer the model must give; `None`: any.
    expected: Option<Said>,
    /// It may also have had no effect at all.
    optional: bool,
}

/// Hook ids for one key.
#[derive(Default)]
struct Hooks(HashMap<String, Hook>);

impl Hooks {
    fn id(&mut self, hook: &str) -> Hook {
        let next = self.0.len() as Hook;
        *self.0.entry(hook.to_owned()).or_insert(next)
    }
}

/// The calls of a history that touch claim keys, by key; queued settles must have taken
/// effect by `settled_by_us`.
fn calls_by_key(history: &[Op], settled_by_us: u64) -> HashMap<String, Vec<Call>> {
    let mut by_key: HashMap<String, (Hooks, Vec<Call>)> = HashMap::new();
    for op in history {
        let key = match &op.request {
            Request::Claim { key, .. } | Request::Settle { key, .. } => key,
            Request::Charge { .. } | Request::Reset { .. } => continue,
        };
        let (hooks, calls) = by_key.entry(key.clone()).or_default();
        let call = match &op.request {
            Request::Claim { hook, .. } => {
                let effect = Effect::Claim(hooks.id(hook));
                match &op.outcome {
                    Outcome::Answered(answer, Decided::Fleet) => {
                        let expected = match answer {
                            Answer::Allowed => Said::Allowed,
                            Answer::Pending => Said::Pending,
                            Answer::Duplicate { holder } => Said::Duplicate(hooks.id(holder)),
                            _ => Said::Impossible,
                        };
                        required(op, vec![effect], expected)
                    }
                    // The fleet did not answer in time, but the proposal may still commit
                    // later; and a claim this node took alone goes to the fleet later, maybe.
                    // Both may happen (a release through the fleet leaves the node's own
                    // record, which reconciliation hands over again), so an `allowed` one
                    // may take effect twice.
                    Outcome::Answered(Answer::Allowed, Decided::Local) => {
                        calls.push(optional(op, vec![effect.clone()]));
                        optional(op, vec![effect])
                    }
                    Outcome::Answered(_, Decided::Local) => optional(op, vec![effect]),
                    Outcome::Unknown(_) => optional(op, vec![effect]),
                    Outcome::NotSent(_) => continue,
                }
            }
            Request::Settle { hook, commit, .. } => {
                let hook = hooks.id(hook);
                let (effect, handed_over) = if *commit {
                    (Effect::Commit(hook), Effect::ReconcileCommit(hook))
                } else {
                    (Effect::Release(hook), Effect::Release(hook))
                };
                match &op.outcome {
                    Outcome::Answered(Answer::Queued, _) => Call {
                        op: op.id,
                        invoke_us: op.invoke_us,
                        return_us: Some(settled_by_us.max(op.return_us)),
                        effects: vec![handed_over],
                        expected: None,
                        optional: false,
                    },
                    Outcome::Answered(answer, _) => {
                        let expected = match answer {
                            Answer::Settled => Said::Settled,
                            Answer::Recreated => Said::Recreated,
                            Answer::Conflict { holder } => Said::Conflict(hooks.id(holder)),
                            _ => Said::Impossible,
                        };
                        required(op, vec![effect], expected)
                    }
                    // It may have been applied, or queued and handed over later.
                    Outcome::Unknown(_) => optional(op, vec![effect, handed_over]),
                    Outcome::NotSent(_) => continue,
                }
            }
            Request::Charge { .. } | Request::Reset { .. } => continue,
        };
        calls.push(call);
    }
    by_key
        .into_iter()
        .map(|(key, (_, calls))| (key, calls))
        .collect()
}

fn required(op: &Op, effects: Vec<Effect>, expected: Said) -> Call {
    Call {
        op: op.id,
        invoke_us: op.invoke_us,
        return_us: Some(op.return_us),
        effects,
        expected: Some(expected),
        optional: false,
    }
}

fn optional(op: &Op, effects: Vec<Effect>) -> Call {
    Call {
        op: op.id,
        invoke_us: op.invoke_us,
        return_us: None,
        effects,
        expected: None,
        optional: true,
    }
}

/// What the search concluded for one key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    Linearizable,
    /// No order explains the answers; the ops of the key, by id.
    NotLinearizable {
        ops: Vec<usize>,
    },
    /// The search ran out of steps before it decided.
    Inconclusive,
}

/// Steps one key's search may take before it gives up (inconclusive, never an anomaly).
const STEPS_MAX: u64 = 2_000_000;

type States = BTreeSet<Claim>;

fn apply(states: &States, call: &Call) -> States {
    let mut next = States::new();
    for state in states {
        if call.optional {
            next.insert(state.clone());
        }
        for effect in &call.effects {
            let (said, after) = step(state, effect);
            if call
                .expected
                .as_ref()
                .is_none_or(|expected| *expected == said)
            {
                next.insert(after);
            }
        }
    }
    next
}

/// The search over one key's calls.
fn check_key(calls: &[Call]) -> Verdict {
    let span = |call: &Call| (call.invoke_us, call.return_us.unwrap_or(u64::MAX));
    let initial: States = BTreeSet::from([Claim::Free]);
    let place = |states: &States, call: &Call| Some(apply(states, call)).filter(|s| !s.is_empty());
    match search::search(calls, span, initial, place, STEPS_MAX) {
        search::Found::Linearizable => Verdict::Linearizable,
        search::Found::NotLinearizable { .. } => not_linearizable(calls),
        search::Found::Inconclusive => Verdict::Inconclusive,
    }
}

fn not_linearizable(calls: &[Call]) -> Verdict {
    Verdict::NotLinearizable {
        ops: calls.iter().map(|call| call.op).collect(),
    }
}

/// The verdict for every claim key of `history`, by key; queued settles must have taken
/// effect by `settled_by_us`.
pub fn check(history: &[Op], settled_by_us: u64) -> Vec<(String, Verdict)> {
    let mut verdicts: Vec<(String, Verdict)> = calls_by_key(history, settled_by_us)
        .into_iter()
        .map(|(key, calls)| {
            let verdict = check_key(&calls);
            (key, verdict)
        })
        .collect();
    verdicts.sort_by(|a, b| a.0.cmp(&b.0));
    verdicts
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::fixtures::{claim, commit, op};

    fn fleet(answer: Answer) -> Outcome {
        Outcome::Answered(answer, Decided::Fleet)
    }

    fn verdict(history: &[Op]) -> Verdict {
        let verdicts = check(history, 1_000);
        assert_eq!(verdicts.len(), 1);
        verdicts[0].1.clone()
    }

    #[test]
    fn a_sequential_history_that_follows_the_contract_is_linearizable() {
        let history = [
            op(0, claim("a"), (0, 10), fleet(Answer::Allowed)),
            op(1, claim("b"), (20, 30), fleet(Answer::Pending)),
            op(2, commit("a"), (40, 50), fleet(Answer::Settled)),
            op(
                3,
                claim("b"),
                (60, 70),
                fleet(Answer::Duplicate { holder: "a".into() }),
            ),
        ];
        assert_eq!(verdict(&history), Verdict::Linearizable);
    }

    /// Two hooks both allowed the same key, one after the other: no order explains it.
    #[test]
    fn two_hooks_allowed_one_after_the_other_is_not_linearizable() {
        let history = [
            op(0, claim("a"), (0, 10), fleet(Answer::Allowed)),
            op(1, claim("b"), (20, 30), fleet(Answer::Allowed)),
        ];
        assert!(matches!(verdict(&history), Verdict::NotLinearizable { .. }));
    }

    /// A duplicate answered before the commit that would explain it was even invoked.
    #[test]
    fn a_duplicate_before_its_commit_is_not_linearizable() {
        let history = [
            op(0, claim("a"), (0, 10), fleet(Answer::Allowed)),
            op(
                1,
                claim("b"),
                (20, 30),
                fleet(Answer::Duplicate { holder: "a".into() }),
            ),
            op(2, commit("a"), (40, 50), fleet(Answer::Settled)),
        ];
        assert!(matches!(verdict(&history), Verdict::NotLinearizable { .. }));
        // Overlapping in time, the commit may have gone first.
        let overlapping = [
            op(0, claim("a"), (0, 10), fleet(Answer::Allowed)),
            op(
                1,
                claim("b"),
                (20, 45),
                fleet(Answer::Duplicate { holder: "a".into() }),
            ),
            op(2, commit("a"), (40, 50), fleet(Answer::Settled)),
        ];
        assert_eq!(verdict(&overlapping), Verdict::Linearizable);
    }

    /// An unknown call may have taken effect, or not; a queued commit may land late and win.
    #[test]
    fn unknown_and_queued_calls_may_take_effect_at_any_time_or_never() {
        let unknown = Outcome::Unknown("deadline".into());
        let history = [
            op(0, claim("a"), (0, 10), unknown.clone()),
            op(1, claim("b"), (20, 30), fleet(Answer::Pending)),
            op(2, claim("c"), (40, 50), fleet(Answer::Pending)),
        ];
        assert_eq!(
            verdict(&history),
            Verdict::Linearizable,
            "the unknown claim took effect"
        );
        let history = [
            op(0, claim("a"), (0, 10), unknown),
            op(1, claim("b"), (20, 30), fleet(Answer::Allowed)),
        ];
        assert_eq!(verdict(&history), Verdict::Linearizable, "it never did");
        let queued = Outcome::Answered(Answer::Queued, Decided::Local);
        let history = [
            op(0, commit("a"), (0, 10), queued),
            op(1, claim("b"), (20, 30), fleet(Answer::Allowed)),
            op(
                2,
                claim("c"),
                (40, 50),
                fleet(Answer::Duplicate { holder: "a".into() }),
            ),
        ];
        assert_eq!(
            verdict(&history),
            Verdict::Linearizable,
            "the queued commit landed over b's pending claim"
        );
    }

    /// A claim the node answered alone (here `pending`, decided locally) may still have
    /// reached the fleet: the proposal that missed its deadline can commit later.
    #[test]
    fn a_claim_answered_locally_may_still_take_effect_in_the_fleet() {
        let local_pending = Outcome::Answered(Answer::Pending, Decided::Local);
        let history = [
            op(0, claim("a"), (0, 10), local_pending),
            op(
                1,
                Request::Settle {
                    key: "k".into(),
                    hook: "b".into(),
                    commit: false,
                },
                (20, 30),
                fleet(Answer::Conflict { holder: "a".into() }),
            ),
        ];
        assert_eq!(verdict(&history), Verdict::Linearizable);
    }

    /// A queued settle is never lost: once the healed fleet handed over everything
    /// (`settled_by_us`, 1 000 here), a probe must see it.
    #[test]
    fn a_queued_commit_that_never_reached_the_fleet_is_not_linearizable() {
        let queued = Outcome::Answered(Answer::Queued, Decided::Local);
        let lost = [
            op(0, commit("a"), (0, 10), queued.clone()),
            op(1, claim("probe"), (2_000, 2_010), fleet(Answer::Allowed)),
        ];
        assert!(matches!(verdict(&lost), Verdict::NotLinearizable { .. }));
        let landed = [
            op(0, commit("a"), (0, 10), queued),
            op(
                1,
                claim("probe"),
                (2_000, 2_010),
                fleet(Answer::Duplicate { holder: "a".into() }),
            ),
        ];
        assert_eq!(verdict(&landed), Verdict::Linearizable);
    }

    /// A second hook allowed while the first one's claim is pending is an anomaly, however
    /// far apart: pending claims outlive the run, and no clock fault ends them early.
    #[test]
    fn a_pending_claim_never_ends_within_a_run() {
        let history = [
            op(0, claim("a"), (0, 10), fleet(Answer::Allowed)),
            op(1, claim("b"), (100, 110), fleet(Answer::Allowed)),
        ];
        assert!(matches!(
            verdict(&history),
            Verdict::NotLinearizable { ops } if ops == vec![0, 1]
        ));
    }

    /// The model itself, case by case (contract §5 and §6).
    #[test]
    fn the_model_follows_the_contract() {
        let (a, b) = (0, 1);
        let pending = Claim::Pending;
        let committed = Claim::Committed;
        assert_eq!(step(&pending(a), &Effect::Claim(a)).0, Said::Allowed);
        assert_eq!(step(&committed(a), &Effect::Claim(a)).0, Said::Duplicate(a));
        assert_eq!(
            step(&Claim::Free, &Effect::Commit(a)),
            (Said::Recreated, committed(a))
        );
        assert_eq!(
            step(&committed(a), &Effect::Release(a)).0,
            Said::Conflict(a)
        );
        assert_eq!(
            step(&pending(a), &Effect::Release(a)),
            (Said::Settled, Claim::Free)
        );
        assert_eq!(
            step(&pending(b), &Effect::ReconcileCommit(a)),
            (Said::Recreated, committed(a))
        );
        assert_eq!(
            step(&committed(b), &Effect::ReconcileCommit(a)).0,
            Said::Conflict(b)
        );
    }
}
