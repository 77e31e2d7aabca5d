//! Runs the process: sets up logging, turns the command line into a job, dispatches it to its
//! command, and returns the exit code.

use std::io::IsTerminal;

use tracing::level_filters::LevelFilter;
use tracing_subscriber::EnvFilter;

use crate::cli::{Cli, Job, LogLevel};
use crate::error::{Error, ExitCode};
use crate::options::LogFormat;
use crate::{apply, clear, demo, inject, inspect, logsink, merge, status};

/// Sets up `tracing` on stderr (stdout is for the JSON report), through [`logsink`], at
/// `level`, or as `RUST_LOG` says when it is set. A `RUST_LOG` that is no valid filter is
/// ignored with a warning (it is a variable other programs read too: not worth failing for).
pub fn init_logging(format: LogFormat, level: LogLevel) {
    let rust_log = std::env::var("RUST_LOG").ok().filter(|v| !v.trim().is_empty());
    let (filter, rejected) = match rust_log.as_deref().map(rust_log_filter) {
        Some(Ok(filter)) => (filter, None),
        Some(Err(why)) => (EnvFilter::default().add_directive(level_filter(level).into()), Some(why)),
        None => (EnvFilter::default().add_directive(level_filter(level).into()), None),
    };
    // Write failures are dropped and counted by the sink, never reported through `eprintln!`
    // (which panics when stderr itself is what failed).
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(logsink::Stderr)
        .log_internal_errors(false)
        .with_target(false);
    match format {
        LogFormat::Json => builder.json().flatten_event(true).init(),
        LogFormat::Text => builder.with_ansi(std::io::stderr().is_terminal()).init(),
    }
    // A panic (a bug) is logged as one line in the log's format, with its place in the code;
    // `lifecycle::contained` then fails the volume it happened in.
    std::panic::set_hook(Box::new(|info| {
        let at = info.location().map(|l| format!("{}:{}", l.file(), l.line())).unwrap_or_default();
        tracing::error!(at = at.as_str(), "internal error: {}", crate::error::panic_text(info.payload()));
    }));
    if let Some(why) = rejected {
        tracing::warn!("RUST_LOG ignored: {why}; logging at --log-level {}", level_filter(level));
    }
}

fn level_filter(level: LogLevel) -> LevelFilter {
    match level {
        LogLevel::Error => LevelFilter::ERROR,
        LogLevel::Warn => LevelFilter::WARN,
        LogLevel::Info => LevelFilter::INFO,
        LogLevel::Debug => LevelFilter::DEBUG,
        LogLevel::Trace => LevelFilter::TRACE,
    }
}

/// `RUST_LOG` as a filter, or why not: it does not parse, or a bare word in it is neither a
/// level nor a module of volprep (`inf` would filter for a target named `inf`, logging nothing).
fn rust_log_filter(v: &str) -> Result<EnvFilter, String> {
    for d in v.split(',').map(str::trim).filter(|d| !d.is_empty()) {
        let bare = !d.contains(['=', '[']);
        if bare && d.parse::<LevelFilter>().is_err() && d != "volprep" && !d.starts_with("volprep::") {
            let whole = if d == v.trim() { String::new() } else { format!(" in '{v}'") };
            return Err(format!(
                "'{d}'{whole} is neither a level (error, warn, info, debug, trace, off) nor a volprep module"
            ));
        }
    }
    EnvFilter::builder().parse(v).map_err(|e| format!("'{v}' is not a valid filter ({e})"))
}

pub fn run(cli: Cli) -> Result<ExitCode, Error> {
    crate::sys::raise_fd_limit();
    match cli.job().map_err(Error::Usage)? {
        Job::Pass(o) => apply::run(&o),
        Job::Status(o) => status::run(&o),
        Job::Clear(o) => clear::run(&o),
        Job::Merge(o) => merge::run(&o),
        Job::Inspect(o) => inspect::run(&o),
        Job::Demo(o) => demo::run(&o),
        Job::Inject(o) => inject::run(&o),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rust_log_takes_levels_and_volprep_targets_and_refuses_typos() {
        for ok in ["debug", "WARN", "volprep=debug", "info,volprep::walk=trace", "volprep", "off", "3"] {
            assert!(rust_log_filter(ok).is_ok(), "{ok}");
        }
        for bad in ["inf", "debug,verbose", "volprep=loud", "volprep[{"] {
            let e = rust_log_filter(bad).err().unwrap_or_else(|| panic!("{bad} accepted"));
            assert!(e.contains(bad), "{e}");
        }
    }
}
