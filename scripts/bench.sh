#!/usr/bin/env bash
# Every benchmark of docs/benchmarks.md, in one run on one machine. As root.
set -euo pipefail
cd "$(dirname "$0")/.."
echo "## snapshot"; bash scripts/bench-snapshot.sh
echo "## go benchmarks (conntrack)"; go test -run '^$' -bench . -benchtime 20x ./internal/conntrack | grep -E '^(Benchmark|cpu)'
[ -f scripts/bench-events.sh ] && { echo "## events"; bash scripts/bench-events.sh; }
echo "## exit latency"; bash scripts/bench-exit.sh "${DRAINS:-50}"
