//! What a pass counts and lists: the counters, the errors, the entries of other users left as
//! they are, and the report they fill at the end.

use std::ffi::CStr;
use std::path::Path;
use std::time::Duration;

use rustix::io::Errno;
use tracing::{debug, warn};

use super::Fixer;
use crate::error::Op;
use crate::escape::{Escaped, EscapedPath};
use crate::fix::{Cause, Change, Failure, Fixed};
use crate::options::{Mode, Privilege};
use crate::progress::Counters;
use crate::report::{EntryError, ForeignEntry, Timing, VolumeReport};
use crate::resume;
use crate::state::Stop;
use crate::sys::Meta;
use crate::walk::{self, At, Node, Visitor};

impl Fixer<'_> {
    /// What the pass counted so far.
    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    /// How many mount points the pass met (see [`Visitor::mount_skipped`]).
    pub fn mount_points(&self) -> u64 {
        crate::sync::lock(&self.mount_points).len() as u64
    }

    /// The mount points the pass met, relative to the root (sorted, each once).
    pub fn met_mounts(&self) -> Vec<Vec<u8>> {
        let mut met = crate::sync::lock(&self.mount_points).clone();
        met.sort_unstable();
        met.dedup();
        met
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
            (&a.tightened, &b.tightened),
        ] {
            x.add(y.get());
        }
        if let (Some(to), Some(from)) = (&self.places, from.places) {
            crate::sync::lock(&to.tightened).append(crate::sync::into_inner(from.tightened));
        }
        crate::sync::lock(&self.errors).append(crate::sync::into_inner(from.errors));
        crate::sync::lock(&self.skipped_mounts).extend(crate::sync::into_inner(from.skipped_mounts));
        crate::sync::lock(&self.mount_points).extend(crate::sync::into_inner(from.mount_points));
        crate::sync::lock(&self.foreign).append(crate::sync::into_inner(from.foreign));
    }

    /// Counts the outcome of one entry's decision or fix.
    pub(super) fn record(&self, at: At<'_>, outcome: Result<Fixed, Failure>) {
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
                    Cause::SetgidDropped => self.error(at, f.op, Errno::PERM),
                    own => self.own_cause(at, f.op, own),
                }
            }
        }
    }

    /// Counts what did change on disk before a failure (any chmod made counts as a mode change).
    pub(super) fn count_change(&self, change: &Change) {
        self.tally(Changed { owner: change.owner(), mode: change.mode.is_some() });
    }

    /// Counts an entry fixed (or, in check, decided): its owner and/or its mode, final against
    /// initial.
    pub(super) fn count(&self, fixed: &Fixed) {
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
    pub(super) fn left(&self, dir: &Node, name: Option<&CStr>, meta: &Meta, change: Change, contents: Contents) {
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
              "{what} more than one link: {verb} changed as the kubelet does (group and added bits only, never a bit removed), which changes the same inode under its other names, maybe outside the volume");
    }

    /// Counts and lists an error on a path that is not a walked entry (marker, restore).
    pub fn error_at(&self, path: &Path, op: Op, errno: Errno) {
        self.counters.errors.inc();
        self.push_failed(EntryError::new(EscapedPath::new(path), op, errno), op);
    }

    /// Lists a failed change: a warning while the list has room, at debug once it is full.
    fn push_failed(&self, err: EntryError, op: Op) {
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

    /// A refused change whose cause is the entry's own (see [`Cause::why`]): its error names it.
    fn own_cause(&self, at: At<'_>, op: Op, cause: Cause) {
        at.dir().taint();
        self.own_cause_at(&walk::full_path(self.root, &at.rel_path()), op, cause);
    }

    /// Counts and lists a change of `path` refused for its own `cause`.
    fn own_cause_at(&self, path: &Path, op: Op, cause: Cause) {
        self.counters.errors.inc();
        let errno = Errno::PERM;
        let text = format!("{}: {}", crate::error::errno_text(errno.raw_os_error()), cause.why().unwrap_or_default());
        self.push_failed(EntryError { path: EscapedPath::new(path), op, errno: Some(errno), error: text }, op);
    }

    /// Counts what a failed change of the root did, and lists it as [`Fixer::record`] lists an
    /// entry's (see [`Fixer::fix_root`]).
    pub(super) fn root_failed(&self, f: Failure) {
        self.count_change(&f.done);
        match f.cause {
            Cause::Errno(e) => self.error_at(self.root, f.op, e),
            Cause::SetgidDropped => self.error_at(self.root, f.op, Errno::PERM),
            Cause::Ignored => self.error_note(
                self.root,
                f.op,
                format!("{} reported success, but did not change the root (the storage ignores it)", f.op),
            ),
            own => self.own_cause_at(self.root, f.op, own),
        }
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
    pub(super) fn error_note(&self, path: &Path, op: Op, text: String) {
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
}

/// Whether what lies below an entry left as it is was looked at: not in a directory of another
/// user that this user may not read (its contents were not checked).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Contents {
    Read,
    Unread,
}

/// What changed on one entry, final against initial: what the counters count.
#[derive(Debug, Clone, Copy)]
struct Changed {
    owner: bool,
    mode: bool,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pass::FixerConfig;
    use crate::spec::Spec;

    #[test]
    fn a_root_that_refused_its_change_is_listed_with_its_own_cause_as_an_entry_is() {
        let spec = Spec::group(2000);
        let fixer = Fixer::new(FixerConfig {
            root: Path::new("/v"),
            spec: &spec,
            mode: Mode::Check,
            privilege: Privilege::Full,
            may_change: true,
            shard: None,
            verify_part: None,
            resume: None,
        });
        let locked = crate::fix::Cause::Locked(crate::sys::Locked::Immutable);
        fixer.root_failed(Failure { op: Op::Chown, cause: locked, done: Change::default() });
        let chowned = Change { gid: Some(2000), ..Change::default() };
        fixer.root_failed(Failure { op: Op::Chmod, cause: Cause::Unmapped, done: chowned });
        fixer.root_failed(Failure { op: Op::Chmod, cause: Cause::Errno(Errno::IO), done: Change::default() });
        assert_eq!(fixer.counters.errors.get(), 3);
        assert_eq!(fixer.counters.changed_owner.get(), 1, "what the failed change did is counted");
        let list = crate::sync::into_inner(fixer.errors).into_vec();
        assert!(list.iter().all(|e| e.path.to_string() == "/v"), "{list:?}");
        assert!(
            list[0]
                .error
                .ends_with("the entry is immutable (chattr +i): volprep does not lift the flag; `chattr -i` it")
        );
        assert!(list[1].error.contains("not mapped into this user namespace"), "{list:?}");
        assert_eq!(list[2].errno, Some(Errno::IO));
    }
}
