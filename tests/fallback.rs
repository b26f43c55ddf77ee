//! Local fallback faults (SPEC section 7): a node cut off from the fleet (isolated by
//! transport fault rules, its peers killed, started alone, or behind a paused leader)
//! still answers every call within its deadline, decided `local`; what it decided alone
//! (claims, queued settles, charges) reaches the fleet once a leader is reachable, also
//! across a kill -9 of that node.
//!
//! Every hit with a claim goes through a [`Journal`]: no `duplicate` may ever be answered
//! for a key whose commit was not acknowledged before the hit was sent (a duplicate is a
//! 2xx to the provider; a 2xx for a hook nobody stored is a lost webhook). Keys are unique
//! per hit, except keys deliberately hit again after their commit, so the check can fail.

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ankusa_fleet::pb;
use ankusa_fleet::pb::fleet_client::FleetClient;
use ankusa_fleet::pb::internal::FaultKind;
use common::*;
use futures::StreamExt;
use tokio::time::Instant;
use tonic::transport::Channel;

const FAULTS: &str = "fault_injection = true";
/// What a local answer may take beyond its timeout_ms, seen from the test process (gRPC both
/// ways, a sled write, a flush for a queued settle). Measured on a loaded 2-core debug build
/// (two tests at once, other builds running): usually 5-75 ms over, once 301 ms.
const LOCAL_MARGIN_MS: u64 = 500;
/// The hook id the probes use: another hook than the stored one, so a lost claim shows.
const PROBE_HOOK: &str = "hook-probe";

// ---- the journal: every claim hit and every acknowledged commit, with times ----

#[derive(Clone, Debug)]
struct HitRecord {
    node: u64,
    key: String,
    sent_at: Instant,
    answer: Outcome,
}

#[derive(Default)]
struct Entries {
    hits: Vec<HitRecord>,
    /// key → (hook id, when its commit was acknowledged).
    commits: HashMap<String, Vec<(String, Instant)>>,
}

/// Hits and commit acknowledgements of one test, shared by its concurrent callers.
#[derive(Clone, Default)]
struct Journal {
    entries: Arc<Mutex<Entries>>,
}

fn journal_key(tenant: &str, source_id: &str, key: &str) -> String {
    format!("{tenant}/{source_id}/{key}")
}

impl Journal {
    fn lock(&self) -> std::sync::MutexGuard<'_, Entries> {
        self.entries.lock().expect("journal lock")
    }

    fn record_hit(&self, node: u64, key: String, sent_at: Instant, answer: Outcome) {
        self.lock().hits.push(HitRecord {
            node,
            key,
            sent_at,
            answer,
        });
    }

    fn record_commit(&self, key: String, hook_id: String, acked_at: Instant) {
        self.lock()
            .commits
            .entry(key)
            .or_default()
            .push((hook_id, acked_at));
    }

    /// Sends a hit through node `node`; a hit with a claim is journaled.
    async fn hit(
        &self,
        client: &mut FleetClient<Channel>,
        node: u64,
        request: pb::HitRequest,
    ) -> Result<(pb::HitResponse, Duration), String> {
        let key = request
            .claim
            .as_ref()
            .map(|c| journal_key(&c.tenant, &c.source_id, &c.key));
        let sent_at = Instant::now();
        let response = client
            .hit(request)
            .await
            .map_err(|e| format!("node {node}: hit {key:?}: {e}"))?
            .into_inner();
        let elapsed = sent_at.elapsed();
        if let Some(key) = key {
            self.record_hit(node, key, sent_at, outcome(&response));
        }
        Ok((response, elapsed))
    }

    /// Sends a settle; an acknowledged commit (settled, recreated or queued) is journaled.
    async fn settle(
        &self,
        client: &mut FleetClient<Channel>,
        node: u64,
        request: pb::SettleRequest,
    ) -> Result<(pb::SettleResponse, Duration), String> {
        let key = journal_key(&request.tenant, &request.source_id, &request.key);
        let hook_id = request.hook_id.clone();
        let commit = request.outcome == pb::SettleOutcome::Commit as i32;
        let sent_at = Instant::now();
        let response = client
            .settle(request)
            .await
            .map_err(|e| format!("node {node}: settle {key}: {e}"))?
            .into_inner();
        let elapsed = sent_at.elapsed();
        let acknowledged = [
            pb::SettleStatus::Settled,
            pb::SettleStatus::Recreated,
            pb::SettleStatus::Queued,
        ]
        .iter()
        .any(|status| *status as i32 == response.status);
        if commit && acknowledged {
            self.record_commit(key, hook_id, Instant::now());
        }
        Ok((response, elapsed))
    }

    /// Every duplicate answered names a hook whose commit of that key was acknowledged
    /// before the hit was sent. Returns how many duplicates were checked.
    fn check(&self) -> Result<usize, String> {
        let entries = self.lock();
        let mut checked = 0;
        for hit in &entries.hits {
            let Outcome::Duplicate(hook_id) = &hit.answer else {
                continue;
            };
            checked += 1;
            let committed_before = entries.commits.get(&hit.key).is_some_and(|commits| {
                commits
                    .iter()
                    .any(|(hook, acked_at)| hook == hook_id && *acked_at < hit.sent_at)
            });
            if !committed_before {
                return Err(format!(
                    "node {} answered duplicate{{{hook_id}}} for {} with no commit of that \
                     hook acknowledged before the hit was sent",
                    hit.node, hit.key
                ));
            }
        }
        Ok(checked)
    }
}

/// Asserts the journal check, and that it saw duplicates (so it could have failed).
fn assert_journal(fleet: &Fleet, journal: &Journal) {
    match journal.check() {
        Ok(0) => fleet.fail("the journal saw no duplicate: its check proved nothing"),
        Ok(checked) => tracing::info!(checked, "journal: every duplicate followed its commit"),
        Err(e) => fleet.fail(&e),
    }
}

#[test]
fn the_journal_check_catches_a_duplicate_without_an_earlier_commit() {
    let start = Instant::now();
    let later = start + Duration::from_millis(5);
    let duplicate = Outcome::Duplicate(hook_of("k"));

    let journal = Journal::default();
    journal.record_commit("t/s/k".into(), hook_of("k"), start);
    journal.record_hit(1, "t/s/k".into(), later, duplicate.clone());
    assert_eq!(journal.check(), Ok(1), "commit acknowledged before the hit");

    let journal = Journal::default();
    journal.record_hit(1, "t/s/k".into(), start, duplicate.clone());
    journal.record_commit("t/s/k".into(), hook_of("k"), later);
    assert!(
        journal.check().is_err(),
        "commit acknowledged after the hit"
    );

    let journal = Journal::default();
    journal.record_commit("t/s/k".into(), "hook-other".into(), start);
    journal.record_hit(1, "t/s/k".into(), later, duplicate.clone());
    assert!(journal.check().is_err(), "another hook was committed");

    let journal = Journal::default();
    journal.record_commit("t/s/other".into(), hook_of("k"), start);
    journal.record_hit(1, "t/s/k".into(), later, duplicate);
    assert!(journal.check().is_err(), "another key was committed");
}

/// A 3-node fleet (with `extra` config lines) of which only one follower is left running:
/// no quorum. The fleet is returned to keep that node alive.
async fn a_follower_left_alone(extra: &str) -> (Fleet, u64) {
    let mut fleet = Fleet::start(3, extra).await;
    let leader = fleet.wait_for_leader(&[1, 2, 3]).await;
    let survivor = (1..=3).find(|id| *id != leader).expect("a follower");
    tracing::info!("--- only node {survivor} is left: no quorum");
    for id in (1..=3).filter(|id| *id != survivor) {
        fleet.kill(id);
    }
    (fleet, survivor)
}

// ---- requests ----

/// A charge these tests never exhaust (a burst of 3.6 million, fair share included), so
/// local grants reach the charge ledger without ever denying.
fn roomy_charge(tenant: &str) -> pb::Charge {
    hooks(tenant, 1_000, 3_600_000_000)
}

fn claim_hit(tenant: &str, key: &str, hook_id: &str, timeout_ms: u32) -> pb::HitRequest {
    pb::HitRequest {
        timeout_ms,
        ..hit(
            vec![roomy_charge(tenant)],
            Some(claim(tenant, key, hook_id)),
        )
    }
}

fn commit(tenant: &str, key: &str, timeout_ms: u32) -> pb::SettleRequest {
    pb::SettleRequest {
        timeout_ms,
        ..settle(tenant, key, &hook_of(key), pb::SettleOutcome::Commit)
    }
}

fn decided(response_decided_by: i32) -> &'static str {
    match pb::DecidedBy::try_from(response_decided_by) {
        Ok(pb::DecidedBy::Fleet) => "fleet",
        Ok(pb::DecidedBy::Local) => "local",
        _ => "unspecified",
    }
}

/// The bound on a call answered at its deadline.
fn within_deadline(elapsed: Duration, timeout_ms: u32) -> bool {
    elapsed <= Duration::from_millis(u64::from(timeout_ms) + LOCAL_MARGIN_MS)
}

// ---- phases shared by the tests ----

/// A node answering locally: its calls, journaled, each with `timeout_ms`.
struct CutOff<'a> {
    fleet: &'a Fleet,
    journal: &'a Journal,
    id: u64,
    tenant: &'a str,
    timeout_ms: u32,
}

impl CutOff<'_> {
    /// Each key is claimed (for `hook_id`, or its own hook when `None`) and answered
    /// `expected`, decided locally with a non-empty local_reason, within its deadline.
    /// Returns the latencies.
    async fn hit(
        &self,
        keys: &[String],
        hook_id: Option<&str>,
        expected: impl Fn(&str) -> Outcome,
    ) -> Vec<Duration> {
        let (fleet, id) = (self.fleet, self.id);
        let mut client = fleet.client(id).await;
        let mut latencies = Vec::new();
        for key in keys {
            let hook = hook_id.map_or_else(|| hook_of(key), str::to_owned);
            let request = claim_hit(self.tenant, key, &hook, self.timeout_ms);
            let (response, elapsed) = self
                .journal
                .hit(&mut client, id, request)
                .await
                .unwrap_or_else(|e| fleet.fail(&e));
            let got = (outcome(&response), decided(response.decided_by));
            if got != (expected(key), "local") || response.local_reason.is_empty() {
                fleet.fail(&format!(
                    "node {id}: hit {key} answered {got:?} reason {:?}, expected {:?} local",
                    response.local_reason,
                    expected(key)
                ));
            }
            if !within_deadline(elapsed, self.timeout_ms) {
                fleet.fail(&format!(
                    "node {id}: hit {key} took {elapsed:?} with timeout_ms {}",
                    self.timeout_ms
                ));
            }
            latencies.push(elapsed);
        }
        latencies
    }

    /// Each key is claimed for its own hook and allowed locally.
    async fn claim(&self, keys: &[String]) -> Vec<Duration> {
        self.hit(keys, None, |_| Outcome::Allowed).await
    }

    /// A probe of each key (another hook) answers duplicate{its hook} locally.
    async fn probe_duplicates(&self, keys: &[String]) -> Vec<Duration> {
        self.hit(keys, Some(PROBE_HOOK), |key| {
            Outcome::Duplicate(hook_of(key))
        })
        .await
    }

    /// Each key's commit is answered `queued`, decided locally, within its deadline.
    async fn commit(&self, keys: &[String]) {
        let (fleet, id) = (self.fleet, self.id);
        let mut client = fleet.client(id).await;
        for key in keys {
            let (response, elapsed) = self
                .journal
                .settle(&mut client, id, commit(self.tenant, key, self.timeout_ms))
                .await
                .unwrap_or_else(|e| fleet.fail(&e));
            let got = (response.status, decided(response.decided_by));
            if got != (pb::SettleStatus::Queued as i32, "local") {
                fleet.fail(&format!(
                    "node {id}: commit {key} answered {got:?}, expected queued local"
                ));
            }
            if !within_deadline(elapsed, self.timeout_ms) {
                fleet.fail(&format!(
                    "node {id}: commit {key} took {elapsed:?} with timeout_ms {}",
                    self.timeout_ms
                ));
            }
        }
    }
}

/// Claims and commits each key through the fleet, round robin over `via`.
async fn commit_through_fleet(
    fleet: &Fleet,
    journal: &Journal,
    via: &[u64],
    tenant: &str,
    keys: &[String],
) {
    let mut clients = Vec::new();
    for id in via {
        clients.push((*id, fleet.client(*id).await));
    }
    for (i, key) in keys.iter().enumerate() {
        let (id, client) = &mut clients[i % via.len()];
        let request = claim_hit(tenant, key, &hook_of(key), CALL_TIMEOUT_MS);
        let (response, _) = journal
            .hit(client, *id, request)
            .await
            .unwrap_or_else(|e| fleet.fail(&e));
        let got = (outcome(&response), decided(response.decided_by));
        if got != (Outcome::Allowed, "fleet") {
            fleet.fail(&format!("node {id}: hit {key} answered {got:?}"));
        }
        let (settled, _) = journal
            .settle(client, *id, commit(tenant, key, CALL_TIMEOUT_MS))
            .await
            .unwrap_or_else(|e| fleet.fail(&e));
        let got = (settled.status, decided(settled.decided_by));
        if got != (pb::SettleStatus::Settled as i32, "fleet") {
            fleet.fail(&format!("node {id}: commit {key} answered {got:?}"));
        }
    }
}

/// Through every node in `ids`, a probe of each key (another hook id) is answered as
/// `expected` says, decided by the fleet.
async fn probe_everywhere(
    fleet: &Fleet,
    journal: &Journal,
    ids: &[u64],
    tenant: &str,
    keys: &[String],
    what: &str,
    expected: impl Fn(&str, &Outcome) -> bool,
) {
    for id in ids {
        let client = fleet.client(*id).await;
        let answers: Vec<Result<(String, Outcome, i32), String>> =
            futures::stream::iter(keys.iter().map(|key| {
                let mut client = client.clone();
                let request = claim_hit(tenant, key, PROBE_HOOK, CALL_TIMEOUT_MS);
                async move {
                    let (response, _) = journal.hit(&mut client, *id, request).await?;
                    Ok((key.clone(), outcome(&response), response.decided_by))
                }
            }))
            .buffer_unordered(8)
            .collect()
            .await;
        for answer in answers {
            let (key, got, decided_by) = answer.unwrap_or_else(|e| fleet.fail(&e));
            if !expected(&key, &got) || decided(decided_by) != "fleet" {
                fleet.fail(&format!(
                    "node {id}: {key} answered {got:?} decided {}, expected {what} from the fleet",
                    decided(decided_by)
                ));
            }
        }
    }
}

async fn assert_duplicates_everywhere(
    fleet: &Fleet,
    journal: &Journal,
    ids: &[u64],
    tenant: &str,
    keys: &[String],
) {
    probe_everywhere(
        fleet,
        journal,
        ids,
        tenant,
        keys,
        "duplicate",
        |key, got| *got == Outcome::Duplicate(hook_of(key)),
    )
    .await;
}

/// Node `id` says it is not degraded: a leader is known and nothing waits to be reconciled.
async fn wait_reconciled(fleet: &Fleet, id: u64) {
    fleet
        .wait_for(
            &format!("node {id} reconciled (degraded false)"),
            || async {
                let status = fleet.status(id).await?;
                (status.leader_id != 0 && !status.degraded).then_some(())
            },
        )
        .await;
}

async fn assert_degraded(fleet: &Fleet, id: u64) {
    let status = fleet
        .wait_for(&format!("node {id} answers status"), || fleet.status(id))
        .await;
    if !status.degraded {
        fleet.fail(&format!(
            "node {id} holds local decisions but is not degraded"
        ));
    }
}

/// Waits until every node in `ids` names one leader that is not `gone`.
async fn wait_for_new_leader(fleet: &Fleet, ids: &[u64], gone: u64) -> u64 {
    fleet
        .wait_for("a new leader known to every node asked", || async {
            let mut leaders = Vec::new();
            for id in ids {
                leaders.push(fleet.status(*id).await?.leader_id);
            }
            let leader = *leaders.first()?;
            (leader != 0 && leader != gone && leaders.iter().all(|l| *l == leader))
                .then_some(leader)
        })
        .await
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// p50 and max of some latencies, in ms.
fn p50_max_ms(latencies: &[Duration]) -> (u64, u64) {
    let mut sorted = latencies.to_vec();
    sorted.sort();
    let p50 = sorted.get(sorted.len() / 2).copied().unwrap_or_default();
    let max = sorted.last().copied().unwrap_or_default();
    (millis(p50), millis(max))
}

// ---- the tests ----

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_isolated_leader_answers_locally_and_reconciles_after_heal() {
    init_tracing();
    const TENANT: &str = "isolated";
    const TIMEOUT_MS: u32 = 300;
    let fleet = Fleet::start(3, FAULTS).await;
    let journal = Journal::default();
    let old_leader = fleet.wait_for_leader(&[1, 2, 3]).await;
    let majority: Vec<u64> = (1..=3).filter(|id| *id != old_leader).collect();

    tracing::info!("--- commit claims through the fleet before the partition");
    let before = keys("before", 5);
    commit_through_fleet(&fleet, &journal, &[1, 2, 3], TENANT, &before).await;
    fleet.wait_for_applied_in_step(&[1, 2, 3]).await;

    tracing::info!("--- black-hole every peer of the leader {old_leader}");
    fleet.isolate(old_leader, FaultKind::Blackhole).await;

    tracing::info!("--- the isolated node claims locally, within its deadline");
    let cut = CutOff {
        fleet: &fleet,
        journal: &journal,
        id: old_leader,
        tenant: TENANT,
        timeout_ms: TIMEOUT_MS,
    };
    let cut_committed = keys("cut-committed", 6);
    let cut_pending = keys("cut-pending", 4);
    let mut latencies = cut.claim(&cut_committed).await;
    latencies.extend(cut.claim(&cut_pending).await);

    tracing::info!(
        "--- commits there are queued; its own commits and its replica answer duplicate"
    );
    cut.commit(&cut_committed).await;
    let mut known_committed = cut_committed.clone();
    known_committed.extend(before.iter().cloned());
    latencies.extend(cut.probe_duplicates(&known_committed).await);
    let (p50_ms, max_ms) = p50_max_ms(&latencies);
    tracing::info!(
        p50_ms,
        max_ms,
        timeout_ms = TIMEOUT_MS,
        "isolated leader: local answer latency"
    );
    assert_degraded(&fleet, old_leader).await;

    tracing::info!("--- the majority {majority:?} elects a new leader and answers from the fleet");
    let new_leader = wait_for_new_leader(&fleet, &majority, old_leader).await;
    let during = keys("majority", 6);
    commit_through_fleet(&fleet, &journal, &majority, TENANT, &during).await;

    tracing::info!("--- heal; the old leader follows {new_leader} and reconciles");
    let healed_at = Instant::now();
    fleet.heal(old_leader).await;
    let leader = fleet.wait_for_leader(&[1, 2, 3]).await;
    if leader == old_leader {
        fleet.fail("the isolated old leader leads again after the heal");
    }
    wait_reconciled(&fleet, old_leader).await;
    let reconciled_ms = millis(healed_at.elapsed());
    tracing::info!(reconciled_ms, leader, "heal to reconciled");

    tracing::info!("--- its queued commits are duplicates, its claims pending, on every node");
    let mut committed = cut_committed.clone();
    committed.extend(before);
    committed.extend(during);
    assert_duplicates_everywhere(&fleet, &journal, &[1, 2, 3], TENANT, &committed).await;
    probe_everywhere(
        &fleet,
        &journal,
        &[1, 2, 3],
        TENANT,
        &cut_pending,
        "pending",
        |_, got| matches!(got, Outcome::Pending(_)),
    )
    .await;
    assert_journal(&fleet, &journal);
}

/// Hits `keys` through node `id`, `concurrency` at a time, each with `timeout_ms`; every
/// one must be allowed, decided locally. Returns the latencies.
async fn local_load(
    fleet: &Fleet,
    journal: &Journal,
    id: u64,
    tenant: &str,
    keys: &[String],
    concurrency: usize,
    timeout_ms: u32,
) -> Vec<Duration> {
    let client = fleet.client(id).await;
    let answers: Vec<Result<(String, pb::HitResponse, Duration), String>> =
        futures::stream::iter(keys.iter().map(|key| {
            let mut client = client.clone();
            let request = claim_hit(tenant, key, &hook_of(key), timeout_ms);
            async move {
                let (response, elapsed) = journal.hit(&mut client, id, request).await?;
                Ok((key.clone(), response, elapsed))
            }
        }))
        .buffer_unordered(concurrency)
        .collect()
        .await;
    let mut latencies = Vec::new();
    for answer in answers {
        let (key, response, elapsed) = answer.unwrap_or_else(|e| fleet.fail(&e));
        let got = (outcome(&response), decided(response.decided_by));
        if got != (Outcome::Allowed, "local") || response.local_reason.is_empty() {
            fleet.fail(&format!(
                "node {id}: {key} answered {got:?} reason {:?}",
                response.local_reason
            ));
        }
        latencies.push(elapsed);
    }
    latencies
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_two_nodes_down_the_survivor_answers_every_hit_within_its_deadline() {
    init_tracing();
    const TENANT: &str = "survivor";
    const TIMEOUT_MS: u32 = 50;
    const HITS: usize = 1_000;
    let mut fleet = Fleet::start(3, "").await;
    let journal = Journal::default();
    let leader = fleet.wait_for_leader(&[1, 2, 3]).await;
    // A follower survives: a leader left alone would append every hit to its log, to commit
    // late once the others return (that case is the ignored bug test below).
    let survivor = (1..=3).find(|id| *id != leader).expect("a follower");
    let down: Vec<u64> = (1..=3).filter(|id| *id != survivor).collect();

    tracing::info!("--- commit claims through the fleet, then kill -9 nodes {down:?}");
    let before = keys("before", 5);
    commit_through_fleet(&fleet, &journal, &[1, 2, 3], TENANT, &before).await;
    fleet.wait_for_applied_in_step(&[1, 2, 3]).await;
    for id in &down {
        fleet.kill(*id);
    }

    tracing::info!("--- {HITS} hits on the survivor, 25 at a time, timeout_ms {TIMEOUT_MS}");
    let load = keys("load", HITS);
    let started = Instant::now();
    let latencies = local_load(&fleet, &journal, survivor, TENANT, &load, 25, TIMEOUT_MS).await;
    let (p50_ms, max_ms) = p50_max_ms(&latencies);
    tracing::info!(
        hits = HITS,
        p50_ms,
        max_ms,
        total_ms = millis(started.elapsed()),
        timeout_ms = TIMEOUT_MS,
        "fallback answer latency"
    );
    if max_ms > u64::from(TIMEOUT_MS) + LOCAL_MARGIN_MS {
        fleet.fail(&format!(
            "slowest local answer took {max_ms} ms with timeout_ms {TIMEOUT_MS}"
        ));
    }

    tracing::info!("--- commits there are queued; duplicates locally, for its replica too");
    let cut = CutOff {
        fleet: &fleet,
        journal: &journal,
        id: survivor,
        tenant: TENANT,
        timeout_ms: TIMEOUT_MS,
    };
    let committed: Vec<String> = load.iter().step_by(50).cloned().collect();
    cut.commit(&committed).await;
    let mut known_committed = committed.clone();
    known_committed.extend(before.iter().cloned());
    cut.probe_duplicates(&known_committed).await;

    tracing::info!("--- restart nodes {down:?}; the queued commits reach the fleet");
    let restarted_at = Instant::now();
    for id in &down {
        fleet.restart(*id);
    }
    fleet.wait_for_leader(&[1, 2, 3]).await;
    wait_reconciled(&fleet, survivor).await;
    tracing::info!(
        reconciled_ms = millis(restarted_at.elapsed()),
        claims = HITS,
        "restart to reconciled"
    );
    assert_duplicates_everywhere(&fleet, &journal, &[1, 2, 3], TENANT, &committed).await;
    assert_journal(&fleet, &journal);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settles_queued_before_a_kill_9_are_applied_after_restart() {
    init_tracing();
    const TENANT: &str = "queued";
    const TIMEOUT_MS: u32 = 200;
    let mut fleet = Fleet::start(3, "").await;
    let journal = Journal::default();
    let holder = 1;
    fleet.wait_for_leader(&[1, 2, 3]).await;

    tracing::info!("--- kill -9 nodes 2 and 3; node {holder} claims and queues commits");
    fleet.kill(2);
    fleet.kill(3);
    let committed = keys("queued", 10);
    {
        let cut = CutOff {
            fleet: &fleet,
            journal: &journal,
            id: holder,
            tenant: TENANT,
            timeout_ms: TIMEOUT_MS,
        };
        cut.claim(&committed).await;
        cut.commit(&committed).await;
    }

    tracing::info!("--- kill -9 node {holder} at once, restart it alone");
    fleet.kill(holder);
    fleet.restart(holder);
    assert_degraded(&fleet, holder).await;

    tracing::info!("--- alone again, it still answers duplicate for its own queued commits");
    CutOff {
        fleet: &fleet,
        journal: &journal,
        id: holder,
        tenant: TENANT,
        timeout_ms: TIMEOUT_MS,
    }
    .probe_duplicates(&committed)
    .await;

    tracing::info!("--- restart nodes 2 and 3: the queued commits reach the fleet");
    fleet.restart(2);
    fleet.restart(3);
    fleet.wait_for_leader(&[1, 2, 3]).await;
    wait_reconciled(&fleet, holder).await;
    assert_duplicates_everywhere(&fleet, &journal, &[1, 2, 3], TENANT, &committed).await;
    assert_journal(&fleet, &journal);
}

/// SPEC 6 and 7: a commit answered `queued` is never lost, and a `duplicate` answered
/// locally leaves nothing behind in the fleet. A leader left alone (both followers killed)
/// still appends what it is asked to its log; those entries commit once the followers
/// return, after the callers were answered locally. A retry of a key with another hook,
/// answered `duplicate` locally (this node queued the key's commit), thus lands in the fleet
/// as a pending claim for the retry's hook, ahead of the queued commit, which reconciliation
/// then drops as a conflict: the stored hook's key reads `pending` for a hook nobody stored,
/// and free once that expires (pending_ttl_ms): the webhook is accepted a second time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_commit_of_a_local_duplicate_keeps_the_queued_commit() {
    init_tracing();
    const TENANT: &str = "late";
    const RETRY_TIMEOUT_MS: u32 = 3_000;
    const COMMIT_TIMEOUT_MS: u32 = 100;
    let mut fleet = Fleet::start(3, "").await;
    let leader = fleet.wait_for_leader(&[1, 2, 3]).await;
    let followers: Vec<u64> = (1..=3).filter(|id| *id != leader).collect();

    tracing::info!("--- kill -9 both followers {followers:?}: {leader} leads alone");
    for id in &followers {
        fleet.kill(*id);
    }

    tracing::info!("--- retries with another hook (timeout 3 s), then each key's commit");
    // The retries are sent first, so their commands reach the leader's log ahead of the
    // commits (which wait behind them and give up); a key whose commit got in first cannot
    // show the bug, but with ten keys most do.
    let late = keys("late", 10);
    let client = fleet.client(leader).await;
    let retries: Vec<_> = late
        .iter()
        .map(|key| {
            let mut client = client.clone();
            let request = claim_hit(TENANT, key, "hook-retry", RETRY_TIMEOUT_MS);
            tokio::spawn(async move { client.hit(request).await })
        })
        .collect();
    let mut settler = client.clone();
    for key in &late {
        let response = send_settle(&mut settler, commit(TENANT, key, COMMIT_TIMEOUT_MS)).await;
        if response.status != pb::SettleStatus::Queued as i32 {
            fleet.fail(&format!(
                "commit {key} answered {response:?}, expected queued"
            ));
        }
    }
    for (key, retry) in late.iter().zip(retries) {
        let response = retry
            .await
            .expect("retry task")
            .unwrap_or_else(|e| fleet.fail(&format!("retry {key}: {e}")))
            .into_inner();
        let got = (outcome(&response), decided(response.decided_by));
        if got != (Outcome::Duplicate(hook_of(key)), "local") {
            fleet.fail(&format!(
                "retry {key} answered {got:?}, expected local duplicate"
            ));
        }
    }

    tracing::info!("--- restart the followers: the leader's log commits, then reconciliation");
    for id in &followers {
        fleet.restart(*id);
    }
    fleet.wait_for_leader(&[1, 2, 3]).await;
    wait_reconciled(&fleet, leader).await;
    let conflicts = fleet.log_lines(leader, &["queued settle conflicts", "hook-retry"]);
    tracing::info!(
        conflicts,
        "queued commits dropped as conflicts with a retry"
    );
    assert_duplicates_everywhere(&fleet, &Journal::default(), &[1, 2, 3], TENANT, &late).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_started_alone_serves_within_one_second() {
    init_tracing();
    const TIMEOUT_MS: u32 = 100;
    /// Start-up of a debug build on a loaded machine, beyond the one second the SPEC allows.
    const START_MARGIN: Duration = Duration::from_millis(500);

    tracing::info!("--- start node 1 of a three-voter fleet whose other nodes never start");
    let spawned_at = Instant::now();
    let fleet = Fleet::start_some(3, &[1], "");
    let request = claim_hit("alone", "first", &hook_of("first"), TIMEOUT_MS);
    let deadline = spawned_at + CONDITION_DEADLINE;
    let response = loop {
        let endpoint =
            Channel::from_shared(format!("http://{}", fleet.api_addr(1))).expect("an endpoint");
        if let Ok(channel) = endpoint.connect().await {
            match FleetClient::new(channel).hit(request.clone()).await {
                Ok(response) => break response.into_inner(),
                Err(e) => tracing::info!(error = %e, "the lone node does not answer yet"),
            }
        }
        if Instant::now() > deadline {
            fleet.fail("the lone node never answered");
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    let first_answer = spawned_at.elapsed();
    tracing::info!(
        first_answer_ms = millis(first_answer),
        "spawn to first answer"
    );

    let got = (
        outcome(&response),
        decided(response.decided_by),
        response.local_reason.as_str(),
    );
    if got != (Outcome::Allowed, "local", "no leader") {
        fleet.fail(&format!("the lone node answered {got:?}"));
    }
    if first_answer > Duration::from_secs(1) + START_MARGIN {
        fleet.fail(&format!(
            "the first answer came {first_answer:?} after spawn"
        ));
    }
}

/// Hits through node `id` (timeout `timeout_ms`) until one is decided by the fleet; every
/// answer must be allowed and come within its deadline. Returns how many were local.
async fn hit_until_fleet(
    fleet: &Fleet,
    journal: &Journal,
    id: u64,
    tenant: &str,
    timeout_ms: u32,
) -> usize {
    let mut client = fleet.client(id).await;
    let deadline = Instant::now() + CONDITION_DEADLINE;
    for local in 0.. {
        let key = format!("leader-paused-{local}");
        let request = claim_hit(tenant, &key, &hook_of(&key), timeout_ms);
        let (response, elapsed) = journal
            .hit(&mut client, id, request)
            .await
            .unwrap_or_else(|e| fleet.fail(&e));
        if outcome(&response) != Outcome::Allowed || !within_deadline(elapsed, timeout_ms) {
            fleet.fail(&format!(
                "node {id}: {key} answered {:?} after {elapsed:?}",
                outcome(&response)
            ));
        }
        if decided(response.decided_by) == "fleet" {
            return local;
        }
        if Instant::now() > deadline {
            fleet.fail("no fleet answer while the old leader is paused");
        }
    }
    unreachable!("the loop returns or fails")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_follower_or_leader_never_blocks_answers() {
    init_tracing();
    const TENANT: &str = "paused";
    const TIMEOUT_MS: u32 = 300;
    let fleet = Fleet::start(3, "").await;
    let journal = Journal::default();
    let leader = fleet.wait_for_leader(&[1, 2, 3]).await;
    let followers: Vec<u64> = (1..=3).filter(|id| *id != leader).collect();
    let (paused, other) = (followers[0], followers[1]);

    tracing::info!("--- SIGSTOP follower {paused}; hits through {other} and {leader} stay fleet");
    fleet.pause(paused);
    let while_paused = keys("follower-paused", 10);
    commit_through_fleet(&fleet, &journal, &[other, leader], TENANT, &while_paused).await;

    tracing::info!("--- SIGCONT {paused}: it catches up and answers from the fleet");
    fleet.resume(paused);
    fleet.wait_for_applied_in_step(&[1, 2, 3]).await;
    assert_duplicates_everywhere(&fleet, &journal, &[paused], TENANT, &while_paused).await;

    tracing::info!("--- SIGSTOP the leader {leader}; hits through {paused} answer in time");
    fleet.pause(leader);
    let paused_at = Instant::now();
    let local = hit_until_fleet(&fleet, &journal, paused, TENANT, TIMEOUT_MS).await;
    tracing::info!(
        local,
        first_fleet_answer_ms = millis(paused_at.elapsed()),
        "answers while the leader is paused"
    );

    tracing::info!("--- SIGCONT {leader}: all three agree on one leader");
    fleet.resume(leader);
    let new_leader = fleet.wait_for_leader(&[1, 2, 3]).await;
    tracing::info!(new_leader, "one leader after the pause");
    assert_duplicates_everywhere(&fleet, &journal, &[1, 2, 3], TENANT, &while_paused).await;
    assert_journal(&fleet, &journal);
}

/// Hits through node `id` until one is rate limited (at most `limit` + 1 hits); every
/// answer must be decided as `decided_by`. Returns how many were allowed.
async fn spend_until_denied(
    fleet: &Fleet,
    id: u64,
    charge: &pb::Charge,
    limit: u64,
    timeout_ms: u32,
    decided_by: &str,
) -> u64 {
    let mut client = fleet.client(id).await;
    for allowed in 0..=limit {
        let request = pb::HitRequest {
            timeout_ms,
            ..hit(vec![charge.clone()], None)
        };
        let response = send_hit_full(&mut client, request).await;
        let got = (outcome(&response), decided(response.decided_by));
        if got.1 != decided_by {
            fleet.fail(&format!("node {id}: charge {allowed} answered {got:?}"));
        }
        match got.0 {
            Outcome::Allowed => {}
            Outcome::RateLimited(_) => return allowed,
            other => fleet.fail(&format!("node {id}: charge answered {other:?}")),
        }
    }
    fleet.fail(&format!("node {id}: more than {limit} charges allowed"))
}

/// The counts of one partition, per bucket.
#[derive(Debug)]
struct Admitted {
    /// Bucket spent on both sides: allowed by the isolated node, then by the majority.
    local: u64,
    majority: u64,
    /// Bucket spent on the isolated node only, then through the fleet after reconciling.
    local_only: u64,
    fleet_after: u64,
}

/// With buckets of `capacity` hooks (one per hour: nothing refills during the test), a
/// follower is isolated; counts what it allows locally and what the majority allows, then
/// what the fleet still allows of a bucket the isolated node alone spent, once reconciled.
async fn over_admission(budget: &str, capacity: u64) -> Admitted {
    const HOUR_US: u64 = 3_600_000_000;
    const TIMEOUT_MS: u32 = 100;
    let fleet = Fleet::start(3, &format!("{FAULTS}\n{budget}")).await;
    let leader = fleet.wait_for_leader(&[1, 2, 3]).await;
    let isolated = (1..=3).find(|id| *id != leader).expect("a follower");
    let shared = hooks("both-sides", HOUR_US, capacity * HOUR_US);
    let absorbed = hooks("cut-side", HOUR_US, capacity * HOUR_US);
    let limit = 2 * capacity;

    tracing::info!("--- drop every peer of follower {isolated}; spend a bucket on both sides");
    fleet.isolate(isolated, FaultKind::Drop).await;
    let local = spend_until_denied(&fleet, isolated, &shared, limit, TIMEOUT_MS, "local").await;
    let majority =
        spend_until_denied(&fleet, leader, &shared, limit, CALL_TIMEOUT_MS, "fleet").await;
    let local_only =
        spend_until_denied(&fleet, isolated, &absorbed, limit, TIMEOUT_MS, "local").await;
    if majority != capacity {
        fleet.fail(&format!(
            "the majority allowed {majority} of a fresh bucket of {capacity}"
        ));
    }

    tracing::info!("--- heal: the local grants are handed to the fleet and spend its budget");
    fleet.heal(isolated).await;
    fleet.wait_for_leader(&[1, 2, 3]).await;
    wait_reconciled(&fleet, isolated).await;
    let fleet_after =
        spend_until_denied(&fleet, leader, &absorbed, limit, CALL_TIMEOUT_MS, "fleet").await;
    let admitted = Admitted {
        local,
        majority,
        local_only,
        fleet_after,
    };
    tracing::info!(budget, capacity, ?admitted, "allowed around the partition");
    admitted
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_admission_under_fair_share_is_at_most_one_share() {
    init_tracing();
    const CAPACITY: u64 = 30;
    let admitted = over_admission("", CAPACITY).await;
    let bound = CAPACITY + CAPACITY.div_ceil(3) + 1;
    assert!(admitted.local >= 1, "the isolated node allowed nothing");
    assert!(
        admitted.local + admitted.majority <= bound,
        "fair_share: {admitted:?}, bound {bound} during the partition"
    );
    assert!(
        admitted.local_only + admitted.fleet_after <= CAPACITY + 1,
        "fair_share: {admitted:?}: the fleet did not account for the local grants"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_admission_under_full_budget_is_at_most_one_budget() {
    init_tracing();
    const CAPACITY: u64 = 30;
    let admitted = over_admission("fallback_budget = \"full\"", CAPACITY).await;
    let bound = 2 * CAPACITY + 1;
    assert!(admitted.local >= 1, "the isolated node allowed nothing");
    assert!(
        admitted.local + admitted.majority <= bound,
        "full: {admitted:?}, bound {bound} during the partition"
    );
    assert!(
        admitted.local_only + admitted.fleet_after <= CAPACITY + 1,
        "full: {admitted:?}: the fleet did not account for the local grants"
    );
}

/// A hit whose charges and claim have different scopes still answers within its deadline
/// when the fleet cannot: the fleet part is decided by the local fallback, the node part by
/// the node, and the answer says `DECIDED_BY_LOCAL`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mixed_scope_hits_fall_back_too() {
    init_tracing();
    let (fleet, survivor) = a_follower_left_alone("").await;
    let mut client = fleet.client(survivor).await;
    let mixed = |charges_scope: pb::Scope, claim_scope: pb::Scope, key: &str, hook: &str| {
        let mut request = hit(
            vec![hooks("mixed", 1_000, 60_000_000)],
            Some(claim("mixed", key, hook)),
        );
        request.timeout_ms = 200;
        request.rate_limit_scope = charges_scope as i32;
        request.dedupe_scope = claim_scope as i32;
        request
    };
    for (charges_scope, claim_scope, key) in [
        (
            pb::Scope::Fleet,
            pb::Scope::Node,
            "fleet-charges-node-claim",
        ),
        (
            pb::Scope::Node,
            pb::Scope::Fleet,
            "node-charges-fleet-claim",
        ),
    ] {
        tracing::info!(
            key,
            "--- first hook takes the key, a second one finds it pending"
        );
        let started = Instant::now();
        let first = client
            .hit(mixed(charges_scope, claim_scope, key, "hook-1"))
            .await
            .expect("answered")
            .into_inner();
        assert!(
            started.elapsed() < Duration::from_millis(200 + 500),
            "{key}: answered after {:?}",
            started.elapsed()
        );
        assert_eq!(outcome(&first), Outcome::Allowed, "{key}");
        assert_eq!(first.decided_by, pb::DecidedBy::Local as i32, "{key}");
        let second = client
            .hit(mixed(charges_scope, claim_scope, key, "hook-2"))
            .await
            .expect("answered")
            .into_inner();
        assert!(
            matches!(outcome(&second), Outcome::Pending(_)),
            "{key}: a second hook got {:?}",
            outcome(&second)
        );
    }
}

/// The proposal queue is bounded: when it is full, a call does not wait. An overloaded
/// fleet is one of SPEC section 7's failures, so the node answers from its own state at
/// once: a hit decided locally, its reason saying "overloaded" with a retry hint (issue
/// #4's overloaded answer), and a settle written to the node's queue (`QUEUED`, never lost).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_proposal_queue_answers_locally_at_once() {
    init_tracing();
    // The follower's one forward slot waits for a leader that does not come.
    let (fleet, survivor) =
        a_follower_left_alone("queue_depth_max = 1\nforwards_in_flight_max = 1").await;
    // The forward slot, the batcher and the queue hold three of these until their deadline
    // (no leader comes back); the others find the queue full.
    const WAITING_MS: u32 = 30_000;
    let mut calls: futures::stream::FuturesUnordered<_> = (0..6)
        .map(|i| {
            let addr = fleet.api_addr(survivor);
            async move {
                let mut client = connect(&addr).await;
                let mut request = hit(vec![], Some(claim("queue", &format!("key-{i}"), "hook")));
                request.timeout_ms = WAITING_MS;
                client.hit(request).await
            }
        })
        .collect();
    let first = calls.next().await.expect("six calls");
    let first = first
        .expect("an overloaded hit is answered, not refused")
        .into_inner();
    assert_eq!(decided(first.decided_by), "local");
    assert!(
        first.local_reason.contains("overloaded") && first.local_reason.contains("retry after"),
        "the first answer comes from a full queue: {first:?}"
    );
    assert_eq!(
        outcome(&first),
        Outcome::Allowed,
        "an unknown key is accepted"
    );

    tracing::info!("--- the queue is still full: a settle is queued on this node's disk");
    let mut client = connect(&fleet.api_addr(survivor)).await;
    let mut request = settle("queue", "settle-key", "hook", pb::SettleOutcome::Commit);
    request.timeout_ms = WAITING_MS;
    let settled = client
        .settle(request)
        .await
        .expect("an overloaded settle is answered, not refused")
        .into_inner();
    assert_eq!(
        settled.status,
        pb::SettleStatus::Queued as i32,
        "{settled:?}"
    );
    assert_eq!(decided(settled.decided_by), "local");

    let mut overloaded = 1;
    while let Some(answer) = calls.next().await {
        let answer = answer.expect("every hit is answered").into_inner();
        assert_eq!(decided(answer.decided_by), "local", "{answer:?}");
        if answer.local_reason.contains("overloaded") {
            overloaded += 1;
        } else {
            assert_eq!(answer.local_reason, "no leader", "{answer:?}");
        }
    }
    assert!(
        overloaded >= 3,
        "at most three of six wait for a leader: {overloaded} overloaded"
    );
}

/// SPEC section 10: a reset clears the node-local buckets even when the fleet cannot take
/// it, including those a cut-off node charges in its place (SPEC section 7).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_clears_the_buckets_a_cut_off_node_charges() {
    init_tracing();
    let (fleet, survivor) = a_follower_left_alone("").await;
    let mut client = connect(&fleet.api_addr(survivor)).await;
    // One hit per hour: the second is denied for the whole test unless the bucket is reset.
    let hourly = || pb::HitRequest {
        timeout_ms: 200,
        ..hit(vec![hooks("reset-me", 3_600_000_000, 3_600_000_000)], None)
    };
    let first = client.hit(hourly()).await.expect("answered").into_inner();
    assert_eq!(
        (outcome(&first), decided(first.decided_by)),
        (Outcome::Allowed, "local")
    );
    let second = client.hit(hourly()).await.expect("answered").into_inner();
    assert!(
        matches!(outcome(&second), Outcome::RateLimited(_)),
        "{second:?}"
    );

    let mut request = reset("reset-me");
    request.timeout_ms = 200;
    let status = client
        .reset(request)
        .await
        .expect_err("no leader to take it");
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");

    let after = client.hit(hourly()).await.expect("answered").into_inner();
    assert_eq!(
        (outcome(&after), decided(after.decided_by)),
        (Outcome::Allowed, "local"),
        "the reset cleared the bucket the fallback charged"
    );
}
