//! A hash map split into [`SHARDS`] maps by the key's hash.
//!
//! A `HashMap` grows by rehashing every item into a table twice the size, in one go: at a
//! few hundred thousand claims that pauses apply for a long time, and since every replica
//! holds the same state, all of them pause together and the fleet stops committing
//! (docs/decisions/008). Split in 64, a map grows one shard at a time: each pause is 1/64
//! of that, and shards cross their thresholds at different moments.
//!
//! A map can also be *frozen* for a snapshot ([`Sharded::freeze`]): the frozen copy shares
//! the shards (no copy is made) and stays as it was, while the live map records every change
//! from then on in a small overlay (a removal is a tombstone); [`Sharded::thaw`] folds the
//! overlay back in once the frozen copy is gone. So a snapshot encodes without holding the
//! state lock, apply goes on meanwhile, and the extra memory is only what changed during
//! the encode.
//!
//! Every item keeps its key's hash, computed once when the key comes in: the shard, the
//! lookup in it, the overlay and a table's growth all use it, so a claim's three strings
//! are hashed once per replica, not once per step.

use std::borrow::Borrow;
use std::hash::{BuildHasher, Hash};
use std::sync::Arc;

use foldhash::fast::RandomState;
use hashbrown::HashTable;

/// Shards per map (a power of two).
const SHARDS: usize = 64;
/// The shard is six bits from the middle of the hash: a shard's table takes its slot from
/// the low bits and its control bytes from the top seven, which must stay spread inside a
/// shard.
const SHARD_SHIFT: u32 = 40;

/// One stored item and its key's hash.
#[derive(Clone, Debug)]
struct Item<K, V> {
    hash: u64,
    key: K,
    value: V,
}

type Table<K, V> = HashTable<Item<K, V>>;

/// A map of `K` to `V` in [`SHARDS`] shards; the subset of `HashMap`'s API the state uses.
///
/// A clone shares the shards as a frozen copy does: while one lives, changes go to the
/// overlay (if there is one) and a fold waits, and without an overlay the next change
/// copies every shard. The state clones a map only by [`Sharded::freeze`].
#[derive(Clone, Debug)]
pub(super) struct Sharded<K, V> {
    hasher: RandomState,
    /// Shared with a frozen copy while one exists; changed in place otherwise.
    base: Arc<Vec<Table<K, V>>>,
    /// Since the last freeze: every change made while the frozen copy lived, by key
    /// (`None`: removed), less what has been folded back into `base` since it was dropped.
    overlay: Option<Table<K, Option<V>>>,
    len: usize,
}

impl<K, V> Default for Sharded<K, V> {
    fn default() -> Self {
        Self {
            hasher: RandomState::default(),
            base: Arc::new((0..SHARDS).map(|_| HashTable::new()).collect()),
            overlay: None,
            len: 0,
        }
    }
}

fn shard_of(hash: u64) -> usize {
    (hash >> SHARD_SHIFT) as usize & (SHARDS - 1)
}

/// Whether an item holds `key`, whose hash is `hash` (for the tables' `find`). The stored
/// hash is compared first: it sits beside the key's pointer, so an item that only shares
/// the probe's seven control bits is passed over without reading its key.
fn holds<'a, K, V, Q>(hash: u64, key: &'a Q) -> impl Fn(&Item<K, V>) -> bool + 'a
where
    K: Borrow<Q>,
    Q: Eq + ?Sized,
{
    move |item| item.hash == hash && item.key.borrow() == key
}

/// The stored hash: what a table needs when it grows.
fn stored_hash<K, V>(item: &Item<K, V>) -> u64 {
    item.hash
}

impl<K: Hash + Eq + Clone, V: Clone> Sharded<K, V> {
    /// `key`'s hash in this map (each map has its own seed). A caller that keeps it looks
    /// the item up again with the `*_hashed` methods without hashing the key: the expiry
    /// queue does, for items whose keys are three strings.
    pub(super) fn hash_of<Q: Hash + ?Sized>(&self, key: &Q) -> u64 {
        self.hasher.hash_one(key)
    }

    #[cfg(test)]
    pub(super) fn get<Q>(&self, key: &Q) -> Option<&V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.get_hashed(self.hash_of(key), key)
    }

    /// The value of `key`, whose `hash` is from [`Sharded::hash_of`].
    pub(super) fn get_hashed<Q>(&self, hash: u64, key: &Q) -> Option<&V>
    where
        K: Borrow<Q>,
        Q: Eq + ?Sized,
    {
        if let Some(changed) = self
            .overlay
            .as_ref()
            .and_then(|overlay| overlay.find(hash, holds(hash, key)))
        {
            return changed.value.as_ref();
        }
        self.base[shard_of(hash)]
            .find(hash, holds(hash, key))
            .map(|item| &item.value)
    }

    #[cfg(test)]
    pub(super) fn get_mut<Q>(&mut self, key: &Q) -> Option<&mut V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.get_mut_hashed(self.hash_of(key), key)
    }

    /// [`Sharded::get_mut`] with `hash` from [`Sharded::hash_of`].
    pub(super) fn get_mut_hashed<Q>(&mut self, hash: u64, key: &Q) -> Option<&mut V>
    where
        K: Borrow<Q>,
        Q: Eq + ?Sized,
    {
        self.get_key_value_mut_hashed(hash, key)
            .map(|(_, value)| value)
    }

    /// The stored key (the map's own, which a caller can share) and its value.
    pub(super) fn get_key_value_mut_hashed<Q>(&mut self, hash: u64, key: &Q) -> Option<(&K, &mut V)>
    where
        K: Borrow<Q>,
        Q: Eq + ?Sized,
    {
        let shard = shard_of(hash);
        let frozen = self.before_change(hash, key);
        let item = match &mut self.overlay {
            Some(overlay) if frozen => {
                if overlay.find(hash, holds(hash, key)).is_none() {
                    // First change since the freeze: copy the item into the overlay.
                    let item = self.base[shard].find(hash, holds(hash, key))?;
                    let copy = Item {
                        hash,
                        key: item.key.clone(),
                        value: Some(item.value.clone()),
                    };
                    overlay.insert_unique(hash, copy, stored_hash);
                }
                let Item { key, value, .. } = overlay.find_mut(hash, holds(hash, key))?;
                return value.as_mut().map(|value| (&*key, value));
            }
            _ => Arc::make_mut(&mut self.base)[shard].find_mut(hash, holds(hash, key))?,
        };
        Some((&item.key, &mut item.value))
    }

    /// Inserts or replaces; true when the key was not there.
    #[cfg(test)]
    pub(super) fn insert(&mut self, key: K, value: V) -> bool {
        self.insert_hashed(self.hash_of(&key), key, value)
    }

    /// [`Sharded::insert`] with `hash` from [`Sharded::hash_of`].
    pub(super) fn insert_hashed(&mut self, hash: u64, key: K, value: V) -> bool {
        let shard = shard_of(hash);
        let frozen = self.before_change(hash, &key);
        let is_new = match &mut self.overlay {
            Some(overlay) if frozen => match overlay.find_mut(hash, holds(hash, &key)) {
                Some(changed) => changed.value.replace(value).is_none(),
                None => {
                    let in_base = self.base[shard].find(hash, holds(hash, &key)).is_some();
                    let value = Some(value);
                    overlay.insert_unique(hash, Item { hash, key, value }, stored_hash);
                    !in_base
                }
            },
            _ => {
                let table = &mut Arc::make_mut(&mut self.base)[shard];
                match table.find_mut(hash, holds(hash, &key)) {
                    Some(item) => {
                        item.value = value;
                        false
                    }
                    None => {
                        table.insert_unique(hash, Item { hash, key, value }, stored_hash);
                        true
                    }
                }
            }
        };
        if is_new {
            self.len += 1;
        }
        is_new
    }

    /// Removes; true when the key was there.
    pub(super) fn remove<Q>(&mut self, key: &Q) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.remove_hashed(self.hash_of(key), key)
    }

    /// [`Sharded::remove`] with `hash` from [`Sharded::hash_of`].
    pub(super) fn remove_hashed<Q>(&mut self, hash: u64, key: &Q) -> bool
    where
        K: Borrow<Q>,
        Q: Eq + ?Sized,
    {
        let shard = shard_of(hash);
        let frozen = self.before_change(hash, key);
        let removed = match &mut self.overlay {
            Some(overlay) if frozen => match overlay.find_mut(hash, holds(hash, key)) {
                Some(changed) => changed.value.take().is_some(),
                None => match self.base[shard].find(hash, holds(hash, key)) {
                    Some(item) => {
                        let key = item.key.clone();
                        let tombstone = Item {
                            hash,
                            key,
                            value: None,
                        };
                        overlay.insert_unique(hash, tombstone, stored_hash);
                        true
                    }
                    None => false,
                },
            },
            _ => Arc::make_mut(&mut self.base)[shard]
                .find_entry(hash, holds(hash, key))
                .map(|entry| entry.remove())
                .is_ok(),
        };
        if removed {
            self.len -= 1;
        }
        removed
    }

    pub(super) fn len(&self) -> usize {
        self.len
    }

    pub(super) fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = (&K, &V)> {
        let overlay = self.overlay.as_ref();
        let unchanged = self
            .base
            .iter()
            .flat_map(|shard| shard.iter())
            .filter(move |item| {
                overlay.is_none_or(|overlay| {
                    overlay
                        .find(item.hash, holds(item.hash, &item.key))
                        .is_none()
                })
            })
            .map(|item| (&item.key, &item.value));
        let changed = overlay
            .into_iter()
            .flat_map(|overlay| overlay.iter())
            .filter_map(|item| item.value.as_ref().map(|value| (&item.key, value)));
        unchanged.chain(changed)
    }

    /// A copy that stays as the map is now and shares its shards; changes to `self` go to
    /// the overlay while the copy lives, and are folded back in once it is dropped
    /// ([`Sharded::thaw_some`], [`Sharded::thaw`]). Freezing again first folds the last
    /// overlay in (copying the shards if that earlier frozen copy is still alive).
    pub(super) fn freeze(&mut self) -> Self {
        self.thaw();
        self.overlay = Some(HashTable::new());
        Self {
            hasher: self.hasher.clone(),
            base: Arc::clone(&self.base),
            overlay: None,
            len: self.len,
        }
    }

    /// Folds the overlay back into the shards (in place once the frozen copy is dropped).
    pub(super) fn thaw(&mut self) {
        while !self.fold(usize::MAX) {}
    }

    /// Folds up to `budget` items of the overlay back into the shards once the frozen copy
    /// is gone (while it lives, nothing: the fold would copy every shard); true once no
    /// overlay is left. Until then the map answers as before, and a change to a key first
    /// moves its overlay item into the shards ([`Sharded::settle`]), so the overlay only
    /// shrinks and the fold ends, whatever the changes between steps: after its size over
    /// `budget` steps, plus one for each step cut short where a shard grew.
    pub(super) fn thaw_some(&mut self, budget: usize) -> bool {
        debug_assert!(budget > 0, "a fold of no items a step never ends");
        if self.frozen() {
            return false;
        }
        self.fold(budget)
    }

    /// Whether a frozen copy still shares the shards: changes then go to the overlay. A
    /// change reads it once: the frozen copy may be dropped on another thread meanwhile, and
    /// a key settled into the shards must not then be changed in the overlay.
    fn frozen(&self) -> bool {
        self.overlay.is_some() && Arc::strong_count(&self.base) > 1
    }

    /// Whether a change to `key` goes to the overlay ([`Sharded::frozen`], read once); when
    /// it does not, `key`'s overlay item is settled into the shards first.
    fn before_change<Q>(&mut self, hash: u64, key: &Q) -> bool
    where
        K: Borrow<Q>,
        Q: Eq + ?Sized,
    {
        let frozen = self.frozen();
        if !frozen {
            self.settle(hash, key);
        }
        frozen
    }

    /// Moves `key`'s overlay item, if there is one, into the shards (unfrozen maps only).
    fn settle<Q>(&mut self, hash: u64, key: &Q)
    where
        K: Borrow<Q>,
        Q: Eq + ?Sized,
    {
        let Some(overlay) = self.overlay.as_mut() else {
            return;
        };
        if let Ok(entry) = overlay.find_entry(hash, holds(hash, key)) {
            let (item, _) = entry.remove();
            fold_one(&mut Arc::make_mut(&mut self.base)[..], item);
        }
    }

    /// Moves up to `budget` overlay items into the shards (copying the shards if a frozen
    /// copy still shares them), fewer if a shard grows; true once the overlay is empty and
    /// gone.
    fn fold(&mut self, budget: usize) -> bool {
        let Some(overlay) = self.overlay.as_mut() else {
            return true;
        };
        let base = Arc::make_mut(&mut self.base);
        for item in overlay.extract_if(|_| true).take(budget) {
            // A shard's growth moves every item in it: the step ends there. The shards fill
            // evenly, so many of them grow within the same thousand items of a fold.
            if fold_one(base, item) {
                break;
            }
        }
        if !overlay.is_empty() {
            return false;
        }
        self.overlay = None;
        true
    }
}

/// Puts one overlay item (a value, or `None` for a removal) into its shard; true when the
/// shard had to grow for it.
fn fold_one<K: Eq, V>(base: &mut [Table<K, V>], item: Item<K, Option<V>>) -> bool {
    let Item { hash, key, value } = item;
    let table = &mut base[shard_of(hash)];
    let full = table.len() == table.capacity();
    let stored = table.find_entry(hash, holds(hash, &key));
    match (stored, value) {
        (Ok(mut stored), Some(value)) => stored.get_mut().value = value,
        (Err(_), Some(value)) => {
            table.insert_unique(hash, Item { hash, key, value }, stored_hash);
            return full;
        }
        (Ok(stored), None) => {
            stored.remove();
        }
        (Err(_), None) => {}
    }
    false
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::sync::Arc;

    use proptest::prelude::*;

    use super::*;

    type TestMap = Sharded<Arc<String>, u32>;

    fn contents(map: &TestMap) -> Vec<(String, u32)> {
        let mut all: Vec<(String, u32)> = map.iter().map(|(k, v)| ((**k).clone(), *v)).collect();
        all.sort();
        all
    }

    fn model_contents(map: &HashMap<Arc<String>, u32>) -> Vec<(String, u32)> {
        let mut all: Vec<(String, u32)> = map.iter().map(|(k, v)| ((**k).clone(), *v)).collect();
        all.sort();
        all
    }

    proptest! {
        /// Against a plain `HashMap`, with lookups by the borrowed form of an `Arc` key (as
        /// the state does): the same answers and contents for any sequence of changes,
        /// frozen, thawed or part way through a fold in steps. A frozen copy keeps the
        /// contents of the moment it was taken whatever happens to the live map (a step
        /// folds nothing while it lives), before and after the overlay is folded back in.
        #[test]
        fn a_frozen_copy_stays_and_the_live_map_goes_on(ops in proptest::collection::vec((0u8..9, 0u16..100, any::<u32>()), 0..400)) {
            let mut sharded: Sharded<Arc<String>, u32> = Sharded::default();
            let mut plain: HashMap<Arc<String>, u32> = HashMap::new();
            let mut frozen: Option<(TestMap, Vec<(String, u32)>)> = None;
            for (op, key, value) in ops {
                let key = format!("key-{key}");
                match op {
                    0 => prop_assert_eq!(
                        sharded.insert(Arc::new(key.clone()), value),
                        plain.insert(Arc::new(key.clone()), value).is_none()
                    ),
                    1 => prop_assert_eq!(sharded.remove(&key), plain.remove(&key).is_some()),
                    2 => {
                        if let Some(v) = sharded.get_mut(&key) {
                            *v = v.wrapping_add(1);
                        }
                        if let Some(v) = plain.get_mut(&key) {
                            *v = v.wrapping_add(1);
                        }
                    }
                    // By a hash kept from before, and another `Arc` of the same key (the
                    // expiry queue's way; equality falls back to the key's contents).
                    5 => prop_assert_eq!(
                        sharded.remove_hashed(sharded.hash_of(&key), &Arc::new(key.clone())),
                        plain.remove(&key).is_some()
                    ),
                    6 => {
                        let hash = sharded.hash_of(&key);
                        if let Some(v) = sharded.get_mut_hashed(hash, &Arc::new(key.clone())) {
                            *v = v.wrapping_add(7);
                        }
                        if let Some(v) = plain.get_mut(&key) {
                            *v = v.wrapping_add(7);
                        }
                    }
                    3 => {
                        if frozen.is_none() {
                            frozen = Some((sharded.freeze(), model_contents(&plain)));
                        }
                    }
                    // A fold in steps: the map goes on between them, and each change folds
                    // its own key first.
                    7 => {
                        frozen = None;
                        sharded.thaw_some(value as usize % 4 + 1);
                    }
                    // While the frozen copy lives, a step folds nothing.
                    8 => {
                        let done = sharded.thaw_some(value as usize % 4 + 1);
                        prop_assert_eq!(done, sharded.overlay.is_none());
                        if frozen.is_some() {
                            prop_assert!(!done);
                        }
                    }
                    _ => {
                        frozen = None;
                        sharded.thaw();
                    }
                }
                prop_assert_eq!(sharded.get(&key), plain.get(&key));
                prop_assert_eq!(sharded.len(), plain.len());
                prop_assert_eq!(contents(&sharded), model_contents(&plain));
                if let Some((copy, then)) = &frozen {
                    prop_assert_eq!(&contents(copy), then);
                }
            }
            prop_assert_eq!(contents(&sharded), model_contents(&plain));
            drop(frozen);
            sharded.thaw();
            prop_assert_eq!(contents(&sharded), model_contents(&plain));
            prop_assert_eq!(sharded.len(), plain.len());
        }
    }

    /// Changes between steps of a fold never grow the overlay: each folds its own key
    /// first, so the fold ends in the overlay's size over the step, however busy the map.
    #[test]
    fn a_fold_in_steps_ends_while_the_map_keeps_changing() {
        let mut map: TestMap = Sharded::default();
        let mut model = std::collections::BTreeMap::new();
        let mut set = |map: &mut TestMap, key, value| {
            map.insert(Arc::new(format!("k{key}")), value);
            model.insert(key, value);
        };
        for key in 0..1_000 {
            set(&mut map, key, key);
        }
        let frozen = map.freeze();
        for key in 0..1_000 {
            set(&mut map, key, key + 1);
        }
        drop(frozen);
        let mut steps = 0;
        let mut next = 1_000;
        while !map.thaw_some(100) {
            steps += 1;
            assert!(steps <= 10, "the fold did not end");
            // A busy map between steps: 200 keys touched, half of them new. In the first
            // round most of the other half are still in the overlay, with an older value
            // that must not come back.
            for key in next - 100..next + 100 {
                set(&mut map, key, key);
            }
            next += 100;
        }
        assert!(
            steps > 0,
            "the fold ended before any change came between its steps"
        );
        assert!(map.overlay.is_none());
        assert_eq!(map.len(), model.len());
        for (key, value) in &model {
            assert_eq!(map.get(&format!("k{key}")), Some(value), "k{key}");
        }
    }

    /// A step ends at the first shard that grows, so a step costs one growth at most.
    #[test]
    fn a_fold_step_ends_where_a_shard_grows() {
        let mut map: TestMap = Sharded::default();
        let frozen = map.freeze();
        for key in 0..100 {
            map.insert(Arc::new(format!("k{key}")), key);
        }
        drop(frozen);
        assert!(
            !map.thaw_some(1_000),
            "an empty shard grows for its first item"
        );
        assert_eq!(map.overlay.as_ref().map(HashTable::len), Some(99));
        map.thaw();
        assert!(map.overlay.is_none());
        assert_eq!(map.len(), 100);
        assert_eq!(contents(&map).len(), 100);
        assert_eq!(map.get(&"k7".to_owned()), Some(&7));
    }

    #[test]
    fn keys_spread_over_the_shards() {
        let mut map: Sharded<u64, ()> = Sharded::default();
        for key in 0..64_000u64 {
            map.insert(key, ());
        }
        let sizes: Vec<usize> = map.base.iter().map(HashTable::len).collect();
        assert!(sizes.iter().all(|n| (500..1_500).contains(n)), "{sizes:?}");
    }
}
