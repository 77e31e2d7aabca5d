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
    fn deep_nesting_and_bad_yaml_are_errors() {
        let deep = "[".repeat(MAX_DEPTH + 1) + &"]".repeat(MAX_DEPTH + 1);
        assert!(parse(&deep).unwrap_err().msg.contains("nested deeper"));
        let e = parse("a: b\n  c: d\n").unwrap_err();
        assert_eq!(e.line, 2, "{e:?}");
        assert!(parse("a: [1, 2\n").is_err());
        assert!(parse("key: \"unterminated\n").is_err());
    }
}
