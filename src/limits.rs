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

/// The largest `HitBatch` request message the edge API decodes (a frame of many hits; each
/// hit in it still at most [`API_MESSAGE_BYTES_MAX`], checked by `api::wire` before the
/// message is decoded). `HitBatch`'s transport limit; every other `Fleet` method keeps
/// [`API_MESSAGE_BYTES_MAX`] (`api::batch::FleetRoutes`).
pub const HIT_BATCH_MESSAGE_BYTES_MAX: usize = 1024 * 1024;

/// The most hits one `HitBatch` request message may carry; one more refuses the message
/// before it is decoded and ends the stream (INVALID_ARGUMENT naming `hits`).
pub const HIT_BATCH_HITS_MAX: usize = 1024;

/// Hits one `HitBatch` stream may have being decided at once: the stream reads no further
/// message while a frame's hits would pass it, so HTTP/2 flow control holds the edge back.
pub const HIT_BATCH_HITS_IN_FLIGHT_MAX: usize = 4 * HIT_BATCH_HITS_MAX;

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

/// Established connections (past their first call) open at once on each server; a call
/// on one more is answered `UNAVAILABLE`. The edge on one host needs one per worker; a
/// fleet needs one per peer plus the `cluster` commands. Keep the process' open-file limit
/// above the sum of every budget here (systemd `LimitNOFILE`).
pub const API_CONNECTIONS_MAX: usize = 1024;
pub const PEER_CONNECTIONS_MAX: usize = 128;

/// Connections open at once on `raft_addr` from members' addresses (their `raft_addr`
/// IPs, from the config's `[[members]]` and the current membership): a budget of its own,
/// established and unproven each, so a flood from other addresses cannot lock a member
/// out.
pub const PEER_MEMBER_CONNECTIONS_MAX: usize = 128;

/// Connections open at once from one source address, in any stage. A place is taken when
/// the TCP connection is accepted, before the TLS handshake proves anything; this keeps
/// one host from holding every place. A node needs one to each peer, plus `cluster`
/// commands and forwards; on `raft_addr` a member's address gets this many per member
/// there. The edge's workers on one host share one address: half the API's places.
pub const PEER_CONNECTIONS_PER_SOURCE_MAX: usize = 16;
pub const API_CONNECTIONS_PER_SOURCE_MAX: usize = API_CONNECTIONS_MAX / 2;

/// Connections open at once that have made no call yet (in their TLS handshake, or
/// silent), all sources together and from one source: a budget apart from established
/// connections, so never-finishing handshakes and silent sockets cannot take their places.
/// One more is closed as soon as it is accepted; a legitimate client makes its first call
/// at once and moves to the established places.
pub const API_UNPROVEN_CONNECTIONS_MAX: usize = 64;
pub const API_UNPROVEN_PER_SOURCE_MAX: usize = 16;
pub const PEER_UNPROVEN_CONNECTIONS_MAX: usize = 32;
pub const PEER_UNPROVEN_PER_SOURCE_MAX: usize = 8;

/// How long a new connection has to make its first call: its TLS handshake
/// ([`TLS_HANDSHAKE_TIMEOUT`]) and the HTTP/2 preface fit well within it.
pub const FIRST_CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// A connection with no call open for this long is closed. Only calls count (a call's
/// start, its end, and any time while it is open), not bytes: HTTP/2 pings or a trickle of
/// bytes that never makes a request do not keep a connection. An edge client that keeps
/// a quiet `HitStream` open is never idle; one without calls for this long reconnects. A
/// peer keeps its `Exchange` stream open.
pub const API_IDLE_TIMEOUT: Duration = Duration::from_secs(300);
pub const PEER_IDLE_TIMEOUT: Duration = Duration::from_secs(60);

/// Bytes of `Exchange` frames one peer connection may have being answered at once (every
/// `Exchange` stream on it together): a stream is read no further while its next frame
/// does not fit, so HTTP/2 flow control holds the sender back. Two of the largest peer
/// messages fit, so one large frame never waits for itself.
pub const EXCHANGE_BYTES_IN_FLIGHT_MAX: usize = 2 * PEER_MESSAGE_BYTES_MAX;

/// How long a new connection may take to finish its TLS handshake.
pub const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

/// The longest any unary call may run on either server. Edge calls carry their own
/// deadline (at most `TIMEOUT_MS_MAX`, 60 s); peer calls are bounded by openraft's
/// timeouts; this catches a call that would otherwise never end.
pub const CALL_TIMEOUT_MAX: Duration = Duration::from_secs(120);

/// The largest HTTP/2 header block either server accepts (gRPC sends a few hundred bytes).
pub const HEADER_LIST_BYTES_MAX: u32 = 16 * 1024;
