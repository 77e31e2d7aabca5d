//! The kubelet's fsGroup pass, re-implemented syscall for syscall for the benchmark.
//!
//! Follows upstream Kubernetes `pkg/volume/volume_linux.go` in its current form (the
//! `VolumeOwnership.ChangePermissions` version, Kubernetes 1.31 and later; the per-path
//! syscalls are the same since `os.Lchown(path, -1, fsGroup)` replaced `os.Chown(path, uid,
//! fsGroup)`): `walkDeep` → `walk` → `readDirNames`, then `changeFilePermission` on each entry,
//! and `requiresPermissionChange` for the `OnRootMismatch` policy. Serial and path-based, as
//! upstream is, with the calls Go's `os` package makes on linux/amd64:
//!
//! - the root: `newfstatat(AT_FDCWD, root, AT_SYMLINK_NOFOLLOW)` (`os.Lstat`);
//! - a directory: `openat(AT_FDCWD, path, O_RDONLY|O_CLOEXEC)` (`os.Open`), `getdents64` with
//!   an 8 KiB buffer until it returns 0 (`Readdirnames(-1)`), `close`; names unsorted; then
//!   for each name `newfstatat(…, AT_SYMLINK_NOFOLLOW)` on the joined path and, at once,
//!   the walk of that child (depth first); the directory's own change comes after its children;
//! - every entry: `fchownat(AT_FDCWD, path, -1, gid, AT_SYMLINK_NOFOLLOW)` (`os.Lchown`, symlinks
//!   included); then, for everything but a symlink, `fchmodat(AT_FDCWD, path, mode | mask)`
//!   (`os.Chmod`, which follows symlinks, hence the skip), where `mode` is the permission and
//!   setuid/setgid/sticky bits read by the `lstat` *before* the chown (so a setuid bit the chown
//!   cleared is put back), and `mask` is `rwMask` 0660 plus, for a directory, setgid and
//!   `execMask` 0110. Unconditional: nothing is compared first.
//! - errors: a failed `lstat` or directory read stops the walk (the pass fails); a failed chown
//!   or chmod is only logged and the walk goes on.
//! - `OnRootMismatch`: `newfstatat(AT_FDCWD, root, 0)` (`os.Stat`, following a symlink); the full
//!   pass runs unless the root is a directory of group `gid` whose permissions include 0770 and
//!   setgid.
//!
//! Left out, as they touch no file: Go's failed `epoll_ctl` registration of each opened
//! directory, klog, and the progress-event timer. Runs in a child process (`__kubelet`), so its
//! rusage is its own.

use std::ffi::{CStr, CString};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// `rwMask`: group read/write.
const RW_MASK: u32 = 0o660;
/// `execMask`: search bits added to directories.
const EXEC_MASK: u32 = 0o110;
/// Go's `Readdirnames` buffer (`blockSize`).
const DIRENT_BUF: usize = 8192;

fn cpath(p: &Path) -> io::Result<CString> {
    CString::new(p.as_os_str().as_bytes()).map_err(|_| io::ErrorKind::InvalidInput.into())
}

fn with_path(e: io::Error, what: &str, p: &Path) -> io::Error {
    io::Error::new(e.kind(), format!("{what} {}: {e}", p.display()))
}

/// `fstatat(AT_FDCWD, p, flags)`: `os.Lstat` with `AT_SYMLINK_NOFOLLOW`, `os.Stat` with 0.
fn stat_at(p: &Path, flags: libc::c_int) -> io::Result<libc::stat> {
    let c = cpath(p)?;
    // SAFETY: stat is plain old data; `c` is a valid C string; the kernel fills `st`.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a valid C string and `st` a valid out-pointer.
    if unsafe { libc::fstatat(libc::AT_FDCWD, c.as_ptr(), &mut st, flags) } != 0 {
        return Err(with_path(io::Error::last_os_error(), "lstat", p));
    }
    Ok(st)
}

/// `readDirNames`: open, every name (unsorted, without `.` and `..`), close.
fn read_dir_names(dir: &Path) -> io::Result<Vec<Vec<u8>>> {
    let c = cpath(dir)?;
    // SAFETY: valid C string.
    let fd = unsafe { libc::openat(libc::AT_FDCWD, c.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(with_path(io::Error::last_os_error(), "open", dir));
    }
    let mut names = Vec::new();
    let mut buf = vec![0u8; DIRENT_BUF];
    let result = loop {
        // SAFETY: `fd` is open; `buf` is writable for its length.
        let n = unsafe { libc::syscall(libc::SYS_getdents64, fd, buf.as_mut_ptr(), buf.len()) };
        if n < 0 {
            break Err(with_path(io::Error::last_os_error(), "getdents64", dir));
        }
        if n == 0 {
            break Ok(());
        }
        let mut off = 0usize;
        while off < n as usize {
            // struct linux_dirent64 { u64 d_ino; i64 d_off; u16 d_reclen; u8 d_type; char d_name[]; }
            let reclen = u16::from_ne_bytes([buf[off + 16], buf[off + 17]]) as usize;
            let name = CStr::from_bytes_until_nul(&buf[off + 19..off + reclen]).expect("NUL-terminated d_name");
            let name = name.to_bytes();
            if name != b"." && name != b".." {
                names.push(name.to_vec());
            }
            off += reclen;
        }
    };
    // SAFETY: `fd` is ours and open.
    unsafe { libc::close(fd) };
    result.map(|()| names)
}

/// `changeFilePermission`: failures are logged, never returned (as upstream).
fn change(path: &Path, st: &libc::stat, gid: u32) {
    let Ok(c) = cpath(path) else { return };
    // SAFETY: valid C string; -1 keeps the owner.
    if unsafe { libc::fchownat(libc::AT_FDCWD, c.as_ptr(), u32::MAX, gid, libc::AT_SYMLINK_NOFOLLOW) } != 0 {
        eprintln!("Lchown failed: {}: {}", path.display(), io::Error::last_os_error());
    }
    let kind = st.st_mode & libc::S_IFMT;
    if kind == libc::S_IFLNK {
        return;
    }
    let mut mask = RW_MASK;
    if kind == libc::S_IFDIR {
        mask |= libc::S_ISGID | EXEC_MASK;
    }
    // SAFETY: valid C string. Follows symlinks, as Go's os.Chmod does (none reach here).
    if unsafe { libc::fchmodat(libc::AT_FDCWD, c.as_ptr(), (st.st_mode & 0o7777) | mask, 0) } != 0 {
        eprintln!("chmod failed: {}: {}", path.display(), io::Error::last_os_error());
    }
}

/// `walk`: depth first, each directory changed after its children; the first `lstat` or
/// directory-read error stops the walk.
fn walk(path: &mut PathBuf, st: &libc::stat, gid: u32, count: &mut u64) -> io::Result<()> {
    if st.st_mode & libc::S_IFMT == libc::S_IFDIR {
        for name in read_dir_names(path)? {
            path.push(std::ffi::OsStr::from_bytes(&name));
            let child = stat_at(path, libc::AT_SYMLINK_NOFOLLOW)?;
            walk(path, &child, gid, count)?;
            path.pop();
        }
    }
    *count += 1;
    change(path, st, gid);
    Ok(())
}

/// The kubelet's pass over `root` (`walkDeep`); returns the number of entries visited.
pub fn pass(root: &Path, gid: u32) -> io::Result<u64> {
    let st = stat_at(root, libc::AT_SYMLINK_NOFOLLOW)?;
    let mut count = 0;
    walk(&mut root.to_path_buf(), &st, gid, &mut count)?;
    Ok(count)
}

/// `requiresPermissionChange`: the OnRootMismatch policy looks at the root only.
pub fn requires_change(root: &Path, gid: u32) -> bool {
    let Ok(st) = stat_at(root, 0) else { return true };
    if st.st_gid != gid || st.st_mode & libc::S_IFMT != libc::S_IFDIR {
        return true;
    }
    let want = RW_MASK | EXEC_MASK;
    st.st_mode & want != want || st.st_mode & libc::S_ISGID == 0
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
    if requires_change(root, gid) {
        return main_kubelet(root, gid);
    }
    println!("{{\"entries\":0,\"skipped\":true}}");
    0
}
