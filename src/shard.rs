//! The sharded run (`apply --shard I/N`): one of N processes (an Indexed Job's pods) prepares its
//! part of a volume; the root marker is where they meet, and the run that completes the set fixes
//! the root and marks the volume done once it has checked what the other shards claim
//! ([`recheck`]). Which entries a shard owns is [`ShardFilter`]'s rule.

mod recheck;

use std::os::fd::{AsFd, BorrowedFd};
use std::path::Path;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use tracing::{debug, info, warn};

use crate::error::{Error, Op};
use crate::escape::{Escaped, EscapedPath};
use crate::lifecycle::{self, Pass, ResumePlan};
use crate::marker::{self, Decision, Found, Heartbeat, Marker, Shards, State};
use crate::options::{Mode, RunOptions, ShardFilter, Verify};
use crate::pass::Fixer;
use crate::report::{Action, VolumeReport};
use crate::resume::Place;
use crate::runid::RunId;
use crate::spec::Spec;
use crate::state::{MarkerState, Stop};
use crate::sys;
use crate::volume;
use crate::walk::{Pool, Threads};

/// A running shard whose heartbeat is older than this is taken for dead.
const STALE_AFTER: u64 = 30;
/// How often a running shard renews its heartbeat.
const HEARTBEAT: Duration = Duration::from_secs(10);

/// What a shard does after looking at the marker.
enum Step {
    Skip(String),
    Wait(String),
    /// This run walks the shard, in the round of run `round` (the marker's run it registered in:
    /// its checkpoint is kept under that run).
    Walk {
        why: String,
        round: RunId,
    },
    /// Every shard is done but the volume is not: a finishing run was killed.
    Finish,
    /// The root's attributes have no room for this shard's registration, taken by attributes
    /// volprep did not write (why): this run walks its part unrecorded (see [`Run::unrecorded`]).
    Unrecorded(String),
}

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
    anchors: Option<String>,
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

    /// Waits for this shard's turn: registers under the root lock, or learns it skips, or that
    /// the volume only needs finishing. Also returns the state of the marker it found.
    fn turn(&self) -> Result<(Step, MarkerState), Error> {
        let (pass, name) = (self.pass, self.name());
        let mut waited_log = Duration::ZERO;
        loop {
            if let Some(sig) = sys::termination() {
                return Err(Error::ShardStopped { path: self.path().to_path_buf(), shard: name, sig });
            }
            match self.locked(|root| self.register(root))? {
                (Step::Wait(why), _) if pass.started.elapsed() < pass.opts.lock_timeout => {
                    if pass.started.elapsed() >= waited_log {
                        info!(path = %pass.shown, "shard {name}: waiting: {why}");
                        waited_log += Duration::from_secs(10);
                    }
                    std::thread::sleep(Duration::from_millis(500));
                }
                (Step::Wait(why), _) => {
                    return Err(Error::ShardTimeout { path: self.path().to_path_buf(), shard: name, why });
                }
                done => return Ok(done),
            }
        }
    }

    /// Under the root lock: reads the marker and decides (the skip rule of every run, then this
    /// shard's part of the round); registers this run as the shard's runner when it walks.
    /// Also returns the state of the marker it found (for the report).
    fn register(&self, root: BorrowedFd<'_>) -> Result<(Step, MarkerState), Error> {
        let found = marker::read(root);
        let before = found.state();
        if found == Found::Unsupported {
            return Err(Error::ShardsNeedXattrs { path: self.path().to_path_buf() });
        }
        let root_meta = sys::stat_fd(root).map_err(|e| Error::sys(self.path(), Op::Stat, e))?;
        if let Decision::Skip(why) = self.pass.decide(root, &found, &root_meta) {
            return Ok((Step::Skip(why), before));
        }
        let mut m = self.round(found);
        let round = m.run.clone();
        let own = || own_anchors(root, &root_meta, self.pass.opts, self.f, &self.pass.shown);
        let step = self.join(m.shards.as_mut().expect("sharded marker"), round, own);
        if let Step::Walk { .. } = step {
            if let Err(e) = marker::write(root, &m) {
                return Ok((self.no_room(root, &mut m, e)?, before));
            }
        }
        Ok((step, before))
    }

    /// The registration `m` did not fit on the root (`e`). Heartbeats of runs gone stale and
    /// merged claim groups make room; while other shards are walking, this one waits for one of
    /// them to finish; alone, with no claim left to merge, the round is more than the root's
    /// xattrs hold: refused, before any walk.
    fn no_room(&self, root: BorrowedFd<'_>, m: &mut Marker, e: rustix::io::Errno) -> Result<Step, Error> {
        let (f, path) = (self.f, self.path());
        if !marker::no_room(e) {
            return Err(Error::sys(path, Op::Xattr, e));
        }
        let now = marker::now();
        let walk = |m: &Marker| Step::Walk {
            why: format!("shard {}/{} of spec {}", f.index, f.count, self.pass.spec),
            round: m.run.clone(),
        };
        let shards = m.shards.as_mut().expect("sharded marker");
        shards.running.retain(|h| h.shard == f.index || fresh(h.at, now));
        let others = shards.running.iter().filter(|h| h.shard != f.index).count();
        loop {
            match marker::write(root, m) {
                Ok(()) => return Ok(walk(m)),
                Err(e) if !marker::no_room(e) => return Err(Error::sys(path, Op::Xattr, e)),
                Err(_) => {}
            }
            let shards = m.shards.as_mut().expect("sharded marker");
            if !shards.merge_closest() {
                break;
            }
        }
        if others > 0 {
            return Ok(Step::Wait(format!(
                "the root's extended attributes hold no more running shards ({others} running): waiting for one to finish"
            )));
        }
        let shards = m.shards.as_mut().expect("sharded marker");
        if !shards.claims.is_empty() {
            warn!(path = %self.pass.shown, "the shard record does not fit on the root with its claims: the run that completes the volume walks the done parts again");
            shards.drop_claims();
            if marker::write(root, m).is_ok() {
                return Ok(walk(m));
            }
        }
        let bytes = m.encode().len();
        let foreign = marker::Foreign::read(root);
        if foreign.bytes >= bytes {
            let why = foreign.describe().unwrap_or_default();
            warn!(path = %self.pass.shown, "shard {}/{}: no room on the root for the shard record ({bytes} bytes): {why}; this shard walks its part without a record (the volume is not marked done, and every start walks its part again, until there is room)", f.index, f.count);
            return Ok(Step::Unrecorded(format!(
                "shard {}/{} of spec {}, unrecorded: the root's extended attributes are full ({why})",
                f.index, f.count, self.pass.spec
            )));
        }
        Err(Error::ShardRoundTooBig {
            path: path.to_path_buf(),
            shards: f.count,
            errno: e,
            bytes,
            on_1k: marker::SHARDS_ON_1K_EXT4,
            max: crate::options::MAX_SHARDS,
        })
    }

    /// The round of shards on the root for this spec and layout, or a new one.
    fn round(&self, found: Found) -> Marker {
        let (f, pass) = (self.f, self.pass);
        match found {
            Found::Marker(m) if m.digest == pass.digest && m.state == State::InProgress && m.shards.is_some() => {
                match m.shards.as_ref().and_then(|s| s.misfit(f.count, f.depth)) {
                    None => {
                        let mut m = m;
                        m.shards.as_mut().expect("sharded").forget_dangling();
                        m
                    }
                    Some(why) => {
                        warn!(path = %pass.shown,
                              "the shard record on the root does not fit --shard {}/{} --shard-depth {}: {why}; starting a new round",
                              f.index, f.count, f.depth);
                        self.new_round()
                    }
                }
            }
            _ => self.new_round(),
        }
    }

    /// This shard's place in the round: done already (skip, or finish the volume), walked by a
    /// live run (wait), or this run's to walk (registered in `shards`).
    fn join(&self, shards: &mut Shards, round: RunId, own: impl FnOnce() -> Option<String>) -> Step {
        let f = self.f;
        let now = marker::now();
        if shards.is_done(f.index) && self.pass.opts.verify == Verify::Full {
            // Nothing is skipped on the word of the root: this shard walks its part again (its
            // anchors' digest leaves its claim group's).
            shards.undo(f.index, own().as_deref());
        } else if shards.is_done(f.index) && shards.complete() {
            return Step::Finish;
        } else if shards.is_done(f.index) {
            return Step::Skip(format!("shard {}/{} is already done for this spec", f.index, f.count));
        }
        if let Some(h) = shards.running.iter().find(|h| h.shard == f.index && h.run != self.id) {
            let other = &h.run;
            if fresh(h.at, now) && !other.is_dead_here() {
                return Step::Wait(format!("run {other} is walking this shard"));
            }
            warn!("shard {}/{}: run {other} is gone; taking over", f.index, f.count);
        }
        shards.running.retain(|h| h.shard != f.index);
        shards.running.push(Heartbeat { shard: f.index, run: self.id.clone(), at: now });
        Step::Walk { why: format!("shard {}/{} of spec {}", f.index, f.count, self.pass.spec), round }
    }

    /// A new round of shards for this spec and layout, registered by this run.
    fn new_round(&self) -> Marker {
        let (pass, f) = (self.pass, self.f);
        Marker {
            shards: Some(Shards::new(f.count, f.depth)),
            ..Marker::new(State::InProgress, &pass.digest, &pass.spec_text, &self.id, marker::now())
        }
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
        let (claimed, mounts) = (listed.anchors.as_deref(), &listed.mounts);
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
        anchors: Option<&str>,
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
        m.shards.as_mut().expect("checked").set_done(f.index, Some((times.ctime, anchors)));
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

/// Walks this shard's part without registering in the round (no room on the root: see
/// [`Step::Unrecorded`]): nothing is resumed or recorded, and the root is fixed once the part
/// is, as no run can learn that every shard is done. Every entry conforms once every shard
/// has run; the volume is not marked done, so every start walks again.
fn unrecorded<'a>(pass: &Pass<'a>, root: BorrowedFd<'_>, pool: &Pool) -> Result<(Fixer<'a>, Option<Stop>), Error> {
    let fixer = pass.fixer(&ResumePlan::None, None);
    let root_meta = sys::stat_fd(root).map_err(|e| Error::sys(pass.path, Op::Stat, e))?;
    let walk_fd = rustix::io::fcntl_dupfd_cloexec(root, 0).map_err(|e| Error::sys(pass.path, Op::Open, e))?;
    let then = "this shard's part is walked again at its next start";
    let stop = pass.walk(&fixer, pool.start()?, walk_fd, root_meta, then);
    if clean(&fixer, stop) {
        let root_meta = sys::stat_fd(root).map_err(|e| Error::sys(pass.path, Op::Stat, e))?;
        fixer.fix_root(root, &root_meta);
    }
    Ok((fixer, stop))
}

/// Whether a heartbeat at `beat` is fresh at `now`: younger than [`STALE_AFTER`], and not from
/// the future (forged, or a clock far ahead: it would hold a shard forever).
fn fresh(beat: u64, now: u64) -> bool {
    now.saturating_sub(beat) < STALE_AFTER && beat <= now + STALE_AFTER
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
) -> Option<String> {
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
