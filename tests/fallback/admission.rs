//! How much a partition over-admits: a bucket spent on both sides of it, under each
//! fallback budget, and the local grants the fleet accounts for once reconciled.

use ankusa_fleet::pb;
use ankusa_fleet::pb::internal::FaultKind;

use crate::common::*;
use crate::support::wait_reconciled;
use crate::{decided, FAULTS};

/// Hits through node `id` until one is rate limited (at most `limit` + 1 hits); every
/// answer must be decided as `decided_by`. Returns how many were allowed.
async fn spend_until_denied(
    fleet: &Fleet,
    id: u64,
    charge: &pb::Charge,
    limit: u64,
    timeout_ms: u32,
    decided_by: &str,
) -> u64 {
    let mut client = fleet.client(id).await;
    for allowed in 0..=limit {
        let request = pb::HitRequest {
            timeout_ms,
            ..hit(vec![charge.clone()], None)
        };
        let response = send_hit_full(&mut client, request).await;
        let got = (outcome(&response), decided(response.decided_by));
        if got.1 != decided_by {
            fleet.fail(&format!("node {id}: charge {allowed} answered {got:?}"));
        }
        match got.0 {
            Outcome::Allowed => {}
            Outcome::RateLimited(_) => return allowed,
            other => fleet.fail(&format!("node {id}: charge answered {other:?}")),
        }
    }
    fleet.fail(&format!("node {id}: more than {limit} charges allowed"))
}

/// The counts of one partition, per bucket.
#[derive(Debug)]
struct Admitted {
    /// Bucket spent on both sides: allowed by the isolated node, then by the majority.
    local: u64,
    majority: u64,
    /// Bucket spent on the isolated node only, then through the fleet after reconciling.
    local_only: u64,
    fleet_after: u64,
}

/// With buckets of `capacity` hooks (one per hour: nothing refills during the test), a
/// follower is isolated; counts what it allows locally and what the majority allows, then
/// what the fleet still allows of a bucket the isolated node alone spent, once reconciled.
async fn over_admission(budget: &str, capacity: u64) -> Admitted {
    const HOUR_US: u64 = 3_600_000_000;
    const TIMEOUT_MS: u32 = 100;
    let fleet = Fleet::start(3, &format!("{FAULTS}\n{budget}")).await;
    let leader = fleet.wait_for_leader(&[1, 2, 3]).await;
    let isolated = (1..=3).find(|id| *id != leader).expect("a follower");
    let shared = hooks("both-sides", HOUR_US, capacity * HOUR_US);
    let absorbed = hooks("cut-side", HOUR_US, capacity * HOUR_US);
    let limit = 2 * capacity;

    tracing::info!("--- drop every peer of follower {isolated}; spend a bucket on both sides");
    fleet.isolate(isolated, FaultKind::Drop).await;
    let local = spend_until_denied(&fleet, isolated, &shared, limit, TIMEOUT_MS, "local").await;
    let majority =
        spend_until_denied(&fleet, leader, &shared, limit, CALL_TIMEOUT_MS, "fleet").await;
    let local_only =
        spend_until_denied(&fleet, isolated, &absorbed, limit, TIMEOUT_MS, "local").await;
    if majority != capacity {
        fleet.fail(&format!(
            "the majority allowed {majority} of a fresh bucket of {capacity}"
        ));
    }

    tracing::info!("--- heal: the local grants are handed to the fleet and spend its budget");
    fleet.heal(isolated).await;
    fleet.wait_for_leader(&[1, 2, 3]).await;
    wait_reconciled(&fleet, isolated).await;
    let fleet_after =
        spend_until_denied(&fleet, leader, &absorbed, limit, CALL_TIMEOUT_MS, "fleet").await;
    let admitted = Admitted {
        local,
        majority,
        local_only,
        fleet_after,
    };
    tracing::info!(budget, capacity, ?admitted, "allowed around the partition");
    admitted
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_admission_under_fair_share_is_at_most_one_share() {
    init_tracing();
    const CAPACITY: u64 = 30;
    let admitted = over_admission("", CAPACITY).await;
    let bound = CAPACITY + CAPACITY.div_ceil(3) + 1;
    assert!(admitted.local >= 1, "the isolated node allowed nothing");
    assert!(
        admitted.local + admitted.majority <= bound,
        "fair_share: {admitted:?}, bound {bound} during the partition"
    );
    assert!(
        admitted.local_only + admitted.fleet_after <= CAPACITY + 1,
        "fair_share: {admitted:?}: the fleet did not account for the local grants"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_admission_under_full_budget_is_at_most_one_budget() {
    init_tracing();
    const CAPACITY: u64 = 30;
    let admitted = over_admission("fallback_budget = \"full\"", CAPACITY).await;
    let bound = 2 * CAPACITY + 1;
    assert!(admitted.local >= 1, "the isolated node allowed nothing");
    assert!(
        admitted.local + admitted.majority <= bound,
        "full: {admitted:?}, bound {bound} during the partition"
    );
    assert!(
        admitted.local_only + admitted.fleet_after <= CAPACITY + 1,
        "full: {admitted:?}: the fleet did not account for the local grants"
    );
}
