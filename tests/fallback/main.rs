//! Local fallback faults (contract §7): a node cut off from the fleet (isolated by
//! transport fault rules, its peers killed, started alone, or behind a paused leader)
//! still answers every call within its deadline, decided `local`; what it decided alone
//! (claims, queued settles, charges) reaches the fleet once a leader is reachable, also
//! across a kill -9 of that node.
//!
//! Every hit with a claim goes through a [`History`](history::History): no `duplicate` may
//! ever be answered for a key whose commit was not acknowledged before the hit was sent (a
//! duplicate is a 2xx to the provider; a 2xx for a hook nobody stored is a lost webhook).
//! Keys are unique per hit, except keys deliberately hit again after their commit, so the
//! check can fail.

#[path = "../common/mod.rs"]
mod common;

mod admission;
mod alone;
mod clock;
mod history;
mod paused;
mod reconcile;
mod support;

use std::time::Duration;

use ankusa_fleet::pb;
use common::*;

pub(crate) const FAULTS: &str = "fault_injection = true";
/// What a local answer may take beyond its timeout_ms, seen from the test process (gRPC both
/// ways, a journal append, a flush for a queued settle) on a loaded 2-core debug build
/// (two tests at once, other builds running).
pub(crate) const LOCAL_MARGIN_MS: u64 = 500;
/// The hook id the probes use: another hook than the stored one, so a lost claim shows.
pub(crate) const PROBE_HOOK: &str = "hook-probe";

// ---- requests ----

/// A charge these tests never exhaust (a burst of 3.6 million, fair share included), so
/// local grants reach the charge ledger without ever denying.
fn roomy_charge(tenant: &str) -> pb::Charge {
    hooks(tenant, 1_000, 3_600_000_000)
}

pub(crate) fn claim_hit(tenant: &str, key: &str, hook_id: &str, timeout_ms: u32) -> pb::HitRequest {
    pb::HitRequest {
        timeout_ms,
        ..hit(
            vec![roomy_charge(tenant)],
            Some(claim(tenant, key, hook_id)),
        )
    }
}

pub(crate) fn commit(tenant: &str, key: &str, timeout_ms: u32) -> pb::SettleRequest {
    pb::SettleRequest {
        timeout_ms,
        ..settle(tenant, key, &hook_of(key), pb::SettleOutcome::Commit)
    }
}

pub(crate) fn decided(response_decided_by: i32) -> &'static str {
    match pb::DecidedBy::try_from(response_decided_by) {
        Ok(pb::DecidedBy::Fleet) => "fleet",
        Ok(pb::DecidedBy::Local) => "local",
        _ => "unspecified",
    }
}

/// The bound on a call answered at its deadline.
pub(crate) fn within_deadline(elapsed: Duration, timeout_ms: u32) -> bool {
    elapsed <= Duration::from_millis(u64::from(timeout_ms) + LOCAL_MARGIN_MS)
}
