//! Envoy's rate limit service (`envoy.service.ratelimit.v3.RateLimitService`) on `api_addr`,
//! so Envoy and Istio gateways can use the fleet directly.
//!
//! Each request descriptor finds its limit in the limits file ([`limits_file`]). One with a rate
//! is a GCRA bucket of its own (`BucketKey::Envoy`: the domain and every entry, never
//! shared with hit's or check_rate's), charged through the fleet like a check_rate: one
//! unit's capacity, an increment of `unit / requests_per_unit` per hit, `hits_addend` hits
//! at once. When the fleet misses the deadline the node decides alone, as for a hit. A
//! descriptor that matches nothing, or an unlimited one, is `OK`; the overall code is
//! `OVER_LIMIT` if any descriptor is, shadow-mode ones aside.

pub mod limits_file;

use std::sync::Arc;
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    rate_limit, Code, DescriptorStatus, RateLimit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitService;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::Duration as ProtoDuration;
use tonic::{Request, Response, Status};

use crate::api::drain::{DrainGate, Draining};
use crate::api::validate::InvalidArgument;
use crate::contract::{CHARGES_MAX, ID_BYTES_MAX, KEY_BYTES_MAX};
use crate::node::request::{CheckRateInput, Scope};
use crate::node::{DecidedBy, Node, NodeError};
use crate::state::{BucketKey, Charge, HitAnswer};
use limits_file::{Limit, Limits, Unit};

/// Entries one descriptor may have.
const ENTRIES_MAX: usize = 16;

/// The service, on one node.
pub struct EnvoyService {
    node: Arc<Node>,
    limits: Arc<Limits>,
    /// The deadline when the caller sends none (Envoy does: its filter's `timeout`).
    timeout_default: Duration,
    gate: DrainGate,
}

impl EnvoyService {
    pub fn new(
        node: Arc<Node>,
        limits: Arc<Limits>,
        timeout_default: Duration,
        gate: DrainGate,
    ) -> Self {
        Self {
            node,
            limits,
            timeout_default,
            gate,
        }
    }
}

/// What `ShouldRateLimit` refuses (its codes are in `api::status`).
#[derive(Debug, thiserror::Error)]
pub enum EnvoyError {
    #[error(transparent)]
    Draining(#[from] Draining),
    /// A request field that breaks an input rule, named by its path.
    #[error(transparent)]
    Invalid(#[from] InvalidArgument),
    /// The fleet's or the node's error for a descriptor (the ones before it stay charged).
    #[error(transparent)]
    Node(#[from] NodeError),
}

fn invalid(field: String, why: &str) -> EnvoyError {
    EnvoyError::Invalid(InvalidArgument {
        field,
        reason: why.to_owned(),
    })
}

/// A descriptor's entries, checked against the input limits (contract §9's sizes).
fn entries(i: usize, descriptor: &RateLimitDescriptor) -> Result<Vec<(&str, &str)>, EnvoyError> {
    if descriptor.is_negative_hits {
        // A refund of budget: GCRA buckets in the log only ever charge.
        return Err(invalid(
            format!("descriptors[{i}].is_negative_hits"),
            "not supported",
        ));
    }
    if descriptor.entries.is_empty() {
        return Err(invalid(
            format!("descriptors[{i}].entries"),
            "must not be empty",
        ));
    }
    if descriptor.entries.len() > ENTRIES_MAX {
        return Err(invalid(
            format!("descriptors[{i}].entries"),
            &format!("at most {ENTRIES_MAX}"),
        ));
    }
    descriptor
        .entries
        .iter()
        .enumerate()
        .map(|(j, entry)| {
            if entry.key.is_empty() || entry.key.len() > ID_BYTES_MAX {
                return Err(invalid(
                    format!("descriptors[{i}].entries[{j}].key"),
                    &format!("must be 1 to {ID_BYTES_MAX} bytes"),
                ));
            }
            if entry.value.len() > KEY_BYTES_MAX {
                return Err(invalid(
                    format!("descriptors[{i}].entries[{j}].value"),
                    &format!("at most {KEY_BYTES_MAX} bytes"),
                ));
            }
            Ok((entry.key.as_str(), entry.value.as_str()))
        })
        .collect()
}

/// The bucket of one descriptor: the domain and every entry, each length-prefixed.
fn bucket(domain: &str, entries: &[(&str, &str)]) -> BucketKey {
    let descriptor: String = entries
        .iter()
        .map(|(key, value)| format!("{}:{key}{}:{value}", key.len(), value.len()))
        .collect();
    BucketKey::Envoy {
        domain: domain.into(),
        descriptor: descriptor.into(),
    }
}

fn proto_unit(unit: Unit) -> rate_limit::Unit {
    match unit {
        Unit::Second => rate_limit::Unit::Second,
        Unit::Minute => rate_limit::Unit::Minute,
        Unit::Hour => rate_limit::Unit::Hour,
        Unit::Day => rate_limit::Unit::Day,
    }
}

fn proto_duration(us: u64) -> ProtoDuration {
    ProtoDuration {
        seconds: i64::try_from(us / 1_000_000).unwrap_or(i64::MAX),
        nanos: i32::try_from(us % 1_000_000 * 1_000).unwrap_or(0),
    }
}

/// The deadline a gRPC caller sent (`grpc-timeout`: digits and a unit, H M S m u n).
fn grpc_timeout(request: &Request<RateLimitRequest>) -> Option<Duration> {
    let text = request.metadata().get("grpc-timeout")?.to_str().ok()?;
    let (digits, unit) = text.split_at(text.len().checked_sub(1)?);
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n.saturating_mul(3_600)),
        "M" => Duration::from_secs(n.saturating_mul(60)),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

/// One descriptor's answer, and who decided it (`None`: no bucket was charged).
struct Decided {
    status: DescriptorStatus,
    by: Option<&'static str>,
    /// Over its limit, shadow mode or not.
    over: bool,
}

/// A descriptor asking more hits at once than its bucket ever holds: over its limit,
/// with nothing charged.
fn never_allowed(current_limit: Option<RateLimit>, shadow: bool) -> Decided {
    Decided {
        status: DescriptorStatus {
            code: if shadow { Code::Ok } else { Code::OverLimit } as i32,
            current_limit,
            ..Default::default()
        },
        by: None,
        over: true,
    }
}

impl EnvoyService {
    async fn decide(
        &self,
        domain: &str,
        entries: &[(&str, &str)],
        hits: u64,
        timeout: Duration,
    ) -> Result<Decided, EnvoyError> {
        let ok = |current_limit| Decided {
            status: DescriptorStatus {
                code: Code::Ok as i32,
                current_limit,
                ..Default::default()
            },
            by: None,
            over: false,
        };
        let (unit, requests_per_unit, name, shadow) = match self.limits.limit(domain, entries) {
            None => return Ok(ok(None)),
            Some(Limit::Unlimited) => {
                let mut unlimited = ok(None);
                unlimited.status.limit_remaining = u32::MAX;
                return Ok(unlimited);
            }
            Some(Limit::Rate {
                unit,
                requests_per_unit,
                name,
                shadow,
            }) => (unit, requests_per_unit, name, shadow),
        };
        let current_limit = Some(RateLimit {
            name: name.clone(),
            requests_per_unit: *requests_per_unit,
            unit: proto_unit(*unit) as i32,
        });
        let capacity_us = unit.us();
        let per_hit_us = (capacity_us / u64::from(*requests_per_unit)).max(1);
        let bucket = bucket(domain, entries);
        // More hits at once than the bucket ever holds can never be allowed.
        let increment_us = match per_hit_us.checked_mul(hits) {
            Some(increment_us) if increment_us <= capacity_us => increment_us,
            _ => return Ok(never_allowed(current_limit, *shadow)),
        };
        let input = CheckRateInput {
            charge: Charge {
                bucket: bucket.clone(),
                increment_us,
                capacity_us,
            },
            timeout,
            scope: Scope::Fleet,
        };
        let decided = self.node.check_rate(input).await?;
        Ok(self.charged(
            decided,
            &bucket,
            (capacity_us, per_hit_us),
            current_limit,
            *shadow,
        ))
    }

    /// The descriptor's status once the fleet (or this node) decided its charge: over or
    /// not, and what is left, read off this node's replica.
    fn charged(
        &self,
        decided: crate::node::Decided<HitAnswer>,
        bucket: &BucketKey,
        (capacity_us, per_hit_us): (u64, u64),
        current_limit: Option<RateLimit>,
        shadow: bool,
    ) -> Decided {
        let by = match decided.decided_by {
            DecidedBy::Fleet => "fleet",
            DecidedBy::Local { .. } => "local",
        };
        // What is left, read off this node's replica: its TAT ahead of the clock. A
        // follower's replica may not have applied the charge yet, so a refusal says 0 left
        // and at least its own retry hint until the reset.
        let mut ahead_us = self.node.bucket_ahead_us(bucket);
        let over = match decided.answer {
            HitAnswer::RateLimited { retry_after_ms } => {
                ahead_us = ahead_us.max(retry_after_ms.saturating_mul(1_000));
                true
            }
            _ => false,
        };
        let remaining = if over {
            0
        } else {
            capacity_us.saturating_sub(ahead_us) / per_hit_us
        };
        let code = if over && !shadow {
            Code::OverLimit
        } else {
            Code::Ok
        };
        Decided {
            status: DescriptorStatus {
                code: code as i32,
                current_limit,
                limit_remaining: u32::try_from(remaining).unwrap_or(u32::MAX),
                duration_until_reset: Some(proto_duration(ahead_us)),
                quota: None,
            },
            by: Some(by),
            over,
        }
    }
}

/// One descriptor's entries, as (key, value) pairs, and the hits it asks for.
type Asked<'a> = (Vec<(&'a str, &'a str)>, u64);

/// The request's descriptors, checked (contract §9's limits, as `Fleet` applies them), as
/// the entries each one walks the limits file with and the hits it asks for.
fn asked(request: &RateLimitRequest) -> Result<Vec<Asked<'_>>, EnvoyError> {
    if request.domain.is_empty() || request.domain.len() > ID_BYTES_MAX {
        return Err(invalid(
            "domain".to_owned(),
            &format!("must be 1 to {ID_BYTES_MAX} bytes"),
        ));
    }
    if request.descriptors.is_empty() {
        return Err(invalid("descriptors".to_owned(), "must not be empty"));
    }
    if request.descriptors.len() > CHARGES_MAX {
        return Err(invalid(
            "descriptors".to_owned(),
            &format!("at most {CHARGES_MAX}"),
        ));
    }
    let mut asked = Vec::with_capacity(request.descriptors.len());
    for (i, descriptor) in request.descriptors.iter().enumerate() {
        // A descriptor's own hits_addend wins over the request's; 0 means 1.
        let hits = descriptor
            .hits_addend
            .map_or(u64::from(request.hits_addend), |addend| addend.value)
            .max(1);
        asked.push((entries(i, descriptor)?, hits));
    }
    Ok(asked)
}

#[tonic::async_trait]
impl RateLimitService for EnvoyService {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        let started = Instant::now();
        let answer = self.answer(request).await.map_err(Status::from);
        let outcome = match &answer {
            Ok(response) if response.get_ref().overall_code == Code::OverLimit as i32 => {
                "over_limit"
            }
            Ok(_) => "ok",
            Err(status) => crate::api::error_label(status),
        };
        metrics::counter!("ankusa_envoy_requests_total", "outcome" => outcome).increment(1);
        crate::api::record_latency("should_rate_limit", started);
        answer
    }
}

impl EnvoyService {
    /// The answer to one request: every descriptor decided (those that were charged stay
    /// charged if a later one fails; the error then ends the call, as for a hit).
    async fn answer(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, EnvoyError> {
        let _call = self.gate.enter()?;
        // The caller's deadline covers the way back too: the answer leaves a tenth of it
        // early.
        let timeout = match grpc_timeout(&request) {
            Some(deadline) => {
                deadline.saturating_sub((deadline / 10).max(Duration::from_millis(1)))
            }
            None => self.timeout_default,
        }
        .min(self.timeout_default);
        let request = request.into_inner();
        let asked = asked(&request)?;
        let decisions = futures::future::join_all(
            asked
                .iter()
                .map(|(entries, hits)| self.decide(&request.domain, entries, *hits, timeout)),
        )
        .await;
        let mut statuses = Vec::with_capacity(decisions.len());
        let mut over_limit = false;
        for decided in decisions {
            let decided = decided?;
            let outcome = match (decided.over, decided.status.code == Code::OverLimit as i32) {
                (false, _) if decided.by.is_none() => "no_limit",
                (false, _) => "ok",
                (true, true) => "over_limit",
                (true, false) => "shadow_over_limit",
            };
            metrics::counter!(
                "ankusa_envoy_descriptors_total",
                "outcome" => outcome,
                "decided_by" => decided.by.unwrap_or("none")
            )
            .increment(1);
            over_limit |= decided.status.code == Code::OverLimit as i32;
            statuses.push(decided.status);
        }
        Ok(Response::new(RateLimitResponse {
            overall_code: if over_limit {
                Code::OverLimit
            } else {
                Code::Ok
            } as i32,
            statuses,
            ..Default::default()
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Buckets of different descriptors never share a name, however their entries split.
    #[test]
    fn descriptors_that_read_alike_get_different_buckets() {
        let a = bucket("d", &[("ab", "c")]);
        let b = bucket("d", &[("a", "bc")]);
        let c = bucket("d", &[("a", ""), ("b", "c")]);
        assert_ne!(a, b);
        assert_ne!(a, c);
        assert_ne!(b, c);
        assert_ne!(bucket("d", &[("k", "v")]), bucket("e", &[("k", "v")]));
    }

    #[test]
    fn a_grpc_timeout_reads_in_every_unit() {
        let with = |value: &str| {
            let mut request = Request::new(RateLimitRequest::default());
            request
                .metadata_mut()
                .insert("grpc-timeout", value.parse().expect("ascii"));
            grpc_timeout(&request)
        };
        assert_eq!(with("20m"), Some(Duration::from_millis(20)));
        assert_eq!(with("2S"), Some(Duration::from_secs(2)));
        assert_eq!(with("1H"), Some(Duration::from_secs(3_600)));
        assert_eq!(with("500u"), Some(Duration::from_micros(500)));
        assert_eq!(with("x"), None);
        assert_eq!(with("m"), None);
        assert_eq!(
            grpc_timeout(&Request::new(RateLimitRequest::default())),
            None
        );
    }
}
