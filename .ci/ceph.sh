# Installs Debian's Ceph 16 packages for the benchmark's CephFS storage (`--storages ceph`,
# benches/passes/ceph.rs), idempotently: apt only runs when a command is missing.
#
# Sourced by .ci/run (under `set -euo pipefail`): no `cd` in this shell, no `exit`.
# Usable by hand: `source .ci/ceph.sh && cargo bench --bench passes -- --smoke --storages ceph`.

volprep_ceph_install() {
  local need=() pkg_cmd pkg cmd
  for pkg_cmd in "ceph-mon:ceph-mon" "ceph-mgr:ceph-mgr" "ceph-osd:ceph-osd" "ceph-mds:ceph-mds" \
                 "ceph-fuse:ceph-fuse" "ceph-common:ceph" "ceph-common:monmaptool"; do
    pkg=${pkg_cmd%%:*}; cmd=${pkg_cmd##*:}
    command -v "$cmd" >/dev/null 2>&1 || need+=("$pkg")
  done
  if [ ${#need[@]} -gt 0 ]; then
    DEBIAN_FRONTEND=noninteractive apt-get update -q
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $(printf '%s\n' "${need[@]}" | sort -u)
  fi
  echo "ceph: $(ceph --version)"
}

volprep_ceph_install
unset -f volprep_ceph_install
