#!/usr/bin/env bash
# Builds a real kubelet from the Go module proxy, once per version, into
# ${DRAIND_KUBELET_CACHE:-~/.cache/draind-kubelet}/<version>/kubelet, and prints its path.
#
# k8s.io/kubernetes replaces its staging modules with ./staging/... paths, so
# `go install` cannot build its commands; a throwaway module that requires it
# and maps every staging module to its published version (v0.X.Y for v1.X.Y)
# builds k8s.io/kubernetes/cmd/kubelet unchanged.
set -euo pipefail
version=${1:-v1.34.2}
cache=${DRAIND_KUBELET_CACHE:-$HOME/.cache/draind-kubelet}/$version
out=$cache/kubelet
if [[ -x $out ]] && "$out" --version 2>/dev/null | grep -qx "Kubernetes $version"; then
	echo "$out"
	exit 0
fi
mkdir -p "$cache"
staging=v0.${version#v1.}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
gomod=$(cd "$work" && GOFLAGS=-mod=mod go mod download -json "k8s.io/kubernetes@$version" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",*$/\1/p')
[[ -f $gomod ]] || { echo "build-kubelet: no go.mod for k8s.io/kubernetes@$version" >&2; exit 1; }
{
	printf 'module draind.local/kubelet\n\ngo 1.26.0\n\nrequire k8s.io/kubernetes %s\n\nreplace (\n' "$version"
	# Every `k8s.io/NAME => ./staging/src/k8s.io/NAME` line of kubernetes' go.mod.
	sed -n 's#^[[:space:]]*\(k8s.io/[a-z0-9-]*\) => ./staging/.*#\t\1 => \1 '"$staging"'#p' "$gomod"
	printf ')\n'
} >"$work/go.mod"
cat >"$work/tools.go" <<'GO'
//go:build tools

package tools

import _ "k8s.io/kubernetes/cmd/kubelet"
GO
pkg=k8s.io/component-base/version
ldflags="-s -w -X $pkg.gitVersion=$version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$(echo "$version" | cut -d. -f2) -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
start=$(date +%s)
(cd "$work" && CGO_ENABLED=0 nice -n 10 go build -mod=mod -trimpath -ldflags "$ldflags" -o "$out.tmp" k8s.io/kubernetes/cmd/kubelet)
mv "$out.tmp" "$out"
echo "build-kubelet: built $version in $(( $(date +%s) - start ))s" >&2
echo "$out"
