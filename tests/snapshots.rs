//! When a node snapshots (docs/architecture.md, "Snapshots"): the first snapshot waits for
//! `snapshot_logs_since_last` entries, every later one also for log as large as the last
//! snapshot (`snapshot_log_percent = 100`). A state that grows with its log is then
//! snapshotted less and less often, where counting entries alone would encode all of it
//! again every `snapshot_logs_since_last` entries.

mod common;

use common::*;

const TENANT: &str = "acme";
/// Entries alone would make a snapshot every 10 entries.
const LOGS_SINCE_LAST: u64 = 10;
const CONFIG: &str = "snapshot_logs_since_last = 10\nsnapshot_log_percent = 100";
const LOG_BYTES: &str = "ankusa_log_bytes_since_snapshot";
/// Claims the test writes: ~160 entries. A claim's state is ~0.4 of its log, so under the
/// rule the gaps between snapshots grow to ~0.4 of their index (~35 entries by the end);
/// counted alone they would stay at 10.
const CLAIMS: usize = 80;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_later_snapshot_waits_for_log_as_large_as_the_last_one() {
    init_tracing();
    let fleet = Fleet::start(3, CONFIG).await;
    let leader = fleet.wait_for_leader(&[1, 2, 3]).await;
    let log_bytes = || fleet.metric(leader, LOG_BYTES);
    let mut seen = fleet
        .wait_for("the leader's snapshot policy ran", || async {
            log_bytes().await
        })
        .await;

    // One claim (a hit and a settle: two entries) at a time, each time until the leader's
    // policy has looked at the log again: it sees the log grow entry by entry, so what
    // decides when a snapshot comes is the rule, not how fast the test writes. Each claim
    // keeps a 200-byte key in the state, so the state grows with the log.
    let long = "k".repeat(200);
    let mut claim_log_bytes_max = 0.0_f64;
    for key in &keys(&long, CLAIMS) {
        let before = fleet.snapshots_built(leader).len();
        fleet
            .commit_claims(&[leader], TENANT, std::slice::from_ref(key), 1)
            .await;
        // The gauge moves, or the policy built a snapshot (after which the gauge may read as
        // before by chance).
        let (now, snapshotted) = fleet
            .wait_for("the leader's policy saw the new entries", || async {
                let bytes = log_bytes().await?;
                let snapshotted = fleet.snapshots_built(leader).len() > before;
                (bytes != seen || snapshotted).then_some((bytes, snapshotted))
            })
            .await;
        if !snapshotted && now > seen {
            claim_log_bytes_max = claim_log_bytes_max.max(now - seen);
        }
        seen = now;
    }
    let built = fleet.snapshots_built(leader);
    tracing::info!(
        ?built,
        claim_log_bytes_max,
        "snapshots on the leader (index, bytes)"
    );
    assert!(
        built.len() >= 3,
        "{} snapshots after {CLAIMS} claims ({built:?})",
        built.len()
    );
    assert!(claim_log_bytes_max > 0.0, "no claim's log was measured");

    for pair in built.windows(2) {
        let ((before, size), (after, _)) = (pair[0], pair[1]);
        // The log between them is at least the earlier snapshot's size: at most
        // `claim_log_bytes_max` per claim, two entries per claim, one more for slack.
        let claims = (after - before) as f64 / 2.0 + 1.0;
        assert!(
            claims * claim_log_bytes_max >= size as f64,
            "a snapshot at {after} came {} entries after one of {size} bytes at {before}, \
             with at most {claim_log_bytes_max} log bytes per claim ({built:?})",
            after - before
        );
    }
    // And that rule, not the count, set the pace: as the state grew, a gap grew well past
    // the 10 entries counting alone would allow.
    let widest = built.windows(2).map(|pair| pair[1].0 - pair[0].0).max();
    assert!(
        widest >= Some(3 * LOGS_SINCE_LAST),
        "no gap between snapshots reached {} entries ({built:?})",
        3 * LOGS_SINCE_LAST
    );
}
