//! The repair of the special bits a killed run left cleared between chown and chmod, on the word of its records.

use std::ffi::OsStr;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use rustix::io::Errno;
use tracing::warn;

use crate::error::{Op, errno_text};
use crate::escape::{Escaped, escape_bytes};
use crate::options::Mode;
use crate::spec::Spec;
use crate::special::SpecialRecord;
use crate::sys::{self, Kind, Meta};

/// What became of the special-bit records of an interrupted run (see [`restore_pending`]).
#[derive(Debug, Default)]
pub struct Restored {
    /// Failed syscalls.
    pub failed: Vec<RestoreFailed>,
    /// Bits not restored on the word of the record.
    pub refused: Vec<Refused>,
    /// Files whose bits were (or, in a dry run, would be) restored.
    pub restored: u64,
    /// The records still needed (refused or failed): kept in the checkpoint until settled.
    pub kept: Vec<SpecialRecord>,
}

/// A syscall that failed while restoring a file's special bits.
#[derive(Debug)]
pub struct RestoreFailed {
    /// The file's full path.
    pub path: PathBuf,
    pub op: Op,
    pub errno: Errno,
}

/// Special bits not restored on the word of a record the app could have written.
#[derive(Debug)]
pub struct Refused {
    /// The file's full path.
    pub path: PathBuf,
    /// What to tell a person: the cause and the command that settles it.
    pub text: String,
}

/// The regular file a record names, pinned: its fd, its metadata now and its full path.
struct Pinned {
    fd: OwnedFd,
    now: Meta,
    full: PathBuf,
}

/// Repairs files left between chown and chmod by a killed run (the checkpoint's `pending`);
/// `check` changes nothing and only counts and reports. Paths are under `root_path`.
///
/// The record lives on the root, which the app may write, so it is not trusted to grant more
/// than the app already has: setgid is restored (the file's group is the spec's group, which the
/// app holds), setuid only when the file's owner is the spec's `--owner`. A bit that can't be
/// restored safely is refused with the command that settles it, and its record kept until then.
/// A record that names no regular file below the root (it does not parse, climbs out, crosses a
/// mount or a symlink, or names another inode) is dropped with a warning naming it: never
/// carried on into every checkpoint.
pub fn restore_pending(
    root: BorrowedFd<'_>,
    root_path: &Path,
    pending: &[SpecialRecord],
    spec: &Spec,
    mode: Mode,
) -> Restored {
    let mut out = Restored::default();
    for record in pending {
        let Some(Pinned { fd: pinned, now, full }) = pin_record(root, root_path, record) else {
            continue;
        };
        let lost = record.mode & (libc::S_ISUID | libc::S_ISGID) & !now.perm();
        let grant = grantable(lost, &now, spec);
        let mut keep = false;
        if grant != 0 && mode == Mode::Check {
            out.restored += 1;
        } else if grant != 0 {
            match sys::chmod_fd(sys::fd(&pinned), now.perm() | grant) {
                Ok(()) => {
                    out.restored += 1;
                    warn!(path = %Escaped(full.as_os_str()), "restored special bits lost by an interrupted pass ({:04o})", now.perm() | grant)
                }
                Err(errno) => {
                    out.failed.push(RestoreFailed { path: full.clone(), op: Op::Chmod, errno });
                    keep = true;
                }
            }
        }
        let refused = lost & !grant;
        if refused != 0 {
            out.refused.push(Refused { text: refused_text(&full, refused), path: full });
            keep = true;
        }
        if keep {
            out.kept.push(record.clone());
        }
    }
    out
}

/// The regular file `record` names below the root, pinned without crossing a symlink or mount,
/// with its metadata and full path; `None` when it is gone, or (with a warning) when the record
/// names no such file.
fn pin_record(root: BorrowedFd<'_>, root_path: &Path, record: &SpecialRecord) -> Option<Pinned> {
    let shown = escape_bytes(record.path.as_bytes());
    let dropped = |why: &str| warn!(record = %shown, "dropped a special-bit record of an interrupted pass: {why}");
    let Some(rel_bytes) = crate::escape::unescape(&record.path) else {
        dropped("it does not parse");
        return None;
    };
    let rel_path = PathBuf::from(OsStr::from_bytes(&rel_bytes));
    let pinned = match sys::pin_beneath(root, &rel_path) {
        Ok(fd) => fd,
        Err(Errno::NOENT) => return None,
        Err(e) => {
            dropped(&format!(
                "it names no entry below the volume root without crossing a symlink or mount: {}",
                errno_text(e.raw_os_error())
            ));
            return None;
        }
    };
    let now = sys::stat_fd(sys::fd(&pinned)).ok()?;
    if now.ino != record.ino || now.kind() != Kind::File {
        dropped("the entry there now is not the regular file (inode) it names");
        return None;
    }
    Some(Pinned { fd: pinned, now, full: root_path.join(&rel_path) })
}

/// Of the special bits `lost`, those a record may give back to the file `now`: setgid when its
/// group is the spec's, setuid when its owner is the spec's `--owner`.
fn grantable(lost: u32, now: &Meta, spec: &Spec) -> u32 {
    let mut grant = 0;
    if lost & libc::S_ISGID != 0 && spec.gid() == Some(now.gid) {
        grant |= libc::S_ISGID;
    }
    if lost & libc::S_ISUID != 0 && spec.uid() == Some(now.uid) {
        grant |= libc::S_ISUID;
    }
    grant
}

/// What to tell a person about special bits an interrupted pass cleared that volprep does not
/// restore on the word of a record the app could have written: the cause and the command.
fn refused_text(full: &Path, refused: u32) -> String {
    let (bits, who) = match (refused & libc::S_ISUID != 0, refused & libc::S_ISGID != 0) {
        (true, true) => ("setuid and setgid bits", "ug+s"),
        (true, false) => ("setuid bit", "u+s"),
        _ => ("setgid bit", "g+s"),
    };
    let path = Escaped(full.as_os_str()).to_string();
    let plain = path.bytes().all(|b| b.is_ascii_alphanumeric() || b"/._-+,:@".contains(&b));
    let word = if plain { path } else { format!("'{}'", path.replace('\'', "'\\''")) };
    format!(
        "{bits} cleared by an interrupted pass (killed between chown and chmod); not restored automatically, as the \
         record of it lies on the app-writable volume root: run `chmod {who} {word}` if the file should have it, or \
         `volprep apply --force` once to forget the record"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_names_the_bits_and_the_command() {
        let t = refused_text(Path::new("/v/bin/tool"), libc::S_ISUID);
        assert!(t.contains("setuid bit") && t.contains("`chmod u+s /v/bin/tool`"), "{t}");
        let t = refused_text(Path::new("/v/it's here"), libc::S_ISUID | libc::S_ISGID);
        assert!(t.contains("`chmod ug+s '/v/it'\\''s here'`"), "{t}");
    }
}
