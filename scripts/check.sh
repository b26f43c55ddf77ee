#!/usr/bin/env bash
# The one check: format, lints, docs, then every test. CI runs exactly this (.ci/run).
# Needs cargo (protoc is vendored by build.rs, everything else comes from crates.io), and
# python3 with pip for the Python edge example that tests/python_edge.rs runs.
set -euo pipefail
cd "$(dirname "$0")/.."

echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy --all-targets -- -D warnings"
cargo clippy --all-targets --locked -- -D warnings
echo "== cargo doc (warnings are errors)"
RUSTDOCFLAGS="-D warnings" cargo doc --no-deps --locked --quiet
echo "== python3 -m pip install -r examples/python/requirements.txt"
# Pinned grpcio and grpcio-tools; a no-op once they are installed.
python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore \
    -r examples/python/requirements.txt
if ! command -v openssl >/dev/null; then
    # tests/identity.rs makes a fleet's certificates with openssl, as docs/security.md shows.
    echo "== apt-get install openssl"
    apt-get update -qq && apt-get install -y -qq openssl
fi
echo "== cargo test"
# Cluster tests start real node processes; two at a time keeps a 2-core machine responsive.
# The nemesis's dev-dependency turns on `planted-bugs` for every test build of the
# workspace, so the product as built (the feature off) is linted and unit-tested apart.
cargo test --all-targets --locked -- --test-threads 2
echo "== the node without planted-bugs: cargo clippy and cargo test --lib"
cargo clippy -p ankusa-fleet --all-targets --locked -- -D warnings
cargo test -p ankusa-fleet --lib --locked -- --test-threads 2
echo "== cargo run -- --version: the README's cargo run starts the node, with no planted bugs"
version=$(cargo run --locked --quiet -- --version)
echo "$version"
if [[ $version == *planted-bugs* ]]; then
    echo "check.sh: a plain build carries the planted bugs" >&2
    exit 1
fi
