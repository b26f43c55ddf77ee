//! The container of the replicated state: buckets and claims in shards, the clock the log
//! has reached, and the expiry queue that drops what the clock passed; plus the images a
//! snapshot is made of ([`StateImage`], [`LiveImage`]) and the frozen copy a snapshot is
//! encoded from ([`FleetState::freeze`]).
//!
//! No IO and no clock: time comes from the caller (the log entry's stamp).

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::hash::Hash;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::model::{BucketKey, ClaimKey, ClaimRecord, EntityId, NodeId, TenantId};
use super::shards::Sharded;
use expiry::ExpiryQueue;

mod expiry;

/// What one stored claim costs in memory, about: its key and record, its map slot, its
/// expiry entry and its share of the tenant counts, measured with typical ids
/// (`examples/state_bytes.rs`, docs/operations.md).
pub const CLAIM_BYTES_ESTIMATE: u64 = 430;
/// What one stored bucket costs in memory, about, measured the same way.
pub const BUCKET_BYTES_ESTIMATE: u64 = 290;

/// Most expiry entries taken before they are swept (see [`FleetState::advance_clock`]):
/// a log entry's claims share a deadline, ~60 of them under load.
const SWEEP_BATCH: usize = 256;

/// Something that expires on its own: a bucket once its TAT passes, a claim at `expires_at`.
#[derive(Clone, Debug)]
enum Expiring {
    // Shared with the map's key: one allocation per item, however often it is re-queued.
    Bucket(Arc<BucketKey>),
    Claim(Arc<ClaimKey>),
}

/// A stored value and the deadline of its one responsible entry in the expiry queue.
#[derive(Clone, Debug)]
struct Slot<V> {
    value: V,
    queued_us: u64,
}

/// The live state of buckets and claims, plus the clock the log has reached.
///
/// Expired entries are dropped as the clock passes them (see [`FleetState::advance_clock`]),
/// so memory follows live state, not history: each stored item has exactly one responsible
/// entry in the expiry queue (its `queued_us`), re-queued lazily when the item was extended.
#[derive(Clone, Debug, Default)]
pub struct FleetState {
    clock_us: u64,
    // Sharded: growing one never pauses apply for a rehash of everything (see `shards`).
    buckets: Sharded<Arc<BucketKey>, Slot<u64>>,
    claims: Sharded<Arc<ClaimKey>, Slot<ClaimRecord>>,
    /// (deadline, hash, item), soonest first ([`expiry`]). Entries whose deadline is not the
    /// item's `queued_us` are stale (the item was removed and re-inserted) and are dropped
    /// when taken.
    expiry: ExpiryQueue,
    /// The last absorb round applied per node (`Command::AbsorbRound`): one number per
    /// node that ever reconciled charges.
    absorbed: BTreeMap<NodeId, u64>,
    /// Stored claims per tenant and buckets per owner, for the tenant limits
    /// (`StateLimits`). Derived from the maps (never in a snapshot, rebuilt with them);
    /// an owner with nothing stored has no entry.
    owned: OwnedCounts,
}

/// Items stored per owner, hashed as the state's maps are: a hit with a claim looks its
/// tenant up twice (its room, then its count), and std's SipHash was 0.5 % of a node's
/// CPU (docs/benchmarks.md, round 19).
type Counts<K> = HashMap<K, u64, foldhash::fast::RandomState>;

/// How many items each tenant (claims) and each bucket owner (buckets) has stored.
#[derive(Clone, Debug, Default)]
struct OwnedCounts {
    claims_by_tenant: Counts<TenantId>,
    buckets_by_tenant: Counts<TenantId>,
    buckets_by_entity: Counts<EntityId>,
    buckets_by_domain: Counts<Box<str>>,
}

/// One more (`up`) or one fewer item for `owner`; an owner at zero is forgotten.
fn count<K: Hash + Eq + Clone + std::borrow::Borrow<Q>, Q: Hash + Eq + ?Sized>(
    map: &mut Counts<K>,
    owner: &Q,
    make: impl FnOnce() -> K,
    up: bool,
) {
    if up {
        match map.get_mut(owner) {
            Some(n) => *n += 1,
            None => {
                map.insert(make(), 1);
            }
        }
    } else if let Some(n) = map.get_mut(owner) {
        *n -= 1;
        if *n == 0 {
            map.remove(owner);
        }
    }
}

impl OwnedCounts {
    fn claim(&mut self, key: &ClaimKey, up: bool) {
        let tenant = &key.tenant;
        count(&mut self.claims_by_tenant, tenant, || tenant.clone(), up);
    }

    fn bucket(&mut self, bucket: &BucketKey, up: bool) {
        match bucket {
            BucketKey::Tenant { tenant, .. } => {
                count(&mut self.buckets_by_tenant, tenant, || tenant.clone(), up)
            }
            BucketKey::Entity { entity_id, .. } => count(
                &mut self.buckets_by_entity,
                entity_id,
                || entity_id.clone(),
                up,
            ),
            BucketKey::Envoy { domain, .. } => count(
                &mut self.buckets_by_domain,
                &**domain,
                || domain.clone(),
                up,
            ),
        }
    }

    fn buckets_of(&self, bucket: &BucketKey) -> u64 {
        let found = match bucket {
            BucketKey::Tenant { tenant, .. } => self.buckets_by_tenant.get(tenant),
            BucketKey::Entity { entity_id, .. } => self.buckets_by_entity.get(entity_id),
            BucketKey::Envoy { domain, .. } => self.buckets_by_domain.get(&**domain),
        };
        found.copied().unwrap_or(0)
    }
}

/// The serialisable content of a [`FleetState`]: live items only (what a snapshot holds).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StateImage {
    pub clock_us: u64,
    pub buckets: Vec<(BucketKey, u64)>,
    pub claims: Vec<(ClaimKey, ClaimRecord)>,
    /// The last absorb round applied per node, by node id.
    pub absorbed: Vec<(NodeId, u64)>,
}

/// Serialises exactly like [`StateImage`] (the same bytes), straight from a state's maps:
/// live items only, no intermediate copy. Snapshots use it, so building one costs the
/// encoded size in memory, not a second copy of the state.
pub struct LiveImage<'a>(pub &'a FleetState);

impl Serialize for LiveImage<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let mut image = serializer.serialize_struct("StateImage", 4)?;
        image.serialize_field("clock_us", &self.0.clock_us)?;
        image.serialize_field("buckets", &LiveBuckets(self.0))?;
        image.serialize_field("claims", &LiveClaims(self.0))?;
        let absorbed: Vec<(NodeId, u64)> = self.0.absorbed_rounds().collect();
        image.serialize_field("absorbed", &absorbed)?;
        image.end()
    }
}

struct LiveBuckets<'a>(&'a FleetState);

impl Serialize for LiveBuckets<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeSeq;
        let clock_us = self.0.clock_us;
        let live = || {
            self.0
                .buckets
                .iter()
                .filter(move |(_, slot)| slot.value > clock_us)
        };
        let mut seq = serializer.serialize_seq(Some(live().count()))?;
        for (bucket, slot) in live() {
            seq.serialize_element(&(&**bucket, slot.value))?;
        }
        seq.end()
    }
}

struct LiveClaims<'a>(&'a FleetState);

impl Serialize for LiveClaims<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeSeq;
        let mut seq = serializer.serialize_seq(Some(self.0.live_claims().count()))?;
        for claim in self.0.live_claims() {
            seq.serialize_element(&claim)?;
        }
        seq.end()
    }
}

impl FleetState {
    /// The time of the last applied entry, never decreasing.
    pub fn clock_us(&self) -> u64 {
        self.clock_us
    }

    /// A bucket's TAT, if it is live at the current clock.
    pub fn bucket_tat_us(&self, bucket: &BucketKey) -> Option<u64> {
        self.bucket_tat_us_hashed(self.bucket_hash(bucket), bucket)
    }

    /// `bucket`'s hash in the bucket map, for the `*_hashed` calls: a charge looks its
    /// bucket up and writes it back with one hash of its key.
    pub(super) fn bucket_hash(&self, bucket: &BucketKey) -> u64 {
        self.buckets.hash_of(bucket)
    }

    /// [`FleetState::bucket_tat_us`] with `hash` from [`FleetState::bucket_hash`].
    pub(super) fn bucket_tat_us_hashed(&self, hash: u64, bucket: &BucketKey) -> Option<u64> {
        self.buckets
            .get_hashed(hash, bucket)
            .map(|slot| slot.value)
            .filter(|tat_us| *tat_us > self.clock_us)
    }

    /// A claim, if it is live at the current clock.
    pub fn claim(&self, key: &ClaimKey) -> Option<&ClaimRecord> {
        self.claim_hashed(self.claim_hash(key), key)
    }

    /// `key`'s hash in this state's claims map (each map has its own seed: a hash from
    /// another state misses): a hit looks its claim up and then writes it
    /// ([`FleetState::claim_hashed`], [`FleetState::set_claim_hashed`]) with one hash of
    /// its three strings.
    pub(super) fn claim_hash(&self, key: &ClaimKey) -> u64 {
        self.claims.hash_of(key)
    }

    /// [`FleetState::claim`] with `hash` from [`FleetState::claim_hash`].
    pub(super) fn claim_hashed(&self, hash: u64, key: &ClaimKey) -> Option<&ClaimRecord> {
        self.claims
            .get_hashed(hash, key)
            .map(|slot| &slot.value)
            .filter(|record| record.expires_at_us > self.clock_us)
    }

    /// Every claim live at the current clock.
    pub fn live_claims(&self) -> impl Iterator<Item = (&ClaimKey, &ClaimRecord)> {
        let clock_us = self.clock_us;
        self.claims
            .iter()
            .filter(move |(_, slot)| slot.value.expires_at_us > clock_us)
            .map(|(key, slot)| (&**key, &slot.value))
    }

    /// The last absorb round of `node`'s the fleet applied (0: none).
    pub fn absorbed_round(&self, node: NodeId) -> u64 {
        self.absorbed.get(&node).copied().unwrap_or(0)
    }

    /// Records that `node`'s absorb round `round` was applied.
    pub fn set_absorbed_round(&mut self, node: NodeId, round: u64) {
        self.absorbed.insert(node, round);
    }

    /// Every node's last applied absorb round, by node id.
    pub fn absorbed_rounds(&self) -> impl Iterator<Item = (NodeId, u64)> + '_ {
        self.absorbed.iter().map(|(node, round)| (*node, *round))
    }

    /// A digest of the live state: its clock, every live bucket and claim, and the absorb
    /// rounds. Each item's hash is summed, so replicas that applied the same entries have
    /// the same digest whatever order their maps hold the items in. It reads every item. The hasher is
    /// std's with fixed keys: the same in every process of one build, not across builds.
    pub fn digest(&self) -> u64 {
        use std::hash::{DefaultHasher, Hash, Hasher};
        fn hash_of(item: impl Hash) -> u64 {
            let mut hasher = DefaultHasher::new();
            item.hash(&mut hasher);
            hasher.finish()
        }
        let clock_us = self.clock_us;
        let buckets = self
            .buckets
            .iter()
            .filter(|(_, slot)| slot.value > clock_us)
            .map(|(bucket, slot)| hash_of(("bucket", &**bucket, slot.value)));
        let claims = self.live_claims().map(|claim| hash_of(("claim", claim)));
        let absorbed = self
            .absorbed_rounds()
            .map(|round| hash_of(("absorbed", round)));
        buckets
            .chain(claims)
            .chain(absorbed)
            .fold(hash_of(("clock", clock_us)), u64::wrapping_add)
    }

    /// Number of stored buckets and claims (live or not yet swept).
    pub fn len(&self) -> (usize, usize) {
        (self.buckets.len(), self.claims.len())
    }

    /// The memory the stored items take, estimated from their counts
    /// ([`CLAIM_BYTES_ESTIMATE`], [`BUCKET_BYTES_ESTIMATE`]): long ids cost more.
    pub fn bytes_estimate(&self) -> u64 {
        let (buckets, claims) = self.len();
        claims as u64 * CLAIM_BYTES_ESTIMATE + buckets as u64 * BUCKET_BYTES_ESTIMATE
    }

    /// Claims stored for `tenant` (after [`FleetState::advance_clock`], the live ones).
    pub fn tenant_claims(&self, tenant: &TenantId) -> u64 {
        let claims = &self.owned.claims_by_tenant;
        claims.get(tenant).copied().unwrap_or(0)
    }

    /// Buckets stored for the owner of `bucket`: its tenant, entity_id or Envoy domain.
    pub fn owner_buckets(&self, bucket: &BucketKey) -> u64 {
        self.owned.buckets_of(bucket)
    }

    /// Owners holding at least one item: tenants with claims, and bucket owners.
    pub fn owners(&self) -> usize {
        let owned = &self.owned;
        owned.claims_by_tenant.len()
            + owned.buckets_by_tenant.len()
            + owned.buckets_by_entity.len()
            + owned.buckets_by_domain.len()
    }

    /// True when nothing is stored.
    pub fn is_empty(&self) -> bool {
        self.buckets.is_empty() && self.claims.is_empty()
    }

    /// Moves the clock to `max(clock, now_us)` and drops what expired; returns the new clock.
    ///
    /// Taking the maximum keeps time monotonic across leader changes even when a new
    /// leader's wall clock is behind the old one's.
    pub fn advance_clock(&mut self, now_us: u64) -> u64 {
        self.clock_us = self.clock_us.max(now_us);
        // What is due is taken a batch at a time, then swept: each sweep's lookup is a cache
        // miss or two in a large table, and lookups in a row, with no queue work between
        // them, overlap. (A sweep re-queues only at deadlines after the clock, never due in
        // this call.) Batches stay small, so a long jump of the clock costs no large buffer.
        let mut due_now = Vec::new();
        loop {
            while due_now.len() < SWEEP_BATCH {
                match self.expiry.pop_due(self.clock_us) {
                    Some(due) => due_now.push(due),
                    None => break,
                }
            }
            if due_now.is_empty() {
                break;
            }
            for due in due_now.drain(..) {
                self.sweep(due);
            }
        }
        self.clock_us
    }

    fn sweep(&mut self, due: Due) {
        let (clock_us, expiry) = (self.clock_us, &mut self.expiry);
        let Due {
            deadline_us,
            hash,
            item,
        } = due;
        match item {
            Expiring::Bucket(bucket) => {
                let deadline_of = |tat_us: &u64| *tat_us;
                let map = &mut self.buckets;
                let due = (deadline_us, hash, Arc::clone(&bucket));
                if sweep_one(map, expiry, due, clock_us, deadline_of, Expiring::Bucket) {
                    self.owned.bucket(&bucket, false);
                }
            }
            Expiring::Claim(key) => {
                let deadline_of = |record: &ClaimRecord| record.expires_at_us;
                let map = &mut self.claims;
                let due = (deadline_us, hash, Arc::clone(&key));
                if sweep_one(map, expiry, due, clock_us, deadline_of, Expiring::Claim) {
                    self.owned.claim(&key, false);
                }
            }
        }
    }

    /// Sets a bucket's TAT. A borrowed key is cloned only when the bucket is new: a charge
    /// of a bucket that exists (most of them) allocates nothing.
    pub(super) fn set_bucket(&mut self, bucket: Cow<'_, BucketKey>, tat_us: u64) {
        let hash = self.bucket_hash(&bucket);
        self.set_bucket_hashed(hash, bucket, tat_us);
    }

    /// [`FleetState::set_bucket`] with `hash` from [`FleetState::bucket_hash`].
    pub(super) fn set_bucket_hashed(&mut self, hash: u64, bucket: Cow<'_, BucketKey>, tat_us: u64) {
        let buckets = &mut self.buckets;
        if let Some(added) = store(
            buckets,
            &mut self.expiry,
            hash,
            bucket,
            tat_us,
            tat_us,
            Expiring::Bucket,
        ) {
            self.owned.bucket(&added, true);
        }
    }

    /// Sets a claim's record; a borrowed key is cloned only when the claim is new.
    pub(super) fn set_claim(&mut self, key: Cow<'_, ClaimKey>, record: ClaimRecord) {
        let hash = self.claim_hash(&key);
        self.set_claim_hashed(hash, key, record);
    }

    /// [`FleetState::set_claim`] with `hash` from [`FleetState::claim_hash`].
    pub(super) fn set_claim_hashed(
        &mut self,
        hash: u64,
        key: Cow<'_, ClaimKey>,
        record: ClaimRecord,
    ) {
        let expires_at_us = record.expires_at_us;
        if let Some(added) = store(
            &mut self.claims,
            &mut self.expiry,
            hash,
            key,
            record,
            expires_at_us,
            Expiring::Claim,
        ) {
            self.owned.claim(&added, true);
        }
    }

    /// Removes a claim (the local fallback forgets what the fleet now holds).
    pub fn remove_claim(&mut self, key: &ClaimKey) {
        if self.claims.remove(key) {
            self.owned.claim(key, false);
        }
    }

    /// Drops a bucket (a reset): its next charge starts from an empty bucket.
    pub(super) fn remove_bucket(&mut self, bucket: &BucketKey) {
        if self.buckets.remove(bucket) {
            self.owned.bucket(bucket, false);
        }
    }

    /// Sets a bucket's TAT directly (the local fallback seeds its buckets this way).
    pub fn seed_bucket(&mut self, bucket: BucketKey, tat_us: u64) {
        if tat_us > self.clock_us {
            self.set_bucket(Cow::Owned(bucket), tat_us);
        }
    }

    /// Gives `increment_us` back to a bucket (a node-scope charge whose hit did not
    /// happen): its TAT moves back, never behind the clock (a full bucket). Never used on
    /// the fleet's state: the log has no refund.
    pub fn refund_bucket(&mut self, bucket: &BucketKey, increment_us: u64) {
        if let Some(tat_us) = self.bucket_tat_us(bucket) {
            let refunded = tat_us.saturating_sub(increment_us).max(self.clock_us);
            self.set_bucket(Cow::Borrowed(bucket), refunded);
        }
    }

    /// A read-only copy of the state as it is now, for a snapshot: it shares the maps' shards
    /// (nothing is copied) and never changes; `self` keeps its changes in overlays while the
    /// copy lives, folded back in afterwards ([`FleetState::thaw_some`]). Encode the copy
    /// with [`LiveImage`] without holding any lock.
    pub fn freeze(&mut self) -> FleetState {
        FleetState {
            clock_us: self.clock_us,
            buckets: self.buckets.freeze(),
            claims: self.claims.freeze(),
            expiry: ExpiryQueue::default(),
            absorbed: self.absorbed.clone(),
            // Only encoded, never applied to: it needs no counts.
            owned: OwnedCounts::default(),
        }
    }

    /// Overlay items a node folds back into each map per applied batch of entries after a
    /// snapshot's encode (`ankusa-fleet bench-snapshot --changes` times the steps).
    pub const THAW_STEP_ITEMS: usize = 1_024;

    /// Folds what changed since [`FleetState::freeze`] back into the maps, up to `budget`
    /// items a map, once the frozen copy is dropped (before, nothing); true once it is
    /// done. Between steps the state answers and changes as usual, and a change folds its
    /// own key first, so the fold ends whatever the changes between steps.
    pub fn thaw_some(&mut self, budget: usize) -> bool {
        let buckets = self.buckets.thaw_some(budget);
        let claims = self.claims.thaw_some(budget);
        buckets && claims
    }

    /// Copies out the live items at the current clock.
    pub fn image(&self) -> StateImage {
        let clock_us = self.clock_us;
        StateImage {
            clock_us,
            buckets: self
                .buckets
                .iter()
                .filter(|(_, slot)| slot.value > clock_us)
                .map(|(k, slot)| (BucketKey::clone(k), slot.value))
                .collect(),
            claims: self
                .claims
                .iter()
                .filter(|(_, slot)| slot.value.expires_at_us > clock_us)
                .map(|(k, slot)| (ClaimKey::clone(k), slot.value.clone()))
                .collect(),
            absorbed: self.absorbed_rounds().collect(),
        }
    }

    /// Rebuilds a state from an image, replacing nothing else (the caller replaces `self`).
    pub fn from_image(image: StateImage) -> Self {
        let mut state = FleetState {
            clock_us: image.clock_us,
            ..FleetState::default()
        };
        for (bucket, tat_us) in image.buckets {
            state.set_bucket(Cow::Owned(bucket), tat_us);
        }
        for (key, record) in image.claims {
            state.set_claim(Cow::Owned(key), record);
        }
        state.absorbed = image.absorbed.into_iter().collect();
        state.advance_clock(image.clock_us);
        state
    }
}

/// An entry of the expiry queue: an item and its deadline.
///
/// It keeps the item's hash in its map: sweeping it then finds the item without hashing the
/// key again, and (the queue holding the map's own `Arc` of the key) without reading the
/// key's strings, which at a million claims are cache misses (docs/decisions/009).
#[derive(Clone, Debug)]
struct Due {
    deadline_us: u64,
    hash: u64,
    item: Expiring,
}

/// Stores `value` under `key` (whose hash in `map` is `hash`); queues an expiry entry only
/// for a new key or an earlier deadline (a later one is re-queued when the current entry
/// is taken, see [`sweep_one`]). A borrowed key is cloned only when it is new. Returns the
/// key when it is new.
fn store<K: Hash + Eq + Clone, V: Clone>(
    map: &mut Sharded<Arc<K>, Slot<V>>,
    expiry: &mut ExpiryQueue,
    hash: u64,
    key: Cow<'_, K>,
    value: V,
    deadline_us: u64,
    expiring: fn(Arc<K>) -> Expiring,
) -> Option<Arc<K>> {
    match map.get_key_value_mut_hashed(hash, &*key) {
        Some((stored, slot)) => {
            slot.value = value;
            if deadline_us < slot.queued_us {
                slot.queued_us = deadline_us;
                expiry.push(Due {
                    deadline_us,
                    hash,
                    item: expiring(Arc::clone(stored)),
                });
            }
            None
        }
        None => {
            let key = Arc::new(key.into_owned());
            expiry.push(Due {
                deadline_us,
                hash,
                item: expiring(Arc::clone(&key)),
            });
            let slot = Slot {
                value,
                queued_us: deadline_us,
            };
            map.insert_hashed(hash, Arc::clone(&key), slot);
            Some(key)
        }
    }
}

/// Handles one expiry entry taken from the queue, `(deadline, hash, key)`: drops the item
/// if it expired by `clock_us`, re-queues it at its current deadline if it was extended,
/// and ignores the entry if it is stale (the item is gone or another entry is responsible
/// for it).
/// Returns whether it dropped the item.
fn sweep_one<K: Hash + Eq, V: Clone>(
    map: &mut Sharded<Arc<K>, Slot<V>>,
    expiry: &mut ExpiryQueue,
    (deadline_us, hash, key): (u64, u64, Arc<K>),
    clock_us: u64,
    deadline_of: impl Fn(&V) -> u64,
    expiring: fn(Arc<K>) -> Expiring,
) -> bool {
    // Looked up as the `Arc` itself: `Arc`'s equality checks the pointer before the key.
    let Some(slot) = map.get_mut_hashed(hash, &key) else {
        return false;
    };
    if slot.queued_us != deadline_us {
        return false;
    }
    let current_us = deadline_of(&slot.value);
    if current_us <= clock_us {
        map.remove_hashed(hash, &key)
    } else {
        slot.queued_us = current_us;
        expiry.push(Due {
            deadline_us: current_us,
            hash,
            item: expiring(key),
        });
        false
    }
}

#[cfg(test)]
mod tests;
