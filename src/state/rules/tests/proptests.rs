//! Property tests against a reference model written from the contract text.

use std::collections::BTreeMap;

use proptest::prelude::*;

use super::*;

/// The the contract's state, literally: a map of buckets and a map of claims that is never swept.
/// A bucket whose TAT is not after now, or a claim whose expiry is not after now, is
/// treated as absent wherever it is read.
#[derive(Debug, Default)]
struct Model {
    clock_us: u64,
    buckets: BTreeMap<BucketKey, u64>,
    claims: BTreeMap<ClaimKey, ClaimRecord>,
    /// The highest absorb round applied per node.
    absorbed: BTreeMap<NodeId, u64>,
}

fn ceil_to_ms(duration_us: u64) -> u64 {
    duration_us.div_ceil(MS_US)
}

impl Model {
    fn bucket_tat_us(&self, bucket: &BucketKey) -> Option<u64> {
        match self.buckets.get(bucket) {
            Some(&tat_us) if tat_us > self.clock_us => Some(tat_us),
            _ => None,
        }
    }

    fn claim(&self, key: &ClaimKey) -> Option<&ClaimRecord> {
        match self.claims.get(key) {
            Some(record) if record.expires_at_us > self.clock_us => Some(record),
            _ => None,
        }
    }

    /// The latest deadline of anything ever stored: past it, nothing is live.
    fn last_deadline_us(&self) -> u64 {
        let buckets = self.buckets.values().copied();
        let claims = self.claims.values().map(|record| record.expires_at_us);
        buckets.chain(claims).fold(self.clock_us, u64::max)
    }

    fn absorb(&mut self, charges: &[Charge]) {
        let now_us = self.clock_us;
        for charge in charges {
            let tat_us = self
                .bucket_tat_us(&charge.bucket)
                .unwrap_or(now_us)
                .max(now_us);
            let new_tat_us = (tat_us + charge.increment_us).min(now_us + charge.capacity_us);
            self.buckets.insert(charge.bucket.clone(), new_tat_us);
        }
    }

    /// Section 3: time never goes back; every command of the entry is decided at one now.
    fn apply_batch(&mut self, commands: &[Command], stamped_now_us: u64) -> Vec<Answer> {
        self.clock_us = self.clock_us.max(stamped_now_us);
        commands.iter().map(|command| self.apply(command)).collect()
    }

    fn apply(&mut self, command: &Command) -> Answer {
        match command {
            Command::Hit {
                charges,
                claim,
                node,
            } => Answer::Hit(self.hit(charges, claim.as_ref(), *node)),
            Command::ProbeCharges { charges } => Answer::Hit(match self.charges(charges) {
                Ok(_) => HitAnswer::Allowed,
                Err(retry_after_ms) => HitAnswer::RateLimited { retry_after_ms },
            }),
            Command::Settle {
                key,
                hook_id,
                outcome: SettleOutcome::Commit,
                ttl_ms,
                node,
            } => Answer::Settle(self.commit(key, hook_id, *ttl_ms, *node)),
            Command::Settle {
                key,
                hook_id,
                outcome: SettleOutcome::Release,
                ..
            } => Answer::Settle(self.release(key, hook_id)),
            Command::ReconcileCommit {
                key,
                hook_id,
                ttl_ms,
                node,
            } => {
                // Contract §7: a late queued commit wins over another hook's pending claim.
                let pending_for_another = self.claim(key).is_some_and(|record| {
                    record.state == ClaimState::Pending && record.hook_id != *hook_id
                });
                if pending_for_another {
                    self.claims.remove(key);
                }
                Answer::Settle(self.commit(key, hook_id, *ttl_ms, *node))
            }
            Command::Absorb { charges } => {
                self.absorb(charges);
                Answer::Absorbed
            }
            // Contract §7: a node's local charges are handed over once, whatever number
            // of times the same round is proposed.
            Command::AbsorbRound {
                node,
                round,
                charges,
            } => {
                if *round > self.absorbed.get(node).copied().unwrap_or(0) {
                    self.absorb(charges);
                    self.absorbed.insert(*node, *round);
                }
                Answer::Absorbed
            }
            Command::Reset { tenant } => {
                for kind in [Kind::Hooks, Kind::Bytes] {
                    self.buckets.remove(&BucketKey::Tenant {
                        kind,
                        tenant: tenant.clone(),
                    });
                }
                Answer::Reset
            }
        }
    }

    /// Section 4 for each charge: the new TATs if all pass, else the largest retry.
    fn charges(&self, charges: &[Charge]) -> Result<Vec<(BucketKey, u64)>, u64> {
        let now_us = self.clock_us;
        let mut taken = Vec::new();
        let mut denied_retries_ms = Vec::new();
        for charge in charges {
            let tat_us = self.bucket_tat_us(&charge.bucket).unwrap_or(now_us);
            let new_tat_us = tat_us.max(now_us) + charge.increment_us;
            if new_tat_us - now_us <= charge.capacity_us {
                taken.push((charge.bucket.clone(), new_tat_us));
            } else {
                let over_us = new_tat_us - now_us - charge.capacity_us;
                denied_retries_ms.push(ceil_to_ms(over_us).max(1));
            }
        }
        match denied_retries_ms.into_iter().max() {
            Some(retry_after_ms) => Err(retry_after_ms),
            None => Ok(taken),
        }
    }

    /// Section 5, steps 2 to 4.
    fn hit(&mut self, charges: &[Charge], claim: Option<&ClaimRequest>, node: NodeId) -> HitAnswer {
        let now_us = self.clock_us;
        let taken = match self.charges(charges) {
            Ok(taken) => taken,
            Err(retry_after_ms) => return HitAnswer::RateLimited { retry_after_ms },
        };
        if let Some(request) = claim {
            if let Some(record) = self.claim(&request.key) {
                if record.state == ClaimState::Committed {
                    return HitAnswer::Duplicate {
                        hook_id: record.hook_id.clone(),
                    };
                }
                if record.hook_id != request.hook_id {
                    let left_us = record.expires_at_us - now_us;
                    return HitAnswer::Pending {
                        retry_after_ms: ceil_to_ms(left_us).max(1),
                    };
                }
                return HitAnswer::Allowed;
            }
        }
        self.buckets.extend(taken);
        if let Some(request) = claim {
            self.claims.insert(
                request.key.clone(),
                ClaimRecord {
                    hook_id: request.hook_id.clone(),
                    node,
                    state: ClaimState::Pending,
                    expires_at_us: now_us + request.pending_ttl_ms * MS_US,
                    ttl_ms: request.ttl_ms,
                },
            );
        }
        HitAnswer::Allowed
    }

    /// Section 6, commit. A pending claim keeps the node that took it.
    fn commit(
        &mut self,
        key: &ClaimKey,
        hook_id: &HookId,
        ttl_ms: u64,
        node: NodeId,
    ) -> SettleAnswer {
        let now_us = self.clock_us;
        let Some(record) = self.claim(key).cloned() else {
            self.claims.insert(
                key.clone(),
                ClaimRecord {
                    hook_id: hook_id.clone(),
                    node,
                    state: ClaimState::Committed,
                    expires_at_us: now_us + ttl_ms * MS_US,
                    ttl_ms,
                },
            );
            return SettleAnswer::Recreated;
        };
        if record.hook_id != *hook_id {
            return SettleAnswer::Conflict {
                holder: record.hook_id,
            };
        }
        if record.state == ClaimState::Pending {
            let expires_at_us = now_us + record.ttl_ms * MS_US;
            self.claims.insert(
                key.clone(),
                ClaimRecord {
                    state: ClaimState::Committed,
                    expires_at_us,
                    ..record
                },
            );
        }
        SettleAnswer::Settled
    }

    /// Section 6, release.
    fn release(&mut self, key: &ClaimKey, hook_id: &HookId) -> SettleAnswer {
        let Some(record) = self.claim(key) else {
            return SettleAnswer::Settled;
        };
        if record.hook_id == *hook_id && record.state == ClaimState::Pending {
            self.claims.remove(key);
            return SettleAnswer::Settled;
        }
        SettleAnswer::Conflict {
            holder: record.hook_id.clone(),
        }
    }
}

const TENANTS: [&str; 2] = ["t0", "t1"];
const SOURCES: [&str; 2] = ["s0", "s1"];
const KEYS: [&str; 3] = ["k0", "k1", "k2"];
const HOOKS: [&str; 3] = ["h0", "h1", "h2"];
const NODES: [NodeId; 2] = [1, 2];

fn universe_buckets() -> Vec<BucketKey> {
    let mut buckets: Vec<BucketKey> = TENANTS
        .iter()
        .flat_map(|tenant| [hooks(tenant), bytes(tenant)])
        .collect();
    buckets.push(entity("t0", "send"));
    buckets
}

fn universe_claim_keys() -> Vec<ClaimKey> {
    let mut keys = Vec::new();
    for tenant in TENANTS {
        for source_id in SOURCES {
            for key in KEYS {
                keys.push(claim_key(tenant, source_id, key));
            }
        }
    }
    keys
}

/// Up to three charges on distinct buckets; rates of a few per second with small bursts,
/// increments not whole milliseconds so retry rounding is exercised.
fn arb_charges() -> impl Strategy<Value = Vec<Charge>> {
    let params =
        (1u64..=1_500_000, 1u64..=3, 0u64..=400_000).prop_map(|(increment_us, burst, extra_us)| {
            (increment_us, increment_us * burst + extra_us)
        });
    (
        prop::sample::subsequence(universe_buckets(), 0..=3),
        prop::collection::vec(params, 3),
    )
        .prop_map(|(buckets, params)| {
            buckets
                .into_iter()
                .zip(params)
                .map(|(bucket, (increment_us, capacity_us))| {
                    charge(bucket, increment_us, capacity_us)
                })
                .collect()
        })
}

fn arb_claim_key() -> impl Strategy<Value = ClaimKey> {
    prop::sample::select(universe_claim_keys())
}

fn arb_hook_id() -> impl Strategy<Value = HookId> {
    prop::sample::select(HOOKS.to_vec()).prop_map(HookId::from)
}

fn arb_claim() -> impl Strategy<Value = ClaimRequest> {
    (arb_claim_key(), arb_hook_id(), 1u64..=8_000, 1u64..=5_000).prop_map(
        |(key, hook_id, ttl_ms, pending_ttl_ms)| ClaimRequest {
            key,
            hook_id,
            ttl_ms,
            pending_ttl_ms,
        },
    )
}

fn arb_command() -> impl Strategy<Value = Command> {
    let node = prop::sample::select(NODES.to_vec());
    let outcome = prop_oneof![Just(SettleOutcome::Commit), Just(SettleOutcome::Release)];
    prop_oneof![
        5 => (arb_charges(), prop::option::weighted(0.7, arb_claim()), node.clone())
            .prop_map(|(charges, claim, node)| Command::Hit { charges, claim, node }),
        1 => arb_charges().prop_map(|charges| Command::ProbeCharges { charges }),
        1 => arb_charges().prop_map(|charges| Command::Absorb { charges }),
        // Few round numbers, so the same round and older ones come again.
        1 => (arb_charges(), node.clone(), 1u64..=4).prop_map(|(charges, node, round)| {
            Command::AbsorbRound { node, round, charges }
        }),
        1 => (arb_claim_key(), arb_hook_id(), 1u64..=8_000, node.clone()).prop_map(
            |(key, hook_id, ttl_ms, node)| Command::ReconcileCommit {
                key,
                hook_id,
                ttl_ms,
                node,
            }
        ),
        4 => (arb_claim_key(), arb_hook_id(), outcome, 1u64..=8_000, node).prop_map(
            |(key, hook_id, outcome, ttl_ms, node)| Command::Settle {
                key,
                hook_id,
                outcome,
                ttl_ms,
                node,
            }
        ),
        1 => prop::sample::select(TENANTS.to_vec())
            .prop_map(|tenant| Command::Reset { tenant: TenantId::from(tenant) }),
    ]
}

/// How far an entry's stamp is from the clock: mostly 0..=3 s ahead (0 included), now and
/// then up to 1 s behind (a new leader whose wall clock lags).
fn arb_step_us() -> impl Strategy<Value = i64> {
    prop_oneof![
        2 => Just(0i64),
        8 => 0i64..=3_000_000,
        1 => -1_000_000i64..0,
    ]
}

/// One log entry: its stamp relative to the clock, and up to three commands.
fn arb_entries(min_len: usize) -> impl Strategy<Value = Vec<(i64, Vec<Command>)>> {
    prop::collection::vec(
        (arb_step_us(), prop::collection::vec(arb_command(), 0..=3)),
        min_len..40,
    )
}

fn stamp_us(clock_us: u64, step_us: i64) -> u64 {
    clock_us.max(T0_US).saturating_add_signed(step_us)
}

proptest! {
    /// Also while a snapshot holds the state frozen for a stretch of the entries (changes
    /// and expiries then go through the maps' overlays), while it thaws in steps of
    /// `thaw_step` items between entries, and after.
    #[test]
    fn rules_agree_with_the_reference_model(
        entries in arb_entries(1),
        freeze_at in any::<prop::sample::Index>(),
        frozen_for in 0usize..40,
        thaw_step in 1usize..4,
    ) {
        let mut state = FleetState::default();
        let mut model = Model::default();
        let freeze_at = freeze_at.index(entries.len());
        let mut frozen = None;
        let mut thawing = false;
        for (i, (step_us, commands)) in entries.iter().enumerate() {
            if i == freeze_at {
                frozen = Some(state.freeze());
            }
            if i == freeze_at + frozen_for {
                frozen = None;
                thawing = true;
            }
            if thawing {
                thawing = !state.thaw_some(thaw_step);
            }
            let now_us = stamp_us(model.clock_us, *step_us);
            let got = apply_batch(&mut state, commands, now_us);
            let want = model.apply_batch(commands, now_us);
            prop_assert_eq!(got, want, "entry {:?} at {}", commands, now_us);
            prop_assert_eq!(state.clock_us(), model.clock_us);
            for bucket in universe_buckets() {
                prop_assert_eq!(
                    state.bucket_tat_us(&bucket),
                    model.bucket_tat_us(&bucket),
                    "{:?}",
                    bucket
                );
            }
            for key in universe_claim_keys() {
                prop_assert_eq!(state.claim(&key), model.claim(&key), "{:?}", key);
            }
        }
        drop(frozen);
        while !state.thaw_some(FleetState::THAW_STEP_ITEMS) {}
        let last_us = model.last_deadline_us();
        prop_assert_eq!(apply_batch(&mut state, &[], last_us), vec![]);
        prop_assert!(state.is_empty(), "stored {:?} at {}", state.len(), last_us);
        prop_assert_eq!(state.image().clock_us, last_us);
    }

    #[test]
    fn a_snapshot_mid_way_answers_like_the_original(
        entries in arb_entries(2),
        split in any::<prop::sample::Index>(),
    ) {
        let (before, after) = entries.split_at(split.index(entries.len()));
        let mut state = FleetState::default();
        for (step_us, commands) in before {
            let now_us = stamp_us(state.clock_us(), *step_us);
            apply_batch(&mut state, commands, now_us);
        }
        let mut restored = FleetState::from_image(state.image());
        prop_assert_eq!(restored.clock_us(), state.clock_us());
        prop_assert_eq!(sorted_image(&restored), sorted_image(&state));
        for (step_us, commands) in after {
            let now_us = stamp_us(state.clock_us(), *step_us);
            let original = apply_batch(&mut state, commands, now_us);
            let copy = apply_batch(&mut restored, commands, now_us);
            prop_assert_eq!(original, copy, "entry {:?} at {}", commands, now_us);
            prop_assert_eq!(sorted_image(&restored), sorted_image(&state));
        }
    }
}
