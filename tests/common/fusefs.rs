//! FUSE filesystems of the tests (the `fuser` crate, served by a thread of the test process): a
//! passthrough (`fuse_passthrough`) over a directory that honours ownership changes, ignores them
//! (accepts chown and chmod and changes nothing, as SMB or Azure Files with fixed
//! `uid=`/`gid=`/`file_mode=` mount options do), or refuses them with EPERM (NFS
//! `root_squash`), or applies them and answers attributes from a daemon-side cache of a few
//! seconds (as network filesystems' attribute caches do). Unmounted on drop. And a metadata
//! server of finite capacity ([`FuseFs::capacity`]): K service slots, each request holding one
//! for a fixed time, the others waiting their turn.

use std::collections::HashMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use fuser::{Errno, FileAttr};
use tempfile::TempDir;

use super::fuse_passthrough::{self, Change, Model, Op, Passthrough};

/// What the filesystem does with a chown or chmod.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Owners {
    /// Applies it (a plain passthrough).
    Honour,
    /// Answers success and changes nothing.
    Ignore,
    /// Answers EPERM.
    Refuse,
    /// Applies it, and answers every path's attributes from a cache filled at its first answer
    /// and kept [`STALE_FOR`] (the reply to the setattr included).
    StaleCache,
}

/// How long [`Owners::StaleCache`] answers a path's attributes from its cache.
pub const STALE_FOR: Duration = Duration::from_secs(3);

impl Owners {
    /// The mount's source (`fuse from volprep-…`) and subtype.
    fn name(self) -> &'static str {
        match self {
            Owners::Honour => "volprep-honour",
            Owners::Ignore => "volprep-ignore",
            Owners::Refuse => "volprep-refuse",
            Owners::StaleCache => "volprep-stale",
        }
    }
}

/// The gate of tests that need root and /dev/fuse, like [`super::privileged`]: each such test
/// is `#[ignore = "needs root and /dev/fuse"]`, so it runs only when asked for
/// (`--include-ignored`), and asked for where it cannot run it fails, naming what is missing (a
/// test asked for and not run must not look passed). Returns true when it can run.
#[track_caller]
pub fn available() -> bool {
    let mut missing = Vec::new();
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        missing.push("not running as root");
    }
    if !Path::new("/dev/fuse").exists() {
        missing.push("no /dev/fuse (`modprobe fuse`)");
    }
    if missing.is_empty() {
        return true;
    }
    let test = std::thread::current().name().unwrap_or("?").to_string();
    panic!("{test}: FUSE test cannot run: {}", missing.join(", "));
}

/// A mounted test filesystem over `src`: its mount point is [`FuseFs::path`].
pub struct FuseFs {
    session: Option<fuser::BackgroundSession>,
    mnt: TempDir,
}

impl FuseFs {
    /// Mounts a passthrough of `src` that treats ownership changes as `owners` says.
    pub fn mount(src: &Path, owners: Owners) -> FuseFs {
        let mnt = tempfile::Builder::new().prefix("volprep-fuse-").tempdir().expect("mount point");
        let fs = Passthrough::new(src, TTL, Served { owners, cache: Mutex::default() }).expect("source");
        let config = fuse_passthrough::config(owners.name(), 4);
        let session = fuser::spawn_mount(fs, mnt.path(), &config).expect("mount the test FUSE filesystem");
        FuseFs { session: Some(session), mnt }
    }

    /// Mounts a passthrough of `src` (that honours ownership changes) served by a metadata
    /// server of `slots` service slots: every lookup, getattr, setattr, readdir and xattr write
    /// holds one for `service`; the kernel caches names and attributes for a minute. `stats`
    /// gets each such request's latency, from its arrival to its reply.
    pub fn capacity(src: &Path, slots: usize, service: Duration, stats: Arc<ServerStats>) -> FuseFs {
        let mnt = tempfile::Builder::new().prefix("volprep-fuse-").tempdir().expect("mount point");
        let model = Capacity { free: Mutex::new(slots), turn: Condvar::new(), service, stats };
        let fs = Passthrough::new(src, Duration::from_secs(60), model).expect("source");
        let config = fuse_passthrough::config("volprep-capacity", 256);
        let session = fuser::spawn_mount(fs, mnt.path(), &config).expect("mount the test FUSE filesystem");
        FuseFs { session: Some(session), mnt }
    }

    pub fn path(&self) -> &Path {
        self.mnt.path()
    }
}

/// What a capacity server saw: its delayed requests and their summed latency (µs).
#[derive(Debug, Default)]
pub struct ServerStats {
    pub requests: AtomicU64,
    pub latency_sum_us: AtomicU64,
}

impl ServerStats {
    /// The mean latency of a request, in µs, and the requests served; then starts over.
    pub fn take(&self) -> (f64, u64) {
        let n = self.requests.swap(0, Ordering::Relaxed);
        let sum = self.latency_sum_us.swap(0, Ordering::Relaxed);
        (if n == 0 { 0.0 } else { sum as f64 / n as f64 }, n)
    }
}

/// A metadata server of finite capacity: `free` service slots of `service` each.
struct Capacity {
    free: Mutex<usize>,
    turn: Condvar,
    service: Duration,
    stats: Arc<ServerStats>,
}

impl Model for Capacity {
    /// Opening a directory and reading xattrs are answered at once (a caching client holds
    /// them); every other request waits for a slot and holds it for the service time.
    fn arrive(&self, op: Op) -> Result<(), Errno> {
        if matches!(op, Op::Opendir | Op::XattrRead) {
            return Ok(());
        }
        let arrived = Instant::now();
        let mut free = self.free.lock().expect("slots lock");
        while *free == 0 {
            free = self.turn.wait(free).expect("slots lock");
        }
        *free -= 1;
        drop(free);
        std::thread::sleep(self.service);
        *self.free.lock().expect("slots lock") += 1;
        self.turn.notify_one();
        self.stats.requests.fetch_add(1, Ordering::Relaxed);
        self.stats.latency_sum_us.fetch_add(arrived.elapsed().as_micros() as u64, Ordering::Relaxed);
        Ok(())
    }

    fn setattr(&self, path: &Path, change: &Change) -> Result<(), Errno> {
        change.chown_chmod(path)
    }
}

impl Drop for FuseFs {
    fn drop(&mut self) {
        if let Some(s) = self.session.take() {
            if s.umount_and_join().is_err() {
                // A busy mount is detached lazily.
                fuse_passthrough::detach(self.mnt.path());
            }
        }
    }
}

/// How long the kernel caches names and attributes.
const TTL: Duration = Duration::from_secs(1);

/// What a test filesystem serves: its way with ownership changes, and (`StaleCache`) its
/// attribute cache, by path: when each was filled and with what.
struct Served {
    owners: Owners,
    cache: Mutex<HashMap<PathBuf, (Instant, FileAttr)>>,
}

impl Model for Served {
    /// These filesystems serve no readlink (ENOSYS, as `fuser` answers what is not served).
    fn arrive(&self, op: Op) -> Result<(), Errno> {
        if op == Op::Readlink { Err(Errno::ENOSYS) } else { Ok(()) }
    }

    fn answer(&self, path: &Path, fresh: FileAttr) -> FileAttr {
        if self.owners != Owners::StaleCache {
            return fresh;
        }
        let mut cache = self.cache.lock().expect("cache lock");
        let now = Instant::now();
        match cache.get(path) {
            Some(&(at, attr)) if now.duration_since(at) < STALE_FOR => attr,
            _ => {
                cache.insert(path.to_path_buf(), (now, fresh));
                fresh
            }
        }
    }

    /// A chown or chmod as `self` says; a change of size is not served (and ignored).
    fn setattr(&self, path: &Path, change: &Change) -> Result<(), Errno> {
        match self.owners {
            Owners::Ignore => Ok(()),
            Owners::Refuse if change.mode.is_some() || change.uid.is_some() || change.gid.is_some() => {
                Err(Errno::EPERM)
            }
            _ => change.chown_chmod(path),
        }
    }
}
