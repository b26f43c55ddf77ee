//! The answers of SPEC sections 4, 5, 6, 8, 10 and 11, checked from outside against a real
//! three-node fleet. One fleet per test function; each case inside uses its own tenants and
//! keys, and most run twice: once through the leader, once through a follower (which
//! forwards to the leader and relays the answer).
//!
//! Time is real here: between two calls the leader's clock moves on, so every bound on a
//! `retry_after_ms` is derived from the elapsed time measured around the calls.

mod common;

use ankusa_fleet::pb;
use ankusa_fleet::pb::fleet_client::FleetClient;
use common::*;
use tokio::time::Instant;
use tonic::transport::Channel;

type Client = FleetClient<Channel>;

const SECOND_US: u64 = 1_000_000;
/// One increment of a [`slow`] bucket: no test run outlasts it, so it never refills.
const SLOW_INCREMENT_US: u64 = 60 * SECOND_US;
/// A claim ttl short enough to wait out, long enough that two calls on a loaded machine
/// still see the claim before it expires.
const SHORT_TTL_MS: u64 = 1_000;

/// A hooks bucket with a budget of `hits` that does not refill during a test.
fn slow(tenant: &str, hits: u64) -> pb::Charge {
    hooks(tenant, SLOW_INCREMENT_US, hits * SLOW_INCREMENT_US)
}

/// Same as [`slow`], for the bytes kind.
fn slow_bytes(tenant: &str, hits: u64) -> pb::Charge {
    bytes(tenant, SLOW_INCREMENT_US, hits * SLOW_INCREMENT_US)
}

fn elapsed_ms(started: Instant) -> u64 {
    u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX)
}

/// The honest range of a retry that would be `full_ms` if every call landed at one instant,
/// when up to `elapsed_ms` of real time (plus rounding) passed between them.
fn drained(full_ms: u64, elapsed_ms: u64) -> std::ops::RangeInclusive<u64> {
    full_ms.saturating_sub(elapsed_ms + 1).max(1)..=full_ms
}

/// The leader and one follower, with a label for the phase lines.
async fn entries(fleet: &Fleet) -> Vec<(&'static str, u64)> {
    let leader = fleet.wait_for_leader(&[1, 2, 3]).await;
    let follower = (1..=3).find(|id| *id != leader).expect("a follower");
    vec![("leader", leader), ("follower", follower)]
}

async fn fleet_hit(
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
async fn assert_budget(client: &mut Client, charge: &pb::Charge, hits: u64, what: &str) {
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

async fn fleet_settle(
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
async fn commit_claim(client: &mut Client, tenant: &str, key: &str, hook_id: &str) {
    let answer = fleet_hit(client, vec![], Some(claim(tenant, key, hook_id))).await;
    assert_eq!(
        answer,
        Outcome::Allowed,
        "{tenant}/{key} is free for {hook_id}"
    );
    let settled = fleet_settle(client, tenant, key, hook_id, pb::SettleOutcome::Commit).await;
    assert_eq!(settled, (pb::SettleStatus::Settled, String::new()));
}

// ---------------------------------------------------------------------------------------
// SPEC sections 4 and 5
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hits_follow_gcra_and_the_claim_steps() {
    init_tracing();
    let fleet = Fleet::start(3, "").await;
    for (role, id) in entries(&fleet).await {
        let mut client = fleet.client(id).await;
        let tag = format!("hit-{role}");
        gcra_example(&mut client, &tag, role).await;
        gcra_denials_write_nothing(&mut client, &tag, role).await;
        rate_limited_beats_duplicate(&mut client, &tag, role).await;
        duplicate_spends_nothing(&mut client, &tag, role).await;
        pending_for_another_hook(&mut client, &tag, role).await;
        pending_for_the_same_hook(&mut client, &tag, role).await;
        empty_hit(&mut client, role).await;
    }
}

async fn gcra_example(client: &mut Client, tag: &str, role: &str) {
    tracing::info!(role, "--- SPEC 4: 10/s burst 10 (the exact example)");
    // Eleven charges are sent together so they land (nearly) at one instant: ten pass and
    // the last in log order waits 100 ms minus the real time between the first stamp and
    // its own (at most the elapsed time measured here). When a loaded machine spreads
    // them over 100 ms or more, the eleventh passes honestly, and the attempt is repeated
    // on a fresh tenant. The same rule scaled up, where time cannot interfere, is checked
    // in `gcra_denials_write_nothing`.
    let mut slow_attempts_ms = Vec::new();
    for attempt in 0..10 {
        let charge = hooks(&format!("{tag}-gcra-{attempt}"), 100_000, 1_000_000);
        let started = Instant::now();
        let eleven = (0..11).map(|_| {
            let mut client = client.clone();
            let charge = charge.clone();
            async move { fleet_hit(&mut client, vec![charge], None).await }
        });
        let answers = futures::future::join_all(eleven).await;
        let elapsed = elapsed_ms(started);
        let allowed = answers.iter().filter(|a| **a == Outcome::Allowed).count();
        let denied: Vec<u64> = answers
            .iter()
            .filter_map(|a| match a {
                Outcome::RateLimited(retry_after_ms) => Some(*retry_after_ms),
                _ => None,
            })
            .collect();
        assert_eq!(allowed + denied.len(), 11, "charges only: {answers:?}");
        if allowed == 11 {
            assert!(
                elapsed >= 100,
                "eleven passed within {elapsed} ms: {answers:?}"
            );
            slow_attempts_ms.push(elapsed);
            continue;
        }
        assert_eq!(allowed, 10, "the burst is ten: {answers:?}");
        tracing::info!(
            attempt,
            elapsed,
            retry_after_ms = denied[0],
            "eleventh denied"
        );
        assert!(
            drained(100, elapsed).contains(&denied[0]),
            "retry_after_ms {} after {elapsed} ms",
            denied[0]
        );
        return;
    }
    panic!("every attempt was spread over 100 ms or more: {slow_attempts_ms:?} ms");
}

async fn gcra_denials_write_nothing(client: &mut Client, tag: &str, role: &str) {
    tracing::info!(
        role,
        "--- SPEC 4 scaled by 100: ten pass, the eleventh waits ~10 s"
    );
    let charge = hooks(
        &format!("{tag}-gcra-scaled"),
        10 * SECOND_US,
        100 * SECOND_US,
    );
    let started = Instant::now();
    for i in 0..10 {
        let answer = fleet_hit(client, vec![charge.clone()], None).await;
        assert_eq!(answer, Outcome::Allowed, "charge {i} is within the burst");
    }
    let eleventh = fleet_hit(client, vec![charge.clone()], None).await;
    let elapsed = elapsed_ms(started);
    let Outcome::RateLimited(first_retry_ms) = eleventh else {
        panic!("the eleventh is denied, got {eleventh:?}");
    };
    assert!(
        drained(10_000, elapsed).contains(&first_retry_ms),
        "retry_after_ms {first_retry_ms} after {elapsed} ms"
    );

    tracing::info!(
        role,
        "--- a denied charge moves no TAT: the next denial waits no longer"
    );
    let twelfth = fleet_hit(client, vec![charge.clone()], None).await;
    let Outcome::RateLimited(second_retry_ms) = twelfth else {
        panic!("the twelfth is denied too, got {twelfth:?}");
    };
    assert!(
        second_retry_ms <= first_retry_ms,
        "a denial that wrote would push the retry to ~20 s: {first_retry_ms} then {second_retry_ms}"
    );

    tracing::info!(
        role,
        "--- SPEC 5.2: one denied charge stops the others and the claim"
    );
    let fresh = slow(&format!("{tag}-deny-fresh"), 2);
    let long_denied = slow(&format!("{tag}-deny-long"), 1);
    let short_denied = hooks(&format!("{tag}-deny-short"), 10 * SECOND_US, 10 * SECOND_US);
    let started = Instant::now();
    for spent in [&long_denied, &short_denied] {
        let answer = fleet_hit(client, vec![spent.clone()], None).await;
        assert_eq!(answer, Outcome::Allowed);
    }
    let key = format!("{tag}-deny-key");
    let denied = fleet_hit(
        client,
        vec![fresh.clone(), short_denied, long_denied],
        Some(claim(&format!("{tag}-deny"), &key, "hook-a")),
    )
    .await;
    let Outcome::RateLimited(retry_after_ms) = denied else {
        panic!("two charges over budget deny the hit, got {denied:?}");
    };
    // The largest retry over the denied charges: ~60 s (the short one alone says ~10 s).
    let elapsed = elapsed_ms(started);
    assert!(
        drained(60_000, elapsed).contains(&retry_after_ms),
        "retry_after_ms {retry_after_ms} is the largest over the denied charges"
    );
    let claimed = fleet_hit(
        client,
        vec![],
        Some(claim(&format!("{tag}-deny"), &key, "hook-b")),
    )
    .await;
    assert_eq!(claimed, Outcome::Allowed, "the denied hit took no claim");
    assert_budget(client, &fresh, 2, "the denied hit spent no charge").await;
}

async fn rate_limited_beats_duplicate(client: &mut Client, tag: &str, role: &str) {
    tracing::info!(
        role,
        "--- SPEC 5.2 before 5.3: rate_limited beats duplicate"
    );
    let tenant = format!("{tag}-rl-dup");
    commit_claim(client, &tenant, "evt", "hook-a").await;
    let charge = slow(&tenant, 1);
    assert_eq!(
        fleet_hit(client, vec![charge.clone()], None).await,
        Outcome::Allowed
    );
    let answer = fleet_hit(client, vec![charge], Some(claim(&tenant, "evt", "hook-b"))).await;
    assert!(
        matches!(answer, Outcome::RateLimited(_)),
        "charges are judged before the claim: {answer:?}"
    );
}

async fn duplicate_spends_nothing(client: &mut Client, tag: &str, role: &str) {
    tracing::info!(
        role,
        "--- SPEC 5.3: committed → duplicate{{holder}}, no charge spent"
    );
    let tenant = format!("{tag}-dup");
    commit_claim(client, &tenant, "evt", "hook-a").await;
    let charge = slow(&tenant, 2);
    for hook_id in ["hook-b", "hook-a"] {
        let answer = fleet_hit(
            client,
            vec![charge.clone()],
            Some(claim(&tenant, "evt", hook_id)),
        )
        .await;
        assert_eq!(
            answer,
            Outcome::Duplicate("hook-a".to_owned()),
            "{hook_id} on a committed claim"
        );
    }
    assert_budget(client, &charge, 2, "duplicates spent no charge").await;
}

async fn pending_for_another_hook(client: &mut Client, tag: &str, role: &str) {
    tracing::info!(
        role,
        "--- SPEC 5.3: pending for another hook → pending{{time left}}"
    );
    let tenant = format!("{tag}-pend-other");
    let holder = claim(&tenant, "evt", "hook-a"); // pending_ttl_ms 60_000
    assert_eq!(
        fleet_hit(client, vec![], Some(holder)).await,
        Outcome::Allowed
    );
    let charge = slow(&tenant, 2);
    let mut other = claim(&tenant, "evt", "hook-b");
    other.pending_ttl_ms = 10 * 86_400_000; // the holder's expiry counts, not this one
    let answer = fleet_hit(client, vec![charge.clone()], Some(other)).await;
    let Outcome::Pending(retry_after_ms) = answer else {
        panic!("another hook's pending claim blocks, got {answer:?}");
    };
    assert!(
        (1..=60_000).contains(&retry_after_ms),
        "retry_after_ms {retry_after_ms} is the time left on the holder's pending claim"
    );
    assert_budget(client, &charge, 2, "a pending answer spent no charge").await;
}

async fn pending_for_the_same_hook(client: &mut Client, tag: &str, role: &str) {
    tracing::info!(
        role,
        "--- SPEC 5.3: the same hook retried → allowed, not charged again"
    );
    let tenant = format!("{tag}-pend-same");
    let charge = slow(&tenant, 2);
    let own = claim(&tenant, "evt", "hook-a");
    let first = fleet_hit(client, vec![charge.clone()], Some(own.clone())).await;
    assert_eq!(first, Outcome::Allowed);
    let before = fleet_hit(client, vec![], Some(claim(&tenant, "evt", "hook-b"))).await;
    let Outcome::Pending(before_ms) = before else {
        panic!("hook-a holds the claim, got {before:?}");
    };
    let retried = fleet_hit(client, vec![charge.clone()], Some(own)).await;
    assert_eq!(retried, Outcome::Allowed, "the edge retried the same hook");
    let after = fleet_hit(client, vec![], Some(claim(&tenant, "evt", "hook-b"))).await;
    let Outcome::Pending(after_ms) = after else {
        panic!("hook-a still holds the claim, got {after:?}");
    };
    assert!(
        after_ms <= before_ms,
        "a retry does not extend the pending expiry: {before_ms} ms then {after_ms} ms"
    );
    assert_budget(client, &charge, 1, "the retry was not charged again").await;
}

async fn empty_hit(client: &mut Client, role: &str) {
    tracing::info!(
        role,
        "--- SPEC 5: a hit with neither charges nor claim is allowed"
    );
    assert_eq!(fleet_hit(client, vec![], None).await, Outcome::Allowed);
}

// ---------------------------------------------------------------------------------------
// SPEC sections 6, 10 and 11
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settle_reset_and_check_rate_follow_the_contract() {
    init_tracing();
    let fleet = Fleet::start(3, "").await;
    for (role, id) in entries(&fleet).await {
        let mut client = fleet.client(id).await;
        let tag = format!("settle-{role}");
        commit_branches(&mut client, &tag, role).await;
        release_branches(&mut client, &tag, role).await;
        reset_forgets_buckets_only(&mut client, &tag, role).await;
        check_rate_answers(&mut client, &tag, role).await;
        check_rate_telemetry(&fleet, id, &tag, role).await;
    }
}

async fn commit_branches(client: &mut Client, tag: &str, role: &str) {
    use pb::SettleOutcome::Commit;
    use pb::SettleStatus::{Conflict, Recreated, Settled};
    let tenant = format!("{tag}-commit");
    let none = String::new;

    tracing::info!(role, "--- SPEC 6 commit: pending for the hook → settled");
    let taken = fleet_hit(client, vec![], Some(claim(&tenant, "own", "hook-a"))).await;
    assert_eq!(taken, Outcome::Allowed);
    let settled = fleet_settle(client, &tenant, "own", "hook-a", Commit).await;
    assert_eq!(settled, (Settled, none()));
    let seen = fleet_hit(client, vec![], Some(claim(&tenant, "own", "hook-b"))).await;
    assert_eq!(seen, Outcome::Duplicate("hook-a".to_owned()));

    tracing::info!(
        role,
        "--- SPEC 6 commit: already committed for the hook → settled"
    );
    let again = fleet_settle(client, &tenant, "own", "hook-a", Commit).await;
    assert_eq!(again, (Settled, none()), "commit is idempotent");
    let seen = fleet_hit(client, vec![], Some(claim(&tenant, "own", "hook-b"))).await;
    assert_eq!(seen, Outcome::Duplicate("hook-a".to_owned()));

    tracing::info!(role, "--- SPEC 6 commit: absent → recreated, committed");
    let recreated = fleet_settle(client, &tenant, "absent", "hook-z", Commit).await;
    assert_eq!(recreated, (Recreated, none()));
    let seen = fleet_hit(client, vec![], Some(claim(&tenant, "absent", "hook-b"))).await;
    assert_eq!(seen, Outcome::Duplicate("hook-z".to_owned()));

    tracing::info!(
        role,
        "--- SPEC 6 commit: pending for another hook → conflict, no change"
    );
    let taken = fleet_hit(client, vec![], Some(claim(&tenant, "other", "hook-a"))).await;
    assert_eq!(taken, Outcome::Allowed);
    let conflict = fleet_settle(client, &tenant, "other", "hook-b", Commit).await;
    assert_eq!(conflict, (Conflict, "hook-a".to_owned()));
    let seen = fleet_hit(client, vec![], Some(claim(&tenant, "other", "hook-c"))).await;
    assert!(
        matches!(seen, Outcome::Pending(_)),
        "still pending for hook-a: {seen:?}"
    );
    let settled = fleet_settle(client, &tenant, "other", "hook-a", Commit).await;
    assert_eq!(settled, (Settled, none()), "the holder still commits");

    tracing::info!(
        role,
        "--- SPEC 6 commit: committed by another hook → conflict"
    );
    let conflict = fleet_settle(client, &tenant, "other", "hook-b", Commit).await;
    assert_eq!(conflict, (Conflict, "hook-a".to_owned()));
    let seen = fleet_hit(client, vec![], Some(claim(&tenant, "other", "hook-c"))).await;
    assert_eq!(seen, Outcome::Duplicate("hook-a".to_owned()));
}

async fn release_branches(client: &mut Client, tag: &str, role: &str) {
    use pb::SettleOutcome::{Commit, Release};
    use pb::SettleStatus::{Conflict, Settled};
    let tenant = format!("{tag}-release");
    let none = String::new;

    tracing::info!(
        role,
        "--- SPEC 6 release: pending for the hook → removed, settled"
    );
    let taken = fleet_hit(client, vec![], Some(claim(&tenant, "own", "hook-a"))).await;
    assert_eq!(taken, Outcome::Allowed);
    let released = fleet_settle(client, &tenant, "own", "hook-a", Release).await;
    assert_eq!(released, (Settled, none()));
    let retaken = fleet_hit(client, vec![], Some(claim(&tenant, "own", "hook-b"))).await;
    assert_eq!(retaken, Outcome::Allowed, "a released key is free");

    tracing::info!(role, "--- SPEC 6 release: absent → settled");
    let released = fleet_settle(client, &tenant, "absent", "hook-a", Release).await;
    assert_eq!(released, (Settled, none()));
    let taken = fleet_hit(client, vec![], Some(claim(&tenant, "absent", "hook-b"))).await;
    assert_eq!(taken, Outcome::Allowed, "releasing nothing created nothing");

    tracing::info!(
        role,
        "--- SPEC 6 release: pending for another hook → conflict, no change"
    );
    let taken = fleet_hit(client, vec![], Some(claim(&tenant, "other", "hook-a"))).await;
    assert_eq!(taken, Outcome::Allowed);
    let conflict = fleet_settle(client, &tenant, "other", "hook-b", Release).await;
    assert_eq!(conflict, (Conflict, "hook-a".to_owned()));
    let seen = fleet_hit(client, vec![], Some(claim(&tenant, "other", "hook-c"))).await;
    assert!(
        matches!(seen, Outcome::Pending(_)),
        "still pending for hook-a: {seen:?}"
    );

    tracing::info!(
        role,
        "--- SPEC 6 release: committed (same hook) → conflict, no change"
    );
    let settled = fleet_settle(client, &tenant, "other", "hook-a", Commit).await;
    assert_eq!(settled, (Settled, none()));
    let conflict = fleet_settle(client, &tenant, "other", "hook-a", Release).await;
    assert_eq!(conflict, (Conflict, "hook-a".to_owned()));
    let seen = fleet_hit(client, vec![], Some(claim(&tenant, "other", "hook-c"))).await;
    assert_eq!(seen, Outcome::Duplicate("hook-a".to_owned()));

    tracing::info!(
        role,
        "--- SPEC 6 release: committed by another hook → conflict"
    );
    let conflict = fleet_settle(client, &tenant, "other", "hook-b", Release).await;
    assert_eq!(conflict, (Conflict, "hook-a".to_owned()));
    let seen = fleet_hit(client, vec![], Some(claim(&tenant, "other", "hook-c"))).await;
    assert_eq!(seen, Outcome::Duplicate("hook-a".to_owned()));
}

async fn reset_forgets_buckets_only(client: &mut Client, tag: &str, role: &str) {
    tracing::info!(
        role,
        "--- SPEC 10: spend a tenant's buckets of both kinds, and another's"
    );
    let tenant = format!("{tag}-reset");
    let bystander = format!("{tag}-reset-bystander");
    let charges = [slow(&tenant, 2), slow_bytes(&tenant, 2)];
    for _ in 0..2 {
        let answer = fleet_hit(client, charges.to_vec(), None).await;
        assert_eq!(answer, Outcome::Allowed);
    }
    for charge in &charges {
        let answer = fleet_hit(client, vec![charge.clone()], None).await;
        assert!(matches!(answer, Outcome::RateLimited(_)), "{answer:?}");
    }
    let other = slow(&bystander, 1);
    assert_eq!(
        fleet_hit(client, vec![other.clone()], None).await,
        Outcome::Allowed
    );
    commit_claim(client, &tenant, "evt", "hook-a").await;
    let local = node_hit(hit(vec![slow(&tenant, 1)], None));
    let answer = outcome(&send_hit_full(client, local.clone()).await);
    assert_eq!(answer, Outcome::Allowed, "node-local bucket spent");
    let answer = outcome(&send_hit_full(client, local.clone()).await);
    assert!(matches!(answer, Outcome::RateLimited(_)), "{answer:?}");

    tracing::info!(
        role,
        "--- SPEC 10: reset forgets both kinds, fleet and node-local"
    );
    send_reset(client, &tenant).await;
    assert_budget(client, &charges[0], 2, "hooks bucket after reset").await;
    assert_budget(client, &charges[1], 2, "bytes bucket after reset").await;
    let answer = outcome(&send_hit_full(client, local).await);
    assert_eq!(answer, Outcome::Allowed, "node-local bucket after reset");

    tracing::info!(role, "--- SPEC 10: claims and other tenants are untouched");
    let seen = fleet_hit(client, vec![], Some(claim(&tenant, "evt", "hook-b"))).await;
    assert_eq!(seen, Outcome::Duplicate("hook-a".to_owned()));
    let answer = fleet_hit(client, vec![other], None).await;
    assert!(
        matches!(answer, Outcome::RateLimited(_)),
        "another tenant's bucket is kept: {answer:?}"
    );
}

async fn check_rate_answers(client: &mut Client, tag: &str, role: &str) {
    tracing::info!(
        role,
        "--- SPEC 11: limit 3 per 60 s: three allowed, the fourth waits ~20 s"
    );
    let entity = format!("{tag}-entity");
    let started = Instant::now();
    for i in 0..3 {
        let answer = send_check_rate(client, check_rate(&entity, "send", 3, 60_000)).await;
        assert!(answer.allowed, "request {i} of 3: {answer:?}");
        assert_eq!(answer.retry_after_ms, 0, "an allowed answer has no retry");
        assert_eq!(answer.decided_by, pb::DecidedBy::Fleet as i32);
    }
    let denied = send_check_rate(client, check_rate(&entity, "send", 3, 60_000)).await;
    let elapsed = elapsed_ms(started);
    assert!(!denied.allowed, "the fourth is over the limit: {denied:?}");
    assert!(
        drained(20_000, elapsed).contains(&denied.retry_after_ms),
        "retry_after_ms {} after {elapsed} ms",
        denied.retry_after_ms
    );
    let other_operation = send_check_rate(client, check_rate(&entity, "read", 3, 60_000)).await;
    assert!(
        other_operation.allowed,
        "one bucket per (entity, operation)"
    );

    tracing::info!(
        role,
        "--- SPEC 11: entity buckets never share a hit bucket's budget"
    );
    let shared = format!("{tag}-shared");
    for charge in [slow(&shared, 1), slow_bytes(&shared, 1)] {
        assert_eq!(
            fleet_hit(client, vec![charge.clone()], None).await,
            Outcome::Allowed
        );
        let spent = fleet_hit(client, vec![charge], None).await;
        assert!(matches!(spent, Outcome::RateLimited(_)), "{spent:?}");
    }
    for operation in ["hooks", "bytes", "KIND_HOOKS", "KIND_BYTES", "1", "2"] {
        let answer = send_check_rate(client, check_rate(&shared, operation, 1, 60_000)).await;
        assert!(
            answer.allowed,
            "entity ({shared}, {operation}) has its own budget: {answer:?}"
        );
    }
    let entity_first = format!("{tag}-entity-first");
    for operation in ["hooks", "bytes"] {
        let answer = send_check_rate(client, check_rate(&entity_first, operation, 1, 60_000)).await;
        assert!(answer.allowed);
        let spent = send_check_rate(client, check_rate(&entity_first, operation, 1, 60_000)).await;
        assert!(!spent.allowed, "limit 1 is spent: {spent:?}");
    }
    assert_budget(client, &slow(&entity_first, 1), 1, "hooks after entity").await;
    assert_budget(
        client,
        &slow_bytes(&entity_first, 1),
        1,
        "bytes after entity",
    )
    .await;
}

async fn check_rate_telemetry(fleet: &Fleet, id: u64, tag: &str, role: &str) {
    tracing::info!(
        role,
        "--- SPEC 11: each decision is a structured event in the node's log"
    );
    let entity = format!("{tag}-entity");
    for event in ["request_allowed", "request_denied"] {
        fleet
            .wait_for(&format!("{event} for {entity} in node {id}'s log"), || {
                let found = fleet.log_lines(id, &[event, &entity, "operation", "send"]) > 0;
                async move { found.then_some(()) }
            })
            .await;
    }
}

// ---------------------------------------------------------------------------------------
// SPEC section 8
// ---------------------------------------------------------------------------------------

/// The same request, with both scopes `node`.
fn node_hit(mut request: pb::HitRequest) -> pb::HitRequest {
    request.rate_limit_scope = pb::Scope::Node as i32;
    request.dedupe_scope = pb::Scope::Node as i32;
    request
}

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

        tracing::info!(role, "--- SPEC 8: node-scope charges are decided locally");
        let charge = slow(&tenant, 2);
        for _ in 0..2 {
            let answer = local_hit(&mut client, vec![charge.clone()], None).await;
            assert_eq!(answer, Outcome::Allowed);
        }
        let answer = local_hit(&mut client, vec![charge.clone()], None).await;
        assert!(matches!(answer, Outcome::RateLimited(_)), "{answer:?}");
        tracing::info!(
            role,
            "--- SPEC 8: another node's node-local bucket is its own"
        );
        let answer = local_hit(&mut other_client, vec![charge.clone()], None).await;
        assert_eq!(
            answer,
            Outcome::Allowed,
            "node {other} never saw node {id}'s charges"
        );

        tracing::info!(
            role,
            "--- SPEC 8: node-scope claims live in the node's own index"
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

        tracing::info!(role, "--- SPEC 8: node-scope check_rate is decided locally");
        let mut request = check_rate(&tenant, "send", 1, 60_000);
        request.scope = pb::Scope::Node as i32;
        let answer = send_check_rate(&mut client, request.clone()).await;
        assert!(answer.allowed);
        assert_eq!(answer.decided_by, pb::DecidedBy::Local as i32);
        let answer = send_check_rate(&mut client, request).await;
        assert!(!answer.allowed && answer.retry_after_ms >= 1, "{answer:?}");
    }

    tracing::info!("--- SPEC 8: nothing of the above went through Raft");
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
        tracing::info!(role, "--- SPEC 8: the fleet never saw the node-scope state");
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
async fn mixed_race(
    client: &Client,
    charge: &pb::Charge,
    (charges_scope, claim_scope): (pb::Scope, pb::Scope),
    claims: Vec<pb::Claim>,
) -> Vec<Outcome> {
    let racers = claims.into_iter().map(|claim| {
        let mut client = client.clone();
        let request = mixed_hit(vec![charge.clone()], charges_scope, claim, claim_scope);
        async move { outcome(&send_hit_full(&mut client, request).await) }
    });
    futures::future::join_all(racers).await
}

fn count(outcomes: &[Outcome], which: fn(&Outcome) -> bool) -> usize {
    outcomes.iter().filter(|outcome| which(outcome)).count()
}

/// SPEC section 5 makes a hit one atomic decision, also when its charges and its claim are
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

// ---------------------------------------------------------------------------------------
// One fleet: shared budgets, shared claims, expiry
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fleet_shares_budgets_and_claims_and_expires_them() {
    init_tracing();
    let fleet = Fleet::start(3, "").await;
    let entries = entries(&fleet).await;
    let mut clients = Vec::new();
    for id in 1..=3 {
        clients.push((id, fleet.client(id).await));
    }

    tracing::info!("--- one burst of 6, hit concurrently through all three nodes, allows 6");
    let charge = slow("shared-burst", 6);
    let racers = (0..12).map(|i| {
        let (_, client) = &clients[i % 3];
        let mut client = client.clone();
        let charge = charge.clone();
        async move { fleet_hit(&mut client, vec![charge], None).await }
    });
    let answers = futures::future::join_all(racers).await;
    let allowed = answers.iter().filter(|a| **a == Outcome::Allowed).count();
    assert_eq!(
        allowed, 6,
        "exactly the capacity passes fleet-wide: {answers:?}"
    );
    for (id, client) in &mut clients {
        let answer = fleet_hit(client, vec![charge.clone()], None).await;
        assert!(
            matches!(answer, Outcome::RateLimited(_)),
            "node {id}: {answer:?}"
        );
    }

    tracing::info!("--- one key claimed concurrently by three hooks through three nodes");
    let racers = clients.iter().map(|(id, client)| {
        let mut client = client.clone();
        let request = claim("shared-race", "evt", &format!("hook-{id}"));
        async move { fleet_hit(&mut client, vec![], Some(request)).await }
    });
    let answers = futures::future::join_all(racers).await;
    let allowed = answers.iter().filter(|a| **a == Outcome::Allowed).count();
    let pending = answers
        .iter()
        .filter(|a| matches!(a, Outcome::Pending(_)))
        .count();
    assert_eq!((allowed, pending), (1, 2), "one holder: {answers:?}");

    tracing::info!("--- an answer from one node is visible at once from every other");
    for a in 0..3 {
        for b in 0..3 {
            if a == b {
                continue;
            }
            let key = format!("visible-{a}-{b}");
            commit_claim(&mut clients[a].1, "shared-visible", &key, "hook-a").await;
            let seen = fleet_hit(
                &mut clients[b].1,
                vec![],
                Some(claim("shared-visible", &key, "hook-b")),
            )
            .await;
            assert_eq!(
                seen,
                Outcome::Duplicate("hook-a".to_owned()),
                "commit via node {}, hit via node {}",
                clients[a].0,
                clients[b].0
            );
            let charge = slow(&format!("visible-{a}-{b}"), 1);
            let spent = fleet_hit(&mut clients[a].1, vec![charge.clone()], None).await;
            assert_eq!(spent, Outcome::Allowed);
            let seen = fleet_hit(&mut clients[b].1, vec![charge], None).await;
            assert!(matches!(seen, Outcome::RateLimited(_)), "{seen:?}");
        }
    }

    for (role, id) in entries {
        let mut client = fleet.client(id).await;
        let tenant = format!("expiry-{role}");
        pending_claim_expires(&fleet, &mut client, &tenant, role).await;
        committed_claim_expires(&fleet, &mut client, &tenant, role).await;
    }
}

/// Waits until `hook_id` can take `key`, retrying (a blocked claim writes nothing).
async fn wait_until_free(fleet: &Fleet, client: &Client, tenant: &str, key: &str, hook_id: &str) {
    let started = Instant::now();
    fleet
        .wait_for("the claim expired", || {
            let mut client = client.clone();
            let request = claim(tenant, key, hook_id);
            async move {
                let answer = fleet_hit(&mut client, vec![], Some(request)).await;
                match answer {
                    Outcome::Allowed => Some(()),
                    Outcome::Pending(_) | Outcome::Duplicate(_) => None,
                    other => panic!("a claim-only hit answered {other:?}"),
                }
            }
        })
        .await;
    tracing::info!(elapsed_ms = elapsed_ms(started), key, "claim expired");
}

async fn pending_claim_expires(fleet: &Fleet, client: &mut Client, tenant: &str, role: &str) {
    tracing::info!(
        role,
        "--- SPEC 2/5: a pending claim expires after pending_ttl_ms"
    );
    let mut short = claim(tenant, "pending", "hook-a");
    short.pending_ttl_ms = SHORT_TTL_MS;
    assert_eq!(
        fleet_hit(client, vec![], Some(short)).await,
        Outcome::Allowed
    );
    let blocked = fleet_hit(client, vec![], Some(claim(tenant, "pending", "hook-b"))).await;
    let Outcome::Pending(retry_after_ms) = blocked else {
        panic!("hook-a holds the claim for now, got {blocked:?}");
    };
    assert!(
        (1..=SHORT_TTL_MS).contains(&retry_after_ms),
        "{retry_after_ms}"
    );
    wait_until_free(fleet, client, tenant, "pending", "hook-b").await;
    let late = fleet_hit(client, vec![], Some(claim(tenant, "pending", "hook-a"))).await;
    assert!(
        matches!(late, Outcome::Pending(_)),
        "hook-b holds it now, hook-a waits: {late:?}"
    );
    let late_commit = fleet_settle(
        client,
        tenant,
        "pending",
        "hook-a",
        pb::SettleOutcome::Commit,
    )
    .await;
    assert_eq!(
        late_commit,
        (pb::SettleStatus::Conflict, "hook-b".to_owned())
    );
}

async fn committed_claim_expires(fleet: &Fleet, client: &mut Client, tenant: &str, role: &str) {
    tracing::info!(role, "--- SPEC 6: a committed claim expires after ttl_ms");
    let mut short = claim(tenant, "committed", "hook-a");
    short.ttl_ms = SHORT_TTL_MS;
    assert_eq!(
        fleet_hit(client, vec![], Some(short)).await,
        Outcome::Allowed
    );
    let settled = fleet_settle(
        client,
        tenant,
        "committed",
        "hook-a",
        pb::SettleOutcome::Commit,
    )
    .await;
    assert_eq!(settled, (pb::SettleStatus::Settled, String::new()));
    let seen = fleet_hit(client, vec![], Some(claim(tenant, "committed", "hook-b"))).await;
    assert_eq!(seen, Outcome::Duplicate("hook-a".to_owned()));
    wait_until_free(fleet, client, tenant, "committed", "hook-b").await;

    tracing::info!(
        role,
        "--- SPEC 6: a recreated claim lives for the settle's ttl_ms"
    );
    let mut recreate = settle(tenant, "recreated", "hook-a", pb::SettleOutcome::Commit);
    recreate.ttl_ms = SHORT_TTL_MS;
    let response = send_settle(client, recreate).await;
    assert_eq!(response.status, pb::SettleStatus::Recreated as i32);
    let seen = fleet_hit(client, vec![], Some(claim(tenant, "recreated", "hook-b"))).await;
    assert_eq!(seen, Outcome::Duplicate("hook-a".to_owned()));
    wait_until_free(fleet, client, tenant, "recreated", "hook-b").await;
}

// ---------------------------------------------------------------------------------------
// HitStream (beyond SPEC 14): the same answers as Hit, in request order
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hit_stream_answers_like_hit_in_request_order() {
    init_tracing();
    let fleet = Fleet::start(3, "").await;
    for (role, id) in entries(&fleet).await {
        tracing::info!(role, "--- four requests sent at once on one stream");
        let tenant = format!("stream-{role}");
        let mut client = fleet.client(id).await;
        let mut stream = HitStream::open(&mut client).await;
        let mut invalid = hit(vec![], Some(claim(&tenant, "evt-3", "hook-x")));
        invalid.claim.as_mut().expect("a claim").tenant = String::new();
        let requests = [
            hit(
                vec![slow(&tenant, 1)],
                Some(claim(&tenant, "evt-1", "hook-a")),
            ),
            hit(vec![], Some(claim(&tenant, "evt-1", "hook-b"))),
            invalid,
            hit(
                vec![slow(&tenant, 1)],
                Some(claim(&tenant, "evt-2", "hook-c")),
            ),
        ];
        for request in requests {
            stream.send(request).await;
        }
        let first = stream.reply().await.expect("the first hit is answered");
        assert_eq!(outcome(&first), Outcome::Allowed, "{first:?}");
        assert_eq!(first.decided_by, pb::DecidedBy::Fleet as i32, "{first:?}");
        let second = stream.reply().await.expect("the second hit is answered");
        assert!(
            matches!(outcome(&second), Outcome::Pending(_)),
            "the first hit (sent before it) holds evt-1 for hook-a: {second:?}"
        );
        let third = stream
            .reply()
            .await
            .expect_err("an empty tenant is refused");
        assert_eq!(third.code(), tonic::Code::InvalidArgument, "{third:?}");
        assert!(third.message().contains("claim.tenant"), "{third:?}");
        let fourth = stream
            .reply()
            .await
            .expect("the stream goes on after an error");
        assert!(
            matches!(outcome(&fourth), Outcome::RateLimited(_)),
            "the first hit spent the bucket's one hit: {fourth:?}"
        );

        tracing::info!(
            role,
            "--- a commit made through another node is seen on the stream"
        );
        let other = (1..=3).find(|other| *other != id).expect("another node");
        let mut other_client = fleet.client(other).await;
        let settled = fleet_settle(
            &mut other_client,
            &tenant,
            "evt-1",
            "hook-a",
            pb::SettleOutcome::Commit,
        )
        .await;
        assert_eq!(settled, (pb::SettleStatus::Settled, String::new()));
        let again = stream
            .hit(hit(vec![], Some(claim(&tenant, "evt-1", "hook-z"))))
            .await
            .expect("answered");
        assert_eq!(outcome(&again), Outcome::Duplicate("hook-a".to_owned()));
    }
}
