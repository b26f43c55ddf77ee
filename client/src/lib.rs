//! An edge client for the local ankusa-fleet node.
//!
//! One [`Client`] per edge process, cloned into every worker: hits from all of them travel
//! over one `HitBatch` stream, and settles, resets and check_rate calls are unary calls on
//! the same HTTP/2 connection. The node may be on TCP (`api_addr`, optionally with TLS) or
//! on its Unix socket (`api_socket`).
//!
//! Hits are coalesced without the caller's help: with no frame in flight a hit leaves at
//! once, alone; while one is in flight, the hits of every clone gather into the next frame,
//! which leaves when that one is answered (or when it is full). Each answer is matched to
//! its hit by id, so a slow hit holds back no other. An edge that already holds a batch
//! hands it over whole with [`Client::hit_many`].
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

use std::path::PathBuf;
use std::time::Duration;

use tokio::sync::mpsc;
use tonic::transport::{Channel, ClientTlsConfig, Endpoint, Uri};

/// The edge API's messages and client, generated from the repository's `proto/fleet.proto`.
pub mod pb {
    tonic::include_proto!("ankusa.fleet.v1");
}

use pb::fleet_client::FleetClient;

mod batch;

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

/// Submissions waiting for the hit task, at most (a submission is one hit, or up to a frame
/// of a [`Client::hit_many`]); a further call waits for room within its deadline.
const SUBMISSIONS_QUEUED_MAX: usize = 1024;

/// A client of one node (cheap to clone; clones share the connection and the hit stream).
/// Dropping the last clone closes the stream once its answers are in.
#[derive(Clone)]
pub struct Client {
    unary: FleetClient<Channel>,
    hits: mpsc::Sender<batch::Submission>,
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
        let (hits, submissions) = mpsc::channel(SUBMISSIONS_QUEUED_MAX);
        tokio::spawn(batch::run(
            unary.clone(),
            submissions,
            options.connect_timeout,
        ));
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

    /// Charges and claims in one call. `request.timeout_ms` is the call's deadline (0:
    /// [`Options::timeout`]).
    ///
    /// Hits of every clone share one `HitBatch` stream: a hit leaves at once when no frame
    /// is in flight, and otherwise in the next frame, with the others that came meanwhile.
    ///
    /// # Errors
    /// No answer by the deadline, an unreachable node, or a refused request.
    pub async fn hit(&self, request: pb::HitRequest) -> Result<Decision, Error> {
        let budget = self.deadline(request.timeout_ms);
        let deadline = tokio::time::Instant::now() + budget;
        let (job, answer) = batch::Job::new(request, deadline, budget)?;
        self.submit(vec![job]).await;
        wait_for(answer, deadline, budget).await
    }

    /// Many hits in one call, for an edge that already holds a batch: they leave together
    /// (in frames of at most 1024), and the answers come back in the order of `requests`.
    /// Each hit is its own decision with its own deadline (its `timeout_ms`, 0:
    /// [`Options::timeout`]), and its own error; the call returns by the latest of them.
    pub async fn hit_many(&self, requests: Vec<pb::HitRequest>) -> Vec<Result<Decision, Error>> {
        let now = tokio::time::Instant::now();
        let mut waits = Vec::with_capacity(requests.len());
        let mut frame = Vec::new();
        for request in requests {
            let budget = self.deadline(request.timeout_ms);
            let deadline = now + budget;
            match batch::Job::new(request, deadline, budget) {
                Ok((job, answer)) => {
                    frame.push(job);
                    waits.push(Ok((answer, deadline, budget)));
                }
                Err(refused) => waits.push(Err(refused)),
            }
            if frame.len() == batch::FRAME_HITS_MAX {
                self.submit(std::mem::take(&mut frame)).await;
            }
        }
        self.submit(frame).await;
        let mut decisions = Vec::with_capacity(waits.len());
        for wait in waits {
            decisions.push(match wait {
                Ok((answer, deadline, budget)) => wait_for(answer, deadline, budget).await,
                Err(refused) => Err(refused),
            });
        }
        decisions
    }

    /// Hands `jobs` to the hit task, waiting for room until the latest of their deadlines;
    /// a job that finds none is answered here.
    async fn submit(&self, jobs: batch::Submission) {
        let Some(latest) = jobs.iter().map(|job| job.deadline).max() else {
            return;
        };
        match tokio::time::timeout_at(latest, self.hits.reserve()).await {
            Ok(Ok(room)) => room.send(jobs),
            Ok(Err(_)) => {
                for job in jobs {
                    job.answer(Err(stopped()));
                }
            }
            // Every one of their deadlines has passed.
            Err(_) => {
                for job in jobs {
                    job.time_out();
                }
            }
        }
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

/// A hit's answer, or [`Error::Timeout`] at its `deadline` (the node's `CANCELLED` or
/// `DEADLINE_EXCEEDED` for it is that timeout too).
async fn wait_for(
    answer: batch::Answer,
    deadline: tokio::time::Instant,
    budget: Duration,
) -> Result<Decision, Error> {
    let response = match tokio::time::timeout_at(deadline, answer).await {
        Err(_) => return Err(Error::Timeout(budget)),
        Ok(Err(_)) => return Err(stopped()),
        Ok(Ok(Err(Error::Status {
            code: tonic::Code::Cancelled | tonic::Code::DeadlineExceeded,
            ..
        }))) => return Err(Error::Timeout(budget)),
        Ok(Ok(answered)) => answered?,
    };
    decision(
        response.outcome.map(outcome_of).transpose()?,
        response.decided_by,
        response.local_reason,
    )
}

fn stopped() -> Error {
    Error::Unavailable("the hit stream's task stopped".to_owned())
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
