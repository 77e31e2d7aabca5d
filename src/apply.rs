//! `volprep apply` / `volprep check`: makes the temp dirs, runs every volume (whole, or one shard
//! of it) on one thread pool, then logs the summaries, writes the termination message and the
//! report, and returns the exit code.

use std::path::{Path, PathBuf};

use crate::error::{Error, ExitCode};
use crate::escape::Escaped;
use crate::options::{self, Mode, Privilege, RunOptions, ShardFilter, Tolerance};
use crate::report::{self, Load, Report, VolumeReport};
use crate::spec::{Ownership, Spec};
use crate::throttle::{Policy, Storage};
use crate::{caps, guard, lifecycle, progress, shard, sticky, sys, volume, walk};

/// What `apply` or `check` was asked, as plain values.
#[derive(Debug, Clone)]
pub struct Options {
    /// How every volume is walked (mode, threads, resume, verification, ...).
    pub run: RunOptions,
    /// Every volume with its spec.
    pub targets: Vec<(PathBuf, Spec)>,
    /// Prepare only this shard of the (single) volume.
    pub shard: Option<ShardFilter>,
    /// Shared temp dirs to make (`--sticky`).
    pub sticky: Vec<PathBuf>,
    /// Per-entry errors tolerated before the exit code becomes 1, and whether entries of other
    /// users left (unprivileged) are a reason to exit 4.
    pub tolerates: Tolerance,
    /// Where the JSON report goes ('-': stdout).
    pub report: Option<PathBuf>,
    /// The Kubernetes termination message file (default: /dev/termination-log when it exists).
    pub termination_log: Option<PathBuf>,
    /// Prepare system directories (`/`, `/etc`, ...) too.
    pub allow_system_path: bool,
}

/// Refusals before any change: system directories (unless allowed), and a report or
/// termination message file at a symlink or inside a volume or temp dir being prepared.
fn refuse_before_starting(o: &Options) -> Result<(), Error> {
    let areas: Vec<&Path> =
        o.targets.iter().map(|(p, _)| p.as_path()).chain(o.sticky.iter().map(PathBuf::as_path)).collect();
    if !o.allow_system_path {
        guard::no_system_dirs(areas.iter().copied())?;
    }
    if let Some(dest) = &o.report {
        guard::output_file("--report", dest, &areas)?;
    }
    if let Some(dest) = &o.termination_log {
        guard::output_file("--termination-log", dest, &areas)?;
    }
    Ok(())
}

pub fn run(o: &Options) -> Result<ExitCode, Error> {
    refuse_before_starting(o)?;
    // `--threads 0` and `--load auto`: by the kind of filesystem, more threads and an adaptive
    // load when any volume is on network or FUSE storage.
    let storage = o.targets.iter().map(|(p, _)| sys::storage(p)).max().unwrap_or(Storage::Local);
    let load = Policy { concurrency: o.run.load.concurrency.resolve(storage), ..o.run.load };
    let chosen = if o.run.threads == 0 { ChosenBy::Default } else { ChosenBy::User };
    let opts = &fit_threads(
        RunOptions { threads: options::resolve_threads(o.run.threads, || storage), load, ..o.run.clone() },
        chosen,
    );
    refuse_overlaps(&o.targets, opts.cross_devices)?;
    check_groups(o, &sys::groups())?;
    warn_app_unknown(&o.targets);
    // SIGTERM (pod deletion, activeDeadlineSeconds) and SIGINT stop the walk, not the process:
    // the checkpoint, report and termination message are still written.
    sys::catch_termination();
    match progress::arm_test_hook().map_err(Error::Usage)? {
        Some(progress::Hook::Signal { after, signal }) => {
            tracing::warn!("test hook {}: signal {signal} after {after} entries", progress::KILL_AFTER_ENV);
        }
        Some(progress::Hook::Panic { after }) => {
            tracing::warn!("test hook {}: a panic after {after} entries", progress::PANIC_AFTER_ENV);
        }
        None => {}
    }
    progress::allocs::arm();
    // Started by the first volume that walks: a restart whose volumes all skip starts no thread.
    let pool = walk::Pool::new(opts.threads);
    // Temp dirs first (one syscall or two each), then every volume at once on the shared pool.
    let mut volumes: Vec<VolumeReport> = o.sticky.iter().map(|p| sticky_report(p, opts.mode)).collect();
    for v in &mut volumes {
        v.load = Load::of(&opts.load);
    }
    volumes.extend(run_volumes(o, opts, &pool));
    finish(o, volumes)
}

/// Says of each app-safe volume whose app's uid is not known that it gets the kubelet's rule.
fn warn_app_unknown(targets: &[(PathBuf, Spec)]) {
    for (path, spec) in targets {
        if spec.modes == crate::spec::Modes::AppSafe && spec.app().is_none() {
            tracing::warn!(path = %Escaped(path.as_os_str()),
                "--modes app-safe without the app's uid: no entry is known to be the app's, so every entry gets the kubelet's bits; give --app-uid UID (the pod's runAsUser) or --owner UID");
        }
    }
}

/// The options of the volume at `path`: the run's, with `--load auto` resolved by the volume's
/// own storage (each pass has a gate of its own: a local volume of a run that also prepares a
/// network one walks at full speed).
fn volume_options(o: &Options, opts: &RunOptions, path: &Path) -> RunOptions {
    let concurrency = o.run.load.concurrency.resolve(sys::storage(path));
    RunOptions { load: Policy { concurrency, ..opts.load }, ..opts.clone() }
}

/// Every volume at once, each on a thread of its own walking on the shared `pool`.
fn run_volumes(o: &Options, opts: &RunOptions, pool: &walk::Pool) -> Vec<VolumeReport> {
    std::thread::scope(|s| {
        let threads: Vec<_> = o
            .targets
            .iter()
            .map(|(path, spec)| (path, spec, s.spawn(|| one_volume(o, opts, pool, path, spec))))
            .collect();
        threads
            .into_iter()
            .map(|(path, spec, t)| {
                t.join().unwrap_or_else(|payload| VolumeReport {
                    load: Load::of(&opts.load),
                    ..VolumeReport::failed(path, spec, opts.threads, &Error::internal(path, &*payload))
                })
            })
            .collect()
    })
}

/// The whole volume or its shard, with its summary logged. A volume that fails (a panic in its
/// pass included) gets a failed report; the others go on.
fn one_volume(o: &Options, opts: &RunOptions, pool: &walk::Pool, path: &Path, spec: &Spec) -> VolumeReport {
    let opts = &volume_options(o, opts, path);
    let pass = || match o.shard {
        Some(f) => shard::run(path, spec, opts, f, pool),
        None => volume::run(path, spec, opts, pool),
    };
    match lifecycle::contained(path, pass) {
        Ok(v) => {
            log_summary(&v, o.tolerates);
            v
        }
        Err(e) => {
            tracing::error!("{e}");
            VolumeReport { load: Load::of(&opts.load), ..VolumeReport::failed(path, spec, opts.threads, &e) }
        }
    }
}

/// The summaries in the log and the termination message, the report, and the exit code.
fn finish(o: &Options, volumes: Vec<VolumeReport>) -> Result<ExitCode, Error> {
    let codes: Vec<ExitCode> = volumes.iter().map(|v| v.exit_code(o.tolerates)).collect();
    let mut missing = missing_capabilities(&volumes);
    if crate::logsink::dropped() > 0 {
        missing.push(format!("{} log line(s) could not be written to stderr", crate::logsink::dropped()));
    }
    write_termination_log(o.termination_log.as_deref(), &volumes, &missing);
    if let Some(dest) = &o.report {
        report::write(&Report::new(volumes), dest)?;
    }
    // A signal's code comes from the volumes it stopped (each report carries it): a signal
    // that came once every pass had ended stopped nothing.
    Ok(ExitCode::merge(codes))
}

/// Refuses volumes that overlap (one inside another, or one directory twice, by any path:
/// symlinks and bind mounts included) with different specs, before anything is changed: their
/// passes would race, and each would leave its own `done` marker over the other's entries.
fn refuse_overlaps(targets: &[(PathBuf, Spec)], cross_devices: bool) -> Result<(), Error> {
    use std::os::unix::fs::MetadataExt;
    // Each volume's root and its ancestors up to `/`, by (device, inode). A volume that can't be
    // resolved fails on its own later.
    let chains: Vec<Option<Vec<(u64, u64)>>> = targets
        .iter()
        .map(|(p, _)| {
            let canon = std::fs::canonicalize(p).ok()?;
            canon.ancestors().map(|a| std::fs::metadata(a).ok().map(|m| (m.dev(), m.ino()))).collect()
        })
        .collect();
    for (i, (pi, si)) in targets.iter().enumerate() {
        for (j, (pj, sj)) in targets.iter().enumerate() {
            let (Some(ci), Some(cj)) = (&chains[i], &chains[j]) else { continue };
            if i == j || si.coverage_digest(cross_devices) == sj.coverage_digest(cross_devices) || !cj.contains(&ci[0])
            {
                continue;
            }
            // Volume j is volume i or inside it.
            let (outer, inner) = (Escaped(pi.as_os_str()), Escaped(pj.as_os_str()));
            let how = if ci[0] == cj[0] { "is the same directory as" } else { "is inside" };
            return Err(Error::Usage(format!(
                "volumes overlap with different specs: {inner} ({sj}) {how} {outer} ({si}); their passes would race \
                 and leave entries with either spec: give a directory one spec"
            )));
        }
    }
    Ok(())
}

/// Unprivileged: the kernel lets an owner give its entries only a group it is in, so every
/// volume's group must be one of `groups` (this process's). Checked for every volume before any
/// is touched; a usage error, since no retry can help.
fn check_groups(o: &Options, groups: &[u32]) -> Result<(), Error> {
    let Privilege::Unprivileged { uid } = o.run.privilege else {
        return Ok(());
    };
    for (path, spec) in &o.targets {
        if let Some(gid) = spec.gid().filter(|g| !groups.contains(g)) {
            let list = groups.iter().map(u32::to_string).collect::<Vec<_>>().join(", ");
            return Err(Error::Usage(format!(
                "{}: group {gid} is not one of this process's groups (uid {uid}, groups {list}), and an unprivileged volprep can only give its files a group it is in: run the init container with supplementalGroups: [{gid}]",
                Escaped(path.as_os_str())
            )));
        }
    }
    Ok(())
}

/// One ERROR line per capability the permission errors of the run point to and the process
/// lacks (e.g. `capabilities.add` without FOWNER); returns those lines.
fn missing_capabilities(volumes: &[VolumeReport]) -> Vec<String> {
    let failures = volumes.iter().flat_map(|v| v.error_list.iter().map(|e| (e.op, e.errno)));
    let Some(effective) = caps::effective() else {
        return Vec::new();
    };
    let lines: Vec<String> = caps::missing(failures, effective).iter().map(caps::message).collect();
    for line in &lines {
        tracing::error!("{line}");
    }
    lines
}

/// Who chose a run's thread count: a cut of the user's `--threads` is a warning, a cut of the
/// default a debug line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ChosenBy {
    User,
    Default,
}

/// The options with the thread count (`chosen` by whom) cut to what the open-file limit carries
/// (each walker thread may hold a few descriptors at once, see `walk`), saying so when it is cut.
fn fit_threads(mut run: RunOptions, chosen: ChosenBy) -> RunOptions {
    let limit = sys::fd_limit();
    let max = walk::max_threads_for(limit);
    if run.threads > max {
        let why = format!("{} threads need more than the open-file limit of {limit} allows: using {max}", run.threads);
        match chosen {
            ChosenBy::User => tracing::warn!("{why} (raise `ulimit -n` for more)"),
            ChosenBy::Default => tracing::debug!("{why}"),
        }
        run.threads = max;
    }
    run
}

/// The summary line, with its figures as fields: an error when the volume fails the run (exit
/// code 1), a warning when it had only tolerated errors (`--max-errors`). The count of entries
/// whose ownership changed is `changed_group` when the spec sets the group alone, else
/// `changed_owner` (the report's key is `changed_owner` either way).
fn log_summary(v: &VolumeReport, tolerates: Tolerance) {
    let action = format!("{:?}", v.action).to_lowercase();
    let (changed_group, changed_owner) = split_changed(&v.spec, v.counts.changed_owner);
    macro_rules! summary {
        ($level:expr) => {
            tracing::event!(
                $level,
                path = v.path.as_str(),
                action = action.as_str(),
                entries = v.counts.entries,
                changed_group,
                changed_owner,
                changed_mode = v.counts.changed_mode,
                errors = v.counts.errors,
                foreign_owned = v.counts.foreign_owned,
                elapsed_ms = v.timing.elapsed_ms,
                marker = v.marker_after.name(),
                "{}",
                v.summary()
            )
        };
    }
    let code = v.exit_code(tolerates);
    if matches!(code, ExitCode::Failure | ExitCode::OwnershipIgnored) {
        summary!(tracing::Level::ERROR)
    } else if v.counts.errors > 0 || v.counts.foreign_owned > 0 {
        summary!(tracing::Level::WARN)
    } else {
        summary!(tracing::Level::INFO)
    }
}

/// `n` as (`changed_group`, `changed_owner`) of a log line: the first when `spec` (in words)
/// sets the group alone, the other otherwise; a field that is `None` is not logged.
fn split_changed(spec: &str, n: u64) -> (Option<u64>, Option<u64>) {
    if Ownership::of_words(spec) == Some(Ownership::Group) { (Some(n), None) } else { (None, Some(n)) }
}

/// Writes the summaries where Kubernetes shows them as the container's termination message:
/// `--termination-log PATH`, else /dev/termination-log when it exists, followed by the
/// missing-capability lines while they fit. A failure is a warning.
fn write_termination_log(path: Option<&Path>, volumes: &[VolumeReport], extra: &[String]) {
    let default = Path::new("/dev/termination-log");
    let path = match path {
        Some(p) => p,
        None if default.exists() => default,
        None => return,
    };
    let mut message = report::termination_message(volumes);
    for line in extra {
        if message.len() + line.len() < report::TERMINATION_MAX_BYTES {
            message += line;
            message.push('\n');
        }
    }
    if options::is_stdout(path) {
        let _ = report::print(message.as_bytes());
    } else if let Err(e) = report::write_file(path, message.as_bytes()) {
        tracing::warn!("{}: cannot write the termination message: {e}", path.display());
    }
}

fn sticky_report(path: &Path, mode: Mode) -> VolumeReport {
    sticky::run(path, mode).unwrap_or_else(|e| {
        tracing::error!("{e}");
        let spec = Spec::default();
        VolumeReport { spec: "sticky".into(), ..VolumeReport::failed(path, &spec, 1, &e) }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_log_line_says_group_when_only_the_group_changes() {
        assert_eq!(split_changed("fs-group=2000", 7), (Some(7), None));
        assert_eq!(split_changed("fs-group=2000 read-only modes=app-safe", 7), (Some(7), None));
        for owner in ["owner=5", "owner=5:6", "fs-group=2000 owner=5", "sticky"] {
            assert_eq!(split_changed(owner, 7), (None, Some(7)), "{owner}");
        }
    }

    fn options(privilege: Privilege, gids: &[u32]) -> Options {
        let spec = Spec::group;
        Options {
            targets: gids.iter().map(|&g| (PathBuf::from(format!("/v{g}")), spec(g))).collect(),
            sticky: Vec::new(),
            shard: None,
            run: RunOptions { privilege, ..RunOptions::new(Mode::Apply, 1) },
            tolerates: Tolerance::NONE,
            report: None,
            termination_log: None,
            allow_system_path: false,
        }
    }

    #[test]
    fn an_unprivileged_run_needs_every_group_among_its_own() {
        let me = Privilege::Unprivileged { uid: 1000 };
        assert!(check_groups(&options(me, &[2000, 1000]), &[1000, 2000]).is_ok());
        let e = check_groups(&options(me, &[1000, 3000]), &[1000, 2000]).unwrap_err();
        assert_eq!(e.exit_code(), ExitCode::Usage);
        let text = e.to_string();
        assert!(text.starts_with("/v3000: group 3000 is not one of"), "{text}");
        assert!(text.contains("supplementalGroups: [3000]"), "{text}");
        assert!(check_groups(&options(Privilege::Full, &[3000]), &[0]).is_ok(), "root may give any group");
    }
}
