//! The sharded run (`apply --shard I/N`): one of N processes (an Indexed Job's pods) prepares its
//! part of a volume; the root marker is where they meet (each registers there: [`register`]),
//! and the run that completes the set fixes the root and marks the volume done once it has
//! checked what the other shards claim ([`recheck`]). Which entries a shard owns is
//! [`ShardFilter`]'s rule.

mod recheck;
mod register;

use std::os::fd::{AsFd, BorrowedFd};
use std::path::Path;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use tracing::{debug, info, warn};

use crate::error::{Error, Op};
use crate::escape::{Escaped, EscapedPath};
use crate::lifecycle::{self, Pass, ResumePlan};
use crate::marker::{self, AnchorDigest, Found, Marker, Shards, State};
use crate::options::{Mode, RunOptions, ShardFilter};
use crate::pass::Fixer;
use crate::report::{Action, VolumeReport};
use crate::resume::Place;
use crate::runid::RunId;
use crate::spec::Spec;
use crate::state::{MarkerState, Stop};
use crate::sys;
use crate::volume;
use crate::walk::{Pool, Threads};

use register::{Step, unrecorded};

/// How often a running shard renews its heartbeat.
const HEARTBEAT: Duration = Duration::from_secs(10);

/// Whether this run walks its shard's part, or only finishes a volume whose shards are all done
/// (a finishing run was killed): the other parts are checked, and a walked one needs no check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum OwnPart {
    Walked,
    NotWalked,
}

/// How a shard's run ended: the marker's state it left, and the signal that stopped its walk or
/// its check of the other shards' parts, if one did.
struct Settled {
    after: MarkerState,
    stop: Option<Stop>,
}

/// What a run lists before it walks: the anchors of its part, whose digest it claims (`None`:
/// no claim), and the mount points below the root, to tell at its end whether they changed.
struct Listed {
    anchors: Option<AnchorDigest>,
    mounts: lifecycle::MountWatch,
}

/// What a shard leaves after recording its outcome.
enum Outcome {
    /// The marker's state word: this run does not complete the volume.
    Left(MarkerState),
    /// Every shard is done: this run checks the others' claims, then seals the volume.
    Complete(Shards),
}

/// One run of one shard: its pass, which shard, and this run's id (its registration).
struct Run<'p, 'a> {
    pass: &'p Pass<'a>,
    f: ShardFilter,
    id: RunId,
    root: BorrowedFd<'p>,
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
    let root_fd = lifecycle::open_root(path)?;
    let root = root_fd.as_fd();
    let mut pass = Pass::new(path, spec, opts, root, started, Some(filter));
    let run = Run { pass: &pass, f: filter, id: RunId::new(), root };
    let (step, before) = run.turn()?;
    let (round, reason) = match step {
        Step::Skip(why) => {
            info!(path = %pass.shown, shard = %run.name(), decision = "skip", reason = %why, "skip {}", pass.shown);
            pass.reason = why;
            return Ok(pass.skipped(before));
        }
        Step::Finish => (None, "every shard is done; finishing the volume".to_string()),
        Step::Unrecorded(why) => {
            info!(path = %pass.shown, shard = %run.name(), decision = "walk", reason = %why, "walk {}", pass.shown);
            drop(run);
            let (fixer, stop) = unrecorded(&pass, root, pool)?;
            pass.reason = why;
            return Ok(pass.report(fixer, stop, Action::Walked, before, Some(before)));
        }
        Step::Walk { why, round } => (Some(round), why),
        Step::Wait(_) => unreachable!("handled by turn"),
    };
    info!(path = %pass.shown, shard = %run.name(), fs = %pass.fs, spec = %spec, threads = opts.threads, load = opts.load.concurrency.name(), max_ops = opts.load.max_ops, decision = "walk", reason = %reason, "walk {}", pass.shown);
    let part = if round.is_some() { OwnPart::Walked } else { OwnPart::NotWalked };
    let plan = match round {
        Some(round) if opts.mode == Mode::Apply => run.plan(round),
        _ => ResumePlan::None,
    };
    let fixer = pass.fixer(&plan, Some(Place::new(root, Some(filter))));
    pass.take_over(root, &fixer, &plan);
    let root_meta = sys::stat_fd(root).map_err(|e| Error::sys(path, Op::Stat, e))?;
    // The anchors this shard claims are the ones there before it walks.
    let listed = Listed {
        anchors: (part == OwnPart::Walked).then(|| own_anchors(root, &root_meta, opts, filter, &pass.shown)).flatten(),
        mounts: lifecycle::MountWatch::start(root),
    };
    let walked = match part {
        OwnPart::Walked => run.walk(&fixer, pool.start()?, root_meta)?,
        OwnPart::NotWalked => None,
    };
    let settled = run.settle(&fixer, walked, &listed, root_meta, pool, part)?;
    drop(run);
    pass.reason = reason;
    Ok(pass.report(fixer, settled.stop, Action::Walked, before, Some(settled.after)))
}

impl Run<'_, '_> {
    /// `I/N`.
    fn name(&self) -> String {
        format!("{}/{}", self.f.index, self.f.count)
    }

    fn path(&self) -> &Path {
        self.pass.path
    }

    /// Where this shard keeps its checkpoint on the root.
    fn place(&self) -> Place<'_> {
        Place::new(self.root, Some(self.f))
    }

    /// The resume plan of this shard: its own checkpoint (`user.volprep.checkpoint.I`, with its
    /// special-bit records), kept under the round's run (the marker's), and continued when it
    /// belongs to this round and spec. Under `--force` it is not continued at all (as in an
    /// unsharded pass: a special-bit record is forgotten, as the message about it says).
    fn plan(&self, round: RunId) -> ResumePlan {
        let place = self.place();
        let previous = if self.pass.opts.force { None } else { place.read(&round, &self.pass.digest) };
        ResumePlan::apply(round, previous)
    }

    /// Walks this shard's part, renewing its heartbeat in the marker meanwhile. Returns the
    /// signal that stopped the walk, if one did.
    fn walk(&self, fixer: &Fixer<'_>, threads: &Threads, root_meta: sys::Meta) -> Result<Option<Stop>, Error> {
        let walk_fd =
            rustix::io::fcntl_dupfd_cloexec(self.root, 0).map_err(|e| Error::sys(self.path(), Op::Open, e))?;
        std::thread::scope(|s| {
            // Dropped when the walk returns or unwinds: the heartbeat then stops.
            let (stop, stopped) = mpsc::channel::<()>();
            s.spawn(|| self.heartbeat(stopped));
            let then = "this shard is not done and is walked again at its next start";
            let walked = self.pass.walk(fixer, threads, walk_fd, root_meta, then);
            drop(stop);
            Ok(walked)
        })
    }

    /// After the walk (stopped by `walked`, if by a signal): records this shard's outcome; the
    /// run that completes the round checks the other shards' claims and seals the volume. This
    /// shard's checkpoint is then removed when its part is done, else written for its next run.
    fn settle(
        &self,
        fixer: &Fixer<'_>,
        walked: Option<Stop>,
        listed: &Listed,
        root_meta: sys::Meta,
        pool: &Pool,
        part: OwnPart,
    ) -> Result<Settled, Error> {
        // Whether this shard's own part is done: its checkpoint is then no longer needed.
        let part_done = clean(fixer, walked);
        let mut stop = walked;
        let (claimed, mounts) = (listed.anchors.as_ref(), &listed.mounts);
        let after = match self.locked(|root| self.finish(root, fixer, walked, claimed, mounts))? {
            Outcome::Left(word) => word,
            Outcome::Complete(shards) => {
                stop = self.recheck(fixer, &shards, root_meta, pool.start()?, part)?.or(walked);
                self.locked(|root| self.seal(root, fixer, stop, mounts))?
            }
        };
        if let Some(r) = fixer.resume() {
            let place = self.place();
            let res = if part_done { place.remove() } else { r.write() };
            if let Err(e) = res {
                debug!("{}: shard {}: cannot write or remove its checkpoint: {e}", self.pass.shown, self.name());
            }
        }
        Ok(Settled { after, stop })
    }

    /// Checks what the other shards claim ([`recheck`]), walking again what it cannot trust.
    /// Returns the signal that stopped the check, if one did (the volume is then not sealed).
    fn recheck(
        &self,
        fixer: &Fixer<'_>,
        shards: &Shards,
        root_meta: sys::Meta,
        threads: &Threads,
        part: OwnPart,
    ) -> Result<Option<Stop>, Error> {
        let (pass, name) = (self.pass, self.name());
        let check = recheck::Recheck { path: pass.path, opts: pass.opts, root: self.root, root_meta, threads, fixer };
        let sum = check.run(shards, (part == OwnPart::Walked).then_some(self.f.index))?;
        if let Some(sig) = sum.stopped {
            // The check did not cover every part: the volume is not sealed.
            warn!(path = %pass.shown, "shard {name}: {sig}: stopped checking what the other shards claim; the volume is completed at the next start");
        }
        info!(path = %pass.shown, shard = %name, entries = sum.entries, dirs_read = sum.dirs_read,
              verified_dirs = sum.verified_dirs, parts = ?sum.parts,
              "checked what the other shards claim: {} directories verified, {} read, {} entries looked at again; parts walked again whole: {:?}",
              sum.verified_dirs, sum.dirs_read, sum.entries, sum.parts);
        Ok(sum.stopped)
    }

    /// Under the root lock: record this shard's outcome (with its claim when its part is done:
    /// not when `walked` stopped it). When every shard is then done, the volume is not sealed
    /// here: the caller checks the other shards' claims first ([`Run::seal`] follows).
    fn finish(
        &self,
        root: BorrowedFd<'_>,
        fixer: &Fixer<'_>,
        walked: Option<Stop>,
        anchors: Option<&AnchorDigest>,
        mounts: &lifecycle::MountWatch,
    ) -> Result<Outcome, Error> {
        let (f, path) = (self.f, self.path());
        let mut m = match self.ours(root)? {
            Ok(m) => m,
            Err(word) => return Ok(Outcome::Left(word)),
        };
        let shards = m.shards.as_mut().expect("checked");
        shards.forget_dangling();
        shards.running.retain(|h| !(h.shard == f.index && h.run == self.id));
        if let Some(why) = shards.misfit(f.count, f.depth) {
            // Changed during the walk: the other shards' completions are not trusted.
            warn!(path = %self.pass.shown, "the shard record on the root no longer fits the layout: {why}; starting a new round");
            *shards = Shards::new(f.count, f.depth);
        }
        let done = clean(fixer, walked) && !shards.is_done(f.index);
        if done {
            shards.entries = shards.entries.saturating_add(fixer.counters().entries.get());
        }
        let met = fixer.mount_points();
        let moved = if done && anchors.is_some() { mounts.end(root, fixer).err() } else { None };
        if done && anchors.is_some() && met > 0 {
            info!(path = %self.pass.shown, shard = %self.name(),
                  "this shard's part holds {met} mount point(s): it claims nothing, and the run that completes the volume walks the part again (what a mount hides shows again once it is unmounted)");
        } else if let Some(why) = &moved {
            info!(path = %self.pass.shown, shard = %self.name(),
                  "{why}: this shard claims nothing, and the run that completes the volume walks its part again");
        }
        if !done || anchors.is_none() || met > 0 || moved.is_some() {
            // Not done, or nothing to claim (a finishing run, anchors that could not be listed,
            // or mount points in the part: what they hide was not walked).
            if done {
                shards.set_done(f.index, None);
            }
            return written(root, path, m);
        }
        let anchors = anchors.expect("checked");
        // The filesystem's clock past the walk: the root's ctime right after a write on it (this
        // very record, its registration gone). A filesystem that did not move the ctime leaves an
        // earlier time, which only makes the check stricter.
        marker::write(root, &m).map_err(|e| Error::sys(path, Op::Xattr, e))?;
        let (_, times) = sys::stat_fd_times(root).map_err(|e| Error::sys(path, Op::Stat, e))?;
        m.shards.as_mut().expect("checked").set_done(f.index, Some((times.ctime.into(), anchors)));
        written(root, path, m)
    }

    /// The sharded marker of this spec on the root, or the state word to leave with when another
    /// run of the same spec completed (or is completing) the volume unsharded.
    fn ours(&self, root: BorrowedFd<'_>) -> Result<Result<Marker, MarkerState>, Error> {
        let (path, shown) = (self.path(), &self.pass.shown);
        let Found::Marker(m) = marker::read(root) else {
            return Err(Error::ShardMarkerVanished { path: path.to_path_buf() });
        };
        match (m.digest == self.pass.digest, m.shards.is_some(), m.state) {
            (true, true, _) => Ok(Ok(m)),
            (true, false, State::Done) => {
                info!(path = %shown, "the volume was completed by another run of this spec (run {}) during this shard's walk: nothing left to do", m.run);
                Ok(Err(MarkerState::Done))
            }
            (true, false, State::InProgress) => {
                info!(path = %shown, "an unsharded run of this spec (run {}) took the volume over during this shard's walk and completes it", m.run);
                Ok(Err(MarkerState::InProgress))
            }
            (false, ..) => Err(Error::SpecTookOver { path: path.to_path_buf() }),
        }
    }

    /// Under the root lock, once the other shards' claims were checked: fixes the root and marks
    /// the volume done, if every shard is still done and this run left nothing unfinished (no
    /// signal, `stop`, cut its walk or its check short).
    fn seal(
        &self,
        root: BorrowedFd<'_>,
        fixer: &Fixer<'_>,
        stop: Option<Stop>,
        mounts: &lifecycle::MountWatch,
    ) -> Result<MarkerState, Error> {
        let (f, path) = (self.f, self.path());
        let mut m = match self.ours(root)? {
            Ok(m) => m,
            Err(word) => return Ok(word),
        };
        let complete = m.shards.as_ref().is_some_and(|s| s.misfit(f.count, f.depth).is_none() && s.complete());
        if !complete || !clean(fixer, stop) {
            return Ok(MarkerState::InProgress);
        }
        let root_meta = sys::stat_fd(root).map_err(|e| Error::sys(path, Op::Stat, e))?;
        if !fixer.fix_root(root, &root_meta) {
            return Ok(MarkerState::InProgress);
        }
        // Listed last, just before the marker records them: a mount that goes after this is a
        // change after the pass (the recorded digest then differs, and the next start walks).
        let recorded = match mounts.end(root, fixer) {
            Ok(recorded) => recorded,
            Err(why) => {
                warn!(path = %self.pass.shown, "{why}: what a mount hid while this run checked the parts was not walked, so the volume is not marked done; the next run of any shard checks them again");
                return Ok(MarkerState::InProgress);
            }
        };
        m.state = State::Done;
        m.finished = Some(marker::now());
        // Sealed: the claims were checked and are needed no more (room for the rest).
        if let Some(s) = m.shards.as_mut() {
            s.drop_claims();
        }
        m.mounts = recorded;
        m.entries = Some(m.shards.as_ref().map_or(0, |s| s.entries) + 1);
        // No shard's checkpoint is needed any more.
        for i in marker::shard_indices(f.count) {
            let _ = Place::new(root, Some(ShardFilter { index: i, ..f })).remove();
        }
        info!(path = %self.pass.shown, "every shard is done: root fixed, volume marked done");
        marker::write(root, &m).map_err(|e| Error::sys(path, Op::Xattr, e))?;
        Ok(MarkerState::Done)
    }

    /// Renews this run's heartbeat in the marker until `stopped` fires.
    fn heartbeat(&self, stopped: mpsc::Receiver<()>) {
        let (path, index) = (self.path(), self.f.index);
        while let Err(mpsc::RecvTimeoutError::Timeout) = stopped.recv_timeout(HEARTBEAT) {
            let res = with_lock(self.root, path, Duration::from_secs(60), |root| {
                if let Found::Marker(mut m) = marker::read(root) {
                    if let Some(s) = m.shards.as_mut() {
                        let now = marker::now();
                        s.running.iter_mut().filter(|h| h.shard == index && h.run == self.id).for_each(|h| h.at = now);
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

    /// Runs `f` holding the volume's lock (see [`with_lock`]), waiting up to `--lock-timeout`.
    fn locked<T>(&self, f: impl FnOnce(BorrowedFd<'_>) -> Result<T, Error>) -> Result<T, Error> {
        with_lock(self.root, self.path(), self.pass.opts.lock_timeout, f)
    }
}

/// Writes `m`; a record with every shard done asks the caller to check and seal. A record that
/// does not fit (a claim group more than at registration) merges claim groups until it does,
/// down to none (every done part then walked again by the completing run).
fn written(root: BorrowedFd<'_>, path: &Path, mut m: Marker) -> Result<Outcome, Error> {
    loop {
        match marker::write(root, &m) {
            Err(e) if marker::no_room(e) => {
                let s = m.shards.as_mut().expect("sharded marker");
                if s.claims.is_empty() {
                    return Err(Error::sys(path, Op::Xattr, e));
                }
                if !s.merge_closest() {
                    warn!(path = %Escaped(path.as_os_str()), "the shard record does not fit on the root with its claim: the run that completes the volume walks the done parts again");
                    s.drop_claims();
                }
            }
            other => break other.map_err(|e| Error::sys(path, Op::Xattr, e))?,
        }
    }
    match m.shards {
        Some(s) if s.complete() => Ok(Outcome::Complete(s)),
        _ => Ok(Outcome::Left(MarkerState::InProgress)),
    }
}

/// The digest of the anchors of this shard's part, listed before its walk; `None` (no claim:
/// the run that completes the volume walks the part again) when they cannot be listed.
fn own_anchors(
    root: BorrowedFd<'_>,
    root_meta: &sys::Meta,
    opts: &RunOptions,
    f: ShardFilter,
    shown: &EscapedPath,
) -> Option<AnchorDigest> {
    match recheck::list_top(root, root_meta, f.depth, opts.cross_devices) {
        Ok(tops) => Some(recheck::part_digest(&tops, f)),
        Err((rel, e)) => {
            warn!(path = %shown, "cannot list the anchors of this shard's part ({}: {e}): it claims none, and the run that completes the volume walks it again", Escaped(rel.as_os_str()));
            None
        }
    }
}

/// Whether this shard's part is done: no error, no signal (`stop`), and (unprivileged) no
/// entry of another user left (a privileged run must finish that).
fn clean(fixer: &Fixer<'_>, stop: Option<Stop>) -> bool {
    let counters = fixer.counters();
    counters.errors.get() == 0 && stop.is_none() && counters.foreign_owned.get() == 0
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
