//! The two promises a webhook fleet exists for, checked over the whole history, whoever
//! decided each answer:
//! - never `duplicate` without a committed claim: a duplicate names a hook whose commit
//!   was at least sent before the duplicate came back (and not refused with a conflict);
//! - no committed claim lost: after the fleet acknowledged a commit, the fleet never
//!   answers `allowed` for that key again (claims in the checked key space outlive the run).

use std::collections::HashMap;

use super::Anomaly;
use crate::history::{Answer, Decided, Op, Outcome, Request};

/// Commits sent for (key, hook) that may have committed: not refused with a conflict.
fn commits(history: &[Op]) -> HashMap<(&str, &str), Vec<&Op>> {
    let mut commits: HashMap<(&str, &str), Vec<&Op>> = HashMap::new();
    for op in history {
        if let Request::Settle {
            key,
            hook,
            commit: true,
        } = &op.request
        {
            if !matches!(op.outcome, Outcome::Answered(Answer::Conflict { .. }, _)) {
                commits.entry((key, hook)).or_default().push(op);
            }
        }
    }
    commits
}

/// Duplicates no commit explains.
pub fn duplicates_without_a_commit(history: &[Op]) -> Vec<Anomaly> {
    let commits = commits(history);
    let mut anomalies = Vec::new();
    for op in history {
        let (Request::Claim { key, .. }, Outcome::Answered(Answer::Duplicate { holder }, by)) =
            (&op.request, &op.outcome)
        else {
            continue;
        };
        let explained = commits
            .get(&(key.as_str(), holder.as_str()))
            .is_some_and(|sent| sent.iter().any(|commit| commit.invoke_us < op.return_us));
        if !explained {
            anomalies.push(Anomaly {
                checker: "duplicate without a commit",
                detail: format!(
                    "op {} on node {}: {key} answered duplicate ({by:?}) for {holder}, whose commit was never sent before it",
                    op.id, op.node
                ),
                ops: vec![op.id],
            });
        }
    }
    anomalies
}

/// Fleet `allowed` answers for a key after the fleet acknowledged a commit on it.
pub fn committed_claims_lost(history: &[Op]) -> Vec<Anomaly> {
    // The earliest acknowledged commit per key.
    let mut committed: HashMap<&str, &Op> = HashMap::new();
    for op in history {
        if let (
            Request::Settle {
                key, commit: true, ..
            },
            Outcome::Answered(Answer::Settled | Answer::Recreated, Decided::Fleet),
        ) = (&op.request, &op.outcome)
        {
            let earliest = committed.entry(key).or_insert(op);
            if op.return_us < earliest.return_us {
                *earliest = op;
            }
        }
    }
    let mut anomalies = Vec::new();
    for op in history {
        let (Request::Claim { key, hook }, Outcome::Answered(Answer::Allowed, Decided::Fleet)) =
            (&op.request, &op.outcome)
        else {
            continue;
        };
        if let Some(commit) = committed.get(key.as_str()) {
            if op.invoke_us > commit.return_us {
                anomalies.push(Anomaly {
                    checker: "committed claim lost",
                    detail: format!(
                        "op {} on node {}: {key} allowed for {hook} after op {} committed it",
                        op.id, op.node, commit.id
                    ),
                    ops: vec![commit.id, op.id],
                });
            }
        }
    }
    anomalies
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::fixtures::{claim, commit, op};

    #[test]
    fn a_duplicate_needs_a_commit_sent_before_it_returned() {
        let duplicate = Outcome::Answered(Answer::Duplicate { holder: "a".into() }, Decided::Local);
        let queued = Outcome::Answered(Answer::Queued, Decided::Local);
        let explained = [
            op(0, commit("a"), (0, 10), queued.clone()),
            op(1, claim("b"), (5, 20), duplicate.clone()),
        ];
        assert!(duplicates_without_a_commit(&explained).is_empty());
        let late = [
            op(0, claim("b"), (0, 10), duplicate.clone()),
            op(1, commit("a"), (20, 30), queued),
        ];
        assert_eq!(duplicates_without_a_commit(&late).len(), 1);
        let refused = [
            op(
                0,
                commit("a"),
                (0, 10),
                Outcome::Answered(Answer::Conflict { holder: "x".into() }, Decided::Fleet),
            ),
            op(1, claim("b"), (20, 30), duplicate),
        ];
        assert_eq!(duplicates_without_a_commit(&refused).len(), 1);
    }

    #[test]
    fn a_fleet_allowed_after_an_acknowledged_commit_is_a_lost_claim() {
        let settled = Outcome::Answered(Answer::Settled, Decided::Fleet);
        let allowed = |by| Outcome::Answered(Answer::Allowed, by);
        let history = [
            op(0, commit("a"), (0, 10), settled),
            op(1, claim("b"), (5, 15), allowed(Decided::Fleet)),
            op(2, claim("c"), (20, 30), allowed(Decided::Local)),
            op(3, claim("d"), (40, 50), allowed(Decided::Fleet)),
        ];
        let lost = committed_claims_lost(&history);
        assert_eq!(lost.len(), 1, "{lost:?}");
        assert_eq!(lost[0].ops, vec![0, 3]);
    }
}
