# Installs the real apps of the app matrix (tests/apps.rs) from Debian packages, and the users
# they run as, idempotently: apt only runs when a command is missing, users only when absent.
#
# Sourced by .ci/run (under `set -euo pipefail`): no `cd` in this shell, no `exit`.
# Usable by hand: `source .ci/apps.sh && cargo test --release --test apps -- --include-ignored`.
#
# The packages' maintainer scripts would start their daemons (PostgreSQL's cluster, MariaDB,
# Redis, sshd, etcd, nginx, Prometheus): a policy-rc.d that refuses every start is put in place
# for the install (and removed after, when this script put it there), so nothing is left running
# and nothing fails on a machine without systemd. PostgreSQL's default cluster is not created.

volprep_apps_install() {
  local need=() pkg_cmd pkg cmd started=$SECONDS
  for pkg_cmd in "postgresql:/usr/lib/postgresql/15/bin/pg_ctl" "mariadb-server:mariadbd" \
                 "redis-server:redis-server" "openssh-server:/usr/sbin/sshd" "openssh-client:ssh" \
                 "git:git" "gnupg:gpg" "etcd-server:etcd" "etcd-client:etcdctl" "nginx-light:nginx" \
                 "prometheus:prometheus" "erlang-base:erl" "sqlite3:sqlite3" "ruby:ruby" \
                 "python3:python3" "util-linux:setpriv" "util-linux:unshare" "curl:curl"; do
    pkg=${pkg_cmd%%:*}; cmd=${pkg_cmd#*:}
    command -v "$cmd" >/dev/null 2>&1 || PATH="$PATH:/usr/sbin:/sbin" command -v "$cmd" >/dev/null 2>&1 \
      || need+=("$pkg")
  done
  if [ ${#need[@]} -gt 0 ]; then
    local policy=/usr/sbin/policy-rc.d ours=0
    if [ ! -e "$policy" ]; then
      printf '#!/bin/sh\n# volprep .ci/apps.sh: no daemon starts during the install\nexit 101\n' >"$policy"
      chmod 0755 "$policy"
      ours=1
    fi
    # No default PostgreSQL cluster (it would be created in /var/lib/postgresql and started).
    mkdir -p /etc/postgresql-common/createcluster.d
    echo 'create_main_cluster = false' >/etc/postgresql-common/createcluster.d/volprep-no-main.conf
    DEBIAN_FRONTEND=noninteractive apt-get update -q
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
      -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold \
      $(printf '%s\n' "${need[@]}" | sort -u)
    [ "$ours" = 1 ] && rm -f "$policy"
    echo "apps: installed ${need[*]} in $((SECONDS - started)) s"
  fi

  # The app's user (uid and group 2000) and a second member of its group, as a pod's fsGroup
  # is shared: Debian's OpenSSH accepts group-writable files when the user is the group's only
  # member, upstream never does. The password field is `*` (no password, not locked: sshd
  # refuses locked accounts); the home is where the ssh test binds its volume.
  getent group 2000 >/dev/null || groupadd -g 2000 volprep-app
  getent passwd 2000 >/dev/null \
    || useradd -u 2000 -g 2000 -M -d /var/lib/volprep-app -s /bin/sh -p '*' volprep-app
  getent group 2001 >/dev/null || groupadd -g 2001 volprep-peer
  getent passwd 2001 >/dev/null || useradd -u 2001 -g 2001 -G 2000 -M -d /nonexistent -s /usr/sbin/nologin volprep-peer
  mkdir -p /var/lib/volprep-app /run/sshd
  echo "apps: $("$(ls -d /usr/lib/postgresql/*/bin/postgres | sort -V | tail -1)" --version), $(ssh -V 2>&1)"
}

volprep_apps_install
unset -f volprep_apps_install
