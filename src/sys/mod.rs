//! The thin syscall layer: every syscall volprep makes, relative to a directory fd, never following a symlink.
//!
//! One file per job: `stat`, `fs` (opens, changes, xattrs), `dir` (listings), `path` (operator-named
//! paths), `proc` (mounts, locks, credentials, limits), `signal`, `fstype` (the filesystem table).

mod dir;
mod fs;
mod fstype;
mod path;
mod proc;
mod signal;
mod stat;

use std::os::fd::{AsFd, BorrowedFd};

use rustix::io::Errno;

pub use dir::{DType, DirReader, Place, first_entry, read_dir};
pub use fs::{
    Locked, acl_at, acl_fd, chmod_fd, chown_fd, create_new_at, create_output, get_xattr, list_xattrs, locked_at,
    mkdir_at, open_parent, open_root, open_root_nofollow, open_subdir, pin_at, pin_beneath, readlink_at, remove_xattr,
    reopen_file, set_xattr, symlink_at, try_lock, unlink_at,
};
pub use fstype::{FsInfo, fs_info, fs_type, storage};
pub use path::{Blocked, open_dir_no_symlinks, open_root_refusing_symlink, stat_path};
pub use proc::{
    LockHolder, Mapped, euid, fd_limit, groups, lock_holders, mount_fs_type, mount_name, mounts_below, process_alive,
    raise_fd_limit, random_u64,
};
pub use signal::{catch_termination, signal_self, termination};
pub use stat::{Devices, Kind, Meta, Times, stat_at, stat_at_times, stat_fd, stat_fd_times};

/// Borrow helper so callers can pass `&OwnedFd` or a borrowed fd alike.
pub fn fd<F: AsFd>(f: &F) -> BorrowedFd<'_> {
    f.as_fd()
}

/// Runs a syscall again while it fails with EINTR.
fn retry<T>(mut f: impl FnMut() -> Result<T, Errno>) -> Result<T, Errno> {
    loop {
        match f() {
            Err(Errno::INTR) => continue,
            other => return other,
        }
    }
}
