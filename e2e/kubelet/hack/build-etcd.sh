#!/usr/bin/env bash
# Builds etcd from the Go module proxy, once per version, into
# ${DRAIND_KUBELET_CACHE:-~/.cache/draind-kubelet}/etcd-<version>/etcd, and
# prints its path. Kubernetes 1.34 wants etcd 3.5 or newer; Debian
# bookworm's etcd-server is 3.4. `go install go.etcd.io/etcd/server/v3@...`
# is refused (its go.mod has replace directives), so a throwaway module
# requires it and builds its main package.
set -euo pipefail
version=${1:-v3.6.16}
cache=${DRAIND_KUBELET_CACHE:-$HOME/.cache/draind-kubelet}/etcd-$version
out=$cache/etcd
export PATH=$PATH:/usr/local/go/bin
if [[ -x $out ]] && "$out" --version 2>/dev/null | grep -q "^etcd Version: ${version#v}\$"; then
	echo "$out"
	exit 0
fi
mkdir -p "$cache"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
printf 'module draind.local/etcd\n\ngo 1.26.0\n' >"$work/go.mod"
printf '//go:build tools\n\npackage tools\n\nimport _ "go.etcd.io/etcd/server/v3"\n' >"$work/tools.go"
start=$(date +%s)
echo "build-etcd: building etcd $version (about a minute, once)" >&2
(cd "$work" && GOFLAGS= go get "go.etcd.io/etcd/server/v3@$version" >/dev/null 2>&1 &&
	GOFLAGS= CGO_ENABLED=0 nice -n 10 go build -mod=mod -trimpath -ldflags "-s -w" -o "$out.tmp" go.etcd.io/etcd/server/v3)
mv -f "$out.tmp" "$out"
echo "build-etcd: built in $(($(date +%s) - start))s" >&2
echo "$out"
