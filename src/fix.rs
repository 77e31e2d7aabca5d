//! One entry's fix: `decide` (pure: metadata + spec → the change), `judge` (pure: whether this
//! pass may make it) and `apply` (the syscalls).

use std::ffi::CStr;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::sync::{Mutex, MutexGuard};

use rustix::io::Errno;

use crate::apps::{self, Links, Private, Whose};
use crate::error::Op;
use crate::options::Privilege;
use crate::spec::Spec;
use crate::sys::{self, Kind, Meta};

/// What must change on one entry; `Change::default()` means it conforms.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Change {
    /// New owner uid (`None`: keep).
    pub uid: Option<u32>,
    /// New group (`None`: keep).
    pub gid: Option<u32>,
    /// New permission bits, special bits included (`None`: keep).
    pub mode: Option<u32>,
}

impl Change {
    pub fn is_none(&self) -> bool {
        *self == Change::default()
    }

    pub fn owner(&self) -> bool {
        self.uid.is_some() || self.gid.is_some()
    }
}

/// One entry's change together with the mode it had before it, which is what the report counts
/// against: a setuid/setgid file whose bits a chown drops and a chmod puts back gets a chmod,
/// but its mode did not change.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Fixed {
    pub change: Change,
    /// Permission bits (`perm()`) of the entry as it was decided on.
    pub old_perm: u32,
}

impl Fixed {
    /// The decision for `meta` at `private`, nothing applied (`check`).
    pub fn decided(meta: &Meta, spec: &Spec, private: Option<Private>) -> Fixed {
        Fixed { change: decide_at(meta, spec, private), old_perm: meta.perm() }
    }

    /// Whether the entry's final mode differs from its initial one.
    pub fn mode_changed(&self) -> bool {
        self.change.mode.is_some_and(|m| m != self.old_perm)
    }
}

/// The decision for an entry at no app-private path: [`decide_at`] with `None`.
pub fn decide(meta: &Meta, spec: &Spec) -> Change {
    decide_at(meta, spec, None)
}

/// The kubelet's rule (`pkg/volume/volume_linux.go`), made change-only: the group (and owner)
/// the spec names, and for every non-symlink the mode bits of the spec's mode policy
/// ([`apps::want_mode`]: with `--modes kubelet`, `old_mode | mask`, directories also `| 0110 |
/// S_ISGID`). `private` is the app-private path the entry is at, if any (app-safe tightens it).
/// When a non-directory's owner changes, the kernel clears its setuid/setgid bits, so a chmod to
/// the wanted mode follows whenever the old mode had them.
pub fn decide_at(meta: &Meta, spec: &Spec, private: Option<Private>) -> Change {
    let uid = spec.uid().filter(|&u| u != meta.uid);
    let gid = spec.gid().filter(|&g| g != meta.gid);
    let chown = uid.is_some() || gid.is_some();
    let kind = meta.kind();
    let mode = if kind == Kind::Symlink {
        None
    } else {
        let old = meta.perm();
        let whose = Whose { owner: uid.unwrap_or(meta.uid), app: spec.app() };
        let links = Links::of(kind, meta.nlink);
        apps::want_mode(spec.modes, old, spec.mode_mask(kind), private, whose, links).and_then(|want| {
            let special_cleared = chown && kind != Kind::Dir && old & (libc::S_ISUID | libc::S_ISGID) != 0;
            (want != old || special_cleared).then_some(want)
        })
    };
    Change { uid, gid, mode }
}

/// What a pass with a given [`Privilege`] does with one entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The entry needs this change (none when it conforms), and the pass may make it.
    Fix(Change),
    /// The entry does not conform but belongs to another user, and the pass is unprivileged: it
    /// is left as it is and listed. The change is what a privileged run would make.
    NotOurs(Change),
}

/// The decision, given who runs the pass. An unprivileged process may change the group (to one
/// of its groups) and the mode of the entries it owns, and nothing of any other entry; an entry
/// of another user that already conforms needs nothing.
pub fn judge(meta: &Meta, spec: &Spec, private: Option<Private>, privilege: Privilege) -> Verdict {
    let change = decide_at(meta, spec, private);
    match privilege {
        Privilege::Unprivileged { uid } if meta.uid != uid && !change.is_none() => Verdict::NotOurs(change),
        _ => Verdict::Fix(change),
    }
}

/// Why a fix failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cause {
    /// The system call failed.
    Errno(Errno),
    /// Every call succeeded, but the entry, read back, does not have the change: the storage
    /// ignores it, or a writer changed it back meanwhile (see `honour`).
    Ignored,
    /// EPERM, and the entry's own flag explains it (`chattr +i` or `+a`): not the storage's doing.
    Locked(sys::Locked),
    /// EPERM on an entry whose owner or group is not mapped into this user namespace (it reads
    /// as the overflow id): the kernel refuses even root's change.
    Unmapped,
    /// Every call succeeded, but the kernel dropped the setgid bit (no CAP_FSETID, not in the
    /// group): an EPERM that names the capability, never the storage's refusal.
    SetgidDropped,
}

impl Cause {
    /// What this failure's line says after the errno's text, for an entry's own cause (a
    /// dropped setgid bit says nothing more: the run's summary names the missing capability).
    pub fn why(self) -> Option<&'static str> {
        match self {
            Cause::Locked(sys::Locked::Immutable) => {
                Some("the entry is immutable (chattr +i): volprep does not lift the flag; `chattr -i` it")
            }
            Cause::Locked(sys::Locked::AppendOnly) => {
                Some("the entry is append-only (chattr +a): volprep does not lift the flag; `chattr -a` it")
            }
            Cause::Unmapped => Some(
                "its owner or group is not mapped into this user namespace (it reads as the overflow id): change it from the host, or map it (hostUsers: false pods map only their own range)",
            ),
            // The errno's own line: the summary names the missing capability (see `caps`).
            Cause::Errno(_) | Cause::Ignored | Cause::SetgidDropped => None,
        }
    }
}

/// A fix that failed: the operation and why, and what had changed on disk before it failed (a
/// chown that worked before its chmod was refused), so reports count what was done.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Failure {
    pub op: Op,
    pub cause: Cause,
    pub done: Change,
}

impl Failure {
    fn new(op: Op, errno: Errno) -> Failure {
        Failure { op, cause: Cause::Errno(errno), done: Change::default() }
    }

    /// The failed call's errno (none when the change was ignored).
    pub fn errno(&self) -> Option<Errno> {
        match self.cause {
            Cause::Errno(e) => Some(e),
            Cause::Locked(_) | Cause::Unmapped | Cause::SetgidDropped => Some(Errno::PERM),
            Cause::Ignored => None,
        }
    }

    /// An EPERM on a chown or chmod, with no cause of the entry's own known: what the storage's
    /// refusal looks like (see `honour`).
    pub fn plain_refusal(&self) -> bool {
        self.cause == Cause::Errno(Errno::PERM) && matches!(self.op, Op::Chown | Op::Chmod)
    }

    /// This failure with the entry's own cause of its EPERM, if `locked` or `mapped` tell one.
    pub fn explained(self, locked: impl FnOnce() -> Option<sys::Locked>, meta: &Meta, mapped: &sys::Mapped) -> Failure {
        if !self.plain_refusal() {
            return self;
        }
        let cause = match locked() {
            Some(l) => Cause::Locked(l),
            None if !mapped.maps(meta.uid, meta.gid) => Cause::Unmapped,
            None => return self,
        };
        Failure { cause, ..self }
    }
}

/// Whether a fix reads the entry back after its change reported success (to tell a storage
/// that ignores ownership changes, while the pass does not know yet: see `honour`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Readback {
    Yes,
    No,
}

/// What a regular file's change goes through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Through {
    /// The `O_PATH` pin.
    Pin,
    /// The file opened for reading through its pin, when it needs both a chown and a chmod. A
    /// ceph-fuse client keeps an open file's capabilities across the chown, so the chmod after
    /// it needs no permission `getattr` from the MDS (one request fewer per file).
    OpenFile,
}

/// How a fix makes the change it decided on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct How {
    pub readback: Readback,
    pub through: Through,
}

/// What the fix of one non-directory entry is asked for: the spec, the app-private path the
/// entry is at (if any), and how the change is made.
#[derive(Debug, Clone, Copy)]
pub struct Task<'s> {
    pub spec: &'s Spec,
    pub private: Option<Private>,
    pub how: How,
    /// When a chmod that sets S_ISGID keeps it (a setgid file of another group may lose it).
    pub setgid: &'s SetgidRule,
}

impl Task<'_> {
    /// The change `meta` needs ([`decide_at`]).
    fn decide(&self, meta: &Meta) -> Change {
        decide_at(meta, self.spec, self.private)
    }
}

/// The part of `change` that the entry, read back as `after`, does not have: the chown, else
/// the chmod.
pub fn unapplied(change: &Change, after: &Meta) -> Option<Op> {
    if change.uid.is_some_and(|u| u != after.uid) || change.gid.is_some_and(|g| g != after.gid) {
        Some(Op::Chown)
    } else if change.mode.is_some_and(|m| m != after.perm()) {
        Some(Op::Chmod)
    } else {
        None
    }
}

/// Applies `change` to the inode `fd` refers to: chown first, then chmod (the chown may have
/// cleared special bits that the chmod restores). `fd` is a directory fd or an O_PATH pin.
pub fn apply(fd: BorrowedFd<'_>, change: &Change) -> Result<(), Failure> {
    if change.owner() {
        sys::chown_fd(fd, change.uid, change.gid).map_err(|e| Failure::new(Op::Chown, e))?;
    }
    if let Some(mode) = change.mode {
        let done = Change { mode: None, ..*change };
        sys::chmod_fd(fd, mode).map_err(|errno| Failure { op: Op::Chmod, cause: Cause::Errno(errno), done })?;
    }
    Ok(())
}

/// Locks held while an inode with more than one link is re-read and changed, one per stripe of
/// inodes (see [`stripe`]): threads fixing different inodes seldom wait for each other.
static MULTI_LINK: [Mutex<()>; STRIPES] = [const { Mutex::new(()) }; STRIPES];
const STRIPES: usize = 64;

/// The stripe of inode `ino` of device `dev`: the top bits of a multiplicative hash, so that
/// neighbouring inode numbers spread over the stripes. Every name of an inode meets on one.
fn stripe(dev: u64, ino: u64) -> usize {
    let h = (ino ^ dev.rotate_left(32)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    (h >> (64 - STRIPES.trailing_zeros())) as usize
}

/// Fixes the non-directory entry `name` in `dir`, which was seen with `seen` (an `lstat` by name).
///
/// Conforming entries cost nothing more. Otherwise the entry is pinned with O_PATH|O_NOFOLLOW
/// and re-stated, and the decision is made again from the pinned inode's own metadata, so the
/// inode changed is the inode decided on, even if `name` was swapped meanwhile (for a symlink,
/// the link itself; never its target). Returns the change made.
///
/// `pin` opens the pin (`sys::pin_at`, or a wrapper that makes room when descriptors run out).
pub fn fix_entry(
    dir: BorrowedFd<'_>,
    name: &CStr,
    seen: &Meta,
    task: Task<'_>,
    pin: impl FnOnce(BorrowedFd<'_>, &CStr) -> Result<OwnedFd, Errno>,
) -> Result<Fixed, Failure> {
    if task.decide(seen).is_none() {
        return Ok(Fixed { change: Change::default(), old_perm: seen.perm() });
    }
    let first = one_at_a_time(seen);
    let pinned = pin(dir, name).map_err(|e| Failure::new(Op::Open, e))?;
    let stat = || sys::stat_fd(sys::fd(&pinned)).map_err(|e| Failure::new(Op::Stat, e));
    let now = stat()?;
    let (_one_at_a_time, now) = if (now.dev, now.ino) != (seen.dev, seen.ino) && now.nlink > 1 {
        // Another inode took the name since it was read: re-read under that inode's stripe
        // (never two stripes held at once).
        drop(first);
        (one_at_a_time(&now), stat()?)
    } else {
        (first, now)
    };
    if now.kind() == Kind::Dir {
        // Swapped for a directory after it was read: its contents were not walked.
        return Err(Failure::new(Op::Stat, Errno::AGAIN));
    }
    if now.other_mount(seen) || now.dev != seen.dev {
        // Another mount took the name's place: not the inode that was looked at.
        return Err(Failure::new(Op::Stat, Errno::XDEV));
    }
    fix_inode(sys::fd(&pinned), &now, task)
}

/// Fixes a non-directory entry through `pin`, an O_PATH|O_NOFOLLOW fd of it whose own `fstat`
/// gave `seen` (the walk pins entries first while they need changes: see
/// `walk::Visitor::pinned_entry`).
///
/// Race-safety, the same as [`fix_entry`]'s with one lookup and one stat fewer: `seen` describes
/// the pinned inode itself, not whatever a name led to at some earlier moment, so the mode
/// decided from it is applied to that inode and no other, whatever happens to the name; the
/// pin never opened the entry (no device, FIFO or socket is opened, a symlink is the link
/// itself), and the walk has checked that it lies on the volume's mount. The one thing that can
/// go stale is the metadata itself, as with any `lstat`-then-change (the kubelet's too): an
/// inode with several names may be fixed by several threads at once, so such inodes are
/// re-read under a lock (see [`fix_entry`]).
pub fn fix_pinned(pin: BorrowedFd<'_>, seen: &Meta, task: Task<'_>) -> Result<Fixed, Failure> {
    if task.decide(seen).is_none() {
        return Ok(Fixed { change: Change::default(), old_perm: seen.perm() });
    }
    let _one_at_a_time = one_at_a_time(seen);
    let now = if seen.nlink > 1 { sys::stat_fd(pin).map_err(|e| Failure::new(Op::Stat, e))? } else { *seen };
    fix_inode(pin, &now, task)
}

/// An inode with several names may be fixed by several threads: each re-reads and changes it
/// under its stripe's lock, so none decides from the state between another's chown (which
/// clears setuid/setgid) and its chmod (which sets them back), and then chmods them away.
fn one_at_a_time(seen: &Meta) -> Option<MutexGuard<'static, ()>> {
    (seen.nlink > 1).then(|| crate::sync::lock(&MULTI_LINK[stripe(seen.dev, seen.ino)]))
}

/// Decides from `now` (the pinned inode's own metadata) and applies the change through `pin`
/// (or the file opened through it: see [`Through`]); with `Readback::Yes`, reads it back: a
/// change that did not hold is `Cause::Ignored`.
fn fix_inode(pin: BorrowedFd<'_>, now: &Meta, task: Task<'_>) -> Result<Fixed, Failure> {
    let (change, how) = (task.decide(now), task.how);
    let both = change.owner() && change.mode.is_some();
    // Opened only when the pin is a regular file: never a device, FIFO or socket.
    let opened = (how.through == Through::OpenFile && both && now.kind() == Kind::File)
        .then(|| sys::reopen_file(pin).ok())
        .flatten();
    let pin = opened.as_ref().map_or(pin, sys::fd);
    apply(pin, &change).map_err(|mut f| {
        // A chown that worked may have cleared setuid/setgid before the chmod was refused.
        if f.done.owner() {
            let after = sys::stat_fd(pin).map_or(now.perm(), |m| m.perm());
            f.done.mode = (after != now.perm()).then_some(after);
        }
        f
    })?;
    if needs_readback(how.readback, &change, now, task.setgid) {
        read_back(pin, &change, now)?;
    }
    Ok(Fixed { change: unlinked(pin, now, change, task)?, old_perm: now.perm() })
}

/// An app path with several names is left as it is; but a chown on overlayfs copies the inode
/// up into one of its own (the link is broken). Then app-safe decides again from the inode as it
/// is now, as the next pass would: returns the change made in all.
fn unlinked(pin: BorrowedFd<'_>, now: &Meta, change: Change, task: Task<'_>) -> Result<Change, Failure> {
    if now.nlink < 2 || task.private.is_none() || !change.owner() {
        return Ok(change);
    }
    let after = sys::stat_fd(pin).map_err(|e| Failure { done: change, ..Failure::new(Op::Stat, e) })?;
    let mode = task.decide(&after).mode;
    if after.nlink > 1 || mode.is_none() {
        return Ok(change);
    }
    let more = Change { mode, ..Change::default() };
    apply(pin, &more).map_err(|f| Failure { done: change, ..f })?;
    Ok(Change { mode, ..change })
}

/// Whether a change that reported success must be read back: when asked (`Readback::Yes`), or
/// when it sets S_ISGID that the kernel may have dropped (see [`SetgidRule`]). The chown before
/// the chmod clears a file's setgid bit too (without CAP_FSETID), so a setgid file of another
/// group comes out without it as silently as a directory does.
fn needs_readback(readback: Readback, change: &Change, seen: &Meta, setgid: &SetgidRule) -> bool {
    let (uid, gid) = (change.uid.unwrap_or(seen.uid), change.gid.unwrap_or(seen.gid));
    let setgid_unsure = change.mode.is_some_and(|m| m & libc::S_ISGID != 0) && !setgid.keeps(seen.dev, uid, gid);
    !change.is_none() && (readback == Readback::Yes || setgid_unsure)
}

/// Reads back through `fd` a `change` made to an inode seen as `seen`, whose calls all reported
/// success. Everything but the setgid bit held: the kernel dropped it (no CAP_FSETID, not in
/// the group), an EPERM that names the missing capability, with what did change counted. Any
/// other part missing: the storage ignored the change (`Cause::Ignored`).
fn read_back(fd: BorrowedFd<'_>, change: &Change, seen: &Meta) -> Result<(), Failure> {
    let after = sys::stat_fd(fd).map_err(|e| Failure { done: *change, ..Failure::new(Op::Stat, e) })?;
    match unapplied(change, &after) {
        None => Ok(()),
        Some(Op::Chmod) if change.mode.is_some_and(|m| m & !libc::S_ISGID == after.perm()) => {
            let mode = (after.perm() != seen.perm()).then_some(after.perm());
            Err(Failure { op: Op::Chmod, cause: Cause::SetgidDropped, done: Change { mode, ..*change } })
        }
        Some(op) => Err(Failure { op, cause: Cause::Ignored, done: Change::default() }),
    }
}

/// Whether a chmod that gives a directory (or a setgid file) its setgid bit is sure to keep it,
/// so that [`fix_dir`] and [`fix_entry`] need not read the mode back.
///
/// The kernel silently drops S_ISGID from a chmod unless the caller is in the inode's group
/// (its fsgid or a supplementary group) or holds CAP_FSETID over the inode
/// (`in_group_or_capable`, fs/attr.c); "over the inode" means its owner and group are mapped in
/// the caller's user namespace (and the mount's idmapping): [`sys::Mapped`]. That is the kernel's own rule only: a FUSE daemon or a network
/// server decides for itself, so on those filesystems (and on any device but the volume's) the
/// mode is always read back.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SetgidRule {
    /// The device whose filesystem follows the kernel's rule (the volume's, when it is local).
    pub local_dev: Option<u64>,
    /// The process's fsgid and supplementary groups, sorted.
    pub groups: Vec<u32>,
    /// CAP_FSETID is in the effective set.
    pub fsetid: bool,
    /// The ids this process's user namespace maps (CAP_FSETID counts only over those).
    pub mapped: sys::Mapped,
}

impl SetgidRule {
    /// Whether a chmod to a mode with S_ISGID of a directory on `dev` owned by `uid`:`gid` (as
    /// they are when the chmod runs) keeps the bit.
    pub fn keeps(&self, dev: u64, uid: u32, gid: u32) -> bool {
        self.local_dev == Some(dev)
            && (self.groups.binary_search(&gid).is_ok() || (self.fsetid && self.mapped.maps(uid, gid)))
    }
}

/// Fixes a directory through its own fd, opened when the walk entered it and seen then as `seen`
/// (the `fstat` of that fd).
///
/// Race-safety: the fd is the directory (opened O_NOFOLLOW|O_DIRECTORY, its device and inode
/// checked whenever the walk had to re-open it), so the change decided from `seen` goes to the
/// inode it was decided for. `seen` is not read again: it is as fresh as the kubelet's `lstat`
/// before its chown and chmod are (the mode a concurrent chmod gave the directory during the
/// walk of its contents would be overwritten by `seen | mask`, as the kubelet's pass would).
///
/// Without CAP_FSETID the kernel silently drops a directory's setgid bit on chmod when its group
/// is not the caller's; unless `setgid` says the bit is kept, the result is read back so that
/// shows as an EPERM error, not a quiet half-prepared volume (the other mode bits that did change
/// are counted as changed). Read back (then, or with `Readback::Yes`), a directory that has
/// neither its group nor the rest of its mode was ignored by the storage (`Cause::Ignored`).
pub fn fix_dir(
    fd: BorrowedFd<'_>,
    seen: &Meta,
    spec: &Spec,
    private: Option<Private>,
    setgid: &SetgidRule,
    readback: Readback,
) -> Result<Fixed, Failure> {
    let change = decide_at(seen, spec, private);
    if change.is_none() {
        return Ok(Fixed { change, old_perm: seen.perm() });
    }
    apply(fd, &change)?;
    if needs_readback(readback, &change, seen, setgid) {
        read_back(fd, &change, seen)?;
    }
    Ok(Fixed { change, old_perm: seen.perm() })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(kind: u32, perm: u32, uid: u32, gid: u32) -> Meta {
        Meta { dev: 1, ino: 2, mode: kind | perm, uid, gid, nlink: 1, mnt_id: 0 }
    }

    fn fs(g: u32) -> Spec {
        Spec::group(g)
    }

    /// The kubelet's formula, written as it is in volume_linux.go, for comparison.
    fn kubelet(m: &Meta, gid: u32, ro: bool) -> (u32, u32, u32) {
        let mut mask = if ro { 0o440 } else { 0o660 };
        if m.kind() == Kind::Dir {
            mask |= libc::S_ISGID | 0o110;
        }
        let mode = if m.kind() == Kind::Symlink { m.perm() } else { m.perm() | mask };
        (m.uid, gid, mode)
    }

    fn linked(dev: u64, ino: u64) -> Meta {
        Meta { dev, ino, nlink: 2, ..meta(libc::S_IFREG, 0o6755, 5, 1) }
    }

    /// The locks are probed from this thread with `try_lock` (no waiting, no other thread) and
    /// compared by stripe: parallel tests that lock stripes cannot change the outcome.
    #[test]
    fn different_multi_link_inodes_are_fixed_at_once_and_one_inode_one_at_a_time() {
        assert!(one_at_a_time(&meta(libc::S_IFREG, 0o644, 5, 1)).is_none(), "one link: no lock");
        let a = linked(7, 1000);
        let mine = stripe(a.dev, a.ino);
        let held = one_at_a_time(&a).expect("a multi-link inode is locked");
        // The same inode (another name of it, seen by another thread) always waits: the lock
        // held is its stripe's, the one every name of it meets on.
        let probe = MULTI_LINK[mine].try_lock();
        assert!(matches!(probe, Err(std::sync::TryLockError::WouldBlock)), "stripe {mine} is the one held");
        drop(probe);
        drop(held);
        // Most other inodes do not wait for `a`: their stripes are others (a few share its).
        let free = (1001..1033).filter(|&ino| stripe(7, ino) != mine).count();
        assert!(free >= 24, "{free} of 32 other inodes went ahead");
    }

    #[test]
    fn a_setgid_bit_the_kernel_may_drop_is_read_back_for_files_and_directories() {
        let without = SetgidRule { local_dev: Some(1), groups: vec![0], fsetid: false, mapped: sys::Mapped::default() };
        let with = SetgidRule { fsetid: true, ..without.clone() };
        let tool = meta(libc::S_IFREG, 0o2755, 5, 33);
        let change = decide(&tool, &fs(2000));
        assert_eq!(change.mode, Some(0o2775), "the kubelet keeps a file's setgid bit");
        assert!(needs_readback(Readback::No, &change, &tool, &without), "another group, no CAP_FSETID");
        assert!(!needs_readback(Readback::No, &change, &tool, &with));
        let plain = meta(libc::S_IFREG, 0o755, 5, 33);
        assert!(!needs_readback(Readback::No, &decide(&plain, &fs(2000)), &plain, &without), "no setgid bit to lose");
        let dir = meta(libc::S_IFDIR, 0o755, 5, 33);
        assert!(needs_readback(Readback::No, &decide(&dir, &fs(2000)), &dir, &without));
        assert!(!needs_readback(Readback::No, &decide(&dir, &fs(0)), &dir, &without), "its group is ours");
        let done = meta(libc::S_IFREG, 0o2775, 5, 2000);
        assert!(!needs_readback(Readback::Yes, &decide(&done, &fs(2000)), &done, &without), "nothing changed");
    }

    #[test]
    fn a_change_read_back_without_it_was_not_applied() {
        let before = meta(libc::S_IFREG, 0o600, 5, 1);
        let change = decide(&before, &fs(2000));
        assert_eq!(unapplied(&change, &before), Some(Op::Chown), "nothing held");
        let grouped = Meta { gid: 2000, ..before };
        assert_eq!(unapplied(&change, &grouped), Some(Op::Chmod), "only the chown held");
        let both = Meta { mode: libc::S_IFREG | 0o660, ..grouped };
        assert_eq!(unapplied(&change, &both), None);
        assert_eq!(Failure::new(Op::Chmod, Errno::PERM).errno(), Some(Errno::PERM));
        let ignored = Failure { op: Op::Chown, cause: Cause::Ignored, done: Change::default() };
        assert_eq!(ignored.errno(), None);
    }

    #[test]
    fn conforming_entry_needs_nothing() {
        assert!(decide(&meta(libc::S_IFREG, 0o660, 5, 2000), &fs(2000)).is_none());
        assert!(decide(&meta(libc::S_IFDIR, 0o2770, 5, 2000), &fs(2000)).is_none());
        assert!(decide(&meta(libc::S_IFLNK, 0o777, 5, 2000), &fs(2000)).is_none());
    }

    #[test]
    fn symlink_gets_group_but_never_a_mode() {
        let c = decide(&meta(libc::S_IFLNK, 0o777, 5, 1), &fs(2000));
        assert_eq!(c, Change { uid: None, gid: Some(2000), mode: None });
    }

    #[test]
    fn directory_gets_setgid_and_search_bits() {
        let c = decide(&meta(libc::S_IFDIR, 0o700, 5, 2000), &fs(2000));
        assert_eq!(c.mode, Some(0o2770));
        assert_eq!(c.gid, None);
    }

    #[test]
    fn setuid_file_gets_its_bits_back_after_a_chown() {
        let c = decide(&meta(libc::S_IFREG, 0o4755, 0, 1), &fs(2000));
        assert_eq!(c, Change { uid: None, gid: Some(2000), mode: Some(0o4775) });
        // Without a chown there is nothing to restore.
        let c = decide(&meta(libc::S_IFREG, 0o4775, 0, 2000), &fs(2000));
        assert!(c.is_none());
    }

    #[test]
    fn a_mode_put_back_after_a_chown_is_no_mode_change() {
        let f = Fixed::decided(&meta(libc::S_IFREG, 0o4775, 0, 1), &fs(2000), None);
        assert_eq!(f.change.mode, Some(0o4775), "the chmod is needed");
        assert!(!f.mode_changed(), "but the final mode is the initial one");
        assert!(Fixed::decided(&meta(libc::S_IFREG, 0o4755, 0, 1), &fs(2000), None).mode_changed());
        assert!(!Fixed::decided(&meta(libc::S_IFREG, 0o660, 0, 1), &fs(2000), None).mode_changed());
    }

    #[test]
    fn owner_alone_changes_ownership_only() {
        let s = Spec::owner(1001, Some(1001));
        let c = decide(&meta(libc::S_IFREG, 0o600, 999, 999), &s);
        assert_eq!(c, Change { uid: Some(1001), gid: Some(1001), mode: None });
        let s = Spec { owner_gid: None, ..s };
        assert_eq!(decide(&meta(libc::S_IFDIR, 0o700, 999, 999), &s).gid, None);
    }

    #[test]
    fn unprivileged_fixes_its_own_entries_and_leaves_the_others() {
        let me = Privilege::Unprivileged { uid: 1000 };
        // Its own entry, whatever its group: group and mode are the owner's to change.
        let own = meta(libc::S_IFREG, 0o600, 1000, 0);
        assert_eq!(judge(&own, &fs(2000), None, me), Verdict::Fix(decide(&own, &fs(2000))));
        assert!(
            matches!(judge(&own, &fs(2000), None, me), Verdict::Fix(c) if c.gid == Some(2000) && c.mode == Some(0o660))
        );
        // Another user's entry that conforms needs nothing.
        let theirs_ok = meta(libc::S_IFDIR, 0o2770, 0, 2000);
        assert_eq!(judge(&theirs_ok, &fs(2000), None, me), Verdict::Fix(Change::default()));
        // Another user's entry that does not conform is left, with what root would change.
        for theirs in [meta(libc::S_IFREG, 0o644, 0, 0), meta(libc::S_IFLNK, 0o777, 1001, 1001)] {
            let v = judge(&theirs, &fs(2000), None, me);
            assert_eq!(v, Verdict::NotOurs(decide(&theirs, &fs(2000))), "{theirs:?}");
        }
        // Root changes everything.
        let theirs = meta(libc::S_IFREG, 0o644, 0, 0);
        assert_eq!(judge(&theirs, &fs(2000), None, Privilege::Full), Verdict::Fix(decide(&theirs, &fs(2000))));
    }

    #[test]
    fn setgid_is_read_back_unless_the_kernel_rule_keeps_it() {
        let mapped = sys::Mapped::new("0 0 100000\n", "0 0 100000\n", (65534, 65534));
        let rule = SetgidRule { local_dev: Some(1), groups: vec![0, 2000], fsetid: false, mapped };
        assert!(rule.keeps(1, 0, 2000), "a group of the process");
        assert!(!rule.keeps(1, 0, 3000), "another group, no CAP_FSETID");
        assert!(!rule.keeps(2, 0, 2000), "another filesystem (FUSE, network, a nested mount)");
        let root = SetgidRule { groups: vec![0], fsetid: true, ..rule.clone() };
        assert!(root.keeps(1, 1000, 3000), "CAP_FSETID over an inode whose owner is mapped");
        assert!(!root.keeps(1, 65534, 3000), "an owner unmapped in this user namespace");
        let host = SetgidRule { mapped: sys::Mapped::default(), ..root.clone() };
        assert!(host.keeps(1, 65534, 3000), "nobody is a mapped owner on the host");
        assert!(!SetgidRule::default().keeps(1, 0, 0), "nothing known: always read back");
    }

    /// App-safe for an app of uid 5 (the entries' owner in most tests).
    fn app_safe(g: u32) -> Spec {
        Spec { modes: crate::spec::Modes::AppSafe, app_uid: Some(5), ..Spec::group(g) }
    }

    #[test]
    fn app_safe_keeps_private_modes_and_changes_the_group() {
        let c = decide(&meta(libc::S_IFREG, 0o600, 5, 1), &app_safe(2000));
        assert_eq!(c, Change { uid: None, gid: Some(2000), mode: None });
        let c = decide(&meta(libc::S_IFDIR, 0o700, 5, 1), &app_safe(2000));
        assert_eq!(c, Change { uid: None, gid: Some(2000), mode: None }, "no setgid added either");
        // Entries the group shares already get the kubelet's bits.
        assert_eq!(decide(&meta(libc::S_IFREG, 0o640, 5, 1), &app_safe(2000)).mode, Some(0o660));
        assert_eq!(decide(&meta(libc::S_IFDIR, 0o755, 5, 1), &app_safe(2000)).mode, Some(0o2775));
        // A setuid file keeps its bits across the chown.
        assert_eq!(decide(&meta(libc::S_IFREG, 0o4700, 5, 1), &app_safe(2000)).mode, Some(0o4700));
    }

    #[test]
    fn app_safe_gives_the_kubelets_bits_to_what_the_app_does_not_own() {
        // Another uid's private directory (root's 0700 volume root): the app reaches it only
        // through the group.
        assert_eq!(decide(&meta(libc::S_IFDIR, 0o700, 0, 0), &app_safe(2000)).mode, Some(0o2770));
        assert_eq!(decide(&meta(libc::S_IFREG, 0o600, 3000, 0), &app_safe(2000)).mode, Some(0o660));
        // The app's uid not known: the kubelet's rule for every entry.
        let unknown = Spec { app_uid: None, ..app_safe(2000) };
        assert_eq!(decide(&meta(libc::S_IFDIR, 0o700, 5, 5), &unknown).mode, Some(0o2770));
        // --owner names the app when --app-uid does not.
        let owner = Spec { owner_uid: Some(5), ..unknown.clone() };
        assert_eq!(decide(&meta(libc::S_IFDIR, 0o700, 3000, 5), &owner).mode, None);
        // --app-uid wins over --owner: after --owner 7 the entry is not the app's.
        let other = Spec { owner_uid: Some(7), ..app_safe(2000) };
        assert_eq!(decide(&meta(libc::S_IFDIR, 0o700, 5, 5), &other).mode, Some(0o2770));
    }

    #[test]
    fn app_safe_tightens_an_app_path_of_its_owner_only() {
        use crate::apps::{Anchor, AppPath};
        let data = Some(Private { path: AppPath::PostgresData, anchor: Anchor::Itself });
        let app = |g| Spec { app_uid: Some(2000), ..app_safe(g) };
        // A data directory an earlier kubelet walked with another group (K).
        let c = decide_at(&meta(libc::S_IFDIR, 0o2770, 2000, 4000), &app(2000), data);
        assert_eq!(c, Change { uid: None, gid: Some(2000), mode: Some(0o2750) });
        // Another uid's data directory: the kubelet's bits, nothing removed.
        let c = decide_at(&meta(libc::S_IFDIR, 0o2750, 2001, 4000), &app(2000), data);
        assert_eq!(c.mode, Some(0o2770));
        // Restored as another uid (R), with --owner: the owner is the app's after the change.
        let key = Some(Private { path: AppPath::PostgresKey, anchor: Anchor::Owner(2000) });
        let owner = Spec { owner_uid: Some(2000), ..app(2000) };
        let c = decide_at(&meta(libc::S_IFREG, 0o660, 3000, 3000), &owner, key);
        assert_eq!(c, Change { uid: Some(2000), gid: Some(2000), mode: Some(0o600) });
        // Without --owner, the key of uid 3000 in a data directory of uid 2000 is not the app's.
        let c = decide_at(&meta(libc::S_IFREG, 0o640, 3000, 3000), &app(2000), key);
        assert_eq!(c, Change { uid: None, gid: Some(2000), mode: Some(0o660) });
        // A hard link: left as it is, never tightened through another name.
        let linked = Meta { nlink: 2, ..meta(libc::S_IFREG, 0o660, 2000, 2000) };
        assert_eq!(decide_at(&linked, &app(2000), key), Change::default());
        // The kubelet's rule ignores the place.
        assert_eq!(decide_at(&meta(libc::S_IFDIR, 0o2750, 2000, 2000), &fs(2000), data).mode, Some(0o2770));
    }

    #[test]
    fn app_safe_decisions_are_fixed_points() {
        use crate::apps::{Anchor, AppPath};
        use crate::spec::Rule;
        let places = [None, Some(Private { path: AppPath::SshHome, anchor: Anchor::Owner(42) })];
        let rules = [Rule::OwnerOnly, Rule::Keep, Rule::Mode(0o2750)].map(AppPath::Rule);
        let places = places
            .into_iter()
            .chain(AppPath::ALL.into_iter().chain(rules).map(|path| Some(Private { path, anchor: Anchor::Itself })));
        for private in places {
            for kind in [libc::S_IFREG, libc::S_IFDIR, libc::S_IFLNK] {
                for perm in 0..=0o7777 {
                    for spec in [
                        app_safe(7),
                        Spec { app_uid: Some(9), ..app_safe(7) },
                        Spec { app_uid: None, ..app_safe(7) },
                        Spec { owner_uid: Some(42), ..app_safe(7) },
                        Spec { modes: crate::spec::Modes::AppSafe, ..Spec::owner(42, Some(7)) },
                    ] {
                        let m = meta(kind, perm, 9, 8);
                        let c = decide_at(&m, &spec, private);
                        let after = Meta {
                            uid: c.uid.unwrap_or(m.uid),
                            gid: c.gid.unwrap_or(m.gid),
                            mode: (m.mode & libc::S_IFMT) | c.mode.unwrap_or(m.perm()),
                            ..m
                        };
                        assert!(decide_at(&after, &spec, private).is_none(), "{kind:o} {perm:o} {private:?} {spec}");
                    }
                }
            }
        }
    }

    #[test]
    fn decide_matches_the_kubelet_formula_for_every_mode_and_kind() {
        let kinds =
            [libc::S_IFREG, libc::S_IFDIR, libc::S_IFLNK, libc::S_IFIFO, libc::S_IFSOCK, libc::S_IFCHR, libc::S_IFBLK];
        for kind in kinds {
            for perm in 0..=0o7777 {
                for (gid, ro) in [(2000, false), (7, true)] {
                    let m = meta(kind, perm, 42, 7);
                    let spec = Spec { access: crate::spec::Access::from_flag(ro), ..fs(gid) };
                    let c = decide(&m, &spec);
                    let (uid, g, mode) = kubelet(&m, gid, ro);
                    // The result after applying the change equals the kubelet's result ...
                    let after = Meta {
                        uid: c.uid.unwrap_or(m.uid),
                        gid: c.gid.unwrap_or(m.gid),
                        mode: (m.mode & libc::S_IFMT) | c.mode.unwrap_or(m.perm()),
                        ..m
                    };
                    assert_eq!((after.uid, after.gid, after.perm()), (uid, g, mode), "{kind:o} {perm:o}");
                    // ... and is a fixed point.
                    assert!(decide(&after, &spec).is_none(), "{kind:o} {perm:o}");
                }
            }
        }
    }
}
