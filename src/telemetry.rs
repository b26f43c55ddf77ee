//! Metrics: the Prometheus exporter a node serves on `metrics_addr`.
//!
//! Every `*_seconds` metric is a real Prometheus histogram (`_bucket` lines), so latencies
//! aggregate across nodes; the batch sizes and snapshot sizes get buckets of their own. docs/operations.md lists the
//! metrics and the alerts worth having on them.

use std::net::SocketAddr;

use anyhow::Context;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};

/// Buckets for durations, in seconds: from 100 µs (a local answer) to 10 s (a snapshot).
const SECONDS: [f64; 16] = [
    0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0,
];
/// Buckets for commands per batch.
const COMMANDS: [f64; 10] = [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0];
/// Buckets for snapshot sizes: 64 KiB to 4 GiB, by fours.
const BYTES: [f64; 9] = [
    65_536.0,
    262_144.0,
    1_048_576.0,
    4_194_304.0,
    16_777_216.0,
    67_108_864.0,
    268_435_456.0,
    1_073_741_824.0,
    4_294_967_296.0,
];

/// Serves Prometheus text on `addr` (any path) from now on, and says so in the log.
///
/// # Errors
/// When the address cannot be bound or a recorder is already installed.
pub fn serve_metrics(addr: SocketAddr) -> anyhow::Result<()> {
    PrometheusBuilder::new()
        .with_http_listener(addr)
        .set_buckets_for_metric(Matcher::Suffix("_seconds".to_owned()), &SECONDS)
        .and_then(|builder| {
            builder.set_buckets_for_metric(
                Matcher::Full("ankusa_batch_commands".to_owned()),
                &COMMANDS,
            )
        })
        .and_then(|builder| {
            builder.set_buckets_for_metric(Matcher::Suffix("_bytes".to_owned()), &BYTES)
        })
        .context("metrics buckets")?
        .install()
        .with_context(|| format!("starting the metrics exporter on metrics_addr {addr}"))?;
    tracing::info!(metrics_addr = %addr, "metrics served (Prometheus text)");
    Ok(())
}
