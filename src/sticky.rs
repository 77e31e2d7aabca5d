//! `--sticky PATH`: makes PATH a shared temp directory like `/tmp` (mode 01777, created if
//! missing, not recursive), refusing a PATH that is a symlink.

use std::ffi::{CString, OsStr};
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
use crate::sys::{self, Kind};

/// The mode of a shared temp directory: everyone may create, only owners may remove (`/tmp`).
pub const TMP_MODE: u32 = 0o1777;

/// Prepares (or, in `check`, inspects) one sticky temp dir. Its parent must exist; PATH itself
/// is created if missing, and its mode set to 01777 if it differs. Nothing below it is touched.
pub fn run(path: &Path, mode: Mode) -> Result<VolumeReport, Error> {
    let started = Instant::now();
    let (parent, name) = split(path)?;
    let parent_fd = sys::open_root(parent).map_err(|e| match e {
        Errno::NOTDIR => Error::NotADirectory { path: parent.to_path_buf() },
        e => Error::sys(parent, Op::Open, e),
    })?;
    let parent_fd = sys::fd(&parent_fd);
    let mut outcome = StickyOutcome { created: false, mode_before: None, mode_after: format!("{TMP_MODE:04o}") };
    let meta = match sys::stat_at(parent_fd, &name) {
        Ok(m) => Some(m),
        Err(Errno::NOENT) => None,
        Err(e) => return Err(Error::sys(path, Op::Stat, e)),
    };
    match meta {
        Some(m) if m.kind() == Kind::Symlink => {
            return Err(Error::Other {
                path: path.to_path_buf(),
                msg: "is a symlink; refusing to make its target a shared temp dir".into(),
            });
        }
        Some(m) if m.kind() != Kind::Dir => {
            return Err(Error::NotADirectory { path: path.to_path_buf() });
        }
        Some(m) => outcome.mode_before = Some(format!("{:04o}", m.perm())),
        None if mode == Mode::Check => outcome.created = true,
        None => {
            sys::mkdir_at(parent_fd, &name, TMP_MODE).map_err(|e| Error::sys(path, Op::Mkdir, e))?;
            outcome.created = true;
        }
    }
    let needs_chmod = outcome.mode_before.as_deref() != Some("1777");
    if needs_chmod && mode == Mode::Apply {
        // Opened without following a symlink, then changed through the fd: the directory we
        // checked (or just made, whatever the umask did to its mode) is the one we change.
        let fd = sys::open_subdir(parent_fd, &name).map_err(|e| Error::sys(path, Op::Open, e))?;
        sys::chmod_fd(sys::fd(&fd), TMP_MODE).map_err(|e| Error::sys(path, Op::Chmod, e))?;
    }
    let what = match (outcome.created, needs_chmod) {
        (true, _) => "created with mode 1777".to_string(),
        (false, true) => format!("mode {} -> 1777", outcome.mode_before.as_deref().unwrap_or("?")),
        (false, false) => "already 1777: no change".to_string(),
    };
    let verb = if mode == Mode::Check && needs_chmod { "would be " } else { "" };
    info!(path = %Escaped(path.as_os_str()), "sticky temp dir {}: {verb}{what}", Escaped(path.as_os_str()));
    let spec = Spec { fs_group: None, owner_uid: None, owner_gid: None, read_only: false };
    let mut r = VolumeReport::empty(path, &spec, 1, if mode == Mode::Check { Action::Checked } else { Action::Sticky });
    r.spec = "sticky".into();
    r.reason = what;
    r.entries = 1;
    r.dirs = 1;
    r.changed_mode = u64::from(needs_chmod);
    r.elapsed_ms = started.elapsed().as_millis() as u64;
    r.sticky = Some(outcome);
    Ok(r)
}

/// `/a/b/tmp` → (`/a/b`, `tmp`); refuses paths whose last component is `.`, `..` or empty.
fn split(path: &Path) -> Result<(&Path, CString), Error> {
    let name = path.file_name().filter(|n| *n != OsStr::new("..")).ok_or_else(|| Error::Other {
        path: path.to_path_buf(),
        msg: "names no directory to make a temp dir of".into(),
    })?;
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let name = CString::new(name.as_bytes()).map_err(|_| Error::Usage("a path holds a NUL byte".into()))?;
    Ok((parent, name))
}
