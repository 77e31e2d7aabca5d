//! One volume from start to end: open the root, take the lock, read the marker, decide to skip
//! or walk (and why), walk with the [`Fixer`], then leave the marker `done` only if every entry
//! conforms (an unprivileged pass that left other users' entries says so, and what would fix them).

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;
use std::time::{Duration, Instant};

use rustix::io::Errno;
use tracing::{debug, info, warn};

use crate::error::{Error, Op};
use crate::escape::{Escaped, Untrusted, escape_bytes};
use crate::lifecycle::{self, Pass, ResumePlan};
use crate::marker::{self, Checkpoint, Decision, Found, Marker, State};
use crate::options::{Mode, Privilege, RunOptions};
use crate::pass::Fixer;
use crate::progress;
use crate::report::{Action, VolumeReport};
use crate::resume::Place;
use crate::runid::RunId;
use crate::spec::Spec;
use crate::state::{MarkerState, Stop};
use crate::sys::{self, LockHolder, Meta};
use crate::walk::{Pool, Threads};

/// Prepares (or checks) the volume at `path`, walking on `pool` (started here if this volume is
/// the first to need it). Fatal problems at start (missing, not a directory, lock timeout) are
/// errors; per-entry failures are counted in the report.
pub fn run(path: &Path, spec: &Spec, opts: &RunOptions, pool: &Pool) -> Result<VolumeReport, Error> {
    let started = Instant::now();
    let root_fd = lifecycle::open_root(path)?;
    let root = root_fd.as_fd();
    if opts.mode == Mode::Apply {
        lock(root, path, opts.lock_timeout)?;
    }
    // Read after the lock: a run that waited sees what the other run left.
    let root_meta = sys::stat_fd(root).map_err(|e| Error::sys(path, Op::Stat, e))?;
    let found = marker::read(root);
    let mut pass = Pass::new(path, spec, opts, root, started, None);
    let decision = pass.decide(root, &found, &root_meta);
    if let Found::Unsupported = found {
        warn!(path = %pass.shown, "no extended attributes on this filesystem: no marker, no resume; falling back to the root-only check");
    }
    let verb;
    (verb, pass.reason) = verb_and_reason(&decision, opts.mode);
    log_decision(&pass, &found, verb);
    let before = found.state();
    if let (Decision::Skip(_), Mode::Apply) = (&decision, opts.mode) {
        return Ok(pass.skipped(before));
    }
    let plan = plan(&decision, &found, opts.mode, |m| Place::new(root, None).read(&m.run, &pass.digest));
    let other_done = match &found {
        Found::Marker(m) if m.state == State::Done && m.digest != pass.digest => Some(&m.spec),
        _ => None,
    };
    walk(&pass, pool.start()?, (root_fd, root_meta), &plan, before, other_done)
}

/// The decision's word for the log (`skip`, `check`, `resume`, `walk`) and its reason.
fn verb_and_reason(decision: &Decision, mode: Mode) -> (&'static str, String) {
    match (decision, mode) {
        (Decision::Skip(r), Mode::Apply) => ("skip", r.clone()),
        (Decision::Skip(r), Mode::Check) => ("check", format!("check walks every entry (apply would skip: {r})")),
        (Decision::Walk { reason, .. }, Mode::Check) => ("check", reason.clone()),
        (Decision::Walk { resume: true, reason }, Mode::Apply) => ("resume", reason.clone()),
        (Decision::Walk { reason, .. }, Mode::Apply) => ("walk", reason.clone()),
    }
}

/// The line saying what this volume is and what the pass does with it.
fn log_decision(pass: &Pass<'_>, found: &Found, verb: &str) {
    let line = progress::DecisionLine {
        shown: &pass.shown,
        fs: &pass.fs,
        spec: &pass.spec_text,
        digest: pass.digest.as_str(),
        threads: pass.opts.threads,
        load: &pass.opts.load,
        estimate: pass.estimate,
        marker: found.state(),
        decision: verb,
        reason: &pass.reason,
    };
    line.log();
}

/// What the pass takes over and keeps: `apply` keeps a checkpoint where there are xattrs (the
/// interrupted run's, when it resumes one: `read` gives its checkpoint); `check` only looks at
/// its special-bit records.
fn plan(
    decision: &Decision,
    found: &Found,
    mode: Mode,
    read: impl FnOnce(&Marker) -> Option<Checkpoint>,
) -> ResumePlan {
    let resumed = match (decision, found) {
        (Decision::Walk { resume: true, .. }, Found::Marker(m)) => Some(m),
        _ => None,
    };
    let previous = resumed.and_then(read);
    match (mode, found) {
        (Mode::Check, _) => previous.map_or(ResumePlan::None, |c| ResumePlan::CheckPending(c.pending)),
        (Mode::Apply, Found::Unsupported) => ResumePlan::None,
        (Mode::Apply, _) => ResumePlan::apply(resumed.map_or_else(RunId::new, |m| m.run.clone()), previous),
    }
}

/// Walks the volume (its root, open, and its metadata) as `plan` says. `apply` writes the
/// marker `in-progress` first (a `done` marker of another spec, `other_done`, that can be
/// neither replaced nor removed fails the pass before any change: see [`begin_marker`]), keeps
/// its checkpoint during the walk, then settles the marker (see [`settle_marker`]); `check` (no
/// checkpoint) changes nothing, and counts the special-bit records of an interrupted run as
/// `apply` would restore them, reporting those it would refuse.
fn walk(
    pass: &Pass<'_>,
    threads: &Threads,
    (root_fd, root_meta): (OwnedFd, Meta),
    plan: &ResumePlan,
    before: MarkerState,
    other_done: Option<&Untrusted>,
) -> Result<VolumeReport, Error> {
    // The walk consumes the root fd (the root node owns it); marker writes use a duplicate.
    let marker_fd = plan.run().and_then(|_| rustix::io::fcntl_dupfd_cloexec(&root_fd, 0).ok());
    let root = marker_fd.as_ref().map(AsFd::as_fd);
    let fixer = pass.fixer(plan, root.map(|r| Place::new(r, None)));
    let marked = match (root, plan.run()) {
        (Some(root), Some(run)) => Some((root, run, begin_marker(pass, (root, &root_meta), run, other_done)?)),
        _ => None,
    };
    pass.take_over(root_fd.as_fd(), &fixer, plan);
    let mounts = root.map(lifecycle::MountWatch::start);
    let (action, then) = match pass.opts.mode {
        Mode::Check => (Action::Checked, "the counts cover what was checked"),
        Mode::Apply => (Action::Walked, "the next start resumes"),
    };
    let stop = pass.walk(&fixer, threads, root_fd, root_meta, then);
    if let (Some(root), None) = (root, stop) {
        fixer.conclude(root);
    }
    let after = match (marked, &mounts) {
        (Some((root, run, Begun::Written)), Some(mounts)) => Some(settle_marker(root, pass, run, &fixer, stop, mounts)),
        (Some((_, _, Begun::Removed)), _) => Some(MarkerState::None),
        _ => None,
    };
    let report = pass.report(fixer, stop, action, before, after);
    log_left(pass, &report);
    Ok(report)
}

/// What became of the `in-progress` marker written before the walk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Begun {
    Written,
    /// Not written; whatever marker was there stays.
    Failed,
    /// Not written, and the marker that was there removed (no `done` may stay from before).
    Removed,
}

/// Writes the `in-progress` marker of run `run` on the root (seen as `meta`). A marker that
/// can't be written is a warning naming the cause (the entries can still be fixed), and the
/// marker that was there is removed, so that no `done` stays from before; a `done` marker of
/// another spec (`other_done`, its spec in words) that can't be removed either fails the pass
/// before any change: a walk would leave it claiming a volume it changed.
fn begin_marker(
    pass: &Pass<'_>,
    (root, meta): (BorrowedFd<'_>, &Meta),
    run: &RunId,
    other_done: Option<&Untrusted>,
) -> Result<Begun, Error> {
    let shown = pass.shown.as_str();
    let e = match marker::write(root, &pass_marker(pass, State::InProgress, run)) {
        Ok(()) => return Ok(Begun::Written),
        Err(e) => e,
    };
    // A read-only volume: whatever needs a change fails on its own; one that conforms is fine.
    if e == Errno::ROFS {
        warn!(path = %shown, "read-only filesystem: no marker can be written");
        return Ok(Begun::Failed);
    }
    let why = marker::refused(root, e);
    let removed = marker::remove(root).is_ok();
    if let (false, Some(spec)) = (removed, other_done) {
        return Err(Error::MarkerStuck { path: pass.path.to_path_buf(), spec: spec.clone(), why });
    }
    if matches!(e, Errno::ACCESS | Errno::PERM) && matches!(pass.opts.privilege, Privilege::Unprivileged { .. }) {
        // Unprivileged, on a root of another user that this user may not write: the entries
        // can still be fixed; only the O(1) restart and resume are lost.
        warn!(path = %shown, root_uid = meta.uid, root_mode = format!("{:04o}", meta.perm()).as_str(),
              "the root is not writable by this user ({why}): no marker (every start walks), no resume");
    } else {
        // A full filesystem, an immutable root (or anything else): the entries can still be
        // fixed, and a volume that conforms must let its app start.
        warn!(path = %shown, "cannot write the marker: {why}; walking without it (no resume; the next start walks again)");
    }
    Ok(if removed { Begun::Removed } else { Begun::Failed })
}

/// The unsharded marker of this pass, in `state`, for run `run`; started when the pass started.
fn pass_marker(pass: &Pass<'_>, state: State, run: &RunId) -> Marker {
    let started = marker::now().saturating_sub(pass.started.elapsed().as_secs());
    Marker::new(state, &pass.digest, &pass.spec_text, run, started)
}

/// Says what an unprivileged pass left (if it did): how many entries, the first few, what a
/// privileged run would change on them, and how to get one.
fn log_left(pass: &Pass<'_>, r: &VolumeReport) {
    if r.counts.foreign_owned == 0 {
        return;
    }
    let first: Vec<&str> = r.foreign_owned_list.iter().take(5).map(|e| e.path.as_str()).collect();
    let unread = match r.counts.foreign_unread_dirs {
        0 => String::new(),
        n => format!(" ({n} of them directories this user may not read: their contents were not checked)"),
    };
    let verb = if pass.opts.mode == Mode::Check { "would be left" } else { "were left as they are" };
    let spec = pass.spec;
    warn!(
        path = r.path.as_str(),
        foreign_owned = r.counts.foreign_owned,
        foreign_unread_dirs = r.counts.foreign_unread_dirs,
        "{}: {} entries owned by other users do not conform and {verb}{unread}; first: {}. A privileged run would give them group {} and the mode bits of spec '{}' (see foreign_owned_list in the report): run `volprep apply {} {}` once as root, e.g. the standalone Job of examples/fleet or the migrate chart",
        r.path,
        r.counts.foreign_owned,
        first.join(" "),
        spec.gid().map_or_else(|| "-".to_string(), |g| g.to_string()),
        spec,
        spec.to_args().join(" "),
        r.path,
    );
}

/// After the walk: `done` (and the checkpoint removed) when no entry failed, no signal stopped
/// the walk (`stop`) and the mount points below the root stayed put (`mounts`, taken at its
/// start); otherwise the marker stays `in-progress` and the checkpoint is written out for the
/// next run. An unprivileged pass that left other users' entries marks the marker with how many
/// (`left`): the next run walks again, and only a privileged run can make it `done`. A marker
/// that can't be written is a warning. Returns the state.
fn settle_marker(
    root: BorrowedFd<'_>,
    pass: &Pass<'_>,
    run: &RunId,
    fixer: &Fixer<'_>,
    stop: Option<Stop>,
    mounts: &lifecycle::MountWatch,
) -> MarkerState {
    let errors = fixer.counters().errors.get();
    let clean = errors == 0 && stop.is_none() && !fixer.probe().final_verdict().stops();
    let settled = if clean { mounts.end(root, fixer).map_err(Some) } else { Err(None) };
    let mounts = match settled {
        Ok(mounts) => mounts,
        Err(why) => return unsettled(pass, fixer, why),
    };
    let left = fixer.counters().foreign_owned.get();
    let m = Marker {
        finished: Some(marker::now()),
        entries: Some(fixer.counters().entries.get()),
        left: (left > 0).then_some(left),
        mounts,
        ..pass_marker(pass, if left > 0 { State::InProgress } else { State::Done }, run)
    };
    // The checkpoint goes first, so that the `done` marker never lacks room beside it (a small
    // filesystem). A kill in between leaves `in-progress` with no checkpoint: a full walk.
    let place = Place::new(root, None);
    let _ = place.remove_checkpoint();
    match marker::write(root, &m).and_then(|()| place.remove()) {
        Ok(()) if left > 0 => MarkerState::InProgress,
        Ok(()) => MarkerState::Done,
        // Every entry conforms: the app may start. Only the next start's skip is lost.
        Err(e) => {
            let what = if left > 0 { "every entry this user owns conforms" } else { "every entry conforms" };
            warn!(path = %pass.shown,
                  "{what}, but cannot write the marker: {}; the next start walks again", marker::refused(root, e));
            MarkerState::InProgress
        }
    }
}

/// A pass that may not mark the volume done: its checkpoint is written out for the next run,
/// and, when the mount points below the root changed while it ran (`why`), it says so.
fn unsettled(pass: &Pass<'_>, fixer: &Fixer<'_>, why: Option<String>) -> MarkerState {
    if let Some(why) = why {
        warn!(path = %pass.shown, "{why}: what a mount hid while the pass ran was not walked, so the volume is not marked done; the next start walks again (resuming this pass)");
    }
    if let Some(r) = fixer.resume() {
        if let Err(e) = r.write() {
            debug!("{}: cannot write the checkpoint: {e}", pass.shown);
        }
    }
    MarkerState::InProgress
}

/// Takes the advisory lock on the root (`flock`), waiting up to `timeout` and saying who holds
/// it; gives up at once on SIGTERM.
pub fn lock(root: BorrowedFd<'_>, path: &Path, timeout: Duration) -> Result<(), Error> {
    let start = Instant::now();
    let mut next_log = Duration::ZERO;
    loop {
        match sys::try_lock(root) {
            Ok(true) => return Ok(()),
            Ok(false) => {}
            // No lock support (some network filesystems): go on without.
            Err(Errno::NOLCK) | Err(Errno::OPNOTSUPP) => return Ok(()),
            Err(e) => return Err(Error::sys(path, Op::Lock, e)),
        }
        let waited = start.elapsed();
        if let Some(sig) = sys::termination() {
            return Err(Error::StoppedWaitingForLock { path: path.to_path_buf(), sig, holder: lock_holder(root) });
        }
        if waited >= timeout {
            return Err(Error::LockTimeout {
                path: path.to_path_buf(),
                holder: lock_holder(root),
                waited_s: waited.as_secs(),
            });
        }
        if waited >= next_log {
            info!(path = %Escaped(path.as_os_str()), "{}; waiting for its lock ({}s so far)", lock_holder(root), waited.as_secs());
            next_log += Duration::from_secs(10);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Who holds the lock on the root, as far as this host can tell (`/proc/locks`).
fn lock_holder(root: BorrowedFd<'_>) -> String {
    let holders = sys::lock_holders(root);
    let me = std::process::id();
    match holders.iter().find(|h| h.pid != me).or(holders.first()) {
        None => "a process not visible from here holds a lock on the volume root (another container's, or another \
                 node's on a network filesystem; maybe another volprep)"
            .into(),
        Some(LockHolder { pid: 0, .. }) => "a process in another pid namespace holds a lock on the volume root".into(),
        Some(LockHolder { pid, command: Some(name) }) if name == "volprep" => {
            format!("another volprep (pid {pid}) is preparing this volume")
        }
        Some(LockHolder { pid, command: Some(name) }) => {
            format!("a process (pid {pid}, {}) holds a lock on the volume root", escape_bytes(name.as_bytes()))
        }
        Some(LockHolder { pid, command: None }) => format!("a process (pid {pid}) holds a lock on the volume root"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::special::SpecialRecord;

    #[test]
    fn the_plan_continues_only_an_interrupted_run_of_this_spec_and_check_keeps_nothing() {
        let r1 = RunId::parse("r1").unwrap();
        let found = Found::Marker(Marker::new(State::InProgress, &"d".into(), "s", &r1, 0));
        let record = SpecialRecord { path: "bin/tool".into(), ino: 7, mode: 0o4755 };
        let checkpoint = Checkpoint { pending: vec![record.clone()], ..Checkpoint::new(&r1, &"d".into()) };
        let resume = Decision::Walk { reason: String::new(), resume: true };
        let fresh = Decision::Walk { reason: String::new(), resume: false };
        let read = |m: &Marker| (m.run == r1).then(|| checkpoint.clone());
        let never = |_: &Marker| -> Option<Checkpoint> { panic!("no checkpoint is read for a fresh walk") };

        assert_eq!(
            plan(&resume, &found, Mode::Apply, read),
            ResumePlan::Resume { run: r1.clone(), checkpoint: checkpoint.clone() }
        );
        // Its checkpoint gone: the run goes on under its id, from nothing.
        assert_eq!(plan(&resume, &found, Mode::Apply, |_| None), ResumePlan::Fresh { run: r1.clone() });
        let ResumePlan::Fresh { run } = plan(&fresh, &found, Mode::Apply, never) else { panic!("a new run") };
        assert_ne!(run, r1);
        assert_eq!(plan(&fresh, &Found::Unsupported, Mode::Apply, never), ResumePlan::None);
        assert_eq!(plan(&resume, &found, Mode::Check, read), ResumePlan::CheckPending(vec![record]));
        assert_eq!(plan(&fresh, &found, Mode::Check, never), ResumePlan::None);
        assert_eq!(plan(&Decision::Skip(String::new()), &found, Mode::Check, never), ResumePlan::None);
    }
}
