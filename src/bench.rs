//! `ankusa-fleet bench`: closed-loop load against a running fleet. N callers spread over
//! the given nodes send hits (one charge + one unique claim each, many tenants), optionally
//! settle each allowed hit, and report HDR-histogram latencies, a live progress line and a
//! JSON summary. A benchmark, never a test: it asserts nothing.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use hdrhistogram::Histogram;
use serde::Serialize;
use tonic::transport::Channel;
use tonic::Status;

use crate::pb;
use crate::pb::fleet_client::FleetClient;

/// What to run (also the `bench` subcommand's arguments).
#[derive(Clone, Debug, clap::Args)]
pub struct BenchPlan {
    /// Node API addresses, comma-separated; callers are spread over them.
    #[arg(
        long = "addrs",
        value_delimiter = ',',
        default_value = "127.0.0.1:7101,127.0.0.1:7102,127.0.0.1:7103"
    )]
    pub api_addrs: Vec<String>,
    #[arg(long, default_value_t = 64)]
    pub callers: usize,
    #[arg(long, default_value_t = 10)]
    pub duration_s: u64,
    #[arg(long, default_value_t = 1000)]
    pub tenants: u64,
    /// Commit each allowed hit's claim with a settle.
    #[arg(long)]
    pub settle: bool,
    /// Use SCOPE_NODE for charges and claims (no Raft).
    #[arg(long)]
    pub node_scope: bool,
    #[arg(long, default_value_t = 5000)]
    pub timeout_ms: u32,
    /// Charge increment per hit: a large one keeps every tenant's bucket live (for memory
    /// runs); the default never limits.
    #[arg(long, default_value_t = 1)]
    pub increment_us: u64,
    #[arg(long, default_value_t = 1_000_000_000)]
    pub capacity_us: u64,
    /// Pending lifetime of each hit's claim.
    #[arg(long, default_value_t = 60_000)]
    pub pending_ttl_ms: u64,
    /// Stop after this many hits in total (0: run for --duration-s).
    #[arg(long = "hits", default_value_t = 0)]
    pub hits_max: u64,
    /// Send hits over one `HitStream` per caller (one hit in flight each) instead of a
    /// unary `Hit` call per hit.
    #[arg(long)]
    pub stream: bool,
}

/// The JSON summary printed at the end.
#[derive(Debug, Default, Serialize)]
pub struct BenchSummary {
    pub callers: usize,
    pub nodes: usize,
    pub duration_s: f64,
    pub hits: u64,
    pub hits_per_s: f64,
    pub settles: u64,
    pub allowed: u64,
    pub not_allowed: u64,
    pub decided_local: u64,
    pub errors: u64,
    pub p50_us: u64,
    pub p90_us: u64,
    pub p99_us: u64,
    pub p999_us: u64,
    pub max_us: u64,
    /// When the slowest hit started (seconds into the run) and the node it went to: a
    /// stall at the start (connections, first streams) reads differently from one mid-run.
    pub slowest_at_s: f64,
    pub slowest_node: String,
}

/// One caller's results.
struct CallerResult {
    latencies: Histogram<u64>,
    slowest_us: u64,
    slowest_at: Duration,
}

#[derive(Default)]
struct Counters {
    /// Hits started: the run-wide sequence number (tenants, `hits_max`).
    sent: AtomicU64,
    hits: AtomicU64,
    settles: AtomicU64,
    allowed: AtomicU64,
    not_allowed: AtomicU64,
    decided_local: AtomicU64,
    errors: AtomicU64,
}

fn histogram() -> Histogram<u64> {
    // 1 µs .. 60 s at 3 significant digits; the bounds are constants, so this cannot fail.
    Histogram::new_with_bounds(1, 60_000_000, 3).unwrap_or_else(|_| unreachable!("constant bounds"))
}

/// Hit number `global_seq` of the run (unique across callers): tenants go round-robin, so
/// with `--tenants` at least `--hits` every hit has a bucket of its own.
fn hit_request(plan: &BenchPlan, caller: usize, seq: u64, global_seq: u64) -> pb::HitRequest {
    let tenant = format!("tenant-{}", global_seq % plan.tenants.max(1));
    let scope = if plan.node_scope {
        pb::Scope::Node
    } else {
        pb::Scope::Fleet
    } as i32;
    pb::HitRequest {
        charges: vec![pb::Charge {
            kind: pb::Kind::Hooks as i32,
            tenant: tenant.clone(),
            increment_us: plan.increment_us,
            capacity_us: plan.capacity_us,
        }],
        claim: Some(pb::Claim {
            tenant,
            source_id: "bench".to_owned(),
            key: format!("{caller}-{seq}-{}", std::process::id()),
            hook_id: format!("hook-{caller}-{seq}"),
            ttl_ms: 600_000,
            pending_ttl_ms: plan.pending_ttl_ms,
        }),
        timeout_ms: plan.timeout_ms,
        rate_limit_scope: scope,
        dedupe_scope: scope,
    }
}

async fn settle(
    client: &mut FleetClient<Channel>,
    request: &pb::HitRequest,
    plan: &BenchPlan,
) -> bool {
    let Some(claim) = request.claim.as_ref() else {
        return false;
    };
    let settle = pb::SettleRequest {
        tenant: claim.tenant.clone(),
        source_id: claim.source_id.clone(),
        key: claim.key.clone(),
        hook_id: claim.hook_id.clone(),
        outcome: pb::SettleOutcome::Commit as i32,
        timeout_ms: plan.timeout_ms,
        dedupe_scope: request.dedupe_scope,
        ttl_ms: 0,
    };
    client.settle(settle).await.is_ok()
}

/// How a caller sends its hits: a unary call each, or messages on its own `HitStream`.
enum HitSender {
    Unary,
    Stream {
        requests: tokio::sync::mpsc::Sender<pb::HitRequest>,
        replies: Box<tonic::Streaming<pb::HitStreamReply>>,
        /// The stream itself failed (not just one hit): it takes no more requests.
        broken: bool,
    },
}

impl HitSender {
    async fn open(plan: &BenchPlan, client: &mut FleetClient<Channel>) -> Result<Self, Status> {
        if !plan.stream {
            return Ok(Self::Unary);
        }
        let (requests, outgoing) = tokio::sync::mpsc::channel(1);
        let replies = client
            .hit_stream(tokio_stream::wrappers::ReceiverStream::new(outgoing))
            .await?
            .into_inner();
        Ok(Self::Stream {
            requests,
            replies: Box::new(replies),
            broken: false,
        })
    }

    fn is_broken(&self) -> bool {
        matches!(self, Self::Stream { broken: true, .. })
    }

    async fn hit(
        &mut self,
        client: &mut FleetClient<Channel>,
        request: pb::HitRequest,
    ) -> Result<pb::HitResponse, Status> {
        let (requests, replies, broken) = match self {
            Self::Unary => return client.hit(request).await.map(tonic::Response::into_inner),
            Self::Stream {
                requests,
                replies,
                broken,
            } => (requests, replies, broken),
        };
        if requests.send(request).await.is_err() {
            *broken = true;
            return Err(Status::unavailable("the hit stream closed"));
        }
        let reply = replies.message().await;
        *broken = !matches!(reply, Ok(Some(_)));
        match reply? {
            Some(reply) => crate::api::stream_reply_result(reply),
            None => Err(Status::unavailable("the hit stream ended")),
        }
    }
}

async fn caller(
    plan: Arc<BenchPlan>,
    index: usize,
    mut client: FleetClient<Channel>,
    counters: Arc<Counters>,
    run_started: Instant,
    until: Instant,
) -> anyhow::Result<CallerResult> {
    let mut latencies = histogram();
    let (mut slowest_us, mut slowest_at) = (0, Duration::ZERO);
    let mut sender = HitSender::open(&plan, &mut client)
        .await
        .context("opening a hit stream")?;
    let mut seq = 0u64;
    while Instant::now() < until {
        let global_seq = counters.sent.fetch_add(1, Ordering::Relaxed);
        if plan.hits_max > 0 && global_seq >= plan.hits_max {
            break;
        }
        seq += 1;
        let request = hit_request(&plan, index, seq, global_seq);
        let started = Instant::now();
        let answer = sender.hit(&mut client, request.clone()).await;
        let took_us = u64::try_from(started.elapsed().as_micros())
            .unwrap_or(u64::MAX)
            .max(1);
        let _ = latencies.record(took_us);
        if took_us > slowest_us {
            (slowest_us, slowest_at) = (took_us, started - run_started);
        }
        counters.hits.fetch_add(1, Ordering::Relaxed);
        let Ok(answer) = answer else {
            counters.errors.fetch_add(1, Ordering::Relaxed);
            if sender.is_broken() {
                sender = HitSender::open(&plan, &mut client)
                    .await
                    .context("reopening a hit stream")?;
            }
            continue;
        };
        if answer.decided_by == pb::DecidedBy::Local as i32 && !plan.node_scope {
            counters.decided_local.fetch_add(1, Ordering::Relaxed);
        }
        if matches!(answer.outcome, Some(pb::hit_response::Outcome::Allowed(_))) {
            counters.allowed.fetch_add(1, Ordering::Relaxed);
            if plan.settle && settle(&mut client, &request, &plan).await {
                counters.settles.fetch_add(1, Ordering::Relaxed);
            }
        } else {
            counters.not_allowed.fetch_add(1, Ordering::Relaxed);
        }
    }
    Ok(CallerResult {
        latencies,
        slowest_us,
        slowest_at,
    })
}

/// Runs the plan and returns the summary.
///
/// # Errors
/// When a node cannot be reached at the start.
pub async fn run(plan: BenchPlan) -> anyhow::Result<BenchSummary> {
    // One connection per caller, like separate edge workers: callers sharing one HTTP/2
    // connection would measure that connection, not the node.
    let mut clients = Vec::with_capacity(plan.callers);
    for i in 0..plan.callers {
        let addr = &plan.api_addrs[i % plan.api_addrs.len()];
        let client = FleetClient::connect(format!("http://{addr}"))
            .await
            .with_context(|| format!("connecting to {addr}"))?
            .max_decoding_message_size(crate::limits::API_RESPONSE_BYTES_MAX);
        clients.push(client);
    }
    let plan = Arc::new(plan);
    let counters = Arc::new(Counters::default());
    let started = Instant::now();
    let until = started + Duration::from_secs(plan.duration_s);
    let tasks: Vec<_> = (0..plan.callers)
        .map(|i| {
            let client = clients[i].clone();
            let counters = counters.clone();
            tokio::spawn(caller(plan.clone(), i, client, counters, started, until))
        })
        .collect();
    let progress = tokio::spawn(progress(counters.clone(), started, until));
    let mut latencies = histogram();
    let (mut slowest_us, mut slowest_at_s, mut slowest_node) = (0, 0.0, String::new());
    for (i, task) in tasks.into_iter().enumerate() {
        let result = task.await??;
        latencies.add(&result.latencies)?;
        if result.slowest_us > slowest_us {
            slowest_us = result.slowest_us;
            slowest_at_s = result.slowest_at.as_secs_f64();
            slowest_node = plan.api_addrs[i % plan.api_addrs.len()].clone();
        }
    }
    progress.abort();
    eprintln!();
    let elapsed_s = started.elapsed().as_secs_f64();
    let hits = counters.hits.load(Ordering::Relaxed);
    Ok(BenchSummary {
        callers: plan.callers,
        nodes: plan.api_addrs.len(),
        duration_s: elapsed_s,
        hits,
        hits_per_s: hits as f64 / elapsed_s,
        settles: counters.settles.load(Ordering::Relaxed),
        allowed: counters.allowed.load(Ordering::Relaxed),
        not_allowed: counters.not_allowed.load(Ordering::Relaxed),
        decided_local: counters.decided_local.load(Ordering::Relaxed),
        errors: counters.errors.load(Ordering::Relaxed),
        p50_us: latencies.value_at_quantile(0.50),
        p90_us: latencies.value_at_quantile(0.90),
        p99_us: latencies.value_at_quantile(0.99),
        p999_us: latencies.value_at_quantile(0.999),
        max_us: latencies.max(),
        slowest_at_s,
        slowest_node,
    })
}

async fn progress(counters: Arc<Counters>, started: Instant, until: Instant) {
    let mut last_hits = 0;
    while Instant::now() < until {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let hits = counters.hits.load(Ordering::Relaxed);
        eprint!(
            "\r{:>5.1}s  {:>8} hits  {:>8} hits/s  {} errors   ",
            started.elapsed().as_secs_f64(),
            hits,
            hits - last_hits,
            counters.errors.load(Ordering::Relaxed)
        );
        last_hits = hits;
    }
}
