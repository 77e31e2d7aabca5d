//! The outcome of a run: per-volume figures, the human summary line and the JSON report.

use std::io::Write;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::{Error, ExitCode, Op, errno_name, errno_text};
use crate::escape::{Escaped, EscapedPath};

/// At most this many per-entry errors are listed (all are counted).
pub const MAX_LISTED_ERRORS: usize = 100;

/// At most this many entries of other users are listed (all are counted).
pub const MAX_LISTED_FOREIGN: usize = 100;

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
    /// The errno's name, e.g. `EROFS`.
    pub errno: String,
    /// The errno's text.
    pub error: String,
}

impl EntryError {
    pub fn new(path: EscapedPath, op: Op, errno: i32) -> Self {
        EntryError {
            path,
            op,
            errno: errno_name(errno).map_or_else(|| errno.to_string(), str::to_string),
            error: errno_text(errno),
        }
    }

    /// A failure that is no failed syscall (`errno` is `-`): `error` says what and what to do.
    pub fn note(path: EscapedPath, op: Op, text: String) -> Self {
        EntryError { path, op, errno: "-".into(), error: text }
    }
}

/// An entry of another user that an unprivileged pass left as it is (it does not conform).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ForeignEntry {
    /// The entry's path, escaped (see `escape`).
    pub path: String,
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

/// One volume's figures.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct VolumeReport {
    pub path: String,
    pub action: Action,
    pub spec: String,
    pub spec_digest: String,
    pub threads: usize,
    /// The filesystem type (from `statfs`).
    pub fs_type: String,
    /// Inodes in use when PATH is a filesystem root (the walk's expected size), else null.
    pub estimated_entries: Option<u64>,
    /// Why the volume was walked or skipped.
    pub reason: String,
    /// The marker's state before and after: `none`, `done`, `in-progress`, `unsupported`, `unreadable`.
    pub marker_before: String,
    pub marker_after: String,
    pub entries: u64,
    pub dirs: u64,
    pub files: u64,
    pub symlinks: u64,
    pub others: u64,
    pub changed_owner: u64,
    pub changed_mode: u64,
    pub errors: u64,
    pub error_list: Vec<EntryError>,
    pub skipped_mounts: Vec<String>,
    /// Unprivileged mode (not root, or `--unprivileged`): only the entries this user owns are
    /// changed.
    pub unprivileged: bool,
    /// Unprivileged mode: entries of other users that do not conform, left as they are for a
    /// privileged run (in `check`: that would be left).
    pub foreign_owned: u64,
    /// The first [`MAX_LISTED_FOREIGN`] of them.
    pub foreign_owned_list: Vec<ForeignEntry>,
    /// Of those, directories this user may not read: their contents were not checked.
    pub foreign_unread_dirs: u64,
    /// Directories read with `getdents` (0 when the walk was skipped).
    pub dirs_read: u64,
    /// Top-level subtrees an interrupted run had finished, not read again.
    pub skipped_subtrees: u64,
    /// Directories of those subtrees listed to verify they did not change since (their files
    /// not looked at); a changed one is read and counted in `entries` like any other.
    #[serde(default)]
    pub verified_dirs: u64,
    /// Non-directory entries whose inode has more than one link (each name counted): changing
    /// one changes every name of the inode, maybe outside the volume.
    pub hardlinked: u64,
    pub elapsed_ms: u64,
    pub entries_per_s: u64,
    /// `I/N` for a sharded pass.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shard: Option<String>,
    /// What `--sticky` found and did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sticky: Option<StickyOutcome>,
    /// The error that stopped this volume before or during its walk.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fatal: Option<String>,
    /// The signal (`SIGTERM`, `SIGINT`) that stopped the walk early.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub interrupted: Option<String>,
}

impl VolumeReport {
    #[cfg(test)]
    fn sample(path: &str, errors: u64) -> Self {
        let spec = crate::spec::Spec::group(1);
        let mut v = Self::empty(Path::new(path), &spec, 1, Action::Walked);
        v.errors = errors;
        v
    }

    /// A volume that could not be walked at all.
    pub fn failed(path: &Path, spec: &crate::spec::Spec, threads: usize, err: &Error) -> Self {
        VolumeReport { fatal: Some(err.to_string()), ..Self::empty(path, spec, threads, Action::Failed) }
    }

    /// A report with every count at zero.
    pub fn empty(path: &Path, spec: &crate::spec::Spec, threads: usize, action: Action) -> Self {
        VolumeReport {
            path: Escaped(path.as_os_str()).to_string(),
            action,
            spec: spec.to_string(),
            spec_digest: spec.digest(),
            threads,
            fs_type: String::new(),
            estimated_entries: None,
            reason: String::new(),
            marker_before: String::new(),
            marker_after: String::new(),
            entries: 0,
            dirs: 0,
            files: 0,
            symlinks: 0,
            others: 0,
            changed_owner: 0,
            changed_mode: 0,
            errors: 0,
            error_list: Vec::new(),
            skipped_mounts: Vec::new(),
            unprivileged: false,
            foreign_owned: 0,
            foreign_owned_list: Vec::new(),
            foreign_unread_dirs: 0,
            dirs_read: 0,
            skipped_subtrees: 0,
            verified_dirs: 0,
            hardlinked: 0,
            elapsed_ms: 0,
            entries_per_s: 0,
            shard: None,
            sticky: None,
            fatal: None,
            interrupted: None,
        }
    }

    /// `check` found entries that `apply` would change.
    pub fn would_change(&self) -> bool {
        self.action == Action::Checked && self.changed_owner + self.changed_mode > 0
    }

    /// An unprivileged pass left (or, in `check`, would leave) entries of other users that do not
    /// conform: a privileged run is needed.
    pub fn left_foreign(&self) -> bool {
        matches!(self.action, Action::Walked | Action::Checked) && self.foreign_owned > 0
    }

    /// The exit code this volume alone asks for, with `max_errors` tolerated, and entries of
    /// other users left too when `allow_foreign`.
    pub fn exit_code(&self, max_errors: u64, allow_foreign: bool) -> ExitCode {
        let partial = self.left_foreign() && !allow_foreign;
        ExitCode::for_volume(self.fatal.is_some(), self.errors, max_errors, partial, self.would_change())
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
            return format!("{}: skipped ({}) in {}ms", self.path, self.reason, self.elapsed_ms);
        }
        // "prepared" only when every entry conforms: with any error (tolerated or not) some may not.
        let stopped;
        let (verb, changed) = match (&self.interrupted, self.action) {
            (Some(sig), action) => {
                let mode = if action == Action::Checked { "would change" } else { "changed" };
                stopped = format!("stopped by {sig} after");
                (stopped.as_str(), mode)
            }
            (None, Action::Checked) => ("checked", "would change"),
            _ if self.errors > 0 || self.foreign_owned > 0 => ("walked", "changed"),
            _ => ("prepared", "changed"),
        };
        let mut s = format!(
            "{}: {verb} {} entries in {:.2}s ({}/s): {changed} owner {}, mode {}",
            self.path,
            self.entries,
            self.elapsed_ms as f64 / 1000.0,
            self.entries_per_s,
            self.changed_owner,
            self.changed_mode,
        );
        if !self.skipped_mounts.is_empty() {
            s += &format!(", skipped {} nested mount(s): {}", self.skipped_mounts.len(), self.skipped_mounts.join(" "));
        }
        if self.skipped_subtrees > 0 {
            s += &format!(
                ", {} finished subtree(s) resumed past ({} of their directories verified unchanged)",
                self.skipped_subtrees, self.verified_dirs
            );
        }
        if self.foreign_owned > 0 {
            let verb = if self.action == Action::Checked { "would leave" } else { "left" };
            s += &format!(
                ", {verb} {} entries of other users that do not conform (a privileged run fixes them)",
                self.foreign_owned
            );
        }
        s += &format!(", {} error(s)", self.errors);
        if self.interrupted.is_some() && self.action == Action::Walked {
            s += "; the next start resumes";
        }
        s
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
            line += &format!(" (first: {} {} {})", e.path, e.op, e.errno);
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
    write_file(dest, &json)
        .map_err(|why| Error::Other { path: dest.to_path_buf(), msg: format!("cannot write report: {why}") })
}

/// Writes `bytes` to stdout. A reader that went away (`volprep status --json | grep -q ...`,
/// EPIPE) is no error: nobody wants the rest.
pub fn print(bytes: &[u8]) -> Result<(), Error> {
    let mut out = std::io::stdout().lock();
    match out.write_all(bytes).and_then(|()| out.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
            Err(Error::Other { path: "-".into(), msg: format!("cannot write to stdout: {e}") })
        }
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
        for (a, b) in [
            (&mut m.entries, v.entries),
            (&mut m.dirs, v.dirs),
            (&mut m.files, v.files),
            (&mut m.symlinks, v.symlinks),
            (&mut m.others, v.others),
            (&mut m.changed_owner, v.changed_owner),
            (&mut m.changed_mode, v.changed_mode),
            (&mut m.errors, v.errors),
            (&mut m.dirs_read, v.dirs_read),
            (&mut m.skipped_subtrees, v.skipped_subtrees),
            (&mut m.verified_dirs, v.verified_dirs),
            (&mut m.hardlinked, v.hardlinked),
            (&mut m.foreign_owned, v.foreign_owned),
            (&mut m.foreign_unread_dirs, v.foreign_unread_dirs),
        ] {
            // Reports are files anyone may have edited: a sum past u64 stays at the maximum.
            *a = a.saturating_add(b);
        }
        m.elapsed_ms = m.elapsed_ms.max(v.elapsed_ms);
        m.error_list.extend(v.error_list);
        m.error_list.truncate(MAX_LISTED_ERRORS);
        m.skipped_mounts.extend(v.skipped_mounts);
        m.foreign_owned_list.extend(v.foreign_owned_list);
        m.foreign_owned_list.truncate(MAX_LISTED_FOREIGN);
        m.unprivileged |= v.unprivileged;
        if v.marker_after == "done" {
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
        v.foreign_owned = 3;
        assert!(v.left_foreign());
        let s = v.summary();
        assert!(s.starts_with("/a: walked 0 entries"), "not 'prepared' with entries left: {s}");
        assert!(s.contains("left 3 entries of other users"), "{s}");
        v.action = Action::Skipped;
        assert!(!v.left_foreign(), "a skip walked nothing");
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
