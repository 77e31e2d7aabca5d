//! Tiny dirfd-relative wrappers over libc for the test helpers. Every call takes a directory fd
//! and one name, so paths longer than PATH_MAX (4096 bytes) work; nothing follows a symlink
//! unless it says so.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

pub fn cstr(bytes: &[u8]) -> CString {
    CString::new(bytes).unwrap_or_else(|_| panic!("NUL in name {:?}", String::from_utf8_lossy(bytes)))
}

fn check(ret: libc::c_int) -> io::Result<libc::c_int> {
    if ret < 0 { Err(io::Error::last_os_error()) } else { Ok(ret) }
}

/// Opens a directory by (absolute or relative) path, not following a final symlink.
pub fn open_dir(path: &Path) -> io::Result<OwnedFd> {
    open_dir_at(libc::AT_FDCWD, path.as_os_str().as_bytes())
}

/// `openat(dirfd, name, O_RDONLY|O_DIRECTORY|O_NOFOLLOW|O_CLOEXEC)`.
pub fn open_dir_at(dirfd: RawFd, name: &[u8]) -> io::Result<OwnedFd> {
    let c = cstr(name);
    let flags = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC;
    // SAFETY: `c` is a NUL-terminated name alive across the call.
    let fd = check(unsafe { libc::openat(dirfd, c.as_ptr(), flags) })?;
    // SAFETY: `fd` was just returned by openat and is owned by nothing else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// `fstatat(dirfd, name, AT_SYMLINK_NOFOLLOW)`; an empty name stats `dirfd` itself.
pub fn stat_at(dirfd: RawFd, name: &[u8]) -> io::Result<libc::stat> {
    let c = cstr(name);
    // SAFETY: an all-zero `stat` is a valid value of this plain C struct.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    let flags = if name.is_empty() { libc::AT_EMPTY_PATH } else { libc::AT_SYMLINK_NOFOLLOW };
    // SAFETY: `c` is a NUL-terminated name alive across the call; `st` is a valid out-pointer.
    check(unsafe { libc::fstatat(dirfd, c.as_ptr(), &mut st, flags) })?;
    Ok(st)
}

/// The names in a directory, `.` and `..` excluded, read through a fresh open file description
/// (so the caller's fd offset is untouched).
pub fn read_names(dirfd: RawFd) -> io::Result<Vec<Vec<u8>>> {
    let fresh = open_dir_at(dirfd, b".")?;
    // SAFETY: `fresh` is an open directory fd; on success the DIR owns it (forgotten below).
    let dir = unsafe { libc::fdopendir(fresh.as_raw_fd()) };
    if dir.is_null() {
        return Err(io::Error::last_os_error());
    }
    // fdopendir owns the fd now; closedir closes it.
    std::mem::forget(fresh);
    let mut names = Vec::new();
    let result = loop {
        // SAFETY: errno is this thread's; readdir signals an error only through it.
        unsafe { *libc::__errno_location() = 0 };
        // SAFETY: `dir` is the open DIR from fdopendir, closed only after the loop.
        let ent = unsafe { libc::readdir(dir) };
        if ent.is_null() {
            let err = io::Error::last_os_error();
            break if err.raw_os_error() == Some(0) { Ok(()) } else { Err(err) };
        }
        // SAFETY: readdir returned a non-null entry whose d_name is NUL-terminated, valid until the next readdir; it is copied at once.
        let name = unsafe { std::ffi::CStr::from_ptr((*ent).d_name.as_ptr()) }.to_bytes();
        if name != b"." && name != b".." {
            names.push(name.to_vec());
        }
    };
    // SAFETY: `dir` is open and closed exactly once.
    unsafe { libc::closedir(dir) };
    result.map(|()| names)
}

pub fn mkdir_at(dirfd: RawFd, name: &[u8], mode: u32) -> io::Result<()> {
    let c = cstr(name);
    // SAFETY: `c` is a NUL-terminated name alive across the call.
    check(unsafe { libc::mkdirat(dirfd, c.as_ptr(), mode) }).map(drop)
}

/// `fchownat(dirfd, name, uid, gid, AT_SYMLINK_NOFOLLOW)`; `u32::MAX` keeps a field (-1).
pub fn lchown_at(dirfd: RawFd, name: &[u8], uid: u32, gid: u32) -> io::Result<()> {
    let c = cstr(name);
    // SAFETY: `c` is a NUL-terminated name alive across the call.
    check(unsafe { libc::fchownat(dirfd, c.as_ptr(), uid, gid, libc::AT_SYMLINK_NOFOLLOW) }).map(drop)
}

/// `fchmodat(dirfd, name, mode, 0)`: follows a final symlink, so call it on non-symlinks only.
pub fn chmod_at(dirfd: RawFd, name: &[u8], mode: u32) -> io::Result<()> {
    let c = cstr(name);
    // SAFETY: `c` is a NUL-terminated name alive across the call.
    check(unsafe { libc::fchmodat(dirfd, c.as_ptr(), mode, 0) }).map(drop)
}

pub fn fchown(fd: RawFd, uid: u32, gid: u32) -> io::Result<()> {
    // SAFETY: fchown on a descriptor: no pointer involved.
    check(unsafe { libc::fchown(fd, uid, gid) }).map(drop)
}

pub fn fchmod(fd: RawFd, mode: u32) -> io::Result<()> {
    // SAFETY: fchmod on a descriptor: no pointer involved.
    check(unsafe { libc::fchmod(fd, mode) }).map(drop)
}

pub fn symlink_at(target: &[u8], dirfd: RawFd, name: &[u8]) -> io::Result<()> {
    let (t, c) = (cstr(target), cstr(name));
    // SAFETY: `t` and `c` are NUL-terminated strings alive across the call.
    check(unsafe { libc::symlinkat(t.as_ptr(), dirfd, c.as_ptr()) }).map(drop)
}

pub fn link_at(olddirfd: RawFd, old: &[u8], newdirfd: RawFd, new: &[u8]) -> io::Result<()> {
    let (o, n) = (cstr(old), cstr(new));
    // SAFETY: `o` and `n` are NUL-terminated names alive across the call.
    check(unsafe { libc::linkat(olddirfd, o.as_ptr(), newdirfd, n.as_ptr(), 0) }).map(drop)
}

pub fn mknod_at(dirfd: RawFd, name: &[u8], mode: u32, dev: libc::dev_t) -> io::Result<()> {
    let c = cstr(name);
    // SAFETY: `c` is a NUL-terminated name alive across the call.
    check(unsafe { libc::mknodat(dirfd, c.as_ptr(), mode, dev) }).map(drop)
}

pub fn mkfifo_at(dirfd: RawFd, name: &[u8], mode: u32) -> io::Result<()> {
    let c = cstr(name);
    // SAFETY: `c` is a NUL-terminated name alive across the call.
    check(unsafe { libc::mkfifoat(dirfd, c.as_ptr(), mode) }).map(drop)
}

/// Creates a regular file (O_EXCL, never through a symlink) holding `content`.
pub fn create_file_at(dirfd: RawFd, name: &[u8], content: &[u8]) -> io::Result<()> {
    let c = cstr(name);
    let flags = libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC;
    // SAFETY: `c` is a NUL-terminated name alive across the call; O_CREAT is given its mode.
    let fd = check(unsafe { libc::openat(dirfd, c.as_ptr(), flags, 0o600 as libc::c_uint) })?;
    // SAFETY: `fd` was just returned by openat and is owned by nothing else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let mut file = std::fs::File::from(fd);
    std::io::Write::write_all(&mut file, content)
}

/// `renameat2(dirfd, a, dirfd, b, RENAME_EXCHANGE)`: atomically swaps two names.
pub fn exchange_at(dirfd: RawFd, a: &[u8], b: &[u8]) -> io::Result<()> {
    let (ca, cb) = (cstr(a), cstr(b));
    let ret =
        // SAFETY: `ca` and `cb` are NUL-terminated names alive across the call.
        unsafe { libc::syscall(libc::SYS_renameat2, dirfd, ca.as_ptr(), dirfd, cb.as_ptr(), libc::RENAME_EXCHANGE) };
    if ret < 0 { Err(io::Error::last_os_error()) } else { Ok(()) }
}

/// The open directories from a root down to the current one, for building and walking trees
/// far deeper than the open-file limit: a step down opens one name below the current directory
/// (never a path), and at most `2 * KEEP` descriptors stay open whatever the depth (every
/// `KEEP`-th level and the last `KEEP`). A closed level is re-opened by name from its nearest
/// open ancestor and must be the directory it was (device and inode).
pub struct DirStack {
    /// The root first. Level 0 (the root) is never closed.
    levels: Vec<Level>,
}

struct Level {
    name: Vec<u8>,
    id: (u64, u64),
    fd: Option<OwnedFd>,
}

/// Whether a step down may create the directory it enters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Missing {
    Fail,
    Create,
}

impl DirStack {
    const KEEP: usize = 64;

    /// The stack at the directory `root` (opened not following a final symlink).
    pub fn open(root: &Path) -> io::Result<DirStack> {
        let fd = open_dir(root)?;
        let id = dev_ino(&stat_at(fd.as_raw_fd(), b"")?);
        Ok(DirStack { levels: vec![Level { name: Vec::new(), id, fd: Some(fd) }] })
    }

    /// Levels below the root.
    pub fn depth(&self) -> usize {
        self.levels.len() - 1
    }

    /// The current directory's fd, re-opening it (and the closed levels above it) if needed.
    pub fn top(&mut self) -> io::Result<RawFd> {
        let open = self.levels.iter().rposition(|l| l.fd.is_some()).expect("the root stays open");
        for i in open + 1..self.levels.len() {
            let parent = self.levels[i - 1].fd.as_ref().unwrap().as_raw_fd();
            let fd = open_dir_at(parent, &self.levels[i].name)?;
            if dev_ino(&stat_at(fd.as_raw_fd(), b"")?) != self.levels[i].id {
                return Err(io::Error::other("directory replaced while walking"));
            }
            self.levels[i].fd = Some(fd);
        }
        Ok(self.levels.last().unwrap().fd.as_ref().unwrap().as_raw_fd())
    }

    /// Enters the directory `name` of the current one.
    pub fn push(&mut self, name: &[u8], missing: Missing) -> io::Result<RawFd> {
        let parent = self.top()?;
        let fd = match open_dir_at(parent, name) {
            Err(e) if missing == Missing::Create && e.raw_os_error() == Some(libc::ENOENT) => {
                mkdir_at(parent, name, 0o755)?;
                open_dir_at(parent, name)?
            }
            other => other?,
        };
        let (id, raw) = (dev_ino(&stat_at(fd.as_raw_fd(), b"")?), fd.as_raw_fd());
        self.levels.push(Level { name: name.to_vec(), id, fd: Some(fd) });
        let far = self.levels.len().saturating_sub(Self::KEEP + 1);
        if far % Self::KEEP != 0 {
            self.levels[far].fd = None;
        }
        Ok(raw)
    }

    /// Back to the parent directory (the root stays).
    pub fn pop(&mut self) {
        assert!(self.levels.len() > 1, "pop at the root");
        self.levels.pop();
    }

    /// Moves to the root-relative directory `rel` (components separated by `/`, `""` the root),
    /// keeping the levels it shares with the current one: siblings and children cost one open.
    pub fn cd(&mut self, rel: &[u8], missing: Missing) -> io::Result<RawFd> {
        let comps: Vec<&[u8]> = rel.split(|&b| b == b'/').filter(|c| !c.is_empty()).collect();
        let shared = comps.iter().zip(&self.levels[1..]).take_while(|(c, l)| **c == l.name.as_slice()).count();
        self.levels.truncate(shared + 1);
        for comp in &comps[shared..] {
            self.push(comp, missing)?;
        }
        self.top()
    }
}

fn dev_ino(st: &libc::stat) -> (u64, u64) {
    (st.st_dev, st.st_ino)
}

/// Splits `a/b/c` into (`a/b`, `c`); a single component has parent `""`.
pub fn split_parent(rel: &[u8]) -> (&[u8], &[u8]) {
    match rel.iter().rposition(|&b| b == b'/') {
        Some(i) => (&rel[..i], &rel[i + 1..]),
        None => (&[], rel),
    }
}

/// The mount id of `name` in `dirfd` (`statx` `STATX_MNT_ID`, not following a symlink; an
/// empty name: `dirfd` itself).
pub fn mnt_id_at(dirfd: RawFd, name: &[u8]) -> io::Result<u64> {
    let c = cstr(name);
    // SAFETY: an all-zero `statx` is a valid value of this plain C struct.
    let mut stx: libc::statx = unsafe { std::mem::zeroed() };
    let flags = if name.is_empty() { libc::AT_EMPTY_PATH } else { libc::AT_SYMLINK_NOFOLLOW };
    // SAFETY: `c` is a NUL-terminated name alive across the call; `stx` is a valid out-pointer.
    check(unsafe { libc::statx(dirfd, c.as_ptr(), flags, libc::STATX_MNT_ID, &mut stx) })?;
    Ok(stx.stx_mnt_id)
}
