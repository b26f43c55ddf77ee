//! The fleet's rules as pure functions over [`FleetState`]: GCRA (SPEC section 4), the
//! hit steps (section 5), settle (section 6), reset (section 10) and expiry.
//!
//! Nothing here does IO, reads a clock or awaits: `now_us` always comes from the log entry
//! (or, for node-local state, from the caller). Every replica that applies the same entries
//! reaches the same state and the same answers.

use std::collections::BinaryHeap;
use std::hash::Hash;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::model::{
    Answer, BucketKey, Charge, ClaimKey, ClaimRecord, ClaimRequest, ClaimState, Command, HitAnswer,
    HookId, Kind, NodeId, SettleAnswer, SettleOutcome, TenantId,
};
use super::shards::Sharded;

/// Microseconds in a millisecond.
const US_PER_MS: u64 = 1_000;
/// Most expiry entries popped before they are swept (see [`FleetState::advance_clock`]):
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
    /// Min-heap of (deadline, hash, item). Entries whose deadline is not the item's `queued_us`
    /// are stale (the item was removed and re-inserted) and are dropped when popped.
    expiry: ExpiryQueue,
}

/// The serialisable content of a [`FleetState`]: live items only (what a snapshot holds).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StateImage {
    pub clock_us: u64,
    pub buckets: Vec<(BucketKey, u64)>,
    pub claims: Vec<(ClaimKey, ClaimRecord)>,
}

/// Serialises exactly like [`StateImage`] (the same bytes), straight from a state's maps:
/// live items only, no intermediate copy. Snapshots use it, so building one costs the
/// encoded size in memory, not a second copy of the state.
pub struct LiveImage<'a>(pub &'a FleetState);

impl Serialize for LiveImage<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let mut image = serializer.serialize_struct("StateImage", 3)?;
        image.serialize_field("clock_us", &self.0.clock_us)?;
        image.serialize_field("buckets", &LiveBuckets(self.0))?;
        image.serialize_field("claims", &LiveClaims(self.0))?;
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
        self.buckets
            .get(bucket)
            .map(|slot| slot.value)
            .filter(|tat_us| *tat_us > self.clock_us)
    }

    /// A claim, if it is live at the current clock.
    pub fn claim(&self, key: &ClaimKey) -> Option<&ClaimRecord> {
        self.claims
            .get(key)
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

    /// Number of stored buckets and claims (live or not yet swept).
    pub fn len(&self) -> (usize, usize) {
        (self.buckets.len(), self.claims.len())
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
        // What is due is popped a batch at a time, then swept: each sweep's lookup is a cache
        // miss or two in a large table, and lookups in a row, with no heap work between
        // them, overlap. (A sweep re-queues only at deadlines after the clock, never due in
        // this call.) Batches stay small, so a long jump of the clock costs no large buffer.
        let mut due_now = Vec::new();
        loop {
            while let Some(due) = self.expiry.peek() {
                if due.deadline_us > self.clock_us || due_now.len() == SWEEP_BATCH {
                    break;
                }
                due_now.extend(self.expiry.pop());
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
                let due = (deadline_us, hash, bucket);
                sweep_one(map, expiry, due, clock_us, deadline_of, Expiring::Bucket);
            }
            Expiring::Claim(key) => {
                let deadline_of = |record: &ClaimRecord| record.expires_at_us;
                let map = &mut self.claims;
                let due = (deadline_us, hash, key);
                sweep_one(map, expiry, due, clock_us, deadline_of, Expiring::Claim);
            }
        }
    }

    fn set_bucket(&mut self, bucket: BucketKey, tat_us: u64) {
        store(
            &mut self.buckets,
            &mut self.expiry,
            bucket,
            tat_us,
            tat_us,
            Expiring::Bucket,
        );
    }

    fn set_claim(&mut self, key: ClaimKey, record: ClaimRecord) {
        let expires_at_us = record.expires_at_us;
        store(
            &mut self.claims,
            &mut self.expiry,
            key,
            record,
            expires_at_us,
            Expiring::Claim,
        );
    }

    /// Removes a claim (the local fallback forgets what the fleet now holds).
    pub fn remove_claim(&mut self, key: &ClaimKey) {
        self.claims.remove(key);
    }

    /// Sets a bucket's TAT directly (the local fallback seeds its buckets this way).
    pub fn seed_bucket(&mut self, bucket: BucketKey, tat_us: u64) {
        if tat_us > self.clock_us {
            self.set_bucket(bucket, tat_us);
        }
    }

    /// Gives `increment_us` back to a bucket (a node-scope charge whose hit did not
    /// happen): its TAT moves back, never behind the clock (a full bucket). Never used on
    /// the fleet's state: the log has no refund.
    pub fn refund_bucket(&mut self, bucket: &BucketKey, increment_us: u64) {
        if let Some(tat_us) = self.bucket_tat_us(bucket) {
            let refunded = tat_us.saturating_sub(increment_us).max(self.clock_us);
            self.set_bucket(bucket.clone(), refunded);
        }
    }

    /// A read-only copy of the state as it is now, for a snapshot: it shares the maps' shards
    /// (nothing is copied) and never changes; `self` keeps changing on top of it until
    /// [`FleetState::thaw`]. Encode the copy with [`LiveImage`] without holding any lock.
    pub fn freeze(&mut self) -> FleetState {
        FleetState {
            clock_us: self.clock_us,
            buckets: self.buckets.freeze(),
            claims: self.claims.freeze(),
            expiry: ExpiryQueue::default(),
        }
    }

    /// Folds what changed since [`FleetState::freeze`] back into the maps; call it once the
    /// frozen copy is dropped (before, it works too, but copies the maps).
    pub fn thaw(&mut self) {
        self.buckets.thaw();
        self.claims.thaw();
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
        }
    }

    /// Rebuilds a state from an image, replacing nothing else (the caller replaces `self`).
    pub fn from_image(image: StateImage) -> Self {
        let mut state = FleetState {
            clock_us: image.clock_us,
            ..FleetState::default()
        };
        for (bucket, tat_us) in image.buckets {
            state.set_bucket(bucket, tat_us);
        }
        for (key, record) in image.claims {
            state.set_claim(key, record);
        }
        state.advance_clock(image.clock_us);
        state
    }
}

type ExpiryQueue = BinaryHeap<Due>;

/// An entry of the expiry queue, ordered by its deadline alone, soonest first. Items due
/// in the same microsecond are common (a log entry's claims share one): compared as
/// `(deadline, item)` they were told apart key by key, string by string, at every step of
/// the heap (`perf`: ~2.5 % of the fleet's CPU). Their order changes nothing, since each
/// is swept on its own.
///
/// It keeps the item's hash in its map: sweeping it then finds the item without hashing the
/// key again, and (the queue holding the map's own `Arc` of the key) without reading the
/// key's strings, which at a million claims were cache misses (`perf`: the sweep was 11 %
/// of a steady fleet's CPU).
#[derive(Clone, Debug)]
struct Due {
    deadline_us: u64,
    hash: u64,
    item: Expiring,
}

impl PartialEq for Due {
    fn eq(&self, other: &Self) -> bool {
        self.deadline_us == other.deadline_us
    }
}

impl Eq for Due {}

impl PartialOrd for Due {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Due {
    /// Reversed: `BinaryHeap` pops the greatest, and the soonest deadline must come first.
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        other.deadline_us.cmp(&self.deadline_us)
    }
}

/// Stores `value` under `key`; queues an expiry entry only for a new key or an earlier
/// deadline (a later one is re-queued when the current entry pops, see [`sweep_one`]).
fn store<K: Hash + Eq, V: Clone>(
    map: &mut Sharded<Arc<K>, Slot<V>>,
    expiry: &mut ExpiryQueue,
    key: K,
    value: V,
    deadline_us: u64,
    expiring: fn(Arc<K>) -> Expiring,
) {
    let hash = map.hash_of(&key);
    match map.get_key_value_mut_hashed(hash, &key) {
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
        }
        None => {
            let key = Arc::new(key);
            expiry.push(Due {
                deadline_us,
                hash,
                item: expiring(Arc::clone(&key)),
            });
            let slot = Slot {
                value,
                queued_us: deadline_us,
            };
            map.insert_hashed(hash, key, slot);
        }
    }
}

/// Handles one popped expiry entry `(deadline, hash, key)`: drops the item if it expired
/// by `clock_us`, re-queues it at its current deadline if it was extended, and ignores the
/// entry if it is stale (the item is gone or another entry is responsible for it).
fn sweep_one<K: Hash + Eq, V: Clone>(
    map: &mut Sharded<Arc<K>, Slot<V>>,
    expiry: &mut ExpiryQueue,
    (deadline_us, hash, key): (u64, u64, Arc<K>),
    clock_us: u64,
    deadline_of: impl Fn(&V) -> u64,
    expiring: fn(Arc<K>) -> Expiring,
) {
    // Looked up as the `Arc` itself: `Arc`'s equality checks the pointer before the key.
    let Some(slot) = map.get_mut_hashed(hash, &key) else {
        return;
    };
    if slot.queued_us != deadline_us {
        return;
    }
    let current_us = deadline_of(&slot.value);
    if current_us <= clock_us {
        map.remove_hashed(hash, &key);
    } else {
        slot.queued_us = current_us;
        expiry.push(Due {
            deadline_us: current_us,
            hash,
            item: expiring(key),
        });
    }
}

/// Applies one command at `now_us` (already advanced with [`FleetState::advance_clock`]).
pub fn apply(state: &mut FleetState, command: &Command, now_us: u64) -> Answer {
    match command {
        Command::Hit {
            charges,
            claim,
            node,
        } => Answer::Hit(hit(state, charges, claim.as_ref(), *node, now_us)),
        Command::ProbeCharges { charges } => {
            Answer::Hit(match evaluate_charges(state, charges, now_us) {
                Ok(_) => HitAnswer::Allowed,
                Err(retry_after_ms) => HitAnswer::RateLimited { retry_after_ms },
            })
        }
        Command::Settle {
            key,
            hook_id,
            outcome: SettleOutcome::Commit,
            ttl_ms,
            node,
        } => Answer::Settle(commit(state, key, hook_id, *ttl_ms, *node, now_us)),
        Command::Settle {
            key,
            hook_id,
            outcome: SettleOutcome::Release,
            ..
        } => Answer::Settle(release(state, key, hook_id)),
        Command::Reset { tenant } => {
            reset(state, tenant);
            Answer::Reset
        }
        Command::Absorb { charges } => {
            absorb(state, charges, now_us);
            Answer::Absorbed
        }
        Command::ReconcileCommit {
            key,
            hook_id,
            ttl_ms,
            node,
        } => Answer::Settle(reconcile_commit(
            state, key, hook_id, *ttl_ms, *node, now_us,
        )),
    }
}

fn reconcile_commit(
    state: &mut FleetState,
    key: &ClaimKey,
    hook_id: &HookId,
    ttl_ms: u64,
    node: NodeId,
    now_us: u64,
) -> SettleAnswer {
    let own_late_pending = state.claim(key).is_some_and(|record| {
        record.state == ClaimState::Pending && record.node == node && record.hook_id != *hook_id
    });
    if own_late_pending {
        state.remove_claim(key);
    }
    commit(state, key, hook_id, ttl_ms, node, now_us)
}

fn absorb(state: &mut FleetState, charges: &[Charge], now_us: u64) {
    for charge in charges {
        let tat_us = state
            .bucket_tat_us(&charge.bucket)
            .unwrap_or(now_us)
            .max(now_us);
        let ceiling_us = now_us.saturating_add(charge.capacity_us);
        let new_tat_us = tat_us.saturating_add(charge.increment_us).min(ceiling_us);
        if new_tat_us > now_us {
            state.set_bucket(charge.bucket.clone(), new_tat_us);
        }
    }
}

/// Applies a whole entry: advances the clock once, then each command in order.
pub fn apply_batch(
    state: &mut FleetState,
    commands: &[Command],
    stamped_now_us: u64,
) -> Vec<Answer> {
    let now_us = state.advance_clock(stamped_now_us);
    commands
        .iter()
        .map(|command| apply(state, command, now_us))
        .collect()
}

/// GCRA for one charge against a TAT: `Ok(new_tat_us)` or `Err(retry_after_ms)`.
pub fn gcra(
    tat_us: Option<u64>,
    now_us: u64,
    increment_us: u64,
    capacity_us: u64,
) -> Result<u64, u64> {
    let new_tat_us = tat_us.unwrap_or(0).max(now_us).saturating_add(increment_us);
    let ahead_us = new_tat_us - now_us;
    if ahead_us <= capacity_us {
        Ok(new_tat_us)
    } else {
        Err(ceil_ms(ahead_us - capacity_us))
    }
}

/// Microseconds to whole milliseconds, rounded up, at least 1.
fn ceil_ms(duration_us: u64) -> u64 {
    duration_us.div_ceil(US_PER_MS).max(1)
}

/// Step 2 of a hit: every charge's new TAT, or the largest retry among the denied ones.
fn evaluate_charges(state: &FleetState, charges: &[Charge], now_us: u64) -> Result<Vec<u64>, u64> {
    let mut new_tats_us = Vec::with_capacity(charges.len());
    let mut retry_after_ms = None;
    for charge in charges {
        let tat_us = state.bucket_tat_us(&charge.bucket);
        match gcra(tat_us, now_us, charge.increment_us, charge.capacity_us) {
            Ok(new_tat_us) => new_tats_us.push(new_tat_us),
            Err(retry_ms) => retry_after_ms = Some(retry_after_ms.unwrap_or(0).max(retry_ms)),
        }
    }
    match retry_after_ms {
        Some(retry_ms) => Err(retry_ms),
        None => Ok(new_tats_us),
    }
}

fn hit(
    state: &mut FleetState,
    charges: &[Charge],
    claim: Option<&ClaimRequest>,
    node: NodeId,
    now_us: u64,
) -> HitAnswer {
    let new_tats_us = match evaluate_charges(state, charges, now_us) {
        Ok(new_tats_us) => new_tats_us,
        Err(retry_after_ms) => return HitAnswer::RateLimited { retry_after_ms },
    };
    if let Some(claim) = claim {
        if let Some(blocked) = claim_blocked(state, claim, now_us) {
            return blocked;
        }
    }
    for (charge, new_tat_us) in charges.iter().zip(new_tats_us) {
        state.set_bucket(charge.bucket.clone(), new_tat_us);
    }
    if let Some(claim) = claim {
        let record = ClaimRecord {
            hook_id: claim.hook_id.clone(),
            node,
            state: ClaimState::Pending,
            expires_at_us: now_us.saturating_add(claim.pending_ttl_ms.saturating_mul(US_PER_MS)),
            ttl_ms: claim.ttl_ms,
        };
        state.set_claim(claim.key.clone(), record);
    }
    HitAnswer::Allowed
}

/// Step 3 of a hit: `Some(answer)` when the claim stops the hit here, `None` to go on.
///
/// A retry of the same pending hook answers `Allowed` without charging or extending.
pub fn claim_blocked(state: &FleetState, claim: &ClaimRequest, now_us: u64) -> Option<HitAnswer> {
    let record = state.claim(&claim.key)?;
    Some(match record.state {
        ClaimState::Committed => HitAnswer::Duplicate {
            hook_id: record.hook_id.clone(),
        },
        ClaimState::Pending if record.hook_id != claim.hook_id => HitAnswer::Pending {
            retry_after_ms: ceil_ms(record.expires_at_us - now_us),
        },
        ClaimState::Pending => HitAnswer::Allowed,
    })
}

fn commit(
    state: &mut FleetState,
    key: &ClaimKey,
    hook_id: &HookId,
    settle_ttl_ms: u64,
    node: NodeId,
    now_us: u64,
) -> SettleAnswer {
    let Some(record) = state.claim(key).cloned() else {
        let record = ClaimRecord {
            hook_id: hook_id.clone(),
            node,
            state: ClaimState::Committed,
            expires_at_us: now_us.saturating_add(settle_ttl_ms.saturating_mul(US_PER_MS)),
            ttl_ms: settle_ttl_ms,
        };
        state.set_claim(key.clone(), record);
        return SettleAnswer::Recreated;
    };
    if record.hook_id != *hook_id {
        return SettleAnswer::Conflict {
            holder: record.hook_id,
        };
    }
    if record.state == ClaimState::Pending {
        let committed = ClaimRecord {
            state: ClaimState::Committed,
            expires_at_us: now_us.saturating_add(record.ttl_ms.saturating_mul(US_PER_MS)),
            ..record
        };
        state.set_claim(key.clone(), committed);
    }
    SettleAnswer::Settled
}

fn release(state: &mut FleetState, key: &ClaimKey, hook_id: &HookId) -> SettleAnswer {
    let Some(record) = state.claim(key) else {
        return SettleAnswer::Settled;
    };
    if record.hook_id != *hook_id || record.state == ClaimState::Committed {
        return SettleAnswer::Conflict {
            holder: record.hook_id.clone(),
        };
    }
    state.claims.remove(key);
    SettleAnswer::Settled
}

fn reset(state: &mut FleetState, tenant: &TenantId) {
    for kind in [Kind::Hooks, Kind::Bytes] {
        state.buckets.remove(&BucketKey::Tenant {
            kind,
            tenant: tenant.clone(),
        });
    }
}

#[cfg(test)]
mod tests;
