//! One volume from start to end: open the root, take the lock, read the marker, decide to skip
//! or walk (and why), walk with the [`Fixer`], then leave the marker `done` only if every entry
//! conforms (an unprivileged pass that left other users' entries says so, and what would fix them).

use std::os::fd::{BorrowedFd, OwnedFd};
use std::path::Path;
use std::time::{Duration, Instant};

use rustix::io::Errno;
use tracing::{debug, info, warn};

use crate::error::{Error, Op};
use crate::escape::{Escaped, escape_bytes};
use crate::fix;
use crate::marker::{self, Decision, Found, Marker, State};
use crate::options::{Mode, Privilege, RunOptions, Verify};
use crate::pass::Fixer;
use crate::progress;
use crate::report::{Action, VolumeReport};
use crate::resume::{self, Place, Resume};
use crate::spec::Spec;
use crate::state::MarkerState;
use crate::sys::{self, Meta};
use crate::walk::{Pool, Walk};

/// Prepares (or checks) the volume at `path`, walking on `pool` (started here if this volume is
/// the first to need it). Fatal problems at start (missing, not a directory, lock timeout) are
/// errors; per-entry failures are counted in the report.
pub fn run(path: &Path, spec: &Spec, opts: &RunOptions, pool: &Pool) -> Result<VolumeReport, Error> {
    let started = Instant::now();
    let root_fd = sys::open_root(path).map_err(|e| match e {
        Errno::NOTDIR => Error::NotADirectory { path: path.to_path_buf() },
        e => Error::sys(path, Op::Open, e),
    })?;
    let root = sys::fd(&root_fd);
    if opts.mode == Mode::Apply {
        lock(root, path, opts.lock_timeout)?;
    }
    // Read after the lock: a run that waited sees what the other run left.
    let root_meta = sys::stat_fd(root).map_err(|e| Error::sys(path, Op::Stat, e))?;
    let found = marker::read(root);
    // What the marker keeps: the spec and what the pass covers (`--cross-devices`).
    let digest = spec.coverage_digest(opts.cross_devices);
    let spec_text = spec.coverage_text(opts.cross_devices);
    let decision = marker::decide(&marker::Inputs {
        found: &found,
        digest: &digest,
        spec: &spec_text,
        root_conforms: fix::decide(&root_meta, spec).is_none(),
        force: opts.force,
        verify: opts.verify,
        reverify_after: opts.reverify_after,
        now: marker::now(),
    });
    let shown = Escaped(path.as_os_str()).to_string();
    if let Found::Unsupported = found {
        warn!(path = %shown, "no extended attributes on this filesystem: no marker, no resume; falling back to the root-only check");
    }
    let (fs, estimate) = sys::fs_info(root);
    let (verb, reason) = match (&decision, opts.mode) {
        (Decision::Skip(r), Mode::Apply) => ("skip", r.clone()),
        (Decision::Skip(r), Mode::Check) => ("check", format!("check walks every entry (apply would skip: {r})")),
        (Decision::Walk { reason, .. }, Mode::Check) => ("check", reason.clone()),
        (Decision::Walk { resume: true, reason }, Mode::Apply) => ("resume", reason.clone()),
        (Decision::Walk { reason, .. }, Mode::Apply) => ("walk", reason.clone()),
    };
    let line = progress::DecisionLine {
        shown: &shown,
        fs: &fs,
        spec: &spec_text,
        digest: &digest,
        threads: opts.threads,
        estimate,
        marker: found.state(),
        decision: verb,
        reason: &reason,
    };
    line.log();
    let ctx =
        Ctx { path, spec, opts, started, reason: reason.clone(), fs, estimate, digest: digest.clone(), spec_text };
    let mut report = match (&decision, opts.mode) {
        (Decision::Skip(_), Mode::Apply) => {
            let fixer = Fixer::new(path, spec, opts.mode, None);
            finish_report(fixer, &ctx, Action::Skipped)
        }
        (Decision::Skip(_), Mode::Check) => walk(&ctx, pool.start()?, root_fd, root_meta, None),
        (Decision::Walk { resume, .. }, Mode::Check) => {
            // What `apply` would do with the special-bit records of the interrupted run.
            let pending = match &found {
                Found::Marker(m) if *resume => Place::new(root, None).read(&m.run, &digest).map(|c| c.pending),
                _ => None,
            };
            walk(
                &ctx,
                pool.start()?,
                root_fd,
                root_meta,
                pending.map(|p| (String::new(), Some(marker::Checkpoint { pending: p, ..Default::default() }))),
            )
        }
        (Decision::Walk { resume, .. }, Mode::Apply) => {
            let resume = (found != Found::Unsupported).then(|| {
                let prev = match &found {
                    Found::Marker(m) if *resume => Place::new(root, None).read(&m.run, &digest),
                    _ => None,
                };
                let run = match &found {
                    Found::Marker(m) if *resume => m.run.clone(),
                    _ => crate::runid::new_run_id(),
                };
                (run, prev)
            });
            walk(&ctx, pool.start()?, root_fd, root_meta, resume)
        }
    };
    report.marker_before = found.state();
    report.spec = ctx.spec_text.clone();
    report.spec_digest = ctx.digest.clone();
    if report.marker_after == MarkerState::Unknown {
        // Nothing was written (a skip, `check`, no xattrs): the marker is as it was.
        report.marker_after = report.marker_before;
    }
    Ok(report)
}

/// What one volume's run knows once it has decided.
struct Ctx<'a> {
    path: &'a Path,
    spec: &'a Spec,
    opts: &'a RunOptions,
    started: Instant,
    reason: String,
    fs: String,
    estimate: Option<u64>,
    /// The marker's digest and spec text: the spec and what the pass covers.
    digest: String,
    spec_text: String,
}

fn walk(
    ctx: &Ctx<'_>,
    threads: &rayon_core::ThreadPool,
    root_fd: OwnedFd,
    root_meta: Meta,
    resume: Option<(String, Option<marker::Checkpoint>)>,
) -> VolumeReport {
    let (path, spec, opts) = (ctx.path, ctx.spec, ctx.opts);
    if opts.mode == Mode::Check {
        let mut fixer = Fixer::new(path, spec, opts.mode, None);
        fixer.privilege = opts.privilege;
        if let Some((_, Some(prev))) = &resume {
            // `check` counts what apply would restore and reports what it would refuse.
            fixer.record_restored(&resume::restore_pending(sys::fd(&root_fd), path, &prev.pending, spec, true));
        }
        let shown = Escaped(path.as_os_str()).to_string();
        progress::watch(&fixer.counters, ctx.estimate, opts.progress, &shown, || {
            threads.install(|| Walk::new(&fixer, &root_meta, opts.cross_devices).run(root_fd, root_meta))
        });
        fixer.interrupted = sys::termination();
        if let Some(sig) = fixer.interrupted {
            warn!(path = %Escaped(path.as_os_str()), "{sig}: stopped walking; the counts cover what was checked");
        }
        let report = finish_report(fixer, ctx, Action::Checked);
        if report.counts.foreign_owned > 0 {
            log_left(ctx, &report);
        }
        return report;
    }
    // The walk consumes the root fd (the root node owns it); marker writes use a duplicate.
    let marker_fd = resume.as_ref().and_then(|_| rustix::io::fcntl_dupfd_cloexec(&root_fd, 0).ok());
    let root = marker_fd.as_ref().map(sys::fd);
    let resumed = matches!(&resume, Some((_, Some(_))));
    let (run, resume) = match (resume, root) {
        (Some((run, prev)), Some(root)) => {
            // Nothing is skipped on the checkpoint's word under --verify full.
            let skip = opts.verify != Verify::Full;
            let r = Resume::new(Place::new(root, None), prev, skip, &run, &ctx.digest, opts.checkpoint_interval);
            (Some(run), Some(r))
        }
        _ => (None, None),
    };
    let mut fixer = Fixer::new(path, spec, opts.mode, resume);
    fixer.privilege = opts.privilege;
    let mut marker_written = false;
    let mut marker_removed = false;
    if let (Some(run), Some(root)) = (&run, root) {
        let started = marker::now() - ctx.started.elapsed().as_secs();
        let m = Marker::new(State::InProgress, &ctx.digest, &ctx.spec_text, run, started);
        match marker::write(root, &m) {
            Ok(()) => marker_written = true,
            // A read-only volume: whatever needs a change fails on its own; one that conforms is fine.
            Err(Errno::ROFS) => {
                warn!(path = %Escaped(path.as_os_str()), "read-only filesystem: no marker can be written")
            }
            // Unprivileged, on a root of another user that this user may not write: the entries
            // can still be fixed; only the O(1) restart and resume are lost.
            Err(Errno::ACCESS | Errno::PERM) if matches!(opts.privilege, Privilege::Unprivileged { .. }) => {
                warn!(path = %Escaped(path.as_os_str()), root_uid = root_meta.uid, root_mode = format!("{:04o}", root_meta.perm()).as_str(),
                      "the root is not writable by this user: no marker (every start walks), no resume")
            }
            // A full filesystem (or quota, or anything else): the entries can still be fixed, and a
            // volume that conforms must let its app start. No `done` marker may stay from before.
            Err(e) => {
                marker_removed = marker::remove(root).is_ok();
                warn!(path = %Escaped(path.as_os_str()),
                      "cannot write the marker: {}; walking without it (no resume; the next start walks again)",
                      crate::error::errno_text(e.raw_os_error()));
            }
        }
        if let (Some(r), true) = (&fixer.resume, resumed) {
            let (records, covered) = r.adopted();
            info!(
                records,
                covered,
                "resuming run {}: {records} directory records of finished work, covering {covered} entries, are not read again",
                marker::escape_str(run),
            );
            let restored = resume::restore_pending(root, path, &r.previous_pending, spec, false);
            fixer.record_restored(&restored);
            r.keep_pending(restored.kept);
        }
    }
    let shown = Escaped(path.as_os_str()).to_string();
    progress::watch(&fixer.counters, ctx.estimate, opts.progress, &shown, || {
        threads.install(|| Walk::new(&fixer, &root_meta, opts.cross_devices).run(root_fd, root_meta))
    });
    fixer.interrupted = sys::termination();
    if let Some(sig) = fixer.interrupted {
        warn!(path = %Escaped(path.as_os_str()), "{sig}: stopped walking; the next start resumes");
    }
    let mut marker_after = marker_removed.then_some(MarkerState::None);
    if let (Some(run), Some(root), true) = (&run, root, marker_written) {
        marker_after = Some(settle_marker(root, ctx, run, &mut fixer));
    }
    let mut report = finish_report(fixer, ctx, Action::Walked);
    if let Some(m) = marker_after {
        report.marker_after = m;
    }
    if report.counts.foreign_owned > 0 {
        log_left(ctx, &report);
    }
    report
}

/// Says what an unprivileged pass left: how many entries, the first few, what a privileged run
/// would change on them, and how to get one.
fn log_left(ctx: &Ctx<'_>, r: &VolumeReport) {
    let first: Vec<&str> = r.foreign_owned_list.iter().take(5).map(|e| e.path.as_str()).collect();
    let unread = match r.counts.foreign_unread_dirs {
        0 => String::new(),
        n => format!(" ({n} of them directories this user may not read: their contents were not checked)"),
    };
    let verb = if ctx.opts.mode == Mode::Check { "would be left" } else { "were left as they are" };
    warn!(
        path = r.path.as_str(),
        foreign_owned = r.counts.foreign_owned,
        foreign_unread_dirs = r.counts.foreign_unread_dirs,
        "{}: {} entries owned by other users do not conform and {verb}{unread}; first: {}. A privileged run would give them group {} and the mode bits of spec '{}' (see foreign_owned_list in the report): run `volprep apply {} {}` once as root, e.g. the standalone Job of examples/fleet or the migrate chart",
        r.path,
        r.counts.foreign_owned,
        first.join(" "),
        ctx.spec.gid().map_or_else(|| "-".to_string(), |g| g.to_string()),
        ctx.spec,
        ctx.spec.to_string().split(' ').map(|w| format!("--{w}")).collect::<Vec<_>>().join(" "),
        r.path,
    );
}

/// After the walk: `done` (and the checkpoint removed) when no entry failed and no signal stopped
/// the walk; otherwise the marker stays `in-progress` and the checkpoint is written out for the
/// next run. An unprivileged pass that left other users' entries marks the marker with how many
/// (`left`): the next run walks again, and only a privileged run can make it `done`. A marker
/// that can't be written is a warning. Returns the state.
fn settle_marker(root: BorrowedFd<'_>, ctx: &Ctx<'_>, run: &str, fixer: &mut Fixer<'_>) -> MarkerState {
    let path = ctx.path;
    let errors = fixer.counters.errors.get();
    if errors > 0 || fixer.interrupted.is_some() {
        if let Some(r) = &fixer.resume {
            if let Err(e) = r.write() {
                debug!("{}: cannot write the checkpoint: {e}", Escaped(path.as_os_str()));
            }
        }
        return MarkerState::InProgress;
    }
    let left = fixer.counters.foreign_owned.get();
    let state = if left > 0 { State::InProgress } else { State::Done };
    let started = marker::now() - ctx.started.elapsed().as_secs();
    let m = Marker {
        finished: Some(marker::now()),
        entries: Some(fixer.counters.entries.get()),
        left: (left > 0).then_some(left),
        ..Marker::new(state, &ctx.digest, &ctx.spec_text, run, started)
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
            warn!(path = %Escaped(path.as_os_str()),
                  "{what}, but cannot write the marker: {}; the next start walks again",
                  crate::error::errno_text(e.raw_os_error()));
            MarkerState::InProgress
        }
    }
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
            return Err(Error::Other {
                path: path.to_path_buf(),
                msg: format!("{sig} while waiting for the volume lock ({})", lock_holder(root)),
            });
        }
        if waited >= timeout {
            return Err(Error::Other {
                path: path.to_path_buf(),
                msg: format!("{}; gave up after {}s (--lock-timeout)", lock_holder(root), waited.as_secs()),
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
    match holders.iter().find(|(pid, _)| *pid != me).or(holders.first()) {
        None => "a process not visible from here holds a lock on the volume root (another container's, or another \
                 node's on a network filesystem; maybe another volprep)"
            .into(),
        Some((0, _)) => "a process in another pid namespace holds a lock on the volume root".into(),
        Some((pid, Some(name))) if name == "volprep" => format!("another volprep (pid {pid}) is preparing this volume"),
        Some((pid, Some(name))) => {
            format!("a process (pid {pid}, {}) holds a lock on the volume root", escape_bytes(name.as_bytes()))
        }
        Some((pid, None)) => format!("a process (pid {pid}) holds a lock on the volume root"),
    }
}

fn finish_report(fixer: Fixer<'_>, ctx: &Ctx<'_>, action: Action) -> VolumeReport {
    let mut r = VolumeReport::empty(ctx.path, ctx.spec, ctx.opts.threads, action);
    r.reason = ctx.reason.clone();
    r.fs_type = ctx.fs.clone();
    r.estimated_entries = ctx.estimate;
    fixer.fill(&mut r, ctx.started.elapsed());
    r
}
