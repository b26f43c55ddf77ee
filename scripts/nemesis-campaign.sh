#!/usr/bin/env bash
# A nemesis campaign: seeds FIRST..LAST, each for DURATION seconds on NODES nodes, with the
# release build; one summary line per run (the nemesis's own last line and its exit code)
# and, for a failing seed, its whole report under OUT.
#   bash scripts/nemesis-campaign.sh FIRST LAST DURATION NODES [OUT] [SLACK_MS]
set -euo pipefail
cd "$(dirname "$0")/.."
first=$1 last=$2 duration=$3 nodes=$4 out=${5:-data/nemesis} slack=${6:-5}
mkdir -p "$out"
cargo build --release --locked --quiet
for seed in $(seq "$first" "$last"); do
    report="$out/seed-$seed-n$nodes.txt"
    if ./target/release/ankusa-fleet nemesis --seed "$seed" --duration-s "$duration" \
        --nodes "$nodes" --deadline-slack-ms "$slack" > "$report" 2>&1; then
        status=0
    else
        status=$?
    fi
    echo "$(date -u +%FT%TZ) exit $status $(tail -n 1 "$report") | $(grep '^faults:' "$report" || true)"
    if [ "$status" = 0 ]; then rm -f "$report"; fi
done
