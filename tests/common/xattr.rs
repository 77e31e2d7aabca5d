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
