//! The slow-storage model: a FUSE passthrough over the benchmark's tree that sleeps a fixed
//! latency on every metadata request, and serves many requests at once.
//!
//! **What it models**: a network filesystem (the CephFS volume of the incident) where every
//! metadata round trip the client cannot answer from its cache costs a fixed delay, and where
//! the server handles concurrent requests in parallel. `lookup`, `getattr`, `setattr`,
//! `readdir`, `readlink`, `setxattr` and `removexattr` each sleep `--latency-us` (the sleep is at least
//! that long: timer slack adds a few tens of microseconds). The kernel caches names and
//! attributes for `--fuse-ttl-s` (like a client holding capabilities or leases), so an entry
//! costs one `lookup` the first time it is reached, then one `setattr` per change. xattr reads
//! are answered at once: a caching client holds them, and the kernel asks for
//! `security.capability` on every chown of a file, which would otherwise double chown's cost. Up to 64
//! requests are in flight at once (64 server threads, each with its own /dev/fuse fd).
//!
//! **Capacity** (`--server-slots K`): a metadata server that serves K delayed requests at once,
//! each for `--latency-us`, in arrival order; the others wait in its queue, so a request's
//! latency grows with the queue (with n requests in flight: `latency × max(1, n / K)`) and the
//! server never answers more than `K / latency` requests per second, however many clients
//! send. The server then has 256 threads (every request reaches the queue, none waits in the
//! kernel), and the stats file has each delayed request's latency from its arrival to its
//! reply (`mean_latency_us`), the figure the other tenants of such a server feel.
//!
//! **What it does not model**: bandwidth, server-side contention (but for the slots),
//! cache invalidations by other clients, lease or capability recalls, journal or writeback
//! costs on the server (the underlying ext4 is local and mostly cached), per-directory locks on
//! the server, or a client that batches or pipelines (e.g. readdirplus): `readdir` returns names
//! only, so every entry needs its own `lookup`. Each run mounts it fresh: the kernel's FUSE
//! caches start empty, which is what "cold" means on slow storage; the underlying ext4 may be warm.

use std::ffi::CString;
use std::fs;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use fuser::{Errno, InitFlags, KernelConfig, MountOption};

use crate::fuse_passthrough::{self, Change, Model, Op, Passthrough};

/// Server threads, so requests in flight (without `--server-slots`).
const THREADS: usize = 64;
/// Server threads with `--server-slots`: the queue is the slots', not the kernel's.
const THREADS_QUEUED: usize = 256;

/// K service slots, served in arrival order (a ticket queue).
struct Slots {
    /// Next ticket to hand out, next ticket to serve, free slots.
    state: Mutex<(u64, u64, usize)>,
    turn: std::sync::Condvar,
}

impl Slots {
    fn new(k: usize) -> Slots {
        Slots { state: Mutex::new((0, 0, k)), turn: std::sync::Condvar::new() }
    }

    /// Waits for a free slot in arrival order; returns the queue's length on arrival.
    fn take(&self) -> u64 {
        let mut s = self.state.lock().expect("slots lock");
        let me = s.0;
        s.0 += 1;
        let queued = me - s.1;
        while !(s.1 == me && s.2 > 0) {
            s = self.turn.wait(s).expect("slots lock");
        }
        s.1 += 1;
        s.2 -= 1;
        drop(s);
        // The next in line may have a free slot too.
        self.turn.notify_all();
        queued
    }

    fn give_back(&self) {
        self.state.lock().expect("slots lock").2 += 1;
        self.turn.notify_all();
    }
}

/// Requests served, by kind; written as JSON to the stats file when the session ends.
#[derive(Default)]
struct Counts {
    lookup: AtomicU64,
    getattr: AtomicU64,
    setattr: AtomicU64,
    readdir: AtomicU64,
    readlink: AtomicU64,
    xattr_read: AtomicU64,
    xattr_write: AtomicU64,
    opendir: AtomicU64,
}

/// The model: a latency on each delayed request, a server's capacity, and the counts.
struct Slow {
    stats: PathBuf,
    counts: Counts,
    latency: Duration,
    /// `--server-slots`: the server's capacity, when it has one.
    slots: Option<Slots>,
    /// Delayed requests' latency from arrival to reply, summed (µs), and the longest queue met.
    latency_sum_us: AtomicU64,
    max_queue: AtomicU64,
}

impl Slow {
    /// One delayed round trip, counted under `c`.
    fn wait(&self, c: &AtomicU64) {
        c.fetch_add(1, Ordering::Relaxed);
        let arrived = Instant::now();
        match &self.slots {
            Some(slots) => {
                self.max_queue.fetch_max(slots.take(), Ordering::Relaxed);
                std::thread::sleep(self.latency);
                slots.give_back();
            }
            None => std::thread::sleep(self.latency),
        }
        self.latency_sum_us.fetch_add(arrived.elapsed().as_micros() as u64, Ordering::Relaxed);
    }
}

impl Model for Slow {
    /// Opening a directory and reading xattrs are counted and answered at once; every other
    /// request is a delayed round trip.
    fn arrive(&self, op: Op) -> Result<(), Errno> {
        let c = &self.counts;
        match op {
            Op::Opendir => drop(c.opendir.fetch_add(1, Ordering::Relaxed)),
            Op::XattrRead => drop(c.xattr_read.fetch_add(1, Ordering::Relaxed)),
            Op::Lookup => self.wait(&c.lookup),
            Op::Getattr => self.wait(&c.getattr),
            Op::Setattr => self.wait(&c.setattr),
            Op::Readlink => self.wait(&c.readlink),
            Op::Readdir => self.wait(&c.readdir),
            Op::XattrWrite => self.wait(&c.xattr_write),
        }
        Ok(())
    }

    fn setattr(&self, path: &Path, change: &Change) -> Result<(), Errno> {
        change.chown_chmod(path)?;
        if let Some(size) = change.size {
            fs::OpenOptions::new().write(true).open(path).and_then(|f| f.set_len(size)).map_err(Errno::from)?;
        }
        Ok(())
    }

    fn init(&mut self, config: &mut KernelConfig) {
        // Lookups in one directory may run in parallel; the server clears setuid on chown.
        let _ = config.add_capabilities(InitFlags::FUSE_PARALLEL_DIROPS);
        let _ = config.add_capabilities(InitFlags::FUSE_HANDLE_KILLPRIV);
    }

    fn destroy(&mut self) {
        let c = &self.counts;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let delayed = get(&c.lookup)
            + get(&c.getattr)
            + get(&c.setattr)
            + get(&c.readdir)
            + get(&c.readlink)
            + get(&c.xattr_write);
        let mean_latency_us = get(&self.latency_sum_us) / delayed.max(1);
        let json = format!(
            "{{\"delayed\":{delayed},\"mean_latency_us\":{mean_latency_us},\"max_queue\":{},\"lookup\":{},\"getattr\":{},\"setattr\":{},\"readdir\":{},\"readlink\":{},\"xattr_read\":{},\"xattr_write\":{},\"opendir\":{}}}\n",
            get(&self.max_queue),
            get(&c.lookup),
            get(&c.getattr),
            get(&c.setattr),
            get(&c.readdir),
            get(&c.readlink),
            get(&c.xattr_read),
            get(&c.xattr_write),
            get(&c.opendir)
        );
        let _ = fs::write(&self.stats, json);
    }
}

/// `__fuse SRC MNT LATENCY_US TTL_S SLOTS STATS`: serves until unmounted, then writes the
/// request counts to STATS. SLOTS 0: no capacity limit.
pub fn main_fuse(src: &Path, mnt: &Path, latency_us: u64, ttl_s: u64, slots: u64, stats: &Path) -> i32 {
    let model = Slow {
        stats: stats.to_path_buf(),
        counts: Counts::default(),
        latency: Duration::from_micros(latency_us),
        slots: (slots > 0).then(|| Slots::new(slots as usize)),
        latency_sum_us: AtomicU64::new(0),
        max_queue: AtomicU64::new(0),
    };
    let fs = match Passthrough::new(src, Duration::from_secs(ttl_s), model) {
        Ok(fs) => fs,
        Err(e) => {
            eprintln!("slowfs: {}: {e}", src.display());
            return 1;
        }
    };
    let mut config = fuse_passthrough::config("volprep-slow", if slots > 0 { THREADS_QUEUED } else { THREADS });
    config.mount_options.push(MountOption::Suid);
    config.clone_fd = true;
    match fuser::mount(fs, mnt, &config) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("slowfs: mount {}: {e}", mnt.display());
            1
        }
    }
}

/// A running slow-storage server and its mount. Dropping it unmounts and reaps the server.
pub struct SlowMount {
    pub mnt: PathBuf,
    child: Option<Child>,
}

/// Whether `mnt` is a FUSE mount point now.
fn is_fuse_mount(mnt: &Path) -> bool {
    let Ok(info) = fs::read_to_string("/proc/self/mountinfo") else {
        return false;
    };
    let want = mnt.to_string_lossy();
    info.lines().any(|l| {
        let f: Vec<&str> = l.split(' ').collect();
        let fstype = f.iter().skip_while(|x| **x != "-").nth(1);
        f.get(4) == Some(&want.as_ref()) && fstype.is_some_and(|t| t.starts_with("fuse"))
    })
}

impl SlowMount {
    /// Starts `exe __fuse` serving `src` on `mnt` and waits until the mount is up.
    pub fn start(exe: &Path, src: &Path, mnt: &Path, model: (u64, u64, u64), stats: &Path) -> io::Result<Self> {
        let (latency_us, ttl_s, slots) = model;
        fs::create_dir_all(mnt)?;
        let mnt = mnt.canonicalize()?;
        let child = Command::new(exe)
            .arg("__fuse")
            .arg(src)
            .arg(&mnt)
            .arg(latency_us.to_string())
            .arg(ttl_s.to_string())
            .arg(slots.to_string())
            .arg(stats)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()?;
        let mut me = SlowMount { mnt, child: Some(child) };
        let t = Instant::now();
        while !is_fuse_mount(&me.mnt) {
            if let Some(st) = me.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                me.child = None;
                return Err(io::Error::other(format!("slow-storage server exited: {st}")));
            }
            if t.elapsed() > Duration::from_secs(15) {
                return Err(io::Error::other("slow-storage mount did not appear in 15 s"));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        Ok(me)
    }
}

impl Drop for SlowMount {
    fn drop(&mut self) {
        if let Ok(c) = CString::new(self.mnt.as_os_str().as_bytes()) {
            // SAFETY: valid C string. A busy mount is detached lazily instead.
            if unsafe { libc::umount2(c.as_ptr(), 0) } != 0 && is_fuse_mount(&self.mnt) {
                fuse_passthrough::detach(&self.mnt);
            }
        }
        if let Some(mut child) = self.child.take() {
            let t = Instant::now();
            while child.try_wait().ok().flatten().is_none() {
                if t.elapsed() > Duration::from_secs(5) {
                    let _ = child.kill();
                    let _ = child.wait();
                    break;
                }
                std::thread::sleep(Duration::from_millis(5));
            }
        }
    }
}
