//! Entry metadata: one `statx` (`fstatat` where it is missing) relative to a directory fd, never following a link.

use std::ffi::CStr;
use std::os::fd::BorrowedFd;
use std::sync::atomic::{AtomicBool, Ordering};

use rustix::fs::{AtFlags, Statx, StatxFlags};
use rustix::io::Errno;

use super::retry;
use crate::throttle::{self, OpKind};

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

/// Which mounts below its root a walk goes on with (`--cross-devices`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Devices {
    /// Only the root's mount: an entry on another mount is not entered (nor handed over).
    RootOnly,
    /// Every mount below the root.
    Cross,
}

impl Devices {
    /// `Cross` when the `--cross-devices` flag is given, else `RootOnly`.
    pub fn from_flag(cross_devices: bool) -> Devices {
        if cross_devices { Devices::Cross } else { Devices::RootOnly }
    }
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

    /// Whether this entry is on another mount than `other`: another mount id where the kernel
    /// tells both, another device where it does not (before Linux 5.8). A btrfs subvolume, or a
    /// file of an overlayfs lower layer, has a device number of its own on the same mount: it is
    /// not another mount (the kubelet's walk goes into it too).
    pub fn other_mount(&self, other: &Meta) -> bool {
        if self.mnt_id != 0 && other.mnt_id != 0 { self.mnt_id != other.mnt_id } else { self.dev != other.dev }
    }

    /// Whether this entry is on the mount and the device of `root`: where inode numbers are
    /// those of the root's filesystem (not of a nested one, nor of a btrfs subvolume, whose
    /// snapshots share inode numbers, change times and link counts with their source), so that
    /// resume records may name it.
    pub fn on_root_fs(&self, root: &Meta) -> bool {
        !self.other_mount(root) && self.dev == root.dev
    }
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
pub(super) fn stat(dir: BorrowedFd<'_>, name: &CStr, flags: AtFlags) -> Result<Meta, Errno> {
    throttle::op(kind_of(name), || stat_now(dir, name, flags))
}

/// What the gate counts a stat of `name` as: a lookup, or (`""`) a stat of an open fd.
fn kind_of(name: &CStr) -> OpKind {
    if name.is_empty() { OpKind::Fstat } else { OpKind::Lookup }
}

fn stat_now(dir: BorrowedFd<'_>, name: &CStr, flags: AtFlags) -> Result<Meta, Errno> {
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

fn stat_times(fd: BorrowedFd<'_>, name: &CStr, flags: AtFlags) -> Result<(Meta, Times), Errno> {
    throttle::op(kind_of(name), || stat_times_now(fd, name, flags))
}

#[allow(clippy::unnecessary_cast)]
fn stat_times_now(fd: BorrowedFd<'_>, name: &CStr, flags: AtFlags) -> Result<(Meta, Times), Errno> {
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
