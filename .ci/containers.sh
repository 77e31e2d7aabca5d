# Container tooling for tests/container.rs: podman, buildah, skopeo, runc, umoci, Debian's
# docker-registry, busybox-static and catatonit (podman builds its pod pause image from it),
# set up to work with no public registry.
#
# Sourced by .ci/run (under `set -euo pipefail`): no `cd` in this shell, no `exit`, every
# variable set before use. Idempotent: packages are installed only when missing; the
# configuration and the image store live in a cache directory outside the work tree.
#
#   CONTAINERS_CONF          runtime runc (crun refuses on hybrid cgroups), low default ulimits
#                            (podman's defaults exceed the hard limits here), no short-name search
#   CONTAINERS_STORAGE_CONF  the image store under the cache dir (vfs: works on any filesystem)
#   CONTAINERS_REGISTRIES_CONF  no unqualified-search registries: every name is fully qualified
#   VOLPREP_CONTAINERS=1     the container tests may run (they fail if it is set and they can't)
#
# Usable by hand: `source .ci/containers.sh && source .ci/static.sh && cargo test --release
# --test container -- --include-ignored`.

volprep_containers() {
  local cache="${VOLPREP_CI_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/volprep-ci}/containers"
  local need=() pkg_cmd pkg cmd
  for pkg_cmd in "podman:podman" "buildah:buildah" "skopeo:skopeo" "runc:runc" "umoci:umoci" \
                 "docker-registry:docker-registry" "busybox-static:busybox" "catatonit:catatonit" \
                 "uidmap:newuidmap" "attr:getfattr" "binutils:objcopy"; do
    pkg=${pkg_cmd%%:*}; cmd=${pkg_cmd##*:}
    command -v "$cmd" >/dev/null 2>&1 || need+=("$pkg")
  done
  # busybox must be the static one: it is copied alone into a FROM scratch image.
  if command -v busybox >/dev/null 2>&1 && ! dpkg -s busybox-static >/dev/null 2>&1; then
    need+=("busybox-static")
  fi
  if [ ${#need[@]} -gt 0 ]; then
    DEBIAN_FRONTEND=noninteractive apt-get update -q
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${need[@]}"
  fi

  mkdir -p "$cache/storage" "$cache/run"
  cat >"$cache/containers.conf" <<'EOF'
[containers]
default_ulimits = ["nofile=20000:20000", "nproc=4096:4096"]
log_driver = "k8s-file"

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
EOF
  cat >"$cache/storage.conf" <<EOF
[storage]
driver = "vfs"
graphroot = "$cache/storage"
runroot = "$cache/run"
EOF
  cat >"$cache/registries.conf" <<'EOF'
unqualified-search-registries = []
short-name-mode = "enforcing"
EOF
  export CONTAINERS_CONF="$cache/containers.conf"
  export CONTAINERS_STORAGE_CONF="$cache/storage.conf"
  export CONTAINERS_REGISTRIES_CONF="$cache/registries.conf"
  export VOLPREP_CONTAINERS=1

  echo "containers: $(podman --version), $(buildah --version | cut -d' ' -f1-3), $(skopeo --version)," \
    "runc $(runc --version | head -n1 | awk '{print $3}'), umoci $(umoci --version | awk '{print $3}')," \
    "$(docker-registry --version | awk '{print $1, $3}')"
}

volprep_containers
unset -f volprep_containers
