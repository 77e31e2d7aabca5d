#!/bin/sh
# Builds the Argo CD sidecar image of the Containerfile beside this script from local files,
# offline: the static volprep (VOLPREP, default: `volprep` on PATH; .ci/static.sh builds one,
# or copy it out of the volprep image), a static helm (HELM, default: `helm` on PATH) and a
# static busybox (BUSYBOX, default: `busybox` on PATH; Debian's busybox-static) for the
# plugin's `sh` and `mktemp`. With buildah when present, else podman or docker.
#   build-sidecar.sh TAG
set -eu
tag=${1:?usage: build-sidecar.sh TAG}
here=$(cd "$(dirname "$0")" && pwd)
ctx=$(mktemp -d)
trap 'rm -rf "$ctx"' EXIT
root="$ctx/rootfs"
mkdir -p "$root/bin" "$root/usr/local/bin" "$root/home/argocd/cmp-server/config" "$root/tmp"
install -m 0755 "${BUSYBOX:-$(command -v busybox)}" "$root/bin/busybox"
for applet in sh mktemp cat rm mkdir ls env; do
  ln -s busybox "$root/bin/$applet"
done
install -m 0755 "${HELM:-$(command -v helm)}" "$root/usr/local/bin/helm"
install -m 0755 "${VOLPREP:-$(command -v volprep)}" "$root/usr/local/bin/volprep"
install -m 0644 "$here/plugin.yaml" "$root/home/argocd/cmp-server/config/plugin.yaml"
chmod 1777 "$root/tmp"
if command -v buildah >/dev/null 2>&1; then
  buildah bud --quiet --pull=never --isolation chroot -f "$here/Containerfile" -t "$tag" "$ctx" >/dev/null
elif command -v podman >/dev/null 2>&1; then
  podman build --quiet --pull=never -f "$here/Containerfile" -t "$tag" "$ctx" >/dev/null
else
  docker build --quiet -f "$here/Containerfile" -t "$tag" "$ctx" >/dev/null
fi
echo "$tag"
