//! The walk against real trees: serial and parallel agree, post-order, tiny fd budgets, pins, stops, panics.

use std::sync::Mutex;

use super::traverse::QUEUED_PER_DIR;
use super::*;
use crate::sys;

#[test]
fn the_pool_starts_on_first_use_with_the_threads_asked_for_and_only_once() {
    let pool = Pool::new(3);
    assert!(!pool.started());
    let first = pool.start().unwrap();
    assert!(pool.started());
    assert_eq!(first.pool.install(rayon_core::current_num_threads), 3);
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
    /// Calls whose directory fd was not the directory described (closed, or another one).
    wrong_fd: std::sync::atomic::AtomicUsize,
}

impl Recorder {
    /// Checks that the fd a call got is open on the directory it describes.
    fn check_fd(&self, dir: &Dir<'_>) {
        if !sys::stat_fd(dir.fd()).is_ok_and(|m| (m.dev, m.ino) == (dir.meta.dev, dir.meta.ino)) {
            self.wrong_fd.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }
}

impl Visitor for Recorder {
    fn entry(&self, parent: &Dir<'_>, name: &CStr, _meta: &Meta) -> Needed {
        if self.panic_on.is_some_and(|p| name.to_bytes() == p.as_bytes()) {
            panic!("visitor panicked on purpose");
        }
        self.check_fd(parent);
        self.seen.lock().unwrap().push((rel_child(parent, name), false));
        if self.pin { Needed::Change } else { Needed::Nothing }
    }
    fn pinned_entry(&self, parent: &Dir<'_>, name: &CStr, meta: &Meta, pin: BorrowedFd<'_>) -> Needed {
        let same = sys::stat_fd(pin).is_ok_and(|m| m == *meta) && sys::stat_at(parent.fd(), name).ok() == Some(*meta);
        self.pinned.lock().unwrap().push((rel_child(parent, name), same));
        self.entry(parent, name, meta)
    }
    fn dir_done(&self, dir: &Dir<'_>) {
        self.check_fd(dir);
        self.seen.lock().unwrap().push((dir.rel_path(), true));
    }
    fn mount_skipped(&self, _: &Dir<'_>, _: &CStr, _: &Meta) {}
    fn stopped(&self) -> bool {
        self.stop_after.is_some_and(|n| self.seen.lock().unwrap().len() >= n)
    }
    fn error(&self, _: At<'_>, op: Op, errno: Errno) {
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
    let pool = match budget {
        Some(n) => Pool::new(threads).with_fd_budget(n),
        None => Pool::new(threads),
    };
    let threads = pool.start().unwrap();
    Walk::new(threads, v, &meta, sys::Devices::RootOnly).run(fd, meta);
    assert_eq!(threads.fds.open_now(), 0, "every directory fd the pool counted was closed and uncounted");
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
fn a_tiny_fd_budget_closes_and_reopens_directories_and_sees_the_same_walk_with_each_calls_own_fd() {
    let t = deep_tree();
    let mut results = Vec::new();
    for (threads, budget) in [(1, None), (1, Some(2)), (4, Some(3)), (8, Some(1))] {
        let v = Recorder::default();
        walk_with_budget(t.path(), threads, budget, &v);
        assert_eq!(v.wrong_fd.into_inner(), 0, "every call's fd is its directory's, open");
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
