//! Bounded state, refused at the door (docs/operations.md, "State limits"): the leader
//! re-checks every command a peer forwards, and admits a new claim only below
//! `claims_max` / `tenant_claims_max`, so a flood gets RESOURCE_EXHAUSTED naming the
//! limit, memory stays bounded, and a restart replays into no more than the limit.
//!
//! The fleets here are plaintext on loopback: the forged `Propose` reaches `raft_addr`
//! without a certificate. With `[peer_tls]` (and the member identity checks on
//! `raft_addr`) such a sender is refused before its payload is read; this tests what the
//! leader does with a command that got that far anyway (a member that misbehaves).

mod common;

use std::time::Duration;

use ankusa_fleet::codec;
use ankusa_fleet::pb;
use ankusa_fleet::pb::fleet_client::FleetClient;
use ankusa_fleet::pb::internal::peer_client::PeerClient;
use ankusa_fleet::pb::internal::RaftMessage;
use ankusa_fleet::raft::{ProposeRequest, ProposeResponse};
use ankusa_fleet::state::{
    Answer, BucketKey, Charge, ClaimKey, ClaimRequest, Command, EncodedCommand, HitAnswer, Kind,
    Refusal, SettleAnswer, SettleOutcome,
};
use common::*;

fn tenant_charge(tenant: &str, increment_us: u64, capacity_us: u64) -> Charge {
    Charge {
        bucket: BucketKey::Tenant {
            kind: Kind::Hooks,
            tenant: tenant.into(),
        },
        increment_us,
        capacity_us,
    }
}

fn claim_key(tenant: &str, key: &str) -> ClaimKey {
    ClaimKey {
        tenant: tenant.into(),
        source_id: "stripe".into(),
        key: key.into(),
    }
}

/// Sends `commands` as one `Propose` from a process that is no member, as node 99 would.
async fn forge_propose(raft_addr: &str, commands: Vec<Command>) -> ProposeResponse {
    let mut peer = PeerClient::connect(format!("http://{raft_addr}"))
        .await
        .expect("connect to raft_addr");
    let request = ProposeRequest {
        commands: EncodedCommand::encode_all(&commands).expect("encode"),
        timeout_ms: 5_000,
    };
    let message = RaftMessage {
        cluster_id: "ankusa-fleet".to_owned(),
        from_node_id: 99,
        payload: codec::encode(&request).expect("encode"),
    };
    let answer = tokio::time::timeout(Duration::from_secs(10), peer.propose(message))
        .await
        .expect("answered in time")
        .expect("propose answered");
    codec::decode(&answer.into_inner().payload).expect("a ProposeResponse")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_invalid_command_is_refused_by_position_and_the_rest_commit() {
    init_tracing();
    let fleet = Fleet::start_plain(3, "").await;
    let leader = fleet.wait_for_leader(&[1, 2, 3]).await;
    let raft_addr = fleet.nodes[&leader].spec.raft_addr.clone();

    tracing::info!("--- one Propose: a valid claim, the forged hit, an oversized charge, a settle");
    let year_us = 365 * 86_400 * 1_000_000;
    let commands = vec![
        Command::Hit {
            charges: Vec::new(),
            claim: Some(ClaimRequest {
                key: claim_key("acme", "evt-held"),
                hook_id: "hook-a".into(),
                ttl_ms: 3_600_000,
                pending_ttl_ms: 60_000,
            }),
            node: leader,
        },
        // What was once committed: a 300-byte tenant, increment = capacity = 2^62 us.
        Command::Hit {
            charges: vec![tenant_charge(&"v".repeat(300), 1 << 62, 1 << 62)],
            claim: None,
            node: leader,
        },
        // A valid tenant, but a charge no edge call may make (a year is past the default
        // capacity_us_max of 31 days).
        Command::Hit {
            charges: vec![tenant_charge("victim", year_us, year_us)],
            claim: None,
            node: leader,
        },
        Command::Settle {
            key: claim_key("acme", "evt-settled"),
            hook_id: "hook-s".into(),
            outcome: SettleOutcome::Commit,
            ttl_ms: 3_600_000,
            node: leader,
        },
    ];
    let answers = forge_propose(&raft_addr, commands).await.expect("taken");
    assert_eq!(answers.len(), 4, "{answers:?}");
    assert_eq!(answers[0], Answer::Hit(HitAnswer::Allowed));
    let field_of = |answer: &Answer| match answer {
        Answer::Refused(Refusal::Invalid { field, .. }) => field.clone(),
        other => panic!("not refused as invalid: {other:?}"),
    };
    assert_eq!(field_of(&answers[1]), "commands[1].charges[0].tenant");
    assert_eq!(field_of(&answers[2]), "commands[2].charges[0].increment_us");
    assert_eq!(answers[3], Answer::Settle(SettleAnswer::Recreated));

    tracing::info!("--- the valid commands committed, the refused ones wrote nothing");
    let mut client = fleet.client(leader).await;
    let (held, _) = send_hit(
        &mut client,
        hit(vec![], Some(claim("acme", "evt-held", "hook-b"))),
    )
    .await;
    assert!(matches!(held, Outcome::Pending(_)), "{held:?}");
    let (settled, _) = send_hit(
        &mut client,
        hit(vec![], Some(claim("acme", "evt-settled", "hook-b"))),
    )
    .await;
    assert_eq!(settled, Outcome::Duplicate("hook-s".to_owned()));
    let (victim, _) = send_hit(&mut client, hit(vec![hooks("victim", 1_000, 10_000)], None)).await;
    assert_eq!(
        victim,
        Outcome::Allowed,
        "the victim's bucket was never charged"
    );
}

fn vm_rss_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|kb| kb.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .expect("VmRSS")
        * 1024
}

const CLAIMS_MAX: u64 = 2_000;
const TENANT_CLAIMS_MAX: u64 = 1_500;
/// Settles sent in all, each a new claim: many times the limit, with long keys.
const FLOOD: usize = 40_000;
const IN_FLIGHT: usize = 128;
/// The most a node's RSS may grow through the flood: twice what it grows by with the limit
/// (16 to 25 MiB in debug builds: the claims the limit admits take about 3 MiB, the rest is
/// the log's tail, snapshots and allocator slack). Unbounded, the flood's 40,000 claims of
/// 1 KiB keys would add about 58 MiB on top of that.
const RSS_GROWTH_MAX: u64 = 48 << 20;
/// How long the restarted fleet may take to elect a leader: each node reads the whole
/// flood back from its log, a debug build on a shared machine takes its time.
const RESTART_LEADER_DEADLINE: Duration = Duration::from_secs(120);

/// How a settle ended: its status, or the gRPC error.
async fn settle_all(
    client: &FleetClient<tonic::transport::Channel>,
    requests: Vec<pb::SettleRequest>,
) -> Vec<Result<i32, tonic::Status>> {
    use futures::StreamExt;
    futures::stream::iter(requests)
        .map(|request| {
            let mut client = client.clone();
            async move { client.settle(request).await.map(|r| r.into_inner().status) }
        })
        .buffered(IN_FLIGHT)
        .collect()
        .await
}

fn long_key(n: usize) -> String {
    format!("{n:0>1024}")
}

fn exhausted_naming(result: &Result<i32, tonic::Status>, limit: &str) -> bool {
    matches!(result, Err(status) if status.code() == tonic::Code::ResourceExhausted
        && names_field(status.message(), limit))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_unique_keys_stops_at_claims_max_and_a_restart_replays_within_it() {
    init_tracing();
    // Slower heartbeats and elections than the default: after the restart every node reads
    // the whole flood back from its log, and a debug build on a shared machine answers
    // `AppendEntries` late while it does.
    let limits = format!(
        "claims_max = {CLAIMS_MAX}\ntenant_claims_max = {TENANT_CLAIMS_MAX}\n\
         heartbeat_ms = 250\nelection_timeout_ms_min = 1500\nelection_timeout_ms_max = 3000"
    );
    let mut fleet = Fleet::start_plain(3, &limits).await;
    let leader = fleet.wait_for_leader(&[1, 2, 3]).await;
    let follower = (1..=3).find(|id| *id != leader).expect("a follower");
    let client = fleet.client(follower).await;
    let rss_before: Vec<u64> = (1..=3)
        .map(|id| vm_rss_bytes(fleet.pid(id).expect("running")))
        .collect();

    tracing::info!("--- one tenant floods: stopped at tenant_claims_max");
    let flood = |tenant: &dyn Fn(usize) -> String, range: std::ops::Range<usize>| {
        range
            .map(|n| {
                let key = long_key(n);
                settle(&tenant(n), &key, "hook-flood", pb::SettleOutcome::Commit)
            })
            .collect::<Vec<_>>()
    };
    let one_tenant = settle_all(&client, flood(&|_| "flood".to_owned(), 0..3_000)).await;
    let recreated = one_tenant
        .iter()
        .filter(|r| matches!(r, Ok(s) if *s == pb::SettleStatus::Recreated as i32))
        .count();
    assert_eq!(recreated as u64, TENANT_CLAIMS_MAX);
    assert!(
        one_tenant
            .iter()
            .filter(|r| r.is_err())
            .all(|r| exhausted_naming(r, "tenant_claims_max")),
        "every refusal names tenant_claims_max: {:?}",
        one_tenant
            .iter()
            .find(|r| !exhausted_naming(r, "tenant_claims_max") && r.is_err())
    );

    tracing::info!("--- another tenant is unaffected by that tenant's limit");
    let mut edge = fleet.client(leader).await;
    let quiet = settle("quiet", "evt-1", "hook-q", pb::SettleOutcome::Commit);
    let quiet = send_settle(&mut edge, quiet).await;
    assert_eq!(quiet.status, pb::SettleStatus::Recreated as i32);

    tracing::info!("--- many tenants flood, far past claims_max");
    let many = settle_all(&client, flood(&|n| format!("t{}", n % 500), 3_000..FLOOD)).await;
    let admitted = many.iter().filter(|r| r.is_ok()).count() as u64;
    assert_eq!(
        admitted,
        CLAIMS_MAX - TENANT_CLAIMS_MAX - 1,
        "the quiet claim counts too"
    );
    assert!(
        many.iter()
            .filter(|r| r.is_err())
            .all(|r| exhausted_naming(r, "claims_max")),
        "{:?}",
        many.iter()
            .find(|r| r.is_err() && !exhausted_naming(r, "claims_max"))
    );
    tracing::info!("--- a hit that would take a new claim is refused too, and spends nothing");
    let refused = edge
        .hit(hit(
            vec![hooks("quiet", 1_000, 1_000)],
            Some(claim("quiet", "evt-2", "hook-q")),
        ))
        .await
        .expect_err("refused");
    assert_eq!(refused.code(), tonic::Code::ResourceExhausted);
    assert!(
        names_field(refused.message(), "claims_max"),
        "{}",
        refused.message()
    );
    let (spent, _) = send_hit(&mut edge, hit(vec![hooks("quiet", 1_000, 1_000)], None)).await;
    assert_eq!(spent, Outcome::Allowed, "the refused hit spent no charge");

    for id in 1..=3 {
        fleet
            .wait_for("the claims gauge at the limit", || async {
                fleet
                    .metric(id, "ankusa_state_claims")
                    .await
                    .filter(|claims| *claims as u64 == CLAIMS_MAX)
            })
            .await;
        let rss = vm_rss_bytes(fleet.pid(id).expect("running"));
        let growth = rss.saturating_sub(rss_before[id as usize - 1]);
        tracing::info!(node = id, rss, growth, "RSS after the flood");
        assert!(growth < RSS_GROWTH_MAX, "node {id} grew {growth} bytes");
    }

    tracing::info!("--- every node stops and starts again: the replay stays within the limit");
    for id in 1..=3 {
        fleet.stop(id).await;
    }
    for id in 1..=3 {
        fleet.restart(id);
    }
    let deadline = tokio::time::Instant::now() + RESTART_LEADER_DEADLINE;
    let leader = loop {
        let mut leaders = Vec::new();
        for id in 1..=3 {
            leaders.push(fleet.status(id).await.map_or(0, |status| status.leader_id));
        }
        if leaders[0] != 0 && leaders.iter().all(|leader| *leader == leaders[0]) {
            break leaders[0];
        }
        if tokio::time::Instant::now() > deadline {
            fleet.fail("no leader after the restart");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let mut edge = fleet.client(leader).await;
    let (duplicate, _) = send_hit(
        &mut edge,
        hit(vec![], Some(claim("flood", &long_key(0), "hook-other"))),
    )
    .await;
    assert_eq!(duplicate, Outcome::Duplicate("hook-flood".to_owned()));
    for id in 1..=3 {
        let claims = fleet
            .wait_for("the claims gauge after the restart", || async {
                fleet
                    .metric(id, "ankusa_state_claims")
                    .await
                    .filter(|claims| *claims as u64 == CLAIMS_MAX)
            })
            .await;
        assert!(claims as u64 <= CLAIMS_MAX, "node {id}: {claims}");
    }
    let refused = edge
        .settle(settle(
            "late",
            "evt-late",
            "hook-late",
            pb::SettleOutcome::Commit,
        ))
        .await
        .expect_err("still full");
    assert_eq!(refused.code(), tonic::Code::ResourceExhausted);
}
