//! Runs a command: builds the spec and options from `cli`, passes over each volume, then
//! prints the summaries, writes the report and returns the exit code.

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

use crate::cli::{Cli, Command, LogFormat, PassArgs};
use crate::error::{Error, ExitCode};
use crate::pass::Mode;
use crate::report::{self, Action, Report, VolumeReport};
use crate::volume;

/// Sets up `tracing` on stderr (stdout is for the JSON report).
pub fn init_logging(format: LogFormat, level: &str) {
    let filter = std::env::var("RUST_LOG")
        .ok()
        .and_then(|v| EnvFilter::try_new(v).ok())
        .unwrap_or_else(|| EnvFilter::try_new(level).unwrap_or_else(|_| EnvFilter::new("info")));
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_target(false);
    match format {
        LogFormat::Json => builder.json().flatten_event(true).init(),
        LogFormat::Text => builder.with_ansi(std::io::stderr().is_terminal()).init(),
    }
}

pub fn run(cli: Cli) -> Result<ExitCode, Error> {
    crate::sys::raise_fd_limit();
    match cli.command {
        Command::Apply(args) => run_pass(&args, Mode::Apply, cli.log_format),
        Command::Check(args) => run_pass(&args, Mode::Check, cli.log_format),
        Command::Status(args) => crate::status::run(&args),
        Command::Report(crate::cli::ReportCommand::Merge { json, files }) => report::merge_files(&files, json),
        Command::Inspect(args) => crate::inspect::run(&args),
        Command::Demo(args) => crate::demo::run(&args),
    }
}

fn run_pass(args: &PassArgs, mode: Mode, log_format: LogFormat) -> Result<ExitCode, Error> {
    let targets = args.targets().map_err(Error::Usage)?;
    let shard = args.shard_filter().map_err(Error::Usage)?;
    if shard.is_some() && mode == Mode::Check {
        return Err(Error::Usage("--shard is for apply; check a volume whole".into()));
    }
    let opts = args.run_options(mode, log_format == LogFormat::Text);
    let pool = rayon_core::ThreadPoolBuilder::new()
        .num_threads(opts.threads)
        .thread_name(|i| format!("volprep-{i}"))
        .build()
        .map_err(|e| Error::Usage(format!("cannot start {} threads: {e}", opts.threads)))?;
    // Temp dirs first (one syscall or two each), then every volume at once on the shared pool.
    let mut volumes: Vec<VolumeReport> = args.sticky.iter().map(|p| sticky_report(p, mode)).collect();
    let walked: Vec<VolumeReport> = std::thread::scope(|s| {
        let handles: Vec<_> = targets
            .iter()
            .map(|(path, spec)| {
                let (pool, opts) = (&pool, &opts);
                let run = move || match shard {
                    Some(f) => crate::shard::run(path, spec, opts, f),
                    None => volume::run(path, spec, opts),
                };
                s.spawn(move || match pool.install(run) {
                    Ok(v) => {
                        log_summary(&v);
                        v
                    }
                    Err(e) => {
                        tracing::error!("{e}");
                        VolumeReport::failed(path, spec, opts.threads, &e)
                    }
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p))).collect()
    });
    volumes.extend(walked);
    let codes: Vec<ExitCode> = volumes.iter().map(|v| volume_exit_code(v, args.max_errors)).collect();
    write_termination_log(args.termination_log.as_deref(), &volumes);
    if let Some(dest) = &args.report {
        report::write(&Report { version: 1, volumes }, dest)?;
    }
    Ok(ExitCode::merge(codes))
}

/// The summary line, with its figures as fields; a warning when an entry failed.
fn log_summary(v: &VolumeReport) {
    let action = format!("{:?}", v.action).to_lowercase();
    macro_rules! summary {
        ($level:expr) => {
            tracing::event!(
                $level,
                path = v.path.as_str(),
                action = action.as_str(),
                entries = v.entries,
                changed_owner = v.changed_owner,
                changed_mode = v.changed_mode,
                errors = v.errors,
                elapsed_ms = v.elapsed_ms,
                marker = v.marker_after.as_str(),
                "{}",
                v.summary()
            )
        };
    }
    if v.errors > 0 { summary!(tracing::Level::WARN) } else { summary!(tracing::Level::INFO) }
}

/// Writes the summaries where Kubernetes shows them as the container's termination message:
/// `--termination-log PATH`, else /dev/termination-log when it exists. A failure is a warning.
fn write_termination_log(path: Option<&std::path::Path>, volumes: &[VolumeReport]) {
    let default = std::path::Path::new("/dev/termination-log");
    let path = match path {
        Some(p) => p,
        None if default.exists() => default,
        None => return,
    };
    if let Err(e) = std::fs::write(path, report::termination_message(volumes)) {
        tracing::warn!("{}: cannot write the termination message: {e}", path.display());
    }
}

fn sticky_report(path: &std::path::Path, mode: Mode) -> VolumeReport {
    crate::sticky::run(path, mode).unwrap_or_else(|e| {
        tracing::error!("{e}");
        let spec = crate::spec::Spec { fs_group: None, owner_uid: None, owner_gid: None, read_only: false };
        VolumeReport { spec: "sticky".into(), ..VolumeReport::failed(path, &spec, 1, &e) }
    })
}

/// The exit code one volume's outcome stands for.
pub fn volume_exit_code(v: &VolumeReport, max_errors: u64) -> ExitCode {
    if v.fatal.is_some() || v.errors > max_errors {
        ExitCode::Failure
    } else if v.action == Action::Checked && v.changed_owner + v.changed_mode > 0 {
        ExitCode::WouldChange
    } else {
        ExitCode::Success
    }
}
