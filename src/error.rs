//! Typed errors (each carries the path and the failed operation) and the documented exit codes.

use std::fmt;
use std::path::PathBuf;

use crate::escape::Escaped;

/// The process exit codes volprep documents (README "Exit codes").
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

impl ExitCode {
    /// The code one volume's outcome stands for: failure when it could not be prepared or had more
    /// per-entry errors than tolerated, partial when entries of other users were left (or would
    /// be) for a privileged run, "would change" when `check` found work, else success.
    pub fn for_volume(fatal: bool, errors: u64, max_errors: u64, left_foreign: bool, would_change: bool) -> ExitCode {
        if fatal || errors > max_errors {
            ExitCode::Failure
        } else if left_foreign {
            ExitCode::Partial
        } else if would_change {
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
    /// The command line or environment is inconsistent.
    #[error("{0}")]
    Usage(String),
    /// Anything else that stops a volume, with its path.
    #[error("{}: {msg}", Escaped(path.as_os_str()))]
    Other { path: PathBuf, msg: String },
}

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

/// The symbolic name of the errnos a pass meets, for reports ("EPERM").
pub fn errno_name(errno: i32) -> Option<&'static str> {
    Some(match errno {
        libc::EPERM => "EPERM",
        libc::ENOENT => "ENOENT",
        libc::EIO => "EIO",
        libc::EACCES => "EACCES",
        libc::EBUSY => "EBUSY",
        libc::EEXIST => "EEXIST",
        libc::ENOTDIR => "ENOTDIR",
        libc::EISDIR => "EISDIR",
        libc::EINVAL => "EINVAL",
        libc::ENFILE => "ENFILE",
        libc::EMFILE => "EMFILE",
        libc::ENOSPC => "ENOSPC",
        libc::EROFS => "EROFS",
        libc::ELOOP => "ELOOP",
        libc::ENAMETOOLONG => "ENAMETOOLONG",
        libc::EOPNOTSUPP => "EOPNOTSUPP",
        libc::ENOSYS => "ENOSYS",
        libc::EXDEV => "EXDEV",
        libc::EDQUOT => "EDQUOT",
        libc::ESTALE => "ESTALE",
        libc::ENODATA => "ENODATA",
        libc::E2BIG => "E2BIG",
        libc::ERANGE => "ERANGE",
        libc::EWOULDBLOCK => "EWOULDBLOCK",
        libc::EINTR => "EINTR",
        libc::ENOMEM => "ENOMEM",
        _ => return None,
    })
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
    fn sys_error_is_one_line_with_path_op_and_errno() {
        let e = Error::Sys { path: "/v/a\nb".into(), op: Op::Chown, errno: libc::EROFS };
        let s = e.to_string();
        assert_eq!(s, "/v/a\\nb: chown failed: Read-only file system (EROFS)");
        assert!(!s.contains('\n'));
    }
}
