//! `inject`'s document loop: each document of an input parsed, decided on, rewritten, self-checked.

use std::path::Path;

use crate::error::{InjectError, InjectErrorKind};
use crate::escape::EscapedPath;

use super::object::{describe_parts, visit};
use super::{Config, Emit, Event, Node, Outcome, Output, check, config, emit, krm, parse, patch, split};

/// Rewrites one input (named `source` in errors and events). Documents left alone are copied
/// byte for byte; a KRM `ResourceList` is written whole. Err: the input is not YAML, or a KRM
/// function config is bad. (Tests; `run` asks for the patches only with `--emit patches`.)
#[cfg(test)]
pub(super) fn inject_stream(
    text: &str,
    source: &Path,
    base: &Config,
    overrides: &[(String, Node)],
) -> Result<Output, InjectError> {
    inject_stream_as(text, source, base, overrides, Emit::Patches)
}

/// `inject_stream` (of the tests), with the patches only when `emit` asks for them (they need a copy of
/// each document before its rewrite).
pub(super) fn inject_stream_as(
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
pub(super) const SKIM_OVER: usize = 1 << 20;
/// The largest document whose tree `inject` builds (a few times its size in memory); a bigger
/// one that it might change is refused, left as it is. Kubernetes stores objects of at most
/// 1.5 MiB; only a `List` comes near.
pub(super) const MAX_REWRITE: usize = 2 << 20;

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
