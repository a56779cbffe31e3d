#!/usr/bin/env bash
# make e2e-kubelet: draind under a real kubelet and containerd on this
# machine (root). Installs what is missing from Debian, builds the kubelet
# once per version (cached in ~/.cache/draind-kubelet), then runs the Go
# tests of e2e/kubelet, which build the images, start containerd and the
# kubelet, run the scenario pods and tear everything down.
#
#   KUBELET_VERSION=v1.34.2   the kubelet to build
#   RUN=regexp                only these tests (go test -run)
#   SKIP=regexp               not these (go test -skip)
#   DRAIND_KUBELET_CACHE=dir  where the kubelet binary is kept (~/.cache/draind-kubelet)
#   DRAIND_E2E_LOGS=1         print every pod's container logs, not only a failed test's
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:/usr/local/go/bin:/usr/sbin:/sbin"
if [[ $(id -u) != 0 ]]; then
	echo "e2e-kubelet: needs root (it runs containerd, a kubelet and pods)" >&2
	exit 1
fi
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1fs", b - a }'; }

t=$(now)
bash ../../tools/deps.sh node # what a node runs, from Debian, when missing (one list)
echo "e2e-kubelet: phase packages                        $(since "$t")"

t=$(now)
KUBELET=$(bash hack/build-kubelet.sh "${KUBELET_VERSION:-v1.34.2}")
echo "e2e-kubelet: phase kubelet build (cached per version) $(since "$t")  $("$KUBELET" --version)"

export KUBELET DRAIND_E2E_KUBELET=1
t=$(now)
status=0
go test -count=1 -v -timeout 30m ${RUN:+-run "$RUN"} ${SKIP:+-skip "$SKIP"} . || status=$?
echo "e2e-kubelet: phase go test                         $(since "$t") (exit $status)"
exit "$status"
