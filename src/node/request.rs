//! A validated request as the node sees it: domain types plus scope and deadline.
//! Built only by `api::validate`, so holding one means the input rules (contract §9)
//! already passed.

use std::time::Duration;

use crate::state::{Charge, ClaimKey, ClaimRequest, HookId, SettleOutcome, TenantId};

/// Where a request's charges or claim are decided (contract §8).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    /// Through the Raft log (the default).
    Fleet,
    /// Node-local buckets and the node's own claim index; never touches Raft.
    Node,
}

/// contract §5.
#[derive(Clone, Debug)]
pub struct HitInput {
    pub charges: Vec<Charge>,
    pub claim: Option<ClaimRequest>,
    pub timeout: Duration,
    pub rate_limit_scope: Scope,
    pub dedupe_scope: Scope,
}

/// contract §6; `ttl_ms` already resolved to the node default when the request had 0.
#[derive(Clone, Debug)]
pub struct SettleInput {
    pub key: ClaimKey,
    pub hook_id: HookId,
    pub outcome: SettleOutcome,
    pub ttl_ms: u64,
    pub timeout: Duration,
    pub scope: Scope,
}

/// contract §10.
#[derive(Clone, Debug)]
pub struct ResetInput {
    pub tenant: TenantId,
    pub timeout: Duration,
}

/// contract §11, already turned into one GCRA charge on an entity bucket.
#[derive(Clone, Debug)]
pub struct CheckRateInput {
    pub charge: Charge,
    pub timeout: Duration,
    pub scope: Scope,
}
