//! Accepted connections of both servers, before tonic sees them: Nagle's algorithm off, TCP
//! keepalive on, a cap on connections open at once, and an idle timeout. Connections to the
//! edge's Unix socket (`api_socket`) get the cap and the idle timeout.
//!
//! `Server::tcp_nodelay` and tonic's TCP keepalive only apply to listeners tonic binds
//! itself, so a node that binds its own (to learn port 0's port first) sets them here. This
//! module decides nothing about who may connect; TLS and the services do.

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::{Instant, Sleep};
use tokio_stream::wrappers::{TcpListenerStream, UnixListenerStream};
use tokio_stream::{Stream, StreamExt};
use tonic::transport::server::Connected;

use crate::limits::{TCP_KEEPALIVE, TCP_KEEPALIVE_INTERVAL, TCP_KEEPALIVE_RETRIES};
use crate::lock::lock;

/// How a server treats its accepted connections.
#[derive(Clone, Copy, Debug)]
pub struct ConnectionLimits {
    /// Connections open at once; one more is closed as soon as it is accepted.
    pub connections_max: usize,
    /// Connections open at once from one source address: a place under the cap is taken
    /// before the TLS handshake, so without it one host with no certificate could hold
    /// every place (in handshakes that time out and start again).
    pub per_source_max: usize,
    /// A connection from which nothing was read for this long is closed.
    pub idle_timeout: Duration,
}

/// The connections `listener` accepts, within `limits`. An accept error is passed on
/// (tonic logs it and goes on accepting).
pub fn incoming(
    listener: TcpListener,
    limits: ConnectionLimits,
) -> impl Stream<Item = io::Result<Guarded<TcpStream>>> {
    let open = Arc::new(Semaphore::new(limits.connections_max));
    let sources: Sources = Arc::default();
    TcpListenerStream::new(listener).filter_map(move |accepted| {
        let stream = match accepted {
            Ok(stream) => stream,
            Err(e) => return Some(Err(e)),
        };
        let source = stream.peer_addr().map(|addr| addr.ip()).ok()?;
        let Some(place) = SourcePlace::take(&sources, source, limits.per_source_max) else {
            metrics::counter!("ankusa_connections_refused_total").increment(1);
            tracing::debug!(%source, max = limits.per_source_max, "connection refused: too many from one source");
            return None;
        };
        let Ok(permit) = Arc::clone(&open).try_acquire_owned() else {
            metrics::counter!("ankusa_connections_refused_total").increment(1);
            tracing::debug!(max = limits.connections_max, "connection refused: too many open");
            return None;
        };
        match configure(&stream) {
            Ok(()) => Some(Ok(Guarded::new(stream, limits.idle_timeout, permit, Some(place)))),
            Err(e) => Some(Err(e)),
        }
    })
}

/// The connections a Unix socket `listener` accepts, within `limits` (every one comes from
/// this host: there is no source to count by).
pub fn incoming_unix(
    listener: UnixListener,
    limits: ConnectionLimits,
) -> impl Stream<Item = io::Result<Guarded<UnixStream>>> {
    let open = Arc::new(Semaphore::new(limits.connections_max));
    UnixListenerStream::new(listener).filter_map(move |accepted| {
        let stream = match accepted {
            Ok(stream) => stream,
            Err(e) => return Some(Err(e)),
        };
        let Ok(permit) = Arc::clone(&open).try_acquire_owned() else {
            metrics::counter!("ankusa_connections_refused_total").increment(1);
            tracing::debug!(
                max = limits.connections_max,
                "connection refused: too many open"
            );
            return None;
        };
        Some(Ok(Guarded::new(stream, limits.idle_timeout, permit, None)))
    })
}

/// A bound Unix socket and its file; the file is removed when `file` is dropped (when its
/// server stops, or when the node fails to start after binding).
pub struct UnixSocket {
    pub listener: UnixListener,
    pub file: SocketFile,
}

impl UnixSocket {
    /// Binds `path`, creating its directory if it is missing. A socket file nobody accepts
    /// on (its connect is refused: a node that is gone left it) is replaced; a live one, one
    /// this user may not connect to, or a file that is not a socket, is an error. The file
    /// is made `0660`: the node's user and group connect.
    ///
    /// # Errors
    /// When the directory cannot be made, the path is taken, or the bind fails.
    pub fn bind(path: &Path) -> io::Result<Self> {
        use std::os::unix::fs::{FileTypeExt, PermissionsExt};
        if let Some(dir) = path.parent().filter(|dir| !dir.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)?;
        }
        match std::fs::symlink_metadata(path) {
            Ok(meta) if !meta.file_type().is_socket() => {
                return Err(io::Error::new(
                    io::ErrorKind::AlreadyExists,
                    "the path exists and is not a socket",
                ))
            }
            Ok(_) => match std::os::unix::net::UnixStream::connect(path) {
                Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
                    std::fs::remove_file(path)?;
                }
                Ok(_) => {
                    return Err(io::Error::new(
                        io::ErrorKind::AddrInUse,
                        "another process accepts on this socket",
                    ))
                }
                Err(e) => {
                    return Err(io::Error::new(
                        e.kind(),
                        format!("a socket is there and it cannot be told stale: {e}"),
                    ))
                }
            },
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        let listener = UnixListener::bind(path)?;
        // From here on the file is this node's: an error below removes it.
        let file = SocketFile::of(path)?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o660))?;
        Ok(Self { listener, file })
    }
}

/// A socket file this node bound, removed when dropped if the path still names that very
/// file (another process may have bound the path since).
pub struct SocketFile {
    path: PathBuf,
    /// (device, inode) of the file at bind.
    id: (u64, u64),
}

impl SocketFile {
    fn of(path: &Path) -> io::Result<Self> {
        use std::os::unix::fs::MetadataExt;
        let meta = std::fs::symlink_metadata(path)?;
        Ok(Self {
            path: path.to_path_buf(),
            id: (meta.dev(), meta.ino()),
        })
    }
}

impl Drop for SocketFile {
    fn drop(&mut self) {
        use std::os::unix::fs::MetadataExt;
        let ours = std::fs::symlink_metadata(&self.path)
            .is_ok_and(|meta| (meta.dev(), meta.ino()) == self.id);
        if ours {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Connections open per source address.
type Sources = Arc<std::sync::Mutex<HashMap<IpAddr, usize>>>;

/// One connection's count under its source address, given back when it closes.
struct SourcePlace {
    sources: Sources,
    source: IpAddr,
}

impl SourcePlace {
    fn take(sources: &Sources, source: IpAddr, max: usize) -> Option<Self> {
        let mut counts = lock(sources);
        let count = counts.entry(source).or_insert(0);
        if *count >= max {
            return None;
        }
        *count += 1;
        Some(Self {
            sources: Arc::clone(sources),
            source,
        })
    }
}

impl Drop for SourcePlace {
    fn drop(&mut self) {
        let mut counts = lock(&self.sources);
        if let Some(count) = counts.get_mut(&self.source) {
            *count -= 1;
            if *count == 0 {
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

/// An accepted connection that holds its place under the cap (and under its source's, for
/// TCP) and times out when idle.
pub struct Guarded<S> {
    stream: S,
    idle_timeout: Duration,
    /// When the idle timer fires next; pushed back lazily (reads only note their time).
    deadline: Pin<Box<Sleep>>,
    last_read: Instant,
    _places: (OwnedSemaphorePermit, Option<SourcePlace>),
}

impl<S> Guarded<S> {
    fn new(
        stream: S,
        idle_timeout: Duration,
        permit: OwnedSemaphorePermit,
        place: Option<SourcePlace>,
    ) -> Self {
        let now = Instant::now();
        Self {
            stream,
            idle_timeout,
            deadline: Box::pin(tokio::time::sleep_until(now + idle_timeout)),
            last_read: now,
            _places: (permit, place),
        }
    }

    /// `Err` once nothing was read for `idle_timeout`; otherwise registers the timer.
    fn check_idle(&mut self, cx: &mut Context<'_>) -> io::Result<()> {
        while self.deadline.as_mut().poll(cx).is_ready() {
            let due = self.last_read + self.idle_timeout;
            if due <= Instant::now() {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "connection idle past its timeout",
                ));
            }
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
        let before = buf.filled().len();
        match Pin::new(&mut self.stream).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                if buf.filled().len() > before {
                    self.last_read = Instant::now();
                }
                Poll::Ready(Ok(()))
            }
            Poll::Pending => match self.check_idle(cx) {
                Ok(()) => Poll::Pending,
                Err(e) => Poll::Ready(Err(e)),
            },
            failed => failed,
        }
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

impl<S: Connected> Connected for Guarded<S> {
    type ConnectInfo = S::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.stream.connect_info()
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    async fn listen(
        limits: ConnectionLimits,
    ) -> (
        std::net::SocketAddr,
        tokio::sync::mpsc::Receiver<Guarded<TcpStream>>,
    ) {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (accepted, rx) = tokio::sync::mpsc::channel(8);
        tokio::spawn(async move {
            let mut incoming = Box::pin(incoming(listener, limits));
            while let Some(Ok(conn)) = incoming.next().await {
                if accepted.send(conn).await.is_err() {
                    break;
                }
            }
        });
        (addr, rx)
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

    #[tokio::test]
    async fn a_connection_that_sends_nothing_is_closed_after_the_idle_timeout() {
        let limits = ConnectionLimits {
            connections_max: 4,
            per_source_max: 4,
            idle_timeout: Duration::from_secs(2),
        };
        let (addr, mut accepted) = listen(limits).await;
        let mut client = TcpStream::connect(addr).await.expect("connect");
        let mut server = accepted.recv().await.expect("accepted");
        client.write_all(b"ping").await.expect("write");
        let mut buf = [0u8; 4];
        server.read_exact(&mut buf).await.expect("read");
        // Nothing more is sent: the next read fails once the timeout has passed.
        let read = tokio::time::timeout(Duration::from_secs(30), server.read(&mut buf))
            .await
            .expect("the idle timeout ended the read");
        let err = read.expect_err("idle");
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
    }

    #[tokio::test]
    async fn connections_past_the_cap_are_closed_at_once() {
        for (connections_max, per_source_max) in [(1, 8), (8, 1)] {
            past_the_cap_closed_at_once(ConnectionLimits {
                connections_max,
                per_source_max,
                idle_timeout: Duration::from_secs(600),
            })
            .await;
        }
    }

    async fn past_the_cap_closed_at_once(limits: ConnectionLimits) {
        let (addr, mut accepted) = listen(limits).await;
        let _first = TcpStream::connect(addr).await.expect("connect");
        let held = accepted.recv().await.expect("first accepted");
        let mut second = TcpStream::connect(addr).await.expect("connect");
        let mut buf = [0u8; 1];
        // The server closes it: the client reads end of file (or a reset).
        let read = tokio::time::timeout(Duration::from_secs(30), second.read(&mut buf))
            .await
            .expect("closed within the deadline");
        assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");
        drop(held);
        let _third = TcpStream::connect(addr).await.expect("connect");
        let third = tokio::time::timeout(Duration::from_secs(30), accepted.recv())
            .await
            .expect("a place was free again");
        assert!(third.is_some());
    }
}
