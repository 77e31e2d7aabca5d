//! The kubelet's fsGroup pass, re-implemented for the benchmark as faithfully as Rust allows
//! (`pkg/volume/volume_linux.go`: `walkDeep`, `readDirNames`, `changeFilePermission`,
//! `requiresPermissionChange`). Serial and path-based, as the kubelet is: each directory is
//! opened, all its names read unsorted, and closed; each child is `lstat`ed by its full path and
//! recursed into; then, after its children (post-order), every entry gets
//! `lchown(path, -1, gid)` and every non-symlink `chmod(path, mode | mask)`, unconditionally,
//! with the mode read before the chown (so a setuid bit the chown cleared is put back).
//! Runs in a child process (`__kubelet`), so its rusage is its own.

use std::ffi::{CString, OsString};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// `rwMask`: group read/write.
const RW_MASK: u32 = 0o660;
/// `execMask`: search bits added to directories.
const EXEC_MASK: u32 = 0o110;

fn cpath(p: &Path) -> io::Result<CString> {
    CString::new(p.as_os_str().as_bytes()).map_err(|_| io::ErrorKind::InvalidInput.into())
}

fn lstat(p: &Path) -> io::Result<libc::stat> {
    let c = cpath(p)?;
    // SAFETY: stat is plain old data; `c` is a valid C string; the kernel fills `st`.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    if unsafe { libc::lstat(c.as_ptr(), &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(st)
}

/// `readDirNames`: open, read every name (unsorted), close.
fn read_dir_names(dir: &Path) -> io::Result<Vec<OsString>> {
    std::fs::read_dir(dir)?.map(|e| e.map(|e| e.file_name())).collect()
}

/// `changeFilePermission`.
fn change(path: &Path, st: &libc::stat, gid: u32) -> io::Result<()> {
    let c = cpath(path)?;
    // SAFETY: valid C string; -1 keeps the owner.
    if unsafe { libc::lchown(c.as_ptr(), u32::MAX, gid) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let kind = st.st_mode & libc::S_IFMT;
    if kind == libc::S_IFLNK {
        return Ok(());
    }
    let mut mask = RW_MASK;
    if kind == libc::S_IFDIR {
        mask |= libc::S_ISGID | EXEC_MASK;
    }
    // SAFETY: valid C string. Follows symlinks, as Go's os.Chmod does (none reach here).
    if unsafe { libc::chmod(c.as_ptr(), (st.st_mode & 0o7777) | mask) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `walk`: post-order; the first error stops the walk, as in the kubelet.
fn walk(path: &mut PathBuf, st: &libc::stat, gid: u32, count: &mut u64) -> io::Result<()> {
    if st.st_mode & libc::S_IFMT == libc::S_IFDIR {
        for name in read_dir_names(path)? {
            path.push(&name);
            let child = lstat(path)?;
            walk(path, &child, gid, count)?;
            path.pop();
        }
    }
    *count += 1;
    change(path, st, gid)
}

/// The kubelet's pass over `root`; returns the number of entries changed.
pub fn pass(root: &Path, gid: u32) -> io::Result<u64> {
    let st = lstat(root)?;
    let mut count = 0;
    walk(&mut root.to_path_buf(), &st, gid, &mut count)?;
    Ok(count)
}

/// `requiresPermissionChange`: the OnRootMismatch policy looks at the root only.
pub fn requires_change(root: &Path, gid: u32) -> io::Result<bool> {
    let st = std::fs::metadata(root)?;
    use std::os::unix::fs::MetadataExt;
    if st.gid() != gid || !st.is_dir() {
        return Ok(true);
    }
    let want = RW_MASK | EXEC_MASK;
    Ok(st.mode() & want != want || st.mode() & libc::S_ISGID == 0)
}

/// `__kubelet`: prints `{"entries":N}` on stdout.
pub fn main_kubelet(root: &Path, gid: u32) -> i32 {
    match pass(root, gid) {
        Ok(n) => {
            println!("{{\"entries\":{n}}}");
            0
        }
        Err(e) => {
            eprintln!("kubelet pass: {e}");
            1
        }
    }
}

/// `__onrootmismatch`: a stat of the root, and the full pass only when the root is not right.
pub fn main_onrootmismatch(root: &Path, gid: u32) -> i32 {
    match requires_change(root, gid) {
        Ok(false) => {
            println!("{{\"entries\":0,\"skipped\":true}}");
            0
        }
        Ok(true) => main_kubelet(root, gid),
        Err(e) => {
            eprintln!("onrootmismatch: {e}");
            1
        }
    }
}
