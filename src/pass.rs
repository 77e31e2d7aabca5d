//! One volume's pass: opens the root, walks it with a visitor that decides and (for `apply`)
//! fixes each entry, and turns the counters into a [`VolumeReport`].

use std::ffi::CStr;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Instant;

use rustix::io::Errno;
use tracing::{debug, warn};

use crate::error::{Error, Op};
use crate::escape::Escaped;
use crate::fix::{self, Change};
use crate::progress::Counters;
use crate::report::{Action, EntryError, MAX_LISTED_ERRORS, VolumeReport};
use crate::spec::Spec;
use crate::sys::{self, Meta};
use crate::walk::{self, Node, Visitor, Walk};

/// `apply` changes entries; `check` only decides.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Apply,
    Check,
}

/// How to run a pass (everything that is not the desired state).
#[derive(Debug, Clone)]
pub struct RunOptions {
    pub mode: Mode,
    pub threads: usize,
    pub cross_devices: bool,
}

/// Runs one pass over the volume at `path`. Fatal problems at start (missing, not a directory)
/// are returned as errors; per-entry failures are counted in the report.
pub fn run(path: &Path, spec: &Spec, opts: &RunOptions) -> Result<VolumeReport, Error> {
    let started = Instant::now();
    let root_fd = sys::open_root(path).map_err(|e| match e {
        Errno::NOTDIR => Error::NotADirectory {
            path: path.to_path_buf(),
        },
        e => Error::sys(path, Op::Open, e),
    })?;
    let root_meta = sys::stat_fd(sys::fd(&root_fd)).map_err(|e| Error::sys(path, Op::Stat, e))?;
    let visitor = Fixer::new(path, spec, opts.mode);
    Walk::new(&visitor, root_meta.dev, opts.cross_devices).run(root_fd, root_meta);
    Ok(visitor.into_report(path, spec, opts, started))
}

/// The visitor of a pass: decide, then (in `apply`) fix; count everything.
struct Fixer<'a> {
    root: &'a Path,
    spec: &'a Spec,
    mode: Mode,
    counters: Counters,
    errors: Mutex<Vec<EntryError>>,
    skipped_mounts: Mutex<Vec<PathBuf>>,
}

impl<'a> Fixer<'a> {
    fn new(root: &'a Path, spec: &'a Spec, mode: Mode) -> Self {
        Fixer {
            root,
            spec,
            mode,
            counters: Counters::default(),
            errors: Mutex::new(Vec::new()),
            skipped_mounts: Mutex::new(Vec::new()),
        }
    }

    fn path_of(&self, dir: &Node, name: Option<&CStr>) -> PathBuf {
        let rel = match name {
            Some(n) => walk::rel_child(dir, n),
            None => dir.rel_path(),
        };
        walk::full_path(self.root, &rel)
    }

    /// Counts the outcome of one entry's decision or fix.
    fn record(&self, dir: &Node, name: Option<&CStr>, outcome: Result<Change, (Op, Errno)>) {
        match outcome {
            Ok(change) => {
                if change.owner() {
                    Counters::add(&self.counters.changed_owner);
                }
                if change.mode.is_some() {
                    Counters::add(&self.counters.changed_mode);
                }
                if !change.is_none() && tracing::enabled!(tracing::Level::DEBUG) {
                    let path = self.path_of(dir, name);
                    let verb = if self.mode == Mode::Check {
                        "would change"
                    } else {
                        "changed"
                    };
                    debug!(path = %Escaped(path.as_os_str()), uid = ?change.uid, gid = ?change.gid,
                           mode = ?change.mode.map(|m| format!("{m:04o}")), "{verb}");
                }
            }
            Err((_, Errno::NOENT)) => {}
            Err((op, errno)) => self.error(dir, name, op, errno),
        }
    }

    fn into_report(
        self,
        path: &Path,
        spec: &Spec,
        opts: &RunOptions,
        started: Instant,
    ) -> VolumeReport {
        let elapsed = started.elapsed();
        let c = &self.counters;
        let entries = Counters::get(&c.entries);
        let secs = elapsed.as_secs_f64();
        VolumeReport {
            path: Escaped(path.as_os_str()).to_string(),
            action: if opts.mode == Mode::Apply {
                Action::Walked
            } else {
                Action::Checked
            },
            spec: spec.to_string(),
            spec_digest: spec.digest(),
            threads: opts.threads,
            entries,
            dirs: Counters::get(&c.dirs),
            files: Counters::get(&c.files),
            symlinks: Counters::get(&c.symlinks),
            others: Counters::get(&c.others),
            changed_owner: Counters::get(&c.changed_owner),
            changed_mode: Counters::get(&c.changed_mode),
            errors: Counters::get(&c.errors),
            error_list: self.errors.into_inner().unwrap_or_else(|e| e.into_inner()),
            skipped_mounts: self
                .skipped_mounts
                .into_inner()
                .unwrap_or_else(|e| e.into_inner())
                .iter()
                .map(|p| Escaped(p.as_os_str()).to_string())
                .collect(),
            elapsed_ms: elapsed.as_millis() as u64,
            entries_per_s: if secs > 0.0 {
                (entries as f64 / secs) as u64
            } else {
                entries
            },
            fatal: None,
        }
    }
}

impl Visitor for Fixer<'_> {
    fn entry(&self, parent: &Node, name: &CStr, meta: &Meta) {
        self.counters.seen(meta.kind());
        let outcome = match self.mode {
            Mode::Check => Ok(fix::decide(meta, self.spec)),
            Mode::Apply => fix::fix_entry(parent.fd(), name, meta, self.spec),
        };
        self.record(parent, Some(name), outcome);
    }

    fn dir_done(&self, dir: &Node) {
        self.counters.seen(sys::Kind::Dir);
        let outcome = match self.mode {
            Mode::Check => Ok(fix::decide(&dir.meta, self.spec)),
            Mode::Apply => fix::fix_dir(dir.fd(), &dir.meta, self.spec),
        };
        self.record(dir, None, outcome);
    }

    fn mount_skipped(&self, parent: &Node, name: &CStr, _meta: &Meta) {
        let path = self.path_of(parent, Some(name));
        warn!(path = %Escaped(path.as_os_str()), "nested mount not entered (use --cross-devices to enter it)");
        self.skipped_mounts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(path);
    }

    fn error(&self, dir: &Node, name: Option<&CStr>, op: Op, errno: Errno) {
        Counters::add(&self.counters.errors);
        let path = self.path_of(dir, name);
        let err = EntryError::new(&path, op, errno.raw_os_error());
        warn!("{}: {} failed: {}", err.path, op, err.error);
        let mut list = self.errors.lock().unwrap_or_else(|e| e.into_inner());
        if list.len() < MAX_LISTED_ERRORS {
            list.push(err);
        }
    }
}
