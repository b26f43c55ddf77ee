//! The edge client crate (`client/`, `ankusa-fleet-client`) against real fleets: the whole
//! API over TCP, many concurrent hits on one stream each getting its own answer, `hit_many`
//! answering in the order asked, a frozen node answered for by the deadline, and the node's
//! Unix socket (`api_socket`).
//!
//! And against a fake node (`fake_node.rs`) that hands each `HitBatch` stream to the test, which
//! answers its frames as it likes: how hits are gathered into frames, matched by id, given
//! up at their deadlines, and failed when the stream breaks.

#[path = "../common/mod.rs"]
mod common;
mod fake_node;

use std::time::Duration;

use ankusa_fleet_client::{pb, Client, DecidedBy, Error, Options, Outcome, SettleStatus, Target};
use common::*;

const TENANT: &str = "acme";
/// Long enough for a loaded machine's fleet; the deadline tests use their own.
const DEADLINE_MS: u32 = 10_000;

fn client_of(fleet: &Fleet, id: u64) -> Client {
    Client::connect(Target::Tcp(fleet.api_addr(id)), Options::default()).expect("a client")
}

fn claim_hit(key: &str, hook_id: &str) -> pb::HitRequest {
    pb::HitRequest {
        claim: Some(pb::Claim {
            tenant: TENANT.into(),
            source_id: "stripe".into(),
            key: key.into(),
            hook_id: hook_id.into(),
            ttl_ms: 3_600_000,
            pending_ttl_ms: 60_000,
        }),
        timeout_ms: DEADLINE_MS,
        ..Default::default()
    }
}

fn budget_hit(tenant: &str, capacity: u64) -> pb::HitRequest {
    pb::HitRequest {
        charges: vec![pb::Charge {
            kind: pb::Kind::Hooks as i32,
            tenant: tenant.into(),
            increment_us: 3_600_000_000,
            capacity_us: capacity * 3_600_000_000,
        }],
        timeout_ms: DEADLINE_MS,
        ..Default::default()
    }
}

fn settle(key: &str, hook_id: &str, outcome: pb::SettleOutcome) -> pb::SettleRequest {
    pb::SettleRequest {
        tenant: TENANT.into(),
        source_id: "stripe".into(),
        key: key.into(),
        hook_id: hook_id.into(),
        outcome: outcome as i32,
        timeout_ms: DEADLINE_MS,
        ..Default::default()
    }
}

fn fleet_says(outcome: Outcome) -> Result<ankusa_fleet_client::Decision, Error> {
    Ok(ankusa_fleet_client::Decision {
        outcome,
        decided_by: DecidedBy::Fleet,
    })
}

/// Claim, commit, duplicate, pending, conflict, rate limited, check_rate and reset, each
/// answered as the contract says, through a follower.
async fn the_whole_api(client: &Client) {
    assert_eq!(
        client.hit(claim_hit("k1", "h1")).await,
        fleet_says(Outcome::Ok)
    );
    let settled = client
        .settle(settle("k1", "h1", pb::SettleOutcome::Commit))
        .await
        .expect("settled");
    assert_eq!(
        (settled.status, settled.decided_by),
        (SettleStatus::Settled, DecidedBy::Fleet)
    );
    assert_eq!(
        client.hit(claim_hit("k1", "h2")).await,
        fleet_says(Outcome::Duplicate {
            hook_id: "h1".into()
        })
    );

    assert_eq!(
        client.hit(claim_hit("k2", "h3")).await,
        fleet_says(Outcome::Ok)
    );
    let pending = client.hit(claim_hit("k2", "h4")).await.expect("answered");
    assert!(
        matches!(pending.outcome, Outcome::Pending { retry_after } if retry_after > Duration::ZERO),
        "{pending:?}"
    );
    let conflict = client
        .settle(settle("k2", "h4", pb::SettleOutcome::Commit))
        .await
        .expect("answered");
    assert_eq!(
        conflict.status,
        SettleStatus::Conflict {
            holder_hook_id: "h3".into()
        }
    );

    for _ in 0..2 {
        assert_eq!(
            client.hit(budget_hit("two", 2)).await,
            fleet_says(Outcome::Ok)
        );
    }
    let limited = client.hit(budget_hit("two", 2)).await.expect("answered");
    assert!(
        matches!(limited.outcome, Outcome::RateLimited { retry_after } if retry_after > Duration::ZERO),
        "{limited:?}"
    );
    client
        .reset(pb::ResetRequest {
            tenant: "two".into(),
            timeout_ms: DEADLINE_MS,
        })
        .await
        .expect("reset");
    assert_eq!(
        client.hit(budget_hit("two", 2)).await,
        fleet_says(Outcome::Ok)
    );

    let check = |limit| pb::CheckRateRequest {
        entity_id: "user-1".into(),
        operation: "login".into(),
        limit,
        window_ms: 3_600_000,
        timeout_ms: DEADLINE_MS,
        ..Default::default()
    };
    assert_eq!(client.check_rate(check(1)).await, fleet_says(Outcome::Ok));
    let refused = client.check_rate(check(1)).await.expect("answered");
    assert!(
        matches!(refused.outcome, Outcome::RateLimited { .. }),
        "{refused:?}"
    );

    let status = client.status().await.expect("status");
    assert_ne!(status.leader_id, 0, "{status:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_speaks_the_whole_api_over_tcp() {
    init_tracing();
    let fleet = Fleet::start(3, "").await;
    let leader = fleet.wait_for_leader(&[1, 2, 3]).await;
    let follower = (1..=3).find(|id| *id != leader).expect("a follower");
    the_whole_api(&client_of(&fleet, follower)).await;

    tracing::info!("--- a request the node refuses is an error value naming the field");
    let mut bad = claim_hit("k3", "h5");
    bad.claim.as_mut().expect("claim").tenant.clear();
    let refused = client_of(&fleet, follower).hit(bad).await;
    assert!(
        matches!(&refused, Err(Error::InvalidArgument(message)) if message.contains("tenant")),
        "{refused:?}"
    );
}

/// Hundreds of hits at once from clones of one client, over one stream: each answer is its
/// own hit's (committed keys answer with their own holder, new keys are allowed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_hits_on_one_stream_each_get_their_own_answer() {
    init_tracing();
    let fleet = Fleet::start(3, "").await;
    fleet.wait_for_leader(&[1, 2, 3]).await;
    let client = client_of(&fleet, 1);
    let committed = keys("held", 40);
    fleet.commit_claims(&[1, 2, 3], TENANT, &committed, 8).await;

    let mut calls = tokio::task::JoinSet::new();
    for round in 0..5 {
        for (i, key) in committed.iter().enumerate() {
            let client = client.clone();
            let (key, fresh) = (key.clone(), format!("fresh-{round}-{i}"));
            calls.spawn(async move {
                let probe = client.hit(claim_hit(&key, "another")).await;
                let new = client.hit(claim_hit(&fresh, "mine")).await;
                (key, probe, new)
            });
        }
    }
    let mut answered = 0;
    while let Some(joined) = calls.join_next().await {
        let (key, probe, new) = joined.expect("a call task");
        assert_eq!(
            probe,
            fleet_says(Outcome::Duplicate {
                hook_id: hook_of(&key)
            }),
            "the probe of {key}"
        );
        assert_eq!(new, fleet_says(Outcome::Ok), "a fresh key after {key}");
        answered += 2;
    }
    assert_eq!(answered, 5 * 2 * committed.len());
}

/// A frozen node (SIGSTOP) answers nothing: the client's hit and settle end at their
/// deadline as timeouts; once the node runs again, the same client is answered, each hit
/// with its own answer although the frozen one's late reply comes first on the stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_node_is_a_timeout_by_the_deadline_not_a_hang() {
    init_tracing();
    let mut fleet = Fleet::start(3, "").await;
    let leader = fleet.wait_for_leader(&[1, 2, 3]).await;
    let id = (1..=3).find(|id| *id != leader).expect("a follower");
    let client = client_of(&fleet, id);
    assert_eq!(
        client.hit(claim_hit("held", "h1")).await,
        fleet_says(Outcome::Ok)
    );
    let committed = client
        .settle(settle("held", "h1", pb::SettleOutcome::Commit))
        .await;
    assert_eq!(committed.map(|s| s.status), Ok(SettleStatus::Settled));
    assert_eq!(
        client.hit(claim_hit("open", "h5")).await,
        fleet_says(Outcome::Ok)
    );

    fleet.pause(id);
    let deadline = Duration::from_millis(300);
    // Its late reply would be `duplicate h1`: were it handed to the next hit, that hit
    // would not see `allowed`.
    let mut frozen = claim_hit("held", "h2");
    frozen.timeout_ms = 300;
    let mut settle_frozen = settle("open", "h5", pb::SettleOutcome::Commit);
    settle_frozen.timeout_ms = 300;
    let outer = CONDITION_DEADLINE;
    let hit = tokio::time::timeout(outer, client.hit(frozen)).await;
    let settled = tokio::time::timeout(outer, client.settle(settle_frozen)).await;
    fleet.resume(id);
    assert_eq!(
        hit.expect("the hit returned"),
        Err(Error::Timeout(deadline))
    );
    assert_eq!(
        settled.expect("the settle returned"),
        Err(Error::Timeout(deadline))
    );

    assert_eq!(
        client.hit(claim_hit("after", "h3")).await,
        fleet_says(Outcome::Ok)
    );
    // The settle that timed out may or may not have been carried out once the node ran
    // again: `open` is h5's, pending or committed, and never anyone else's.
    let probe = client.hit(claim_hit("open", "h4")).await.expect("answered");
    assert!(
        matches!(&probe.outcome, Outcome::Pending { .. })
            || probe.outcome
                == Outcome::Duplicate {
                    hook_id: "h5".into()
                },
        "{probe:?}"
    );
}

/// A node with `api_socket` serves the edge API there too, without TLS: the client speaks
/// all of it over the socket. The file is `0660`, gone after a drain, and a file left by a
/// kill -9 is replaced when the node starts again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_unix_socket_serves_the_edge_api() {
    use std::os::unix::fs::PermissionsExt;
    init_tracing();
    let sockets = tempfile::tempdir().expect("tempdir");
    let socket = sockets.path().join("run").join("api.sock");
    let mut fleet = Fleet::start(
        1,
        &format!("api_socket = {:?}", socket.display().to_string()),
    )
    .await;
    fleet.wait_for_leader(&[1]).await;
    let client =
        Client::connect(Target::Unix(socket.clone()), Options::default()).expect("a client");
    the_whole_api(&client).await;
    let mode = std::fs::metadata(&socket)
        .expect("the socket file")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o660, "the socket's mode: {mode:o}");

    tracing::info!("--- a drain removes the socket file");
    fleet.stop(1).await;
    assert!(
        !socket.exists(),
        "{} is left after a drain",
        socket.display()
    );
    let down = client.hit(claim_hit("k9", "h9")).await;
    assert!(matches!(down, Err(Error::Unavailable(_))), "{down:?}");

    tracing::info!("--- a kill -9 leaves the file; the restarted node replaces it");
    fleet.restart(1);
    fleet.wait_for_leader(&[1]).await;
    fleet.kill(1);
    assert!(socket.exists(), "kill -9 removes nothing");
    fleet.restart(1);
    fleet.wait_for_leader(&[1]).await;
    let again = fleet
        .wait_for("the socket answers again", || async {
            client.hit(claim_hit("k1", "h7")).await.ok()
        })
        .await;
    assert_eq!(
        again,
        ankusa_fleet_client::Decision {
            outcome: Outcome::Duplicate {
                hook_id: "h1".into()
            },
            decided_by: DecidedBy::Fleet
        }
    );
}

/// `hit_many` through a follower: 1500 hits (two frames: the node takes at most 1024 in
/// one), answered in the order asked. Committed keys are probed at known places (each
/// answered with its own holder), and one hit without a tenant is refused on its own
/// while the rest are decided.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hit_many_answers_in_the_order_asked() {
    init_tracing();
    let fleet = Fleet::start(3, "").await;
    let leader = fleet.wait_for_leader(&[1, 2, 3]).await;
    let follower = (1..=3).find(|id| *id != leader).expect("a follower");
    let committed = keys("held", 15);
    fleet.commit_claims(&[1, 2, 3], TENANT, &committed, 8).await;

    const HITS: usize = 1500;
    const INVALID: usize = 1100;
    let probe_at = |i: usize| (i % 100 == 7).then(|| committed[i / 100].clone());
    let hits: Vec<pb::HitRequest> = (0..HITS)
        .map(|i| match probe_at(i) {
            Some(key) => claim_hit(&key, "another"),
            None if i == INVALID => {
                let mut bad = claim_hit("no-tenant", "h");
                bad.claim.as_mut().expect("claim").tenant.clear();
                bad
            }
            None => claim_hit(&format!("fresh-{i}"), "mine"),
        })
        .collect();
    let answers = client_of(&fleet, follower).hit_many(hits).await;
    assert_eq!(answers.len(), HITS);
    for (i, answer) in answers.into_iter().enumerate() {
        match probe_at(i) {
            Some(key) => assert_eq!(
                answer,
                fleet_says(Outcome::Duplicate {
                    hook_id: hook_of(&key)
                }),
                "hit {i}, a probe of {key}"
            ),
            None if i == INVALID => assert!(
                matches!(&answer, Err(Error::InvalidArgument(message)) if message.contains("tenant")),
                "hit {i}: {answer:?}"
            ),
            None => assert_eq!(answer, fleet_says(Outcome::Ok), "hit {i}, a fresh key"),
        }
    }
}
