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
