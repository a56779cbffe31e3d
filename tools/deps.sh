#!/usr/bin/env bash
# Installs what the tests use, when it is missing: Debian's packages (one
# apt-get, after `apt-get update`), then the Istio test peers
# (tools/peers: pilot-agent and istioctl, built once into
# ~/.cache/draind-peers). `make test` runs it first, so that a fresh
# machine skips no test for lack of a tool; .ci/run too.
#
#   bash tools/deps.sh            # packages and peers
#   bash tools/deps.sh packages   # the packages alone
#   bash tools/deps.sh node       # a node's alone: containerd, runc, CNI, iptables
#                                 # (make e2e-kubelet and make cluster)
#   bash tools/deps.sh bench      # the benchmarks' real clients: Python's requests,
#                                 # Node (make bench-keepalive)
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH=$PATH:/usr/local/go/bin:/usr/sbin:/sbin

# Each package, and a file that says it is installed. The test suites' own
# needs first, then make generate's, make vmtest's and the kubelet's.
pkgs=(
	nginx:/usr/sbin/nginx net-tools:/bin/netstat iproute2:/sbin/ip iptables:/usr/sbin/iptables
	tini:/usr/bin/tini-static util-linux:/usr/bin/setpriv python3:/usr/bin/python3 bpftool:/usr/sbin/bpftool
	clang-16:/usr/bin/clang-16 llvm-16:/usr/bin/llvm-strip-16 clang-format-16:/usr/bin/clang-format-16 libbpf-dev:/usr/include/bpf/bpf_helpers.h
	qemu-system-x86:/usr/bin/qemu-system-x86_64 qemu-system-arm:/usr/bin/qemu-system-aarch64 xz-utils:/usr/bin/xz kmod:/usr/bin/kmod
	containerd:/usr/bin/containerd runc:/usr/sbin/runc containernetworking-plugins:/usr/lib/cni/bridge conntrack:/usr/sbin/conntrack
	busybox-static:/bin/busybox
)
# What a node runs (e2e/kubelet: containerd, runc, the CNI bridge, tini for
# the init-wrapper image, iptables and conntrack for kube-proxy; busybox and
# netstat for the proxy image's shell, the recipe's preStop loop).
node=(containerd runc containernetworking-plugins iproute2 iptables tini conntrack busybox-static net-tools)
# The keep-alive clients of make bench-keepalive, beside Go's.
bench=(python3-requests:/usr/lib/python3/dist-packages/requests/__init__.py nodejs:/usr/bin/node)
[[ ${1:-} == bench ]] && pkgs=("${bench[@]}")
need=()
for p in "${pkgs[@]}"; do
	if [[ ${1:-} == node && ! " ${node[*]} " =~ " ${p%%:*} " ]]; then
		continue
	fi
	[[ -e ${p#*:} ]] || need+=("${p%%:*}")
done
if ((${#need[@]})); then
	if [[ $(id -u) != 0 ]]; then
		echo "deps: missing ${need[*]}: run as root (sudo make test) or apt-get install them" >&2
		exit 1
	fi
	echo "deps: apt-get install ${need[*]}" >&2
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
[[ ${1:-} == packages || ${1:-} == node || ${1:-} == bench ]] && exit 0
bash tools/peers/pilot-agent.sh >/dev/null
bash tools/peers/istioctl.sh >/dev/null
bash tools/peers/helm.sh >/dev/null
