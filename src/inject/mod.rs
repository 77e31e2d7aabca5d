//! `volprep inject`: rewrites rendered Kubernetes manifests (a multi-document YAML stream, or a
//! kustomize KRM `ResourceList`) so the pods that leave their volumes to the kubelet's fsGroup
//! pass get the volprep init container instead. A command: nothing below it imports it.

mod check;
mod config;
mod emit;
mod krm;
mod node;
mod object;
mod parse;
mod patch;
mod rewrite;
mod select;
mod split;
mod stream;
mod summary;
mod volumes;

use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use crate::error::{Error, ExitCode, InjectError, InjectErrorKind};
use crate::escape::EscapedPath;

pub use config::{Config, Mode, REFUSED_ANNOTATION, value_of};
pub use node::Node;
use stream::inject_stream_as;
#[cfg(test)]
use stream::{MAX_REWRITE, SKIM_OVER, inject_stream};
use summary::{log_events, refusals};

/// Largest input read, all files together.
pub const MAX_INPUT: u64 = 64 << 20;

/// What `inject` writes to stdout.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Emit {
    /// The manifests, rewritten.
    #[default]
    Manifests,
    /// The kustomize patches (JSON 6902, with targets) that make the same change.
    Patches,
}

/// `inject`'s plain options.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// Inputs; none: stdin.
    pub files: Vec<PathBuf>,
    /// A YAML file of configuration keys.
    pub config_file: Option<PathBuf>,
    /// `KEY` and value from flags and the environment, applied last (over a KRM function config).
    pub overrides: Vec<(String, Node)>,
    /// What a refusal makes of the run (`--strict`: an error, exit 5, nothing written).
    pub refusal: Refusal,
    /// An error or a `--strict` refusal writes its reasons to stdout and exits 0 (Helm 4).
    pub errors_on_stdout: bool,
    /// A usage error found in the command line, reported by `run` (with `errors_on_stdout`).
    pub usage_error: Option<String>,
    pub emit: Emit,
}

/// What a workload inject refuses to rewrite makes of the run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Refusal {
    /// A warning: the workload is left unchanged, the rest is written.
    #[default]
    Warn,
    /// `--strict`: an error: exit 5 and nothing written.
    Error,
}

impl Refusal {
    /// `--strict` given or not.
    pub fn from_flag(strict: bool) -> Refusal {
        if strict { Refusal::Error } else { Refusal::Warn }
    }
}

/// What became of one object.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    Injected,
    /// Left unchanged (but for the refusal annotation): the rewrite would change what the app
    /// may read or do. Warned about; an error under `--strict`.
    Refused(Vec<String>),
    /// Left as it is because inject cannot read it as Kubernetes does: said at info level.
    Unsupported(String),
    /// Nothing to do: not a candidate (said at debug level).
    Skipped(String),
}

/// One object's outcome, with where it was (`FILE:LINE`) and what it is (`Kind/name`).
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    pub at: String,
    pub what: String,
    pub outcome: Outcome,
    /// Injected: the apps of the table it runs under the kubelet's rule (said, and annotated).
    pub apps: Vec<String>,
}

/// The annotation on an injected workload that runs an app insisting on private modes under the
/// kubelet's rule: which, and the setting that keeps it working.
pub const APP_MODES_ANNOTATION: &str = "volprep.io/app-modes";

/// A rewritten stream, the patches that make the same change, and what happened to each object.
#[derive(Debug, Default)]
pub struct Output {
    pub text: String,
    pub patches: Vec<Node>,
    pub events: Vec<Event>,
}

/// The configuration: `base` (defaults and config file), a KRM function config, overrides.
pub fn config(base: &Config, function_config: Option<&Node>, overrides: &[(String, Node)]) -> Result<Config, String> {
    let mut cfg = base.clone();
    if let Some(fc) = function_config {
        krm::merge_function_config(&mut cfg, fc)?;
    }
    for (k, v) in overrides {
        cfg.set(k, v)?;
    }
    Ok(cfg)
}

/// Reads every input (stdin for none, named `-`) with its name, at most MAX_INPUT bytes.
fn read_inputs(files: &[PathBuf]) -> Result<Vec<(PathBuf, String)>, InjectError> {
    let mut out = Vec::new();
    let mut budget = MAX_INPUT;
    let mut read = |name: &Path, r: &mut dyn Read| -> Result<(), InjectError> {
        let mut buf = Vec::new();
        let err = |kind| InjectError::of(name, kind);
        r.take(budget + 1)
            .read_to_end(&mut buf)
            .map_err(|e| err(InjectErrorKind::Read { op: "read", cause: e.to_string() }))?;
        if buf.len() as u64 > budget {
            return Err(err(InjectErrorKind::TooBig { limit_mib: MAX_INPUT >> 20 }));
        }
        budget -= buf.len() as u64;
        let text = String::from_utf8(buf)
            .map_err(|e| err(InjectErrorKind::NotUtf8 { valid_up_to: e.utf8_error().valid_up_to() }))?;
        out.push((name.to_path_buf(), text));
        Ok(())
    };
    if files.is_empty() {
        read(Path::new("-"), &mut std::io::stdin().lock())?;
    }
    for f in files {
        if f.as_os_str() == "-" {
            read(f, &mut std::io::stdin().lock())?;
            continue;
        }
        let mut file = std::fs::File::open(f)
            .map_err(|e| InjectError::of(f, InjectErrorKind::Read { op: "open", cause: e.to_string() }))?;
        read(f, &mut file)?;
    }
    Ok(out)
}

/// The base configuration: defaults and the config file.
fn base_config(opts: &Options) -> Result<Config, Error> {
    let mut cfg = Config::default();
    if let Some(path) = &opts.config_file {
        let name = EscapedPath::new(path);
        let text = std::fs::read_to_string(path).map_err(|e| Error::Usage(format!("{name}: cannot read: {e}")))?;
        let docs = parse::parse(&text)
            .map_err(|e| Error::Usage(format!("{name}:{}:{}: not YAML: {}", e.line, e.col, e.msg)))?;
        if let Some(doc) = docs.first() {
            cfg.merge(doc).map_err(|e| Error::Usage(format!("{name}: {e}")))?;
        }
    }
    config(&cfg, None, &opts.overrides).map_err(Error::Usage)?;
    Ok(cfg)
}

pub fn run(opts: &Options) -> Result<ExitCode, Error> {
    let mut reasons = Vec::new();
    let result = run_with(opts, &mut reasons);
    if !opts.errors_on_stdout {
        return result;
    }
    let code = match result {
        Ok(ExitCode::Success) => return result,
        Ok(code) => code,
        Err(e) => {
            tracing::error!("{e}");
            reasons.push(e.to_string());
            e.exit_code()
        }
    };
    write_reasons(&reasons, code)?;
    Ok(ExitCode::Success)
}

/// The reasons inject wrote nothing, as one YAML document on stdout: a comment, then a literal
/// block (a scalar, so no Kubernetes tool takes it for an object; Helm 4 shows it).
fn write_reasons(reasons: &[String], code: ExitCode) -> Result<(), Error> {
    let mut text = format!("# volprep inject failed (exit status {}): nothing rendered\n|-\n", code as i32);
    for r in reasons {
        for line in r.lines() {
            text.push_str("  ");
            text.push_str(&line.replace(|c: char| c.is_control() && c != '\t', " "));
            text.push('\n');
        }
    }
    let mut stdout = std::io::stdout().lock();
    stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
        .map_err(|e| Error::Inject(InjectError::of("-", InjectErrorKind::Write(e.to_string()))))
}

/// [`run`], the reasons of a `--strict` refusal added to `reasons`.
fn run_with(opts: &Options, reasons: &mut Vec<String>) -> Result<ExitCode, Error> {
    if let Some(e) = &opts.usage_error {
        return Err(Error::Usage(e.clone()));
    }
    let base = base_config(opts)?;
    let inputs = read_inputs(&opts.files).map_err(Error::Inject)?;
    let mut text = String::new();
    let mut patches = Vec::new();
    let mut events = Vec::new();
    for (path, input) in &inputs {
        let out = inject_stream_as(input, path, &base, &opts.overrides, opts.emit).map_err(Error::Inject)?;
        if !text.is_empty() && !out.text.is_empty() {
            if !text.ends_with('\n') {
                text.push('\n');
            }
            if !out.text.starts_with("---") {
                text.push_str("---\n");
            }
        }
        if text.is_empty() {
            text = out.text;
        } else {
            text.push_str(&out.text);
        }
        patches.extend(out.patches);
        events.extend(out.events);
    }
    let tally = log_events(&events, opts.refusal);
    if tally.refused > 0 && opts.refusal == Refusal::Error {
        let last = format!("{} workload(s) refused (--strict): nothing written", tally.refused);
        tracing::error!("{last}");
        reasons.extend(refusals(&events));
        reasons.push(last);
        return Ok(ExitCode::Refused);
    }
    tally.summary();
    if opts.emit == Emit::Patches {
        text = if patches.is_empty() {
            "[]\n".to_string()
        } else {
            emit::document(&Node::seq(patches), emit::Seqs::Indented)
                .map_err(|e| Error::Inject(InjectError::of("-", InjectErrorKind::Unwritable(e))))?
        };
    }
    let mut stdout = std::io::stdout().lock();
    stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
        .map_err(|e| Error::Inject(InjectError::of("-", InjectErrorKind::Write(e.to_string()))))?;
    Ok(ExitCode::Success)
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_roundtrip;
#[cfg(test)]
mod tests_shapes;
#[cfg(test)]
mod tests_volumes;
#[cfg(test)]
mod tests_yaml;
