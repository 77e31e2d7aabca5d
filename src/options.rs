//! Plain option values shared by `cli` (which fills them) and the pass machinery (which reads
//! them): the mode, when to trust the marker, the thread count, the shard a run owns, how
//! progress shows, who the pass runs as, and [`RunOptions`], which carries them down (with the
//! load policy of `throttle`). No clap, no I/O.

use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::throttle::{Policy, Storage};

/// `apply` changes entries; `check` only decides.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Apply,
    Check,
}

/// `--verify`: when a valid marker is enough.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verify {
    /// Trust a `done` marker for this spec when the root conforms.
    Marker,
    /// Always walk (changing only what differs).
    Full,
}

/// How progress is shown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProgressStyle {
    /// No progress output.
    Off,
    /// A log line every interval (containers, `kubectl logs`).
    Lines(Duration),
    /// A live bar on the terminal.
    Bar,
}

/// `--log-format`: human text (the default), or one JSON object per line. `inject` passes the
/// same words to the init containers it writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

impl LogFormat {
    /// The flag's word for it.
    pub fn as_str(self) -> &'static str {
        match self {
            LogFormat::Text => "text",
            LogFormat::Json => "json",
        }
    }
}

/// Who reads stderr: a person at a terminal with text logs, or a log collector (JSON logs, a
/// container's log, a file).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stderr {
    TextTerminal,
    Log,
}

impl ProgressStyle {
    /// A bar for a person at a terminal, lines for a log; off for a zero interval.
    pub fn pick(interval: Duration, stderr: Stderr) -> ProgressStyle {
        match stderr {
            _ if interval.is_zero() => ProgressStyle::Off,
            Stderr::TextTerminal => ProgressStyle::Bar,
            Stderr::Log => ProgressStyle::Lines(interval),
        }
    }
}

/// What the pass may change. Root with the capabilities the README lists changes any entry; a
/// non-root process (a `restricted` pod), or `--unprivileged`, only the entries it owns: their
/// group (to one of its own groups) and their mode bits, which needs no capability at all.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Privilege {
    /// Every entry may be changed.
    Full,
    /// Only entries owned by `uid` are changed; the others that do not conform are listed for
    /// a privileged run.
    Unprivileged { uid: u32 },
}

/// What the command line asks of the privilege a run has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PrivilegeAsk {
    /// What the effective uid allows.
    AsAllowed,
    /// `--unprivileged`: lowered to the entries this uid owns, even as root.
    Lowered,
}

impl PrivilegeAsk {
    /// `--unprivileged` given or not.
    pub fn from_flag(unprivileged: bool) -> PrivilegeAsk {
        if unprivileged { PrivilegeAsk::Lowered } else { PrivilegeAsk::AsAllowed }
    }
}

impl Privilege {
    /// Unprivileged when lowered (`--unprivileged`) or when the effective uid is not 0.
    pub fn pick(ask: PrivilegeAsk, euid: u32) -> Privilege {
        match ask {
            PrivilegeAsk::AsAllowed if euid == 0 => Privilege::Full,
            PrivilegeAsk::AsAllowed | PrivilegeAsk::Lowered => Privilege::Unprivileged { uid: euid },
        }
    }
}

/// What a run tolerates before its exit code says so: per-entry errors (`--max-errors`), and
/// entries of other users left for a privileged run (`--allow-foreign`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tolerance {
    pub max_errors: u64,
    pub foreign: Foreign,
}

impl Tolerance {
    /// Nothing tolerated.
    pub const NONE: Tolerance = Tolerance { max_errors: 0, foreign: Foreign::Partial };
}

/// What entries of other users left by an unprivileged pass make of the exit code.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Foreign {
    /// Exit 4 (partial): a privileged run is needed.
    #[default]
    Partial,
    /// Not a reason to exit 4 (`--allow-foreign`); the report and the marker still say so.
    Allowed,
}

/// How to run a pass over one volume (everything that is not the desired state).
#[derive(Debug, Clone)]
pub struct RunOptions {
    pub mode: Mode,
    /// Walker threads; 0 until `apply` resolves it (`resolve_threads`).
    pub threads: usize,
    pub cross_devices: bool,
    pub force: bool,
    pub verify: Verify,
    pub reverify_after: Option<Duration>,
    pub lock_timeout: Duration,
    pub progress: ProgressStyle,
    /// How often the resume checkpoint on the root is rewritten, at most.
    pub checkpoint_interval: Duration,
    /// Which entries the pass may change.
    pub privilege: Privilege,
    /// The load on the storage: operations in flight (`Auto` until `apply` resolves it) and
    /// the ceiling on operations per second.
    pub load: Policy,
}

impl RunOptions {
    pub fn new(mode: Mode, threads: usize) -> Self {
        RunOptions {
            mode,
            threads,
            cross_devices: false,
            force: false,
            verify: Verify::Marker,
            reverify_after: None,
            lock_timeout: Duration::from_secs(1800),
            progress: ProgressStyle::Off,
            checkpoint_interval: Duration::from_secs(3),
            privilege: Privilege::Full,
            load: Policy::default(),
        }
    }
}

/// The most worker threads a run starts (`--threads`): past this, threads only cost memory
/// and start-up time (20000 took minutes), never speed.
pub const MAX_THREADS: usize = 1024;

/// Whether an output file named on the command line means stdout: `-`, or `/dev/stdout` (a
/// symlink to the process's fd 1, written as stdout rather than opened through the link).
pub fn is_stdout(dest: &Path) -> bool {
    dest == Path::new("-") || dest == Path::new("/dev/stdout")
}

/// `0` means automatic, from the thread sweep in docs/performance.md: metadata I/O waits far
/// more than it computes, and what a cold pass needs is requests in flight, whatever the cores.
/// On a local filesystem 4 threads per core, 32 to 64 (on 2 cores a cold ext4 pass was as fast
/// at 16 to 64 threads as it gets, 2× faster than at 8; 128 was slower). On a network or FUSE
/// filesystem ([`Storage::Remote`]), where every uncached request is a round trip, 4 times that,
/// 128 to 256 (the slow-storage model was fastest at 128). `storage` is only asked when `n` is 0.
pub fn resolve_threads(n: usize, storage: impl FnOnce() -> Storage) -> usize {
    if n > 0 {
        return n.min(MAX_THREADS);
    }
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    let local = (cores * 4).clamp(32, 64);
    match storage() {
        Storage::Local => local,
        Storage::Remote => local * 4,
    }
}

/// Parses `500ms`, `30s`, `15m`, `12h`, `7d` (or plain seconds).
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (num, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
    let n: u64 = num.parse().map_err(|_| format!("'{s}' is not a duration like 500ms, 30s, 15m, 12h or 7d"))?;
    let millis = match unit {
        "ms" => 1,
        "" | "s" => 1000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => {
            return Err(format!("'{s}': unknown unit '{unit}' (use ms, s, m, h or d)"));
        }
    };
    Ok(Duration::from_millis(n.saturating_mul(millis)))
}

/// `--shard I/N`: which part of the tree a sharded pass owns. Ownership is a pure function of an
/// entry's depth and path.
///
/// The tree is split at `--shard-depth D`: an entry at depth D (and its whole subtree) belongs to
/// shard `fnv1a(relative path) % N`; entries between the root and depth D belong to shard 0;
/// the root itself is changed, and the marker set `done`, by whichever run finds every shard done.
/// No shard needs more than the first D levels of the tree to know its part.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShardFilter {
    pub index: u32,
    pub count: u32,
    pub depth: u32,
}

impl ShardFilter {
    /// Whether the entry at `depth` (root = 0) with relative path `rel` is this shard's to fix.
    /// `rel` is only built at the split depth. Deeper entries are reached only through an
    /// owned anchor, so they are owned.
    pub fn owns(&self, depth: u32, rel: impl FnOnce() -> PathBuf) -> bool {
        match depth {
            0 => false,
            d if d < self.depth => self.index == 0,
            d if d > self.depth => true,
            _ => self.shard_of(rel().as_os_str().as_bytes()) == self.index,
        }
    }

    /// The shard an anchor path goes to: FNV-1a (64 bit) of its bytes, modulo N. Stable across
    /// runs, machines and versions (changing it would mix up shards of different versions).
    pub fn shard_of(&self, rel: &[u8]) -> u32 {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for &b in rel {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        (h % u64::from(self.count)) as u32
    }
}

/// The most shards of one round (`--shard I/N`, N at most this): the shard record on the root
/// takes one byte per shard, and the root's xattr space (about 4 KiB on ext4 with 4 KiB blocks,
/// 1 KiB with 1 KiB blocks) must hold it beside the marker.
pub const MAX_SHARDS: u32 = 1024;

/// Parses `I/N` (0 ≤ I < N) or `auto/N`, taking I from `job_index` (`JOB_COMPLETION_INDEX`).
pub fn parse_shard(s: &str, job_index: Option<&str>) -> Result<(u32, u32), String> {
    let (i, n) = s.split_once('/').ok_or_else(|| format!("'{s}' is not I/N (e.g. 0/4) or auto/N"))?;
    let n: u32 = n.parse().ok().filter(|&n| n > 0).ok_or_else(|| format!("'{s}': N must be a number above 0"))?;
    let i = match i {
        "auto" => job_index
            .ok_or("--shard auto/N needs JOB_COMPLETION_INDEX (set by Kubernetes in Indexed Jobs)")?
            .trim()
            .parse::<u32>()
            .map_err(|_| "JOB_COMPLETION_INDEX is not a number".to_string())?,
        i => i.parse().map_err(|_| format!("'{s}': I must be a number or 'auto'"))?,
    };
    if n > MAX_SHARDS {
        return Err(format!(
            "'{s}': at most {} shards (the root's extended attributes hold one byte per shard)",
            MAX_SHARDS
        ));
    }
    if i >= n {
        return Err(format!("shard {i} of {n} does not exist (shards are 0..{})", n - 1));
    }
    Ok((i, n))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thread_default_is_by_cores_and_more_on_remote_storage() {
        let never = || -> Storage { panic!("an explicit count looks at no filesystem") };
        assert_eq!(resolve_threads(5, never), 5, "an explicit count wins");
        let local = resolve_threads(0, || Storage::Local);
        assert!((32..=64).contains(&local), "{local}");
        assert_eq!(resolve_threads(0, || Storage::Remote), local * 4);
    }

    /// Shards that fix the entry `path` (at depth = its number of components): an entry below
    /// the split depth is reached only by the shard that entered its anchor.
    fn fixers(n: u32, depth: u32, path: &[&str]) -> usize {
        let d = path.len() as u32;
        (0..n)
            .filter(|&i| {
                let f = ShardFilter { index: i, count: n, depth };
                let reached = d <= depth || f.owns(depth, || path[..depth as usize].iter().collect());
                reached && f.owns(d, || path.iter().collect())
            })
            .count()
    }

    #[test]
    fn shards_are_disjoint_and_cover_everything() {
        for n in [1, 2, 4, 7] {
            for depth in 1..=3 {
                assert_eq!(fixers(n, depth, &[]), 0, "the root is the finisher's");
                for i in 0..300 {
                    let (a, b, c, e) = (format!("repo-{}", i % 37), format!("d{}", i % 11), format!("{i}"), "f");
                    for len in 1..=4 {
                        let path = [a.as_str(), b.as_str(), c.as_str(), e][..len].to_vec();
                        assert_eq!(fixers(n, depth, &path), 1, "n={n} depth={depth} {path:?}");
                    }
                }
            }
        }
    }

    #[test]
    fn the_hash_is_pinned() {
        // FNV-1a 64 test vectors: changing the hash would mix up shards across versions.
        let f = ShardFilter { index: 0, count: u32::MAX, depth: 2 };
        assert_eq!(f.shard_of(b""), (0xcbf2_9ce4_8422_2325u64 % u64::from(u32::MAX)) as u32);
        assert_eq!(f.shard_of(b"a"), (0xaf63_dc4c_8601_ec8cu64 % u64::from(u32::MAX)) as u32);
    }

    #[test]
    fn shard_specs_parse() {
        assert_eq!(parse_shard("1/4", None), Ok((1, 4)));
        assert_eq!(parse_shard("auto/4", Some("3")), Ok((3, 4)));
        assert!(parse_shard("auto/4", None).is_err());
        assert!(parse_shard("4/4", None).is_err());
        assert!(parse_shard("0/0", None).is_err());
        assert!(parse_shard("x/2", None).is_err());
        assert!(parse_shard("2", None).is_err());
    }

    #[test]
    fn durations_parse() {
        assert_eq!(parse_duration("7d").unwrap(), Duration::from_secs(7 * 86400));
        assert_eq!(parse_duration("90").unwrap(), Duration::from_secs(90));
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(parse_duration("0").unwrap(), Duration::ZERO);
        assert!(parse_duration("7w").is_err());
        assert!(parse_duration("d").is_err());
    }

    #[test]
    fn privilege_is_unprivileged_when_asked_or_not_root() {
        assert_eq!(Privilege::pick(PrivilegeAsk::AsAllowed, 0), Privilege::Full);
        assert_eq!(Privilege::pick(PrivilegeAsk::Lowered, 0), Privilege::Unprivileged { uid: 0 });
        assert_eq!(Privilege::pick(PrivilegeAsk::AsAllowed, 1000), Privilege::Unprivileged { uid: 1000 });
        assert_eq!(Privilege::pick(PrivilegeAsk::Lowered, 1000), Privilege::Unprivileged { uid: 1000 });
    }

    #[test]
    fn progress_style_follows_interval_and_terminal() {
        let s = Duration::from_secs(5);
        assert_eq!(ProgressStyle::pick(Duration::ZERO, Stderr::TextTerminal), ProgressStyle::Off);
        assert_eq!(ProgressStyle::pick(Duration::ZERO, Stderr::Log), ProgressStyle::Off);
        assert_eq!(ProgressStyle::pick(s, Stderr::TextTerminal), ProgressStyle::Bar);
        assert_eq!(ProgressStyle::pick(s, Stderr::Log), ProgressStyle::Lines(s));
    }
}
