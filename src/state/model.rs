//! The vocabulary of the replicated state: ids, commands (what goes in a log entry) and
//! answers (what applying one yields). Plain data: no IO, no clock.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::EncodedCommand;

/// Microseconds in a millisecond.
pub const US_PER_MS: u64 = 1_000;

/// A Raft node id (also the `node` recorded on a claim).
pub type NodeId = u64;

macro_rules! string_id {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        /// (A `Box<str>`, not a `String`: 16 bytes instead of 24 in every stored key and
        /// record, with the same encoding.)
        #[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        pub struct $name(pub Box<str>);

        impl $name {
            /// The id as text.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl From<&str> for $name {
            fn from(value: &str) -> Self {
                Self(value.into())
            }
        }

        impl From<String> for $name {
            fn from(value: String) -> Self {
                Self(value.into_boxed_str())
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(&self.0)
            }
        }
    };
}

string_id!(
    /// The sender a budget belongs to (one customer of the edge).
    TenantId
);
string_id!(
    /// The webhook provider (or endpoint) an event came from.
    SourceId
);
string_id!(
    /// The edge's id for one stored hook; a claim is held by exactly one.
    HookId
);
string_id!(
    /// check_rate's entity (a user, an API key, an IP address...).
    EntityId
);

/// What a hit's charge counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Kind {
    Hooks,
    Bytes,
}

/// A GCRA bucket's name. Hit's buckets, check_rate's and Envoy's live in separate
/// variants, so they can never share a name (contract §11).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum BucketKey {
    Tenant {
        kind: Kind,
        tenant: TenantId,
    },
    Entity {
        entity_id: EntityId,
        operation: Box<str>,
    },
    /// An Envoy rate limit descriptor (`envoy`): its domain and its entries, each key and
    /// value prefixed by its length (`3:key5:value...`), so no two descriptors share one.
    Envoy {
        domain: Box<str>,
        descriptor: Box<str>,
    },
}

/// Who a bucket counts against for `tenant_buckets_max`: a tenant's, an entity's (its
/// operations) or an Envoy domain's (its descriptors).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BucketOwner<'a> {
    Tenant(&'a TenantId),
    Entity(&'a EntityId),
    Domain(&'a str),
}

impl BucketKey {
    /// The owner this bucket counts against.
    pub fn owner(&self) -> BucketOwner<'_> {
        match self {
            BucketKey::Tenant { tenant, .. } => BucketOwner::Tenant(tenant),
            BucketKey::Entity { entity_id, .. } => BucketOwner::Entity(entity_id),
            BucketKey::Envoy { domain, .. } => BucketOwner::Domain(domain),
        }
    }
}

/// One GCRA charge (contract §4), already validated.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Charge {
    pub bucket: BucketKey,
    pub increment_us: u64,
    pub capacity_us: u64,
}

/// Where a claim lives: one provider event of one tenant.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ClaimKey {
    pub tenant: TenantId,
    pub source_id: SourceId,
    pub key: Box<str>,
}

/// A hit's request to claim a key for a hook (contract §5, step 3).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClaimRequest {
    pub key: ClaimKey,
    pub hook_id: HookId,
    /// How long the claim lives once committed.
    pub ttl_ms: u64,
    /// How long it stays pending before it expires on its own.
    pub pending_ttl_ms: u64,
}

/// The two phases of a claim.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ClaimState {
    Pending,
    Committed,
}

/// A stored claim (contract §2).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ClaimRecord {
    pub hook_id: HookId,
    pub node: NodeId,
    pub state: ClaimState,
    pub expires_at_us: u64,
    /// The committed lifetime, kept from the claim for the commit that comes later.
    pub ttl_ms: u64,
}

/// The second phase of a claim.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum SettleOutcome {
    Commit,
    Release,
}

/// One decision the state machine makes. A log entry carries a batch of these.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Command {
    /// contract §5 (and check_rate, which is a hit with one entity charge).
    Hit {
        charges: Vec<Charge>,
        claim: Option<ClaimRequest>,
        node: NodeId,
    },
    /// Evaluate charges without spending them: `Allowed` or `RateLimited`, nothing written.
    /// Used when a fleet-scoped charge meets a node-scoped claim that is already taken.
    ProbeCharges { charges: Vec<Charge> },
    /// contract §6. `ttl_ms` is already resolved (never 0).
    Settle {
        key: ClaimKey,
        hook_id: HookId,
        outcome: SettleOutcome,
        ttl_ms: u64,
        node: NodeId,
    },
    /// contract §10: forget the tenant's hooks and bytes buckets.
    Reset { tenant: TenantId },
    /// A commit the node queued while cut off, applied by reconciliation (contract §7).
    /// Like a settle commit, except that it wins over a claim held *pending* for another
    /// hook, whichever node took it: this commit means the hook is stored, so losing it
    /// would let a redelivery of a stored hook through, while the other hook's later commit
    /// answers `conflict` (delivered twice at worst, never lost).
    ReconcileCommit {
        key: ClaimKey,
        hook_id: HookId,
        ttl_ms: u64,
        node: NodeId,
    },
    /// Account for charges a node granted on its own while cut off (contract §7): each
    /// bucket is charged without the capacity check, but never past `now + capacity_us`,
    /// so a node's local grants spend the fleet budget without locking it for longer than
    /// one burst window.
    Absorb { charges: Vec<Charge> },
    /// [`Command::Absorb`] as round `round` of `node`'s (what nodes propose; a log may
    /// still hold the plain form from before). Applied only when `round` is above the
    /// last round of `node`'s the fleet absorbed, so a round proposed again after an
    /// answer that never came (it may have committed all the same) is absorbed once.
    AbsorbRound {
        node: NodeId,
        round: u64,
        charges: Vec<Charge>,
    },
}

/// The answer to a hit (and to check_rate).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum HitAnswer {
    Allowed,
    Duplicate { hook_id: HookId },
    Pending { retry_after_ms: u64 },
    RateLimited { retry_after_ms: u64 },
}

/// The answer to a settle.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum SettleAnswer {
    Settled,
    Recreated,
    Conflict {
        holder: HookId,
    },
    /// Never produced by the rules: the node queued the settle on its disk because the
    /// fleet did not take it in time (contract §6); it is retried until applied.
    Queued,
}

/// What applying one command yields; always in the same position as its command.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Answer {
    Hit(HitAnswer),
    Settle(SettleAnswer),
    Reset,
    Absorbed,
    /// The command was not applied and nothing was written for it.
    Refused(Refusal),
}

/// Why the fleet refused one command (the others of its entry or batch go on).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum Refusal {
    /// The leader's re-check of a forwarded command (contract §9 and the node's ceilings):
    /// `field` names the command by its position in the batch, e.g.
    /// `commands[2].charges[0].tenant`.
    #[error("invalid argument: {field}: {reason}")]
    Invalid { field: String, reason: String },
    /// Applying it would create a claim or a bucket beyond a limit the leader stamped.
    #[error("resource exhausted: {limit}")]
    Exhausted { limit: StateLimit },
}

/// The state limits by their config key names (`claims_max`, ...).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum StateLimit {
    ClaimsMax,
    BucketsMax,
    TenantClaimsMax,
    TenantBucketsMax,
}

impl StateLimit {
    /// The config key that sets it.
    pub fn key(self) -> &'static str {
        match self {
            StateLimit::ClaimsMax => "claims_max",
            StateLimit::BucketsMax => "buckets_max",
            StateLimit::TenantClaimsMax => "tenant_claims_max",
            StateLimit::TenantBucketsMax => "tenant_buckets_max",
        }
    }
}

impl std::fmt::Display for StateLimit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.key())
    }
}

/// How many claims and buckets the state may hold, stamped by the leader into every entry
/// (like `now_us`), so every replica refuses exactly the commands the leader's limits
/// refused, and a replay never holds more than the run that wrote the log.
///
/// A bucket's owner (for `tenant_buckets_max`) is its tenant, check_rate's entity_id, or an
/// Envoy bucket's domain.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StateLimits {
    /// Live claims, fleet-wide.
    pub claims_max: u64,
    /// Live buckets, fleet-wide.
    pub buckets_max: u64,
    /// Live claims of one tenant.
    pub tenant_claims_max: u64,
    /// Live buckets of one owner.
    pub tenant_buckets_max: u64,
}

impl StateLimits {
    /// No limit: what entries written before limits were stamped apply with.
    pub const UNLIMITED: StateLimits = StateLimits {
        claims_max: u64::MAX,
        buckets_max: u64::MAX,
        tenant_claims_max: u64::MAX,
        tenant_buckets_max: u64::MAX,
    };
}

/// A log entry's application payload: commands stamped with the proposing leader's clock.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FleetRequest {
    /// Microseconds since the Unix epoch, read by the leader when it proposed the entry.
    pub now_us: u64,
    /// The leader's state limits when it proposed the entry (see [`StateLimits`]).
    pub limits: StateLimits,
    /// Each command as the bytes the node that built it encoded (see [`EncodedCommand`]):
    /// the entry, the WAL and `AppendEntries` copy them and never encode a command again.
    /// Shared, not owned: openraft and the log's tail clone entries (for the tail, for each
    /// follower's AppendEntries), and a shared slice makes those clones a count bump. It
    /// encodes exactly as a `Vec` would.
    pub commands: Arc<[EncodedCommand]>,
}

/// One answer per command of the entry (empty for blank and membership entries).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FleetResponse {
    pub answers: Vec<Answer>,
}
