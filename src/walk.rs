//! Parallel, dirfd-relative, post-order traversal of one filesystem. Knows nothing of ownership:
//! it hands entries to a [`Visitor`] and calls [`Visitor::dir_done`] once a directory's contents
//! are all visited (the root last).
//!
//! Each directory is a [`Node`] that holds its own fd (opened `O_NOFOLLOW|O_DIRECTORY` relative
//! to its parent's fd) and a count of unfinished work below it. Directories are read with
//! `getdents64` into a fixed buffer; subdirectories become rayon jobs (work-stealing, LIFO per
//! thread, so the walk stays depth-first and few fds are open), and other entries are handled in
//! batches of names, stolen by idle threads when there are any. No path is ever resolved.

use std::ffi::{CStr, OsStr};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use rustix::io::Errno;

use crate::error::Op;
use crate::sys::{self, DType, Kind, Meta};

/// Names handled per batch job.
const BATCH: usize = 256;
/// `getdents64` buffer per directory being read.
const DIRENT_BUF: usize = 32 * 1024;

/// A directory being walked.
pub struct Node {
    fd: OwnedFd,
    /// Metadata read through `fd` when the directory was opened.
    pub meta: Meta,
    parent: Option<Arc<Node>>,
    name: Box<[u8]>,
    /// 0 for the root.
    pub depth: u32,
    /// Unfinished work: 1 while being read, plus one per pending child directory or batch.
    pending: AtomicUsize,
}

impl Node {
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// This directory's name in its parent (empty for the root).
    pub fn name(&self) -> &[u8] {
        &self.name
    }

    /// The ancestor (or self) at `depth`, e.g. the top-level directory a node is in.
    pub fn ancestor_at(&self, depth: u32) -> Option<&Node> {
        let mut cur = self;
        while cur.depth > depth {
            cur = cur.parent.as_deref()?;
        }
        (cur.depth == depth).then_some(cur)
    }

    /// The path relative to the walk's root ("" for the root). Built only when needed (errors,
    /// logs): nodes keep one name each, not a path.
    pub fn rel_path(&self) -> PathBuf {
        let mut names = Vec::new();
        let mut cur = Some(self);
        while let Some(n) = cur {
            if n.parent.is_some() {
                names.push(&n.name[..]);
            }
            cur = n.parent.as_deref();
        }
        let mut p = PathBuf::new();
        for n in names.iter().rev() {
            p.push(OsStr::from_bytes(n));
        }
        p
    }
}

/// What the walk tells its user. Called from many threads at once.
pub trait Visitor: Sync {
    /// A non-directory entry (or any entry at all below a skipped mount is never seen).
    fn entry(&self, parent: &Node, name: &CStr, meta: &Meta);
    /// A directory all of whose contents were visited; called before its parent's.
    fn dir_done(&self, dir: &Node);
    /// An entry on another mount (a nested filesystem, or a bind mount of a directory or file,
    /// of the same filesystem or not): not entered, not handed to [`Visitor::entry`].
    fn mount_skipped(&self, parent: &Node, name: &CStr, meta: &Meta);
    /// Whether to enter the subdirectory `name` (inode `ino`) of `parent` (default: yes).
    /// A skipped subtree is neither read nor reported.
    fn enter(&self, _parent: &Node, _name: &CStr, _ino: u64) -> bool {
        true
    }
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

/// One traversal of one volume.
pub struct Walk<'v, V: Visitor> {
    visitor: &'v V,
    /// The root's metadata: its device and mount id tell what is a nested mount.
    root: Meta,
    cross_devices: bool,
}

impl<'v, V: Visitor> Walk<'v, V> {
    pub fn new(visitor: &'v V, root: &Meta, cross_devices: bool) -> Self {
        Walk { visitor, root: *root, cross_devices }
    }

    /// Whether an entry is on another mount than the root, and the walk stays on the root's.
    /// Mount ids tell a bind mount of the same filesystem; devices tell the rest.
    fn foreign(&self, meta: &Meta) -> bool {
        !self.cross_devices && meta.other_mount(&self.root)
    }

    /// Hands a non-directory to the visitor, or reports it as a mount (a bind-mounted file).
    fn leaf(&self, parent: &Node, name: &CStr, meta: &Meta) {
        if self.foreign(meta) {
            self.visitor.mount_skipped(parent, name, meta);
        } else {
            self.visitor.entry(parent, name, meta);
        }
    }

    /// Walks the tree below `root_fd` on the current rayon pool and returns when every job
    /// finished (also when one panicked: the panic is then resumed here).
    pub fn run(&self, root_fd: OwnedFd, root_meta: Meta) {
        let root = Arc::new(Node {
            fd: root_fd,
            meta: root_meta,
            parent: None,
            name: Box::new([]),
            depth: 0,
            pending: AtomicUsize::new(1),
        });
        rayon_core::in_place_scope(|s| self.read(s, root));
    }

    fn read<'s>(&'s self, s: &rayon_core::Scope<'s>, node: Arc<Node>) {
        if self.visitor.stopped() {
            return self.complete(node);
        }
        let mut buf = vec![MaybeUninit::<u8>::uninit(); DIRENT_BUF];
        let mut batch = Batch::default();
        self.visitor.dir_read(&node);
        let res = sys::read_dir(node.fd(), &mut buf, |name, dtype, ino| match dtype {
            DType::Dir => self.subdir(s, &node, name, ino),
            DType::Other | DType::Unknown => {
                batch.push(name);
                if batch.len() >= BATCH {
                    self.dispatch(s, &node, std::mem::take(&mut batch));
                }
            }
        });
        if let Err(e) = res {
            self.visitor.error(&node, None, Op::Readdir, e);
        }
        if !batch.is_empty() {
            self.dispatch(s, &node, batch);
        }
        drop(buf);
        self.complete(node);
    }

    /// Runs a batch here when this thread already has queued work (others can steal that),
    /// or queues it for an idle thread otherwise. Keeps both threads and memory in check.
    fn dispatch<'s>(&'s self, s: &rayon_core::Scope<'s>, node: &Arc<Node>, batch: Batch) {
        if rayon_core::current_thread_has_pending_tasks() == Some(true) || rayon_core::current_num_threads() == 1 {
            self.run_batch(s, node, &batch);
        } else {
            node.pending.fetch_add(1, Ordering::Relaxed);
            let node = Arc::clone(node);
            s.spawn(move |s| {
                self.run_batch(s, &node, &batch);
                self.complete(node);
            });
        }
    }

    fn run_batch<'s>(&'s self, s: &rayon_core::Scope<'s>, node: &Arc<Node>, batch: &Batch) {
        for name in batch.iter() {
            if self.visitor.stopped() {
                return;
            }
            match sys::stat_at(node.fd(), name) {
                Ok(meta) if meta.kind() == Kind::Dir => self.subdir(s, node, name, meta.ino),
                Ok(meta) => self.leaf(node, name, &meta),
                Err(Errno::NOENT) => {}
                Err(e) => self.visitor.error(node, Some(name), Op::Stat, e),
            }
        }
    }

    /// Queues subdirectory `name` of `parent`. It is opened by the job that reads it, not here:
    /// a directory of a million subdirectories queues a million names, not a million open fds.
    fn subdir<'s>(&'s self, s: &rayon_core::Scope<'s>, parent: &Arc<Node>, name: &CStr, ino: u64) {
        if self.visitor.stopped() || !self.visitor.enter(parent, name, ino) {
            return;
        }
        parent.pending.fetch_add(1, Ordering::Relaxed);
        let parent = Arc::clone(parent);
        let name: Box<CStr> = name.into();
        s.spawn(move |s| match self.open_child(&parent, &name) {
            Some(child) => self.read(s, child),
            None => self.complete(parent),
        });
    }

    /// Opens subdirectory `name` of `parent` without following symlinks, as a node to read, or
    /// handles it as the entry it turned out to be (nested mount, or no longer a directory).
    fn open_child(&self, parent: &Arc<Node>, name: &CStr) -> Option<Arc<Node>> {
        let fd = match sys::open_subdir(parent.fd(), name) {
            Ok(fd) => fd,
            Err(Errno::NOENT) => return None,
            // Not (or no longer) a directory: a symlink or file took its place. Handle it as the
            // entry it now is, by its own lstat.
            Err(Errno::NOTDIR) | Err(Errno::LOOP) => {
                match sys::stat_at(parent.fd(), name) {
                    Ok(meta) if meta.kind() != Kind::Dir => self.leaf(parent, name, &meta),
                    Ok(_) => self.visitor.error(parent, Some(name), Op::Open, Errno::AGAIN),
                    Err(Errno::NOENT) => {}
                    Err(e) => self.visitor.error(parent, Some(name), Op::Stat, e),
                }
                return None;
            }
            Err(e) => {
                self.visitor.error(parent, Some(name), Op::Open, e);
                return None;
            }
        };
        let meta = match sys::stat_fd(fd.as_fd()) {
            Ok(m) => m,
            Err(e) => {
                self.visitor.error(parent, Some(name), Op::Stat, e);
                return None;
            }
        };
        if self.foreign(&meta) {
            self.visitor.mount_skipped(parent, name, &meta);
            return None;
        }
        Some(Arc::new(Node {
            fd,
            meta,
            parent: Some(Arc::clone(parent)),
            name: name.to_bytes().into(),
            depth: parent.depth + 1,
            pending: AtomicUsize::new(1),
        }))
    }

    /// One unit of `node`'s work is finished; a directory whose count reaches zero is done,
    /// which in turn finishes one unit of its parent's (iteratively: no recursion on deep trees).
    fn complete(&self, node: Arc<Node>) {
        let mut cur = node;
        loop {
            if cur.pending.fetch_sub(1, Ordering::AcqRel) != 1 || self.visitor.stopped() {
                return;
            }
            self.visitor.dir_done(&cur);
            match cur.parent.clone() {
                Some(p) => cur = p,
                None => return,
            }
        }
    }
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

    /// Records what the walk reports: entries and finished directories, in order.
    #[derive(Default)]
    struct Recorder {
        seen: Mutex<Vec<(PathBuf, bool)>>,
        panic_on: Option<&'static str>,
        /// Stop after this many entries.
        stop_after: Option<usize>,
    }

    impl Visitor for Recorder {
        fn entry(&self, parent: &Node, name: &CStr, _meta: &Meta) {
            if self.panic_on.is_some_and(|p| name.to_bytes() == p.as_bytes()) {
                panic!("visitor panicked on purpose");
            }
            self.seen.lock().unwrap().push((rel_child(parent, name), false));
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
        let fd = sys::open_root(root).unwrap();
        let meta = sys::stat_fd(fd.as_fd()).unwrap();
        let pool = rayon_core::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
        pool.install(|| Walk::new(v, &meta, false).run(fd, meta));
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

    #[test]
    #[should_panic(expected = "visitor panicked on purpose")]
    fn a_panicking_visitor_does_not_hang_the_walk() {
        let t = tree();
        let v = Recorder { panic_on: Some("f150"), ..Default::default() };
        walk(t.path(), 4, &v);
    }
}
