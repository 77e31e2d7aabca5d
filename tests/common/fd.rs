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
    let fd = check(unsafe { libc::openat(dirfd, c.as_ptr(), flags) })?;
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// `fstatat(dirfd, name, AT_SYMLINK_NOFOLLOW)`; an empty name stats `dirfd` itself.
pub fn stat_at(dirfd: RawFd, name: &[u8]) -> io::Result<libc::stat> {
    let c = cstr(name);
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    let flags = if name.is_empty() { libc::AT_EMPTY_PATH } else { libc::AT_SYMLINK_NOFOLLOW };
    check(unsafe { libc::fstatat(dirfd, c.as_ptr(), &mut st, flags) })?;
    Ok(st)
}

/// The names in a directory, `.` and `..` excluded, read through a fresh open file description
/// (so the caller's fd offset is untouched).
pub fn read_names(dirfd: RawFd) -> io::Result<Vec<Vec<u8>>> {
    let fresh = open_dir_at(dirfd, b".")?;
    let dir = unsafe { libc::fdopendir(fresh.as_raw_fd()) };
    if dir.is_null() {
        return Err(io::Error::last_os_error());
    }
    // fdopendir owns the fd now; closedir closes it.
    std::mem::forget(fresh);
    let mut names = Vec::new();
    let result = loop {
        unsafe { *libc::__errno_location() = 0 };
        let ent = unsafe { libc::readdir(dir) };
        if ent.is_null() {
            let err = io::Error::last_os_error();
            break if err.raw_os_error() == Some(0) { Ok(()) } else { Err(err) };
        }
        let name = unsafe { std::ffi::CStr::from_ptr((*ent).d_name.as_ptr()) }.to_bytes();
        if name != b"." && name != b".." {
            names.push(name.to_vec());
        }
    };
    unsafe { libc::closedir(dir) };
    result.map(|()| names)
}

pub fn mkdir_at(dirfd: RawFd, name: &[u8], mode: u32) -> io::Result<()> {
    let c = cstr(name);
    check(unsafe { libc::mkdirat(dirfd, c.as_ptr(), mode) }).map(drop)
}

/// `fchownat(dirfd, name, uid, gid, AT_SYMLINK_NOFOLLOW)`; `u32::MAX` keeps a field (-1).
pub fn lchown_at(dirfd: RawFd, name: &[u8], uid: u32, gid: u32) -> io::Result<()> {
    let c = cstr(name);
    check(unsafe { libc::fchownat(dirfd, c.as_ptr(), uid, gid, libc::AT_SYMLINK_NOFOLLOW) }).map(drop)
}

/// `fchmodat(dirfd, name, mode, 0)`: follows a final symlink, so call it on non-symlinks only.
pub fn chmod_at(dirfd: RawFd, name: &[u8], mode: u32) -> io::Result<()> {
    let c = cstr(name);
    check(unsafe { libc::fchmodat(dirfd, c.as_ptr(), mode, 0) }).map(drop)
}

pub fn fchown(fd: RawFd, uid: u32, gid: u32) -> io::Result<()> {
    check(unsafe { libc::fchown(fd, uid, gid) }).map(drop)
}

pub fn fchmod(fd: RawFd, mode: u32) -> io::Result<()> {
    check(unsafe { libc::fchmod(fd, mode) }).map(drop)
}

pub fn symlink_at(target: &[u8], dirfd: RawFd, name: &[u8]) -> io::Result<()> {
    let (t, c) = (cstr(target), cstr(name));
    check(unsafe { libc::symlinkat(t.as_ptr(), dirfd, c.as_ptr()) }).map(drop)
}

pub fn link_at(olddirfd: RawFd, old: &[u8], newdirfd: RawFd, new: &[u8]) -> io::Result<()> {
    let (o, n) = (cstr(old), cstr(new));
    check(unsafe { libc::linkat(olddirfd, o.as_ptr(), newdirfd, n.as_ptr(), 0) }).map(drop)
}

pub fn mknod_at(dirfd: RawFd, name: &[u8], mode: u32, dev: libc::dev_t) -> io::Result<()> {
    let c = cstr(name);
    check(unsafe { libc::mknodat(dirfd, c.as_ptr(), mode, dev) }).map(drop)
}

pub fn mkfifo_at(dirfd: RawFd, name: &[u8], mode: u32) -> io::Result<()> {
    let c = cstr(name);
    check(unsafe { libc::mkfifoat(dirfd, c.as_ptr(), mode) }).map(drop)
}

/// Creates a regular file (O_EXCL, never through a symlink) holding `content`.
pub fn create_file_at(dirfd: RawFd, name: &[u8], content: &[u8]) -> io::Result<()> {
    let c = cstr(name);
    let flags = libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC;
    let fd = check(unsafe { libc::openat(dirfd, c.as_ptr(), flags, 0o600 as libc::c_uint) })?;
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let mut file = std::fs::File::from(fd);
    std::io::Write::write_all(&mut file, content)
}

/// `renameat2(dirfd, a, dirfd, b, RENAME_EXCHANGE)`: atomically swaps two names.
pub fn exchange_at(dirfd: RawFd, a: &[u8], b: &[u8]) -> io::Result<()> {
    let (ca, cb) = (cstr(a), cstr(b));
    let ret =
        unsafe { libc::syscall(libc::SYS_renameat2, dirfd, ca.as_ptr(), dirfd, cb.as_ptr(), libc::RENAME_EXCHANGE) };
    if ret < 0 { Err(io::Error::last_os_error()) } else { Ok(()) }
}

/// Opens the directory at `rel` (components separated by `/`) below `dirfd`, one component at a
/// time, so `rel` may be longer than PATH_MAX. Missing components are created (0755) if `create`.
pub fn open_rel_dir(dirfd: RawFd, rel: &[u8], create: bool) -> io::Result<OwnedFd> {
    let mut cur = open_dir_at(dirfd, b".")?;
    for comp in rel.split(|&b| b == b'/').filter(|c| !c.is_empty()) {
        let next = match open_dir_at(cur.as_raw_fd(), comp) {
            Err(e) if create && e.raw_os_error() == Some(libc::ENOENT) => {
                mkdir_at(cur.as_raw_fd(), comp, 0o755)?;
                open_dir_at(cur.as_raw_fd(), comp)?
            }
            other => other?,
        };
        cur = next;
    }
    Ok(cur)
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
    let mut stx: libc::statx = unsafe { std::mem::zeroed() };
    let flags = if name.is_empty() { libc::AT_EMPTY_PATH } else { libc::AT_SYMLINK_NOFOLLOW };
    check(unsafe { libc::statx(dirfd, c.as_ptr(), flags, libc::STATX_MNT_ID, &mut stx) })?;
    Ok(stx.stx_mnt_id)
}
