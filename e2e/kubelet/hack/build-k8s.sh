#!/usr/bin/env bash
# Builds real Kubernetes components from the Go module proxy, once per
# version, into ${DRAIND_KUBELET_CACHE:-~/.cache/draind-kubelet}/<version>/,
# and prints that directory.
#
#   bash hack/build-k8s.sh [VERSION] [COMMAND...]
#
# COMMANDs default to the node's and the control plane's: kubelet,
# kube-apiserver, kube-controller-manager, kube-scheduler, kube-proxy and
# kubectl. `hack/build-kubelet.sh` asks for the kubelet alone.
#
# k8s.io/kubernetes replaces its staging modules with ./staging/... paths, so
# `go install` cannot build its commands; a throwaway module that requires it
# and maps every staging module to its published version (v0.X.Y for v1.X.Y)
# builds them unchanged, in one `go build` so that the packages they share
# compile once.
set -euo pipefail
version=${1:-v1.34.2}
shift || true
cmds=("$@")
((${#cmds[@]})) || cmds=(kubelet kube-apiserver kube-controller-manager kube-scheduler kube-proxy kubectl)
cache=${DRAIND_KUBELET_CACHE:-$HOME/.cache/draind-kubelet}/$version
export PATH=$PATH:/usr/local/go/bin

# A binary is current when it reports the version it was stamped with.
current() {
	local out=$cache/$1
	[[ -x $out ]] || return 1
	case $1 in
	kubectl) "$out" version --client 2>/dev/null | grep -q "Client Version: $version\$" ;;
	*) "$out" --version 2>/dev/null | grep -qx "Kubernetes $version" ;;
	esac
}
missing=()
for c in "${cmds[@]}"; do
	current "$c" || missing+=("$c")
done
if ((${#missing[@]} == 0)); then
	echo "$cache"
	exit 0
fi

mkdir -p "$cache"
staging=v0.${version#v1.}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
gomod=$(cd "$work" && GOFLAGS=-mod=mod go mod download -json "k8s.io/kubernetes@$version" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",*$/\1/p')
[[ -f $gomod ]] || { echo "build-k8s: no go.mod for k8s.io/kubernetes@$version" >&2; exit 1; }
{
	printf 'module draind.local/k8s\n\ngo 1.26.0\n\nrequire k8s.io/kubernetes %s\n\nreplace (\n' "$version"
	# Every `k8s.io/NAME => ./staging/src/k8s.io/NAME` line of kubernetes' go.mod.
	sed -n 's#^[[:space:]]*\(k8s.io/[a-z0-9-]*\) => ./staging/.*#\t\1 => \1 '"$staging"'#p' "$gomod"
	printf ')\n'
} >"$work/go.mod"
pkgs=()
{
	printf '//go:build tools\n\npackage tools\n\nimport (\n'
	for c in "${missing[@]}"; do
		case $c in
		kubectl) p=k8s.io/kubernetes/cmd/kubectl ;;
		kubelet | kube-apiserver | kube-controller-manager | kube-scheduler | kube-proxy) p=k8s.io/kubernetes/cmd/$c ;;
		*) echo "build-k8s: unknown command $c" >&2; exit 2 ;;
		esac
		pkgs+=("$p")
		printf '\t_ "%s"\n' "$p"
	done
	printf ')\n'
} >"$work/tools.go"
pkg=k8s.io/component-base/version
minor=$(echo "$version" | cut -d. -f2)
ldflags="-s -w -X $pkg.gitVersion=$version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
# kubectl reads its version from client-go's copy of the same variables.
cpkg=k8s.io/client-go/pkg/version
ldflags="$ldflags -X $cpkg.gitVersion=$version -X $cpkg.gitMajor=1 -X $cpkg.gitMinor=$minor -X $cpkg.gitTreeState=clean -X $cpkg.buildDate=1970-01-01T00:00:00Z"
start=$(date +%s)
echo "build-k8s: building ${missing[*]} at $version (minutes, once)" >&2
mkdir -p "$work/out"
(cd "$work" && CGO_ENABLED=0 nice -n 10 go build -mod=mod -trimpath -ldflags "$ldflags" -o "$work/out/" "${pkgs[@]}")
# Rename into place: an interrupted build never leaves a half-written binary.
for c in "${missing[@]}"; do
	mv -f "$work/out/$c" "$cache/$c"
done
echo "build-k8s: built ${missing[*]} in $(($(date +%s) - start))s" >&2
echo "$cache"
