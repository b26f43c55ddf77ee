use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::*;

fn limits() -> ConnectionLimits {
    ConnectionLimits {
        connections_max: 4,
        per_source_max: 4,
        unproven_max: 4,
        unproven_per_source_max: 4,
        first_call_timeout: Duration::from_secs(600),
        idle_timeout: Duration::from_secs(600),
        member_connections_max: 0,
    }
}

/// A listener on 127.0.0.1 with its accepted connections and its layer.
async fn listen(
    limits: ConnectionLimits,
    members: MemberSources,
) -> (
    SocketAddr,
    tokio::sync::mpsc::Receiver<Guarded<TcpStream>>,
    CallsLayer,
) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (accepted, rx) = tokio::sync::mpsc::channel(8);
    let (incoming, layer) = incoming(listener, limits, members);
    tokio::spawn(async move {
        let mut incoming = Box::pin(incoming);
        while let Some(Ok(conn)) = incoming.next().await {
            if accepted.send(conn).await.is_err() {
                break;
            }
        }
    });
    (addr, rx, layer)
}

/// Connects to `addr` from `source` (any 127.0.0.0/8 address is this host).
async fn connect_from(source: &str, addr: SocketAddr) -> TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket
        .bind(SocketAddr::new(source.parse().expect("ip"), 0))
        .expect("bind");
    socket.connect(addr).await.expect("connect")
}

/// The connection `client` is, as the layer finds it.
fn connection(layer: &CallsLayer, client: &TcpStream) -> Arc<ConnectionState> {
    let local = client.local_addr().expect("addr");
    lock(&layer.registry)
        .get(&local)
        .and_then(Weak::upgrade)
        .expect("registered")
}

/// The server closes `client`: it reads end of file (or a reset) within the deadline.
async fn closed(client: &mut TcpStream) {
    let mut buf = [0u8; 1];
    let read = tokio::time::timeout(Duration::from_secs(30), client.read(&mut buf))
        .await
        .expect("closed within the deadline");
    assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");
}

/// A live socket and a file that is not a socket are refused; a stale socket (nobody
/// accepts) is replaced; the file goes with its node, unless another took the path.
#[tokio::test]
async fn a_socket_path_is_taken_over_only_from_a_node_that_is_gone() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("run").join("api.sock");
    let live = UnixSocket::bind(&path).expect("bind");
    let refused = UnixSocket::bind(&path)
        .err()
        .expect("a live socket is refused");
    assert_eq!(refused.kind(), io::ErrorKind::AddrInUse);
    drop(live);
    assert!(!path.exists(), "the node's own file goes with it");

    let stale = std::os::unix::net::UnixListener::bind(&path).expect("bind");
    drop(stale);
    assert!(
        path.exists(),
        "a listener dropped without cleanup leaves its file"
    );
    let replaced = UnixSocket::bind(&path).expect("a stale socket is replaced");
    // Another process binds the path meanwhile: dropping ours leaves its file.
    std::fs::remove_file(&path).expect("remove");
    let other = std::os::unix::net::UnixListener::bind(&path).expect("bind");
    drop(replaced);
    assert!(path.exists(), "another node's socket was removed");
    drop(other);

    let plain = dir.path().join("plain");
    std::fs::write(&plain, b"not a socket").expect("write");
    let refused = UnixSocket::bind(&plain)
        .err()
        .expect("a plain file is refused");
    assert_eq!(refused.kind(), io::ErrorKind::AlreadyExists);
    assert_eq!(std::fs::read(&plain).expect("read"), b"not a socket");
}

/// Bytes that never make a call do not keep a connection: it closes at its first-call
/// timeout however often they come.
#[tokio::test]
async fn a_connection_sending_bytes_but_no_call_is_closed_at_its_timeout() {
    let limits = ConnectionLimits {
        first_call_timeout: Duration::from_secs(1),
        ..limits()
    };
    let (addr, mut accepted, _layer) = listen(limits, MemberSources::default()).await;
    let mut client = TcpStream::connect(addr).await.expect("connect");
    let mut server = accepted.recv().await.expect("accepted");
    let started = Instant::now();
    let trickle = tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_millis(100));
        loop {
            tick.tick().await;
            if client.write_all(b"x").await.is_err() {
                return;
            }
        }
    });
    let mut buf = [0u8; 64];
    let ended = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            match server.read(&mut buf).await {
                Ok(0) => return Ok(0),
                Ok(_) => continue,
                Err(e) => return Err(e),
            }
        }
    })
    .await
    .expect("the timeout ended the reads");
    let err = ended.expect_err("closed as idle");
    assert_eq!(err.kind(), io::ErrorKind::TimedOut);
    assert!(started.elapsed() >= Duration::from_secs(1));
    trickle.abort();
}

/// An open call keeps a connection however long it lasts; once it ends, the idle
/// timeout counts from its end.
#[tokio::test]
async fn a_connection_with_a_call_open_is_never_idle() {
    let limits = ConnectionLimits {
        first_call_timeout: Duration::from_millis(500),
        idle_timeout: Duration::from_millis(500),
        ..limits()
    };
    let (addr, mut accepted, layer) = listen(limits, MemberSources::default()).await;
    let client = TcpStream::connect(addr).await.expect("connect");
    let mut server = accepted.recv().await.expect("accepted");
    let state = connection(&layer, &client);
    state.call_started().expect("a place");
    let mut buf = [0u8; 1];
    let read = tokio::time::timeout(Duration::from_secs(2), server.read(&mut buf)).await;
    assert!(read.is_err(), "closed with a call open: {read:?}");
    state.call_ended();
    let ended_at = Instant::now();
    let read = tokio::time::timeout(Duration::from_secs(30), server.read(&mut buf))
        .await
        .expect("closed after the call");
    assert_eq!(read.expect_err("idle").kind(), io::ErrorKind::TimedOut);
    assert!(ended_at.elapsed() >= Duration::from_millis(500));
    drop(client);
}

/// The first call takes an established place; with none free it is refused, and the
/// connection holds only its unproven place.
#[tokio::test]
async fn a_first_call_needs_an_established_place() {
    let limits = ConnectionLimits {
        connections_max: 1,
        ..limits()
    };
    let (addr, mut accepted, layer) = listen(limits, MemberSources::default()).await;
    let first = TcpStream::connect(addr).await.expect("connect");
    let _first_server = accepted.recv().await.expect("accepted");
    connection(&layer, &first).call_started().expect("a place");
    let second = TcpStream::connect(addr).await.expect("connect");
    let second_server = accepted.recv().await.expect("accepted");
    let refused = connection(&layer, &second).call_started();
    assert!(refused.is_err(), "two established with one place");
    // The first one's place is given back when it closes.
    drop((first, _first_server));
    connection(&layer, &second)
        .call_started()
        .expect("the freed place");
    drop(second_server);
}

/// Wired into a tonic server, the layer finds each call's connection: a call makes it
/// established, and its end leaves no call open.
#[tokio::test]
async fn a_call_through_tonic_establishes_its_connection() {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (incoming, layer) = incoming(listener, limits(), MemberSources::default());
    let registry = Arc::clone(&layer.registry);
    let (_reporter, health) = tonic_health::server::health_reporter();
    tokio::spawn(
        tonic::transport::Server::builder()
            .layer(layer)
            .add_service(health)
            .serve_with_incoming(incoming),
    );
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .expect("endpoint")
        .connect()
        .await
        .expect("connect");
    let mut client = tonic_health::pb::health_client::HealthClient::new(channel);
    client
        .check(tonic_health::pb::HealthCheckRequest::default())
        .await
        .expect("answered");
    let states: Vec<_> = lock(&registry).values().filter_map(Weak::upgrade).collect();
    assert_eq!(states.len(), 1);
    let state = &states[0];
    assert!(lock(&state.held).established.is_some(), "not established");
    assert!(lock(&state.held).unproven.is_none(), "still unproven");
    let deadline = Instant::now() + Duration::from_secs(30);
    while state.calls_open.load(Ordering::Acquire) > 0 {
        assert!(Instant::now() < deadline, "the call never ended");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Members' addresses have places of their own: with none left for other addresses, a
/// member still connects.
#[tokio::test]
async fn a_members_address_connects_when_others_have_no_place() {
    let members = MemberSources::default();
    members.set(["127.0.0.1:7201"]);
    let limits = ConnectionLimits {
        unproven_max: 0,
        member_connections_max: 2,
        ..limits()
    };
    let (addr, mut accepted, _layer) = listen(limits, members).await;
    let mut other = connect_from("127.0.0.2", addr).await;
    closed(&mut other).await;
    let _member = connect_from("127.0.0.1", addr).await;
    let member = tokio::time::timeout(Duration::from_secs(30), accepted.recv())
        .await
        .expect("a member's place");
    assert!(member.is_some());
}

#[tokio::test]
async fn connections_past_the_cap_are_closed_at_once() {
    for (unproven_max, per_source_max, unproven_per_source_max) in [(1, 8, 8), (8, 1, 8), (8, 8, 1)]
    {
        past_the_cap_closed_at_once(ConnectionLimits {
            unproven_max,
            per_source_max,
            unproven_per_source_max,
            ..limits()
        })
        .await;
    }
}

async fn past_the_cap_closed_at_once(limits: ConnectionLimits) {
    let (addr, mut accepted, _layer) = listen(limits, MemberSources::default()).await;
    let _first = TcpStream::connect(addr).await.expect("connect");
    let held = accepted.recv().await.expect("first accepted");
    let mut second = TcpStream::connect(addr).await.expect("connect");
    closed(&mut second).await;
    drop(held);
    let _third = TcpStream::connect(addr).await.expect("connect");
    let third = tokio::time::timeout(Duration::from_secs(30), accepted.recv())
        .await
        .expect("a place was free again");
    assert!(third.is_some());
}
