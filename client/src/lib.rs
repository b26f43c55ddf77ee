//! An edge client for the local ankusa-fleet node.
//!
//! One [`Client`] per edge process, cloned into every worker: hits from all of them travel
//! over one `HitStream` (the node answers them in the order they were sent), and settles,
//! resets and check_rate calls are unary calls on the same HTTP/2 connection. The node may
//! be on TCP (`api_addr`, optionally with TLS) or on its Unix socket (`api_socket`).
//!
//! Every call returns by its deadline. The node is asked to answer a little before it
//! (a tenth of the deadline, at most 20 ms, is kept for the way back), and the client stops
//! waiting at the deadline with [`Error::Timeout`]. An unreachable node is an error value
//! ([`Error::Unavailable`]), never a hang, and [`Client::connect`] does not wait for the
//! node: an edge starts while its node is down, and its calls fail until it is up.
//!
//! ```no_run
//! use ankusa_fleet_client::{pb, Client, Options, Outcome, Target};
//!
//! # async fn example() -> Result<(), ankusa_fleet_client::Error> {
//! let client = Client::connect(Target::Unix("/run/ankusa-fleet/api.sock".into()), Options::default())?;
//! let claim = pb::Claim {
//!     tenant: "acme".into(),
//!     source_id: "stripe".into(),
//!     key: "evt_1".into(),
//!     hook_id: "hook-7".into(),
//!     ttl_ms: 86_400_000,
//!     pending_ttl_ms: 60_000,
//! };
//! let hit = pb::HitRequest {
//!     charges: vec![pb::Charge {
//!         kind: pb::Kind::Hooks as i32,
//!         tenant: "acme".into(),
//!         increment_us: 10_000,
//!         capacity_us: 1_000_000,
//!     }],
//!     claim: Some(claim.clone()),
//!     timeout_ms: 300,
//!     ..Default::default()
//! };
//! match client.hit(hit).await?.outcome {
//!     Outcome::Ok => { /* store the hook, then settle with SETTLE_OUTCOME_COMMIT */ }
//!     Outcome::Duplicate { hook_id } => { /* answer 2xx: `hook_id` stored it */ }
//!     Outcome::Pending { retry_after } | Outcome::RateLimited { retry_after } => {
//!         /* answer 429 or 503 with Retry-After */
//!     }
//! }
//! # Ok(())
//! # }
//! ```

use std::collections::VecDeque;
use std::path::PathBuf;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tokio_stream::StreamExt;
use tonic::transport::{Channel, ClientTlsConfig, Endpoint, Uri};

/// The edge API's messages and client, generated from the repository's `proto/fleet.proto`.
pub mod pb {
    tonic::include_proto!("ankusa.fleet.v1");
}

use pb::fleet_client::FleetClient;

/// Where the local node serves its edge API.
#[derive(Clone, Debug)]
pub enum Target {
    /// `host:port` of the node's `api_addr`: plaintext, or TLS with [`Options::tls`].
    Tcp(String),
    /// The node's `api_socket`.
    Unix(PathBuf),
}

/// How a [`Client`] calls its node.
#[derive(Clone, Debug)]
pub struct Options {
    /// A call's deadline when its request names none (`timeout_ms = 0`).
    pub timeout: Duration,
    /// How long opening a connection or the hit stream may take (a call's own deadline
    /// still ends its wait first).
    pub connect_timeout: Duration,
    /// TLS for a [`Target::Tcp`] node with `[api_tls]`.
    pub tls: Option<ClientTlsConfig>,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            timeout: Duration::from_secs(1),
            connect_timeout: Duration::from_secs(1),
            tls: None,
        }
    }
}

/// Who decided an answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DecidedBy {
    /// The fleet, through its Raft log.
    Fleet,
    /// The node alone (node scope, or the fleet missed the deadline), and why.
    Local { reason: String },
}

/// A hit's or check_rate's answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Every charge was taken, and the claim, if any, is this hook's.
    Ok,
    /// The claim's key is committed by `hook_id`: the event was stored before.
    Duplicate { hook_id: String },
    /// The key is claimed by a hook in flight; ask the sender to retry after this long.
    Pending { retry_after: Duration },
    /// A bucket has no room; retry after this long.
    RateLimited { retry_after: Duration },
}

/// An answer and who decided it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    pub outcome: Outcome,
    pub decided_by: DecidedBy,
}

/// What a settle did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SettleStatus {
    /// Committed or released as asked.
    Settled,
    /// The pending claim had expired; the commit made it anew.
    Recreated,
    /// Another hook holds the key; the settle changed nothing.
    Conflict { holder_hook_id: String },
    /// The fleet missed the deadline: the node keeps the settle on disk and hands it to
    /// the fleet later.
    Queued,
}

/// A settle's answer and who decided it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SettleDecision {
    pub status: SettleStatus,
    pub decided_by: DecidedBy,
}

/// A call that got no answer.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// No answer by the call's deadline.
    #[error("no answer within the call's deadline of {0:?}")]
    Timeout(Duration),
    /// The node refused the request (its message names the field).
    #[error("the node refused the request: {0}")]
    InvalidArgument(String),
    /// The node could not be reached, or could not take the call.
    #[error("the node is unavailable: {0}")]
    Unavailable(String),
    /// Any other gRPC status.
    #[error("the node answered {code:?}: {message}")]
    Status { code: tonic::Code, message: String },
    /// An answer this client does not understand (a newer or broken node).
    #[error("the node's answer does not fit the API: {0}")]
    Protocol(String),
    /// The target cannot be used (a malformed address or TLS setting).
    #[error("target: {0}")]
    Target(String),
}

impl From<tonic::Status> for Error {
    fn from(status: tonic::Status) -> Self {
        let message = status.message().to_owned();
        match status.code() {
            tonic::Code::InvalidArgument | tonic::Code::OutOfRange => {
                Error::InvalidArgument(message)
            }
            tonic::Code::Unavailable => Error::Unavailable(message),
            code => Error::Status { code, message },
        }
    }
}

/// Of a call's deadline, the most kept for the answer's way back: the node is asked to
/// answer by the rest.
const WAY_BACK_MAX: Duration = Duration::from_millis(20);

/// The timeout to ask of the node for a call that must be answered within `deadline`:
/// the deadline less a tenth of it, at most 20 ms, and at least 1 ms.
pub fn node_timeout_ms(deadline: Duration) -> u32 {
    let asked = deadline.saturating_sub((deadline / 10).min(WAY_BACK_MAX));
    u32::try_from(asked.as_millis()).unwrap_or(u32::MAX).max(1)
}

/// Hits sent on the stream and not answered yet, at most; a further call waits for a place
/// (within its deadline).
const IN_FLIGHT_MAX: usize = 4096;

/// One hit waiting for its place on the stream and then for its reply.
struct Job {
    request: pb::HitRequest,
    /// When its caller stops waiting: `timeout_ms` is set from it as the hit is sent, so
    /// time spent queued here is not the node's to spend.
    deadline: tokio::time::Instant,
    /// The call's whole deadline, for its `Timeout`.
    budget: Duration,
    reply: oneshot::Sender<Result<pb::HitResponse, Error>>,
}

/// The replies due on one stream, oldest first.
type Waiting = VecDeque<oneshot::Sender<Result<pb::HitResponse, Error>>>;

impl Job {
    /// Sends the hit on `requests` with what is left of its deadline and queues its reply
    /// in `waiting`. A hit whose deadline passed is not sent (the node need not work for
    /// nobody): its caller is answered `Timeout` at once.
    fn send(mut self, requests: &mpsc::UnboundedSender<pb::HitRequest>, waiting: &mut Waiting) {
        let left = self
            .deadline
            .checked_duration_since(tokio::time::Instant::now())
            .filter(|left| !left.is_zero());
        let Some(left) = left else {
            let _ = self.reply.send(Err(Error::Timeout(self.budget)));
            return;
        };
        if self.reply.is_closed() {
            return;
        }
        self.request.timeout_ms = node_timeout_ms(left);
        match requests.send(self.request) {
            Ok(()) => waiting.push_back(self.reply),
            Err(_) => {
                let closed = Error::Unavailable("the hit stream closed".to_owned());
                let _ = self.reply.send(Err(closed));
            }
        }
    }
}

/// A client of one node (cheap to clone; clones share the connection and the hit stream).
/// Dropping the last clone closes the stream once its replies are in.
#[derive(Clone)]
pub struct Client {
    unary: FleetClient<Channel>,
    hits: mpsc::Sender<Job>,
    timeout: Duration,
}

impl Client {
    /// A client of the node at `target`. It does not wait for the node: the connection is
    /// made by the first call and made again after it breaks. Must be called within a
    /// tokio runtime (the hit stream runs in a task of its own).
    ///
    /// # Errors
    /// [`Error::Target`] for an address or TLS setting that cannot be used.
    pub fn connect(target: Target, options: Options) -> Result<Client, Error> {
        let channel = channel(&target, &options)?;
        let unary = FleetClient::new(channel);
        let (hits, jobs) = mpsc::channel(IN_FLIGHT_MAX);
        tokio::spawn(run_stream(unary.clone(), jobs, options.connect_timeout));
        Ok(Client {
            unary,
            hits,
            timeout: options.timeout,
        })
    }

    fn deadline(&self, timeout_ms: u32) -> Duration {
        match timeout_ms {
            0 => self.timeout,
            ms => Duration::from_millis(u64::from(ms)),
        }
    }

    /// Charges and claims in one call, over the shared `HitStream`. `request.timeout_ms`
    /// is the call's deadline (0: [`Options::timeout`]).
    ///
    /// # Errors
    /// No answer by the deadline, an unreachable node, or a refused request.
    pub async fn hit(&self, request: pb::HitRequest) -> Result<Decision, Error> {
        let deadline = self.deadline(request.timeout_ms);
        let (reply, answer) = oneshot::channel();
        let job = Job {
            request,
            deadline: tokio::time::Instant::now() + deadline,
            budget: deadline,
            reply,
        };
        let call = async {
            self.hits
                .send(job)
                .await
                .map_err(|_| Error::Unavailable("the hit stream's task stopped".to_owned()))?;
            answer
                .await
                .map_err(|_| Error::Unavailable("the hit stream's task stopped".to_owned()))?
        };
        let response = within(deadline, call).await?;
        decision(
            response.outcome.map(outcome_of).transpose()?,
            response.decided_by,
            response.local_reason,
        )
    }

    /// The second phase of a claim: commit (the hook is stored) or release (it was not).
    /// `request.timeout_ms` is the call's deadline (0: [`Options::timeout`]).
    ///
    /// # Errors
    /// No answer by the deadline, an unreachable node, or a refused request.
    pub async fn settle(&self, mut request: pb::SettleRequest) -> Result<SettleDecision, Error> {
        let deadline = self.deadline(request.timeout_ms);
        request.timeout_ms = node_timeout_ms(deadline);
        let mut client = self.unary.clone();
        let response = within(deadline, async move {
            Ok(client.settle(timed(request, deadline)).await?.into_inner())
        })
        .await?;
        let status = match pb::SettleStatus::try_from(response.status) {
            Ok(pb::SettleStatus::Settled) => SettleStatus::Settled,
            Ok(pb::SettleStatus::Recreated) => SettleStatus::Recreated,
            Ok(pb::SettleStatus::Conflict) => SettleStatus::Conflict {
                holder_hook_id: response.holder_hook_id,
            },
            Ok(pb::SettleStatus::Queued) => SettleStatus::Queued,
            _ => {
                return Err(Error::Protocol(format!(
                    "settle status {} is not one this client knows",
                    response.status
                )))
            }
        };
        Ok(SettleDecision {
            status,
            decided_by: decided_by(response.decided_by, String::new())?,
        })
    }

    /// Forgets a tenant's buckets, fleet-wide and on this node. `request.timeout_ms` is the
    /// call's deadline (0: [`Options::timeout`]).
    ///
    /// # Errors
    /// No answer by the deadline, an unreachable node or fleet, or a refused request.
    pub async fn reset(&self, mut request: pb::ResetRequest) -> Result<(), Error> {
        let deadline = self.deadline(request.timeout_ms);
        request.timeout_ms = node_timeout_ms(deadline);
        let mut client = self.unary.clone();
        within(deadline, async move {
            client.reset(timed(request, deadline)).await?;
            Ok(())
        })
        .await
    }

    /// One charge of the bucket of (entity_id, operation): `limit` calls per `window_ms`.
    /// Answers [`Outcome::Ok`] or [`Outcome::RateLimited`]. `request.timeout_ms` is the
    /// call's deadline (0: [`Options::timeout`]).
    ///
    /// # Errors
    /// No answer by the deadline, an unreachable node, or a refused request.
    pub async fn check_rate(&self, mut request: pb::CheckRateRequest) -> Result<Decision, Error> {
        let deadline = self.deadline(request.timeout_ms);
        request.timeout_ms = node_timeout_ms(deadline);
        let mut client = self.unary.clone();
        let response = within(deadline, async move {
            Ok(client
                .check_rate(timed(request, deadline))
                .await?
                .into_inner())
        })
        .await?;
        let outcome = if response.allowed {
            Outcome::Ok
        } else {
            Outcome::RateLimited {
                retry_after: Duration::from_millis(response.retry_after_ms),
            }
        };
        decision(Some(outcome), response.decided_by, String::new())
    }

    /// The node's view of the fleet, within [`Options::timeout`].
    ///
    /// # Errors
    /// No answer in time, or an unreachable node.
    pub async fn status(&self) -> Result<pb::StatusResponse, Error> {
        let mut client = self.unary.clone();
        let deadline = self.timeout;
        within(deadline, async move {
            Ok(client
                .status(timed(pb::StatusRequest {}, deadline))
                .await?
                .into_inner())
        })
        .await
    }
}

/// A request that tells the node (in `grpc-timeout`) when the caller stops waiting.
fn timed<T>(message: T, deadline: Duration) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request.set_timeout(deadline);
    request
}

/// `call`'s result, or [`Error::Timeout`] once `deadline` has passed (tonic's own end of a
/// call's `grpc-timeout`, `CANCELLED` or `DEADLINE_EXCEEDED`, is that timeout too).
async fn within<T>(
    deadline: Duration,
    call: impl std::future::Future<Output = Result<T, Error>>,
) -> Result<T, Error> {
    match tokio::time::timeout(deadline, call).await {
        Ok(Err(Error::Status {
            code: tonic::Code::Cancelled | tonic::Code::DeadlineExceeded,
            ..
        }))
        | Err(_) => Err(Error::Timeout(deadline)),
        Ok(result) => result,
    }
}

/// How often an idle connection is pinged, and how long a ping may go unanswered before
/// the connection counts as dead: a node that vanished without a word (a host power-off,
/// a partition) fails the calls waiting on it, and the next call connects again.
const KEEP_ALIVE_INTERVAL: Duration = Duration::from_secs(10);
const KEEP_ALIVE_TIMEOUT: Duration = Duration::from_secs(5);

fn keep_alive(endpoint: Endpoint, options: &Options) -> Endpoint {
    endpoint
        .connect_timeout(options.connect_timeout)
        .http2_keep_alive_interval(KEEP_ALIVE_INTERVAL)
        .keep_alive_timeout(KEEP_ALIVE_TIMEOUT)
        .keep_alive_while_idle(true)
}

fn channel(target: &Target, options: &Options) -> Result<Channel, Error> {
    let invalid = |e: tonic::transport::Error| Error::Target(e.to_string());
    match target {
        Target::Tcp(addr) => {
            let scheme = if options.tls.is_some() {
                "https"
            } else {
                "http"
            };
            let mut endpoint = keep_alive(
                Endpoint::from_shared(format!("{scheme}://{addr}")).map_err(invalid)?,
                options,
            )
            .tcp_nodelay(true)
            .tcp_keepalive(Some(KEEP_ALIVE_INTERVAL));
            if let Some(tls) = &options.tls {
                endpoint = endpoint.tls_config(tls.clone()).map_err(invalid)?;
            }
            Ok(endpoint.connect_lazy())
        }
        Target::Unix(path) => {
            if options.tls.is_some() {
                return Err(Error::Target(
                    "a Unix socket takes no TLS (the node serves it without)".to_owned(),
                ));
            }
            let path = path.clone();
            // The URI only names the HTTP/2 authority; the connector ignores it.
            let endpoint = keep_alive(Endpoint::from_static("http://ankusa-fleet.local"), options);
            Ok(
                endpoint.connect_with_connector_lazy(tower::service_fn(move |_: Uri| {
                    let path = path.clone();
                    async move {
                        let stream = tokio::net::UnixStream::connect(path).await?;
                        Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(stream))
                    }
                })),
            )
        }
    }
}

/// Carries hits over one `HitStream` at a time: opens it for the first hit, sends every
/// hit on it in order and hands each reply to the hit sent at the same place in that
/// order. When the stream breaks, the hits waiting on it fail and the next hit opens a new
/// one. Ends when every [`Client`] clone is gone and no reply is due.
async fn run_stream(
    client: FleetClient<Channel>,
    mut jobs: mpsc::Receiver<Job>,
    open_timeout: Duration,
) {
    while let Some(first) = jobs.recv().await {
        // A caller that gave up before its turn needs no stream.
        if first.reply.is_closed() {
            continue;
        }
        let (requests, outgoing) = mpsc::unbounded_channel();
        let mut waiting = Waiting::new();
        let mut opener = client.clone();
        let stream = tokio_stream::wrappers::UnboundedReceiverStream::new(outgoing);
        let opened = tokio::time::timeout(open_timeout, opener.hit_stream(stream)).await;
        let mut replies = match opened {
            Ok(Ok(response)) => response.into_inner(),
            Ok(Err(status)) => {
                let _ = first.reply.send(Err(Error::from(status)));
                continue;
            }
            Err(_) => {
                let error = Error::Unavailable(format!("no stream within {open_timeout:?}"));
                let _ = first.reply.send(Err(error));
                continue;
            }
        };
        // Sent once the stream is open, with what is left of its deadline then.
        first.send(&requests, &mut waiting);
        let mut accepting = true;
        loop {
            tokio::select! {
                job = jobs.recv(), if accepting && waiting.len() < IN_FLIGHT_MAX => match job {
                    Some(job) => job.send(&requests, &mut waiting),
                    // Every client is gone: collect the replies still due, then stop.
                    None if waiting.is_empty() => return,
                    None => accepting = false,
                },
                reply = replies.next() => match reply {
                    Some(Ok(reply)) => {
                        // A reply beyond the hits sent: the stream cannot be trusted, and
                        // the next hit opens another.
                        let Some(waiter) = waiting.pop_front() else {
                            break;
                        };
                        let _ = waiter.send(result_of(reply));
                        if !accepting && waiting.is_empty() {
                            return;
                        }
                    }
                    Some(Err(status)) => {
                        fail_all(&mut waiting, &Error::from(status));
                        break;
                    }
                    None => {
                        let error = Error::Unavailable("the node closed the hit stream".to_owned());
                        fail_all(&mut waiting, &error);
                        break;
                    }
                },
            }
        }
        if !accepting {
            return;
        }
    }
}

fn fail_all(waiting: &mut Waiting, error: &Error) {
    for waiter in waiting.drain(..) {
        let _ = waiter.send(Err(error.clone()));
    }
}

fn result_of(reply: pb::HitStreamReply) -> Result<pb::HitResponse, Error> {
    match reply.result {
        Some(pb::hit_stream_reply::Result::Response(response)) => Ok(response),
        Some(pb::hit_stream_reply::Result::Error(error)) => {
            let code = tonic::Code::from(i32::try_from(error.code).unwrap_or(i32::MAX));
            Err(Error::from(tonic::Status::new(code, error.message)))
        }
        None => Err(Error::Protocol(
            "a stream reply with neither answer nor error".to_owned(),
        )),
    }
}

fn outcome_of(outcome: pb::hit_response::Outcome) -> Result<Outcome, Error> {
    use pb::hit_response::Outcome as Wire;
    Ok(match outcome {
        Wire::Allowed(_) => Outcome::Ok,
        Wire::Duplicate(duplicate) => Outcome::Duplicate {
            hook_id: duplicate.hook_id,
        },
        Wire::Pending(pending) => Outcome::Pending {
            retry_after: Duration::from_millis(pending.retry_after_ms),
        },
        Wire::RateLimited(limited) => Outcome::RateLimited {
            retry_after: Duration::from_millis(limited.retry_after_ms),
        },
    })
}

fn decided_by(wire: i32, local_reason: String) -> Result<DecidedBy, Error> {
    match pb::DecidedBy::try_from(wire) {
        Ok(pb::DecidedBy::Fleet) => Ok(DecidedBy::Fleet),
        Ok(pb::DecidedBy::Local) => Ok(DecidedBy::Local {
            reason: local_reason,
        }),
        _ => Err(Error::Protocol(format!(
            "decided_by {wire} is not one this client knows"
        ))),
    }
}

fn decision(outcome: Option<Outcome>, wire: i32, local_reason: String) -> Result<Decision, Error> {
    let Some(outcome) = outcome else {
        return Err(Error::Protocol("an answer without an outcome".to_owned()));
    };
    Ok(Decision {
        outcome,
        decided_by: decided_by(wire, local_reason)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_node_is_asked_to_answer_before_the_deadline() {
        assert_eq!(node_timeout_ms(Duration::from_millis(1_000)), 980);
        assert_eq!(node_timeout_ms(Duration::from_millis(100)), 90);
        assert_eq!(node_timeout_ms(Duration::from_millis(5)), 4);
        assert_eq!(node_timeout_ms(Duration::ZERO), 1);
    }

    fn hit_request(timeout_ms: u32) -> pb::HitRequest {
        pb::HitRequest {
            charges: vec![pb::Charge {
                kind: pb::Kind::Hooks as i32,
                tenant: "acme".into(),
                increment_us: 1_000,
                capacity_us: 10_000,
            }],
            timeout_ms,
            ..Default::default()
        }
    }

    /// A peer that accepts TCP connections and never says a word: every call still ends
    /// at its deadline, as a timeout.
    #[tokio::test]
    async fn a_node_that_never_answers_is_a_timeout_at_the_deadline() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr").to_string();
        let held = tokio::spawn(async move {
            let mut open = Vec::new();
            while let Ok((stream, _)) = listener.accept().await {
                open.push(stream);
            }
        });
        let options = Options {
            connect_timeout: Duration::from_secs(30),
            ..Options::default()
        };
        let client = Client::connect(Target::Tcp(addr), options).expect("client");
        let deadline = Duration::from_millis(200);
        let outer = Duration::from_secs(30);
        let hit = tokio::time::timeout(outer, client.hit(hit_request(200)))
            .await
            .expect("the hit returned by itself");
        assert_eq!(hit, Err(Error::Timeout(deadline)));
        let settle = pb::SettleRequest {
            timeout_ms: 200,
            ..Default::default()
        };
        let settled = tokio::time::timeout(outer, client.settle(settle))
            .await
            .expect("the settle returned by itself");
        assert_eq!(settled, Err(Error::Timeout(deadline)));
        held.abort();
    }

    /// Nothing listens: the call fails as unavailable, and the next one tries again.
    #[tokio::test]
    async fn an_unreachable_node_is_an_error_value() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr").to_string();
        drop(listener);
        let client = Client::connect(Target::Tcp(addr), Options::default()).expect("client");
        for _ in 0..2 {
            let hit = client.hit(hit_request(5_000)).await;
            assert!(matches!(hit, Err(Error::Unavailable(_))), "{hit:?}");
        }
    }

    #[tokio::test]
    async fn a_unix_socket_takes_no_tls() {
        let options = Options {
            tls: Some(ClientTlsConfig::new()),
            ..Options::default()
        };
        let refused = Client::connect(Target::Unix("/run/x.sock".into()), options);
        assert!(matches!(refused, Err(Error::Target(_))));
    }
}
