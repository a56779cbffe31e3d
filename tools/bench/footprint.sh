#!/usr/bin/env bash
# draind's footprint (docs/benchmarks.md, "Footprint"), in one run. As root.
#
#   memory   `draind run` with N established flows in its pod namespace (0, 1k,
#            10k, 100k by default; FLOWS=...), opened after it is ready (its
#            table fills from eBPF events): VmRSS, RssAnon, RssFile, the Go heap
#            (from /metrics when it has the Go collector; the live heap of the
#            last GC from GODEBUG=gctrace=1 always)
#   conns    `draind conns` against `ss -tan` / `ss -tani` as whole processes
#            inside the namespace: wall, user and system time, minor page
#            faults, max RSS (medians of RUNS, default 5)
#   startup  exec of `draind run` to its first /healthz/ready 200 with a proxy
#            LIVE at once, the timeline of its log lines, and Istio's
#            pilot-agent with the same stand-in proxy (built by `make peers`)
#
# Extra environment for draind: DRAIND_ENV="GOGC=50 GOMEMLIMIT=..." (each
# word one --env).
set -euo pipefail
cd "$(dirname "$0")/../.."
make -s build >/dev/null
go -C tools build -o "$PWD/bin/footprint" ./bench/footprint
pilot=$(bash tools/peers/pilot-agent.sh 2>/dev/null || true)
envs=(--env GODEBUG=gctrace=1)
for e in ${DRAIND_ENV:-}; do envs+=(--env "$e"); done
echo "## memory (flows opened after draind is ready)"
./bin/footprint rss "${envs[@]}" --flows "${FLOWS:-0,1000,10000,100000}"
echo; echo "## conns against ss"
./bin/footprint conns --flows "${CONNS_FLOWS:-10000,100000}" --runs "${RUNS:-5}"
echo; echo "## start-up"
./bin/footprint startup "${envs[@]:2}" --runs "${STARTS:-10}" ${pilot:+--pilot-agent "$pilot"}
