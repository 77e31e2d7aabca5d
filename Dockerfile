# syntax=docker/dockerfile:1
#
# volprep image: one fully static binary in an empty (scratch) image, about 2 MB.
#
#   docker build -t volprep:0.1.0 .
#   docker buildx build --platform linux/amd64,linux/arm64 -t REGISTRY/volprep:0.1.0 --push .
#   podman build --platform linux/amd64,linux/arm64 --manifest volprep:0.1.0 .
#
# The binary is glibc linked statically (`-C target-feature=+crt-static`); volprep takes numeric
# ids only, so it never needs NSS, /etc/passwd or a shell. The builder runs on the target
# platform (QEMU under buildx for the other architecture), so no cross linker is needed.
# The same cargo command builds the binary that tests/static_binary.rs runs in an empty chroot
# (.ci/static.sh); tests/examples.rs checks that this file and that script agree.
#
# Runs as root with every capability dropped but the few the manifests add back, and writes
# nothing to its root filesystem: `readOnlyRootFilesystem: true` works.

ARG RUST_VERSION=1.95

FROM rust:${RUST_VERSION}-slim-bookworm AS builder
ARG TARGETARCH
WORKDIR /src
# The whole crate (see .dockerignore): Cargo.toml may name benches, tests or a build script
# that cargo wants to see even when it builds only the binary.
COPY . .
ENV RUSTFLAGS="-C target-feature=+crt-static"
RUN set -eu; \
    case "${TARGETARCH:-amd64}" in \
      amd64) triple=x86_64-unknown-linux-gnu ;; \
      arm64) triple=aarch64-unknown-linux-gnu ;; \
      *) echo "unsupported TARGETARCH: ${TARGETARCH}" >&2; exit 1 ;; \
    esac; \
    cargo build --release --locked --target "$triple"; \
    install -D -m 0755 "target/$triple/release/volprep" /out/volprep; \
    /out/volprep --version

FROM scratch
ARG VERSION=0.1.0
ARG REVISION=unknown
LABEL org.opencontainers.image.title="volprep" \
      org.opencontainers.image.description="Prepares a Kubernetes volume for a non-root app: group ownership and mode bits, fixed in parallel, only where wrong" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=builder /out/volprep /volprep
ENTRYPOINT ["/volprep"]
