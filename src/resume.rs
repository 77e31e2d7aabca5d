//! Resume state of one `apply` (or one shard): what an interrupted run had finished, what this
//! run has finished so far (the checkpoint written to the root now and then), and the repair of
//! files that a killed run left between chown and chmod.
//!
//! Finished work is recorded at any depth: when a directory finishes with nothing left
//! unfinished below it (no error, no entry of another user left as it is), its ordinal goes into
//! its parent's record and its own record goes away (see `frontier`). Only directories on the
//! root's mount are recorded: a nested filesystem (`--cross-devices`) is walked again in full by
//! every resume, as device numbers change between mounts and clones share inodes and times.
//!
//! A resumed walk reads every directory it reaches; where the directory's inode, change time
//! and link count are those of a record (the root's modification time stands in for its change
//! time, which the checkpoint writes themselves change), the subdirectories at recorded
//! ordinals are verified, not read, after the inode at the first ordinal of each range matched
//! (a mismatch drops the record: the rest is read). Verifying a subtree (see `verify`) lists
//! its directories and looks at no file: each directory whose change time is before the
//! record's clock lists what it listed when it was finished; one changed since (an entry moved
//! in, linked, exchanged) is read with everything below it. So a change between two runs inside
//! a finished subtree is always seen. Each record's clock is the filesystem's time read just
//! before the checkpoint write that first carried it, strictly after every change this run
//! made before it (see [`verify::claim`]); a record carried from an older checkpoint
//! keeps its clock, and a subtree verified by this run is recorded again under this run's.
//! Unmatched records are carried into the new checkpoint until their directory is read or the
//! pass ends. The checkpoint keeps the records that save most within [`CHECKPOINT_MAX_BYTES`],
//! or within what the filesystem accepts: a write that does not fit (ENOSPC, E2BIG: ext4 with
//! 1 KiB blocks has ~900 bytes for every xattr of the root) is tried again with half the bytes,
//! and the size that fit is kept. Special-bit records are kept in their own small xattr, written
//! first: a big checkpoint never pushes them out.
//!
//! Where it cannot be kept: on a filesystem without xattrs (ramfs) there is no marker and no
//! checkpoint, so every start walks everything, as before. A write that fails (a full
//! filesystem, a smaller xattr limit) is warned about once and retried at the next interval;
//! a later resume reads again what the last written checkpoint did not cover.
//!
//! Safety: the checkpoint lies on the app-writable root, like the marker. A forged or stale one
//! can only make volprep skip subtrees it would otherwise read (as a forged `done` marker skips
//! all of them): it never makes volprep change anything it would not, nor follow anything, and
//! the `done` marker is still written only by a pass in which every entry it read conformed or
//! was fixed. Special-bit records are checked against the file they name (see
//! [`restore_pending`]). `--verify full` skips nothing on a checkpoint's word.

use std::collections::HashSet;
use std::ffi::CString;
use std::os::fd::BorrowedFd;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use rustix::io::Errno;
use tracing::warn;

use crate::error::errno_text;
use crate::escape::{Escaped, escape_bytes};
use crate::frontier::{Frontier, Record, Seal};
use crate::marker::{self, CHECKPOINT_MAX_BYTES, Checkpoint, Pending};
use crate::options::{ShardFilter, Verify};
use crate::runid::RunId;
use crate::spec::Digest;
use crate::special::SpecialRecord;
use crate::sys::{self, Meta};
use crate::verify::{self, Stamp};
use crate::walk::Node;

mod restore;

pub use restore::{Restored, restore_pending};

/// Resume bookkeeping of an `apply` on a filesystem with xattrs.
pub struct Resume<'a> {
    /// Where the checkpoint and the special-bit records live (one pair of xattrs per shard).
    place: Place<'a>,
    /// The checkpoint's byte bound: a share of [`CHECKPOINT_MAX_BYTES`] (shards share the root's
    /// xattr space), halved each time a write did not fit.
    budget: AtomicUsize,
    /// The root: what is on another mount is neither recorded nor trusted.
    root_meta: Option<Meta>,
    /// The filesystem's time when this run started: the seal of a directory opened by this run
    /// proves it unchanged only if it is older (see [`verify::seal_trusted`]). `None` when it
    /// can't be read (the root can't be changed): then nothing is recorded.
    start: Option<Stamp>,
    /// What the interrupted run had finished (empty under `--verify full`).
    previous: Frontier,
    /// Special-bit records of the interrupted run.
    pub previous_pending: Vec<SpecialRecord>,
    /// Directories whose records in `previous` were found not to hold while they were read.
    dropped: Mutex<HashSet<u64>>,
    /// What this run has finished so far, written to the root now and then.
    current: Mutex<Current>,
    /// How often `current` is written to the root, at most.
    every: Duration,
    /// A failed write was warned about.
    warned: AtomicBool,
    /// Whether a claim's clock waits for the filesystem's clock to move (see [`verify::claim`]).
    patient: AtomicBool,
}

struct Current {
    checkpoint: Checkpoint,
    frontier: Frontier,
    written: Instant,
    /// The special-bit records last written to their xattr (`None`: not known).
    pending_written: Option<Vec<SpecialRecord>>,
}

/// Where a finished directory lies: on the root's filesystem (and device), where its record can
/// be trusted, or elsewhere (see [`Resume::recordable`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fs {
    Root,
    Other,
}

/// When the checkpoint is written: once `--checkpoint-interval` has passed since the last
/// write, or now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum When {
    IfDue,
    Now,
}

/// A checkpoint budget below which halving stops: the records no longer pay for a write.
const MIN_BUDGET: usize = 128;

/// Where the checkpoint lives and how big it may grow.
pub struct Place<'a> {
    pub root: BorrowedFd<'a>,
    pub xattr: CString,
    pub pending_xattr: CString,
    pub max_bytes: usize,
}

impl<'a> Place<'a> {
    /// The unsharded pass's checkpoint, or shard I of N's (a share of the bound each).
    pub fn new(root: BorrowedFd<'a>, shard: Option<ShardFilter>) -> Self {
        let max_bytes = shard.map_or(CHECKPOINT_MAX_BYTES, |f| (CHECKPOINT_MAX_BYTES / f.count as usize).max(600));
        let index = shard.map(|f| f.index);
        Place { root, xattr: marker::checkpoint_xattr(index), pending_xattr: marker::pending_xattr(index), max_bytes }
    }

    /// The checkpoint there, with the special-bit records of its xattr, if they belong to `run`
    /// and `digest`.
    pub fn read(&self, run: &RunId, digest: &Digest) -> Option<Checkpoint> {
        let mut c = marker::read_checkpoint(self.root, &self.xattr).filter(|c| c.run == *run && c.digest == *digest);
        let p = marker::read_pending(self.root, &self.pending_xattr).filter(|p| p.run == *run && p.digest == *digest);
        if let Some(p) = p {
            let c = c.get_or_insert_with(|| Checkpoint::new(run, digest));
            for r in p.pending {
                if !c.pending.contains(&r) {
                    c.pending.push(r);
                }
            }
        }
        c
    }

    /// Removes the checkpoint (its special-bit records stay).
    pub fn remove_checkpoint(&self) -> Result<(), Errno> {
        marker::remove_checkpoint(self.root, &self.xattr)
    }

    /// Removes the checkpoint and the special-bit records.
    pub fn remove(&self) -> Result<(), Errno> {
        let pending = marker::remove_checkpoint(self.root, &self.pending_xattr);
        self.remove_checkpoint().and(pending)
    }
}

impl<'a> Resume<'a> {
    /// `previous`: the interrupted run's checkpoint, whose records skip nothing under
    /// `--verify full` (its special-bit records are kept all the same).
    pub fn new(
        place: Place<'a>,
        previous: Option<Checkpoint>,
        verify: Verify,
        run: &RunId,
        digest: &Digest,
        every: Duration,
    ) -> Self {
        let mut checkpoint = Checkpoint::new(run, digest);
        let (mut frontier, mut pending) = (Frontier::default(), Vec::new());
        if let Some(p) = &previous {
            if verify == Verify::Marker {
                frontier = Frontier::decode(p.records());
            }
            pending = p.pending.clone();
        }
        checkpoint.pending = pending.clone();
        Resume {
            budget: AtomicUsize::new(place.max_bytes),
            root_meta: sys::stat_fd(place.root).ok(),
            start: verify::take(place.root).ok(),
            previous: frontier.clone(),
            previous_pending: pending,
            dropped: Mutex::new(HashSet::new()),
            current: Mutex::new(Current { checkpoint, frontier, written: Instant::now(), pending_written: None }),
            every,
            warned: AtomicBool::new(false),
            patient: AtomicBool::new(true),
            place,
        }
    }

    /// Directory records of the interrupted run and the entries they cover.
    pub fn adopted(&self) -> (usize, u64) {
        (self.previous.len(), self.previous.covered())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Current> {
        crate::sync::lock(&self.current)
    }

    /// The checkpoint to write within `budget` bytes (its special-bit records go elsewhere);
    /// this run's records get the clock `now` (none without one).
    fn bounded(cur: &Current, budget: usize, now: Option<Stamp>) -> Checkpoint {
        let mut c = Checkpoint { pending: Vec::new(), ..cur.checkpoint.clone() };
        let base = c.encode().len();
        // Each record costs its quotes and a comma.
        if let Some(now) = now {
            c.dirs = cur.frontier.encode(now, budget.saturating_sub(base), 3);
        }
        c
    }

    /// Whether `dir` may have records: it is on the root's mount and device (not in a nested
    /// filesystem, nor in a btrfs subvolume, whose snapshots are clones: see [`Meta::on_root_fs`]).
    fn recordable(&self, dir: &Node) -> bool {
        self.root_meta.is_some_and(|root| dir.meta.on_root_fs(&root))
    }

    /// The seal of a directory as read when the walk opened it, before reading it. The root's
    /// change time moves with every checkpoint written on it: its modification time (which
    /// moves with every entry added, removed or renamed in it) stands in.
    fn seal(dir: &Node) -> Seal {
        let (sec, nsec) = if dir.depth == 0 { dir.times.mtime } else { dir.times.ctime };
        Seal { sec, nsec, nlink: dir.meta.nlink }
    }

    /// The records of the interrupted run(s) that hold for `dir` as it is now, with their clocks.
    /// A record whose clock is after this run's start (a clock stepped back, or a forged
    /// checkpoint) holds for nothing.
    fn holding<'s>(&'s self, dir: &Node) -> impl Iterator<Item = (Stamp, &'s Record)> + 's {
        let (seal, ok, start) = (Self::seal(dir), self.recordable(dir), self.start);
        let past = move |c: Stamp| start.is_some_and(|s| c <= s);
        self.previous
            .of(dir.meta.ino)
            .filter(move |(_, r)| ok && r.seal == seal)
            .filter_map(move |(c, r)| Some((c.filter(|&c| past(c))?, r)))
    }

    /// `dir` is about to be read: the records of the interrupted run(s) that hold for it are
    /// carried over, each under its own clock (a claim holds from its own: merged under the
    /// oldest, a subtree re-recorded by a later run would be read again), to be kept until `dir`
    /// finishes; one that does not hold is dropped, and so is this run's own.
    pub fn begin(&self, dir: &Node) {
        if self.previous.is_empty() {
            return;
        }
        let ino = dir.meta.ino;
        let carried: Vec<(Stamp, Record)> = self.holding(dir).map(|(clock, r)| (clock, r.clone())).collect();
        let mut cur = self.lock();
        cur.frontier.remove_all(ino);
        for (clock, r) in carried {
            cur.frontier.insert((ino, Some(clock)), r);
        }
    }

    /// Whether the subdirectory at ordinal `ord` (inode `ino`) of `dir` was finished by an
    /// interrupted run, and if so the clock to verify it against (the latest of the records
    /// that say so). At the first ordinal of a range the inode must be the recorded one, or
    /// every record of `dir` is dropped and skips nothing more of it.
    pub fn was_done(&self, dir: &Node, ino: u64, ord: Option<u32>) -> Option<Stamp> {
        let ord = ord?;
        let mut best: Option<Stamp> = None;
        for (clock, r) in self.holding(dir) {
            let Some(span) = r.span_of(ord) else {
                continue;
            };
            let mut dropped = crate::sync::lock(&self.dropped);
            if dropped.contains(&dir.meta.ino) {
                return None;
            }
            if ord == span.first && ino != span.first_ino {
                // The directory does not list what its records say: none of them skips more of it.
                dropped.insert(dir.meta.ino);
                drop(dropped);
                let mut cur = self.lock();
                let carried: Vec<_> = cur.frontier.of(dir.meta.ino).filter_map(|(c, _)| c).collect();
                carried.into_iter().for_each(|c| drop(cur.frontier.remove((dir.meta.ino, Some(c)))));
                drop(cur);
                warn!(dir = %Escaped(dir.rel_path().as_os_str()), "the checkpoint's record of this directory does not match it: reading all of it");
                return None;
            }
            best = best.max(Some(clock));
        }
        best
    }

    /// `dir` is finished (or verified): if nothing below it is left unfinished, it goes into its
    /// parent's record (its own records are no longer needed). The checkpoint is written when
    /// the interval has passed. Nothing of another mount is recorded, nor anything below a
    /// directory that changed after this run started (its seal proves nothing).
    pub fn finished(&self, dir: &Node) {
        let (Some(parent), Some(ord)) = (dir.parent(), dir.ord()) else {
            return;
        };
        if dir.tainted() {
            return;
        }
        let fs = if self.recordable(dir) { Fs::Root } else { Fs::Other };
        self.record(parent, ord, dir.meta.ino, dir.entries(), fs);
    }

    /// A subdirectory of `parent` (ordinal `ord`, inode `ino`) without subdirectories was
    /// verified unchanged without being opened: finished, as by [`Resume::finished`].
    pub fn finished_leaf(&self, parent: &Node, ord: Option<u32>, ino: u64) {
        if let Some(ord) = ord {
            self.record(parent, ord, ino, 1, Fs::Root);
        }
    }

    /// The subdirectory at ordinal `ord` (inode `ino`, on filesystem `fs`) of `parent` is
    /// finished, covering `covered` entries: its own records go, and it joins `parent`'s record
    /// (written out when the interval has passed) if it and `parent` may be recorded.
    fn record(&self, parent: &Node, ord: u32, ino: u64, covered: u64, fs: Fs) {
        let mut cur = self.lock();
        cur.frontier.remove_all(ino);
        let seal = Self::seal(parent);
        let trusted = self.start.is_some_and(|start| verify::seal_trusted(seal.at(), start));
        if !trusted || fs != Fs::Root || !self.recordable(parent) {
            return;
        }
        cur.frontier.finish(parent.meta.ino, seal, ord, ino, covered);
        // A failed write is warned about (once) inside: it only costs a later resume re-reading.
        let _ = self.flush(cur, When::IfDue);
    }

    /// Records (and writes at once, in its own xattr) the mode a setuid/setgid file must get
    /// back if this run is killed between its chown and chmod.
    pub fn stage_pending(&self, record: SpecialRecord) -> Result<(), Errno> {
        let mut cur = self.lock();
        cur.checkpoint.pending.push(record);
        self.write_pending(&mut cur)
    }

    /// Replaces the pending records taken over from the interrupted run with those still needed
    /// (see [`Restored::kept`]); written out with the next checkpoint.
    pub fn keep_pending(&self, kept: Vec<SpecialRecord>) {
        self.lock().checkpoint.pending = kept;
    }

    /// Drops a pending record (written out with the next checkpoint).
    pub fn forget_pending(&self, record: &SpecialRecord) {
        self.lock().checkpoint.pending.retain(|p| p != record);
    }

    /// Writes the checkpoint now (at the end of an interrupted pass).
    pub fn write(&self) -> Result<(), Errno> {
        let cur = self.lock();
        self.flush(cur, When::Now)
    }

    /// Writes the checkpoint and the special-bit records `when` says, warning (once) when that
    /// fails.
    fn flush(&self, mut cur: std::sync::MutexGuard<'_, Current>, when: When) -> Result<(), Errno> {
        if when == When::IfDue && cur.written.elapsed() < self.every {
            return Ok(());
        }
        cur.written = Instant::now();
        // The clock of this run's records: read after every one of them was made, so it is
        // later than anything this run did to the subtrees they name (see `verify`).
        let now = verify::claim(self.place.root, &self.patient).ok();
        let pending = self.write_pending(&mut cur);
        let res = self.write_bounded(&cur, now).and(pending);
        if let Err(e) = res {
            if !self.warned.swap(true, Ordering::Relaxed) {
                warn!(
                    "cannot write the resume checkpoint ({}): {}; a resumed run may read again what it did not record",
                    escape_bytes(self.place.xattr.as_bytes()),
                    errno_text(e.raw_os_error())
                );
            }
        }
        res
    }

    /// Writes the special-bit records if they changed since last written. Where they do not
    /// fit, the checkpoint gives way (removed now, rewritten within half its budget later).
    fn write_pending(&self, cur: &mut Current) -> Result<(), Errno> {
        if cur.pending_written.as_ref() == Some(&cur.checkpoint.pending) {
            return Ok(());
        }
        let c = &cur.checkpoint;
        let p = Pending { run: c.run.clone(), digest: c.digest.clone(), pending: c.pending.clone() };
        let mut res = marker::write_pending(self.place.root, &self.place.pending_xattr, &p);
        if res.is_err_and(marker::no_room) {
            self.budget.fetch_min((self.budget.load(Ordering::Relaxed) / 2).max(MIN_BUDGET), Ordering::Relaxed);
            let _ = marker::remove_checkpoint(self.place.root, &self.place.xattr);
            res = marker::write_pending(self.place.root, &self.place.pending_xattr, &p);
        }
        if res.is_ok() {
            cur.pending_written = Some(p.pending);
        }
        res
    }

    /// Writes the checkpoint within the byte budget; where it does not fit, halves the budget
    /// and tries again. The budget that fit is kept for the later writes.
    fn write_bounded(&self, cur: &Current, now: Option<Stamp>) -> Result<(), Errno> {
        loop {
            let budget = self.budget.load(Ordering::Relaxed);
            match marker::write_checkpoint(self.place.root, &self.place.xattr, &Self::bounded(cur, budget, now)) {
                Err(e) if marker::no_room(e) && budget > MIN_BUDGET => {
                    self.budget.store((budget / 2).max(MIN_BUDGET), Ordering::Relaxed);
                }
                other => return other,
            }
        }
    }
}
