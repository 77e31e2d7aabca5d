//! Parallel, dirfd-relative, post-order traversal of one filesystem. Knows nothing of ownership:
//! it hands entries to a [`Visitor`] and calls [`Visitor::dir_done`] once a directory's contents
//! are all visited (the root last).
//!
//! Each directory is a [`Node`] that holds its own fd (opened `O_NOFOLLOW|O_DIRECTORY` relative
//! to its parent's fd, kept within the fd budget of the [`Pool`] it is walked on by `node`, a
//! share of the process's open-file limit) and a count of unfinished work below it. Directories are read with `getdents64` into a fixed buffer;
//! subdirectories become rayon jobs (work-stealing, LIFO per thread, so the walk stays
//! depth-first and few fds are open), and other entries are handled in batches of names, stolen
//! by idle threads when there are any (`traverse`). No path is ever resolved. The visitor sees a
//! directory's fd only as a [`Dir`], borrowed from the lease that holds it open for the call.

mod listing;
mod name;
mod node;
mod stock;
mod traverse;

use std::ffi::{CStr, OsStr};
use std::os::fd::BorrowedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustix::io::Errno;

use crate::error::{Error, Op};
use crate::sys::Meta;
use crate::verify::Stamp;

use node::Fds;
pub use node::{Dir, Node, max_threads_for};
pub use stock::DIRENT_BUF;
pub use traverse::Walk;

/// What to do with a subdirectory (see [`Visitor::enter`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Descend {
    /// Read it and everything below it.
    Read,
    /// Neither read nor report it.
    Skip,
    /// It was finished by a run whose claim holds from this bound on (see `verify`): each
    /// directory of the subtree whose change time is before the bound, on the root's mount, has
    /// only its subdirectories looked at (and verified the same way), and is reported with
    /// [`Visitor::dir_verified`]; any other is read with everything below it, as by `Read`.
    Verify(Stamp),
}

/// What a visitor found an entry needed (see [`Visitor::entry`]): while entries need changes,
/// the walk pins the next ones of the same directory before reading them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Needed {
    /// It conformed (or was left as it is).
    Nothing,
    /// It needed a change (made, or tried).
    Change,
}

/// How a directory's listing is taken (see [`Node::contents`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Contents {
    /// Every entry is handed to the visitor.
    Read,
    /// Trusted (unchanged since the bound it is verified against): only its subdirectories are
    /// looked at; its other entries are counted ([`Visitor::listed`]).
    Verified,
}

/// Where a failure happened (see [`Visitor::error`]).
#[derive(Clone, Copy)]
pub enum At<'l> {
    /// The directory itself, which the walk may not hold open (no fd comes with it).
    Dir(&'l Node),
    /// An entry of the directory, which the walk holds open.
    Entry(Dir<'l>, &'l CStr),
}

impl<'l> At<'l> {
    /// The directory, or the entry's directory.
    pub fn dir(&self) -> &'l Node {
        match *self {
            At::Dir(node) => node,
            At::Entry(dir, _) => dir.node(),
        }
    }

    /// The path of the directory, or of the entry, relative to the walk's root.
    pub fn rel_path(&self) -> PathBuf {
        match *self {
            At::Dir(node) => node.rel_path(),
            At::Entry(dir, name) => rel_child(dir.node(), name),
        }
    }
}

/// What the walk tells its user. Called from many threads at once; each call about a directory
/// or one of its entries gets that directory as a [`Dir`], held open for the call.
pub trait Visitor: Sync {
    /// A non-directory entry, as an `lstat` of its name saw it (one on a mount the walk does not
    /// enter goes to [`Visitor::mount_skipped`] instead). Returns whether it needed a change:
    /// while entries do, the walk pins the next ones of the same directory before reading them
    /// ([`Visitor::pinned_entry`]).
    fn entry(&self, parent: &Dir<'_>, name: &CStr, meta: &Meta) -> Needed;
    /// A non-directory entry read through `pin`, an `O_PATH|O_NOFOLLOW` fd of it (nothing was
    /// opened: no device, FIFO or socket; a symlink is the link itself), whose own `fstat` is
    /// `meta`, on the walk's mount. The pin is closed after the call. Returns as
    /// [`Visitor::entry`] does (by default, that is what is called).
    fn pinned_entry(&self, parent: &Dir<'_>, name: &CStr, meta: &Meta, _pin: BorrowedFd<'_>) -> Needed {
        self.entry(parent, name, meta)
    }
    /// A directory all of whose contents were visited; called before its parent's.
    fn dir_done(&self, dir: &Dir<'_>);
    /// An entry on another mount (a nested filesystem, or a bind mount of a directory or file,
    /// of the same filesystem or not): not entered, not handed to [`Visitor::entry`].
    fn mount_skipped(&self, parent: &Dir<'_>, name: &CStr, meta: &Meta);
    /// An entry on another mount than `parent` that the walk goes on with (`--cross-devices`):
    /// a directory it enters or another entry it hands over next. What the mount hides below
    /// its name is not walked (see [`Visitor::mount_skipped`] for the ones it does not enter).
    fn mount_crossed(&self, _parent: &Dir<'_>, _name: &CStr, _meta: &Meta) {}
    /// A directory that holds nothing and takes no change: btrfs's stand-in for a subvolume
    /// that a snapshot did not include (inode 2: empty, read-only, its chown and chmod succeed
    /// and change nothing). Neither entered nor handed over.
    fn placeholder(&self, _parent: &Dir<'_>, _name: &CStr, _meta: &Meta) {}
    /// Whether and how to enter the subdirectory `name` (inode `ino`, ordinal `ord`: see
    /// [`Node::ord`]) of `parent` (default: read it). A skipped subtree is neither read nor
    /// reported. Called while `parent` is being read, in `getdents` order for the typed ones.
    /// The walk does what it says: a subdirectory of a verified directory is verified only if
    /// this returns `Verify` (see [`Node::verified_against`]).
    fn enter(&self, _parent: &Dir<'_>, _name: &CStr, _ino: u64, _ord: Option<u32>) -> Descend {
        Descend::Read
    }
    /// A directory whose listing was trusted ([`Descend::Verify`]) was listed: `others` entries
    /// that are not directories, not handed over one by one.
    fn listed(&self, _dir: &Dir<'_>, _others: u64) {}
    /// A subdirectory `name` (ordinal `ord`) of `parent` verified without being opened: it has
    /// no subdirectories (a link count of 2 on a filesystem that counts them) and did not
    /// change (`meta` is its own `lstat`). Neither read nor reported otherwise.
    fn verified_leaf(&self, _parent: &Dir<'_>, _name: &CStr, _ord: Option<u32>, _meta: &Meta) {}
    /// A verified directory all of whose subdirectories were verified or visited; called before
    /// its parent's `dir_done` (or `dir_verified`), instead of `dir_done`.
    fn dir_verified(&self, _dir: &Dir<'_>) {}
    /// A directory is about to be read (counts `getdents` work).
    fn dir_read(&self, _dir: &Dir<'_>) {}
    /// Whether the walk must stop (SIGTERM): no directory is read or entered and no batch goes
    /// on once this is true, and no directory is reported done (its contents may be unvisited).
    fn stopped(&self) -> bool {
        false
    }
    /// A per-entry failure, or one of a directory itself (which may not be open then).
    fn error(&self, at: At<'_>, op: Op, errno: Errno);
}

/// The walk's worker threads, shared by every volume of a run and started only when a walk first
/// needs them: a volume whose marker lets it skip starts none.
pub struct Pool {
    threads: usize,
    /// Directory fds its walks keep open at most beyond those in use; by default what the
    /// open-file limit leaves once every thread has its share.
    fd_budget: Option<usize>,
    started: std::sync::OnceLock<Result<Threads, String>>,
}

/// A started [`Pool`]: its threads, and the fd budget every walk on them shares.
pub struct Threads {
    pool: rayon_core::ThreadPool,
    fds: Arc<Fds>,
}

impl Pool {
    /// A pool of `threads` threads, not started yet.
    pub fn new(threads: usize) -> Pool {
        Pool { threads, fd_budget: None, started: std::sync::OnceLock::new() }
    }

    /// Keeps at most `n` directory fds open beyond those in use.
    #[cfg(test)]
    pub fn with_fd_budget(self, n: usize) -> Pool {
        Pool { fd_budget: Some(n), ..self }
    }

    /// The started pool (started now on first call), to [`Walk::run`] on.
    pub fn start(&self) -> Result<&Threads, Error> {
        let threads = self.threads;
        let built = self.started.get_or_init(|| {
            let built = rayon_core::ThreadPoolBuilder::new()
                .num_threads(threads)
                .thread_name(|i| format!("volprep-{i}"))
                .build()
                .map_err(|e| e.to_string());
            if built.is_ok() {
                tracing::debug!(threads, "started {threads} walk threads");
            }
            let fds = match self.fd_budget {
                Some(n) => Fds::new(n),
                None => Fds::fitting(threads as u64),
            };
            built.map(|pool| Threads { pool, fds })
        });
        built.as_ref().map_err(|e| Error::Environment(format!("cannot start {threads} threads: {e}")))
    }

    /// Whether the threads were started.
    #[cfg(test)]
    pub fn started(&self) -> bool {
        self.started.get().is_some()
    }
}

/// The path of `name` in `dir`, relative to the root.
pub fn rel_child(dir: &Node, name: &CStr) -> PathBuf {
    dir.rel_path().join(OsStr::from_bytes(name.to_bytes()))
}

/// `root/rel`, or `root` itself for an empty `rel`.
pub fn full_path(root: &Path, rel: &Path) -> PathBuf {
    if rel.as_os_str().is_empty() { root.to_path_buf() } else { root.join(rel) }
}

#[cfg(test)]
mod tests;
