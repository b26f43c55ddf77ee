//! The edge port, secure by default (docs/security.md): a non-loopback `api_addr` needs
//! `[api_tls]` with `client_ca_file` or `insecure_edge_api = true`; idle connections from
//! one address cannot take the places of another's; the data dir is the node user's alone.

mod common;

use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::*;
use tokio::time::Instant;

/// True when this process may make a network namespace of its own (`unshare -rn`).
fn namespaces_permitted() -> bool {
    Command::new("unshare")
        .args(["-rn", "true"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|status| status.success())
}

/// Runs a one-node config whose `api_addr` (and `raft_addr`) listen on every interface
/// of a private network namespace: nothing outside it can reach them.
fn serve_in_namespace(dir: &Path, extra: &str) -> Child {
    let config = format!(
        "node_id = 1\napi_addr = \"0.0.0.0:7101\"\nraft_addr = \"0.0.0.0:7201\"\n\
         insecure_peer_traffic = true\ndata_dir = {:?}\n{extra}\n[[members]]\nid = 1\n\
         api_addr = \"0.0.0.0:7101\"\nraft_addr = \"0.0.0.0:7201\"\n",
        dir.join("data").display().to_string()
    );
    let path = dir.join("node.toml");
    std::fs::write(&path, config).expect("write config");
    let log = std::fs::File::create(dir.join("node.log")).expect("log");
    Command::new("unshare")
        .args([
            "-rn",
            env!("CARGO_BIN_EXE_ankusa-fleet"),
            "serve",
            "--config",
        ])
        .arg(&path)
        .env("RUST_LIB_BACKTRACE", "0")
        .stdout(Stdio::from(log.try_clone().expect("log")))
        .stderr(Stdio::from(log))
        .spawn()
        .expect("spawn")
}

fn mode(path: &Path) -> u32 {
    std::fs::symlink_metadata(path)
        .expect("metadata")
        .permissions()
        .mode()
        & 0o777
}

/// Every directory under `dir` is 0700 and every file 0600.
fn assert_private(dir: &Path) {
    assert_eq!(mode(dir), 0o700, "{}", dir.display());
    let mut files = 0;
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).expect("read dir") {
            let path = entry.expect("entry").path();
            let kind = std::fs::symlink_metadata(&path)
                .expect("metadata")
                .file_type();
            if kind.is_dir() {
                assert_eq!(mode(&path), 0o700, "{}", path.display());
                dirs.push(path);
            } else if kind.is_file() {
                assert_eq!(mode(&path), 0o600, "{}", path.display());
                files += 1;
            }
        }
    }
    assert!(files > 0, "the node wrote no file in {}", dir.display());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_api_addr_off_loopback_starts_only_with_client_certificates_or_the_insecure_key() {
    init_tracing();
    if !namespaces_permitted() {
        eprintln!("skipped: `unshare -rn` is not permitted here (no private network namespace)");
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let log_path = dir.path().join("node.log");

    tracing::info!("--- without [api_tls] the node refuses to start, naming the keys");
    let mut refused = serve_in_namespace(dir.path(), "");
    let status = wait_until("the node exits", || refused.try_wait().expect("wait")).await;
    let log = std::fs::read_to_string(&log_path).expect("log");
    assert!(!status.success(), "started: {log}");
    assert!(
        log.contains("`api_tls`") && log.contains("insecure_edge_api"),
        "{log}"
    );
    assert!(
        !dir.path().join("data").exists(),
        "a refused node wrote its data dir"
    );

    tracing::info!("--- with insecure_edge_api = true it starts, and warns once");
    // A data dir left wide open (an older version, a umask of 022) is made private.
    let data = dir.path().join("data");
    std::fs::create_dir(&data).expect("mkdir");
    std::fs::set_permissions(&data, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let mut insecure = serve_in_namespace(dir.path(), "insecure_edge_api = true");
    wait_until("the node starts", || {
        let log = std::fs::read_to_string(&log_path).ok()?;
        log.contains("node started").then_some(())
    })
    .await;
    let log = std::fs::read_to_string(&log_path).expect("log");
    assert!(insecure.try_wait().expect("wait").is_none(), "{log}");
    assert_eq!(
        log.matches("insecure_edge_api = true: edge clients are not authenticated")
            .count(),
        1,
        "{log}"
    );

    tracing::info!("--- the data dir and every file in it are the node user's alone");
    assert_private(&data);
    insecure.kill().expect("kill");
    insecure.wait().expect("wait");
    assert_private(&data);
}

/// Opens `count` TCP connections to `addr` from `source`, sending nothing; a connection the
/// node closes at once still counts (it was tried).
async fn idle_connections(
    source: &str,
    addr: SocketAddr,
    count: usize,
) -> Vec<tokio::net::TcpStream> {
    let mut open = Vec::with_capacity(count);
    for _ in 0..count {
        let socket = tokio::net::TcpSocket::new_v4().expect("socket");
        socket
            .bind(SocketAddr::new(source.parse().expect("ip"), 0))
            .expect("bind the source address");
        if let Ok(Ok(stream)) =
            tokio::time::timeout(Duration::from_secs(5), socket.connect(addr)).await
        {
            open.push(stream);
        }
    }
    open
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_from_one_address_leave_another_served() {
    init_tracing();
    let fleet = Fleet::start(1, "").await;
    fleet.wait_for_leader(&[1]).await;
    let api_addr: SocketAddr = fleet.api_addr(1).parse().expect("addr");

    tracing::info!("--- 1,100 silent connections from 127.0.0.2");
    let started = Instant::now();
    let flood = idle_connections("127.0.0.2", api_addr, 1_100).await;
    assert!(!flood.is_empty(), "no connection was accepted at all");

    tracing::info!("--- a Status from 127.0.0.1 is answered meanwhile");
    let status = fleet.status(1).await;
    assert!(
        status.is_some(),
        "Status from another address was not served"
    );
    // Served while the flood held its places, not after they timed out.
    assert!(
        started.elapsed() < ankusa_fleet::limits::FIRST_CALL_TIMEOUT,
        "served only after {:?}",
        started.elapsed()
    );
    drop(flood);
}
