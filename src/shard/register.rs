//! A shard's registration on the root: its turn, room for its record in the xattrs, or an unrecorded walk.

use std::os::fd::BorrowedFd;
use std::time::Duration;

use tracing::{info, warn};

use crate::error::{Error, Op};
use crate::lifecycle::{Pass, ResumePlan};
use crate::marker::{self, AnchorDigest, Decision, Found, Heartbeat, Marker, Shards, State};
use crate::options::Verify;
use crate::pass::Fixer;
use crate::runid::RunId;
use crate::state::{MarkerState, Stop};
use crate::sys;
use crate::walk::Pool;

use super::{Run, clean, own_anchors};

/// A running shard whose heartbeat is older than this is taken for dead.
const STALE_AFTER: u64 = 30;

/// What a shard does after looking at the marker.
pub(super) enum Step {
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
    /// volprep did not write (why): this run walks its part unrecorded (see [`unrecorded`]).
    Unrecorded(String),
}

impl Run<'_, '_> {
    /// Waits for this shard's turn: registers under the root lock, or learns it skips, or that
    /// the volume only needs finishing. Also returns the state of the marker it found.
    pub(super) fn turn(&self) -> Result<(Step, MarkerState), Error> {
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
            return Err(Error::MarkerRefused { path: path.to_path_buf(), why: marker::refused(root, e) });
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
                Err(e) if !marker::no_room(e) => {
                    return Err(Error::MarkerRefused { path: path.to_path_buf(), why: marker::refused(root, e) });
                }
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
    fn join(&self, shards: &mut Shards, round: RunId, own: impl FnOnce() -> Option<AnchorDigest>) -> Step {
        let f = self.f;
        let now = marker::now();
        if shards.is_done(f.index) && self.pass.opts.verify == Verify::Full {
            // Nothing is skipped on the word of the root: this shard walks its part again (its
            // anchors' digest leaves its claim group's).
            shards.undo(f.index, own().as_ref());
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
}

/// Walks this shard's part without registering in the round (no room on the root: see
/// [`Step::Unrecorded`]): nothing is resumed or recorded, and the root is fixed once the part
/// is, as no run can learn that every shard is done. Every entry conforms once every shard
/// has run; the volume is not marked done, so every start walks again.
pub(super) fn unrecorded<'a>(
    pass: &Pass<'a>,
    root: BorrowedFd<'_>,
    pool: &Pool,
) -> Result<(Fixer<'a>, Option<Stop>), Error> {
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
