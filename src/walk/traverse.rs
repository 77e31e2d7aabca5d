//! The traversal: each directory read once, its subdirectories queued as jobs, finished after its contents.

use std::ffi::CStr;
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use rayon_core::Scope;
use rustix::io::Errno;

use super::listing::Listing;
use super::name::Name;
use super::node::{Fds, Lease, Opened, Reached};
use super::stock::{Batch, DirentBuf, Stock};
use super::{At, Contents, Descend, Dir, Needed, Node, Threads, Visitor};
use crate::error::Op;
use crate::sys::{self, Devices, DirReader, Kind, Meta, Place};
use crate::throttle::{self, Gate};
use crate::verify::{self, Stamp};

/// Filesystems (as mountinfo names them) whose directories' link count is 2 plus their
/// subdirectories. ceph-fuse reports 2 plus the directory's `nsubdirs`, which the MDS keeps (its
/// listings are checked against it too: `sys::DirReader`).
const NLINK_COUNTS_SUBDIRS: &[&str] = &["ext2", "ext3", "ext4", "xfs", "tmpfs", "fuse.ceph-fuse"];

/// The inode btrfs gives the empty stand-in of a subvolume a snapshot did not include
/// (`BTRFS_EMPTY_SUBVOL_DIR_OBJECTID`; real inodes start at 256).
const BTRFS_EMPTY_SUBVOL_DIR: u64 = 2;

/// Subdirectory jobs of one directory queued at most: past this, its reader runs queued jobs
/// itself before reading on, so a directory of a million subdirectories never holds a million
/// queued jobs (each a name and a closure: ~100 bytes).
pub(super) const QUEUED_PER_DIR: usize = 1024;

/// One traversal of one volume.
pub struct Walk<'v, V: Visitor> {
    /// The pool it runs on, whose fd budget it keeps to (see [`Node`]).
    threads: &'v Threads,
    pub(super) visitor: &'v V,
    /// The root's metadata: its device and mount id tell what is a nested mount.
    root: Meta,
    /// Whether it goes on with entries on other mounts than the root's.
    devices: Devices,
    /// The root's filesystem counts a directory's subdirectories in its link count (2 + them).
    nlink_counts_subdirs: bool,
    /// The root's filesystem is btrfs (see [`BTRFS_EMPTY_SUBVOL_DIR`]).
    btrfs: bool,
    /// Reads directories, past `.` and `..` where the root's mount allows it (ceph-fuse).
    reader: DirReader,
    /// The load gate of the pass that runs the walk (the caller's current one): each job on the
    /// pool, which other volumes' walks share, makes it its thread's current gate.
    gate: Option<Arc<Gate>>,
    /// The idle name buffers of its batches.
    pub(super) stock: Stock,
}

impl<'v, V: Visitor> Walk<'v, V> {
    /// A walk on `threads` handing the entries below `root` to `visitor`.
    pub fn new(threads: &'v Threads, visitor: &'v V, root: &Meta, devices: Devices) -> Self {
        Walk {
            threads,
            visitor,
            root: *root,
            devices,
            nlink_counts_subdirs: false,
            btrfs: false,
            reader: DirReader::new(None),
            gate: None,
            stock: Stock::default(),
        }
    }

    /// Whether an entry is on another mount than the root, and the walk stays on the root's.
    /// Mount ids decide (a bind mount of the same filesystem is another mount; a btrfs
    /// subvolume or an overlayfs layer's file is not); devices only where there are none.
    fn foreign(&self, meta: &Meta) -> bool {
        self.devices == Devices::RootOnly && meta.other_mount(&self.root)
    }

    /// Hands a non-directory to the visitor, or reports it as a mount (a bind-mounted file).
    /// Returns what the visitor said: whether the next entries are worth pinning first.
    fn leaf(&self, parent: &Dir<'_>, name: &CStr, meta: &Meta) -> Needed {
        if self.foreign(meta) {
            self.visitor.mount_skipped(parent, name, meta);
            Needed::Nothing
        } else {
            self.crossing(parent, name, meta);
            self.visitor.entry(parent, name, meta)
        }
    }

    /// Tells the visitor when `name`, which the walk goes on with, is a mount point: on another
    /// mount than its directory (only with `--cross-devices`; else it was skipped).
    fn crossing(&self, parent: &Dir<'_>, name: &CStr, meta: &Meta) {
        if meta.other_mount(&parent.meta) {
            self.visitor.mount_crossed(parent, name, meta);
        }
    }

    /// The fd budget of the pool.
    fn fds(&self) -> &Fds {
        &self.threads.fds
    }

    /// Walks the tree below `root_fd` on its pool and returns when every job finished (also
    /// when one panicked: the panic is then resumed here).
    pub fn run(mut self, root_fd: OwnedFd, root_meta: Meta) {
        let fs = if root_meta.mnt_id != 0 { sys::mount_fs_type(root_meta.mnt_id) } else { None };
        self.reader = DirReader::new(fs.as_deref());
        self.nlink_counts_subdirs = fs.as_deref().is_some_and(|f| NLINK_COUNTS_SUBDIRS.contains(&f));
        self.btrfs = fs.as_deref() == Some("btrfs");
        let times = sys::stat_fd_times(sys::fd(&root_fd)).map(|t| t.1).unwrap_or_default();
        let lease = Node::opened(&self.threads.fds, Opened::root(root_fd, root_meta, times), &root_meta);
        self.gate = throttle::current();
        let this = &self;
        self.threads.pool.install(|| {
            let _gate = this.enter_gate();
            rayon_core::in_place_scope(|s| this.read(s, lease))
        });
    }

    /// Makes the walk's gate the current one of this thread while the job runs.
    fn enter_gate(&self) -> throttle::Entered {
        throttle::enter(self.gate.clone())
    }

    /// Where `node` is, for the [`DirReader`]: the root, on its mount, or on another.
    fn place(&self, node: &Node) -> Place {
        if node.parent.is_none() {
            Place::Root
        } else if !node.meta.other_mount(&self.root) {
            Place::RootMount
        } else {
            Place::OtherMount
        }
    }

    /// Reads the held directory: its subdirectories become jobs, its other entries batches (or,
    /// when its listing is trusted, a count); then one unit of its work is done.
    fn read<'s>(&'s self, s: &Scope<'s>, lease: Lease) {
        let node = Arc::clone(lease.node());
        if self.visitor.stopped() {
            return self.complete(node, Some(lease));
        }
        let contents = node.contents();
        if contents == Contents::Read {
            self.visitor.dir_read(&lease.dir());
        }
        let mut listing = Listing::new(self, s, &lease, contents);
        let mut buf = DirentBuf::take();
        let read = self.reader.read(lease.fd(), &mut buf, (self.place(&node), node.meta.nlink), |name, dtype, ino| {
            listing.entry(name, dtype, ino)
        });
        drop(buf);
        match read {
            Ok(None) => {}
            Ok(Some(below)) => tracing::warn!(
                dir = %crate::escape::Escaped(node.rel_path().as_os_str()),
                "{} entries were listed below position {}: reading directories from the start from now on",
                below.entries, below.from
            ),
            Err(e) => self.visitor.error(At::Dir(&node), Op::Readdir, e),
        }
        listing.finish();
        self.complete(node, Some(lease));
    }

    /// Runs a batch here when this thread already has queued work (others can steal that),
    /// or queues it for an idle thread otherwise. Keeps both threads and memory in check.
    pub(super) fn dispatch<'s>(&'s self, s: &Scope<'s>, lease: &Lease, batch: Batch) {
        if rayon_core::current_thread_has_pending_tasks() == Some(true) || rayon_core::current_num_threads() == 1 {
            self.run_batch(s, lease, &batch);
            self.stock.put(batch);
        } else {
            let node = Arc::clone(lease.node());
            node.pending.fetch_add(1, Ordering::Relaxed);
            s.spawn(move |s| match (self.enter_gate(), self.fds().lease(&node)) {
                (_gate, Ok(lease)) => {
                    self.run_batch(s, &lease, &batch);
                    self.stock.put(batch);
                    self.complete(node, Some(lease));
                }
                (_gate, Err(e)) => {
                    self.visitor.error(At::Dir(&node), Op::Open, e);
                    self.stock.put(batch);
                    self.complete(node, None);
                }
            });
        }
    }

    /// Reads each name of `batch` with an `lstat`, or, right after an entry that needed a change
    /// (most likely its neighbours do too), pins it first and reads the pin: a change then needs
    /// neither another lookup nor another stat. While entries conform, the plain `lstat` is one
    /// syscall where a pin is three (open, fstat, close).
    fn run_batch<'s>(&'s self, s: &Scope<'s>, lease: &Lease, batch: &Batch) {
        let dir = lease.dir();
        let mut last = Needed::Nothing;
        for name in batch.iter() {
            if self.visitor.stopped() {
                return;
            }
            if last == Needed::Change {
                last = self.pinned(s, lease, name);
                continue;
            }
            last = match sys::stat_at(dir.fd(), name) {
                Ok(meta) if meta.kind() == Kind::Dir => {
                    self.subdir(s, lease, name, meta.ino, None);
                    Needed::Nothing
                }
                Ok(meta) => self.leaf(&dir, name, &meta),
                Err(Errno::NOENT) => Needed::Nothing,
                Err(e) => {
                    self.visitor.error(At::Entry(dir, name), Op::Stat, e);
                    Needed::Nothing
                }
            };
        }
    }

    /// Pins entry `name` of the held directory (`O_PATH|O_NOFOLLOW`), reads the pin and hands
    /// the entry to the visitor with it; a directory is queued by name as from an `lstat`.
    fn pinned<'s>(&'s self, s: &Scope<'s>, lease: &Lease, name: &CStr) -> Needed {
        let dir = lease.dir();
        let pin = match dir.with_fd_relief(|| sys::pin_at(dir.fd(), name)) {
            Ok(pin) => pin,
            Err(Errno::NOENT) => return Needed::Nothing,
            Err(e) => {
                self.visitor.error(At::Entry(dir, name), Op::Open, e);
                return Needed::Nothing;
            }
        };
        match sys::stat_fd(sys::fd(&pin)) {
            Ok(meta) if meta.kind() == Kind::Dir => {
                drop(pin);
                self.subdir(s, lease, name, meta.ino, None);
                Needed::Nothing
            }
            Ok(meta) if self.foreign(&meta) => {
                self.visitor.mount_skipped(&dir, name, &meta);
                Needed::Nothing
            }
            Ok(meta) => {
                self.crossing(&dir, name, &meta);
                self.visitor.pinned_entry(&dir, name, &meta, sys::fd(&pin))
            }
            Err(e) => {
                self.visitor.error(At::Entry(dir, name), Op::Stat, e);
                Needed::Nothing
            }
        }
    }

    /// Queues subdirectory `name` of the held `parent`. It is opened by the job that reads it,
    /// not here: a directory of a million subdirectories queues a million names, not a million
    /// open fds.
    pub(super) fn subdir<'s>(&'s self, s: &Scope<'s>, parent: &Lease, name: &CStr, ino: u64, ord: Option<u32>) {
        if self.visitor.stopped() {
            return;
        }
        let node = parent.node();
        let bound = match self.visitor.enter(&parent.dir(), name, ino, ord) {
            Descend::Skip => return,
            Descend::Verify(b) => Some(b),
            Descend::Read => None,
        };
        node.pending.fetch_add(1, Ordering::Relaxed);
        node.queued.fetch_add(1, Ordering::Relaxed);
        let job = Arc::clone(node);
        // Moves into the subdirectory's node: no allocation for a name of up to 47 bytes.
        let name = Name::new(name);
        s.spawn(move |s| {
            let _gate = self.enter_gate();
            job.queued.fetch_sub(1, Ordering::Relaxed);
            self.enter_subdir(s, job, name, Reached { ord, bound })
        });
        pace(node);
    }

    /// The job of a queued subdirectory: opens it from its parent and reads it (or, when one
    /// `lstat` verifies it, only counts it done).
    fn enter_subdir<'s>(&'s self, s: &Scope<'s>, parent: Arc<Node>, name: Name, reached: Reached) {
        match self.fds().lease(&parent) {
            Ok(pl) if reached.bound.is_some_and(|b| self.leaf_verified(&pl, name.as_c_str(), reached.ord, b)) => {
                self.complete(parent, Some(pl))
            }
            Ok(pl) => match self.open_child(&pl, name, reached) {
                Some(child) => {
                    // Neither the parent's fd nor (through it) its ancestors' are held while
                    // this subtree is walked: the budget may close them.
                    drop((pl, parent));
                    self.read(s, child)
                }
                None => self.complete(parent, Some(pl)),
            },
            Err(e) => {
                self.visitor.error(At::Dir(&parent), Op::Open, e);
                self.complete(parent, None)
            }
        }
    }

    /// Verifies subdirectory `name` of the held `parent` by one `lstat` when that is enough: on
    /// the root's mount, unchanged since `bound`, and without subdirectories (a link count of
    /// 2, on a filesystem that counts them), it lists nothing to look at further.
    fn leaf_verified(&self, parent: &Lease, name: &CStr, ord: Option<u32>, bound: Stamp) -> bool {
        if !self.nlink_counts_subdirs {
            return false;
        }
        match sys::stat_at_times(parent.fd(), name) {
            Ok((meta, times)) if meta.kind() == Kind::Dir && meta.nlink == 2 => {
                let leaf = verify::unchanged(&meta, &times, &self.root, bound);
                if leaf {
                    self.visitor.verified_leaf(&parent.dir(), name, ord, &meta);
                }
                leaf
            }
            _ => false,
        }
    }

    /// Opens subdirectory `name` of the held `parent` without following symlinks, as a node to
    /// read, or handles it as the entry it turned out to be (nested mount, or no longer a
    /// directory).
    fn open_child(&self, parent: &Lease, owned: Name, reached: Reached) -> Option<Lease> {
        let dir = parent.dir();
        let name = owned.as_c_str();
        let fd = match self.fds().open_dir(&dir, || sys::open_subdir(dir.fd(), name)) {
            Ok(fd) => fd,
            Err(Errno::NOENT) => return None,
            // Not (or no longer) a directory: a symlink or file took its place.
            Err(Errno::NOTDIR) | Err(Errno::LOOP) => return self.replaced(&dir, name),
            Err(e) => {
                self.visitor.error(At::Entry(dir, name), Op::Open, e);
                return None;
            }
        };
        let (meta, times) = match sys::stat_fd_times(sys::fd(&fd)) {
            Ok(m) => m,
            Err(e) => {
                self.visitor.error(At::Entry(dir, name), Op::Stat, e);
                return None;
            }
        };
        if self.foreign(&meta) {
            self.visitor.mount_skipped(&dir, name, &meta);
            return None;
        }
        if self.btrfs && meta.ino == BTRFS_EMPTY_SUBVOL_DIR && !meta.other_mount(&self.root) {
            self.visitor.placeholder(&dir, name, &meta);
            return None;
        }
        self.crossing(&dir, name, &meta);
        let child = Opened { fd, meta, times, parent: Some(Arc::clone(parent.node())), name: owned, reached };
        let lease = Node::opened(&self.threads.fds, child, &self.root);
        self.fds().trim(lease.node());
        Some(lease)
    }

    /// A subdirectory that turned out not to be one when opened: handled as the entry it now
    /// is, by its own lstat.
    fn replaced(&self, dir: &Dir<'_>, name: &CStr) -> Option<Lease> {
        match sys::stat_at(dir.fd(), name) {
            Ok(meta) if meta.kind() != Kind::Dir => {
                self.leaf(dir, name, &meta);
            }
            Ok(_) => self.visitor.error(At::Entry(*dir, name), Op::Open, Errno::AGAIN),
            Err(Errno::NOENT) => {}
            Err(e) => self.visitor.error(At::Entry(*dir, name), Op::Stat, e),
        }
        None
    }

    /// One unit of `node`'s work is finished (`held`: its lease, when the caller has it); a
    /// directory whose count reaches zero is done, which in turn finishes one unit of its
    /// parent's (iteratively: no recursion on deep trees). A parent whose fd was closed is
    /// re-opened through `..` of the child just finished, which is one open, not one per level.
    fn complete(&self, node: Arc<Node>, held: Option<Lease>) {
        let (mut node, mut held) = (node, held);
        loop {
            if node.pending.fetch_sub(1, Ordering::AcqRel) != 1 || self.visitor.stopped() {
                return self.leave_open(&node, held);
            }
            match self.lease_done(&node, held.take()) {
                Ok(l) => {
                    if node.contents() == Contents::Verified {
                        self.visitor.dir_verified(&l.dir());
                    } else {
                        self.visitor.dir_done(&l.dir());
                    }
                    held = Some(l);
                }
                Err(e) => self.visitor.error(At::Dir(&node), Op::Open, e),
            }
            match node.parent.clone() {
                Some(p) => node = p,
                None => return,
            }
        }
    }

    /// `node` is not done yet. Its queued jobs need its fd: re-opened now while `held` (a
    /// finished child's) leads to it in one step; then the child's fd is needed no more.
    fn leave_open(&self, node: &Arc<Node>, held: Option<Lease>) {
        if let Some(child) = held.filter(|l| !Arc::ptr_eq(l.node(), node)) {
            if !node.is_open() {
                let _ = self.fds().lease_via_child(node, &child);
            }
            let done = Arc::clone(child.node());
            drop(child);
            done.close_if_idle();
        }
    }

    /// Holds the done `node` open for its report: `held` when it is its lease, else re-opened
    /// through `..` of `held` (a finished child), else by name from an open ancestor.
    fn lease_done(&self, node: &Arc<Node>, held: Option<Lease>) -> Result<Lease, Errno> {
        match held {
            Some(l) if Arc::ptr_eq(l.node(), node) => Ok(l),
            Some(child) => {
                let lease = self.fds().lease_via_child(node, &child);
                // The child is done: its fd is needed no more (a job up the stack may still
                // hold the node itself, and through it its ancestors).
                let done = Arc::clone(child.node());
                drop(child);
                done.close_if_idle();
                lease
            }
            None => self.fds().lease(node),
        }
    }
}

/// Keeps `dir`'s queued subdirectory jobs under [`QUEUED_PER_DIR`]: while there are more, the
/// thread reading it runs queued jobs itself (its own newest first, else stolen ones), and only
/// then reads on. Nothing waits on another thread, so no pool, however small, can deadlock. A
/// job run here may be another huge directory that paces in turn: past [`MAX_PACING`] such
/// nested levels (a deep chain of huge directories), a thread reads on without pacing, so its
/// stack stays bounded.
fn pace(dir: &Node) {
    use rayon_core::Yield;
    if dir.queued.load(Ordering::Relaxed) <= QUEUED_PER_DIR || PACING.get() >= MAX_PACING {
        return;
    }
    PACING.set(PACING.get() + 1);
    while dir.queued.load(Ordering::Relaxed) > QUEUED_PER_DIR {
        let ran = match rayon_core::yield_local() {
            Some(Yield::Idle) => rayon_core::yield_now(),
            other => other,
        };
        match ran {
            Some(Yield::Executed) => {}
            // Other threads took the jobs and are starting them: the count is about to drop.
            Some(Yield::Idle) => std::thread::yield_now(),
            None => break,
        }
    }
    PACING.set(PACING.get() - 1);
}

/// Nested [`pace`] calls on one thread at most.
const MAX_PACING: u32 = 16;

thread_local! {
    /// This thread's nested [`pace`] calls.
    static PACING: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}
