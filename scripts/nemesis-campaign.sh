#!/usr/bin/env bash
# A nemesis campaign: seeds FIRST..LAST, each for DURATION seconds on NODES nodes, with the
# release build; one line per run (the nemesis's summary line, its exit code, its faults
# and anomalies by kind) and, for a failing seed, its whole report under OUT.
# `python3 scripts/nemesis-summary.py` totals those lines.
#   bash scripts/nemesis-campaign.sh FIRST LAST DURATION NODES [OUT] [SLACK_MS]
# BIN=PATH runs that binary instead of building this tree (a campaign outlives edits).
# `$BIN nemesis` runs the ankusa-fleet-nemesis beside it (docs/reliability.md), so copy
# both binaries together.
set -euo pipefail
cd "$(dirname "$0")/.."
first=$1 last=$2 duration=$3 nodes=$4 out=${5:-data/nemesis} slack=${6:-5}
mkdir -p "$out"
bin=${BIN:-./target/release/ankusa-fleet}
if [ -z "${BIN:-}" ]; then cargo build --release --locked --quiet; fi
# `ankusa-fleet nemesis` looks beside its own executable, links followed.
if [ ! -x "$(dirname "$(readlink -f "$(command -v "$bin")")")/ankusa-fleet-nemesis" ]; then
    echo "nemesis-campaign: no ankusa-fleet-nemesis beside $bin (copy it there too)" >&2
    exit 1
fi
for seed in $(seq "$first" "$last"); do
    report="$out/seed-$seed-n$nodes.txt"
    if "$bin" nemesis --seed "$seed" --duration-s "$duration" \
        --nodes "$nodes" --deadline-slack-ms "$slack" > "$report" 2>&1; then
        status=0
    else
        status=$?
    fi
    faults=$(grep '^faults:' "$report" || true)
    anomalies=$(grep '^anomalies:' "$report" | sed 's/ (.*//' || true)
    deadlines=$(grep '^deadlines:' "$report" || true)
    echo "$(date -u +%FT%TZ) exit $status $(tail -n 1 "$report") | $faults | $anomalies | $deadlines"
    if [ "$status" = 0 ]; then rm -f "$report"; fi
done
