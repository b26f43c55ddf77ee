//! The API's Unix socket: binding it (a stale file replaced, a live one refused), the
//! connections it accepts (within the same limits as TCP, without a source to count by),
//! and its file removed when the server stops.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio::net::{UnixListener, UnixStream};
use tokio_stream::wrappers::UnixListenerStream;
use tokio_stream::{Stream, StreamExt};

use super::{Budget, ConnectionLimits, ConnectionState, Guarded};

/// The connections a Unix socket `listener` accepts, within `limits` (every one comes from
/// this host: there is no source to count by). Their calls are marked by any
/// [`CallsLayer`](super::CallsLayer) (the connection rides in its connect info).
pub fn incoming_unix(
    listener: UnixListener,
    limits: ConnectionLimits,
) -> impl Stream<Item = io::Result<Guarded<UnixStream>>> {
    let budget = Budget::new(limits.connections_max, limits.unproven_max);
    UnixListenerStream::new(listener).filter_map(move |accepted| {
        let stream = match accepted {
            Ok(stream) => stream,
            Err(e) => return Some(Err(e)),
        };
        let Ok(unproven) = Arc::clone(&budget.unproven).try_acquire_owned() else {
            metrics::counter!("ankusa_connections_refused_total").increment(1);
            tracing::debug!(
                max = limits.unproven_max,
                "connection refused: too many without a first call"
            );
            return None;
        };
        let state = ConnectionState::new(&limits, Arc::clone(&budget.established), unproven, None);
        Some(Ok(Guarded::new(stream, state, None)))
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
