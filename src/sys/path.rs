//! Paths the operator names (volume roots, system directories), resolved from `/` or the working directory.

use std::ffi::OsStr;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use rustix::fs::AtFlags;
use rustix::io::Errno;

use super::stat::stat;
use super::{Kind, Meta, open_root, open_subdir, stat_at};

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
