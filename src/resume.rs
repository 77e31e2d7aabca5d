//! Resume state of one `apply`: what an interrupted run had finished, what this run has finished
//! so far (the checkpoint written to the root now and then), and the repair of files that a
//! killed run left between chown and chmod.

use std::collections::HashSet;
use std::ffi::OsStr;
use std::os::fd::BorrowedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use rustix::io::Errno;
use tracing::warn;

use crate::error::{Op, errno_text};
use crate::escape::{Escaped, escape_bytes};
use crate::marker::{self, Checkpoint};
use crate::spec::Spec;
use crate::sys::{self, Kind};

/// Resume bookkeeping of an `apply` on a filesystem with xattrs.
pub struct Resume<'a> {
    root: BorrowedFd<'a>,
    /// What the interrupted run had finished: these top-level subtrees are not read again.
    pub previous: Option<Checkpoint>,
    /// What this run has finished so far, written to the root now and then.
    current: Mutex<(Checkpoint, Instant)>,
    /// How often `current` is written to the root, at most.
    every: Duration,
    /// Top-level directories (by inode) with an error somewhere inside: not finished.
    tainted: Mutex<HashSet<u64>>,
}

impl<'a> Resume<'a> {
    pub fn new(root: BorrowedFd<'a>, previous: Option<Checkpoint>, run: &str, digest: &str, every: Duration) -> Self {
        let mut current = Checkpoint::new(run, digest);
        if let Some(p) = &previous {
            current.done = p.done.clone();
            current.pending = p.pending.clone();
        }
        Resume {
            root,
            previous,
            current: Mutex::new((current, Instant::now())),
            every,
            tainted: Mutex::new(HashSet::new()),
        }
    }

    /// The checkpoint as it stands (for the final write).
    pub fn snapshot(&self) -> Checkpoint {
        self.current.lock().unwrap_or_else(|e| e.into_inner()).0.clone()
    }

    /// Whether the interrupted run finished the top-level subtree `name` (inode `ino`).
    pub fn was_done(&self, ino: u64, name: &str) -> bool {
        self.previous.as_ref().is_some_and(|p| p.is_done(ino, name))
    }

    /// Marks the top-level directory `ino` as holding an error: it is never recorded finished.
    pub fn taint(&self, top_ino: u64) {
        self.tainted.lock().unwrap_or_else(|e| e.into_inner()).insert(top_ino);
    }

    /// Records the top-level subtree `name` as finished, unless an error was seen inside it.
    /// The checkpoint is written when the interval has passed.
    pub fn finished_top(&self, ino: u64, name: String) -> Result<(), Errno> {
        if self.tainted.lock().unwrap_or_else(|e| e.into_inner()).contains(&ino) {
            return Ok(());
        }
        self.update(false, |c| {
            c.add_done(ino, name);
        })
    }

    /// Records (and writes at once) the mode a setuid/setgid file must get back if this run is
    /// killed between its chown and chmod.
    pub fn stage_pending(&self, record: (String, u64, u32)) -> Result<(), Errno> {
        self.update(true, |c| c.pending.push(record))
    }

    /// Replaces the pending records taken over from the interrupted run with those still needed
    /// (see [`Restored::kept`]); written out with the next checkpoint.
    pub fn keep_pending(&self, kept: Vec<(String, u64, u32)>) {
        self.current.lock().unwrap_or_else(|e| e.into_inner()).0.pending = kept;
    }

    /// Drops a pending record (written out with the next checkpoint).
    pub fn forget_pending(&self, record: &(String, u64, u32)) {
        self.current.lock().unwrap_or_else(|e| e.into_inner()).0.pending.retain(|p| p != record);
    }

    fn update(&self, force: bool, f: impl FnOnce(&mut Checkpoint)) -> Result<(), Errno> {
        let mut guard = self.current.lock().unwrap_or_else(|e| e.into_inner());
        f(&mut guard.0);
        if force || guard.1.elapsed() >= self.every {
            guard.1 = Instant::now();
            return marker::write_checkpoint(self.root, &guard.0);
        }
        Ok(())
    }
}

/// What became of the special-bit records of an interrupted run (see [`restore_pending`]).
#[derive(Debug, Default)]
pub struct Restored {
    /// Failed syscalls: full path, operation, errno.
    pub failed: Vec<(PathBuf, Op, Errno)>,
    /// Bits not restored on the word of the record: full path, what to tell a person.
    pub refused: Vec<(PathBuf, String)>,
    /// Files whose bits were (or, in a dry run, would be) restored.
    pub restored: u64,
    /// The records still needed (refused or failed): kept in the checkpoint until settled.
    pub kept: Vec<(String, u64, u32)>,
}

/// Repairs files left between chown and chmod by a killed run (the checkpoint's `pending`); a
/// `dry_run` (`check`) changes nothing and only counts and reports. Paths are under `root_path`.
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
    pending: &[(String, u64, u32)],
    spec: &Spec,
    dry_run: bool,
) -> Restored {
    let mut out = Restored::default();
    for record in pending {
        let (rel, ino, mode) = record;
        let shown = escape_bytes(rel.as_bytes());
        let dropped = |why: &str| warn!(record = %shown, "dropped a special-bit record of an interrupted pass: {why}");
        let Some(rel_bytes) = crate::escape::unescape(rel) else {
            dropped("it does not parse");
            continue;
        };
        let rel_path = PathBuf::from(OsStr::from_bytes(&rel_bytes));
        let full = root_path.join(&rel_path);
        let pinned = match sys::pin_beneath(root, &rel_path) {
            Ok(fd) => fd,
            Err(Errno::NOENT) => continue,
            Err(e) => {
                dropped(&format!(
                    "it names no entry below the volume root without crossing a symlink or mount: {}",
                    errno_text(e.raw_os_error())
                ));
                continue;
            }
        };
        let Ok(now) = sys::stat_fd(sys::fd(&pinned)) else {
            continue;
        };
        if now.ino != *ino || now.kind() != Kind::File {
            dropped("the entry there now is not the regular file (inode) it names");
            continue;
        }
        let lost = mode & (libc::S_ISUID | libc::S_ISGID) & !now.perm();
        let mut grant = 0;
        if lost & libc::S_ISGID != 0 && spec.gid() == Some(now.gid) {
            grant |= libc::S_ISGID;
        }
        if lost & libc::S_ISUID != 0 && spec.uid() == Some(now.uid) {
            grant |= libc::S_ISUID;
        }
        let mut keep = false;
        if grant != 0 && dry_run {
            out.restored += 1;
        } else if grant != 0 {
            match sys::chmod_fd(sys::fd(&pinned), now.perm() | grant) {
                Ok(()) => {
                    out.restored += 1;
                    warn!(path = %Escaped(full.as_os_str()), "restored special bits lost by an interrupted pass ({:04o})", now.perm() | grant)
                }
                Err(e) => {
                    out.failed.push((full.clone(), Op::Chmod, e));
                    keep = true;
                }
            }
        }
        let refused = lost & !grant;
        if refused != 0 {
            out.refused.push((full.clone(), refused_text(&full, refused)));
            keep = true;
        }
        if keep {
            out.kept.push(record.clone());
        }
    }
    out
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
