//! The input rules of contract §9: protobuf request → validated node input, or an
//! [`InvalidArgument`] naming the first bad field. Nothing is written before this passes.

use std::time::Duration;

use crate::contract::{
    CHARGES_MAX, ID_BYTES_MAX, KEY_BYTES_MAX, TIMEOUT_MS_MAX, TTL_MS_MAX, WINDOW_MS_MAX, YEAR_US,
};
use crate::node::request::{CheckRateInput, HitInput, ResetInput, Scope, SettleInput};
use crate::pb;
use crate::state::check::{self, Ceilings, InvalidField};
use crate::state::{
    BucketKey, Charge, ClaimKey, ClaimRequest, EntityId, HookId, Kind, SettleOutcome, SourceId,
    TenantId,
};

/// A request field broke an input rule.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {reason}")]
pub struct InvalidArgument {
    pub field: String,
    pub reason: String,
}

fn invalid(field: impl Into<String>, reason: impl Into<String>) -> InvalidArgument {
    InvalidArgument {
        field: field.into(),
        reason: reason.into(),
    }
}

/// Defaults a request may fall back on, and the node's ceilings it is held to.
#[derive(Clone, Copy, Debug)]
pub struct RequestDefaults {
    pub timeout: Duration,
    pub claim_ttl_ms: u64,
    /// `ttl_ms_max` and `capacity_us_max` (never above the contract's).
    pub ceilings: Ceilings,
}

impl From<InvalidField> for InvalidArgument {
    fn from(invalid: InvalidField) -> Self {
        InvalidArgument {
            field: invalid.field,
            reason: invalid.reason,
        }
    }
}

fn text(field: &str, value: &str, bytes_max: usize) -> Result<String, InvalidArgument> {
    check::text(field, value, bytes_max)?;
    Ok(value.to_owned())
}

/// `value`, moved rather than copied, when it is a valid id or key (`check::text`); the
/// field's name is built only for the error (a hit's fields: its hot path).
fn moved_text(
    field: impl FnOnce() -> String,
    value: String,
    bytes_max: usize,
) -> Result<String, InvalidArgument> {
    check::text("", &value, bytes_max).map_err(|e| invalid(field(), e.reason))?;
    Ok(value)
}

fn timeout(
    field: &str,
    timeout_ms: u32,
    defaults: RequestDefaults,
) -> Result<Duration, InvalidArgument> {
    match timeout_ms {
        0 => Ok(defaults.timeout),
        ms if ms <= TIMEOUT_MS_MAX => Ok(Duration::from_millis(u64::from(ms))),
        _ => Err(invalid(
            field,
            format!("must be between 1 and {TIMEOUT_MS_MAX} (0: node default)"),
        )),
    }
}

fn scope(field: &str, value: i32) -> Result<Scope, InvalidArgument> {
    match pb::Scope::try_from(value) {
        Ok(pb::Scope::Fleet) => Ok(Scope::Fleet),
        Ok(pb::Scope::Node) => Ok(Scope::Node),
        Err(_) => Err(invalid(field, format!("unknown scope {value}"))),
    }
}

fn ttl_ms(field: &str, value: u64, ceilings: &Ceilings) -> Result<u64, InvalidArgument> {
    if value == 0 || value > TTL_MS_MAX {
        return Err(invalid(
            field,
            format!("must be between 1 ms and {TTL_MS_MAX} ms (30 days)"),
        ));
    }
    check::ttl_ms(field, value, ceilings)?;
    Ok(value)
}

fn charge(i: usize, charge: pb::Charge, ceilings: &Ceilings) -> Result<Charge, InvalidArgument> {
    let field = |name: &str| format!("charges[{i}].{name}");
    let kind = match pb::Kind::try_from(charge.kind) {
        Ok(pb::Kind::Hooks) => Kind::Hooks,
        Ok(pb::Kind::Bytes) => Kind::Bytes,
        _ => return Err(invalid(field("kind"), "must be KIND_HOOKS or KIND_BYTES")),
    };
    let tenant = TenantId::from(moved_text(|| field("tenant"), charge.tenant, ID_BYTES_MAX)?);
    if charge.increment_us == 0 || charge.increment_us > YEAR_US {
        return Err(invalid(
            field("increment_us"),
            "must be between 1 and one year in microseconds",
        ));
    }
    if charge.capacity_us < charge.increment_us || charge.capacity_us > YEAR_US {
        return Err(invalid(
            field("capacity_us"),
            "must be at least increment_us and at most one year",
        ));
    }
    check::charge_terms(field, charge.increment_us, charge.capacity_us, ceilings)?;
    Ok(Charge {
        bucket: BucketKey::Tenant { kind, tenant },
        increment_us: charge.increment_us,
        capacity_us: charge.capacity_us,
    })
}

fn claim(claim: pb::Claim, ceilings: &Ceilings) -> Result<ClaimRequest, InvalidArgument> {
    let named = |name: &'static str| move || name.to_owned();
    Ok(ClaimRequest {
        key: ClaimKey {
            tenant: TenantId::from(moved_text(
                named("claim.tenant"),
                claim.tenant,
                ID_BYTES_MAX,
            )?),
            source_id: SourceId::from(moved_text(
                named("claim.source_id"),
                claim.source_id,
                ID_BYTES_MAX,
            )?),
            key: moved_text(named("claim.key"), claim.key, KEY_BYTES_MAX)?.into(),
        },
        hook_id: HookId::from(moved_text(
            named("claim.hook_id"),
            claim.hook_id,
            ID_BYTES_MAX,
        )?),
        ttl_ms: ttl_ms("claim.ttl_ms", claim.ttl_ms, ceilings)?,
        pending_ttl_ms: ttl_ms("claim.pending_ttl_ms", claim.pending_ttl_ms, ceilings)?,
    })
}

/// Validates a hit.
///
/// # Errors
/// The first field that breaks contract §9.
pub fn hit(
    request: pb::HitRequest,
    defaults: RequestDefaults,
) -> Result<HitInput, InvalidArgument> {
    if request.charges.len() > CHARGES_MAX {
        return Err(invalid(
            "charges",
            format!("{} charges, at most {CHARGES_MAX}", request.charges.len()),
        ));
    }
    let mut charges: Vec<Charge> = Vec::with_capacity(request.charges.len());
    for (i, pb_charge) in request.charges.into_iter().enumerate() {
        let charge = charge(i, pb_charge, &defaults.ceilings)?;
        // At most CHARGES_MAX: a scan, with no copy of the bucket's name.
        if charges.iter().any(|seen| seen.bucket == charge.bucket) {
            return Err(invalid(
                format!("charges[{i}]"),
                "a second charge for the same (kind, tenant)",
            ));
        }
        charges.push(charge);
    }
    Ok(HitInput {
        charges,
        claim: request
            .claim
            .map(|c| claim(c, &defaults.ceilings))
            .transpose()?,
        timeout: timeout("timeout_ms", request.timeout_ms, defaults)?,
        rate_limit_scope: scope("rate_limit_scope", request.rate_limit_scope)?,
        dedupe_scope: scope("dedupe_scope", request.dedupe_scope)?,
    })
}

/// Validates a settle, resolving `ttl_ms = 0` to the node default.
///
/// # Errors
/// The first field that breaks contract §9.
pub fn settle(
    request: &pb::SettleRequest,
    defaults: RequestDefaults,
) -> Result<SettleInput, InvalidArgument> {
    let key = ClaimKey {
        tenant: TenantId::from(text("tenant", &request.tenant, ID_BYTES_MAX)?),
        source_id: SourceId::from(text("source_id", &request.source_id, ID_BYTES_MAX)?),
        key: text("key", &request.key, KEY_BYTES_MAX)?.into(),
    };
    let hook_id = HookId::from(text("hook_id", &request.hook_id, ID_BYTES_MAX)?);
    let outcome = match pb::SettleOutcome::try_from(request.outcome) {
        Ok(pb::SettleOutcome::Commit) => SettleOutcome::Commit,
        Ok(pb::SettleOutcome::Release) => SettleOutcome::Release,
        _ => {
            return Err(invalid(
                "outcome",
                "must be SETTLE_OUTCOME_COMMIT or SETTLE_OUTCOME_RELEASE",
            ))
        }
    };
    let ttl_ms = match request.ttl_ms {
        0 => defaults.claim_ttl_ms,
        ms => ttl_ms("ttl_ms", ms, &defaults.ceilings)?,
    };
    Ok(SettleInput {
        key,
        hook_id,
        outcome,
        ttl_ms,
        timeout: timeout("timeout_ms", request.timeout_ms, defaults)?,
        scope: scope("dedupe_scope", request.dedupe_scope)?,
    })
}

/// Validates a reset.
///
/// # Errors
/// The first field that breaks contract §9.
pub fn reset(
    request: &pb::ResetRequest,
    defaults: RequestDefaults,
) -> Result<ResetInput, InvalidArgument> {
    Ok(ResetInput {
        tenant: TenantId::from(text("tenant", &request.tenant, ID_BYTES_MAX)?),
        timeout: timeout("timeout_ms", request.timeout_ms, defaults)?,
    })
}

/// Validates a check_rate and turns it into GCRA terms (contract §11):
/// `increment_us = ceil(window_ms * 1000 / limit)`, `capacity_us = window_ms * 1000`.
///
/// # Errors
/// The first field that breaks contract §9 or §11.
pub fn check_rate(
    request: &pb::CheckRateRequest,
    defaults: RequestDefaults,
) -> Result<CheckRateInput, InvalidArgument> {
    let entity_id = EntityId::from(text("entity_id", &request.entity_id, ID_BYTES_MAX)?);
    let operation = text("operation", &request.operation, ID_BYTES_MAX)?.into();
    if request.window_ms == 0 || request.window_ms > WINDOW_MS_MAX {
        return Err(invalid(
            "window_ms",
            format!("must be between 1 and {WINDOW_MS_MAX} (one year)"),
        ));
    }
    let capacity_us = request.window_ms * 1_000;
    let capacity_us_max = defaults.ceilings.capacity_us_max;
    if capacity_us > capacity_us_max {
        return Err(invalid(
            "window_ms",
            format!(
                "must be at most {} (capacity_us_max = {capacity_us_max} us)",
                capacity_us_max / 1_000
            ),
        ));
    }
    if request.limit == 0 {
        return Err(invalid("limit", "must be at least 1"));
    }
    if request.limit > capacity_us {
        return Err(invalid(
            "limit",
            "more than one request per microsecond of window_ms",
        ));
    }
    Ok(CheckRateInput {
        charge: Charge {
            bucket: BucketKey::Entity {
                entity_id,
                operation,
            },
            increment_us: capacity_us.div_ceil(request.limit),
            capacity_us,
        },
        timeout: timeout("timeout_ms", request.timeout_ms, defaults)?,
        scope: scope("scope", request.scope)?,
    })
}

#[cfg(test)]
mod tests {
    use prost::Message;

    use super::*;
    use crate::limits::API_MESSAGE_BYTES_MAX;

    #[test]
    fn the_api_limit_fits_the_largest_valid_request() {
        let id = "x".repeat(ID_BYTES_MAX);
        let charges = (0..CHARGES_MAX)
            .map(|n| pb::Charge {
                kind: pb::Kind::Bytes as i32,
                tenant: format!("{n:x<ID_BYTES_MAX$}"),
                increment_us: YEAR_US,
                capacity_us: YEAR_US,
            })
            .collect();
        let largest = pb::HitRequest {
            charges,
            claim: Some(pb::Claim {
                tenant: id.clone(),
                source_id: id.clone(),
                key: "k".repeat(KEY_BYTES_MAX),
                hook_id: id,
                ttl_ms: TTL_MS_MAX,
                pending_ttl_ms: TTL_MS_MAX,
            }),
            timeout_ms: crate::contract::TIMEOUT_MS_MAX,
            rate_limit_scope: pb::Scope::Fleet as i32,
            dedupe_scope: pb::Scope::Fleet as i32,
        };
        let defaults = RequestDefaults {
            timeout: std::time::Duration::from_secs(1),
            claim_ttl_ms: 1_000,
            ceilings: Ceilings::CONTRACT,
        };
        hit(largest.clone(), defaults).expect("the largest request is valid");
        let bytes = largest.encoded_len();
        // Room for it, and not much more: a limit far above the largest valid request would
        // only let an invalid one cost more to read before it is refused.
        assert!(bytes <= API_MESSAGE_BYTES_MAX, "{bytes} bytes");
        assert!(bytes * 4 > API_MESSAGE_BYTES_MAX, "{bytes} bytes");
    }

    /// Above the node's ceilings a request is invalid, and the message names the field and
    /// the config key.
    #[test]
    fn the_node_ceilings_are_input_rules_naming_field_and_key() {
        let defaults = RequestDefaults {
            timeout: std::time::Duration::from_secs(1),
            claim_ttl_ms: 1_000,
            ceilings: Ceilings {
                ttl_ms_max: 60_000,
                capacity_us_max: 10_000_000,
            },
        };
        let request = |capacity_us, ttl_ms| pb::HitRequest {
            charges: vec![pb::Charge {
                kind: pb::Kind::Hooks as i32,
                tenant: "t".into(),
                increment_us: 1_000,
                capacity_us,
            }],
            claim: Some(pb::Claim {
                tenant: "t".into(),
                source_id: "s".into(),
                key: "k".into(),
                hook_id: "h".into(),
                ttl_ms,
                pending_ttl_ms: 1_000,
            }),
            ..Default::default()
        };
        hit(request(10_000_000, 60_000), defaults).expect("at the ceilings");
        let capacity = hit(request(10_000_001, 60_000), defaults).expect_err("capacity");
        assert_eq!(capacity.field, "charges[0].capacity_us");
        assert!(capacity.reason.contains("capacity_us_max"), "{capacity}");
        let ttl = hit(request(10_000_000, 60_001), defaults).expect_err("ttl");
        assert_eq!(ttl.field, "claim.ttl_ms");
        assert!(ttl.reason.contains("ttl_ms_max"), "{ttl}");
        let window = pb::CheckRateRequest {
            entity_id: "e".into(),
            operation: "o".into(),
            limit: 1,
            window_ms: 10_001,
            ..Default::default()
        };
        let window = check_rate(&window, defaults).expect_err("window");
        assert_eq!(window.field, "window_ms");
        assert!(window.reason.contains("capacity_us_max"), "{window}");
    }
}
