#!/usr/bin/env bash
# make cluster / make cluster-down / make e2e-cluster: a single-node
# Kubernetes cluster on this machine, every component a process
# (internal/cluster). Installs what is missing from Debian, builds the
# components once per version (cached: hack/build-k8s.sh, hack/build-etcd.sh,
# hack/build-coredns.sh, tools/peers/pilot-agent.sh), then
#
#   hack/cluster.sh up     start it; prints the KUBECONFIG to use
#   hack/cluster.sh down   remove everything it made
#   hack/cluster.sh test   run the e2e-cluster tests (they start their own)
#
#   KUBELET_VERSION=v1.34.2  ETCD_VERSION=v3.6.16  COREDNS_VERSION=v1.15.0
#   RUN=regexp SKIP=regexp   (test) only these tests / not these
#   PROXY_SYNC_PERIOD=1s     kube-proxy's --iptables-min-sync-period
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:/usr/local/go/bin:/usr/sbin:/sbin"
cmd=${1:?usage: cluster.sh up|down|test}
if [[ $(id -u) != 0 ]]; then
	echo "cluster: needs root (it runs containerd, a kubelet, kube-proxy's iptables rules and pods)" >&2
	exit 1
fi
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1fs", b - a }'; }

if [[ $cmd == down ]]; then
	exec go run ./cmd/cluster down
fi

t=$(now)
bash ../../tools/deps.sh node # what a node runs, from Debian, when missing (one list)
echo "cluster: phase packages                        $(since "$t")"

t=$(now)
K8S_DIR=$(bash hack/build-k8s.sh "${KUBELET_VERSION:-v1.34.2}")
ETCD=$(bash hack/build-etcd.sh "${ETCD_VERSION:-v3.6.16}")
COREDNS=$(bash hack/build-coredns.sh "${COREDNS_VERSION:-v1.15.0}")
PILOT_AGENT=$(bash ../../tools/peers/pilot-agent.sh)
ISTIOCTL=$(bash ../../tools/peers/istioctl.sh)
ISTIOD=$(bash ../../tools/peers/pilot-agent.sh pilot-discovery)
echo "cluster: phase builds (cached per version)         $(since "$t")"
export DRAIND_CLUSTER_K8S_DIR=$K8S_DIR DRAIND_CLUSTER_ETCD=$ETCD DRAIND_CLUSTER_COREDNS=$COREDNS DRAIND_PILOT_AGENT=$PILOT_AGENT \
	DRAIND_ISTIOCTL=$ISTIOCTL DRAIND_CLUSTER_ISTIOD=$ISTIOD

case $cmd in
up)
	exec go run ./cmd/cluster up --k8s-dir "$K8S_DIR" --etcd "$ETCD" --coredns "$COREDNS" \
		--istiod "$ISTIOD" --istioctl "$ISTIOCTL" --pilot-agent "$PILOT_AGENT" \
		--istio-values ../../deploy/istio/injection-template.yaml --istio-values testdata/cluster/istio-values.yaml \
		--proxy-sync-period "${PROXY_SYNC_PERIOD:-1s}"
	;;
test)
	export DRAIND_E2E_CLUSTER=1 DRAIND_CLUSTER_PROXY_SYNC=${PROXY_SYNC_PERIOD:-}
	t=$(now)
	status=0
	# TEST_TIMEOUT: make bench-rollout's rounds outlast the tests' 40 min.
	go test -count=1 -v -timeout "${TEST_TIMEOUT:-40m}" ${RUN:+-run "$RUN"} ${SKIP:+-skip "$SKIP"} . || status=$?
	echo "e2e-cluster: phase go test                         $(since "$t") (exit $status)"
	exit "$status"
	;;
*)
	echo "cluster.sh: unknown command $cmd (up, down or test)" >&2
	exit 2
	;;
esac
