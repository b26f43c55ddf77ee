//! The bench's way into Redis: each hit is one `EVALSHA` of scripts/redis/hit.lua (the
//! fleet's hit as one atomic script: one GCRA charge, one two-phase claim), with the keys
//! and arguments scripts/redis/bench_redis.py sends and the names the fleet bench uses.
//! Built only with the `redis-bench` feature, so the node's binary carries no Redis client.
//!
//! Each caller has a connection of its own (one request in flight on it), or with
//! `--shared-connections K` the callers share K connections, each pipelining the concurrent
//! requests of its callers (redis-rs `MultiplexedConnection`).

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use redis::aio::MultiplexedConnection;
use redis::Value;

use super::{Answer, BenchPlan, HitId, HitNames};

/// How long connecting to Redis may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// One caller's connection (its own, or a clone of a shared one) and the script's SHA1.
pub(super) struct RedisSender {
    connection: MultiplexedConnection,
    sha: Arc<str>,
}

/// One sender per caller, connected and with the script loaded.
pub(super) async fn senders(plan: &BenchPlan, addr: &str) -> anyhow::Result<Vec<RedisSender>> {
    let script = std::fs::read(&plan.redis_script)
        .with_context(|| format!("reading {}", plan.redis_script.display()))?;
    let client = redis::Client::open(format!("redis://{addr}/"))
        .with_context(|| format!("a Redis address: {addr}"))?;
    let connections_count = plan
        .shared_connections
        .unwrap_or(plan.callers)
        .clamp(1, plan.callers);
    let config = redis::AsyncConnectionConfig::new()
        .set_connection_timeout(CONNECT_TIMEOUT)
        .set_response_timeout(Duration::from_millis(u64::from(plan.timeout_ms)));
    let mut connections = Vec::with_capacity(connections_count);
    for _ in 0..connections_count {
        let connection = client
            .get_multiplexed_async_connection_with_config(&config)
            .await
            .with_context(|| format!("connecting to Redis at {addr}"))?;
        connections.push(connection);
    }
    let sha: String = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(script)
        .query_async(&mut connections[0])
        .await
        .with_context(|| format!("SCRIPT LOAD {}", plan.redis_script.display()))?;
    let sha: Arc<str> = sha.into();
    Ok((0..plan.callers)
        .map(|i| RedisSender {
            connection: connections[i % connections_count].clone(),
            sha: sha.clone(),
        })
        .collect())
}

impl RedisSender {
    /// `EVALSHA <sha> 2 <bucket> <claim> <increment_us> <capacity_us> <hook_id>
    /// <pending_ttl_ms>`; the reply's first element is the outcome (`allowed`,
    /// `rate_limited`, `duplicate` or `pending`).
    pub(super) async fn hit(&mut self, plan: &BenchPlan, id: HitId) -> anyhow::Result<Answer> {
        let names = HitNames::new(plan, id);
        let reply: Value = redis::cmd("EVALSHA")
            .arg(&*self.sha)
            .arg(2)
            .arg(format!("b:hooks:{}", names.tenant))
            .arg(format!("c:{}:bench:{}", names.tenant, names.claim_key))
            .arg(plan.increment_us)
            .arg(plan.capacity_us)
            .arg(names.hook_id)
            .arg(plan.pending_ttl_ms)
            .query_async(&mut self.connection)
            .await?;
        Ok(Answer {
            allowed: outcome(&reply) == Some(b"allowed".as_slice()),
            decided_local: false,
            settled: false,
        })
    }
}

/// The outcome word of hit.lua's reply.
fn outcome(reply: &Value) -> Option<&[u8]> {
    let Value::Array(items) = reply else {
        return None;
    };
    match items.first()? {
        Value::BulkString(word) => Some(word),
        Value::SimpleString(word) => Some(word.as_bytes()),
        _ => None,
    }
}
