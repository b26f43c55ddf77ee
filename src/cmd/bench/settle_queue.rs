//! `ankusa-fleet bench-settle-queue`: what writing one queued settle to the disk costs, the
//! settle queue's journal against the way the queue was kept before (a sled tree in
//! `state.sled`, made durable by `SledDisk::flush_to_disk`), side by side: each round
//! writes one settle each way, one after the other, into a scratch data dir whose sled
//! store also holds `--snapshot-mib` of snapshot-sized values, as a node's does. With
//! `--disk-load`, a thread appends 64 KiB and `fdatasync`s a file of its own in a loop
//! meanwhile, as the other nodes' logs on the same disk do.

use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use hdrhistogram::Histogram;
use serde::Serialize;

use crate::codec;
use crate::local::settle_queue::{QueuedSettle, SettleQueue};
use crate::state::{ClaimKey, SettleOutcome};
use crate::storage::layout::{SETTLE_QUEUE_JOURNAL, STATE_SLED_DIR};
use crate::storage::sled_disk::SledDisk;
use crate::storage::RemovedOnDrop;

/// What to measure.
#[derive(Clone, Debug, clap::Args)]
pub struct SettleQueueBenchPlan {
    /// Settles written each way.
    #[arg(long, default_value_t = 300)]
    pub settles: u64,
    /// Snapshot-sized values (1 MiB each) in the sled store beside the old queue's tree.
    #[arg(long, default_value_t = 64)]
    pub snapshot_mib: u64,
    /// Another writer on the same disk meanwhile (64 KiB appends, each fdatasynced).
    #[arg(long)]
    pub disk_load: bool,
    /// Where the scratch data dir goes (removed afterwards).
    #[arg(long, default_value_os_t = std::env::temp_dir())]
    pub scratch_dir: PathBuf,
}

/// One way's latencies, in milliseconds.
#[derive(Clone, Debug, Serialize)]
pub struct Latencies {
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
}

/// The whole run.
#[derive(Clone, Debug, Serialize)]
pub struct SettleQueueBenchSummary {
    pub settles: u64,
    pub snapshot_mib: u64,
    pub disk_load: bool,
    /// The settle queue's journal: append, then wait for its sync.
    pub journal: Latencies,
    /// The queue before it: a sled tree insert, then `SledDisk::flush_to_disk`.
    pub sled_flush: Latencies,
}

/// Runs the plan.
///
/// # Errors
/// When the scratch data dir cannot be made, written or synced.
pub async fn run(plan: &SettleQueueBenchPlan) -> anyhow::Result<SettleQueueBenchSummary> {
    let dir = plan
        .scratch_dir
        .join(format!("ankusa-bench-settle-queue-{}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let _scratch = RemovedOnDrop(dir.clone());
    let disk = SledDisk::open(&dir.join(STATE_SLED_DIR), 64 << 20)?;
    let snapshot = disk.db().open_tree("snapshots")?;
    for chunk in 0..plan.snapshot_mib {
        snapshot.insert(chunk.to_be_bytes(), vec![0x5a; 1 << 20])?;
    }
    disk.flush_to_disk()?;
    let queue = SettleQueue::open(&dir.join(SETTLE_QUEUE_JOURNAL), &disk)?;
    // A tree of its own name: the queue would move one called `settle_queue`.
    let old_tree = disk.db().open_tree("settle_queue_as_before")?;

    let stop = Arc::new(AtomicBool::new(false));
    let load = plan
        .disk_load
        .then(|| {
            let (stop, path) = (stop.clone(), dir.join("neighbour.log"));
            std::thread::Builder::new()
                .name("disk-load".to_owned())
                .spawn(move || neighbour(&path, &stop))
        })
        .transpose()?;

    let mut journal = Histogram::<u64>::new(3)?;
    let mut sled_flush = Histogram::<u64>::new(3)?;
    for seq in 0..plan.settles {
        let settle = settle(seq);
        let started = Instant::now();
        queue.push(&settle).await?;
        journal.record(micros(started))?;

        let started = Instant::now();
        old_tree.insert(seq.to_be_bytes(), codec::encode(&settle)?)?;
        let flushed = disk.clone();
        tokio::task::spawn_blocking(move || flushed.flush_to_disk()).await??;
        sled_flush.record(micros(started))?;
    }
    stop.store(true, Ordering::Relaxed);
    if let Some(load) = load {
        load.join()
            .map_err(|_| anyhow::anyhow!("the disk-load thread panicked"))??;
    }
    Ok(SettleQueueBenchSummary {
        settles: plan.settles,
        snapshot_mib: plan.snapshot_mib,
        disk_load: plan.disk_load,
        journal: latencies(&journal),
        sled_flush: latencies(&sled_flush),
    })
}

fn settle(seq: u64) -> QueuedSettle {
    QueuedSettle {
        key: ClaimKey {
            tenant: "acme".into(),
            source_id: "stripe".into(),
            key: format!("evt_{seq:012}").into(),
        },
        hook_id: format!("hook-{seq:012}").as_str().into(),
        outcome: SettleOutcome::Commit,
        ttl_ms: 86_400_000,
    }
}

fn micros(since: Instant) -> u64 {
    u64::try_from(since.elapsed().as_micros()).unwrap_or(u64::MAX)
}

fn latencies(histogram: &Histogram<u64>) -> Latencies {
    let ms = |us: u64| us as f64 / 1e3;
    Latencies {
        p50_ms: ms(histogram.value_at_quantile(0.5)),
        p99_ms: ms(histogram.value_at_quantile(0.99)),
        max_ms: ms(histogram.max()),
    }
}

/// Another node's log on the same disk: 64 KiB appends, each fdatasynced, until `stop`.
fn neighbour(path: &std::path::Path, stop: &AtomicBool) -> std::io::Result<()> {
    let mut file = std::fs::File::create(path)?;
    let block = vec![0xa5; 64 << 10];
    while !stop.load(Ordering::Relaxed) {
        file.write_all(&block)?;
        file.sync_data()?;
    }
    Ok(())
}
