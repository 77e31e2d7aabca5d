//! `volprep inject`: rewrites rendered Kubernetes manifests (a multi-document YAML stream, or a
//! kustomize KRM `ResourceList`) so the pods that leave their volumes to the kubelet's fsGroup
//! pass get the volprep init container instead. A command: nothing below it imports it.

mod check;
mod config;
mod emit;
mod krm;
mod node;
mod parse;
mod patch;
mod rewrite;
mod select;
mod split;
mod volumes;

use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use crate::error::{Error, ExitCode, InjectError, InjectErrorKind};
use crate::escape::EscapedPath;

pub use config::{Config, Mode, REFUSED_ANNOTATION, value_of};
pub use node::Node;

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
    /// A refusal is an error: exit 5, nothing written.
    pub strict: bool,
    /// An error or a `--strict` refusal writes its reasons to stdout and exits 0 (Helm 4).
    pub errors_on_stdout: bool,
    /// A usage error found in the command line, reported by `run` (with `errors_on_stdout`).
    pub usage_error: Option<String>,
    pub emit: Emit,
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

/// Rewrites one input (named `source` in errors and events). Documents left alone are copied
/// byte for byte; a KRM `ResourceList` is written whole. Err: the input is not YAML, or a KRM
/// function config is bad. (Tests; `run` asks for the patches only with `--emit patches`.)
#[cfg(test)]
pub fn inject_stream(
    text: &str,
    source: &Path,
    base: &Config,
    overrides: &[(String, Node)],
) -> Result<Output, InjectError> {
    inject_stream_as(text, source, base, overrides, Emit::Patches)
}

/// [`inject_stream`], with the patches only when `emit` asks for them (they need a copy of
/// each document before its rewrite).
fn inject_stream_as(
    text: &str,
    source: &Path,
    base: &Config,
    overrides: &[(String, Node)],
    emit: Emit,
) -> Result<Output, InjectError> {
    let shown = EscapedPath::new(source);
    let chunks = split::chunks(text);
    if let Some((line, doc)) = lone_resource_list(&chunks, source)? {
        return resource_list(text, &doc, source, line, base, overrides, emit);
    }
    let cfg = config(base, None, overrides).map_err(|m| InjectError::of(source, InjectErrorKind::FunctionConfig(m)))?;
    let mut out = Output { text: String::with_capacity(text.len() + text.len() / 4), ..Output::default() };
    // One document at a time: its tree is dropped before the next one's is built.
    for chunk in &chunks {
        let at = format!("{shown}:{}", chunk.line);
        if chunk.text.len() > SKIM_OVER && left_big(chunk, &at, source, &mut out)? {
            continue;
        }
        let docs = parse::parse(chunk.text).map_err(|e| not_yaml(source, chunk, e))?;
        rewrite_chunk(chunk, docs, &at, &cfg, emit, source, &mut out)?;
    }
    Ok(out)
}

/// Above this size a document's head is read from the parser's events before any tree is built.
const SKIM_OVER: usize = 1 << 20;
/// The largest document whose tree `inject` builds (a few times its size in memory); a bigger
/// one that it might change is refused, left as it is. Kubernetes stores objects of at most
/// 1.5 MiB; only a `List` comes near.
pub const MAX_REWRITE: usize = 2 << 20;

/// Kinds that hold no pod template: a big document of one (a ConfigMap's or a Secret's data, a
/// CRD's schema) is copied without a tree.
const NO_POD_TEMPLATE: &[(&str, &str)] = &[
    ("v1", "ConfigMap"),
    ("v1", "Secret"),
    ("apiextensions.k8s.io/v1", "CustomResourceDefinition"),
    ("apiextensions.k8s.io/v1beta1", "CustomResourceDefinition"),
];

fn not_yaml(source: &Path, chunk: &split::Chunk, e: parse::YamlError) -> InjectError {
    let line = chunk.line + e.line.saturating_sub(1);
    InjectError::at(source, line, Some(e.col), InjectErrorKind::NotYaml(e.msg))
}

/// A big document (over SKIM_OVER) settled from its head alone: one of NO_POD_TEMPLATE is
/// copied; one over MAX_REWRITE is refused and copied. False: build its tree.
fn left_big(chunk: &split::Chunk, at: &str, source: &Path, out: &mut Output) -> Result<bool, InjectError> {
    let head = parse::skim(chunk.text).map_err(|e| not_yaml(source, chunk, e))?;
    let what = head.as_ref().map_or_else(
        || "(document)".to_string(),
        |h| describe_parts(h.kind.as_deref(), h.namespace.as_deref(), h.name.as_deref()),
    );
    let outcome = match &head {
        Some(h)
            if NO_POD_TEMPLATE
                .iter()
                .any(|&(a, k)| h.api_version.as_deref() == Some(a) && h.kind.as_deref() == Some(k)) =>
        {
            Outcome::Skipped("not a pod template (read without building its tree)".into())
        }
        _ if chunk.text.len() > MAX_REWRITE => Outcome::Refused(vec![format!(
            "the document is {} MiB, over the {} MiB inject rewrites: left as it is (a List: write its items as documents)",
            chunk.text.len() >> 20,
            MAX_REWRITE >> 20
        )]),
        _ => return Ok(false),
    };
    out.events.push(Event { at: at.to_string(), what, outcome, apps: Vec::new() });
    out.text.push_str(chunk.text);
    Ok(true)
}

/// The stream's one document with its line when it is a KRM `ResourceList`, else None. A big
/// first document is skimmed: a ConfigMap is not read whole to learn it is no ResourceList.
fn lone_resource_list(chunks: &[split::Chunk], source: &Path) -> Result<Option<(usize, Node)>, InjectError> {
    let mut found = None;
    for chunk in chunks {
        if chunk.text.len() > SKIM_OVER {
            let head = parse::skim(chunk.text).map_err(|e| not_yaml(source, chunk, e))?;
            if head.is_some_and(|h| found.is_some() || h.kind.as_deref() != Some("ResourceList")) {
                return Ok(None);
            }
        }
        let docs = parse::parse(chunk.text).map_err(|e| not_yaml(source, chunk, e))?;
        match docs.len() {
            0 => continue,
            1 if found.is_none() && krm::is_resource_list(&docs[0]) => {
                found = docs.into_iter().next().map(|d| (chunk.line, d));
            }
            _ => return Ok(None),
        }
    }
    Ok(found)
}

/// Decides and applies for the documents of one chunk; writes the chunk back rewritten and
/// checked, or as it came.
fn rewrite_chunk(
    chunk: &split::Chunk,
    mut docs: Vec<Node>,
    at: &str,
    cfg: &Config,
    emit: Emit,
    source: &Path,
    out: &mut Output,
) -> Result<(), InjectError> {
    let before = if emit == Emit::Patches { docs.clone() } else { Vec::new() };
    let first = out.events.len();
    let mut changed = false;
    for doc in &mut docs {
        changed |= visit(doc, at, cfg, &mut out.events);
    }
    if !changed {
        out.text.push_str(chunk.text);
        return Ok(());
    }
    match checked(rewritten(chunk.text, &docs), &docs) {
        Ok(text) => {
            let unwritable = |e: String| InjectError::at(source, chunk.line, None, InjectErrorKind::Unwritable(e));
            out.patches.extend(patches(&before, &docs).map_err(unwritable)?);
            out.text.push_str(&text);
        }
        Err(why) => {
            refuse_unchecked(&mut out.events[first..], &why);
            out.text.push_str(chunk.text);
        }
    }
    Ok(())
}

/// A KRM `ResourceList` (all of `text`), its items rewritten and checked; when the check fails,
/// `text` as it came, its workloads refused.
fn resource_list(
    text: &str,
    doc: &Node,
    source: &Path,
    line: usize,
    base: &Config,
    overrides: &[(String, Node)],
    emit: Emit,
) -> Result<Output, InjectError> {
    let shown = EscapedPath::new(source);
    let mut new = doc.clone();
    let mut out = krm::run(&mut new, &format!("{shown}:{line}"), base, overrides)
        .map_err(|msg| InjectError::at(source, line, None, InjectErrorKind::FunctionConfig(msg)))?;
    match checked(Ok(std::mem::take(&mut out.text)), std::slice::from_ref(&new)) {
        Ok(written) => out.text = written,
        Err(why) => {
            refuse_unchecked(&mut out.events, &why);
            out.text = text.to_string();
            return Ok(out);
        }
    }
    if emit == Emit::Patches {
        let unwritable = |e: String| InjectError::at(source, line, None, InjectErrorKind::Unwritable(e));
        let items = |d: &Node| d.get("items").map(Node::as_seq).unwrap_or(&[]).to_vec();
        out.patches = patches(&items(doc), &items(&new)).map_err(unwritable)?;
    }
    Ok(out)
}

/// The patches that turn each object of `before` into the same object of `after`.
fn patches(before: &[Node], after: &[Node]) -> Result<Vec<Node>, String> {
    let mut out = Vec::new();
    for (old, new) in before.iter().zip(after) {
        for (o, n) in objects(old).into_iter().zip(objects(new)) {
            out.extend(patch::patch(o, n)?);
        }
    }
    Ok(out)
}

/// The self-check: `text` (inject's output for `meant`) read back means `meant`, node by node,
/// to a YAML 1.2 and a YAML 1.1 reader. Err: why not, with the path of the first difference.
fn checked(text: Result<String, String>, meant: &[Node]) -> Result<String, String> {
    let text = text.map_err(|e| format!("inject cannot write this document back ({e})"))?;
    let back = parse::parse(&text)
        .map_err(|e| format!("inject's output of this document is not YAML (line {}: {})", e.line, e.msg))?;
    match check::first_difference(meant, &back) {
        None => Ok(text),
        Some(d) => Err(format!("inject's output of this document would read differently at {d}")),
    }
}

/// The objects of a document whose rewrite failed the self-check: those injected or annotated
/// are refused, the document written as it came (a volprep bug, to report).
fn refuse_unchecked(events: &mut [Event], why: &str) {
    let why = format!("{why}; the document is left as it came (a volprep bug: please report it)");
    for e in events {
        match &mut e.outcome {
            Outcome::Injected => e.outcome = Outcome::Refused(vec![why.clone()]),
            Outcome::Refused(reasons) => reasons.push(why.clone()),
            Outcome::Unsupported(_) | Outcome::Skipped(_) => {}
        }
    }
}

/// A changed chunk's new text: its head (directives, `---`, leading comments) and its tail
/// (`...` and what follows) as they were, the documents written in its line endings.
fn rewritten(chunk: &str, docs: &[Node]) -> Result<String, String> {
    let head = split::head(chunk);
    let mut body = String::new();
    if !split::head_has_marker(head) && (chunk.starts_with("---") || head.starts_with('%')) {
        body.push_str("---\n");
    }
    for (i, doc) in docs.iter().enumerate() {
        if i > 0 {
            body.push_str("---\n");
        }
        body.push_str(&emit::document(doc, emit::Seqs::of(chunk))?);
    }
    let nl = split::newline(chunk);
    if nl != "\n" {
        body = body.replace('\n', nl);
    }
    Ok(format!("{head}{body}{}", split::tail(chunk)))
}

/// The objects of a document: the items of a `List`, else the document.
fn objects(doc: &Node) -> Vec<&Node> {
    if doc.get("kind").and_then(Node::as_str) == Some("List") {
        return doc.get("items").map(Node::as_seq).unwrap_or(&[]).iter().collect();
    }
    vec![doc]
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
    let mut apps = Vec::new();
    let (outcome, changed) = match select::decide(doc, cfg) {
        select::Decision::Skip(why) => (Outcome::Skipped(why), false),
        select::Decision::Unsupported(why) => (Outcome::Unsupported(why), false),
        select::Decision::Refuse(why) => {
            let changed = cfg.annotate_refusals && annotate_refusal(doc, &why);
            (Outcome::Refused(why), changed)
        }
        select::Decision::Inject(plan) => {
            let kind = doc.get("kind").and_then(Node::as_str).unwrap_or("").to_string();
            let path = select::pod_spec_path(&kind).expect("decided on a pod template");
            rewrite::apply(doc, path, &plan, cfg);
            if let Some(a) = doc.at_mut(&["metadata", "annotations"]) {
                a.remove(REFUSED_ANNOTATION);
            }
            if !plan.apps.is_empty() {
                doc.map_at("metadata")
                    .map_at("annotations")
                    .set(APP_MODES_ANNOTATION, Node::str(&app_modes_text(&plan.apps)));
            }
            apps = plan.apps;
            (Outcome::Injected, true)
        }
    };
    events.push(Event { at: at.to_string(), what, outcome, apps });
    changed
}

/// What inject says of a workload running `apps` under the kubelet's rule.
fn app_modes_text(apps: &[String]) -> String {
    format!(
        "{} under the kubelet's rule, which it may refuse: set volprep.io/modes: app-safe (inject: --modes app-safe), with runAsUser set",
        apps.join(", ")
    )
}

/// Sets the refusal annotation on the workload (not its pod template: no rollout); true when
/// it changed. A document with duplicate keys is left byte for byte.
fn annotate_refusal(doc: &mut Node, why: &[String]) -> bool {
    if doc.duplicate_key().is_some() || !doc.is_map() {
        return false;
    }
    let text = why.join("; ");
    if doc.at(&["metadata", "annotations", REFUSED_ANNOTATION]).and_then(Node::as_str) == Some(text.as_str()) {
        return false;
    }
    doc.map_at("metadata").map_at("annotations").set(REFUSED_ANNOTATION, Node::str(&text));
    true
}

/// `Kind/name` (`Kind/namespace/name` with a namespace).
pub fn describe(obj: &Node) -> String {
    let s = |p: &[&str]| obj.at(p).and_then(Node::as_str);
    describe_parts(s(&["kind"]), s(&["metadata", "namespace"]), s(&["metadata", "name"]))
}

fn describe_parts(kind: Option<&str>, ns: Option<&str>, name: Option<&str>) -> String {
    let (kind, ns, name) = (kind.unwrap_or(""), ns.unwrap_or(""), name.unwrap_or(""));
    let kind = if kind.is_empty() { "(no kind)" } else { kind };
    if ns.is_empty() { format!("{kind}/{name}") } else { format!("{kind}/{ns}/{name}") }
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
    let tally = log_events(&events, opts.strict);
    if tally.refused > 0 && opts.strict {
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

/// How many objects had each outcome.
#[derive(Debug, Default)]
struct Tally {
    injected: usize,
    /// Injected workloads running an app of the table under the kubelet's rule.
    apps: usize,
    refused: usize,
    unsupported: usize,
    skipped: usize,
}

impl Tally {
    /// One line for the whole run: at warning level when a workload was refused or not read.
    fn summary(&self) {
        let mut line = format!(
            "volprep inject: {} injected, {} refused (left to the kubelet, annotated {REFUSED_ANNOTATION}), {} not read (merge keys), {} without anything to prepare",
            self.injected, self.refused, self.unsupported, self.skipped
        );
        if self.apps > 0 {
            line += &format!(
                "; {} injected with the kubelet's rule run an app that insists on private modes (annotated {APP_MODES_ANNOTATION}): give them app-safe",
                self.apps
            );
        }
        if self.refused + self.unsupported + self.apps > 0 {
            tracing::warn!("{line}");
        } else {
            tracing::info!("{line}");
        }
    }
}

/// A line per reason of each refused object (`FILE:LINE: Kind/name: refused: why`).
fn refusals(events: &[Event]) -> Vec<String> {
    let mut out = Vec::new();
    for e in events {
        if let Outcome::Refused(why) = &e.outcome {
            out.extend(why.iter().map(|w| format!("{}: {}: refused: {w}", e.at, e.what)));
        }
    }
    out
}

/// One log line per injected, refused or unsupported object; the tally.
fn log_events(events: &[Event], strict: bool) -> Tally {
    let mut t = Tally::default();
    for e in events {
        match &e.outcome {
            Outcome::Injected => {
                t.injected += 1;
                tracing::info!("{}: {}: volprep injected", e.at, e.what);
                if !e.apps.is_empty() {
                    t.apps += 1;
                    tracing::warn!("{}: {}: runs {}", e.at, e.what, app_modes_text(&e.apps));
                }
            }
            Outcome::Skipped(why) => {
                t.skipped += 1;
                tracing::debug!("{}: {}: left alone: {why}", e.at, e.what);
            }
            Outcome::Unsupported(why) => {
                t.unsupported += 1;
                tracing::info!("{}: {}: left alone: {why}", e.at, e.what);
            }
            Outcome::Refused(why) => {
                t.refused += 1;
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
    t
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
