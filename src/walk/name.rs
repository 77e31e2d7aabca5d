//! A directory's name as its node keeps it: inline up to [`INLINE`] bytes, boxed only when
//! longer, so a queued subdirectory costs no allocation for its name, and the name moves from
//! the queued job into the node unchanged.

use std::ffi::CStr;

/// The longest name kept inline (its NUL makes the inline buffer 48 bytes).
pub(super) const INLINE: usize = 47;

/// A NUL-terminated name: inline when short, boxed otherwise.
pub(super) enum Name {
    /// The name's bytes and its NUL, then unused bytes.
    Inline([u8; INLINE + 1]),
    Boxed(Box<CStr>),
}

impl Name {
    /// A copy of `name`: inline when it fits (no allocation), else boxed.
    pub(super) fn new(name: &CStr) -> Name {
        let bytes = name.to_bytes_with_nul();
        if bytes.len() <= INLINE + 1 {
            let mut buf = [0u8; INLINE + 1];
            buf[..bytes.len()].copy_from_slice(bytes);
            Name::Inline(buf)
        } else {
            Name::Boxed(name.into())
        }
    }

    pub(super) fn as_c_str(&self) -> &CStr {
        match self {
            Name::Inline(buf) => CStr::from_bytes_until_nul(buf).expect("an inline name ends with its NUL"),
            Name::Boxed(b) => b,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_up_to_the_inline_length_stay_inline_and_longer_ones_are_boxed() {
        let short = c"d";
        let edge = std::ffi::CString::new(vec![b'x'; INLINE]).unwrap();
        let long = std::ffi::CString::new(vec![b'y'; INLINE + 1]).unwrap();
        for (name, inline) in [(short, true), (edge.as_c_str(), true), (long.as_c_str(), false), (c"", true)] {
            let n = Name::new(name);
            assert_eq!(n.as_c_str(), name);
            assert_eq!(matches!(n, Name::Inline(_)), inline, "{name:?}");
        }
    }
}
