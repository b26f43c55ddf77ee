//! contract §4 and §5: GCRA charges, and the steps of a hit with a claim.

use tokio::time::Instant;

use crate::common::*;
use crate::{
    assert_budget, commit_claim, drained, elapsed_ms, entries, fleet_hit, slow, Client, SECOND_US,
};

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
    tracing::info!(role, "--- contract §4: 10/s burst 10 (the exact example)");
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
        "--- contract §4 scaled by 100: ten pass, the eleventh waits ~10 s"
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
        "--- contract §5.2: one denied charge stops the others and the claim"
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
        "--- contract §5.2 before 5.3: rate_limited beats duplicate"
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
        "--- contract §5.3: committed → duplicate{{holder}}, no charge spent"
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
        "--- contract §5.3: pending for another hook → pending{{time left}}"
    );
    let tenant = format!("{tag}-pend-other");
    let holder = claim(&tenant, "evt", "hook-a"); // pending_ttl_ms 60_000
    assert_eq!(
        fleet_hit(client, vec![], Some(holder)).await,
        Outcome::Allowed
    );
    let charge = slow(&tenant, 2);
    let mut other = claim(&tenant, "evt", "hook-b");
    other.pending_ttl_ms = 6 * 86_400_000; // the holder's expiry counts, not this one
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
        "--- contract §5.3: the same hook retried → allowed, not charged again"
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
        "--- contract §5: a hit with neither charges nor claim is allowed"
    );
    assert_eq!(fleet_hit(client, vec![], None).await, Outcome::Allowed);
}
