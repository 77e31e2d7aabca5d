//! The visitor of one pass: decides each entry, fixes it in `apply` (unprivileged: only the
//! entries this user owns; the others that do not conform are listed), counts everything, and
//! feeds the resume state (finished subtrees at any depth, special bits in flight). With
//! `--modes app-safe`, `places` says which entries are app-private paths.

mod places;

pub use places::{Places, root_place};

use std::ffi::CStr;
use std::os::fd::BorrowedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use rustix::io::Errno;
use tracing::{debug, warn};

use crate::apps::Private;
use crate::caps;
use crate::error::Op;
use crate::escape::{Escaped, EscapedPath, escape_bytes};
use crate::fix::{self, Cause, Change, Failure, Fixed, How, Readback, SetgidRule, Task, Through, Verdict};
use crate::honour::{Outcome, Probe};
use crate::marker;
use crate::options::{Mode, Privilege, ShardFilter};
use crate::progress::Counters;
use crate::report::{EntryError, ErrorList, ForeignEntry, ForeignList, Timing, VolumeReport};
use crate::resume::{self, Resume};
use crate::spec::Spec;
use crate::special::SpecialRecord;
use crate::state::Stop;
use crate::sys::{self, Kind, Meta};
use crate::throttle::Storage;
use crate::verify::Stamp;
use crate::walk::{self, At, Descend, Dir, Node, Visitor};

/// What a pass's [`Fixer`] is built from: filled by the lifecycle (or by the run that checks
/// the other shards' parts), the same for the whole pass.
pub struct FixerConfig<'a> {
    /// The volume root as given: the paths of logs and of the report start with it.
    pub root: &'a Path,
    pub spec: &'a Spec,
    pub mode: Mode,
    /// Unprivileged: only entries this user owns are changed.
    pub privilege: Privilege,
    /// EPERM on a chown or chmod is the storage's refusal, not a missing capability: this
    /// process may make every change it attempts (see [`may_change`]).
    pub may_change: bool,
    /// For `--shard I/N`: only the entries this shard owns are fixed and counted.
    pub shard: Option<ShardFilter>,
    /// With `shard`, for the run that completes a sharded volume: the part's anchor
    /// directories are verified against this bound (`Descend::Verify`) rather than read.
    pub verify_part: Option<Stamp>,
    /// The checkpoint this pass keeps (and the interrupted run's it continues), if any.
    pub resume: Option<Resume<'a>>,
}

/// Decides, fixes and counts. Shared by every walker thread: counters are atomics; the error
/// list, mount list and checkpoint take a lock only on their (rare) events.
pub struct Fixer<'a> {
    root: &'a Path,
    spec: &'a Spec,
    mode: Mode,
    counters: Counters,
    errors: Mutex<ErrorList>,
    skipped_mounts: Mutex<Vec<PathBuf>>,
    /// Mount points met (entered or not): what they hide was not walked, so no directory above
    /// one is recorded finished, and a shard whose part holds one claims nothing.
    mount_points: AtomicU64,
    resume: Option<Resume<'a>>,
    shard: Option<ShardFilter>,
    verify_part: Option<Stamp>,
    privilege: Privilege,
    /// The first entries of other users left as they are (unprivileged).
    foreign: Mutex<ForeignList>,
    /// When a directory's setgid bit is sure to stick (`apply`; else it is always read back).
    setgid: SetgidRule,
    /// Whether the storage honours ownership changes, from the first ones (`apply`).
    probe: Probe,
    /// What a regular file's change goes through (a file opened for reading on ceph-fuse).
    through: Through,
    may_change: bool,
    /// `--modes app-safe`: which entries are app-private paths, and which were tightened.
    places: Option<Places>,
}

impl<'a> Fixer<'a> {
    /// The fixer of a pass as `config` says; in `apply`, what the volume's filesystem and this
    /// process's credentials say about setgid bits and regular files is looked up here.
    pub fn new(config: FixerConfig<'a>) -> Self {
        let FixerConfig { root, spec, mode, privilege, may_change, shard, verify_part, resume } = config;
        Fixer {
            root,
            spec,
            mode,
            counters: Counters::default(),
            errors: Mutex::default(),
            skipped_mounts: Mutex::new(Vec::new()),
            mount_points: AtomicU64::new(0),
            resume,
            shard,
            verify_part,
            privilege,
            foreign: Mutex::default(),
            setgid: if mode == Mode::Apply { setgid_rule(root) } else { SetgidRule::default() },
            probe: Probe::default(),
            through: if mode == Mode::Apply { through(root) } else { Through::Pin },
            may_change,
            places: Places::of(spec),
        }
    }

    /// What the pass counted so far.
    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    /// The checkpoint this pass keeps, if any.
    pub fn resume(&self) -> Option<&Resume<'a>> {
        self.resume.as_ref()
    }

    /// What the pass's changes say of the storage (see `honour`).
    pub fn probe(&self) -> &Probe {
        &self.probe
    }

    /// How many mount points the pass met (see [`Visitor::mount_skipped`]).
    pub fn mount_points(&self) -> u64 {
        self.mount_points.load(Ordering::Relaxed)
    }

    /// Adds what `from` (a walk of another shard's part) changed, failed and listed to this
    /// pass's counts; the entries it looked at again are not this pass's part (each part is
    /// counted once, by its shard).
    pub fn absorb(&self, from: Fixer<'_>) {
        let (a, b) = (&self.counters, &from.counters);
        for (x, y) in [
            (&a.changed_owner, &b.changed_owner),
            (&a.changed_mode, &b.changed_mode),
            (&a.errors, &b.errors),
            (&a.dirs_read, &b.dirs_read),
            (&a.verified_dirs, &b.verified_dirs),
            (&a.foreign_owned, &b.foreign_owned),
            (&a.foreign_unread, &b.foreign_unread),
        ] {
            x.add(y.get());
        }
        crate::sync::lock(&self.errors).append(crate::sync::into_inner(from.errors));
        crate::sync::lock(&self.skipped_mounts).extend(crate::sync::into_inner(from.skipped_mounts));
        self.mount_points.fetch_add(from.mount_points.into_inner(), Ordering::Relaxed);
        crate::sync::lock(&self.foreign).append(crate::sync::into_inner(from.foreign));
    }

    /// Counts and fixes the root of a sharded volume (`root`, whose metadata is `meta`), which
    /// the run that completes the volume does last; a failure is counted and listed. Returns
    /// whether the root conforms now.
    pub fn fix_root(&self, root: BorrowedFd<'_>, meta: &Meta) -> bool {
        self.counters.seen(Kind::Dir);
        let private = root_place(root, self.spec);
        match fix::fix_dir(root, meta, self.spec, private, &self.setgid, Readback::No) {
            Ok(fixed) => {
                self.count(&fixed);
                true
            }
            Err(e) => {
                self.count_change(&e.done);
                match e.errno() {
                    Some(errno) => self.error_at(self.root, e.op, errno),
                    None => self.error_note(
                        self.root,
                        e.op,
                        format!("{} reported success, but did not change the root (the storage ignores it)", e.op),
                    ),
                }
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

    /// Whether to read the next change back (see `honour`).
    fn readback(&self) -> Readback {
        if self.mode == Mode::Apply && self.probe.wants_readback() { Readback::Yes } else { Readback::No }
    }

    /// Tells the probe what a change (made with `readback`) did.
    fn tell_probe(&self, at: At<'_>, readback: Readback, outcome: &Result<Fixed, Failure>) {
        let seen = match outcome {
            Ok(f) if readback == Readback::Yes && !f.change.is_none() => Outcome::Held,
            Err(f) if f.cause == Cause::Ignored => Outcome::Ignored,
            Err(f) if self.may_change && f.errno() == Some(Errno::PERM) && matches!(f.op, Op::Chown | Op::Chmod) => {
                Outcome::Refused
            }
            _ => return,
        };
        self.probe.record(seen, || walk::full_path(self.root, &at.rel_path()).display().to_string());
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

    /// Counts the outcome of one entry's decision or fix.
    fn record(&self, at: At<'_>, outcome: Result<Fixed, Failure>) {
        match outcome {
            Ok(fixed) => {
                let change = fixed.change;
                self.count(&fixed);
                if !change.is_none() && tracing::enabled!(tracing::Level::DEBUG) {
                    let path = walk::full_path(self.root, &at.rel_path());
                    let verb = if self.mode == Mode::Check { "would change" } else { "changed" };
                    let show = |v: Option<u32>| v.map_or_else(|| "-".to_string(), |v| v.to_string());
                    debug!(path = %Escaped(path.as_os_str()), uid = show(change.uid).as_str(),
                           gid = show(change.gid).as_str(),
                           mode = change.mode.map_or_else(|| "-".to_string(), |m| format!("{m:04o}")).as_str(), "{verb}");
                }
            }
            Err(f) if f.errno() == Some(Errno::NOENT) => self.count_change(&f.done),
            Err(f) => {
                // What did change on disk before the failure is counted like any change.
                self.count_change(&f.done);
                // Until a change is seen to hold, a change the storage ignored or refused may
                // be the first of many: logged at debug, the verdict says it once.
                let quiet = self.may_change && !self.probe.held();
                match f.cause {
                    Cause::Errno(e) if quiet && e == Errno::PERM => self.quiet_error(at, f.op, e),
                    Cause::Errno(e) => self.error(at, f.op, e),
                    Cause::Ignored => self.ignored(at, f.op),
                }
            }
        }
    }

    /// Counts what did change on disk before a failure (any chmod made counts as a mode change).
    fn count_change(&self, change: &Change) {
        self.tally(Changed { owner: change.owner(), mode: change.mode.is_some() });
    }

    /// Counts an entry fixed (or, in check, decided): its owner and/or its mode, final against
    /// initial.
    fn count(&self, fixed: &Fixed) {
        self.tally(Changed { owner: fixed.change.owner(), mode: fixed.mode_changed() });
    }

    fn tally(&self, changed: Changed) {
        if changed.owner {
            self.counters.changed_owner.inc();
        }
        if changed.mode {
            self.counters.changed_mode.inc();
        }
    }

    /// An entry of another user that does not conform: left as it is, counted and listed (with
    /// what a privileged run would change), and no directory above it is finished.
    fn left(&self, dir: &Node, name: Option<&CStr>, meta: &Meta, change: Change, contents: Contents) {
        let unread = contents == Contents::Unread;
        self.counters.foreign_owned.inc();
        if unread {
            self.counters.foreign_unread.inc();
        }
        dir.taint();
        let entry = || ForeignEntry {
            path: EscapedPath::new(self.path_of(dir, name)),
            uid: meta.uid,
            gid: meta.gid,
            mode: format!("{:04o}", meta.perm()),
            want_gid: change.gid,
            want_mode: change.mode.map(|m| format!("{m:04o}")),
            unread,
        };
        let mut list = crate::sync::lock(&self.foreign);
        if tracing::enabled!(tracing::Level::DEBUG) {
            let e = entry();
            debug!(path = %e.path, uid = e.uid, gid = e.gid, mode = e.mode.as_str(), unread,
                   "owned by another user and does not conform: left as it is");
            list.push(e);
        } else {
            list.push_with(entry);
        }
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

    /// Moves the counts, the error list and the skipped mounts into `r`, with the signal that
    /// stopped the pass (`stop`), if one did.
    pub fn fill(self, r: &mut VolumeReport, stop: Option<Stop>, elapsed: Duration) {
        r.counts = self.counters.snapshot();
        r.interrupted = stop;
        if r.counts.hardlinked > 0 {
            self.warn_hardlinked(r.counts.hardlinked);
        }
        r.unprivileged = matches!(self.privilege, Privilege::Unprivileged { .. });
        r.foreign_owned_list = crate::sync::into_inner(self.foreign);
        if let Some(p) = self.places {
            r.tightened_list = crate::sync::into_inner(p.tightened);
        }
        r.timing = Timing::of(elapsed, r.counts.entries);
        r.error_list = crate::sync::into_inner(self.errors);
        r.skipped_mounts = crate::sync::into_inner(self.skipped_mounts).iter().map(EscapedPath::new).collect();
    }

    /// Warns that `n` entries with more than one link were (or would be) changed.
    fn warn_hardlinked(&self, n: u64) {
        let one = n == 1;
        let what = if one { "1 entry has".to_string() } else { format!("{n} entries have") };
        let verb = match (self.mode == Mode::Apply, one) {
            (true, true) => "it was",
            (true, false) => "they were",
            (false, true) => "it would be",
            (false, false) => "they would be",
        };
        warn!(path = %Escaped(self.root.as_os_str()), hardlinked = n,
              "{what} more than one link: {verb} changed as the kubelet does, which changes the same inode under its other names, maybe outside the volume");
    }

    /// Counts and lists an error on a path that is not a walked entry (marker, restore).
    pub fn error_at(&self, path: &Path, op: Op, errno: Errno) {
        self.counters.errors.inc();
        let err = EntryError::new(EscapedPath::new(path), op, errno);
        let mut list = crate::sync::lock(&self.errors);
        if list.is_full() {
            debug!("{}: {} failed: {}", err.path, op, err.error);
        } else {
            warn!("{}: {} failed: {}", err.path, op, err.error);
        }
        list.push(err);
    }

    /// A change that reported success and did not hold.
    fn ignored(&self, at: At<'_>, op: Op) {
        at.dir().taint();
        let what = if op == Op::Chown { "the owner or group" } else { "the mode" };
        let text = format!("{op} reported success, but {what} did not change (the storage ignores it)");
        self.counters.errors.inc();
        let err = EntryError::note(EscapedPath::new(walk::full_path(self.root, &at.rel_path())), op, text);
        debug!("{}: {}", err.path, err.error);
        crate::sync::lock(&self.errors).push(err);
    }

    /// A failed syscall the probe is still weighing (logged at debug).
    fn quiet_error(&self, at: At<'_>, op: Op, errno: Errno) {
        at.dir().taint();
        self.counters.errors.inc();
        let err = EntryError::new(EscapedPath::new(walk::full_path(self.root, &at.rel_path())), op, errno);
        debug!("{}: {} failed: {}", err.path, op, err.error);
        crate::sync::lock(&self.errors).push(err);
    }

    /// Counts and lists a failure that is no failed syscall: `text` says what and what to do.
    fn error_note(&self, path: &Path, op: Op, text: String) {
        self.counters.errors.inc();
        let err = EntryError::note(EscapedPath::new(path), op, text);
        let mut list = crate::sync::lock(&self.errors);
        if !list.is_full() {
            warn!("{}: {}", err.path, err.error);
        }
        list.push(err);
    }

    /// Counts and lists what [`resume::restore_pending`] found (in `check`: what `apply` would
    /// restore counts as a mode change).
    pub fn record_restored(&self, r: &resume::Restored) {
        if self.mode == Mode::Check {
            self.counters.changed_mode.add(r.restored);
        }
        for f in &r.failed {
            self.error_at(&f.path, f.op, f.errno);
        }
        for refused in &r.refused {
            self.error_note(&refused.path, Op::Restore, refused.text.clone());
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
        self.mount_points.fetch_add(1, Ordering::Relaxed);
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
        let outcome = match self.mode {
            Mode::Check => Ok(Fixed::decided(&dir.meta, self.spec, private)),
            Mode::Apply => fix::fix_dir(dir.fd(), &dir.meta, self.spec, private, &self.setgid, readback),
        };
        self.tell_probe(At::Dir(dir), readback, &outcome);
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
    fn one_entry(&self, parent: &Dir<'_>, name: &CStr, meta: &Meta, pin: Option<BorrowedFd<'_>>) -> bool {
        if let Some(p) = &self.places {
            p.note(parent, name, meta.kind());
        }
        if self.shard.is_some_and(|s| !s.owns(parent.depth + 1, || walk::rel_child(parent, name))) {
            return false;
        }
        self.counters.seen_meta(meta);
        if self.resume.is_some() {
            parent.add_entries(1);
        }
        let private = self.places.as_ref().and_then(|p| p.of_entry(parent, name, meta.kind()));
        if let Verdict::NotOurs(change) = fix::judge(meta, self.spec, private, self.privilege) {
            self.left(parent, Some(name), meta, change, Contents::Read);
            return false;
        }
        let outcome = match (self.mode, &self.resume) {
            (Mode::Check, _) => Ok(Fixed::decided(meta, self.spec, private)),
            (Mode::Apply, Some(r)) if needs_special_care(meta, self.spec) => {
                self.fix_special(r, (parent, name), meta, private, pin)
            }
            (Mode::Apply, _) => self.fix_one(parent, name, meta, private, pin),
        };
        self.tightened(private, &outcome, || walk::rel_child(parent, name));
        // A failed change was a change to make all the same: its neighbours likely need one too.
        let changed = self.mode == Mode::Apply && outcome.as_ref().map_or(true, |f| !f.change.is_none());
        self.record(At::Entry(*parent, name), outcome);
        changed
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
        let task = Task { spec: self.spec, private, how: How { readback, through: self.through } };
        let outcome = match pin {
            Some(pin) => fix::fix_pinned(pin, meta, task),
            None => fix::fix_entry(dir.fd(), name, meta, task, |d, n| dir.with_fd_relief(|| sys::pin_at(d, n))),
        };
        self.tell_probe(At::Entry(*dir, name), readback, &outcome);
        outcome
    }
}

impl Visitor for Fixer<'_> {
    fn entry(&self, parent: &Dir<'_>, name: &CStr, meta: &Meta) -> bool {
        self.one_entry(parent, name, meta, None)
    }

    fn pinned_entry(&self, parent: &Dir<'_>, name: &CStr, meta: &Meta, pin: BorrowedFd<'_>) -> bool {
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
            p.note(parent, name, meta.kind());
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
            p.note(parent, name, Kind::Dir);
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

/// Whether what lies below an entry left as it is was looked at: not in a directory of another
/// user that this user may not read (its contents were not checked).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Contents {
    Read,
    Unread,
}

/// What changed on one entry, final against initial: what the counters count.
#[derive(Debug, Clone, Copy)]
struct Changed {
    owner: bool,
    mode: bool,
}

/// What this process's credentials and the volume's filesystem say about a directory's setgid
/// bit (see [`SetgidRule`]).
fn setgid_rule(root: &Path) -> SetgidRule {
    let local_dev = match sys::storage(root) {
        Storage::Remote => None,
        Storage::Local => sys::stat_path(root).ok().map(|m| m.dev),
    };
    SetgidRule {
        local_dev,
        groups: sys::groups(),
        fsetid: caps::effective().is_some_and(|e| e & (1 << caps::FSETID.bit) != 0),
        overflow_uid: sys::overflow_uid(),
    }
}

/// The filesystem (as mountinfo names it) whose client keeps an open file's capabilities: a
/// file's chown and chmod through an open fd make no permission `getattr` round trip.
const OPEN_FILES_KEEP_CAPS: &str = "fuse.ceph-fuse";

/// What regular files' changes go through on the volume at `root`.
fn through(root: &Path) -> Through {
    let fs = sys::stat_path(root).ok().filter(|m| m.mnt_id != 0).and_then(|m| sys::mount_fs_type(m.mnt_id));
    if fs.as_deref() == Some(OPEN_FILES_KEEP_CAPS) { Through::OpenFile } else { Through::Pin }
}

/// Whether this process may make every change a pass with `privilege` attempts: unprivileged,
/// it attempts only its own entries; privileged, it needs CAP_CHOWN and CAP_FOWNER.
pub fn may_change(privilege: Privilege) -> bool {
    match privilege {
        Privilege::Unprivileged { .. } => true,
        Privilege::Full => {
            caps::effective().is_some_and(|e| [caps::CHOWN, caps::FOWNER].iter().all(|c| e & (1 << c.bit) != 0))
        }
    }
}

/// A regular file with setuid/setgid bits that a chown is about to clear.
fn needs_special_care(meta: &Meta, spec: &Spec) -> bool {
    meta.kind() == Kind::File && meta.perm() & (libc::S_ISUID | libc::S_ISGID) != 0 && fix::decide(meta, spec).owner()
}
