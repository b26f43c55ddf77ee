//! One node's bad wall clock (contract §3): a leader whose clock jumps 90 minutes stands
//! down, pending claims do not expire at once, and once its clock is back buckets refill
//! at real time; a clock off by less than `max_clock_offset_ms` changes nothing.

use tokio::time::Instant;

use crate::common::*;
use crate::FAULTS;
use ankusa_fleet::pb;

const TENANT: &str = "clock";
const MINUTE_MS: i64 = 60_000;

async fn set_clock(fleet: &Fleet, id: u64, offset_ms: i64) {
    let request = pb::internal::SetFaultsRequest {
        cluster_id: "ankusa-fleet".to_owned(),
        clock_offset_ms: offset_ms,
        ..Default::default()
    };
    fleet.send_faults(id, request).await;
}

/// One hit of `charge` (and `claim`) through node `id`: its outcome when the fleet decided
/// it, `None` when it was decided locally (no leader within its timeout).
async fn fleet_hit(
    fleet: &Fleet,
    id: u64,
    charge: pb::Charge,
    claim: Option<pb::Claim>,
) -> Option<Outcome> {
    let mut client = fleet.client(id).await;
    let request = pb::HitRequest {
        timeout_ms: 2_000,
        ..hit(vec![charge], claim)
    };
    let response = client
        .hit(request)
        .await
        .unwrap_or_else(|e| fleet.fail(&format!("hit through node {id}: {e}")))
        .into_inner();
    (response.decided_by == pb::DecidedBy::Fleet as i32).then(|| outcome(&response))
}

/// A claim of `key` by `hook_id`, pending for 10 minutes: far past the test's length, far
/// short of 90 minutes.
fn long_pending(key: &str, hook_id: &str) -> pb::Claim {
    pb::Claim {
        pending_ttl_ms: 600_000,
        ..claim(TENANT, key, hook_id)
    }
}

/// A bucket of one hit per second, burst one.
fn one_per_second(tenant: &str) -> pb::Charge {
    hooks(tenant, 1_000_000, 1_000_000)
}

/// Spends `tenant`'s one-per-second bucket through node `id`, then waits until it has
/// refilled: the fleet's time must move on at real time.
async fn bucket_refills(fleet: &Fleet, id: u64, tenant: &str) {
    fleet
        .wait_for(
            &format!("{tenant}: the first hit through node {id}"),
            || async {
                (fleet_hit(fleet, id, one_per_second(tenant), None).await == Some(Outcome::Allowed))
                    .then_some(())
            },
        )
        .await;
    match fleet_hit(fleet, id, one_per_second(tenant), None).await {
        Some(Outcome::RateLimited(_)) => {}
        other => fleet.fail(&format!("{tenant}: the second hit at once: {other:?}")),
    }
    let spent = Instant::now();
    fleet
        .wait_for(&format!("{tenant}: the bucket refills"), || async {
            (fleet_hit(fleet, id, one_per_second(tenant), None).await == Some(Outcome::Allowed))
                .then_some(())
        })
        .await;
    tracing::info!(
        tenant,
        refilled_ms = spent.elapsed().as_millis() as u64,
        "refilled"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_whose_clock_jumps_90_minutes_stands_down_and_time_keeps_its_pace() {
    init_tracing();
    let fleet = Fleet::start(3, FAULTS).await;
    let leader = fleet.wait_for_leader(&[1, 2, 3]).await;
    let follower = (1..=3).find(|id| *id != leader).expect("a follower");

    tracing::info!("--- a follower 200 ms ahead (below the 500 ms bound) changes nothing");
    set_clock(&fleet, follower, 200).await;
    let seen = fleet
        .wait_for("the follower's offset is known", || async {
            let status = fleet.status(follower).await?;
            (status.clock_offset_known && status.clock_offset_ms >= 150).then_some(status)
        })
        .await;
    assert!(!seen.degraded, "{seen:?}");
    bucket_refills(&fleet, follower, "clock-small-skew").await;
    assert_eq!(fleet.wait_for_leader(&[1, 2, 3]).await, leader);
    set_clock(&fleet, follower, 0).await;

    tracing::info!("--- a pending claim, then the leader's clock 90 minutes ahead");
    let key = "claimed-before-the-jump";
    let claimed = fleet_hit(
        &fleet,
        follower,
        one_per_second("clock-claims"),
        Some(long_pending(key, &hook_of(key))),
    )
    .await;
    assert_eq!(claimed, Some(Outcome::Allowed));
    set_clock(&fleet, leader, 90 * MINUTE_MS).await;
    let new_leader = fleet
        .wait_for("another node leads", || async {
            let mut leaders = Vec::new();
            for id in 1..=3 {
                leaders.push(fleet.status(id).await?.leader_id);
            }
            let first = leaders[0];
            (first != 0 && first != leader && leaders.iter().all(|l| *l == first)).then_some(first)
        })
        .await;
    let skewed = fleet
        .wait_for("the old leader reports its offset", || async {
            let status = fleet.status(leader).await?;
            (status.clock_offset_known && status.clock_offset_ms > 89 * MINUTE_MS).then_some(status)
        })
        .await;
    assert!(
        skewed.degraded && skewed.degraded_reason.contains("max_clock_offset_ms"),
        "{skewed:?}"
    );
    assert!(
        fleet.log_count(leader, "too far from the fleet's median") >= 1,
        "the old leader says why it stood down"
    );
    tracing::info!(new_leader, "a node with a sound clock leads");

    tracing::info!("--- the claim is still pending: the fleet's time did not jump with the clock");
    // Another hook's hit: the first hook's own retry would be allowed while pending.
    match fleet_hit(
        &fleet,
        new_leader,
        one_per_second("clock-claims-2"),
        Some(long_pending(key, crate::PROBE_HOOK)),
    )
    .await
    {
        Some(Outcome::Pending(_)) => {}
        other => fleet.fail(&format!("{key} after the jump: {other:?}")),
    }

    tracing::info!(
        "--- the clock back: it leads again if elected, and buckets refill at real time"
    );
    set_clock(&fleet, leader, 0).await;
    fleet
        .wait_for(
            "the old leader's clock is within the bound again",
            || async {
                let status = fleet.status(leader).await?;
                (status.clock_offset_known
                    && status.clock_offset_ms.abs() < 500
                    && !status.degraded)
                    .then_some(())
            },
        )
        .await;
    for id in 1..=3 {
        bucket_refills(&fleet, id, &format!("clock-after-{id}")).await;
    }
}
