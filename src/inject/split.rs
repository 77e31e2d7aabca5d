//! Splits a YAML stream into its documents' source text at `---` lines, so documents that
//! `inject` leaves alone are written back byte for byte.

/// One document's source text: from its `---` line (if any) to the next one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Chunk<'a> {
    pub text: &'a str,
    /// 1-based line of the chunk's first line in the stream.
    pub line: usize,
}

/// True for a line that starts a document: `---` alone or followed by a space or tab.
fn is_start(line: &str) -> bool {
    let l = line.trim_end_matches(['\n', '\r']);
    l == "---" || l.starts_with("--- ") || l.starts_with("---\t")
}

/// The chunks of `text`, in order; concatenated they are `text`.
pub fn chunks(text: &str) -> Vec<Chunk<'_>> {
    let mut out = Vec::new();
    let (mut start, mut start_line, mut pos) = (0, 1, 0);
    for (n, line) in text.split_inclusive('\n').enumerate() {
        if is_start(line) && pos > start {
            out.push(Chunk { text: &text[start..pos], line: start_line });
            (start, start_line) = (pos, n + 1);
        }
        pos += line.len();
    }
    if pos > start {
        out.push(Chunk { text: &text[start..pos], line: start_line });
    }
    out
}

/// The chunk's head to keep when it is re-written: the `---` line, then the comment and blank
/// lines before its content (helm's `# Source: ...`).
pub fn head(chunk: &str) -> &str {
    let mut end = 0;
    for (i, line) in chunk.split_inclusive('\n').enumerate() {
        let t = line.trim();
        if !((i == 0 && is_start(line) && line.trim_end() == "---") || t.is_empty() || t.starts_with('#')) {
            break;
        }
        end += line.len();
    }
    &chunk[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_cover_the_text() {
        let text = "# lead\na: 1\n---\n# Source: x\nb: 2\n--- \nc: |\n  ---x\n----\n---\n";
        let c = chunks(text);
        assert_eq!(c.iter().map(|c| c.text).collect::<String>(), text);
        assert_eq!(c.len(), 4);
        assert_eq!((c[1].text, c[1].line), ("---\n# Source: x\nb: 2\n", 3));
        assert_eq!(c[2].text, "--- \nc: |\n  ---x\n----\n");
        assert_eq!(c[3].text, "---\n");
        assert!(chunks("").is_empty());
        assert_eq!(chunks("a: 1").len(), 1);
    }

    #[test]
    fn head_keeps_the_marker_and_leading_comments() {
        assert_eq!(head("---\n# Source: x\n\nkind: Pod\n# later\n"), "---\n# Source: x\n\n");
        assert_eq!(head("kind: Pod\n"), "");
        assert_eq!(head("--- {a: 1}\n"), "");
    }
}
