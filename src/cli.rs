//! Command line and environment (clap): parses and validates flags, and turns them into a
//! [`Job`]: one command's plain option values (`Spec`, `RunOptions`, ...). Nothing below this
//! module sees clap types.

use std::io::IsTerminal;
use std::path::PathBuf;

use clap::builder::BoolishValueParser;
use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::inject_args::InjectArgs;
use crate::options::{
    self, Foreign, LogFormat, Mode, Privilege, ProgressStyle, RunOptions, ShardFilter, Stderr, Tolerance, Verify,
    parse_duration,
};
use crate::spec::{self, Modes, Spec};
use crate::throttle::{Concurrency, Policy};
use crate::{apply, demo, inject, inspect, merge, status};

/// Prepares Kubernetes volumes for a non-root app: the kubelet's fsGroup pass, made parallel,
/// change-only-what-differs and safe against symlink races.
#[derive(Debug, Parser)]
#[command(name = "volprep", version, about, max_term_width = 100)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,

    /// Log format on stderr: human text, or one JSON object per line.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text, env = "VOLPREP_LOG_FORMAT")]
    pub log_format: LogFormat,

    /// Log level; RUST_LOG, when set to a valid filter, overrides it.
    #[arg(long, global = true, value_enum, ignore_case = true, default_value_t = LogLevel::Info,
          env = "VOLPREP_LOG_LEVEL")]
    pub log_level: LogLevel,
}

/// The words of `--log-format` are [`LogFormat::as_str`]'s.
impl ValueEnum for LogFormat {
    fn value_variants<'a>() -> &'a [Self] {
        &[LogFormat::Text, LogFormat::Json]
    }

    fn to_possible_value(&self) -> Option<clap::builder::PossibleValue> {
        Some(clap::builder::PossibleValue::new(self.as_str()))
    }
}

/// `--log-level`: the least severe events logged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogLevel {
    Error,
    Warn,
    Info,
    Debug,
    Trace,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Make every PATH conform to the spec, changing only the entries that differ.
    Apply(PassArgs),
    /// Change nothing; report what `apply` would change (exit 3 if anything).
    Check(PassArgs),
    /// Work with JSON reports (`report merge FILE...`).
    #[command(subcommand)]
    Report(ReportCommand),
    /// Print each volume's marker: what it was prepared for, and when.
    Status(StatusArgs),
    /// Change nothing; diagnose a volume: owners, missing mode bits, risky directories and
    /// symlinks, nested mounts, and (with --fs-group) what the kubelet and `apply` would do.
    Inspect(InspectArgs),
    /// Make a demo volume in a temp dir (or DIR), then check, apply and check it again.
    Demo(DemoArgs),
    /// Rewrite rendered manifests (stdin or FILEs, to stdout) so pods with an fsGroup get the
    /// volprep init container instead of the kubelet's walk: a Helm post-renderer, a kustomize
    /// KRM function, a filter.
    Inject(InjectArgs),
}

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

    /// A volume with its own spec: 'PATH,fs-group=GID,owner=UID[:GID],read-only,modes=MODE' (keys
    /// as the spec flags; the path may also be given as 'path=PATH'). Repeatable; VOLPREP_VOLUMES
    /// takes several, separated by ';' or newlines.
    #[arg(long = "volume", value_name = "PATH,KEY=VALUE,...", value_parser = parse_volume)]
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

#[derive(Debug, Subcommand)]
pub enum ReportCommand {
    /// Merge reports (e.g. of the shards of one volume) into one per volume path.
    Merge {
        /// Print the merged report as JSON instead of summary lines.
        #[arg(long)]
        json: bool,
        /// Reports written with --report.
        #[arg(required = true, value_name = "FILE")]
        files: Vec<PathBuf>,
    },
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

impl SpecArgs {
    /// The spec the flags ask for, as they are (maybe nothing).
    pub fn spec(&self) -> Spec {
        let owner = self.owner.map_or_else(Spec::default, |(uid, gid)| Spec::owner(uid, gid));
        let modes = self.modes.map_or(Modes::Kubelet, Modes::from);
        let mut rules = self.rules.clone();
        rules.sort();
        Spec { fs_group: self.fs_group, read_only: self.read_only, modes, app_uid: self.app_uid, rules, ..owner }
    }

    /// The spec, or a usage error when it asks for nothing.
    pub fn to_spec(&self) -> Result<Spec, String> {
        let spec = self.spec();
        if spec.is_empty() {
            return Err(
                "nothing to do: give --fs-group GID and/or --owner UID[:GID] (or VOLPREP_FS_GROUP / VOLPREP_OWNER)"
                    .into(),
            );
        }
        if spec.read_only && spec.fs_group.is_none() {
            return Err("--read-only changes the fsGroup mode policy: it needs --fs-group".into());
        }
        if !spec.rules.is_empty() && spec.modes != Modes::AppSafe {
            return Err("--rule is a rule of --modes app-safe: give --modes app-safe (or modes=app-safe)".into());
        }
        spec::rules_in_order(spec.rules.clone())?;
        Ok(spec)
    }
}

impl PassArgs {
    /// Every volume to walk with its spec: the PATHs with the spec flags, then each `--volume`
    /// (from the command line, or else from VOLPREP_VOLUMES).
    pub fn targets(&self) -> Result<Vec<(PathBuf, Spec)>, String> {
        let mut out = Vec::new();
        if !self.paths.is_empty() {
            let spec = self.spec.to_spec()?;
            out.extend(self.paths.iter().map(|p| (p.clone(), spec.clone())));
        } else if self.spec.fs_group.is_some() || self.spec.owner.is_some() {
            return Err("spec flags given but no PATH to apply them to".into());
        }
        let env_volumes;
        let volumes = if self.volumes.is_empty() {
            env_volumes = volumes_from_env()?;
            &env_volumes
        } else {
            &self.volumes
        };
        for (p, s) in volumes {
            // --modes is a policy: a --volume without modes= takes it (app-uid= and rule= too).
            let rules = if s.rules.is_empty() { self.spec.rules.clone() } else { s.rules.clone() };
            let (modes, app_uid) = (s.modes.or(self.spec.modes), s.app_uid.or(self.spec.app_uid));
            let s = SpecArgs { modes, app_uid, rules, ..s.clone() };
            out.push((p.clone(), s.to_spec()?));
        }
        if out.is_empty() && self.sticky.is_empty() {
            return Err("nothing to do: give PATHs with --fs-group/--owner, --volume or --sticky".into());
        }
        if self.shard.is_some() && out.len() != 1 {
            return Err("--shard prepares part of one volume: give exactly one PATH".into());
        }
        Ok(out)
    }

    /// `--shard`, resolved (JOB_COMPLETION_INDEX for `auto/N`).
    pub fn shard_filter(&self) -> Result<Option<ShardFilter>, String> {
        let Some(s) = &self.shard else { return Ok(None) };
        let job_index = std::env::var("JOB_COMPLETION_INDEX").ok();
        let (index, count) = options::parse_shard(s, job_index.as_deref())?;
        Ok(Some(ShardFilter { index, count, depth: self.shard_depth }))
    }

    pub fn run_options(&self, mode: Mode, stderr: Stderr, privilege: Privilege) -> RunOptions {
        RunOptions {
            mode,
            // 0 (automatic) is resolved by `apply`, which knows the volumes' filesystems.
            threads: self.threads,
            cross_devices: self.cross_devices,
            force: self.force,
            verify: match self.verify {
                VerifyArg::Marker => Verify::Marker,
                VerifyArg::Full => Verify::Full,
            },
            reverify_after: self.reverify_after,
            lock_timeout: self.lock_timeout,
            progress: ProgressStyle::pick(self.progress_interval, stderr),
            checkpoint_interval: self.checkpoint_interval,
            privilege,
            load: Policy {
                concurrency: match self.load {
                    LoadArg::Auto => Concurrency::Auto,
                    LoadArg::Adaptive => Concurrency::Adaptive,
                    LoadArg::Full => Concurrency::Full,
                },
                max_ops: self.max_ops,
            },
        }
    }

    /// The plain options of `apply` (`mode` Apply) or `check`, for a process whose effective
    /// uid is `euid` and whose stderr is `stderr`.
    pub fn to_options(&self, mode: Mode, stderr: Stderr, euid: u32) -> Result<apply::Options, String> {
        let targets = self.targets()?;
        let shard = self.shard_filter()?;
        let privilege = Privilege::pick(self.unprivileged, euid);
        if let Privilege::Unprivileged { uid } = privilege {
            if let Some((path, _)) = targets.iter().find(|(_, s)| s.uid().is_some()) {
                let why =
                    if self.unprivileged { "--unprivileged".to_string() } else { format!("running as uid {uid}") };
                return Err(format!(
                    "{}: --owner needs root (only root may give files away), and this run is unprivileged ({why}): use --fs-group alone, or run as root",
                    crate::escape::Escaped(path.as_os_str())
                ));
            }
        }
        if shard.is_some() && mode == Mode::Check {
            return Err("--shard is for apply; check a volume whole".into());
        }
        Ok(apply::Options {
            targets,
            sticky: self.sticky.clone(),
            shard,
            run: self.run_options(mode, stderr, privilege),
            tolerates: Tolerance {
                max_errors: self.max_errors,
                foreign: if self.allow_foreign { Foreign::Allowed } else { Foreign::Partial },
            },
            report: self.report.clone(),
            termination_log: self.termination_log.clone(),
            allow_system_path: self.allow_system_path,
        })
    }
}

/// One command, as the plain values it runs from.
#[derive(Debug, Clone)]
pub enum Job {
    /// `apply` or `check` (by `run.mode`).
    Pass(apply::Options),
    Status(status::Options),
    Inspect(inspect::Options),
    Merge(merge::Options),
    Demo(demo::Options),
    Inject(inject::Options),
}

impl Cli {
    /// The command as plain values, or a usage error (flag combinations clap can't see).
    pub fn job(self) -> Result<Job, String> {
        let stderr = match self.log_format {
            LogFormat::Text if std::io::stderr().is_terminal() => Stderr::TextTerminal,
            _ => Stderr::Log,
        };
        Ok(match self.command {
            Command::Apply(a) => Job::Pass(a.to_options(Mode::Apply, stderr, crate::sys::euid())?),
            Command::Check(a) => Job::Pass(a.to_options(Mode::Check, stderr, crate::sys::euid())?),
            Command::Status(a) => Job::Status(status::Options { json: a.json, paths: a.paths }),
            Command::Report(ReportCommand::Merge { json, files }) => Job::Merge(merge::Options { json, files }),
            Command::Inspect(a) => Job::Inspect(inspect::Options {
                spec: a.spec.spec(),
                json: a.json,
                threads: a.threads,
                cross_devices: a.cross_devices,
                path: a.path,
            }),
            Command::Demo(a) => {
                Job::Demo(demo::Options { dir: a.dir, entries: a.entries, keep: a.keep, report: a.report })
            }
            Command::Inject(a) => Job::Inject(a.to_options()?),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("volprep").chain(args.iter().copied()))
    }

    #[test]
    fn spec_flags_build_the_spec() {
        let cli = parse(&["apply", "--fs-group", "2000", "--owner", "1001", "/v"]).unwrap();
        let Command::Apply(a) = cli.command else { panic!() };
        let s = a.spec.to_spec().unwrap();
        assert_eq!((s.fs_group, s.owner_uid, s.owner_gid), (Some(2000), Some(1001), None));
    }

    #[test]
    fn log_levels_parse_and_a_typo_is_a_usage_error() {
        let level = |l: &str| parse(&["--log-level", l, "status", "/v"]).map(|c| c.log_level);
        assert_eq!(level("debug").unwrap(), LogLevel::Debug);
        assert_eq!(level("WARN").unwrap(), LogLevel::Warn);
        assert_eq!(parse(&["status", "/v"]).unwrap().log_level, LogLevel::Info);
        for bad in ["inf", "", "volprep=debug", "5"] {
            assert_eq!(level(bad).unwrap_err().exit_code(), 2, "{bad}");
        }
    }

    #[test]
    fn bad_ids_are_usage_errors() {
        for bad in ["-1", "4294967295", "abc", ""] {
            let e = parse(&["apply", "--fs-group", bad, "/v"]).unwrap_err();
            assert_eq!(e.exit_code(), 2, "{bad}");
        }
        assert!(parse(&["apply", "--owner", "1:-1", "/v"]).is_err());
    }

    #[test]
    fn empty_spec_and_lone_read_only_are_refused() {
        let cli = parse(&["check", "/v"]).unwrap();
        let Command::Check(a) = cli.command else { panic!() };
        assert!(a.spec.to_spec().is_err());
        let cli = parse(&["check", "--read-only", "--owner", "1", "/v"]).unwrap();
        let Command::Check(a) = cli.command else { panic!() };
        assert!(a.spec.to_spec().is_err());
    }

    #[test]
    fn a_path_is_required() {
        assert!(parse(&["apply", "--fs-group", "1"]).is_err());
    }

    #[test]
    fn volumes_carry_their_own_specs() {
        let cli = parse(&[
            "apply",
            "--fs-group",
            "2000",
            "/volumes/data",
            "--volume",
            "/volumes/cache,owner=1001:2000",
            "--volume",
            "path=/volumes/ro,fs-group=3000,read-only",
            "--sticky",
            "/volumes/tmp",
        ])
        .unwrap();
        let Command::Apply(a) = cli.command else { panic!() };
        let t = a.targets().unwrap();
        assert_eq!(t.len(), 3);
        assert_eq!((t[0].0.to_str(), t[0].1.fs_group), (Some("/volumes/data"), Some(2000)));
        assert_eq!((t[1].1.owner_uid, t[1].1.gid(), t[1].1.fs_group), (Some(1001), Some(2000), None));
        assert!(t[2].1.read_only && t[2].1.fs_group == Some(3000));
        assert_eq!(a.sticky, vec![PathBuf::from("/volumes/tmp")]);
    }

    #[test]
    fn modes_come_from_the_flag_the_volume_or_the_default() {
        let targets = |args: &[&str]| {
            let Command::Apply(a) = parse(args).unwrap().command else { panic!() };
            a.targets().unwrap().into_iter().map(|(_, s)| s.modes).collect::<Vec<_>>()
        };
        assert_eq!(targets(&["apply", "--fs-group", "1", "/v"]), [Modes::Kubelet]);
        assert_eq!(targets(&["apply", "--fs-group", "1", "--modes", "app-safe", "/v"]), [Modes::AppSafe]);
        assert_eq!(targets(&["apply", "--fs-group", "1", "--modes", "App-Safe", "/v"]), [Modes::AppSafe]);
        assert_eq!(
            targets(&[
                "apply",
                "--modes",
                "app-safe",
                "--volume",
                "/a,fs-group=1",
                "--volume",
                "/b,fs-group=1,modes=kubelet"
            ]),
            [Modes::AppSafe, Modes::Kubelet],
            "a --volume takes --modes unless it says modes="
        );
        assert_eq!(parse_volume("/v,owner=1,modes=app-safe").unwrap().1.spec().modes, Modes::AppSafe);
        assert!(parse_volume("/v,fs-group=1,modes=safe").unwrap_err().contains("kubelet or app-safe"));
        assert_eq!(parse(&["apply", "--fs-group", "1", "--modes", "strict", "/v"]).unwrap_err().exit_code(), 2);
    }

    #[test]
    fn the_app_uid_and_rules_come_from_the_flags_or_the_volume() {
        let specs = |args: &[&str]| {
            let Command::Apply(a) = parse(args).unwrap().command else { panic!() };
            a.targets().map(|t| t.into_iter().map(|(_, s)| s).collect::<Vec<_>>())
        };
        let safe = ["apply", "--fs-group", "1", "--modes", "app-safe"];
        let s = specs(&[&safe[..], &["--app-uid", "7", "--rule", "k=owner-only", "--rule", ".=0750", "/v"]].concat())
            .unwrap();
        assert_eq!(s[0].app_uid, Some(7));
        assert_eq!(
            s[0].rules.iter().map(spec::PathRule::text).collect::<Vec<_>>(),
            [".=0750", "k=owner-only"],
            "sorted"
        );
        let v = specs(
            &[
                &["apply", "--modes", "app-safe"][..],
                &[
                    "--app-uid",
                    "7",
                    "--rule",
                    "k=keep",
                    "--volume",
                    "/a,fs-group=1",
                    "--volume",
                    "/b,fs-group=1,app-uid=8,rule=x/y=0600",
                ],
            ]
            .concat(),
        )
        .unwrap();
        assert_eq!(
            (v[0].app_uid, v[1].app_uid),
            (Some(7), Some(8)),
            "a --volume takes --app-uid unless it says app-uid="
        );
        assert_eq!(v[0].rules[0].text(), "k=keep");
        assert_eq!(v[1].rules.iter().map(spec::PathRule::text).collect::<Vec<_>>(), ["x/y=0600"]);
        let e = specs(&["apply", "--fs-group", "1", "--rule", "k=keep", "/v"]).unwrap_err();
        assert!(e.contains("--modes app-safe"), "{e}");
        let e = specs(&[&safe[..], &["--rule", "k=keep", "--rule", "./k=0700", "/v"]].concat()).unwrap_err();
        assert!(e.contains("two rules for 'k'"), "{e}");
        assert!(parse(&["apply", "--fs-group", "1", "--app-uid", "-1", "/v"]).is_err());
        assert!(parse_volume("/v,fs-group=1,app-uid=x").is_err());
        assert!(parse_volume("/v,fs-group=1,rule=../x=keep").unwrap_err().contains(".."));
    }

    #[test]
    fn yes_no_words() {
        assert!(parse_volume("/v,fs-group=1,read-only=on").unwrap().1.read_only);
        assert!(!parse_volume("/v,fs-group=1,read-only=no").unwrap().1.read_only);
        assert_eq!(parse_bool("Yes"), Ok(true));
        assert!(parse_bool("maybe").is_err());
    }

    #[test]
    fn owner_is_refused_when_unprivileged() {
        let opts = |args: &[&str], euid: u32| {
            let Command::Apply(a) = parse(args).unwrap().command else { panic!() };
            a.to_options(Mode::Apply, Stderr::Log, euid)
        };
        let o = opts(&["apply", "--fs-group", "2000", "/v"], 1000).unwrap();
        assert_eq!(o.run.privilege, Privilege::Unprivileged { uid: 1000 });
        assert_eq!(opts(&["apply", "--fs-group", "2000", "/v"], 0).unwrap().run.privilege, Privilege::Full);
        assert_eq!(
            opts(&["apply", "--unprivileged", "--fs-group", "2000", "/v"], 0).unwrap().run.privilege,
            Privilege::Unprivileged { uid: 0 }
        );
        let e = opts(&["apply", "--owner", "1000", "/v"], 1000).unwrap_err();
        assert!(e.contains("--owner needs root") && e.contains("uid 1000"), "{e}");
        assert!(opts(&["apply", "--unprivileged", "--fs-group", "1", "--volume", "/w,owner=5:5", "/v"], 0).is_err());
        assert!(opts(&["apply", "--owner", "1000", "/v"], 0).is_ok());
    }

    #[test]
    fn bad_volume_values_are_usage_errors() {
        for bad in
            ["", "fs-group=1", "/v,fs-group=-1", "/v,color=red", "/v", "/v,read-only", "/v,fs-group=1,read-only=maybe"]
        {
            assert!(parse_volume(bad).is_err(), "{bad}");
        }
        assert!(parse(&["apply", "--sticky", "/t"]).is_ok());
    }
}
