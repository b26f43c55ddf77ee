"""Totals the lines of scripts/nemesis-campaign.sh: runs, failing runs, operations, faults
by kind, anomalies by checker, and the calls that ran to their timeout by how late they
came (with the campaign's p99 and latest).

    python3 scripts/nemesis-summary.py campaign.log [more.log ...]
"""

import collections
import json
import re
import sys

runs = failed = ops = 0
faults = collections.Counter()
anomalies = collections.Counter()
skipped = 0
lateness = collections.Counter()
latest_us = 0
for path in sys.argv[1:]:
    with open(path, encoding="utf-8") as lines:
        for line in lines:
            summary = re.search(r"nemesis seed \d+: (\d+) ops, (\d+) faults, (\d+) anomalies", line)
            if not summary:
                continue
            runs += 1
            ops += int(summary.group(1))
            failed += int(summary.group(3)) > 0
            kinds = re.search(r"faults: (\{[^}]*\}) \((\d+) skipped", line)
            if kinds:
                faults.update(json.loads(kinds.group(1)))
                skipped += int(kinds.group(2))
            found = re.search(r"anomalies: (\{[^}]*\})", line)
            if found:
                anomalies.update(json.loads(found.group(1)))
            late = re.search(r"deadlines: (\{[^}]*\}).*the latest (\d+) µs past", line)
            if late:
                lateness.update(json.loads(late.group(1)))
                latest_us = max(latest_us, int(late.group(2)))
print(f"runs {runs}, failing {failed}, ops {ops}")
print(f"faults {sum(faults.values())} {dict(sorted(faults.items()))}, skipped {skipped}")
print(f"anomalies {sum(anomalies.values())} {dict(sorted(anomalies.items()))}")
order = ["in time", "<=1ms", "<=2ms", "<=5ms", ">5ms"]
total = sum(lateness.values())
p99 = None
if total:
    seen = 0
    for name in order:
        seen += lateness[name]
        if seen >= 0.99 * total:
            p99 = name
            break
print(f"ran to their timeout {total} {dict((n, lateness[n]) for n in order)}, p99 {p99}, latest {latest_us} µs past")
