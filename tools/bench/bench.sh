#!/usr/bin/env bash
# Every benchmark of docs/benchmarks.md, in one run on one machine. As root.
set -euo pipefail
cd "$(dirname "$0")/../.."
echo "## snapshot"; bash tools/bench/snapshot.sh
echo "## go benchmarks (sockdiag, flows)"; go test -run '^$' -bench . -benchtime 20x ./internal/sockdiag ./internal/flows | grep -E '^(Benchmark|cpu)'
echo "## events"; bash tools/bench/events.sh
echo "## exit latency"; bash tools/bench/exit.sh "${DRAINS:-50}"
echo "## keep-alive clients across a drain (--close-idle-keepalives)"; make -s bench-keepalive
echo "## footprint"; bash tools/bench/footprint.sh
echo "## node density"; bash tools/bench/node.sh
