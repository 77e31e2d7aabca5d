//! Lossless, terminal-safe rendering of file names that an app (maybe hostile) wrote.
//!
//! Valid UTF-8 without control characters is shown as is. Control characters become
//! `\n`, `\t`, `\r` or `\u{NN}`, so do the bidirectional controls (U+202E RIGHT-TO-LEFT
//! OVERRIDE and its kin, which reorder what a terminal shows), a backslash becomes `\\`, and
//! each byte that is not valid UTF-8 becomes `\xNN`. The mapping is invertible, so reports keep
//! every name exactly.

use std::ffi::OsStr;
use std::fmt;
use std::os::unix::ffi::OsStrExt;

/// Displays an `OsStr` (or bytes) escaped as described in the module docs.
pub struct Escaped<'a>(pub &'a OsStr);

impl fmt::Display for Escaped<'_> {
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
                c if c.is_control() || is_bidi_control(c) => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
                c => out.push(c),
            }
        }
        for b in chunk.invalid() {
            out.push_str(&format!("\\x{b:02x}"));
        }
    }
    out
}

/// The Unicode bidirectional formatting characters (marks, embeddings, overrides, isolates):
/// invisible, yet they reorder the text around them on a terminal, so `a\u{202e}txt.exe` shows
/// as `aexe.txt`.
fn is_bidi_control(c: char) -> bool {
    matches!(c, '\u{061c}' | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
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
