#!/usr/bin/env bash
# Exit latency: last downstream flow closed → draind sends /quitquitquit,
# p50/p99 over N drains per tracker mode (default 50). Run as root.
set -euo pipefail
cd "$(dirname "$0")/../.."
n=${1:-50}
go test -count=1 -run '^$' -bench 'ExitLatency' -benchtime "${n}x" -timeout 30m ./e2e | grep -E '^(Benchmark|goos|cpu)'
