//! What the run that completes a sharded volume checks before marking it done: that the part
//! each other shard claims is still what it walked, walking again whatever moved or changed.
//!
//! A done shard's claim ([`Shards::claims`]) holds a digest of its anchors (names and inodes, listed before its
//! walk) and the filesystem's time `T` once its walk ended. A part whose anchors changed, or
//! whose shard left no claim, is walked again whole. Otherwise the part is walked again with its
//! anchor directories verified against `T` (`Descend::Verify`, see `verify`): a directory whose
//! ctime is before `T` has only its subdirectories looked at; one changed since (an entry
//! added, removed, renamed in or out, hard-linked in, or its own owner or mode changed) is read
//! and fixed with everything below it. The levels above the anchors are read as usual.

use std::ffi::{CStr, OsStr};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use rustix::io::Errno;
use tracing::info;

use crate::error::{Error, Op};
use crate::escape::Escaped;
use crate::marker::{AnchorDigest, Shards};
use crate::options::{RunOptions, ShardFilter, Verify};
use crate::pass::Fixer;
use crate::sys::{self, DType, Kind, Meta};
use crate::verify::Stamp;
use crate::walk::{self, DIRENT_BUF, Threads, Walk};

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
pub fn part_digest(tops: &[Top], f: ShardFilter) -> AnchorDigest {
    let mut owned: Vec<(Vec<u8>, u64)> = tops
        .iter()
        .filter(|t| f.owns(t.depth, || t.rel.clone()))
        .map(|t| (t.rel.as_os_str().as_bytes().to_vec(), t.ino))
        .collect();
    AnchorDigest::of(&mut owned)
}

/// What the check found and did, for the log.
#[derive(Debug, Default)]
pub struct Summary {
    /// Parts walked again whole (no claim, or their anchors changed).
    pub parts: Vec<u32>,
    /// Entries looked at again (the levels above the anchors, and what changed).
    pub entries: u64,
    /// Directories read (above the anchors, changed ones and below them, whole parts).
    pub dirs_read: u64,
    /// Directories verified: only their subdirectories looked at.
    pub verified_dirs: u64,
    /// The signal (SIGTERM, SIGINT) that stopped a walk of the check: the parts it did not
    /// cover are unchecked, and the volume must not be marked done.
    pub stopped: Option<crate::state::Stop>,
}

/// The volume being completed and the run completing it.
pub struct Recheck<'r, 'a> {
    pub path: &'r Path,
    pub opts: &'r RunOptions,
    pub root: BorrowedFd<'r>,
    pub root_meta: Meta,
    pub threads: &'r Threads,
    pub fixer: &'r Fixer<'a>,
}

impl Recheck<'_, '_> {
    /// Checks the part of every done shard but `skip` (the one this run just walked), walking
    /// what the check cannot trust: under `--verify full`, no claim (each part is read again
    /// whole, as the shard that walked it read it). Errors of the walks are counted in the fixer; a signal that
    /// stops a walk ends the check, with [`Summary::stopped`] set.
    pub fn run(&self, shards: &Shards, skip: Option<u32>) -> Result<Summary, Error> {
        let tops = list_top(self.root, &self.root_meta, shards.depth, self.opts.cross_devices)
            .map_err(|(rel, e)| Error::sys(walk::full_path(self.path, &rel), Op::Readdir, e))?;
        let mut sum = Summary::default();
        let layout = |i| ShardFilter { index: i, count: shards.n, depth: shards.depth };
        let shown = Escaped(self.path.as_os_str());
        // The bound each part is verified against: its claim group's clock, when the anchors of
        // every part of the group are still those its shard listed.
        let mut bounds: Vec<Option<Stamp>> = vec![None; shards.n as usize];
        let trusted = if self.opts.verify == Verify::Full {
            info!(path = %shown, "--verify full: no claim of the other shards is trusted: walking every part again whole");
            &[][..]
        } else {
            &shards.claims[..]
        };
        for (k, c) in trusted.iter().enumerate() {
            let members = shards.members(k);
            let digests: Vec<AnchorDigest> = members.iter().map(|&i| part_digest(&tops, layout(i))).collect();
            if AnchorDigest::xor(&digests) == c.a {
                members.iter().for_each(|&i| bounds[i as usize] = Some(c.t));
            } else {
                info!(path = %shown, "shards {members:?} of {}: the anchors of their parts changed since they walked (one renamed, added, removed or replaced): walking their parts again", shards.n);
            }
        }
        for i in (0..shards.n).filter(|&i| Some(i) != skip) {
            let bound = bounds[i as usize];
            if bound.is_none() {
                if shards.claim(i).is_none() && self.opts.verify != Verify::Full {
                    info!(path = %shown, "shard {i}/{}: done without a claim to check (its part held mount points, or its anchors could not be listed): walking its part again", shards.n);
                }
                sum.parts.push(i);
            }
            self.walk_part(layout(i), bound, &mut sum);
            // A walk stopped by a signal did not cover its part (the flag stays set once raised);
            // nor did one that the storage's verdict stopped (the pass's report says it).
            sum.stopped = sys::termination();
            if sum.stopped.is_some() || self.fixer.probe().verdict().stops() {
                break;
            }
        }
        Ok(sum)
    }

    /// Walks the part of shard `f` again, its anchor directories verified against `bound`.
    fn walk_part(&self, f: ShardFilter, bound: Option<Stamp>, sum: &mut Summary) {
        let opened = sys::open_subdir(self.root, c".").and_then(|fd| sys::stat_fd(fd.as_fd()).map(|m| (fd, m)));
        let (fd, meta) = match opened {
            Ok(x) => x,
            Err(e) => return self.fixer.error_at(self.path, Op::Open, e),
        };
        let sub = self.fixer.for_part(f, bound);
        Walk::new(self.threads, &sub, &self.root_meta, sys::Devices::from_flag(self.opts.cross_devices)).run(fd, meta);
        let counted = sub.counters();
        sum.entries += counted.entries.get();
        sum.dirs_read += counted.dirs_read.get();
        sum.verified_dirs += counted.verified_dirs.get();
        self.fixer.absorb(sub);
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
}
