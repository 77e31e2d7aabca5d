//! `inject --emit patches`: the change `inject` makes to each object, as a kustomize patch (a
//! JSON 6902 patch and its target), for what takes patches only: a Flux HelmRelease's
//! `postRenderers[].kustomize.patches`, a kustomization's `patches`.

use super::emit;
use super::node::Node;

/// The kustomize patch that turns `old` into `new` (one object each), or None when they are
/// equal: `{target: {kind, name, namespace}, patch: "- op: ..."}`.
pub fn patch(old: &Node, new: &Node) -> Result<Option<Node>, String> {
    let mut ops = Vec::new();
    diff(old, new, &mut String::new(), &mut ops);
    if ops.is_empty() {
        return Ok(None);
    }
    let mut p = Node::map();
    p.set("target", target(new));
    p.set("patch", Node::str(&emit::document(&Node::seq(ops), emit::Seqs::Indented)?));
    Ok(Some(p))
}

/// The target that selects `obj` alone: its group (of `apiVersion`: `apps` of `apps/v1`, `^$`
/// for the core `v1`), version, kind, name and namespace. kustomize matches each as a regular
/// expression (anchored), so their `.` are escaped: `a.b` would select `axb` too.
fn target(obj: &Node) -> Node {
    let mut t = Node::map();
    let field = |path: &[&str]| obj.at(path).and_then(Node::as_str).map(str::to_string);
    if let Some(api) = field(&["apiVersion"]) {
        let (group, version) = api.rsplit_once('/').unwrap_or(("", &api));
        // An empty group selects every group: `^$` is the core group alone.
        t.set("group", Node::str(&if group.is_empty() { "^$".to_string() } else { regex_literal(group) }));
        t.set("version", Node::str(&regex_literal(version)));
    }
    for (key, path) in
        [("kind", &["kind"][..]), ("name", &["metadata", "name"]), ("namespace", &["metadata", "namespace"])]
    {
        if let Some(v) = field(path) {
            t.set(key, Node::str(&regex_literal(&v)));
        }
    }
    t
}

/// `s` as a regular expression that matches `s` alone (kustomize anchors it).
fn regex_literal(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if "\\.+*?()|[]{}^$".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// `~` and `/` escaped as a JSON pointer's reference token (RFC 6901).
fn token(key: &str) -> String {
    key.replace('~', "~0").replace('/', "~1")
}

fn op(kind: &str, path: &str, value: Option<&Node>) -> Node {
    let mut o = Node::map();
    o.set("op", Node::str(kind));
    o.set("path", Node::str(path));
    if let Some(v) = value {
        o.set("value", v.clone());
    }
    o
}

/// The operations that turn `old` into `new` at `path`: keys removed and added, items
/// inserted into a sequence, anything else replaced.
fn diff(old: &Node, new: &Node, path: &mut String, out: &mut Vec<Node>) {
    if old == new {
        return;
    }
    match (old, new) {
        (Node::Map { entries: o, tag: ot }, Node::Map { entries: n, tag: nt }) if ot == nt => {
            for (k, _) in o {
                let key = k.as_str().unwrap_or_default();
                if new.get(key).is_none() {
                    out.push(op("remove", &format!("{path}/{}", token(key)), None));
                }
            }
            for (k, v) in n {
                let key = k.as_str().unwrap_or_default();
                let len = path.len();
                path.push('/');
                path.push_str(&token(key));
                match old.get(key) {
                    Some(ov) => diff(ov, v, path, out),
                    None => out.push(op("add", path, Some(v))),
                }
                path.truncate(len);
            }
        }
        (Node::Seq { items: o, tag: ot }, Node::Seq { items: n, tag: nt }) if ot == nt && o.len() == n.len() => {
            for (i, (ov, nv)) in o.iter().zip(n).enumerate() {
                let len = path.len();
                path.push_str(&format!("/{i}"));
                diff(ov, nv, path, out);
                path.truncate(len);
            }
        }
        (Node::Seq { items: o, tag: ot }, Node::Seq { items: n, tag: nt }) if ot == nt && inserted(o, n) => {
            let mut j = 0;
            for (i, item) in n.iter().enumerate() {
                if j < o.len() && o[j] == *item {
                    j += 1;
                } else {
                    // The array now holds i items, then the old ones not yet passed: past them all
                    // is its end.
                    let at = if j == o.len() { "-".to_string() } else { i.to_string() };
                    out.push(op("add", &format!("{path}/{at}"), Some(item)));
                }
            }
        }
        _ => out.push(op("replace", path, Some(new))),
    }
}

/// True when `new` is `old` with items inserted (old is a subsequence of new).
fn inserted(old: &[Node], new: &[Node]) -> bool {
    let mut it = new.iter();
    new.len() > old.len() && old.iter().all(|o| it.by_ref().any(|n| n == o))
}

#[cfg(test)]
mod tests {
    use super::super::parse::parse;
    use super::*;

    fn ops(old: &str, new: &str) -> String {
        let (o, n) = (parse(old).unwrap().remove(0), parse(new).unwrap().remove(0));
        let p = patch(&o, &n).unwrap().unwrap();
        p.get("patch").and_then(Node::as_str).unwrap().to_string()
    }

    #[test]
    fn keys_items_and_escapes() {
        let p = ops(
            "kind: Pod\nmetadata: {name: p}\nspec: {securityContext: {fsGroup: 1}, c: [a, b]}\n",
            "kind: Pod\nmetadata: {name: p, annotations: {a/b~c: x}}\nspec: {securityContext: {s: [1]}, c: [i, a, b, j]}\n",
        );
        assert_eq!(
            p,
            "- op: add\n  path: /metadata/annotations\n  value:\n    a/b~c: x\n- op: remove\n  path: /spec/securityContext/fsGroup\n- op: add\n  path: /spec/securityContext/s\n  value:\n    - 1\n- op: add\n  path: /spec/c/0\n  value: i\n- op: add\n  path: /spec/c/-\n  value: j\n"
        );
        assert!(ops("kind: A\nx: [a]\n", "kind: A\nx: [b, c]\n").contains("op: replace\n  path: /x\n"));
        assert!(patch(&Node::plain("a"), &Node::plain("a")).unwrap().is_none());
        assert_eq!(token("volprep.io/a~b"), "volprep.io~1a~0b");
        let t = |api: &str| {
            let obj = parse(&format!("apiVersion: {api}\nkind: K\nmetadata: {{name: a.b, namespace: n}}\n")).unwrap();
            let t = target(&obj[0]);
            ["group", "version", "kind", "name", "namespace"]
                .map(|k| t.get(k).and_then(Node::as_str).unwrap().to_string())
        };
        assert_eq!(t("apps.kruise.io/v1beta1"), ["apps\\.kruise\\.io", "v1beta1", "K", "a\\.b", "n"]);
        assert_eq!(t("v1"), ["^$", "v1", "K", "a\\.b", "n"]);
    }
}
