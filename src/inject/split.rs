//! Splits a YAML stream into its documents' source text at `---` lines (with the `%YAML`/`%TAG`
//! directives before them), so documents that `inject` leaves alone are written back byte for
//! byte.

/// One document's source text: from its directives or `---` line (if any) to the next one.
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

/// True for a line that ends a document: `...` alone or followed by a space, tab or comment.
fn is_end(line: &str) -> bool {
    let l = line.trim_end_matches(['\n', '\r']);
    l == "..." || l.starts_with("... ") || l.starts_with("...\t")
}

/// A directive (`%YAML 1.1`, `%TAG ! tag:...`): only at column 0, before a `---`.
fn is_directive(line: &str) -> bool {
    line.starts_with('%')
}

fn is_blank_or_comment(line: &str) -> bool {
    let t = line.trim();
    t.is_empty() || t.starts_with('#')
}

/// The chunks of `text`, in order; concatenated they are `text`. Directives belong to the
/// document they precede: they may stand only at the start of the stream or after a `...`
/// line, so a `%` line there opens the next chunk.
pub fn chunks(text: &str) -> Vec<Chunk<'_>> {
    let mut out = Vec::new();
    let (mut start, mut start_line, mut pos) = (0, 1, 0);
    // Where the directives before the next `---` begin (and their line), while only
    // directives, comments and blank lines followed a `...` line or the stream's start.
    let mut directives: Option<(usize, usize)> = None;
    let mut after_end = true;
    for (n, line) in text.split_inclusive('\n').enumerate() {
        if is_start(line) {
            let (at, at_line) = directives.unwrap_or((pos, n + 1));
            if at > start {
                out.push(Chunk { text: &text[start..at], line: start_line });
                (start, start_line) = (at, at_line);
            }
            directives = None;
            after_end = false;
        } else if is_end(line) {
            after_end = true;
            directives = None;
        } else if is_directive(line) && after_end {
            directives.get_or_insert((pos, n + 1));
        } else if !is_blank_or_comment(line) {
            after_end = false;
            directives = None;
        }
        pos += line.len();
    }
    if pos > start {
        out.push(Chunk { text: &text[start..pos], line: start_line });
    }
    out
}

/// The chunk's head to keep when it is re-written: its directives, the `---` line when bare,
/// then the comment and blank lines before its content (helm's `# Source: ...`).
pub fn head(chunk: &str) -> &str {
    let mut end = 0;
    let mut marker_seen = false;
    for line in chunk.split_inclusive('\n') {
        let keep = if is_start(line) {
            let bare = line.trim_end() == "---";
            let first = !marker_seen;
            marker_seen = true;
            bare && first
        } else {
            (is_directive(line) && !marker_seen) || is_blank_or_comment(line)
        };
        if !keep {
            break;
        }
        end += line.len();
    }
    &chunk[..end]
}

/// True when the head holds the document's `---` line.
pub fn head_has_marker(head: &str) -> bool {
    head.split_inclusive('\n').any(is_start)
}

/// The chunk's tail to keep when it is re-written: a last `...` line and the comment and blank
/// lines after it.
pub fn tail(chunk: &str) -> &str {
    let mut start = chunk.len();
    for line in chunk.split_inclusive('\n').rev() {
        start -= line.len();
        if is_end(line) {
            return &chunk[start..];
        }
        if !is_blank_or_comment(line) {
            break;
        }
    }
    ""
}

/// The line ending the chunk's own lines use.
pub fn newline(chunk: &str) -> &'static str {
    if chunk.contains("\r\n") { "\r\n" } else { "\n" }
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
    fn directives_open_the_document_they_precede() {
        let text = "%YAML 1.1\n---\na: 1\n...\n# c\n%TAG !e! tag:e.com,2000:\n---\nb: !e!x 2\n";
        let c = chunks(text);
        assert_eq!(
            c.iter().map(|c| c.text).collect::<Vec<_>>(),
            ["%YAML 1.1\n---\na: 1\n...\n# c\n", "%TAG !e! tag:e.com,2000:\n---\nb: !e!x 2\n"]
        );
        assert_eq!(c[1].line, 6);
        assert_eq!(head(c[0].text), "%YAML 1.1\n---\n");
        assert_eq!(tail(c[0].text), "...\n# c\n");
        // A `%` line inside a document is text, not a directive.
        assert_eq!(chunks("a: |\n  x\n%b\n---\nc: 1\n").len(), 2);
    }

    #[test]
    fn head_keeps_the_marker_and_leading_comments() {
        assert_eq!(head("---\n# Source: x\n\nkind: Pod\n# later\n"), "---\n# Source: x\n\n");
        assert_eq!(head("kind: Pod\n"), "");
        assert_eq!(head("--- {a: 1}\n"), "");
        assert_eq!(head("--- !!map\nkind: Pod\n"), "");
        assert!(!head_has_marker(head("--- !!map\n")));
        assert_eq!(tail("a: 1\n"), "");
        assert_eq!(newline("a: 1\r\n"), "\r\n");
    }
}
