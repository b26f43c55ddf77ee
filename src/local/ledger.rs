//! What the local fallback granted while the fleet did not answer, kept until
//! reconciliation (`super::reconcile`) hands it to the fleet.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};

use crate::lock::lock;
use crate::state::{BucketKey, Charge, TenantId};

/// Charges granted locally while cut off, summed per bucket until reconciliation hands
/// them to the fleet as one [`crate::state::Command::Absorb`]. Memory only: a restart forgets them (the
/// budgets they spent refill within one window anyway).
#[derive(Default)]
pub struct ChargeLedger {
    spent: Mutex<HashMap<BucketKey, (u64, u64)>>,
}

impl ChargeLedger {
    fn lock(&self) -> MutexGuard<'_, HashMap<BucketKey, (u64, u64)>> {
        lock(&self.spent)
    }

    /// Adds the charges of one local grant.
    pub fn record(&self, charges: &[Charge]) {
        let mut spent = self.lock();
        for charge in charges {
            let entry = spent.entry(charge.bucket.clone()).or_insert((0, 0));
            entry.0 = entry.0.saturating_add(charge.increment_us);
            entry.1 = entry.1.max(charge.capacity_us);
        }
    }

    /// Takes everything recorded so far, one charge per bucket.
    pub fn take(&self) -> Vec<Charge> {
        self.lock()
            .drain()
            .map(|(bucket, (increment_us, capacity_us))| Charge {
                bucket,
                increment_us,
                capacity_us,
            })
            .collect()
    }

    /// True when nothing waits to be reconciled.
    pub fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }

    /// How many buckets have charges waiting to be reconciled.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Drops what `tenant`'s buckets (both kinds) were charged locally: a reset forgets
    /// them, so reconciliation must not charge them to the fleet afterwards.
    pub fn forget_tenant(&self, tenant: &TenantId) {
        self.lock().retain(
            |bucket, _| !matches!(bucket, BucketKey::Tenant { tenant: t, .. } if t == tenant),
        );
    }
}
