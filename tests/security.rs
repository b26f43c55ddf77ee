//! Who may talk to a node (docs/security.md): with `[peer_tls]` only holders of a fleet
//! certificate reach `raft_addr`, `Admin` is served there and not to the edge, `[api_tls]`
//! puts the edge API behind TLS, a `raft_addr` off loopback needs `[peer_tls]`, and SIGTERM
//! drains a node under load without losing what it answered.

mod common;

use std::time::Duration;

use ankusa_fleet::cmd::cluster as cli;
use ankusa_fleet::pb;
use ankusa_fleet::pb::internal::admin_client::AdminClient;
use ankusa_fleet::pb::internal::peer_client::PeerClient;
use ankusa_fleet::pb::internal::{ClusterStatusRequest, RaftMessage};
use common::*;
use tonic::transport::{Channel, ClientTlsConfig};

const TENANT: &str = "acme";

/// A `Vote` with an empty payload: a caller that gets past TLS and the cluster id check is
/// answered INVALID_ARGUMENT (the payload does not decode); one refused earlier is not.
async fn vote_with_empty_payload(
    raft_addr: &str,
    tls: Option<ClientTlsConfig>,
    from_node_id: u64,
) -> Result<(), tonic::Status> {
    let endpoint = ankusa_fleet::tls::endpoint(raft_addr, tls.as_ref())
        .map_err(|e| tonic::Status::unavailable(e.to_string()))?
        .connect_timeout(Duration::from_secs(5));
    let channel = endpoint
        .connect()
        .await
        .map_err(|e| tonic::Status::unavailable(format!("connect: {e}")))?;
    let mut client = PeerClient::new(channel);
    let call = client.vote(RaftMessage {
        cluster_id: "ankusa-fleet".to_owned(),
        from_node_id,
        payload: Vec::new(),
    });
    match tokio::time::timeout(Duration::from_secs(10), call).await {
        Ok(answer) => answer.map(|_| ()),
        Err(_) => Err(tonic::Status::deadline_exceeded("no answer in 10 s")),
    }
}

fn refused_before_the_service(what: &str, answer: Result<(), tonic::Status>) {
    match answer {
        Err(status) if status.code() != tonic::Code::InvalidArgument => {
            tracing::info!(what, code = ?status.code(), message = status.message(), "refused");
        }
        other => panic!("{what}: reached the Peer service: {other:?}"),
    }
}

/// Waits for a leader through the `Admin` service (a fleet with `[api_tls]` has no
/// plaintext edge API for the harness' own status calls).
async fn wait_for_leader_by_admin(fleet: &Fleet, ids: &[u64]) -> u64 {
    fleet
        .wait_for("one leader known to all (Admin)", || async {
            let mut leaders = Vec::new();
            for id in ids {
                let status = cli::cluster_status(&fleet.admin_target(*id)).await.ok()?;
                leaders.push(status.leader_id);
            }
            let first = *leaders.first()?;
            (first != 0 && leaders.iter().all(|l| *l == first)).then_some(first)
        })
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peer_tls_admits_only_fleet_certificates_and_admin_is_not_on_the_edge_port() {
    init_tracing();
    let fleet = Fleet::start(3, "").await;
    let leader = fleet.wait_for_leader(&[1, 2, 3]).await;

    tracing::info!("--- the fleet forms over mutual TLS and answers from the fleet");
    fleet
        .commit_claims(&[1, 2, 3], TENANT, &keys("tls", 12), 4)
        .await;
    fleet
        .assert_duplicates(leader, TENANT, &keys("tls", 12), 4)
        .await;

    tracing::info!("--- a member's node certificate reaches the Peer service");
    let raft_addr = fleet.nodes[&leader].spec.raft_addr.clone();
    let ca = fleet.cert_file("ca.pem");
    let member = if leader == 1 { 2 } else { 1 };
    let node_cert = ankusa_fleet::tls::client_from_files(
        &ca,
        Some((
            &fleet.cert_file(&format!("node{member}.pem")),
            &fleet.cert_file(&format!("node{member}.key")),
        )),
    )
    .expect("client tls");
    let reached = vote_with_empty_payload(&raft_addr, Some(node_cert), member).await;
    assert_eq!(
        reached.expect_err("an empty payload").code(),
        tonic::Code::InvalidArgument
    );

    tracing::info!("--- plaintext, no client certificate and another CA's are refused");
    refused_before_the_service(
        "plaintext",
        vote_with_empty_payload(&raft_addr, None, member).await,
    );
    let no_cert = ankusa_fleet::tls::client_from_files(&ca, None).expect("client tls");
    refused_before_the_service(
        "no client certificate",
        vote_with_empty_payload(&raft_addr, Some(no_cert), member).await,
    );
    let foreign = fleet.dir.path().join("foreign");
    ankusa_fleet::cmd::certs::make_certs(&ankusa_fleet::cmd::certs::CertsPlan {
        hosts: vec![(1, fleet.ip.to_string())],
        ..ankusa_fleet::cmd::certs::CertsPlan::new(
            foreign.clone(),
            1,
            ankusa_fleet::config::Defaults::CLUSTER_ID,
        )
    })
    .expect("a foreign CA");
    let foreign_cert = ankusa_fleet::tls::client_from_files(
        &ca,
        Some((&foreign.join("admin.pem"), &foreign.join("admin.key"))),
    )
    .expect("client tls");
    refused_before_the_service(
        "another CA's certificate",
        vote_with_empty_payload(&raft_addr, Some(foreign_cert), member).await,
    );

    tracing::info!("--- Admin answers on raft_addr with a certificate, not on api_addr");
    let status = cli::cluster_status(&fleet.admin_target(leader))
        .await
        .expect("cluster status with the admin certificate");
    assert_eq!((status.node_id, status.leader_id), (leader, leader));
    assert_eq!(status.members.len(), 3);
    let by_config = cli::AdminTarget {
        addr: None,
        credentials: cli::Credentials {
            config: Some(fleet.nodes[&1].config_path.clone()),
            ..cli::Credentials::default()
        },
    };
    let status = cli::cluster_status(&by_config)
        .await
        .expect("cluster status with node 1's own config");
    assert_eq!(status.node_id, 1);
    let mut plaintext_target = fleet.admin_target(leader);
    (
        plaintext_target.credentials.ca,
        plaintext_target.credentials.cert,
        plaintext_target.credentials.key,
    ) = (None, None, None);
    assert!(
        cli::cluster_status(&plaintext_target).await.is_err(),
        "Admin answered a plaintext caller on raft_addr"
    );
    let mut other_fleet = fleet.admin_target(leader);
    other_fleet.credentials.cluster_id = Some("another-fleet".to_owned());
    let refused = cli::cluster_status(&other_fleet)
        .await
        .expect_err("Admin answered a call for another cluster");
    assert!(format!("{refused:#}").contains("cluster_id"), "{refused:#}");
    let api = Channel::from_shared(format!("http://{}", fleet.api_addr(leader)))
        .expect("uri")
        .connect()
        .await
        .expect("connect to api_addr");
    let on_api = AdminClient::new(api)
        .cluster_status(ClusterStatusRequest {
            cluster_id: "ankusa-fleet".to_owned(),
            digest: false,
        })
        .await
        .expect_err("Admin on api_addr");
    assert_eq!(on_api.code(), tonic::Code::Unimplemented, "{on_api:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_tls_serves_tls_only_and_asks_edge_clients_for_a_certificate() {
    init_tracing();
    let fleet = Fleet::start_with_api_tls(3, "");
    let leader = wait_for_leader_by_admin(&fleet, &[1, 2, 3]).await;
    let api_addr = fleet.api_addr(leader);
    let ca = fleet.cert_file("ca.pem");
    let connect = |tls: Option<ClientTlsConfig>| {
        let api_addr = api_addr.clone();
        async move {
            let endpoint = ankusa_fleet::tls::endpoint(&api_addr, tls.as_ref())
                .expect("endpoint")
                .connect_timeout(Duration::from_secs(5));
            let channel = endpoint.connect().await.map_err(|e| format!("{e:?}"))?;
            let mut client = pb::fleet_client::FleetClient::new(channel);
            let request = hit(vec![], Some(claim(TENANT, "k1", "hook-1")));
            let call = client.hit(request);
            match tokio::time::timeout(Duration::from_secs(10), call).await {
                Ok(Ok(response)) => Ok(response.into_inner()),
                Ok(Err(status)) => Err(format!("{status:?}")),
                Err(_) => Err("no answer in 10 s".to_owned()),
            }
        }
    };

    tracing::info!("--- a TLS edge client with a certificate of the CA is answered");
    let edge = ankusa_fleet::tls::client_from_files(
        &ca,
        Some((&fleet.cert_file("admin.pem"), &fleet.cert_file("admin.key"))),
    )
    .expect("client tls");
    let answered = connect(Some(edge)).await.expect("a TLS edge client");
    assert_eq!(outcome(&answered), Outcome::Allowed, "{answered:?}");

    tracing::info!("--- plaintext and a TLS client without a certificate are refused");
    let plaintext = connect(None).await;
    assert!(plaintext.is_err(), "plaintext answered: {plaintext:?}");
    let anonymous = ankusa_fleet::tls::client_from_files(&ca, None).expect("client tls");
    let anonymous = connect(Some(anonymous)).await;
    assert!(
        anonymous.is_err(),
        "no client certificate answered: {anonymous:?}"
    );
}

/// Writes a one-node config whose `raft_addr` listens on every interface, and runs it.
fn serve_exposed(dir: &std::path::Path, extra: &str) -> std::process::Child {
    let api = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let raft = std::net::TcpListener::bind("0.0.0.0:0").expect("bind");
    let (api_addr, raft_port) = (
        api.local_addr().expect("addr").to_string(),
        raft.local_addr().expect("addr").port(),
    );
    drop((api, raft));
    let raft_addr = format!("0.0.0.0:{raft_port}");
    let config = format!(
        "node_id = 1\napi_addr = \"{api_addr}\"\nraft_addr = \"{raft_addr}\"\n\
         data_dir = {:?}\n{extra}\n[[members]]\nid = 1\napi_addr = \"{api_addr}\"\n\
         raft_addr = \"{raft_addr}\"\n",
        dir.join("data").display().to_string()
    );
    let path = dir.join("node.toml");
    std::fs::write(&path, config).expect("write config");
    let log = std::fs::File::create(dir.join("node.log")).expect("log");
    std::process::Command::new(env!("CARGO_BIN_EXE_ankusa-fleet"))
        .args(["serve", "--config"])
        .arg(&path)
        .env("RUST_LIB_BACKTRACE", "0")
        .stdout(std::process::Stdio::from(log.try_clone().expect("log")))
        .stderr(std::process::Stdio::from(log))
        .spawn()
        .expect("spawn")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_raft_addr_off_loopback_starts_only_with_peer_tls_or_the_insecure_key() {
    init_tracing();
    let dir = tempfile::tempdir().expect("tempdir");

    tracing::info!("--- without [peer_tls] the node refuses to start, naming the key");
    let mut refused = serve_exposed(dir.path(), "");
    let status = wait_until("the node exits", || refused.try_wait().expect("wait")).await;
    let log = std::fs::read_to_string(dir.path().join("node.log")).expect("log");
    assert!(!status.success(), "started: {log}");
    assert!(
        log.contains("`peer_tls`") && log.contains("insecure_peer_traffic"),
        "{log}"
    );

    tracing::info!("--- with insecure_peer_traffic = true it starts, and warns");
    let mut insecure = serve_exposed(dir.path(), "insecure_peer_traffic = true");
    let log_path = dir.path().join("node.log");
    wait_until("the node starts", || {
        let log = std::fs::read_to_string(&log_path).ok()?;
        log.contains("node started").then_some(())
    })
    .await;
    let log = std::fs::read_to_string(&log_path).expect("log");
    assert!(insecure.try_wait().expect("wait").is_none(), "{log}");
    assert!(log.contains("insecure_peer_traffic = true"), "{log}");
    insecure.kill().expect("kill");
    insecure.wait().expect("reap");
}

/// Hits with claims through one client until a call fails; returns the keys whose claim the
/// fleet committed (settle answered `settled` by the fleet) and the error that ended it.
async fn commit_until_refused(
    mut client: pb::fleet_client::FleetClient<Channel>,
    worker: usize,
) -> (Vec<String>, String) {
    let mut committed = Vec::new();
    let mut n = 0;
    loop {
        let key = format!("w{worker}-k{n}");
        if let Err(e) = commit_claim(&mut client, TENANT, &key).await {
            return (committed, e);
        }
        committed.push(key);
        n += 1;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_a_leader_under_load_and_loses_nothing_it_answered() {
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::health_client::HealthClient;
    use tonic_health::pb::HealthCheckRequest;

    init_tracing();
    let mut fleet = Fleet::start(3, "").await;
    let leader = fleet.wait_for_leader(&[1, 2, 3]).await;
    let others: Vec<u64> = (1..=3).filter(|id| *id != leader).collect();
    let channel = Channel::from_shared(format!("http://{}", fleet.api_addr(leader)))
        .expect("uri")
        .connect()
        .await
        .expect("connect");
    let mut watch = HealthClient::new(channel.clone())
        .watch(HealthCheckRequest {
            service: "ankusa.fleet.v1.Fleet".to_owned(),
        })
        .await
        .expect("health watch")
        .into_inner();
    // Health follows the leader within a tick (a leader also needs a quorum's ack first).
    let serving = tokio::time::timeout(CONDITION_DEADLINE, async {
        while let Ok(Some(update)) = watch.message().await {
            if update.status() == ServingStatus::Serving {
                return true;
            }
        }
        false
    })
    .await
    .unwrap_or(false);
    assert!(serving, "health never said SERVING with a leader");

    tracing::info!("--- 8 edge workers commit claims through the leader");
    let workers: Vec<_> = (0..8)
        .map(|worker| {
            let client = pb::fleet_client::FleetClient::new(channel.clone());
            tokio::spawn(commit_until_refused(client, worker))
        })
        .collect();
    fleet
        .wait_for("40 claims committed", || async {
            let applied = fleet.last_applied(leader).await?;
            (applied >= 40).then_some(())
        })
        .await;

    tracing::info!("--- SIGTERM: health turns NOT_SERVING, the node exits 0");
    fleet.terminate(leader);
    let not_serving = tokio::time::timeout(CONDITION_DEADLINE, async {
        while let Ok(Some(update)) = watch.message().await {
            if update.status() == ServingStatus::NotServing {
                return true;
            }
        }
        false
    })
    .await
    .unwrap_or(false);
    assert!(not_serving, "health never said NOT_SERVING while draining");
    let status = fleet.wait_exit(leader).await;
    assert!(status.success(), "the drained node exited with {status}");
    let mut committed = Vec::new();
    let mut refused_by_the_gate = 0;
    for worker in workers {
        let (keys, ended) = worker.await.expect("worker");
        // A worker's next call after the drain began met the gate (refused), was still
        // queued in the client when the server's GOAWAY closed the connection (hyper cancels
        // it unsent), went out on a stream past the GOAWAY's last stream id (the server
        // never read it: h2 fails it with that GOAWAY), or found the listener gone. Each of
        // those never reached the node; a call cut off while the node worked on it would end
        // otherwise. h2 also fails a stream with the GOAWAY when the connection closes under
        // it, which the server does only once every call in flight was answered (the drain
        // said so in its log, checked below).
        let went_past_the_goaway = ended.contains("GoAway(b\"\", NO_ERROR, Remote)");
        if ended.contains("shutting down") {
            refused_by_the_gate += 1;
        } else {
            assert!(
                ended.contains("operation was canceled")
                    || ended.contains("tcp connect error")
                    || went_past_the_goaway,
                "a worker ended with: {ended}"
            );
        }
        committed.extend(keys);
    }
    assert!(
        refused_by_the_gate > 0,
        "no call was refused by the drain gate"
    );
    assert_eq!(
        fleet.log_lines(leader, &["drained: every call in flight was answered"]),
        1,
        "the drain answered every call in flight before the servers stopped"
    );
    tracing::info!(
        committed = committed.len(),
        "claims the fleet answered as committed"
    );
    assert!(
        committed.len() >= 8,
        "too few claims committed under load: {}",
        committed.len()
    );

    tracing::info!("--- every answered commit is still a duplicate, on the rest and after restart");
    let next = fleet.wait_for_leader(&others).await;
    fleet.assert_duplicates(next, TENANT, &committed, 8).await;
    fleet.restart(leader);
    fleet.wait_for_leader(&[1, 2, 3]).await;
    fleet.assert_duplicates(leader, TENANT, &committed, 8).await;
}
