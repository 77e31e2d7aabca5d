//! Parallel, dirfd-relative, post-order traversal of one filesystem. Knows nothing of ownership:
//! it hands entries to a [`Visitor`] and calls [`Visitor::dir_done`] once a directory's contents
//! are all visited (the root last).
//!
//! Each directory is a [`Node`] that holds its own fd (opened `O_NOFOLLOW|O_DIRECTORY` relative
//! to its parent's fd) and a count of unfinished work below it. Directories are read with
//! `getdents64` into a fixed buffer; subdirectories become rayon jobs (work-stealing, LIFO per
//! thread, so the walk stays depth-first and few fds are open), and other entries are handled in
//! batches of names, stolen by idle threads when there are any. No path is ever resolved.

use std::collections::VecDeque;
use std::ffi::{CStr, OsStr};
use std::mem::MaybeUninit;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};

use rustix::io::Errno;

use crate::error::{Error, Op};
use crate::sync::lock;
use crate::sys::{self, DType, Kind, Meta, Times};
use crate::verify::{self, Stamp};

/// Filesystems whose directories' link count is 2 plus their subdirectories.
const NLINK_COUNTS_SUBDIRS: &[&str] = &["ext2", "ext3", "ext4", "xfs", "tmpfs"];

/// Names handled per batch job.
const BATCH: usize = 256;
/// `getdents64` buffer per directory being read.
const DIRENT_BUF: usize = 32 * 1024;
/// Descriptors kept aside for the process: stdio, the root and its marker and lock fds, logs.
pub const FD_RESERVE: u64 = 16;
/// Descriptors one walker thread may hold at once: the directory it reads, its parent while
/// opening it (or two while re-opening a closed ancestor), and an O_PATH pin of an entry.
pub const FD_PER_THREAD: u64 = 4;

/// Subdirectory jobs of one directory queued at most: past this, its reader runs queued jobs
/// itself before reading on, so a directory of a million subdirectories never holds a million
/// queued jobs (each a name and a closure: ~100 bytes).
const QUEUED_PER_DIR: usize = 1024;
/// Tries of an open that failed with EMFILE/ENFILE, each after closing idle directory fds.
const FD_TRIES: u32 = 8;

/// Directory fds held open by the walks of this process (the fd budget counts these).
static OPEN_DIRS: AtomicUsize = AtomicUsize::new(0);
/// The directories opened by the walks of this process, oldest first: where idle fds are found
/// when the nearest ancestors are all busy, or descriptors ran out (pruned as it grows).
static OPENED: Mutex<VecDeque<Weak<Node>>> = Mutex::new(VecDeque::new());

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
/// for it and changes nothing there.
pub struct Node {
    /// The open directory (`None` while closed) and how many holders keep it open.
    slot: Mutex<Slot>,
    /// The raw fd in `slot` (-1 while closed), read by [`Node::fd`] without the lock.
    raw: AtomicI32,
    /// Metadata read through the fd when the directory was first opened (before it was read).
    pub meta: Meta,
    /// Its change and modification times, read with `meta`.
    pub times: Times,
    parent: Option<Arc<Node>>,
    name: Box<CStr>,
    /// 0 for the root.
    pub depth: u32,
    /// Its index among its parent's `DT_DIR` entries in `getdents` order.
    ord: Option<u32>,
    /// Unfinished work: 1 while being read, plus one per pending child directory or batch.
    pending: AtomicUsize,
    /// Subdirectory jobs queued and not started yet (see [`QUEUED_PER_DIR`]).
    queued: AtomicUsize,
    /// Entries the walk's user counted in this subtree (see [`Node::add_entries`]).
    entries: AtomicU64,
    /// Set on this directory and its ancestors by [`Node::taint`].
    tainted: AtomicBool,
    /// To be verified against this bound ([`Descend::Verify`]) rather than read.
    bound: Option<Stamp>,
    /// Its listing was trusted ([`verify::unchanged`]): only its subdirectories were looked at.
    verified: AtomicBool,
}

struct Slot {
    fd: Option<OwnedFd>,
    leases: u32,
}

impl Node {
    /// The node of a directory just opened, held by the caller.
    fn opened(
        fd: OwnedFd,
        (meta, times): (Meta, Times),
        parent: Option<Arc<Node>>,
        name: &CStr,
        (ord, bound): (Option<u32>, Option<Stamp>),
    ) -> Lease {
        OPEN_DIRS.fetch_add(1, Ordering::Relaxed);
        let node = Arc::new(Node {
            raw: AtomicI32::new(fd.as_raw_fd()),
            // Held from the start: no other thread may close it before its opener uses it.
            slot: Mutex::new(Slot { fd: Some(fd), leases: 1 }),
            meta,
            times,
            depth: parent.as_ref().map_or(0, |p| p.depth + 1),
            parent,
            name: name.into(),
            ord,
            pending: AtomicUsize::new(1),
            queued: AtomicUsize::new(0),
            entries: AtomicU64::new(0),
            tainted: AtomicBool::new(false),
            bound,
            verified: AtomicBool::new(false),
        });
        register(&node);
        Lease(node)
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
    /// error, an entry left as it is).
    pub fn taint(&self) {
        let mut cur = Some(self);
        while let Some(n) = cur {
            if n.tainted.swap(true, Ordering::Relaxed) {
                return;
            }
            cur = n.parent.as_deref();
        }
    }

    /// Whether the walk trusted this directory's listing ([`Descend::Verify`]): its entries other
    /// than subdirectories were not handed to the visitor.
    pub fn verified(&self) -> bool {
        self.verified.load(Ordering::Relaxed)
    }

    /// Whether [`Node::taint`] was called on this directory or one below it.
    pub fn tainted(&self) -> bool {
        self.tainted.load(Ordering::Relaxed)
    }

    /// This directory's fd. The walk keeps it open during every [`Visitor`] call about this
    /// directory or one of its entries; it must not be used outside those calls.
    pub fn fd(&self) -> BorrowedFd<'_> {
        let raw = self.raw.load(Ordering::Acquire);
        assert!(raw >= 0, "a directory's fd used while it is closed");
        // SAFETY: `raw` is the fd owned by `slot`, which stays open while a lease is held, and
        // the walk holds one during every call that may use it.
        unsafe { BorrowedFd::borrow_raw(raw) }
    }

    /// This directory's name in its parent (empty for the root).
    pub fn name(&self) -> &[u8] {
        self.name.to_bytes()
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

    fn is_open(&self) -> bool {
        lock(&self.slot).fd.is_some()
    }

    /// Holds the fd open, if it is.
    fn try_lease(self: &Arc<Self>) -> Option<Lease> {
        let mut s = lock(&self.slot);
        s.fd.as_ref()?;
        s.leases += 1;
        Some(Lease(Arc::clone(self)))
    }

    /// Installs a re-opened fd (unless another thread did first) and holds it open.
    fn install(self: &Arc<Self>, fd: OwnedFd) -> Lease {
        let mut s = lock(&self.slot);
        let fresh = s.fd.is_none();
        if fresh {
            self.raw.store(fd.as_raw_fd(), Ordering::Release);
            s.fd = Some(fd);
            OPEN_DIRS.fetch_add(1, Ordering::Relaxed);
        }
        // Held before the slot is unlocked: no other thread may close it in between.
        s.leases += 1;
        drop(s);
        if fresh {
            register(self);
        }
        Lease(Arc::clone(self))
    }

    /// Closes the fd if nobody holds it (never the root's). Returns whether it did.
    fn close_if_idle(&self) -> bool {
        let mut s = lock(&self.slot);
        if s.leases > 0 || s.fd.is_none() || self.parent.is_none() {
            return false;
        }
        self.raw.store(-1, Ordering::Release);
        s.fd = None;
        OPEN_DIRS.fetch_sub(1, Ordering::Relaxed);
        true
    }
}

/// Notes an opened directory in [`OPENED`]; drops the entries of closed and finished ones
/// once they outnumber the open ones (amortized: the list stays near the open count).
fn register(node: &Arc<Node>) {
    let mut q = crate::sync::lock(&OPENED);
    q.push_back(Arc::downgrade(node));
    if q.len() > 2 * OPEN_DIRS.load(Ordering::Relaxed).max(64) {
        q.retain(|w| w.upgrade().is_some_and(|n| n.raw.load(Ordering::Relaxed) >= 0));
    }
}

/// Closes idle directory fds of this process's walks, oldest first, until at most `keep` are
/// open. Returns how many it closed. A closed directory is re-opened when next needed.
fn close_idle(keep: usize) -> usize {
    let mut q = crate::sync::lock(&OPENED);
    let mut closed = 0;
    for _ in 0..q.len() {
        if OPEN_DIRS.load(Ordering::Relaxed) <= keep {
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

/// Runs `open` (anything that takes a descriptor); on EMFILE/ENFILE closes idle directory fds
/// of the walks (down to half of those open) and tries again, a bounded number of times: the
/// walk completes at any open-file limit its threads fit in.
pub fn with_fd_relief<T>(mut open: impl FnMut() -> Result<T, Errno>) -> Result<T, Errno> {
    let mut tries = 1;
    loop {
        match open() {
            Err(Errno::MFILE | Errno::NFILE) if tries < FD_TRIES => {
                if close_idle(OPEN_DIRS.load(Ordering::Relaxed) / 2) == 0 {
                    // Nothing idle: other threads hold what is open; their pins close soon.
                    std::thread::sleep(std::time::Duration::from_millis(1 << tries));
                }
                tries += 1;
            }
            other => return other,
        }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        if lock(&self.slot).fd.is_some() {
            OPEN_DIRS.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

/// Keeps a node's fd open while held.
struct Lease(Arc<Node>);

impl Lease {
    fn node(&self) -> &Arc<Node> {
        &self.0
    }
    fn fd(&self) -> BorrowedFd<'_> {
        self.0.fd()
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        lock(&self.0.slot).leases -= 1;
    }
}

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

/// What the walk tells its user. Called from many threads at once.
pub trait Visitor: Sync {
    /// A non-directory entry (or any entry at all below a skipped mount is never seen), as an
    /// `lstat` of its name saw it. Returns whether it needed a change: while entries do, the walk
    /// pins the next ones of the same directory before reading them ([`Visitor::pinned_entry`]).
    fn entry(&self, parent: &Node, name: &CStr, meta: &Meta) -> bool;
    /// A non-directory entry read through `pin`, an `O_PATH|O_NOFOLLOW` fd of it (nothing was
    /// opened: no device, FIFO or socket; a symlink is the link itself), whose own `fstat` is
    /// `meta`, on the walk's mount. The pin is closed after the call. Returns as
    /// [`Visitor::entry`] does (by default, that is what is called).
    fn pinned_entry(&self, parent: &Node, name: &CStr, meta: &Meta, _pin: BorrowedFd<'_>) -> bool {
        self.entry(parent, name, meta)
    }
    /// A directory all of whose contents were visited; called before its parent's.
    fn dir_done(&self, dir: &Node);
    /// An entry on another mount (a nested filesystem, or a bind mount of a directory or file,
    /// of the same filesystem or not): not entered, not handed to [`Visitor::entry`].
    fn mount_skipped(&self, parent: &Node, name: &CStr, meta: &Meta);
    /// Whether and how to enter the subdirectory `name` (inode `ino`, ordinal `ord`: see
    /// [`Node::ord`]) of `parent` (default: read it). A skipped subtree is neither read nor
    /// reported. Called while `parent` is being read, in `getdents` order for the typed ones;
    /// below a verified directory only `Skip` counts (anything else verifies).
    fn enter(&self, _parent: &Node, _name: &CStr, _ino: u64, _ord: Option<u32>) -> Descend {
        Descend::Read
    }
    /// A directory whose listing was trusted ([`Descend::Verify`]) was listed: `others` entries
    /// that are not directories, not handed over one by one.
    fn listed(&self, _dir: &Node, _others: u64) {}
    /// A subdirectory `name` (ordinal `ord`) of `parent` verified without being opened: it has
    /// no subdirectories (a link count of 2 on a filesystem that counts them) and did not
    /// change (`meta` is its own `lstat`). Neither read nor reported otherwise.
    fn verified_leaf(&self, _parent: &Node, _name: &CStr, _ord: Option<u32>, _meta: &Meta) {}
    /// A verified directory all of whose subdirectories were verified or visited; called before
    /// its parent's `dir_done` (or `dir_verified`), instead of `dir_done`.
    fn dir_verified(&self, _dir: &Node) {}
    /// A directory is about to be read (counts `getdents` work).
    fn dir_read(&self, _dir: &Node) {}
    /// Whether the walk must stop (SIGTERM): no directory is read or entered and no batch goes
    /// on once this is true, and no directory is reported done (its contents may be unvisited).
    fn stopped(&self) -> bool {
        false
    }
    /// A per-entry failure; `name` is `None` when it concerns `dir` itself.
    fn error(&self, dir: &Node, name: Option<&CStr>, op: Op, errno: Errno);
}

/// The walk's worker threads, shared by every volume of a run and started only when a walk first
/// needs them: a volume whose marker lets it skip starts none.
pub struct Pool {
    threads: usize,
    pool: std::sync::OnceLock<Result<rayon_core::ThreadPool, String>>,
}

impl Pool {
    /// A pool of `threads` threads, not started yet.
    pub fn new(threads: usize) -> Pool {
        Pool { threads, pool: std::sync::OnceLock::new() }
    }

    /// The started pool (started now on first call); [`Walk::run`] runs inside its `install`.
    pub fn start(&self) -> Result<&rayon_core::ThreadPool, Error> {
        let threads = self.threads;
        let built = self.pool.get_or_init(|| {
            let built = rayon_core::ThreadPoolBuilder::new()
                .num_threads(threads)
                .thread_name(|i| format!("volprep-{i}"))
                .build()
                .map_err(|e| e.to_string());
            if built.is_ok() {
                tracing::debug!(threads, "started {threads} walk threads");
            }
            built
        });
        built.as_ref().map_err(|e| Error::Environment(format!("cannot start {threads} threads: {e}")))
    }

    /// Whether the threads were started.
    #[cfg(test)]
    pub fn started(&self) -> bool {
        self.pool.get().is_some()
    }
}

/// One traversal of one volume.
pub struct Walk<'v, V: Visitor> {
    visitor: &'v V,
    /// The root's metadata: its device and mount id tell what is a nested mount.
    root: Meta,
    cross_devices: bool,
    /// Directory fds the walk keeps open at most, beyond those in use (see [`Node`]); from the
    /// open-file limit and the thread count when not set.
    budget: Option<usize>,
    /// The root is on a [`sys::DOTS_FIRST_FS`] mount.
    dots_first: bool,
    /// The root's filesystem counts a directory's subdirectories in its link count (2 + them).
    nlink_counts_subdirs: bool,
    /// Where reads of directories on the root's mount start: 0, or, once the root's own read
    /// (from 0) showed `.` and `..` at positions 0 and 1 on a [`sys::DOTS_FIRST_FS`] mount, 2,
    /// which skips them and what they cost there.
    read_from: AtomicU64,
}

impl<'v, V: Visitor> Walk<'v, V> {
    pub fn new(visitor: &'v V, root: &Meta, cross_devices: bool) -> Self {
        Walk {
            visitor,
            root: *root,
            cross_devices,
            budget: None,
            dots_first: false,
            nlink_counts_subdirs: false,
            read_from: AtomicU64::new(0),
        }
    }

    /// Whether an entry is on another mount than the root, and the walk stays on the root's.
    /// Mount ids tell a bind mount of the same filesystem; devices tell the rest.
    fn foreign(&self, meta: &Meta) -> bool {
        !self.cross_devices && meta.other_mount(&self.root)
    }

    /// Hands a non-directory to the visitor, or reports it as a mount (a bind-mounted file).
    /// Returns what the visitor said: whether the next entries are worth pinning first.
    fn leaf(&self, parent: &Node, name: &CStr, meta: &Meta) -> bool {
        if self.foreign(meta) {
            self.visitor.mount_skipped(parent, name, meta);
            false
        } else {
            self.visitor.entry(parent, name, meta)
        }
    }

    /// Keeps at most `n` directory fds open beyond those in use (default: what the open-file
    /// limit leaves once every thread has its share).
    #[cfg(test)]
    pub fn fd_budget(mut self, n: usize) -> Self {
        self.budget = Some(n);
        self
    }

    fn budget(&self) -> usize {
        self.budget.unwrap_or(usize::MAX)
    }

    /// Walks the tree below `root_fd` on the current rayon pool and returns when every job
    /// finished (also when one panicked: the panic is then resumed here).
    pub fn run(mut self, root_fd: OwnedFd, root_meta: Meta) {
        if self.budget.is_none() {
            let threads = rayon_core::current_num_threads() as u64;
            let left = sys::fd_limit().saturating_sub(FD_RESERVE + FD_PER_THREAD * threads);
            self.budget = Some(left.max(threads).min(usize::MAX as u64) as usize);
        }
        let fs = if root_meta.mnt_id != 0 { sys::mount_fs_type(root_meta.mnt_id) } else { None };
        self.dots_first = fs.as_deref() == Some(sys::DOTS_FIRST_FS);
        self.nlink_counts_subdirs = fs.as_deref().is_some_and(|f| NLINK_COUNTS_SUBDIRS.contains(&f));
        let times = sys::stat_fd_times(sys::fd(&root_fd)).map(|t| t.1).unwrap_or_default();
        let lease = Node::opened(root_fd, (root_meta, times), None, c"", (None, None));
        let this = &self;
        rayon_core::in_place_scope(|s| this.read(s, lease));
    }

    fn read<'s>(&'s self, s: &rayon_core::Scope<'s>, lease: Lease) {
        let node = Arc::clone(lease.node());
        if self.visitor.stopped() {
            return self.complete(node, Some(lease));
        }
        let mut buf = vec![MaybeUninit::<u8>::uninit(); DIRENT_BUF];
        let mut batch = Batch::default();
        let verified = node.bound.is_some_and(|b| verify::unchanged(&node.meta, &node.times, &self.root, b));
        node.verified.store(verified, Ordering::Relaxed);
        // Entries of a verified directory that are not directories: counted, not visited.
        let others = std::cell::Cell::new(0u64);
        if !verified {
            self.visitor.dir_read(&node);
        }
        let on_root_mount = node.meta.mnt_id == self.root.mnt_id && node.meta.dev == self.root.dev;
        let from = if on_root_mount { self.read_from.load(Ordering::Relaxed) } else { 0 };
        // Subdirectories met, and whether every entry came with its type (ceph-fuse's do).
        let (ord, typed) = (std::cell::Cell::new(0u32), std::cell::Cell::new(true));
        let mut visit = |name: &CStr, dtype, ino| match dtype {
            DType::Dir => {
                self.subdir(s, &node, name, ino, Some(ord.get()));
                ord.set(ord.get().saturating_add(1));
            }
            DType::Other if verified => others.set(others.get() + 1),
            DType::Unknown if verified => {
                typed.set(false);
                match sys::stat_at(lease.fd(), name) {
                    Ok(meta) if meta.kind() == Kind::Dir => self.subdir(s, &node, name, meta.ino, None),
                    Ok(_) => others.set(others.get() + 1),
                    Err(Errno::NOENT) => {}
                    Err(e) => self.visitor.error(&node, Some(name), Op::Stat, e),
                }
            }
            DType::Other | DType::Unknown => {
                typed.set(typed.get() && dtype == DType::Other);
                batch.push(name);
                if batch.len() >= BATCH {
                    self.dispatch(s, &lease, std::mem::take(&mut batch));
                }
            }
        };
        let mut res = sys::read_dir(lease.fd(), &mut buf, from, u64::MAX, &mut visit);
        // Read past `.` and `..` (see `sys::DOTS_FIRST_FS`), the subdirectories met must be what
        // the link count says (ceph-fuse: 2 + subdirectories). Fewer, and one may sit below the
        // start: read what is there, and if anything is, read every directory from 0 from now on.
        if from > 0 && res.is_ok() && typed.get() && node.meta.nlink >= 2 && u64::from(ord.get()) != node.meta.nlink - 2
        {
            let mut below = 0u32;
            res = sys::read_dir(lease.fd(), &mut buf, 0, from, |name: &CStr, dtype, ino| {
                below += 1;
                visit(name, dtype, ino)
            })
            .map(|_| None);
            if below > 0 && self.read_from.swap(0, Ordering::Relaxed) != 0 {
                tracing::warn!(
                    dir = %crate::escape::Escaped(node.rel_path().as_os_str()),
                    "{below} entries were listed below position {from}: reading directories from the start from now on"
                );
            }
        }
        match res {
            Ok(Some(2)) if self.dots_first && node.parent.is_none() => self.read_from.store(2, Ordering::Relaxed),
            Ok(_) => {}
            Err(e) => self.visitor.error(&node, None, Op::Readdir, e),
        }
        if !batch.is_empty() {
            self.dispatch(s, &lease, batch);
        }
        if verified {
            self.visitor.listed(&node, others.get());
        }
        drop(buf);
        self.complete(node, Some(lease));
    }

    /// Runs a batch here when this thread already has queued work (others can steal that),
    /// or queues it for an idle thread otherwise. Keeps both threads and memory in check.
    fn dispatch<'s>(&'s self, s: &rayon_core::Scope<'s>, lease: &Lease, batch: Batch) {
        if rayon_core::current_thread_has_pending_tasks() == Some(true) || rayon_core::current_num_threads() == 1 {
            self.run_batch(s, lease, &batch);
        } else {
            let node = Arc::clone(lease.node());
            node.pending.fetch_add(1, Ordering::Relaxed);
            s.spawn(move |s| match self.lease(&node) {
                Ok(lease) => {
                    self.run_batch(s, &lease, &batch);
                    self.complete(node, Some(lease));
                }
                Err(e) => {
                    self.visitor.error(&node, None, Op::Open, e);
                    self.complete(node, None);
                }
            });
        }
    }

    /// Reads each name of `batch` with an `lstat`, or, right after an entry that needed a change
    /// (most likely its neighbours do too), pins it first and reads the pin: a change then needs
    /// neither another lookup nor another stat. While entries conform, the plain `lstat` is one
    /// syscall where a pin is three (open, fstat, close).
    fn run_batch<'s>(&'s self, s: &rayon_core::Scope<'s>, lease: &Lease, batch: &Batch) {
        let node = lease.node();
        let mut pin_next = false;
        for name in batch.iter() {
            if self.visitor.stopped() {
                return;
            }
            if pin_next {
                pin_next = self.pinned(s, lease, name);
                continue;
            }
            pin_next = match sys::stat_at(lease.fd(), name) {
                Ok(meta) if meta.kind() == Kind::Dir => {
                    self.subdir(s, node, name, meta.ino, None);
                    false
                }
                Ok(meta) => self.leaf(node, name, &meta),
                Err(Errno::NOENT) => false,
                Err(e) => {
                    self.visitor.error(node, Some(name), Op::Stat, e);
                    false
                }
            };
        }
    }

    /// Pins entry `name` of the held directory (`O_PATH|O_NOFOLLOW`), reads the pin and hands
    /// the entry to the visitor with it; a directory is queued by name as from an `lstat`.
    fn pinned<'s>(&'s self, s: &rayon_core::Scope<'s>, lease: &Lease, name: &CStr) -> bool {
        let node = lease.node();
        let pin = match with_fd_relief(|| sys::pin_at(lease.fd(), name)) {
            Ok(pin) => pin,
            Err(Errno::NOENT) => return false,
            Err(e) => {
                self.visitor.error(node, Some(name), Op::Open, e);
                return false;
            }
        };
        match sys::stat_fd(sys::fd(&pin)) {
            Ok(meta) if meta.kind() == Kind::Dir => {
                drop(pin);
                self.subdir(s, node, name, meta.ino, None);
                false
            }
            Ok(meta) if self.foreign(&meta) => {
                self.visitor.mount_skipped(node, name, &meta);
                false
            }
            Ok(meta) => self.visitor.pinned_entry(node, name, &meta, sys::fd(&pin)),
            Err(e) => {
                self.visitor.error(node, Some(name), Op::Stat, e);
                false
            }
        }
    }

    /// Queues subdirectory `name` of `parent`. It is opened by the job that reads it, not here:
    /// a directory of a million subdirectories queues a million names, not a million open fds.
    fn subdir<'s>(&'s self, s: &rayon_core::Scope<'s>, parent: &Arc<Node>, name: &CStr, ino: u64, ord: Option<u32>) {
        if self.visitor.stopped() {
            return;
        }
        let bound = match (self.visitor.enter(parent, name, ino, ord), parent.bound) {
            (Descend::Skip, _) => return,
            (_, Some(b)) if parent.verified() => Some(b),
            (Descend::Verify(b), _) => Some(b),
            (Descend::Read, _) => None,
        };
        parent.pending.fetch_add(1, Ordering::Relaxed);
        parent.queued.fetch_add(1, Ordering::Relaxed);
        let node = Arc::clone(parent);
        let name: Box<CStr> = name.into();
        s.spawn(move |s| {
            node.queued.fetch_sub(1, Ordering::Relaxed);
            self.enter_subdir(s, node, &name, (ord, bound))
        });
        pace(parent);
    }

    /// The job of a queued subdirectory: opens it from its parent and reads it (or, when one
    /// `lstat` verifies it, only counts it done).
    fn enter_subdir<'s>(
        &'s self,
        s: &rayon_core::Scope<'s>,
        parent: Arc<Node>,
        name: &CStr,
        (ord, bound): (Option<u32>, Option<Stamp>),
    ) {
        match self.lease(&parent) {
            Ok(pl) if bound.is_some_and(|b| self.leaf_verified(&pl, name, ord, b)) => self.complete(parent, Some(pl)),
            Ok(pl) => match self.open_child(&pl, name, (ord, bound)) {
                Some(child) => {
                    // Neither the parent's fd nor (through it) its ancestors' are held while
                    // this subtree is walked: the budget may close them.
                    drop((pl, parent));
                    self.read(s, child)
                }
                None => self.complete(parent, Some(pl)),
            },
            Err(e) => {
                self.visitor.error(&parent, None, Op::Open, e);
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
                    self.visitor.verified_leaf(parent.node(), name, ord, &meta);
                }
                leaf
            }
            _ => false,
        }
    }

    /// Opens subdirectory `name` of the held `parent` without following symlinks, as a node to
    /// read, or handles it as the entry it turned out to be (nested mount, or no longer a
    /// directory).
    fn open_child(&self, parent: &Lease, name: &CStr, ord: (Option<u32>, Option<Stamp>)) -> Option<Lease> {
        let p = parent.node();
        let fd = match self.open_dir(p, || sys::open_subdir(parent.fd(), name)) {
            Ok(fd) => fd,
            Err(Errno::NOENT) => return None,
            // Not (or no longer) a directory: a symlink or file took its place. Handle it as the
            // entry it now is, by its own lstat.
            Err(Errno::NOTDIR) | Err(Errno::LOOP) => {
                match sys::stat_at(parent.fd(), name) {
                    Ok(meta) if meta.kind() != Kind::Dir => {
                        self.leaf(p, name, &meta);
                    }
                    Ok(_) => self.visitor.error(p, Some(name), Op::Open, Errno::AGAIN),
                    Err(Errno::NOENT) => {}
                    Err(e) => self.visitor.error(p, Some(name), Op::Stat, e),
                }
                return None;
            }
            Err(e) => {
                self.visitor.error(p, Some(name), Op::Open, e);
                return None;
            }
        };
        let (meta, times) = match sys::stat_fd_times(sys::fd(&fd)) {
            Ok(m) => m,
            Err(e) => {
                self.visitor.error(p, Some(name), Op::Stat, e);
                return None;
            }
        };
        if self.foreign(&meta) {
            self.visitor.mount_skipped(p, name, &meta);
            return None;
        }
        let lease = Node::opened(fd, (meta, times), Some(Arc::clone(p)), name, ord);
        self.trim(lease.node());
        Some(lease)
    }

    /// One unit of `node`'s work is finished (`held`: its lease, when the caller has it); a
    /// directory whose count reaches zero is done, which in turn finishes one unit of its
    /// parent's (iteratively: no recursion on deep trees). A parent whose fd was closed is
    /// re-opened through `..` of the child just finished, which is one open, not one per level.
    fn complete(&self, node: Arc<Node>, held: Option<Lease>) {
        let (mut node, mut held) = (node, held);
        loop {
            if node.pending.fetch_sub(1, Ordering::AcqRel) != 1 || self.visitor.stopped() {
                // Not done yet. Its queued jobs need its fd: re-open it now while a child's
                // fd leads to it in one step.
                if let Some(child) = held.filter(|l| !Arc::ptr_eq(l.node(), &node)) {
                    if !node.is_open() {
                        let _ = self.lease_via_child(&node, &child);
                    }
                    let done = Arc::clone(child.node());
                    drop(child);
                    done.close_if_idle();
                }
                return;
            }
            let lease = match held.take() {
                Some(l) if Arc::ptr_eq(l.node(), &node) => Ok(l),
                Some(child) => {
                    let lease = self.lease_via_child(&node, &child);
                    // The child is done: its fd is needed no more (a job up the stack may still
                    // hold the node itself, and through it its ancestors).
                    let done = Arc::clone(child.node());
                    drop(child);
                    done.close_if_idle();
                    lease
                }
                None => self.lease(&node),
            };
            match lease {
                Ok(l) => {
                    if node.verified() {
                        self.visitor.dir_verified(&node);
                    } else {
                        self.visitor.dir_done(&node);
                    }
                    held = Some(l);
                }
                Err(e) => self.visitor.error(&node, None, Op::Open, e),
            }
            match node.parent.clone() {
                Some(p) => node = p,
                None => return,
            }
        }
    }

    /// Holds `node` open, re-opening it (and any closed ancestors) by name from the nearest
    /// open ancestor when the budget closed it.
    fn lease(&self, node: &Arc<Node>) -> Result<Lease, Errno> {
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
                    let fd = self.open_dir(&n, || sys::open_subdir(held.fd(), &n.name))?;
                    self.adopt(&n, fd)?
                }
            };
        }
        Ok(held)
    }

    /// Holds `node` open, re-opening it as `..` of its held child `child` if it was closed.
    fn lease_via_child(&self, node: &Arc<Node>, child: &Lease) -> Result<Lease, Errno> {
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
    /// then idle directories anywhere (see [`with_fd_relief`]).
    fn open_dir(&self, near: &Node, open: impl Fn() -> Result<OwnedFd, Errno>) -> Result<OwnedFd, Errno> {
        match open() {
            Err(Errno::MFILE) | Err(Errno::NFILE) => {
                self.close_ancestors(near, 0);
                with_fd_relief(open)
            }
            other => other,
        }
    }

    /// Over budget: closes idle fds of `node`'s ancestors beyond its parent, nearest first;
    /// if those are busy or already closed, the oldest idle ones anywhere.
    fn trim(&self, node: &Node) {
        if OPEN_DIRS.load(Ordering::Relaxed) > self.budget() {
            self.close_ancestors(node, self.budget());
            if OPEN_DIRS.load(Ordering::Relaxed) > self.budget() {
                close_idle(self.budget());
            }
        }
    }

    /// Closes idle ancestors of `node` beyond its parent until at most `keep` directory fds are
    /// open, or a bounded number of ancestors was looked at.
    fn close_ancestors(&self, node: &Node, keep: usize) {
        let mut cur = node.parent.as_deref().and_then(|p| p.parent.as_deref());
        let mut looked = 0;
        while let Some(n) = cur {
            if looked > self.budget().min(4096) + 64 {
                return;
            }
            if n.close_if_idle() && OPEN_DIRS.load(Ordering::Relaxed) <= keep {
                return;
            }
            looked += 1;
            cur = n.parent.as_deref();
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

/// Names of one directory's entries, NUL-terminated, in one buffer.
#[derive(Default)]
struct Batch {
    bytes: Vec<u8>,
    count: usize,
}

impl Batch {
    fn push(&mut self, name: &CStr) {
        self.bytes.extend_from_slice(name.to_bytes_with_nul());
        self.count += 1;
    }
    fn len(&self) -> usize {
        self.count
    }
    fn is_empty(&self) -> bool {
        self.count == 0
    }
    fn iter(&self) -> impl Iterator<Item = &CStr> {
        self.bytes.split_inclusive(|&b| b == 0).map(|n| CStr::from_bytes_with_nul(n).expect("names are NUL-terminated"))
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
mod tests {
    use super::*;
    use std::sync::Mutex;

    #[test]
    fn the_pool_starts_on_first_use_with_the_threads_asked_for_and_only_once() {
        let pool = Pool::new(3);
        assert!(!pool.started());
        let first = pool.start().unwrap();
        assert!(pool.started());
        assert_eq!(first.install(rayon_core::current_num_threads), 3);
        assert!(std::ptr::eq(first, pool.start().unwrap()), "a second start is the same pool");
    }

    /// Records what the walk reports: entries and finished directories, in order.
    #[derive(Default)]
    struct Recorder {
        seen: Mutex<Vec<(PathBuf, bool)>>,
        panic_on: Option<&'static str>,
        /// Stop after this many entries.
        stop_after: Option<usize>,
        /// Ask for pins (every entry "needed a change").
        pin: bool,
        /// Entries handed over with a pin, and whether each pin was the inode described.
        pinned: Mutex<Vec<(PathBuf, bool)>>,
    }

    impl Visitor for Recorder {
        fn entry(&self, parent: &Node, name: &CStr, _meta: &Meta) -> bool {
            if self.panic_on.is_some_and(|p| name.to_bytes() == p.as_bytes()) {
                panic!("visitor panicked on purpose");
            }
            self.seen.lock().unwrap().push((rel_child(parent, name), false));
            self.pin
        }
        fn pinned_entry(&self, parent: &Node, name: &CStr, meta: &Meta, pin: BorrowedFd<'_>) -> bool {
            let same =
                sys::stat_fd(pin).is_ok_and(|m| m == *meta) && sys::stat_at(parent.fd(), name).ok() == Some(*meta);
            self.pinned.lock().unwrap().push((rel_child(parent, name), same));
            self.entry(parent, name, meta)
        }
        fn dir_done(&self, dir: &Node) {
            self.seen.lock().unwrap().push((dir.rel_path(), true));
        }
        fn mount_skipped(&self, _: &Node, _: &CStr, _: &Meta) {}
        fn stopped(&self) -> bool {
            self.stop_after.is_some_and(|n| self.seen.lock().unwrap().len() >= n)
        }
        fn error(&self, _: &Node, _: Option<&CStr>, op: Op, errno: Errno) {
            panic!("unexpected {op} error {errno}");
        }
    }

    fn tree() -> tempfile::TempDir {
        let t = tempfile::tempdir().unwrap();
        for d in 0..20 {
            let dir = t.path().join(format!("d{d}/sub"));
            std::fs::create_dir_all(&dir).unwrap();
            for f in 0..300 {
                std::fs::write(dir.join(format!("f{f}")), b"").unwrap();
            }
        }
        std::os::unix::fs::symlink("/etc", t.path().join("link")).unwrap();
        t
    }

    fn walk(root: &Path, threads: usize, v: &Recorder) {
        walk_with_budget(root, threads, None, v)
    }

    fn walk_with_budget(root: &Path, threads: usize, budget: Option<usize>, v: &Recorder) {
        let fd = sys::open_root(root).unwrap();
        let meta = sys::stat_fd(sys::fd(&fd)).unwrap();
        let pool = rayon_core::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
        let w = Walk::new(v, &meta, false);
        let w = match budget {
            Some(n) => w.fd_budget(n),
            None => w,
        };
        pool.install(|| w.run(fd, meta));
    }

    /// A chain of directories 400 deep, each level also holding files and a side directory.
    fn deep_tree() -> tempfile::TempDir {
        let t = tempfile::tempdir().unwrap();
        let mut dir = t.path().to_path_buf();
        for level in 0..400 {
            std::fs::create_dir(dir.join("side")).unwrap();
            std::fs::write(dir.join("side/f"), b"").unwrap();
            for f in 0..3 {
                std::fs::write(dir.join(format!("f{f}")), b"").unwrap();
            }
            dir.push(format!("d{level}"));
            std::fs::create_dir(&dir).unwrap();
        }
        t
    }

    #[test]
    fn a_tiny_fd_budget_closes_and_reopens_directories_and_sees_the_same_walk() {
        let t = deep_tree();
        let mut results = Vec::new();
        for (threads, budget) in [(1, None), (1, Some(2)), (4, Some(3)), (8, Some(1))] {
            let v = Recorder::default();
            walk_with_budget(t.path(), threads, budget, &v);
            let mut seen = v.seen.into_inner().unwrap();
            assert_eq!(seen.last(), Some(&(PathBuf::new(), true)), "the root finishes last");
            seen.sort();
            results.push(seen);
        }
        assert_eq!(results[0].len(), 1 + 400 * (1 + 1 + 1 + 3));
        for r in &results[1..] {
            assert_eq!(&results[0], r);
        }
    }

    #[test]
    fn serial_and_parallel_see_the_same_entries_and_finish_dirs_after_their_contents() {
        let t = tree();
        let mut results = Vec::new();
        for threads in [1, 8] {
            let v = Recorder::default();
            walk(t.path(), threads, &v);
            let seen = v.seen.into_inner().unwrap();
            // Post-order: every entry comes before its directory's `dir_done`; the root last.
            for (i, (p, _)) in seen.iter().enumerate() {
                if let Some(parent) = p.parent() {
                    let done_at = seen.iter().position(|(q, d)| *d && q == parent).expect("parent finished");
                    assert!(done_at > i, "{} finished before {}", parent.display(), p.display());
                }
            }
            assert_eq!(seen.last(), Some(&(PathBuf::new(), true)));
            let mut sorted = seen;
            sorted.sort();
            results.push(sorted);
        }
        assert_eq!(results[0].len(), 1 + 20 * 2 + 20 * 300 + 1);
        assert_eq!(results[0], results[1]);
    }

    #[test]
    fn entries_after_one_that_needed_a_change_are_pinned_and_the_walk_is_the_same() {
        let t = tree();
        for l in 0..10 {
            std::os::unix::fs::symlink("/etc", t.path().join(format!("d0/sub/l{l}"))).unwrap();
        }
        let plain = Recorder::default();
        walk(t.path(), 4, &plain);
        let pinning = Recorder { pin: true, ..Default::default() };
        walk(t.path(), 4, &pinning);
        let (mut a, mut b) = (plain.seen.into_inner().unwrap(), pinning.seen.into_inner().unwrap());
        a.sort();
        b.sort();
        assert_eq!(a, b);
        assert!(plain.pinned.into_inner().unwrap().is_empty(), "no pins unless asked for");
        let pinned = pinning.pinned.into_inner().unwrap();
        // Each batch of a directory's names (300 files: two batches) starts with an lstat; the
        // rest are pinned.
        assert!(pinned.len() >= 20 * 298, "{} pinned", pinned.len());
        assert!(pinned.iter().all(|(_, same)| *same), "a pin's fstat is the entry's own lstat (a link's, not /etc's)");
        assert!(pinned.iter().any(|(p, _)| p.to_string_lossy().starts_with("d0/sub/l")), "symlinks are pinned too");
    }

    #[test]
    fn a_stopped_walk_reports_no_directory_done() {
        let t = tree();
        for threads in [1, 4] {
            let v = Recorder { stop_after: Some(500), ..Default::default() };
            walk(t.path(), threads, &v);
            let seen = v.seen.into_inner().unwrap();
            assert!(seen.len() < 1000, "stopped early: {}", seen.len());
            // Whatever was reported done had every entry of it reported before.
            for (dir, _) in seen.iter().filter(|(_, done)| *done) {
                let files = seen.iter().filter(|(p, d)| !d && p.parent() == Some(dir.as_path())).count();
                assert!(dir.ends_with("sub") && files == 300 || !dir.ends_with("sub"), "{} done early", dir.display());
            }
            assert!(!seen.contains(&(PathBuf::new(), true)), "the root is never done");
        }
    }

    /// More subdirectories than may wait queued: the reader runs queued jobs itself in between
    /// (on one thread as on several), and every one is seen and finished once.
    #[test]
    fn a_directory_wider_than_the_queue_bound_is_walked_whole() {
        let t = tempfile::tempdir().unwrap();
        let n = 3 * QUEUED_PER_DIR + 7;
        for i in 0..n {
            std::fs::create_dir(t.path().join(format!("d{i}"))).unwrap();
        }
        for threads in [1, 3] {
            let v = Recorder::default();
            walk(t.path(), threads, &v);
            let seen = v.seen.into_inner().unwrap();
            assert_eq!(seen.len(), n + 1, "{threads} threads");
            assert_eq!(seen.last(), Some(&(PathBuf::new(), true)), "the root finishes last");
            let distinct: std::collections::HashSet<_> = seen.iter().collect();
            assert_eq!(distinct.len(), n + 1, "each once");
        }
    }

    #[test]
    #[should_panic(expected = "visitor panicked on purpose")]
    fn a_panicking_visitor_does_not_hang_the_walk() {
        let t = tree();
        let v = Recorder { panic_on: Some("f150"), ..Default::default() };
        walk(t.path(), 4, &v);
    }
}
