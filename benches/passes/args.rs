//! Command line of the benchmark, and of the hidden child subcommands it re-execs itself with.

use std::path::PathBuf;

/// Usage text, printed by `--help` and after a bad flag.
pub const USAGE: &str = "\
usage: cargo bench --bench passes -- [OPTIONS]

Times volprep against the kubelet's fsGroup pass, `chown -R`, `chgrp -R && chmod -R` and a
stat-only floor, on a fresh loop-mounted filesystem (and on a FUSE model of slow storage).
Needs root, a loop device, mkfs.ext4 (mkfs.xfs for --fs xfs), find, and /dev/fuse for the
slow-storage part; the CephFS part also needs Debian's ceph-mon ceph-mgr ceph-osd ceph-mds
ceph-fuse ceph-common (Ceph 16): it starts a single-node cluster itself and stops it after.

options:
  --entries N          entries in the tree (default 100000; 1000000 for the 1M run)
  --shape S            atlantis | flat | deep (default atlantis)
  --fs F               ext4 | xfs (default ext4)
  --reps N             repetitions per method and temperature (default 3)
  --threads-list L     volprep --threads values, e.g. 1,2,4,8,16,32 (the default);
                       `default` runs volprep without --threads (its own default)
  --storages L         local,slow,ceph (default local,slow): where the methods run
  --temps L            cold,warm (default both)
  --methods L          only these (default all): floor,read-floor,unsafe-floor,
                       race-safe-floor,check,kubelet,kubelet-2nd,
                       onrootmismatch,onrootmismatch-1st,chown,chgrp,rchm,full,
                       rescan,skip,resume,
                       resume80,progress
  --seed N             tree generator seed (default 1)
  --smoke              10k entries (CephFS 500), 1 repetition, every method, short
                       thread list
  --out FILE           JSON with the raw figures (default target/bench-passes.json)
  --latency-us N       slow storage: delay per metadata request (default 500)
  --slow-entries N     slow storage: tree size (default entries/10, at most 10000; 0: skip)
  --fuse-ttl-s N       slow storage: entry/attr cache TTL the model grants (default 60)
  --server-slots K     slow storage: a server of finite capacity, K requests served at
                       once (the others queue); 0: unlimited, 64 in flight (default 0)
  --ceph-entries N     CephFS: tree size (default 20000)
  --syscalls           also count syscalls per entry (from an `strace -f` trace)
  --resume-by-time     resume/resume80: SIGKILL at 50/80 % of the measured full time
                       (default: once a progress line counts 50/80 % of the entries)
  --workdir DIR        where the sparse image and mount points go (default target/tmp)
";

/// A temperature: caches dropped (and filesystem remounted) before the run, or not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Temp {
    Cold,
    Warm,
}

impl Temp {
    pub fn name(self) -> &'static str {
        match self {
            Temp::Cold => "cold",
            Temp::Warm => "warm",
        }
    }
}

/// Tree shapes (see `tree`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    Atlantis,
    Flat,
    Deep,
}

impl Shape {
    pub fn name(self) -> &'static str {
        match self {
            Shape::Atlantis => "atlantis",
            Shape::Flat => "flat",
            Shape::Deep => "deep",
        }
    }
}

/// Filesystem of the image.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FsKind {
    Ext4,
    Xfs,
}

impl FsKind {
    pub fn name(self) -> &'static str {
        match self {
            FsKind::Ext4 => "ext4",
            FsKind::Xfs => "xfs",
        }
    }
}

/// Where methods run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StorageKind {
    /// The loop-mounted filesystem (`--fs`).
    Local,
    /// The FUSE latency model over a smaller tree (`passes/slowfs.rs`).
    Slow,
    /// A single-node CephFS through ceph-fuse (`passes/ceph.rs`).
    Ceph,
}

/// Options of a benchmark run.
#[derive(Debug, Clone)]
pub struct Args {
    pub entries: u64,
    pub shape: Shape,
    pub fs: FsKind,
    pub reps: usize,
    pub threads: Vec<usize>,
    pub temps: Vec<Temp>,
    pub methods: Option<Vec<String>>,
    pub seed: u64,
    pub smoke: bool,
    pub out: PathBuf,
    pub latency_us: u64,
    pub slow_entries: u64,
    pub fuse_ttl_s: u64,
    pub server_slots: u64,
    pub storages: Vec<StorageKind>,
    pub ceph_entries: u64,
    pub syscalls: bool,
    pub resume_by_time: bool,
    pub workdir: PathBuf,
}

impl Args {
    /// Whether a method (by table name) is selected.
    pub fn wants(&self, method: &str) -> bool {
        self.methods.as_ref().is_none_or(|m| m.iter().any(|x| x == method))
    }

    /// Whether methods run on this storage.
    pub fn on(&self, s: StorageKind) -> bool {
        self.storages.contains(&s)
    }
}

/// What this process was started to do.
#[derive(Debug)]
pub enum Command {
    Bench(Args),
    Help,
    /// Hidden: start and measure children on request (`__spawner`; see `child::Spawner`).
    Spawner,
    /// Hidden: the kubelet's pass on ROOT (`__kubelet ROOT GID`).
    Kubelet {
        root: PathBuf,
        gid: u32,
    },
    /// Hidden: a floor's pass (`__floor KIND ROOT GID THREADS`; see `floors.rs`).
    Floor {
        floor: crate::floors::Floor,
        root: PathBuf,
        gid: u32,
        threads: usize,
    },
    /// Hidden: the kubelet's OnRootMismatch policy (`__onrootmismatch ROOT GID`).
    OnRootMismatch {
        root: PathBuf,
        gid: u32,
    },
    /// Hidden: serve the slow-storage FUSE model (`__fuse SRC MNT LATENCY_US TTL_S SLOTS STATS`).
    Fuse {
        src: PathBuf,
        mnt: PathBuf,
        latency_us: u64,
        ttl_s: u64,
        slots: u64,
        stats: PathBuf,
    },
}

/// Parses the arguments after the program name. `cargo bench` appends `--bench`; it is ignored.
pub fn parse(raw: Vec<String>, target_dir: PathBuf) -> Result<Command, String> {
    let raw: Vec<String> = raw.into_iter().filter(|a| a != "--bench").collect();
    match raw.first().map(String::as_str) {
        Some("__kubelet") | Some("__onrootmismatch") => {
            let [_, root, gid] = &raw[..] else {
                return Err(format!("{}: expected ROOT GID", raw[0]));
            };
            let (root, gid) = (PathBuf::from(root), num(gid)? as u32);
            return Ok(if raw[0] == "__kubelet" {
                Command::Kubelet { root, gid }
            } else {
                Command::OnRootMismatch { root, gid }
            });
        }
        Some("__floor") => {
            let [_, kind, root, gid, threads] = &raw[..] else {
                return Err("__floor: expected KIND ROOT GID THREADS".into());
            };
            let floor = crate::floors::Floor::parse(kind).ok_or_else(|| format!("__floor: unknown floor {kind:?}"))?;
            let (root, gid, threads) = (PathBuf::from(root), num(gid)? as u32, num(threads)? as usize);
            return Ok(Command::Floor { floor, root, gid, threads });
        }
        Some("__spawner") => return Ok(Command::Spawner),
        Some("__fuse") => {
            let [_, src, mnt, lat, ttl, slots, stats] = &raw[..] else {
                return Err("__fuse: expected SRC MNT LATENCY_US TTL_S SLOTS STATS".into());
            };
            return Ok(Command::Fuse {
                src: src.into(),
                mnt: mnt.into(),
                latency_us: num(lat)?,
                ttl_s: num(ttl)?,
                slots: num(slots)?,
                stats: stats.into(),
            });
        }
        _ => {}
    }
    parse_bench(raw, target_dir)
}

fn parse_bench(raw: Vec<String>, target_dir: PathBuf) -> Result<Command, String> {
    let mut entries = None;
    let mut reps = None;
    let mut threads = None;
    let mut slow_entries = None;
    let mut ceph_entries = None;
    let mut a = Args {
        entries: 100_000,
        shape: Shape::Atlantis,
        fs: FsKind::Ext4,
        reps: 3,
        threads: vec![1, 2, 4, 8, 16, 32],
        temps: vec![Temp::Cold, Temp::Warm],
        methods: None,
        seed: 1,
        smoke: false,
        out: target_dir.join("bench-passes.json"),
        latency_us: 500,
        slow_entries: 0,
        fuse_ttl_s: 60,
        server_slots: 0,
        storages: vec![StorageKind::Local, StorageKind::Slow],
        ceph_entries: 20_000,
        syscalls: false,
        resume_by_time: false,
        workdir: target_dir.join("tmp"),
    };
    let mut it = raw.into_iter();
    while let Some(arg) = it.next() {
        let (flag, inline) = match arg.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f.to_string(), Some(v.to_string())),
            _ => (arg.clone(), None),
        };
        let mut value = || inline.clone().or_else(|| it.next()).ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "-h" | "--help" => return Ok(Command::Help),
            "--smoke" => a.smoke = true,
            "--syscalls" => a.syscalls = true,
            "--resume-by-time" => a.resume_by_time = true,
            "--entries" => entries = Some(num(&value()?)?),
            "--reps" => reps = Some(num(&value()?)?.max(1) as usize),
            "--threads-list" => threads = Some(list(&value()?)?),
            "--seed" => a.seed = num(&value()?)?,
            "--latency-us" => a.latency_us = num(&value()?)?,
            "--slow-entries" => slow_entries = Some(num(&value()?)?),
            "--fuse-ttl-s" => a.fuse_ttl_s = num(&value()?)?,
            "--server-slots" => a.server_slots = num(&value()?)?,
            "--ceph-entries" => ceph_entries = Some(num(&value()?)?.max(10)),
            "--storages" => {
                a.storages = value()?
                    .split(',')
                    .map(|t| match t {
                        "local" => Ok(StorageKind::Local),
                        "slow" => Ok(StorageKind::Slow),
                        "ceph" => Ok(StorageKind::Ceph),
                        _ => Err(format!("--storages: unknown storage {t:?} (local, slow, ceph)")),
                    })
                    .collect::<Result<_, _>>()?
            }
            "--out" => a.out = value()?.into(),
            "--workdir" => a.workdir = value()?.into(),
            "--methods" => a.methods = Some(value()?.split(',').map(str::to_string).collect()),
            "--shape" => {
                a.shape = match value()?.as_str() {
                    "atlantis" => Shape::Atlantis,
                    "flat" => Shape::Flat,
                    "deep" => Shape::Deep,
                    s => return Err(format!("--shape: unknown shape {s:?}")),
                }
            }
            "--fs" => {
                a.fs = match value()?.as_str() {
                    "ext4" => FsKind::Ext4,
                    "xfs" => FsKind::Xfs,
                    s => return Err(format!("--fs: unknown filesystem {s:?}")),
                }
            }
            "--temps" => {
                a.temps = value()?
                    .split(',')
                    .map(|t| match t {
                        "cold" => Ok(Temp::Cold),
                        "warm" => Ok(Temp::Warm),
                        _ => Err(format!("--temps: unknown temperature {t:?}")),
                    })
                    .collect::<Result<_, _>>()?
            }
            _ => return Err(format!("unknown argument {arg:?}")),
        }
    }
    if a.smoke {
        a.entries = 10_000;
        a.reps = 1;
        a.threads = vec![1, 4];
        a.ceph_entries = 500;
    }
    a.entries = entries.unwrap_or(a.entries).max(10);
    a.reps = reps.unwrap_or(a.reps);
    a.threads = threads.unwrap_or(a.threads);
    a.slow_entries = slow_entries.unwrap_or((a.entries / 10).min(10_000));
    a.ceph_entries = ceph_entries.unwrap_or(a.ceph_entries);
    if a.threads.is_empty() {
        return Err("--threads-list: give thread counts of at least 1, or `default`".into());
    }
    if a.storages.is_empty() {
        return Err("--storages: give at least one of local, slow, ceph".into());
    }
    Ok(Command::Bench(a))
}

fn num(s: &str) -> Result<u64, String> {
    s.replace('_', "").parse().map_err(|_| format!("not a number: {s:?}"))
}

/// A thread list; `default` is 0 (volprep without `--threads`).
fn list(s: &str) -> Result<Vec<usize>, String> {
    s.split(',')
        .map(|x| match x {
            "default" => Ok(0),
            _ => match num(x)? {
                0 => Err("--threads-list: thread counts start at 1 (`default`: volprep's own)".into()),
                n => Ok(n as usize),
            },
        })
        .collect()
}
