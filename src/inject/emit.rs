//! [`Node`]s to block-style YAML. Plain scalars are written as they were read; strings are
//! written plain only when no YAML 1.1 or 1.2 reader could take them for anything else.

use std::fmt::Write as _;

use super::node::{Node, Style};

/// One document's text (without a `---` line), ending with a newline.
pub fn document(node: &Node) -> Result<String, String> {
    let mut out = String::new();
    match node {
        Node::Map { entries, tag: None } if !entries.is_empty() => map(entries, 0, false, &mut out)?,
        Node::Seq { items, tag: None } if !items.is_empty() => seq(items, 0, false, &mut out)?,
        _ => {
            value_inline(node, 0, &mut out)?;
            out.push('\n');
        }
    }
    Ok(out)
}

fn pad(out: &mut String, indent: usize) {
    out.extend(std::iter::repeat_n(' ', indent));
}

/// The entries of a mapping at `indent`; with `inline` the first starts on the current line.
fn map(entries: &[(Node, Node)], indent: usize, inline: bool, out: &mut String) -> Result<(), String> {
    for (i, (k, v)) in entries.iter().enumerate() {
        if i > 0 || !inline {
            pad(out, indent);
        }
        let Node::Scalar { .. } = k else { return Err("a mapping key is not a scalar".into()) };
        if k.as_str().is_some_and(|s| s.contains('\n')) {
            return Err("a mapping key spans lines".into());
        }
        scalar_inline(k, out);
        out.push(':');
        child(v, indent, out)?;
    }
    Ok(())
}

/// The items of a sequence at `indent`; with `inline` the first starts on the current line.
fn seq(items: &[Node], indent: usize, inline: bool, out: &mut String) -> Result<(), String> {
    for (i, item) in items.iter().enumerate() {
        if i > 0 || !inline {
            pad(out, indent);
        }
        out.push('-');
        match item {
            Node::Map { entries, tag: None } if !entries.is_empty() => {
                out.push(' ');
                map(entries, indent + 2, true, out)?;
            }
            Node::Seq { items, tag: None } if !items.is_empty() => {
                out.push(' ');
                seq(items, indent + 2, true, out)?;
            }
            _ => child(item, indent, out)?,
        }
    }
    Ok(())
}

/// A value after `key:` or `-`: on the same line, or as a block below at `indent + 2`.
fn child(v: &Node, indent: usize, out: &mut String) -> Result<(), String> {
    match v {
        Node::Map { entries, tag } if !entries.is_empty() => {
            tag_then_newline(tag, out);
            map(entries, indent + 2, false, out)
        }
        Node::Seq { items, tag } if !items.is_empty() => {
            tag_then_newline(tag, out);
            seq(items, indent + 2, false, out)
        }
        Node::Scalar { text, style: Style::Plain, tag: None } if text.is_empty() => {
            out.push('\n');
            Ok(())
        }
        _ => {
            out.push(' ');
            value_inline(v, indent + 2, out)?;
            out.push('\n');
            Ok(())
        }
    }
}

fn tag_then_newline(tag: &Option<String>, out: &mut String) {
    if let Some(t) = tag {
        out.push(' ');
        out.push_str(t);
    }
    out.push('\n');
}

/// A scalar or an empty collection, on the current line (a literal block continues below).
fn value_inline(v: &Node, indent: usize, out: &mut String) -> Result<(), String> {
    let tag = match v {
        Node::Scalar { tag, .. } | Node::Seq { tag, .. } | Node::Map { tag, .. } => tag,
    };
    if let Some(t) = tag {
        out.push_str(t);
        out.push(' ');
    }
    match v {
        Node::Seq { .. } => out.push_str("[]"),
        Node::Map { .. } => out.push_str("{}"),
        Node::Scalar { text, style: Style::Quoted, .. } if literal_ok(text) => literal(text, indent, out),
        Node::Scalar { .. } => scalar_inline(v, out),
    }
    Ok(())
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

#[cfg(test)]
mod tests {
    use super::super::parse::parse;
    use super::*;

    fn round_trip(text: &str) -> String {
        let docs = parse(text).unwrap();
        let out = document(&docs[0]).unwrap();
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
    fn tags_are_kept() {
        round_trip("a: !!str 0644\nb: !!binary aGk=\nc: !custom\n  k: v\n");
    }
}
