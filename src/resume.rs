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

use crate::error::Op;
use crate::escape::Escaped;
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

/// Repairs files left between chown and chmod by a killed run (the checkpoint's `pending`).
/// Returns the failures, each with the file's full path under `root_path`.
///
/// The record lives on the root, which the app may write, so it is not trusted to grant more
/// than the app already has: setgid is restored (the file's group is the spec's group, which the
/// app holds), setuid only when the file's owner is the spec's `--owner`. A setuid bit that can't
/// be restored safely is reported as an error naming the file, for a person to decide.
pub fn restore_pending(
    root: BorrowedFd<'_>,
    root_path: &Path,
    pending: &[(String, u64, u32)],
    spec: &Spec,
) -> Vec<(PathBuf, Op, Errno)> {
    let mut failed = Vec::new();
    for (rel, ino, mode) in pending {
        let Some(rel_bytes) = crate::escape::unescape(rel) else {
            continue;
        };
        let rel_path = PathBuf::from(OsStr::from_bytes(&rel_bytes));
        let full = root_path.join(&rel_path);
        let pinned = match sys::pin_beneath(root, &rel_path) {
            Ok(fd) => fd,
            Err(Errno::NOENT) => continue,
            Err(e) => {
                failed.push((full, Op::Open, e));
                continue;
            }
        };
        let Ok(now) = sys::stat_fd(sys::fd(&pinned)) else {
            continue;
        };
        if now.ino != *ino || now.kind() != Kind::File {
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
        if grant != 0 {
            match sys::chmod_fd(sys::fd(&pinned), now.perm() | grant) {
                Ok(()) => {
                    warn!(path = %Escaped(full.as_os_str()), "restored special bits lost by an interrupted pass ({:04o})", now.perm() | grant)
                }
                Err(e) => failed.push((full.clone(), Op::Chmod, e)),
            }
        }
        if lost & !grant != 0 {
            warn!(path = %Escaped(full.as_os_str()),
                  "an interrupted pass cleared this file's setuid bit; not restored automatically (the record is writable by the app): restore it with chmod u+s if intended");
            failed.push((full, Op::Chmod, Errno::PERM));
        }
    }
    failed
}
