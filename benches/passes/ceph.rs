//! A throwaway single-node CephFS on 127.0.0.1 (`--storages ceph`), mounted with `ceph-fuse`.
//!
//! One monitor, one manager, one OSD on `memstore` (objects in the OSD's memory), one MDS,
//! `auth … required = none`, pools of size 1, from Debian's `ceph-mon ceph-mgr ceph-osd ceph-mds
//! ceph-fuse ceph-common` (Ceph 16). Every daemon runs in the foreground (`-f`) in its own
//! process group (a ctrl-c of the benchmark does not reach it) with `PR_SET_PDEATHSIG`, and is
//! stopped by its pid on drop: SIGTERM, then SIGKILL after a grace period. Two traps: the OSD
//! id is created with a uuid (`ceph osd new UUID`) and the same uuid goes to `ceph-osd --mkfs
//! --osd-uuid`, or the monitor never marks the OSD up; and daemons that fork into the
//! background cannot be stopped reliably, hence `-f`.
//!
//! [`Cluster::mds_requests`] reads the MDS's `mds.request` perf counter through its admin
//! socket (`ceph daemon mds.a perf dump`): the metadata round trips a method costs.

use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::fsimage::{have, sh, syncfs};

/// The daemons and tools this needs, with the Debian package that has each.
const NEEDS: [(&str, &str); 7] = [
    ("ceph-mon", "ceph-mon"),
    ("ceph-mgr", "ceph-mgr"),
    ("ceph-osd", "ceph-osd"),
    ("ceph-mds", "ceph-mds"),
    ("ceph-fuse", "ceph-fuse"),
    ("ceph", "ceph-common"),
    ("monmaptool", "ceph-common"),
];

/// How long the cluster may take to come up.
const UP_TIMEOUT: Duration = Duration::from_secs(120);

/// Keys of [`Cluster::mds_counters`]: the MDS's summed reply latency (µs) and its count.
pub const REPLY_LATENCY_US: &str = "reply_latency_us";
pub const REPLIES: &str = "replies";

/// `statfs` magic of a FUSE mount.
const FUSE_SUPER_MAGIC: i64 = 0x6573_5546;

/// What this machine lacks for a CephFS run.
pub fn missing() -> Vec<String> {
    let mut need: Vec<String> = NEEDS
        .iter()
        .filter(|(cmd, _)| !have(cmd))
        .map(|(cmd, pkg)| format!("`{cmd}` on PATH (Debian package {pkg})"))
        .collect();
    if !Path::new("/dev/fuse").exists() {
        need.push("/dev/fuse for ceph-fuse (`modprobe fuse`)".into());
    }
    need
}

/// A running daemon (or ceph-fuse), stopped by pid on drop.
struct Daemon {
    name: String,
    child: Child,
}

impl Daemon {
    fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// SIGTERM, up to `grace` for it to exit, then SIGKILL; always reaps.
    fn stop(&mut self, grace: Duration) {
        if !self.alive() {
            return;
        }
        // SAFETY: the pid is our unreaped child (try_wait saw it running).
        unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM) };
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if !self.alive() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The cluster: its directory, configuration and daemons; the client mount, when mounted.
pub struct Cluster {
    dir: PathBuf,
    conf: PathBuf,
    pub mnt: PathBuf,
    daemons: Vec<Daemon>,
    fuse: Option<Daemon>,
    mds_asok: PathBuf,
    /// Seconds from start to a mounted filesystem.
    pub up_s: f64,
}

fn uuid() -> io::Result<String> {
    Ok(fs::read_to_string("/proc/sys/kernel/random/uuid")?.trim().to_string())
}

/// A port nobody listens on now (the kernel's pick for a socket bound to port 0).
fn free_port() -> io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

fn statfs_type(p: &Path) -> Option<i64> {
    let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).ok()?;
    // SAFETY: statfs is plain old data; valid C string.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a valid C string and `st` a valid out-pointer.
    (unsafe { libc::statfs(c.as_ptr(), &mut st) } == 0).then_some(st.f_type as i64)
}

impl Cluster {
    /// Creates the cluster under `dir` (which it owns and removes), starts it and mounts the
    /// filesystem at `dir/mnt`. Fails with the tail of the daemon logs when it does not come up.
    pub fn start(dir: &Path) -> io::Result<Cluster> {
        let t = Instant::now();
        let _ = fs::remove_dir_all(dir);
        for d in ["mon", "osd", "mds", "mgr", "run", "log", "mnt"] {
            fs::create_dir_all(dir.join(d))?;
        }
        let mut c = Cluster {
            dir: dir.to_path_buf(),
            conf: dir.join("ceph.conf"),
            mnt: dir.join("mnt"),
            daemons: Vec::new(),
            fuse: None,
            mds_asok: dir.join("run/mds.a.asok"),
            up_s: 0.0,
        };
        match c.bring_up() {
            Ok(()) => {
                c.up_s = t.elapsed().as_secs_f64();
                Ok(c)
            }
            Err(e) => Err(io::Error::other(format!("{e}{}", c.log_tails()))),
        }
    }

    fn bring_up(&mut self) -> io::Result<()> {
        let fsid = uuid()?;
        let addr = format!("v1:127.0.0.1:{}", free_port()?);
        let d = self.dir.display();
        // `$name` is expanded by Ceph itself (mon.a, osd.0, …).
        let conf = format!(
            "[global]
fsid = {fsid}
mon host = {addr}
mon initial members = a
public addr = 127.0.0.1
ms bind ipv6 = false
auth cluster required = none
auth service required = none
auth client required = none
auth allow insecure global id reclaim = true
mon allow pool size one = true
mon allow pool delete = true
mon warn on pool no redundancy = false
mon warn on insecure global id reclaim = false
mon warn on insecure global id reclaim allowed = false
mon data avail warn = 1
mon data avail crit = 0
osd pool default size = 1
osd pool default min size = 1
osd pool default pg autoscale mode = off
osd crush chooseleaf type = 0
osd objectstore = memstore
memstore device bytes = 1073741824
run dir = {d}/run
admin socket = {d}/run/$name.asok
log file = {d}/log/$name.log
mon data = {d}/mon
osd data = {d}/osd
mds data = {d}/mds
mgr data = {d}/mgr
keyring = /dev/null
"
        );
        fs::write(&self.conf, conf)?;
        let monmap = self.dir.join("monmap");
        sh(Command::new("monmaptool").args(["--create", "--add", "a", &addr, "--fsid", &fsid]).arg(&monmap))?;
        sh(self.cmd("ceph-mon").args(["--mkfs", "-i", "a", "--monmap"]).arg(&monmap))?;
        self.spawn("mon.a", self.cmd("ceph-mon").args(["-f", "-i", "a"]))?;

        // The trap: the same uuid for the id and the OSD's mkfs.
        let osd_uuid = uuid()?;
        let id = self.ceph(&["osd", "new", &osd_uuid])?;
        sh(self.cmd("ceph-osd").args(["-i", &id, "--mkfs", "--osd-uuid", &osd_uuid]))?;
        // Under heavy load the OSD sometimes asks the monitor before it has the monmap ("wrong
        // fsid") and exits: start it again, a few times.
        for attempt in 1.. {
            self.spawn(&format!("osd.{id}"), self.cmd("ceph-osd").args(["-f", "-i", &id]))?;
            match self.wait_for("the OSD to be up", |c| Ok(c.ceph(&["osd", "stat"])?.contains(" 1 up"))) {
                Ok(()) => break,
                Err(e) if attempt < 3 && self.daemons.last_mut().is_some_and(|d| !d.alive()) => {
                    eprintln!("passes: cephfs: {e}; starting it again");
                    self.daemons.pop();
                }
                Err(e) => return Err(e),
            }
        }
        self.spawn("mgr.x", self.cmd("ceph-mgr").args(["-f", "-i", "x"]))?;
        self.spawn("mds.a", self.cmd("ceph-mds").args(["-f", "-i", "a"]))?;
        self.ceph(&["osd", "pool", "create", "cephfs_data", "8"])?;
        self.ceph(&["osd", "pool", "create", "cephfs_metadata", "8"])?;
        self.ceph(&["fs", "new", "cephfs", "cephfs_metadata", "cephfs_data"])?;
        self.wait_for("the MDS to be up:active", |c| Ok(c.ceph(&["mds", "stat"])?.contains("up:active")))?;
        self.mount()
    }

    /// A ceph command line on this cluster's configuration.
    fn cmd(&self, program: &str) -> Command {
        let mut c = Command::new(program);
        c.arg("-c").arg(&self.conf);
        c
    }

    /// `ceph ARGS` (the CLI), its stdout.
    fn ceph(&self, args: &[&str]) -> io::Result<String> {
        sh(self.cmd("ceph").args(["--connect-timeout", "30"]).args(args))
    }

    /// Starts a foreground daemon in its own process group, with its output in `log/`.
    fn spawn(&mut self, name: &str, cmd: &mut Command) -> io::Result<()> {
        let d = self.start_daemon(name, cmd)?;
        self.daemons.push(d);
        Ok(())
    }

    fn start_daemon(&self, name: &str, cmd: &mut Command) -> io::Result<Daemon> {
        let out = fs::File::create(self.dir.join("log").join(format!("{name}.out")))?;
        cmd.stdin(Stdio::null()).stdout(out.try_clone()?).stderr(out).process_group(0);
        // SAFETY: prctl is async-signal-safe; the child dies with the benchmark.
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
                Ok(())
            });
        }
        let child = cmd.spawn().map_err(|e| io::Error::new(e.kind(), format!("starting {name}: {e}")))?;
        Ok(Daemon { name: name.to_string(), child })
    }

    /// Polls `ready` until it says yes, a daemon dies, or [`UP_TIMEOUT`] passes.
    fn wait_for(&mut self, what: &str, ready: impl Fn(&Cluster) -> io::Result<bool>) -> io::Result<()> {
        let deadline = Instant::now() + UP_TIMEOUT;
        loop {
            crate::interrupted()?;
            for d in &mut self.daemons {
                if !d.alive() {
                    return Err(io::Error::other(format!("{} exited while waiting for {what}", d.name)));
                }
            }
            if ready(self).unwrap_or(false) {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(io::Error::other(format!("timed out after {UP_TIMEOUT:?} waiting for {what}")));
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    /// Mounts the filesystem at `mnt` with a fresh ceph-fuse: its caches start empty.
    pub fn mount(&mut self) -> io::Result<()> {
        self.unmount();
        let mut cmd = self.cmd("ceph-fuse");
        cmd.arg("-f").arg(&self.mnt);
        self.fuse = Some(self.start_daemon("ceph-fuse", &mut cmd)?);
        let deadline = Instant::now() + Duration::from_secs(60);
        while statfs_type(&self.mnt) != Some(FUSE_SUPER_MAGIC) {
            if !self.fuse.as_mut().is_some_and(Daemon::alive) {
                return Err(io::Error::other("ceph-fuse exited before the mount appeared"));
            }
            if Instant::now() > deadline {
                return Err(io::Error::other("ceph-fuse: the mount did not appear within 60 s"));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(())
    }

    /// Unmounts and waits for ceph-fuse to exit (lazily detached when busy).
    pub fn unmount(&mut self) {
        let Some(mut f) = self.fuse.take() else { return };
        if statfs_type(&self.mnt) == Some(FUSE_SUPER_MAGIC) && sh(Command::new("umount").arg(&self.mnt)).is_err() {
            let _ = sh(Command::new("umount").arg("-l").arg(&self.mnt));
        }
        // ceph-fuse exits by itself once unmounted.
        let deadline = Instant::now() + Duration::from_secs(10);
        while f.alive() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        f.stop(Duration::from_secs(2));
    }

    /// Client cache cold: unmount, mount again. The MDS and OSD keep theirs (server side).
    pub fn cold(&mut self) -> io::Result<()> {
        self.mount()
    }

    /// `syncfs` of the mount; seconds it took.
    pub fn sync(&self) -> io::Result<f64> {
        syncfs(&self.mnt)
    }

    /// The MDS's counters (`ceph daemon mds.a perf dump`): `request` (`mds.request`, client
    /// requests handled since it started), each request kind (`mds_server.req_KIND_latency`'s
    /// count: `getattr`, `lookup`, `setattr`, `readdir`, …) and cap messages from clients
    /// (`handle_client_caps`, `handle_client_caps_dirty`: changes flushed under a cap, no request).
    pub fn mds_counters(&self) -> io::Result<BTreeMap<String, u64>> {
        let out = sh(Command::new("ceph").arg("--admin-daemon").arg(&self.mds_asok).args(["perf", "dump"]))?;
        let v: Value = serde_json::from_str(&out).map_err(io::Error::other)?;
        let mut m = BTreeMap::new();
        let request = v.pointer("/mds/request").and_then(Value::as_u64);
        m.insert("request".to_string(), request.ok_or_else(|| io::Error::other("no mds.request counter"))?);
        // The MDS's reply latency (`mds.reply_latency`: request received to reply sent, its
        // queue included): the sum, in µs, and the count, so a run's mean is their increases'.
        if let Some(r) = v.pointer("/mds/reply_latency") {
            let sum = r.get("sum").and_then(Value::as_f64).unwrap_or(0.0);
            m.insert(REPLY_LATENCY_US.to_string(), (sum * 1e6) as u64);
            m.insert(REPLIES.to_string(), r.get("avgcount").and_then(Value::as_u64).unwrap_or(0));
        }
        for k in ["handle_client_caps", "handle_client_caps_dirty"] {
            if let Some(n) = v.pointer(&format!("/mds/{k}")).and_then(Value::as_u64) {
                m.insert(k.to_string(), n);
            }
        }
        if let Some(server) = v.get("mds_server").and_then(Value::as_object) {
            for (k, c) in server {
                if let (Some(kind), Some(n)) =
                    (k.strip_prefix("req_").and_then(|k| k.strip_suffix("_latency")), c.get("avgcount"))
                {
                    m.insert(kind.to_string(), n.as_u64().unwrap_or(0));
                }
            }
        }
        Ok(m)
    }

    /// The last lines of each daemon's log, for an error message.
    fn log_tails(&self) -> String {
        let mut s = String::new();
        let Ok(rd) = fs::read_dir(self.dir.join("log")) else { return s };
        let mut paths: Vec<PathBuf> = rd.filter_map(|e| e.ok().map(|e| e.path())).collect();
        paths.sort();
        for p in paths {
            let text = fs::read_to_string(&p).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(4).collect();
            if !tail.is_empty() {
                s.push_str(&format!("\n  {}:", p.file_name().unwrap_or_default().to_string_lossy()));
                for l in tail.into_iter().rev() {
                    s.push_str(&format!("\n    {l}"));
                }
            }
        }
        s
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.unmount();
        // The MDS first (it flushes to the OSD), the monitor last.
        while let Some(mut d) = self.daemons.pop() {
            d.stop(Duration::from_secs(3));
        }
        let _ = fs::remove_dir_all(&self.dir);
    }
}
