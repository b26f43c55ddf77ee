//! `ankusa-fleet bench`: one load generator for the fleet and for Redis. N callers send hits
//! (one charge + one unique claim each, many tenants) through one of four paths: a unary
//! `Hit` per hit, a `HitStream` per caller, the edge client (`--client`), or Redis running
//! `scripts/redis/hit.lua` (`--redis`, with the `redis-bench` feature). Closed loop by
//! default (each caller sends its next hit when the last is answered); `--rate` runs an open
//! loop instead. Reports HDR-histogram latencies, a live progress line and a JSON summary.
//! A benchmark, never a test: it asserts nothing.
//!
//! The callers and the clock live here; how a hit is sent lives in `fleet.rs` and `redis.rs`.

pub mod settle_queue;
pub mod snapshot;

mod fleet;
#[cfg(feature = "redis-bench")]
mod redis;

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use serde::Serialize;

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
    #[arg(long, conflicts_with_all = ["client", "redis_addr"])]
    pub stream: bool,
    /// Send hits through `ankusa-fleet-client`: one `Client` per node, shared by that
    /// node's callers, the way an edge process shares one.
    #[arg(long, conflicts_with = "redis_addr")]
    pub client: bool,
    /// Open loop: this many hits per second in total, each caller on a fixed schedule of
    /// its share. A hit's latency counts from when it was due, so a stall is not hidden by
    /// the hits it kept from being sent. At most --callers hits are in flight: a caller
    /// behind its schedule sends its late hits back to back.
    #[arg(long = "rate", value_name = "HITS_PER_S")]
    pub rate_per_s: Option<f64>,
    /// Redis at ADDR (host:port) running scripts/redis/hit.lua instead of the fleet: the
    /// same hits as one EVALSHA each (needs the `redis-bench` feature).
    #[arg(long = "redis", value_name = "ADDR", conflicts_with_all = ["settle", "node_scope"])]
    pub redis_addr: Option<String>,
    /// With --redis: K connections shared by all callers, each pipelining its callers'
    /// concurrent requests (redis-rs `MultiplexedConnection`), instead of one per caller.
    #[arg(long, value_name = "K", requires = "redis_addr")]
    pub shared_connections: Option<usize>,
    /// With --redis: the script to SCRIPT LOAD.
    #[arg(long, default_value = "scripts/redis/hit.lua")]
    pub redis_script: PathBuf,
}

impl BenchPlan {
    /// What the summary calls the path the hits take.
    fn target_name(&self) -> String {
        match (&self.redis_addr, self.shared_connections) {
            (Some(_), Some(k)) => format!("redis-shared-{k}"),
            (Some(_), None) => "redis".to_owned(),
            (None, _) if self.client => "fleet-client".to_owned(),
            (None, _) if self.stream => "fleet-stream".to_owned(),
            (None, _) => "fleet".to_owned(),
        }
    }

    /// Where caller `index` sends its hits.
    fn addr_of(&self, index: usize) -> &str {
        match &self.redis_addr {
            Some(addr) => addr,
            None => &self.api_addrs[index % self.api_addrs.len()],
        }
    }
}

/// The JSON summary printed at the end.
#[derive(Debug, Default, Serialize)]
pub struct BenchSummary {
    /// fleet, fleet-stream, fleet-client, redis or redis-shared-K.
    pub target: String,
    pub callers: usize,
    pub nodes: usize,
    /// The open loop's rate asked for; absent for a closed loop.
    pub rate_per_s: Option<f64>,
    pub duration_s: f64,
    pub hits: u64,
    pub hits_per_s: f64,
    pub settles: u64,
    pub allowed: u64,
    pub not_allowed: u64,
    pub decided_local: u64,
    pub errors: u64,
    /// The first hit without an answer, and why: what the errors were.
    pub first_error: Option<String>,
    /// Latency: from when the hit was sent (closed loop) or due (open loop) to its answer.
    pub p50_us: u64,
    pub p90_us: u64,
    pub p99_us: u64,
    pub p999_us: u64,
    pub max_us: u64,
    /// Open loop: hits that started more than `LATE_START` after they were due (their
    /// caller was still waiting on an earlier hit, or the bench itself lagged), and the
    /// delay from due to sent.
    pub late_starts: u64,
    pub start_delay_p99_us: u64,
    pub start_delay_max_us: u64,
    /// When the slowest hit started (seconds into the run) and where it went: a stall at
    /// the start (connections, first streams) reads differently from one mid-run.
    pub slowest_at_s: f64,
    pub slowest_node: String,
}

/// An open-loop hit that starts later than this after it was due is counted late: tokio's
/// timer wakes a sleeper up to 1 ms after its deadline, so a lag within that is the timer's.
const LATE_START: Duration = Duration::from_millis(2);

/// One caller's results.
struct CallerResult {
    latencies: Histogram<u64>,
    start_delays: Histogram<u64>,
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
    first_error: std::sync::OnceLock<String>,
    late_starts: AtomicU64,
}

fn histogram() -> Histogram<u64> {
    // 1 µs .. 60 s at 3 significant digits; the bounds are constants, so this cannot fail.
    Histogram::new_with_bounds(1, 60_000_000, 3).unwrap_or_else(|_| unreachable!("constant bounds"))
}

fn micros_at_least_1(duration: Duration) -> u64 {
    u64::try_from(duration.as_micros())
        .unwrap_or(u64::MAX)
        .max(1)
}

/// Which hit of the run this is: caller `caller`'s `seq`-th, the run's `global_seq`-th.
#[derive(Clone, Copy, Debug)]
struct HitId {
    caller: usize,
    seq: u64,
    global_seq: u64,
}

/// The names one hit uses, the same for the fleet and for Redis: tenants go round-robin
/// over the run's hits (with `--tenants` at least `--hits`, every hit has a bucket of its
/// own), and the claim's key is unique to the caller, the hit and this process.
struct HitNames {
    tenant: String,
    claim_key: String,
    hook_id: String,
}

impl HitId {
    /// The `n`th hit made before the clock starts (to open a connection or a stream); its
    /// caller is no measured caller's.
    fn warm_up(n: u64) -> Self {
        Self {
            caller: usize::MAX,
            seq: n,
            global_seq: 0,
        }
    }
}

impl HitNames {
    fn new(plan: &BenchPlan, id: HitId) -> Self {
        // Warm-ups charge a tenant of their own: the measured hits' buckets start untouched.
        let tenant = if id.caller == usize::MAX {
            "bench-warm-up".to_owned()
        } else {
            format!("tenant-{}", id.global_seq % plan.tenants.max(1))
        };
        Self {
            tenant,
            claim_key: format!("{}-{}-{}", id.caller, id.seq, std::process::id()),
            hook_id: format!("hook-{}-{}", id.caller, id.seq),
        }
    }
}

/// What the target answered to one hit.
#[derive(Clone, Copy, Debug)]
struct Answer {
    allowed: bool,
    /// The node decided alone although the fleet was asked.
    decided_local: bool,
    /// A settle was sent after the hit and succeeded.
    settled: bool,
}

/// One caller's way to its target.
enum Sender {
    Fleet(fleet::FleetSender),
    #[cfg(feature = "redis-bench")]
    Redis(redis::RedisSender),
}

impl Sender {
    /// `Err` is a hit without an answer (counted, not fatal); the caller goes on.
    async fn hit(&mut self, plan: &BenchPlan, id: HitId) -> anyhow::Result<Answer> {
        match self {
            Self::Fleet(sender) => sender.hit(plan, id).await,
            #[cfg(feature = "redis-bench")]
            Self::Redis(sender) => sender.hit(plan, id).await,
        }
    }
}

/// When caller `index` sends its hits: at once after the last answer (closed loop), or
/// at fixed intervals of its share of `--rate`, the callers' schedules staggered evenly.
struct Schedule {
    next_due: Option<Instant>,
    interval: Duration,
}

impl Schedule {
    fn new(plan: &BenchPlan, index: usize, started: Instant) -> Self {
        let Some(rate_per_s) = plan.rate_per_s else {
            return Self {
                next_due: None,
                interval: Duration::ZERO,
            };
        };
        let interval = Duration::from_secs_f64(plan.callers as f64 / rate_per_s);
        let offset = interval.mul_f64(index as f64 / plan.callers as f64);
        Self {
            next_due: Some(started + offset),
            interval,
        }
    }

    /// Waits until the next hit is due and returns when that was.
    async fn next(&mut self) -> Instant {
        let Some(due) = self.next_due else {
            return Instant::now();
        };
        self.next_due = Some(due + self.interval);
        tokio::time::sleep_until(due.into()).await;
        due
    }
}

async fn caller(
    plan: Arc<BenchPlan>,
    index: usize,
    mut sender: Sender,
    counters: Arc<Counters>,
    run_started: Instant,
    until: Instant,
) -> CallerResult {
    let mut result = CallerResult {
        latencies: histogram(),
        start_delays: histogram(),
        slowest_us: 0,
        slowest_at: Duration::ZERO,
    };
    let mut schedule = Schedule::new(&plan, index, run_started);
    let mut seq = 0u64;
    loop {
        let due = schedule.next().await;
        if due >= until {
            break;
        }
        let global_seq = counters.sent.fetch_add(1, Ordering::Relaxed);
        if plan.hits_max > 0 && global_seq >= plan.hits_max {
            break;
        }
        seq += 1;
        let start_delay = due.elapsed();
        if plan.rate_per_s.is_some() {
            let _ = result.start_delays.record(micros_at_least_1(start_delay));
            if start_delay > LATE_START {
                counters.late_starts.fetch_add(1, Ordering::Relaxed);
            }
        }
        let id = HitId {
            caller: index,
            seq,
            global_seq,
        };
        let answer = sender.hit(&plan, id).await;
        let took_us = micros_at_least_1(due.elapsed());
        let _ = result.latencies.record(took_us);
        if took_us > result.slowest_us {
            (result.slowest_us, result.slowest_at) = (took_us, due - run_started);
        }
        counters.hits.fetch_add(1, Ordering::Relaxed);
        count(&counters, answer);
    }
    result
}

fn count(counters: &Counters, answer: anyhow::Result<Answer>) {
    let answer = match answer {
        Ok(answer) => answer,
        Err(error) => {
            counters.errors.fetch_add(1, Ordering::Relaxed);
            let _ = counters.first_error.set(format!("{error:#}"));
            return;
        }
    };
    let counter = if answer.allowed {
        &counters.allowed
    } else {
        &counters.not_allowed
    };
    counter.fetch_add(1, Ordering::Relaxed);
    if answer.decided_local {
        counters.decided_local.fetch_add(1, Ordering::Relaxed);
    }
    if answer.settled {
        counters.settles.fetch_add(1, Ordering::Relaxed);
    }
}

/// One sender per caller, connected before the clock starts.
async fn senders(plan: &BenchPlan) -> anyhow::Result<Vec<Sender>> {
    if let Some(addr) = &plan.redis_addr {
        #[cfg(feature = "redis-bench")]
        {
            let senders = redis::senders(plan, addr).await?;
            return Ok(senders.into_iter().map(Sender::Redis).collect());
        }
        #[cfg(not(feature = "redis-bench"))]
        anyhow::bail!("--redis {addr}: this binary was built without the redis-bench feature");
    }
    let senders = fleet::senders(plan).await?;
    Ok(senders.into_iter().map(Sender::Fleet).collect())
}

/// Runs the plan and returns the summary.
///
/// # Errors
/// A target that cannot be reached at the start, or a plan that cannot run.
pub async fn run(plan: BenchPlan) -> anyhow::Result<BenchSummary> {
    anyhow::ensure!(plan.callers > 0, "--callers must be at least 1");
    anyhow::ensure!(!plan.api_addrs.is_empty(), "--addrs names no node");
    if let Some(rate_per_s) = plan.rate_per_s {
        anyhow::ensure!(
            rate_per_s.is_finite() && rate_per_s > 0.0,
            "--rate must be a positive number of hits per second"
        );
    }
    let senders = senders(&plan).await?;
    let plan = Arc::new(plan);
    let counters = Arc::new(Counters::default());
    let started = Instant::now();
    let until = started + Duration::from_secs(plan.duration_s);
    let tasks: Vec<_> = senders
        .into_iter()
        .enumerate()
        .map(|(i, sender)| {
            let counters = counters.clone();
            tokio::spawn(caller(plan.clone(), i, sender, counters, started, until))
        })
        .collect();
    let progress = tokio::spawn(progress(counters.clone(), started, until));
    let mut latencies = histogram();
    let mut start_delays = histogram();
    let (mut slowest_us, mut slowest_at_s, mut slowest_node) = (0, 0.0, String::new());
    for (i, task) in tasks.into_iter().enumerate() {
        let result = task.await?;
        latencies.add(&result.latencies)?;
        start_delays.add(&result.start_delays)?;
        if result.slowest_us > slowest_us {
            slowest_us = result.slowest_us;
            slowest_at_s = result.slowest_at.as_secs_f64();
            slowest_node = plan.addr_of(i).to_owned();
        }
    }
    progress.abort();
    eprintln!();
    let elapsed_s = started.elapsed().as_secs_f64();
    let hits = counters.hits.load(Ordering::Relaxed);
    Ok(BenchSummary {
        target: plan.target_name(),
        callers: plan.callers,
        nodes: if plan.redis_addr.is_some() {
            1
        } else {
            plan.api_addrs.len()
        },
        rate_per_s: plan.rate_per_s,
        duration_s: elapsed_s,
        hits,
        hits_per_s: hits as f64 / elapsed_s,
        settles: counters.settles.load(Ordering::Relaxed),
        allowed: counters.allowed.load(Ordering::Relaxed),
        not_allowed: counters.not_allowed.load(Ordering::Relaxed),
        decided_local: counters.decided_local.load(Ordering::Relaxed),
        errors: counters.errors.load(Ordering::Relaxed),
        first_error: counters.first_error.get().cloned(),
        p50_us: latencies.value_at_quantile(0.50),
        p90_us: latencies.value_at_quantile(0.90),
        p99_us: latencies.value_at_quantile(0.99),
        p999_us: latencies.value_at_quantile(0.999),
        max_us: latencies.max(),
        late_starts: counters.late_starts.load(Ordering::Relaxed),
        start_delay_p99_us: start_delays.value_at_quantile(0.99),
        start_delay_max_us: start_delays.max(),
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
            "\r{:>5.1}s  {:>8} hits  {:>8} hits/s  {} errors  {} late   ",
            started.elapsed().as_secs_f64(),
            hits,
            hits - last_hits,
            counters.errors.load(Ordering::Relaxed),
            counters.late_starts.load(Ordering::Relaxed),
        );
        last_hits = hits;
    }
}
