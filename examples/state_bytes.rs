//! What one live claim and one live bucket cost in memory (RSS), for sizing `claims_max`
//! and `buckets_max` (docs/operations.md, "Sizing the state limits"):
//! `cargo run --example state_bytes -- 500000`. It builds the state through the rules, as
//! a replica does, with ids of typical length (a 36-byte key and hook id), and reads
//! VmRSS from /proc before and after each half.

use ankusa_fleet::state::{
    rules, BucketKey, Charge, ClaimKey, ClaimRequest, Command, FleetState, Kind,
};

fn rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|kb| kb.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

fn main() {
    let items: u64 = std::env::args()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or(500_000);
    let now_us = 1_700_000_000_000_000;
    let mut state = FleetState::default();
    let batch = 512;
    let before = rss_bytes();
    for start in (0..items).step_by(batch) {
        let commands: Vec<Command> = (start..(start + batch as u64).min(items))
            .map(|n| Command::Hit {
                charges: Vec::new(),
                claim: Some(ClaimRequest {
                    key: ClaimKey {
                        tenant: format!("tenant-{:04}", n % 1_000).into(),
                        source_id: "stripe".into(),
                        key: format!("evt_{n:032}").into(),
                    },
                    hook_id: format!("hook_{n:031}").into(),
                    ttl_ms: 86_400_000,
                    pending_ttl_ms: 86_400_000,
                }),
                node: 1,
            })
            .collect();
        rules::apply_batch(&mut state, &commands, now_us);
    }
    let claims = rss_bytes();
    for start in (0..items).step_by(batch) {
        let commands: Vec<Command> = (start..(start + batch as u64).min(items))
            .map(|n| Command::Hit {
                charges: vec![Charge {
                    bucket: BucketKey::Tenant {
                        kind: Kind::Hooks,
                        tenant: format!("bucket-tenant-{n:010}").into(),
                    },
                    increment_us: 1_000_000,
                    capacity_us: 86_400_000_000,
                }],
                claim: None,
                node: 1,
            })
            .collect();
        rules::apply_batch(&mut state, &commands, now_us);
    }
    let buckets = rss_bytes();
    let per_claim = claims.saturating_sub(before) / items;
    let per_bucket = buckets.saturating_sub(claims) / items;
    println!("items={items} rss_before={before} bytes_per_claim={per_claim} bytes_per_bucket={per_bucket} stored={:?}", state.len());
}
