//! Reading and forging the marker xattrs on a volume root, as an app on that volume could.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use serde_json::Value;

/// The marker attribute.
pub const MARKER: &str = "user.volprep";
/// The resume checkpoint attribute.
pub const CHECKPOINT: &str = "user.volprep.checkpoint";

fn cpath(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).expect("no NUL in a test path")
}

/// `lgetxattr`: `None` when the attribute is absent.
pub fn get_xattr(path: &Path, name: &str) -> Option<Vec<u8>> {
    let (p, n) = (cpath(path), CString::new(name).unwrap());
    let mut buf = vec![0u8; 65536];
    // SAFETY: `p` and `n` are valid C strings; `buf` has room for `buf.len()` bytes.
    let len = unsafe { libc::lgetxattr(p.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if len < 0 {
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::ENODATA) {
            return None;
        }
        panic!("getxattr {name} on {}: {e}", path.display());
    }
    buf.truncate(len as usize);
    Some(buf)
}

/// `lsetxattr`, panicking on failure.
pub fn set_xattr(path: &Path, name: &str, value: &[u8]) {
    let (p, n) = (cpath(path), CString::new(name).unwrap());
    // SAFETY: `p` and `n` are valid C strings; `value` is readable for `value.len()` bytes.
    let ret = unsafe { libc::lsetxattr(p.as_ptr(), n.as_ptr(), value.as_ptr().cast(), value.len(), 0) };
    assert_eq!(ret, 0, "setxattr {name} on {}: {}", path.display(), std::io::Error::last_os_error());
}

/// The JSON held by xattr `name` on `path`, if any.
pub fn xattr_json(path: &Path, name: &str) -> Option<Value> {
    get_xattr(path, name).map(|b| {
        serde_json::from_slice(&b)
            .unwrap_or_else(|e| panic!("{name} is not JSON ({e}): {}", String::from_utf8_lossy(&b)))
    })
}

/// Writes `v` as JSON into xattr `name` on `path`.
pub fn set_json(path: &Path, name: &str, v: &Value) {
    set_xattr(path, name, v.to_string().as_bytes());
}

/// The checkpoint record (format 3) that says which subdirectories of the volume root `root`
/// are finished, as volprep writes it: the root's inode, its modification time (the root's
/// seal), link count, the entries covered (`covered`), its clock, and the ordinals, among the
/// root's directory entries in `getdents` order, of those `finished` picks, each range with the
/// inode of its first. What a forged or hand-made checkpoint looks like. The clock is the
/// filesystem's own, as volprep takes it: the change time a no-op `lchown` of the root gets a
/// tick after every change made so far, so before the start of the run that reads it (a clock
/// after that start holds for nothing).
pub fn dir_record(root: &Path, covered: u64, finished: impl Fn(&std::ffi::OsStr) -> bool) -> String {
    use std::os::unix::fs::{DirEntryExt, MetadataExt};
    let dir = root;
    let m = std::fs::symlink_metadata(dir).expect("stat dir");
    let (sec, nsec) = (m.mtime(), m.mtime_nsec());
    let mut spans: Vec<(u64, u64, u64)> = Vec::new();
    let subdirs = std::fs::read_dir(dir).expect("read dir").map(|e| e.expect("entry")).filter(|e| {
        // d_type as getdents gave it (volprep numbers only these).
        e.file_type().expect("d_type").is_dir()
    });
    for (ord, e) in subdirs.enumerate() {
        let ord = ord as u64;
        if !finished(&e.file_name()) {
            continue;
        }
        match spans.last_mut() {
            Some(s) if s.1 + 1 == ord => s.1 = ord,
            _ => spans.push((ord, ord, e.ino())),
        }
    }
    let spans: Vec<String> =
        spans.iter().map(|(a, b, ino)| if a == b { format!("{a}@{ino}") } else { format!("{a}-{b}@{ino}") }).collect();
    super::tick();
    let c = CString::new(dir.as_os_str().as_bytes()).unwrap();
    // SAFETY: `c` is a valid C string alive across the call.
    assert_eq!(unsafe { libc::lchown(c.as_ptr(), u32::MAX, u32::MAX) }, 0, "no-op lchown of {}", dir.display());
    let t = std::fs::symlink_metadata(dir).expect("stat dir");
    let clock = format!("{}.{:09}", t.ctime(), t.ctime_nsec());
    format!("{}:{sec}.{nsec:09}:{}:{covered}:{clock}:{}", m.ino(), m.nlink(), spans.join(","))
}
