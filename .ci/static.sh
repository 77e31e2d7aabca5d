# Builds the fully static volprep that the image ships, for tests/static_binary.rs and
# tests/container.rs (and .ci/image.sh).
#
# Sourced by .ci/run (under `set -euo pipefail`): no `cd` in this shell, no `exit`. The command
# is the Dockerfile builder's, for x86_64: glibc linked statically by
# `-C target-feature=+crt-static`, `cargo auditable` (the dependency list inside the binary),
# build paths remapped to the Dockerfile's (/build/volprep, /cargo) so no path of this machine
# lands in the binary; the dist profile (LTO, one codegen unit, stripped). A separate target dir keeps these
# RUSTFLAGS from invalidating the normal build; cargo makes the rebuild incremental.
# cargo-auditable is installed (pinned, the Dockerfile's version) into the CI cache when missing.
#
#   VOLPREP_STATIC_BIN  absolute path of the static binary
#
# Usable by hand: `source .ci/static.sh && cargo test --release --test static_binary -- --include-ignored`.

volprep_static_build() {
  local root triple="x86_64-unknown-linux-gnu"
  root="$(git rev-parse --show-toplevel 2>/dev/null || pwd)"
  local cache="${VOLPREP_CI_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/volprep-ci}"
  local cargo_home="${CARGO_HOME:-$HOME/.cargo}"
  local auditable_version
  auditable_version="$(sed -n 's/^ARG CARGO_AUDITABLE_VERSION=//p' "$root/Dockerfile")"
  local tools="$cache/cargo-auditable-$auditable_version"
  if [ ! -x "$tools/bin/cargo-auditable" ]; then
    cargo install --quiet --locked --root "$tools" "cargo-auditable@$auditable_version"
  fi
  local target_dir="$root/target/static"
  PATH="$tools/bin:$PATH" \
    RUSTFLAGS="-C target-feature=+crt-static --remap-path-prefix=$root=/build/volprep --remap-path-prefix=$cargo_home=/cargo" \
    CARGO_TARGET_DIR="$target_dir" \
    cargo auditable build --profile dist --locked --target "$triple" --manifest-path "$root/Cargo.toml"
  export VOLPREP_STATIC_BIN="$target_dir/$triple/dist/volprep"
  echo "static volprep: $VOLPREP_STATIC_BIN ($(stat -c %s "$VOLPREP_STATIC_BIN") bytes)"
}

volprep_static_build
unset -f volprep_static_build
