//! Lossless, terminal-safe rendering of file names that an app (maybe hostile) wrote.
//!
//! Valid UTF-8 of printing characters is shown as is. Every code point that prints nothing, or
//! not what it is, becomes `\n`, `\t`, `\r` or `\u{NN}`: controls, format characters (the
//! bidirectional controls such as U+202E RIGHT-TO-LEFT OVERRIDE, which reorder what a terminal
//! shows; zero-width spaces and joiners; tag characters), the line and paragraph separators
//! U+2028 and U+2029 (a new line to many log viewers), spaces other than U+0020, and unassigned
//! code points (see [`nonprinting`]). A backslash becomes `\\`, and each byte that is not
//! valid UTF-8 becomes `\xNN`. The mapping is invertible, so reports keep every name exactly.

mod nonprinting;

use std::ffi::OsStr;
use std::fmt;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use serde::{Deserialize, Serialize};

/// Displays an `OsStr` (or bytes) escaped as described in the module docs.
pub struct Escaped<'a>(pub &'a OsStr);

impl fmt::Display for Escaped<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&escape_bytes(self.0.as_bytes()))
    }
}

/// A path (or a symlink's target) escaped as described in the module docs, ready to be printed
/// or stored in a report. Only this module escapes: a raw path cannot be taken for one, nor one
/// escaped twice. Serde reads and writes it as the escaped string (a report volprep wrote).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize)]
#[serde(transparent)]
pub struct EscapedPath(String);

impl EscapedPath {
    /// The escape of a path (or any name).
    pub fn new(path: impl AsRef<OsStr>) -> Self {
        Self::from_bytes(path.as_ref().as_bytes())
    }

    /// The escape of raw bytes (a symlink's target).
    pub fn from_bytes(bytes: &[u8]) -> Self {
        EscapedPath(escape_bytes(bytes))
    }

    /// The escape of a path relative to a root; the root itself (the empty path) is `.`.
    pub fn relative(rel: &Path) -> Self {
        if rel.as_os_str().is_empty() { EscapedPath(".".into()) } else { Self::new(rel) }
    }

    /// The escaped text, to print or log.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for EscapedPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Text read back from where the app may write (the spec in words that a marker records): kept
/// as it was read, and shown (`Display`) escaped, so that no log line or message has to remember
/// to. Serde reads and writes it as the plain string.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Untrusted(String);

impl From<&str> for Untrusted {
    fn from(text: &str) -> Self {
        Untrusted(text.into())
    }
}

impl fmt::Display for Untrusted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&escape_bytes(self.0.as_bytes()))
    }
}

/// Escapes raw name bytes (see the module docs).
pub fn escape_bytes(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len());
    for chunk in bytes.utf8_chunks() {
        for c in chunk.valid().chars() {
            match c {
                '\\' => out.push_str("\\\\"),
                '\n' => out.push_str("\\n"),
                '\t' => out.push_str("\\t"),
                '\r' => out.push_str("\\r"),
                c if is_nonprinting(c) => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
                c => out.push(c),
            }
        }
        for b in chunk.invalid() {
            out.push_str(&format!("\\x{b:02x}"));
        }
    }
    out
}

/// Whether `c` is one of the code points never shown raw (see the module docs). ASCII is
/// answered at once; anything else by a binary search of the table's ~700 ranges.
fn is_nonprinting(c: char) -> bool {
    let c = c as u32;
    if c < 0x7f {
        return c < 0x20;
    }
    let ranges = nonprinting::RANGES;
    let i = ranges.partition_point(|&(_, last)| last < c);
    ranges.get(i).is_some_and(|&(first, _)| first <= c)
}

/// Inverse of [`escape_bytes`].
pub fn unescape(s: &str) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            let mut buf = [0u8; 4];
            out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
            continue;
        }
        match chars.next()? {
            '\\' => out.push(b'\\'),
            'n' => out.push(b'\n'),
            't' => out.push(b'\t'),
            'r' => out.push(b'\r'),
            'x' => {
                let hex: String = chars.by_ref().take(2).collect();
                out.push(u8::from_str_radix(&hex, 16).ok()?);
            }
            'u' => {
                if chars.next()? != '{' {
                    return None;
                }
                let hex: String = chars.by_ref().take_while(|&c| c != '}').collect();
                let c = char::from_u32(u32::from_str_radix(&hex, 16).ok()?)?;
                let mut buf = [0u8; 4];
                out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
            }
            _ => return None,
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn untrusted_text_is_kept_as_read_and_shown_escaped() {
        let t: Untrusted = serde_json::from_str(r#""fs-group=1\nFAKE\u2028""#).unwrap();
        assert_eq!(t.to_string(), r"fs-group=1\nFAKE\u{2028}");
        let back: String = serde_json::from_str(&serde_json::to_string(&t).unwrap()).unwrap();
        assert_eq!(back, "fs-group=1\nFAKE\u{2028}");
        assert_eq!(Untrusted::from("fs-group=2000").to_string(), "fs-group=2000");
    }

    #[test]
    fn plain_names_are_unchanged() {
        assert_eq!(escape_bytes("data/ü.txt".as_bytes()), "data/ü.txt");
    }

    #[test]
    fn control_backslash_and_invalid_bytes_are_escaped() {
        assert_eq!(escape_bytes(b"a\nb\\c\xff\x1b"), "a\\nb\\\\c\\xff\\u{1b}");
    }

    #[test]
    fn bidi_controls_are_escaped() {
        assert_eq!(escape_bytes("a\u{202e}fdp.exe".as_bytes()), "a\\u{202e}fdp.exe");
        for c in ['\u{061c}', '\u{200e}', '\u{200f}', '\u{202a}', '\u{202e}', '\u{2066}', '\u{2069}'] {
            let s = format!("x{c}y");
            let e = escape_bytes(s.as_bytes());
            assert!(!e.contains(c), "{e}");
            assert_eq!(unescape(&e).unwrap(), s.as_bytes());
        }
        assert_eq!(escape_bytes("\u{2070}".as_bytes()), "\u{2070}", "superscript zero is printable");
    }

    /// Known members of each category, and printing characters next to them.
    const ESCAPED: &[(&str, &[u32])] = &[
        ("Cc", &[0x0, 0x1b, 0x7f, 0x85, 0x9f]),
        ("Cf", &[0xad, 0x600, 0x61c, 0x180e, 0x200b, 0x200c, 0x200d, 0x200e, 0x202a, 0x202e, 0x2060, 0x2064]),
        ("Cf", &[0x2066, 0x2069, 0xfeff, 0xfff9, 0xfffb, 0x110bd, 0x1d173, 0xe0001, 0xe0020, 0xe0041, 0xe007f]),
        ("Zl", &[0x2028]),
        ("Zp", &[0x2029]),
        ("Zs", &[0xa0, 0x1680, 0x2000, 0x2007, 0x200a, 0x202f, 0x205f, 0x3000]),
        ("Cn", &[0x378, 0x5ff, 0xfdd0, 0xfdef, 0xfffe, 0xffff, 0x2fffe, 0x50000, 0xe0000, 0xe0080, 0x10ffff]),
    ];
    const PRINTED: &[u32] = &[
        0x20, 0x41, 0x7e, 0xa1, 0xe9, 0xfc, 0x301, 0x5d0, 0x627, 0x2010, 0x2070, 0x20ac, 0x4e2d, 0xfe0f, 0x1f600,
        0xe000, 0xe0100, 0xf0000,
    ];

    #[test]
    fn every_non_printing_category_is_escaped_and_printing_characters_are_not() {
        for (cat, cps) in ESCAPED {
            for &cp in *cps {
                let c = char::from_u32(cp).unwrap();
                let s = format!("a{c}b");
                let e = escape_bytes(s.as_bytes());
                assert_eq!(e, format!("a\\u{{{cp:x}}}b"), "{cat} U+{cp:04X}");
                assert_eq!(unescape(&e).unwrap(), s.as_bytes(), "{cat} U+{cp:04X}");
            }
        }
        for &cp in PRINTED {
            let c = char::from_u32(cp).unwrap();
            assert_eq!(escape_bytes(c.to_string().as_bytes()), c.to_string(), "U+{cp:04X} prints");
        }
    }

    #[test]
    fn a_name_with_separators_and_tags_stays_on_one_visible_line() {
        let name = "ok\u{2028}FAKE LINE\u{2029}\u{200b}x\u{e0041}\u{e007f}.txt";
        let e = escape_bytes(name.as_bytes());
        assert_eq!(e, "ok\\u{2028}FAKE LINE\\u{2029}\\u{200b}x\\u{e0041}\\u{e007f}.txt");
        assert!(e.chars().all(|c| c == ' ' || !c.is_whitespace() && !is_nonprinting(c)), "{e}");
    }

    #[test]
    fn the_table_is_sorted_disjoint_and_whole() {
        let r = nonprinting::RANGES;
        assert!(r.iter().all(|&(a, b)| a <= b && b <= 0x10ffff));
        assert!(r.windows(2).all(|w| w[0].1 + 1 < w[1].0), "sorted, disjoint, merged");
        assert_eq!(r.iter().map(|&(a, b)| b - a + 1).sum::<u32>(), nonprinting::COVERED);
        assert!(!r.iter().any(|&(a, b)| (a..=b).contains(&0x20)), "a plain space prints");
        // Every `char` the standard library calls a control is in the table.
        assert!((0..=0x10ffffu32).filter_map(char::from_u32).filter(|c| c.is_control()).all(is_nonprinting));
    }

    #[test]
    fn an_escaped_path_is_escaped_once_and_the_root_is_a_dot() {
        let p = EscapedPath::new(Path::new("x\\y/\n"));
        assert_eq!(p.to_string(), "x\\\\y/\\n");
        assert_eq!(serde_json::to_string(&p).unwrap(), r#""x\\\\y/\\n""#);
        assert_eq!(serde_json::from_str::<EscapedPath>(r#""x\\\\y""#).unwrap().to_string(), "x\\\\y");
        assert_eq!(EscapedPath::relative(Path::new("")).to_string(), ".");
        assert_eq!(EscapedPath::relative(Path::new("a\\b")).to_string(), "a\\\\b");
    }

    #[test]
    fn escaping_round_trips_every_byte() {
        let all: Vec<u8> = (1..=255u8).chain([0xc3, 0xa9, 0xe2, 0x28]).collect();
        assert_eq!(unescape(&escape_bytes(&all)).unwrap(), all);
        for b in 0..=255u8 {
            let v = vec![b'x', b, b'\\', b'x'];
            assert_eq!(unescape(&escape_bytes(&v)).unwrap(), v);
        }
    }
}
