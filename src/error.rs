//! Typed errors (each carries the path and the failed operation) and the documented exit codes.

use std::fmt;
use std::path::PathBuf;

use rustix::io::Errno;

use crate::escape::Escaped;
use crate::state::Stop;

/// The process exit codes volprep documents (README "Exit codes", docs/reference.md). Ordered
/// by severity, which is not the number: the order [`ExitCode::merge`] keeps the most severe of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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
    /// The storage ignores ownership changes (they report success and change nothing) or
    /// refuses them to a root that may make them (NFS root_squash): the pass stopped; the
    /// group must come from the mount options or the CSI driver.
    OwnershipIgnored = 6,
    /// Stopped by SIGINT (128 + 2): the walk stopped, the checkpoint and report were written.
    Interrupted = 130,
    /// Stopped by SIGTERM (128 + 15, what a shell reports for a process SIGTERM ended): the walk
    /// stopped, the checkpoint, report and termination message were written.
    Terminated = 143,
}

impl ExitCode {
    /// Least severe first: success, "would change", partial, refused, failure, storage that
    /// ignores ownership, usage, SIGINT, SIGTERM. A signal wins over everything (the run was stopped), a usage error over a failure.
    const SEVERITY: [ExitCode; 9] = [
        ExitCode::Success,
        ExitCode::WouldChange,
        ExitCode::Partial,
        ExitCode::Refused,
        ExitCode::Failure,
        ExitCode::OwnershipIgnored,
        ExitCode::Usage,
        ExitCode::Interrupted,
        ExitCode::Terminated,
    ];

    fn severity(self) -> usize {
        Self::SEVERITY.iter().position(|c| *c == self).expect("every code has a severity")
    }

    /// The code of a run made of several outcomes: the most severe wins.
    pub fn merge(codes: impl IntoIterator<Item = ExitCode>) -> ExitCode {
        codes.into_iter().max().unwrap_or(ExitCode::Success)
    }
}

impl Ord for ExitCode {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.severity().cmp(&other.severity())
    }
}

impl PartialOrd for ExitCode {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

/// What one volume's exit code depends on.
#[derive(Debug, Clone, Copy, Default)]
pub struct VolumeOutcome {
    /// A signal stopped its pass, or its wait before the pass.
    pub stopped: Option<Stop>,
    /// Its storage ignores (or refuses) ownership changes.
    pub ownership_ignored: bool,
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
    /// The code of a run stopped by `sig`: 130 or 143.
    pub fn stopped(sig: Stop) -> ExitCode {
        match sig {
            Stop::Int => ExitCode::Interrupted,
            Stop::Term => ExitCode::Terminated,
        }
    }

    /// The code one volume's outcome stands for: the signal's when a signal stopped it, failure when it could not be prepared or had more
    /// per-entry errors than tolerated, partial when entries of other users were left (or would
    /// be) for a privileged run, "would change" when `check` found work, else success.
    pub fn for_volume(o: VolumeOutcome) -> ExitCode {
        if let Some(sig) = o.stopped {
            ExitCode::stopped(sig)
        } else if o.ownership_ignored {
            ExitCode::OwnershipIgnored
        } else if o.fatal || o.errors > o.max_errors {
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

/// Every error volprep reports. `Display` prints one line naming the path and the cause; the
/// exit code it stands for is [`Error::exit_code`]'s. A caller matches the variant, never the
/// text.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A syscall failed on a path.
    #[error("{}: {op} failed: {}", Escaped(path.as_os_str()), errno_text(errno.raw_os_error()))]
    Sys { path: PathBuf, op: Op, errno: Errno },
    /// A volume root that is not a directory.
    #[error("{}: not a directory", Escaped(path.as_os_str()))]
    NotADirectory { path: PathBuf },
    /// A volume root named by a symlink, for a command that opens only the root itself
    /// (`clear`): the link is never followed.
    #[error("{}: is a symlink; refusing to follow it (name the volume's directory itself)", Escaped(path.as_os_str()))]
    RootIsSymlink { path: PathBuf },
    /// `clear` on a root whose special-bit records still name files an interrupted pass left
    /// without their setuid or setgid bit: removing them would forget which.
    #[error(
        "{}: holds {count} special-bit record(s) of an interrupted pass (setuid/setgid bits cleared between chown and chmod, first: {first}); run `volprep apply` on it to restore them first, or `volprep clear --discard-pending` to drop the records; nothing was removed",
        Escaped(path.as_os_str())
    )]
    PendingRecords { path: PathBuf, count: usize, first: String },
    /// The command line is inconsistent, or asks for what this machine does not allow.
    #[error("{0}")]
    Usage(String),
    /// The environment failed the run: a resource it needs could not be had (threads).
    #[error("{0}")]
    Environment(String),
    /// The volume lock stayed taken for `--lock-timeout`; `holder` says by whom, as far as
    /// this host can tell.
    #[error("{}: {holder}; gave up after {waited_s}s (--lock-timeout)", Escaped(path.as_os_str()))]
    LockTimeout { path: PathBuf, holder: String, waited_s: u64 },
    /// SIGTERM or SIGINT came while waiting for the volume lock.
    #[error("{}: {sig} while waiting for the volume lock ({holder})", Escaped(path.as_os_str()))]
    StoppedWaitingForLock { path: PathBuf, sig: Stop, holder: String },
    /// SIGTERM or SIGINT came before shard `shard` (`I/N`) started walking.
    #[error("{}: shard {shard}: {sig} before walking", Escaped(path.as_os_str()))]
    ShardStopped { path: PathBuf, shard: String, sig: Stop },
    /// Shard `shard` waited for its turn for `--lock-timeout`; `why` it had to wait.
    #[error("{}: shard {shard}: {why}; gave up (--lock-timeout)", Escaped(path.as_os_str()))]
    ShardTimeout { path: PathBuf, shard: String, why: String },
    /// A sharded pass on a root without extended attributes.
    #[error("{}: a sharded pass needs extended attributes: the root marker is where shards meet", Escaped(path.as_os_str()))]
    ShardsNeedXattrs { path: PathBuf },
    /// The sharded marker a shard walked under was gone when it came to record its part.
    #[error("{}: the shard marker vanished during the walk", Escaped(path.as_os_str()))]
    ShardMarkerVanished { path: PathBuf },
    /// A run of another spec took the volume over while this shard walked.
    #[error("{}: another spec took over the volume during the walk", Escaped(path.as_os_str()))]
    SpecTookOver { path: PathBuf },
    /// A sharded pass could not write its record on the root (`why`: the errno and the root's
    /// own cause); nothing was changed.
    #[error("{}: cannot write the shard marker: {why}; nothing was changed", Escaped(path.as_os_str()))]
    MarkerRefused { path: PathBuf, why: String },
    /// The marker could not be written (`why`) nor the `done` marker of another spec (`spec`,
    /// as the marker words it) removed: a walk would leave it claiming a volume it changed.
    /// Nothing was changed.
    #[error("{}: cannot replace the done marker of spec '{spec}': {why}; nothing was changed", Escaped(path.as_os_str()))]
    MarkerStuck { path: PathBuf, spec: crate::escape::Untrusted, why: String },
    /// A panic in a volume's pass: that volume fails, the others go on.
    #[error("{}: internal error: {panic}", Escaped(path.as_os_str()))]
    Internal { path: PathBuf, panic: String },
    /// A `--sticky` path reached through a symlink (`at`): it is resolved without following links.
    #[error(
        "{}: is a symlink: --sticky {} is resolved without following links, so a link planted in a parent can't redirect it",
        Escaped(at.as_os_str()),
        Escaped(path.as_os_str())
    )]
    StickyParentIsSymlink { at: PathBuf, path: PathBuf },
    /// A `--sticky` path that is itself a symlink.
    #[error("{}: is a symlink; refusing to make its target a shared temp dir", Escaped(path.as_os_str()))]
    StickyIsSymlink { path: PathBuf },
    /// A `--sticky` path whose last component names no directory (`..`, `/`).
    #[error("{}: names no directory to make a temp dir of", Escaped(path.as_os_str()))]
    StickyNamesNoDir { path: PathBuf },
    /// `demo`'s new temp dir was not the directory it made by the time it was opened.
    #[error("{}: was replaced right after mkdir", Escaped(path.as_os_str()))]
    TempDirReplaced { path: PathBuf },
    /// `demo` found every random temp dir name it drew in `path` taken.
    #[error("{}: {tries} random temp dir names were all taken", Escaped(path.as_os_str()))]
    TempNamesTaken { path: PathBuf, tries: u32 },
    /// A report file (`report merge`) that could not be read.
    #[error("{}: cannot read: {why}", Escaped(path.as_os_str()))]
    ReportUnreadable { path: PathBuf, why: String },
    /// A file (`report merge`) that is no volprep report.
    #[error("{}: not a volprep report: {why}", Escaped(path.as_os_str()))]
    NotAReport { path: PathBuf, why: String },
    /// The report (`--report FILE`) could not be written.
    #[error("{}: cannot write report: {why}", Escaped(path.as_os_str()))]
    ReportUnwritable { path: PathBuf, why: String },
    /// Standard output could not be written (other than a reader that went away).
    #[error("-: cannot write to stdout: {why}")]
    Stdout { why: String },
    /// The shard record of a round of `shards` (`bytes` long) does not fit in the root's
    /// extended attributes (`errno`); `on_1k` shards fit on ext4 with 1 KiB blocks, `max` with
    /// 4 KiB blocks.
    #[error(
        "{}: a round of {shards} shards does not fit in the root's extended attributes ({}: the shard record takes {bytes} bytes, one per shard and about 50 per running shard); use fewer shards (ext4 with 1 KiB blocks holds up to {on_1k} shards, with 4 KiB blocks up to {max})",
        Escaped(path.as_os_str()),
        errno_text(errno.raw_os_error())
    )]
    ShardRoundTooBig { path: PathBuf, shards: u32, errno: Errno, bytes: usize, on_1k: u32, max: u32 },
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
    pub fn sys(path: impl Into<PathBuf>, op: Op, errno: Errno) -> Error {
        Error::Sys { path: path.into(), op, errno }
    }

    /// A panic of `path`'s pass, with the message it was raised with.
    pub fn internal(path: impl Into<PathBuf>, payload: &(dyn std::any::Any + Send)) -> Error {
        Error::Internal { path: path.into(), panic: panic_text(payload) }
    }

    /// The signal this error carries: a wait (for the volume's lock, for a shard) that a signal
    /// ended.
    pub fn stop(&self) -> Option<Stop> {
        match self {
            Error::StoppedWaitingForLock { sig, .. } | Error::ShardStopped { sig, .. } => Some(*sig),
            _ => None,
        }
    }

    /// The exit code this error stands for when it stops the run, one rule for every variant:
    /// one that carries a signal ([`Error::stop`]: a wait the signal ended) exits with the
    /// signal's code (130, 143), a usage error 2, every other error 1.
    pub fn exit_code(&self) -> ExitCode {
        match (self.stop(), self) {
            (Some(sig), _) => ExitCode::stopped(sig),
            (None, Error::Usage(_)) => ExitCode::Usage,
            (None, _) => ExitCode::Failure,
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
        assert_eq!(ExitCode::merge([Failure, OwnershipIgnored, Partial]), OwnershipIgnored);
        assert_eq!(ExitCode::merge([OwnershipIgnored, Usage]), Usage);
        assert_eq!(OwnershipIgnored as u8, 6);
        assert_eq!(ExitCode::merge([Refused, Partial]), Refused);
        assert_eq!(ExitCode::merge([Refused, Failure]), Failure);
    }

    #[test]
    fn the_order_is_the_merge_precedence_and_every_pair_merges_to_its_max() {
        let all = ExitCode::SEVERITY;
        assert!(all.windows(2).all(|w| w[0] < w[1]), "strictly increasing severity");
        for a in all {
            for b in all {
                assert_eq!(ExitCode::merge([a, b]), a.max(b), "{a:?} {b:?}");
                assert_eq!(ExitCode::merge([a, b]), ExitCode::merge([b, a]));
            }
        }
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
        let ignored = VolumeOutcome { ownership_ignored: true, fatal: true, errors: 8, ..clean };
        assert_eq!(code(ignored), ExitCode::OwnershipIgnored);
    }

    #[test]
    fn an_environment_failure_is_no_usage_error() {
        assert_eq!(Error::Environment("cannot start 4 threads: x".into()).exit_code(), ExitCode::Failure);
        assert_eq!(Error::Usage("--shard 3/2".into()).exit_code(), ExitCode::Usage);
    }

    #[test]
    fn a_wait_a_signal_ended_exits_with_the_signals_code() {
        let p = || PathBuf::from("/v");
        let lock = Error::StoppedWaitingForLock { path: p(), sig: Stop::Term, holder: "h".into() };
        assert_eq!((lock.stop(), lock.exit_code()), (Some(Stop::Term), ExitCode::Terminated));
        let shard = Error::ShardStopped { path: p(), shard: "1/4".into(), sig: Stop::Int };
        assert_eq!((shard.stop(), shard.exit_code()), (Some(Stop::Int), ExitCode::Interrupted));
        assert_eq!(Error::LockTimeout { path: p(), holder: "h".into(), waited_s: 1 }.stop(), None);
        let stopped = VolumeOutcome { stopped: Some(Stop::Term), fatal: true, ..Default::default() };
        assert_eq!(ExitCode::for_volume(stopped), ExitCode::Terminated, "the signal wins over the failure");
    }

    #[test]
    fn errnos_are_spelled_by_name_number_or_dash() {
        for (e, w) in [(Some(Errno::PERM), "EPERM"), (Some(Errno::from_raw_os_error(4000)), "4000"), (None, "-")] {
            assert_eq!((errno_word::word(e), errno_word::parse(w)), (w.to_string(), e));
        }
    }

    #[test]
    fn each_variant_prints_its_one_line() {
        let p = || PathBuf::from("/v");
        let holder = || "another volprep (pid 42) is preparing this volume".to_string();
        for (e, line) in [
            (
                Error::LockTimeout { path: p(), holder: holder(), waited_s: 30 },
                "/v: another volprep (pid 42) is preparing this volume; gave up after 30s (--lock-timeout)",
            ),
            (
                Error::StoppedWaitingForLock { path: p(), sig: Stop::Term, holder: holder() },
                "/v: SIGTERM while waiting for the volume lock (another volprep (pid 42) is preparing this volume)",
            ),
            (
                Error::ShardStopped { path: p(), shard: "1/4".into(), sig: Stop::Int },
                "/v: shard 1/4: SIGINT before walking",
            ),
            (
                Error::ShardsNeedXattrs { path: p() },
                "/v: a sharded pass needs extended attributes: the root marker is where shards meet",
            ),
            (Error::internal("/v", &"boom"), "/v: internal error: boom"),
            (
                Error::MarkerStuck {
                    path: p(),
                    spec: "fs-group=1\n".into(),
                    why: "Operation not permitted (EPERM)".into(),
                },
                "/v: cannot replace the done marker of spec 'fs-group=1\\n': Operation not permitted (EPERM); nothing was changed",
            ),
            (
                Error::StickyParentIsSymlink { at: "/l".into(), path: "/l/tmp".into() },
                "/l: is a symlink: --sticky /l/tmp is resolved without following links, so a link planted in a parent can't redirect it",
            ),
            (Error::TempNamesTaken { path: "/tmp".into(), tries: 64 }, "/tmp: 64 random temp dir names were all taken"),
            (
                Error::PendingRecords { path: p(), count: 2, first: "a/su".into() },
                "/v: holds 2 special-bit record(s) of an interrupted pass (setuid/setgid bits cleared between \
                 chown and chmod, first: a/su); run `volprep apply` on it to restore them first, or `volprep \
                 clear --discard-pending` to drop the records; nothing was removed",
            ),
            (
                Error::RootIsSymlink { path: "/v/l".into() },
                "/v/l: is a symlink; refusing to follow it (name the volume's directory itself)",
            ),
            (
                Error::Stdout { why: "No space left on device".into() },
                "-: cannot write to stdout: No space left on device",
            ),
        ] {
            assert_eq!(e.to_string(), line);
            let code = e.stop().map_or(ExitCode::Failure, ExitCode::stopped);
            assert_eq!(e.exit_code(), code, "{line}");
        }
    }

    #[test]
    fn sys_error_is_one_line_with_path_op_and_errno() {
        let e = Error::sys("/v/a\nb", Op::Chown, Errno::ROFS);
        let s = e.to_string();
        assert_eq!(s, "/v/a\\nb: chown failed: Read-only file system (EROFS)");
        assert!(!s.contains('\n'));
    }
}
