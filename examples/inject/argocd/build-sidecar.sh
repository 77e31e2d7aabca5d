#!/bin/sh
# Builds the Argo CD sidecar image of the Containerfile beside this script from local files,
# offline: a static volprep (VOLPREP, default: `volprep` on PATH), a static helm (HELM, default:
# `helm` on PATH) and a static busybox (BUSYBOX, default: `busybox` on PATH; Debian's
# busybox-static) for the plugin's `sh` and `mktemp`. With buildah when present, else podman or
# docker.
#   build-sidecar.sh TAG
# The image has no C library: each of the three must be statically linked (no ELF interpreter).
# A dynamically linked one (what `cargo install volprep` builds) stops the build here, naming
# it; in the image it would fail only at run time ("exec /usr/local/bin/volprep: no such file or
# directory"). A static volprep: the release binaries, the volprep image's /volprep, or
#   RUSTFLAGS='-C target-feature=+crt-static' cargo build --release --target x86_64-unknown-linux-gnu
set -eu
tag=${1:?usage: build-sidecar.sh TAG}
here=$(cd "$(dirname "$0")" && pwd)

# The path of the program to ship as NAME (from VAR or PATH), or a message and exit 1.
pick() {
  name=$1 given=$2
  path=${given:-$(command -v "$name" || true)}
  if [ -z "$path" ] || [ ! -f "$path" ]; then
    echo "build-sidecar.sh: no $name: set $(echo "$name" | tr a-z A-Z) to a static $name" >&2
    exit 1
  fi
  why=$(elf_not_static "$path") || {
    echo "build-sidecar.sh: $path: $why: the image has no C library, so $name must be statically linked (set $(echo "$name" | tr a-z A-Z))" >&2
    exit 1
  }
  echo "$path"
}

# Reads the ELF header and program headers of FILE (od only): succeeds for a static executable,
# else prints why not (not ELF, not 64-bit little-endian, or a PT_INTERP: dynamically linked).
elf_not_static() {
  magic=$(od -An -tx1 -N4 "$1" | tr -d ' \n')
  [ "$magic" = 7f454c46 ] || { echo "not an ELF executable"; return 1; }
  class=$(od -An -tu1 -j4 -N2 "$1" | tr -s ' ' | sed 's/^ //')
  [ "$class" = "2 1" ] || { echo "not a 64-bit little-endian ELF executable"; return 1; }
  phoff=$(od -An -tu8 -j32 -N8 "$1" | tr -d ' ')
  phentsize=$(od -An -tu2 -j54 -N2 "$1" | tr -d ' ')
  phnum=$(od -An -tu2 -j56 -N2 "$1" | tr -d ' ')
  i=0
  while [ "$i" -lt "$phnum" ]; do
    type=$(od -An -tu4 -j$((phoff + i * phentsize)) -N4 "$1" | tr -d ' ')
    [ "$type" != 3 ] || { echo "dynamically linked (it names an ELF interpreter)"; return 1; }
    i=$((i + 1))
  done
}

volprep=$(pick volprep "${VOLPREP:-}")
helm=$(pick helm "${HELM:-}")
busybox=$(pick busybox "${BUSYBOX:-}")
ctx=$(mktemp -d)
trap 'rm -rf "$ctx"' EXIT
root="$ctx/rootfs"
mkdir -p "$root/bin" "$root/usr/local/bin" "$root/home/argocd/cmp-server/config" "$root/tmp"
install -m 0755 "$busybox" "$root/bin/busybox"
for applet in sh mktemp cat rm mkdir ls env; do
  ln -s busybox "$root/bin/$applet"
done
install -m 0755 "$helm" "$root/usr/local/bin/helm"
install -m 0755 "$volprep" "$root/usr/local/bin/volprep"
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
