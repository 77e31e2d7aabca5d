//! `--sticky PATH`: makes PATH a shared temp directory like `/tmp` (mode 01777, created if
//! missing, not recursive), refusing a PATH with a symlink anywhere in it.

use std::ffi::{CStr, CString, OsStr};
use std::os::fd::{BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::time::Instant;

use rustix::io::Errno;
use tracing::info;

use crate::error::{Error, Op};
use crate::escape::Escaped;
use crate::options::Mode;
use crate::report::{Action, StickyOutcome, VolumeReport};
use crate::spec::Spec;
use crate::sys::{self, Blocked, Kind};

/// The mode of a shared temp directory: everyone may create, only owners may remove (`/tmp`).
pub const TMP_MODE: u32 = 0o1777;

/// Prepares (or, in `check`, inspects) one sticky temp dir. Its parent must exist and is
/// reached without following any symlink; PATH itself is created if missing, and given the bits
/// 01777 when it lacks some. Other bits stay: the setgid an fsGroup pass gives directories (or
/// a setgid parent passes on) is kept, so a temp dir inside an `--fs-group` volume is 3777 and
/// stays so, run after run. Nothing below it is touched.
pub fn run(path: &Path, mode: Mode) -> Result<VolumeReport, Error> {
    let started = Instant::now();
    let (parent, name) = split(path)?;
    let parent_fd = open_parent(path, parent)?;
    let parent_fd = sys::fd(&parent_fd);
    let mut outcome = StickyOutcome { created: false, mode_before: None, mode_after: format!("{TMP_MODE:04o}") };
    let before = match existing(parent_fd, &name, path)? {
        Some(perm) => {
            outcome.mode_before = Some(format!("{perm:04o}"));
            Some(perm)
        }
        None if mode == Mode::Check => {
            outcome.created = true;
            None
        }
        None => {
            sys::mkdir_at(parent_fd, &name, TMP_MODE).map_err(|e| Error::sys(path, Op::Mkdir, e))?;
            outcome.created = true;
            None
        }
    };
    let needs_chmod = before.is_none_or(|p| p & TMP_MODE != TMP_MODE);
    let mut after = before.map_or(TMP_MODE, |p| p | TMP_MODE);
    if needs_chmod && mode == Mode::Apply {
        after = make_sticky(parent_fd, &name, path)?;
    }
    outcome.mode_after = format!("{after:04o}");
    let what = match (outcome.created, needs_chmod) {
        (true, _) => format!("created with mode {after:04o}"),
        (false, true) => format!("mode {} -> {after:04o}", outcome.mode_before.as_deref().unwrap_or("?")),
        (false, false) => format!("mode {after:04o} has 1777 already: no change"),
    };
    let verb = if mode == Mode::Check && needs_chmod { "would be " } else { "" };
    info!(path = %Escaped(path.as_os_str()), "sticky temp dir {}: {verb}{what}", Escaped(path.as_os_str()));
    let spec = Spec::default();
    let mut r = VolumeReport::empty(path, &spec, 1, if mode == Mode::Check { Action::Checked } else { Action::Sticky });
    r.spec = "sticky".into();
    r.reason = what;
    r.counts.entries = 1;
    r.counts.dirs = 1;
    r.counts.changed_mode = u64::from(needs_chmod);
    r.timing.elapsed_ms = started.elapsed().as_millis() as u64;
    r.sticky = Some(outcome);
    Ok(r)
}

/// The parent of PATH, reached without following any symlink.
fn open_parent(path: &Path, parent: &Path) -> Result<OwnedFd, Error> {
    sys::open_dir_no_symlinks(parent).map_err(|blocked| match blocked {
        Blocked::Symlink { at } => Error::StickyParentIsSymlink { at, path: path.to_path_buf() },
        Blocked::Failed { at, errno: Errno::NOTDIR } => Error::NotADirectory { path: at },
        Blocked::Failed { at, errno } => Error::sys(at, Op::Open, errno),
    })
}

/// The permission bits of the directory `name` of `parent` (`path`), `None` when it is missing;
/// a symlink or a non-directory there is refused.
fn existing(parent: BorrowedFd<'_>, name: &CStr, path: &Path) -> Result<Option<u32>, Error> {
    match sys::stat_at(parent, name) {
        Ok(m) if m.kind() == Kind::Symlink => Err(Error::StickyIsSymlink { path: path.to_path_buf() }),
        Ok(m) if m.kind() != Kind::Dir => Err(Error::NotADirectory { path: path.to_path_buf() }),
        Ok(m) => Ok(Some(m.perm())),
        Err(Errno::NOENT) => Ok(None),
        Err(e) => Err(Error::sys(path, Op::Stat, e)),
    }
}

/// Gives the directory `name` of `parent` the bits 01777 (keeping its others); returns its mode.
fn make_sticky(parent: BorrowedFd<'_>, name: &CStr, path: &Path) -> Result<u32, Error> {
    // Opened without following a symlink, then changed through the fd: the directory we
    // checked (or just made, whatever the umask did to its mode) is the one we change.
    let fd = sys::open_subdir(parent, name).map_err(|e| Error::sys(path, Op::Open, e))?;
    let now = sys::stat_fd(sys::fd(&fd)).map_err(|e| Error::sys(path, Op::Stat, e))?;
    let after = now.perm() | TMP_MODE;
    if after != now.perm() {
        sys::chmod_fd(sys::fd(&fd), after).map_err(|e| Error::sys(path, Op::Chmod, e))?;
    }
    Ok(after)
}

/// `/a/b/tmp` → (`/a/b`, `tmp`); refuses paths whose last component is `.`, `..` or empty.
fn split(path: &Path) -> Result<(&Path, CString), Error> {
    let name = path
        .file_name()
        .filter(|n| *n != OsStr::new(".."))
        .ok_or_else(|| Error::StickyNamesNoDir { path: path.to_path_buf() })?;
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let name = CString::new(name.as_bytes()).map_err(|_| Error::Usage("a path holds a NUL byte".into()))?;
    Ok((parent, name))
}
