#!/usr/bin/env bash
# Idle cost: draind's CPU time and wake-ups (context switches, all threads)
# over SECONDS (default 60) in an idle pod namespace, for `draind run` in
# Ready (envoysim as the proxy) with each tracker mode. Target (docs/design.md,
# "Targets"):
# no periodic wake-ups while Ready in eBPF mode. Run as root.
set -euo pipefail
cd "$(dirname "$0")/../.."
secs=${1:-60}
make -s build >/dev/null
tmp=$(mktemp -d); chmod 755 "$tmp"
ns=draind-idle-$$
cleanup() { pkill -P $$ 2>/dev/null || true; ip netns del "$ns" 2>/dev/null || true; rm -rf "$tmp"; }
trap cleanup EXIT
cat >"$tmp/envoy.json" <<JSON
{"admin_address":"127.0.0.1:15000","listeners":[{"name":"inbound","address":"0.0.0.0:15006","direction":"inbound","protocol":"http","upstream":"127.0.0.1:8080"}]}
JSON
ticks=$(getconf CLK_TCK)
wakeups() { # sum of context switches over the threads of $1
  cat /proc/"$1"/task/*/status 2>/dev/null | awk '/ctxt_switches/ {s+=$2} END {print s+0}'
}
cputicks() { awk '{print $14+$15}' /proc/"$1"/stat; }
printf "| mode | draind CPU over %ss | wake-ups (context switches) | per second |\n|---|---|---|---|\n" "$secs"
for mode in ebpf sockdiag; do
  ip netns add "$ns"; ip -n "$ns" link set lo up
  ip netns exec "$ns" bin/draind run --tracker "$mode" --status-addr 127.0.0.1:15020 --run-proxy-as 1337 \
    --log-format console -- "$PWD/bin/envoysim" -c "$tmp/envoy.json" >"$tmp/$mode.log" 2>&1 &
  pid=$!
  for _ in $(seq 50); do grep -q '"phase": "ready"\|phase.*ready' "$tmp/$mode.log" && break; sleep 0.1; done
  sleep 2 # past start-up
  c0=$(cputicks $pid); w0=$(wakeups $pid)
  sleep "$secs"
  c1=$(cputicks $pid); w1=$(wakeups $pid)
  kill -TERM $pid; wait $pid 2>/dev/null || true
  ip netns del "$ns"
  cpu_ms=$(( (c1 - c0) * 1000 / ticks ))
  printf "| %s | %d ms | %d | %s |\n" "$mode" "$cpu_ms" $((w1 - w0)) "$(awk -v w=$((w1 - w0)) -v s="$secs" 'BEGIN{printf "%.2f", w/s}')"
done
