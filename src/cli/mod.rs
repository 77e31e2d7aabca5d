//! Command line and environment (clap): parses and validates flags, and turns them into a
//! [`Job`]: one command's plain option values (`Spec`, `RunOptions`, ...). Nothing below this
//! module sees clap types.

mod args;
mod convert;

use std::io::IsTerminal;
use std::path::PathBuf;

use clap::{Parser, Subcommand, ValueEnum};

use crate::inject_args::InjectArgs;
use crate::options::{LogFormat, Mode, Stderr};
use crate::{apply, clear, demo, inject, inspect, merge, status};

pub use args::{ClearArgs, DemoArgs, InspectArgs, PassArgs, StatusArgs};

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
    /// Remove volprep's attributes (marker, checkpoints, records) from each volume root, to go
    /// back to the kubelet's fsGroup; changes no owner, group or mode.
    Clear(ClearArgs),
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

/// One command, as the plain values it runs from.
#[derive(Debug, Clone)]
pub enum Job {
    /// `apply` or `check` (by `run.mode`).
    Pass(apply::Options),
    Status(status::Options),
    Clear(clear::Options),
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
            Command::Clear(a) => Job::Clear(clear::Options {
                clearing: if a.dry_run { clear::Clearing::DryRun } else { clear::Clearing::Remove },
                pending: if a.discard_pending { clear::PendingRecords::Discard } else { clear::PendingRecords::Refuse },
                lock_timeout: a.lock_timeout,
                report: a.report,
                paths: a.paths,
            }),
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
    use super::args::{parse_bool, parse_volume};
    use super::*;
    use crate::options::Privilege;
    use crate::spec::{self, Modes};

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
        assert!(t[2].1.access == crate::spec::Access::ReadOnly && t[2].1.fs_group == Some(3000));
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
