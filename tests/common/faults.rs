//! Fault injection: frozen processes (SIGSTOP), transport fault rules between nodes, held
//! log writes.

use ankusa_fleet::pb;

use super::Fleet;

impl Fleet {
    /// SIGSTOP: the process freezes (no answer, no timer) until [`Fleet::resume`].
    pub fn pause(&mut self, id: u64) {
        self.launch
            .pause(id)
            .unwrap_or_else(|e| panic!("SIGSTOP to node {id}: {e}"));
    }

    /// SIGCONT after [`Fleet::pause`].
    pub fn resume(&mut self, id: u64) {
        self.launch
            .resume(id)
            .unwrap_or_else(|e| panic!("SIGCONT to node {id}: {e}"));
    }

    /// Replaces node `id`'s transport fault rules (its config needs `fault_injection = true`);
    /// an empty list heals. A rule for peer P covers both directions at node `id`.
    pub async fn set_faults(&self, id: u64, faults: &[(u64, pb::internal::FaultKind)]) {
        let request = pb::internal::SetFaultsRequest {
            cluster_id: "ankusa-fleet".to_owned(),
            faults: faults
                .iter()
                .map(|(peer_id, kind)| pb::internal::PeerFault {
                    peer_id: *peer_id,
                    kind: *kind as i32,
                    delay_ms: 0,
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        };
        self.send_faults(id, request).await;
    }

    /// Holds node `id`'s log writer (its appends stay in memory, unwritten, so a kill loses
    /// them) and clears its transport rules; [`Fleet::heal`] lifts the hold.
    pub async fn hold_log_writes(&self, id: u64) {
        let request = pb::internal::SetFaultsRequest {
            cluster_id: "ankusa-fleet".to_owned(),
            faults: Vec::new(),
            hold_log_writes: true,
            ..Default::default()
        };
        self.send_faults(id, request).await;
    }

    /// Sends `request` to node `id`'s Admin `SetFaults` (every field; it replaces the whole set).
    pub async fn send_faults(&self, id: u64, request: pb::internal::SetFaultsRequest) {
        let mut admin = self
            .admin_target(id)
            .connect()
            .await
            .unwrap_or_else(|e| self.fail(&format!("admin client for node {id}: {e:#}")));
        if let Err(e) = admin.set_faults(request).await {
            self.fail(&format!("set_faults on node {id}: {e}"));
        }
    }

    /// Cuts node `id` off from every other node with `kind` rules set on `id` alone.
    pub async fn isolate(&self, id: u64, kind: pb::internal::FaultKind) {
        let faults: Vec<(u64, pb::internal::FaultKind)> = self
            .nodes
            .keys()
            .filter(|peer| **peer != id)
            .map(|peer| (*peer, kind))
            .collect();
        self.set_faults(id, &faults).await;
    }

    /// Clears node `id`'s fault rules.
    pub async fn heal(&self, id: u64) {
        self.set_faults(id, &[]).await;
    }
}
