//! YAML text to [`Node`]s, from the events of `saphyr-parser`, with limits for untrusted input:
//! nesting depth, and the nodes that aliases may copy (an "alias bomb" stops with an error).

use std::collections::HashMap;

use saphyr_parser::{Event, Parser, ScalarStyle, Tag};

use super::node::{Node, Style};

/// Deepest nesting of mappings and sequences accepted (Kubernetes objects stay below 20).
pub const MAX_DEPTH: usize = 128;
/// Most nodes that aliases may copy in one document stream.
pub const MAX_ALIAS_NODES: usize = 100_000;

/// Why a text is not YAML, and where (1-based line and column in the text given).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct YamlError {
    pub line: usize,
    pub col: usize,
    pub msg: String,
}

/// An open mapping or sequence.
struct Frame {
    node: Node,
    anchor: usize,
    key: Option<Node>,
}

/// Builds the documents of one stream from parser events.
#[derive(Default)]
struct Builder {
    stack: Vec<Frame>,
    anchors: HashMap<usize, Node>,
    docs: Vec<Node>,
    alias_nodes: usize,
}

/// The documents of `text` (an empty document is left out).
pub fn parse(text: &str) -> Result<Vec<Node>, YamlError> {
    let mut parser = Parser::new_from_str(text);
    let mut b = Builder::default();
    while let Some(next) = parser.next_event() {
        let (event, span) = next.map_err(|e| YamlError {
            line: e.marker().line(),
            col: e.marker().col() + 1,
            msg: e.info().to_string(),
        })?;
        let at = |msg: String| YamlError { line: span.start.line(), col: span.start.col() + 1, msg };
        b.event(event).map_err(at)?;
    }
    Ok(b.docs)
}

/// The top-level `apiVersion`, `kind`, `metadata.name` and `metadata.namespace` of a text that
/// holds one document whose root is an untagged mapping, each a scalar written once (None:
/// missing, written twice, an alias or a collection); read from the parser's events without
/// building a tree, so a huge document that inject leaves alone costs no more than its text.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Head {
    pub api_version: Option<String>,
    pub kind: Option<String>,
    pub name: Option<String>,
    pub namespace: Option<String>,
}

/// [`Head`] of `text`, or None when it holds no such document (none, several, a root that is not
/// an untagged mapping, a merge key at the top).
pub fn skim(text: &str) -> Result<Option<Head>, YamlError> {
    let mut parser = Parser::new_from_str(text);
    let mut s = Skimmer::default();
    while let Some(next) = parser.next_event() {
        let (event, _) = next.map_err(|e| YamlError {
            line: e.marker().line(),
            col: e.marker().col() + 1,
            msg: e.info().to_string(),
        })?;
        if !s.event(event) {
            return Ok(None);
        }
    }
    Ok(s.finish())
}

/// [`skim`]'s state: the open collections, innermost last; the fields met (to find those
/// written twice).
#[derive(Default)]
struct Skimmer {
    stack: Vec<Open>,
    head: Head,
    docs: usize,
    seen: Vec<String>,
    root: bool,
}

/// A collection [`skim`] is in.
enum Open {
    Seq,
    /// A mapping, and what in it comes next.
    Map(Next),
}

/// What comes next in a mapping: a key, or the value of a key (a scalar's text; empty for
/// another node).
enum Next {
    Key,
    Value(String),
}

impl Open {
    /// The key whose value is being read, in a mapping.
    fn key(&self) -> Option<&str> {
        match self {
            Open::Map(Next::Value(k)) => Some(k),
            Open::Map(Next::Key) | Open::Seq => None,
        }
    }
}

impl Skimmer {
    /// The field a value here would be (`kind`, `metadata.name`, ...), if one of Head's.
    fn wanted(&self) -> Option<&'static str> {
        let path: Vec<&str> = self.stack.iter().filter_map(Open::key).collect();
        let at_value = matches!(self.stack.last(), Some(Open::Map(Next::Value(_))));
        if !at_value || path.len() != self.stack.len() {
            return None;
        }
        match path.as_slice() {
            ["apiVersion"] => Some("apiVersion"),
            ["kind"] => Some("kind"),
            ["metadata", "name"] => Some("metadata.name"),
            ["metadata", "namespace"] => Some("metadata.namespace"),
            _ => None,
        }
    }

    /// Takes one event; false when the text is not one document with an untagged mapping root
    /// and no merge key at the top.
    fn event(&mut self, event: Event) -> bool {
        let wanted = self.wanted();
        let map = matches!(event, Event::MappingStart(..));
        match event {
            Event::DocumentStart(_) => self.docs += 1,
            Event::MappingStart(_, tag) | Event::SequenceStart(_, tag) if self.stack.is_empty() => {
                if !map || tag.is_some() || self.docs > 1 || self.root {
                    return false;
                }
                self.root = true;
                self.stack.push(Open::Map(Next::Key));
            }
            Event::MappingStart(..) | Event::SequenceStart(..) => {
                self.seen.extend(wanted.map(String::from));
                self.stack.push(if map { Open::Map(Next::Key) } else { Open::Seq });
            }
            Event::MappingEnd | Event::SequenceEnd => {
                self.stack.pop();
                advance(&mut self.stack, None);
            }
            Event::Scalar(text, _, _, tag) => {
                let key_next = matches!(self.stack.last(), Some(Open::Map(Next::Key)));
                if self.stack.is_empty() || (key_next && self.stack.len() == 1 && text == "<<") {
                    return false;
                }
                if let Some(w) = wanted {
                    self.seen.push(w.to_string());
                    let value = tag.is_none().then(|| text.to_string());
                    match w {
                        "apiVersion" => self.head.api_version = value,
                        "kind" => self.head.kind = value,
                        "metadata.name" => self.head.name = value,
                        _ => self.head.namespace = value,
                    }
                }
                advance(&mut self.stack, key_next.then(|| text.into_owned()));
            }
            Event::Alias(_) => {
                self.seen.extend(wanted.map(String::from));
                advance(&mut self.stack, None);
            }
            _ => {}
        }
        true
    }

    /// The head; a field written twice (or as a collection or an alias) is not known.
    fn finish(mut self) -> Option<Head> {
        let once = |f: &str| self.seen.iter().filter(|s| *s == f).count() == 1;
        let known = [once("apiVersion"), once("kind"), once("metadata.name"), once("metadata.namespace")];
        let h = &mut self.head;
        for (ok, v) in known.into_iter().zip([&mut h.api_version, &mut h.kind, &mut h.name, &mut h.namespace]) {
            if !ok {
                *v = None;
            }
        }
        (self.docs <= 1 && self.root).then_some(self.head)
    }
}

/// After a node inside the innermost collection: a mapping's key becomes the one being read
/// (`key` for a scalar key), or its value ends the entry.
fn advance(stack: &mut [Open], key: Option<String>) {
    if let Some(Open::Map(next)) = stack.last_mut() {
        *next = match next {
            Next::Key => Next::Value(key.unwrap_or_default()),
            Next::Value(_) => Next::Key,
        };
    }
}

impl Builder {
    fn event(&mut self, event: Event) -> Result<(), String> {
        match event {
            Event::Scalar(text, style, anchor, tag) => {
                let style = if style == ScalarStyle::Plain { Style::Plain } else { Style::Quoted };
                let node = Node::Scalar { text: text.into_owned(), style, tag: tag.map(|t| tag_text(&t)) };
                self.complete(node, anchor)
            }
            Event::SequenceStart(anchor, tag) => {
                self.open(Node::Seq { items: Vec::new(), tag: tag.map(|t| tag_text(&t)) }, anchor)
            }
            Event::MappingStart(anchor, tag) => {
                self.open(Node::Map { entries: Vec::new(), tag: tag.map(|t| tag_text(&t)) }, anchor)
            }
            Event::SequenceEnd | Event::MappingEnd => {
                let frame = self.stack.pop().ok_or("unbalanced end of a collection")?;
                if frame.key.is_some() {
                    return Err("a mapping key has no value".into());
                }
                self.complete(frame.node, frame.anchor)
            }
            Event::Alias(id) => {
                let node = self.anchors.get(&id).ok_or("an alias names no anchor")?.clone();
                self.alias_nodes += count(&node);
                if self.alias_nodes > MAX_ALIAS_NODES {
                    return Err(format!("aliases expand to more than {MAX_ALIAS_NODES} nodes"));
                }
                self.complete(node, 0)
            }
            Event::DocumentStart(_) => {
                self.anchors.clear();
                Ok(())
            }
            _ => Ok(()),
        }
    }

    fn open(&mut self, node: Node, anchor: usize) -> Result<(), String> {
        if self.stack.len() >= MAX_DEPTH {
            return Err(format!("nested deeper than {MAX_DEPTH} levels"));
        }
        self.stack.push(Frame { node, anchor, key: None });
        Ok(())
    }

    /// A finished node: a document, an item, a key or a value.
    fn complete(&mut self, node: Node, anchor: usize) -> Result<(), String> {
        if anchor != 0 {
            self.anchors.insert(anchor, node.clone());
        }
        let Some(top) = self.stack.last_mut() else {
            if !node.is_null() || matches!(&node, Node::Scalar { tag: Some(_), .. }) {
                self.docs.push(node);
            }
            return Ok(());
        };
        match (&mut top.node, top.key.take()) {
            (Node::Seq { items, .. }, _) => items.push(node),
            (Node::Map { entries, .. }, Some(key)) => entries.push((key, node)),
            (Node::Map { .. }, None) => top.key = Some(node),
            (Node::Scalar { .. }, _) => return Err("a scalar has children".into()),
        }
        Ok(())
    }
}

/// A tag as written: `!!str` for the YAML core schema, `!name` for a local tag, else verbatim.
fn tag_text(tag: &Tag) -> String {
    match tag.handle.as_str() {
        "tag:yaml.org,2002:" => format!("!!{}", tag.suffix),
        "!" | "!!" => format!("{}{}", tag.handle, tag.suffix),
        h => format!("!<{h}{}>", tag.suffix),
    }
}

/// Nodes in a tree (depth is bounded by MAX_DEPTH).
fn count(node: &Node) -> usize {
    1 + match node {
        Node::Scalar { .. } => 0,
        Node::Seq { items, .. } => items.iter().map(count).sum(),
        Node::Map { entries, .. } => entries.iter().map(|(k, v)| count(k) + count(v)).sum(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scalars_keep_text_and_style() {
        let docs = parse("a: 0644\nb: '0644'\nc: yes\nd: !!str 1\n").unwrap();
        let d = &docs[0];
        assert_eq!(d.get("a"), Some(&Node::plain("0644")));
        assert_eq!(d.get("b"), Some(&Node::str("0644")));
        assert_eq!(d.get("c").and_then(Node::as_bool), Some(true));
        assert!(matches!(d.get("d"), Some(Node::Scalar { tag: Some(t), .. }) if t == "!!str"));
    }

    #[test]
    fn several_documents_and_empty_ones() {
        let docs = parse("---\na: 1\n---\n# nothing\n---\n- x\n").unwrap();
        assert_eq!(docs.len(), 2);
        assert_eq!(docs[1].as_seq()[0].as_str(), Some("x"));
    }

    #[test]
    fn aliases_are_copied_within_a_budget() {
        let docs = parse("a: &x {k: v}\nb: *x\n").unwrap();
        assert_eq!(docs[0].get("b"), docs[0].get("a"));
        // The billion-laughs shape: each level doubles the nodes the aliases copy.
        let mut bomb = String::from("a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n");
        for i in 1..12 {
            let p = i - 1;
            bomb.push_str(&format!("a{i}: &a{i} [*a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}]\n"));
        }
        let e = parse(&bomb).unwrap_err();
        assert!(e.msg.contains("aliases expand"), "{e:?}");
    }

    #[test]
    fn skim_reads_the_head_without_a_tree() {
        let h =
            skim("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  labels: {kind: x}\n  name: big\ndata:\n  kind: no\n")
                .unwrap();
        let want = Head {
            api_version: Some("v1".into()),
            kind: Some("ConfigMap".into()),
            name: Some("big".into()),
            namespace: None,
        };
        assert_eq!(h, Some(want));
        assert_eq!(skim("kind: A\nkind: B\n").unwrap().unwrap().kind, None, "twice");
        assert_eq!(skim("x: &k Pod\nkind: *k\n").unwrap().unwrap().kind, None, "an alias");
        assert_eq!(skim("kind: !!str Pod\n").unwrap().unwrap().kind, None, "tagged");
        assert_eq!(skim("? [a]\n: 1\nkind: Secret\n").unwrap().unwrap().kind.as_deref(), Some("Secret"));
        assert_eq!(skim("<<: {kind: Pod}\nkind: Secret\n").unwrap(), None);
        assert_eq!(skim("- kind: Pod\n").unwrap(), None);
        assert_eq!(skim("--- !!map\nkind: Pod\n").unwrap(), None);
        assert_eq!(skim("kind: A\n---\nkind: B\n").unwrap(), None);
        assert!(skim("kind: [\n").is_err());
    }

    #[test]
    fn deep_nesting_and_bad_yaml_are_errors() {
        let deep = "[".repeat(MAX_DEPTH + 1) + &"]".repeat(MAX_DEPTH + 1);
        assert!(parse(&deep).unwrap_err().msg.contains("nested deeper"));
        let e = parse("a: b\n  c: d\n").unwrap_err();
        assert_eq!(e.line, 2, "{e:?}");
        assert!(parse("a: [1, 2\n").is_err());
        assert!(parse("key: \"unterminated\n").is_err());
    }
}
