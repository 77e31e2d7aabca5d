//! The sharded run (`apply --shard I/N`): one of N processes (an Indexed Job's pods) prepares its
//! part of a volume; the root marker is where they meet, and the run that completes the set fixes
//! the root and marks the volume done once it has checked what the other shards claim
//! ([`recheck`]). Which entries a shard owns is [`ShardFilter`]'s rule.

mod recheck;

use std::os::fd::{AsFd, BorrowedFd};
use std::path::Path;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use rustix::io::Errno;
use tracing::{debug, info, warn};

use crate::error::{Error, Op};
use crate::escape::Escaped;
use crate::fix;
use crate::marker::{self, Claim, Decision, Found, Heartbeat, Marker, Shards, State};
use crate::options::{Mode, RunOptions, ShardFilter, Verify};
use crate::pass::Fixer;
use crate::progress;
use crate::report::{Action, VolumeReport};
use crate::resume::{self, Place, Resume};
use crate::spec::Spec;
use crate::state::MarkerState;
use crate::sys;
use crate::volume;
use crate::walk::{Pool, Walk};

/// A running shard whose heartbeat is older than this is taken for dead.
const STALE_AFTER: u64 = 30;
/// How often a running shard renews its heartbeat.
const HEARTBEAT: Duration = Duration::from_secs(10);

/// What a shard does after looking at the marker.
enum Step {
    Skip(String),
    Wait(String),
    Walk(String),
    /// Every shard is done but the volume is not: a finishing run was killed.
    Finish,
}

/// What a shard leaves after recording its outcome.
enum Outcome {
    /// The marker's state word: this run does not complete the volume.
    Left(MarkerState),
    /// Every shard is done: this run checks the others' claims, then seals the volume.
    Complete(Shards),
}

/// Runs shard `filter.index` of the volume at `path`.
pub fn run(
    path: &Path,
    spec: &Spec,
    opts: &RunOptions,
    filter: ShardFilter,
    pool: &Pool,
) -> Result<VolumeReport, Error> {
    let started = Instant::now();
    let root_fd = sys::open_root(path).map_err(|e| match e {
        Errno::NOTDIR => Error::NotADirectory { path: path.to_path_buf() },
        e => Error::sys(path, Op::Open, e),
    })?;
    let root = root_fd.as_fd();
    let run_id = crate::runid::new_run_id();
    let shown = Escaped(path.as_os_str()).to_string();
    let name = format!("{}/{}", filter.index, filter.count);
    let mut waited_log = Duration::ZERO;
    let mut marker_before;
    let step = loop {
        if let Some(sig) = sys::termination() {
            return Err(Error::Other { path: path.to_path_buf(), msg: format!("shard {name}: {sig} before walking") });
        }
        let (step, before) =
            with_lock(root, path, opts.lock_timeout, |root| register(root, path, spec, opts, filter, &run_id))?;
        marker_before = before;
        match step {
            Step::Wait(why) if started.elapsed() < opts.lock_timeout => {
                if started.elapsed() >= waited_log {
                    info!(path = %shown, "shard {name}: waiting: {why}");
                    waited_log += Duration::from_secs(10);
                }
                std::thread::sleep(Duration::from_millis(500));
            }
            Step::Wait(why) => {
                return Err(Error::Other {
                    path: path.to_path_buf(),
                    msg: format!("shard {name}: {why}; gave up (--lock-timeout)"),
                });
            }
            step => break step,
        }
    };
    let mut report = VolumeReport::empty(path, spec, opts.threads, Action::Walked);
    report.spec = spec.coverage_text(opts.cross_devices);
    report.spec_digest = spec.coverage_digest(opts.cross_devices);
    report.shard = Some(name.clone());
    let walk_needed = !matches!(step, Step::Finish);
    let reason = match step {
        Step::Skip(why) => {
            info!(path = %shown, shard = %name, decision = "skip", reason = %why, "skip {shown}");
            report.action = Action::Skipped;
            report.reason = why;
            report.marker_before = marker_before;
            report.elapsed_ms = started.elapsed().as_millis() as u64;
            return Ok(report);
        }
        Step::Finish => "every shard is done; finishing the volume".to_string(),
        Step::Walk(why) => why,
        Step::Wait(_) => unreachable!("handled above"),
    };
    let (fs, estimate) = sys::fs_info(root);
    info!(path = %shown, shard = %name, fs = %fs, spec = %spec, threads = opts.threads, decision = "walk", reason = %reason, "walk {shown}");
    let resume = (walk_needed && opts.mode == Mode::Apply).then(|| shard_resume(root, spec, opts, filter));
    let mut fixer = Fixer::new(path, spec, opts.mode, resume);
    fixer.shard = Some(filter);
    fixer.privilege = opts.privilege;
    if let Some(r) = &fixer.resume {
        let (records, covered) = r.adopted();
        if records > 0 || !r.previous_pending.is_empty() {
            info!(path = %shown, shard = %name, records, covered,
                  "shard {name}: resuming: {records} directory records of finished work, covering {covered} entries, are not read again");
        }
        let restored = resume::restore_pending(root, path, &r.previous_pending, spec, false);
        fixer.record_restored(&restored);
        r.keep_pending(restored.kept);
    }
    let root_meta = sys::stat_fd(root).map_err(|e| Error::sys(path, Op::Stat, e))?;
    // The anchors this shard claims are the ones there before it walks.
    let claimed = walk_needed.then(|| own_anchors(root, &root_meta, opts, filter, &shown)).flatten();
    if walk_needed {
        let threads = pool.start()?;
        let walk_fd = rustix::io::fcntl_dupfd_cloexec(root, 0).map_err(|e| Error::sys(path, Op::Open, e))?;
        std::thread::scope(|s| {
            let (stop, stopped) = mpsc::channel::<()>();
            s.spawn(|| heartbeat(root, path, filter.index, &run_id, stopped));
            progress::watch(&fixer.counters, estimate, opts.progress, &shown, || {
                threads.install(|| Walk::new(&fixer, &root_meta, opts.cross_devices).run(walk_fd, root_meta))
            });
            drop(stop);
        });
    }
    fixer.interrupted = sys::termination();
    if let Some(sig) = fixer.interrupted {
        warn!(path = %shown, "shard {name}: {sig}: stopped walking; this shard is not done and is walked again at its next start");
    }
    // Whether this shard's own part is done: its checkpoint is then no longer needed.
    let part_done = clean(&fixer);
    let outcome = with_lock(root, path, opts.lock_timeout, |root| {
        finish(root, path, spec, opts, filter, &run_id, &fixer, claimed.as_deref())
    })?;
    let after = match outcome {
        Outcome::Left(word) => word,
        Outcome::Complete(shards) => {
            let check = recheck::Recheck { path, spec, opts, root, root_meta, threads: pool.start()?, fixer: &fixer };
            let sum = check.run(&shards, walk_needed.then_some(filter.index))?;
            if let Some(sig) = sum.stopped {
                // The check did not cover every part: the volume is not sealed.
                warn!(path = %shown, "shard {name}: {sig}: stopped checking what the other shards claim; the volume is completed at the next start");
                fixer.interrupted = Some(sig);
            }
            info!(path = %shown, shard = %name, entries = sum.entries, dirs_read = sum.dirs_read,
                  verified_dirs = sum.verified_dirs, parts = ?sum.parts,
                  "checked what the other shards claim: {} directories verified, {} read, {} entries looked at again; parts walked again whole: {:?}",
                  sum.verified_dirs, sum.dirs_read, sum.entries, sum.parts);
            with_lock(root, path, opts.lock_timeout, |root| seal(root, path, spec, opts, filter, &fixer))?
        }
    };
    if let Some(r) = &fixer.resume {
        // This shard's checkpoint: gone once its part is done, kept for its next run otherwise.
        let res = if part_done { Place::new(root, Some((filter.index, filter.count))).remove() } else { r.write() };
        if let Err(e) = res {
            debug!("{shown}: shard {name}: cannot write or remove its checkpoint: {e}");
        }
    }
    report.reason = reason;
    report.fs_type = fs;
    report.estimated_entries = estimate;
    report.marker_before = marker_before;
    report.marker_after = after;
    fixer.fill(&mut report, started.elapsed());
    Ok(report)
}

/// Under the root lock: read the marker and decide; register this run as the shard's runner.
/// Also returns the state of the marker it found (for the report).
fn register(
    root: BorrowedFd<'_>,
    path: &Path,
    spec: &Spec,
    opts: &RunOptions,
    f: ShardFilter,
    run: &str,
) -> Result<(Step, MarkerState), Error> {
    let found = marker::read(root);
    let before = found.state();
    register_on(root, path, spec, opts, f, run, found).map(|step| (step, before))
}

fn register_on(
    root: BorrowedFd<'_>,
    path: &Path,
    spec: &Spec,
    opts: &RunOptions,
    f: ShardFilter,
    run: &str,
    found: Found,
) -> Result<Step, Error> {
    let digest = spec.coverage_digest(opts.cross_devices);
    if found == Found::Unsupported {
        return Err(Error::Other {
            path: path.to_path_buf(),
            msg: "a sharded pass needs extended attributes: the root marker is where shards meet".into(),
        });
    }
    let root_meta = sys::stat_fd(root).map_err(|e| Error::sys(path, Op::Stat, e))?;
    // The skip rule of every run (spec, root, --force, --verify, --reverify-after) in one place.
    let inputs = marker::Inputs {
        found: &found,
        digest: &digest,
        spec: &spec.coverage_text(opts.cross_devices),
        root_conforms: fix::decide(&root_meta, spec).is_none(),
        force: opts.force,
        verify: opts.verify,
        reverify_after: opts.reverify_after,
        now: marker::now(),
    };
    if let Decision::Skip(why) = marker::decide(&inputs) {
        return Ok(Step::Skip(why));
    }
    let mut m = match found {
        Found::Marker(m) if m.digest == digest && m.state == State::InProgress && m.shards.is_some() => {
            match m.shards.as_ref().and_then(|s| s.misfit(f.count, f.depth)) {
                None => m,
                Some(why) => {
                    warn!(path = %Escaped(path.as_os_str()),
                          "the shard record on the root does not fit --shard {}/{} --shard-depth {}: {why}; starting a new round",
                          f.index, f.count, f.depth);
                    new_round(spec, opts, f, run)
                }
            }
        }
        _ => new_round(spec, opts, f, run),
    };
    let shards = m.shards.as_mut().expect("sharded marker");
    let now = marker::now();
    if shards.done.contains(&f.index) && opts.verify == Verify::Full {
        // Nothing is skipped on the word of the root: this shard walks its part again.
        shards.undo(f.index);
    } else if shards.done.contains(&f.index) {
        if shards.complete() {
            return Ok(Step::Finish);
        }
        return Ok(Step::Skip(format!("shard {}/{} is already done for this spec", f.index, f.count)));
    }
    if let Some(h) = shards.running.iter().find(|h| h.shard == f.index && h.run != run) {
        let (other, beat) = (marker::escape_str(&h.run), &h.at);
        // A heartbeat from the future (forged, or a clock far ahead) would hold the shard forever.
        let fresh = now.saturating_sub(*beat) < STALE_AFTER && *beat <= now + STALE_AFTER;
        if fresh && !crate::runid::run_is_dead_here(&other) {
            return Ok(Step::Wait(format!("run {other} is walking this shard")));
        }
        warn!("shard {}/{}: run {other} is gone; taking over", f.index, f.count);
    }
    shards.running.retain(|h| h.shard != f.index);
    shards.running.push(Heartbeat { shard: f.index, run: run.to_string(), at: now });
    marker::write(root, &m).map_err(|e| Error::sys(path, Op::Xattr, e))?;
    Ok(Step::Walk(format!("shard {}/{} of spec {}", f.index, f.count, spec)))
}

/// A new round of shards for this spec and layout, registered by `run`.
fn new_round(spec: &Spec, opts: &RunOptions, f: ShardFilter, run: &str) -> Marker {
    let (digest, text) = (spec.coverage_digest(opts.cross_devices), spec.coverage_text(opts.cross_devices));
    Marker {
        shards: Some(Shards { n: f.count, depth: f.depth, ..Default::default() }),
        ..Marker::new(State::InProgress, &digest, &text, run, marker::now())
    }
}

/// Under the root lock: record this shard's outcome (with its claim when its part is done).
/// When every shard is then done, the volume is not sealed here: the caller checks the other
/// shards' claims first ([`seal`] follows).
#[allow(clippy::too_many_arguments)]
fn finish(
    root: BorrowedFd<'_>,
    path: &Path,
    spec: &Spec,
    opts: &RunOptions,
    f: ShardFilter,
    run: &str,
    fixer: &Fixer<'_>,
    anchors: Option<&str>,
) -> Result<Outcome, Error> {
    let mut m = match ours(root, path, spec, opts)? {
        Ok(m) => m,
        Err(word) => return Ok(Outcome::Left(word)),
    };
    let shards = m.shards.as_mut().expect("checked");
    shards.running.retain(|h| !(h.shard == f.index && h.run == run));
    if let Some(why) = shards.misfit(f.count, f.depth) {
        // Changed during the walk: the other shards' completions are not trusted.
        warn!(path = %Escaped(path.as_os_str()), "the shard record on the root no longer fits the layout: {why}; starting a new round");
        *shards = Shards { n: f.count, depth: f.depth, ..Default::default() };
    }
    let done = clean(fixer) && !shards.done.contains(&f.index);
    if done {
        shards.entries = shards.entries.saturating_add(fixer.counters.entries.get());
    }
    if !done || anchors.is_none() {
        // Not done, or nothing to claim (a finishing run, or anchors that could not be listed).
        if done {
            shards.set_done(f.index, None);
        }
        return written(root, path, m);
    }
    // The filesystem's clock past the walk: the root's ctime right after a write on it (this
    // very record, its registration gone). A filesystem that did not move the ctime leaves an
    // earlier time, which only makes the check stricter.
    marker::write(root, &m).map_err(|e| Error::sys(path, Op::Xattr, e))?;
    let (_, times) = sys::stat_fd_times(root).map_err(|e| Error::sys(path, Op::Stat, e))?;
    let claim = anchors.map(|a| Claim { i: f.index, t: times.ctime, a: a.to_string() });
    m.shards.as_mut().expect("checked").set_done(f.index, claim);
    written(root, path, m)
}

/// Writes `m`; a record with every shard done asks the caller to check and seal.
fn written(root: BorrowedFd<'_>, path: &Path, m: Marker) -> Result<Outcome, Error> {
    marker::write(root, &m).map_err(|e| Error::sys(path, Op::Xattr, e))?;
    match m.shards {
        Some(s) if s.complete() => Ok(Outcome::Complete(s)),
        _ => Ok(Outcome::Left(MarkerState::InProgress)),
    }
}

/// The sharded marker of this spec on the root, or the state word to leave with when another
/// run of the same spec completed (or is completing) the volume unsharded.
fn ours(
    root: BorrowedFd<'_>,
    path: &Path,
    spec: &Spec,
    opts: &RunOptions,
) -> Result<Result<Marker, MarkerState>, Error> {
    let Found::Marker(m) = marker::read(root) else {
        return Err(Error::Other { path: path.to_path_buf(), msg: "the shard marker vanished during the walk".into() });
    };
    let shown = Escaped(path.as_os_str());
    match (m.digest == spec.coverage_digest(opts.cross_devices), m.shards.is_some(), m.state) {
        (true, true, _) => Ok(Ok(m)),
        (true, false, State::Done) => {
            info!(path = %shown, "the volume was completed by another run of this spec (run {}) during this shard's walk: nothing left to do", marker::escape_str(&m.run));
            Ok(Err(MarkerState::Done))
        }
        (true, false, State::InProgress) => {
            info!(path = %shown, "an unsharded run of this spec (run {}) took the volume over during this shard's walk and completes it", marker::escape_str(&m.run));
            Ok(Err(MarkerState::InProgress))
        }
        (false, ..) => Err(Error::Other {
            path: path.to_path_buf(),
            msg: "another spec took over the volume during the walk".into(),
        }),
    }
}

/// Under the root lock, once the other shards' claims were checked: fixes the root and marks
/// the volume done, if every shard is still done and this run left nothing unfinished.
fn seal(
    root: BorrowedFd<'_>,
    path: &Path,
    spec: &Spec,
    opts: &RunOptions,
    f: ShardFilter,
    fixer: &Fixer<'_>,
) -> Result<MarkerState, Error> {
    let mut m = match ours(root, path, spec, opts)? {
        Ok(m) => m,
        Err(word) => return Ok(word),
    };
    let complete = m.shards.as_ref().is_some_and(|s| s.misfit(f.count, f.depth).is_none() && s.complete());
    if !complete || !clean(fixer) {
        return Ok(MarkerState::InProgress);
    }
    let root_meta = sys::stat_fd(root).map_err(|e| Error::sys(path, Op::Stat, e))?;
    fixer.counters.seen(sys::Kind::Dir);
    match fix::fix_dir(root, &root_meta, spec, &fixer.setgid) {
        Ok(fixed) => {
            fixer.count(fixed.change.owner(), fixed.mode_changed());
            m.state = State::Done;
            m.finished = Some(marker::now());
            m.entries = Some(m.shards.as_ref().map_or(0, |s| s.entries) + 1);
            // No shard's checkpoint is needed any more.
            for i in 0..f.count.min(1024) {
                let _ = Place::new(root, Some((i, f.count))).remove();
            }
            info!(path = %Escaped(path.as_os_str()), "every shard is done: root fixed, volume marked done");
        }
        Err(e) => {
            fixer.count_change(&e.done);
            fixer.error_at(path, e.op, e.errno);
            return Ok(MarkerState::InProgress);
        }
    }
    marker::write(root, &m).map_err(|e| Error::sys(path, Op::Xattr, e))?;
    Ok(MarkerState::Done)
}

/// The digest of the anchors of this shard's part, listed before its walk; `None` (no claim:
/// the run that completes the volume walks the part again) when they cannot be listed.
fn own_anchors(
    root: BorrowedFd<'_>,
    root_meta: &sys::Meta,
    opts: &RunOptions,
    f: ShardFilter,
    shown: &str,
) -> Option<String> {
    match recheck::list_top(root, root_meta, f.depth, opts.cross_devices) {
        Ok(tops) => Some(recheck::part_digest(&tops, f)),
        Err((rel, e)) => {
            warn!(path = %shown, "cannot list the anchors of this shard's part ({}: {e}): it claims none, and the run that completes the volume walks it again", Escaped(rel.as_os_str()));
            None
        }
    }
}

/// Whether this shard's part is done: no error, no signal, and (unprivileged) no entry of
/// another user left (a privileged run must finish that).
fn clean(fixer: &Fixer<'_>) -> bool {
    fixer.counters.errors.get() == 0 && fixer.interrupted.is_none() && fixer.counters.foreign_owned.get() == 0
}

/// The resume state of this shard: its own checkpoint (`user.volprep.checkpoint.I`, with its
/// special-bit records), adopted when it belongs to this round of shards (the marker's run) and
/// spec. Under `--verify full` its records skip nothing; under `--force` it is not adopted at
/// all (as in an unsharded pass: a special-bit record is forgotten, as the message about it says).
fn shard_resume<'a>(root: BorrowedFd<'a>, spec: &Spec, opts: &RunOptions, f: ShardFilter) -> Resume<'a> {
    let digest = spec.coverage_digest(opts.cross_devices);
    let round = match marker::read(root) {
        Found::Marker(m) => m.run,
        _ => String::new(),
    };
    let place = Place::new(root, Some((f.index, f.count)));
    let previous = if opts.force { None } else { place.read(&round, &digest) };
    Resume::new(place, previous, opts.verify != Verify::Full, &round, &digest, opts.checkpoint_interval)
}

/// Renews this run's heartbeat in the marker until `stopped` fires.
fn heartbeat(root: BorrowedFd<'_>, path: &Path, index: u32, run: &str, stopped: mpsc::Receiver<()>) {
    while let Err(mpsc::RecvTimeoutError::Timeout) = stopped.recv_timeout(HEARTBEAT) {
        let res = with_lock(root, path, Duration::from_secs(60), |root| {
            if let Found::Marker(mut m) = marker::read(root) {
                if let Some(s) = m.shards.as_mut() {
                    let now = marker::now();
                    s.running.iter_mut().filter(|h| h.shard == index && h.run == run).for_each(|h| h.at = now);
                    marker::write(root, &m).map_err(|e| Error::sys(path, Op::Xattr, e))?;
                }
            }
            Ok(())
        });
        if let Err(e) = res {
            warn!("heartbeat: {e}");
        }
    }
}

/// Runs `f` holding the volume's lock, taken on a separate open of the root (a lock of its
/// own, released when that fd closes), for as short a time as `f` takes.
fn with_lock<T>(
    root: BorrowedFd<'_>,
    path: &Path,
    timeout: Duration,
    f: impl FnOnce(BorrowedFd<'_>) -> Result<T, Error>,
) -> Result<T, Error> {
    let lock_fd = sys::open_subdir(root, c".").map_err(|e| Error::sys(path, Op::Open, e))?;
    volume::lock(lock_fd.as_fd(), path, timeout)?;
    f(root)
}
