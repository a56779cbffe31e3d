#!/usr/bin/env bash
# Node density (docs/benchmarks.md, "Node density"; issue 21): a node full
# of idle draind pods and what it costs the other pods. As root. Flags go to
# `footprint node` (tools/bench/footprint/node.go), e.g.
#   bash tools/bench/node.sh --pods 10,40,110 --sockdiag-pods 110 --draining 10
# --pod-cgroup-pods 110 (the default; '' for none) runs the eBPF pods once
# more, each a cgroup v2 of its own (proxy and app containers) with
# `draind run --cgroup-root`, and drains --draining of them the same way:
# draind tracks TCP from its pod's cgroup, not the node's hook. With no
# cgroup2 mounted (a cgroup v1 host) one is mounted for the run, in this
# script's mount namespace; cgroups left by a killed run are empty
# `draind-bench-*` directories at the root of the hierarchy (rmdir them).
# About 7 minutes with the defaults on 2 CPUs.
set -euo pipefail
cd "$(dirname "$0")/../.."
make -s build >/dev/null
go -C tools build -o "$PWD/bin/footprint" ./bench/footprint
tmp=$(mktemp -d); chmod 755 "$tmp" # the proxy runs as uid 1337
trap 'rm -rf "$tmp"' EXIT
# A PID namespace of its own: however the benchmark ends, the kernel ends
# every process it started, and with them the network namespaces they hold.
TMPDIR=$tmp unshare --pid --fork --kill-child --mount-proc \
  ./bin/footprint node --draind bin/draind --envoysim bin/envoysim "$@"
