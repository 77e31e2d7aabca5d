//! The YAML tree `inject` reads and writes: scalars keep their source text and style, so a
//! re-written document means to Kubernetes (a YAML 1.1 reader) what the original meant.

/// How a scalar was written. `Plain` text is re-emitted as it was (`0644` stays the octal
/// 420 that Kubernetes reads, `yes` stays a boolean); `Quoted` is always a string.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Style {
    Plain,
    Quoted,
}

/// One YAML node. Mappings keep their key order.
#[derive(Debug, Clone, PartialEq)]
pub enum Node {
    Scalar { text: String, style: Style, tag: Option<String> },
    Seq { items: Vec<Node>, tag: Option<String> },
    Map { entries: Vec<(Node, Node)>, tag: Option<String> },
}

impl Node {
    /// A string: quoted on output when it could read as anything else.
    pub fn str(s: &str) -> Node {
        Node::Scalar { text: s.to_string(), style: Style::Quoted, tag: None }
    }

    /// An integer or boolean, or a string that must stay a plain scalar.
    pub fn plain(s: &str) -> Node {
        Node::Scalar { text: s.to_string(), style: Style::Plain, tag: None }
    }

    pub fn int(n: u64) -> Node {
        Node::plain(&n.to_string())
    }

    pub fn map() -> Node {
        Node::Map { entries: Vec::new(), tag: None }
    }

    pub fn seq(items: Vec<Node>) -> Node {
        Node::Seq { items, tag: None }
    }

    /// `null`, `~` or an empty plain scalar.
    pub fn is_null(&self) -> bool {
        matches!(self, Node::Scalar { text, style: Style::Plain, tag: None }
            if matches!(text.as_str(), "" | "~" | "null" | "Null" | "NULL"))
    }

    /// The text of a scalar (not null).
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Node::Scalar { text, .. } if !self.is_null() => Some(text),
            _ => None,
        }
    }

    /// A scalar as Kubernetes reads an integer: decimal, `0o17`/`0x1f`, and the YAML 1.1
    /// octal `0644` of hand-written manifests.
    pub fn as_u64(&self) -> Option<u64> {
        let Node::Scalar { text, style: Style::Plain, .. } = self else { return None };
        let t = text.strip_prefix('+').unwrap_or(text).replace('_', "");
        if let Some(o) = t.strip_prefix("0o") {
            u64::from_str_radix(o, 8).ok()
        } else if let Some(x) = t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
            u64::from_str_radix(x, 16).ok()
        } else if t.len() > 1 && t.starts_with('0') {
            u64::from_str_radix(&t[1..], 8).ok()
        } else {
            t.parse().ok()
        }
    }

    /// A plain scalar as YAML 1.1 reads a boolean (`true`, `yes`, `on`, ...), or a quoted
    /// string of one of these words (annotations are strings).
    pub fn as_bool(&self) -> Option<bool> {
        match self.as_str()?.to_ascii_lowercase().as_str() {
            "true" | "yes" | "on" | "y" => Some(true),
            "false" | "no" | "off" | "n" => Some(false),
            _ => None,
        }
    }

    pub fn as_seq(&self) -> &[Node] {
        match self {
            Node::Seq { items, .. } => items,
            _ => &[],
        }
    }

    pub fn is_map(&self) -> bool {
        matches!(self, Node::Map { .. })
    }

    /// The value of `key` in a mapping.
    pub fn get(&self, key: &str) -> Option<&Node> {
        match self {
            Node::Map { entries, .. } => entries.iter().find(|(k, _)| k.as_str() == Some(key)).map(|(_, v)| v),
            _ => None,
        }
    }

    /// The value at a path of keys (`["spec", "template", "spec"]`).
    pub fn at(&self, path: &[&str]) -> Option<&Node> {
        path.iter().try_fold(self, |n, k| n.get(k))
    }

    pub fn get_mut(&mut self, key: &str) -> Option<&mut Node> {
        match self {
            Node::Map { entries, .. } => entries.iter_mut().find(|(k, _)| k.as_str() == Some(key)).map(|(_, v)| v),
            _ => None,
        }
    }

    pub fn at_mut(&mut self, path: &[&str]) -> Option<&mut Node> {
        path.iter().try_fold(self, |n, k| n.get_mut(k))
    }

    /// Removes `key` from a mapping; true when it was there.
    pub fn remove(&mut self, key: &str) -> bool {
        let Node::Map { entries, .. } = self else { return false };
        let before = entries.len();
        entries.retain(|(k, _)| k.as_str() != Some(key));
        entries.len() != before
    }

    /// Sets `key` (in place when present, else appended) in a mapping; a null or non-mapping
    /// node becomes an empty mapping first. Returns the value.
    pub fn set(&mut self, key: &str, value: Node) -> &mut Node {
        if !self.is_map() {
            *self = Node::map();
        }
        let Node::Map { entries, .. } = self else { unreachable!() };
        let at = match entries.iter().position(|(k, _)| k.as_str() == Some(key)) {
            Some(i) => {
                entries[i].1 = value;
                i
            }
            None => {
                entries.push((Node::plain(key), value));
                entries.len() - 1
            }
        };
        &mut entries[at].1
    }

    /// The first key written twice in one mapping, shown with its path
    /// (`spec.template.spec.securityContext.fsGroup`).
    pub fn duplicate_key(&self) -> Option<String> {
        match self {
            Node::Scalar { .. } => None,
            Node::Seq { items, .. } => items.iter().enumerate().find_map(|(i, n)| {
                n.duplicate_key().map(|p| if p.starts_with('[') { format!("[{i}]{p}") } else { format!("[{i}].{p}") })
            }),
            Node::Map { entries, .. } => {
                let mut seen = std::collections::HashSet::new();
                for (k, _) in entries {
                    let Node::Scalar { text, .. } = k else { continue };
                    if !seen.insert(text.as_str()) {
                        return Some(text.clone());
                    }
                }
                entries.iter().find_map(|(k, v)| {
                    let key = k.as_str().unwrap_or("?");
                    v.duplicate_key()
                        .map(|p| if p.starts_with('[') { format!("{key}{p}") } else { format!("{key}.{p}") })
                })
            }
        }
    }

    /// True when a mapping anywhere in the tree has a YAML merge key (`<<`, plain).
    pub fn has_merge_key(&self) -> bool {
        match self {
            Node::Scalar { .. } => false,
            Node::Seq { items, .. } => items.iter().any(Node::has_merge_key),
            Node::Map { entries, .. } => entries.iter().any(|(k, v)| {
                matches!(k, Node::Scalar { text, style: Style::Plain, tag: None } if text == "<<") || v.has_merge_key()
            }),
        }
    }

    /// The mapping at `key`, made (empty) when missing or null.
    pub fn map_at(&mut self, key: &str) -> &mut Node {
        if self.get(key).is_none_or(|n| !n.is_map()) {
            self.set(key, Node::map());
        }
        self.get_mut(key).expect("just set")
    }

    /// The sequence at `key`, made (empty) when missing or null.
    pub fn seq_at(&mut self, key: &str) -> &mut Vec<Node> {
        if !matches!(self.get(key), Some(Node::Seq { .. })) {
            self.set(key, Node::seq(Vec::new()));
        }
        match self.get_mut(key) {
            Some(Node::Seq { items, .. }) => items,
            _ => unreachable!(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integers_as_kubernetes_reads_them() {
        assert_eq!(Node::plain("0644").as_u64(), Some(0o644));
        assert_eq!(Node::plain("0o440").as_u64(), Some(0o440));
        assert_eq!(Node::plain("420").as_u64(), Some(420));
        assert_eq!(Node::plain("0").as_u64(), Some(0));
        assert_eq!(Node::str("420").as_u64(), None, "a quoted number is a string");
        assert_eq!(Node::plain("0x1F").as_u64(), Some(31));
        assert_eq!(Node::plain("0x1G").as_u64(), None);
    }

    #[test]
    fn set_remove_and_paths() {
        let mut n = Node::map();
        n.map_at("a").set("b", Node::int(1));
        assert_eq!(n.at(&["a", "b"]).and_then(Node::as_u64), Some(1));
        n.seq_at("s").push(Node::str("x"));
        assert_eq!(n.get("s").unwrap().as_seq().len(), 1);
        assert!(n.get_mut("a").unwrap().remove("b"));
        assert!(!n.get_mut("a").unwrap().remove("b"));
        assert!(Node::plain("~").is_null() && Node::plain("null").as_str().is_none());
        assert_eq!(Node::str("false").as_bool(), Some(false));
    }

    #[test]
    fn duplicate_and_merge_keys_are_found() {
        let doc = |t: &str| super::super::parse::parse(t).unwrap().remove(0);
        assert_eq!(doc("a: 1\nb: {c: [x, {d: 1, d: 2}]}\n").duplicate_key().as_deref(), Some("b.c[1].d"));
        assert_eq!(doc("a: 1\na: 2\n").duplicate_key().as_deref(), Some("a"));
        assert_eq!(doc("a: {b: 1}\nc: {b: 1}\n").duplicate_key(), None);
        assert!(doc("a: &x {b: 1}\nc: {<<: *x}\n").has_merge_key());
        assert!(!doc("a: {'<<': 1}\n").has_merge_key());
    }
}
