//! The Python edge example (`examples/python/edge.py`) against a real 3-node fleet: its claim
//! is allowed, its commit settled, and the same key under another hook answered duplicate.
//! It needs python3 with grpcio and grpcio-tools (`scripts/check.sh` installs them); without
//! them the test fails and says how to install them.

mod common;

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use common::*;

/// Making the stubs and three calls, on a loaded 2-core machine.
const SCRIPT_DEADLINE: Duration = Duration::from_secs(60);

const INSTALL: &str = "python3 -m pip install -r examples/python/requirements.txt";

/// Fails the test unless python3 runs and imports both packages.
fn require_python_grpc() {
    let output = std::process::Command::new("python3")
        .args(["-c", "import grpc, grpc_tools"])
        .output();
    match output {
        Err(e) => {
            panic!("python3 does not run ({e}): install CPython 3 with pip, then `{INSTALL}`")
        }
        Ok(output) if !output.status.success() => panic!(
            "python3 lacks grpcio or grpcio-tools: run `{INSTALL}` (scripts/check.sh does)\n{}",
            String::from_utf8_lossy(&output.stderr)
        ),
        Ok(_) => {}
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_edge_claims_commits_and_is_answered_duplicate() {
    init_tracing();
    require_python_grpc();
    let fleet = Fleet::start(3, "").await;
    let leader = fleet.wait_for_leader(&[1, 2, 3]).await;
    // The edge calls the node on its own host, whichever leads: here a follower.
    let follower = (1..=3).find(|id| *id != leader).expect("a follower");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/python/edge.py");
    let child = tokio::process::Command::new("python3")
        .arg(&script)
        .args(["--addr", &fleet.api_addr(follower)])
        .args(["--timeout-ms", &CALL_TIMEOUT_MS.to_string()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn python3");
    let output = match tokio::time::timeout(SCRIPT_DEADLINE, child.wait_with_output()).await {
        Ok(output) => output.expect("wait for python3"),
        Err(_) => fleet.fail(&format!("edge.py did not end within {SCRIPT_DEADLINE:?}")),
    };
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    if !output.status.success() {
        fleet.fail(&format!(
            "edge.py exited with {}\n--- stdout\n{stdout}--- stderr\n{stderr}",
            output.status
        ));
    }
    let first_hook = stdout
        .lines()
        .find(|line| line.starts_with("1. hit"))
        .and_then(|line| line.split("hook=").nth(1))
        .unwrap_or_else(|| panic!("no first hit in:\n{stdout}"));
    for expected in [
        "   allowed (decided by fleet)".to_owned(),
        "   settled (decided by fleet)".to_owned(),
        format!("   duplicate of {first_hook} (decided by fleet)"),
        "ok: allowed, settled, duplicate".to_owned(),
    ] {
        assert!(
            stdout.lines().any(|line| line == expected),
            "no line `{expected}` in:\n{stdout}"
        );
    }
}
