//! Runs the process: sets up logging, turns the command line into a job, dispatches it to its
//! command, and returns the exit code.

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

use crate::cli::{Cli, Job, LogFormat};
use crate::error::{Error, ExitCode};
use crate::{apply, demo, inject, inspect, merge, status};

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
    match cli.job().map_err(Error::Usage)? {
        Job::Pass(o) => apply::run(&o),
        Job::Status(o) => status::run(&o),
        Job::Merge(o) => merge::run(&o),
        Job::Inspect(o) => inspect::run(&o),
        Job::Demo(o) => demo::run(&o),
        Job::Inject(o) => inject::run(&o),
    }
}
