//! The mount points below the root: their digest in a `done` marker, and whether they changed during a pass.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::escape::escape_bytes;

/// What a `done` marker records of the mount points below the root ([`Marker::mounts`]): their
/// digest ([`mounts_digest`]), or [`MountsDigest::unlisted`] when they could not be listed.
/// Read back from the root it is whatever the app wrote there, only ever compared and shown
/// escaped. On the wire the plain string.
///
/// [`Marker::mounts`]: super::Marker::mounts
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct MountsDigest(String);

impl MountsDigest {
    /// The word a marker records when the mount points could not be listed at the end of the
    /// pass: no digest equals it, so every start walks.
    pub fn unlisted() -> MountsDigest {
        MountsDigest("unlisted".into())
    }
}

impl fmt::Display for MountsDigest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&escape_bytes(self.0.as_bytes()))
    }
}

/// The digest of a set of mount points (paths relative to the root, sorted): 16 hex digits of
/// SHA-256; `None` (never equal to a recorded digest) when they could not be listed.
pub fn mounts_digest(points: Option<&[Vec<u8>]>) -> Option<MountsDigest> {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    for p in points? {
        h.update(p);
        h.update([0]);
    }
    Some(MountsDigest(h.finalize().iter().take(8).map(|b| format!("{b:02x}")).collect()))
}

/// Why a pass may not mark the volume done over the mounts it saw, or `None` when it may: the
/// mount points below the root when it started (`start`) and when it ended (`end`; `None`
/// when they could not be listed) differ, or a mount point it met (`met`) is gone. What a mount
/// hid while the pass ran was not walked, and shows again, with its old change times, once the
/// mount is gone: only a set of mounts that stayed put lets the marker's digest stand for it.
/// Where they cannot be listed, a pass that met one records a digest nothing equals (see
/// [`Marker::mounts`](super::Marker::mounts)): every start walks.
pub fn mounts_changed(start: Option<&[Vec<u8>]>, end: Option<&[Vec<u8>]>, met: &[Vec<u8>]) -> Option<String> {
    let end = end?;
    let shown = |v: Vec<&Vec<u8>>| {
        let n = v.len();
        let mut s: Vec<String> = v.into_iter().take(3).map(|p| escape_bytes(p)).collect();
        if n > 3 {
            s.push(format!("and {} more", n - 3));
        }
        s.join(", ")
    };
    if let Some(start) = start.filter(|s| *s != end) {
        let came: Vec<&Vec<u8>> = end.iter().filter(|p| !start.contains(p)).collect();
        let went: Vec<&Vec<u8>> = start.iter().filter(|p| !end.contains(p)).collect();
        let mut what = Vec::new();
        if !came.is_empty() {
            what.push(format!("mounted: {}", shown(came)));
        }
        if !went.is_empty() {
            what.push(format!("unmounted: {}", shown(went)));
        }
        return Some(format!("the mount points below the root changed during the pass ({})", what.join("; ")));
    }
    let gone: Vec<&Vec<u8>> = met.iter().filter(|p| !end.contains(p)).collect();
    (!gone.is_empty()).then(|| format!("mount points the pass met were unmounted before it ended ({})", shown(gone)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_digest_is_written_as_a_plain_string() {
        let d = mounts_digest(Some(&[b"a/m".to_vec()])).unwrap();
        let text = serde_json::to_string(&d).unwrap();
        assert_eq!((text.len(), &text[..1]), (18, "\""), "16 hex digits, quoted: {text}");
        assert_eq!(serde_json::from_str::<MountsDigest>(&text).unwrap(), d);
        assert_eq!(serde_json::to_string(&MountsDigest::unlisted()).unwrap(), r#""unlisted""#);
        let forged: MountsDigest = serde_json::from_str(r#""x\n""#).unwrap();
        assert_eq!(forged.to_string(), "x\\n", "shown escaped");
    }

    #[test]
    fn a_pass_claims_nothing_over_mounts_that_changed_while_it_ran() {
        let (a, b) = (b"a/m".to_vec(), b"x/y/h".to_vec());
        let some = |v: &[&Vec<u8>]| Some(v.iter().map(|p| (*p).clone()).collect::<Vec<_>>());
        // The same mounts at both ends, each one met still there: nothing to say.
        assert_eq!(mounts_changed(some(&[&a]).as_deref(), some(&[&a]).as_deref(), std::slice::from_ref(&a)), None);
        // Mounted during the pass and still there (met or not): the set changed all the same.
        assert!(mounts_changed(some(&[]).as_deref(), some(&[&a]).as_deref(), &[]).is_some());
        // Mounted at the start, gone at the end (met or not).
        let why = mounts_changed(some(&[&a, &b]).as_deref(), some(&[&a]).as_deref(), std::slice::from_ref(&b)).unwrap();
        assert!(why.contains("unmounted: x/y/h") && !why.contains("a/m"), "{why}");
        let why = mounts_changed(some(&[&a]).as_deref(), some(&[&b]).as_deref(), &[]).unwrap();
        assert!(why.contains("mounted: x/y/h") && why.contains("unmounted: a/m"), "{why}");
        // Mounted after the start and gone before the end, met in between.
        let why = mounts_changed(some(&[]).as_deref(), some(&[]).as_deref(), std::slice::from_ref(&b)).unwrap();
        assert!(why.contains("met were unmounted") && why.contains("x/y/h"), "{why}");
        // Not listed at the start: what was met must still be there.
        assert!(mounts_changed(None, some(&[]).as_deref(), std::slice::from_ref(&b)).is_some());
        assert_eq!(mounts_changed(None, some(&[&b]).as_deref(), std::slice::from_ref(&b)), None);
        // Not listed at the end: the marker records a digest nothing equals instead.
        assert_eq!(mounts_changed(some(&[&a]).as_deref(), None, std::slice::from_ref(&a)), None);
    }
}
