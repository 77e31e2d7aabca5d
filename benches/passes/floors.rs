//! The machine's floors: the same parallel walk as a pass, with nothing but the syscalls each
//! entry needs and no volprep machinery (no marker, no checkpoint, no report, no comparison
//! before a change), so every run states how far volprep is from what the kernel allows.
//! `__floor KIND ROOT GID THREADS` runs one in a child process (its rusage is its own):
//!
//! - `read`: each directory opened (`openat` relative to its parent, `O_DIRECTORY|O_NOFOLLOW`),
//!   read with `getdents64` (32 KiB) and closed; each entry `statx` by name
//!   (`AT_SYMLINK_NOFOLLOW`). What `check` cannot go below.
//! - `unsafe`: `read`, then on every entry `fchownat(dirfd, name, -1, gid,
//!   AT_SYMLINK_NOFOLLOW)` and, on every non-symlink, `fchmodat(dirfd, name, old | mask)` by
//!   name: the kubelet's rule with the kubelet's exposure to a name swapped for a symlink
//!   between the stat and the chmod.
//! - `race-safe`: each entry pinned first, `openat(dirfd, name, O_PATH|O_NOFOLLOW)`, then
//!   `statx`, `fchownat` and `fchmodat2` (`chmod` of `/proc/self/fd/N` where the kernel lacks
//!   it) on the pinned fd (`AT_EMPTY_PATH`), and `close`: the fewest syscalls of a pass that
//!   changes only the inode it inspected.
//!
//! Unconditional, like the kubelet: every entry is changed, to `old | 0660` (directories
//! `| 02770`), the mode read before the chown (which may clear setuid; the chmod puts it back),
//! so the tree ends as the kubelet leaves it and the bench verifies it the same way. A
//! directory is read once, from a queue of open directory fds shared by `THREADS` threads.

use std::ffi::CStr;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex};

/// Which floor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Floor {
    Read,
    Unsafe,
    RaceSafe,
}

impl Floor {
    pub fn parse(s: &str) -> Option<Floor> {
        match s {
            "read" => Some(Floor::Read),
            "unsafe" => Some(Floor::Unsafe),
            "race-safe" => Some(Floor::RaceSafe),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Floor::Read => "read",
            Floor::Unsafe => "unsafe",
            Floor::RaceSafe => "race-safe",
        }
    }
}

const DIRENT_BUF: usize = 32 * 1024;

/// The directories still to read, and how many threads are reading one.
struct Queue {
    state: Mutex<(Vec<OwnedFd>, usize)>,
    more: Condvar,
}

impl Queue {
    /// The next directory, or `None` once every directory is read.
    fn pop(&self) -> Option<OwnedFd> {
        let mut s = self.state.lock().unwrap();
        loop {
            if let Some(fd) = s.0.pop() {
                s.1 += 1;
                return Some(fd);
            }
            if s.1 == 0 {
                self.more.notify_all();
                return None;
            }
            s = self.more.wait(s).unwrap();
        }
    }

    fn push(&self, fds: Vec<OwnedFd>) {
        if !fds.is_empty() {
            self.state.lock().unwrap().0.extend(fds);
            self.more.notify_all();
        }
    }

    fn done_one(&self) {
        let mut s = self.state.lock().unwrap();
        s.1 -= 1;
        if s.1 == 0 && s.0.is_empty() {
            self.more.notify_all();
        }
    }
}

/// A syscall's result, or its error named by `what`.
fn check(ret: libc::c_int, what: &str) -> io::Result<libc::c_int> {
    if ret >= 0 {
        return Ok(ret);
    }
    let e = io::Error::last_os_error();
    Err(io::Error::new(e.kind(), format!("{what}: {e}")))
}

/// `statx(dirfd, name, flags)`: (file type and mode bits, is a directory).
fn statx(dirfd: RawFd, name: &CStr, flags: libc::c_int) -> io::Result<u32> {
    // SAFETY: statx is plain old data; the kernel fills it.
    let mut stx: libc::statx = unsafe { std::mem::zeroed() };
    let mask = libc::STATX_TYPE | libc::STATX_MODE | libc::STATX_UID | libc::STATX_GID;
    // SAFETY: `name` is a valid C string, `stx` a valid out-pointer.
    check(unsafe { libc::statx(dirfd, name.as_ptr(), flags, mask, &mut stx) }, "statx")?;
    Ok(u32::from(stx.stx_mode))
}

/// The kubelet's target mode for an entry of `mode` (type and bits).
fn target(mode: u32) -> u32 {
    let dir = mode & libc::S_IFMT == libc::S_IFDIR;
    (mode & 0o7777) | if dir { 0o2770 } else { 0o660 }
}

fn is_symlink(mode: u32) -> bool {
    mode & libc::S_IFMT == libc::S_IFLNK
}

/// One entry, `name` in `dirfd`, as `floor` does it; its type and mode as `statx` read them.
fn entry(floor: Floor, dirfd: RawFd, name: &CStr, gid: u32) -> io::Result<u32> {
    let nofollow = libc::AT_SYMLINK_NOFOLLOW;
    match floor {
        Floor::Read => statx(dirfd, name, nofollow),
        Floor::Unsafe => {
            let mode = statx(dirfd, name, nofollow)?;
            // SAFETY: valid C string; -1 keeps the owner.
            check(unsafe { libc::fchownat(dirfd, name.as_ptr(), u32::MAX, gid, nofollow) }, "fchownat")?;
            if !is_symlink(mode) {
                // SAFETY: valid C string.
                check(unsafe { libc::fchmodat(dirfd, name.as_ptr(), target(mode), 0) }, "fchmodat")?;
            }
            Ok(mode)
        }
        Floor::RaceSafe => {
            let flags = libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC;
            // SAFETY: valid C string.
            let pin = check(unsafe { libc::openat(dirfd, name.as_ptr(), flags) }, "openat O_PATH")?;
            // SAFETY: `pin` was just opened and is ours.
            let pin = unsafe { OwnedFd::from_raw_fd(pin) };
            pinned(pin.as_raw_fd(), gid)
        }
    }
}

/// `statx`, `fchownat` and `fchmodat2` on an `O_PATH` fd (the caller closes it); the mode read.
fn pinned(fd: RawFd, gid: u32) -> io::Result<u32> {
    let empty = c"";
    let mode = statx(fd, empty, libc::AT_EMPTY_PATH)?;
    // SAFETY: an empty path with AT_EMPTY_PATH names `fd` itself.
    check(unsafe { libc::fchownat(fd, empty.as_ptr(), u32::MAX, gid, libc::AT_EMPTY_PATH) }, "fchownat")?;
    if is_symlink(mode) {
        return Ok(mode);
    }
    // SAFETY: as above; fchmodat2 takes (dirfd, path, mode, flags).
    let r = unsafe { libc::syscall(libc::SYS_fchmodat2, fd, empty.as_ptr(), target(mode), libc::AT_EMPTY_PATH) };
    if r == 0 {
        return Ok(mode);
    }
    let proc = std::ffi::CString::new(format!("/proc/self/fd/{fd}")).expect("no NUL");
    // SAFETY: valid C string; the magic link resolves to the pinned inode, never a symlink here.
    check(unsafe { libc::chmod(proc.as_ptr(), target(mode)) }, "chmod /proc/self/fd")?;
    Ok(mode)
}

/// Reads one directory: every entry done, its subdirectories opened and returned.
fn directory(floor: Floor, dir: &OwnedFd, gid: u32, count: &AtomicU64) -> io::Result<Vec<OwnedFd>> {
    let mut subdirs = Vec::new();
    let mut buf = vec![0u8; DIRENT_BUF];
    loop {
        // SAFETY: `dir` is open; `buf` is writable for its length.
        let n = unsafe { libc::syscall(libc::SYS_getdents64, dir.as_raw_fd(), buf.as_mut_ptr(), buf.len()) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        if n == 0 {
            return Ok(subdirs);
        }
        let mut off = 0usize;
        while off < n as usize {
            // struct linux_dirent64 { u64 d_ino; i64 d_off; u16 d_reclen; u8 d_type; char d_name[]; }
            let reclen = u16::from_ne_bytes([buf[off + 16], buf[off + 17]]) as usize;
            let d_type = buf[off + 18];
            let name = CStr::from_bytes_until_nul(&buf[off + 19..off + reclen]).expect("NUL-terminated d_name");
            off += reclen;
            if name.to_bytes() == b"." || name.to_bytes() == b".." {
                continue;
            }
            let mode = entry(floor, dir.as_raw_fd(), name, gid)?;
            count.fetch_add(1, Ordering::Relaxed);
            // The entry's own `d_type`, or its stat where the filesystem gives none.
            let is_dir = d_type == libc::DT_DIR || (d_type == libc::DT_UNKNOWN && mode & libc::S_IFMT == libc::S_IFDIR);
            if is_dir {
                let flags = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC;
                // SAFETY: valid C string.
                let fd = check(unsafe { libc::openat(dir.as_raw_fd(), name.as_ptr(), flags) }, "openat dir")?;
                // SAFETY: just opened, ours.
                subdirs.push(unsafe { OwnedFd::from_raw_fd(fd) });
            }
        }
    }
}

/// The floor's pass over `root` with `threads` threads; the entries it did, root included.
pub fn pass(floor: Floor, root: &Path, gid: u32, threads: usize) -> io::Result<u64> {
    raise_fd_limit();
    let c = std::ffi::CString::new(root.as_os_str().as_bytes()).map_err(|_| io::ErrorKind::InvalidInput)?;
    let flags = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC;
    // SAFETY: valid C string.
    let fd = check(unsafe { libc::open(c.as_ptr(), flags) }, "open root")?;
    // SAFETY: just opened, ours.
    let rootfd = unsafe { OwnedFd::from_raw_fd(fd) };
    entry(floor, libc::AT_FDCWD, &c, gid)?;
    let count = AtomicU64::new(1);
    let queue = Queue { state: Mutex::new((vec![rootfd], 0)), more: Condvar::new() };
    let failed: Mutex<Option<io::Error>> = Mutex::new(None);
    std::thread::scope(|s| {
        for _ in 0..threads.max(1) {
            s.spawn(|| {
                while let Some(dir) = queue.pop() {
                    match directory(floor, &dir, gid, &count) {
                        Ok(subdirs) => queue.push(subdirs),
                        Err(e) => *failed.lock().unwrap() = Some(e),
                    }
                    drop(dir);
                    queue.done_one();
                }
            });
        }
    });
    match failed.into_inner().unwrap() {
        Some(e) => Err(e),
        None => Ok(count.into_inner()),
    }
}

/// Queued directories hold an fd each: the soft open-file limit raised to the hard one.
fn raise_fd_limit() {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: `lim` is a valid out-pointer.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } == 0 {
        lim.rlim_cur = lim.rlim_max;
        // SAFETY: `lim` is valid.
        unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) };
    }
}

/// `__floor KIND ROOT GID THREADS`: prints `{"entries":N}` on stdout.
pub fn main_floor(floor: Floor, root: &Path, gid: u32, threads: usize) -> i32 {
    match pass(floor, root, gid, threads) {
        Ok(n) => {
            println!("{{\"entries\":{n}}}");
            0
        }
        Err(e) => {
            eprintln!("{} floor: {e}", floor.name());
            1
        }
    }
}
