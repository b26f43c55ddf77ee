#!/usr/bin/env bash
# The one check: format, lints, docs, then every test. CI runs exactly this (.ci/run).
# Needs only cargo: protoc is vendored by build.rs, everything else comes from crates.io.
set -euo pipefail
cd "$(dirname "$0")/.."

echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy --all-targets -- -D warnings"
cargo clippy --all-targets --locked -- -D warnings
echo "== cargo doc (warnings are errors)"
RUSTDOCFLAGS="-D warnings" cargo doc --no-deps --locked --quiet
echo "== cargo test"
# Cluster tests start real node processes; two at a time keeps a 2-core machine responsive.
cargo test --all-targets --locked -- --test-threads 2
