//! `ankusa-fleet bench-snapshot`: what one snapshot costs on this machine, apart from a
//! fleet. It builds a state of `--claims` pending claims (and `--tenants` buckets) through
//! the state machine's own rules, then per round: encodes it as a node does
//! (`snapshot::encode_live`), stores it as a node does (its file and the sled record naming
//! it, kept across rounds, so the previous generation is there to replace), and reads
//! it back into a state as a restart or an install does. Between the freeze and the encode
//! `--changes` new claims go in, as apply goes on during a node's encode, and the overlay
//! they make is folded back in the node's steps, each timed. CPU time is the process's, so
//! sled's own threads count.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;
use serde::Serialize;

use crate::raft::snapshot;
use crate::raft::snapshot::store;
use crate::raft::{SnapshotMeta, StoredMembership};
use crate::state::{
    rules, BucketKey, Charge, ClaimKey, ClaimRequest, Command, FleetState, HookId, Kind, SourceId,
    TenantId,
};
use crate::storage::sled_disk::SledDisk;
use crate::storage::RemovedOnDrop;

/// What to measure.
#[derive(Clone, Debug, clap::Args)]
pub struct SnapshotBenchPlan {
    /// Pending claims in the state.
    #[arg(long, default_value_t = 300_000)]
    pub claims: usize,
    /// Tenants (one hooks bucket each) the claims are spread over.
    #[arg(long, default_value_t = 1_000)]
    pub tenants: usize,
    /// New claims applied while each round's copy is frozen (they stay in the state, so
    /// each round's snapshot is larger than the one before).
    #[arg(long, default_value_t = 0)]
    pub changes: usize,
    /// Snapshots taken one after another.
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    /// Where the scratch sled database goes (removed afterwards).
    #[arg(long, default_value_os_t = std::env::temp_dir())]
    pub scratch_dir: PathBuf,
}

/// One snapshot's costs.
#[derive(Clone, Debug, Serialize)]
pub struct SnapshotRound {
    pub snapshot_bytes: u64,
    pub encode_cpu_ms: f64,
    pub encode_ns_per_byte: f64,
    pub store_cpu_ms: f64,
    pub store_wall_ms: f64,
    pub store_ns_per_byte: f64,
    /// Read back from sled, checked and decoded into a state.
    pub load_cpu_ms: f64,
    /// The overlay folded back in steps of `FleetState::THAW_STEP_ITEMS`, as apply does
    /// one a batch: their number, their sum (about what one fold at once would hold the
    /// state's lock) and the longest (what one batch's apply adds).
    pub thaw_steps: usize,
    pub thaw_total_ms: f64,
    pub thaw_step_max_ms: f64,
}

/// The whole run.
#[derive(Clone, Debug, Serialize)]
pub struct SnapshotBenchSummary {
    pub claims: usize,
    pub tenants: usize,
    pub rounds: Vec<SnapshotRound>,
}

fn process_cpu_s() -> f64 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec, which `now` is, and reads nothing else.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut now) };
    if rc != 0 {
        return f64::NAN;
    }
    now.tv_sec as f64 + now.tv_nsec as f64 * 1e-9
}

/// Runs `work`, returning its result with the process CPU and wall time it took, in ms.
fn timed<T>(work: impl FnOnce() -> T) -> (T, f64, f64) {
    let (wall, cpu) = (Instant::now(), process_cpu_s());
    let out = work();
    (
        out,
        (process_cpu_s() - cpu) * 1e3,
        wall.elapsed().as_secs_f64() * 1e3,
    )
}

/// A state like the benchmark's after `claims` hits: one hooks charge and one pending claim
/// with its own key per hit.
fn build_state(claims: usize, tenants: usize) -> FleetState {
    let mut state = FleetState::default();
    add_claims(&mut state, 0..claims, tenants);
    state
}

/// Applies one such hit for each of `ids`, each with a claim key of its own.
fn add_claims(state: &mut FleetState, ids: std::ops::Range<usize>, tenants: usize) {
    let tenants = tenants.max(1);
    let mut batch = Vec::with_capacity(512);
    for i in ids {
        let tenant = TenantId(format!("tenant-{:06}", i % tenants).into());
        batch.push(Command::Hit {
            charges: vec![Charge {
                bucket: BucketKey::Tenant {
                    kind: Kind::Hooks,
                    tenant: tenant.clone(),
                },
                increment_us: 1,
                capacity_us: 1_000_000_000,
            }],
            claim: Some(ClaimRequest {
                key: ClaimKey {
                    tenant,
                    source_id: SourceId("stripe".into()),
                    key: format!("evt_{i:012}").into(),
                },
                hook_id: HookId(format!("hook-{i:012}").into()),
                ttl_ms: 86_400_000,
                pending_ttl_ms: 3_600_000,
            }),
            node: 1,
        });
        if batch.len() == batch.capacity() {
            rules::apply_batch(state, &batch, 1_000_000);
            batch.clear();
        }
    }
    rules::apply_batch(state, &batch, 1_000_000);
}

/// Folds `state`'s overlays back in as a node does; (steps, total ms, longest step ms).
fn thaw_in_steps(state: &mut FleetState) -> (usize, f64, f64) {
    let (mut steps, mut total_ms, mut step_max_ms) = (0, 0.0_f64, 0.0_f64);
    loop {
        let started = Instant::now();
        let done = state.thaw_some(FleetState::THAW_STEP_ITEMS);
        let ms = started.elapsed().as_secs_f64() * 1e3;
        steps += 1;
        total_ms += ms;
        step_max_ms = step_max_ms.max(ms);
        if done {
            return (steps, total_ms, step_max_ms);
        }
    }
}

/// Runs the plan.
///
/// # Errors
/// When the scratch database cannot be made or a snapshot does not read back.
pub fn run(plan: &SnapshotBenchPlan) -> anyhow::Result<SnapshotBenchSummary> {
    let mut state = build_state(plan.claims, plan.tenants);
    let dir = plan
        .scratch_dir
        .join(format!("ankusa-bench-snapshot-{}", std::process::id()));
    // A real database (synced to the disk like a node's), removed at the end: the guard is
    // dropped after the database.
    let _scratch = RemovedOnDrop(dir.clone());
    // Laid out as a data dir: the snapshot's file goes beside the sled store, in `dir` too.
    let sled_dir = dir.join(crate::storage::layout::STATE_SLED_DIR);
    let db = SledDisk::open(&sled_dir, 64 << 20)
        .with_context(|| format!("opening a scratch sled database in {}", sled_dir.display()))?;
    let tree = db
        .db()
        .open_tree(crate::raft::snapshot::store::SNAPSHOT_TREE)?;
    let files = store::files_dir(&db);
    let membership = StoredMembership::default();
    let mut rounds = Vec::with_capacity(plan.rounds);
    for round in 0..plan.rounds {
        let frozen = state.freeze();
        let first_new = plan.claims + round * plan.changes;
        add_claims(
            &mut state,
            first_new..first_new + plan.changes,
            plan.tenants,
        );
        let (data, encode_cpu_ms, _) = timed(|| snapshot::encode_live(None, &membership, &frozen));
        drop(frozen);
        let (thaw_steps, thaw_total_ms, thaw_step_max_ms) = thaw_in_steps(&mut state);
        let data = data?;
        let meta = SnapshotMeta {
            last_log_id: None,
            last_membership: membership.clone(),
            snapshot_id: format!("bench-{round}"),
        };
        let (stored, store_cpu_ms, store_wall_ms) =
            timed(|| store::write(&tree, &db, &files, &meta, &data));
        anyhow::ensure!(stored?, "the snapshot was not stored");
        let (loaded, load_cpu_ms, _) = timed(|| -> anyhow::Result<FleetState> {
            let stored =
                store::read(&tree, &files)?.context("the snapshot just stored is missing")?;
            let body = snapshot::decode(&stored.data)?;
            Ok(FleetState::from_image(body.image))
        });
        drop(loaded?);
        let bytes = data.len() as u64;
        let per_byte = |ms: f64| ms * 1e6 / bytes.max(1) as f64;
        rounds.push(SnapshotRound {
            snapshot_bytes: bytes,
            encode_cpu_ms,
            encode_ns_per_byte: per_byte(encode_cpu_ms),
            store_cpu_ms,
            store_wall_ms,
            store_ns_per_byte: per_byte(store_cpu_ms),
            load_cpu_ms,
            thaw_steps,
            thaw_total_ms,
            thaw_step_max_ms,
        });
        eprintln!(
            "round {round}: {:.1} MB, encode {encode_cpu_ms:.0} ms CPU, store {store_cpu_ms:.0} ms CPU \
             ({store_wall_ms:.0} ms wall), load {load_cpu_ms:.0} ms CPU, thaw {thaw_total_ms:.1} ms \
             in {thaw_steps} steps (longest {thaw_step_max_ms:.2} ms)",
            bytes as f64 / 1e6
        );
    }
    Ok(SnapshotBenchSummary {
        claims: plan.claims,
        tenants: plan.tenants,
        rounds,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_round_stores_and_reads_back_the_same_snapshot() {
        let dir = tempfile::tempdir().expect("tempdir");
        let plan = SnapshotBenchPlan {
            claims: 2_000,
            tenants: 10,
            changes: 5_000,
            rounds: 2,
            scratch_dir: dir.path().to_path_buf(),
        };
        let summary = run(&plan).expect("run");
        assert_eq!(summary.rounds.len(), 2);
        let [first, second] = &summary.rounds[..] else {
            unreachable!("two rounds")
        };
        // 2000 claims with keys and hook ids of 16+ bytes each cannot fit in less.
        assert!(first.snapshot_bytes > 2_000 * 32, "{first:?}");
        // The second holds the first round's changes too: 5000 claims more.
        assert!(
            second.snapshot_bytes > first.snapshot_bytes + 5_000 * 32,
            "{second:?}"
        );
        // 5000 new claims and their 10 buckets' changes: two steps at least for the claims.
        assert!(first.thaw_steps >= 2, "{first:?}");
    }
}
