//! Accepted connections of both servers, before and beside tonic: Nagle's algorithm off,
//! TCP keepalive on, connection places, and the idle timer.
//!
//! A connection's places: one under its source address's cap, taken at accept; one in a
//! small budget of *unproven* connections, held until its first call reaches the services
//! (for a TLS server, after its handshake), so never-finishing handshakes and silent
//! sockets cannot take the places of connections in use; then one among the established
//! connections. On `raft_addr`, the addresses of members have budgets of their own
//! ([`MemberSources`]). A connection is idle when no call is open on it; the idle timer
//! restarts when a call starts or ends ([`CallsLayer`] marks them), never on bare bytes, so
//! a trickle of bytes that never makes a request does not keep a place.
//!
//! `Server::tcp_nodelay` and tonic's TCP keepalive only apply to listeners tonic binds
//! itself, so a node that binds its own (to learn port 0's port first) sets them here. This
//! module decides nothing about who may connect; TLS and the services do.

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock, Weak};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream, UnixStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::{Instant, Sleep};
use tokio_stream::wrappers::TcpListenerStream;
use tokio_stream::{Stream, StreamExt};
use tonic::transport::server::{Connected, TcpConnectInfo, TlsConnectInfo, UdsConnectInfo};

use crate::limits::{TCP_KEEPALIVE, TCP_KEEPALIVE_INTERVAL, TCP_KEEPALIVE_RETRIES};
use crate::lock::lock;

mod unix;
pub use unix::{incoming_unix, SocketFile, UnixSocket};

/// How a server treats its accepted connections.
#[derive(Clone, Copy, Debug)]
pub struct ConnectionLimits {
    /// Established connections (past their first call) open at once; one more is answered
    /// `UNAVAILABLE` and closed at its first-call timeout.
    pub connections_max: usize,
    /// Connections open at once from one source address, in any stage. A place is taken
    /// before the TLS handshake, so without it one host with no certificate could hold
    /// every place.
    pub per_source_max: usize,
    /// Connections open at once that have not yet made a call (in their TLS handshake or
    /// silent); one more is closed as soon as it is accepted.
    pub unproven_max: usize,
    /// Unproven connections open at once from one source address.
    pub unproven_per_source_max: usize,
    /// How long a new connection has to make its first call.
    pub first_call_timeout: Duration,
    /// An established connection with no call open for this long is closed.
    pub idle_timeout: Duration,
    /// Established and unproven places kept for members' addresses (each budget this
    /// large, apart from the others'); 0 where there are no members (`api_addr`).
    pub member_connections_max: usize,
}

/// The IP addresses of the fleet's members (their `raft_addr`), with how many members
/// share each: connections from them take places of their own on `raft_addr`, so a flood
/// from elsewhere cannot lock a member out. Updated as the membership changes.
#[derive(Clone, Debug, Default)]
pub struct MemberSources(Arc<RwLock<HashMap<IpAddr, usize>>>);

impl MemberSources {
    /// Replaces the members' addresses with those of `raft_addrs` (`ip:port`; another form
    /// is skipped: it names no address a connection comes from).
    pub fn set<'a>(&self, raft_addrs: impl IntoIterator<Item = &'a str>) {
        let mut members = HashMap::new();
        for addr in raft_addrs {
            if let Ok(addr) = addr.parse::<SocketAddr>() {
                *members.entry(addr.ip()).or_insert(0) += 1;
            }
        }
        *self
            .0
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = members;
    }

    /// How many members have address `ip` (0: not a member's).
    fn at(&self, ip: IpAddr) -> usize {
        self.0
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(&ip)
            .copied()
            .unwrap_or(0)
    }
}

/// One budget of places: established and unproven connections.
struct Budget {
    established: Arc<Semaphore>,
    unproven: Arc<Semaphore>,
}

impl Budget {
    fn new(established: usize, unproven: usize) -> Self {
        Self {
            established: Arc::new(Semaphore::new(established)),
            unproven: Arc::new(Semaphore::new(unproven)),
        }
    }
}

/// The places of one listener, shared by its accepted connections.
struct Places {
    limits: ConnectionLimits,
    others: Budget,
    members: Budget,
    member_sources: MemberSources,
    sources: Sources,
}

/// The connections `listener` accepts, within `limits`, with the members' addresses
/// `members` (empty on `api_addr`), and the layer that must wrap the services they reach:
/// it marks calls on their connections. An accept error is passed on (tonic logs it and
/// goes on accepting).
pub fn incoming(
    listener: TcpListener,
    limits: ConnectionLimits,
    members: MemberSources,
) -> (
    impl Stream<Item = io::Result<Guarded<TcpStream>>>,
    CallsLayer,
) {
    let places = Arc::new(Places {
        limits,
        others: Budget::new(limits.connections_max, limits.unproven_max),
        members: Budget::new(limits.member_connections_max, limits.member_connections_max),
        member_sources: members,
        sources: Arc::default(),
    });
    let layer = CallsLayer::default();
    let registry = Arc::clone(&layer.registry);
    let stream = TcpListenerStream::new(listener).filter_map(move |accepted| {
        let stream = match accepted {
            Ok(stream) => stream,
            Err(e) => return Some(Err(e)),
        };
        let remote = stream.peer_addr().ok()?;
        let state = admit(&places, remote.ip())?;
        if let Err(e) = configure(&stream) {
            return Some(Err(e));
        }
        let registered = Registered::new(&registry, remote, &state);
        Some(Ok(Guarded::new(stream, state, Some(registered))))
    });
    (stream, layer)
}

/// A new connection from `source` takes its places, or is refused (`None`).
fn admit(places: &Places, source: IpAddr) -> Option<Arc<ConnectionState>> {
    let limits = &places.limits;
    let members_there = places.member_sources.at(source);
    let (budget, per_source_max) = if members_there > 0 && limits.member_connections_max > 0 {
        (&places.members, limits.per_source_max * members_there)
    } else {
        (&places.others, limits.per_source_max)
    };
    let refused = |why: &'static str| {
        metrics::counter!("ankusa_connections_refused_total").increment(1);
        tracing::debug!(%source, why, "connection refused");
        None
    };
    let unproven_per_source_max = limits.unproven_per_source_max * members_there.max(1);
    let Some(place) = SourcePlace::take(
        &places.sources,
        source,
        per_source_max,
        unproven_per_source_max,
    ) else {
        return refused("too many from one source");
    };
    let Ok(unproven) = Arc::clone(&budget.unproven).try_acquire_owned() else {
        return refused("too many connections without a first call");
    };
    Some(ConnectionState::new(
        limits,
        Arc::clone(&budget.established),
        unproven,
        Some(place),
    ))
}

/// Connections open per source address: (all, unproven).
type Sources = Arc<Mutex<HashMap<IpAddr, (usize, usize)>>>;

/// One connection's count under its source address, given back when it closes; it counts
/// as unproven until [`SourcePlace::proven`].
struct SourcePlace {
    sources: Sources,
    source: IpAddr,
    unproven: bool,
}

impl SourcePlace {
    fn take(sources: &Sources, source: IpAddr, max: usize, unproven_max: usize) -> Option<Self> {
        let mut counts = lock(sources);
        let (open, unproven) = counts.entry(source).or_insert((0, 0));
        if *open >= max || *unproven >= unproven_max {
            if *open == 0 {
                counts.remove(&source);
            }
            return None;
        }
        *open += 1;
        *unproven += 1;
        Some(Self {
            sources: Arc::clone(sources),
            source,
            unproven: true,
        })
    }

    fn proven(&mut self) {
        if std::mem::replace(&mut self.unproven, false) {
            if let Some((_, unproven)) = lock(&self.sources).get_mut(&self.source) {
                *unproven -= 1;
            }
        }
    }
}

impl Drop for SourcePlace {
    fn drop(&mut self) {
        let mut counts = lock(&self.sources);
        if let Some((open, unproven)) = counts.get_mut(&self.source) {
            *open -= 1;
            if self.unproven {
                *unproven -= 1;
            }
            if *open == 0 {
                counts.remove(&self.source);
            }
        }
    }
}

/// Nagle off (small request/answer messages would otherwise wait for delayed ACKs, about
/// 40 ms on Linux) and TCP keepalive on (a peer that vanished is found even when no byte
/// is due).
fn configure(stream: &TcpStream) -> io::Result<()> {
    stream.set_nodelay(true)?;
    let keepalive = socket2::TcpKeepalive::new()
        .with_time(TCP_KEEPALIVE)
        .with_interval(TCP_KEEPALIVE_INTERVAL)
        .with_retries(TCP_KEEPALIVE_RETRIES);
    socket2::SockRef::from(stream).set_tcp_keepalive(&keepalive)
}

/// A connection's places, by stage.
struct Held {
    /// Until the first call; then `None`.
    unproven: Option<OwnedSemaphorePermit>,
    /// From the first call on.
    established: Option<OwnedSemaphorePermit>,
    source: Option<SourcePlace>,
}

/// What the connection's reader ([`Guarded`]) and its calls ([`CallsLayer`]) share.
struct ConnectionState {
    established_places: Arc<Semaphore>,
    /// The size of `established_places`, for the refusal's message.
    established_max: usize,
    held: Mutex<Held>,
    calls_open: AtomicUsize,
    /// When a call last started or ended (or the connection was accepted).
    last_call: Mutex<Instant>,
    first_call_timeout: Duration,
    idle_timeout: Duration,
    frame_bytes: OnceLock<Arc<Semaphore>>,
}

/// A call could not start: no established place is free.
#[derive(Debug, thiserror::Error)]
#[error("no connection place is free ({max} connections in use)")]
pub struct NoPlace {
    max: usize,
}

impl ConnectionState {
    fn new(
        limits: &ConnectionLimits,
        established_places: Arc<Semaphore>,
        unproven: OwnedSemaphorePermit,
        source: Option<SourcePlace>,
    ) -> Arc<Self> {
        Arc::new(Self {
            established_places,
            established_max: limits.connections_max,
            held: Mutex::new(Held {
                unproven: Some(unproven),
                established: None,
                source,
            }),
            calls_open: AtomicUsize::new(0),
            last_call: Mutex::new(Instant::now()),
            first_call_timeout: limits.first_call_timeout,
            idle_timeout: limits.idle_timeout,
            frame_bytes: OnceLock::new(),
        })
    }

    /// A call starts: the connection is established (it takes its place the first time)
    /// and not idle until the call ends.
    fn call_started(&self) -> Result<(), NoPlace> {
        {
            let mut held = lock(&self.held);
            if held.established.is_none() {
                let Ok(place) = Arc::clone(&self.established_places).try_acquire_owned() else {
                    return Err(NoPlace {
                        max: self.established_max,
                    });
                };
                held.established = Some(place);
                held.unproven = None;
                if let Some(source) = held.source.as_mut() {
                    source.proven();
                }
            }
        }
        self.calls_open.fetch_add(1, Ordering::AcqRel);
        *lock(&self.last_call) = Instant::now();
        Ok(())
    }

    fn call_ended(&self) {
        *lock(&self.last_call) = Instant::now();
        self.calls_open.fetch_sub(1, Ordering::AcqRel);
    }

    /// When the connection is due to close if nothing changes (`None`: a call is open).
    fn idle_due(&self) -> Option<Instant> {
        if self.calls_open.load(Ordering::Acquire) > 0 {
            return None;
        }
        let timeout = if lock(&self.held).established.is_some() {
            self.idle_timeout
        } else {
            self.first_call_timeout
        };
        Some(*lock(&self.last_call) + timeout)
    }
}

/// An accepted connection as its calls see it (in the request's extensions): a budget of
/// bytes its calls may hold at once, shared by every call on it.
#[derive(Clone)]
pub struct Connection(Arc<ConnectionState>);

impl Connection {
    /// The connection's budget of `bytes_max` bytes (the first caller sizes it): a
    /// streaming call takes from it what the frames it is answering hold, so one
    /// connection cannot fill the node's memory however many streams it opens.
    pub fn frame_bytes(&self, bytes_max: usize) -> Arc<Semaphore> {
        Arc::clone(
            self.0
                .frame_bytes
                .get_or_init(|| Arc::new(Semaphore::new(bytes_max))),
        )
    }
}

/// The open TCP connections of one listener by remote address, for [`CallsLayer`] (tonic's
/// connect info for TCP must stay tonic's own type: `remote_addr()` and `peer_certs()`
/// look for it).
type Registry = Arc<Mutex<HashMap<SocketAddr, Weak<ConnectionState>>>>;

/// A connection's entry in the registry, removed with it.
struct Registered {
    registry: Registry,
    remote: SocketAddr,
    state: Weak<ConnectionState>,
}

impl Registered {
    fn new(registry: &Registry, remote: SocketAddr, state: &Arc<ConnectionState>) -> Self {
        let state = Arc::downgrade(state);
        lock(registry).insert(remote, Weak::clone(&state));
        Self {
            registry: Arc::clone(registry),
            remote,
            state,
        }
    }
}

impl Drop for Registered {
    fn drop(&mut self) {
        let mut registry = lock(&self.registry);
        if registry
            .get(&self.remote)
            .is_some_and(|entry| entry.ptr_eq(&self.state))
        {
            registry.remove(&self.remote);
        }
    }
}

/// An accepted connection that holds its places and closes when idle: no call open for
/// the idle timeout (or no first call within the first-call timeout).
pub struct Guarded<S> {
    stream: S,
    state: Arc<ConnectionState>,
    /// When the idle timer fires next; pushed back lazily (calls only note their time).
    deadline: Pin<Box<Sleep>>,
    _registered: Option<Registered>,
}

impl<S> Guarded<S> {
    fn new(stream: S, state: Arc<ConnectionState>, registered: Option<Registered>) -> Self {
        let due = Instant::now() + state.first_call_timeout;
        Self {
            stream,
            state,
            deadline: Box::pin(tokio::time::sleep_until(due)),
            _registered: registered,
        }
    }

    /// `Err` once the connection is idle past its timeout; otherwise registers the timer.
    fn check_idle(&mut self, cx: &mut Context<'_>) -> io::Result<()> {
        while self.deadline.as_mut().poll(cx).is_ready() {
            let due = match self.state.idle_due() {
                Some(due) if due <= Instant::now() => {
                    return Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "connection idle past its timeout",
                    ))
                }
                Some(due) => due,
                // A call is open: look again one idle timeout from now.
                None => Instant::now() + self.state.idle_timeout,
            };
            self.deadline.as_mut().reset(due);
        }
        Ok(())
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Guarded<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        // Checked whether bytes arrive or not: bytes alone never keep a connection open.
        if let Err(e) = self.check_idle(cx) {
            return Poll::Ready(Err(e));
        }
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Guarded<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

impl Connected for Guarded<TcpStream> {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.stream.connect_info()
    }
}

/// A Unix socket connection's connect info: tonic's, and the connection for
/// [`CallsLayer`].
#[derive(Clone)]
pub struct UnixConnectInfo {
    pub peer: UdsConnectInfo,
    connection: Connection,
}

impl Connected for Guarded<UnixStream> {
    type ConnectInfo = UnixConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        UnixConnectInfo {
            peer: self.stream.connect_info(),
            connection: Connection(Arc::clone(&self.state)),
        }
    }
}

/// The tower layer on both servers that tells each connection when its calls start and
/// end (its idle timer and its places follow them), and gives calls their
/// [`Connection`]. A call on a connection that finds no established place free is
/// answered `UNAVAILABLE`.
#[derive(Clone, Default)]
pub struct CallsLayer {
    registry: Registry,
}

impl<S> tower::Layer<S> for CallsLayer {
    type Service = Calls<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Calls {
            inner,
            registry: Arc::clone(&self.registry),
        }
    }
}

/// The service [`CallsLayer`] makes.
#[derive(Clone)]
pub struct Calls<S> {
    inner: S,
    registry: Registry,
}

impl<S> Calls<S> {
    fn connection_of<B>(&self, request: &http::Request<B>) -> Option<Connection> {
        let extensions = request.extensions();
        if let Some(unix) = extensions.get::<UnixConnectInfo>() {
            return Some(unix.connection.clone());
        }
        let remote = extensions
            .get::<TcpConnectInfo>()
            .or_else(|| {
                extensions
                    .get::<TlsConnectInfo<TcpConnectInfo>>()
                    .map(TlsConnectInfo::get_ref)
            })?
            .remote_addr()?;
        lock(&self.registry)
            .get(&remote)
            .and_then(Weak::upgrade)
            .map(Connection)
    }
}

type CallFuture = Pin<
    Box<
        dyn Future<Output = Result<http::Response<tonic::body::Body>, std::convert::Infallible>>
            + Send,
    >,
>;

impl<S> tower::Service<http::Request<tonic::body::Body>> for Calls<S>
where
    S: tower::Service<
            http::Request<tonic::body::Body>,
            Response = http::Response<tonic::body::Body>,
            Error = std::convert::Infallible,
        > + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = std::convert::Infallible;
    type Future = CallFuture;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: http::Request<tonic::body::Body>) -> Self::Future {
        let Some(connection) = self.connection_of(&request) else {
            // Served without a guarded connection (nothing to mark).
            return Box::pin(self.inner.call(request));
        };
        if let Err(e) = connection.0.call_started() {
            metrics::counter!("ankusa_connections_refused_total").increment(1);
            let refused = tonic::Status::from(e).into_http();
            return Box::pin(std::future::ready(Ok(refused)));
        }
        let open = OpenCall(Some(Arc::clone(&connection.0)));
        request.extensions_mut().insert(connection);
        let answer = self.inner.call(request);
        Box::pin(async move {
            let response = answer.await?;
            // The call stays open until its answer's body is sent (a stream's last message).
            Ok(response.map(|body| tonic::body::Body::new(CallBody { body, _open: open })))
        })
    }
}

/// An open call; ends when dropped.
struct OpenCall(Option<Arc<ConnectionState>>);

impl Drop for OpenCall {
    fn drop(&mut self) {
        if let Some(state) = self.0.take() {
            state.call_ended();
        }
    }
}

/// A call's answer body, holding the call open until it is done with.
struct CallBody {
    body: tonic::body::Body,
    _open: OpenCall,
}

impl http_body::Body for CallBody {
    type Data = Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, tonic::Status>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests;
