//! The input limits of the contract (docs/contract.md §9), in one place: `api::validate`
//! checks requests against them and `config` checks the node's defaults against them.

/// Longest tenant, source_id, hook_id, entity_id and operation, in bytes.
pub const ID_BYTES_MAX: usize = 256;
/// Longest claim key, in bytes.
pub const KEY_BYTES_MAX: usize = 1024;
/// Most charges in one hit.
pub const CHARGES_MAX: usize = 16;
/// Longest increment or capacity: one year (365 days).
pub const YEAR_US: u64 = 365 * 86_400 * 1_000_000;
/// Longest claim ttl: 30 days.
pub const TTL_MS_MAX: u64 = 30 * 86_400 * 1_000;
/// Longest check_rate window: one year.
pub const WINDOW_MS_MAX: u64 = 365 * 86_400 * 1_000;
/// The longest call deadline the API accepts (contract §9).
pub const TIMEOUT_MS_MAX: u32 = 60_000;
