//! The at-syscalls that open and change entries (directories, O_PATH pins, owners, modes, xattrs, links, locks).
//!
//! Each is relative to a directory fd, with its flags (NOFOLLOW, CLOEXEC) chosen here once.

use std::ffi::CStr;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

use rustix::fs::{AtFlags, Gid, Mode, OFlags, Uid};
use rustix::io::Errno;

use super::{Kind, retry, stat_fd};
use crate::throttle::{self, OpKind};

/// `open(path, O_RDONLY|O_DIRECTORY)`: the volume root. The user's own path may contain
/// symlinks (it names the volume); nothing below it is ever reached through one.
pub fn open_root(path: &Path) -> Result<OwnedFd, Errno> {
    retry(|| rustix::fs::open(path, dir_flags(), Mode::empty()))
}

/// `open(path, O_RDONLY|O_DIRECTORY|O_NOFOLLOW)`: a volume root whose last component must be
/// the directory itself, never a symlink (ENOTDIR: a symlink, or anything else but a directory).
pub fn open_root_nofollow(path: &Path) -> Result<OwnedFd, Errno> {
    retry(|| rustix::fs::open(path, dir_flags() | OFlags::NOFOLLOW, Mode::empty()))
}

/// `openat(dir, name, O_RDONLY|O_DIRECTORY|O_NOFOLLOW)`: a subdirectory, never through a
/// symlink (ELOOP/ENOTDIR when `name` is not a real directory). O_NONBLOCK and O_NOCTTY make
/// sure nothing else could ever block or become a terminal.
pub fn open_subdir(dir: BorrowedFd<'_>, name: &CStr) -> Result<OwnedFd, Errno> {
    throttle::op(OpKind::OpenDir, || {
        retry(|| rustix::fs::openat(dir, name, dir_flags() | OFlags::NOFOLLOW, Mode::empty()))
    })
}

/// `openat(dir, "..", O_PATH|O_DIRECTORY)`: the parent of an open directory (itself at `/`).
pub fn open_parent(dir: BorrowedFd<'_>) -> Result<OwnedFd, Errno> {
    retry(|| rustix::fs::openat(dir, c"..", OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty()))
}

/// Opens an output file (report, termination message) for writing: created 0644 if missing,
/// never through a symlink at `path` (`O_NOFOLLOW`: ELOOP), never a regular file with other
/// hard links (EMLINK: it could be any file of that filesystem), never anything but a regular
/// file (ENXIO: a FIFO, socket or device). `O_NONBLOCK` makes the open of a FIFO without a
/// reader fail at once (ENXIO) instead of waiting forever; it is cleared once the fd is known
/// to be a regular file. `O_NOCTTY`: a terminal named here never becomes the controlling one.
/// A regular file is truncated.
pub fn create_output(path: &Path) -> Result<std::fs::File, Errno> {
    let flags =
        OFlags::WRONLY | OFlags::CREATE | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NOCTTY | OFlags::NONBLOCK;
    let fd = retry(|| rustix::fs::open(path, flags, Mode::from_raw_mode(0o644)))?;
    let meta = stat_fd(fd.as_fd())?;
    if meta.kind() != Kind::File {
        return Err(Errno::NXIO);
    }
    if meta.nlink > 1 {
        return Err(Errno::MLINK);
    }
    rustix::fs::fcntl_setfl(&fd, rustix::fs::fcntl_getfl(&fd)? - OFlags::NONBLOCK)?;
    retry(|| rustix::fs::ftruncate(&fd, 0))?;
    Ok(std::fs::File::from(fd))
}

fn dir_flags() -> OFlags {
    OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC | OFlags::NONBLOCK | OFlags::NOCTTY
}

/// `openat(dir, name, O_PATH|O_NOFOLLOW)`: pins an entry's inode without opening it
/// (no device driver, FIFO or socket is ever opened; a symlink yields the link itself).
pub fn pin_at(dir: BorrowedFd<'_>, name: &CStr) -> Result<OwnedFd, Errno> {
    let flags = OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    throttle::op(OpKind::Open, || retry(|| rustix::fs::openat(dir, name, flags, Mode::empty())))
}

/// `open("/proc/self/fd/N", O_RDONLY)`: opens the regular file `pin` (an `O_PATH` fd whose
/// `fstat` said so) for reading, through its magic link, which leads to the pinned inode itself,
/// never to whatever its name leads to now. Nothing is read. The caller must have checked the
/// kind: this never opens a device, FIFO or socket only because `pin` is none.
pub fn reopen_file(pin: BorrowedFd<'_>) -> Result<OwnedFd, Errno> {
    let proc_path = format!("/proc/self/fd/{}", pin.as_raw_fd());
    let flags = OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NONBLOCK | OFlags::NOCTTY;
    throttle::op(OpKind::Open, || retry(|| rustix::fs::open(proc_path.as_str(), flags, Mode::empty())))
}

/// `readlinkat(dir, name)`: the target of the symlink `name` in `dir`, as stored (never
/// resolved). EINVAL when `name` is not (or no longer) a symlink.
pub fn readlink_at(dir: BorrowedFd<'_>, name: &CStr) -> Result<Vec<u8>, Errno> {
    retry(|| rustix::fs::readlinkat(dir, name, Vec::new())).map(|t| t.into_bytes())
}

/// `fchownat(fd, "", uid, gid, AT_EMPTY_PATH)`: changes the owner of the inode `fd` refers to
/// (for an O_PATH fd on a symlink: the link itself). `None` keeps that id (-1).
pub fn chown_fd(fd: BorrowedFd<'_>, uid: Option<u32>, gid: Option<u32>) -> Result<(), Errno> {
    let uid = uid.map(Uid::from_raw);
    let gid = gid.map(Gid::from_raw);
    throttle::op(OpKind::Change, || retry(|| rustix::fs::chownat(fd, c"", uid, gid, AtFlags::EMPTY_PATH)))
}

/// Remembers that this kernel lacks `fchmodat2` (Linux < 6.6), so the fallback is taken at once.
static NO_FCHMODAT2: AtomicBool = AtomicBool::new(false);

/// `fchmodat2(fd, "", mode, AT_EMPTY_PATH)`: changes the mode of the inode `fd` refers to.
///
/// `fd` must not refer to a symlink (callers check with [`stat_fd`]). On kernels without
/// `fchmodat2`, falls back to `chmod("/proc/self/fd/N")`, which reaches the very inode the fd
/// pins (the magic link is not re-resolved by name). Plain `fchmodat` is never used: it follows
/// symlinks, so an entry swapped for a link would change the link's target.
pub fn chmod_fd(fd: BorrowedFd<'_>, mode: u32) -> Result<(), Errno> {
    throttle::op(OpKind::Change, || chmod_now(fd, mode))
}

fn chmod_now(fd: BorrowedFd<'_>, mode: u32) -> Result<(), Errno> {
    if !NO_FCHMODAT2.load(Ordering::Relaxed) {
        match retry(|| fchmodat2_empty_path(fd, mode)) {
            Err(Errno::NOSYS) => NO_FCHMODAT2.store(true, Ordering::Relaxed),
            other => return other,
        }
    }
    let proc_path = format!("/proc/self/fd/{}", fd.as_raw_fd());
    retry(|| rustix::fs::chmod(proc_path.as_str(), Mode::from_raw_mode(mode)))
}

fn fchmodat2_empty_path(fd: BorrowedFd<'_>, mode: u32) -> Result<(), Errno> {
    // SAFETY: plain syscall with a valid fd, a NUL-terminated empty path and flag constants.
    let rc = unsafe {
        libc::syscall(libc::SYS_fchmodat2, fd.as_raw_fd(), c"".as_ptr(), mode as libc::c_uint, libc::AT_EMPTY_PATH)
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(Errno::from_raw_os_error(std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO)))
    }
}

/// `fgetxattr(fd, name)`: `Ok(None)` when the attribute is absent (ENODATA).
/// ENOTSUP/EOPNOTSUPP (no xattr support, e.g. ramfs) is returned as an error for the caller.
pub fn get_xattr(fd: BorrowedFd<'_>, name: &CStr) -> Result<Option<Vec<u8>>, Errno> {
    xattr_value(4096, |buf| rustix::fs::fgetxattr(fd, name, buf))
}

/// An xattr's value, read by `get` (an `*getxattr` call into the buffer it is given) into a
/// buffer of `first` bytes, grown while the value does not fit (ERANGE, up to 64 KiB):
/// `Ok(None)` when the attribute is absent (ENODATA).
fn xattr_value(first: usize, mut get: impl FnMut(&mut [u8]) -> Result<usize, Errno>) -> Result<Option<Vec<u8>>, Errno> {
    let mut buf = vec![0u8; first];
    loop {
        match retry(|| get(&mut buf[..])) {
            Ok(n) => {
                buf.truncate(n);
                return Ok(Some(buf));
            }
            Err(Errno::NODATA) => return Ok(None),
            Err(Errno::RANGE) if buf.len() < 1 << 16 => buf.resize(buf.len() * 4, 0),
            Err(e) => return Err(e),
        }
    }
}

/// The xattr that holds a POSIX access ACL (in the kernel's binary form).
const ACL_ACCESS: &CStr = c"system.posix_acl_access";

/// The POSIX access ACL of `name` in `dir`, if it has one beyond its mode bits: `lgetxattr` of
/// `system.posix_acl_access` through `/proc/self/fd/DIR/NAME` (nothing is opened, a symlink is
/// not followed). A filesystem without ACLs has none.
pub fn acl_at(dir: BorrowedFd<'_>, name: &CStr) -> Result<Option<Vec<u8>>, Errno> {
    use std::os::unix::ffi::OsStrExt;
    let mut path = format!("/proc/self/fd/{}/", dir.as_raw_fd()).into_bytes();
    path.extend_from_slice(name.to_bytes());
    let path = std::ffi::OsStr::from_bytes(&path);
    match xattr_value(1024, |buf| rustix::fs::lgetxattr(path, ACL_ACCESS, buf)) {
        Err(Errno::OPNOTSUPP) => Ok(None),
        other => other,
    }
}

/// The POSIX access ACL of the open `fd` (see [`acl_at`]).
pub fn acl_fd(fd: BorrowedFd<'_>) -> Result<Option<Vec<u8>>, Errno> {
    match get_xattr(fd, ACL_ACCESS) {
        Err(Errno::OPNOTSUPP) => Ok(None),
        other => other,
    }
}

/// `flistxattr(fd)`: the names of the attributes of `fd` this process may list (on Linux, every
/// namespace but `trusted.*` without CAP_SYS_ADMIN).
pub fn list_xattrs(fd: BorrowedFd<'_>) -> Result<Vec<std::ffi::CString>, Errno> {
    let list = xattr_value(4096, |buf| rustix::fs::flistxattr(fd, buf))?.unwrap_or_default();
    Ok(list.split(|&b| b == 0).filter(|n| !n.is_empty()).filter_map(|n| std::ffi::CString::new(n).ok()).collect())
}

/// `fsetxattr(fd, name, value, 0)`.
pub fn set_xattr(fd: BorrowedFd<'_>, name: &CStr, value: &[u8]) -> Result<(), Errno> {
    retry(|| rustix::fs::fsetxattr(fd, name, value, rustix::fs::XattrFlags::empty()))
}

/// `fremovexattr(fd, name)`; an absent attribute is not an error.
pub fn remove_xattr(fd: BorrowedFd<'_>, name: &CStr) -> Result<(), Errno> {
    match retry(|| rustix::fs::fremovexattr(fd, name)) {
        Err(Errno::NODATA) => Ok(()),
        other => other,
    }
}

/// `flock(fd, LOCK_EX|LOCK_NB)`: `Ok(false)` when another process holds the lock.
pub fn try_lock(fd: BorrowedFd<'_>) -> Result<bool, Errno> {
    match retry(|| rustix::fs::flock(fd, rustix::fs::FlockOperation::NonBlockingLockExclusive)) {
        Ok(()) => Ok(true),
        Err(Errno::WOULDBLOCK) => Ok(false),
        Err(e) => Err(e),
    }
}

/// `openat2(root, rel, O_PATH|O_NOFOLLOW, RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS|RESOLVE_NO_XDEV)`:
/// pins an entry named by a path below `root`, refusing any symlink, `..` escape or mount crossing.
pub fn pin_beneath(root: BorrowedFd<'_>, rel: &Path) -> Result<OwnedFd, Errno> {
    use rustix::fs::ResolveFlags;
    let how = ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_XDEV | ResolveFlags::NO_MAGICLINKS;
    retry(|| rustix::fs::openat2(root, rel, OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC, Mode::empty(), how))
}

/// `mkdirat(dir, name, mode)`: never follows a symlink at `name` (EEXIST instead).
pub fn mkdir_at(dir: BorrowedFd<'_>, name: &CStr, mode: u32) -> Result<(), Errno> {
    retry(|| rustix::fs::mkdirat(dir, name, Mode::from_raw_mode(mode)))
}

/// `openat(dir, name, O_WRONLY|O_CREAT|O_EXCL|O_NOFOLLOW, mode)`: a new regular file. An entry
/// already at `name`, a symlink included (even a dangling one), is never opened: EEXIST.
pub fn create_new_at(dir: BorrowedFd<'_>, name: &CStr, mode: u32) -> Result<OwnedFd, Errno> {
    let flags = OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NOCTTY;
    retry(|| rustix::fs::openat(dir, name, flags, Mode::from_raw_mode(mode)))
}

/// `symlinkat(target, dir, name)`: a new symlink (EEXIST when `name` exists).
pub fn symlink_at(target: &CStr, dir: BorrowedFd<'_>, name: &CStr) -> Result<(), Errno> {
    retry(|| rustix::fs::symlinkat(target, dir, name))
}

/// `unlinkat(dir, name, 0)`: removes the file `name` (never a directory; a symlink is itself).
pub fn unlink_at(dir: BorrowedFd<'_>, name: &CStr) -> Result<(), Errno> {
    retry(|| rustix::fs::unlinkat(dir, name, AtFlags::empty()))
}

/// The inode flags of an entry that make the kernel refuse even root's chown and chmod.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Locked {
    /// `chattr +i`.
    Immutable,
    /// `chattr +a`.
    AppendOnly,
}

/// Whether the entry `name` in `dir` (`""`: `dir` itself, which may be an `O_PATH` pin) has the
/// immutable or append-only flag, from `statx`'s attributes: nothing is opened, no symlink is
/// followed. `None` when it has neither, or the filesystem does not say.
pub fn locked_at(dir: BorrowedFd<'_>, name: &CStr) -> Option<Locked> {
    let flags = if name.is_empty() { AtFlags::EMPTY_PATH } else { AtFlags::empty() } | AtFlags::SYMLINK_NOFOLLOW;
    let x = retry(|| rustix::fs::statx(dir, name, flags, rustix::fs::StatxFlags::BASIC_STATS)).ok()?;
    use rustix::fs::StatxAttributes as A;
    let known = |bit: A| x.stx_attributes_mask.contains(bit) && x.stx_attributes.contains(bit);
    if known(A::IMMUTABLE) {
        Some(Locked::Immutable)
    } else if known(A::APPEND) {
        Some(Locked::AppendOnly)
    } else {
        None
    }
}
