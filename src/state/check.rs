//! The input rules of contract §9 over [`Command`] values, with a node's ceilings
//! ([`Ceilings`]: `ttl_ms_max`, `capacity_us_max`): what the leader re-checks of every
//! command a peer forwards (`Propose`) before it proposes it, so a command that never
//! passed `api::validate` is refused by field instead of committed.
//!
//! Pure: no IO, no clock. It checks values only; how many claims and buckets the state may
//! hold is the rules' business (`StateLimits`).

use std::collections::HashSet;

use super::model::{BucketKey, Charge, ClaimKey, ClaimRequest, Command, HookId, NodeId};
use crate::contract::{CHARGES_MAX, ID_BYTES_MAX, KEY_BYTES_MAX, TTL_MS_MAX, YEAR_US};
use crate::limits::COMMAND_BYTES_MAX;

/// A node's ceilings under the contract's maxima, from its config.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ceilings {
    /// Longest claim `ttl_ms` / `pending_ttl_ms` (at most 30 days).
    pub ttl_ms_max: u64,
    /// Longest `capacity_us` (at most one year); an increment is never above its capacity.
    pub capacity_us_max: u64,
}

impl Ceilings {
    /// The contract's own maxima.
    pub const CONTRACT: Ceilings = Ceilings {
        ttl_ms_max: TTL_MS_MAX,
        capacity_us_max: YEAR_US,
    };
}

/// A command field that breaks an input rule; `field` is its path inside the command
/// (`charges[0].tenant`, `claim.ttl_ms`, `key.source_id`...).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {reason}")]
pub struct InvalidField {
    pub field: String,
    pub reason: String,
}

fn invalid(field: impl Into<String>, reason: impl Into<String>) -> InvalidField {
    InvalidField {
        field: field.into(),
        reason: reason.into(),
    }
}

/// A non-empty text of at most `bytes_max` bytes.
///
/// # Errors
/// When it is empty or longer.
pub fn text(field: &str, value: &str, bytes_max: usize) -> Result<(), InvalidField> {
    if value.is_empty() {
        return Err(invalid(field, "must not be empty"));
    }
    if value.len() > bytes_max {
        return Err(invalid(
            field,
            format!("is {} bytes, at most {bytes_max}", value.len()),
        ));
    }
    Ok(())
}

/// A claim lifetime: between 1 ms and the node's `ttl_ms_max`.
///
/// # Errors
/// When it is 0 or above the ceiling (the error names the key).
pub fn ttl_ms(field: &str, value: u64, ceilings: &Ceilings) -> Result<(), InvalidField> {
    if value == 0 || value > ceilings.ttl_ms_max {
        return Err(invalid(
            field,
            format!(
                "must be between 1 ms and {} ms (ttl_ms_max; the contract allows {TTL_MS_MAX})",
                ceilings.ttl_ms_max
            ),
        ));
    }
    Ok(())
}

/// A charge's terms: `1 <= increment_us <= capacity_us <= capacity_us_max`.
///
/// # Errors
/// The first term out of range (the error names the key).
pub fn charge_terms(
    field: impl Fn(&str) -> String,
    increment_us: u64,
    capacity_us: u64,
    ceilings: &Ceilings,
) -> Result<(), InvalidField> {
    let capacity_us_max = ceilings.capacity_us_max;
    if increment_us == 0 || increment_us > capacity_us_max {
        return Err(invalid(
            field("increment_us"),
            format!("must be between 1 and {capacity_us_max} (capacity_us_max)"),
        ));
    }
    if capacity_us < increment_us || capacity_us > capacity_us_max {
        return Err(invalid(
            field("capacity_us"),
            format!(
                "must be at least increment_us and at most {capacity_us_max} (capacity_us_max)"
            ),
        ));
    }
    Ok(())
}

fn bucket(field: &dyn Fn(&str) -> String, bucket: &BucketKey) -> Result<(), InvalidField> {
    match bucket {
        BucketKey::Tenant { tenant, .. } => text(&field("tenant"), tenant.as_str(), ID_BYTES_MAX),
        BucketKey::Entity {
            entity_id,
            operation,
        } => {
            text(&field("entity_id"), entity_id.as_str(), ID_BYTES_MAX)?;
            text(&field("operation"), operation, ID_BYTES_MAX)
        }
        BucketKey::Envoy { domain, descriptor } => {
            text(&field("domain"), domain, KEY_BYTES_MAX)?;
            text(&field("descriptor"), descriptor, COMMAND_BYTES_MAX)
        }
    }
}

fn charges(list: &[Charge], ceilings: &Ceilings) -> Result<(), InvalidField> {
    if list.len() > CHARGES_MAX {
        return Err(invalid(
            "charges",
            format!("{} charges, at most {CHARGES_MAX}", list.len()),
        ));
    }
    let mut seen = HashSet::new();
    for (i, charge) in list.iter().enumerate() {
        let field = |name: &str| format!("charges[{i}].{name}");
        bucket(&field, &charge.bucket)?;
        charge_terms(field, charge.increment_us, charge.capacity_us, ceilings)?;
        if !seen.insert(&charge.bucket) {
            return Err(invalid(
                format!("charges[{i}]"),
                "a second charge for the same bucket",
            ));
        }
    }
    Ok(())
}

fn claim_key(prefix: &str, key: &ClaimKey) -> Result<(), InvalidField> {
    text(
        &format!("{prefix}tenant"),
        key.tenant.as_str(),
        ID_BYTES_MAX,
    )?;
    text(
        &format!("{prefix}source_id"),
        key.source_id.as_str(),
        ID_BYTES_MAX,
    )?;
    text(&format!("{prefix}key"), &key.key, KEY_BYTES_MAX)
}

fn hook_id(field: &str, hook_id: &HookId) -> Result<(), InvalidField> {
    text(field, hook_id.as_str(), ID_BYTES_MAX)
}

fn claim(claim: &ClaimRequest, ceilings: &Ceilings) -> Result<(), InvalidField> {
    claim_key("claim.", &claim.key)?;
    hook_id("claim.hook_id", &claim.hook_id)?;
    ttl_ms("claim.ttl_ms", claim.ttl_ms, ceilings)?;
    ttl_ms("claim.pending_ttl_ms", claim.pending_ttl_ms, ceilings)
}

/// The node a command speaks for: the `node` a hit, a settle, a reconciled commit or an
/// absorb round names; `None` for the commands that name none.
pub fn named_node(command: &Command) -> Option<NodeId> {
    match command {
        Command::Hit { node, .. }
        | Command::Settle { node, .. }
        | Command::ReconcileCommit { node, .. }
        | Command::AbsorbRound { node, .. } => Some(*node),
        Command::ProbeCharges { .. } | Command::Absorb { .. } | Command::Reset { .. } => None,
    }
}

/// Checks that a command a node forwarded speaks for that node only: the `node` a hit, a
/// settle, a reconciled commit or an absorb round names (whose node-scope claim, whose
/// round) must be `sender`'s, or one node could move another's rounds and claims.
///
/// # Errors
/// `node`, when it names another node.
pub fn sent_by(command: &Command, sender: NodeId) -> Result<(), InvalidField> {
    let Some(named) = named_node(command) else {
        return Ok(());
    };
    if named == sender {
        return Ok(());
    }
    Err(invalid(
        "node",
        format!("names node {named}, but node {sender} sent it"),
    ))
}

/// Checks one command against contract §9 and `ceilings`.
///
/// # Errors
/// The first field that breaks them, by its path inside the command.
pub fn command(command: &Command, ceilings: &Ceilings) -> Result<(), InvalidField> {
    match command {
        Command::Hit {
            charges: list,
            claim: request,
            ..
        } => {
            charges(list, ceilings)?;
            request.as_ref().map_or(Ok(()), |c| claim(c, ceilings))
        }
        Command::ProbeCharges { charges: list }
        | Command::Absorb { charges: list }
        | Command::AbsorbRound { charges: list, .. } => charges(list, ceilings),
        Command::Settle {
            key,
            hook_id: id,
            ttl_ms: ttl,
            ..
        }
        | Command::ReconcileCommit {
            key,
            hook_id: id,
            ttl_ms: ttl,
            ..
        } => {
            claim_key("key.", key)?;
            hook_id("hook_id", id)?;
            ttl_ms("ttl_ms", *ttl, ceilings)
        }
        Command::Reset { tenant } => text("tenant", tenant.as_str(), ID_BYTES_MAX),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::{Kind, SettleOutcome};

    const CEILINGS: Ceilings = Ceilings {
        ttl_ms_max: 60_000,
        capacity_us_max: 1_000_000,
    };

    fn hit(tenant: &str, increment_us: u64, capacity_us: u64) -> Command {
        Command::Hit {
            charges: vec![Charge {
                bucket: BucketKey::Tenant {
                    kind: Kind::Hooks,
                    tenant: tenant.into(),
                },
                increment_us,
                capacity_us,
            }],
            claim: None,
            node: 1,
        }
    }

    fn field_of(result: Result<(), InvalidField>) -> String {
        result.expect_err("refused").field
    }

    /// The forged Propose that was once committed: a 300-byte tenant with a 2^62 µs charge.
    #[test]
    fn the_forged_hit_is_refused_by_field() {
        let forged = hit(&"t".repeat(300), 1 << 62, 1 << 62);
        assert_eq!(field_of(command(&forged, &CEILINGS)), "charges[0].tenant");
        let huge = hit("t", 1 << 62, 1 << 62);
        let refused = command(&huge, &CEILINGS).expect_err("refused");
        assert_eq!(refused.field, "charges[0].increment_us");
        assert!(refused.reason.contains("capacity_us_max"), "{refused}");
        command(&hit("t", 1_000, 1_000_000), &CEILINGS).expect("valid");
    }

    #[test]
    fn the_ceilings_bound_capacity_and_ttl() {
        assert_eq!(
            field_of(command(&hit("t", 1_000, 1_000_001), &CEILINGS)),
            "charges[0].capacity_us"
        );
        assert_eq!(
            field_of(command(&hit("t", 2_000, 1_000), &CEILINGS)),
            "charges[0].capacity_us",
            "below its increment"
        );
        let settle = |ttl_ms| Command::Settle {
            key: ClaimKey {
                tenant: "t".into(),
                source_id: "s".into(),
                key: "k".into(),
            },
            hook_id: "h".into(),
            outcome: SettleOutcome::Commit,
            ttl_ms,
            node: 1,
        };
        command(&settle(60_000), &CEILINGS).expect("at the ceiling");
        let refused = command(&settle(60_001), &CEILINGS).expect_err("above it");
        assert_eq!(refused.field, "ttl_ms");
        assert!(refused.reason.contains("ttl_ms_max"), "{refused}");
        assert_eq!(field_of(command(&settle(0), &CEILINGS)), "ttl_ms");
    }

    #[test]
    fn ids_keys_and_charge_counts_are_checked() {
        let mut claimed = hit("t", 1, 1);
        if let Command::Hit { claim, .. } = &mut claimed {
            *claim = Some(ClaimRequest {
                key: ClaimKey {
                    tenant: "t".into(),
                    source_id: "s".into(),
                    key: "k".repeat(KEY_BYTES_MAX + 1).into(),
                },
                hook_id: "h".into(),
                ttl_ms: 1_000,
                pending_ttl_ms: 1_000,
            });
        }
        assert_eq!(field_of(command(&claimed, &CEILINGS)), "claim.key");
        let Command::Hit { charges: one, .. } = hit("t", 1, 1) else {
            unreachable!("a hit")
        };
        let twice = Command::ProbeCharges {
            charges: [one.clone(), one].concat(),
        };
        assert_eq!(field_of(command(&twice, &CEILINGS)), "charges[1]");
        let reset = Command::Reset { tenant: "".into() };
        assert_eq!(field_of(command(&reset, &CEILINGS)), "tenant");
    }
}
