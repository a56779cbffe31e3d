#!/usr/bin/env bash
# Event-path benchmarks of the eBPF probe (internal/probes, tcpstate_linux_test.go).
# Needs root and a kernel with BTF. Usage: tools/bench/events.sh [CONNS] [CLOSES]
#
#   BenchmarkProbeThroughput/connect  CONNS loopback connections opened and closed
#                                     by several threads (10 state changes each)
#   BenchmarkProbeThroughput/listen   CONNS socket+listen+close (2 changes each,
#                                     no packets): the event path at full speed
#   BenchmarkProbeCloseLatency        CLOSES closes, close(2) -> event read p50/p99
#
# Metrics: events/s delivered, lost (the probe's counter), primary-misses and
# backup-covered (nested changes the backup program recovered), chain-breaks
# (changes missing with no counter noticing), primary/backup-ns/run.
set -euo pipefail
cd "$(dirname "$0")/../.."
conns=${1:-50000}
closes=${2:-1000}
go test -count=1 -run '^$' -bench 'BenchmarkProbeThroughput' -benchtime="${conns}x" ./internal/probes/
go test -count=1 -run '^$' -bench 'BenchmarkProbeCloseLatency' -benchtime="${closes}x" ./internal/probes/
