//! A hash map split into [`SHARDS`] maps by the key's hash.
//!
//! A `HashMap` grows by rehashing every item into a table twice the size, in one go: at a
//! few hundred thousand claims that took 100-400 ms on the benchmark machine, and since
//! every replica holds the same state, all of them paused together and the fleet stopped
//! committing for that long (AppendEntries timed out). Split in 64, a map grows one shard
//! at a time: each pause is 1/64 of that, and shards cross their thresholds at different
//! moments.

use std::borrow::Borrow;
use std::collections::HashMap;
use std::hash::{BuildHasher, Hash};

use foldhash::fast::RandomState;

/// Shards per map (a power of two: the shard is the top bits of the key's hash).
const SHARDS: usize = 64;
const SHARD_BITS: u32 = SHARDS.trailing_zeros();

/// A map of `K` to `V` in [`SHARDS`] shards; the subset of `HashMap`'s API the state uses.
#[derive(Clone, Debug)]
pub(super) struct Sharded<K, V> {
    /// Picks the shard (each shard's map hashes again with its own seed).
    hasher: RandomState,
    shards: Vec<HashMap<K, V, RandomState>>,
    len: usize,
}

impl<K, V> Default for Sharded<K, V> {
    fn default() -> Self {
        Self {
            hasher: RandomState::default(),
            shards: (0..SHARDS)
                .map(|_| HashMap::with_hasher(RandomState::default()))
                .collect(),
            len: 0,
        }
    }
}

impl<K: Hash + Eq, V> Sharded<K, V> {
    fn shard_of<Q: Hash + ?Sized>(&self, key: &Q) -> usize {
        // The top bits: the shard's own map uses another seed, so its buckets stay spread.
        (self.hasher.hash_one(key) >> (u64::BITS - SHARD_BITS)) as usize
    }

    pub(super) fn get<Q>(&self, key: &Q) -> Option<&V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.shards[self.shard_of(key)].get(key)
    }

    pub(super) fn get_mut<Q>(&mut self, key: &Q) -> Option<&mut V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let shard = self.shard_of(key);
        self.shards[shard].get_mut(key)
    }

    pub(super) fn insert(&mut self, key: K, value: V) -> Option<V> {
        let shard = self.shard_of(&key);
        let previous = self.shards[shard].insert(key, value);
        if previous.is_none() {
            self.len += 1;
        }
        previous
    }

    pub(super) fn remove<Q>(&mut self, key: &Q) -> Option<V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let shard = self.shard_of(key);
        let removed = self.shards[shard].remove(key);
        if removed.is_some() {
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
        self.shards.iter().flat_map(HashMap::iter)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use proptest::prelude::*;

    use super::*;

    proptest! {
        /// Against a plain `HashMap`: the same answers for any sequence of changes, with
        /// lookups by the borrowed form of an `Arc` key (as the state does).
        #[test]
        fn behaves_like_a_hash_map(ops in proptest::collection::vec((0u8..3, 0u16..200, any::<u32>()), 0..400)) {
            let mut sharded: Sharded<Arc<String>, u32> = Sharded::default();
            let mut plain: HashMap<Arc<String>, u32> = HashMap::new();
            for (op, key, value) in ops {
                let key = format!("key-{key}");
                match op {
                    0 => prop_assert_eq!(
                        sharded.insert(Arc::new(key.clone()), value),
                        plain.insert(Arc::new(key.clone()), value)
                    ),
                    1 => prop_assert_eq!(sharded.remove(&key), plain.remove(&key)),
                    _ => {
                        if let Some(v) = sharded.get_mut(&key) {
                            *v = v.wrapping_add(1);
                        }
                        if let Some(v) = plain.get_mut(&key) {
                            *v = v.wrapping_add(1);
                        }
                    }
                }
                prop_assert_eq!(sharded.get(&key), plain.get(&key));
                prop_assert_eq!(sharded.len(), plain.len());
                prop_assert_eq!(sharded.is_empty(), plain.is_empty());
            }
            let mut all: Vec<(String, u32)> =
                sharded.iter().map(|(k, v)| ((**k).clone(), *v)).collect();
            let mut expected: Vec<(String, u32)> =
                plain.iter().map(|(k, v)| ((**k).clone(), *v)).collect();
            all.sort();
            expected.sort();
            prop_assert_eq!(all, expected);
        }
    }

    #[test]
    fn keys_spread_over_the_shards() {
        let mut map: Sharded<u64, ()> = Sharded::default();
        for key in 0..64_000u64 {
            map.insert(key, ());
        }
        let sizes: Vec<usize> = map.shards.iter().map(HashMap::len).collect();
        assert!(sizes.iter().all(|n| (500..1_500).contains(n)), "{sizes:?}");
    }
}
