//! `volprep clear`: removes volprep's attributes (the marker first, then its checkpoints and
//! records) from each volume root, under the volume's lock, changing no owner, group or mode;
//! `--dry-run` lists them. Logs a summary line per volume and writes the report.

use std::ffi::CString;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rustix::io::Errno;
use serde::Serialize;

use crate::error::{Error, ExitCode, Op};
use crate::escape::{EscapedPath, escape_bytes};
use crate::marker;
use crate::state::MarkerState;
use crate::{guard, report, sys, volume};

/// Whether `clear` removes the attributes or only says which it would remove.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Clearing {
    Remove,
    /// `--dry-run`: change nothing; exit 3 when something would be removed.
    DryRun,
}

/// What `clear` does with special-bit records (setuid/setgid bits a killed pass cleared and a
/// later pass restores): by default a volume that has some is left as it is (exit 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PendingRecords {
    Refuse,
    /// `--discard-pending`: removed with the rest.
    Discard,
}

/// What `clear` was asked, as plain values.
#[derive(Debug, Clone)]
pub struct Options {
    pub clearing: Clearing,
    pub pending: PendingRecords,
    /// How long to wait for the volume's lock (another volprep preparing it).
    pub lock_timeout: Duration,
    /// Where the JSON report goes ('-': stdout).
    pub report: Option<PathBuf>,
    /// Volume roots.
    pub paths: Vec<PathBuf>,
}

/// What became of one volume.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Action {
    /// Its attributes were removed.
    Cleared,
    /// `--dry-run`: it has attributes `clear` would remove.
    WouldClear,
    /// It has none of volprep's attributes (or its filesystem has no user xattrs).
    Nothing,
    /// It could not be cleared (or looked at): `fatal` says why.
    Failed,
}

impl Action {
    /// The word the report and the log use.
    pub fn name(self) -> &'static str {
        match self {
            Action::Cleared => "cleared",
            Action::WouldClear => "would-clear",
            Action::Nothing => "nothing",
            Action::Failed => "failed",
        }
    }
}

/// One volume in the report. Key names are a stable interface.
#[derive(Debug, Clone, Serialize)]
pub struct Cleared {
    pub path: EscapedPath,
    pub action: Action,
    /// What the marker said before (`unsupported`: no user xattrs there).
    pub marker_before: MarkerState,
    /// volprep's attributes found, in the order they are removed (escaped): removed, or with
    /// `--dry-run` to be removed. On a failure, those removed before it.
    pub attributes: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fatal: Option<String>,
    pub elapsed_ms: u64,
}

/// The JSON report of `clear`: `{"version":1,"command":"clear","volumes":[...]}`.
#[derive(Debug, Serialize)]
struct Report<'a> {
    version: u32,
    command: &'static str,
    volumes: &'a [Cleared],
}

pub fn run(o: &Options) -> Result<ExitCode, Error> {
    let areas: Vec<&Path> = o.paths.iter().map(PathBuf::as_path).collect();
    if let Some(dest) = &o.report {
        guard::output_file("--report", dest, &areas)?;
    }
    // SIGTERM and SIGINT end a wait for a lock with their exit code.
    sys::catch_termination();
    let mut codes = Vec::new();
    let mut volumes = Vec::new();
    for path in &o.paths {
        let started = Instant::now();
        let (v, code) = match one(path, o) {
            Ok(v) => {
                let code = if v.action == Action::WouldClear { ExitCode::WouldChange } else { ExitCode::Success };
                (v, code)
            }
            Err((e, attributes)) => (failed(path, &e, attributes), e.exit_code()),
        };
        let v = Cleared { elapsed_ms: started.elapsed().as_millis() as u64, ..v };
        log_summary(&v);
        volumes.push(v);
        codes.push(code);
    }
    if let Some(dest) = &o.report {
        let r = Report { version: 1, command: "clear", volumes: &volumes };
        let mut json = serde_json::to_vec_pretty(&r).expect("report serializes");
        json.push(b'\n');
        if crate::options::is_stdout(dest) {
            report::print(&json)?;
        } else {
            report::write_file(dest, &json).map_err(|why| Error::ReportUnwritable { path: dest.to_path_buf(), why })?;
        }
    }
    Ok(ExitCode::merge(codes))
}

/// A volume's error, with the attributes removed before it.
type Failure = (Error, Vec<String>);

/// Clears (or looks at) one volume: opens its root (never through a symlink), takes its lock
/// (not for `--dry-run`), lists volprep's attributes and removes them in order.
fn one(path: &Path, o: &Options) -> Result<Cleared, Failure> {
    let root_fd = open(path).map_err(|e| (e, Vec::new()))?;
    let root = sys::fd(&root_fd);
    if o.clearing == Clearing::Remove {
        volume::lock(root, path, o.lock_timeout).map_err(|e| (e, Vec::new()))?;
    }
    // Read after the lock: what a pass that held it left.
    let found = marker::read(root);
    let names = match marker::list_ours(root) {
        Ok(names) => names,
        Err(Errno::OPNOTSUPP) => Vec::new(),
        Err(e) => return Err((Error::sys(path, Op::Xattr, e), Vec::new())),
    };
    if o.pending == PendingRecords::Refuse {
        refuse_pending(root, path, &names).map_err(|e| (e, Vec::new()))?;
    }
    let shown = |names: &[CString]| names.iter().map(|n| escape_bytes(n.to_bytes())).collect::<Vec<_>>();
    let action = match (names.is_empty(), o.clearing) {
        (true, _) => Action::Nothing,
        (false, Clearing::DryRun) => Action::WouldClear,
        (false, Clearing::Remove) => {
            remove(root, &names).map_err(|(done, e)| (Error::sys(path, Op::Xattr, e), shown(&names[..done])))?;
            Action::Cleared
        }
    };
    Ok(Cleared {
        path: EscapedPath::new(path),
        action,
        marker_before: found.state(),
        attributes: shown(&names),
        fatal: None,
        elapsed_ms: 0,
    })
}

/// Fails when the special-bit records among `names` (the pending records and the checkpoints,
/// which held them in earlier formats) name any file.
fn refuse_pending(root: BorrowedFd<'_>, path: &Path, names: &[CString]) -> Result<(), Error> {
    let mut records = Vec::new();
    for name in names {
        let n = name.to_bytes();
        if n.starts_with(marker::PENDING_XATTR.to_bytes()) {
            records.extend(marker::read_pending(root, name).map(|p| p.pending).unwrap_or_default());
        } else if n.starts_with(marker::CHECKPOINT_XATTR.to_bytes()) {
            records.extend(marker::read_checkpoint(root, name).map(|c| c.pending).unwrap_or_default());
        }
    }
    match records.first() {
        None => Ok(()),
        Some(r) => Err(Error::PendingRecords { path: path.to_path_buf(), count: records.len(), first: r.path.clone() }),
    }
}

/// Opens the volume root itself: a symlink there is refused, never followed.
fn open(path: &Path) -> Result<OwnedFd, Error> {
    sys::open_root_refusing_symlink(path).map_err(|b| match b {
        sys::Blocked::Symlink { .. } => Error::RootIsSymlink { path: path.to_path_buf() },
        sys::Blocked::Failed { errno: Errno::NOTDIR, .. } => Error::NotADirectory { path: path.to_path_buf() },
        sys::Blocked::Failed { errno, .. } => Error::sys(path, Op::Open, errno),
    })
}

/// Removes `names` in order; on a failure, how many were removed and the errno.
fn remove(root: BorrowedFd<'_>, names: &[CString]) -> Result<(), (usize, Errno)> {
    for (i, name) in names.iter().enumerate() {
        marker::remove_ours(root, name).map_err(|e| (i, e))?;
    }
    Ok(())
}

/// The report entry of a volume that failed with `e`.
fn failed(path: &Path, e: &Error, attributes: Vec<String>) -> Cleared {
    Cleared {
        path: EscapedPath::new(path),
        action: Action::Failed,
        marker_before: MarkerState::Unknown,
        attributes,
        fatal: Some(e.to_string()),
        elapsed_ms: 0,
    }
}

/// The summary line of one volume (what it had, what became of it).
pub fn summary(v: &Cleared) -> String {
    let list = v.attributes.join(", ");
    let n = v.attributes.len();
    match v.action {
        Action::Cleared => format!("{}: removed {n} volprep attribute(s): {list}", v.path),
        Action::WouldClear => format!("{}: would remove {n} volprep attribute(s): {list}", v.path),
        Action::Nothing if v.marker_before == MarkerState::Unsupported => {
            format!("{}: nothing to clear (the filesystem has no user xattrs)", v.path)
        }
        Action::Nothing => format!("{}: nothing to clear (no volprep attributes)", v.path),
        Action::Failed => {
            let fatal = v.fatal.as_deref().unwrap_or_default();
            if n == 0 { fatal.to_string() } else { format!("{fatal} (removed before: {list})") }
        }
    }
}

fn log_summary(v: &Cleared) {
    let action = v.action.name();
    macro_rules! summary {
        ($level:expr) => {
            tracing::event!(
                $level,
                path = v.path.as_str(),
                action,
                attributes = v.attributes.len(),
                marker = v.marker_before.name(),
                elapsed_ms = v.elapsed_ms,
                "{}",
                summary(v)
            )
        };
    }
    if v.action == Action::Failed { summary!(tracing::Level::ERROR) } else { summary!(tracing::Level::INFO) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cleared(action: Action, before: MarkerState, attributes: &[&str]) -> Cleared {
        Cleared {
            path: EscapedPath::new("/v"),
            action,
            marker_before: before,
            attributes: attributes.iter().map(|s| s.to_string()).collect(),
            fatal: None,
            elapsed_ms: 0,
        }
    }

    #[test]
    fn each_outcome_has_its_line_and_report_word() {
        let two = ["user.volprep", "user.volprep.checkpoint"];
        let cases = [
            (
                cleared(Action::Cleared, MarkerState::Done, &two),
                "/v: removed 2 volprep attribute(s): user.volprep, user.volprep.checkpoint",
            ),
            (
                cleared(Action::WouldClear, MarkerState::InProgress, &two[..1]),
                "/v: would remove 1 volprep attribute(s): user.volprep",
            ),
            (cleared(Action::Nothing, MarkerState::None, &[]), "/v: nothing to clear (no volprep attributes)"),
            (
                cleared(Action::Nothing, MarkerState::Unsupported, &[]),
                "/v: nothing to clear (the filesystem has no user xattrs)",
            ),
        ];
        for (v, line) in cases {
            assert_eq!(summary(&v), line);
            assert_eq!(serde_json::to_value(&v).unwrap()["action"], v.action.name(), "report and log say one word");
        }
        let e = Error::sys("/v", Op::Xattr, Errno::PERM);
        let f = failed(Path::new("/v"), &e, vec!["user.volprep".into()]);
        assert_eq!(summary(&f), "/v: xattr failed: Operation not permitted (EPERM) (removed before: user.volprep)");
        let json = serde_json::to_value(&f).unwrap();
        assert_eq!((json["action"].as_str(), json["marker_before"].as_str()), (Some("failed"), Some("")));
        let json = serde_json::to_value(cleared(Action::WouldClear, MarkerState::Done, &two)).unwrap();
        assert_eq!(json["action"], "would-clear");
        assert!(json.get("fatal").is_none(), "{json}");
    }
}
