#!/usr/bin/env bash
# Build Istio's istioctl, a test peer, into the same cache as pilot-agent and
# print the path of the binary. Idempotent: a cached binary is not rebuilt.
#
#   bash tools/peers/istioctl.sh     # prints e.g. ~/.cache/draind-peers/istioctl-v0.0.0-2026...
#
# The same Istio version as pilot-agent (the versions are in
# tools/peers/pilot-agent.sh): `istioctl kube-inject` is Istio's own
# injector, run offline on deploy/istio (e2e/istio_linux_test.go, and
# docs/kubernetes.md, "Istio"). About three minutes of compiling on two
# cores after the downloads; the tests find it through DRAIND_ISTIOCTL or at
# this cache path.
set -euo pipefail
exec bash "$(dirname "${BASH_SOURCE[0]}")/pilot-agent.sh" istioctl
