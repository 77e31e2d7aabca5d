//! kustomize's KRM function protocol: a `ResourceList` in (items and a `functionConfig`), the
//! same list out with its items rewritten and one `results` entry per refused workload.

use super::config::{Config, value_of};
use super::node::Node;
use super::object::visit;
use super::{Outcome, Output, emit};

pub fn is_resource_list(doc: &Node) -> bool {
    doc.get("kind").and_then(Node::as_str) == Some("ResourceList")
        && doc.get("apiVersion").and_then(Node::as_str).is_some_and(|a| a.starts_with("config.kubernetes.io/"))
}

/// A function config's settings: the `spec` of any kind, or the `data` of a ConfigMap (each
/// value a YAML text, as `--set` takes).
pub fn merge_function_config(cfg: &mut Config, fc: &Node) -> Result<(), String> {
    let err = |e: String| format!("functionConfig: {e}");
    if fc.get("kind").and_then(Node::as_str) == Some("ConfigMap") {
        if let Some(Node::Map { entries, .. }) = fc.get("data") {
            for (k, v) in entries {
                let value = value_of(v.as_str().unwrap_or_default()).map_err(err)?;
                cfg.set(k.as_str().unwrap_or_default(), &value).map_err(err)?;
            }
        }
        return Ok(());
    }
    match fc.get("spec") {
        Some(spec) if spec.is_map() => cfg.merge(spec).map_err(err),
        Some(spec) if !spec.is_null() => Err(err("spec is not a mapping".into())),
        _ => Ok(()),
    }
}

/// Rewrites the items of a `ResourceList` and adds a result per refused one.
pub fn run(doc: &mut Node, at: &str, base: &Config, overrides: &[(String, Node)]) -> Result<Output, String> {
    let cfg = super::config(base, doc.get("functionConfig"), overrides)?;
    let mut out = Output::default();
    let mut results = Vec::new();
    if let Some(Node::Seq { items, .. }) = doc.get_mut("items") {
        for (i, item) in items.iter_mut().enumerate() {
            let first = out.events.len();
            visit(item, &format!("{at}: items[{i}]"), &cfg, &mut out.events);
            for e in &out.events[first..] {
                if let Outcome::Refused(why) = &e.outcome {
                    results.extend(why.iter().map(|w| result(item, &format!("left unchanged: {w}"))));
                }
            }
        }
    }
    if !results.is_empty() {
        doc.seq_at("results").extend(results);
    }
    out.text =
        emit::document(doc, emit::Seqs::Compact).map_err(|e| format!("cannot write the ResourceList back: {e}"))?;
    Ok(out)
}

/// A KRM result: message, severity warning and the item's reference.
fn result(item: &Node, message: &str) -> Node {
    let mut r = Node::map();
    r.set("message", Node::str(message));
    r.set("severity", Node::str("warning"));
    let reference = r.map_at("resourceRef");
    for (key, path) in [
        ("apiVersion", &["apiVersion"][..]),
        ("kind", &["kind"]),
        ("name", &["metadata", "name"]),
        ("namespace", &["metadata", "namespace"]),
    ] {
        if let Some(v) = item.at(path).and_then(Node::as_str) {
            reference.set(key, Node::str(v));
        }
    }
    r
}
