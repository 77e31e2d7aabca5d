//! The fd budget of a pool's walks ([`Fds`]): each directory [`Node`] holds its fd, kept open by
//! a [`Lease`] while used, closed while idle.
//!
//! A closed fd is re-opened when needed (never through a symlink, checked by device and inode).

use std::collections::VecDeque;
use std::ffi::OsStr;
use std::ops::Deref;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};

use rustix::io::Errno;

use super::Contents;
use super::name::Name;
use crate::sync::lock;
use crate::sys::{self, Meta, Times};
use crate::verify::{self, Stamp};

/// Descriptors kept aside for the process: stdio, the root and its marker and lock fds, logs.
pub const FD_RESERVE: u64 = 16;
/// Descriptors one walker thread may hold at once: the directory it reads, its parent while
/// opening it (or two while re-opening a closed ancestor), and an O_PATH pin of an entry.
pub const FD_PER_THREAD: u64 = 4;
/// Tries of an open that failed with EMFILE/ENFILE, each after closing idle directory fds.
const FD_TRIES: u32 = 8;

/// The most walker threads an open-file limit of `limit` carries: each thread may hold
/// [`FD_PER_THREAD`] descriptors at once, whatever the tree's depth.
pub fn max_threads_for(limit: u64) -> usize {
    (limit.saturating_sub(FD_RESERVE) / FD_PER_THREAD).max(1) as usize
}

/// A directory being walked.
///
/// Its fd is opened `O_NOFOLLOW|O_DIRECTORY` relative to its parent's. To stay within the
/// process's open-file limit whatever the depth, an idle directory's fd may be closed (like GNU
/// fts) and re-opened when needed: through `..` of a child being finished, or by name from the
/// nearest open ancestor, never following a symlink; either way the re-opened directory must
/// have the device and inode recorded when it was first opened, or the walk reports an error
/// for it and changes nothing there. The fd is only reached through a [`Lease`].
pub struct Node {
    /// The open directory (`None` while closed) and how many holders keep it open.
    slot: Mutex<Slot>,
    /// The fd budget of the pool this directory is walked on, which counts its fd while open.
    fds: Arc<Fds>,
    /// Metadata read through the fd when the directory was first opened (before it was read).
    pub meta: Meta,
    /// Its change and modification times, read with `meta`.
    pub times: Times,
    pub(super) parent: Option<Arc<Node>>,
    name: Name,
    /// 0 for the root.
    pub depth: u32,
    /// Its index among its parent's `DT_DIR` entries in `getdents` order.
    ord: Option<u32>,
    /// Unfinished work: 1 while being read, plus one per pending child directory or batch.
    pub(super) pending: AtomicUsize,
    /// Subdirectory jobs queued and not started yet (see `traverse::QUEUED_PER_DIR`).
    pub(super) queued: AtomicUsize,
    /// Entries the walk's user counted in this subtree (see [`Node::add_entries`]).
    entries: AtomicU64,
    /// Set on this directory and its ancestors by [`Node::taint`].
    tainted: AtomicBool,
    /// To be verified against this bound (`Descend::Verify`) rather than read.
    pub(super) bound: Option<Stamp>,
    /// Whether its listing is trusted (unchanged since `bound`: `verify::unchanged`): then only
    /// its subdirectories are looked at.
    contents: Contents,
}

struct Slot {
    fd: Option<OwnedFd>,
    leases: u32,
}

/// How the walk came to a subdirectory, from its parent's listing.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Reached {
    /// Its index among its parent's `DT_DIR` entries in `getdents` order (`None` for the root
    /// and when `getdents` did not give its type).
    pub ord: Option<u32>,
    /// The bound its listing is verified against (`Descend::Verify`), else it is read.
    pub bound: Option<Stamp>,
}

/// A directory just opened, which [`Node::opened`] makes a node.
pub(super) struct Opened {
    pub fd: OwnedFd,
    /// Read through `fd` before the directory is read.
    pub meta: Meta,
    pub times: Times,
    /// Its parent's node (`None` for the root) and its name there, which moves into the node.
    pub parent: Option<Arc<Node>>,
    pub name: Name,
    pub reached: Reached,
}

impl Opened {
    /// The walk's root, opened as `fd`.
    pub fn root(fd: OwnedFd, meta: Meta, times: Times) -> Opened {
        Opened { fd, meta, times, parent: None, name: Name::new(c""), reached: Reached::default() }
    }
}

impl Node {
    /// The node of a directory just opened, held by the caller and counted in `fds`; `root`:
    /// the walk's root, whose mount a directory must be on for its listing to be trusted.
    pub(super) fn opened(fds: &Arc<Fds>, dir: Opened, root: &Meta) -> Lease {
        let Opened { fd, meta, times, parent, name, reached: Reached { ord, bound } } = dir;
        fds.open.fetch_add(1, Ordering::Relaxed);
        let raw = fd.as_raw_fd();
        let node = Arc::new(Node {
            // Held from the start: no other thread may close it before its opener uses it.
            slot: Mutex::new(Slot { fd: Some(fd), leases: 1 }),
            fds: Arc::clone(fds),
            meta,
            times,
            depth: parent.as_ref().map_or(0, |p| p.depth + 1),
            parent,
            name,
            ord,
            pending: AtomicUsize::new(1),
            queued: AtomicUsize::new(0),
            entries: AtomicU64::new(0),
            tainted: AtomicBool::new(false),
            bound,
            contents: match bound {
                Some(b) if verify::unchanged(&meta, &times, root, b) => Contents::Verified,
                _ => Contents::Read,
            },
        });
        fds.register(&node);
        Lease { node, raw }
    }

    /// Its index among its parent's `DT_DIR` entries in `getdents` order: `None` for the root
    /// and for a subdirectory whose type `getdents` did not tell (found by a stat).
    pub fn ord(&self) -> Option<u32> {
        self.ord
    }

    pub fn parent(&self) -> Option<&Node> {
        self.parent.as_deref()
    }

    /// Adds `n` to the entries counted in this subtree. The walk itself counts nothing here: its
    /// user does (e.g. each entry into its directory, each finished directory into its parent).
    pub fn add_entries(&self, n: u64) {
        self.entries.fetch_add(n, Ordering::Relaxed);
    }

    pub fn entries(&self) -> u64 {
        self.entries.load(Ordering::Relaxed)
    }

    /// Marks this directory and every ancestor: something below them is left unfinished (an
    /// error, an entry left as it is, what a mount point hides).
    pub fn taint(&self) {
        let mut cur = Some(self);
        while let Some(n) = cur {
            if n.tainted.swap(true, Ordering::Relaxed) {
                return;
            }
            cur = n.parent.as_deref();
        }
    }

    /// Whether the walk trusted this directory's listing (`Descend::Verify`): then its entries
    /// other than subdirectories were not handed to the visitor.
    pub fn contents(&self) -> Contents {
        self.contents
    }

    /// The bound this directory's listing was trusted against, if it was (see
    /// [`Node::contents`]): what its subdirectories are verified against in turn.
    pub fn verified_against(&self) -> Option<Stamp> {
        self.bound.filter(|_| self.contents == Contents::Verified)
    }

    /// Whether [`Node::taint`] was called on this directory or one below it.
    pub fn tainted(&self) -> bool {
        self.tainted.load(Ordering::Relaxed)
    }

    /// This directory's name in its parent (empty for the root).
    pub fn name(&self) -> &[u8] {
        self.name.as_c_str().to_bytes()
    }

    /// The path relative to the walk's root ("" for the root). Built only when needed (errors,
    /// logs): nodes keep one name each, not a path.
    pub fn rel_path(&self) -> PathBuf {
        let mut names = Vec::new();
        let mut cur = Some(self);
        while let Some(n) = cur {
            if n.parent.is_some() {
                names.push(n.name());
            }
            cur = n.parent.as_deref();
        }
        let mut p = PathBuf::new();
        for n in names.iter().rev() {
            p.push(OsStr::from_bytes(n));
        }
        p
    }

    pub(super) fn is_open(&self) -> bool {
        lock(&self.slot).fd.is_some()
    }

    /// Holds the fd open, if it is.
    fn try_lease(self: &Arc<Self>) -> Option<Lease> {
        let mut s = lock(&self.slot);
        let raw = s.fd.as_ref()?.as_raw_fd();
        s.leases += 1;
        Some(Lease { node: Arc::clone(self), raw })
    }

    /// Installs a re-opened fd (unless another thread did first) and holds it open.
    fn install(self: &Arc<Self>, fd: OwnedFd) -> Lease {
        let mut s = lock(&self.slot);
        let fresh = s.fd.is_none();
        // Another thread's fd, if it installed one first (this one is then closed).
        let raw = s.fd.get_or_insert(fd).as_raw_fd();
        if fresh {
            self.fds.open.fetch_add(1, Ordering::Relaxed);
        }
        // Held before the slot is unlocked: no other thread may close it in between.
        s.leases += 1;
        drop(s);
        if fresh {
            self.fds.register(self);
        }
        Lease { node: Arc::clone(self), raw }
    }

    /// Closes the fd if nobody holds it (never the root's). Returns whether it did.
    pub(super) fn close_if_idle(&self) -> bool {
        let mut s = lock(&self.slot);
        if s.leases > 0 || s.fd.is_none() || self.parent.is_none() {
            return false;
        }
        s.fd = None;
        self.fds.open.fetch_sub(1, Ordering::Relaxed);
        true
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        if lock(&self.slot).fd.is_some() {
            self.fds.open.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

/// Keeps a node's fd open while held.
pub(super) struct Lease {
    node: Arc<Node>,
    /// The fd in the node's slot, which stays there (open) while any lease is held.
    raw: RawFd,
}

impl Lease {
    pub(super) fn node(&self) -> &Arc<Node> {
        &self.node
    }

    pub(super) fn fd(&self) -> BorrowedFd<'_> {
        // SAFETY: `raw` is the fd owned by the node's slot, which neither closes nor replaces an
        // fd while a lease is held (`close_if_idle` refuses, `install` keeps an open one), and
        // this lease is held for as long as the borrow lasts.
        unsafe { BorrowedFd::borrow_raw(self.raw) }
    }

    /// The directory with its fd, for the visitor's calls.
    pub(super) fn dir(&self) -> Dir<'_> {
        Dir { node: &self.node, fd: self.fd() }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        lock(&self.node.slot).leases -= 1;
    }
}

/// A directory the walk holds open during a visitor call: its node (which it dereferences to)
/// and its fd, borrowed from the lease that keeps it open. Only the walk makes one.
#[derive(Clone, Copy)]
pub struct Dir<'l> {
    node: &'l Node,
    fd: BorrowedFd<'l>,
}

impl<'l> Dir<'l> {
    /// The directory's fd, open for as long as this borrow.
    pub fn fd(&self) -> BorrowedFd<'l> {
        self.fd
    }

    pub fn node(&self) -> &'l Node {
        self.node
    }
}

impl Dir<'_> {
    /// Runs `open` (anything that takes a descriptor); on EMFILE/ENFILE closes idle directory
    /// fds of the walks on this directory's pool and tries again (see [`Fds::with_relief`]).
    pub fn with_fd_relief<T>(&self, open: impl FnMut() -> Result<T, Errno>) -> Result<T, Errno> {
        self.node.fds.with_relief(open)
    }
}

impl Deref for Dir<'_> {
    type Target = Node;

    fn deref(&self) -> &Node {
        self.node
    }
}

/// The directory fds of the walks on one pool, and how many of them those walks keep open at
/// most beyond those in use: idle ancestors are closed first, and re-opened by name or through
/// `..` when needed again. Every pool has its own: the walks of one pool count only their own
/// fds, and relieve a shortage only by closing their own idle ones.
pub(super) struct Fds {
    /// Directory fds held open by the walks (what the budget counts).
    open: AtomicUsize,
    /// The directories opened by the walks, oldest first: where idle fds are found when the
    /// nearest ancestors are all busy, or descriptors ran out (pruned as it grows).
    opened: Mutex<VecDeque<Weak<Node>>>,
    /// The budget: directory fds kept open at most beyond those in use.
    keep: usize,
}

impl Fds {
    /// A budget of `keep` directory fds beyond those in use.
    pub(super) fn new(keep: usize) -> Arc<Fds> {
        Arc::new(Fds { open: AtomicUsize::new(0), opened: Mutex::new(VecDeque::new()), keep })
    }

    /// The budget of what the open-file limit leaves once each of `threads` threads has its
    /// share.
    pub(super) fn fitting(threads: u64) -> Arc<Fds> {
        let left = sys::fd_limit().saturating_sub(FD_RESERVE + FD_PER_THREAD * threads);
        Fds::new(left.max(threads).min(usize::MAX as u64) as usize)
    }

    /// Directory fds open now.
    pub(super) fn open_now(&self) -> usize {
        self.open.load(Ordering::Relaxed)
    }

    /// Notes an opened directory in `opened`; drops the entries of closed and finished ones once
    /// they outnumber the open ones (amortized: the list stays near the open count).
    fn register(&self, node: &Arc<Node>) {
        let mut q = lock(&self.opened);
        q.push_back(Arc::downgrade(node));
        if q.len() > 2 * self.open_now().max(64) {
            q.retain(|w| w.upgrade().is_some_and(|n| n.is_open()));
        }
    }

    /// Closes idle directory fds of the walks, oldest first, until at most `keep` are open.
    /// Returns how many it closed. A closed directory is re-opened when next needed.
    fn close_idle(&self, keep: usize) -> usize {
        let mut q = lock(&self.opened);
        let mut closed = 0;
        for _ in 0..q.len() {
            if self.open_now() <= keep {
                break;
            }
            let Some(w) = q.pop_front() else { break };
            let Some(node) = w.upgrade() else { continue };
            if node.close_if_idle() {
                closed += 1;
            } else if node.is_open() {
                // Busy (or the root): still open, looked at again next time.
                q.push_back(w);
            }
        }
        closed
    }

    /// Runs `open` (anything that takes a descriptor); on EMFILE/ENFILE closes idle directory
    /// fds of the walks (down to half of those open) and tries again, a bounded number of times:
    /// the walk completes at any open-file limit its threads fit in.
    pub(super) fn with_relief<T>(&self, mut open: impl FnMut() -> Result<T, Errno>) -> Result<T, Errno> {
        let mut tries = 1;
        loop {
            match open() {
                Err(Errno::MFILE | Errno::NFILE) if tries < FD_TRIES => {
                    if self.close_idle(self.open_now() / 2) == 0 {
                        // Nothing idle: other threads hold what is open; their pins close soon.
                        std::thread::sleep(std::time::Duration::from_millis(1 << tries));
                    }
                    tries += 1;
                }
                other => return other,
            }
        }
    }

    /// Holds `node` open, re-opening it (and any closed ancestors) by name from the nearest
    /// open ancestor when the budget closed it.
    pub(super) fn lease(&self, node: &Arc<Node>) -> Result<Lease, Errno> {
        if let Some(l) = node.try_lease() {
            return Ok(l);
        }
        let mut closed = vec![Arc::clone(node)];
        let mut held = loop {
            let up = closed.last().expect("not empty").parent.clone().expect("the root is never closed");
            if let Some(l) = up.try_lease() {
                break l;
            }
            closed.push(up);
        };
        while let Some(n) = closed.pop() {
            held = match n.try_lease() {
                Some(l) => l,
                None => {
                    let fd = self.open_dir(&n, || sys::open_subdir(held.fd(), n.name.as_c_str()))?;
                    self.adopt(&n, fd)?
                }
            };
        }
        Ok(held)
    }

    /// Holds `node` open, re-opening it as `..` of its held child `child` if it was closed.
    pub(super) fn lease_via_child(&self, node: &Arc<Node>, child: &Lease) -> Result<Lease, Errno> {
        if let Some(l) = node.try_lease() {
            return Ok(l);
        }
        let fd = self.open_dir(node, || sys::open_subdir(child.fd(), c".."))?;
        self.adopt(node, fd)
    }

    /// Takes a re-opened fd for `node` if it is the directory first walked there (same device
    /// and inode), else refuses it: the name now leads elsewhere, and nothing there is touched.
    fn adopt(&self, node: &Arc<Node>, fd: OwnedFd) -> Result<Lease, Errno> {
        let now = sys::stat_fd(sys::fd(&fd))?;
        if (now.dev, now.ino) != (node.meta.dev, node.meta.ino) {
            return Err(Errno::STALE);
        }
        let lease = node.install(fd);
        self.trim(node);
        Ok(lease)
    }

    /// Opens a directory; on EMFILE/ENFILE closes every idle ancestor of `near` and tries again,
    /// then idle directories anywhere (see [`Fds::with_relief`]).
    pub(super) fn open_dir(&self, near: &Node, open: impl Fn() -> Result<OwnedFd, Errno>) -> Result<OwnedFd, Errno> {
        match open() {
            Err(Errno::MFILE) | Err(Errno::NFILE) => {
                self.close_ancestors(near, 0);
                self.with_relief(open)
            }
            other => other,
        }
    }

    /// Over budget: closes idle fds of `node`'s ancestors beyond its parent, nearest first;
    /// if those are busy or already closed, the oldest idle ones anywhere.
    pub(super) fn trim(&self, node: &Node) {
        if self.open_now() > self.keep {
            self.close_ancestors(node, self.keep);
            if self.open_now() > self.keep {
                self.close_idle(self.keep);
            }
        }
    }

    /// Closes idle ancestors of `node` beyond its parent until at most `keep` directory fds are
    /// open, or a bounded number of ancestors was looked at.
    fn close_ancestors(&self, node: &Node, keep: usize) {
        let mut cur = node.parent.as_deref().and_then(|p| p.parent.as_deref());
        let mut looked = 0;
        while let Some(n) = cur {
            if looked > self.keep.min(4096) + 64 {
                return;
            }
            if n.close_if_idle() && self.open_now() <= keep {
                return;
            }
            looked += 1;
            cur = n.parent.as_deref();
        }
    }
}
