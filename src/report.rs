//! The outcome of a run: per-volume figures, the human summary line and the JSON report.

use std::io::Write;
use std::path::Path;
use std::time::Duration;

use rustix::io::Errno;
use serde::{Deserialize, Serialize};

use crate::bounded::Bounded;
use crate::error::{Error, ExitCode, Op, VolumeOutcome, errno_text};
use crate::escape::EscapedPath;
use crate::options::{Foreign, Tolerance};
use crate::spec::{Digest, Ownership};
use crate::state::{MarkerState, Stop};
use crate::throttle::{Concurrency, Figures, Policy};

mod wire;

pub use wire::Counts;

/// At most this many per-entry errors are listed (all are counted).
pub const MAX_LISTED_ERRORS: usize = 100;

/// At most this many entries of other users are listed (all are counted).
pub const MAX_LISTED_FOREIGN: usize = 100;

/// The first [`MAX_LISTED_ERRORS`] per-entry errors.
pub type ErrorList = Bounded<EntryError, MAX_LISTED_ERRORS>;

/// The first [`MAX_LISTED_FOREIGN`] entries of other users left as they are.
pub type ForeignList = Bounded<ForeignEntry, MAX_LISTED_FOREIGN>;

/// At most this many tightened entries are listed (all are counted).
pub const MAX_LISTED_TIGHTENED: usize = 100;

/// The first [`MAX_LISTED_TIGHTENED`] entries at app-private paths that lost bits.
pub type TightenedList = Bounded<TightenedEntry, MAX_LISTED_TIGHTENED>;

/// The JSON report: `{"version":1,"volumes":[...]}`. Key names are a stable interface.
#[derive(Debug, Serialize, Deserialize)]
pub struct Report {
    pub version: u32,
    pub volumes: Vec<VolumeReport>,
    /// Log lines this run could not write to stderr (its reader went away, a full disk): the
    /// pass went on without them. Absent when every line was written.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub log_lines_dropped: u64,
}

impl Report {
    /// This run's report of `volumes`, with the log lines dropped so far.
    pub fn new(volumes: Vec<VolumeReport>) -> Report {
        Report { version: 1, volumes, log_lines_dropped: crate::logsink::dropped() }
    }
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// What happened to a volume.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Action {
    /// `apply` walked the volume.
    #[default]
    Walked,
    /// `check` walked it without changing anything.
    Checked,
    /// `apply` did not walk: the marker says the volume is prepared for this spec.
    Skipped,
    /// The volume could not be prepared at all (see `fatal`).
    Failed,
    /// `--sticky`: a shared temp dir was made (see `sticky`).
    Sticky,
}

/// One per-entry failure.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct EntryError {
    /// The entry's path, escaped (see `escape`): lossless for any bytes.
    pub path: EscapedPath,
    pub op: Op,
    /// The failed syscall's errno (none for a failure that is no failed syscall). Reports spell
    /// it by its name, e.g. `EROFS` (`-` for none).
    #[serde(with = "crate::error::errno_word")]
    pub errno: Option<Errno>,
    /// The errno's text.
    pub error: String,
}

impl EntryError {
    pub fn new(path: EscapedPath, op: Op, errno: Errno) -> Self {
        EntryError { path, op, errno: Some(errno), error: errno_text(errno.raw_os_error()) }
    }

    /// A failure that is no failed syscall (`errno` is `-`): `error` says what and what to do.
    pub fn note(path: EscapedPath, op: Op, text: String) -> Self {
        EntryError { path, op, errno: None, error: text }
    }
}

/// An entry of another user that an unprivileged pass left as it is (it does not conform).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ForeignEntry {
    /// The entry's path, escaped (see `escape`).
    pub path: EscapedPath,
    /// Its owner and group.
    pub uid: u32,
    pub gid: u32,
    /// Its permission bits, octal (`0644`).
    pub mode: String,
    /// What a privileged run would give it: the group (null: kept) ...
    pub want_gid: Option<u32>,
    /// ... and the mode (null: kept).
    pub want_mode: Option<String>,
    /// A directory this user may not read: what is inside was not checked either.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub unread: bool,
}

/// An entry at an app-private path that `--modes app-safe` tightened (in `check`: would).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TightenedEntry {
    /// The entry's path, escaped (see `escape`).
    pub path: EscapedPath,
    /// What it is, e.g. `PostgreSQL data directory`.
    pub app: String,
    /// Its permission bits before and after, octal (`2770`, `2750`).
    pub mode: String,
    pub want_mode: String,
}

/// One volume's figures. Serialized by hand (`report/wire.rs`) to keep the key order of earlier
/// versions while the counts live in one [`Counts`].
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct VolumeReport {
    /// The volume's path, escaped.
    pub path: EscapedPath,
    pub action: Action,
    /// The spec in words and its digest (what the marker records).
    pub spec: String,
    pub spec_digest: Digest,
    /// Walker threads.
    pub threads: usize,
    /// The filesystem type (from `statfs`).
    pub fs_type: String,
    /// Inodes in use when PATH is a whole filesystem (the walk's expected size), else null: a
    /// directory of a larger filesystem has no estimate.
    pub estimated_entries: Option<u64>,
    /// Why the volume was walked or skipped.
    pub reason: String,
    /// The marker's state before and after.
    pub marker_before: MarkerState,
    pub marker_after: MarkerState,
    /// Entries by kind, changes, errors, entries of other users left, directories read.
    #[serde(flatten)]
    pub counts: Counts,
    pub error_list: ErrorList,
    pub skipped_mounts: Vec<EscapedPath>,
    /// Unprivileged mode (not root, or `--unprivileged`): only the entries this user owns are
    /// changed.
    pub unprivileged: bool,
    /// Unprivileged mode: the first entries of other users that do not conform (`counts`
    /// has how many), left as they are for a privileged run (in `check`: that would be left).
    pub foreign_owned_list: ForeignList,
    /// `--modes app-safe`: the first entries at app-private paths that lost bits their app
    /// refuses (`counts` has how many).
    pub tightened_list: TightenedList,
    /// Wall time of the volume, and entries per second over it.
    #[serde(flatten)]
    pub timing: Timing,
    /// `I/N` for a sharded pass.
    pub shard: Option<String>,
    /// What `--sticky` found and did.
    pub sticky: Option<StickyOutcome>,
    /// The error that stopped this volume before or during its walk.
    pub fatal: Option<String>,
    /// The signal that stopped the walk early.
    pub interrupted: Option<Stop>,
    /// The load on the storage: the run's policy and what the gate saw.
    pub load: Load,
    /// `ignored` or `refused` when the storage did not take ownership changes (see `honour`):
    /// the pass stopped, `fatal` says what to do.
    pub ownership: Option<String>,
    /// What volprep's own experiment on the storage found, when one was made (see `honour`):
    /// the proof behind `ownership`, or why suspect entries were no verdict.
    pub ownership_evidence: Option<String>,
}

/// The load a run put on its storage (`--load`, `--max-ops`): the report's `load` object.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Load {
    /// `adaptive` or `full` (operations in flight).
    pub policy: Concurrency,
    /// The ceiling on operations per second, if any.
    pub max_ops: Option<u32>,
    /// What the gate measured during the walk (absent when it had nothing to do: `full` without
    /// a ceiling, or no walk). One gate serves every volume of a run: the figures are the run's.
    #[serde(flatten)]
    pub figures: Option<Figures>,
}

impl Load {
    /// The run's policy, no figures yet.
    pub fn of(p: &Policy) -> Load {
        Load { policy: p.concurrency, max_ops: p.max_ops, figures: None }
    }
}

impl VolumeReport {
    #[cfg(test)]
    fn sample(path: &str, errors: u64) -> Self {
        let spec = crate::spec::Spec::group(1);
        let mut v = Self::empty(Path::new(path), &spec, 1, Action::Walked);
        v.counts.errors = errors;
        v
    }

    /// A volume that could not be walked at all.
    pub fn failed(path: &Path, spec: &crate::spec::Spec, threads: usize, err: &Error) -> Self {
        let interrupted = err.stop();
        VolumeReport { fatal: Some(err.to_string()), interrupted, ..Self::empty(path, spec, threads, Action::Failed) }
    }

    /// A report with every count at zero.
    pub fn empty(path: &Path, spec: &crate::spec::Spec, threads: usize, action: Action) -> Self {
        let path = EscapedPath::new(path);
        VolumeReport { path, action, spec: spec.to_string(), spec_digest: spec.digest(), threads, ..Default::default() }
    }

    /// `check` found entries that `apply` would change.
    pub fn would_change(&self) -> bool {
        self.action == Action::Checked && self.counts.changed_owner + self.counts.changed_mode > 0
    }

    /// An unprivileged pass left (or, in `check`, would leave) entries of other users that do not
    /// conform: a privileged run is needed.
    pub fn left_foreign(&self) -> bool {
        matches!(self.action, Action::Walked | Action::Checked) && self.counts.foreign_owned > 0
    }

    /// The exit code this volume alone asks for, with what the run `tolerates`.
    pub fn exit_code(&self, tolerates: Tolerance) -> ExitCode {
        ExitCode::for_volume(VolumeOutcome {
            stopped: self.interrupted,
            ownership_ignored: self.ownership.is_some(),
            fatal: self.fatal.is_some(),
            errors: self.counts.errors,
            max_errors: tolerates.max_errors,
            left_foreign: self.left_foreign() && tolerates.foreign == Foreign::Partial,
            would_change: self.would_change(),
        })
    }

    /// The one-line human summary.
    pub fn summary(&self) -> String {
        if let Some(f) = &self.fatal {
            return format!("{}: failed: {f}", self.path);
        }
        if self.sticky.is_some() {
            return format!("{}: sticky temp dir: {}", self.path, self.reason);
        }
        if self.action == Action::Skipped {
            return format!("{}: skipped ({}) in {}ms", self.path, self.reason, self.timing.elapsed_ms);
        }
        let mut s = self.headline();
        let c = &self.counts;
        if !self.skipped_mounts.is_empty() {
            s += &format!(
                ", skipped {} nested mount(s): {}",
                self.skipped_mounts.len(),
                self.skipped_mounts.iter().map(EscapedPath::as_str).collect::<Vec<_>>().join(" ")
            );
        }
        if c.skipped_subtrees > 0 {
            s += &format!(
                ", {} finished subtree(s) resumed past ({} of their directories verified unchanged)",
                c.skipped_subtrees, c.verified_dirs
            );
        }
        if c.tightened > 0 {
            let verb = if self.action == Action::Checked { "would tighten" } else { "tightened" };
            let first =
                self.tightened_list.first().map_or_else(String::new, |t| format!(" (first: {} {})", t.path, t.app));
            s += &format!(", {verb} {} app-private path(s){first}", c.tightened);
        }
        if c.foreign_owned > 0 {
            let verb = if self.action == Action::Checked { "would leave" } else { "left" };
            s += &format!(
                ", {verb} {} entries of other users that do not conform (a privileged run fixes them)",
                c.foreign_owned
            );
        }
        s += &format!(", {} error(s)", c.errors);
        if self.interrupted.is_some() && self.action == Action::Walked {
            s += "; the next start resumes";
        }
        s
    }

    /// `PATH: prepared N entries in 1.00s (N/s): changed group N, mode N` (`owner`, `owner and
    /// group`: what the spec sets).
    fn headline(&self) -> String {
        let c = &self.counts;
        // "prepared" only when every entry conforms: with any error (tolerated or not) some may not.
        let (verb, changed) = match (self.interrupted, self.action) {
            (Some(sig), Action::Checked) => (format!("stopped by {sig} after"), "would change"),
            (Some(sig), _) => (format!("stopped by {sig} after"), "changed"),
            (None, Action::Checked) => ("checked".into(), "would change"),
            _ if c.errors > 0 || c.foreign_owned > 0 => ("walked".into(), "changed"),
            _ => ("prepared".into(), "changed"),
        };
        let ownership = Ownership::of_words(&self.spec).map_or("owner or group".into(), |o| o.to_string());
        format!(
            "{}: {verb} {} entries in {:.2}s ({}/s): {changed} {ownership} {}, mode {}",
            self.path,
            c.entries,
            self.timing.elapsed_ms as f64 / 1000.0,
            self.timing.entries_per_s,
            c.changed_owner,
            c.changed_mode,
        )
    }
}

/// How long a volume took, and its pace.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct Timing {
    /// Wall time, in milliseconds.
    pub elapsed_ms: u64,
    /// Entries per second over it (all of them when it took no measurable time).
    pub entries_per_s: u64,
}

impl Timing {
    /// `entries` looked at in `elapsed`.
    pub fn of(elapsed: Duration, entries: u64) -> Timing {
        let secs = elapsed.as_secs_f64();
        let entries_per_s = if secs > 0.0 { (entries as f64 / secs) as u64 } else { entries };
        Timing { elapsed_ms: elapsed.as_millis() as u64, entries_per_s }
    }
}

/// What `--sticky` found and did to a temp dir.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StickyOutcome {
    /// The directory did not exist and was made.
    pub created: bool,
    /// Its mode before (octal), when it existed.
    pub mode_before: Option<String>,
    pub mode_after: String,
}

/// The Kubernetes termination message limit.
pub const TERMINATION_MAX_BYTES: usize = 4096;

/// One summary line per volume, cut to [`TERMINATION_MAX_BYTES`] (at a character boundary, with
/// a marker saying how many volumes were left out).
pub fn termination_message(volumes: &[VolumeReport]) -> String {
    let mut out = String::new();
    for (i, v) in volumes.iter().enumerate() {
        let mut line = v.summary();
        if !v.error_list.is_empty() {
            let e = &v.error_list[0];
            line += &format!(" (first: {} {} {})", e.path, e.op, crate::error::errno_word::word(e.errno));
        }
        line.push('\n');
        let rest = volumes.len() - i - 1;
        let tail = if rest > 0 { format!("... and {rest} more volume(s)\n") } else { String::new() };
        if out.len() + line.len() + tail.len() > TERMINATION_MAX_BYTES {
            let more = format!("... and {} more volume(s)\n", volumes.len() - i);
            let room = TERMINATION_MAX_BYTES.saturating_sub(out.len() + more.len());
            let mut cut = room.min(line.len());
            while !line.is_char_boundary(cut) {
                cut -= 1;
            }
            if cut > 0 {
                out += &line[..cut];
                out.push('\n');
            }
            out += &more;
            while out.len() > TERMINATION_MAX_BYTES {
                out.pop();
            }
            return out;
        }
        out += &line;
    }
    out
}

/// Writes the report as one JSON document to `dest` (`-`: stdout).
pub fn write(report: &Report, dest: &Path) -> Result<(), Error> {
    let mut json = serde_json::to_vec_pretty(report).expect("report serializes");
    json.push(b'\n');
    if crate::options::is_stdout(dest) {
        return print(&json);
    }
    write_file(dest, &json).map_err(|why| Error::ReportUnwritable { path: dest.to_path_buf(), why })
}

/// Writes `bytes` to stdout. A reader that went away (`volprep status --json | grep -q ...`,
/// EPIPE) is no error: nobody wants the rest.
pub fn print(bytes: &[u8]) -> Result<(), Error> {
    let mut out = std::io::stdout().lock();
    match out.write_all(bytes).and_then(|()| out.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(Error::Stdout { why: e.to_string() }),
        _ => Ok(()),
    }
}

/// Writes an output file (the report, the termination message) through
/// [`crate::sys::create_output`]: never through a symlink, never over a file with other links.
pub fn write_file(dest: &Path, bytes: &[u8]) -> Result<(), String> {
    let mut f = crate::sys::create_output(dest).map_err(|e| match e {
        rustix::io::Errno::LOOP => "it is a symlink; refusing to follow it".to_string(),
        rustix::io::Errno::MLINK => "it has other hard links; refusing to overwrite it".to_string(),
        rustix::io::Errno::NXIO => {
            "it is not a regular file (a FIFO, socket or device); refusing to open it".to_string()
        }
        e => errno_text(e.raw_os_error()),
    })?;
    f.write_all(bytes).map_err(|e| e.to_string())
}

impl VolumeReport {
    /// Adds `v` (another part of the same volume, e.g. a shard) into this report: counts add up,
    /// lists join, the elapsed time is the longest.
    pub fn merge(&mut self, v: VolumeReport) {
        let m = self;
        m.counts.add(&v.counts);
        m.timing.elapsed_ms = m.timing.elapsed_ms.max(v.timing.elapsed_ms);
        m.error_list.append(v.error_list);
        m.skipped_mounts.extend(v.skipped_mounts);
        m.foreign_owned_list.append(v.foreign_owned_list);
        m.tightened_list.append(v.tightened_list);
        m.unprivileged |= v.unprivileged;
        if v.marker_after == MarkerState::Done {
            m.marker_after = v.marker_after;
        }
        if v.action == Action::Walked {
            m.action = Action::Walked;
        }
        m.fatal = m.fatal.take().or(v.fatal);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn termination_message_has_a_line_per_volume() {
        let m = termination_message(&[VolumeReport::sample("/a", 0), VolumeReport::sample("/b", 2)]);
        assert_eq!(m.lines().count(), 2);
        assert!(m.lines().next().unwrap().starts_with("/a: prepared 0 entries"));
        assert!(m.contains("2 error(s)"));
        assert!(m.lines().nth(1).unwrap().starts_with("/b: walked 0 entries"), "not 'prepared' with errors: {m}");
    }

    #[test]
    fn entries_left_for_a_privileged_run_show_in_the_summary() {
        let mut v = VolumeReport::sample("/a", 0);
        assert!(!v.left_foreign());
        v.counts.foreign_owned = 3;
        assert!(v.left_foreign());
        let s = v.summary();
        assert!(s.starts_with("/a: walked 0 entries"), "not 'prepared' with entries left: {s}");
        assert!(s.contains("left 3 entries of other users"), "{s}");
        v.action = Action::Skipped;
        assert!(!v.left_foreign(), "a skip walked nothing");
    }

    #[test]
    fn the_summary_names_what_the_spec_changes() {
        let mut v = VolumeReport::sample("/a", 0);
        v.action = Action::Checked;
        (v.counts.changed_owner, v.counts.changed_mode) = (11, 10);
        for (spec, said) in [
            ("fs-group=2000", "would change group 11, mode 10"),
            ("fs-group=2000 read-only cross-devices", "would change group 11, mode 10"),
            ("owner=1000", "would change owner 11, mode 10"),
            ("owner=1000:2000", "would change owner and group 11, mode 10"),
            ("fs-group=2000 owner=1000", "would change owner and group 11, mode 10"),
            ("edited by hand", "would change owner or group 11, mode 10"),
        ] {
            v.spec = spec.into();
            assert!(v.summary().contains(said), "{spec}: {}", v.summary());
        }
    }

    #[test]
    fn timing_is_entries_over_the_wall_time() {
        assert_eq!(Timing::of(Duration::from_millis(2500), 1000), Timing { elapsed_ms: 2500, entries_per_s: 400 });
        assert_eq!(Timing::of(Duration::ZERO, 7).entries_per_s, 7, "no measurable time: all of them");
    }

    #[test]
    fn termination_message_never_exceeds_4096_bytes() {
        let long = "/é".repeat(3000);
        let vols: Vec<_> = (0..50).map(|i| VolumeReport::sample(&format!("{long}{i}"), i)).collect();
        let m = termination_message(&vols);
        assert!(m.len() <= TERMINATION_MAX_BYTES, "{}", m.len());
        assert!(m.ends_with("more volume(s)\n"), "{}", &m[m.len() - 60..]);
        let few: Vec<_> = (0..200).map(|i| VolumeReport::sample(&format!("/v{i}"), 0)).collect();
        let m = termination_message(&few);
        assert!(m.len() <= TERMINATION_MAX_BYTES);
        assert!(m.contains("more volume(s)"));
    }
}
