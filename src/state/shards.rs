//! A hash map split into [`SHARDS`] maps by the key's hash.
//!
//! A `HashMap` grows by rehashing every item into a table twice the size, in one go: at a
//! few hundred thousand claims that took 100-400 ms on the benchmark machine, and since
//! every replica holds the same state, all of them paused together and the fleet stopped
//! committing for that long (AppendEntries timed out). Split in 64, a map grows one shard
//! at a time: each pause is 1/64 of that, and shards cross their thresholds at different
//! moments.
//!
//! A map can also be *frozen* for a snapshot ([`Sharded::freeze`]): the frozen copy shares
//! the shards (no copy is made) and stays as it was, while the live map records every change
//! from then on in a small overlay (a removal is a tombstone); [`Sharded::thaw`] folds the
//! overlay back in once the frozen copy is gone. So a snapshot encodes without holding the
//! state lock, apply goes on meanwhile, and the extra memory is only what changed during
//! the encode.

use std::borrow::Borrow;
use std::collections::HashMap;
use std::hash::{BuildHasher, Hash};
use std::sync::Arc;

use foldhash::fast::RandomState;

/// Shards per map (a power of two: the shard is the top bits of the key's hash).
const SHARDS: usize = 64;
const SHARD_BITS: u32 = SHARDS.trailing_zeros();

type Shards<K, V> = Vec<HashMap<K, V, RandomState>>;

/// A map of `K` to `V` in [`SHARDS`] shards; the subset of `HashMap`'s API the state uses.
#[derive(Clone, Debug)]
pub(super) struct Sharded<K, V> {
    /// Picks the shard (each shard's map hashes again with its own seed).
    hasher: RandomState,
    /// Shared with a frozen copy while one exists; changed in place otherwise.
    base: Arc<Shards<K, V>>,
    /// While frozen: every change since, by key (`None`: removed).
    overlay: Option<HashMap<K, Option<V>, RandomState>>,
    len: usize,
}

impl<K, V> Default for Sharded<K, V> {
    fn default() -> Self {
        Self {
            hasher: RandomState::default(),
            base: Arc::new(
                (0..SHARDS)
                    .map(|_| HashMap::with_hasher(RandomState::default()))
                    .collect(),
            ),
            overlay: None,
            len: 0,
        }
    }
}

/// The shard of `key`: the top bits of its hash (each shard's own map hashes with another
/// seed, so its buckets stay spread).
fn shard_index<Q: Hash + ?Sized>(hasher: &RandomState, key: &Q) -> usize {
    (hasher.hash_one(key) >> (u64::BITS - SHARD_BITS)) as usize
}

impl<K: Hash + Eq + Clone, V: Clone> Sharded<K, V> {
    fn shard_of<Q: Hash + ?Sized>(&self, key: &Q) -> usize {
        shard_index(&self.hasher, key)
    }

    pub(super) fn get<Q>(&self, key: &Q) -> Option<&V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        if let Some(changed) = self.overlay.as_ref().and_then(|overlay| overlay.get(key)) {
            return changed.as_ref();
        }
        self.base[self.shard_of(key)].get(key)
    }

    pub(super) fn get_mut<Q>(&mut self, key: &Q) -> Option<&mut V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let shard = self.shard_of(key);
        match &mut self.overlay {
            Some(overlay) => {
                if !overlay.contains_key(key) {
                    // First change since the freeze: copy the item into the overlay.
                    let (k, v) = self.base[shard].get_key_value(key)?;
                    overlay.insert(k.clone(), Some(v.clone()));
                }
                overlay.get_mut(key).and_then(Option::as_mut)
            }
            None => Arc::make_mut(&mut self.base)[shard].get_mut(key),
        }
    }

    /// Inserts or replaces; true when the key was not there.
    pub(super) fn insert(&mut self, key: K, value: V) -> bool {
        let shard = self.shard_of(&key);
        let is_new = match &mut self.overlay {
            Some(overlay) => {
                let in_base = self.base[shard].contains_key(&key);
                match overlay.insert(key, Some(value)) {
                    Some(changed) => changed.is_none(),
                    None => !in_base,
                }
            }
            None => Arc::make_mut(&mut self.base)[shard]
                .insert(key, value)
                .is_none(),
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
        let shard = self.shard_of(key);
        let removed = match &mut self.overlay {
            Some(overlay) => match overlay.get_mut(key) {
                Some(changed) => changed.take().is_some(),
                None => match self.base[shard].get_key_value(key) {
                    Some((k, _)) => {
                        overlay.insert(k.clone(), None);
                        true
                    }
                    None => false,
                },
            },
            None => Arc::make_mut(&mut self.base)[shard].remove(key).is_some(),
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
            .filter(move |(k, _)| overlay.is_none_or(|overlay| !overlay.contains_key(*k)));
        let changed = overlay
            .into_iter()
            .flat_map(|overlay| overlay.iter())
            .filter_map(|(k, v)| v.as_ref().map(|v| (k, v)));
        unchanged.chain(changed)
    }

    /// A copy that stays as the map is now and shares its shards; changes to `self` go to
    /// the overlay until [`Sharded::thaw`]. Freezing again first folds the last overlay in
    /// (copying the shards if that earlier frozen copy is still alive).
    pub(super) fn freeze(&mut self) -> Self {
        self.thaw();
        self.overlay = Some(HashMap::with_hasher(RandomState::default()));
        Self {
            hasher: self.hasher.clone(),
            base: Arc::clone(&self.base),
            overlay: None,
            len: self.len,
        }
    }

    /// Folds the overlay back into the shards (in place once the frozen copy is dropped).
    pub(super) fn thaw(&mut self) {
        let Some(overlay) = self.overlay.take() else {
            return;
        };
        let base = Arc::make_mut(&mut self.base);
        for (key, value) in overlay {
            let shard = shard_index(&self.hasher, &key);
            match value {
                Some(value) => {
                    base[shard].insert(key, value);
                }
                None => {
                    base[shard].remove(&key);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
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
        /// the state does): the same answers for any sequence of changes, frozen or not. A
        /// frozen copy keeps the contents of the moment it was taken whatever happens to the
        /// live map, before and after the overlay is folded back in.
        #[test]
        fn a_frozen_copy_stays_and_the_live_map_goes_on(ops in proptest::collection::vec((0u8..5, 0u16..100, any::<u32>()), 0..400)) {
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
                    3 => {
                        if frozen.is_none() {
                            frozen = Some((sharded.freeze(), model_contents(&plain)));
                        }
                    }
                    _ => {
                        frozen = None;
                        sharded.thaw();
                    }
                }
                prop_assert_eq!(sharded.get(&key), plain.get(&key));
                prop_assert_eq!(sharded.len(), plain.len());
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

    #[test]
    fn keys_spread_over_the_shards() {
        let mut map: Sharded<u64, ()> = Sharded::default();
        for key in 0..64_000u64 {
            map.insert(key, ());
        }
        let sizes: Vec<usize> = map.base.iter().map(HashMap::len).collect();
        assert!(sizes.iter().all(|n| (500..1_500).contains(n)), "{sizes:?}");
    }
}
