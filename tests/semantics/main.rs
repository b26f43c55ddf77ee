//! The answers of contract §4, 5, 6, 8, 10 and 11, checked from outside against a real
//! three-node fleet. One fleet per test function; each case inside uses its own tenants and
//! keys, and most run twice: once through the leader, once through a follower (which
//! forwards to the leader and relays the answer).
//!
//! Time is real here: between two calls the leader's clock moves on, so every bound on a
//! `retry_after_ms` is derived from the elapsed time measured around the calls.

#[path = "../common/mod.rs"]
mod common;

mod hit_batch;
mod hit_stream;
mod hits;
mod one_fleet;
mod scopes;
mod settle_reset_check_rate;

use ankusa_fleet::pb;
use ankusa_fleet::pb::fleet_client::FleetClient;
use common::*;
use tokio::time::Instant;
use tonic::transport::Channel;

pub(crate) type Client = FleetClient<Channel>;

pub(crate) const SECOND_US: u64 = 1_000_000;
/// One increment of a [`slow`] bucket: no test run outlasts it, so it never refills.
const SLOW_INCREMENT_US: u64 = 60 * SECOND_US;

/// A hooks bucket with a budget of `hits` that does not refill during a test.
pub(crate) fn slow(tenant: &str, hits: u64) -> pb::Charge {
    hooks(tenant, SLOW_INCREMENT_US, hits * SLOW_INCREMENT_US)
}

/// Same as [`slow`], for the bytes kind.
pub(crate) fn slow_bytes(tenant: &str, hits: u64) -> pb::Charge {
    bytes(tenant, SLOW_INCREMENT_US, hits * SLOW_INCREMENT_US)
}

pub(crate) fn elapsed_ms(started: Instant) -> u64 {
    u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX)
}

/// The honest range of a retry that would be `full_ms` if every call landed at one instant,
/// when up to `elapsed_ms` of real time (plus rounding) passed between them.
pub(crate) fn drained(full_ms: u64, elapsed_ms: u64) -> std::ops::RangeInclusive<u64> {
    full_ms.saturating_sub(elapsed_ms + 1).max(1)..=full_ms
}

/// The leader and one follower, with a label for the phase lines.
pub(crate) async fn entries(fleet: &Fleet) -> Vec<(&'static str, u64)> {
    let leader = fleet.wait_for_leader(&[1, 2, 3]).await;
    let follower = (1..=3).find(|id| *id != leader).expect("a follower");
    vec![("leader", leader), ("follower", follower)]
}

pub(crate) async fn fleet_hit(
    client: &mut Client,
    charges: Vec<pb::Charge>,
    claim: Option<pb::Claim>,
) -> Outcome {
    let response = send_hit_full(client, hit(charges, claim)).await;
    assert_eq!(
        response.decided_by,
        pb::DecidedBy::Fleet as i32,
        "a fleet-scope hit on a healthy fleet is decided by the fleet: {response:?}"
    );
    outcome(&response)
}

/// Spends a bucket's whole remaining budget: exactly `hits` pass, the next is denied.
pub(crate) async fn assert_budget(client: &mut Client, charge: &pb::Charge, hits: u64, what: &str) {
    for i in 0..hits {
        let answer = fleet_hit(client, vec![charge.clone()], None).await;
        assert_eq!(answer, Outcome::Allowed, "{what}: hit {i} of {hits}");
    }
    let answer = fleet_hit(client, vec![charge.clone()], None).await;
    assert!(
        matches!(answer, Outcome::RateLimited(_)),
        "{what}: hit {hits} is over the budget, got {answer:?}"
    );
}

/// Commits `key` for `hook` through a node other than `id`, and checks it settled.
pub(crate) async fn commit_through_another_node(
    fleet: &Fleet,
    id: u64,
    tenant: &str,
    key: &str,
    hook: &str,
) {
    let other = (1..=3).find(|other| *other != id).expect("another node");
    let mut other_client = fleet.client(other).await;
    let settled = fleet_settle(
        &mut other_client,
        tenant,
        key,
        hook,
        pb::SettleOutcome::Commit,
    )
    .await;
    assert_eq!(settled, (pb::SettleStatus::Settled, String::new()));
}

pub(crate) async fn fleet_settle(
    client: &mut Client,
    tenant: &str,
    key: &str,
    hook_id: &str,
    outcome: pb::SettleOutcome,
) -> (pb::SettleStatus, String) {
    let response = send_settle(client, settle(tenant, key, hook_id, outcome)).await;
    assert_eq!(
        response.decided_by,
        pb::DecidedBy::Fleet as i32,
        "a fleet-scope settle on a healthy fleet is decided by the fleet: {response:?}"
    );
    let status = pb::SettleStatus::try_from(response.status).expect("a known settle status");
    (status, response.holder_hook_id)
}

/// Takes `key` for `hook_id` (pending) and commits it.
pub(crate) async fn commit_claim(client: &mut Client, tenant: &str, key: &str, hook_id: &str) {
    let answer = fleet_hit(client, vec![], Some(claim(tenant, key, hook_id))).await;
    assert_eq!(
        answer,
        Outcome::Allowed,
        "{tenant}/{key} is free for {hook_id}"
    );
    let settled = fleet_settle(client, tenant, key, hook_id, pb::SettleOutcome::Commit).await;
    assert_eq!(settled, (pb::SettleStatus::Settled, String::new()));
}

/// The same request, with both scopes `node`.
pub(crate) fn node_hit(mut request: pb::HitRequest) -> pb::HitRequest {
    request.rate_limit_scope = pb::Scope::Node as i32;
    request.dedupe_scope = pb::Scope::Node as i32;
    request
}
