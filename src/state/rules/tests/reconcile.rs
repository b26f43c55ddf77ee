//! ReconcileCommit (SPEC section 7: a queued commit handed to the fleet).

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

#[test]
fn a_reconciled_commit_still_conflicts_with_other_nodes_and_commits() {
    let key = ClaimKey {
        tenant: TenantId::from("t"),
        source_id: SourceId::from("s"),
        key: "k".into(),
    };
    let mut state = FleetState::default();
    apply_batch(&mut state, &[pending_by(&key, "theirs", 8)], T0_US);
    let answers = apply_batch(&mut state, &[reconcile_commit(&key, "mine", 7)], T0_US);
    let conflict = Answer::Settle(SettleAnswer::Conflict {
        holder: HookId::from("theirs"),
    });
    assert_eq!(answers, vec![conflict]);
    assert_eq!(
        state.claim(&key).expect("kept").hook_id,
        HookId::from("theirs")
    );
}
