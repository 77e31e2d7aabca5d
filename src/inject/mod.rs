//! `volprep inject`: rewrites rendered Kubernetes manifests (a multi-document YAML stream, or a
//! kustomize KRM `ResourceList`) so the pods that leave their volumes to the kubelet's fsGroup
//! pass get the volprep init container instead. A command: nothing below it imports it.

mod config;
mod emit;
mod krm;
mod node;
mod parse;
mod rewrite;
mod select;
mod split;

use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use crate::error::{Error, ExitCode};
use crate::escape::EscapedPath;

pub use config::{Config, value_of};
pub use node::Node;

/// Largest input read, all files together.
pub const MAX_INPUT: u64 = 64 << 20;

/// `inject`'s plain options.
#[derive(Debug, Clone)]
pub struct Options {
    /// Inputs; none: stdin.
    pub files: Vec<PathBuf>,
    /// A YAML file of configuration keys.
    pub config_file: Option<PathBuf>,
    /// `KEY` and value from flags and the environment, applied last (over a KRM function config).
    pub overrides: Vec<(String, Node)>,
    /// A refusal is an error: exit 5, nothing written.
    pub strict: bool,
}

/// What became of one object.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    Injected,
    Refused(Vec<String>),
    Skipped(String),
}

/// One object's outcome, with where it was (`FILE:LINE`) and what it is (`Kind/name`).
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    pub at: String,
    pub what: String,
    pub outcome: Outcome,
}

/// A rewritten stream and what happened to each object.
#[derive(Debug, Default)]
pub struct Output {
    pub text: String,
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

/// Why an input could not be rewritten, and where in it: `:LINE[:COL]` after its name, or
/// nothing (the input as a whole).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamError {
    pub line: String,
    pub msg: String,
}

impl StreamError {
    fn new(line: impl Into<String>, msg: impl Into<String>) -> StreamError {
        StreamError { line: line.into(), msg: msg.into() }
    }

    /// The error of the input named `source`, at `SOURCE:LINE[:COL]` (the raw name followed by
    /// the line is escaped once, when shown: the line is ASCII).
    fn of(self, source: &Path) -> Error {
        let mut at = source.as_os_str().to_owned();
        at.push(&self.line);
        Error::Other { path: at.into(), msg: self.msg }
    }
}

/// Rewrites one input. Documents left alone are copied byte for byte; a KRM `ResourceList` is
/// written whole. Err: the input is not YAML, or a KRM function config is bad.
pub fn inject_stream(
    text: &str,
    source: &Path,
    base: &Config,
    overrides: &[(String, Node)],
) -> Result<Output, StreamError> {
    let shown = EscapedPath::new(source);
    let mut parsed = Vec::new();
    for chunk in split::chunks(text) {
        let docs = parse::parse(chunk.text).map_err(|e| {
            StreamError::new(
                format!(":{}:{}", chunk.line + e.line.saturating_sub(1), e.col),
                format!("not YAML: {}", e.msg),
            )
        })?;
        parsed.push((chunk, docs));
    }
    let all: Vec<&Node> = parsed.iter().flat_map(|(_, d)| d).collect();
    if let [doc] = all.as_slice() {
        if krm::is_resource_list(doc) {
            let mut doc = (*doc).clone();
            let line = parsed.iter().find(|(_, d)| !d.is_empty()).map_or(1, |(c, _)| c.line);
            let at = format!("{shown}:{line}");
            return krm::run(&mut doc, &at, base, overrides).map_err(|msg| StreamError::new(format!(":{line}"), msg));
        }
    }
    let cfg = config(base, None, overrides).map_err(|msg| StreamError::new("", msg))?;
    let mut out = Output::default();
    for (chunk, mut docs) in parsed {
        let at = format!("{shown}:{}", chunk.line);
        let mut changed = false;
        for doc in &mut docs {
            changed |= visit(doc, &at, &cfg, &mut out.events);
        }
        if !changed {
            out.text.push_str(chunk.text);
            continue;
        }
        let head = split::head(chunk.text);
        if head.is_empty() && chunk.text.starts_with("---") {
            out.text.push_str("---\n");
        }
        out.text.push_str(head);
        for (i, doc) in docs.iter().enumerate() {
            if i > 0 {
                out.text.push_str("---\n");
            }
            let text = emit::document(doc, emit::Seqs::of(chunk.text)).map_err(|e| {
                StreamError::new(format!(":{}", chunk.line), format!("cannot write the document back: {e}"))
            })?;
            out.text.push_str(&text);
        }
    }
    Ok(out)
}

/// Decides and applies for one object (each item of a `List`); true when it changed.
pub fn visit(doc: &mut Node, at: &str, cfg: &Config, events: &mut Vec<Event>) -> bool {
    if doc.get("kind").and_then(Node::as_str) == Some("List") {
        let mut changed = false;
        if let Some(Node::Seq { items, .. }) = doc.get_mut("items") {
            for item in items {
                changed |= visit(item, at, cfg, events);
            }
        }
        return changed;
    }
    let what = describe(doc);
    let (outcome, changed) = match select::decide(doc, cfg) {
        select::Decision::Skip(why) => (Outcome::Skipped(why), false),
        select::Decision::Refuse(why) => (Outcome::Refused(why), false),
        select::Decision::Inject(plan) => {
            let kind = doc.get("kind").and_then(Node::as_str).unwrap_or("").to_string();
            let path = select::pod_spec_path(&kind).expect("decided on a pod template");
            rewrite::apply(doc, path, &plan, cfg);
            (Outcome::Injected, true)
        }
    };
    events.push(Event { at: at.to_string(), what, outcome });
    changed
}

/// `Kind/name` (`Kind/namespace/name` with a namespace).
pub fn describe(obj: &Node) -> String {
    let s = |p: &[&str]| obj.at(p).and_then(Node::as_str).unwrap_or("").to_string();
    let (kind, ns, name) = (s(&["kind"]), s(&["metadata", "namespace"]), s(&["metadata", "name"]));
    let kind = if kind.is_empty() { "(no kind)".to_string() } else { kind };
    if ns.is_empty() { format!("{kind}/{name}") } else { format!("{kind}/{ns}/{name}") }
}

/// Reads every input (stdin for none, named `-`) with its name, at most MAX_INPUT bytes.
fn read_inputs(files: &[PathBuf]) -> Result<Vec<(PathBuf, String)>, Error> {
    let mut out = Vec::new();
    let mut budget = MAX_INPUT;
    let mut read = |name: &Path, r: &mut dyn Read| -> Result<(), Error> {
        let mut buf = Vec::new();
        let other = |msg: String| Error::Other { path: name.to_path_buf(), msg };
        r.take(budget + 1).read_to_end(&mut buf).map_err(|e| other(format!("read failed: {e}")))?;
        if buf.len() as u64 > budget {
            return Err(other(format!("input over {} MiB", MAX_INPUT >> 20)));
        }
        budget -= buf.len() as u64;
        let text =
            String::from_utf8(buf).map_err(|e| other(format!("not UTF-8 (byte {})", e.utf8_error().valid_up_to())))?;
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
        let mut file =
            std::fs::File::open(f).map_err(|e| Error::Other { path: f.clone(), msg: format!("open failed: {e}") })?;
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
    let base = base_config(opts)?;
    let inputs = read_inputs(&opts.files)?;
    let mut text = String::new();
    let mut events = Vec::new();
    for (path, input) in &inputs {
        let out = inject_stream(input, path, &base, &opts.overrides).map_err(|e| e.of(path))?;
        if !text.is_empty() && !out.text.is_empty() {
            if !text.ends_with('\n') {
                text.push('\n');
            }
            if !out.text.starts_with("---") {
                text.push_str("---\n");
            }
        }
        text.push_str(&out.text);
        events.extend(out.events);
    }
    let refused = log_events(&events, opts.strict);
    if refused > 0 && opts.strict {
        tracing::error!("{refused} workload(s) refused (--strict): nothing written");
        return Ok(ExitCode::Refused);
    }
    let mut stdout = std::io::stdout().lock();
    stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
        .map_err(|e| Error::Other { path: "-".into(), msg: format!("write to stdout failed: {e}") })?;
    Ok(ExitCode::Success)
}

/// One log line per injected or refused object; returns the number refused.
fn log_events(events: &[Event], strict: bool) -> usize {
    let mut refused = 0;
    for e in events {
        match &e.outcome {
            Outcome::Injected => tracing::info!("{}: {}: volprep injected", e.at, e.what),
            Outcome::Skipped(why) => tracing::debug!("{}: {}: left alone: {why}", e.at, e.what),
            Outcome::Refused(why) => {
                refused += 1;
                for w in why {
                    if strict {
                        tracing::error!("{}: {}: refused: {w}", e.at, e.what);
                    } else {
                        tracing::warn!("{}: {}: left unchanged: {w}", e.at, e.what);
                    }
                }
            }
        }
    }
    refused
}

#[cfg(test)]
mod tests;
