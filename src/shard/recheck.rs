//! What the run that completes a sharded volume checks before marking it done: that the part
//! each other shard claims is still what it walked, walking again whatever moved or changed.
//!
//! A done shard's [`Claim`] holds a digest of its anchors (names and inodes, listed before its
//! walk) and the filesystem's time `T` once its walk ended. Its part is trusted when the digest
//! of its anchors now is the same and no directory of its part has a ctime at or past `T` (a
//! directory's ctime moves when an entry is added to it, removed from it or renamed in or out,
//! and when its own owner or mode changes). A part whose anchors changed is walked again whole;
//! a changed anchor or directory is walked again with everything below it.

use std::ffi::{CStr, CString, OsStr};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use rustix::io::Errno;
use tracing::{debug, info};

use crate::error::{Error, Op};
use crate::escape::Escaped;
use crate::fix::{self, Verdict};
use crate::marker::{self, Claim, Shards};
use crate::options::{RunOptions, ShardFilter};
use crate::pass::Fixer;
use crate::progress::Counters;
use crate::spec::Spec;
use crate::sys::{self, DType, Kind, Meta};
use crate::walk::Walk;

/// Directories the verification keeps open for jobs waiting on other threads.
const OPEN_BUDGET: usize = 256;
const DIRENT_BUF: usize = 32 * 1024;

/// An entry at a depth from 1 to the split depth: an anchor (at the split depth) or an entry
/// above it (shard 0's).
#[derive(Debug, Clone)]
pub struct Top {
    pub rel: PathBuf,
    pub ino: u64,
    pub depth: u32,
}

/// Lists the entries from depth 1 to `split` below the root (reading the directories above the
/// split depth, on the root's mount unless `cross`), by `getdents` alone where it gives types.
pub fn list_top(root: BorrowedFd<'_>, root_meta: &Meta, split: u32, cross: bool) -> Result<Vec<Top>, (PathBuf, Errno)> {
    let fresh = sys::open_subdir(root, c".").map_err(|e| (PathBuf::new(), e))?;
    let mut queue = vec![(fresh, PathBuf::new(), 0u32)];
    let mut tops = Vec::new();
    let mut buf = vec![MaybeUninit::<u8>::uninit(); DIRENT_BUF];
    while let Some((fd, rel, depth)) = queue.pop() {
        let mut names = Vec::new();
        sys::read_dir(fd.as_fd(), &mut buf, 0, u64::MAX, |name, dtype, ino| names.push((name.to_owned(), dtype, ino)))
            .map_err(|e| (rel.clone(), e))?;
        for (name, dtype, ino) in names {
            let child = rel.join(OsStr::from_bytes(name.to_bytes()));
            let depth = depth + 1;
            if depth < split && is_dir(fd.as_fd(), &name, dtype) {
                let sub = sys::open_subdir(fd.as_fd(), &name).map_err(|e| (child.clone(), e))?;
                let meta = sys::stat_fd(sub.as_fd()).map_err(|e| (child.clone(), e))?;
                if cross || !meta.other_mount(root_meta) {
                    queue.push((sub, child.clone(), depth));
                }
            }
            tops.push(Top { rel: child, ino, depth });
        }
    }
    Ok(tops)
}

fn is_dir(dir: BorrowedFd<'_>, name: &CStr, dtype: DType) -> bool {
    match dtype {
        DType::Dir => true,
        DType::Other => false,
        DType::Unknown => sys::stat_at(dir, name).is_ok_and(|m| m.kind() == Kind::Dir),
    }
}

/// The digest of the entries of `tops` that shard `f` owns.
pub fn part_digest(tops: &[Top], f: ShardFilter) -> String {
    let mut owned: Vec<(Vec<u8>, u64)> = tops
        .iter()
        .filter(|t| f.owns(t.depth, || t.rel.clone()))
        .map(|t| (t.rel.as_os_str().as_bytes().to_vec(), t.ino))
        .collect();
    marker::anchor_digest(&mut owned)
}

/// What the check found and did, for the log.
#[derive(Debug, Default)]
pub struct Summary {
    /// Parts walked again whole (no claim, or their anchors changed).
    pub parts: Vec<u32>,
    /// Directories read to verify the other parts.
    pub dirs_read: u64,
    /// Changed anchors and directories walked again with their subtrees, and single entries
    /// above the split depth fixed again.
    pub walked: u64,
}

/// The volume being completed and the run completing it.
pub struct Recheck<'r, 'a> {
    pub path: &'r Path,
    pub spec: &'r Spec,
    pub opts: &'r RunOptions,
    pub root: BorrowedFd<'r>,
    pub root_meta: Meta,
    pub threads: &'r rayon_core::ThreadPool,
    pub fixer: &'r Fixer<'a>,
}

impl Recheck<'_, '_> {
    /// Checks the part of every done shard but `skip` (the one this run just walked), walking
    /// what the check cannot trust. Errors of the walks are counted in the fixer.
    pub fn run(&self, shards: &Shards, skip: Option<u32>) -> Result<Summary, Error> {
        let tops = list_top(self.root, &self.root_meta, shards.depth, self.opts.cross_devices)
            .map_err(|(rel, e)| Error::sys(self.full(&rel), Op::Readdir, e))?;
        let mut sum = Summary::default();
        for i in (0..shards.n).filter(|&i| Some(i) != skip) {
            let f = ShardFilter { index: i, count: shards.n, depth: shards.depth };
            let shown = Escaped(self.path.as_os_str());
            match shards.claim(i) {
                None => {
                    info!(path = %shown, "shard {i}/{}: done without a claim to check (recorded by an earlier version): walking its part again", shards.n);
                    self.walk_part(f, &mut sum);
                }
                Some(c) if part_digest(&tops, f) != c.a => {
                    info!(path = %shown, "shard {i}/{}: its anchors changed since it walked (one renamed, added, removed or replaced): walking its part again", shards.n);
                    self.walk_part(f, &mut sum);
                }
                Some(c) => self.check_part(&tops, f, c, &mut sum),
            }
        }
        Ok(sum)
    }

    fn full(&self, rel: &Path) -> PathBuf {
        if rel.as_os_str().is_empty() { self.path.to_path_buf() } else { self.path.join(rel) }
    }

    /// Verifies a part whose anchors are the ones its shard listed: entries of the part changed
    /// since its time are fixed again (anchor directories with their subtrees), and below the
    /// others a directory-only pass looks for changed directories.
    fn check_part(&self, tops: &[Top], f: ShardFilter, claim: &Claim, sum: &mut Summary) {
        let mut changed = Vec::new();
        let mut unchanged = Vec::new();
        for t in tops.iter().filter(|t| f.owns(t.depth, || t.rel.clone())) {
            let (parent_rel, name) = split(&t.rel);
            let parent = match self.open_rel(parent_rel) {
                Ok(p) => p,
                Err(e) => {
                    self.fixer.error_at(&self.full(parent_rel), Op::Open, e);
                    continue;
                }
            };
            let (meta, times) = match sys::stat_at_times(parent.as_fd(), &name) {
                Ok(m) => m,
                Err(Errno::NOENT) => continue,
                Err(e) => {
                    self.fixer.error_at(&self.full(&t.rel), Op::Stat, e);
                    continue;
                }
            };
            if !self.opts.cross_devices && meta.other_mount(&self.root_meta) {
                continue;
            }
            let anchor_dir = t.depth == f.depth && meta.kind() == Kind::Dir;
            if times.ctime >= claim.t {
                debug!(path = %Escaped(self.full(&t.rel).as_os_str()), ctime = ?times.ctime, since = ?claim.t,
                       "changed since shard {}/{} walked: fixed again", f.index, f.count);
            }
            match (times.ctime >= claim.t, anchor_dir) {
                (true, true) => changed.push(t.rel.clone()),
                (true, false) => {
                    sum.walked += 1;
                    self.fix_single(parent.as_fd(), &name, &meta, &t.rel);
                }
                (false, true) => match sys::open_subdir(parent.as_fd(), &name) {
                    Ok(fd) => unchanged.push((fd, t.rel.clone())),
                    Err(_) => changed.push(t.rel.clone()),
                },
                (false, false) => {}
            }
        }
        changed.extend(self.changed_below(unchanged, claim.t, sum));
        for rel in changed {
            sum.walked += 1;
            self.walk_subtree(&rel);
        }
    }

    /// Directory-only pass below `dirs`: the directories (with a ctime at or past `since`)
    /// whose subtrees must be walked again.
    fn changed_below(&self, dirs: Vec<(OwnedFd, PathBuf)>, since: (i64, u32), sum: &mut Summary) -> Vec<PathBuf> {
        let v = Verifier {
            since,
            root: self.root_meta,
            cross: self.opts.cross_devices,
            changed: Mutex::new(Vec::new()),
            dirs_read: AtomicU64::new(0),
            queued: AtomicUsize::new(0),
        };
        self.threads.install(|| {
            rayon_core::scope(|s| {
                for (fd, rel) in dirs {
                    let v = &v;
                    s.spawn(move |s| v.verify(s, fd, rel));
                }
            })
        });
        sum.dirs_read += v.dirs_read.into_inner();
        v.changed.into_inner().unwrap_or_else(|e| e.into_inner())
    }

    /// Opens the directory at `rel` below the root, one component at a time, never following
    /// a symlink.
    fn open_rel(&self, rel: &Path) -> Result<OwnedFd, Errno> {
        let mut fd = sys::open_subdir(self.root, c".")?;
        for c in rel.components() {
            let name = CString::new(c.as_os_str().as_bytes()).map_err(|_| Errno::INVAL)?;
            fd = sys::open_subdir(fd.as_fd(), &name)?;
        }
        Ok(fd)
    }

    /// Fixes the one entry `name` of `parent` (an entry above the split depth, or an anchor
    /// that is not a directory), as the walk would.
    fn fix_single(&self, parent: BorrowedFd<'_>, name: &CStr, meta: &Meta, rel: &Path) {
        let fixer = self.fixer;
        fixer.counters.seen_meta(meta);
        if let Verdict::NotOurs(_) = fix::judge(meta, self.spec, self.opts.privilege) {
            Counters::add(&fixer.counters.foreign_owned);
            return;
        }
        let outcome = if meta.kind() == Kind::Dir {
            match sys::open_subdir(parent, name) {
                Ok(fd) => fix::fix_dir(fd.as_fd(), meta, self.spec, &fixer.setgid),
                Err(e) => return fixer.error_at(&self.full(rel), Op::Open, e),
            }
        } else {
            fix::fix_entry(parent, name, meta, self.spec)
        };
        match outcome {
            Ok(fixed) => fixer.count(fixed.change.owner(), fixed.mode_changed()),
            Err(f) if f.errno == Errno::NOENT => fixer.count_change(&f.done),
            Err(f) => {
                fixer.count_change(&f.done);
                fixer.error_at(&self.full(rel), f.op, f.errno);
            }
        }
    }

    /// Walks the directory at `rel` and everything below it, as an unsharded pass would.
    fn walk_subtree(&self, rel: &Path) {
        let full = self.full(rel);
        let opened = self.open_rel(rel).and_then(|fd| sys::stat_fd(fd.as_fd()).map(|m| (fd, m)));
        let (fd, meta) = match opened {
            Ok(x) => x,
            Err(Errno::NOENT) => return,
            Err(e) => return self.fixer.error_at(&full, Op::Open, e),
        };
        let sub = self.sub_fixer(&full, None);
        self.threads.install(|| Walk::new(&sub, &self.root_meta, self.opts.cross_devices).run(fd, meta));
        absorb(self.fixer, sub);
    }

    /// Walks the whole part of shard `f` again.
    fn walk_part(&self, f: ShardFilter, sum: &mut Summary) {
        sum.parts.push(f.index);
        let opened = sys::open_subdir(self.root, c".").and_then(|fd| sys::stat_fd(fd.as_fd()).map(|m| (fd, m)));
        let (fd, meta) = match opened {
            Ok(x) => x,
            Err(e) => return self.fixer.error_at(self.path, Op::Open, e),
        };
        let sub = self.sub_fixer(self.path, Some(f));
        self.threads.install(|| Walk::new(&sub, &self.root_meta, self.opts.cross_devices).run(fd, meta));
        absorb(self.fixer, sub);
    }

    fn sub_fixer<'p>(&'p self, root: &'p Path, shard: Option<ShardFilter>) -> Fixer<'p> {
        let mut sub = Fixer::new(root, self.spec, self.opts.mode, None);
        sub.shard = shard;
        sub.privilege = self.opts.privilege;
        sub
    }
}

/// The parent's path and the name of `rel` (which has at least one component).
fn split(rel: &Path) -> (&Path, CString) {
    let parent = rel.parent().unwrap_or(Path::new(""));
    let name = rel.file_name().map_or_else(Vec::new, |n| n.as_bytes().to_vec());
    (parent, CString::new(name).unwrap_or_default())
}

/// Adds what `from` counted and listed to `into`.
fn absorb(into: &Fixer<'_>, from: Fixer<'_>) {
    let (a, b) = (&into.counters, &from.counters);
    for (x, y) in [
        (&a.entries, &b.entries),
        (&a.dirs, &b.dirs),
        (&a.files, &b.files),
        (&a.symlinks, &b.symlinks),
        (&a.others, &b.others),
        (&a.changed_owner, &b.changed_owner),
        (&a.changed_mode, &b.changed_mode),
        (&a.errors, &b.errors),
        (&a.dirs_read, &b.dirs_read),
        (&a.hardlinked, &b.hardlinked),
        (&a.foreign_owned, &b.foreign_owned),
        (&a.foreign_unread, &b.foreign_unread),
    ] {
        x.fetch_add(y.load(Ordering::Relaxed), Ordering::Relaxed);
    }
    append(&into.errors, from.errors);
    append(&into.skipped_mounts, from.skipped_mounts);
    append(&into.foreign, from.foreign);
}

fn append<T>(into: &Mutex<Vec<T>>, from: Mutex<Vec<T>>) {
    let from = from.into_inner().unwrap_or_else(|e| e.into_inner());
    into.lock().unwrap_or_else(|e| e.into_inner()).extend(from);
}

/// The directory-only pass: `getdents` of every directory (types from `d_type`), a `statx`
/// of every subdirectory, nothing of the other entries.
struct Verifier {
    since: (i64, u32),
    root: Meta,
    cross: bool,
    changed: Mutex<Vec<PathBuf>>,
    dirs_read: AtomicU64,
    queued: AtomicUsize,
}

impl Verifier {
    fn verify<'s>(&'s self, s: &rayon_core::Scope<'s>, fd: OwnedFd, rel: PathBuf) {
        self.dirs_read.fetch_add(1, Ordering::Relaxed);
        let mut subdirs = Vec::new();
        let mut buf = vec![MaybeUninit::<u8>::uninit(); DIRENT_BUF];
        let read = sys::read_dir(fd.as_fd(), &mut buf, 0, u64::MAX, |name, dtype, _| {
            if dtype != DType::Other {
                subdirs.push((name.to_owned(), dtype));
            }
        });
        drop(buf);
        if read.is_err() {
            // The walk reports what cannot be read.
            return self.change(rel);
        }
        for (name, dtype) in subdirs {
            let child = rel.join(OsStr::from_bytes(name.to_bytes()));
            if dtype == DType::Unknown && !is_dir(fd.as_fd(), &name, dtype) {
                continue;
            }
            let opened =
                sys::open_subdir(fd.as_fd(), &name).and_then(|c| sys::stat_fd_times(c.as_fd()).map(|m| (c, m)));
            let (sub, (meta, times)) = match opened {
                Ok(x) => x,
                Err(Errno::NOENT) => continue,
                Err(_) => {
                    self.change(child);
                    continue;
                }
            };
            if !self.cross && meta.other_mount(&self.root) {
                continue;
            }
            if times.ctime >= self.since {
                self.change(child);
            } else if self.queued.load(Ordering::Relaxed) < OPEN_BUDGET {
                self.queued.fetch_add(1, Ordering::Relaxed);
                s.spawn(move |s| {
                    self.verify(s, sub, child);
                    self.queued.fetch_sub(1, Ordering::Relaxed);
                });
            } else {
                self.verify(s, sub, child);
            }
        }
    }

    fn change(&self, rel: PathBuf) {
        self.changed.lock().unwrap_or_else(|e| e.into_inner()).push(rel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tops(names: &[(&str, u64, u32)]) -> Vec<Top> {
        names.iter().map(|&(n, ino, depth)| Top { rel: n.into(), ino, depth }).collect()
    }

    #[test]
    fn a_rename_between_parts_changes_the_digest_of_the_part_it_lands_in() {
        let f = |i| ShardFilter { index: i, count: 2, depth: 1 };
        // Names whose anchors go to shard 0 and to shard 1.
        let name_in = |part: u32, skip: usize| {
            (0..100).map(|i| format!("d{i}")).filter(|n| f(0).shard_of(n.as_bytes()) == part).nth(skip).unwrap()
        };
        let (a, b, e) = (name_in(0, 0), name_in(1, 0), name_in(0, 1));
        let before = tops(&[(&a, 10, 1), (&b, 11, 1)]);
        let after = tops(&[(&a, 10, 1), (&e, 11, 1)]);
        assert_ne!(part_digest(&before, f(0)), part_digest(&after, f(0)), "{b} renamed to {e}");
        assert_eq!(part_digest(&after, f(0)), part_digest(&tops(&[(&e, 11, 1), (&a, 10, 1)]), f(0)));
        // Above the split depth, entries are shard 0's.
        let deep = ShardFilter { index: 0, count: 2, depth: 2 };
        let upper = tops(&[("top", 5, 1)]);
        assert_ne!(part_digest(&upper, deep), part_digest(&[], deep));
        assert_eq!(part_digest(&upper, ShardFilter { index: 1, ..deep }), part_digest(&[], deep));
    }

    #[test]
    fn paths_split_into_parent_and_name() {
        assert_eq!(split(Path::new("a")), (Path::new(""), CString::new("a").unwrap()));
        assert_eq!(split(Path::new("top/b")), (Path::new("top"), CString::new("b").unwrap()));
    }
}
