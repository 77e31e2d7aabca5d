//! Runs a command: builds the spec and options from `cli`, passes over each volume, then
//! prints the summaries, writes the report and returns the exit code.

use std::io::IsTerminal;

use tracing::info;
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
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false);
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
        Command::Inspect(args) => crate::inspect::run(&args),
        Command::Demo(args) => crate::demo::run(&args),
    }
}

fn run_pass(args: &PassArgs, mode: Mode, log_format: LogFormat) -> Result<ExitCode, Error> {
    let spec = args.spec.to_spec().map_err(Error::Usage)?;
    let opts = args.run_options(mode, log_format == LogFormat::Text);
    let pool = rayon_core::ThreadPoolBuilder::new()
        .num_threads(opts.threads)
        .thread_name(|i| format!("volprep-{i}"))
        .build()
        .map_err(|e| Error::Usage(format!("cannot start {} threads: {e}", opts.threads)))?;
    let mut volumes = Vec::new();
    let mut codes = Vec::new();
    for path in &args.paths {
        let vol = match pool.install(|| volume::run(path, &spec, &opts)) {
            Ok(v) => {
                info!("{}", v.summary());
                v
            }
            Err(e) => {
                tracing::error!("{e}");
                VolumeReport::failed(path, &spec, opts.threads, &e)
            }
        };
        codes.push(volume_exit_code(&vol, args.max_errors));
        volumes.push(vol);
    }
    if let Some(dest) = &args.report {
        report::write(
            &Report {
                version: 1,
                volumes,
            },
            dest,
        )?;
    }
    Ok(ExitCode::merge(codes))
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
