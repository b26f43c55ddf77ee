//! The limits of both gRPC servers and of their clients, named in one place (docs/security.md
//! lists them with their reasons).
//!
//! The edge's server (`api_addr`) is sized to the largest valid request; the peers' server
//! (`raft_addr`) to a snapshot chunk. Both bound connections, HTTP/2 streams and concurrent
//! calls per connection, close connections that fall silent (idle timeout, TCP keepalive),
//! and give a connection that never finishes its TLS handshake a deadline.

use std::time::Duration;

/// The largest request the edge API decodes. The largest valid request (a `Hit` with
/// `CHARGES_MAX` charges and a claim, every id and key at its byte limit) encodes to under
/// 8 KiB; a test holds the limit to that (`the_api_limit_fits_the_largest_valid_request`).
pub const API_MESSAGE_BYTES_MAX: usize = 16 * 1024;

/// The largest answer an edge client (the CLI, `bench`) decodes: a `Status` of a large
/// fleet is a few KiB.
pub const API_RESPONSE_BYTES_MAX: usize = 1024 * 1024;

/// The largest message between peers, either way: a snapshot chunk is at most openraft's
/// `snapshot_max_chunk_size` (3 MiB by default) plus its metadata, and a batch of
/// AppendEntries at most 300 entries of `batch_commands_max` commands each.
pub const PEER_MESSAGE_BYTES_MAX: usize = 64 * 1024 * 1024;

/// An upper bound on one encoded command (bincode): it comes from one validated API request,
/// which is at most [`API_MESSAGE_BYTES_MAX`] and encodes no larger in bincode.
pub const COMMAND_BYTES_MAX: usize = API_MESSAGE_BYTES_MAX;

/// What an `AppendEntries` payload may take, leaving room for the message around it.
pub const APPEND_ENTRIES_BYTES_MAX: usize = PEER_MESSAGE_BYTES_MAX - 64 * 1024;

/// HTTP/2 streams one connection may have open at once. The edge keeps one `HitStream` per
/// worker or sends unary calls that end quickly; a peer opens one `Exchange` stream plus a
/// unary call at a time.
pub const API_STREAMS_PER_CONNECTION_MAX: u32 = 1024;
pub const PEER_STREAMS_PER_CONNECTION_MAX: u32 = 64;

/// Calls one connection may have being served at once (tower's concurrency limit: a call
/// beyond it waits for one to finish).
pub const API_CALLS_PER_CONNECTION_MAX: usize = 1024;
pub const PEER_CALLS_PER_CONNECTION_MAX: usize = 64;

/// TCP keepalive on accepted connections: a client that vanished (power loss, partition)
/// is found after about `TCP_KEEPALIVE + TCP_KEEPALIVE_INTERVAL * TCP_KEEPALIVE_RETRIES`
/// (60 s) of silence and its connection closed, with its streams and their tasks. The
/// kernel sends the probes, so they do not count as reads for the idle timeout (HTTP/2
/// pings from the server would: every client answers them).
pub const TCP_KEEPALIVE: Duration = Duration::from_secs(30);
pub const TCP_KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);
pub const TCP_KEEPALIVE_RETRIES: u32 = 3;

/// Connections open at once on each server; one more is closed as soon as it is accepted.
/// The edge on one host needs one per worker; a fleet needs one per peer plus the `cluster`
/// commands. Keep the process' open-file limit above their sum (systemd `LimitNOFILE`).
pub const API_CONNECTIONS_MAX: usize = 1024;
pub const PEER_CONNECTIONS_MAX: usize = 128;

/// Connections open at once on `raft_addr` from one source address. A place is taken when
/// the TCP connection is accepted, before the TLS handshake proves anything; this keeps
/// one host without a certificate from holding every place, so restarted and new members
/// can still connect. A node needs one to each peer, plus `cluster` commands and forwards.
pub const PEER_CONNECTIONS_PER_SOURCE_MAX: usize = 16;

/// A connection from which nothing was read for this long is closed. An edge client that
/// keeps a quiet `HitStream` open must send HTTP/2 keepalive pings (tonic's
/// `keep_alive_while_idle`; off by default) or reopen the stream when it ends; a peer's
/// client pings every second, so only a connection that says nothing at all reaches it.
pub const API_IDLE_TIMEOUT: Duration = Duration::from_secs(300);
pub const PEER_IDLE_TIMEOUT: Duration = Duration::from_secs(60);

/// How long a new connection may take to finish its TLS handshake.
pub const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

/// The longest any unary call may run on either server. Edge calls carry their own
/// deadline (at most `TIMEOUT_MS_MAX`, 60 s); peer calls are bounded by openraft's
/// timeouts; this catches a call that would otherwise never end.
pub const CALL_TIMEOUT_MAX: Duration = Duration::from_secs(120);

/// The largest HTTP/2 header block either server accepts (gRPC sends a few hundred bytes).
pub const HEADER_LIST_BYTES_MAX: u32 = 16 * 1024;
