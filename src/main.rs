//! volprep: prepares Kubernetes volumes for a non-root app. `main` parses, sets up logging and
//! maps the outcome to the documented exit code; the work is in `app`.

// Layers, top to bottom: a module only imports modules below it (tests/layers.rs checks).
// Process and command line:
mod app;
mod cli;
mod inject_args;
// Commands:
mod apply;
mod clear;
mod demo;
mod inject;
mod inspect;
mod merge;
mod status;
// One volume (or one shard of it, or one temp dir) from start to end:
mod shard;
mod sticky;
mod volume;
// The lifecycle of one pass, shared by a volume and a shard:
mod lifecycle;
// The pass: the visitor and its resume state:
mod pass;
mod resume;
// Walking, deciding and fixing, the marker, progress, refusals made up front:
mod caps;
mod fix;
mod frontier;
mod guard;
mod marker;
mod progress;
mod walk;
// The report's data and rendering:
mod report;
// Whether a finished subtree changed since (the filesystem's clock); whether the storage
// honours ownership changes:
mod honour;
mod verify;
// App-private paths and the app-safe mode rule:
mod apps;
// Ground: syscalls, the spec, option values, errors, run ids, escaping, the log sink, state words:
mod bounded;
mod error;
mod escape;
mod logsink;
mod options;
mod runid;
mod spec;
mod special;
mod state;
mod sync;
mod sys;
// Below the syscalls: the gate every metadata syscall of a walk passes (load on the storage):
mod throttle;

use clap::Parser;

fn main() -> std::process::ExitCode {
    let cli = match cli::Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    app::init_logging(cli.log_format, cli.log_level);
    match app::run(cli) {
        Ok(code) => code.into(),
        Err(e) => {
            tracing::error!("{e}");
            e.exit_code().into()
        }
    }
}
