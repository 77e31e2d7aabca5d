//! One pass from its decision to its report, shared by a whole volume and by one shard of it.
//!
//! A volume ([`crate::volume`]) or a shard ([`crate::shard`]) only reads the marker, decides
//! with [`Pass::decide`] and settles the marker afterwards; everything in between is here, in
//! this order: [`Pass::fixer`] (with the [`ResumePlan`]), [`Pass::take_over`] (what an
//! interrupted run left), [`Pass::walk`], [`Pass::report`]. A panic anywhere in a volume's pass
//! ends that volume only ([`contained`]).

use std::os::fd::{BorrowedFd, OwnedFd};
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use rustix::io::Errno;
use tracing::{info, warn};

use crate::error::{Error, Op};
use crate::escape::EscapedPath;
use crate::fix;
use crate::marker::{self, Checkpoint, Decision, Found, MountsDigest};
use crate::options::{RunOptions, ShardFilter};
use crate::pass::{Fixer, FixerConfig};
use crate::progress;
use crate::report::{Action, Load, Timing, VolumeReport};
use crate::resume::{self, Place, Resume};
use crate::runid::RunId;
use crate::spec::{Digest, Spec};
use crate::special::SpecialRecord;
use crate::state::{MarkerState, Stop};
use crate::sys::{self, Meta};
use crate::throttle;
use crate::walk::{Threads, Walk};

/// What a pass takes over from an interrupted run, and the checkpoint it keeps for the next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResumePlan {
    /// Nothing: `check` with no interrupted run to look at, or a filesystem without xattrs.
    None,
    /// `check` of an interrupted run: the special-bit records `apply` would restore.
    CheckPending(Vec<SpecialRecord>),
    /// `apply`: a checkpoint kept under `run`, starting empty (a new run, or an interrupted
    /// one whose checkpoint is gone or belongs to another spec).
    Fresh { run: RunId },
    /// `apply`: the interrupted run `run` continued from its checkpoint.
    Resume { run: RunId, checkpoint: Checkpoint },
}

impl ResumePlan {
    /// An `apply` under run `run`, continuing `checkpoint` when there is one.
    pub fn apply(run: RunId, checkpoint: Option<Checkpoint>) -> Self {
        match checkpoint {
            Some(checkpoint) => ResumePlan::Resume { run, checkpoint },
            None => ResumePlan::Fresh { run },
        }
    }

    /// The run whose checkpoint the pass keeps (none in `check`, nor without xattrs).
    pub fn run(&self) -> Option<&RunId> {
        match self {
            ResumePlan::Fresh { run } | ResumePlan::Resume { run, .. } => Some(run),
            ResumePlan::None | ResumePlan::CheckPending(_) => None,
        }
    }
}

/// Opens a volume root (the path given may hold symlinks: it names the volume); a path that is
/// no directory is said so.
pub fn open_root(path: &Path) -> Result<OwnedFd, Error> {
    sys::open_root(path).map_err(|e| match e {
        Errno::NOTDIR => Error::NotADirectory { path: path.to_path_buf() },
        e => Error::sys(path, Op::Open, e),
    })
}

/// Runs one volume's pass `f`. A panic anywhere in it (in a walker thread too) becomes that
/// volume's error, "internal error: …": its report says so, and the other volumes go on.
pub fn contained(path: &Path, f: impl FnOnce() -> Result<VolumeReport, Error>) -> Result<VolumeReport, Error> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f))
        .unwrap_or_else(|payload| Err(Error::internal(path, &*payload)))
}

/// One pass (of a volume, or of one shard of it) once its root is open.
pub struct Pass<'a> {
    /// When this volume's run began (the lock wait included): the report's `elapsed_ms`.
    pub started: Instant,
    /// The volume root as given, its spec, and how the run goes (the same for every volume).
    pub path: &'a Path,
    pub spec: &'a Spec,
    pub opts: &'a RunOptions,
    /// The path as logs show it (escaped).
    pub shown: EscapedPath,
    /// The shard this pass prepares, if only one.
    shard: Option<ShardFilter>,
    /// Why it walks or skips, once decided.
    pub reason: String,
    /// The filesystem type and its estimate of the entries (used inodes), for the log, the
    /// progress display and the report.
    pub fs: String,
    pub estimate: Option<u64>,
    /// The filesystem as the verdict on ownership names it: the mount's type and source
    /// (`nfs from fileserver:/exports/data`), else `fs`.
    fs_named: String,
    /// The marker's digest and spec text: the spec and what the pass covers (`--cross-devices`).
    pub digest: Digest,
    pub spec_text: String,
    /// The load gate of this pass (its own baselines and limit: see [`throttle`]), current on
    /// the pass's thread while the pass lives, and on the pool's for its walks' jobs.
    gate: Arc<throttle::Gate>,
    _entered: throttle::Entered,
}

impl<'a> Pass<'a> {
    pub fn new(
        path: &'a Path,
        spec: &'a Spec,
        opts: &'a RunOptions,
        root: BorrowedFd<'_>,
        started: Instant,
        shard: Option<ShardFilter>,
    ) -> Self {
        let sys::FsInfo { name: fs, estimate } = sys::fs_info(root);
        let mounted = sys::stat_fd(root).ok().filter(|m| m.mnt_id != 0).and_then(|m| sys::mount_name(m.mnt_id));
        let fs_named = mounted.unwrap_or_else(|| fs.clone());
        let gate = Arc::new(throttle::Gate::started(opts.load, opts.threads));
        Pass {
            path,
            spec,
            opts,
            started,
            shown: EscapedPath::new(path),
            shard,
            reason: String::new(),
            fs,
            estimate,
            fs_named,
            digest: spec.coverage_digest(opts.cross_devices),
            spec_text: spec.coverage_text(opts.cross_devices),
            _entered: throttle::enter(Some(Arc::clone(&gate))),
            gate,
        }
    }

    /// `shard I/N: ` for a shard's log lines, else nothing.
    pub fn label(&self) -> String {
        self.shard.map_or_else(String::new, |f| format!("shard {}/{}: ", f.index, f.count))
    }

    /// The skip rule of every run (spec, root, `--force`, `--verify`, `--reverify-after`),
    /// which is [`marker::decide`]'s. `root_meta` is the root's (`root`) metadata.
    pub fn decide(&self, root: BorrowedFd<'_>, found: &Found, root_meta: &Meta) -> Decision {
        marker::decide(&marker::Inputs {
            found,
            digest: &self.digest,
            spec: &self.spec_text,
            root_conforms: fix::decide_at(root_meta, self.spec, crate::pass::root_place(root, self.spec)).is_none(),
            force: self.opts.force,
            verify: self.opts.verify,
            reverify_after: self.opts.reverify_after,
            now: marker::now(),
            mounts_now: match found {
                Found::Marker(m) if m.mounts.is_some() => mounts_now(root),
                _ => None,
            },
        })
    }

    /// The fixer of this pass. With a `place` and a plan that keeps a checkpoint, the fixer
    /// keeps it there (and continues the interrupted run's, skipping nothing on its word under
    /// `--verify full`).
    pub fn fixer<'f>(&self, plan: &ResumePlan, place: Option<Place<'f>>) -> Fixer<'f>
    where
        'a: 'f,
    {
        let verify = self.opts.verify;
        let every = self.opts.checkpoint_interval;
        let resume = match (plan, place) {
            (ResumePlan::Fresh { run }, Some(p)) => Some(Resume::new(p, None, verify, run, &self.digest, every)),
            (ResumePlan::Resume { run, checkpoint }, Some(p)) => {
                Some(Resume::new(p, Some(checkpoint.clone()), verify, run, &self.digest, every))
            }
            _ => None,
        };
        Fixer::new(FixerConfig {
            root: self.path,
            spec: self.spec,
            mode: self.opts.mode,
            privilege: self.opts.privilege,
            may_change: crate::pass::may_change(self.opts.privilege),
            shard: self.shard,
            verify_part: None,
            resume,
        })
    }

    /// Before the walk, what `plan` says an interrupted run left: its finished work (logged)
    /// and its special-bit records, restored (in `check`: counted) and kept while still needed.
    pub fn take_over(&self, root: BorrowedFd<'_>, fixer: &Fixer<'_>, plan: &ResumePlan) {
        let records = match (plan, fixer.resume()) {
            (ResumePlan::CheckPending(records), _) => records.as_slice(),
            (ResumePlan::Resume { run, .. }, Some(r)) => {
                let (records, covered) = r.adopted();
                info!(path = %self.shown, records, covered,
                      "{}resuming run {run}: {records} directory records of finished work, covering {covered} entries, are not read again",
                      self.label());
                &r.previous_pending
            }
            _ => return,
        };
        let restored = resume::restore_pending(root, self.path, records, self.spec, self.opts.mode);
        fixer.record_restored(&restored);
        if let Some(r) = fixer.resume() {
            r.keep_pending(restored.kept);
        }
    }

    /// Walks the tree below `root_fd` with `fixer` on `threads`, showing its progress. Returns
    /// the signal that stopped the walk, if one did (logged, with `then`: what that means).
    pub fn walk(
        &self,
        fixer: &Fixer<'_>,
        threads: &Threads,
        root_fd: OwnedFd,
        root_meta: Meta,
        then: &str,
    ) -> Option<Stop> {
        let shown = progress::Shown { path: &self.shown, estimate: self.estimate, ownership: self.spec.ownership() };
        let allocs_before = progress::allocs::count();
        progress::watch(fixer.counters(), &shown, self.opts.progress, || {
            Walk::new(threads, fixer, &root_meta, sys::Devices::from_flag(self.opts.cross_devices))
                .run(root_fd, root_meta)
        });
        if let (Some(before), Some(after)) = (allocs_before, progress::allocs::count()) {
            let walk_allocations = after - before;
            info!(path = %self.shown, walk_allocations, "test hook: the walk made {walk_allocations} allocations");
        }
        let stop = sys::termination();
        if let Some(sig) = stop {
            warn!(path = %self.shown, "{}{sig}: stopped walking; {then}", self.label());
        }
        stop
    }

    /// The report of this pass: what `fixer` counted, the signal that stopped it (`stop`), and
    /// the marker's state as it was found (`before`) and left (`after`; `None` when nothing
    /// was written: as it was).
    pub fn report(
        &self,
        fixer: Fixer<'_>,
        stop: Option<Stop>,
        action: Action,
        before: MarkerState,
        after: Option<MarkerState>,
    ) -> VolumeReport {
        let mut r = self.report_head(action, before, after);
        let verdict = fixer.probe().final_verdict();
        if let Some(line) = fixer.probe().explain(verdict, &self.fs_named) {
            r.ownership = verdict.word().map(str::to_string);
            r.fatal = Some(line);
        }
        r.ownership_evidence = fixer.probe().proof().map(|p| p.evidence);
        r.load.figures = self.gate.figures();
        if r.fatal.is_none() && stop.is_none() {
            self.warn_latched(r.load.figures.and_then(|f| f.in_flight_limit));
        }
        fixer.fill(&mut r, stop, self.started.elapsed());
        r
    }

    /// Warns when the adaptive limit of a pass that ran to its end ended at one operation in
    /// flight while the walk had more threads, after it had been at 4 or more: the storage
    /// answered one request at a time no faster than several.
    fn warn_latched(&self, limits: Option<throttle::Limits>) {
        if let Some(l) = limits.filter(|l| l.last == 1 && l.max >= 4 && self.opts.threads > 1) {
            warn!(path = %self.shown, threads = self.opts.threads, max_in_flight = l.max,
                  "the adaptive load ended at 1 operation in flight of {} threads: the storage's latency rose with every request more; if it is not shared, `--load full` runs all threads", self.opts.threads);
        }
    }

    /// The report of a pass that skips: nothing counted.
    pub fn skipped(&self, before: MarkerState) -> VolumeReport {
        VolumeReport {
            timing: Timing::of(self.started.elapsed(), 0),
            ..self.report_head(Action::Skipped, before, None)
        }
    }

    /// What the report of this pass says whether it walked or skipped (see [`Pass::report`]).
    fn report_head(&self, action: Action, before: MarkerState, after: Option<MarkerState>) -> VolumeReport {
        let mut r = VolumeReport::empty(self.path, self.spec, self.opts.threads, action);
        r.spec = self.spec_text.clone();
        r.spec_digest = self.digest.clone();
        r.shard = self.shard.map(|f| format!("{}/{}", f.index, f.count));
        r.reason = self.reason.clone();
        r.fs_type = self.fs.clone();
        r.estimated_entries = self.estimate;
        r.marker_before = before;
        r.marker_after = after.unwrap_or(before);
        r.load = Load::of(&self.opts.load);
        r
    }
}

/// The mount points below the root when a pass started (`None`: they could not be listed), to
/// tell at its end whether it may mark the volume done over them ([`MountWatch::end`]).
pub struct MountWatch(Option<Vec<Vec<u8>>>);

impl MountWatch {
    /// The mount points below `root` now, at the start of a pass.
    pub fn start(root: BorrowedFd<'_>) -> MountWatch {
        MountWatch(sys::mounts_below(root))
    }

    /// At the end of the pass whose `fixer` met what it met: what a `done` marker records of
    /// the mount points below the root (see [`Marker::mounts`](marker::Marker)): nothing after
    /// a pass that met none, their digest now, or a word no digest equals when they cannot be
    /// listed (every start then walks). `Err` with the reason when they changed while the pass
    /// ran ([`marker::mounts_changed`]): the pass may not mark the volume done.
    pub fn end(&self, root: BorrowedFd<'_>, fixer: &Fixer<'_>) -> Result<Option<MountsDigest>, String> {
        let now = sys::mounts_below(root);
        let met = fixer.met_mounts();
        if let Some(why) = marker::mounts_changed(self.0.as_deref(), now.as_deref(), &met) {
            return Err(why);
        }
        let digest = marker::mounts_digest(now.as_deref()).unwrap_or_else(MountsDigest::unlisted);
        Ok((!met.is_empty()).then_some(digest))
    }
}

/// The [`marker::mounts_digest`] of the mount points below the root now.
pub fn mounts_now(root: BorrowedFd<'_>) -> Option<MountsDigest> {
    marker::mounts_digest(sys::mounts_below(root).as_deref())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plan_keeps_a_checkpoint_only_in_apply() {
        let r1 = RunId::parse("r1").unwrap();
        let fresh = ResumePlan::apply(r1.clone(), None);
        assert_eq!(fresh, ResumePlan::Fresh { run: r1.clone() });
        let resumed = ResumePlan::apply(r1.clone(), Some(Checkpoint::new(&r1, &"d".into())));
        assert!(matches!(&resumed, ResumePlan::Resume { run, .. } if *run == r1));
        assert_eq!((fresh.run(), resumed.run()), (Some(&r1), Some(&r1)));
        assert_eq!(ResumePlan::CheckPending(Vec::new()).run(), None);
        assert_eq!(ResumePlan::None.run(), None);
    }

    #[test]
    fn a_panic_becomes_an_internal_error_of_its_volume() {
        let path = Path::new("/v");
        let e = contained(path, || panic!("boom {}", 7)).unwrap_err();
        assert_eq!(e.to_string(), "/v: internal error: boom 7");
        assert_eq!(e.exit_code(), crate::error::ExitCode::Failure);
        let e = contained(path, || std::panic::panic_any(5u8)).unwrap_err();
        assert!(e.to_string().ends_with("internal error: a panic without a message"), "{e}");
    }
}
