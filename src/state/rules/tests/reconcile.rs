//! ReconcileCommit (contract §7: a queued commit handed to the fleet).

use super::*;

fn reconcile_commit(key: &ClaimKey, hook_id: &str, node: NodeId) -> Command {
    Command::ReconcileCommit {
        key: key.clone(),
        hook_id: HookId::from(hook_id),
        ttl_ms: 5_000,
        node,
    }
}

fn pending_by(key: &ClaimKey, hook_id: &str, node: NodeId) -> Command {
    Command::Hit {
        charges: Vec::new(),
        claim: Some(ClaimRequest {
            key: key.clone(),
            hook_id: HookId::from(hook_id),
            ttl_ms: 5_000,
            pending_ttl_ms: 60_000,
        }),
        node,
    }
}

#[test]
fn a_reconciled_commit_replaces_a_late_pending_claim_of_its_own_node() {
    let key = ClaimKey {
        tenant: TenantId::from("t"),
        source_id: SourceId::from("s"),
        key: "k".into(),
    };
    let mut state = FleetState::default();
    apply_batch(&mut state, &[pending_by(&key, "retry", 7)], T0_US);
    let answers = apply_batch(&mut state, &[reconcile_commit(&key, "stored", 7)], T0_US);
    assert_eq!(answers, vec![Answer::Settle(SettleAnswer::Recreated)]);
    let record = state.claim(&key).expect("committed");
    assert_eq!(record.state, ClaimState::Committed);
    assert_eq!(record.hook_id, HookId::from("stored"));
}

/// Contract §7: a queued commit that reaches the fleet late wins over a pending claim
/// another hook took meanwhile on another node; that hook's later commit is a conflict.
/// A claim already committed for another hook is never replaced.
#[test]
fn a_reconciled_commit_wins_over_another_nodes_pending_claim_but_not_a_committed_one() {
    let key = ClaimKey {
        tenant: TenantId::from("t"),
        source_id: SourceId::from("s"),
        key: "k".into(),
    };
    let mut state = FleetState::default();
    apply_batch(&mut state, &[pending_by(&key, "theirs", 8)], T0_US);
    let answers = apply_batch(&mut state, &[reconcile_commit(&key, "mine", 7)], T0_US);
    assert_eq!(answers, vec![Answer::Settle(SettleAnswer::Recreated)]);
    let record = state.claim(&key).expect("committed");
    assert_eq!(
        (record.state, record.hook_id.clone()),
        (ClaimState::Committed, HookId::from("mine"))
    );
    let their_commit = Command::Settle {
        key: key.clone(),
        hook_id: HookId::from("theirs"),
        outcome: SettleOutcome::Commit,
        ttl_ms: 5_000,
        node: 8,
    };
    let conflict = Answer::Settle(SettleAnswer::Conflict {
        holder: HookId::from("mine"),
    });
    assert_eq!(
        apply_batch(&mut state, &[their_commit], T0_US),
        vec![conflict]
    );

    let answers = apply_batch(&mut state, &[reconcile_commit(&key, "late", 9)], T0_US);
    let conflict = Answer::Settle(SettleAnswer::Conflict {
        holder: HookId::from("mine"),
    });
    assert_eq!(answers, vec![conflict], "a committed claim stays");
    assert_eq!(
        state.claim(&key).expect("kept").hook_id,
        HookId::from("mine")
    );
}

fn absorb_round(node: NodeId, round: u64, increment_us: u64) -> Command {
    Command::AbsorbRound {
        node,
        round,
        charges: vec![charge(hooks("t"), increment_us, 60 * SEC_US)],
    }
}

/// Contract §7: a node's local charges are handed over once. A round proposed again (its
/// answer was lost, but it committed) is not absorbed again, nor is an older one; the next
/// round is, and each node's rounds count on their own. The rounds survive an image.
#[test]
fn an_absorb_round_is_charged_once_however_often_it_is_proposed() {
    let mut state = FleetState::default();
    apply_batch(&mut state, &[absorb_round(7, 5, SEC_US)], T0_US);
    assert_eq!(state.bucket_tat_us(&hooks("t")), Some(T0_US + SEC_US));
    let again = [absorb_round(7, 5, SEC_US), absorb_round(7, 4, SEC_US)];
    assert_eq!(
        apply_batch(&mut state, &again, T0_US),
        vec![Answer::Absorbed, Answer::Absorbed]
    );
    assert_eq!(
        state.bucket_tat_us(&hooks("t")),
        Some(T0_US + SEC_US),
        "round 5 again and round 4 charged nothing"
    );
    let next = [absorb_round(7, 6, SEC_US), absorb_round(8, 5, SEC_US)];
    apply_batch(&mut state, &next, T0_US);
    assert_eq!(state.bucket_tat_us(&hooks("t")), Some(T0_US + 3 * SEC_US));
    assert_eq!((state.absorbed_round(7), state.absorbed_round(8)), (6, 5));

    let mut restored = FleetState::from_image(state.image());
    assert_eq!(restored.digest(), state.digest());
    apply_batch(&mut restored, &[absorb_round(8, 5, SEC_US)], T0_US);
    assert_eq!(
        restored.bucket_tat_us(&hooks("t")),
        Some(T0_US + 3 * SEC_US),
        "a restored state still knows round 5 of node 8"
    );
}
