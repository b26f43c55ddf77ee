#!/usr/bin/env bash
# What mutual TLS between the nodes costs: the same 3-node fleet (local-3 configs on free
# loopback ports, one tokio worker per node) run with [peer_tls] and with it stripped,
# `ankusa-fleet bench` against each in turns (TLS, plain, TLS, plain, ...), hits/s and the
# nodes' CPU per hit (utime+stime from /proc) printed per run. Numbers go to
# docs/benchmarks.md with the date and machine.
#
#   bash scripts/bench-tls.sh [ROUNDS] [CALLERS] [DURATION_S]
#
# With BIN_B=PATH (another build of ankusa-fleet, e.g. of an earlier commit), it compares
# instead this build ("a"; or BIN_A=PATH, then nothing is built) with that one ("b"), both
# with [peer_tls], in turns: what a change costs, measured side by side in one run.
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-2}
CALLERS=${2:-64}
DURATION_S=${3:-10}
if [[ -n ${BIN_A:-} ]]; then
    BIN=$BIN_A
else
    cargo build --release --locked --quiet
    BIN=$PWD/target/release/ankusa-fleet
fi
MODES=(tls plain)
if [[ -n ${BIN_B:-} ]]; then MODES=(a b); fi
WORK=$(mktemp -d)
PIDS=""
cleanup() { [[ -n $PIDS ]] && kill $PIDS 2>/dev/null; wait 2>/dev/null; rm -rf "$WORK"; }
trap cleanup EXIT
"$BIN" certs --out "$WORK/certs" --nodes 3 >/dev/null

ticks() {
    local total=0 pid stat rest
    for pid in "$@"; do
        stat=$(cat "/proc/$pid/stat")
        rest=${stat##*) }
        read -r -a f <<<"$rest"
        total=$((total + f[11] + f[12]))
    done
    echo "$total"
}

# start MODE: a fresh fleet (tls or plain) on free ports; sets PIDS and ADDRS.
start() {
    local mode=$1 dir="$WORK/$1" n ports subst=() old
    rm -rf "$dir"; mkdir -p "$dir"
    read -r -a ports <<<"$(python3 -c '
import socket
s = [socket.socket() for _ in range(6)]
for x in s: x.bind(("127.0.0.1", 0))
print(" ".join(str(x.getsockname()[1]) for x in s))')"
    for n in 0 1 2 3 4 5; do
        old=$((n < 3 ? 7101 + n : 7201 + n - 3))
        subst+=(-e "s/127\.0\.0\.1:$old\"/127.0.0.1:${ports[n]}\"/g")
    done
    ADDRS="127.0.0.1:${ports[0]},127.0.0.1:${ports[1]},127.0.0.1:${ports[2]}"
    PIDS=""
    for n in 1 2 3; do
        sed "${subst[@]}" -e "s#data/local-3/certs#$WORK/certs#g" \
            -e "s#^data_dir = .*#data_dir = \"$dir/node$n\"#" \
            "cluster-configs/local-3/node$n.toml" >"$dir/node$n.toml"
        if [[ $mode == plain ]]; then
            sed -i -e '/^\[peer_tls\]/,$d' "$dir/node$n.toml"
        fi
        local bin=$BIN
        if [[ $mode == b ]]; then bin=$BIN_B; fi
        TOKIO_WORKER_THREADS=1 "$bin" serve --config "$dir/node$n.toml" >"$dir/node$n.log" 2>&1 &
        PIDS="$PIDS $!"
    done
    for _ in $(seq 200); do
        if "$BIN" cluster status --config "$dir/node1.toml" 2>/dev/null | grep -qE 'leader [1-9]'; then
            return 0
        fi
        sleep 0.1
    done
    echo "no leader in $mode fleet" >&2; exit 1
}

hz=$(getconf CLK_TCK)
echo "date $(date -u +%F) $(nproc) cpus, $CALLERS callers, ${DURATION_S}s per run"
for round in $(seq "$ROUNDS"); do
    for mode in "${MODES[@]}"; do
        start "$mode"
        before=$(ticks $PIDS)
        out=$("$BIN" bench --addrs "$ADDRS" --callers "$CALLERS" --duration-s "$DURATION_S" 2>/dev/null)
        after=$(ticks $PIDS)
        python3 - "$mode" "$round" "$((after - before))" "$hz" "$out" <<'PY'
import json, sys
mode, round_, ticks, hz, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
s = json.loads(out)
cpu_us = ticks / hz * 1e6 / s["hits"] if s["hits"] else float("nan")
print(f"round {round_} {mode:5}: {s['hits_per_s']:8.0f} hits/s  p50 {s['p50_us']:5d} us  p99 {s['p99_us']:6d} us  "
      f"nodes' CPU {cpu_us:5.1f} us/hit  errors {s['errors']}  local {s['decided_local']}")
PY
        kill $PIDS; wait $PIDS 2>/dev/null || true; PIDS=""
    done
done
