//! Who may call what on `raft_addr` (docs/security.md, "Identities"): a certificate speaks
//! for the identity in its URI SAN only. The admin certificate sends no Raft traffic, a node
//! sends only as itself and only while it is a member (a learner never votes or leads), only
//! the admin changes or reads out the fleet, a certificate without an identity (or expired)
//! is refused, a follower answers admin calls with the leader's address and the commands
//! follow it, and a fleet made with openssl from the documented recipe works.

#[path = "../common/mod.rs"]
mod common;
mod learner;
mod openssl;

use std::path::Path;
use std::time::Duration;

use ankusa_fleet::codec;
use ankusa_fleet::pb::internal::admin_client::AdminClient;
use ankusa_fleet::pb::internal::peer_client::PeerClient;
use ankusa_fleet::pb::internal::{
    AddMemberRequest, ClusterStatusRequest, PeerFrame, PeerMethod, RaftMessage,
    RemoveMemberRequest, SaveSnapshotRequest, SetFaultsRequest,
};
use ankusa_fleet::raft::{NodeId, ProposeRequest, ProposeResponse, TypeConfig};
use ankusa_fleet::state::{Answer, ClaimKey, Command, EncodedCommand, Refusal, SettleOutcome};
use common::*;
use openraft::raft::{AppendEntriesRequest, InstallSnapshotRequest, VoteRequest};
use openraft::Vote;
use tonic::transport::{Channel, ClientTlsConfig};

const TENANT: &str = "acme";
const CLUSTER_ID: &str = "ankusa-fleet";
/// How long one call to a node may take before the test calls it lost.
const CALL_DEADLINE: Duration = Duration::from_secs(10);

/// A client TLS config presenting `cert` and `key` (files of the fleet's certs folder).
fn tls_with(fleet: &Fleet, cert: &Path, key: &Path) -> ClientTlsConfig {
    ankusa_fleet::tls::client_from_files(&fleet.cert_file("ca.pem"), Some((cert, key)))
        .expect("client tls")
}

/// The TLS of the fleet's own `NAME.pem` and `NAME.key` (`admin`, `node3`, ...).
fn tls_as(fleet: &Fleet, name: &str) -> ClientTlsConfig {
    tls_with(
        fleet,
        &fleet.cert_file(&format!("{name}.pem")),
        &fleet.cert_file(&format!("{name}.key")),
    )
}

async fn channel(addr: &str, tls: ClientTlsConfig) -> Result<Channel, tonic::Status> {
    ankusa_fleet::tls::endpoint(addr, Some(&tls))
        .expect("endpoint")
        .connect_timeout(CALL_DEADLINE)
        .connect()
        .await
        .map_err(|e| tonic::Status::unavailable(format!("connect: {e:?}")))
}

/// A well-formed request of `method` as node `leader_id` would send it in term `term`.
fn payload(method: PeerMethod, term: u64, leader_id: NodeId) -> Vec<u8> {
    match method {
        PeerMethod::Vote => codec::encode(&VoteRequest::<NodeId> {
            vote: Vote::new(term, leader_id),
            last_log_id: None,
        }),
        PeerMethod::AppendEntries => codec::encode(&AppendEntriesRequest::<TypeConfig> {
            vote: Vote::new_committed(term, leader_id),
            prev_log_id: None,
            entries: Vec::new(),
            leader_commit: None,
        }),
        PeerMethod::InstallSnapshot => codec::encode(&InstallSnapshotRequest::<TypeConfig> {
            vote: Vote::new_committed(term, leader_id),
            meta: Default::default(),
            offset: 0,
            data: vec![0xab; 64],
            done: false,
        }),
        _ => codec::encode(&ProposeRequest {
            commands: Vec::<ankusa_fleet::state::Command>::new(),
            timeout_ms: 50,
        }),
    }
    .expect("encode")
}

const PEER_METHODS: [PeerMethod; 4] = [
    PeerMethod::AppendEntries,
    PeerMethod::Vote,
    PeerMethod::InstallSnapshot,
    PeerMethod::Propose,
];

/// One unary `Peer` call with `tls` to `addr`.
async fn unary(
    addr: &str,
    tls: ClientTlsConfig,
    method: PeerMethod,
    from_node_id: NodeId,
    payload: Vec<u8>,
) -> Result<(), tonic::Status> {
    let mut client = PeerClient::new(channel(addr, tls).await?);
    let message = RaftMessage {
        cluster_id: CLUSTER_ID.to_owned(),
        from_node_id,
        payload,
    };
    let call = async {
        match method {
            PeerMethod::AppendEntries => client.append_entries(message).await,
            PeerMethod::Vote => client.vote(message).await,
            PeerMethod::InstallSnapshot => client.install_snapshot(message).await,
            _ => client.propose(message).await,
        }
    };
    match tokio::time::timeout(CALL_DEADLINE, call).await {
        Ok(answer) => answer.map(|_| ()),
        Err(_) => Err(tonic::Status::deadline_exceeded("no answer")),
    }
}

/// Node `id` (its own certificate) calls `method` on `addr` as itself, with the vote (or
/// the empty batch) of node `id` in `term`.
async fn as_node(
    fleet: &Fleet,
    addr: &str,
    id: NodeId,
    method: PeerMethod,
    term: u64,
) -> Result<(), tonic::Status> {
    let tls = tls_as(fleet, &format!("node{id}"));
    unary(addr, tls, method, id, payload(method, term, id)).await
}

/// Sends `frames` on one `Exchange` stream and returns each answer's error code and message,
/// by call id.
async fn exchange(
    addr: &str,
    tls: ClientTlsConfig,
    frames: Vec<PeerFrame>,
) -> Result<Vec<(u64, i32, String)>, tonic::Status> {
    let mut client = PeerClient::new(channel(addr, tls).await?);
    let count = frames.len();
    let (sender, receiver) = tokio::sync::mpsc::channel(count.max(1));
    for frame in frames {
        sender.send(frame).await.expect("queue a frame");
    }
    let call = async {
        let mut answers = client
            .exchange(tokio_stream::wrappers::ReceiverStream::new(receiver))
            .await?
            .into_inner();
        let mut seen = Vec::new();
        while seen.len() < count {
            let Some(answer) = answers.message().await? else {
                break;
            };
            seen.push((answer.call_id, answer.error_code, answer.error_message));
        }
        Ok(seen)
    };
    let seen = tokio::time::timeout(CALL_DEADLINE, call)
        .await
        .unwrap_or_else(|_| Err(tonic::Status::deadline_exceeded("no answers")));
    drop(sender);
    seen
}

/// `answer` is PERMISSION_DENIED and its message says `needle`.
fn assert_denied(what: &str, answer: Result<(), tonic::Status>, needle: &str) {
    match answer {
        Err(status) if status.code() == tonic::Code::PermissionDenied => assert!(
            status.message().contains(needle),
            "{what}: denied, but the message does not say {needle:?}: {}",
            status.message()
        ),
        other => panic!("{what}: expected PERMISSION_DENIED ({needle}), got {other:?}"),
    }
}

/// `answer` got past the identity checks: any answer but PERMISSION_DENIED from the service
/// (an empty or stale request may still be refused for what it says).
fn assert_admitted(what: &str, answer: Result<(), tonic::Status>) {
    if let Err(status) = &answer {
        assert_ne!(
            status.code(),
            tonic::Code::PermissionDenied,
            "{what}: {status:?}"
        );
        assert_ne!(
            status.code(),
            tonic::Code::Unavailable,
            "{what}: {status:?}"
        );
    }
}

/// Every `Admin` method once, with `tls`, to `addr`: (method, answer).
async fn every_admin_call(
    addr: &str,
    tls: ClientTlsConfig,
) -> Vec<(&'static str, Result<(), tonic::Status>)> {
    let mut admin = AdminClient::new(channel(addr, tls).await.expect("connect"));
    let cluster_id = CLUSTER_ID.to_owned();
    let save = async {
        let mut chunks = admin
            .clone()
            .save_snapshot(SaveSnapshotRequest {
                cluster_id: cluster_id.clone(),
            })
            .await?
            .into_inner();
        while chunks.message().await?.is_some() {}
        Ok(())
    };
    let save = tokio::time::timeout(CALL_DEADLINE, save)
        .await
        .expect("SaveSnapshot answers");
    let add = admin
        .add_member(AddMemberRequest {
            cluster_id: cluster_id.clone(),
            id: 9,
            api_addr: "127.0.0.1:1".to_owned(),
            raft_addr: "127.0.0.1:2".to_owned(),
            voter: false,
        })
        .await
        .map(|_| ());
    let remove = admin
        .remove_member(RemoveMemberRequest {
            cluster_id: cluster_id.clone(),
            id: 9,
        })
        .await
        .map(|_| ());
    let faults = admin
        .set_faults(SetFaultsRequest {
            cluster_id: cluster_id.clone(),
            ..SetFaultsRequest::default()
        })
        .await
        .map(|_| ());
    let status = admin
        .cluster_status(ClusterStatusRequest {
            cluster_id,
            digest: false,
        })
        .await
        .map(|_| ());
    vec![
        ("SaveSnapshot", save),
        ("AddMember", add),
        ("RemoveMember", remove),
        ("SetFaults", faults),
        ("ClusterStatus", status),
    ]
}

/// A certificate of the fleet CA with the given URI SANs, valid from `not_before` to
/// `not_after`; written as `name.pem` and `name.key` in the fleet's certs folder.
fn issue(
    fleet: &Fleet,
    name: &str,
    uris: &[&str],
    (not_before, not_after): (time::OffsetDateTime, time::OffsetDateTime),
) {
    let ca_key = rcgen::KeyPair::from_pem(
        &std::fs::read_to_string(fleet.cert_file("ca.key")).expect("ca.key"),
    )
    .expect("ca key");
    let issuer = rcgen::Issuer::from_ca_cert_pem(
        &std::fs::read_to_string(fleet.cert_file("ca.pem")).expect("ca.pem"),
        ca_key,
    )
    .expect("issuer");
    let key = rcgen::KeyPair::generate().expect("key");
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
    for uri in uris {
        params.subject_alt_names.push(rcgen::SanType::URI(
            rcgen::string::Ia5String::try_from(*uri).expect("ia5"),
        ));
    }
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
    (params.not_before, params.not_after) = (not_before, not_after);
    let cert = params.signed_by(&key, &issuer).expect("sign");
    std::fs::write(fleet.cert_file(&format!("{name}.pem")), cert.pem()).expect("write");
    std::fs::write(fleet.cert_file(&format!("{name}.key")), key.serialize_pem()).expect("write");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_certificate_speaks_only_for_its_own_identity() {
    init_tracing();
    let fleet = Fleet::start(3, "").await;
    let leader = fleet.wait_for_leader(&[1, 2, 3]).await;
    let follower = [1, 2, 3].into_iter().find(|id| *id != leader).expect("one");
    let other = [1, 2, 3]
        .into_iter()
        .find(|id| *id != leader && *id != follower)
        .expect("one");
    let follower_addr = fleet.nodes[&follower].spec.raft_addr.clone();
    let leader_addr = fleet.nodes[&leader].spec.raft_addr.clone();
    let term = cli_status(&fleet, leader).await.term;

    tracing::info!("--- admin.pem sends no Raft traffic, unary or on Exchange");
    for method in PEER_METHODS {
        let answer = unary(
            &follower_addr,
            tls_as(&fleet, "admin"),
            method,
            leader,
            payload(method, term + 1, leader),
        )
        .await;
        assert_denied(
            &format!("admin {method:?}"),
            answer,
            "identity admin may not call Peer",
        );
    }
    let frames: Vec<PeerFrame> = PEER_METHODS
        .iter()
        .enumerate()
        .map(|(i, method)| PeerFrame {
            call_id: i as u64 + 1,
            cluster_id: CLUSTER_ID.to_owned(),
            from_node_id: leader,
            method: *method as i32,
            payload: payload(*method, term + 1, leader),
            ..PeerFrame::default()
        })
        .collect();
    let answers = exchange(&follower_addr, tls_as(&fleet, "admin"), frames.clone()).await;
    assert_denied(
        "admin Exchange",
        answers.map(|_| ()),
        "identity admin may not call Peer",
    );
    // A member's stream is open, and each frame is checked on its own: node `other`'s
    // frames sent as the leader are refused one by one.
    let node_other = format!("node{other}");
    let answers = exchange(&follower_addr, tls_as(&fleet, &node_other), frames)
        .await
        .expect("a member's stream opens");
    assert_eq!(answers.len(), PEER_METHODS.len(), "{answers:?}");
    for (call_id, code, message) in &answers {
        assert_eq!(
            *code,
            tonic::Code::PermissionDenied as i32,
            "frame {call_id}: {message}"
        );
        assert!(
            message.contains(&format!("identity node {other} may not call Peer/")),
            "{message}"
        );
    }

    tracing::info!("--- a node speaks only as itself, and only while it is a member");
    let node = format!("node{follower}");
    // (from_node_id, methods, what the refusal says): as another node, then as itself but
    // with another node's vote inside.
    let posing = [
        (
            other,
            &PEER_METHODS[..],
            format!("identity node {follower} may not call"),
        ),
        (
            follower,
            &PEER_METHODS[..3],
            "vote.leader_id.node_id".to_owned(),
        ),
    ];
    for (from, methods, refusal) in posing {
        for method in methods {
            let answer = unary(
                &leader_addr,
                tls_as(&fleet, &node),
                *method,
                from,
                payload(*method, term + 1, other),
            )
            .await;
            assert_denied(
                &format!("node {follower} as {from}, vote of {other}: {method:?}"),
                answer,
                &refusal,
            );
        }
    }
    let answer = as_node(&fleet, &leader_addr, follower, PeerMethod::Propose, 0).await;
    assert_admitted("a member's Propose as itself", answer);
    // Node 5 has a certificate of the fleet CA but is no member.
    let answer = as_node(&fleet, &follower_addr, 5, PeerMethod::Vote, term + 1).await;
    assert_denied("node 5, no member", answer, "not a member");

    // A leader's traffic from a node this one does not know yet is heard (a node behind a
    // membership change must catch up): node 5's stale AppendEntries reaches openraft,
    // which answers with its own, higher vote.
    let answer = as_node(&fleet, &follower_addr, 5, PeerMethod::AppendEntries, 0).await;
    assert_admitted("node 5's stale AppendEntries", answer);

    tracing::info!("--- a node's Propose speaks for that node only");
    let commands = vec![
        Command::Reset {
            tenant: "acme-reset".into(),
        },
        Command::Settle {
            key: ClaimKey {
                tenant: TENANT.into(),
                source_id: "stripe".into(),
                key: "posed".into(),
            },
            hook_id: "hook-posed".into(),
            outcome: SettleOutcome::Commit,
            ttl_ms: 60_000,
            node: other,
        },
        Command::AbsorbRound {
            node: other,
            round: 12_345,
            charges: Vec::new(),
        },
    ];
    let answers = propose_as(&leader_addr, tls_as(&fleet, &node), follower, commands).await;
    assert_eq!(answers.len(), 3, "{answers:?}");
    assert!(
        !matches!(answers[0], Answer::Refused(_)),
        "the Reset names no node: {answers:?}"
    );
    for answer in &answers[1..] {
        match answer {
            Answer::Refused(Refusal::Invalid { field, reason }) => assert!(
                field.ends_with(".node") && reason.contains(&format!("node {follower} sent it")),
                "{field}: {reason}"
            ),
            other => panic!("a command naming node {other:?} was taken from node {follower}"),
        }
    }

    tracing::info!("--- only the admin changes or reads out the fleet; a node reads status");
    for (method, answer) in every_admin_call(&leader_addr, tls_as(&fleet, &node)).await {
        if method == "ClusterStatus" {
            answer.expect("a node reads ClusterStatus");
        } else {
            assert_denied(
                &format!("node {follower}: Admin/{method}"),
                answer,
                &format!("identity node {follower} may not call Admin/{method}"),
            );
        }
    }

    tracing::info!("--- a follower names the leader instead of forwarding");
    let mut admin = AdminClient::new(
        channel(&follower_addr, tls_as(&fleet, "admin"))
            .await
            .expect("connect"),
    );
    let refused = admin
        .remove_member(RemoveMemberRequest {
            cluster_id: CLUSTER_ID.to_owned(),
            id: 9,
        })
        .await
        .expect_err("a follower does not remove members");
    assert_eq!(
        refused.code(),
        tonic::Code::FailedPrecondition,
        "{refused:?}"
    );
    let named = refused
        .metadata()
        .get(ankusa_fleet::api::admin::LEADER_RAFT_ADDR_HEADER)
        .and_then(|value| value.to_str().ok())
        .map(str::to_owned);
    assert_eq!(named.as_deref(), Some(leader_addr.as_str()), "{refused:?}");

    tracing::info!("--- a certificate of the CA without an identity, or expired, is refused");
    let now = time::OffsetDateTime::now_utc();
    let valid = (
        now - time::Duration::hours(1),
        now + time::Duration::days(1),
    );
    issue(&fleet, "anonymous", &[], valid);
    issue(
        &fleet,
        "elsewhere",
        &["spiffe://another-fleet/admin"],
        valid,
    );
    for name in ["anonymous", "elsewhere"] {
        let answer = unary(
            &follower_addr,
            tls_as(&fleet, name),
            PeerMethod::Vote,
            leader,
            payload(PeerMethod::Vote, term + 1, leader),
        )
        .await;
        assert_denied(&format!("{name}: Peer/Vote"), answer, "names no identity");
        for (method, answer) in every_admin_call(&follower_addr, tls_as(&fleet, name)).await {
            assert_denied(
                &format!("{name}: Admin/{method}"),
                answer,
                "names no identity",
            );
        }
    }
    let expired = (now - time::Duration::days(3), now - time::Duration::days(1));
    issue(
        &fleet,
        "expired",
        &[&format!("spiffe://{CLUSTER_ID}/admin")],
        expired,
    );
    let answer = unary(
        &follower_addr,
        tls_as(&fleet, "expired"),
        PeerMethod::Propose,
        leader,
        payload(PeerMethod::Propose, 0, leader),
    )
    .await;
    let status = answer.expect_err("an expired certificate is refused at the handshake");
    assert_ne!(status.code(), tonic::Code::InvalidArgument, "{status:?}");

    tracing::info!("--- the fleet kept its leader and still answers from the fleet");
    assert_eq!(fleet.wait_for_leader(&[1, 2, 3]).await, leader);
    fleet
        .commit_claims(&[1, 2, 3], TENANT, &keys("identity", 6), 2)
        .await;
    fleet
        .assert_duplicates(follower, TENANT, &keys("identity", 6), 2)
        .await;
}

/// Sends `commands` as one `Propose` from node `from` with `tls`; its answers.
async fn propose_as(
    addr: &str,
    tls: ClientTlsConfig,
    from: NodeId,
    commands: Vec<Command>,
) -> Vec<Answer> {
    let mut client = PeerClient::new(channel(addr, tls).await.expect("connect"));
    let request = ProposeRequest {
        commands: EncodedCommand::encode_all(&commands).expect("encode"),
        timeout_ms: 5_000,
    };
    let message = RaftMessage {
        cluster_id: CLUSTER_ID.to_owned(),
        from_node_id: from,
        payload: codec::encode(&request).expect("encode"),
    };
    let answer = tokio::time::timeout(CALL_DEADLINE, client.propose(message))
        .await
        .expect("answered in time")
        .expect("Propose answered");
    let response: ProposeResponse =
        codec::decode(&answer.into_inner().payload).expect("a ProposeResponse");
    response.expect("the batch was taken")
}

async fn cli_status(fleet: &Fleet, id: u64) -> ankusa_fleet::pb::internal::ClusterStatusResponse {
    ankusa_fleet::cmd::cluster::cluster_status(&fleet.admin_target(id))
        .await
        .expect("cluster status with the admin certificate")
}
