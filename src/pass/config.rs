//! What a pass's [`Fixer`] is built from ([`FixerConfig`]) and what is looked up when it is
//! built: the setgid rule of this process and filesystem, what regular files' changes go through,
//! and whether this process may make every change it attempts.

use std::path::Path;
use std::sync::{Arc, Mutex};

use super::{Fixer, Places};
use crate::caps;
use crate::fix::{SetgidRule, Through};
use crate::honour::Probe;
use crate::options::{Mode, Privilege, ShardFilter};
use crate::progress::Counters;
use crate::resume::Resume;
use crate::spec::Spec;
use crate::sys;
use crate::throttle::Storage;
use crate::verify::Stamp;

/// What a pass's [`Fixer`] is built from: filled by the lifecycle, the same for the whole pass
/// (the walks of other shards' parts take theirs from it: [`Fixer::for_part`]).
pub struct FixerConfig<'a> {
    /// The volume root as given: the paths of logs and of the report start with it.
    pub root: &'a Path,
    pub spec: &'a Spec,
    pub mode: Mode,
    /// Unprivileged: only entries this user owns are changed.
    pub privilege: Privilege,
    /// EPERM on a chown or chmod is the storage's refusal, not a missing capability: this
    /// process may make every change it attempts (see [`may_change`]).
    pub may_change: bool,
    /// For `--shard I/N`: only the entries this shard owns are fixed and counted.
    pub shard: Option<ShardFilter>,
    /// With `shard`, for the run that completes a sharded volume: the part's anchor
    /// directories are verified against this bound (`Descend::Verify`) rather than read.
    pub verify_part: Option<Stamp>,
    /// The checkpoint this pass keeps (and the interrupted run's it continues), if any.
    pub resume: Option<Resume<'a>>,
}

impl<'a> Fixer<'a> {
    /// The fixer of a pass as `config` says; in `apply`, what the volume's filesystem and this
    /// process's credentials say about setgid bits and regular files is looked up here.
    pub fn new(config: FixerConfig<'a>) -> Self {
        let FixerConfig { root, spec, mode, privilege, may_change, shard, verify_part, resume } = config;
        Fixer {
            root,
            spec,
            mode,
            counters: Counters::default(),
            errors: Mutex::default(),
            skipped_mounts: Mutex::new(Vec::new()),
            mount_points: Mutex::new(Vec::new()),
            resume,
            shard,
            verify_part,
            privilege,
            foreign: Mutex::default(),
            setgid: if mode == Mode::Apply { setgid_rule(root) } else { SetgidRule::default() },
            probe: Arc::new(Probe::default()),
            through: if mode == Mode::Apply { through(root) } else { Through::Pin },
            may_change,
            mapped: if mode == Mode::Apply { sys::Mapped::of_self() } else { sys::Mapped::default() },
            places: Places::of(spec),
        }
    }

    /// The fixer of a walk of another shard's part, `part`, by the run that completes a sharded
    /// volume (its anchor directories verified against `bound`): this pass's in all else, with
    /// counts and lists of its own (added back by [`Fixer::absorb`]) and no checkpoint. It
    /// shares this pass's probe: what the storage does with ownership changes is one verdict,
    /// which stops this pass and every such walk alike, and an EPERM where this process may
    /// make the change is weighed as in the pass's own walk.
    pub fn for_part(&self, part: ShardFilter, bound: Option<Stamp>) -> Fixer<'_> {
        let sub = Fixer::new(FixerConfig {
            root: self.root,
            spec: self.spec,
            mode: self.mode,
            privilege: self.privilege,
            may_change: self.may_change,
            shard: Some(part),
            verify_part: bound,
            resume: None,
        });
        Fixer { probe: Arc::clone(&self.probe), ..sub }
    }
}

/// What this process's credentials and the volume's filesystem say about a directory's setgid
/// bit (see [`SetgidRule`]).
fn setgid_rule(root: &Path) -> SetgidRule {
    let local_dev = match sys::storage(root) {
        Storage::Remote => None,
        Storage::Local => sys::stat_path(root).ok().map(|m| m.dev),
    };
    SetgidRule {
        local_dev,
        groups: sys::groups(),
        fsetid: caps::effective().is_some_and(|e| e & (1 << caps::FSETID.bit) != 0),
        mapped: sys::Mapped::of_self(),
    }
}

/// The filesystem (as mountinfo names it) whose client keeps an open file's capabilities: a
/// file's chown and chmod through an open fd make no permission `getattr` round trip.
const OPEN_FILES_KEEP_CAPS: &str = "fuse.ceph-fuse";

/// What regular files' changes go through on the volume at `root`.
fn through(root: &Path) -> Through {
    let fs = sys::stat_path(root).ok().filter(|m| m.mnt_id != 0).and_then(|m| sys::mount_fs_type(m.mnt_id));
    if fs.as_deref() == Some(OPEN_FILES_KEEP_CAPS) { Through::OpenFile } else { Through::Pin }
}

/// Whether this process may make every change a pass with `privilege` attempts: unprivileged,
/// it attempts only its own entries; privileged, it needs CAP_CHOWN and CAP_FOWNER.
pub fn may_change(privilege: Privilege) -> bool {
    match privilege {
        Privilege::Unprivileged { .. } => true,
        Privilege::Full => {
            caps::effective().is_some_and(|e| [caps::CHOWN, caps::FOWNER].iter().all(|c| e & (1 << c.bit) != 0))
        }
    }
}
