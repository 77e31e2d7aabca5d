//! The thin syscall layer: every open, stat, chown and chmod volprep makes, each relative to a
//! directory fd and never following a symlink. Flag choices (NOFOLLOW, CLOEXEC, O_PATH) live here once.

use std::ffi::CStr;
use std::ffi::OsStr;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};

use rustix::fs::{AtFlags, FileType, Gid, Mode, OFlags, RawDir, Statx, StatxFlags, Uid};
use rustix::io::Errno;

/// The lstat data a decision needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Meta {
    pub dev: u64,
    pub ino: u64,
    /// Full `st_mode`: file type and permission bits, special bits included.
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    /// Hard links to the inode.
    pub nlink: u64,
    /// The id of the mount the entry was reached through (`statx` `STATX_MNT_ID`), 0 where the
    /// kernel does not tell (before Linux 5.8). A bind mount of a directory of the same
    /// filesystem has the same `dev` but its own mount id.
    pub mnt_id: u64,
}

/// The kind of an entry, from its mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    Dir,
    File,
    Symlink,
    Fifo,
    Socket,
    CharDev,
    BlockDev,
}

impl Meta {
    pub fn kind(&self) -> Kind {
        match self.mode & libc::S_IFMT {
            libc::S_IFDIR => Kind::Dir,
            libc::S_IFLNK => Kind::Symlink,
            libc::S_IFIFO => Kind::Fifo,
            libc::S_IFSOCK => Kind::Socket,
            libc::S_IFCHR => Kind::CharDev,
            libc::S_IFBLK => Kind::BlockDev,
            _ => Kind::File,
        }
    }

    /// Permission and special bits (`mode & 07777`).
    pub fn perm(&self) -> u32 {
        self.mode & 0o7777
    }

    // `nlink_t` is u64 here but u32 on some targets.
    #[allow(clippy::useless_conversion)]
    fn from_stat(st: &rustix::fs::Stat) -> Meta {
        Meta {
            dev: st.st_dev,
            ino: st.st_ino,
            mode: st.st_mode,
            uid: st.st_uid,
            gid: st.st_gid,
            nlink: u64::from(st.st_nlink),
            mnt_id: 0,
        }
    }

    fn from_statx(x: &Statx) -> Meta {
        Meta {
            dev: libc::makedev(x.stx_dev_major, x.stx_dev_minor),
            ino: x.stx_ino,
            mode: u32::from(x.stx_mode),
            uid: x.stx_uid,
            gid: x.stx_gid,
            nlink: u64::from(x.stx_nlink),
            mnt_id: if x.stx_mask & StatxFlags::MNT_ID.bits() != 0 { x.stx_mnt_id } else { 0 },
        }
    }

    /// Whether this entry is on another mount than `root`: another mount id (where the kernel
    /// tells) or another device (btrfs subvolumes, kernels without mount ids).
    pub fn other_mount(&self, root: &Meta) -> bool {
        self.dev != root.dev || (self.mnt_id != 0 && root.mnt_id != 0 && self.mnt_id != root.mnt_id)
    }
}

/// `open(path, O_RDONLY|O_DIRECTORY)`: the volume root. The user's own path may contain
/// symlinks (it names the volume); nothing below it is ever reached through one.
pub fn open_root(path: &Path) -> Result<OwnedFd, Errno> {
    retry(|| rustix::fs::open(path, dir_flags(), Mode::empty()))
}

/// `openat(dir, name, O_RDONLY|O_DIRECTORY|O_NOFOLLOW)`: a subdirectory, never through a
/// symlink (ELOOP/ENOTDIR when `name` is not a real directory). O_NONBLOCK and O_NOCTTY make
/// sure nothing else could ever block or become a terminal.
pub fn open_subdir(dir: BorrowedFd<'_>, name: &CStr) -> Result<OwnedFd, Errno> {
    retry(|| rustix::fs::openat(dir, name, dir_flags() | OFlags::NOFOLLOW, Mode::empty()))
}

/// Opens the directory `path` resolving every component without following a symlink (`..` is
/// taken as it is, after symlink-free components). On failure: the component's path (the prefix
/// of `path` that failed), whether it is a symlink, and the errno.
pub fn open_dir_no_symlinks(path: &Path) -> Result<OwnedFd, (PathBuf, bool, Errno)> {
    let start = if path.has_root() { "/" } else { "." };
    let mut so_far = PathBuf::from(start);
    let mut fd = open_root(Path::new(start)).map_err(|e| (so_far.clone(), false, e))?;
    for c in path.components() {
        let name = match c {
            Component::RootDir | Component::CurDir | Component::Prefix(_) => continue,
            Component::ParentDir => OsStr::new(".."),
            Component::Normal(n) => n,
        };
        so_far.push(name);
        let cname = std::ffi::CString::new(name.as_bytes()).map_err(|_| (so_far.clone(), false, Errno::INVAL))?;
        fd = match open_subdir(fd.as_fd(), &cname) {
            Ok(next) => next,
            Err(e @ (Errno::LOOP | Errno::NOTDIR)) => {
                let link = stat_at(fd.as_fd(), &cname).is_ok_and(|m| m.kind() == Kind::Symlink);
                return Err((so_far, link, e));
            }
            Err(e) => return Err((so_far, false, e)),
        };
    }
    Ok(fd)
}

/// `stat(path)`, following symlinks: for paths the operator names (volume roots, system
/// directories), never for entries inside a volume.
pub fn stat_path(path: &Path) -> Result<Meta, Errno> {
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).map_err(|_| Errno::INVAL)?;
    stat(rustix::fs::CWD, &c, AtFlags::empty())
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
    retry(|| rustix::fs::openat(dir, name, OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC, Mode::empty()))
}

/// Remembers that `statx` is unavailable (Linux < 4.11, or a seccomp filter refusing it).
static NO_STATX: AtomicBool = AtomicBool::new(false);

/// What every stat asks `statx` for: the basic fields a decision needs, and the mount id.
fn statx_mask() -> StatxFlags {
    StatxFlags::TYPE
        | StatxFlags::MODE
        | StatxFlags::NLINK
        | StatxFlags::UID
        | StatxFlags::GID
        | StatxFlags::INO
        | StatxFlags::MNT_ID
}

/// One stat: `statx(dir, name, flags, mask)` (one syscall, the mount id included), or
/// `fstatat` where `statx` is missing (`mnt_id` then 0).
fn stat(dir: BorrowedFd<'_>, name: &CStr, flags: AtFlags) -> Result<Meta, Errno> {
    if !NO_STATX.load(Ordering::Relaxed) {
        match retry(|| rustix::fs::statx(dir, name, flags, statx_mask())) {
            Err(Errno::NOSYS) => NO_STATX.store(true, Ordering::Relaxed),
            other => return other.map(|x| Meta::from_statx(&x)),
        }
    }
    retry(|| rustix::fs::statat(dir, name, flags)).map(|st| Meta::from_stat(&st))
}

/// `fstat(fd)` (as `statx(fd, "", AT_EMPTY_PATH)`).
pub fn stat_fd(fd: BorrowedFd<'_>) -> Result<Meta, Errno> {
    stat(fd, c"", AtFlags::EMPTY_PATH | AtFlags::SYMLINK_NOFOLLOW)
}

/// A directory's change and modification times (seconds, nanoseconds): what a resume
/// checkpoint seals its records with.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Times {
    pub ctime: (i64, u32),
    pub mtime: (i64, u32),
}

/// `fstat(fd)` with the change and modification times: the same single `statx` as [`stat_fd`],
/// asking for two more fields.
// `st_ctime_nsec` is i64 here but another width on some targets.
#[allow(clippy::unnecessary_cast)]
pub fn stat_fd_times(fd: BorrowedFd<'_>) -> Result<(Meta, Times), Errno> {
    stat_times(fd, c"", AtFlags::EMPTY_PATH | AtFlags::SYMLINK_NOFOLLOW)
}

/// `fstatat(dir, name, AT_SYMLINK_NOFOLLOW)` with the change and modification times.
pub fn stat_at_times(dir: BorrowedFd<'_>, name: &CStr) -> Result<(Meta, Times), Errno> {
    stat_times(dir, name, AtFlags::SYMLINK_NOFOLLOW)
}

#[allow(clippy::unnecessary_cast)]
fn stat_times(fd: BorrowedFd<'_>, name: &CStr, flags: AtFlags) -> Result<(Meta, Times), Errno> {
    if !NO_STATX.load(Ordering::Relaxed) {
        let mask = statx_mask() | StatxFlags::CTIME | StatxFlags::MTIME;
        match retry(|| rustix::fs::statx(fd, name, flags, mask)) {
            Err(Errno::NOSYS) => NO_STATX.store(true, Ordering::Relaxed),
            other => {
                return other.map(|x| {
                    let t = |s: rustix::fs::StatxTimestamp| (s.tv_sec, s.tv_nsec);
                    (Meta::from_statx(&x), Times { ctime: t(x.stx_ctime), mtime: t(x.stx_mtime) })
                });
            }
        }
    }
    let st = retry(|| rustix::fs::statat(fd, name, flags))?;
    let times = Times {
        ctime: (st.st_ctime as i64, st.st_ctime_nsec as u32),
        mtime: (st.st_mtime as i64, st.st_mtime_nsec as u32),
    };
    Ok((Meta::from_stat(&st), times))
}

/// `fstatat(dir, name, AT_SYMLINK_NOFOLLOW)`: lstat relative to a directory fd (as `statx`).
pub fn stat_at(dir: BorrowedFd<'_>, name: &CStr) -> Result<Meta, Errno> {
    stat(dir, name, AtFlags::SYMLINK_NOFOLLOW)
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
    retry(|| rustix::fs::chownat(fd, c"", uid, gid, AtFlags::EMPTY_PATH))
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

/// Reads a directory in fixed-size `getdents64` batches, from the start (`from` 0) or from
/// position `from`, calling `each(name, d_type, d_ino)` for every entry but `.` and `..` whose
/// position is below `until` (`u64::MAX`: all). Memory is the caller's buffer, whatever the
/// directory's size. A read of everything from 0 expects a fresh fd (no `lseek`, one syscall
/// per directory less); any other read seeks first.
///
/// Returns the position right after `..` when a read from the start found `.` first, at
/// position 0 and ending at 1, then `..` (see [`DOTS_FIRST_FS`]); `None` otherwise.
pub fn read_dir(
    dir: BorrowedFd<'_>,
    buf: &mut [MaybeUninit<u8>],
    from: u64,
    until: u64,
    mut each: impl FnMut(&CStr, DType, u64),
) -> Result<Option<u64>, Errno> {
    if from != 0 || until != u64::MAX {
        rustix::fs::seek(dir, rustix::fs::SeekFrom::Start(from))?;
    }
    let mut raw = RawDir::new(dir, buf);
    // How the read began: 0 nothing yet, 1 `.` ending at position 1, 2 then `..` (done), 3 else.
    let (mut began, mut dots_end) = (if from == 0 { 0 } else { 3 }, None);
    // The position of the next entry (where a read from `from` finds it).
    let mut at = from;
    while let Some(entry) = raw.next() {
        let entry = match entry {
            Ok(e) => e,
            Err(Errno::INTR) => continue,
            Err(e) => return Err(e),
        };
        if at >= until {
            break;
        }
        at = entry.next_entry_cookie();
        let name = entry.file_name();
        let bytes = name.to_bytes();
        began = match (began, bytes) {
            (0, b".") if entry.next_entry_cookie() == 1 => 1,
            (1, b"..") => {
                dots_end = Some(entry.next_entry_cookie());
                2
            }
            (0 | 1, _) => 3,
            (b, _) => b,
        };
        if bytes == b"." || bytes == b".." {
            continue;
        }
        let t = entry.file_type();
        let dtype = if t == FileType::Directory {
            DType::Dir
        } else if t == FileType::Unknown {
            DType::Unknown
        } else {
            DType::Other
        };
        each(name, dtype, entry.ino());
    }
    Ok(dots_end)
}

/// The filesystem (as `/proc/self/mountinfo` names it) whose directories list `.` at position 0
/// and `..` at 1, and every other entry at a position of at least 2: ceph-fuse, whose readdir
/// positions carry a fragment or hash in their high bits and an index from 2 in their low ones
/// (the client's `dir_result_t`). Its `.` and `..` each cost a `getattr` round trip to the MDS
/// (forced: it asks for recursive stats), two per directory, which a read from position 2
/// does not make. The walk reads from 2 only on such a mount, and only after the volume root,
/// read from the start, showed exactly that layout (see `walk`).
pub const DOTS_FIRST_FS: &str = "fuse.ceph-fuse";

/// The filesystem type of the mount with id `mnt_id` (`statx` `STATX_MNT_ID`) as
/// `/proc/self/mountinfo` names it (`ext4`, `fuse.ceph-fuse`, …); `None` when not listed.
pub fn mount_fs_type(mnt_id: u64) -> Option<String> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    mountinfo_fs_type(&text, mnt_id)
}

/// The filesystem type of mount `mnt_id` in the text of a mountinfo file ("ID PARENT MAJ:MIN
/// ROOT POINT OPTIONS [TAGS…] - TYPE SOURCE SUPER-OPTIONS").
fn mountinfo_fs_type(text: &str, mnt_id: u64) -> Option<String> {
    text.lines().find_map(|line| {
        let id: u64 = line.split(' ').next()?.parse().ok()?;
        (id == mnt_id).then(|| line.split_once(" - ")?.1.split(' ').next().map(str::to_string)).flatten()
    })
}

/// What `getdents` said about an entry's type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DType {
    Dir,
    Other,
    /// The filesystem does not fill `d_type`: stat to know.
    Unknown,
}

/// Raises the soft open-file limit to the hard limit: a deep tree keeps one fd per directory
/// on the path being walked.
pub fn raise_fd_limit() {
    let lim = rustix::process::getrlimit(rustix::process::Resource::Nofile);
    if let Some(max) = lim.maximum {
        let _ = rustix::process::setrlimit(
            rustix::process::Resource::Nofile,
            rustix::process::Rlimit { current: Some(max), maximum: Some(max) },
        );
    }
}

/// `geteuid()`: the user whose entries an unprivileged pass may change.
pub fn euid() -> u32 {
    rustix::process::geteuid().as_raw()
}

/// `getegid()` and `getgroups()`: the groups this process may give its own entries, sorted.
pub fn groups() -> Vec<u32> {
    let mut out: Vec<u32> = rustix::process::getgroups().unwrap_or_default().iter().map(|g| g.as_raw()).collect();
    out.push(rustix::process::getegid().as_raw());
    out.sort_unstable();
    out.dedup();
    out
}

/// The uid an owner that is not mapped in this user namespace reads as
/// (`/proc/sys/kernel/overflowuid`; 65534, the kernel's default, when that is unreadable).
pub fn overflow_uid() -> u32 {
    std::fs::read_to_string("/proc/sys/kernel/overflowuid").ok().and_then(|s| s.trim().parse().ok()).unwrap_or(65534)
}

/// The soft open-file limit (`u64::MAX` when unlimited).
pub fn fd_limit() -> u64 {
    rustix::process::getrlimit(rustix::process::Resource::Nofile).current.unwrap_or(u64::MAX)
}

/// Borrow helper so callers can pass `&OwnedFd` or a borrowed fd alike.
pub fn fd<F: AsFd>(f: &F) -> BorrowedFd<'_> {
    f.as_fd()
}

fn retry<T>(mut f: impl FnMut() -> Result<T, Errno>) -> Result<T, Errno> {
    loop {
        match f() {
            Err(Errno::INTR) => continue,
            other => return other,
        }
    }
}

/// `fgetxattr(fd, name)`: `Ok(None)` when the attribute is absent (ENODATA).
/// ENOTSUP/EOPNOTSUPP (no xattr support, e.g. ramfs) is returned as an error for the caller.
pub fn get_xattr(fd: BorrowedFd<'_>, name: &CStr) -> Result<Option<Vec<u8>>, Errno> {
    let mut buf = vec![0u8; 4096];
    loop {
        match retry(|| rustix::fs::fgetxattr(fd, name, &mut buf[..])) {
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

/// The filesystem's name, from `fstatfs`'s magic number ("0x..." when unknown).
pub fn fs_type(fd: BorrowedFd<'_>) -> String {
    match rustix::fs::fstatfs(fd) {
        Ok(st) => fs_name(st.f_type),
        Err(_) => "unknown".to_string(),
    }
}

/// The filesystem's name (from `fstatfs`'s magic number) and, when `fd` is the root of its
/// mount, the inodes in use (`fstatvfs`): an estimate of the entries a walk will meet.
pub fn fs_info(fd: BorrowedFd<'_>) -> (String, Option<u64>) {
    let name = fs_type(fd);
    let is_mount_root = rustix::fs::statx(fd, c"", AtFlags::EMPTY_PATH, rustix::fs::StatxFlags::empty())
        .ok()
        .filter(|x| x.stx_attributes_mask.contains(rustix::fs::StatxAttributes::MOUNT_ROOT))
        .is_some_and(|x| x.stx_attributes.contains(rustix::fs::StatxAttributes::MOUNT_ROOT));
    let estimate = is_mount_root
        .then(|| rustix::fs::fstatvfs(fd).ok())
        .flatten()
        .map(|v| v.f_files.saturating_sub(v.f_ffree))
        .filter(|&n| n > 0);
    (name, estimate)
}

/// Whether the filesystem at `path` (`statfs`, which follows a symlink: only a hint) is a
/// network or FUSE filesystem, where requests are round trips (see `options::resolve_threads`).
pub fn is_remote_fs(path: &Path) -> bool {
    rustix::fs::statfs(path).is_ok_and(|st| {
        matches!(
            st.f_type,
            0x6969 // nfs
                | 0x00C3_6400 // ceph
                | 0x6573_5546 // fuse (ceph-fuse, s3fs, gcsfuse, glusterfs, …)
                | 0xFF53_4D42 // cifs
                | 0xFE53_4D42 // smb2
                | 0x0102_1997 // v9fs
                | 0x6B41_4653 // afs
                | 0x0BD0_0BD0 // lustre
                | 0x4750_4653 // gpfs
                | 0x0116_1970 // gfs2
                | 0x7461_636F // ocfs2
        )
    })
}

fn fs_name(magic: i64) -> String {
    match magic {
        0xEF53 => "ext4",
        0x5846_5342 => "xfs",
        0x9123_683E => "btrfs",
        0x0102_1994 => "tmpfs",
        0x8584_58f6 => "ramfs",
        0x6969 => "nfs",
        0x00C3_6400 => "ceph",
        0x794C_7630 => "overlay",
        0x6573_5546 => "fuse",
        0x2FC1_2FC1 => "zfs",
        0xFF53_4D42 => "cifs",
        0x0102_1997 => "v9fs",
        0x7366_7173 => "squashfs",
        0x4244 => "hfs",
        0x9FA0 => "proc",
        0x6265_6572 => "sysfs",
        0x0027_E0EB => "cgroup",
        0x6367_7270 => "cgroup2",
        0x1CD1 => "devpts",
        0x6462_6720 => "debugfs",
        0x7472_6163 => "tracefs",
        0x7363_6673 => "securityfs",
        0xCAFE_4A11 => "bpf",
        0x6165_676C => "pstore",
        0xDE5E_81E4 => "efivarfs",
        0x6265_6570 => "configfs",
        0x4249_4E4D => "binfmt_misc",
        0x6573_5543 => "fusectl",
        0x1980_0202 => "mqueue",
        _ => return format!("0x{magic:x}"),
    }
    .to_string()
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

/// The first entry of a directory but `.` and `..`, if any (`dir` freshly opened).
pub fn first_entry(dir: BorrowedFd<'_>) -> Result<Option<Vec<u8>>, Errno> {
    let mut buf = vec![MaybeUninit::<u8>::uninit(); 4096];
    let mut first = None;
    read_dir(dir, &mut buf, 0, u64::MAX, |name, _, _| {
        first.get_or_insert_with(|| name.to_bytes().to_vec());
    })?;
    Ok(first)
}

/// `getrandom(buf, 8, 0)`: 64 unpredictable bits from the kernel.
pub fn random_u64() -> Result<u64, Errno> {
    let mut buf = [0u8; 8];
    let mut got = 0;
    while got < buf.len() {
        // SAFETY: writes at most `len - got` bytes into the rest of `buf`.
        let n = unsafe { libc::getrandom(buf[got..].as_mut_ptr().cast(), buf.len() - got, 0) };
        match n {
            n if n > 0 => got += n as usize,
            _ => match std::io::Error::last_os_error().raw_os_error() {
                Some(libc::EINTR) => continue,
                e => return Err(Errno::from_raw_os_error(e.unwrap_or(libc::EIO))),
            },
        }
    }
    Ok(u64::from_ne_bytes(buf))
}

/// Processes holding a lock on the inode `fd` refers to, from `/proc/locks`: their pid (0 when
/// the holder is not visible from this pid namespace) and command name, when known. Empty when
/// no holder is listed (on a network filesystem, a holder on another node never is).
pub fn lock_holders(fd: BorrowedFd<'_>) -> Vec<(u32, Option<String>)> {
    let Ok(st) = rustix::fs::fstat(fd) else { return Vec::new() };
    let Ok(locks) = std::fs::read_to_string("/proc/locks") else { return Vec::new() };
    let (major, minor) = (rustix::fs::major(st.st_dev), rustix::fs::minor(st.st_dev));
    let mut out: Vec<(u32, Option<String>)> = Vec::new();
    for pid in locks.lines().filter_map(|l| lock_line_holder(l, major, minor, st.st_ino)) {
        if !out.iter().any(|(p, _)| *p == pid) {
            let name = (pid != 0)
                .then(|| std::fs::read_to_string(format!("/proc/{pid}/comm")).ok())
                .flatten()
                .map(|c| c.trim().to_string());
            out.push((pid, name));
        }
    }
    out
}

/// The pid of a `/proc/locks` line (`1: FLOCK  ADVISORY  WRITE 4242 08:01:1234 0 EOF`) when it
/// holds (not waits for: `->`) a lock on inode `ino` of device `major:minor` (hex in the file).
fn lock_line_holder(line: &str, major: u32, minor: u32, ino: u64) -> Option<u32> {
    let fields: Vec<&str> = line.split_whitespace().collect();
    if fields.get(1) == Some(&"->") || fields.len() < 6 {
        return None;
    }
    let mut id = fields[5].split(':');
    let (ma, mi, i) = (id.next()?, id.next()?, id.next()?);
    let same = u32::from_str_radix(ma, 16).ok()? == major
        && u32::from_str_radix(mi, 16).ok()? == minor
        && i.parse::<u64>().ok()? == ino;
    same.then(|| fields[4].parse().ok()).flatten()
}

/// The signal (SIGTERM, SIGINT) that asked this process to stop, 0 while none did.
static TERMINATION: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_termination(sig: libc::c_int) {
    // Async-signal-safe: one atomic store.
    TERMINATION.store(sig, Ordering::SeqCst);
}

/// Catches SIGTERM and SIGINT: the first one sets a flag that a pass polls to stop its walk and
/// save its state (the kubelet's grace period); a second one ends the process as usual.
pub fn catch_termination() {
    for sig in [libc::SIGTERM, libc::SIGINT] {
        // SAFETY: a handler that only stores to an atomic; sigaction with a zeroed, filled-in struct.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_termination as extern "C" fn(libc::c_int) as libc::sighandler_t;
            sa.sa_flags = libc::SA_RESTART | libc::SA_RESETHAND;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(sig, &sa, std::ptr::null_mut());
        }
    }
}

/// Sends `sig` to this process (`kill(getpid(), sig)`): the test hook of
/// `progress::arm_kill_point`.
pub fn signal_self(sig: libc::c_int) {
    // raise(3) directs the signal at this thread, which runs the handler before raise returns;
    // kill(getpid()) may hand it to another thread, later: the caller would then go on as if no
    // signal had come (a walk finishing right after it would not see its flag).
    // SAFETY: raise(3) with a plain signal number.
    unsafe {
        libc::raise(sig);
    }
}

/// The signal that asked this process to stop, if one did (only SIGINT and SIGTERM are caught).
pub fn termination() -> Option<crate::state::Stop> {
    match TERMINATION.load(Ordering::SeqCst) {
        0 => None,
        libc::SIGINT => Some(crate::state::Stop::Int),
        _ => Some(crate::state::Stop::Term),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_names_the_filesystem_of_a_mount_id() {
        let text = "\
27 1 253:0 / / rw,relatime shared:1 - ext4 /dev/vda rw
46 27 0:40 / /tmp/x/ceph/mnt rw,nosuid,nodev,relatime - fuse.ceph-fuse ceph-fuse rw,user_id=0,group_id=0
470 27 0:41 / /a\\040b rw shared:5 master:2 - tmpfs tmpfs rw
";
        assert_eq!(mountinfo_fs_type(text, 46).as_deref(), Some(DOTS_FIRST_FS));
        assert_eq!(mountinfo_fs_type(text, 27).as_deref(), Some("ext4"));
        assert_eq!(mountinfo_fs_type(text, 470).as_deref(), Some("tmpfs"));
        assert_eq!(mountinfo_fs_type(text, 4), None);
    }

    #[test]
    fn a_directory_read_from_the_start_tells_where_its_dots_end() {
        let t = tempfile::tempdir().unwrap();
        for n in ["a", "b", "c"] {
            std::fs::write(t.path().join(n), b"").unwrap();
        }
        let fd = open_root(t.path()).unwrap();
        let mut buf = vec![MaybeUninit::<u8>::uninit(); 4096];
        let mut names = Vec::new();
        let end = read_dir(fd.as_fd(), &mut buf, 0, u64::MAX, |n, _, _| names.push(n.to_bytes().to_vec())).unwrap();
        names.sort();
        assert_eq!(names, [b"a".to_vec(), b"b".to_vec(), b"c".to_vec()], "no dots");
        // Whatever this filesystem's layout, reading again from where it said the dots end
        // lists the same names; a read from elsewhere reports no dots.
        if let Some(end) = end {
            let fd = open_root(t.path()).unwrap();
            let mut again = Vec::new();
            assert_eq!(
                read_dir(fd.as_fd(), &mut buf, end, u64::MAX, |n, _, _| again.push(n.to_bytes().to_vec())),
                Ok(None)
            );
            again.sort();
            assert_eq!(again, names);
            // Below where the dots end there is nothing but the dots.
            let mut below = 0;
            assert_eq!(read_dir(fd.as_fd(), &mut buf, 0, end, |_, _, _| below += 1), Ok(Some(end)));
            assert_eq!(below, 0);
        }
        // A bounded read seeks first (the fd is at the end here) and stops at its bound.
        let mut none = 0;
        read_dir(fd.as_fd(), &mut buf, 0, 0, |_, _, _| none += 1).unwrap();
        assert_eq!(none, 0);
        let mut all = Vec::new();
        read_dir(fd.as_fd(), &mut buf, 0, u64::MAX - 1, |n, _, _| all.push(n.to_bytes().to_vec())).unwrap();
        all.sort();
        assert_eq!(all, names, "a read bounded past every position sees every entry again");
    }

    #[test]
    fn proc_locks_lines() {
        let held = "1: FLOCK  ADVISORY  WRITE 4242 08:01:1234 0 EOF";
        assert_eq!(lock_line_holder(held, 8, 1, 1234), Some(4242));
        assert_eq!(lock_line_holder(held, 8, 1, 1235), None);
        assert_eq!(lock_line_holder(held, 8, 2, 1234), None);
        assert_eq!(lock_line_holder("2: POSIX  ADVISORY  WRITE 7 fd:1a:99 0 EOF", 0xfd, 0x1a, 99), Some(7));
        assert_eq!(lock_line_holder("1: -> FLOCK  ADVISORY  WRITE 5 08:01:1234 0 EOF", 8, 1, 1234), None);
        assert_eq!(lock_line_holder("garbage", 8, 1, 1234), None);
    }
}
