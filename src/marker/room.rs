//! The root's xattr space: whether a failed write found it full, the attributes volprep did not
//! write in it and those it did (listed and removed by `volprep clear`), and why the root refused
//! a write.

use std::ffi::{CStr, CString};
use std::os::fd::BorrowedFd;

use rustix::io::Errno;

use crate::escape::escape_bytes;
use crate::sys;

use super::MARKER_XATTR;

/// Whether a failed xattr write means the value does not fit (the root's xattr space is full,
/// or the filesystem's limit on one value is smaller): a smaller value may still fit.
pub fn no_room(e: Errno) -> bool {
    matches!(e, Errno::NOSPC | Errno::TOOBIG | Errno::RANGE | Errno::DQUOT)
}

/// Why the root refused a marker write with `e`: the errno, and what the root itself tells of
/// it: its inode flag or an owner not mapped into this user namespace (EPERM), what fills its
/// attribute space (no room).
pub fn refused(root: BorrowedFd<'_>, e: Errno) -> String {
    let text = crate::error::errno_text(e.raw_os_error());
    if e != Errno::PERM {
        let what = no_room(e).then(|| Foreign::read(root).describe()).flatten();
        return what.map_or(text.clone(), |w| format!("{text} ({w})"));
    }
    let unmapped = || sys::stat_fd(root).is_ok_and(|m| !sys::Mapped::of_self().maps(m.uid, m.gid));
    match sys::locked_at(root, c"") {
        Some(sys::Locked::Immutable) => {
            format!("{text}: the root is immutable (chattr +i): volprep does not lift the flag; `chattr -i` it")
        }
        Some(sys::Locked::AppendOnly) => {
            format!("{text}: the root is append-only (chattr +a): volprep does not lift the flag; `chattr -a` it")
        }
        None if unmapped() => {
            format!(
                "{text}: the root's owner or group is not mapped into this user namespace (it reads as the overflow id)"
            )
        }
        None => text,
    }
}

/// The extended attributes of the root that volprep did not write (any name but `user.volprep`
/// and `user.volprep.*`): what takes the room its marker, shard record and checkpoints need.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Foreign {
    /// How many there are.
    pub count: usize,
    /// Their names' and values' bytes (the filesystem adds a little per attribute).
    pub bytes: usize,
    /// The first few names, escaped.
    pub first: Vec<String>,
}

impl Foreign {
    /// The root's attributes that volprep did not write; none when they cannot be listed.
    pub fn read(root: BorrowedFd<'_>) -> Foreign {
        let mut f = Foreign::default();
        for name in sys::list_xattrs(root).unwrap_or_default() {
            if is_ours(&name) {
                continue;
            }
            let n = name.to_bytes();
            let value = sys::get_xattr(root, &name).ok().flatten().map_or(0, |v| v.len());
            f.count += 1;
            f.bytes += n.len() + value;
            if f.first.len() < 3 {
                f.first.push(escape_bytes(n));
            }
        }
        f
    }

    /// Says how much of the root's attribute space they take and what to do, or nothing when
    /// there are none.
    pub fn describe(&self) -> Option<String> {
        (self.count > 0).then(|| {
            let more = if self.count > self.first.len() { ", ..." } else { "" };
            format!(
                "{} extended attribute(s) that volprep did not write hold {} bytes of names and values in the root's attribute space ({}{more}): remove those the app does not need (`setfattr -x NAME ROOT`) to give the marker room",
                self.count,
                self.bytes,
                self.first.join(", ")
            )
        })
    }
}

/// Whether an attribute name is volprep's: `user.volprep` (the marker) or `user.volprep.*` (its
/// checkpoints, special-bit records, and whatever else was written under that name).
pub fn is_ours(name: &CStr) -> bool {
    let (n, marker) = (name.to_bytes(), MARKER_XATTR.to_bytes());
    n == marker || n.strip_prefix(marker).is_some_and(|rest| rest.starts_with(b"."))
}

/// Of the attribute `names`, volprep's, in the order they are removed: the marker first (once it
/// is gone no run trusts what is left: a checkpoint or record without its marker resumes
/// nothing), then the others by name.
pub fn ours_in_clear_order(names: Vec<CString>) -> Vec<CString> {
    let mut ours: Vec<CString> = names.into_iter().filter(|n| is_ours(n)).collect();
    ours.sort_by(|a, b| (a.as_c_str() != MARKER_XATTR, a).cmp(&(b.as_c_str() != MARKER_XATTR, b)));
    ours.dedup();
    ours
}

/// volprep's attributes on the root, in the order [`remove_ours`] takes them
/// ([`ours_in_clear_order`]).
pub fn list_ours(root: BorrowedFd<'_>) -> Result<Vec<CString>, Errno> {
    sys::list_xattrs(root).map(ours_in_clear_order)
}

/// Removes one of volprep's attributes from the root (an absent one is no error); any other
/// name is refused (EINVAL) and left as it is.
pub fn remove_ours(root: BorrowedFd<'_>, name: &CStr) -> Result<(), Errno> {
    if !is_ours(name) {
        return Err(Errno::INVAL);
    }
    sys::remove_xattr(root, name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn volprep_attributes_are_the_marker_and_its_dotted_names_the_marker_first() {
        let c = |s: &str| CString::new(s).unwrap();
        for ours in ["user.volprep", "user.volprep.checkpoint", "user.volprep.pending.3", "user.volprep.x"] {
            assert!(is_ours(&c(ours)), "{ours}");
        }
        for other in ["user.volprepx", "user.volpre", "user.other", "security.selinux", "trusted.volprep"] {
            assert!(!is_ours(&c(other)), "{other}");
        }
        let names = ["user.a", "user.volprep.pending", "user.volprep.checkpoint.1", "user.volprep", "user.volprepx"];
        let order = ours_in_clear_order(names.iter().map(|n| c(n)).collect());
        let order: Vec<&str> = order.iter().map(|n| n.to_str().unwrap()).collect();
        assert_eq!(order, ["user.volprep", "user.volprep.checkpoint.1", "user.volprep.pending"]);
        assert_eq!(super::super::checkpoint_xattr(Some(2)).as_c_str().to_bytes(), b"user.volprep.checkpoint.2");
        assert!(is_ours(&super::super::checkpoint_xattr(Some(2))) && is_ours(&super::super::pending_xattr(None)));
    }

    #[test]
    fn foreign_attributes_are_named_with_their_bytes_and_what_to_do() {
        assert_eq!(Foreign::default().describe(), None);
        let f = Foreign { count: 172, bytes: 3784, first: vec!["user.a".into(), "user.b".into(), "user.c".into()] };
        let text = f.describe().unwrap();
        assert!(text.starts_with("172 extended attribute(s) that volprep did not write hold 3784 bytes"), "{text}");
        assert!(text.contains("(user.a, user.b, user.c, ...)") && text.contains("setfattr -x NAME ROOT"), "{text}");
        let one = Foreign { count: 1, bytes: 9, first: vec!["user.a".into()] };
        assert!(one.describe().unwrap().contains("(user.a)"));
    }
}
