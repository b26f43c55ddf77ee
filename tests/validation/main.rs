//! contract §9 from outside: every input rule of Hit, Settle, Reset and CheckRate is
//! INVALID_ARGUMENT with the field's name in the message, through every node, and writes
//! nothing; the boundary values themselves are valid.
//!
//! "Writes nothing" is checked two ways: no node's `last_applied` moves during the invalid
//! batch (and one valid hit afterwards moves the leader's by exactly one, so the check can
//! fail), and the tenant, key and entity used only by invalid requests are afterwards
//! wholly free.

#[path = "../common/mod.rs"]
mod common;

mod boundaries;
mod invalid;
mod not_utf8;
mod size_limit;

use ankusa_fleet::pb;
use ankusa_fleet::pb::fleet_client::FleetClient;
use common::*;
use tonic::transport::Channel;

pub(crate) type Client = FleetClient<Channel>;

const SECOND_US: u64 = 1_000_000;
pub(crate) const YEAR_US: u64 = 365 * 86_400 * SECOND_US;
pub(crate) const YEAR_MS: u64 = 365 * 86_400 * 1_000;
pub(crate) const THIRTY_DAYS_MS: u64 = 30 * 86_400 * 1_000;

/// Used only inside invalid requests: afterwards it must be as if never seen.
pub(crate) const GHOST: &str = "ghost";
pub(crate) const GHOST_KEY: &str = "ghost-evt";
pub(crate) const GHOST_HOOK: &str = "hook-ghost";
pub(crate) const GHOST_ENTITY: &str = "ghost-entity";
/// Three hits of budget, no refill within a test run.
pub(crate) const GHOST_INCREMENT_US: u64 = 60 * SECOND_US;
pub(crate) const GHOST_CAPACITY_US: u64 = 3 * GHOST_INCREMENT_US;

pub(crate) fn ghost_charge() -> pb::Charge {
    hooks(GHOST, GHOST_INCREMENT_US, GHOST_CAPACITY_US)
}

pub(crate) fn ghost_bytes() -> pb::Charge {
    bytes(GHOST, GHOST_INCREMENT_US, GHOST_CAPACITY_US)
}

/// A valid hit that would spend ghost budget and take the ghost claim.
pub(crate) fn ghost_hit() -> pb::HitRequest {
    hit(
        vec![ghost_charge()],
        Some(claim(GHOST, GHOST_KEY, GHOST_HOOK)),
    )
}

/// A valid settle that would re-create the ghost claim as committed.
pub(crate) fn ghost_settle() -> pb::SettleRequest {
    settle(GHOST, GHOST_KEY, GHOST_HOOK, pb::SettleOutcome::Commit)
}

pub(crate) fn ghost_check_rate() -> pb::CheckRateRequest {
    check_rate(GHOST_ENTITY, "send", 3, 60_000)
}

pub(crate) fn long(bytes: usize) -> String {
    "x".repeat(bytes)
}

/// `chars` two-byte characters: 128 of them is 256 bytes.
pub(crate) fn wide(chars: usize) -> String {
    "é".repeat(chars)
}
