#!/usr/bin/env bash
# Builds the volprep image offline, reproducibly: the static binary of .ci/static.sh
# (VOLPREP_STATIC_BIN, built here when unset) copied into FROM scratch by the Dockerfile's
# BINARY=prebuilt path, with buildah, the layer and config timestamps fixed to the commit's
# time (SOURCE_DATE_EPOCH), then written as an OCI image layout (layers gzip-compressed, as a
# registry stores them). Two builds of one commit give the same digest.
#
#   bash .ci/image.sh OUT_DIR [TAG]     (needs .ci/containers.sh's configuration in the env)
#
# Leaves the image in the local store as TAG (default localhost/volprep:VERSION) and the
# layout in OUT_DIR (reference oci:OUT_DIR:VERSION); prints one line with the digest and sizes.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out="${1:?usage: image.sh OUT_DIR [TAG]}"
version="$(sed -n 's/^version = "\(.*\)"$/\1/p' "$root/Cargo.toml" | head -n1)"
tag="${2:-localhost/volprep:$version}"
if [ -z "${VOLPREP_STATIC_BIN:-}" ]; then
  # shellcheck source=/dev/null
  source "$root/.ci/static.sh" >&2
fi
revision="$(git -C "$root" rev-parse HEAD)"
export SOURCE_DATE_EPOCH="${SOURCE_DATE_EPOCH:-$(git -C "$root" log -1 --format=%ct)}"

# The host's architecture, as the Dockerfile's TARGETARCH (buildah warns when a declared
# platform argument has no value, even in a stage it skips).
case "$(uname -m)" in
  x86_64) arch=amd64 ;;
  aarch64) arch=arm64 ;;
  *) arch="$(uname -m)" ;;
esac

context="$(mktemp -d)"
trap 'rm -rf "$context"' EXIT
install -m 0755 "$VOLPREP_STATIC_BIN" "$context/volprep"
buildah bud --quiet --isolation chroot --pull=never \
  --build-arg BINARY=prebuilt --build-arg TARGETARCH="$arch" \
  --build-arg VERSION="$version" --build-arg REVISION="$revision" \
  --timestamp "$SOURCE_DATE_EPOCH" --identity-label=false \
  -f "$root/Dockerfile" -t "$tag" "$context" >/dev/null
rm -rf "$out"
skopeo copy --quiet "containers-storage:$tag" "oci:$out:$version"
manifest="$(skopeo inspect --raw "oci:$out:$version")"
digest="sha256:$(printf '%s' "$manifest" | sha256sum | cut -d' ' -f1)"
compressed="$(printf '%s' "$manifest" | python3 -c 'import json,sys; m=json.load(sys.stdin); print(m["config"]["size"] + sum(l["size"] for l in m["layers"]))')"
echo "image $tag digest $digest size $compressed bytes compressed, binary $(stat -c %s "$context/volprep") bytes, created $(date -u -d "@$SOURCE_DATE_EPOCH" +%FT%TZ)"
