# syntax=docker/dockerfile:1
#
# volprep image: one fully static binary in an empty (scratch) image (3.5 MB, see docs/operations.md
# "Image"). Two ways to get the binary, one image:
#
#   BINARY=builder (default): built here, in the Rust image (needs docker.io and crates.io):
#     docker build -t volprep:0.1.0 .
#     docker buildx build --platform linux/amd64,linux/arm64 -t REGISTRY/volprep:0.1.0 --push .
#     podman build --platform linux/amd64,linux/arm64 --manifest volprep:0.1.0 .
#   BINARY=prebuilt: the binary built on the host by .ci/static.sh, the build context a directory
#     holding only it (what .ci/image.sh does, offline; no base image is pulled):
#     buildah bud --build-arg BINARY=prebuilt --timestamp "$SOURCE_DATE_EPOCH" -f Dockerfile DIR
#
# Both build the binary with the same command: glibc linked statically
# (`-C target-feature=+crt-static`), `cargo auditable` (the dependency list, an SBOM that
# `cargo audit bin`, syft or trivy read, travels inside the binary), and the build paths
# remapped (`--remap-path-prefix`), so no path of the machine that built it lands in the binary
# and the same toolchain gives the same bytes. With the layer timestamps fixed
# (`--timestamp`/SOURCE_DATE_EPOCH), two builds of one commit give the same image digest
# (tests/container.rs checks it). volprep takes numeric ids only, so it never needs NSS,
# /etc/passwd or a shell. The builder runs on the target platform (QEMU under buildx for the
# other architecture), so no cross linker is needed.
#
# Runs as root with every capability dropped but the few the manifests add back, and writes
# nothing to its root filesystem: `readOnlyRootFilesystem: true` works.

ARG RUST_VERSION=1.95
ARG BINARY=builder

# The binary built on the host (.ci/static.sh), the build context holding only it.
FROM scratch AS prebuilt
COPY volprep /out/volprep

FROM docker.io/library/rust:${RUST_VERSION}-slim-bookworm AS builder
ARG TARGETARCH
ARG CARGO_AUDITABLE_VERSION=0.7.7
RUN cargo install --locked "cargo-auditable@${CARGO_AUDITABLE_VERSION}"
WORKDIR /src
# The whole crate (see .dockerignore): Cargo.toml may name benches, tests or a build script
# that cargo wants to see even when it builds only the binary.
COPY . .
ENV RUSTFLAGS="-C target-feature=+crt-static --remap-path-prefix=/src=/build/volprep --remap-path-prefix=/usr/local/cargo=/cargo"
RUN set -eu; \
    case "${TARGETARCH:-amd64}" in \
      amd64) triple=x86_64-unknown-linux-gnu ;; \
      arm64) triple=aarch64-unknown-linux-gnu ;; \
      *) echo "unsupported TARGETARCH: ${TARGETARCH}" >&2; exit 1 ;; \
    esac; \
    cargo auditable build --profile dist --locked --target "$triple"; \
    install -D -m 0755 "target/$triple/dist/volprep" /out/volprep; \
    /out/volprep --version

FROM ${BINARY} AS binary

FROM scratch
ARG VERSION=0.1.0
ARG REVISION=unknown
ARG SOURCE=unknown
LABEL org.opencontainers.image.title="volprep" \
      org.opencontainers.image.description="Prepares a Kubernetes volume for a non-root app: group ownership and mode bits, fixed in parallel, only where wrong" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.source="${SOURCE}" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=binary /out/volprep /volprep
ENTRYPOINT ["/volprep"]
