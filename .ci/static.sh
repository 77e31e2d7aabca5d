# Builds the fully static volprep that the Dockerfile ships, for tests/static_binary.rs.
#
# Sourced by .ci/run (under `set -euo pipefail`): no `cd` in this shell, no `exit`. The command
# is the Dockerfile's, for x86_64: glibc linked statically by `-C target-feature=+crt-static`,
# release profile (LTO, stripped). A separate target dir keeps these RUSTFLAGS from
# invalidating the normal build; cargo makes the rebuild incremental.
#
#   VOLPREP_STATIC_BIN  absolute path of the static binary
#
# Usable by hand: `source .ci/static.sh && cargo test --release --test static_binary`.

volprep_static_build() {
  local root triple="x86_64-unknown-linux-gnu"
  root="$(git rev-parse --show-toplevel 2>/dev/null || pwd)"
  local target_dir="$root/target/static"
  RUSTFLAGS="-C target-feature=+crt-static" CARGO_TARGET_DIR="$target_dir" \
    cargo build --release --locked --target "$triple" --manifest-path "$root/Cargo.toml"
  export VOLPREP_STATIC_BIN="$target_dir/$triple/release/volprep"
  echo "static volprep: $VOLPREP_STATIC_BIN ($(stat -c %s "$VOLPREP_STATIC_BIN") bytes)"
}

volprep_static_build
unset -f volprep_static_build
