//! The sharded run (`apply --shard I/N`): one of N processes (an Indexed Job's pods) prepares its
//! part of a volume; the root marker is where they meet, and the run that completes the set fixes
//! the root and marks the volume done. Which entries a shard owns is [`ShardFilter`]'s rule.

use std::os::fd::{AsFd, BorrowedFd};
use std::path::Path;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use rustix::io::Errno;
use tracing::{debug, info, warn};

use crate::error::{Error, Op};
use crate::escape::Escaped;
use crate::fix;
use crate::marker::{self, Found, Marker, Shards, State};
use crate::options::{Mode, RunOptions, ShardFilter, Verify};
use crate::pass::Fixer;
use crate::progress::{self, Counters};
use crate::report::{Action, VolumeReport};
use crate::resume::{self, Place, Resume};
use crate::spec::Spec;
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
    let run_id = marker::new_run_id();
    let shown = Escaped(path.as_os_str()).to_string();
    let name = format!("{}/{}", filter.index, filter.count);
    let mut waited_log = Duration::ZERO;
    let step = loop {
        if let Some(sig) = sys::termination() {
            return Err(Error::Other { path: path.to_path_buf(), msg: format!("shard {name}: {sig} before walking") });
        }
        match with_lock(root, path, opts.lock_timeout, |root| register(root, path, spec, opts, filter, &run_id))? {
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
            report.marker_before = "done".into();
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
    if walk_needed {
        let threads = pool.start()?;
        let root_meta = sys::stat_fd(root).map_err(|e| Error::sys(path, Op::Stat, e))?;
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
    let after =
        with_lock(root, path, opts.lock_timeout, |root| finish(root, path, spec, opts, filter, &run_id, &fixer))?;
    if let Some(r) = &fixer.resume {
        // This shard's checkpoint: gone once its part is done, kept for its next run otherwise.
        let res = if clean(&fixer) { Place::new(root, Some((filter.index, filter.count))).remove() } else { r.write() };
        if let Err(e) = res {
            debug!("{shown}: shard {name}: cannot write or remove its checkpoint: {e}");
        }
    }
    report.reason = reason;
    report.fs_type = fs;
    report.estimated_entries = estimate;
    report.marker_before = "in-progress".into();
    report.marker_after = after;
    fixer.fill(&mut report, started.elapsed());
    Ok(report)
}

/// Under the root lock: read the marker and decide; register this run as the shard's runner.
fn register(
    root: BorrowedFd<'_>,
    path: &Path,
    spec: &Spec,
    opts: &RunOptions,
    f: ShardFilter,
    run: &str,
) -> Result<Step, Error> {
    let digest = spec.coverage_digest(opts.cross_devices);
    let found = marker::read(root);
    let root_meta = sys::stat_fd(root).map_err(|e| Error::sys(path, Op::Stat, e))?;
    let conforms = fix::decide(&root_meta, spec).is_none();
    let mut m = match found {
        Found::Unsupported => {
            return Err(Error::Other {
                path: path.to_path_buf(),
                msg: "a sharded pass needs extended attributes: the root marker is where shards meet".into(),
            });
        }
        Found::Marker(m)
            if m.digest == digest
                && m.state == State::Done
                && conforms
                && !opts.force
                && opts.verify == Verify::Marker =>
        {
            return Ok(Step::Skip("marker says done for this spec and the root conforms".into()));
        }
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
        shards.done.retain(|&i| i != f.index);
    } else if shards.done.contains(&f.index) {
        if shards.complete() {
            return Ok(Step::Finish);
        }
        return Ok(Step::Skip(format!("shard {}/{} is already done for this spec", f.index, f.count)));
    }
    if let Some((_, other, beat)) = shards.running.iter().find(|(i, r, _)| *i == f.index && r != run) {
        let other = marker::escape_str(other);
        // A heartbeat from the future (forged, or a clock far ahead) would hold the shard forever.
        let fresh = now.saturating_sub(*beat) < STALE_AFTER && *beat <= now + STALE_AFTER;
        if fresh && !marker::run_is_dead_here(&other) {
            return Ok(Step::Wait(format!("run {other} is walking this shard")));
        }
        warn!("shard {}/{}: run {other} is gone; taking over", f.index, f.count);
    }
    shards.running.retain(|(i, _, _)| *i != f.index);
    shards.running.push((f.index, run.to_string(), now));
    marker::write(root, &m).map_err(|e| Error::sys(path, Op::Xattr, e))?;
    Ok(Step::Walk(format!("shard {}/{} of spec {}", f.index, f.count, spec)))
}

/// A new round of shards for this spec and layout, registered by `run`.
fn new_round(spec: &Spec, opts: &RunOptions, f: ShardFilter, run: &str) -> Marker {
    Marker {
        v: marker::FORMAT,
        state: State::InProgress,
        digest: spec.coverage_digest(opts.cross_devices),
        spec: spec.coverage_text(opts.cross_devices),
        run: run.to_string(),
        started: marker::now(),
        finished: None,
        entries: None,
        shards: Some(Shards { n: f.count, depth: f.depth, ..Default::default() }),
        left: None,
    }
}

/// Under the root lock: record this shard's outcome; the run that completes the set fixes the
/// root and marks the volume done. Returns the marker state it leaves.
fn finish(
    root: BorrowedFd<'_>,
    path: &Path,
    spec: &Spec,
    opts: &RunOptions,
    f: ShardFilter,
    run: &str,
    fixer: &Fixer<'_>,
) -> Result<String, Error> {
    let Found::Marker(mut m) = marker::read(root) else {
        return Err(Error::Other { path: path.to_path_buf(), msg: "the shard marker vanished during the walk".into() });
    };
    if m.digest != spec.coverage_digest(opts.cross_devices) || m.shards.is_none() {
        return Err(Error::Other {
            path: path.to_path_buf(),
            msg: "another spec took over the volume during the walk".into(),
        });
    }
    let shards = m.shards.as_mut().expect("checked");
    shards.running.retain(|(i, r, _)| !(*i == f.index && r == run));
    if let Some(why) = shards.misfit(f.count, f.depth) {
        // Changed during the walk: the other shards' completions are not trusted.
        warn!(path = %Escaped(path.as_os_str()), "the shard record on the root no longer fits the layout: {why}; starting a new round");
        *shards = Shards { n: f.count, depth: f.depth, ..Default::default() };
    }
    let clean = clean(fixer);
    if clean && !shards.done.contains(&f.index) {
        shards.done.push(f.index);
        shards.done.sort_unstable();
        shards.entries = shards.entries.saturating_add(Counters::get(&fixer.counters.entries));
    }
    if clean && shards.complete() {
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
            Err(f) => {
                fixer.count_change(&f.done);
                fixer.error_at(path, f.op, f.errno)
            }
        }
    }
    marker::write(root, &m).map_err(|e| Error::sys(path, Op::Xattr, e))?;
    Ok(if m.state == State::Done { "done" } else { "in-progress" }.into())
}

/// Whether this shard's part is done: no error, no signal, and (unprivileged) no entry of
/// another user left (a privileged run must finish that).
fn clean(fixer: &Fixer<'_>) -> bool {
    Counters::get(&fixer.counters.errors) == 0
        && fixer.interrupted.is_none()
        && Counters::get(&fixer.counters.foreign_owned) == 0
}

/// The resume state of this shard: its own checkpoint (`user.volprep.checkpoint.I`, with its
/// special-bit records), adopted when it belongs to this round of shards (the marker's run) and
/// spec. Under `--verify full` its records skip nothing.
fn shard_resume<'a>(root: BorrowedFd<'a>, spec: &Spec, opts: &RunOptions, f: ShardFilter) -> Resume<'a> {
    let digest = spec.coverage_digest(opts.cross_devices);
    let round = match marker::read(root) {
        Found::Marker(m) => m.run,
        _ => String::new(),
    };
    let place = Place::new(root, Some((f.index, f.count)));
    let previous = place.read(&round, &digest);
    Resume::new(place, previous, opts.verify != Verify::Full, &round, &digest, opts.checkpoint_interval)
}

/// Renews this run's heartbeat in the marker until `stopped` fires.
fn heartbeat(root: BorrowedFd<'_>, path: &Path, index: u32, run: &str, stopped: mpsc::Receiver<()>) {
    while let Err(mpsc::RecvTimeoutError::Timeout) = stopped.recv_timeout(HEARTBEAT) {
        let res = with_lock(root, path, Duration::from_secs(60), |root| {
            if let Found::Marker(mut m) = marker::read(root) {
                if let Some(s) = m.shards.as_mut() {
                    let now = marker::now();
                    s.running.iter_mut().filter(|(i, r, _)| *i == index && r == run).for_each(|e| e.2 = now);
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
