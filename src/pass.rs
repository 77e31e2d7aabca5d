//! The visitor of one pass: decides each entry, fixes it in `apply` (unprivileged: only the
//! entries this user owns; the others that do not conform are listed), counts everything, and
//! feeds the resume state (finished subtrees at any depth, special bits in flight). `config`
//! builds it, `tally` keeps its counts and lists; with `--modes app-safe`, `places` says which
//! entries are app-private paths.

mod config;
mod places;
mod tally;

pub use config::{FixerConfig, may_change};
pub use places::{Places, Proof, root_place};
use tally::Contents;

use std::ffi::CStr;
use std::os::fd::BorrowedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use rustix::io::Errno;
use tracing::{debug, warn};

use crate::apps::Private;
use crate::error::Op;
use crate::escape::{Escaped, escape_bytes};
use crate::fix::{self, Cause, Failure, Fixed, How, Readback, SetgidRule, Task, Through, Verdict};
use crate::honour::experiment::{self, CACHE_WAIT, Chowner};
use crate::honour::{Outcome, Probe};
use crate::marker;
use crate::options::{Mode, Privilege, ShardFilter};
use crate::progress::Counters;
use crate::report::{ErrorList, ForeignList};
use crate::resume::Resume;
use crate::spec::Spec;
use crate::special::SpecialRecord;
use crate::sys::{self, Kind, Meta};
use crate::verify::Stamp;
use crate::walk::{self, At, Descend, Dir, Needed, Node, Visitor};

/// Decides, fixes and counts. Shared by every walker thread: counters are atomics; the error
/// list, mount list and checkpoint take a lock only on their (rare) events.
pub struct Fixer<'a> {
    root: &'a Path,
    spec: &'a Spec,
    mode: Mode,
    counters: Counters,
    errors: Mutex<ErrorList>,
    skipped_mounts: Mutex<Vec<PathBuf>>,
    /// Mount points met (entered or not), relative to the root: what they hide was not walked,
    /// so no directory above one is recorded finished, a shard whose part holds one claims
    /// nothing, and a `done` marker is written only while every one is still mounted.
    mount_points: Mutex<Vec<Vec<u8>>>,
    resume: Option<Resume<'a>>,
    shard: Option<ShardFilter>,
    verify_part: Option<Stamp>,
    privilege: Privilege,
    /// The first entries of other users left as they are (unprivileged).
    foreign: Mutex<ForeignList>,
    /// When a directory's setgid bit is sure to stick (`apply`; else it is always read back).
    setgid: SetgidRule,
    /// Whether the storage honours ownership changes, from the first ones (`apply`): one for
    /// the pass and its walks of other shards' parts (see [`Fixer::for_part`]).
    probe: Arc<Probe>,
    /// What a regular file's change goes through (a file opened for reading on ceph-fuse).
    through: Through,
    may_change: bool,
    /// The ids this process's user namespace maps (an EPERM on an entry of an unmapped owner is
    /// that entry's, not the storage's).
    mapped: sys::Mapped,
    /// `--modes app-safe`: which entries are app-private paths, and which were tightened.
    places: Option<Places>,
}

impl<'a> Fixer<'a> {
    /// The checkpoint this pass keeps, if any.
    pub fn resume(&self) -> Option<&Resume<'a>> {
        self.resume.as_ref()
    }

    /// What the pass's changes say of the storage (see `honour`).
    pub fn probe(&self) -> &Probe {
        &self.probe
    }

    /// Counts and fixes the root of a sharded volume (`root`, whose metadata is `meta`), which
    /// the run that completes the volume does last. A failure is tried once more from what the
    /// root is now (a concurrent writer), then counted and listed with the root's own cause, as
    /// an entry's is (an inode flag, an owner not mapped into this user namespace). Returns
    /// whether the root conforms now.
    pub fn fix_root(&self, root: BorrowedFd<'_>, meta: &Meta) -> bool {
        self.counters.seen(Kind::Dir);
        let private = root_place(root, self.spec);
        let fix = |m: &Meta| fix::fix_dir(root, m, self.spec, private, &self.setgid, Readback::No);
        let outcome = match fix(meta) {
            // What the first try changed is counted here; the second decides from the rest.
            Err(f) => {
                self.count_change(&f.done);
                let first = Failure { done: fix::Change::default(), ..f };
                sys::stat_fd(root).map_or(Err(first), |now| fix(&now))
            }
            done => done,
        };
        match self.explained(outcome, meta, || sys::locked_at(root, c"")) {
            Ok(fixed) => {
                self.count(&fixed);
                true
            }
            Err(f) => {
                self.root_failed(f);
                false
            }
        }
    }

    /// Counts and records an entry at an app-private path that lost bits (see `places`).
    fn tightened(&self, private: Option<Private>, outcome: &Result<Fixed, Failure>, path: impl FnOnce() -> PathBuf) {
        if let (Some(places), Ok(fixed)) = (&self.places, outcome) {
            if places.record(private, fixed, self.mode, || walk::full_path(self.root, &path())) {
                self.counters.tightened.inc();
            }
        }
    }

    /// Whether to read the next change back (see `honour`); waits for an experiment under way.
    fn readback(&self) -> Readback {
        if self.mode == Mode::Apply && self.probe.wants_readback() {
            self.probe.settle();
            Readback::Yes
        } else {
            Readback::No
        }
    }

    /// Tells the probe what a change (made with `readback`) did; when that makes the experiment
    /// due, makes it in `dir` (the entry's directory, or the directory itself).
    fn tell_probe(&self, at: At<'_>, dir: BorrowedFd<'_>, readback: Readback, outcome: &Result<Fixed, Failure>) {
        let seen = match outcome {
            Ok(f) if readback == Readback::Yes && !f.change.is_none() => Outcome::Held,
            Err(f) if f.cause == Cause::Ignored => Outcome::Ignored,
            Err(f) if self.may_change && f.plain_refusal() => Outcome::Refused,
            _ => return,
        };
        if self.probe.record(seen, || walk::full_path(self.root, &at.rel_path()).display().to_string()) {
            self.experiment(dir);
        }
    }

    /// Makes the experiment that proves what the storage does with ownership changes, in `dir`
    /// (see `honour::experiment`), unless it was made; logs what it found.
    pub fn experiment(&self, dir: BorrowedFd<'_>) {
        let who = match self.privilege {
            Privilege::Full => Chowner::Privileged,
            Privilege::Unprivileged { uid } => Chowner::Unprivileged { uid },
        };
        let mut made = false;
        let proof = self.probe.prove(|| {
            made = true;
            experiment::run(dir, self.spec.gid(), who, CACHE_WAIT)
        });
        if made && !proof.verdict.stops() {
            let honours = proof.verdict == crate::honour::Verdict::Honours;
            let what =
                if honours { "the storage honours ownership changes" } else { "volprep's own test proved nothing" };
            warn!(path = %Escaped(self.root.as_os_str()), evidence = proof.evidence.as_str(),
                  "changes did not hold on some entries, but {what}: they are counted as errors of their own");
        }
    }

    /// After the walk: the experiment, if entries were suspect and none held (see `honour`),
    /// in the root `root`.
    pub fn conclude(&self, root: BorrowedFd<'_>) {
        if self.mode == Mode::Apply && self.probe.due_at_end() {
            self.experiment(root);
        }
    }

    /// A failed change with its entry's own cause, if one explains its EPERM: an inode flag
    /// (`locked`), or an owner unmapped in this user namespace (`meta`).
    fn explained(
        &self,
        outcome: Result<Fixed, Failure>,
        meta: &Meta,
        locked: impl FnOnce() -> Option<sys::Locked>,
    ) -> Result<Fixed, Failure> {
        outcome.map_err(|f| f.explained(locked, meta, &self.mapped))
    }

    /// Records `dir` as finished work for resume, counted with its entries (and `itself`, unless
    /// it is another shard's) into its parent's.
    fn finish_resumable(&self, dir: &Dir<'_>, itself: Itself) {
        if let Some(r) = &self.resume {
            if itself == Itself::Counted {
                dir.add_entries(1);
            }
            r.finished(dir);
            if let Some(p) = dir.parent() {
                p.add_entries(dir.entries());
            }
        }
    }

    fn path_of(&self, dir: &Node, name: Option<&CStr>) -> PathBuf {
        let rel = match name {
            Some(n) => walk::rel_child(dir, n),
            None => dir.rel_path(),
        };
        walk::full_path(self.root, &rel)
    }

    /// Unprivileged: a subdirectory of another user that this user may not open. It does not
    /// conform (a conforming one is open to its group, which this user is in): it is left and
    /// listed, its contents unchecked. Returns false when that does not apply (a real error).
    fn unreadable(&self, parent: &Dir<'_>, name: &CStr) -> bool {
        let Ok(meta) = crate::sys::stat_at(parent.fd(), name) else {
            return false;
        };
        let private = self.places.as_ref().and_then(|p| p.of_unread_dir(parent, name));
        match fix::judge(&meta, self.spec, private, self.privilege) {
            Verdict::NotOurs(change) => {
                self.counters.seen(meta.kind());
                self.left(parent, Some(name), &meta, change, Contents::Unread);
                true
            }
            Verdict::Fix(_) => false,
        }
    }

    /// A mount point `name` in `parent` (of this shard's part: returns whether it is). What the
    /// mount hides (a directory or file of the volume's own filesystem under the same name) is
    /// not walked, and shows again once it is unmounted: `parent` and every directory above it
    /// are not finished work, so no resume verifies them on this run's word.
    fn mount_point(&self, parent: &Dir<'_>, name: &CStr) -> bool {
        if self.shard.is_some_and(|s| !s.owns(parent.depth + 1, || walk::rel_child(parent, name))) {
            return false;
        }
        let rel = walk::rel_child(parent, name);
        crate::sync::lock(&self.mount_points).push(rel.as_os_str().as_bytes().to_vec());
        parent.taint();
        true
    }

    /// Counts, judges and (in `apply`) fixes a directory whose contents are all visited.
    fn fix_dir(&self, dir: &Dir<'_>) {
        self.counters.seen(Kind::Dir);
        let private = self.places.as_ref().and_then(|p| p.of_dir(dir));
        if let Verdict::NotOurs(change) = fix::judge(&dir.meta, self.spec, private, self.privilege) {
            return self.left(dir, None, &dir.meta, change, Contents::Read);
        }
        let readback = self.readback();
        let fix = |meta: &Meta| fix::fix_dir(dir.fd(), meta, self.spec, private, &self.setgid, readback);
        let outcome = match self.mode {
            Mode::Check => Ok(Fixed::decided(&dir.meta, self.spec, private)),
            Mode::Apply => match fix(&dir.meta) {
                // A writer may have changed it back meanwhile: once more, from what it is now.
                Err(f) if f.cause == Cause::Ignored => sys::stat_fd(dir.fd()).map_or(Err(f), |now| fix(&now)),
                other => other,
            },
        };
        let outcome = self.explained(outcome, &dir.meta, || sys::locked_at(dir.fd(), c""));
        self.tell_probe(At::Dir(dir), dir.fd(), readback, &outcome);
        self.tightened(private, &outcome, || dir.rel_path());
        self.record(At::Dir(dir), outcome);
    }

    /// Fixes a regular file whose setuid/setgid bits its chown will clear: the mode to restore
    /// is recorded on the root first, so a kill between chown and chmod can be repaired.
    fn fix_special(
        &self,
        resume: &Resume<'_>,
        (dir, name): (&Dir<'_>, &CStr),
        meta: &Meta,
        private: Option<Private>,
        pin: Option<BorrowedFd<'_>>,
    ) -> Result<Fixed, Failure> {
        let change = fix::decide_at(meta, self.spec, private);
        let rel = escape_bytes(walk::rel_child(dir, name).as_os_str().as_bytes());
        let record = SpecialRecord { path: rel, ino: meta.ino, mode: change.mode.unwrap_or(meta.perm()) };
        // Best effort: if the record can't be kept (too long a path, a full filesystem), the file
        // is fixed all the same, as the kubelet would, just without the crash-safety net.
        if record.path.len() > marker::CHECKPOINT_MAX_BYTES / 4 || resume.stage_pending(record.clone()).is_err() {
            resume.forget_pending(&record);
            debug!(path = %record.path, "cannot record the mode to restore on the root; fixing without it");
            return self.fix_one(dir, name, meta, private, pin);
        }
        let out = self.fix_one(dir, name, meta, private, pin);
        resume.forget_pending(&record);
        out
    }

    /// One non-directory entry, seen by name (`pin: None`) or through a pin of it. Returns
    /// whether `apply` had a change to make (the walk then pins the next entries first).
    fn one_entry(&self, parent: &Dir<'_>, name: &CStr, meta: &Meta, pin: Option<BorrowedFd<'_>>) -> Needed {
        // The experiment's file of a pass killed while it waited: removed, never counted.
        if self.mode == Mode::Apply && experiment::remove_stale(parent.fd(), name, meta) {
            return Needed::Nothing;
        }
        if let Some(p) = &self.places {
            p.note(parent, name, meta);
        }
        if self.shard.is_some_and(|s| !s.owns(parent.depth + 1, || walk::rel_child(parent, name))) {
            return Needed::Nothing;
        }
        self.counters.seen_meta(meta);
        if self.resume.is_some() {
            parent.add_entries(1);
        }
        let private = self.places.as_ref().and_then(|p| p.of_entry(parent, name, meta.kind()));
        if let Some(p) = &self.places {
            p.warn_held_back(private, meta, || walk::full_path(self.root, &walk::rel_child(parent, name)));
        }
        if let Verdict::NotOurs(change) = fix::judge(meta, self.spec, private, self.privilege) {
            self.left(parent, Some(name), meta, change, Contents::Read);
            return Needed::Nothing;
        }
        let outcome = match (self.mode, &self.resume) {
            (Mode::Check, _) => Ok(Fixed::decided(meta, self.spec, private)),
            (Mode::Apply, Some(r)) if needs_special_care(meta, self.spec) => {
                self.fix_special(r, (parent, name), meta, private, pin)
            }
            (Mode::Apply, _) => self.fix_one(parent, name, meta, private, pin),
        };
        self.tightened(private, &outcome, || walk::rel_child(parent, name));
        self.note_again(parent, name, meta, &outcome);
        // A failed change was a change to make all the same: its neighbours likely need one too.
        let changed = self.mode == Mode::Apply && outcome.as_ref().map_or(true, |f| !f.change.is_none());
        self.record(At::Entry(*parent, name), outcome);
        if changed { Needed::Change } else { Needed::Nothing }
    }

    /// A sign with several names proves nothing; but its chown may have copied it up into an
    /// inode of its own (overlayfs): noted again as it is now, for its directory's decision.
    fn note_again(&self, parent: &Dir<'_>, name: &CStr, meta: &Meta, outcome: &Result<Fixed, Failure>) {
        let Some(p) = &self.places else { return };
        if meta.nlink > 1 && outcome.as_ref().is_ok_and(|f| f.change.owner()) {
            if let Ok(now) = sys::stat_at(parent.fd(), name) {
                p.note(parent, name, &now);
            }
        }
    }

    /// Fixes one non-directory entry (reading it back while the probe wants it).
    fn fix_one(
        &self,
        dir: &Dir<'_>,
        name: &CStr,
        meta: &Meta,
        private: Option<Private>,
        pin: Option<BorrowedFd<'_>>,
    ) -> Result<Fixed, Failure> {
        let readback = self.readback();
        let task =
            Task { spec: self.spec, private, how: How { readback, through: self.through }, setgid: &self.setgid };
        let fix = |meta: &Meta| match pin {
            Some(pin) => fix::fix_pinned(pin, meta, task),
            None => fix::fix_entry(dir.fd(), name, meta, task, |d, n| dir.with_fd_relief(|| sys::pin_at(d, n))),
        };
        let outcome = match fix(meta) {
            // A writer may have changed it back meanwhile: once more, from what it is now.
            Err(f) if f.cause == Cause::Ignored => {
                let now = pin.map_or_else(|| sys::stat_at(dir.fd(), name), sys::stat_fd);
                now.map_or(Err(f), |now| fix(&now))
            }
            other => other,
        };
        let locked = || match pin {
            Some(pin) => sys::locked_at(pin, c""),
            None => sys::locked_at(dir.fd(), name),
        };
        let outcome = self.explained(outcome, meta, locked);
        self.tell_probe(At::Entry(*dir, name), dir.fd(), readback, &outcome);
        outcome
    }
}

impl Visitor for Fixer<'_> {
    fn entry(&self, parent: &Dir<'_>, name: &CStr, meta: &Meta) -> Needed {
        self.one_entry(parent, name, meta, None)
    }

    fn pinned_entry(&self, parent: &Dir<'_>, name: &CStr, meta: &Meta, pin: BorrowedFd<'_>) -> Needed {
        self.one_entry(parent, name, meta, Some(pin))
    }

    fn dir_done(&self, dir: &Dir<'_>) {
        let owned = self.shard.is_none_or(|s| s.owns(dir.depth, || dir.rel_path()));
        if owned {
            self.fix_dir(dir);
        }
        // A failure (or an entry left) marked `dir` and its ancestors: then it is not finished
        // work. A shard's part of a directory it does not own is.
        self.finish_resumable(dir, if owned { Itself::Counted } else { Itself::OtherShards });
    }

    fn mount_skipped(&self, parent: &Dir<'_>, name: &CStr, meta: &Meta) {
        if let Some(p) = &self.places {
            p.note(parent, name, meta);
        }
        if self.mount_point(parent, name) {
            let path = self.path_of(parent, Some(name));
            warn!(path = %Escaped(path.as_os_str()), "nested mount not entered (use --cross-devices to enter it)");
            crate::sync::lock(&self.skipped_mounts).push(path);
        }
    }

    fn mount_crossed(&self, parent: &Dir<'_>, name: &CStr, _meta: &Meta) {
        self.mount_point(parent, name);
    }

    fn placeholder(&self, parent: &Dir<'_>, name: &CStr, _meta: &Meta) {
        if tracing::enabled!(tracing::Level::DEBUG) {
            let path = self.path_of(parent, Some(name));
            debug!(path = %Escaped(path.as_os_str()), "the stand-in of a btrfs subvolume a snapshot did not include: empty, takes no change, left as it is");
        }
    }

    fn enter(&self, parent: &Dir<'_>, name: &CStr, ino: u64, ord: Option<u32>) -> Descend {
        if let Some(p) = &self.places {
            p.note_dir(parent, name);
        }
        let depth = parent.depth + 1;
        if self.shard.is_some_and(|s| depth == s.depth && !s.owns(depth, || walk::rel_child(parent, name))) {
            return Descend::Skip;
        }
        // Below a verified directory, whatever is not skipped is verified against the same bound.
        if let Some(bound) = parent.verified_against() {
            return Descend::Verify(bound);
        }
        if let (Some(s), Some(bound)) = (self.shard, self.verify_part) {
            if depth == s.depth {
                return Descend::Verify(bound);
            }
        }
        let Some(clock) = self.resume.as_ref().and_then(|r| r.was_done(parent, ino, ord)) else {
            return Descend::Read;
        };
        self.counters.skipped_subtrees.inc();
        if tracing::enabled!(tracing::Level::DEBUG) {
            let path = self.path_of(parent, Some(name));
            debug!(path = %Escaped(path.as_os_str()), "finished by the interrupted run: verified, not read again");
        }
        Descend::Verify(clock)
    }

    fn listed(&self, dir: &Dir<'_>, others: u64) {
        self.counters.verified_dirs.inc();
        if self.resume.is_some() {
            dir.add_entries(others);
        }
    }

    fn verified_leaf(&self, parent: &Dir<'_>, _name: &CStr, ord: Option<u32>, meta: &Meta) {
        self.counters.verified_dirs.inc();
        if let Some(r) = &self.resume {
            parent.add_entries(1);
            r.finished_leaf(parent, ord, meta.ino);
        }
    }

    fn dir_verified(&self, dir: &Dir<'_>) {
        self.finish_resumable(dir, Itself::Counted);
    }

    fn dir_read(&self, dir: &Dir<'_>) {
        self.counters.dirs_read.inc();
        if let Some(r) = &self.resume {
            r.begin(dir);
        }
    }

    fn stopped(&self) -> bool {
        sys::termination().is_some() || self.probe.verdict().stops()
    }

    fn error(&self, at: At<'_>, op: Op, errno: Errno) {
        if let (Privilege::Unprivileged { .. }, Op::Open, Errno::ACCESS, At::Entry(dir, name)) =
            (self.privilege, op, errno, at)
        {
            if self.unreadable(&dir, name) {
                return;
            }
        }
        at.dir().taint();
        self.error_at(&walk::full_path(self.root, &at.rel_path()), op, errno);
    }
}

/// Whether a finished directory counts itself among the entries of its parent's resume record:
/// not when it is another shard's (this shard only walked through it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Itself {
    Counted,
    OtherShards,
}

/// A regular file with setuid/setgid bits that a chown is about to clear.
fn needs_special_care(meta: &Meta, spec: &Spec) -> bool {
    meta.kind() == Kind::File && meta.perm() & (libc::S_ISUID | libc::S_ISGID) != 0 && fix::decide(meta, spec).owner()
}
