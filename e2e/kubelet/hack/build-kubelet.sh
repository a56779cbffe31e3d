#!/usr/bin/env bash
# Builds a real kubelet from the Go module proxy, once per version, into
# ${DRAIND_KUBELET_CACHE:-~/.cache/draind-kubelet}/<version>/kubelet, and
# prints its path: hack/build-k8s.sh (which builds make cluster's other
# components the same way, into the same place) for the kubelet alone.
set -euo pipefail
version=${1:-v1.34.2}
dir=$(bash "$(dirname "${BASH_SOURCE[0]}")/build-k8s.sh" "$version" kubelet)
echo "$dir/kubelet"
