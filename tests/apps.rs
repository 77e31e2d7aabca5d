//! Real apps on prepared volumes (the README's "Apps that insist on private modes"): for each
//! app, its own data made as its uid, a volume restored as another uid and one an earlier
//! kubelet walked with another group, each prepared with the README's setting (the app must
//! start and serve a read and a write) and with the kubelet's rule (the app must do what the
//! README says: fail, warn or work). Debian's packages, installed by `.ci/apps.sh`; every app
//! process is killed with its process group when its check ends, panics included.

mod common;

use std::path::Path;
use std::process::Command;

use common::apps::{
    APP, App, Case, Daemon, HOME, Lab, Probe, as_app, chmod, exe, free_port, gate, listening, matrix, readme_rows,
    said, write_as_app,
};

fn path(p: &Path) -> &str {
    p.to_str().expect("UTF-8 test path")
}

/// A directory of the run dir, owned by the app.
fn run_dir(lab: &Lab, name: &str) -> std::path::PathBuf {
    let d = lab.run_path(name);
    std::fs::create_dir_all(&d).unwrap();
    common::apps::chown(&d, APP, APP);
    d
}

/// Runs `cmd` as the app in the pristine volume's making; panics with its output on failure.
#[track_caller]
fn make(cmd: &mut Command) -> String {
    let out = said(cmd);
    assert!(out.ok, "making the app's data: {cmd:?}\n{}", out.text);
    out.text
}

/// Starts a server app on a volume (its `n`-th run), recording the start in `probe`; returns
/// the server and how to reach it, or `None` when it did not start.
type Start<A> = fn(&Lab, &Path, usize, &mut Probe) -> Option<(Daemon, A)>;

/// Starts a server app in the pristine volume's making; panics with what it said if it fails.
fn start_to_make<A>(lab: &Lab, vol: &Path, start: Start<A>) -> (Daemon, A) {
    let mut probe = Probe::default();
    start(lab, vol, 0, &mut probe).unwrap_or_else(|| panic!("{}", probe.transcript))
}

/// The check of a server app: starts it, `serve` reads and writes through it, and it is
/// stopped with `signal`, its log joining the transcript.
fn check_server<A>(
    lab: &Lab,
    vol: &Path,
    n: usize,
    start: Start<A>,
    signal: libc::c_int,
    serve: impl FnOnce(&mut Probe, &A),
) -> Probe {
    let mut probe = Probe::default();
    if let Some((daemon, at)) = start(lab, vol, n, &mut probe) {
        serve(&mut probe, &at);
        probe.said("server log", &daemon.stop(signal));
    }
    probe
}

/// The probe of a check whose one command said it all (`said`): whether the app started,
/// read and wrote, as found in it.
fn probe_of(said: &str, started: bool, read: bool, write: bool) -> Probe {
    let mut probe = Probe::default();
    probe.started(started, said);
    probe.read(read, "");
    probe.write(write, "");
    probe
}

// ---------------------------------------------------------------------------------------------
// PostgreSQL: data directory 0700/0750 owned by the server's uid; server.key 0600 with ssl on.

fn pg_start(lab: &Lab, vol: &Path, n: usize, probe: &mut Probe) -> Option<(Daemon, std::path::PathBuf)> {
    let sock = run_dir(lab, &format!("pg{n}"));
    let data = vol.join("pgdata");
    let mut pg = Daemon::spawn(
        as_app(lab, "postgres").arg("-D").arg(&data).arg("-k").arg(&sock).args(["-c", "listen_addresses="]),
        &lab.run_path(&format!("pg{n}.log")),
    );
    let ready = pg.wait_ready(|| said(Command::new(exe("pg_isready")).arg("-q").arg("-h").arg(&sock)).ok);
    probe.started(ready, &pg.log()).then_some((pg, sock))
}

fn psql(lab: &Lab, sock: &Path, sql: &str) -> common::apps::Said {
    said(as_app(lab, "psql").arg("-h").arg(sock).args([
        "-U",
        "app",
        "-d",
        "postgres",
        "-v",
        "ON_ERROR_STOP=1",
        "-Atc",
        sql,
    ]))
}

#[test]
#[ignore = "needs root, loop devices and the apps (source .ci/apps.sh)"]
fn postgresql() {
    gate(&["initdb", "postgres", "psql", "pg_isready", "openssl"]);
    let create = |lab: &Lab, vol: &Path| {
        let data = vol.join("pgdata");
        make(as_app(lab, "initdb").arg("-D").arg(&data).args(["-A", "trust", "-U", "app"]));
        make(as_app(lab, "openssl").current_dir(&data).args([
            "req",
            "-new",
            "-x509",
            "-days",
            "3650",
            "-nodes",
            "-subj",
            "/CN=volprep",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-keyout",
            "server.key",
            "-out",
            "server.crt",
        ]));
        chmod(&data.join("server.key"), 0o600);
        let conf = data.join("postgresql.conf");
        let text = std::fs::read_to_string(&conf).unwrap() + "ssl = on\n";
        std::fs::write(&conf, text).unwrap();
        let (pg, sock) = start_to_make(lab, vol, pg_start);
        let out = psql(lab, &sock, "create table t (v text); insert into t values ('before')");
        assert!(out.ok, "{}", out.text);
        pg.stop(libc::SIGINT);
    };
    let check = |lab: &Lab, vol: &Path, n: usize| {
        check_server(lab, vol, n, pg_start, libc::SIGINT, |probe, sock| {
            let read = psql(lab, sock, "select v from t");
            probe.read(read.ok && read.text.contains("before"), &read.text);
            let write = psql(lab, sock, "insert into t values ('after')");
            probe.write(write.ok, &write.text);
        })
    };
    // `inspect` names the data directory, says the kubelet's rule leaves a mode PostgreSQL
    // refuses, and which setting keeps it working; on the walked volume, that --owner alone
    // does not repair it.
    let staged = |case: Case, vol: &Path| {
        let out = common::run(common::volprep().args(["inspect", "--fs-group", "2000", "--owner", "2000"]).arg(vol));
        let line =
            out.stdout.lines().find(|l| l.starts_with("pgdata ")).unwrap_or_else(|| panic!("{}", out.describe()));
        assert!(line.contains("PostgreSQL data directory"), "{line}");
        let (mode, kubelet, keeps, with) = match case {
            Case::Restored => ("0700", "2770 (refuses)", "--modes app-safe: 0700", "2770 (refuses)"),
            Case::Walked => ("2770", "2770 (refuses)", "--modes app-safe: 2750", "2770 (refuses)"),
        };
        for part in [mode, kubelet, keeps, with] {
            assert!(line.contains(part), "{case}: {part:?} in {line:?}\n{}", out.stdout);
        }
        let key = out
            .stdout
            .lines()
            .find(|l| l.starts_with("pgdata/server.key "))
            .unwrap_or_else(|| panic!("{}", out.stdout));
        assert!(key.contains("PostgreSQL server.key"), "{key}");
    };
    matrix(&App { row: "PostgreSQL", create: &create, check: &check, tmpdir: "tmp", staged: Some(&staged) });
}

// ---------------------------------------------------------------------------------------------
// MariaDB: checks nothing about modes.

fn mariadb_start(lab: &Lab, vol: &Path, n: usize, probe: &mut Probe) -> Option<(Daemon, std::path::PathBuf)> {
    let sock = run_dir(lab, &format!("my{n}")).join("s");
    let mut db = Daemon::spawn(
        as_app(lab, "mariadbd")
            .arg("--no-defaults")
            .arg(format!("--datadir={}", path(&vol.join("data"))))
            .arg(format!("--socket={}", path(&sock)))
            .args(["--skip-networking", "--innodb-log-file-size=8M"]),
        &lab.run_path(&format!("my{n}.log")),
    );
    let ready = db.wait_ready(|| sock.exists());
    probe.started(ready, &db.log()).then_some((db, sock))
}

fn mariadb(lab: &Lab, sock: &Path, sql: &str) -> common::apps::Said {
    said(as_app(lab, "mariadb").arg("-S").arg(sock).args(["-u", "root", "-N", "-e", sql]))
}

#[test]
#[ignore = "needs root, loop devices and the apps (source .ci/apps.sh)"]
fn mariadb_server() {
    gate(&["mariadb-install-db", "mariadbd", "mariadb"]);
    let create = |lab: &Lab, vol: &Path| {
        make(as_app(lab, "mariadb-install-db").args([
            "--no-defaults",
            &format!("--datadir={}", path(&vol.join("data"))),
            "--user=volprep-app",
            "--auth-root-authentication-method=normal",
            "--skip-test-db",
            "--innodb-log-file-size=8M",
        ]));
        let (db, sock) = start_to_make(lab, vol, mariadb_start);
        let out = mariadb(
            lab,
            &sock,
            "create database app; create table app.t (v text); insert into app.t values ('before')",
        );
        assert!(out.ok, "{}", out.text);
        db.stop(libc::SIGTERM);
    };
    let check = |lab: &Lab, vol: &Path, n: usize| {
        check_server(lab, vol, n, mariadb_start, libc::SIGTERM, |probe, sock| {
            let read = mariadb(lab, sock, "select v from app.t");
            probe.read(read.ok && read.text.contains("before"), &read.text);
            let write = mariadb(lab, sock, "insert into app.t values ('after')");
            probe.write(write.ok, &write.text);
        })
    };
    matrix(&App { row: "MariaDB", create: &create, check: &check, tmpdir: "tmp", staged: None });
}

// ---------------------------------------------------------------------------------------------
// Redis: checks nothing about modes.

fn redis_start(lab: &Lab, vol: &Path, n: usize, probe: &mut Probe) -> Option<(Daemon, std::path::PathBuf)> {
    let sock = run_dir(lab, &format!("redis{n}")).join("s");
    let mut r = Daemon::spawn(
        as_app(lab, "redis-server")
            .args(["--port", "0", "--unixsocket"])
            .arg(&sock)
            .arg("--dir")
            .arg(vol.join("data"))
            .args(["--appendonly", "yes", "--save", "3600 1", "--daemonize", "no"]),
        &lab.run_path(&format!("redis{n}.log")),
    );
    let ready = r.wait_ready(|| sock.exists());
    probe.started(ready, &r.log()).then_some((r, sock))
}

fn redis_cli(lab: &Lab, sock: &Path, args: &[&str]) -> common::apps::Said {
    said(as_app(lab, "redis-cli").arg("-s").arg(sock).args(args))
}

#[test]
#[ignore = "needs root, loop devices and the apps (source .ci/apps.sh)"]
fn redis() {
    gate(&["redis-server", "redis-cli"]);
    let create = |lab: &Lab, vol: &Path| {
        std::fs::create_dir(vol.join("data")).unwrap();
        common::apps::chown(&vol.join("data"), APP, APP);
        let (r, sock) = start_to_make(lab, vol, redis_start);
        for args in [&["set", "k", "before"][..], &["save"]] {
            let out = redis_cli(lab, &sock, args);
            assert!(out.ok && out.text.contains("OK"), "{}", out.text);
        }
        r.stop(libc::SIGTERM);
    };
    let check = |lab: &Lab, vol: &Path, n: usize| {
        check_server(lab, vol, n, redis_start, libc::SIGTERM, |probe, sock| {
            let read = redis_cli(lab, sock, &["get", "k"]);
            probe.read(read.ok && read.text.contains("before"), &read.text);
            let set = redis_cli(lab, sock, &["set", "k2", "after"]);
            let save = redis_cli(lab, sock, &["save"]);
            probe.write(set.ok && save.ok && save.text.trim() == "OK", &format!("{}{}", set.text, save.text));
        })
    };
    matrix(&App { row: "Redis", create: &create, check: &check, tmpdir: "tmp", staged: None });
}

// ---------------------------------------------------------------------------------------------
// OpenSSH: sshd (StrictModes) checks the home, ~/.ssh and authorized_keys; the client checks
// the private key and ~/.ssh/config. The volume is the app user's home: bound on HOME in a
// mount namespace of the check's own, where root's sshd and the app's client run.

const SSH_CHECK: &str = r#"
set -u
mount --bind "$VOL" "$HOME_DIR"
mkdir -p /run/sshd
/usr/sbin/sshd -D -e -f "$RUN/sshd_config" 2>"$RUN/sshd.log" &
for i in $(seq 400); do [ -s "$RUN/sshd.pid" ] && break; sleep 0.05; done
as_app() { setpriv --reuid=2000 --regid=2000 --groups=2000 --inh-caps=-all "$@"; }
opts="-p $PORT -o BatchMode=yes -o ConnectTimeout=10 -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR"
echo "== the client's key"
as_app ssh-keygen -y -f "$HOME_DIR/.ssh/id_ed25519" >/dev/null && echo "key ok"
echo "== sshd, with a copy of the key and no client config"
as_app ssh -F /dev/null -i "$RUN/key" $opts volprep-app@127.0.0.1 true && echo "sshd ok"
echo "== login with the key and config in the home: read, write"
as_app ssh -i "$HOME_DIR/.ssh/id_ed25519" $opts volprep-app@127.0.0.1 'cat ~/data.txt && echo after > ~/new.txt && echo "wrote ok"'
echo "== sshd log"
cat "$RUN/sshd.log"
"#;

#[test]
#[ignore = "needs root, loop devices and the apps (source .ci/apps.sh)"]
fn openssh() {
    gate(&["sshd", "ssh", "ssh-keygen", "setpriv", "mount"]);
    let create = |lab: &Lab, vol: &Path| {
        let ssh = vol.join(".ssh");
        make(as_app(lab, "mkdir").args(["-m", "700"]).arg(&ssh));
        make(
            as_app(lab, "ssh-keygen")
                .args(["-q", "-t", "ed25519", "-N", "", "-C", "app", "-f"])
                .arg(ssh.join("id_ed25519")),
        );
        let public = std::fs::read_to_string(ssh.join("id_ed25519.pub")).unwrap();
        write_as_app(&ssh.join("authorized_keys"), &public, 0o600);
        write_as_app(&ssh.join("config"), "Host *\n  ServerAliveInterval 30\n", 0o600);
        write_as_app(&vol.join("data.txt"), "hello from the volume\n", 0o644);
        // The check's sshd: its host key, a copy of the app's key (outside the volume), the config.
        make(
            Command::new(exe("ssh-keygen")).args(["-q", "-t", "ed25519", "-N", "", "-f"]).arg(lab.run_path("hostkey")),
        );
        std::fs::copy(ssh.join("id_ed25519"), lab.run_path("key")).unwrap();
        common::apps::chown(&lab.run_path("key"), APP, APP);
    };
    let check = |lab: &Lab, vol: &Path, n: usize| {
        let run = run_dir(lab, &format!("ssh{n}"));
        std::fs::copy(lab.run_path("key"), run.join("key")).unwrap();
        common::apps::chown(&run.join("key"), APP, APP);
        chmod(&run.join("key"), 0o600);
        let port = free_port();
        let config = format!(
            "Port {port}\nListenAddress 127.0.0.1\nHostKey {}\nPidFile {}\nUsePAM no\nStrictModes yes\n\
             PasswordAuthentication no\nKbdInteractiveAuthentication no\nAuthorizedKeysFile .ssh/authorized_keys\n\
             AllowUsers volprep-app\n",
            path(&lab.run_path("hostkey")),
            path(&run.join("sshd.pid"))
        );
        std::fs::write(run.join("sshd_config"), config).unwrap();
        let out = said(
            Command::new(exe("unshare"))
                .args(["--mount", "--propagation", "private", "sh", "-c", SSH_CHECK])
                .env("VOL", vol)
                .env("HOME_DIR", HOME)
                .env("RUN", &run)
                .env("PORT", port.to_string()),
        );
        let t = &out.text;
        let started = t.contains("key ok") && t.contains("sshd ok");
        let wrote = t.contains("wrote ok") && vol.join("new.txt").exists();
        probe_of(t, started, t.contains("hello from the volume"), wrote)
    };
    matrix(&App { row: "OpenSSH", create: &create, check: &check, tmpdir: "tmp", staged: None });
}

// ---------------------------------------------------------------------------------------------
// git: checks the repository's owner (safe.directory).

#[test]
#[ignore = "needs root, loop devices and the apps (source .ci/apps.sh)"]
fn git() {
    gate(&["git"]);
    let git = |lab: &Lab, repo: &Path| {
        let mut c = as_app(lab, "git");
        c.arg("-C").arg(repo).args(["-c", "user.name=app", "-c", "user.email=app@example.org"]);
        c
    };
    let create = |lab: &Lab, vol: &Path| {
        let repo = vol.join("repo");
        make(as_app(lab, "git").args(["init", "-q"]).arg(&repo));
        write_as_app(&repo.join("README"), "one\n", 0o644);
        make(git(lab, &repo).args(["add", "README"]));
        make(git(lab, &repo).args(["commit", "-q", "-m", "first"]));
    };
    let check = |lab: &Lab, vol: &Path, _n: usize| {
        let repo = vol.join("repo");
        let mut probe = Probe::default();
        let status = said(git(lab, &repo).args(["status", "--short"]));
        if probe.started(status.ok, &status.text) {
            let log = said(git(lab, &repo).args(["log", "-1", "--format=%s"]));
            probe.read(log.ok && log.text.contains("first"), &log.text);
            let commit = said(git(lab, &repo).args(["commit", "-q", "--allow-empty", "-m", "second"]));
            probe.write(commit.ok, &commit.text);
        }
        probe
    };
    matrix(&App { row: "git", create: &create, check: &check, tmpdir: "tmp", staged: None });
}

// ---------------------------------------------------------------------------------------------
// GnuPG: warns when the homedir is not the owner's alone. The check runs its own agent (in its
// process group; gpg never starts one itself).

fn gpg_agent(lab: &Lab, home: &Path, n: usize) -> Daemon {
    let mut agent = Daemon::spawn(
        as_app(lab, "gpg-agent").arg("--homedir").arg(home).args(["--daemon", "--no-detach"]),
        &lab.run_path(&format!("agent{n}.log")),
    );
    agent.wait_ready(|| {
        said(as_app(lab, "gpg-connect-agent").arg("--homedir").arg(home).args(["--no-autostart", "/bye"])).ok
    });
    agent
}

fn gpg(lab: &Lab, home: &Path) -> Command {
    let mut c = as_app(lab, "gpg");
    c.arg("--homedir").arg(home).args(["--batch", "--no-autostart", "--pinentry-mode", "loopback", "--passphrase", ""]);
    c
}

#[test]
#[ignore = "needs root, loop devices and the apps (source .ci/apps.sh)"]
fn gnupg() {
    gate(&["gpg", "gpg-agent", "gpg-connect-agent"]);
    let create = |lab: &Lab, vol: &Path| {
        let home = vol.join("gnupg");
        make(as_app(lab, "mkdir").args(["-m", "700"]).arg(&home));
        let agent = gpg_agent(lab, &home, 0);
        make(gpg(lab, &home).args(["-q", "--quick-gen-key", "app <app@example.org>", "ed25519", "sign", "never"]));
        write_as_app(&vol.join("message"), "signed by the app\n", 0o644);
        make(
            gpg(lab, &home)
                .args(["-q", "--output"])
                .arg(vol.join("message.asc"))
                .arg("--clearsign")
                .arg(vol.join("message")),
        );
        agent.stop(libc::SIGTERM);
    };
    let check = |lab: &Lab, vol: &Path, n: usize| {
        let home = vol.join("gnupg");
        let agent = gpg_agent(lab, &home, n);
        let mut probe = Probe::default();
        let list = said(gpg(lab, &home).arg("--list-secret-keys"));
        if probe.started(list.ok && list.text.contains("app@example.org"), &list.text) {
            let verify = said(gpg(lab, &home).arg("--verify").arg(vol.join("message.asc")));
            probe.read(verify.ok && verify.text.contains("Good signature"), &verify.text);
            let generate = said(gpg(lab, &home).args([
                "-q",
                "--quick-gen-key",
                "two <two@example.org>",
                "ed25519",
                "sign",
                "never",
            ]));
            probe.write(generate.ok, &generate.text);
        }
        probe.said("agent log", &agent.stop(libc::SIGTERM));
        probe.warns_on("WARNING: unsafe");
        probe
    };
    matrix(&App { row: "GnuPG", create: &create, check: &check, tmpdir: "tmp", staged: None });
}

// ---------------------------------------------------------------------------------------------
// etcd: warns when its data directories are not the owner's alone.

fn etcd_start(lab: &Lab, vol: &Path, n: usize, probe: &mut Probe) -> Option<(Daemon, String)> {
    let (client, peer) = (free_port(), free_port());
    let client_url = format!("http://127.0.0.1:{client}");
    let peer_url = format!("http://127.0.0.1:{peer}");
    let mut etcd = Daemon::spawn(
        as_app(lab, "etcd")
            .args(["--name", "n", "--data-dir"])
            .arg(vol.join("data"))
            .args(["--listen-client-urls", &client_url, "--advertise-client-urls", &client_url])
            .args(["--listen-peer-urls", &peer_url, "--initial-advertise-peer-urls", &peer_url])
            .args(["--initial-cluster", &format!("n={peer_url}")]),
        &lab.run_path(&format!("etcd{n}.log")),
    );
    let ready =
        etcd.wait_ready(|| said(as_app(lab, "etcdctl").args(["--endpoints", &client_url, "endpoint", "health"])).ok);
    probe.started(ready, &etcd.log()).then_some((etcd, client_url))
}

#[test]
#[ignore = "needs root, loop devices and the apps (source .ci/apps.sh)"]
fn etcd() {
    gate(&["etcd", "etcdctl"]);
    let create = |lab: &Lab, vol: &Path| {
        let (etcd, url) = start_to_make(lab, vol, etcd_start);
        make(as_app(lab, "etcdctl").args(["--endpoints", &url, "put", "k", "before"]));
        etcd.stop(libc::SIGTERM);
    };
    let check = |lab: &Lab, vol: &Path, n: usize| {
        let mut probe = check_server(lab, vol, n, etcd_start, libc::SIGTERM, |probe, url| {
            let read = said(as_app(lab, "etcdctl").args(["--endpoints", url, "get", "k", "--print-value-only"]));
            probe.read(read.ok && read.text.contains("before"), &read.text);
            let write = said(as_app(lab, "etcdctl").args(["--endpoints", url, "put", "k2", "after"]));
            probe.write(write.ok && write.text.contains("OK"), &write.text);
        });
        probe.warns_on("check file permission");
        probe
    };
    matrix(&App { row: "etcd", create: &create, check: &check, tmpdir: "tmp", staged: None });
}

// ---------------------------------------------------------------------------------------------
// nginx (non-root): a proxy cache and the temp paths in the volume; checks nothing about modes.

fn nginx_start(lab: &Lab, vol: &Path, n: usize, probe: &mut Probe) -> Option<(Daemon, u16)> {
    let (port, upstream) = (free_port(), free_port());
    let run = run_dir(lab, &format!("nginx{n}"));
    let v = path(vol);
    let conf = format!(
        "worker_processes 1;\npid {run}/nginx.pid;\nerror_log {run}/error.log info;\nevents {{ worker_connections 64; }}\n\
         http {{\n access_log off;\n client_body_temp_path {v}/client_temp;\n proxy_temp_path {v}/proxy_temp;\n\
         fastcgi_temp_path {v}/fastcgi_temp;\n uwsgi_temp_path {v}/uwsgi_temp;\n scgi_temp_path {v}/scgi_temp;\n\
         client_body_buffer_size 1k;\n proxy_cache_path {v}/cache levels=1:2 keys_zone=c:1m;\n\
         server {{ listen 127.0.0.1:{port}; location / {{ proxy_pass http://127.0.0.1:{upstream}; proxy_cache c;\n\
         proxy_cache_key $request_uri; proxy_cache_valid 200 1d; add_header X-Cache $upstream_cache_status always; }} }}\n\
         server {{ listen 127.0.0.1:{upstream}; location / {{ return 200 \"body of $request_uri\\n\"; }} }}\n}}\n",
        run = path(&run)
    );
    std::fs::write(run.join("nginx.conf"), conf).unwrap();
    let mut nginx = Daemon::spawn(
        as_app(lab, "nginx").arg("-p").arg(&run).arg("-c").arg(run.join("nginx.conf")).args(["-g", "daemon off;"]),
        &lab.run_path(&format!("nginx{n}.log")),
    );
    let ready = nginx.wait_ready(|| listening(port));
    let log = nginx.log() + &std::fs::read_to_string(run.join("error.log")).unwrap_or_default();
    probe.started(ready, &log).then_some((nginx, port))
}

fn curl(lab: &Lab, args: &[&str]) -> common::apps::Said {
    said(as_app(lab, "curl").args(["-s", "-S", "-D", "-", "-o", "/dev/null", "--max-time", "20"]).args(args))
}

#[test]
#[ignore = "needs root, loop devices and the apps (source .ci/apps.sh)"]
fn nginx() {
    gate(&["nginx", "curl"]);
    let create = |lab: &Lab, vol: &Path| {
        let (nginx, port) = start_to_make(lab, vol, nginx_start);
        let out = curl(lab, &[&format!("http://127.0.0.1:{port}/cached")]);
        assert!(out.text.contains("X-Cache: MISS"), "{}", out.text);
        nginx.stop(libc::SIGQUIT);
    };
    let check = |lab: &Lab, vol: &Path, n: usize| {
        let mut probe = Probe::default();
        if let Some((nginx, port)) = nginx_start(lab, vol, n, &mut probe) {
            // The response cached when the app made its data, read from the volume.
            let read = curl(lab, &[&format!("http://127.0.0.1:{port}/cached")]);
            probe.read(read.ok && read.text.contains("X-Cache: HIT"), &read.text);
            // A body larger than the buffer goes through client_temp; a new response is cached.
            let body = "x".repeat(8000);
            let post = curl(lab, &["--data-binary", &body, &format!("http://127.0.0.1:{port}/post")]);
            let fresh = curl(lab, &[&format!("http://127.0.0.1:{port}/fresh")]);
            let again = curl(lab, &[&format!("http://127.0.0.1:{port}/fresh")]);
            probe.write(
                post.text.starts_with("HTTP/1.1 200") && again.text.contains("X-Cache: HIT"),
                &format!("{}{}{}", post.text, fresh.text, again.text),
            );
            let run = lab.run_path(&format!("nginx{n}"));
            let errors = std::fs::read_to_string(run.join("error.log")).unwrap_or_default();
            probe.said("server log", &(nginx.stop(libc::SIGQUIT) + &errors));
        }
        probe
    };
    matrix(&App { row: "nginx", create: &create, check: &check, tmpdir: "tmp", staged: None });
}

// ---------------------------------------------------------------------------------------------
// Prometheus: its TSDB in the volume; checks nothing about modes.

fn prometheus_start(lab: &Lab, vol: &Path, n: usize, probe: &mut Probe) -> Option<(Daemon, u16)> {
    let port = free_port();
    let conf = lab.run_path(&format!("prometheus{n}.yml"));
    let scrape = format!(
        "global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: self\n    static_configs:\n      - targets: [\"127.0.0.1:{port}\"]\n"
    );
    std::fs::write(&conf, scrape).unwrap();
    let mut prom = Daemon::spawn(
        as_app(lab, "prometheus")
            .arg(format!("--config.file={}", path(&conf)))
            .arg(format!("--storage.tsdb.path={}", path(&vol.join("data"))))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .arg("--web.enable-admin-api"),
        &lab.run_path(&format!("prometheus{n}.log")),
    );
    let ready =
        prom.wait_ready(|| said(as_app(lab, "curl").args(["-sf", &format!("http://127.0.0.1:{port}/-/ready")])).ok);
    probe.started(ready, &prom.log()).then_some((prom, port))
}

/// `GET /api/v1/query` with the form fields `fields` (`query=up`, `time=...`).
fn prom_query(lab: &Lab, port: u16, fields: &[&str]) -> common::apps::Said {
    let mut c = as_app(lab, "curl");
    c.args(["-s", "-S", "--max-time", "20", "-G", &format!("http://127.0.0.1:{port}/api/v1/query")]);
    for f in fields {
        c.args(["--data-urlencode", f]);
    }
    said(&mut c)
}

#[test]
#[ignore = "needs root, loop devices and the apps (source .ci/apps.sh)"]
fn prometheus() {
    gate(&["prometheus", "curl"]);
    let create = |lab: &Lab, vol: &Path| {
        let (prom, port) = start_to_make(lab, vol, prometheus_start);
        // The first scrape comes within a few seconds (targets are synced every 5 s).
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        let sample = loop {
            let out = prom_query(lab, port, &["query=up"]);
            let v: serde_json::Value = serde_json::from_str(&out.text).unwrap_or_default();
            if let Some(t) = v["data"]["result"][0]["value"][0].as_f64() {
                break t;
            }
            assert!(std::time::Instant::now() < deadline, "no sample scraped: {}", out.text);
            std::thread::sleep(std::time::Duration::from_millis(200));
        };
        write_as_app(&vol.join("sample-time"), &format!("{sample}"), 0o644);
        prom.stop(libc::SIGTERM);
    };
    let check = |lab: &Lab, vol: &Path, n: usize| {
        check_server(lab, vol, n, prometheus_start, libc::SIGTERM, |probe, &port| {
            // The sample scraped when the app made its data, at its time: from the volume only.
            let at = std::fs::read_to_string(vol.join("sample-time")).unwrap();
            let read = prom_query(lab, port, &["query=up", &format!("time={at}")]);
            let v: serde_json::Value = serde_json::from_str(&read.text).unwrap_or_default();
            probe.read(v["data"]["result"][0]["value"][1] == "1", &read.text);
            let snap = said(as_app(lab, "curl").args([
                "-s",
                "-S",
                "-XPOST",
                &format!("http://127.0.0.1:{port}/api/v1/admin/tsdb/snapshot"),
            ]));
            probe.write(snap.ok && snap.text.contains("\"success\""), &snap.text);
        })
    };
    matrix(&App { row: "Prometheus", create: &create, check: &check, tmpdir: "tmp", staged: None });
}

// ---------------------------------------------------------------------------------------------
// SQLite (WAL): checks nothing about modes; needs the directory writable for -wal and -shm.

#[test]
#[ignore = "needs root, loop devices and the apps (source .ci/apps.sh)"]
fn sqlite() {
    gate(&["sqlite3"]);
    let create = |lab: &Lab, vol: &Path| {
        make(
            as_app(lab, "sqlite3")
                .arg(vol.join("app.db"))
                .arg("PRAGMA journal_mode=WAL; create table t (v text); insert into t values ('before');"),
        );
    };
    let check = |lab: &Lab, vol: &Path, _n: usize| {
        let db = vol.join("app.db");
        let mut probe = Probe::default();
        let mode = said(as_app(lab, "sqlite3").arg(&db).arg("PRAGMA journal_mode;"));
        if probe.started(mode.ok && mode.text.contains("wal"), &mode.text) {
            let read = said(as_app(lab, "sqlite3").arg(&db).arg("select v from t;"));
            probe.read(read.ok && read.text.contains("before"), &read.text);
            let write = said(as_app(lab, "sqlite3").arg(&db).arg("insert into t values ('after');"));
            probe.write(write.ok && write.text.trim().is_empty(), &write.text);
        }
        probe
    };
    matrix(&App { row: "SQLite", create: &create, check: &check, tmpdir: "tmp", staged: None });
}

// ---------------------------------------------------------------------------------------------
// Erlang/OTP (RabbitMQ keeps its cookie on its data volume, its HOME): the cookie must be the
// owner's alone. Each check runs its own epmd (in its process group), never the daemon.

fn erlang(lab: &Lab, vol: &Path, n: usize, eval: &str) -> common::apps::Said {
    let port = free_port();
    let epmd =
        Daemon::spawn(as_app(lab, "epmd").args(["-port", &port.to_string()]), &lab.run_path(&format!("epmd{n}.log")));
    let mut c = as_app(lab, "erl");
    c.env("HOME", vol).env("ERL_EPMD_PORT", port.to_string());
    c.args(["-sname", &format!("volprep{n}"), "-noshell", "-start_epmd", "false", "-eval", eval]);
    let out = said(&mut c);
    epmd.stop(libc::SIGTERM);
    out
}

#[test]
#[ignore = "needs root, loop devices and the apps (source .ci/apps.sh)"]
fn erlang_cookie() {
    gate(&["erl", "epmd"]);
    let create = |lab: &Lab, vol: &Path| {
        let out = erlang(lab, vol, 0, "halt().");
        assert!(out.ok && vol.join(".erlang.cookie").exists(), "{}", out.text);
    };
    let check = |lab: &Lab, vol: &Path, n: usize| {
        let cookie = std::fs::read_to_string(vol.join(".erlang.cookie")).unwrap();
        let eval = "io:format(\"cookie ~s~n\", [erlang:get_cookie()]), \
                    ok = file:write_file(os:getenv(\"HOME\") ++ \"/written\", <<\"after\">>), \
                    io:format(\"wrote ok~n\"), halt().";
        let out = erlang(lab, vol, n, eval);
        let t = &out.text;
        probe_of(
            t,
            out.ok && !t.contains("ERROR REPORT"),
            t.contains(&format!("cookie {}", cookie.trim())),
            t.contains("wrote ok"),
        )
    };
    matrix(&App { row: "Erlang/OTP", create: &create, check: &check, tmpdir: "tmp", staged: None });
}

// ---------------------------------------------------------------------------------------------
// Temp dirs: Ruby's Dir.tmpdir refuses a world-writable TMPDIR without the sticky bit (and
// silently falls back to /tmp); Python's tempfile only needs it writable. The app's image made
// the temp dir 0777.

fn make_tmpdir(_lab: &Lab, vol: &Path) {
    let tmp = vol.join("tmp");
    std::fs::create_dir(&tmp).unwrap();
    common::apps::chown(&tmp, APP, APP);
    chmod(&tmp, 0o777);
    write_as_app(&tmp.join("left-by-the-app"), "before\n", 0o644);
}

/// The check of a temp dir: `interpreter flag script` runs as the app with `TMPDIR` the
/// volume's `tmp`; the script prints `tmpdir DIR` (the temp dir it chose), the file the app
/// left there and, once it wrote a temp file of its own, `wrote ok`.
fn check_tmpdir(lab: &Lab, vol: &Path, [interpreter, flag, script]: &[&str; 3]) -> Probe {
    let tmp = vol.join("tmp");
    let out = said(as_app(lab, interpreter).env("TMPDIR", &tmp).args([flag, script]));
    let t = &out.text;
    let read = t.contains(&format!("tmpdir {}", path(&tmp))) && t.contains("before");
    probe_of(t, t.contains("tmpdir "), read, t.contains("wrote ok"))
}

#[test]
#[ignore = "needs root, loop devices and the apps (source .ci/apps.sh)"]
fn ruby_tmpdir() {
    gate(&["ruby"]);
    let script = "require 'tmpdir'; d = Dir.tmpdir; puts \"tmpdir #{d}\"; \
                  puts File.read(File.join(d, 'left-by-the-app')); \
                  Dir.mktmpdir { |x| File.write(File.join(x, 'f'), 'after'); puts 'wrote ok' }";
    let check = |lab: &Lab, vol: &Path, _n: usize| check_tmpdir(lab, vol, &["ruby", "-e", script]);
    matrix(&App { row: "Ruby", create: &make_tmpdir, check: &check, tmpdir: "tmp", staged: None });
}

#[test]
#[ignore = "needs root, loop devices and the apps (source .ci/apps.sh)"]
fn python_tempfile() {
    gate(&["python3"]);
    let script = "import os, tempfile; d = tempfile.gettempdir(); print('tmpdir', d); \
                  print(open(os.path.join(d, 'left-by-the-app')).read()); \
                  fd, p = tempfile.mkstemp(); os.write(fd, b'after'); os.close(fd); print('wrote ok')";
    let check = |lab: &Lab, vol: &Path, _n: usize| check_tmpdir(lab, vol, &["python3", "-c", script]);
    matrix(&App { row: "Python", create: &make_tmpdir, check: &check, tmpdir: "tmp", staged: None });
}

// ---------------------------------------------------------------------------------------------

/// A check that panics leaves no process behind: a daemon's whole process group (a server and
/// the workers it forked) is killed when it is dropped, on the way out of the panic.
#[test]
fn a_panicking_check_leaves_no_process_behind() {
    let dir = tempfile::tempdir().unwrap();
    let pids = dir.path().join("pids");
    let script = format!("sleep 300 & echo $! > {0}; sleep 300 & echo $! >> {0}; wait", pids.display());
    // SAFETY: kill with signal 0 only probes the pid: no memory is involved.
    let alive = |pid: i32| unsafe { libc::kill(pid, 0) } == 0;
    let caught = std::panic::catch_unwind(|| {
        let mut d = Daemon::spawn(Command::new("sh").args(["-c", &script]), &dir.path().join("log"));
        assert!(d.wait_ready(|| std::fs::read_to_string(&pids).is_ok_and(|p| p.lines().count() == 2)));
        panic!("a check failed");
    });
    assert!(caught.is_err());
    let pids: Vec<i32> = std::fs::read_to_string(&pids).unwrap().lines().map(|l| l.parse().unwrap()).collect();
    assert_eq!(pids.len(), 2);
    for pid in pids {
        // Killed and reaped by its parent (the shell, killed too, reaped by the test).
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while alive(pid) && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let zombie = std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| s.contains(") Z "));
        assert!(!alive(pid) || zombie, "process {pid} of the dropped daemon still runs");
    }
}

/// `volprep inject --extra-arg=--modes=app-safe` gives every volume of an injected workload the
/// app-safe policy (a `--volume` without `modes=` takes `--modes`): the init container it
/// writes, run on a data directory an earlier kubelet widened, tightens it. As any user: `check`
/// with the user's own group.
#[test]
fn inject_with_modes_app_safe_tightens_a_widened_data_directory() {
    let dir = tempfile::tempdir().unwrap();
    let manifest = dir.path().join("sts.yaml");
    std::fs::write(
        &manifest,
        "apiVersion: apps/v1\nkind: StatefulSet\nmetadata:\n  name: db\nspec:\n  serviceName: db\n  selector:\n    \
         matchLabels: {app: db}\n  template:\n    metadata:\n      labels: {app: db}\n    spec:\n      \
         securityContext: {runAsUser: 999, fsGroup: 999}\n      containers:\n        - name: db\n          \
         image: postgres:16\n          volumeMounts: [{name: data, mountPath: /var/lib/postgresql/data}]\n  \
         volumeClaimTemplates:\n    - metadata: {name: data}\n      spec:\n        accessModes: [ReadWriteOnce]\n        \
         resources: {requests: {storage: 1Gi}}\n",
    )
    .unwrap();
    let out =
        common::run(common::volprep().args(["inject", "--extra-arg=--modes=app-safe"]).arg(&manifest)).expect_code(0);
    let docs: serde_norway::Value = serde_norway::from_str(&out.stdout).expect("one manifest");
    let init = &docs["spec"]["template"]["spec"]["initContainers"][0];
    let args: Vec<String> =
        init["args"].as_sequence().unwrap().iter().map(|a| a.as_str().unwrap().to_string()).collect();
    assert!(args.contains(&"--modes=app-safe".to_string()), "{args:?}");
    // The volume as the container sees it, here: a data directory the kubelet made 2770.
    let vol = dir.path().join("data");
    std::fs::create_dir_all(vol.join("pgdata/global")).unwrap();
    std::fs::write(vol.join("pgdata/PG_VERSION"), "15\n").unwrap();
    chmod(&vol.join("pgdata"), 0o2770);
    // The app's uid is the pod's runAsUser; here, this process's (who owns the volume).
    assert!(args.iter().any(|a| a.ends_with(",app-uid=999")), "{args:?}");
    let (uid, gid) = (rustix::process::geteuid().as_raw(), rustix::process::getegid().as_raw());
    let run_args: Vec<String> = args
        .iter()
        .skip(1)
        .filter(|a| !a.starts_with("--termination-log") && !a.starts_with("--log-format"))
        .map(|a| {
            let a = a.replace("/volumes/data", vol.to_str().unwrap());
            a.replace("fs-group=999", &format!("fs-group={gid}")).replace("app-uid=999", &format!("app-uid={uid}"))
        })
        .collect();
    let check = common::run(common::volprep().arg("check").args(&run_args).args(["--report", "-"])).expect_code(3);
    let v = check.volume();
    assert_eq!(v["spec"], format!("fs-group={gid} modes=app-safe app-uid={uid}"), "{}", check.describe());
    assert_eq!(v["tightened"], 1, "{}", check.describe());
    assert_eq!(v["tightened_list"][0]["app"], "PostgreSQL data directory");
    assert_eq!(
        (v["tightened_list"][0]["mode"].as_str(), v["tightened_list"][0]["want_mode"].as_str()),
        (Some("2770"), Some("2750"))
    );
}

/// The README's table of apps names exactly the apps this file runs, each with a setting, so a
/// row without a test (or a test without a row) is caught without root.
#[test]
fn the_readme_table_of_apps_is_the_matrix() {
    let tested = [
        "PostgreSQL",
        "MariaDB",
        "Redis",
        "OpenSSH",
        "git",
        "GnuPG",
        "etcd",
        "nginx",
        "Prometheus",
        "SQLite",
        "Erlang/OTP",
        "Ruby",
        "Python",
    ];
    let rows = readme_rows();
    let named: Vec<&str> = rows.iter().map(|r| r.app.split_whitespace().next().unwrap()).collect();
    assert_eq!(named, tested, "README.md's table of apps and tests/apps.rs list the same apps, in order");
    for r in &rows {
        assert!(r.setting.contains("--modes app-safe"), "{}: the setting is app-safe: {}", r.app, r.setting);
        for (outcome, text) in [&r.restored, &r.walked] {
            assert_eq!(
                *outcome == common::apps::Outcome::Works,
                text.is_empty(),
                "{}: ✔ cells carry no text, ✗ and ⚠ cells name what the app says",
                r.app
            );
        }
    }
}
