#!/usr/bin/env bash
# make e2e-kubelet-vm: the kubelet tests inside a qemu VM booted with the
# cgroup v2 unified hierarchy alone (vmexec --cgroup2: cgroup_no_v1=all),
# whatever this machine mounts: containerd, runc and the kubelet
# (cgroupDriver: cgroupfs) on cgroup v2, as on current distributions. The
# VM sees this machine's root (containerd, runc, CNI plugins, Go) read-only
# under an overlay; containerd's and the kubelet's roots get a tmpfs of
# their own. See docs/kubernetes.md.
#
#   VM_KERNEL=6.12            the pinned kernel (tools/vmtest/vmtest.sh --help)
#   VM_MEMORY=4G              guest memory
#   KUBELET_VERSION=v1.34.2   the kubelet to build (cached, as for make e2e-kubelet)
#   RUN=regexp SKIP=regexp    as for make e2e-kubelet
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:/usr/local/go/bin:/usr/sbin:/sbin"
if [[ $(id -u) != 0 ]]; then
	echo "e2e-kubelet-vm: needs root (the VM runs as the host's root)" >&2
	exit 1
fi
repo=$(cd ../.. && pwd)
kernel=${VM_KERNEL:-6.12}
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1fs", b - a }'; }
for t in containerd runc ctr /usr/lib/cni/bridge; do
	command -v "$t" >/dev/null || { echo "e2e-kubelet-vm: $t missing: run make e2e-kubelet once (it installs them)" >&2; exit 1; }
done

tmp=$(mktemp -d "${TMPDIR:-/tmp}/draind-kubelet-vm.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
t=$(now)
KUBELET=$(bash hack/build-kubelet.sh "${KUBELET_VERSION:-v1.34.2}")
bash "$repo/tools/vmtest/vmtest.sh" --fetch --kernels "$kernel" >/dev/null
CGO_ENABLED=0 go -C "$repo/tools" build -o "$tmp/vmexec" ./vmtest/vmexec
go test -c -o "$tmp/kubelet.test" .
echo "e2e-kubelet-vm: phase build (kubelet cached)          $(since "$t")  $("$KUBELET" --version), kernel $kernel, cgroup v2 only"

# Software emulation on a shared machine: the tests' few wall-clock bounds, 5
# times longer (draind's start-up took 2.7 s to 6.4 s here, 0.3 s on the host).
export KUBELET DRAIND_E2E_KUBELET=1 DRAIND_E2E_TIME_SCALE=${DRAIND_E2E_TIME_SCALE:-5}
t=$(now)
status=0
"$tmp/vmexec" --kernel "$kernel" --cgroup2 --memory "${VM_MEMORY:-4G}" --tmpfs /var/lib/draind-e2e -- \
	"$tmp/kubelet.test" -test.count=1 -test.v -test.timeout 40m ${RUN:+-test.run "$RUN"} ${SKIP:+-test.skip "$SKIP"} || status=$?
echo "e2e-kubelet-vm: phase go test in the VM               $(since "$t") (exit $status)"
exit "$status"
