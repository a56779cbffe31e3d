# syntax=docker/dockerfile:1.7
#
# The draind image: Envoy with draind as its entrypoint. draind starts and
# supervises Envoy, serves readiness on :15020, and on SIGTERM keeps Envoy
# alive exactly as long as the app still has work in flight.
#
#   docker buildx build --build-arg VERSION=$(git describe --always --dirty) -t draind:dev .
#
# Needs BuildKit (docker ≥ 23, buildx, buildah): the last stage uses
# RUN --mount. docs/kubernetes.md says how to run it in a pod; e2e/kubelet
# checks this file statically (go test ./e2e/kubelet -run Dockerfile).

# Envoy 1.39.1, distroless variant (no shell: draind needs none), pinned by
# tag AND the multi-arch index digest. Envoy ≥ 1.34 is required: drain
# semantics changed in 1.34 (docs/envoysim.md, "Envoy's behaviour, from its source"). The digest is the one public
# repositories pin for this tag (Envoy Gateway v1.9.x deployments and the
# registry's answer they recorded: index sha256:eb2c01c1…, linux/arm64
# sha256:62649e9c…); `docker buildx imagetools inspect` re-checks it.
ARG ENVOY_IMAGE=docker.io/envoyproxy/envoy:distroless-v1.39.1@sha256:eb2c01c13125d1629637cb4e4cce7207009fb7cc2c8027f9742758549d15b6f4
ARG GO_IMAGE=docker.io/library/golang:1.26-bookworm

# ---- build: a static draind, and setfcap (installs a file with file capabilities)
FROM --platform=$BUILDPLATFORM ${GO_IMAGE} AS build
ARG TARGETOS=linux
ARG TARGETARCH
ARG VERSION=dev
WORKDIR /src
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/root/go/pkg/mod go mod download
COPY cmd/ cmd/
COPY internal/ internal/
RUN --mount=type=cache,target=/root/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 GOOS=$TARGETOS GOARCH=$TARGETARCH go build -trimpath -tags grpcnotrace \
      -ldflags "-s -w -X github.com/draind/draind/internal/cli.Version=${VERSION}" \
      -o /out/draind ./cmd/draind
# setfcap lives in the e2e module (it shares the capability encoding with
# the test images); it imports nothing outside the standard library.
COPY e2e/kubelet/go.mod e2e/kubelet/go.sum e2e/kubelet/
COPY e2e/kubelet/internal/fcap/ e2e/kubelet/internal/fcap/
COPY e2e/kubelet/cmd/setfcap/ e2e/kubelet/cmd/setfcap/
RUN --mount=type=cache,target=/root/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    cd e2e/kubelet && CGO_ENABLED=0 GOOS=$TARGETOS GOARCH=$TARGETARCH go build -trimpath -o /out/setfcap ./cmd/setfcap

# ---- the image
FROM ${ENVOY_IMAGE}
ARG VERSION=dev
# File capabilities on draind, permitted only (+p, no effective bit): execve
# makes each one permitted when the container's bounding set has it
# (securityContext.capabilities.add; a non-root uid gets nothing else from
# it) and leaves the others out without failing, so the image starts under
# any securityContext. draind raises what it got at start and drops it all
# once started (docs/threat-model.md). BPF, PERFMON: eBPF tracking;
# NET_ADMIN: only to hand to Envoy with --proxy-caps NET_ADMIN (TPROXY).
# +ep would make execve refuse draind (EPERM, any uid) whenever the pod
# does not add every one of them. They are set in the same step that
# writes the binary, in this stage: COPY --from keeps security.capability
# only with some builders (kaniko drops it, moby/buildkit#3671 fixed one
# loss, #2250 is open), and a setcap after a COPY would copy the whole
# binary up into a second layer. docs/kubernetes.md has the table.
ARG DRAIND_FILE_CAPS=cap_bpf,cap_perfmon,cap_net_admin+p
# (Exec form: the base has no shell, and exec form expands no variables,
# so setfcap reads the ARG from its environment.)
RUN --mount=type=bind,from=build,source=/out,target=/mnt/draind \
    ["/mnt/draind/setfcap", "--caps-env", "DRAIND_FILE_CAPS", "/mnt/draind/draind", "/usr/local/bin/draind"]
LABEL org.opencontainers.image.title="draind" \
      org.opencontainers.image.description="Envoy supervised by draind: readiness, and a drain that lasts exactly as long as the app has work in flight" \
      org.opencontainers.image.source="https://github.com/draind/draind" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.base.name="docker.io/envoyproxy/envoy:distroless-v1.39.1" \
      org.opencontainers.image.base.digest="sha256:eb2c01c13125d1629637cb4e4cce7207009fb7cc2c8027f9742758549d15b6f4"
# Envoy's sockets are told apart by this uid (--proxy-uid, Istio's 1337).
USER 1337:1337
EXPOSE 15020
# draind run -- envoy ARGS: the arguments a pod gives (args:) are Envoy's;
# draind takes its settings from DRAIND_* variables (README, Configuration).
ENTRYPOINT ["/usr/local/bin/draind", "run", "--", "/usr/local/bin/envoy"]
# --disable-hot-restart as pilot-agent passes it: draind restarts nothing, and
# hot restart's shared memory would tie this Envoy to a base id.
CMD ["-c", "/etc/envoy/envoy.yaml", "--drain-time-s", "45", "--drain-strategy", "immediate", "--disable-hot-restart"]
