use super::*;
use crate::clock::Clock;
use crate::state::ClaimKey;

/// The local reserve is an eighth of a short timeout and capped for a long one, so the
/// fleet keeps nearly all of a timeout (docs/decisions/023).
#[test]
fn the_local_reserve_is_an_eighth_of_the_timeout_at_most_its_cap() {
    let ms = std::time::Duration::from_millis;
    assert_eq!(local_reserve(ms(300), SETTLE_RESERVE_MAX), ms(25));
    assert_eq!(local_reserve(ms(80), SETTLE_RESERVE_MAX), ms(10));
    assert_eq!(local_reserve(ms(1_000), HIT_RESERVE_MAX), ms(5));
    assert_eq!(local_reserve(ms(16), HIT_RESERVE_MAX), ms(2));
    assert_eq!(local_reserve(ms(0), HIT_RESERVE_MAX), ms(0));
    assert_eq!(local_reserve(ms(300), RESET_RESERVE_MAX), ms(5));
}

/// Contract §8: one part in each scope says local, naming the node-scoped part, and then
/// why the fleet part was local too, when it was.
#[test]
fn a_mixed_decision_names_its_node_part_then_why_the_fleet_was_not_asked() {
    let claim = ClaimRequest {
        key: ClaimKey {
            tenant: "t".into(),
            source_id: "s".into(),
            key: "k".into(),
        },
        hook_id: "h".into(),
        ttl_ms: 1,
        pending_ttl_ms: 1,
    };
    let reason = |route: &Route, missed: Option<&str>| match mixed_decision(
        HitAnswer::Allowed,
        route,
        missed.map(str::to_owned),
    ) {
        Decided {
            answer: HitAnswer::Allowed,
            decided_by: DecidedBy::Local { reason },
        } => reason,
        other => panic!("{other:?}"),
    };
    let node_claim = Route::FleetChargesNodeClaim(&claim);
    let node_charges = Route::NodeChargesFleetClaim(&claim);
    assert_eq!(reason(&node_claim, None), "node scope: claim");
    assert_eq!(reason(&node_charges, None), "node scope: charges");
    assert_eq!(
        reason(&node_claim, Some("no leader")),
        "node scope: claim; no leader"
    );
    assert_eq!(
        reason(&node_charges, Some("deadline")),
        "node scope: charges; deadline"
    );
}

/// A node of one member that never formed a fleet (so no leader ever comes), its stores
/// in `dir`, deciding alone on a wall clock the test drives.
async fn leaderless_node(dir: &std::path::Path) -> Node {
    node_lingering(dir, std::time::Duration::ZERO).await
}

/// [`leaderless_node`] whose batches linger up to `linger`.
async fn node_lingering(dir: &std::path::Path, linger: std::time::Duration) -> Node {
    use crate::clock::{LocalTime, ManualClock};
    use crate::raft::clock_view::ClockView;
    use crate::raft::durability::network::DurableNetwork;
    use crate::raft::faults::Faults;
    use crate::raft::log_store::LogStore;
    use crate::raft::network::PeerClients;
    use crate::storage::sled_disk::SledDisk;

    const NODE_ID: NodeId = 1;
    let bound = std::time::Duration::from_millis(500);
    let clocks: Arc<dyn Clock> = Arc::new(ManualClock::new(1_800_000_000_000_000));
    let time = Arc::new(LocalTime::new(clocks.clone(), bound));
    let faults = Faults::new(false);
    let log = LogStore::open(&dir.join("raft-log.redb"), NODE_ID, faults.clone()).expect("log");
    let durable = log.durable();
    let disk = SledDisk::open(&dir.join("state.sled"), 1 << 20).expect("sled");
    let state = StateMachineStore::open(&disk, durable.clone(), Planted::default()).expect("state");
    let clock = ClockView::new(NODE_ID, bound);
    let peers = PeerClients::new("test", NODE_ID, faults);
    let config = openraft::Config::default().validate().expect("config");
    let network = DurableNetwork::new(peers.clone(), durable.clone());
    let raft = Raft::new(NODE_ID, Arc::new(config), network, log, state.clone())
        .await
        .expect("raft");
    let router = router::Router::new(
        NODE_ID,
        raft.clone(),
        peers,
        crate::state::StateLimits::UNLIMITED,
        clock.clone(),
        clocks.clone(),
    );
    let limits = propose::BatchLimits {
        batch_commands_max: 100,
        queue_depth_max: 1_000,
        proposals_in_flight_max: 1,
        forwards_in_flight_max: 16,
        linger,
    };
    let proposer = Proposer::start(
        Arc::new(router),
        limits,
        crate::state::check::Ceilings::CONTRACT,
    );
    let local = LocalEngine::open(&dir.join("node-claims.journal"), NODE_ID, time.clone())
        .expect("node scope");
    let fallback = Fallback::open(
        dir,
        &disk,
        NODE_ID,
        crate::config::FallbackBudget::Full,
        time,
    )
    .expect("fallback");
    Node::new(NodeParts {
        id: NODE_ID,
        raft,
        state,
        proposer,
        local,
        fallback,
        voters_max: 5,
        durable,
        planted_bug: Planted::default(),
        clock,
        clocks,
    })
}

/// Contract §7 on tokio's paused time: with no leader, a fleet-scoped hit is answered by
/// the local fallback once the fleet's part of its timeout is over, leaving the local
/// reserve for the answer (docs/decisions/023), not at the timeout or after it.
#[tokio::test(start_paused = true)]
async fn a_hit_without_a_leader_is_answered_locally_by_its_fleet_deadline() {
    let dir = tempfile::tempdir().expect("tempdir");
    let node = leaderless_node(dir.path()).await;
    let timeout = std::time::Duration::from_millis(300);
    let input = HitInput {
        charges: vec![Charge {
            bucket: crate::state::BucketKey::Tenant {
                kind: crate::state::Kind::Hooks,
                tenant: "t".into(),
            },
            increment_us: 1_000_000,
            capacity_us: 10_000_000,
        }],
        claim: None,
        timeout,
        rate_limit_scope: request::Scope::Fleet,
        dedupe_scope: request::Scope::Fleet,
    };
    let started = Instant::now();
    let decided = node.hit(input).await.expect("answered");
    let elapsed = started.elapsed();
    assert_eq!(
        decided,
        Decided {
            answer: HitAnswer::Allowed,
            decided_by: DecidedBy::Local {
                reason: "no leader".to_owned()
            },
        }
    );
    let fleet_part = timeout - local_reserve(timeout, HIT_RESERVE_MAX);
    assert!(
        elapsed >= fleet_part && elapsed <= fleet_part + std::time::Duration::from_millis(1),
        "answered after {elapsed:?}, the fleet's part being {fleet_part:?}"
    );
    assert_eq!(
        node.fallback().ledger.len(),
        1,
        "the grant waits to be reconciled"
    );
}

/// Decision 028 as the batcher runs it: once an entry held a frame of two or more
/// commands, the leader's next entry waits for that sender's next frame, and the lone
/// command that came first rides in the same entry with it.
#[tokio::test]
async fn a_leaders_next_entry_waits_for_the_frame_its_last_one_answered() {
    use crate::raft::MemberNode;
    use crate::state::{Command, EncodedCommand};

    let dir = tempfile::tempdir().expect("tempdir");
    // Long enough that no run of this test meets its end by chance.
    let node = node_lingering(dir.path(), std::time::Duration::from_secs(60)).await;
    let member = MemberNode {
        api_addr: "127.0.0.1:1".to_owned(),
        raft_addr: "127.0.0.1:2".to_owned(),
    };
    node.raft
        .initialize(std::collections::BTreeMap::from([(node.id, member)]))
        .await
        .expect("initialize");
    node.raft
        .wait(Some(std::time::Duration::from_secs(30)))
        .current_leader(node.id, "leads")
        .await
        .expect("the one member leads");
    let reset = |tenant: &str| {
        EncodedCommand::encode(&Command::Reset {
            tenant: tenant.into(),
        })
        .expect("encode")
    };
    let deadline = || tokio::time::Instant::now() + std::time::Duration::from_secs(120);
    let last_index = || node.raft.metrics().borrow().last_log_index;

    // A frame of two commands, answered.
    let frame = |a, b| {
        let proposer = node.proposer.clone();
        async move {
            let answers = proposer
                .propose_many(vec![reset(a), reset(b)], deadline())
                .await
                .expect("a frame");
            assert_eq!(answers.len(), 2);
        }
    };
    frame("a", "b").await;
    let after_first = last_index();

    let proposer = node.proposer.clone();
    let mut lone = tokio::spawn(async move { proposer.propose(reset("c"), deadline()).await });
    // Not a timing bound: a lone command that did not wait is answered in milliseconds;
    // one that waits is answered only after the frame below.
    let early = tokio::time::timeout(std::time::Duration::from_millis(300), &mut lone).await;
    assert!(
        early.is_err(),
        "the lone command left without waiting for the frame's sender: {early:?}"
    );
    frame("d", "e").await;
    lone.await.expect("joined").expect("the lone command");
    assert_eq!(
        last_index(),
        after_first.map(|index| index + 1),
        "the lone command and the frame in one entry"
    );
}
