//! volprep: prepares Kubernetes volumes for a non-root app. `main` parses, sets up logging and
//! maps the outcome to the documented exit code; the work is in `app`.

mod app;
mod cli;
mod demo;
mod error;
mod escape;
mod fix;
mod inspect;
mod marker;
mod pass;
mod progress;
mod report;
mod shard;
mod spec;
mod status;
mod sticky;
mod sys;
mod volume;
mod walk;

use clap::Parser;

fn main() -> std::process::ExitCode {
    let cli = match cli::Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    app::init_logging(cli.log_format, &cli.log_level);
    match app::run(cli) {
        Ok(code) => code.into(),
        Err(e) => {
            tracing::error!("{e}");
            e.exit_code().into()
        }
    }
}
