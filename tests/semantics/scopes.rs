//! contract §8: node scope, and hits whose charges and claim have different scopes.

use ankusa_fleet::pb;

use crate::common::*;
use crate::{assert_budget, entries, fleet_hit, node_hit, slow, Client};

/// Sends a node-scope hit and checks it says so.
async fn local_hit(
    client: &mut Client,
    charges: Vec<pb::Charge>,
    claim: Option<pb::Claim>,
) -> Outcome {
    let response = send_hit_full(client, node_hit(hit(charges, claim))).await;
    assert_eq!(
        (response.decided_by, response.local_reason.as_str()),
        (pb::DecidedBy::Local as i32, "node scope"),
        "{response:?}"
    );
    outcome(&response)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_scope_stays_on_its_node() {
    init_tracing();
    let fleet = Fleet::start(3, "").await;
    let entries = entries(&fleet).await;
    let before = fleet.wait_for_applied_in_step(&[1, 2, 3]).await;

    for (role, id) in &entries {
        let (role, id) = (*role, *id);
        let other = (1..=3).find(|o| *o != id).expect("another node");
        let mut client = fleet.client(id).await;
        let mut other_client = fleet.client(other).await;
        let tenant = format!("node-{role}");

        tracing::info!(
            role,
            "--- contract §8: node-scope charges are decided locally"
        );
        let charge = slow(&tenant, 2);
        for _ in 0..2 {
            let answer = local_hit(&mut client, vec![charge.clone()], None).await;
            assert_eq!(answer, Outcome::Allowed);
        }
        let answer = local_hit(&mut client, vec![charge.clone()], None).await;
        assert!(matches!(answer, Outcome::RateLimited(_)), "{answer:?}");
        tracing::info!(
            role,
            "--- contract §8: another node's node-local bucket is its own"
        );
        let answer = local_hit(&mut other_client, vec![charge.clone()], None).await;
        assert_eq!(
            answer,
            Outcome::Allowed,
            "node {other} never saw node {id}'s charges"
        );

        tracing::info!(
            role,
            "--- contract §8: node-scope claims live in the node's own index"
        );
        let answer = local_hit(&mut client, vec![], Some(claim(&tenant, "evt", "hook-a"))).await;
        assert_eq!(answer, Outcome::Allowed);
        let answer = local_hit(&mut client, vec![], Some(claim(&tenant, "evt", "hook-b"))).await;
        assert!(matches!(answer, Outcome::Pending(_)), "{answer:?}");
        let answer = local_hit(
            &mut other_client,
            vec![],
            Some(claim(&tenant, "evt", "hook-b")),
        )
        .await;
        assert_eq!(
            answer,
            Outcome::Allowed,
            "node {other} never saw node {id}'s claim"
        );
        let mut commit = settle(&tenant, "evt", "hook-a", pb::SettleOutcome::Commit);
        commit.dedupe_scope = pb::Scope::Node as i32;
        let settled = send_settle(&mut client, commit).await;
        assert_eq!(settled.status, pb::SettleStatus::Settled as i32);
        assert_eq!(settled.decided_by, pb::DecidedBy::Local as i32);
        let answer = local_hit(&mut client, vec![], Some(claim(&tenant, "evt", "hook-c"))).await;
        assert_eq!(answer, Outcome::Duplicate("hook-a".to_owned()));

        tracing::info!(
            role,
            "--- contract §8: node-scope check_rate is decided locally"
        );
        let mut request = check_rate(&tenant, "send", 1, 60_000);
        request.scope = pb::Scope::Node as i32;
        let answer = send_check_rate(&mut client, request.clone()).await;
        assert!(answer.allowed);
        assert_eq!(answer.decided_by, pb::DecidedBy::Local as i32);
        let answer = send_check_rate(&mut client, request).await;
        assert!(!answer.allowed && answer.retry_after_ms >= 1, "{answer:?}");
    }

    tracing::info!("--- contract §8: nothing of the above went through Raft");
    let after = fleet.wait_for_applied_in_step(&[1, 2, 3]).await;
    let mut leader_client = fleet.client(entries[0].1).await;
    assert_eq!(
        fleet_hit(&mut leader_client, vec![], None).await,
        Outcome::Allowed
    );
    let marked = fleet.wait_for_applied_in_step(&[1, 2, 3]).await;
    match (after.entries_since(before), marked.entries_since(after)) {
        (Some(during), Some(marker)) => {
            assert_eq!(during, 0, "node-scope requests appended no log entry");
            assert_eq!(
                marker, 1,
                "the fleet-scope marker hit is one entry (the check can fail)"
            );
        }
        _ => tracing::warn!(
            ?before,
            ?after,
            ?marked,
            "an election happened; index check skipped"
        ),
    }

    for (role, id) in &entries {
        let mut client = fleet.client(*id).await;
        let tenant = format!("node-{role}");
        tracing::info!(
            role,
            "--- contract §8: the fleet never saw the node-scope state"
        );
        assert_budget(&mut client, &slow(&tenant, 2), 2, "fleet bucket").await;
        let answer = fleet_hit(&mut client, vec![], Some(claim(&tenant, "evt", "hook-x"))).await;
        assert_eq!(answer, Outcome::Allowed, "fleet claim index");
        let answer = send_check_rate(&mut client, check_rate(&tenant, "send", 1, 60_000)).await;
        assert!(answer.allowed, "fleet entity bucket");
    }
}

/// A hit with its charges in one scope and its claim in the other.
fn mixed_hit(
    charges: Vec<pb::Charge>,
    charges_scope: pb::Scope,
    claim: pb::Claim,
    claim_scope: pb::Scope,
) -> pb::HitRequest {
    pb::HitRequest {
        rate_limit_scope: charges_scope as i32,
        dedupe_scope: claim_scope as i32,
        ..hit(charges, Some(claim))
    }
}

/// Sends the same kind of mixed-scope hit for each of `claims` at once; the outcomes.
/// Every answer says `local`, its reason naming the node-scoped part (contract §8: one
/// part in each scope is not a fleet-wide decision).
async fn mixed_race(
    client: &Client,
    charge: &pb::Charge,
    (charges_scope, claim_scope): (pb::Scope, pb::Scope),
    claims: Vec<pb::Claim>,
) -> Vec<Outcome> {
    let node_part = if claim_scope == pb::Scope::Node {
        "node scope: claim"
    } else {
        "node scope: charges"
    };
    let racers = claims.into_iter().map(|claim| {
        let mut client = client.clone();
        let request = mixed_hit(vec![charge.clone()], charges_scope, claim, claim_scope);
        async move {
            let response = send_hit_full(&mut client, request).await;
            assert_eq!(
                response.decided_by,
                pb::DecidedBy::Local as i32,
                "{response:?}"
            );
            assert!(
                response.local_reason.starts_with(node_part),
                "the reason names {node_part:?}: {response:?}"
            );
            outcome(&response)
        }
    });
    futures::future::join_all(racers).await
}

fn count(outcomes: &[Outcome], which: fn(&Outcome) -> bool) -> usize {
    outcomes.iter().filter(|outcome| which(outcome)).count()
}

/// contract §5 makes a hit one atomic decision, also when its charges and its claim are
/// in different scopes (section 8): concurrent hits never both pass a budget with room for
/// one, a hit that is not allowed spends nothing, and a retry of the same hook is not
/// charged again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mixed_scope_hits_are_one_decision() {
    use pb::Scope::{Fleet as F, Node as N};
    init_tracing();
    let fleet = Fleet::start(3, "").await;
    let leader = fleet.wait_for_leader(&[1, 2, 3]).await;
    // Through the leader: its replica has every claim it answered for.
    let mut client = fleet.client(leader).await;
    let allowed = |o: &Outcome| *o == Outcome::Allowed;
    let pending = |o: &Outcome| matches!(o, Outcome::Pending(_));
    let limited = |o: &Outcome| matches!(o, Outcome::RateLimited(_));

    tracing::info!("--- fleet charges, node claim: eight hooks race for one key");
    let charge = slow("mixed-fleet", 2);
    let hooks: Vec<pb::Claim> = (0..8)
        .map(|i| claim("mixed-fleet", "evt", &format!("hook-{i}")))
        .collect();
    let answers = mixed_race(&client, &charge, (F, N), hooks).await;
    assert_eq!(
        (count(&answers, allowed), count(&answers, pending)),
        (1, 7),
        "one takes the claim, the others wait for it: {answers:?}"
    );
    let other_key = claim("mixed-fleet", "evt-2", "hook-x");
    let answers = mixed_race(&client, &charge, (F, N), vec![other_key]).await;
    assert_eq!(
        answers,
        [Outcome::Allowed],
        "the seven pending hits spent nothing of the budget of two"
    );

    tracing::info!("--- node charges, fleet claim: four keys race for a budget of one");
    let charge = slow("mixed-node", 1);
    let keys: Vec<pb::Claim> = (0..4)
        .map(|i| claim("mixed-node", &format!("evt-{i}"), "hook"))
        .collect();
    let answers = mixed_race(&client, &charge, (N, F), keys).await;
    assert_eq!(
        (count(&answers, allowed), count(&answers, limited)),
        (1, 3),
        "exactly the node budget passes: {answers:?}"
    );

    tracing::info!("--- node charges, fleet claim: a retry and a pending hit spend nothing");
    let charge = slow("mixed-retry", 2);
    let first = claim("mixed-retry", "evt", "hook-1");
    let send = |claim: pb::Claim| mixed_hit(vec![charge.clone()], N, claim, F);
    let mut answers = Vec::new();
    for request in [
        send(first.clone()),
        send(first),
        send(claim("mixed-retry", "evt", "hook-2")),
        send(claim("mixed-retry", "evt-2", "hook-3")),
        send(claim("mixed-retry", "evt-3", "hook-4")),
    ] {
        answers.push(outcome(&send_hit_full(&mut client, request).await));
    }
    assert!(
        matches!(
            answers.as_slice(),
            [
                Outcome::Allowed,
                Outcome::Allowed,
                Outcome::Pending(_),
                Outcome::Allowed,
                Outcome::RateLimited(_)
            ]
        ),
        "first, its retry, another hook's pending, a second key (the budget's second hit), \
         a third key (over budget): {answers:?}"
    );
}
