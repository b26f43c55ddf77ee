//! The workload: clients on every node sending claims, settles, charges and resets, each
//! call recorded with its invocation and return time.
//!
//! Claims go to a small key space that moves on every [`KEY_WINDOW_MS`], so hooks on
//! different nodes collide on the same keys while they are fresh: one takes the claim, the
//! others see it pending, then duplicate once it commits, or free again once released.
//! Some keys belong to one node's clients only (see [`Client::run`]). A
//! client that took a claim settles it (commit mostly, release sometimes), retrying with
//! the same hook while the answer is unknown, as an edge would.

use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::sync::watch;
use tonic::transport::Channel;

use super::history::{Answer, Decided, Op, Outcome, Recorder, Request};
use ankusa_fleet::pb;
use ankusa_fleet::pb::fleet_client::FleetClient;

/// The tenant and source of every checked claim.
const TENANT: &str = "nemesis";
const SOURCE: &str = "provider";
/// Committed claims in the checked key space outlive any run, and any clock fault.
const CLAIM_TTL_MS: u64 = 86_400_000;
/// Pending claims outlive any run too, even on a node whose clock is set forward by
/// [`CLOCK_SKEW_MS`]: the fleet's time moves by at most [`MAX_CLOCK_OFFSET_MS`] with it.
pub const PENDING_TTL_MS: u64 = 3_600_000;
/// How far the `clock` fault sets a wall clock, forward or back: past the pending TTL.
pub const CLOCK_SKEW_MS: i64 = 5_400_000;
/// The fleet's `max_clock_offset_ms` (the nodes' configs say so).
pub const MAX_CLOCK_OFFSET_MS: u64 = 500;
/// How far the `skew` fault sets a wall clock, forward or back: within the bound.
pub const SMALL_SKEW_MS: i64 = MAX_CLOCK_OFFSET_MS as i64 / 2;
/// The charges' bucket: 10 at once, 10 per second.
pub const BUCKET: crate::check::budget::Bucket = crate::check::budget::Bucket {
    increment_us: 100_000,
    capacity_us: 1_000_000,
};
// The bucket search (`check::bucket`) works on a 1 ms grid: the bucket must fit it.
const _: () = assert!(
    BUCKET.increment_us % crate::check::bucket::GRID_US == 0
        && BUCKET.capacity_us % crate::check::bucket::GRID_US == 0
);
/// How long a set of keys is fresh.
pub const KEY_WINDOW_MS: u64 = 2_000;
/// Keys fresh at once, shared by every node, for each client a node has: as many clients
/// per key with `--clients 8` as with the default 2, so the claim search's cost per key
/// (exponential in the calls that overlap on it) does not grow with the clients.
const KEYS_PER_WINDOW_PER_CLIENT: u64 = 2;
/// The share of claims on a node's own keys, and how many of those are fresh at once, for
/// each client a node has.
const PRIVATE_KEYS: f64 = 0.3;
const PRIVATE_KEYS_PER_WINDOW_PER_CLIENT: u64 = 1;
/// Every call's deadline.
pub const CALL_TIMEOUT_MS: u64 = 300;
/// The hook of the final probes.
pub const PROBE_HOOK: &str = "probe";
/// Times a client retries a settle whose answer is unknown before it leaves it.
const SETTLE_TRIES: usize = 5;

/// One client, bound to one node.
pub struct Client {
    pub id: usize,
    pub node: u64,
    pub api_addr: String,
    pub seed: u64,
    /// How many clients each node has (the keys fresh at once scale with it).
    pub clients_per_node: u64,
    /// The node's `HitBatch` stream its claims travel on (`--frames`); `None`: a unary
    /// `Hit` each.
    pub frames: Option<super::frames::Frames>,
}

/// How long a client waits for any answer (a paused node gives none) before it calls the
/// outcome unknown.
const CLIENT_WAIT: Duration = Duration::from_millis(3 * CALL_TIMEOUT_MS);

async fn bounded<T>(
    call: impl std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
) -> Result<tonic::Response<T>, tonic::Status> {
    tokio::time::timeout(CLIENT_WAIT, call)
        .await
        .unwrap_or_else(|_| Err(tonic::Status::deadline_exceeded("no answer from the node")))
}

/// How a call that got no answer ended: never sent when no connection could be made (the
/// node is down or restarting), else unknown.
fn failed(status: &tonic::Status) -> Outcome {
    let text = format!("{status:?}");
    let refused = status.code() == tonic::Code::Unavailable
        && [
            "tcp connect error",
            "Connection refused",
            "error trying to connect",
        ]
        .iter()
        .any(|sign| text.contains(sign));
    if refused {
        Outcome::NotSent(status.message().to_owned())
    } else {
        Outcome::Unknown(status.to_string())
    }
}

fn decided(decided_by: i32) -> Decided {
    if decided_by == pb::DecidedBy::Local as i32 {
        Decided::Local
    } else {
        Decided::Fleet
    }
}

impl Client {
    /// Sends calls until `stop` turns true.
    pub async fn run(self, recorder: Recorder, mut stop: watch::Receiver<bool>) {
        let mut rng = StdRng::seed_from_u64(self.seed ^ (self.id as u64).wrapping_mul(0x9e37_79b9));
        let endpoint =
            match tonic::transport::Endpoint::from_shared(format!("http://{}", self.api_addr)) {
                Ok(endpoint) => endpoint.connect_timeout(Duration::from_millis(CALL_TIMEOUT_MS)),
                Err(_) => return,
            };
        let mut client = FleetClient::new(endpoint.connect_lazy());
        let mut seq = 0u64;
        while !*stop.borrow() {
            seq += 1;
            let roll = rng.gen_range(0..100);
            if roll < 70 {
                let window = recorder.now_us() / 1_000 / KEY_WINDOW_MS;
                // Most keys are shared by every node's clients, so claims collide. Some are
                // this node's own: a commit it queued while cut off meets no other hook's
                // commit there, so if the queued settle were lost, the final probe shows it.
                let key = if rng.gen_bool(PRIVATE_KEYS) {
                    let k = rng
                        .gen_range(0..PRIVATE_KEYS_PER_WINDOW_PER_CLIENT * self.clients_per_node);
                    format!("n{}-w{window}-k{k}", self.node)
                } else {
                    let k = rng.gen_range(0..KEYS_PER_WINDOW_PER_CLIENT * self.clients_per_node);
                    format!("w{window}-k{k}")
                };
                let hook = format!("c{}-{seq}", self.id);
                let answer = self.claim(&mut client, &recorder, &key, &hook).await;
                if answer == Some(Answer::Allowed) {
                    let commit = rng.gen_bool(0.7);
                    for _ in 0..SETTLE_TRIES {
                        if self
                            .settle(&mut client, &recorder, &key, &hook, commit)
                            .await
                        {
                            break;
                        }
                    }
                }
            } else if roll < 97 {
                let tenant = format!("t{}", rng.gen_range(0..3));
                self.charge(&mut client, &recorder, &tenant).await;
            } else {
                let tenant = format!("t{}", rng.gen_range(0..3));
                self.reset(&mut client, &recorder, &tenant).await;
            }
            let pause = Duration::from_millis(rng.gen_range(5..=30));
            tokio::select! {
                _ = tokio::time::sleep(pause) => {}
                _ = stop.changed() => {}
            }
        }
    }

    fn record(&self, recorder: &Recorder, request: Request, invoke_us: u64, outcome: Outcome) {
        recorder.record(Op {
            id: 0,
            client: self.id,
            node: self.node,
            request,
            timeout_ms: CALL_TIMEOUT_MS,
            invoke_us,
            return_us: recorder.now_us(),
            outcome,
        });
    }

    /// After the final heal: one claim per key with a hook nobody used, through the fleet,
    /// so the history ends with what the fleet holds for every key (a queued commit that
    /// never reached it shows here).
    pub async fn probe(&self, recorder: &Recorder, keys: &[String]) {
        let Ok(endpoint) =
            tonic::transport::Endpoint::from_shared(format!("http://{}", self.api_addr))
        else {
            return;
        };
        let mut client = FleetClient::new(endpoint.connect_lazy());
        for key in keys {
            self.claim(&mut client, recorder, key, PROBE_HOOK).await;
        }
    }

    async fn claim(
        &self,
        client: &mut FleetClient<Channel>,
        recorder: &Recorder,
        key: &str,
        hook: &str,
    ) -> Option<Answer> {
        use pb::hit_response::Outcome as O;
        let request = pb::HitRequest {
            charges: Vec::new(),
            claim: Some(pb::Claim {
                tenant: TENANT.to_owned(),
                source_id: SOURCE.to_owned(),
                key: key.to_owned(),
                hook_id: hook.to_owned(),
                ttl_ms: CLAIM_TTL_MS,
                pending_ttl_ms: PENDING_TTL_MS,
            }),
            timeout_ms: CALL_TIMEOUT_MS as u32,
            rate_limit_scope: pb::Scope::Fleet as i32,
            dedupe_scope: pb::Scope::Fleet as i32,
        };
        let invoke_us = recorder.now_us();
        let answered = match &self.frames {
            Some(frames) => tokio::time::timeout(CLIENT_WAIT, frames.hit(request))
                .await
                .unwrap_or_else(|_| {
                    Err(tonic::Status::deadline_exceeded("no answer from the node"))
                }),
            None => bounded(client.hit(request))
                .await
                .map(tonic::Response::into_inner),
        };
        let outcome = match answered {
            Ok(response) => {
                let answer = match response.outcome {
                    Some(O::Allowed(_)) => Answer::Allowed,
                    Some(O::Duplicate(d)) => Answer::Duplicate { holder: d.hook_id },
                    Some(O::Pending(_)) => Answer::Pending,
                    Some(O::RateLimited(_)) => Answer::RateLimited,
                    None => Answer::Reset,
                };
                Outcome::Answered(answer, decided(response.decided_by))
            }
            Err(status) => failed(&status),
        };
        let answer = match &outcome {
            Outcome::Answered(answer, _) => Some(answer.clone()),
            Outcome::Unknown(_) | Outcome::NotSent(_) => None,
        };
        let request = Request::Claim {
            key: key.to_owned(),
            hook: hook.to_owned(),
        };
        self.record(recorder, request, invoke_us, outcome);
        answer
    }

    /// `true` once the settle was answered.
    async fn settle(
        &self,
        client: &mut FleetClient<Channel>,
        recorder: &Recorder,
        key: &str,
        hook: &str,
        commit: bool,
    ) -> bool {
        let request = pb::SettleRequest {
            tenant: TENANT.to_owned(),
            source_id: SOURCE.to_owned(),
            key: key.to_owned(),
            hook_id: hook.to_owned(),
            outcome: if commit {
                pb::SettleOutcome::Commit as i32
            } else {
                pb::SettleOutcome::Release as i32
            },
            timeout_ms: CALL_TIMEOUT_MS as u32,
            dedupe_scope: pb::Scope::Fleet as i32,
            ttl_ms: CLAIM_TTL_MS,
        };
        let invoke_us = recorder.now_us();
        let outcome = match bounded(client.settle(request)).await {
            Ok(response) => {
                let response = response.into_inner();
                let holder = response.holder_hook_id;
                let answer = match pb::SettleStatus::try_from(response.status) {
                    Ok(pb::SettleStatus::Settled) => Answer::Settled,
                    Ok(pb::SettleStatus::Recreated) => Answer::Recreated,
                    Ok(pb::SettleStatus::Conflict) => Answer::Conflict { holder },
                    Ok(pb::SettleStatus::Queued) => Answer::Queued,
                    _ => Answer::Reset,
                };
                Outcome::Answered(answer, decided(response.decided_by))
            }
            Err(status) => failed(&status),
        };
        let answered = matches!(outcome, Outcome::Answered(..));
        let request = Request::Settle {
            key: key.to_owned(),
            hook: hook.to_owned(),
            commit,
        };
        self.record(recorder, request, invoke_us, outcome);
        answered
    }

    async fn charge(&self, client: &mut FleetClient<Channel>, recorder: &Recorder, tenant: &str) {
        use pb::hit_response::Outcome as O;
        let request = pb::HitRequest {
            charges: vec![pb::Charge {
                kind: pb::Kind::Hooks as i32,
                tenant: tenant.to_owned(),
                increment_us: BUCKET.increment_us,
                capacity_us: BUCKET.capacity_us,
            }],
            claim: None,
            timeout_ms: CALL_TIMEOUT_MS as u32,
            rate_limit_scope: pb::Scope::Fleet as i32,
            dedupe_scope: pb::Scope::Fleet as i32,
        };
        let invoke_us = recorder.now_us();
        let outcome = match bounded(client.hit(request)).await {
            Ok(response) => {
                let response = response.into_inner();
                let answer = match response.outcome {
                    Some(O::RateLimited(_)) => Answer::RateLimited,
                    _ => Answer::Allowed,
                };
                Outcome::Answered(answer, decided(response.decided_by))
            }
            Err(status) => failed(&status),
        };
        let request = Request::Charge {
            tenant: tenant.to_owned(),
        };
        self.record(recorder, request, invoke_us, outcome);
    }

    async fn reset(&self, client: &mut FleetClient<Channel>, recorder: &Recorder, tenant: &str) {
        let request = pb::ResetRequest {
            tenant: tenant.to_owned(),
            timeout_ms: CALL_TIMEOUT_MS as u32,
        };
        let invoke_us = recorder.now_us();
        let outcome = match bounded(client.reset(request)).await {
            Ok(_) => Outcome::Answered(Answer::Reset, Decided::Fleet),
            Err(status) => failed(&status),
        };
        let request = Request::Reset {
            tenant: tenant.to_owned(),
        };
        self.record(recorder, request, invoke_us, outcome);
    }
}
