//! `cargo bench --bench passes -- --entries 100000`: volprep against the kubelet's fsGroup pass,
//! `chown -R`, `chgrp -R && chmod -R` and a stat-only floor, on a fresh loop-mounted
//! filesystem, on a FUSE model of slow storage, and (`--storages ceph`) on a single-node CephFS
//! it brings up and tears down itself. Run `-- --help` for the options; the module docs of
//! `passes/slowfs.rs` say what the slow-storage model is and is not, those of `passes/ceph.rs`
//! how the cluster is built.
//!
//! Each method runs as a child process (the kubelet re-implementation too, through a hidden
//! subcommand of this binary), so `wait4` gives its own CPU time and peak RSS. Every run starts
//! from a reset tree whose metadata digest is verified; methods that promise a result are
//! checked against the expected digest afterwards.
//!
//! Methods (`--methods` ids): `floor` (`find ROOT -printf '%U\n'`), the machine's floors
//! `read-floor`, `unsafe-floor` and `race-safe-floor` (plain syscalls on the same parallel walk,
//! at the largest thread count: `passes/floors.rs`), `check` (volprep check, a
//! second floor), `kubelet` (`passes/kubelet.rs`), `kubelet-2nd` (the same on a tree it already
//! fixed), `onrootmismatch` (`fsGroupChangePolicy: OnRootMismatch` at a restart: the kubelet's
//! root-only check, on a prepared tree), `onrootmismatch-1st` (the same policy's first walk: the
//! check, then the kubelet's pass), `chown` (`chown -R 1001:2000`), `chgrp` (`chgrp -R 2000 &&
//! chmod -R g+rwX`), `rchm` (crates.io `rcp-tools-rchm`, pinned, built with `cargo install
//! --locked` into `target/peers/` on first use, about 4 minutes; a `--smoke` run uses it only
//! when already built; its failures, such as EMFILE, are shown in its row, not fatal), and
//! volprep `full` (every entry needs a change; an explicit thread count runs with `--load full`,
//! `default` with volprep's own load policy, adaptive on FUSE and CephFS), `rescan` (tree already right, `--verify full` when the binary has it),
//! `skip` (valid marker), `resume` and `resume80` (SIGKILL once a progress line counts 50 % or
//! 80 % of the entries, or with `--resume-by-time` at that share of the measured `full` time,
//! then a rerun; reports the entries the rerun read) and `progress` (`full` with `--progress-interval 1s`; the
//! other volprep runs use `0`). `skip` and `resume` show n/a unless the report says "skipped".
//!
//! Cold: `syncfs`, unmount, mount, `echo 3 > /proc/sys/vm/drop_caches` (dropping caches alone
//! leaves freshly written inode tables cached); on CephFS, a fresh ceph-fuse mount (the
//! client's caches start empty; the MDS keeps its own). Warm: `syncfs` only. On CephFS each
//! run also reads the MDS's request counter before and after (`requests/entry`). The loop device uses direct
//! I/O when the backing filesystem allows it; what the host below caches is out of reach.
//!
//! Needs root, util-linux (losetup, mount), e2fsprogs (xfsprogs for `--fs xfs`), findutils,
//! coreutils, /dev/fuse for the slow-storage part (no libfuse: `fuser` mounts directly as root)
//! strace for `--syscalls`, and Debian's Ceph 16 packages for `--storages ceph` (see
//! `passes/ceph.rs`). Without root, a loop device or those it says so and exits 2; under CI
//! (`CI=true` or `VOLPREP_PRIVILEGED_TESTS=1`) the `--smoke` run exits 1 instead.

#[path = "passes/args.rs"]
mod args;
#[path = "passes/ceph.rs"]
mod ceph;
#[path = "passes/child.rs"]
mod child;
#[path = "passes/floors.rs"]
mod floors;
#[path = "passes/fsimage.rs"]
mod fsimage;
/// The FUSE passthrough under the slow-storage model, shared with the tests' FUSE filesystems.
#[path = "../tests/common/fuse_passthrough.rs"]
mod fuse_passthrough;
#[path = "passes/kubelet.rs"]
mod kubelet;
#[path = "passes/methods.rs"]
mod methods;
#[path = "passes/report.rs"]
mod report;
#[path = "passes/shapes.rs"]
mod shapes;
#[path = "passes/slowfs.rs"]
mod slowfs;
#[path = "passes/syscalls.rs"]
mod syscalls;
#[path = "passes/tree.rs"]
mod tree;

use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use args::{Args, Command, FsKind, StorageKind, Temp};
use child::Spawner;
use fsimage::{Volume, have};
use methods::{Features, Kind, Method, Runner};
use report::Run;
use slowfs::SlowMount;
use tree::{Counts, State, Tree, Xattrs};

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_sigint(_: libc::c_int) {
    INTERRUPTED.store(true, Ordering::Relaxed);
}

fn main() -> ExitCode {
    let target_dir =
        Path::new(env!("CARGO_TARGET_TMPDIR")).parent().map_or_else(|| PathBuf::from("target"), Path::to_path_buf);
    let code = match args::parse(std::env::args().skip(1).collect(), target_dir) {
        Err(msg) => {
            eprintln!("passes: {msg}\n\n{}", args::USAGE);
            2
        }
        Ok(Command::Help) => {
            print!("{}", args::USAGE);
            0
        }
        Ok(Command::Kubelet { root, gid }) => kubelet::main_kubelet(&root, gid),
        Ok(Command::OnRootMismatch { root, gid }) => kubelet::main_onrootmismatch(&root, gid),
        Ok(Command::Floor { floor, root, gid, threads }) => floors::main_floor(floor, &root, gid, threads),
        Ok(Command::Fuse { src, mnt, latency_us, ttl_s, slots, stats }) => {
            slowfs::main_fuse(&src, &mnt, latency_us, ttl_s, slots, &stats)
        }
        Ok(Command::Spawner) => child::serve(),
        Ok(Command::Bench(a)) => bench(&a),
    };
    ExitCode::from(code as u8)
}

/// Where the volprep binary is: `VOLPREP_BIN`, else the one cargo built for this bench.
fn volprep_bin(target_dir: &Path) -> PathBuf {
    if let Some(p) = std::env::var_os("VOLPREP_BIN") {
        return p.into();
    }
    option_env!("CARGO_BIN_EXE_volprep").map_or_else(|| target_dir.join("release/volprep"), PathBuf::from)
}

/// rchm, pinned to [`methods::RCHM_VERSION`]: `target/peers/rchm-VERSION/bin/rchm`, built there
/// with `cargo install --locked` (from crates.io) when missing, except in a smoke run.
fn rchm_bin(target_dir: &Path, smoke: bool) -> Result<PathBuf, String> {
    let version = methods::RCHM_VERSION;
    let root = target_dir.join("peers").join(format!("rchm-{version}"));
    let bin = root.join("bin/rchm");
    if bin.is_file() {
        return Ok(bin);
    }
    if smoke {
        return Err(format!("not built ({} missing; a run without --smoke builds it, about 4 minutes)", bin.display()));
    }
    eprintln!(
        "passes: building rchm {version} from crates.io into {} (cargo install --locked; about 4 minutes)",
        root.display()
    );
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let log = root.with_extension("log");
    let _ = fs::create_dir_all(&root);
    let out = fs::File::create(&log).map_err(|e| format!("{}: {e}", log.display()))?;
    let status = std::process::Command::new(cargo)
        .args(["install", "--locked", "--root"])
        .arg(&root)
        .arg(format!("rcp-tools-rchm@{version}"))
        .stdout(out.try_clone().map_err(|e| e.to_string())?)
        .stderr(out)
        .status()
        .map_err(|e| format!("cargo install: {e}"))?;
    if status.success() && bin.is_file() {
        Ok(bin)
    } else {
        Err(format!("cargo install rcp-tools-rchm@{version} failed ({status}); see {}", log.display()))
    }
}

fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true") || std::env::var("VOLPREP_PRIVILEGED_TESTS").is_ok_and(|v| v == "1")
}

/// What this machine lacks for the benchmark.
fn missing(a: &Args, volprep: &Path) -> Vec<String> {
    let mut need = Vec::new();
    // SAFETY: geteuid cannot fail.
    if rustix::process::geteuid().as_raw() != 0 {
        need.push("root (it makes loop devices, mounts, chowns and drops caches)".to_string());
    }
    let mkfs = match a.fs {
        FsKind::Ext4 => "mkfs.ext4",
        FsKind::Xfs => "mkfs.xfs",
    };
    for cmd in [mkfs, "losetup", "mount", "umount", "find", "chown", "chgrp", "chmod", "sh"] {
        if !have(cmd) {
            need.push(format!("`{cmd}` on PATH"));
        }
    }
    if !Path::new("/dev/loop-control").exists() {
        need.push("a loop device (/dev/loop-control: `modprobe loop`)".to_string());
    }
    if !volprep.is_file() {
        need.push(format!("the volprep binary at {} (or VOLPREP_BIN)", volprep.display()));
    }
    if a.on(StorageKind::Ceph) {
        need.extend(ceph::missing().into_iter().map(|n| format!("{n}, for --storages ceph")));
    }
    need
}

/// Prints what is missing; 2, or 1 for the smoke run under CI (where it must run).
fn cannot_run(a: &Args, need: &[String]) -> i32 {
    eprintln!("passes: this benchmark cannot run here; it needs:");
    for n in need {
        eprintln!("  - {n}");
    }
    if a.smoke && in_ci() {
        eprintln!("passes: the smoke run is required under CI (CI=true or VOLPREP_PRIVILEGED_TESTS=1): failing");
        1
    } else {
        2
    }
}

/// Removes the run's scratch directory on every exit.
struct WorkDir(PathBuf);

impl Drop for WorkDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// Where a method runs.
#[derive(Debug, Clone)]
enum Storage {
    Local,
    Slow { latency_us: u64, ttl_s: u64, slots: u64 },
    Ceph,
}

/// One benchmark run: the volume, the mounted slow-storage model, and what was measured.
/// Field order is drop order: the FUSE mount goes before the volume, the volume before its dir.
struct Bench<'a> {
    spawner: Spawner,
    slow: Option<SlowMount>,
    ceph: Option<ceph::Cluster>,
    vol: Volume,
    work: WorkDir,
    a: &'a Args,
    exe: PathBuf,
    volprep: PathBuf,
    features: Features,
    /// The rchm binary, when built (see [`rchm_bin`]).
    rchm: Option<PathBuf>,
    runs: Vec<Run>,
    failures: Vec<String>,
    na: BTreeMap<&'static str, String>,
    entries: BTreeMap<String, u64>,
    seq: usize,
}

fn bench(a: &Args) -> i32 {
    let target_dir = a.out.parent().map_or_else(|| PathBuf::from("."), Path::to_path_buf);
    let volprep = volprep_bin(&target_dir);
    let need = missing(a, &volprep);
    if !need.is_empty() {
        return cannot_run(a, &need);
    }
    // SAFETY: the handler only stores to an atomic.
    unsafe { libc::signal(libc::SIGINT, on_sigint as *const () as libc::sighandler_t) };
    let exe = std::env::current_exe().expect("own executable");
    // Before anything big is allocated here (see `child::Spawner`).
    let spawner = match Spawner::start(&exe) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("passes: cannot start the spawner process: {e}");
            return 1;
        }
    };
    let work = a.workdir.join(format!("bench-passes-{}", std::process::id()));
    let size = (a.entries * 8192).max(1 << 30);
    let inodes = a.entries + a.entries / 4 + a.slow_entries * 2 + 20_000;
    let vol = match Volume::create(&work, a.fs, size, inodes) {
        Ok(v) => v,
        Err(e) => {
            let _ = fs::remove_dir_all(&work);
            return cannot_run(a, &[format!("a working loop device and mount: {e}")]);
        }
    };
    let mut b = Bench {
        spawner,
        slow: None,
        ceph: None,
        vol,
        work: WorkDir(work),
        a,
        exe,
        features: Features::detect(&volprep),
        rchm: None,
        volprep,
        runs: Vec::new(),
        failures: Vec::new(),
        na: BTreeMap::new(),
        entries: BTreeMap::new(),
        seq: 0,
    };
    if a.wants("rchm") {
        match rchm_bin(&target_dir, a.smoke) {
            Ok(p) => b.rchm = Some(p),
            Err(why) => {
                eprintln!("passes: rchm: {why}");
                b.na.insert("rchm", why);
            }
        }
    }
    match b.main() {
        Ok(()) if b.failures.is_empty() => 0,
        Ok(()) => {
            eprintln!("\npasses: {} failure(s):", b.failures.len());
            for f in &b.failures {
                eprintln!("  - {f}");
            }
            1
        }
        Err(e) => {
            eprintln!("passes: {e}");
            1
        }
    }
}

/// What a peer that failed said: its first error line (rchm logs errors on stdout, in colour)
/// and how many such lines there were.
fn peer_error(dir: &Path) -> String {
    let mut text = fs::read_to_string(dir.join("stderr")).unwrap_or_default();
    text += &fs::read_to_string(dir.join("stdout")).unwrap_or_default();
    // Without ANSI escapes (ESC [ ... letter).
    let mut plain = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            plain.push(c);
        }
    }
    let errors: Vec<&str> = plain.lines().filter(|l| l.contains("ERROR") || l.contains("error")).collect();
    let first = errors.first().copied().or_else(|| plain.lines().rev().find(|l| !l.trim().is_empty())).unwrap_or("");
    let first: String = first.trim().chars().take(200).collect();
    format!("{} error line(s), the first: {first}", errors.len())
}

/// What a volprep report's `load` says when its gate worked: the policy, the limit on
/// operations in flight (at the end, lowest–highest) and volprep's own mean latency.
fn load_note(load: Option<&Value>) -> String {
    let Some(l) = load.filter(|l| l.get("ops").is_some()) else { return String::new() };
    let mut s = l.get("policy").and_then(Value::as_str).unwrap_or("?").to_string();
    if let Some(lim) = l.get("in_flight_limit").filter(|v| v.is_object()) {
        let n = |k: &str| lim.get(k).and_then(Value::as_u64).unwrap_or(0);
        s += &format!(" {} in flight ({}–{})", n("final"), n("min"), n("max"));
    }
    if let Some(us) = l.get("mean_latency_us").and_then(Value::as_u64) {
        s += &format!(", volprep saw {:.2} ms", us as f64 / 1000.0);
    }
    if let Some(us) = l.get("unloaded_latency_us").and_then(Value::as_u64) {
        s += &format!(" ({:.2} unloaded)", us as f64 / 1000.0);
    }
    s
}

/// The 1-minute load average (`/proc/loadavg`); NaN when unreadable.
fn load1() -> f64 {
    fs::read_to_string("/proc/loadavg").ok().and_then(|s| s.split_whitespace().next()?.parse().ok()).unwrap_or(f64::NAN)
}

/// "generated N entries (…) in T s".
fn generated(c: &Counts, since: Instant) -> String {
    format!(
        "generated {} entries ({} dirs, {} files, {} symlinks, {} hard links, {} setuid) in {:.1} s",
        c.entries,
        c.dirs,
        c.files,
        c.symlinks,
        c.hardlinks,
        c.setuid,
        since.elapsed().as_secs_f64()
    )
}

pub(crate) fn interrupted() -> io::Result<()> {
    if INTERRUPTED.load(Ordering::Relaxed) {
        return Err(io::Error::new(io::ErrorKind::Interrupted, "interrupted"));
    }
    Ok(())
}

impl Bench<'_> {
    fn storage_name(&self, s: &Storage) -> String {
        match s {
            Storage::Local => self.a.fs.name().to_string(),
            Storage::Slow { latency_us, slots: 0, .. } => format!("slow {latency_us}us"),
            Storage::Slow { latency_us, slots, .. } => format!("slow {latency_us}us {slots} slots"),
            Storage::Ceph => "cephfs".to_string(),
        }
    }

    fn cluster(&mut self) -> io::Result<&mut ceph::Cluster> {
        self.ceph.as_mut().ok_or_else(|| io::Error::other("the CephFS cluster is not running"))
    }

    fn main(&mut self) -> io::Result<()> {
        let a = self.a;
        eprintln!(
            "passes: {} {} entries (seed {}), {} rep(s), threads {:?}, storages {:?}, volprep {} (progress-interval: {}, verify full: {})",
            a.shape.name(),
            a.entries,
            a.seed,
            a.reps,
            a.threads,
            a.storages,
            self.volprep.display(),
            self.features.progress_interval,
            self.features.verify_full
        );
        let local_name = self.storage_name(&Storage::Local);
        let mut local = None;
        let mut syscall_lines = Vec::new();
        let mut syscall_json = Vec::new();
        if a.on(StorageKind::Local) {
            let t = Instant::now();
            let tree = Tree::generate(&self.vol.mnt.join("vol"), a.shape, a.entries, a.seed, false)?;
            tree.verify(State::Golden, Xattrs::None).map_err(io::Error::other)?;
            eprintln!("passes: {}", generated(&tree.counts, t));
            self.prime(&tree)?;
            self.entries.insert(local_name.clone(), tree.counts.entries);
            let plan = methods::plan(a, self.features, false);
            self.phase(&Storage::Local, &tree, &plan, &a.temps)?;
            if a.syscalls {
                if have("strace") {
                    (syscall_lines, syscall_json) = self.syscalls(&tree)?;
                } else {
                    eprintln!("passes: --syscalls: strace is not installed; skipped");
                }
            }
            local = Some(tree);
        }

        let mut slow_name = None;
        let mut slow_tree = None;
        if a.on(StorageKind::Slow) && a.slow_entries > 0 {
            match self.slow_tree() {
                Ok(tree) => {
                    let storage =
                        Storage::Slow { latency_us: a.latency_us, ttl_s: a.fuse_ttl_s, slots: a.server_slots };
                    let name = self.storage_name(&storage);
                    self.entries.insert(name.clone(), tree.counts.entries);
                    let plan = methods::plan(a, self.features, true);
                    self.phase(&storage, &tree, &plan, &[Temp::Cold])?;
                    slow_name = Some(name);
                    slow_tree = Some(tree.counts);
                }
                Err(e) if a.smoke && in_ci() => {
                    self.failures.push(format!("slow storage could not run: {e}"));
                }
                Err(e) => eprintln!("passes: slow storage skipped: {e}"),
            }
        }

        let mut ceph_run = None;
        if a.on(StorageKind::Ceph) {
            match self.ceph_phase() {
                Ok(r) => ceph_run = Some(r),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => return Err(e),
                Err(e) => self.failures.push(format!("CephFS: {e}")),
            }
        }

        let rows = report::rows(&self.runs, &self.entries, &self.na);
        let mut out = String::new();
        if let Some(local) = &local {
            out.push_str(&format!(
                "\n### {local_name}: {} tree, {} entries, {} rep(s)\n\n",
                a.shape.name(),
                local.counts.entries,
                a.reps
            ));
            out.push_str(&report::table(&rows, &local_name));
        }
        if let (Some(name), Some(counts)) = (&slow_name, slow_tree) {
            out.push_str(&format!(
                "\n### {name}: FUSE model, {} µs per metadata request, {} tree, {} entries, cold (fresh mount) only; requests/entry: delayed FUSE requests\n\n",
                a.latency_us,
                a.shape.name(),
                counts.entries
            ));
            out.push_str(&report::table(&rows, name));
        }
        if let Some((counts, up_s)) = ceph_run {
            out.push_str(&format!(
                "\n### cephfs: single-node Ceph 16 (memstore OSD) through ceph-fuse, up in {up_s:.0} s, {} tree, {} entries, {} rep(s), client cache cold (fresh ceph-fuse mount); requests/entry: MDS requests (mds.request)\n\n",
                a.shape.name(),
                counts.entries,
                a.reps
            ));
            out.push_str(&report::table(&rows, "cephfs"));
            out.push_str("\nMDS requests per entry by kind (medians; caps: cap messages from the client, changes flushed without a request):\n\n");
            out.push_str(&report::mix_table(&self.runs, &rows, "cephfs", counts.entries));
        }
        if !syscall_lines.is_empty() {
            out.push_str("\n### syscalls per entry (counted in an strace -f trace, warm)\n\n| method | syscalls | per entry | most frequent (per entry) |\n|---|--:|--:|---|\n");
            for l in &syscall_lines {
                out.push_str(l);
                out.push('\n');
            }
        }
        let local_key = if local.is_some() { local_name.as_str() } else { "" };
        let ceph_key = ceph_run.map(|_| "cephfs");
        let targets = report::targets(&rows, local_key, slow_name.as_deref(), ceph_key, &self.na);
        let distances = report::distances(&rows, &[local_key, slow_name.as_deref().unwrap_or(""), "cephfs"]);
        if !distances.is_empty() {
            out.push_str("\n### distance to the machine's floors (medians of this run)\n\n");
            for d in &distances {
                out.push_str(&format!("- {d}\n"));
            }
        }
        out.push_str("\n### targets (ratios from this run)\n\n");
        for t in &targets {
            out.push_str(&format!("- {t}\n"));
        }
        let loads: Vec<f64> = self.runs.iter().map(|r| r.load1).filter(|l| l.is_finite()).collect();
        let (lo, hi) = loads.iter().fold((f64::INFINITY, 0.0f64), |(lo, hi), &l| (lo.min(l), hi.max(l)));
        out.push_str(&format!("\n{}", machine_line(&self.vol)));
        if !loads.is_empty() {
            out.push_str(&format!("; 1-minute load average before the timed runs {lo:.1}–{hi:.1}"));
        }
        out.push('\n');
        println!("{out}");

        let meta = self.meta(local.as_ref());
        let j = report::json(meta, &self.runs, &rows, &targets, Value::Array(syscall_json));
        if let Some(dir) = a.out.parent() {
            fs::create_dir_all(dir)?;
        }
        fs::write(&a.out, serde_json::to_string_pretty(&j)? + "\n")?;
        eprintln!("passes: raw figures written to {}", a.out.display());
        Ok(())
    }

    /// Brings up the CephFS cluster, generates its tree through the mount, runs the plan
    /// (cold client only) and tears the cluster down. Returns the tree's counts and the
    /// cluster's start-up time.
    fn ceph_phase(&mut self) -> io::Result<(Counts, f64)> {
        let a = self.a;
        eprintln!("passes: cephfs: starting a single-node cluster (mon, mgr, memstore OSD, MDS) and ceph-fuse");
        let cluster = ceph::Cluster::start(&self.work.0.join("ceph"))?;
        let up_s = cluster.up_s;
        eprintln!("passes: cephfs: up and mounted in {up_s:.1} s");
        let root = cluster.mnt.join("vol");
        self.ceph = Some(cluster);
        let t = Instant::now();
        let tree = Tree::generate(&root, a.shape, a.ceph_entries, a.seed, true)?;
        tree.verify(State::Golden, Xattrs::None).map_err(io::Error::other)?;
        eprintln!("passes: cephfs: {}", generated(&tree.counts, t));
        self.entries.insert(self.storage_name(&Storage::Ceph), tree.counts.entries);
        let plan = methods::plan(a, self.features, true);
        let r = self.phase(&Storage::Ceph, &tree, &plan, &[Temp::Cold]);
        let t = Instant::now();
        self.ceph = None;
        eprintln!("passes: cephfs: cluster stopped and removed in {:.1} s", t.elapsed().as_secs_f64());
        r.map(|()| (tree.counts, up_s))
    }

    /// One untimed cold walk, so the first timed method does not pay alone for whatever the
    /// layers below the loop device (host page cache, disk) had not read yet.
    fn prime(&mut self, tree: &Tree) -> io::Result<()> {
        self.vol.cold()?;
        fsimage::sh(std::process::Command::new("find").arg(&tree.root).args(["-printf", ""]))?;
        Ok(())
    }

    /// The smaller tree for slow storage, on the same filesystem.
    fn slow_tree(&mut self) -> io::Result<Tree> {
        if !Path::new("/dev/fuse").exists() {
            return Err(io::Error::other("it needs /dev/fuse (`modprobe fuse`)"));
        }
        let a = self.a;
        let tree = Tree::generate(&self.vol.mnt.join("slow-vol"), a.shape, a.slow_entries, a.seed, false)?;
        tree.verify(State::Golden, Xattrs::None).map_err(io::Error::other)?;
        // Prove the mount works before timing anything on it.
        self.mount_slow(&tree, (a.latency_us, a.fuse_ttl_s, a.server_slots))?;
        let n = fs::read_dir(&self.slow.as_ref().expect("mounted").mnt)?.count();
        self.slow = None;
        eprintln!(
            "passes: slow storage: {} entries, {} µs per request; root lists {n} names",
            tree.counts.entries, a.latency_us
        );
        Ok(tree)
    }

    fn mount_slow(&mut self, tree: &Tree, model: (u64, u64, u64)) -> io::Result<()> {
        self.slow = None;
        let mnt = self.work.0.join("slow");
        let stats = self.stats_file();
        let _ = fs::remove_file(&stats);
        self.slow = Some(SlowMount::start(&self.exe, &tree.root, &mnt, model, &stats)?);
        Ok(())
    }

    /// Where the slow-storage server writes its request counts when unmounted.
    fn stats_file(&self) -> PathBuf {
        self.work.0.join("slow-stats.json")
    }

    /// The root a method sees: the tree itself, or the slow-storage mount of it.
    fn attach(&mut self, storage: &Storage, tree: &Tree) -> io::Result<PathBuf> {
        match storage {
            Storage::Local | Storage::Ceph => Ok(tree.root.clone()),
            Storage::Slow { latency_us, ttl_s, slots } => {
                self.mount_slow(tree, (*latency_us, *ttl_s, *slots))?;
                Ok(self.slow.as_ref().expect("mounted").mnt.clone())
            }
        }
    }

    fn phase(&mut self, storage: &Storage, tree: &Tree, plan: &[Method], temps: &[Temp]) -> io::Result<()> {
        for rep in 0..self.a.reps {
            for m in plan {
                for &temp in temps {
                    interrupted()?;
                    self.one(storage, tree, m, temp, rep)?;
                }
            }
        }
        self.slow = None;
        Ok(())
    }

    /// Caches for a timed run: sync (warm), or sync + remount + drop caches (cold); on CephFS
    /// a fresh ceph-fuse mount (cold). Cold is the volume's caches: the programs themselves are
    /// then started once (`--version`), as an init container's image is in the page cache
    /// after its pull; otherwise a 10 ms `skip` would time reading volprep and libc from disk.
    fn temperature(&mut self, storage: &Storage, temp: Temp) -> io::Result<()> {
        self.slow = None;
        match (storage, temp) {
            (Storage::Ceph, Temp::Cold) => self.cluster()?.cold(),
            (Storage::Ceph, Temp::Warm) => self.cluster()?.sync().map(|_| ()),
            (_, Temp::Cold) => {
                self.vol.cold()?;
                for program in
                    [self.volprep.as_os_str(), "find".as_ref(), "chown".as_ref(), "chgrp".as_ref(), "chmod".as_ref()]
                {
                    let mut c = std::process::Command::new(program);
                    fsimage::sh(c.arg("--version"))?;
                }
                Ok(())
            }
            (_, Temp::Warm) => self.vol.sync().map(|_| ()),
        }
    }

    /// `syncfs` of the storage a method ran on; seconds.
    fn sync(&mut self, storage: &Storage) -> io::Result<f64> {
        match storage {
            Storage::Ceph => self.cluster()?.sync(),
            _ => self.vol.sync(),
        }
    }

    /// The MDS's counters, on CephFS.
    fn mds_counters(&mut self, storage: &Storage) -> io::Result<Option<BTreeMap<String, u64>>> {
        match storage {
            Storage::Ceph => self.cluster()?.mds_counters().map(Some),
            _ => Ok(None),
        }
    }

    fn run_dir(&mut self, what: &str) -> io::Result<PathBuf> {
        self.seq += 1;
        let d = self.work.0.join("runs").join(format!("{:04}-{what}", self.seq));
        fs::create_dir_all(&d)?;
        Ok(d)
    }

    /// Runs `m`'s command once, untimed setup or timed, with stdout/stderr in `dir`.
    fn exec(&mut self, m: &Method, root: &Path, dir: &Path, kill: Option<child::Kill>) -> io::Result<child::Measured> {
        let runner =
            Runner { exe: &self.exe, volprep: &self.volprep, features: self.features, rchm: self.rchm.as_deref() };
        let (cmd, _) = runner.command(m, root, &dir.join("report.json"));
        let stdout = (m.kind != Kind::Floor).then(|| dir.join("stdout"));
        let r = self.spawner.run(&cmd, stdout.as_deref(), Some(&dir.join("stderr")), kill);
        interrupted()?;
        r
    }

    /// The shortest time of this run's `full` at these threads and cache state, if measured
    /// (the least disturbed: a kill at half a median pass may come after a quick pass ended).
    fn full_time(&self, storage: &str, threads: Option<usize>, temp: &str) -> Option<f64> {
        let mut v: Vec<f64> = self
            .runs
            .iter()
            .filter(|r| r.storage == storage && r.method == "full" && r.threads == threads && r.temp == temp && r.ok)
            .map(|r| r.m.wall_s)
            .collect();
        v.sort_by(f64::total_cmp);
        v.first().copied()
    }

    fn one(&mut self, storage: &Storage, tree: &Tree, m: &Method, temp: Temp, rep: usize) -> io::Result<()> {
        let sname = self.storage_name(storage);
        let what = format!(
            "[{sname}] {} t={} {} rep {}/{}",
            m.id,
            methods::threads_label(m.threads),
            temp.name(),
            rep + 1,
            self.a.reps
        );
        if matches!(m.kind, Kind::Resume(_))
            && let Some(why) = self.na.get("skip")
        {
            let why = format!("needs the marker, not built yet ({why})");
            self.na.entry("resume").or_insert(why);
            return Ok(());
        }
        if m.kind == Kind::Skip && self.na.contains_key("skip") {
            return Ok(());
        }
        if m.kind == Kind::Rchm && self.rchm.is_none() {
            return Ok(());
        }
        let setup = Instant::now();
        let dir = self.run_dir(&format!("{}-{}", m.id, temp.name()))?;
        tree.reset(m.start)?;
        if let Err(e) = tree.verify(m.start, Xattrs::None) {
            self.failures.push(format!("{what}: reset did not verify: {e}"));
            return Ok(());
        }
        let mut note = String::new();
        let mut timed = m.clone();
        match m.kind {
            Kind::Skip => {
                // A first apply prepares the tree and writes its marker.
                let prep = Method { kind: Kind::Apply(vec![]), ..m.clone() };
                let root = self.attach(storage, tree)?;
                let d = self.run_dir("skip-prep")?;
                let r = self.exec(&prep, &root, &d, None)?;
                if r.exit != child::Exit::Code(0) {
                    self.failures.push(format!("{what}: the preparing apply failed: {}", r.exit.describe()));
                    return Ok(());
                }
            }
            Kind::Resume(pct) => {
                let full = self.full_time(&sname, m.threads, temp.name());
                let full = match full {
                    Some(t) => t,
                    None => {
                        // No full pass measured at these threads: time one now.
                        let cal = Method { kind: Kind::Apply(vec![]), ..m.clone() };
                        self.temperature(storage, temp)?;
                        let root = self.attach(storage, tree)?;
                        let d = self.run_dir("resume-calibrate")?;
                        let r = self.exec(&cal, &root, &d, None)?;
                        tree.reset(State::Golden)?;
                        r.wall_s
                    }
                };
                if self.features.checkpoint_interval {
                    // Checkpoints about 100 times per pass: what the default 3 s gives a 5-minute
                    // pass (the incident's took 30), so the kill loses what it would there.
                    let every = format!("{}ms", ((full * 1000.0 / 100.0) as u64).max(10));
                    timed.kind = Kind::Apply(vec!["--checkpoint-interval".into(), every]);
                }
                self.temperature(storage, temp)?;
                let root = self.attach(storage, tree)?;
                // At that share of the entries (progress lines every 20 ms), or of the time.
                let d = self.run_dir("resume-killed")?;
                let (killed, kill) = match (self.a.resume_by_time, &timed.kind) {
                    (false, Kind::Apply(extra)) if self.features.progress_interval => {
                        let mut extra = extra.clone();
                        extra.extend(["--progress-interval", "20ms", "--log-format", "text"].map(String::from));
                        let at = tree.counts.entries * u64::from(pct) / 100;
                        (
                            Method { kind: Kind::Apply(extra), ..timed.clone() },
                            child::Kill::AtEntries(at, d.join("stderr")),
                        )
                    }
                    _ => (timed.clone(), child::Kill::After(Duration::from_secs_f64(full * f64::from(pct) / 100.0))),
                };
                let r = self.exec(&killed, &root, &d, Some(kill))?;
                note = match r.exit {
                    child::Exit::Signal(libc::SIGKILL) => String::new(),
                    e => format!("first pass ended before the kill ({})", e.describe()),
                };
            }
            _ => {}
        }
        self.temperature(storage, temp)?;
        let root = self.attach(storage, tree)?;
        let before = self.mds_counters(storage)?;
        let setup_s = setup.elapsed().as_secs_f64();
        let load1 = load1();
        let r = self.exec(&timed, &root, &dir, None)?;
        let sync_s = self.sync(storage)?;
        let (request_mix, requests, latency_us) = match storage {
            Storage::Local => (None, None, None),
            Storage::Slow { .. } => {
                self.slow = None;
                let mix =
                    fs::read_to_string(self.stats_file()).ok().and_then(|t| serde_json::from_str::<Value>(&t).ok());
                let delayed = mix.as_ref().and_then(|v| v.get("delayed").and_then(Value::as_u64));
                let latency = mix.as_ref().and_then(|v| v.get("mean_latency_us").and_then(Value::as_f64));
                (mix, delayed, latency)
            }
            Storage::Ceph => {
                // After the sync, so whatever the method left to flush is counted too.
                let after = self.mds_counters(storage)?.unwrap_or_default();
                let before = before.unwrap_or_default();
                let mut delta: BTreeMap<&String, u64> = after
                    .iter()
                    .map(|(k, v)| (k, v.saturating_sub(before.get(k).copied().unwrap_or(0))))
                    .filter(|(_, v)| *v > 0)
                    .collect();
                let requests = delta.get(&"request".to_string()).copied().unwrap_or(0);
                let sum = delta.remove(&ceph::REPLY_LATENCY_US.to_string());
                let count = delta.remove(&ceph::REPLIES.to_string());
                let latency = sum.zip(count).filter(|(_, n)| *n > 0).map(|(s, n)| s as f64 / n as f64);
                (Some(json!(delta)), Some(requests), latency)
            }
        };

        let ran = matches!(r.exit, child::Exit::Code(c) if m.ok_codes.contains(&c));
        let mut ok = ran;
        // A peer's failure is a measurement (rchm's EMFILE on a deep tree), not the bench's.
        let peer_failed = !ran && m.kind == Kind::Rchm;
        let (mut action, mut entries_read) = (None, None);
        let text = fs::read_to_string(dir.join("report.json"))
            .or_else(|_| fs::read_to_string(dir.join("stdout")))
            .unwrap_or_default();
        if let Ok(v) = serde_json::from_str::<Value>(&text) {
            let vol = v.pointer("/volumes/0").unwrap_or(&v);
            action = vol.get("action").and_then(Value::as_str).map(str::to_string);
            entries_read = vol.get("entries").and_then(Value::as_u64);
            let load = load_note(vol.get("load"));
            if !load.is_empty() {
                note = format!("{note}; {load}");
            }
            if let Some(e) = vol.get("errors").and_then(Value::as_u64).filter(|&e| e > 0) {
                note = format!("{note}; {e} error(s) reported");
            }
        }
        if peer_failed {
            note = format!("{note}; {}: {}", r.exit.describe(), peer_error(&dir));
        } else if !ran {
            let err = fs::read_to_string(dir.join("stderr")).unwrap_or_default();
            let tail: Vec<&str> = err.lines().rev().take(3).collect();
            self.failures.push(format!(
                "{what}: {} (expected exit {:?}); stderr: {}",
                r.exit.describe(),
                m.ok_codes,
                tail.into_iter().rev().collect::<Vec<_>>().join(" / ")
            ));
        }
        if m.kind == Kind::Skip && action.as_deref() != Some("skipped") {
            let got = action.clone().unwrap_or_else(|| "none".into());
            self.na.insert("skip", format!("report action is \"{got}\", not \"skipped\""));
        }
        if matches!(m.kind, Kind::Resume(_))
            && let Some(n) = entries_read
        {
            let pct = 100.0 * n as f64 / tree.counts.entries as f64;
            note = format!("{note}; read {n} entries ({pct:.0} %)");
        }
        if m.kind == Kind::Rchm
            && ran
            && let Err(e) = tree.verify(State::Prepared, Xattrs::Ignored)
        {
            note = format!("{note}; result ≠ the kubelet's: {e}");
        }
        if let Some(state) = m.expect
            && ran
            && let Err(e) = tree.verify(state, Xattrs::Ignored)
        {
            ok = false;
            self.failures.push(format!("{what}: result is not the {} state: {e}", state.name()));
            note = format!("result ≠ {}", state.name());
        }
        eprintln!(
            "passes: {what}: {:.3} s (user {:.3} s, sys {:.3} s, {:.1} MiB, sync {:.3} s, setup {setup_s:.1} s, load {load1:.1}){}{}{}",
            r.wall_s,
            r.user_s,
            r.sys_s,
            r.maxrss_kib as f64 / 1024.0,
            sync_s,
            action.as_ref().map_or(String::new(), |a| format!(", {a}")),
            requests.map_or(String::new(), |q| format!(
                ", {:.2} requests/entry",
                q as f64 / tree.counts.entries.max(1) as f64
            )),
            if ok { String::new() } else { " FAILED".into() }
        );
        self.runs.push(Run {
            storage: sname,
            method: m.id,
            threads: m.threads,
            temp: temp.name(),
            rep,
            m: r,
            sync_s,
            entries_read,
            action,
            requests,
            request_mix,
            latency_us,
            ok,
            note: note.trim_start_matches("; ").to_string(),
            load1,
        });
        Ok(())
    }

    /// `--syscalls`: syscalls of the kubelet and volprep passes, counted under strace, warm.
    fn syscalls(&mut self, tree: &Tree) -> io::Result<(Vec<String>, Vec<Value>)> {
        let max = *self.a.threads.iter().max().expect("threads");
        let mut cases: Vec<(String, Method)> = Vec::new();
        for m in methods::plan(self.a, self.features, false) {
            let keep = match m.id {
                "kubelet" | "kubelet-2nd" | "chown" | "floor" | "read-floor" | "unsafe-floor" | "race-safe-floor" => {
                    true
                }
                "full" | "rescan" => m.threads == Some(1) || m.threads == Some(max),
                "check" => m.threads == Some(1),
                _ => false,
            };
            if keep {
                cases.push((format!("{} (threads {})", methods::label(m.id), m.threads.unwrap_or(1)), m));
            }
        }
        let (mut lines, mut js) = (Vec::new(), Vec::new());
        for (name, m) in cases {
            interrupted()?;
            tree.reset(m.start)?;
            tree.verify(m.start, Xattrs::None).map_err(io::Error::other)?;
            self.vol.sync()?;
            let dir = self.run_dir(&format!("strace-{}", m.id))?;
            let runner =
                Runner { exe: &self.exe, volprep: &self.volprep, features: self.features, rchm: self.rchm.as_deref() };
            let (cmd, _) = runner.command(&m, &tree.root, &dir.join("report.json"));
            let counts = syscalls::count(&cmd, &dir.join("strace.txt"))?;
            let (line, j) = syscalls::summarize(&name, &counts, tree.counts.entries);
            eprintln!("passes: syscalls {line}");
            lines.push(line);
            js.push(j);
        }
        Ok((lines, js))
    }

    fn meta(&self, tree: Option<&Tree>) -> Value {
        let a = self.a;
        let version = std::process::Command::new(&self.volprep)
            .arg("--version")
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .unwrap_or_default();
        json!({
            "machine": machine(&self.vol),
            "volprep": { "version": version, "progress_interval": self.features.progress_interval,
                         "verify_full": self.features.verify_full },
            "args": { "entries": a.entries, "shape": a.shape.name(), "fs": a.fs.name(), "reps": a.reps,
                      "threads": a.threads, "seed": a.seed, "smoke": a.smoke, "latency_us": a.latency_us,
                      "slow_entries": a.slow_entries, "fuse_ttl_s": a.fuse_ttl_s,
                      "storages": format!("{:?}", a.storages), "ceph_entries": a.ceph_entries },
            "tree": tree.map(|tree| json!({ "entries": tree.counts.entries, "dirs": tree.counts.dirs,
                      "files": tree.counts.files, "symlinks": tree.counts.symlinks,
                      "hardlinks": tree.counts.hardlinks, "setuid": tree.counts.setuid,
                      "golden_digest": tree.digest_of(State::Golden),
                      "prepared_digest": tree.digest_of(State::Prepared) })),
            "entries_by_storage": self.entries,
            "not_available": self.na,
        })
    }
}

fn machine(vol: &Volume) -> Value {
    let cpu = fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_default();
    let mem_gib = fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("MemTotal:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
        })
        .map_or(0.0, |kib| kib / 1048576.0);
    let kernel = fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default().trim().to_string();
    let backing = fsimage::sh(std::process::Command::new("df").arg("--output=fstype,source").arg(&vol.img))
        .ok()
        .and_then(|s| s.lines().nth(1).map(|l| l.split_whitespace().collect::<Vec<_>>().join(" on ")))
        .unwrap_or_default();
    json!({
        "cores": std::thread::available_parallelism().map_or(0, |n| n.get()),
        "cpu": cpu,
        "mem_gib": (mem_gib * 10.0).round() / 10.0,
        "kernel": kernel,
        "filesystem": vol.fs.name(),
        "image_backing": backing,
        "loop_direct_io": vol.direct_io,
    })
}

fn machine_line(vol: &Volume) -> String {
    let m = machine(vol);
    format!(
        "machine: {} cores ({}), {} GiB RAM, kernel {}; {} on a sparse loop image (backing: {}, direct I/O {})",
        m["cores"],
        m["cpu"].as_str().unwrap_or("?"),
        m["mem_gib"],
        m["kernel"].as_str().unwrap_or("?"),
        m["filesystem"].as_str().unwrap_or("?"),
        m["image_backing"].as_str().unwrap_or("?"),
        if vol.direct_io { "on" } else { "off" }
    )
}
