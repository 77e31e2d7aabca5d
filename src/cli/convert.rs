//! Parsed arguments into plain values: the spec flags into a `Spec`, `apply`/`check`'s into `apply::Options`.

use std::path::PathBuf;

use crate::apply;
use crate::options::{
    self, Foreign, Mode, Privilege, PrivilegeAsk, ProgressStyle, RunOptions, ShardFilter, Stderr, Tolerance, Verify,
};
use crate::spec::{self, Access, Modes, Spec};
use crate::throttle::{Concurrency, Policy};

use super::args::{LoadArg, PassArgs, SpecArgs, VerifyArg, volumes_from_env};

impl SpecArgs {
    /// The spec the flags ask for, as they are (maybe nothing).
    pub fn spec(&self) -> Spec {
        let owner = self.owner.map_or_else(Spec::default, |(uid, gid)| Spec::owner(uid, gid));
        let modes = self.modes.map_or(Modes::Kubelet, Modes::from);
        let mut rules = self.rules.clone();
        rules.sort();
        Spec {
            fs_group: self.fs_group,
            access: Access::from_flag(self.read_only),
            modes,
            app_uid: self.app_uid,
            rules,
            ..owner
        }
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
        if spec.access == Access::ReadOnly && spec.fs_group.is_none() {
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
        let privilege = Privilege::pick(PrivilegeAsk::from_flag(self.unprivileged), euid);
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
