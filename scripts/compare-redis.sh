#!/usr/bin/env bash
# Compares ankusa-fleet (local 3-node Raft fleet) with a single Redis without persistence
# running the same hit (scripts/redis/hit.lua: GCRA charge + two-phase claim), driven by the
# one load generator, `ankusa-fleet bench` (built with the redis-bench feature): one
# KIND_HOOKS charge + one claim on a unique key per hit, tenants spread, C closed-loop callers.
#
#   scripts/compare-redis.sh                   # 10 s per point
#   DURATION_S=3 scripts/compare-redis.sh      # quick run
#
# Two pairings, each system alone on the machine, in turns (fleet, Redis, fleet, Redis), each
# on a fresh fleet or a fresh Redis:
#   plain  fleet: a unary Hit per hit, one connection per caller, callers spread over the
#                 3 nodes;            Redis: one connection per caller, one EVALSHA at a time.
#   best   fleet: `--client`, one ankusa-fleet-client Client per node shared by that node's
#                 callers;            Redis: SHARED_CONNECTIONS connections shared by all
#                 callers, each pipelining their requests (redis-rs MultiplexedConnection).
# Beside them: one lone caller through a follower (unary Hit, and the client), one lone
# Redis caller, and an open loop (`--rate`) at half of each system's best closed-loop rate.
# And the plain pairing's floor: the same unary hits at SCOPE_NODE (`--node-scope`), each
# node answering alone with no forward, log or replication, against Redis' plain point.
#
# Environment:
#   DURATION_S          seconds per point (default 10)
#   CALLERS             closed-loop callers of the pairings and the open loop (default 64)
#   TENANTS             tenant spread (default 1000)
#   SHARED_CONNECTIONS  Redis connections of the best pairing (default 1)
#   OUT_JSON            raw results (default target/compare-redis.json)
#   BUILD_TIMEOUT       seconds allowed for cargo build --release (default 3600; waits on locks)
#   BIN                 run this binary (built with --features redis-bench) instead of building
#   FLEET_PORTS         auto (default): `ankusa-fleet dev` when its fixed ports 7101-7103/7201-7203
#                       are free, else the same 3 nodes started here on free ports (with dev's
#                       tokio worker count, TOKIO_WORKER_THREADS if set); dev; free
#
# Needs cargo; installs redis-server (and python3) with apt-get when missing. Server CPU per
# hit is utime+stime of the 3 node processes, or of redis-server, read from /proc before and
# after each point, over the hits; the load generator's own CPU is reported apart. Everything
# started here is stopped on exit.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

DURATION_S=${DURATION_S:-10}
CALLERS=${CALLERS:-64}
TENANTS=${TENANTS:-1000}
SHARED_CONNECTIONS=${SHARED_CONNECTIONS:-1}
OUT_JSON=${OUT_JSON:-target/compare-redis.json}
BUILD_TIMEOUT=${BUILD_TIMEOUT:-3600}
FLEET_PORTS=${FLEET_PORTS:-auto}
TARGET_DIR=${CARGO_TARGET_DIR:-target}
# BIN: a binary built with --features redis-bench to run instead of building this tree's
# (an earlier build, for a before/after pair measured in one sitting).
BIN=${BIN:-}
POINT_TIMEOUT=$((DURATION_S + 90))

log() { printf '== %s\n' "$*" >&2; }
die() { printf 'compare-redis: %s\n' "$*" >&2; exit 1; }

[[ $DURATION_S =~ ^[1-9][0-9]*$ ]] || die "DURATION_S must be a whole number of seconds"
[[ $CALLERS =~ ^[1-9][0-9]*$ ]] || die "CALLERS must be one whole number"
[[ $SHARED_CONNECTIONS =~ ^[1-9][0-9]*$ ]] || die "SHARED_CONNECTIONS must be a whole number"

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

# port_busy PORT: someone listens on it. SO_REUSEADDR as a server binds, so the TIME_WAIT
# left by a fleet stopped a moment ago does not count.
port_busy() {
    python3 - "$1" <<'EOF'
import socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
try:
    s.bind(("127.0.0.1", int(sys.argv[1])))
except OSError:
    sys.exit(0)
sys.exit(1)
EOF
}

# Sum of utime+stime (+ waited-for children, e.g. an RDB save) of the given pids, in ticks.
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

# stop_pids PID... : TERM, then KILL what is left after 10 s (by pid, never by name).
stop_pids() {
    local pid
    for pid in "$@"; do kill -TERM "$pid" 2>/dev/null || true; done
    for pid in "$@"; do
        for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
        kill -KILL "$pid" 2>/dev/null || true
    done
}

# ---------------------------------------------------------------- build
if [[ -z $BIN ]]; then
    BIN=$TARGET_DIR/release/ankusa-fleet
    log "cargo build --release --features redis-bench (waits if another build holds the lock)"
    timeout "$BUILD_TIMEOUT" cargo build --release --locked --features redis-bench --bin ankusa-fleet
fi
[[ -x $BIN ]] || die "$BIN not built"

# ---------------------------------------------------------------- fleet
busy_dev_port() {
    local port
    for port in 7101 7102 7103 7201 7202 7203; do
        if port_busy "$port"; then echo "$port"; return 0; fi
    done
    return 1
}

# set_follower LEADER-ID: FOLLOWER_ADDR is the api address of the node after the leader.
set_follower() {
    local addrs
    IFS=, read -r -a addrs <<<"$FLEET_ADDRS"
    [[ $1 =~ ^[1-3]$ ]] || die "leader id '$1' is not one of the 3 nodes"
    FOLLOWER_ADDR=${addrs[$(($1 % 3))]}
}

# The fleet the normal way: `ankusa-fleet dev` (fixed ports 7101-7103 / 7201-7203).
start_dev_fleet() {
    local dir=$1
    log "starting the dev fleet in $dir"
    "$BIN" dev --data-dir "$dir" >"$dir.log" 2>&1 &
    DEV_PID=$!
    for _ in $(seq 600); do   # 60 s; dev itself gives up after 30 s
        grep -q 'leader is node' "$dir.log" && break
        kill -0 "$DEV_PID" 2>/dev/null || { cat "$dir.log" >&2; die "dev exited"; }
        sleep 0.1
    done
    grep -q 'leader is node' "$dir.log" || { cat "$dir.log" >&2; die "no leader within 60 s"; }
    grep 'leader is node' "$dir.log" >&2
    NODE_PIDS=$(cat /proc/"$DEV_PID"/task/*/children 2>/dev/null | tr ' ' '\n' | grep -E '^[0-9]+$' | sort -n | tr '\n' ' ' || true)
    NODE_PIDS=${NODE_PIDS% }
    [[ $(wc -w <<<"$NODE_PIDS") == 3 ]] || die "expected 3 node processes under dev ($DEV_PID), found: '$NODE_PIDS'"
    local pid
    for pid in $NODE_PIDS; do
        grep -q serve "/proc/$pid/cmdline" || die "child $pid of dev is not a serve node"
    done
    FLEET_ADDRS=127.0.0.1:7101,127.0.0.1:7102,127.0.0.1:7103
    FLEET_MODE="ankusa-fleet dev"
    set_follower "$(grep -oE 'leader is node [0-9]+' "$dir.log" | head -n1 | awk '{print $4}')"
}

# The same 3 nodes as dev (cluster-configs/local-3, as dev embeds them) with every port
# swapped for a free one, each `serve` started here: for a machine where another fleet holds
# dev's ports. Each node gets dev's runtime size too (a third of the cores, at least one
# worker): with tokio's default of one worker per core, three nodes on 2 cores measured
# 26.2k streaming hits/s at 42.5 us/hit against 29.3k at 35.8 (64 callers).
start_free_port_fleet() {
    local dir=$1
    local workers=${TOKIO_WORKER_THREADS:-$(( $(nproc) / 3 > 0 ? $(nproc) / 3 : 1 ))}
    log "starting 3 serve nodes (local-3 configs) on free ports in $dir"
    mkdir -p "$dir"
    local subst=() n old addrs=() pid ports
    read -r -a ports <<<"$(free_port 6)"
    for n in 0 1 2 3 4 5; do
        old=$((n < 3 ? 7101 + n : 7201 + n - 3))
        subst+=(-e "s/127\.0\.0\.1:$old\"/127.0.0.1:${ports[n]}\"/g")
        if ((n < 3)); then addrs+=("127.0.0.1:${ports[n]}"); fi
    done
    "$BIN" certs --out "$dir/certs" --nodes 3 >/dev/null
    for n in 1 2 3; do
        sed "${subst[@]}" \
            -e "s#^data_dir = .*#data_dir = \"$dir/node$n\"#" \
            -e "s#data/local-3/certs#$dir/certs#g" \
            "cluster-configs/local-3/node$n.toml" >"$dir/node$n.toml"
        TOKIO_WORKER_THREADS=$workers "$BIN" serve --config "$dir/node$n.toml" \
            >"$dir/node$n.log" 2>&1 &
        pid=$!
        NODE_PIDS="$NODE_PIDS $pid"
    done
    NODE_PIDS=${NODE_PIDS# }
    FLEET_ADDRS=$(IFS=,; echo "${addrs[*]}")
    FLEET_MODE="3 serve processes, local-3 configs on free ports, $workers tokio worker(s) each"
    local lines ids
    for _ in $(seq 120); do   # 60 s
        for pid in $NODE_PIDS; do
            kill -0 "$pid" 2>/dev/null || { tail -n 20 "$dir"/node*.log >&2; die "node $pid exited"; }
        done
        lines=$(for n in 1 2 3; do
            timeout 5 "$BIN" cluster status --config "$dir/node$n.toml" 2>/dev/null | head -n1 || true
        done)
        ids=$(grep -oE 'leader [1-9][0-9]*' <<<"$lines" | awk '{print $2}' || true)
        if [[ $(grep -c . <<<"$ids" || true) == 3 && $(sort -u <<<"$ids" | wc -l) == 1 ]]; then
            log "ankusa-fleet: 3 nodes up, leader is node $(head -n1 <<<"$ids") (api $FLEET_ADDRS)"
            set_follower "$(head -n1 <<<"$ids")"
            return 0
        fi
        sleep 0.5
    done
    tail -n 20 "$dir"/node*.log >&2
    die "no leader within 60 s"
}

# start_fleet NAME: a fresh fleet in $WORK/fleet-NAME; sets NODE_PIDS, FLEET_ADDRS,
# FOLLOWER_ADDR and FLEET_MODE. The first start settles FLEET_PORTS for the later ones, so
# every pairing runs the same kind of fleet.
start_fleet() {
    local dir="$WORK/fleet-$1" busy
    case $FLEET_PORTS in
        dev|auto)
            if busy=$(busy_dev_port); then
                [[ $FLEET_PORTS == dev ]] && die "127.0.0.1:$busy is in use; the dev fleet needs 7101-7103 and 7201-7203"
                log "127.0.0.1:$busy is in use (another fleet running?): not using dev"
                start_free_port_fleet "$dir"
                FLEET_PORTS=free
            else
                start_dev_fleet "$dir"
                FLEET_PORTS=dev
            fi ;;
        free) start_free_port_fleet "$dir" ;;
        *) die "FLEET_PORTS must be auto, dev or free" ;;
    esac
    log "fleet nodes: pids $NODE_PIDS, a follower at $FOLLOWER_ADDR"
}

stop_fleet() {
    log "stopping the fleet"
    if [[ -n $DEV_PID ]]; then stop_pids "$DEV_PID"; fi
    # shellcheck disable=SC2086
    stop_pids $NODE_PIDS
    # Stopped and reaped: the exit cleanup must not signal these pids again (they may be reused).
    DEV_PID="" NODE_PIDS=""
    rm -rf "$WORK"/fleet-*
}

# ---------------------------------------------------------------- redis
# start_redis NAME: a fresh Redis without persistence; sets REDIS_ADDR and REDIS_PID.
start_redis() {
    local name=$1
    local dir="$WORK/redis-$name" port
    mkdir -p "$dir"
    port=$(free_port)
    "$REDIS_SERVER" --bind 127.0.0.1 --port "$port" --protected-mode yes \
        --dir "$dir" --dbfilename dump.rdb --save '' --appendonly no --daemonize no \
        --logfile "$dir/redis.log" &
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
    REDIS_ADDR=127.0.0.1:$port
    timeout 30 python3 scripts/redis/bench_redis.py --port "$port" --script scripts/redis/hit.lua --check >/dev/null \
        || die "hit.lua check failed on redis ($name)"
    log "redis ($name): $REDIS_ADDR pid $REDIS_PID ($("$REDIS_SERVER" --version | awk '{print $3}' | sed 's/^v=//'))"
}

stop_redis() {
    stop_pids "$REDIS_PID"
    local kept="" pid
    for pid in $REDIS_PIDS; do [[ $pid == "$REDIS_PID" ]] || kept="$kept $pid"; done
    REDIS_PIDS=$kept
}

# ---------------------------------------------------------------- points
RESULTS=$WORK/results.jsonl
: >"$RESULTS"

PROGRESS_PY='
import json, sys
r = json.loads(sys.stdin.read())
s = r["summary"]
cpu = r["server_cpu_s"] * 1e6 / s["hits"] if s["hits"] else float("nan")
bad = " ".join("%s=%s" % (k, s[k]) for k in ("errors", "not_allowed", "decided_local", "late_starts") if s.get(k))
print("   %-13s %-6s %3d callers: %9.0f hits/s  p50 %6d us  p99 %7d us  server CPU %6.1f us/hit  %s"
      % (r["point"], r["system"], s["callers"], s["hits_per_s"], s["p50_us"], s["p99_us"], cpu, bad))
'

# point NAME SYSTEM SERVER-PIDS -- BENCH-ARGS... : one `bench` run, with the servers' CPU.
point() {
    local name=$1 system=$2 pids=$3; shift 4
    local out="$WORK/$name-$system.json" before after client_cpu
    log "$name, $system: bench $*"
    # shellcheck disable=SC2086
    before=$(cpu_ticks $pids)
    client_cpu=$(run_timed "$out" "$BIN" bench --duration-s "$DURATION_S" --tenants "$TENANTS" "$@") \
        || die "$name against $system failed"
    # shellcheck disable=SC2086
    after=$(cpu_ticks $pids)
    python3 - "$name" "$system" "$((after - before))" "$CLK_TCK" "$client_cpu" "$out" >>"$RESULTS" <<'EOF'
import json, sys
name, system, ticks, clk, client_cpu, out = sys.argv[1:]
summary = json.load(open(out))
print(json.dumps({"point": name, "system": system, "server_cpu_s": int(ticks) / int(clk),
                  "client_cpu_s": float(client_cpu), "summary": summary}))
EOF
    tail -n1 "$RESULTS" | python3 -c "$PROGRESS_PY" >&2
}

# hits_per_s NAME SYSTEM: a point's closed-loop rate, whole hits per second.
hits_per_s() {
    python3 - "$RESULTS" "$1" "$2" <<'EOF'
import json, sys
path, name, system = sys.argv[1:]
rows = [json.loads(l) for l in open(path) if l.strip()]
print(max(1, int(next(r["summary"]["hits_per_s"] for r in rows
                      if r["point"] == name and r["system"] == system))))
EOF
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

# warm_up SYSTEM BENCH-ARGS... : 1 s, not reported (connections, first allocations).
warm_up() {
    local system=$1; shift
    log "warm-up of $system (1 s, not reported)"
    run_timed "$WORK/warm-$system.json" "$BIN" bench --callers 16 --duration-s 1 --tenants "$TENANTS" "$@" >/dev/null
}

# Each system runs alone, started fresh for each pairing, in turns: a system idling beside
# another still works in the background (the fleet's snapshots and expiries, Redis' expiry
# cycle), and a fleet's state grows with every hit it took.
start_fleet plain
warm_up fleet --addrs "$FLEET_ADDRS"
IDLE_FLEET=$(idle_cpu "$NODE_PIDS")
log "idle server CPU (s per s): fleet $IDLE_FLEET"
point plain fleet "$NODE_PIDS" -- --addrs "$FLEET_ADDRS" --callers "$CALLERS"
point plain-node fleet "$NODE_PIDS" -- --addrs "$FLEET_ADDRS" --callers "$CALLERS" --node-scope
point lone-hit fleet "$NODE_PIDS" -- --addrs "$FOLLOWER_ADDR" --callers 1
point lone-client fleet "$NODE_PIDS" -- --addrs "$FOLLOWER_ADDR" --callers 1 --client
stop_fleet

start_redis plain
warm_up redis --redis "$REDIS_ADDR"
IDLE_REDIS=$(idle_cpu "$REDIS_PID")
log "idle server CPU (s per s): redis $IDLE_REDIS"
point plain redis "$REDIS_PID" -- --redis "$REDIS_ADDR" --callers "$CALLERS"
point lone redis "$REDIS_PID" -- --redis "$REDIS_ADDR" --callers 1
stop_redis

start_fleet best
warm_up fleet --addrs "$FLEET_ADDRS" --client
point best fleet "$NODE_PIDS" -- --addrs "$FLEET_ADDRS" --callers "$CALLERS" --client
RATE=$(( $(hits_per_s best fleet) / 2 ))
point open-half fleet "$NODE_PIDS" -- --addrs "$FLEET_ADDRS" --callers "$CALLERS" --client --rate "$RATE"
stop_fleet

start_redis best
warm_up redis --redis "$REDIS_ADDR" --shared-connections "$SHARED_CONNECTIONS"
point best redis "$REDIS_PID" -- --redis "$REDIS_ADDR" --callers "$CALLERS" --shared-connections "$SHARED_CONNECTIONS"
RATE=$(( $(hits_per_s best redis) / 2 ))
point open-half redis "$REDIS_PID" -- --redis "$REDIS_ADDR" --callers "$CALLERS" \
    --shared-connections "$SHARED_CONNECTIONS" --rate "$RATE"
stop_redis

# ---------------------------------------------------------------- report
mkdir -p "$(dirname "$OUT_JSON")"
FLEET_MODE=$FLEET_MODE IDLE_JSON="{\"fleet\": $IDLE_FLEET, \"redis\": $IDLE_REDIS}" \
REDIS_VERSION=$("$REDIS_SERVER" --version | awk '{print $3}' | sed 's/^v=//') \
python3 - "$RESULTS" "$OUT_JSON" "$DURATION_S" "$TENANTS" "$CALLERS" "$SHARED_CONNECTIONS" <<'EOF'
import json, os, platform, sys, time
results_path, out_path, duration_s, tenants, callers, shared = sys.argv[1:]
rows = [json.loads(l) for l in open(results_path) if l.strip()]
for r in rows:
    s = r["summary"]
    r["server_cpu_us_per_hit"] = r["server_cpu_s"] * 1e6 / s["hits"] if s["hits"] else None
    r["client_cpu_us_per_hit"] = r["client_cpu_s"] * 1e6 / s["hits"] if s["hits"] else None
by = {(r["point"], r["system"]): r for r in rows}

def ratio(a, b):
    return a / b if a is not None and b else None

pairings = []
for name, fleet_point, redis_point in (("plain", "plain", "plain"),
                                       ("plain-node", "plain-node", "plain"),
                                       ("best", "best", "best")):
    f, r = by.get((fleet_point, "fleet")), by.get((redis_point, "redis"))
    if not (f and r):
        continue
    pairings.append({
        "pairing": name,
        "fleet_hits_per_s": f["summary"]["hits_per_s"],
        "fleet_cpu_us_per_hit": f["server_cpu_us_per_hit"],
        "redis_hits_per_s": r["summary"]["hits_per_s"],
        "redis_cpu_us_per_hit": r["server_cpu_us_per_hit"],
        "hits_per_s_fleet_over_redis": ratio(f["summary"]["hits_per_s"], r["summary"]["hits_per_s"]),
        "cpu_per_hit_fleet_over_redis": ratio(f["server_cpu_us_per_hit"], r["server_cpu_us_per_hit"]),
    })

doc = {
    "generated_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    "duration_s": int(duration_s), "tenants": int(tenants), "callers": int(callers),
    "redis_shared_connections": int(shared),
    "host": {"cpus": os.cpu_count(), "kernel": platform.release(),
             "load_average": os.getloadavg()},
    "redis_version": os.environ.get("REDIS_VERSION"),
    "workload": "per hit 1 GCRA charge (hooks, increment 1 us, capacity 1e9 us) + 1 unique "
                "claim (pending_ttl 60 s); fleet: 3 nodes, callers spread over them; "
                "Redis: no persistence",
    "fleet_nodes": os.environ.get("FLEET_MODE"),
    "idle_server_cpu_s_per_s": json.loads(os.environ["IDLE_JSON"]),
    "points": rows, "pairings": pairings,
}
with open(out_path, "w") as f:
    json.dump(doc, f, indent=2)

def fmt(x, spec):
    return format(x, spec) if x is not None else "-"

def ms(us):
    return f"{us / 1000:.2f} ms"

labels = {
    "plain": "plain: one connection per caller, unary `Hit` / one `EVALSHA` at a time per connection",
    "plain-node": "plain's floor: the same at `SCOPE_NODE`, each node alone (no Raft) / Redis' plain",
    "best": f"best: one `Client` per node shared by its callers / {shared} shared pipelining connection(s)",
}
print()
print(f"ankusa-fleet ({doc['fleet_nodes']}) vs one Redis {doc['redis_version']} (no persistence)"
      f" running hit.lua; {callers} closed-loop callers, {duration_s} s per point,"
      f" {tenants} tenants, {os.cpu_count()} CPUs, {doc['generated_at']}")
print("server CPU per hit = utime+stime of the 3 node processes / of redis-server over the hits;"
      " idle server CPU (s per s, included): "
      + ", ".join(f"{k} {v}" for k, v in doc["idle_server_cpu_s_per_s"].items()))
print()
print("| pairing | fleet hits/s | fleet server CPU per hit (3 nodes) | Redis hits/s | Redis CPU per hit | ratio | CPU per hit, fleet/Redis |")
print("|---|---|---|---|---|---|---|")
for p in pairings:
    print(f"| {labels[p['pairing']]} | {p['fleet_hits_per_s']:,.0f} | {fmt(p['fleet_cpu_us_per_hit'], '.1f')} µs"
          f" | {p['redis_hits_per_s']:,.0f} | {fmt(p['redis_cpu_us_per_hit'], '.1f')} µs"
          f" | {fmt(p['hits_per_s_fleet_over_redis'], '.2f')} | {fmt(p['cpu_per_hit_fleet_over_redis'], '.1f')} |")
print()
print("| point | system | bench | callers | hits/s | p50 | p99 | p999 | max | late starts | server CPU/hit | bench CPU/hit |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|")
for r in rows:
    m = r["summary"]
    rate = f" --rate {m['rate_per_s']:.0f}" if m.get("rate_per_s") else ""
    flags = " ".join(f"{k}={m[k]}" for k in ("errors", "not_allowed", "decided_local") if m.get(k))
    late = str(m["late_starts"]) if m.get("rate_per_s") else "-"
    print(f"| {r['point']} | {r['system']} | {m['target']}{rate}{(' ' + flags) if flags else ''}"
          f" | {m['callers']} | {m['hits_per_s']:,.0f} | {ms(m['p50_us'])} | {ms(m['p99_us'])}"
          f" | {ms(m['p999_us'])} | {ms(m['max_us'])} | {late}"
          f" | {fmt(r['server_cpu_us_per_hit'], '.1f')} µs | {fmt(r['client_cpu_us_per_hit'], '.1f')} µs |")
print()
print(f"raw results: {out_path}")
EOF
