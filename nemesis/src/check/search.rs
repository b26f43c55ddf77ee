//! The search both linearizability checkers share, in the style of Wing & Gong and of
//! porcupine: find an order of the calls, each placed between its invocation and its
//! return, in which a sequential model gives every answer that was given.
//!
//! The model works on sets of states (porcupine's way with models that are not
//! deterministic): `apply` maps the states before a call to the states after it, and an
//! empty set means the call cannot go there. A call may have no return (`u64::MAX`): it
//! may go anywhere after its invocation.

use std::collections::HashSet;
use std::hash::{DefaultHasher, Hash, Hasher};

/// What the search concluded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Found {
    Linearizable,
    /// No order explains the answers. `stuck` is the call the longest partial order could
    /// not go on with (the earliest invoked of those left there).
    NotLinearizable {
        stuck: usize,
    },
    /// It ran out of steps before it decided.
    Inconclusive,
}

/// The calls done so far and a set of states after them, as the search remembers them:
/// a 128-bit fingerprint of both (SipHash with two salts), so remembering costs 16 bytes
/// and no copy of the calls' bit set. Two different pairs sharing a fingerprint would make
/// the search skip one of them; at 2^-128 a pair, over a few million steps, that does not
/// happen.
type Seen = (u64, u64);

fn fingerprint<S: Hash>(done: &[u64], states: &S) -> Seen {
    let hash = |salt: u8| {
        let mut hasher = DefaultHasher::new();
        salt.hash(&mut hasher);
        done.hash(&mut hasher);
        states.hash(&mut hasher);
        hasher.finish()
    };
    (hash(0), hash(1))
}

/// The search over `calls`, whose `span` is (invocation, return); `apply` returns `None`
/// where the model cannot place the call. Gives up after `steps_max` steps.
pub(super) fn search<C, S: Clone + Hash>(
    calls: &[C],
    span: impl Fn(&C) -> (u64, u64),
    initial: S,
    mut apply: impl FnMut(&S, &C) -> Option<S>,
    steps_max: u64,
) -> Found {
    // Events: (time, is_return, call); calls sort before returns at the same time, so
    // calls that touch in time count as overlapping (the lenient reading).
    let mut events: Vec<(u64, bool, usize)> = Vec::with_capacity(calls.len() * 2);
    for (index, call) in calls.iter().enumerate() {
        let (invoke_us, return_us) = span(call);
        events.push((invoke_us, false, index));
        events.push((return_us, true, index));
    }
    events.sort();
    let n = events.len();
    if n == 0 {
        return Found::Linearizable;
    }
    // A circular doubly linked list over the events through a sentinel at `n`, which is
    // both the head (`next[n]`) and the end (`next[last] == n`).
    let mut next: Vec<usize> = (1..=n).collect();
    next.push(0);
    let mut prev: Vec<usize> = (0..n).map(|i| if i == 0 { n } else { i - 1 }).collect();
    prev.push(n - 1);
    let end = n;
    let mut return_of = vec![0; calls.len()];
    for (position, (_, is_return, call)) in events.iter().enumerate() {
        if *is_return {
            return_of[*call] = position;
        }
    }
    let unlink = |next: &mut Vec<usize>, prev: &mut Vec<usize>, at: usize| {
        let (p, q) = (prev[at], next[at]);
        next[p] = q;
        prev[q] = p;
    };
    let relink = |next: &mut Vec<usize>, prev: &mut Vec<usize>, at: usize| {
        let (p, q) = (prev[at], next[at]);
        next[p] = at;
        prev[q] = at;
    };
    let mut done = vec![0u64; calls.len().div_ceil(64)];
    let mut seen: HashSet<Seen> = HashSet::new();
    let mut stack: Vec<(usize, S)> = Vec::new();
    let mut states = initial;
    let mut entry = next[n];
    let mut steps = 0u64;
    let (mut deepest, mut stuck) = (0, events[next[n]].2);
    while next[n] != end {
        steps += 1;
        if steps > steps_max {
            return Found::Inconclusive;
        }
        // Every remaining call was tried here, or one returned before any order could
        // place it: go back one.
        if entry == end || events[entry].1 {
            let Some((at, before)) = stack.pop() else {
                return Found::NotLinearizable { stuck };
            };
            let back = events[at].2;
            done[back / 64] &= !(1 << (back % 64));
            relink(&mut next, &mut prev, return_of[back]);
            relink(&mut next, &mut prev, at);
            states = before;
            entry = next[at];
            continue;
        }
        let call = events[entry].2;
        if let Some(after) = apply(&states, &calls[call]) {
            done[call / 64] |= 1 << (call % 64);
            if seen.insert(fingerprint(&done, &after)) {
                stack.push((entry, std::mem::replace(&mut states, after)));
                unlink(&mut next, &mut prev, entry);
                unlink(&mut next, &mut prev, return_of[call]);
                entry = next[n];
                if stack.len() > deepest && entry != end {
                    (deepest, stuck) = (stack.len(), events[entry].2);
                }
                continue;
            }
            done[call / 64] &= !(1 << (call % 64));
        }
        entry = next[entry];
    }
    Found::Linearizable
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A register a call writes (`Some`) or reads (`None` with the value it saw).
    type Call = (u64, u64, Option<u8>, u8);

    fn register(calls: &[Call]) -> Found {
        search(
            calls,
            |call| (call.0, call.1),
            0u8,
            |value, call| match call.2 {
                Some(written) => Some(written),
                None => (*value == call.3).then_some(*value),
            },
            1_000,
        )
    }

    #[test]
    fn a_read_sees_a_write_that_overlaps_it_but_not_one_after_it() {
        // write 1 over [0, 10], read 1 over [5, 20]: the write may go first.
        assert_eq!(
            register(&[(0, 10, Some(1), 0), (5, 20, None, 1)]),
            Found::Linearizable
        );
        // read 1 over [0, 4], write 1 over [5, 10]: the read came first and saw a value
        // nothing had written yet.
        assert_eq!(
            register(&[(0, 4, None, 1), (5, 10, Some(1), 0)]),
            Found::NotLinearizable { stuck: 0 }
        );
        // Two reads that disagree with each other, after one write: no order has both.
        assert_eq!(
            register(&[(0, 1, Some(1), 0), (2, 3, None, 1), (4, 5, None, 0)]),
            Found::NotLinearizable { stuck: 2 }
        );
    }

    #[test]
    fn a_search_that_runs_out_of_steps_says_so() {
        let calls: Vec<Call> = (0..20).map(|i| (0, 100, Some(i), 0)).collect();
        let found = search(
            &calls,
            |call| (call.0, call.1),
            0u8,
            // Nothing can ever be placed: unbounded, the search would end after 21 steps.
            |_, _| None::<u8>,
            5,
        );
        assert_eq!(found, Found::Inconclusive);
    }
}
