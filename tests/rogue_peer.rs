//! A hostile process that reaches `raft_addr` of a plaintext fleet (the cluster id right,
//! everything else wrong): thousands of seeded random and mutated frames to every `Peer`
//! method, unary and on `Exchange`. Every node stays alive and the fleet still answers
//! from the fleet afterwards. (With `[peer_tls]` such a process is refused at the
//! handshake: tests/security.rs.) A forged snapshot, well formed on the outside, is refused
//! before openraft sees it, and every node goes on applying; so is an entry whose command
//! does not decode.

mod common;

use std::time::Duration;

use ankusa_fleet::codec;
use ankusa_fleet::pb::internal::peer_client::PeerClient;
use ankusa_fleet::pb::internal::{PeerFrame, PeerMethod, RaftMessage};
use ankusa_fleet::raft::snapshot::{SnapshotBody, FORMAT_VERSION, HEADER_LEN};
use ankusa_fleet::raft::{
    LogId, MemberNode, NodeId, ProposeRequest, SnapshotMeta, StoredMembership, TypeConfig,
};
use common::*;
use openraft::raft::{AppendEntriesRequest, InstallSnapshotRequest, VoteRequest};
use openraft::{CommittedLeaderId, Membership, Vote};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tonic::transport::Channel;

const TENANT: &str = "acme";
/// Frames per method per node, unary; as many again on one `Exchange` stream per node.
const FRAMES_PER_METHOD: usize = 250;
const SEED: u64 = 14;
/// The frames that aborted a node before decoding had a limit.
const PROPOSE_THAT_ABORTED: [u8; 13] = [1, 1, 1, 1, 0xfd, 0, 0, 0, 0, 0, 0, 0, 0x40];

/// A plaintext `Peer` client of node `id`'s `raft_addr`.
async fn peer_client(fleet: &Fleet, id: u64) -> PeerClient<Channel> {
    let addr = format!("http://{}", fleet.nodes[&id].spec.raft_addr);
    let channel = Channel::from_shared(addr)
        .expect("uri")
        .connect()
        .await
        .expect("connect");
    PeerClient::new(channel)
}

/// Valid encodings of each method's request under term 0 (below any real vote), to mutate.
fn bases() -> Vec<(PeerMethod, Vec<u8>)> {
    let vote = VoteRequest::<NodeId> {
        vote: Vote::new(0, 99),
        last_log_id: None,
    };
    let append = AppendEntriesRequest::<TypeConfig> {
        vote: Vote::new_committed(0, 99),
        prev_log_id: None,
        entries: Vec::new(),
        leader_commit: None,
    };
    let install = InstallSnapshotRequest::<TypeConfig> {
        vote: Vote::new_committed(0, 99),
        meta: Default::default(),
        offset: 0,
        data: vec![0xab; 64],
        done: false,
    };
    let propose = ProposeRequest {
        commands: Vec::<ankusa_fleet::state::Command>::new(),
        timeout_ms: 50,
    };
    vec![
        (PeerMethod::Vote, codec::encode(&vote).expect("encode")),
        (
            PeerMethod::AppendEntries,
            codec::encode(&append).expect("encode"),
        ),
        (
            PeerMethod::InstallSnapshot,
            codec::encode(&install).expect("encode"),
        ),
        (
            PeerMethod::Propose,
            codec::encode(&propose).expect("encode"),
        ),
    ]
}

/// Random bytes, the aborting corpus, or `base` with a few bytes flipped, set to a varint
/// marker, cut or inserted.
fn frame(rng: &mut StdRng, base: &[u8]) -> Vec<u8> {
    match rng.gen_range(0..10) {
        0..=2 => (0..rng.gen_range(0..200)).map(|_| rng.gen()).collect(),
        3 => PROPOSE_THAT_ABORTED.to_vec(),
        4 => vec![0xff; 25],
        _ => {
            let mut bytes = base.to_vec();
            for _ in 0..rng.gen_range(1..5) {
                if bytes.is_empty() {
                    bytes.push(rng.gen());
                    continue;
                }
                let i = rng.gen_range(0..bytes.len());
                match rng.gen_range(0..4) {
                    0 => bytes[i] ^= 1 << rng.gen_range(0..8),
                    1 => bytes[i] = [0xfb, 0xfc, 0xfd, 0xff][rng.gen_range(0..4)],
                    2 => bytes.truncate(i),
                    _ => bytes.insert(i, rng.gen()),
                }
            }
            bytes
        }
    }
}

async fn unary(client: &mut PeerClient<Channel>, method: PeerMethod, payload: Vec<u8>) {
    let message = RaftMessage {
        cluster_id: "ankusa-fleet".to_owned(),
        from_node_id: 99,
        payload,
    };
    let call = async {
        match method {
            PeerMethod::Vote => client.vote(message).await.map(drop),
            PeerMethod::AppendEntries => client.append_entries(message).await.map(drop),
            PeerMethod::InstallSnapshot => client.install_snapshot(message).await.map(drop),
            _ => client.propose(message).await.map(drop),
        }
    };
    // Answers are not the point (most are INVALID_ARGUMENT); the node staying up is.
    let _ = tokio::time::timeout(Duration::from_secs(5), call).await;
}

/// Sends `frames` on one `Exchange` stream and reads answers until the stream ends or goes
/// quiet; returns how many answers came back.
async fn exchange(client: &mut PeerClient<Channel>, frames: Vec<PeerFrame>) -> usize {
    let count = frames.len();
    let Ok(Ok(answers)) = tokio::time::timeout(
        Duration::from_secs(10),
        client.exchange(futures::stream::iter(frames)),
    )
    .await
    else {
        return 0;
    };
    let mut answers = answers.into_inner();
    let mut answered = 0;
    while answered < count {
        match tokio::time::timeout(Duration::from_secs(5), answers.message()).await {
            Ok(Ok(Some(_))) => answered += 1,
            _ => break,
        }
    }
    answered
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seeded_garbage_to_every_peer_method_stops_no_node() {
    init_tracing();
    let fleet = Fleet::start_plain(3, "").await;
    fleet.wait_for_leader(&[1, 2, 3]).await;
    fleet
        .commit_claims(&[1, 2, 3], TENANT, &keys("before", 10), 4)
        .await;
    let mut rng = StdRng::seed_from_u64(SEED);
    let bases = bases();

    for id in 1..=3 {
        tracing::info!(
            node = id,
            "--- unary frames to every Peer method, then one Exchange stream"
        );
        let mut client = peer_client(&fleet, id).await;
        let mut frames = Vec::new();
        for (method, base) in &bases {
            for n in 0..FRAMES_PER_METHOD {
                unary(&mut client, *method, frame(&mut rng, base)).await;
                frames.push(PeerFrame {
                    call_id: (frames.len() + n) as u64,
                    // Now and then a method number no Peer method has.
                    method: if rng.gen_range(0..20) == 0 {
                        rng.gen_range(5..1000)
                    } else {
                        *method as i32
                    },
                    cluster_id: "ankusa-fleet".to_owned(),
                    from_node_id: 99,
                    payload: frame(&mut rng, base),
                    ..PeerFrame::default()
                });
            }
        }
        let sent = frames.len();
        let answered = exchange(&mut client, frames).await;
        tracing::info!(node = id, sent, answered, "Exchange frames answered");
        // No fault rules are set: every frame is answered, refused or not.
        assert_eq!(answered, sent, "node {id} left Exchange frames unanswered");
    }

    tracing::info!("--- every node is alive, and the fleet answers from the fleet");
    let mut fleet = fleet;
    assert_exited_none(&mut fleet);
    fleet.wait_for_leader(&[1, 2, 3]).await;
    let after = keys("after", 30);
    fleet.commit_claims(&[1, 2, 3], TENANT, &after, 4).await;
    for id in 1..=3 {
        fleet.assert_duplicates(id, TENANT, &after, 4).await;
        fleet
            .assert_duplicates(id, TENANT, &keys("before", 10), 4)
            .await;
    }
    assert_exited_none(&mut fleet);
}

/// No node process exited (a panic or abort would have ended it).
fn assert_exited_none(fleet: &mut Fleet) {
    for id in 1..=3 {
        let exited = fleet.try_exit_status(id);
        assert!(exited.is_none(), "node {id} exited: {exited:?}");
    }
}

/// `body` behind a header whose magic, version, length and CRC-32 are all right.
fn sealed(body: &[u8]) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(HEADER_LEN + body.len());
    bytes.extend_from_slice(b"AKFS");
    bytes.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    bytes.extend_from_slice(&(body.len() as u64).to_le_bytes());
    bytes.extend_from_slice(&crc32fast::hash(body).to_le_bytes());
    bytes.extend_from_slice(body);
    bytes
}

/// Sends a whole snapshot in one `InstallSnapshot` call to `id`, as `leader` under `vote`;
/// the status it was refused with (`None`: taken).
async fn install(
    fleet: &Fleet,
    id: u64,
    leader: u64,
    vote: Vote<NodeId>,
    meta: SnapshotMeta,
    data: Vec<u8>,
) -> Option<tonic::Status> {
    let request = InstallSnapshotRequest::<TypeConfig> {
        vote,
        meta,
        offset: 0,
        data,
        done: true,
    };
    let message = RaftMessage {
        cluster_id: "ankusa-fleet".to_owned(),
        from_node_id: leader,
        payload: codec::encode(&request).expect("encode"),
    };
    let mut client = peer_client(fleet, id).await;
    let call = client.install_snapshot(message);
    match tokio::time::timeout(Duration::from_secs(10), call).await {
        Ok(answer) => answer.err(),
        Err(_) => fleet.fail(&format!("node {id} did not answer InstallSnapshot")),
    }
}

/// The forged `InstallSnapshot` that once froze a follower: under the leader's own vote, a
/// meta covering entries far past the follower's log, and a snapshot whose header, length
/// and CRC are right over a body of 64 garbage bytes. It passed the header check, failed
/// inside openraft's install and stopped the follower's Raft core, which then applied
/// nothing more while saying it was fine. Now it is refused naming `data`; so is a good
/// body whose meta claims more than it covers (`meta.last_log_id`); and every node goes on
/// applying past the leader's index at the time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_snapshot_is_refused_by_field_and_every_node_keeps_applying() {
    init_tracing();
    let mut fleet = Fleet::start_plain(3, "").await;
    let leader = fleet.wait_for_leader(&[1, 2, 3]).await;
    fleet
        .commit_claims(&[1, 2, 3], TENANT, &keys("before", 10), 4)
        .await;
    let follower = (1..=3).find(|id| *id != leader).expect("a follower");
    let status = fleet.status(leader).await.expect("leader status");
    let vote = Vote::new_committed(status.term, leader);
    let committed = |index| LogId::new(CommittedLeaderId::new(status.term, leader), index);
    let nodes = fleet
        .initial
        .iter()
        .map(|spec| {
            let node = MemberNode {
                api_addr: spec.api_addr.clone(),
                raft_addr: spec.raft_addr.clone(),
            };
            (spec.id, node)
        })
        .collect::<std::collections::BTreeMap<_, _>>();
    let meta = SnapshotMeta {
        last_log_id: Some(committed(status.last_applied + 1_000)),
        last_membership: StoredMembership::new(Some(committed(1)), Membership::from(nodes)),
        snapshot_id: "forged".to_owned(),
    };

    tracing::info!(
        follower,
        "--- a right header over a garbage body: refused as `data`"
    );
    let refused = install(
        &fleet,
        follower,
        leader,
        vote,
        meta.clone(),
        sealed(&[0xab; 64]),
    )
    .await
    .unwrap_or_else(|| fleet.fail("the forged snapshot was taken"));
    assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{refused:?}");
    assert!(names_field(refused.message(), "data"), "{refused:?}");

    tracing::info!(
        follower,
        "--- a good body under a meta that claims more: refused"
    );
    let good = ankusa_fleet::raft::snapshot::encode(&SnapshotBody::default()).expect("encode");
    let refused = install(&fleet, follower, leader, vote, meta, good)
        .await
        .unwrap_or_else(|| fleet.fail("a snapshot not fitting its meta was taken"));
    assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{refused:?}");
    assert!(
        names_field(refused.message(), "meta.last_log_id"),
        "{refused:?}"
    );

    tracing::info!("--- every node applies past the leader's index at the time");
    let index_then = fleet
        .last_applied(leader)
        .await
        .unwrap_or_else(|| fleet.fail("the leader does not answer Status"));
    let leader = fleet.wait_for_leader(&[1, 2, 3]).await;
    fleet
        .commit_claims(&[1, 2, 3], TENANT, &keys("after", 10), 4)
        .await;
    for id in 1..=3 {
        let applied = fleet
            .wait_for(&format!("node {id} applies past {index_then}"), || async {
                let applied = fleet.last_applied(id).await?;
                (applied > index_then).then_some(applied)
            })
            .await;
        let status = fleet.status(id).await.expect("status");
        assert!(
            !status.degraded_reason.starts_with("raft core stopped"),
            "node {id}: {status:?}"
        );
        tracing::info!(id, applied, leader, "applying");
    }
    assert_exited_none(&mut fleet);
}

/// A forged `AppendEntries` under the leader's own vote whose entry holds a command that
/// does not decode: the follower refuses it naming the command, before openraft (and so
/// its log) sees the entry. Written, it could never be applied: the follower's Raft core
/// would stop at apply, and again at every restart. Every node goes on applying.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_entry_whose_command_does_not_decode_is_refused_before_it_is_written() {
    use ankusa_fleet::state::{Command, EncodedCommand, FleetRequest, StateLimits};
    init_tracing();
    let mut fleet = Fleet::start_plain(3, "").await;
    let leader = fleet.wait_for_leader(&[1, 2, 3]).await;
    fleet
        .commit_claims(&[1, 2, 3], TENANT, &keys("before", 10), 4)
        .await;
    let follower = (1..=3).find(|id| *id != leader).expect("a follower");
    let status = fleet.status(leader).await.expect("leader status");
    let log_id = |index| LogId::new(CommittedLeaderId::new(status.term, leader), index);

    tracing::info!(
        follower,
        "--- an entry with a sound command and one of garbage: refused by position"
    );
    let sound = EncodedCommand::encode(&Command::Reset {
        tenant: TENANT.into(),
    })
    .expect("encode");
    let garbage = EncodedCommand::from_bytes(vec![0x7f, 0xff, 0x01].into());
    let entry = ankusa_fleet::raft::Entry {
        log_id: log_id(status.last_applied + 1),
        payload: openraft::EntryPayload::Normal(FleetRequest {
            now_us: 1,
            limits: StateLimits::UNLIMITED,
            commands: vec![sound, garbage].into(),
        }),
    };
    let request = AppendEntriesRequest::<TypeConfig> {
        vote: Vote::new_committed(status.term, leader),
        prev_log_id: Some(log_id(status.last_applied)),
        entries: vec![entry],
        leader_commit: None,
    };
    let message = RaftMessage {
        cluster_id: "ankusa-fleet".to_owned(),
        from_node_id: leader,
        payload: codec::encode(&request).expect("encode"),
    };
    let mut client = peer_client(&fleet, follower).await;
    let refused = tokio::time::timeout(Duration::from_secs(10), client.append_entries(message))
        .await
        .unwrap_or_else(|_| fleet.fail("no answer to AppendEntries"))
        .expect_err("an entry with a command that does not decode was taken");
    assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{refused:?}");
    assert!(
        names_field(refused.message(), "entries[0].payload.commands[1]"),
        "{refused:?}"
    );

    tracing::info!("--- every node applies past the leader's index at the time");
    let index_then = status.last_applied;
    fleet
        .commit_claims(&[1, 2, 3], TENANT, &keys("after", 10), 4)
        .await;
    for id in 1..=3 {
        fleet
            .wait_for(&format!("node {id} applies past {index_then}"), || async {
                let applied = fleet.last_applied(id).await?;
                (applied > index_then).then_some(applied)
            })
            .await;
        let status = fleet.status(id).await.expect("status");
        assert!(
            !status.degraded_reason.starts_with("raft core stopped"),
            "node {id}: {status:?}"
        );
    }
    assert_exited_none(&mut fleet);
}
