//! One volume from start to end: open the root, take the lock, read the marker, decide to skip
//! or walk (and why), walk with the [`Fixer`], then leave the marker `done` only if every entry
//! conforms.

use std::os::fd::{BorrowedFd, OwnedFd};
use std::path::Path;
use std::time::{Duration, Instant};

use rustix::io::Errno;
use tracing::{debug, info, warn};

use crate::error::{Error, Op};
use crate::escape::Escaped;
use crate::fix;
use crate::marker::{self, Decision, Found, Marker, State};
use crate::options::{Mode, RunOptions};
use crate::pass::Fixer;
use crate::progress::{self, Counters};
use crate::report::{Action, VolumeReport};
use crate::resume::{self, Resume};
use crate::spec::Spec;
use crate::sys::{self, Meta};
use crate::walk::Walk;

/// Prepares (or checks) the volume at `path`. Fatal problems at start (missing, not a
/// directory, lock timeout) are errors; per-entry failures are counted in the report.
pub fn run(path: &Path, spec: &Spec, opts: &RunOptions) -> Result<VolumeReport, Error> {
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
    let digest = spec.digest();
    let spec_text = spec.to_string();
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
    // The estimate is a number when known (JSON logs keep its type), else the word "unknown".
    match estimate {
        Some(n) => info!(
            fs = fs.as_str(),
            spec = spec_text.as_str(),
            digest = digest.as_str(),
            threads = opts.threads,
            estimated_entries = n,
            marker = found.state_word(),
            decision = verb,
            reason = reason.as_str(),
            "{verb} {shown}"
        ),
        None => info!(
            fs = fs.as_str(),
            spec = spec_text.as_str(),
            digest = digest.as_str(),
            threads = opts.threads,
            estimated_entries = "unknown",
            marker = found.state_word(),
            decision = verb,
            reason = reason.as_str(),
            "{verb} {shown}"
        ),
    }
    let ctx = Ctx { path, spec, opts, started, reason: reason.clone(), fs, estimate };
    let mut report = match (&decision, opts.mode) {
        (Decision::Skip(_), Mode::Apply) => {
            let fixer = Fixer::new(path, spec, opts.mode, None);
            finish_report(fixer, &ctx, Action::Skipped)
        }
        (Decision::Skip(_), Mode::Check) => walk(&ctx, root_fd, root_meta, None),
        (Decision::Walk { resume, .. }, _) => {
            let resume = (opts.mode == Mode::Apply && found != Found::Unsupported).then(|| {
                let prev = match &found {
                    Found::Marker(m) if *resume => {
                        marker::read_checkpoint(root).filter(|c| c.run == m.run && c.digest == digest)
                    }
                    _ => None,
                };
                let run = match &found {
                    Found::Marker(m) if *resume => m.run.clone(),
                    _ => marker::new_run_id(),
                };
                (run, prev)
            });
            walk(&ctx, root_fd, root_meta, resume)
        }
    };
    report.marker_before = found.state_word().to_string();
    if report.marker_after.is_empty() {
        // Nothing was written (a skip, `check`, no xattrs): the marker is as it was.
        report.marker_after = report.marker_before.clone();
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
}

fn walk(
    ctx: &Ctx<'_>,
    root_fd: OwnedFd,
    root_meta: Meta,
    resume: Option<(String, Option<marker::Checkpoint>)>,
) -> VolumeReport {
    let (path, spec, opts) = (ctx.path, ctx.spec, ctx.opts);
    // The walk consumes the root fd (the root node owns it); marker writes use a duplicate.
    let marker_fd = resume.as_ref().and_then(|_| rustix::io::fcntl_dupfd_cloexec(&root_fd, 0).ok());
    let root = marker_fd.as_ref().map(sys::fd);
    let (run, resume) = match (resume, root) {
        (Some((run, prev)), Some(root)) => {
            let r = Resume::new(root, prev, &run, &spec.digest(), opts.checkpoint_interval);
            (Some(run), Some(r))
        }
        _ => (None, None),
    };
    let mut fixer = Fixer::new(path, spec, opts.mode, resume);
    let mut marker_written = false;
    if let (Some(run), Some(root)) = (&run, root) {
        let m = Marker {
            v: marker::FORMAT,
            state: State::InProgress,
            digest: spec.digest(),
            spec: spec.to_string(),
            run: run.clone(),
            started: marker::now() - ctx.started.elapsed().as_secs(),
            finished: None,
            entries: None,
            shards: None,
        };
        match marker::write(root, &m) {
            Ok(()) => marker_written = true,
            // A read-only volume: whatever needs a change fails on its own; one that conforms is fine.
            Err(Errno::ROFS) => {
                warn!(path = %Escaped(path.as_os_str()), "read-only filesystem: no marker can be written")
            }
            Err(e) => fixer.error_at(path, Op::Xattr, e),
        }
        if let Some(prev) = fixer.resume.as_ref().and_then(|r| r.previous.clone()) {
            info!(
                subtrees = prev.done.len(),
                "resuming run {run}: {} finished top-level directories are not read again",
                prev.done.len()
            );
            for (full, op, e) in resume::restore_pending(root, path, &prev.pending, spec) {
                fixer.error_at(&full, op, e);
            }
        }
    }
    let shown = Escaped(path.as_os_str()).to_string();
    progress::watch(&fixer.counters, ctx.estimate, opts.progress, &shown, || {
        Walk::new(&fixer, root_meta.dev, opts.cross_devices).run(root_fd, root_meta)
    });
    let action = if opts.mode == Mode::Apply { Action::Walked } else { Action::Checked };
    let mut marker_after = None;
    if let (Some(run), Some(root), true) = (&run, root, marker_written) {
        marker_after = Some(settle_marker(root, ctx, run, &mut fixer));
    }
    let mut report = finish_report(fixer, ctx, action);
    if let Some(m) = marker_after {
        report.marker_after = m;
    }
    report
}

/// After the walk: `done` (and the checkpoint removed) when no entry failed; otherwise the marker
/// stays `in-progress` and the checkpoint is written out for the next run. Returns the state word.
fn settle_marker(root: BorrowedFd<'_>, ctx: &Ctx<'_>, run: &str, fixer: &mut Fixer<'_>) -> String {
    let (path, spec) = (ctx.path, ctx.spec);
    let errors = Counters::get(&fixer.counters.errors);
    if errors > 0 {
        if let Some(r) = &fixer.resume {
            if let Err(e) = marker::write_checkpoint(root, &r.snapshot()) {
                debug!("{}: cannot write the checkpoint: {e}", Escaped(path.as_os_str()));
            }
        }
        return "in-progress".into();
    }
    let m = Marker {
        v: marker::FORMAT,
        state: State::Done,
        digest: spec.digest(),
        spec: spec.to_string(),
        run: run.to_string(),
        started: marker::now() - ctx.started.elapsed().as_secs(),
        finished: Some(marker::now()),
        entries: Some(Counters::get(&fixer.counters.entries)),
        shards: None,
    };
    match marker::write(root, &m).and_then(|()| marker::remove_checkpoint(root)) {
        Ok(()) => "done".into(),
        Err(e) => {
            fixer.error_at(path, Op::Xattr, e);
            "in-progress".into()
        }
    }
}

/// Takes the advisory lock on the root (`flock`), waiting up to `timeout` and saying so.
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
        if waited >= timeout {
            return Err(Error::Other {
                path: path.to_path_buf(),
                msg: format!(
                    "another volprep holds the volume lock; gave up after {}s (--lock-timeout)",
                    waited.as_secs()
                ),
            });
        }
        if waited >= next_log {
            info!(path = %Escaped(path.as_os_str()), "another volprep is preparing this volume; waiting for its lock ({}s so far)", waited.as_secs());
            next_log += Duration::from_secs(10);
        }
        std::thread::sleep(Duration::from_millis(50));
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
