//! One object of `inject`: the decision on it applied (injected, refusal annotated), its event.

use super::{APP_MODES_ANNOTATION, Config, Event, Node, Outcome, REFUSED_ANNOTATION, rewrite, select};

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
pub(super) fn app_modes_text(apps: &[String]) -> String {
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

pub(super) fn describe_parts(kind: Option<&str>, ns: Option<&str>, name: Option<&str>) -> String {
    let (kind, ns, name) = (kind.unwrap_or(""), ns.unwrap_or(""), name.unwrap_or(""));
    let kind = if kind.is_empty() { "(no kind)" } else { kind };
    if ns.is_empty() { format!("{kind}/{name}") } else { format!("{kind}/{ns}/{name}") }
}
