//! [`Node`]s to block-style YAML. Plain scalars are written as they were read; strings are
//! written plain only when no YAML 1.1 or 1.2 reader could take them for anything else.

use std::fmt::Write as _;

use super::node::{Node, Style};

/// How a sequence under a mapping key is indented: `Indented` (`key:` then `  - item`), or
/// `Compact` (`- item` at the key's indentation, as Go's YAML writes it: helm, kustomize).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seqs {
    Indented,
    Compact,
}

impl Seqs {
    /// The style of a document's source: compact when a `key:` line is followed by a `- ` line
    /// at the same indentation.
    pub fn of(text: &str) -> Seqs {
        let mut prev: Option<&str> = None;
        for line in text.lines() {
            if let Some(p) = prev {
                let ind = p.len() - p.trim_start().len();
                if p.trim_end().ends_with(':')
                    && line.len() > ind
                    && line[..ind].trim().is_empty()
                    && line[ind..].starts_with("- ")
                {
                    return Seqs::Compact;
                }
            }
            prev = Some(line);
        }
        Seqs::Indented
    }

    fn extra(self) -> usize {
        match self {
            Seqs::Indented => 2,
            Seqs::Compact => 0,
        }
    }
}

/// One document's text (without a `---` line), ending with a newline. A tagged root
/// collection has its tag on a line of its own, then its block (`!!map`, `kind: Pod`, ...).
pub fn document(node: &Node, seqs: Seqs) -> Result<String, String> {
    let mut out = String::new();
    let mut e = Emitter { out: &mut out, seqs };
    match node {
        Node::Map { entries, tag } if !entries.is_empty() => {
            root_tag(tag, e.out);
            e.map(entries, 0, First::OwnLine)?
        }
        Node::Seq { items, tag } if !items.is_empty() => {
            root_tag(tag, e.out);
            e.seq(items, 0, First::OwnLine)?
        }
        _ => {
            e.value_inline(node, 0)?;
            e.out.push('\n');
        }
    }
    Ok(out)
}

/// Where the first entry of a block collection starts: on the line already begun (after `- `
/// in a sequence), or on a line of its own at the block's indent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum First {
    SameLine,
    OwnLine,
}

struct Emitter<'a> {
    out: &'a mut String,
    seqs: Seqs,
}

fn pad(out: &mut String, indent: usize) {
    out.extend(std::iter::repeat_n(' ', indent));
}

impl Emitter<'_> {
    /// The entries of a mapping at `indent`, the first where `first` says.
    fn map(&mut self, entries: &[(Node, Node)], indent: usize, first: First) -> Result<(), String> {
        for (i, (k, v)) in entries.iter().enumerate() {
            if i > 0 || first == First::OwnLine {
                pad(self.out, indent);
            }
            if implicit_key_ok(k) {
                self.key_inline(k);
            } else {
                // An explicit key (`? key` then `: value`): a collection, a key over lines, a
                // tagged empty scalar, a long key.
                self.out.push('?');
                self.child(k, indent, 2)?;
                pad(self.out, indent);
            }
            self.out.push(':');
            self.child(v, indent, self.seqs.extra())?;
        }
        Ok(())
    }

    /// A key on the current line, with its tag (`!!str 0644` stays a string key).
    fn key_inline(&mut self, k: &Node) {
        if let Node::Scalar { tag: Some(t), .. } = k {
            if !hook::drops_key_tags() {
                self.out.push_str(t);
                self.out.push(' ');
            }
        }
        scalar_inline(k, self.out);
    }

    /// The items of a sequence at `indent`, the first where `first` says.
    fn seq(&mut self, items: &[Node], indent: usize, first: First) -> Result<(), String> {
        for (i, item) in items.iter().enumerate() {
            if i > 0 || first == First::OwnLine {
                pad(self.out, indent);
            }
            self.out.push('-');
            match item {
                Node::Map { entries, tag: None } if !entries.is_empty() => {
                    self.out.push(' ');
                    self.map(entries, indent + 2, First::SameLine)?;
                }
                Node::Seq { items, tag: None } if !items.is_empty() => {
                    self.out.push(' ');
                    self.seq(items, indent + 2, First::SameLine)?;
                }
                _ => self.child(item, indent, 2)?,
            }
        }
        Ok(())
    }

    /// A value after `key:` or `-`: on the same line, or as a block below (a sequence under a
    /// key at `indent + seq_extra`).
    fn child(&mut self, v: &Node, indent: usize, seq_extra: usize) -> Result<(), String> {
        match v {
            Node::Map { entries, tag } if !entries.is_empty() => {
                tag_then_newline(tag, self.out);
                self.map(entries, indent + 2, First::OwnLine)
            }
            Node::Seq { items, tag } if !items.is_empty() => {
                tag_then_newline(tag, self.out);
                self.seq(items, indent + seq_extra, First::OwnLine)
            }
            Node::Scalar { text, style: Style::Plain, tag: None } if text.is_empty() => {
                self.out.push('\n');
                Ok(())
            }
            _ => {
                self.out.push(' ');
                self.value_inline(v, indent + 2)?;
                self.out.push('\n');
                Ok(())
            }
        }
    }

    /// A scalar or an empty collection, on the current line (a literal block continues below).
    fn value_inline(&mut self, v: &Node, indent: usize) -> Result<(), String> {
        let tag = match v {
            Node::Scalar { tag, .. } | Node::Seq { tag, .. } | Node::Map { tag, .. } => tag,
        };
        if let Some(t) = tag {
            self.out.push_str(t);
            if matches!(v, Node::Scalar { text, style: Style::Plain, .. } if text.is_empty()) {
                // A tagged empty scalar (`!!str`: the empty string) is its tag alone.
                return Ok(());
            }
            self.out.push(' ');
        }
        match v {
            Node::Seq { .. } => self.out.push_str("[]"),
            Node::Map { .. } => self.out.push_str("{}"),
            Node::Scalar { text, style: Style::Quoted, .. } if literal_ok(text) => literal(text, indent, self.out),
            Node::Scalar { .. } => scalar_inline(v, self.out),
        }
        Ok(())
    }
}

fn root_tag(tag: &Option<String>, out: &mut String) {
    if let Some(t) = tag {
        out.push_str(t);
        out.push('\n');
    }
}

fn tag_then_newline(tag: &Option<String>, out: &mut String) {
    if let Some(t) = tag {
        out.push(' ');
        out.push_str(t);
    }
    out.push('\n');
}

/// True when `k` may be written as an implicit key (`key: value`): a scalar on one line, not
/// a tagged empty one, short enough for every reader (YAML caps implicit keys at 1024 chars).
fn implicit_key_ok(k: &Node) -> bool {
    match k {
        Node::Scalar { text, style, tag } => {
            !text.contains(['\n', '\r'])
                && text.len() <= 256
                && !(tag.is_some() && text.is_empty() && *style == Style::Plain)
        }
        _ => false,
    }
}

/// A scalar on one line, its tag left to the caller.
fn scalar_inline(v: &Node, out: &mut String) {
    let Node::Scalar { text, style, .. } = v else { return };
    match style {
        Style::Plain if text.is_empty() => out.push_str("null"),
        Style::Plain if !text.contains(['\n', '\r']) => out.push_str(text),
        _ if plain_safe(text) => out.push_str(text),
        _ => double_quoted(text, out),
    }
}

/// True when `s` written plain reads back as the same string under YAML 1.1 and 1.2: starts
/// with a letter, `/`, `_` or `--` and a letter (a long flag), holds no indicator that could
/// end or start anything, and is no boolean or null word.
pub fn plain_safe(s: &str) -> bool {
    let start = s.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '/' || c == '_')
        || s.strip_prefix("--").is_some_and(|r| r.starts_with(|c: char| c.is_ascii_alphabetic()));
    let body = s.chars().all(|c| c.is_ascii_alphanumeric() || "_./:@=+-".contains(c));
    let words = ["y", "n", "yes", "no", "on", "off", "true", "false", "null"];
    start && body && !s.ends_with(':') && !words.contains(&s.to_ascii_lowercase().as_str())
}

/// A multi-line string written as a literal block (`|` or `|-`) keeps its text exactly.
fn literal_ok(s: &str) -> bool {
    s.contains('\n')
        && !s.starts_with([' ', '\t', '\n'])
        && !s.ends_with("\n\n")
        && s.chars().all(|c| c == '\n' || c == '\t' || !c.is_control())
        && !s.contains(['\u{feff}', '\u{2028}', '\u{2029}', '\u{85}'])
        && !s.lines().any(|l| l.ends_with([' ', '\t']) && l.trim().is_empty())
}

fn literal(s: &str, indent: usize, out: &mut String) {
    let body = s.strip_suffix('\n');
    out.push_str(if body.is_some() { "|" } else { "|-" });
    for line in body.unwrap_or(s).split('\n') {
        out.push('\n');
        if !line.is_empty() {
            pad(out, indent);
            out.push_str(line);
        }
    }
}

fn double_quoted(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c if c.is_control() || matches!(c, '\u{feff}' | '\u{2028}' | '\u{2029}') => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// A TEST HOOK, only in a binary built with `--features test-hooks` (what the tests run): with
/// `VOLPREP_TEST_INJECT_BREAK_EMITTER` set, the emitter drops mapping keys' tags, as the bug
/// that turned `!!str 0644` into the integer key 420 did; the tests show the self-check
/// catches it. The shipped binary never reads the variable.
mod hook {
    #[cfg(feature = "test-hooks")]
    pub fn drops_key_tags() -> bool {
        std::env::var_os("VOLPREP_TEST_INJECT_BREAK_EMITTER").is_some()
    }

    #[cfg(not(feature = "test-hooks"))]
    pub fn drops_key_tags() -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::super::parse::parse;
    use super::*;

    fn round_trip(text: &str) -> String {
        let docs = parse(text).unwrap();
        let out = document(&docs[0], Seqs::of(text)).unwrap();
        assert_eq!(parse(&out).unwrap(), docs, "{out}");
        out
    }

    #[test]
    fn yaml_1_1_meanings_survive() {
        let out = round_trip("a: 0644\nb: \"yes\"\nc: yes\nd: '0644'\ne: \"on\"\nf: \"\"\ng: ~\nh:\n");
        assert_eq!(out, "a: 0644\nb: \"yes\"\nc: yes\nd: \"0644\"\ne: \"on\"\nf: \"\"\ng: ~\nh:\n");
    }

    #[test]
    fn nested_blocks_and_empty_collections() {
        let text = "spec:\n  containers:\n    - name: app\n      args:\n        - --x=1\n        - \"a b\"\n    - name: b\n  m: {}\n  s: []\nl:\n  - - 1\n    - 2\n";
        assert_eq!(round_trip(text), text);
    }

    #[test]
    fn strings_that_need_quotes_get_them() {
        for s in
            ["", "1", "1.5", "0x1f", "true", "Yes", "N", "null", "~", "12:30", "a: b", "#c", "- x", "@x", "a,b", "x:"]
        {
            assert!(!plain_safe(s), "{s}");
        }
        for s in ["app", "/volumes/data", "--fs-group=1000", "registry.example.com/volprep:0.1.0", "RuntimeDefault"] {
            assert!(plain_safe(s), "{s}");
        }
        round_trip("a: \"tab\\there \\\"q\\\" \\\\ \\u0001\"\n");
    }

    #[test]
    fn multi_line_strings_become_literal_blocks() {
        let out = round_trip("cmd:\n  - sh\n  - |\n    echo one\n\n    echo two\n  - \"no newline\\nat end\"\n");
        assert!(out.contains("  - |\n    echo one\n\n    echo two\n"), "{out}");
        assert!(out.contains("  - |-\n    no newline\n    at end\n"), "{out}");
        round_trip("a: \"  leading\\n\"\nb: \"x\\n\\n\"\nc: >\n  folded\n  text\n");
    }

    #[test]
    fn compact_sequences_as_go_writes_them() {
        let text =
            "spec:\n  containers:\n  - name: app\n    args:\n    - --x=1\n    ports: []\n  l:\n  - - 1\n    - 2\n";
        assert_eq!(Seqs::of(text), Seqs::Compact);
        assert_eq!(round_trip(text), text);
    }

    #[test]
    fn tagged_empty_scalars_and_tagged_keys_keep_their_meaning() {
        let out = round_trip("value: !!str\nargs:\n  - !!str\n  - !e \"\"\n!!str 0644: mode\n? !!str yes\n: b\n");
        assert_eq!(out, "value: !!str\nargs:\n  - !!str\n  - !e \"\"\n!!str 0644: mode\n!!str yes: b\n");
        assert_eq!(round_trip("!!str\n"), "!!str\n");
        let out = round_trip("? !!str\n: empty\n? [a, b]\n: seq\n? {k: v}\n: map\n? |\n  two\n  lines\n: x\n");
        assert_eq!(out, "? !!str\n: empty\n?\n  - a\n  - b\n: seq\n?\n  k: v\n: map\n? |\n  two\n  lines\n: x\n");
    }

    #[test]
    fn tags_are_kept() {
        round_trip("a: !!str 0644\nb: !!binary aGk=\nc: !custom\n  k: v\n");
        assert_eq!(round_trip("--- !!map\nkind: Pod\nspec: {}\n"), "!!map\nkind: Pod\nspec: {}\n");
        round_trip("--- !list\n- a\n- !!map\n  b: c\n");
    }
}
