#!/usr/bin/env bash
# Compares ankusa-fleet (local 3-node Raft fleet) with a single Redis running the same hit
# (scripts/redis/hit.lua: GCRA charge + two-phase claim), under the same closed-loop
# workload: one charge + one unique claim per hit, tenants spread, C callers.
#
#   scripts/compare-redis.sh                   # 10 s per point, callers 1 16 64
#   DURATION_S=3 scripts/compare-redis.sh      # quick run
#
# The fleet runs twice per caller count: `fleet` (a unary Hit call per hit) and
# `fleet-stream` (one HitStream per caller, one hit in flight: the same closed loop, without
# a new HTTP/2 stream per hit, the way Redis callers reuse one connection).
#
# Environment:
#   DURATION_S     seconds per point (default 10)
#   CALLERS        caller counts (default "1 16 64")
#   TENANTS        tenant spread (default 1000)
#   OUT_JSON       raw results (default target/compare-redis.json)
#   REDIS_PROCS    driver worker processes (default: min(callers, CPUs))
#   BUILD_TIMEOUT  seconds allowed for cargo build --release (default 3600; waits on locks)
#   FLEET_PORTS    auto (default): `ankusa-fleet dev` when its fixed ports 7101-7103/7201-7203
#                  are free, else the same 3 nodes started here on free ports (with dev's
#                  tokio worker count, TOKIO_WORKER_THREADS if set); dev; free
#
# Needs cargo; installs redis-server (and python3) with apt-get when missing. The fleet is
# `ankusa-fleet dev` (fixed ports 127.0.0.1:7101-7103 and 7201-7203; see FLEET_PORTS);
# Redis gets free loopback ports. The systems run one at a time (the fleet, then each
# Redis), each alone on the machine. Everything started here is stopped on exit.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

DURATION_S=${DURATION_S:-10}
CALLERS=${CALLERS:-"1 16 64"}
TENANTS=${TENANTS:-1000}
OUT_JSON=${OUT_JSON:-target/compare-redis.json}
REDIS_PROCS=${REDIS_PROCS:-0}
BUILD_TIMEOUT=${BUILD_TIMEOUT:-3600}
FLEET_PORTS=${FLEET_PORTS:-auto}
TARGET_DIR=${CARGO_TARGET_DIR:-target}
BIN=$TARGET_DIR/release/ankusa-fleet
POINT_TIMEOUT=$((DURATION_S + 90))

log() { printf '== %s\n' "$*" >&2; }
die() { printf 'compare-redis: %s\n' "$*" >&2; exit 1; }

[[ $DURATION_S =~ ^[1-9][0-9]*$ ]] || die "DURATION_S must be a whole number of seconds"

# ---------------------------------------------------------------- tools
APT_UPDATED=0
apt_install() {
    command -v apt-get >/dev/null || die "apt-get not found; install $* by hand"
    [[ $(id -u) == 0 ]] || die "need root to apt-get install $*"
    export DEBIAN_FRONTEND=noninteractive
    if [[ $APT_UPDATED == 0 ]]; then
        log "apt-get update"
        timeout 600 apt-get update -qq
        APT_UPDATED=1
    fi
    log "apt-get install $*"
    timeout 900 apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}
command -v python3 >/dev/null || apt_install python3
command -v redis-server >/dev/null || apt_install redis-server
command -v cargo >/dev/null || die "cargo not found (install Rust: https://rustup.rs)"
REDIS_SERVER=$(command -v redis-server)
CLK_TCK=$(getconf CLK_TCK)

# ---------------------------------------------------------------- cleanup
WORK=$(mktemp -d "${TMPDIR:-/tmp}/compare-redis.XXXXXX")
DEV_PID=""
NODE_PIDS=""
REDIS_PIDS=""
cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    if [[ -n $DEV_PID ]] && kill -0 "$DEV_PID" 2>/dev/null; then
        kill -TERM "$DEV_PID" 2>/dev/null || true
        for _ in $(seq 50); do kill -0 "$DEV_PID" 2>/dev/null || break; sleep 0.2; done
        kill -KILL "$DEV_PID" 2>/dev/null || true
    fi
    # dev kills its nodes when it stops; make sure of it (by pid, never by name).
    for pid in $NODE_PIDS $REDIS_PIDS; do kill -TERM "$pid" 2>/dev/null || true; done
    for pid in $NODE_PIDS $REDIS_PIDS; do
        for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
        kill -KILL "$pid" 2>/dev/null || true
    done
    wait 2>/dev/null || true
    rm -rf "$WORK"
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# free_port [N]: N distinct free loopback ports (bound to port 0 together, then released).
free_port() {
    python3 -c '
import socket, sys
socks = [socket.socket() for _ in range(int(sys.argv[1]))]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in socks))' "${1:-1}"
}

port_busy() {
    python3 - "$1" <<'EOF'
import socket, sys
s = socket.socket()
try:
    s.bind(("127.0.0.1", int(sys.argv[1])))
except OSError:
    sys.exit(0)
sys.exit(1)
EOF
}

# Sum of utime+stime (+ waited-for children, e.g. an AOF rewrite) of the given pids, in ticks.
cpu_ticks() {
    local total=0 pid stat rest
    for pid in "$@"; do
        stat=$(cat "/proc/$pid/stat") || die "process $pid is gone"
        rest=${stat##*) }             # fields from 3 on; comm may hold spaces
        read -r -a f <<<"$rest"
        # f[0] is field 3; utime=14 stime=15 cutime=16 cstime=17 -> f[11..14]
        total=$((total + f[11] + f[12] + f[13] + f[14]))
    done
    echo "$total"
}

# run_timed OUT CMD... : runs CMD with a timeout, stdout to OUT, stderr to OUT.err;
# prints the client's own CPU seconds (user+sys of CMD and its children).
run_timed() {
    local out=$1; shift
    python3 - "$out" "$POINT_TIMEOUT" "$@" <<'EOF'
import resource, subprocess, sys
out, limit, cmd = sys.argv[1], float(sys.argv[2]), sys.argv[3:]
with open(out, "wb") as o, open(out + ".err", "wb") as e:
    try:
        rc = subprocess.run(cmd, stdout=o, stderr=e, timeout=limit).returncode
    except subprocess.TimeoutExpired:
        sys.exit(f"timed out after {limit:.0f}s: {' '.join(cmd)}")
if rc != 0:
    tail = open(out + ".err", "rb").read()[-2000:].decode(errors="replace")
    sys.exit(f"exit {rc}: {' '.join(cmd)}\n{tail}")
r = resource.getrusage(resource.RUSAGE_CHILDREN)
print(f"{r.ru_utime + r.ru_stime:.3f}")
EOF
}

# ---------------------------------------------------------------- build + fleet
log "cargo build --release (waits if another build holds the lock)"
timeout "$BUILD_TIMEOUT" cargo build --release --locked --bin ankusa-fleet
[[ -x $BIN ]] || die "$BIN not built"

busy_dev_port() {
    local port
    for port in 7101 7102 7103 7201 7202 7203; do
        if port_busy "$port"; then echo "$port"; return 0; fi
    done
    return 1
}

# The fleet the normal way: `ankusa-fleet dev` (fixed ports 7101-7103 / 7201-7203).
start_dev_fleet() {
    log "starting the dev fleet in $WORK/fleet"
    "$BIN" dev --data-dir "$WORK/fleet" >"$WORK/dev.log" 2>&1 &
    DEV_PID=$!
    for _ in $(seq 600); do   # 60 s; dev itself gives up after 30 s
        grep -q 'leader is node' "$WORK/dev.log" && break
        kill -0 "$DEV_PID" 2>/dev/null || { cat "$WORK/dev.log" >&2; die "dev exited"; }
        sleep 0.1
    done
    grep -q 'leader is node' "$WORK/dev.log" || { cat "$WORK/dev.log" >&2; die "no leader within 60 s"; }
    grep 'leader is node' "$WORK/dev.log" >&2
    NODE_PIDS=$(cat /proc/"$DEV_PID"/task/*/children 2>/dev/null | tr ' ' '\n' | grep -E '^[0-9]+$' | sort -n | tr '\n' ' ' || true)
    NODE_PIDS=${NODE_PIDS% }
    [[ $(wc -w <<<"$NODE_PIDS") == 3 ]] || die "expected 3 node processes under dev ($DEV_PID), found: '$NODE_PIDS'"
    local pid
    for pid in $NODE_PIDS; do
        grep -q serve "/proc/$pid/cmdline" || die "child $pid of dev is not a serve node"
    done
    FLEET_ADDRS=127.0.0.1:7101,127.0.0.1:7102,127.0.0.1:7103
    FLEET_MODE="ankusa-fleet dev"
}

# The same 3 nodes as dev (cluster-configs/local-3, as dev embeds them) with every port
# swapped for a free one, each `serve` started here: for a machine where another fleet holds
# dev's ports. Each node gets dev's runtime size too (a third of the cores, at least one
# worker): with tokio's default of one worker per core, three nodes on 2 cores measured
# 26.2k streaming hits/s at 42.5 us/hit against 29.3k at 35.8 (64 callers).
start_free_port_fleet() {
    local workers=${TOKIO_WORKER_THREADS:-$(( $(nproc) / 3 > 0 ? $(nproc) / 3 : 1 ))}
    log "starting 3 serve nodes (local-3 configs) on free ports in $WORK/fleet"
    mkdir -p "$WORK/fleet"
    local subst=() n old addrs=() pid ports
    read -r -a ports <<<"$(free_port 6)"
    for n in 0 1 2 3 4 5; do
        old=$((n < 3 ? 7101 + n : 7201 + n - 3))
        subst+=(-e "s/127\.0\.0\.1:$old\"/127.0.0.1:${ports[n]}\"/g")
        if ((n < 3)); then addrs+=("127.0.0.1:${ports[n]}"); fi
    done
    "$BIN" certs --out "$WORK/fleet/certs" --nodes 3 >/dev/null
    for n in 1 2 3; do
        sed "${subst[@]}" \
            -e "s#^data_dir = .*#data_dir = \"$WORK/fleet/node$n\"#" \
            -e "s#data/local-3/certs#$WORK/fleet/certs#g" \
            "cluster-configs/local-3/node$n.toml" >"$WORK/fleet/node$n.toml"
        TOKIO_WORKER_THREADS=$workers "$BIN" serve --config "$WORK/fleet/node$n.toml" \
            >"$WORK/fleet/node$n.log" 2>&1 &
        pid=$!
        NODE_PIDS="$NODE_PIDS $pid"
    done
    NODE_PIDS=${NODE_PIDS# }
    FLEET_ADDRS=$(IFS=,; echo "${addrs[*]}")
    FLEET_MODE="3 serve processes, local-3 configs on free ports, $workers tokio worker(s) each"
    local lines ids
    for _ in $(seq 120); do   # 60 s
        for pid in $NODE_PIDS; do
            kill -0 "$pid" 2>/dev/null || { tail -n 20 "$WORK"/fleet/node*.log >&2; die "node $pid exited"; }
        done
        lines=$(for n in 1 2 3; do
            timeout 5 "$BIN" cluster status --config "$WORK/fleet/node$n.toml" 2>/dev/null | head -n1 || true
        done)
        ids=$(grep -oE 'leader [1-9][0-9]*' <<<"$lines" | awk '{print $2}' || true)
        if [[ $(grep -c . <<<"$ids" || true) == 3 && $(sort -u <<<"$ids" | wc -l) == 1 ]]; then
            log "ankusa-fleet: 3 nodes up, leader is node $(head -n1 <<<"$ids") (api $FLEET_ADDRS)"
            return 0
        fi
        sleep 0.5
    done
    tail -n 20 "$WORK"/fleet/node*.log >&2
    die "no leader within 60 s"
}

case $FLEET_PORTS in
    dev|auto)
        if busy=$(busy_dev_port); then
            [[ $FLEET_PORTS == dev ]] && die "127.0.0.1:$busy is in use; the dev fleet needs 7101-7103 and 7201-7203"
            log "127.0.0.1:$busy is in use (another fleet running?): not using dev"
            start_free_port_fleet
        else
            start_dev_fleet
        fi ;;
    free) start_free_port_fleet ;;
    *) die "FLEET_PORTS must be auto, dev or free" ;;
esac
log "fleet nodes: pids $NODE_PIDS"

# ---------------------------------------------------------------- redis
# start_redis NAME EXTRA-ARGS... : sets REDIS_PORT and REDIS_PID
start_redis() {
    local name=$1; shift
    local dir="$WORK/redis-$name" port
    mkdir -p "$dir"
    port=$(free_port)
    "$REDIS_SERVER" --bind 127.0.0.1 --port "$port" --protected-mode yes \
        --dir "$dir" --dbfilename dump.rdb --save '' --daemonize no \
        --logfile "$dir/redis.log" "$@" &
    REDIS_PID=$!
    REDIS_PIDS="$REDIS_PIDS $REDIS_PID"
    for _ in $(seq 100); do
        if python3 - "$port" <<'EOF' 2>/dev/null; then break; fi
import socket, sys
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=1)
s.sendall(b"PING\r\n")
sys.exit(0 if s.recv(64).startswith(b"+PONG") else 1)
EOF
        kill -0 "$REDIS_PID" 2>/dev/null || { cat "$dir/redis.log" >&2; die "redis ($name) exited"; }
        sleep 0.1
    done
    REDIS_PORT=$port
    timeout 30 python3 scripts/redis/bench_redis.py --port "$port" --script scripts/redis/hit.lua --check >/dev/null \
        || die "hit.lua check failed on redis ($name)"
    log "redis ($name): port $port pid $REDIS_PID ($("$REDIS_SERVER" --version | awk '{print $3}' | sed 's/^v=//'))"
}

# stop_pids PID... : TERM, then KILL what is left after 10 s (by pid, never by name).
stop_pids() {
    local pid
    for pid in "$@"; do kill -TERM "$pid" 2>/dev/null || true; done
    for pid in "$@"; do
        for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
        kill -KILL "$pid" 2>/dev/null || true
    done
}

# ---------------------------------------------------------------- points
RESULTS=$WORK/results.jsonl
: >"$RESULTS"

PROGRESS_PY='
import json, sys
r = json.loads(sys.stdin.read())
s = r["summary"]
cpu = r["server_cpu_s"] * 1e6 / s["hits"] if s["hits"] else float("nan")
bad = " ".join("%s=%s" % (k, s[k]) for k in ("errors", "not_allowed", "decided_local") if s.get(k))
print("   %-15s callers %3d: %9.0f hits/s  p50 %6d us  p99 %7d us  server CPU %6.1f us/hit  %s"
      % (r["system"], r["callers"], s["hits_per_s"], s["p50_us"], s["p99_us"], cpu, bad))
'

# point SYSTEM CALLERS SERVER-PIDS -- CMD...
point() {
    local system=$1 callers=$2 pids=$3; shift 4
    local out="$WORK/$system-$callers.json" before after client_cpu
    # shellcheck disable=SC2086
    before=$(cpu_ticks $pids)
    client_cpu=$(run_timed "$out" "$@") || die "$system with $callers callers failed"
    # shellcheck disable=SC2086
    after=$(cpu_ticks $pids)
    python3 - "$system" "$callers" "$((after - before))" "$CLK_TCK" "$client_cpu" "$out" >>"$RESULTS" <<'EOF'
import json, sys
system, callers, ticks, clk, client_cpu, out = sys.argv[1:]
summary = json.load(open(out))
print(json.dumps({"system": system, "callers": int(callers),
                  "server_cpu_s": int(ticks) / int(clk),
                  "client_cpu_s": float(client_cpu), "summary": summary}))
EOF
    tail -n1 "$RESULTS" | python3 -c "$PROGRESS_PY" >&2
}

# Idle server CPU (heartbeats, cron), to read the per-hit numbers against: CPU s per s.
idle_cpu() {
    local b a
    # shellcheck disable=SC2086
    b=$(cpu_ticks $1); sleep 2
    # shellcheck disable=SC2086
    a=$(cpu_ticks $1)
    python3 -c "print(round(($a - $b) / $CLK_TCK / 2, 4))"
}

# Each system runs alone: the fleet's points first, then the fleet is stopped and each Redis
# is started, measured and stopped in turn. A system idling beside another still works in
# the background (the fleet's snapshots and expiries, Redis' expiry cycle and AOF writes);
# alone, that work lands in its own points and takes nothing from the other's. (Measured
# once in round 7, the order moved neither side much: fleet 64-caller stream 23.6k hits/s at
# 47.6 µs/hit alone vs 23.4k at 48.1 beside both Redis servers.)
log "warm-up of the fleet (1 s, not reported)"
run_timed "$WORK/warm-fleet.json" "$BIN" bench --addrs "$FLEET_ADDRS" --callers 16 --duration-s 1 --tenants "$TENANTS" >/dev/null
IDLE_FLEET=$(idle_cpu "$NODE_PIDS")
log "idle server CPU (s per s): fleet $IDLE_FLEET"
for c in $CALLERS; do
    log "fleet, callers $c, ${DURATION_S}s per point"
    # shellcheck disable=SC2086
    point fleet "$c" "$NODE_PIDS" -- "$BIN" bench --addrs "$FLEET_ADDRS" --callers "$c" --duration-s "$DURATION_S" --tenants "$TENANTS"
    # shellcheck disable=SC2086
    point fleet-stream "$c" "$NODE_PIDS" -- "$BIN" bench --stream --addrs "$FLEET_ADDRS" --callers "$c" --duration-s "$DURATION_S" --tenants "$TENANTS"
done
log "stopping the fleet"
if [[ -n $DEV_PID ]]; then stop_pids "$DEV_PID"; fi
# shellcheck disable=SC2086
stop_pids $NODE_PIDS
# Stopped and reaped: the exit cleanup must not signal these pids again (they may be reused).
DEV_PID="" NODE_PIDS=""

# redis_points NAME REDIS-ARGS... : starts that Redis, measures it alone, stops it.
redis_points() {
    local name=$1; shift
    start_redis "$name" "$@"
    log "warm-up of redis-$name (1 s, not reported)"
    run_timed "$WORK/warm-$name.json" python3 scripts/redis/bench_redis.py --port "$REDIS_PORT" \
        --script scripts/redis/hit.lua --callers 16 --duration-s 1 --tenants "$TENANTS" >/dev/null
    IDLE_REDIS=$(idle_cpu "$REDIS_PID")
    log "idle server CPU (s per s): redis-$name $IDLE_REDIS"
    for c in $CALLERS; do
        point "redis-$name" "$c" "$REDIS_PID" -- python3 scripts/redis/bench_redis.py --port "$REDIS_PORT" \
            --script scripts/redis/hit.lua --callers "$c" --duration-s "$DURATION_S" --tenants "$TENANTS" --procs "$REDIS_PROCS"
    done
    stop_pids "$REDIS_PID"
    local kept="" pid
    for pid in $REDIS_PIDS; do [[ $pid == "$REDIS_PID" ]] || kept="$kept $pid"; done
    REDIS_PIDS=$kept
}
redis_points none --appendonly no
IDLE_NONE=$IDLE_REDIS
redis_points everysec --appendonly yes --appendfsync everysec
IDLE_EVERYSEC=$IDLE_REDIS

# ---------------------------------------------------------------- report
mkdir -p "$(dirname "$OUT_JSON")"
FLEET_MODE=$FLEET_MODE IDLE_JSON="{\"fleet\": $IDLE_FLEET, \"redis-none\": $IDLE_NONE, \"redis-everysec\": $IDLE_EVERYSEC}" \
REDIS_VERSION=$("$REDIS_SERVER" --version | awk '{print $3}' | sed 's/^v=//') \
python3 - "$RESULTS" "$OUT_JSON" "$DURATION_S" "$TENANTS" <<'EOF'
import json, os, platform, sys, time
results_path, out_path, duration_s, tenants = sys.argv[1:]
rows = [json.loads(l) for l in open(results_path) if l.strip()]
for r in rows:
    s = r["summary"]
    r["server_cpu_us_per_hit"] = r["server_cpu_s"] * 1e6 / s["hits"] if s["hits"] else None
    r["client_cpu_us_per_hit"] = r["client_cpu_s"] * 1e6 / s["hits"] if s["hits"] else None
by = {(r["system"], r["callers"]): r for r in rows}
callers = sorted({r["callers"] for r in rows})
fleets = ["fleet", "fleet-stream"]  # unary Hit per hit / one HitStream per caller
systems = fleets + ["redis-none", "redis-everysec"]

def ratio(a, b):
    return a / b if a is not None and b else None

ratios = []
for c, fleet in ((c, fleet) for c in callers for fleet in fleets):
    f, n, e = (by.get((s, c)) for s in (fleet, "redis-none", "redis-everysec"))
    if not (f and n and e):
        continue
    ratios.append({
        "callers": c,
        "fleet": fleet,
        "hits_per_s_fleet_over_redis_everysec": ratio(f["summary"]["hits_per_s"], e["summary"]["hits_per_s"]),
        "hits_per_s_fleet_over_redis_none": ratio(f["summary"]["hits_per_s"], n["summary"]["hits_per_s"]),
        "cpu_per_hit_fleet_over_redis_everysec": ratio(f["server_cpu_us_per_hit"], e["server_cpu_us_per_hit"]),
        "cpu_per_hit_fleet_over_redis_none": ratio(f["server_cpu_us_per_hit"], n["server_cpu_us_per_hit"]),
    })

doc = {
    "generated_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    "duration_s": int(duration_s), "tenants": int(tenants),
    "host": {"cpus": os.cpu_count(), "kernel": platform.release()},
    "redis_version": os.environ.get("REDIS_VERSION"),
    "workload": "closed loop; per hit 1 GCRA charge (hooks, increment 1 us, capacity 1e9 us) "
                "+ 1 unique claim (pending_ttl 60 s); fleet: 3 nodes, callers spread over them",
    "fleet_nodes": os.environ.get("FLEET_MODE"),
    "idle_server_cpu_s_per_s": json.loads(os.environ["IDLE_JSON"]),
    "points": rows, "ratios": ratios,
}
with open(out_path, "w") as f:
    json.dump(doc, f, indent=2)

def fmt(x, spec):
    return format(x, spec) if x is not None else "-"

print()
print(f"ankusa-fleet ({doc['fleet_nodes']}) vs one Redis {doc['redis_version']} running hit.lua;"
      f" {duration_s}s per point, {tenants} tenants, {os.cpu_count()} CPUs")
print("server CPU = utime+stime of the 3 node processes / of redis-server, per hit;"
      " client CPU = the load generator's own")
idle = doc["idle_server_cpu_s_per_s"]
print("idle server CPU (s per s, included above): " + ", ".join(f"{k} {v}" for k, v in idle.items()))
print()
hdr = f"{'callers':>7}  {'system':<15} {'hits/s':>9} {'p50 us':>8} {'p99 us':>8} {'CPU us/hit':>10}  {'client CPU us/hit':>17}"
print(hdr)
print("-" * len(hdr))
for c in callers:
    for s in systems:
        r = by.get((s, c))
        if not r:
            continue
        m = r["summary"]
        flag = []
        for k in ("errors", "not_allowed", "decided_local"):
            if m.get(k):
                flag.append(f"{k}={m[k]}")
        print(f"{c:>7}  {s:<15} {m['hits_per_s']:>9.0f} {m['p50_us']:>8} {m['p99_us']:>8}"
              f" {fmt(r['server_cpu_us_per_hit'], '10.1f')}  {fmt(r['client_cpu_us_per_hit'], '17.1f')}"
              f"  {' '.join(flag)}")
print()
print(f"{'callers':>7}  {'fleet':<13} {'hits/s fleet/everysec':>21} {'hits/s fleet/none':>17} {'CPU fleet/everysec':>18} {'CPU fleet/none':>14}")
for r in ratios:
    print(f"{r['callers']:>7}  {r['fleet']:<13} {fmt(r['hits_per_s_fleet_over_redis_everysec'], '21.2f')}"
          f" {fmt(r['hits_per_s_fleet_over_redis_none'], '17.2f')}"
          f" {fmt(r['cpu_per_hit_fleet_over_redis_everysec'], '18.1f')}"
          f" {fmt(r['cpu_per_hit_fleet_over_redis_none'], '14.1f')}")
print()
print(f"raw results: {out_path}")
EOF
