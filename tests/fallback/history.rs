//! The history of one test: every claim hit and every acknowledged commit, with times, and
//! its check. The tests keep theirs in a `journal` variable; it is not the service's claim
//! journal.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ankusa_fleet::pb;
use ankusa_fleet::pb::fleet_client::FleetClient;
use tokio::time::Instant;
use tonic::transport::Channel;

use crate::common::*;

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
pub(crate) struct History {
    entries: Arc<Mutex<Entries>>,
}

fn journal_key(tenant: &str, source_id: &str, key: &str) -> String {
    format!("{tenant}/{source_id}/{key}")
}

impl History {
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
    pub(crate) async fn hit(
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
    pub(crate) async fn settle(
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
pub(crate) fn assert_journal(fleet: &Fleet, journal: &History) {
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

    let journal = History::default();
    journal.record_commit("t/s/k".into(), hook_of("k"), start);
    journal.record_hit(1, "t/s/k".into(), later, duplicate.clone());
    assert_eq!(journal.check(), Ok(1), "commit acknowledged before the hit");

    let journal = History::default();
    journal.record_hit(1, "t/s/k".into(), start, duplicate.clone());
    journal.record_commit("t/s/k".into(), hook_of("k"), later);
    assert!(
        journal.check().is_err(),
        "commit acknowledged after the hit"
    );

    let journal = History::default();
    journal.record_commit("t/s/k".into(), "hook-other".into(), start);
    journal.record_hit(1, "t/s/k".into(), later, duplicate.clone());
    assert!(journal.check().is_err(), "another hook was committed");

    let journal = History::default();
    journal.record_commit("t/s/other".into(), hook_of("k"), start);
    journal.record_hit(1, "t/s/k".into(), later, duplicate);
    assert!(journal.check().is_err(), "another key was committed");
}
