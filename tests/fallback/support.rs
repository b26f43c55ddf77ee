//! Phases shared by the tests: a cut-off node's local answers, commits and probes through
//! the fleet, waits for reconciliation and for a new leader, latency summaries.

use std::time::Duration;

use ankusa_fleet::pb;
use futures::StreamExt;

use crate::common::*;
use crate::history::History;
use crate::{claim_hit, commit, decided, within_deadline, PROBE_HOOK};

/// A node answering locally: its calls, journaled, each with `timeout_ms`.
pub(crate) struct CutOff<'a> {
    pub(crate) fleet: &'a Fleet,
    pub(crate) journal: &'a History,
    pub(crate) id: u64,
    pub(crate) tenant: &'a str,
    pub(crate) timeout_ms: u32,
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
    pub(crate) async fn claim(&self, keys: &[String]) -> Vec<Duration> {
        self.hit(keys, None, |_| Outcome::Allowed).await
    }

    /// A probe of each key (another hook) answers duplicate{its hook} locally.
    pub(crate) async fn probe_duplicates(&self, keys: &[String]) -> Vec<Duration> {
        self.hit(keys, Some(PROBE_HOOK), |key| {
            Outcome::Duplicate(hook_of(key))
        })
        .await
    }

    /// Each key's commit is answered `queued`, decided locally, within its deadline.
    pub(crate) async fn commit(&self, keys: &[String]) {
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
pub(crate) async fn commit_through_fleet(
    fleet: &Fleet,
    journal: &History,
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
pub(crate) async fn probe_everywhere(
    fleet: &Fleet,
    journal: &History,
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

pub(crate) async fn assert_duplicates_everywhere(
    fleet: &Fleet,
    journal: &History,
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
pub(crate) async fn wait_reconciled(fleet: &Fleet, id: u64) {
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

pub(crate) async fn assert_degraded(fleet: &Fleet, id: u64) {
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
pub(crate) async fn wait_for_new_leader(fleet: &Fleet, ids: &[u64], gone: u64) -> u64 {
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

pub(crate) fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// p50 and max of some latencies, in ms.
pub(crate) fn p50_max_ms(latencies: &[Duration]) -> (u64, u64) {
    let mut sorted = latencies.to_vec();
    sorted.sort();
    let p50 = sorted.get(sorted.len() / 2).copied().unwrap_or_default();
    let max = sorted.last().copied().unwrap_or_default();
    (millis(p50), millis(max))
}
