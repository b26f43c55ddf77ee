//! What the local fallback granted while the fleet did not answer, kept until
//! reconciliation (`super::reconcile`) hands it to the fleet.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};

use crate::lock::lock;
use crate::state::{BucketKey, Charge, TenantId};

/// Charges granted locally while cut off, summed per bucket until reconciliation hands
/// them to the fleet as one numbered round ([`crate::state::Command::AbsorbRound`]). A
/// round is sent again, the same, until the fleet answers it; what is granted meanwhile
/// waits for the next round. The fleet applies a round number of a node's once, so a round
/// whose answer was lost but which committed is not absorbed twice. Memory only: a restart
/// forgets them (the budgets they spent refill within one window anyway).
#[derive(Default)]
pub struct ChargeLedger {
    spent: Mutex<HashMap<BucketKey, (u64, u64)>>,
    rounds: Mutex<Rounds>,
}

/// The rounds made from the ledger.
#[derive(Default)]
struct Rounds {
    /// The round sent and not answered yet.
    in_flight: Option<AbsorbRound>,
    /// The number of the last round made, so the next one is above it.
    last: u64,
}

/// One round of charges for the fleet to absorb.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AbsorbRound {
    pub round: u64,
    pub charges: Vec<Charge>,
}

impl ChargeLedger {
    fn lock(&self) -> MutexGuard<'_, HashMap<BucketKey, (u64, u64)>> {
        lock(&self.spent)
    }

    /// The round to send: the one not answered yet, else a new one of everything recorded
    /// (None: nothing to send). A new round's number is above the last one made here,
    /// above `floor` (the last the fleet applied of this node's, as its replica knows it)
    /// and at least `now_us`, so it stays above the fleet's across a restart of this
    /// node (a wiped data dir too), unless the wall clock went back past it meanwhile (then
    /// the round is not absorbed: under-charged, as a restart forgets a ledger).
    pub fn next_round(&self, floor: u64, now_us: u64) -> Option<AbsorbRound> {
        let mut rounds = lock(&self.rounds);
        if let Some(round) = rounds.in_flight.as_ref() {
            return Some(round.clone());
        }
        let charges = self.take();
        if charges.is_empty() {
            return None;
        }
        rounds.last = now_us
            .max(floor.saturating_add(1))
            .max(rounds.last.saturating_add(1));
        let round = AbsorbRound {
            round: rounds.last,
            charges,
        };
        rounds.in_flight = Some(round.clone());
        Some(round)
    }

    /// The fleet answered round `round`: it is done.
    pub fn confirm(&self, round: u64) {
        let mut rounds = lock(&self.rounds);
        if rounds
            .in_flight
            .as_ref()
            .is_some_and(|sent| sent.round == round)
        {
            rounds.in_flight = None;
        }
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
    fn take(&self) -> Vec<Charge> {
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
        self.len() == 0
    }

    /// How many charges wait to be reconciled: recorded, or in the round not answered yet.
    pub fn len(&self) -> usize {
        // Both at once, in `next_round`'s order: a round being made is counted once.
        let rounds = lock(&self.rounds);
        let sent = rounds
            .in_flight
            .as_ref()
            .map_or(0, |round| round.charges.len());
        self.lock().len() + sent
    }

    /// Drops what `tenant`'s buckets (both kinds) were charged locally: a reset forgets
    /// them, so reconciliation must not charge them to the fleet afterwards (the round in
    /// flight keeps its number: the fleet applies it at most once either way).
    pub fn forget_tenant(&self, tenant: &TenantId) {
        let of_tenant = |bucket: &BucketKey| matches!(bucket, BucketKey::Tenant { tenant: t, .. } if t == tenant);
        self.lock().retain(|bucket, _| !of_tenant(bucket));
        if let Some(round) = lock(&self.rounds).in_flight.as_mut() {
            round.charges.retain(|charge| !of_tenant(&charge.bucket));
        }
    }
}
