//! `ankusa-fleet serve --config NODE.toml`: run one node (logs, metrics, the listeners,
//! `server::start`), until a signal drains it.

use std::path::PathBuf;

use crate::config::{LogFormat, NodeConfig};
use crate::server;

/// Log lines to stderr, filtered by RUST_LOG (default `info,openraft=warn`): text, or one
/// JSON object per line.
fn init_telemetry(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,openraft=warn"));
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => logs.with_ansi(ansi).init(),
        LogFormat::Json => logs.json().init(),
    }
}

/// Turns transparent huge pages off for this process (as Redis asks of its hosts): mimalloc
/// asks for huge pages on its arenas, and a fault on one zeroes 2 MiB on the thread that
/// touched it, often the one applying entries (docs/decisions/016). Best effort: a kernel
/// without the call keeps its default.
#[cfg(target_os = "linux")]
fn disable_transparent_huge_pages() {
    // SAFETY: PR_SET_THP_DISABLE reads its integer arguments only and sets a flag on this
    // process' memory map; it touches no memory of ours.
    let rc = unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) };
    if rc != 0 {
        tracing::debug!(error = %std::io::Error::last_os_error(), "transparent huge pages stay as the kernel sets them");
    }
}

/// Transparent huge pages are a Linux feature; elsewhere there is nothing to turn off.
#[cfg(not(target_os = "linux"))]
fn disable_transparent_huge_pages() {}

/// Runs the node `path` describes until SIGTERM or Ctrl-C (then drains), or until its Raft
/// core stops (then exits with [`server::RAFT_CORE_STOPPED_EXIT_CODE`]).
///
/// # Errors
/// When the config is invalid, a listener cannot bind, or the node cannot start.
pub async fn run(path: PathBuf) -> anyhow::Result<()> {
    let config = NodeConfig::load(&path)?;
    init_telemetry(config.log_format);
    disable_transparent_huge_pages();
    if let Some(addr) = config.metrics_addr {
        crate::telemetry::serve_metrics(addr)?;
    }
    let listeners = server::Listeners::bind(&config).await?;
    // After the bind: `api_socket`'s directory and file keep the modes that let the edge's
    // group in. From here on every file the stores create is the node user's alone.
    crate::storage::set_private_umask();
    let running = server::start(config, listeners).await?;
    // SIGTERM is what systemd and Kubernetes send; SIGINT is Ctrl-C. Both drain, and so
    // does a Raft core that stopped: the node then exits non-zero to be started again.
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let core_stopped = tokio::select! {
        _ = tokio::signal::ctrl_c() => {
            tracing::info!(signal = "SIGINT", "shutting down");
            None
        }
        _ = terminate.recv() => {
            tracing::info!(signal = "SIGTERM", "shutting down");
            None
        }
        why = running.raft_core_stopped() => Some(why),
    };
    // A second signal during the drain stops the node at once (as an operator who presses
    // Ctrl-C twice expects); the claim journals and the log are fsynced as they go.
    tokio::spawn(async move {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = terminate.recv() => {}
        }
        tracing::warn!("second signal: stopping without finishing the drain");
        std::process::exit(1);
    });
    running.drain().await;
    if let Some(why) = core_stopped {
        tracing::error!(
            reason = %why,
            exit_code = server::RAFT_CORE_STOPPED_EXIT_CODE,
            "stopped: the Raft core had stopped"
        );
        std::process::exit(server::RAFT_CORE_STOPPED_EXIT_CODE);
    }
    tracing::info!("stopped");
    Ok(())
}
