//! One at a time per claim key: a mixed-scope hit (fleet charges, node claim) looks at the
//! node's claim, spends its charges through the fleet and only then takes the claim. Contract §5
//! makes that one atomic decision, so two such hits for the same key on this node
//! take turns instead of both spending (`Node::hit_fleet_charges_node_claim`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::OwnedMutexGuard;

use crate::lock::lock;
use crate::state::ClaimKey;

/// The keys whose turn is taken, each with the lock its waiters queue on.
#[derive(Default)]
pub struct KeyTurns {
    turns: Mutex<HashMap<ClaimKey, Arc<tokio::sync::Mutex<()>>>>,
}

/// A key's turn, given back when dropped.
pub struct KeyTurn<'a> {
    turns: &'a KeyTurns,
    key: ClaimKey,
    lock: Arc<tokio::sync::Mutex<()>>,
    held: Option<OwnedMutexGuard<()>>,
}

impl KeyTurns {
    fn map(&self) -> MutexGuard<'_, HashMap<ClaimKey, Arc<tokio::sync::Mutex<()>>>> {
        lock(&self.turns)
    }

    /// Waits for `key`'s turn (cancel-safe: dropping the wait gives up the place).
    pub async fn take(&self, key: &ClaimKey) -> KeyTurn<'_> {
        let lock = self.map().entry(key.clone()).or_default().clone();
        let mut turn = KeyTurn {
            turns: self,
            key: key.clone(),
            lock: lock.clone(),
            held: None,
        };
        turn.held = Some(lock.lock_owned().await);
        turn
    }

    /// How many keys have a turn taken or waited for (for tests).
    #[cfg(test)]
    fn len(&self) -> usize {
        self.map().len()
    }
}

impl Drop for KeyTurn<'_> {
    fn drop(&mut self) {
        drop(self.held.take());
        let mut turns = self.turns.map();
        // The map's reference and this one: nobody else holds or waits for the key.
        if Arc::strong_count(&self.lock) == 2 {
            turns.remove(&self.key);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn key(name: &str) -> ClaimKey {
        ClaimKey {
            tenant: "t".into(),
            source_id: "s".into(),
            key: name.into(),
        }
    }

    #[tokio::test]
    async fn one_turn_per_key_and_keys_are_forgotten_when_nobody_waits() {
        let turns = KeyTurns::default();
        let first = turns.take(&key("a")).await;
        let other_key = turns.take(&key("b")).await;
        let a = key("a");
        let second = turns.take(&a);
        tokio::pin!(second);
        assert!(
            tokio::time::timeout(Duration::from_millis(20), &mut second)
                .await
                .is_err(),
            "a second turn for the same key waits"
        );
        drop(first);
        let second = second.await;
        drop(other_key);
        assert_eq!(turns.len(), 1, "only the key still held is kept");
        drop(second);
        assert_eq!(turns.len(), 0);
    }
}
