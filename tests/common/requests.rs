//! Request builders, calls with their answers flattened for assertions, claim helpers run
//! over many keys, and the `HitStream` client.

use std::time::Duration;

use ankusa_fleet::pb;
use ankusa_fleet::pb::fleet_client::FleetClient;
use tokio::time::Instant;
use tonic::transport::Channel;

use super::{Fleet, CALL_TIMEOUT_MS, CONDITION_DEADLINE};

pub async fn connect(api_addr: &str) -> FleetClient<Channel> {
    let deadline = Instant::now() + CONDITION_DEADLINE;
    loop {
        if let Ok(client) = FleetClient::connect(format!("http://{api_addr}")).await {
            return client;
        }
        assert!(Instant::now() < deadline, "cannot connect to {api_addr}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

// ---- request builders ----

pub fn hooks(tenant: &str, increment_us: u64, capacity_us: u64) -> pb::Charge {
    pb::Charge {
        kind: pb::Kind::Hooks as i32,
        tenant: tenant.to_owned(),
        increment_us,
        capacity_us,
    }
}

pub fn claim(tenant: &str, key: &str, hook_id: &str) -> pb::Claim {
    pb::Claim {
        tenant: tenant.to_owned(),
        source_id: "stripe".to_owned(),
        key: key.to_owned(),
        hook_id: hook_id.to_owned(),
        ttl_ms: 3_600_000,
        pending_ttl_ms: 60_000,
    }
}

pub fn hit(charges: Vec<pb::Charge>, claim: Option<pb::Claim>) -> pb::HitRequest {
    pb::HitRequest {
        charges,
        claim,
        timeout_ms: CALL_TIMEOUT_MS,
        rate_limit_scope: pb::Scope::Fleet as i32,
        dedupe_scope: pb::Scope::Fleet as i32,
    }
}

pub fn settle(
    tenant: &str,
    key: &str,
    hook_id: &str,
    outcome: pb::SettleOutcome,
) -> pb::SettleRequest {
    pb::SettleRequest {
        tenant: tenant.to_owned(),
        source_id: "stripe".to_owned(),
        key: key.to_owned(),
        hook_id: hook_id.to_owned(),
        outcome: outcome as i32,
        timeout_ms: CALL_TIMEOUT_MS,
        dedupe_scope: pb::Scope::Fleet as i32,
        ttl_ms: 0,
    }
}

/// The outcome of a hit, flattened for assertions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    Allowed,
    Duplicate(String),
    Pending(u64),
    RateLimited(u64),
}

pub fn outcome(response: &pb::HitResponse) -> Outcome {
    use pb::hit_response::Outcome as O;
    match response.outcome.as_ref().expect("an outcome") {
        O::Allowed(_) => Outcome::Allowed,
        O::Duplicate(d) => Outcome::Duplicate(d.hook_id.clone()),
        O::Pending(p) => Outcome::Pending(p.retry_after_ms),
        O::RateLimited(r) => Outcome::RateLimited(r.retry_after_ms),
    }
}

/// Sends a hit and returns its outcome and who decided it.
pub async fn send_hit(
    client: &mut FleetClient<Channel>,
    request: pb::HitRequest,
) -> (Outcome, i32) {
    let response = client
        .hit(request)
        .await
        .expect("hit answered")
        .into_inner();
    (outcome(&response), response.decided_by)
}

// ---- helpers for the fault and membership tests ----

/// The hook id the helpers below store for `key`.
pub fn hook_of(key: &str) -> String {
    format!("hook-{key}")
}

/// `n` distinct idempotency keys starting with `prefix`.
pub fn keys(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}-{i}")).collect()
}

impl Fleet {
    pub async fn client(&self, id: u64) -> FleetClient<Channel> {
        connect(&self.api_addr(id)).await
    }

    /// Claims and commits every key (hit, then settle commit, hook `hook_of(key)`), spread
    /// round robin over the nodes in `via`, `concurrency` keys at a time. Every answer must
    /// be `allowed` / `settled`, decided by the fleet.
    pub async fn commit_claims(
        &self,
        via: &[u64],
        tenant: &str,
        keys: &[String],
        concurrency: usize,
    ) {
        let clients = self.clients(via).await;
        let failures = run_all(keys, concurrency, |i, key| {
            let mut client = clients[i % clients.len()].clone();
            async move { commit_claim(&mut client, tenant, &key).await }
        })
        .await;
        if let Some(first) = failures.first() {
            self.fail(&format!(
                "{} claims not committed, first: {first}",
                failures.len()
            ));
        }
    }

    /// Asserts that through node `id` every key answers `duplicate{hook_of(key)}`, decided
    /// by the fleet (a probe with another hook id, so a lost claim would show as `allowed`).
    pub async fn assert_duplicates(
        &self,
        id: u64,
        tenant: &str,
        keys: &[String],
        concurrency: usize,
    ) {
        let client = self.client(id).await;
        let failures = run_all(keys, concurrency, |_, key| {
            let mut client = client.clone();
            async move { probe_duplicate(&mut client, tenant, &key).await }
        })
        .await;
        if let Some(first) = failures.first() {
            self.fail(&format!(
                "node {id}: {} of {} keys not duplicate, first: {first}",
                failures.len(),
                keys.len()
            ));
        }
    }

    async fn clients(&self, ids: &[u64]) -> Vec<FleetClient<Channel>> {
        let mut clients = Vec::new();
        for id in ids {
            clients.push(self.client(*id).await);
        }
        clients
    }
}

/// Runs `work` for every key, `concurrency` at a time; returns the failures.
async fn run_all<F, Fut>(keys: &[String], concurrency: usize, work: F) -> Vec<String>
where
    F: Fn(usize, String) -> Fut,
    Fut: std::future::Future<Output = Result<(), String>>,
{
    use futures::StreamExt;
    let results: Vec<Result<(), String>> =
        futures::stream::iter(keys.iter().enumerate().map(|(i, key)| work(i, key.clone())))
            .buffer_unordered(concurrency.max(1))
            .collect()
            .await;
    results.into_iter().filter_map(Result::err).collect()
}

pub async fn commit_claim(
    client: &mut FleetClient<Channel>,
    tenant: &str,
    key: &str,
) -> Result<(), String> {
    let hook = hook_of(key);
    let response = client
        .hit(hit(vec![], Some(claim(tenant, key, &hook))))
        .await
        .map_err(|e| format!("hit {key}: {e}"))?
        .into_inner();
    let got = (outcome(&response), response.decided_by);
    if got != (Outcome::Allowed, pb::DecidedBy::Fleet as i32) {
        return Err(format!("hit {key}: {got:?}"));
    }
    let settled = client
        .settle(settle(tenant, key, &hook, pb::SettleOutcome::Commit))
        .await
        .map_err(|e| format!("settle {key}: {e}"))?
        .into_inner();
    let got = (settled.status, settled.decided_by);
    if got
        != (
            pb::SettleStatus::Settled as i32,
            pb::DecidedBy::Fleet as i32,
        )
    {
        return Err(format!("settle {key}: {got:?}"));
    }
    Ok(())
}

async fn probe_duplicate(
    client: &mut FleetClient<Channel>,
    tenant: &str,
    key: &str,
) -> Result<(), String> {
    let response = client
        .hit(hit(vec![], Some(claim(tenant, key, "hook-probe"))))
        .await
        .map_err(|e| format!("hit {key}: {e}"))?
        .into_inner();
    let got = (outcome(&response), response.decided_by);
    if got
        != (
            Outcome::Duplicate(hook_of(key)),
            pb::DecidedBy::Fleet as i32,
        )
    {
        return Err(format!("{key}: {got:?}"));
    }
    Ok(())
}

// ---- helpers shared by the semantics and validation tests ----

pub fn bytes(tenant: &str, increment_us: u64, capacity_us: u64) -> pb::Charge {
    pb::Charge {
        kind: pb::Kind::Bytes as i32,
        tenant: tenant.to_owned(),
        increment_us,
        capacity_us,
    }
}

pub fn reset(tenant: &str) -> pb::ResetRequest {
    pb::ResetRequest {
        tenant: tenant.to_owned(),
        timeout_ms: CALL_TIMEOUT_MS,
    }
}

pub fn check_rate(
    entity_id: &str,
    operation: &str,
    limit: u64,
    window_ms: u64,
) -> pb::CheckRateRequest {
    pb::CheckRateRequest {
        entity_id: entity_id.to_owned(),
        operation: operation.to_owned(),
        limit,
        window_ms,
        timeout_ms: CALL_TIMEOUT_MS,
        scope: pb::Scope::Fleet as i32,
    }
}

/// Sends a hit and returns the whole response (outcome, decided_by, local_reason).
pub async fn send_hit_full(
    client: &mut FleetClient<Channel>,
    request: pb::HitRequest,
) -> pb::HitResponse {
    client
        .hit(request)
        .await
        .expect("hit answered")
        .into_inner()
}

pub async fn send_settle(
    client: &mut FleetClient<Channel>,
    request: pb::SettleRequest,
) -> pb::SettleResponse {
    client
        .settle(request)
        .await
        .expect("settle answered")
        .into_inner()
}

pub async fn send_check_rate(
    client: &mut FleetClient<Channel>,
    request: pb::CheckRateRequest,
) -> pb::CheckRateResponse {
    client
        .check_rate(request)
        .await
        .expect("check_rate answered")
        .into_inner()
}

pub async fn send_reset(client: &mut FleetClient<Channel>, tenant: &str) {
    client.reset(reset(tenant)).await.expect("reset answered");
}

/// True when `message` names `field` as a whole token: `charges` is not named by
/// `charges[0].kind`, nor `ttl_ms` by `claim.ttl_ms`.
pub fn names_field(message: &str, field: &str) -> bool {
    let is_name_char = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '.';
    message.match_indices(field).any(|(at, _)| {
        let before = message[..at].chars().next_back();
        let after = message[at + field.len()..].chars().next();
        !before.is_some_and(is_name_char) && !after.is_some_and(|c| is_name_char(c) || c == '[')
    })
}

// ---- HitStream: the streaming twin of Hit ----

/// One open `HitStream`: requests go in, replies come back in request order.
pub struct HitStream {
    requests: tokio::sync::mpsc::Sender<pb::HitRequest>,
    replies: tonic::Streaming<pb::HitStreamReply>,
}

impl HitStream {
    pub async fn open(client: &mut FleetClient<Channel>) -> HitStream {
        let (requests, outgoing) = tokio::sync::mpsc::channel(64);
        let replies = client
            .hit_stream(tokio_stream::wrappers::ReceiverStream::new(outgoing))
            .await
            .expect("open a hit stream")
            .into_inner();
        HitStream { requests, replies }
    }

    /// Sends one request without waiting for its reply.
    pub async fn send(&mut self, request: pb::HitRequest) {
        self.requests
            .send(request)
            .await
            .expect("the hit stream takes requests");
    }

    /// The next reply: the answer, or the error reply as a status. Panics if the stream
    /// itself ended or failed (an error reply must not end it).
    pub async fn reply(&mut self) -> Result<pb::HitResponse, tonic::Status> {
        let reply = tokio::time::timeout(CONDITION_DEADLINE, self.replies.message())
            .await
            .expect("a reply within the deadline")
            .expect("the stream did not fail")
            .expect("the stream did not end");
        ankusa_fleet::api::stream_reply_result(reply)
    }

    /// Sends one request and waits for its reply.
    pub async fn hit(&mut self, request: pb::HitRequest) -> Result<pb::HitResponse, tonic::Status> {
        self.send(request).await;
        self.reply().await
    }
}

// ---- HitBatch: many hits per message, answers by id ----

/// One open `HitBatch`: frames of (id, hit) go in, replies of answers by id come back.
pub struct HitBatch {
    frames: tokio::sync::mpsc::Sender<pb::HitBatchRequest>,
    replies: tonic::Streaming<pb::HitBatchReply>,
}

/// One hit's answer on a `HitBatch`: the response, or the error as a status.
pub type BatchAnswer = Result<pb::HitResponse, tonic::Status>;

impl HitBatch {
    pub async fn open(client: &mut FleetClient<Channel>) -> HitBatch {
        let (frames, outgoing) = tokio::sync::mpsc::channel(16);
        let replies = client
            .hit_batch(tokio_stream::wrappers::ReceiverStream::new(outgoing))
            .await
            .expect("open a hit batch stream")
            .into_inner();
        HitBatch { frames, replies }
    }

    /// Sends one frame without waiting for its answers.
    pub async fn send(&mut self, hits: Vec<(u64, pb::HitRequest)>) {
        let hits = hits
            .into_iter()
            .map(|(id, hit)| pb::BatchedHit { id, hit: Some(hit) })
            .collect();
        self.frames
            .send(pb::HitBatchRequest { hits })
            .await
            .expect("the hit batch stream takes frames");
    }

    /// The next reply message, or the status the stream ended with. Panics if it ended
    /// without one.
    pub async fn reply(&mut self) -> Result<Vec<(u64, BatchAnswer)>, tonic::Status> {
        let reply = tokio::time::timeout(CONDITION_DEADLINE, self.replies.message())
            .await
            .expect("a reply within the deadline")?
            .expect("the stream did not end");
        Ok(reply
            .answers
            .into_iter()
            .map(ankusa_fleet::api::batch::answer_result)
            .collect())
    }

    /// Reply messages until `count` answers came: each answer by id, with the number of
    /// the reply message it came in (0 for the first). Panics on an id answered twice.
    pub async fn answers(
        &mut self,
        count: usize,
    ) -> std::collections::BTreeMap<u64, (usize, BatchAnswer)> {
        let mut answers = std::collections::BTreeMap::new();
        let mut message = 0;
        while answers.len() < count {
            for (id, answer) in self.reply().await.expect("the stream did not fail") {
                let earlier = answers.insert(id, (message, answer));
                assert!(earlier.is_none(), "hit {id} was answered twice");
            }
            message += 1;
        }
        answers
    }

    /// The status the stream ended with. Panics if a reply came instead.
    pub async fn ended(&mut self) -> tonic::Status {
        match self.reply().await {
            Ok(answers) => panic!("answers instead of the stream's end: {answers:?}"),
            Err(status) => status,
        }
    }

    /// The sender of raw frames, for a message `send` would not build.
    pub fn frames(&self) -> &tokio::sync::mpsc::Sender<pb::HitBatchRequest> {
        &self.frames
    }

    /// Sends one hit in a frame of its own and waits for its answer.
    pub async fn hit(&mut self, request: pb::HitRequest) -> BatchAnswer {
        self.send(vec![(0, request)]).await;
        let mut answers = self.answers(1).await;
        answers.remove(&0).expect("hit 0 is answered").1
    }
}
