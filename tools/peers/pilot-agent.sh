#!/usr/bin/env bash
# Build Istio's pilot-agent, a test peer, into a cache and print the path of
# the binary. Idempotent: a binary already in the cache is not rebuilt.
#
#   bash tools/peers/pilot-agent.sh          # prints e.g. ~/.cache/draind-peers/pilot-agent-v0.0.0-2026...
#   bash tools/peers/pilot-agent.sh istioctl # the same for istioctl (tools/peers/istioctl.sh)
#
# The tests of internal/testenv/mesh use it (`pilot-agent istio-iptables`:
# Istio's own interception rules). They find it through DRAIND_PILOT_AGENT or
# at this same cache path. Needs Go and the Go module proxy; about two
# minutes on two cores with an empty module cache.
#
# Why not `go install istio.io/istio/pilot/cmd/pilot-agent@VERSION`: the
# module proxy refuses three pseudo-versions Istio pins (istio.io/api and
# go-control-plane's envoy and contrib modules). A throwaway module replaces
# them with the nearest versions the proxy serves; Istio compiles unchanged.
# Not `go mod tidy`: it chases test dependencies the proxy also refuses.
set -euo pipefail

# Keep ISTIO_VERSION in step with mesh.IstioVersion
# (internal/testenv/mesh/pilotagent.go); a test checks that they agree.
ISTIO_VERSION=v0.0.0-20260827124520-eed52ebb66ad
ISTIO_API_VERSION=v1.31.1
GO_CONTROL_PLANE_ENVOY=v1.37.1-0.20260729145720-a2d8c7492908
GO_CONTROL_PLANE_CONTRIB=v1.36.1-0.20260729145720-a2d8c7492908

# The command to build: pilot-agent (default), istioctl or pilot-discovery
# (istiod), from the same Istio version, so that istioctl's and istiod's
# injectors match the pilot-agent run.
peer=${1:-pilot-agent}
case $peer in
pilot-agent) pkg=istio.io/istio/pilot/cmd/pilot-agent ;;
istioctl) pkg=istio.io/istio/istioctl/cmd/istioctl ;;
pilot-discovery) pkg=istio.io/istio/pilot/cmd/pilot-discovery ;; # istiod, for make cluster
*) echo "pilot-agent.sh: unknown peer $peer (pilot-agent, istioctl or pilot-discovery)" >&2; exit 2 ;;
esac

cache=${DRAIND_PEERS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/draind-peers}
bin=$cache/$peer-$ISTIO_VERSION
if [[ -x $bin ]]; then
	echo "$bin"
	exit 0
fi

PATH=$PATH:/usr/local/go/bin
command -v go >/dev/null || { echo "pilot-agent.sh: go not found (PATH or /usr/local/go/bin)" >&2; exit 1; }

mkdir -p "$cache"
work=$(mktemp -d "$cache/build.XXXXXX")
trap 'rm -rf "$work"' EXIT
cat >"$work/go.mod" <<GOMOD
module peers.local/pilotagent

go 1.26.0

require istio.io/istio $ISTIO_VERSION

replace (
	istio.io/api => istio.io/api $ISTIO_API_VERSION
	github.com/envoyproxy/go-control-plane/envoy => github.com/envoyproxy/go-control-plane/envoy $GO_CONTROL_PLANE_ENVOY
	github.com/envoyproxy/go-control-plane/contrib => github.com/envoyproxy/go-control-plane/contrib $GO_CONTROL_PLANE_CONTRIB
)
GOMOD

echo "pilot-agent.sh: building istio.io/istio@$ISTIO_VERSION $peer (takes minutes)" >&2
start=$(date +%s)
# GOFLAGS from the environment (e.g. -mod=vendor) must not leak into this
# throwaway module; CGO off gives a static binary that also runs in the VMs.
(cd "$work" && GOFLAGS= CGO_ENABLED=0 nice -n 10 go build -mod=mod -trimpath -o "$peer" "$pkg")
# Rename into place: a concurrent run or an interrupted build never leaves a
# half-written binary at the final path.
mv -f "$work/$peer" "$bin"
echo "pilot-agent.sh: built in $(($(date +%s) - start)) s" >&2
echo "$bin"
