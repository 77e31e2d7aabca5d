//! Typed errors (each carries the path and the failed operation) and the documented exit codes.

use std::fmt;
use std::path::PathBuf;

use crate::escape::Escaped;

/// The process exit codes volprep documents (README "Exit codes", docs/reference.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum ExitCode {
    /// Every volume conforms (`apply`), or nothing would change (`check`).
    Success = 0,
    /// A volume could not be prepared: a fatal error at start, or more per-entry errors than `--max-errors`.
    Failure = 1,
    /// Bad command line or environment (clap also exits 2).
    Usage = 2,
    /// `check` found entries that `apply` would change.
    WouldChange = 3,
    /// Unprivileged mode: every entry this user owns conforms (or would), but entries owned by
    /// other users do not and were left as they are: a privileged run is needed.
    Partial = 4,
    /// `inject --strict`: a workload was left unchanged because the rewrite would change what
    /// the app may read or do; nothing was written.
    Refused = 5,
    /// Stopped by SIGINT (128 + 2): the walk stopped, the checkpoint and report were written.
    Interrupted = 130,
    /// Stopped by SIGTERM (128 + 15, what a shell reports for a process SIGTERM ended): the walk
    /// stopped, the checkpoint, report and termination message were written.
    Terminated = 143,
}

impl ExitCode {
    /// The code of a run made of several outcomes: the most severe wins
    /// (failure over partial over "would change" over success).
    pub fn merge(codes: impl IntoIterator<Item = ExitCode>) -> ExitCode {
        codes.into_iter().fold(ExitCode::Success, |acc, c| match (acc, c) {
            (ExitCode::Terminated, _) | (_, ExitCode::Terminated) => ExitCode::Terminated,
            (ExitCode::Interrupted, _) | (_, ExitCode::Interrupted) => ExitCode::Interrupted,
            (ExitCode::Usage, _) | (_, ExitCode::Usage) => ExitCode::Usage,
            (ExitCode::Failure, _) | (_, ExitCode::Failure) => ExitCode::Failure,
            (ExitCode::Refused, _) | (_, ExitCode::Refused) => ExitCode::Refused,
            (ExitCode::Partial, _) | (_, ExitCode::Partial) => ExitCode::Partial,
            (ExitCode::WouldChange, _) | (_, ExitCode::WouldChange) => ExitCode::WouldChange,
            _ => ExitCode::Success,
        })
    }
}

/// What one volume's exit code depends on.
#[derive(Debug, Clone, Copy, Default)]
pub struct VolumeOutcome {
    /// It could not be prepared at all.
    pub fatal: bool,
    /// Per-entry errors, and how many are tolerated (`--max-errors`).
    pub errors: u64,
    pub max_errors: u64,
    /// Entries of other users were left (or would be) for a privileged run, and that is not
    /// allowed (`--allow-foreign`).
    pub left_foreign: bool,
    /// `check` found entries `apply` would change.
    pub would_change: bool,
}

impl ExitCode {
    /// The code one volume's outcome stands for: failure when it could not be prepared or had more
    /// per-entry errors than tolerated, partial when entries of other users were left (or would
    /// be) for a privileged run, "would change" when `check` found work, else success.
    pub fn for_volume(o: VolumeOutcome) -> ExitCode {
        if o.fatal || o.errors > o.max_errors {
            ExitCode::Failure
        } else if o.left_foreign {
            ExitCode::Partial
        } else if o.would_change {
            ExitCode::WouldChange
        } else {
            ExitCode::Success
        }
    }
}

impl From<ExitCode> for std::process::ExitCode {
    fn from(c: ExitCode) -> Self {
        std::process::ExitCode::from(c as u8)
    }
}

/// The syscall-level operation that failed, as shown in summaries and reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Op {
    Open,
    Stat,
    Readdir,
    Chown,
    Chmod,
    Xattr,
    Lock,
    Mkdir,
    /// Restoring a special bit an interrupted pass cleared.
    Restore,
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = match self {
            Op::Open => "open",
            Op::Stat => "stat",
            Op::Readdir => "readdir",
            Op::Chown => "chown",
            Op::Chmod => "chmod",
            Op::Xattr => "xattr",
            Op::Lock => "lock",
            Op::Mkdir => "mkdir",
            Op::Restore => "restore",
        };
        f.write_str(s)
    }
}

/// Every error volprep reports. `Display` prints one line naming the path and the cause.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A syscall failed on a path.
    #[error("{}: {op} failed: {}", Escaped(path.as_os_str()), errno_text(*errno))]
    Sys { path: PathBuf, op: Op, errno: i32 },
    /// A volume root that is not a directory.
    #[error("{}: not a directory", Escaped(path.as_os_str()))]
    NotADirectory { path: PathBuf },
    /// The command line is inconsistent, or asks for what this machine does not allow.
    #[error("{0}")]
    Usage(String),
    /// The environment failed the run: a resource it needs could not be had (threads).
    #[error("{0}")]
    Environment(String),
    /// Anything else that stops a volume, with its path.
    #[error("{}: {msg}", Escaped(path.as_os_str()))]
    Other { path: PathBuf, msg: String },
    /// `inject` could not read, parse or write back an input.
    #[error("{0}")]
    Inject(InjectError),
}

/// Why `inject` could not rewrite an input (exit 1, nothing written): the input's name, the
/// line and column when the cause has a place, and what went wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InjectError {
    pub source: PathBuf,
    pub line: Option<usize>,
    pub col: Option<usize>,
    pub kind: InjectErrorKind,
}

/// What went wrong with an `inject` input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InjectErrorKind {
    /// It could not be opened or read (the I/O error's text).
    Read { op: &'static str, cause: String },
    /// The inputs together are larger than the limit (MiB).
    TooBig { limit_mib: u64 },
    /// Not UTF-8 from this byte on.
    NotUtf8 { valid_up_to: usize },
    /// The parser's (or the nesting and alias limits') cause.
    NotYaml(String),
    /// A KRM function config it could not use.
    FunctionConfig(String),
    /// A rewritten document could not be written as YAML (e.g. a key spanning lines).
    Unwritable(String),
    /// Writing the result failed.
    Write(String),
}

impl InjectError {
    /// An error of the input as a whole.
    pub fn of(source: impl Into<PathBuf>, kind: InjectErrorKind) -> InjectError {
        InjectError { source: source.into(), line: None, col: None, kind }
    }

    /// An error at a line (and column) of the input.
    pub fn at(source: impl Into<PathBuf>, line: usize, col: Option<usize>, kind: InjectErrorKind) -> InjectError {
        InjectError { source: source.into(), line: Some(line), col, kind }
    }
}

impl fmt::Display for InjectError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", Escaped(self.source.as_os_str()))?;
        if let Some(line) = self.line {
            write!(f, ":{line}")?;
            if let Some(col) = self.col {
                write!(f, ":{col}")?;
            }
        }
        match &self.kind {
            InjectErrorKind::Read { op, cause } => write!(f, ": {op} failed: {cause}"),
            InjectErrorKind::TooBig { limit_mib } => write!(f, ": input over {limit_mib} MiB"),
            InjectErrorKind::NotUtf8 { valid_up_to } => write!(f, ": not UTF-8 (byte {valid_up_to})"),
            InjectErrorKind::NotYaml(cause) => write!(f, ": not YAML: {cause}"),
            InjectErrorKind::FunctionConfig(cause) => write!(f, ": {cause}"),
            InjectErrorKind::Unwritable(cause) => write!(f, ": cannot write the document back: {cause}"),
            InjectErrorKind::Write(cause) => write!(f, ": write failed: {cause}"),
        }
    }
}

impl std::error::Error for InjectError {}

impl Error {
    pub fn sys(path: impl Into<PathBuf>, op: Op, errno: rustix::io::Errno) -> Error {
        Error::Sys { path: path.into(), op, errno: errno.raw_os_error() }
    }

    /// The exit code this error stands for when it stops the run.
    pub fn exit_code(&self) -> ExitCode {
        match self {
            Error::Usage(_) => ExitCode::Usage,
            _ => ExitCode::Failure,
        }
    }
}

/// "Permission denied (EACCES)": the C library's text and the errno's name.
pub fn errno_text(errno: i32) -> String {
    let text = std::io::Error::from_raw_os_error(errno).to_string();
    let text = text.split(" (os error").next().unwrap_or(&text).to_string();
    match errno_name(errno) {
        Some(name) => format!("{text} ({name})"),
        None => text,
    }
}

/// The errnos a pass meets, with their symbolic names.
const ERRNO_NAMES: &[(i32, &str)] = &[
    (libc::EPERM, "EPERM"),
    (libc::ENOENT, "ENOENT"),
    (libc::EIO, "EIO"),
    (libc::EACCES, "EACCES"),
    (libc::EBUSY, "EBUSY"),
    (libc::EEXIST, "EEXIST"),
    (libc::ENOTDIR, "ENOTDIR"),
    (libc::EISDIR, "EISDIR"),
    (libc::EINVAL, "EINVAL"),
    (libc::ENFILE, "ENFILE"),
    (libc::EMFILE, "EMFILE"),
    (libc::ENOSPC, "ENOSPC"),
    (libc::EROFS, "EROFS"),
    (libc::ELOOP, "ELOOP"),
    (libc::ENAMETOOLONG, "ENAMETOOLONG"),
    (libc::EOPNOTSUPP, "EOPNOTSUPP"),
    (libc::ENOSYS, "ENOSYS"),
    (libc::EXDEV, "EXDEV"),
    (libc::EDQUOT, "EDQUOT"),
    (libc::ESTALE, "ESTALE"),
    (libc::ENODATA, "ENODATA"),
    (libc::E2BIG, "E2BIG"),
    (libc::ERANGE, "ERANGE"),
    (libc::EWOULDBLOCK, "EWOULDBLOCK"),
    (libc::EINTR, "EINTR"),
    (libc::ENOMEM, "ENOMEM"),
];

/// The symbolic name of the errnos a pass meets, for reports ("EPERM").
pub fn errno_name(errno: i32) -> Option<&'static str> {
    ERRNO_NAMES.iter().find(|(n, _)| *n == errno).map(|(_, name)| *name)
}

/// How reports spell an errno (`#[serde(with)]`): its name (`EPERM`), its number when it has no
/// name here, `-` for none (a failure that is no failed syscall).
pub mod errno_word {
    use rustix::io::Errno;
    use serde::{Deserialize, Deserializer, Serializer};

    /// `EPERM`, `1234`, `-`.
    pub fn word(errno: Option<Errno>) -> String {
        match errno.map(|e| e.raw_os_error()) {
            None => "-".into(),
            Some(n) => super::errno_name(n).map_or_else(|| n.to_string(), str::to_string),
        }
    }

    /// The errno `word` spells (none for `-` or a word it does not know).
    pub fn parse(word: &str) -> Option<Errno> {
        let by_name = super::ERRNO_NAMES.iter().find(|(_, name)| *name == word).map(|(n, _)| *n);
        by_name.or_else(|| word.parse().ok()).map(Errno::from_raw_os_error)
    }

    pub fn serialize<S: Serializer>(errno: &Option<Errno>, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&word(*errno))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Errno>, D::Error> {
        Ok(parse(&String::deserialize(d)?))
    }
}

/// The message a panic was raised with (`panic!("…")`), for the report and the log.
pub fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    match (payload.downcast_ref::<&str>(), payload.downcast_ref::<String>()) {
        (Some(s), _) => s.to_string(),
        (_, Some(s)) => s.clone(),
        _ => "a panic without a message".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merge_takes_the_most_severe() {
        use ExitCode::*;
        assert_eq!(ExitCode::merge([]), Success);
        assert_eq!(ExitCode::merge([Success, WouldChange]), WouldChange);
        assert_eq!(ExitCode::merge([WouldChange, Failure, Success]), Failure);
        assert_eq!(ExitCode::merge([Failure, Usage]), Usage);
        assert_eq!(ExitCode::merge([WouldChange, Partial, Success]), Partial);
        assert_eq!(ExitCode::merge([Partial, Failure]), Failure);
        assert_eq!(Partial as u8, 4);
        assert_eq!(ExitCode::merge([Failure, Interrupted]), Interrupted);
        assert_eq!(ExitCode::merge([Interrupted, Terminated, Usage]), Terminated);
    }

    #[test]
    fn a_volume_outcome_maps_to_its_code() {
        let clean = VolumeOutcome { max_errors: 2, ..Default::default() };
        let code = |o: VolumeOutcome| ExitCode::for_volume(o);
        assert_eq!(code(clean), ExitCode::Success);
        assert_eq!(code(VolumeOutcome { errors: 2, would_change: true, ..clean }), ExitCode::WouldChange);
        assert_eq!(code(VolumeOutcome { errors: 3, left_foreign: true, ..clean }), ExitCode::Failure);
        assert_eq!(code(VolumeOutcome { left_foreign: true, would_change: true, ..clean }), ExitCode::Partial);
        assert_eq!(code(VolumeOutcome { fatal: true, ..clean }), ExitCode::Failure);
    }

    #[test]
    fn an_environment_failure_is_no_usage_error() {
        assert_eq!(Error::Environment("cannot start 4 threads: x".into()).exit_code(), ExitCode::Failure);
        assert_eq!(Error::Usage("--shard 3/2".into()).exit_code(), ExitCode::Usage);
    }

    #[test]
    fn errnos_are_spelled_by_name_number_or_dash() {
        use rustix::io::Errno;
        for (e, w) in [(Some(Errno::PERM), "EPERM"), (Some(Errno::from_raw_os_error(4000)), "4000"), (None, "-")] {
            assert_eq!((errno_word::word(e), errno_word::parse(w)), (w.to_string(), e));
        }
    }

    #[test]
    fn sys_error_is_one_line_with_path_op_and_errno() {
        let e = Error::Sys { path: "/v/a\nb".into(), op: Op::Chown, errno: libc::EROFS };
        let s = e.to_string();
        assert_eq!(s, "/v/a\\nb: chown failed: Read-only file system (EROFS)");
        assert!(!s.contains('\n'));
    }
}
