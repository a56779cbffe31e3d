#!/usr/bin/env bash
# Snapshot cost at 1k/10k/100k established loopback connections: draind's
# listener check and full snapshot against ss, netstat and /proc/net/tcp.
# Prints a Markdown table (docs/benchmarks.md). Run as root.
set -euo pipefail
cd "$(dirname "$0")/../.."
command -v netstat >/dev/null || { echo "needs netstat (apt-get install net-tools) for the comparison" >&2; exit 1; }
CGO_ENABLED=0 go build -o bin/draind ./cmd/draind
go -C tools build -o "$PWD/bin/benchsnap" ./bench/benchsnap
./bin/benchsnap --draind bin/draind --flows "${FLOWS:-1000,10000,100000}" --budget "${BUDGET:-2s}"
