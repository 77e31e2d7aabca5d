//! Each command's clap argument types and the parsers of their values (`--volume`, yes/no words).

use std::path::PathBuf;

use clap::builder::BoolishValueParser;
use clap::{Args, ValueEnum};

use crate::options::{self, parse_duration};
use crate::spec::{self, Modes};

/// The desired state of the volumes.
#[derive(Debug, Args, Clone, Default)]
pub struct SpecArgs {
    /// Group every entry gets, with the kubelet's fsGroup mode policy (g+rw, dirs g+rwxs).
    #[arg(long, value_name = "GID", env = "VOLPREP_FS_GROUP", value_parser = spec::parse_id,
          allow_hyphen_values = true)]
    pub fs_group: Option<u32>,

    /// Owner every entry gets (and group, without --fs-group), like `chown -R UID:GID`.
    #[arg(long, value_name = "UID[:GID]", env = "VOLPREP_OWNER", value_parser = spec::parse_owner,
          allow_hyphen_values = true)]
    pub owner: Option<(u32, Option<u32>)>,

    /// Use the read-only mask (0440 instead of 0660), as the kubelet does for read-only volumes.
    #[arg(long, env = "VOLPREP_READ_ONLY", value_parser = BoolishValueParser::new())]
    pub read_only: bool,

    /// How mode bits are decided: 'kubelet' (the kubelet's fsGroup rule, exactly) or 'app-safe'
    /// (the group gets access without breaking apps that insist on private modes: PostgreSQL,
    /// ssh, Erlang/RabbitMQ, GnuPG, etcd). Also for the --volume specs that set no modes=.
    #[arg(long, value_name = "MODE", value_enum, env = "VOLPREP_MODES", ignore_case = true)]
    pub modes: Option<ModesArg>,

    /// The uid the app runs as (the pod's runAsUser). With --modes app-safe, only the entries it
    /// owns (after --owner) keep private modes or are tightened; the others get the kubelet's
    /// bits. Default: the --owner uid; without either, app-safe is the kubelet's rule.
    #[arg(long, value_name = "UID", env = "VOLPREP_APP_UID", value_parser = spec::parse_id,
          allow_hyphen_values = true)]
    pub app_uid: Option<u32>,

    /// A rule for one path, relative to the volume ('.' is its root), with --modes app-safe:
    /// 'owner-only' (an entry the app owns loses its group and other bits), an exact octal mode
    /// ('0755', whoever owns it), or 'keep' (its mode is left alone). Repeatable; VOLPREP_RULES
    /// takes several, separated by ';'. A --volume without rule= takes these.
    #[arg(long = "rule", value_name = "PATH=RULE", env = "VOLPREP_RULES", value_delimiter = ';',
          value_parser = spec::PathRule::parse)]
    pub rules: Vec<spec::PathRule>,
}

/// `--modes`: the mode policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ModesArg {
    /// The default. Files get g+rw and directories g+rwx and setgid (old_mode | 0660, dirs
    /// | 2770), like the kubelet's fsGroup pass; with --owner alone, modes are untouched.
    Kubelet,
    /// Only for entries the app owns (--app-uid, else --owner's uid; after --owner): one with no
    /// group or other bits keeps its mode (its group still changes), and known app-private paths
    /// whose signs the app owns lose the bits their app refuses, and gain none: a PostgreSQL
    /// data directory (holding PG_VERSION and global/) drops group write and other bits, its
    /// server.key, .pgpass, .erlang.cookie, private keys in .ssh/, a GnuPG homedir and its
    /// private-keys-v1.d/, etcd's data directory and member/ (with its wal/ and snap/) drop group
    /// and other bits, and .ssh/, .ssh/authorized_keys, .ssh/config and the home above .ssh/ drop
    /// group and other write. A file with more than one link is left as it is (and said). Every
    /// other entry (another uid's, or all when the app's uid is not known) gets the kubelet's
    /// bits; what was tightened is logged and reported.
    AppSafe,
}

impl From<ModesArg> for Modes {
    fn from(m: ModesArg) -> Modes {
        match m {
            ModesArg::Kubelet => Modes::Kubelet,
            ModesArg::AppSafe => Modes::AppSafe,
        }
    }
}

/// Arguments of `apply` and `check`.
#[derive(Debug, Args)]
pub struct PassArgs {
    #[command(flatten)]
    pub spec: SpecArgs,

    /// Worker threads (0: automatic: 4 per core, 32 to 64, and 4 times that on a network or FUSE
    /// filesystem; at most 1024). More than the cores, even on 2: each stat or chown mostly waits
    /// on the storage, so requests in flight, not cores, set the pace of a cold pass.
    #[arg(long, short = 'j', value_name = "N", default_value_t = 0, env = "VOLPREP_THREADS",
          value_parser = threads_parser())]
    pub threads: usize,

    /// Metadata operations kept in flight: 'adaptive' as many as the storage answers without
    /// making them wait in its queue (each about as fast as unloaded), 'full' one per thread;
    /// 'auto': adaptive on network and FUSE filesystems, full on local ones.
    #[arg(long, value_enum, default_value_t = LoadArg::Auto, env = "VOLPREP_LOAD")]
    pub load: LoadArg,

    /// At most RATE metadata operations per second (stats, opens, directory reads, chowns,
    /// chmods), whatever --load says: a hard ceiling for shared storage.
    #[arg(long, value_name = "RATE", env = "VOLPREP_MAX_OPS",
          value_parser = clap::value_parser!(u32).range(1..))]
    pub max_ops: Option<u32>,

    /// Prepare a system directory too (/, /etc, /usr, /var, anything below /proc, /sys or /dev,
    /// ...), which is refused otherwise.
    #[arg(long, env = "VOLPREP_ALLOW_SYSTEM_PATH", value_parser = BoolishValueParser::new())]
    pub allow_system_path: bool,

    /// Enter nested mounts (other filesystems, and bind mounts of the same one); by default they
    /// are skipped.
    #[arg(long, env = "VOLPREP_CROSS_DEVICES", value_parser = BoolishValueParser::new())]
    pub cross_devices: bool,

    /// Per-entry errors tolerated before the exit code becomes 1 (they are always reported).
    #[arg(long, value_name = "N", default_value_t = 0, env = "VOLPREP_MAX_ERRORS")]
    pub max_errors: u64,

    /// Write the JSON report to FILE ('-': stdout).
    #[arg(long, value_name = "FILE", env = "VOLPREP_REPORT")]
    pub report: Option<PathBuf>,

    /// Write a one-line summary per volume (at most 4096 bytes) to this Kubernetes termination
    /// message file. Default: /dev/termination-log when it exists and is writable.
    #[arg(long, value_name = "PATH", env = "VOLPREP_TERMINATION_LOG")]
    pub termination_log: Option<PathBuf>,

    /// When a valid marker is enough: 'marker' skips a volume whose marker says done for this
    /// spec and whose root conforms; 'full' always walks (changing only what differs).
    #[arg(long, value_enum, default_value_t = VerifyArg::Marker, env = "VOLPREP_VERIFY")]
    pub verify: VerifyArg,

    /// Walk in verify mode when the marker is older than this (30s, 15m, 12h, 7d).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, env = "VOLPREP_REVERIFY_AFTER")]
    pub reverify_after: Option<std::time::Duration>,

    /// Log a progress line this often while walking (0: never). On a terminal: a live bar.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, default_value = "5s",
          env = "VOLPREP_PROGRESS_INTERVAL")]
    pub progress_interval: std::time::Duration,

    /// Rewrite the resume checkpoint on the root at most this often.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, default_value = "3s",
          env = "VOLPREP_CHECKPOINT_INTERVAL")]
    pub checkpoint_interval: std::time::Duration,

    /// Ignore the marker and any checkpoint: walk everything.
    #[arg(long, env = "VOLPREP_FORCE", value_parser = BoolishValueParser::new())]
    pub force: bool,

    /// Change only the entries this user owns (their group to one of its groups, and their mode
    /// bits) and list the others for a privileged run; what a non-root volprep always does.
    #[arg(long, env = "VOLPREP_UNPRIVILEGED", value_parser = BoolishValueParser::new())]
    pub unprivileged: bool,

    /// Exit 0 instead of 4 when entries of other users were left (unprivileged mode), e.g. an
    /// unreadable root-owned lost+found; the warning, report and in-progress marker still say so.
    #[arg(long, env = "VOLPREP_ALLOW_FOREIGN", value_parser = BoolishValueParser::new())]
    pub allow_foreign: bool,

    /// How long to wait for another volprep holding the volume's lock.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, default_value = "30m",
          env = "VOLPREP_LOCK_TIMEOUT")]
    pub lock_timeout: std::time::Duration,

    /// `--volume PATH,KEY=VALUE,...`: a volume with its own spec (the help text says how).
    #[arg(long = "volume", value_name = "PATH,KEY=VALUE,...", value_parser = parse_volume,
          help = "A volume with its own spec: 'PATH,fs-group=GID,owner=UID[:GID],read-only,modes=MODE' (keys \
                  as the spec flags; the path may also be given as 'path=PATH'). Repeatable; VOLPREP_VOLUMES \
                  takes several, separated by ';' or newlines")]
    pub volumes: Vec<(PathBuf, SpecArgs)>,

    /// Make PATH a shared temp dir like /tmp: mode 01777, created if missing (its parent must
    /// exist), not recursive. Repeatable; VOLPREP_STICKY takes several, separated by ':'.
    #[arg(long, value_name = "PATH", env = "VOLPREP_STICKY", value_delimiter = ':')]
    pub sticky: Vec<PathBuf>,

    /// Prepare only shard I of N of the volume (0 <= I < N), e.g. one pod of an Indexed Job;
    /// 'auto/N' takes I from JOB_COMPLETION_INDEX. The shards meet in the root marker.
    #[arg(long, value_name = "I/N", env = "VOLPREP_SHARD")]
    pub shard: Option<String>,

    /// Depth at which a sharded pass splits the tree (the same for every shard).
    #[arg(long, value_name = "D", default_value_t = 3, env = "VOLPREP_SHARD_DEPTH",
          value_parser = clap::value_parser!(u32).range(1..=16))]
    pub shard_depth: u32,

    /// Volume roots (directories) to prepare with the spec flags above.
    #[arg(value_name = "PATH", required_unless_present_any = ["volumes", "sticky"])]
    pub paths: Vec<PathBuf>,
}

/// `--threads`: 0 (automatic) to [`options::MAX_THREADS`]; more is a usage error, not an abort.
fn threads_parser() -> clap::builder::RangedU64ValueParser<usize> {
    clap::builder::RangedU64ValueParser::new().range(0..=options::MAX_THREADS as u64)
}

/// Parses one `--volume` value: `PATH,fs-group=GID,owner=UID[:GID],read-only,modes=MODE`.
pub fn parse_volume(s: &str) -> Result<(PathBuf, SpecArgs), String> {
    let mut path = None;
    let mut spec = SpecArgs::default();
    for (i, item) in s.split(',').map(str::trim).enumerate() {
        let (key, value) = match item.split_once('=') {
            Some((k, v)) => (k.trim(), Some(v.trim())),
            None if i == 0 => ("path", Some(item)),
            None => (item, None),
        };
        match (key, value) {
            ("path", Some(v)) if !v.is_empty() => path = Some(PathBuf::from(v)),
            ("fs-group", Some(v)) => spec.fs_group = Some(spec::parse_id(v)?),
            ("owner", Some(v)) => spec.owner = Some(spec::parse_owner(v)?),
            ("app-uid", Some(v)) => spec.app_uid = Some(spec::parse_id(v)?),
            ("rule", Some(v)) => spec.rules.push(spec::PathRule::parse(v)?),
            ("read-only", None) => spec.read_only = true,
            ("read-only", Some(v)) => spec.read_only = parse_bool(v)?,
            ("modes", Some(v)) => {
                spec.modes = Some(
                    ModesArg::from_str(v, true)
                        .map_err(|_| format!("modes='{v}' is not a mode policy: kubelet or app-safe"))?,
                );
            }
            _ => {
                return Err(format!(
                    "'{item}' is not one of path=PATH, fs-group=GID, owner=UID[:GID], read-only, modes=MODE, app-uid=UID, rule=PATH=RULE"
                ));
            }
        }
    }
    let path = path.ok_or_else(|| format!("'{s}' names no path"))?;
    // Without modes= it takes --modes (checked with it by `targets`).
    SpecArgs { modes: spec.modes.or(Some(ModesArg::AppSafe)), ..spec.clone() }.to_spec()?;
    Ok((path, spec))
}

/// A yes/no word as Kubernetes manifests write them: `true`/`false`, `1`/`0`, `yes`/`no`,
/// `on`/`off`, `y`/`n`, `t`/`f`, any case (clap's `BoolishValueParser`, as the boolean flags'
/// environment variables take).
pub fn parse_bool(v: &str) -> Result<bool, String> {
    match v.trim().to_ascii_lowercase().as_str() {
        "true" | "1" | "yes" | "on" | "y" | "t" => Ok(true),
        "false" | "0" | "no" | "off" | "n" | "f" => Ok(false),
        _ => Err(format!("'{v}' is not a yes/no value (true/false, 1/0, yes/no, on/off)")),
    }
}

/// `VOLPREP_VOLUMES`: `--volume` values separated by ';' or newlines.
pub fn volumes_from_env() -> Result<Vec<(PathBuf, SpecArgs)>, String> {
    let Ok(v) = std::env::var("VOLPREP_VOLUMES") else {
        return Ok(Vec::new());
    };
    v.split([';', '\n']).map(str::trim).filter(|s| !s.is_empty()).map(parse_volume).collect()
}

/// `--load`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LoadArg {
    Auto,
    Adaptive,
    Full,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum VerifyArg {
    Marker,
    Full,
}

/// Arguments of `status`.
#[derive(Debug, Args)]
pub struct StatusArgs {
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,

    /// Volume roots.
    #[arg(required = true, value_name = "PATH")]
    pub paths: Vec<PathBuf>,
}

/// Arguments of `clear`.
#[derive(Debug, Args)]
pub struct ClearArgs {
    /// Change nothing; list the attributes clear would remove (exit 3 if any).
    #[arg(long)]
    pub dry_run: bool,

    /// Also remove special-bit records (setuid/setgid bits an interrupted pass cleared, which
    /// the next `apply` restores); without it a volume that has some is left as it is (exit 1).
    #[arg(long)]
    pub discard_pending: bool,

    /// How long to wait for another volprep holding the volume's lock.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, default_value = "30m",
          env = "VOLPREP_LOCK_TIMEOUT")]
    pub lock_timeout: std::time::Duration,

    /// Write the JSON report to FILE ('-': stdout).
    #[arg(long, value_name = "FILE", env = "VOLPREP_REPORT")]
    pub report: Option<PathBuf>,

    /// Volume roots (each the directory itself: a symlink is refused).
    #[arg(required = true, value_name = "PATH")]
    pub paths: Vec<PathBuf>,
}

/// Arguments of `inspect`: the spec flags of `apply` ask what it would do.
#[derive(Debug, Args)]
#[command(
    mut_arg("fs_group", |a| a.help(
        "Also show what the kubelet's fsGroup pass and `volprep apply --fs-group GID` would do")),
    mut_arg("owner", |a| a.help(
        "Also show which entries `volprep apply --owner UID[:GID]` (with --fs-group, if given) would \
         change: a preview for a migrated volume")),
    mut_arg("read_only", |a| a.help("The volume is mounted read-only: the kubelet's read-only mask (0440)")),
    mut_arg("modes", |a| a.help(
        "The mode policy of the previews (kubelet or app-safe); the app paths found are shown under both")),
)]
pub struct InspectArgs {
    #[command(flatten)]
    pub spec: SpecArgs,

    /// Print one JSON document instead of tables.
    #[arg(long)]
    pub json: bool,

    /// Worker threads (0: automatic: 4 per core, 32 to 64, and 4 times that on a network or FUSE
    /// filesystem; at most 1024). More than the cores, even on 2: each stat or chown mostly waits
    /// on the storage, so requests in flight, not cores, set the pace of a cold pass.
    #[arg(long, short = 'j', value_name = "N", default_value_t = 0, env = "VOLPREP_THREADS",
          value_parser = threads_parser())]
    pub threads: usize,

    /// Enter nested mounts (other filesystems, and bind mounts of the same one); by default they
    /// are listed only.
    #[arg(long, env = "VOLPREP_CROSS_DEVICES", value_parser = BoolishValueParser::new())]
    pub cross_devices: bool,

    /// The volume root (a directory).
    #[arg(value_name = "PATH")]
    pub path: PathBuf,
}

/// Arguments of `demo`.
#[derive(Debug, Args)]
pub struct DemoArgs {
    /// Where to make the demo volume (a new or empty directory); default: a temp dir.
    pub dir: Option<PathBuf>,

    /// Entries in the demo volume.
    #[arg(long, default_value_t = 20_000)]
    pub entries: u64,

    /// Keep the demo volume afterwards.
    #[arg(long)]
    pub keep: bool,

    /// Also write the JSON report of its three passes to FILE ('-': stdout).
    #[arg(long, value_name = "FILE")]
    pub report: Option<PathBuf>,
}
