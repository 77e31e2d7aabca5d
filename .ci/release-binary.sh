#!/usr/bin/env bash
# The release's static binary and its checksum: the binary .ci/static.sh builds (the image's,
# VOLPREP_STATIC_BIN, built here when unset), named volprep-VERSION-x86_64-linux, and a
# sha256sum line for it, in OUT_DIR. The release workflow uploads both; `sha256sum -c` checks.
#
#   bash .ci/release-binary.sh OUT_DIR     (prints the binary's path)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out="${1:?usage: release-binary.sh OUT_DIR}"
version="$(sed -n 's/^version = "\(.*\)"$/\1/p' "$root/Cargo.toml" | head -n1)"
if [ -z "${VOLPREP_STATIC_BIN:-}" ]; then
  # shellcheck source=/dev/null
  source "$root/.ci/static.sh" >&2
fi
name="volprep-$version-x86_64-linux"
mkdir -p "$out"
install -m 0755 "$VOLPREP_STATIC_BIN" "$out/$name"
(cd "$out" && sha256sum "$name" >"$name.sha256")
echo "$out/$name"
