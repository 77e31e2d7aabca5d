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

use std::collections::HashMap;
use std::ffi::{CString, OsStr, OsString};
use std::fs;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirEntryExt, FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, RwLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use fuser::{
    Config, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, InitFlags,
    KernelConfig, MountOption, OpenFlags, ReplyAttr, ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen,
    ReplyStatfs, ReplyXattr, Request,
};

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

type DirList = Vec<(u64, FileType, OsString)>;

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

struct Slow {
    stats: PathBuf,
    counts: Counts,
    latency: Duration,
    /// `--server-slots`: the server's capacity, when it has one.
    slots: Option<Slots>,
    /// Delayed requests' latency from arrival to reply, summed (µs), and the longest queue met.
    latency_sum_us: AtomicU64,
    max_queue: AtomicU64,
    ttl: Duration,
    root_ino: u64,
    paths: RwLock<HashMap<u64, PathBuf>>,
    dirs: Mutex<HashMap<u64, DirList>>,
    next_fh: AtomicU64,
}

fn kind_of(ft: fs::FileType) -> FileType {
    if ft.is_dir() {
        FileType::Directory
    } else if ft.is_symlink() {
        FileType::Symlink
    } else if ft.is_fifo() {
        FileType::NamedPipe
    } else if ft.is_socket() {
        FileType::Socket
    } else if ft.is_char_device() {
        FileType::CharDevice
    } else if ft.is_block_device() {
        FileType::BlockDevice
    } else {
        FileType::RegularFile
    }
}

fn time(secs: i64, nsecs: i64) -> SystemTime {
    UNIX_EPOCH + Duration::new(secs.max(0) as u64, nsecs as u32)
}

fn cstr(p: &Path) -> Result<CString, Errno> {
    CString::new(p.as_os_str().as_bytes()).map_err(|_| Errno::EINVAL)
}

fn last() -> Errno {
    Errno::from(io::Error::last_os_error())
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

    fn fuse_ino(&self, ino: u64) -> u64 {
        if ino == self.root_ino { 1 } else { ino }
    }

    fn path(&self, ino: INodeNo) -> Result<PathBuf, Errno> {
        let map = self.paths.read().expect("paths lock");
        map.get(&ino.0).cloned().ok_or(Errno::ENOENT)
    }

    fn attr(&self, path: &Path) -> Result<FileAttr, Errno> {
        let m = fs::symlink_metadata(path).map_err(Errno::from)?;
        Ok(FileAttr {
            ino: INodeNo(self.fuse_ino(m.ino())),
            size: m.size(),
            blocks: m.blocks(),
            atime: time(m.atime(), m.atime_nsec()),
            mtime: time(m.mtime(), m.mtime_nsec()),
            ctime: time(m.ctime(), m.ctime_nsec()),
            crtime: UNIX_EPOCH,
            kind: kind_of(m.file_type()),
            perm: (m.mode() & 0o7777) as u16,
            nlink: m.nlink() as u32,
            uid: m.uid(),
            gid: m.gid(),
            rdev: m.rdev() as u32,
            blksize: m.blksize() as u32,
            flags: 0,
        })
    }

    fn setattr_path(
        &self,
        path: &Path,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
    ) -> Result<FileAttr, Errno> {
        let c = cstr(path)?;
        if uid.is_some() || gid.is_some() {
            let (u, g) = (uid.unwrap_or(u32::MAX), gid.unwrap_or(u32::MAX));
            // SAFETY: valid C string.
            if unsafe { libc::lchown(c.as_ptr(), u, g) } != 0 {
                return Err(last());
            }
        }
        if let Some(mode) = mode {
            let flags = libc::AT_SYMLINK_NOFOLLOW;
            // SAFETY: valid C string; fchmodat2 with NOFOLLOW never follows a symlink.
            let r = unsafe { libc::syscall(libc::SYS_fchmodat2, libc::AT_FDCWD, c.as_ptr(), mode & 0o7777, flags) };
            if r != 0 {
                return Err(last());
            }
        }
        if let Some(size) = size {
            fs::OpenOptions::new().write(true).open(path).and_then(|f| f.set_len(size)).map_err(Errno::from)?;
        }
        self.attr(path)
    }
}

impl Filesystem for Slow {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> io::Result<()> {
        // Lookups in one directory may run in parallel; the server clears setuid on chown.
        let _ = config.add_capabilities(InitFlags::FUSE_PARALLEL_DIROPS);
        let _ = config.add_capabilities(InitFlags::FUSE_HANDLE_KILLPRIV);
        Ok(())
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

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        self.wait(&self.counts.lookup);
        let r = self.path(parent).and_then(|p| {
            let path = p.join(name);
            let attr = self.attr(&path)?;
            self.paths.write().expect("paths lock").insert(attr.ino.0, path);
            Ok(attr)
        });
        match r {
            Ok(attr) => reply.entry(&self.ttl, &attr, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        self.wait(&self.counts.getattr);
        match self.path(ino).and_then(|p| self.attr(&p)) {
            Ok(attr) => reply.attr(&self.ttl, &attr),
            Err(e) => reply.error(e),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<fuser::TimeOrNow>,
        _mtime: Option<fuser::TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        self.wait(&self.counts.setattr);
        match self.path(ino).and_then(|p| self.setattr_path(&p, mode, uid, gid, size)) {
            Ok(attr) => reply.attr(&self.ttl, &attr),
            Err(e) => reply.error(e),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        self.wait(&self.counts.readlink);
        match self.path(ino).and_then(|p| fs::read_link(p).map_err(Errno::from)) {
            Ok(t) => reply.data(t.as_os_str().as_bytes()),
            Err(e) => reply.error(e),
        }
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        self.counts.opendir.fetch_add(1, Ordering::Relaxed);
        let list = self.path(ino).and_then(|p| {
            let mut list = DirList::new();
            for e in fs::read_dir(p).map_err(Errno::from)? {
                let e = e.map_err(Errno::from)?;
                let kind = kind_of(e.file_type().map_err(Errno::from)?);
                list.push((self.fuse_ino(e.ino()), kind, e.file_name()));
            }
            Ok(list)
        });
        match list {
            Ok(list) => {
                let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
                self.dirs.lock().expect("dirs lock").insert(fh, list);
                reply.opened(FileHandle(fh), FopenFlags::empty());
            }
            Err(e) => reply.error(e),
        }
    }

    fn readdir(&self, _req: &Request, _ino: INodeNo, fh: FileHandle, offset: u64, mut reply: ReplyDirectory) {
        self.wait(&self.counts.readdir);
        let dirs = self.dirs.lock().expect("dirs lock");
        let Some(list) = dirs.get(&fh.0) else {
            return reply.error(Errno::EBADF);
        };
        for (i, (ino, kind, name)) in list.iter().enumerate().skip(offset as usize) {
            if reply.add(INodeNo(*ino), i as u64 + 1, *kind, name) {
                break;
            }
        }
        reply.ok();
    }

    fn releasedir(&self, _req: &Request, _ino: INodeNo, fh: FileHandle, _flags: OpenFlags, reply: ReplyEmpty) {
        self.dirs.lock().expect("dirs lock").remove(&fh.0);
        reply.ok();
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        reply.statfs(1 << 20, 1 << 19, 1 << 19, 1 << 22, 1 << 21, 4096, 255, 4096);
    }

    fn access(&self, _req: &Request, _ino: INodeNo, _mask: fuser::AccessFlags, reply: ReplyEmpty) {
        reply.ok();
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        self.counts.xattr_read.fetch_add(1, Ordering::Relaxed);
        let r = self.path(ino).and_then(|p| {
            let (c, n) = (cstr(&p)?, CString::new(name.as_bytes()).map_err(|_| Errno::EINVAL)?);
            let mut buf = vec![0u8; size as usize];
            // SAFETY: valid C strings and a buffer of `size` bytes.
            let got = unsafe { libc::lgetxattr(c.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
            if got < 0 {
                return Err(last());
            }
            buf.truncate(got as usize);
            Ok(buf)
        });
        xattr_reply(r, size, reply);
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        self.counts.xattr_read.fetch_add(1, Ordering::Relaxed);
        let r = self.path(ino).and_then(|p| {
            let c = cstr(&p)?;
            let mut buf = vec![0u8; size as usize];
            // SAFETY: valid C string and a buffer of `size` bytes.
            let got = unsafe { libc::llistxattr(c.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
            if got < 0 {
                return Err(last());
            }
            buf.truncate(got as usize);
            Ok(buf)
        });
        xattr_reply(r, size, reply);
    }

    fn setxattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        self.wait(&self.counts.xattr_write);
        let r = self.path(ino).and_then(|p| {
            let (c, n) = (cstr(&p)?, CString::new(name.as_bytes()).map_err(|_| Errno::EINVAL)?);
            // SAFETY: valid C strings and value slice.
            let r = unsafe { libc::lsetxattr(c.as_ptr(), n.as_ptr(), value.as_ptr().cast(), value.len(), flags) };
            if r != 0 { Err(last()) } else { Ok(()) }
        });
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn removexattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.wait(&self.counts.xattr_write);
        let r = self.path(ino).and_then(|p| {
            let (c, n) = (cstr(&p)?, CString::new(name.as_bytes()).map_err(|_| Errno::EINVAL)?);
            // SAFETY: valid C strings.
            if unsafe { libc::lremovexattr(c.as_ptr(), n.as_ptr()) } != 0 { Err(last()) } else { Ok(()) }
        });
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }
}

/// `size == 0` asks for the length only.
fn xattr_reply(r: Result<Vec<u8>, Errno>, size: u32, reply: ReplyXattr) {
    match r {
        Ok(v) if size == 0 => reply.size(v.len() as u32),
        Ok(v) => reply.data(&v),
        Err(e) => reply.error(e),
    }
}

/// `__fuse SRC MNT LATENCY_US TTL_S SLOTS STATS`: serves until unmounted, then writes the
/// request counts to STATS. SLOTS 0: no capacity limit.
pub fn main_fuse(src: &Path, mnt: &Path, latency_us: u64, ttl_s: u64, slots: u64, stats: &Path) -> i32 {
    let root_ino = match fs::metadata(src) {
        Ok(m) => m.ino(),
        Err(e) => {
            eprintln!("slowfs: {}: {e}", src.display());
            return 1;
        }
    };
    let fs = Slow {
        stats: stats.to_path_buf(),
        counts: Counts::default(),
        latency: Duration::from_micros(latency_us),
        slots: (slots > 0).then(|| Slots::new(slots as usize)),
        latency_sum_us: AtomicU64::new(0),
        max_queue: AtomicU64::new(0),
        ttl: Duration::from_secs(ttl_s),
        root_ino,
        paths: RwLock::new(HashMap::from([(1, src.to_path_buf())])),
        dirs: Mutex::new(HashMap::new()),
        next_fh: AtomicU64::new(1),
    };
    let mut config = Config::default();
    config.mount_options = vec![
        MountOption::FSName("volprep-slow".into()),
        MountOption::Subtype("volprep-slow".into()),
        MountOption::Suid,
    ];
    config.n_threads = Some(if slots > 0 { THREADS_QUEUED } else { THREADS });
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
                // SAFETY: `c` is a valid C string; a failed detach is only reported by the return value.
                unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
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
