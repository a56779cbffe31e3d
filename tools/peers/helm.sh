#!/usr/bin/env bash
# Build Helm, a test peer, into the same cache as pilot-agent and print the
# path of the binary. Idempotent: a cached binary is not rebuilt.
#
#   bash tools/peers/helm.sh     # prints e.g. ~/.cache/draind-peers/helm-v3.19.5
#
# Most Istio installations are made with Helm: e2e/istio_inject_linux_test.go
# renders Istio's istiod chart (from the istio.io/istio module at
# pilot-agent's version, tools/peers/pilot-agent.sh) with deploy/istio's
# values, as `helm install istiod` would, and checks the injector
# configuration against istioctl's. About two minutes of compiling on two
# cores after the downloads; the test finds it through DRAIND_HELM or at
# this cache path.
set -euo pipefail

HELM_VERSION=v3.19.5

cache=${DRAIND_PEERS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/draind-peers}
bin=$cache/helm-$HELM_VERSION
if [[ -x $bin ]]; then
	echo "$bin"
	exit 0
fi
PATH=$PATH:/usr/local/go/bin
command -v go >/dev/null || { echo "helm.sh: go not found (PATH or /usr/local/go/bin)" >&2; exit 1; }
mkdir -p "$cache"
work=$(mktemp -d "$cache/build.XXXXXX")
trap 'rm -rf "$work"' EXIT
echo "helm.sh: building helm.sh/helm/v3@$HELM_VERSION (takes minutes)" >&2
start=$(date +%s)
GOFLAGS= CGO_ENABLED=0 GOBIN=$work nice -n 10 go install -trimpath "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
mv -f "$work/helm" "$bin"
echo "helm.sh: built in $(($(date +%s) - start)) s" >&2
echo "$bin"
