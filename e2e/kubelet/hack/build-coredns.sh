#!/usr/bin/env bash
# Builds CoreDNS from the Go module proxy, once per version, into
# ${DRAIND_KUBELET_CACHE:-~/.cache/draind-kubelet}/coredns-<version>/coredns,
# and prints its path: make cluster's cluster DNS (internal/cluster/dns.go).
# Its go.mod has no replace directives, so `go install` builds the released
# main package as it is, every plugin of its plugin.cfg in. Debian bookworm
# has no coredns package.
set -euo pipefail
version=${1:-v1.15.0}
cache=${DRAIND_KUBELET_CACHE:-$HOME/.cache/draind-kubelet}/coredns-$version
out=$cache/coredns
export PATH=$PATH:/usr/local/go/bin
if [[ -x $out ]] && "$out" -version 2>/dev/null | grep -q "^CoreDNS-${version#v}\$"; then
	echo "$out"
	exit 0
fi
mkdir -p "$cache"
work=$(mktemp -d "$cache/build.XXXXXX")
trap 'rm -rf "$work"' EXIT
start=$(date +%s)
echo "build-coredns: building CoreDNS $version (a few minutes, once)" >&2
GOBIN=$work GOFLAGS= CGO_ENABLED=0 nice -n 10 go install -trimpath \
	-ldflags "-s -w -X github.com/coredns/coredns/coremain.GitCommit=$version" \
	"github.com/coredns/coredns@$version"
mv -f "$work/coredns" "$out"
echo "build-coredns: built in $(($(date +%s) - start))s" >&2
echo "$out"
