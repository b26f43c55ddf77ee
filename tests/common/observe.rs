//! What a fleet shows: status, applied progress, metrics, and the node logs.

use ankusa_fleet::pb;

use super::Fleet;

impl Fleet {
    /// Node `id`'s status through its edge API, if it answers in time.
    pub async fn status(&self, id: u64) -> Option<pb::StatusResponse> {
        self.launch.status(id).await
    }

    /// Node `id`'s applied index, if it answers.
    pub async fn last_applied(&self, id: u64) -> Option<u64> {
        Some(self.status(id).await?.last_applied)
    }

    /// The value of the sample `name` (with its labels, as the exporter writes them) on node
    /// `id`'s metrics page; `None` while the page or the sample is not there.
    pub async fn metric(&self, id: u64, name: &str) -> Option<f64> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let addr = self.nodes[&id]
            .spec
            .metrics_addr
            .as_ref()
            .expect("every test node serves metrics");
        let mut stream = tokio::net::TcpStream::connect(addr).await.ok()?;
        let request = format!("GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n");
        stream.write_all(request.as_bytes()).await.ok()?;
        let mut page = String::new();
        stream.read_to_string(&mut page).await.ok()?;
        page.lines()
            .find_map(|line| line.strip_prefix(name)?.strip_prefix(' '))
            .and_then(|value| value.trim().parse().ok())
    }

    /// How many lines of node `id`'s log (all its runs) contain `needle`.
    pub fn log_count(&self, id: u64, needle: &str) -> usize {
        let log = std::fs::read_to_string(&self.nodes[&id].log_path).unwrap_or_default();
        log.lines().filter(|line| line.contains(needle)).count()
    }

    /// How many lines of node `id`'s log contain every one of `needles`.
    pub fn log_lines(&self, id: u64, needles: &[&str]) -> usize {
        let log = std::fs::read_to_string(&self.nodes[&id].log_path).unwrap_or_default();
        log.lines()
            .filter(|line| needles.iter().all(|needle| line.contains(needle)))
            .count()
    }

    /// Every snapshot node `id` logged as built (all its runs), in order: its last log index
    /// and its size. The state store names a snapshot `T{term}-N{leader}-{index}-{seq}`
    /// (e.g. `T1-N2-1180-55`) and logs `size_bytes` beside it.
    pub fn snapshots_built(&self, id: u64) -> Vec<(u64, u64)> {
        let log = std::fs::read_to_string(&self.nodes[&id].log_path).unwrap_or_default();
        let field = |line: &str, name: &str| -> Option<String> {
            let value = line.split(name).nth(1)?.split_whitespace().next()?;
            Some(value.to_string())
        };
        log.lines()
            .filter(|line| line.contains("snapshot built"))
            .filter_map(|line| {
                let index = field(line, "snapshot_id=")?
                    .rsplit('-')
                    .nth(1)?
                    .parse()
                    .ok()?;
                let size = field(line, "size_bytes=")?.parse().ok()?;
                Some((index, size))
            })
            .collect()
    }

    pub fn dump_logs(&self) {
        for node in self.nodes.values() {
            let log = std::fs::read_to_string(&node.log_path).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(40).collect();
            eprintln!("---- node {} log (last 40 lines) ----", node.spec.id);
            for line in tail.into_iter().rev() {
                eprintln!("{line}");
            }
        }
    }

    /// Panics with the node logs (the way `wait_for` does at its deadline).
    pub fn fail(&self, why: &str) -> ! {
        self.dump_logs();
        panic!("{why}");
    }
}

/// Raft progress as every node among `ids` reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Applied {
    pub term: u64,
    pub last_applied: u64,
}

impl Applied {
    /// Entries applied since `earlier`, or `None` when the term changed in between: a new
    /// leader appends an entry of its own, so the count then says nothing about requests.
    pub fn entries_since(&self, earlier: Applied) -> Option<u64> {
        (self.term == earlier.term).then(|| self.last_applied - earlier.last_applied)
    }
}

impl Fleet {
    /// Waits until every node among `ids` reports the same term and `last_applied` (nothing
    /// in flight), and returns it.
    pub async fn wait_for_applied_in_step(&self, ids: &[u64]) -> Applied {
        self.wait_for("every node applied the same index", || async {
            let mut seen = Vec::new();
            for id in ids {
                let status = self.status(*id).await?;
                seen.push(Applied {
                    term: status.term,
                    last_applied: status.last_applied,
                });
            }
            let first = *seen.first()?;
            seen.iter().all(|s| *s == first).then_some(first)
        })
        .await
    }
}
