//! Paths the operator names (volume roots, system directories), resolved from `/` or the working directory.

use std::ffi::OsStr;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use rustix::fs::AtFlags;
use rustix::io::Errno;

use super::stat::stat;
use super::{Kind, Meta, open_root, open_root_nofollow, open_subdir, stat_at};

/// Where [`open_dir_no_symlinks`] stopped: at a symlink, or at a component it could not open;
/// `at` is the component's path (the prefix of the path given).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Blocked {
    Symlink { at: PathBuf },
    Failed { at: PathBuf, errno: Errno },
}

/// Opens the directory `path` resolving every component without following a symlink (`..` is
/// taken as it is, after symlink-free components).
pub fn open_dir_no_symlinks(path: &Path) -> Result<OwnedFd, Blocked> {
    let start = if path.has_root() { "/" } else { "." };
    let mut so_far = PathBuf::from(start);
    let mut fd = open_root(Path::new(start)).map_err(|errno| Blocked::Failed { at: so_far.clone(), errno })?;
    for c in path.components() {
        let name = match c {
            Component::RootDir | Component::CurDir | Component::Prefix(_) => continue,
            Component::ParentDir => OsStr::new(".."),
            Component::Normal(n) => n,
        };
        so_far.push(name);
        let cname = std::ffi::CString::new(name.as_bytes())
            .map_err(|_| Blocked::Failed { at: so_far.clone(), errno: Errno::INVAL })?;
        fd = match open_subdir(fd.as_fd(), &cname) {
            Ok(next) => next,
            Err(errno @ (Errno::LOOP | Errno::NOTDIR)) => {
                let link = stat_at(fd.as_fd(), &cname).is_ok_and(|m| m.kind() == Kind::Symlink);
                return Err(if link { Blocked::Symlink { at: so_far } } else { Blocked::Failed { at: so_far, errno } });
            }
            Err(errno) => return Err(Blocked::Failed { at: so_far, errno }),
        };
    }
    Ok(fd)
}

/// Opens the directory `path` (a volume root the operator names), refusing a symlink at its last
/// component: `Blocked::Symlink`, told by an `lstat` after the open failed, never followed.
pub fn open_root_refusing_symlink(path: &Path) -> Result<OwnedFd, Blocked> {
    let at = || path.to_path_buf();
    match open_root_nofollow(path) {
        Ok(fd) => Ok(fd),
        Err(errno @ (Errno::LOOP | Errno::NOTDIR)) => {
            let c = std::ffi::CString::new(path.as_os_str().as_bytes()).map_err(|_| Errno::INVAL);
            let link = c.and_then(|c| stat(rustix::fs::CWD, &c, AtFlags::SYMLINK_NOFOLLOW));
            if link.is_ok_and(|m| m.kind() == Kind::Symlink) {
                Err(Blocked::Symlink { at: at() })
            } else {
                Err(Blocked::Failed { at: at(), errno })
            }
        }
        Err(errno) => Err(Blocked::Failed { at: at(), errno }),
    }
}

/// `stat(path)`, following symlinks: for paths the operator names (volume roots, system
/// directories), never for entries inside a volume.
pub fn stat_path(path: &Path) -> Result<Meta, Errno> {
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).map_err(|_| Errno::INVAL)?;
    stat(rustix::fs::CWD, &c, AtFlags::empty())
}
