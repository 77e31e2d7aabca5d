//! Refusals made before anything changes: a system directory as a volume (unless forced), and a
//! report or termination message file at a symlink, at a FIFO, socket or device, or inside a
//! volume being prepared.

use std::path::{Component, Path, PathBuf};

use crate::error::Error;
use crate::escape::Escaped;
use crate::{options, sys};

/// Directories of the host or image that are never a volume. Compared by inode, so an alias (a
/// symlink, a bind mount, `/bin` on a merged-/usr system) is caught too.
pub const SYSTEM_DIRS: &[&str] = &[
    "/",
    "/bin",
    "/boot",
    "/dev",
    "/etc",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/proc",
    "/root",
    "/run",
    "/sbin",
    "/sys",
    "/usr",
    "/usr/bin",
    "/usr/lib",
    "/usr/lib64",
    "/usr/libexec",
    "/usr/local",
    "/usr/sbin",
    "/usr/share",
    "/var",
    "/var/lib",
];

/// Trees of kernel and device files: nothing below them is a volume.
const PSEUDO_TREES: &[&str] = &["/proc", "/sys", "/dev"];

/// Filesystems of kernel state (by `statfs` type), never a volume wherever mounted.
const PSEUDO_FS: &[&str] = &[
    "proc",
    "sysfs",
    "cgroup",
    "cgroup2",
    "devpts",
    "debugfs",
    "tracefs",
    "securityfs",
    "bpf",
    "pstore",
    "efivarfs",
    "configfs",
    "binfmt_misc",
    "fusectl",
    "mqueue",
];

/// Why `path` is a system directory ("is /etc", "is below /proc", "is on a sysfs filesystem"),
/// or `None`. A path that can't be opened is not judged here (the pass reports it).
pub fn system_dir(path: &Path) -> Option<String> {
    let fd = sys::open_root(path).ok()?;
    let fs = sys::fs_type(sys::fd(&fd));
    if PSEUDO_FS.contains(&fs.as_str()) {
        return Some(format!("is on a {fs} filesystem"));
    }
    let me = sys::stat_fd(sys::fd(&fd)).ok()?;
    if let Some(d) = SYSTEM_DIRS.iter().find(|d| sys::stat_path(Path::new(d)).is_ok_and(|m| same(&m, &me))) {
        return Some(format!("is {d}"));
    }
    let real = std::fs::canonicalize(path).ok()?;
    PSEUDO_TREES.iter().find(|t| real.starts_with(t)).map(|t| format!("is below {t}"))
}

/// Refuses system directories among `paths` (volume roots and temp dirs): a usage error naming
/// the path, what it is, and the flag that forces it.
pub fn no_system_dirs<'a>(paths: impl IntoIterator<Item = &'a Path>) -> Result<(), Error> {
    for p in paths {
        if let Some(what) = system_dir(p) {
            return Err(Error::Usage(format!(
                "{}: {what}, a system directory, not a volume: refusing to prepare it (--allow-system-path forces it)",
                Escaped(p.as_os_str())
            )));
        }
    }
    Ok(())
}

/// Refuses an output file (`flag` names it: `--report`, `--termination-log`) that is a symlink
/// or an existing file that is not a regular one (a FIFO would block the open, a device or
/// socket is no place for a report), or that lies inside one of `areas` (volumes and temp dirs
/// being prepared: their app may have planted anything there), by its path or, through any
/// alias, by its directory's inode. `-` and `/dev/stdout` are stdout.
pub fn output_file(flag: &str, dest: &Path, areas: &[&Path]) -> Result<(), Error> {
    if options::is_stdout(dest) {
        return Ok(());
    }
    let shown = Escaped(dest.as_os_str());
    if let Some(what) = std::fs::symlink_metadata(dest).ok().and_then(|m| not_regular(m.file_type())) {
        let verb = if what == "a symlink" { "follow" } else { "open" };
        return Err(Error::Usage(format!(
            "{shown}: {flag} is {what}, not a regular file: refusing to {verb} it (name a regular file, or '-' for stdout)"
        )));
    }
    let inside = |area: &Path| {
        Error::Usage(format!(
            "{shown}: {flag} is inside {}, which is being prepared (its app may control it): write it elsewhere",
            Escaped(area.as_os_str())
        ))
    };
    let lexical = normalize(dest);
    if let Some(area) = areas.iter().find(|a| lexical.starts_with(normalize(a))) {
        return Err(inside(area));
    }
    let roots: Vec<(&Path, sys::Meta)> = areas.iter().filter_map(|a| sys::stat_path(a).ok().map(|m| (*a, m))).collect();
    let parent = match dest.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    // From the directory the file would be made in, up to `/`, by `..`: any alias ends up here.
    let Ok(mut dir) = sys::open_root(parent) else { return Ok(()) };
    for _ in 0..4096 {
        let Ok(here) = sys::stat_fd(sys::fd(&dir)) else { break };
        if let Some((area, _)) = roots.iter().find(|(_, m)| same(m, &here)) {
            return Err(inside(area));
        }
        let Ok(up) = sys::open_parent(sys::fd(&dir)) else { break };
        if sys::stat_fd(sys::fd(&up)).is_ok_and(|m| same(&m, &here)) {
            break;
        }
        dir = up;
    }
    Ok(())
}

/// What an existing output file is when it is not a regular file ("a FIFO"), or `None`.
fn not_regular(t: std::fs::FileType) -> Option<&'static str> {
    use std::os::unix::fs::FileTypeExt;
    let what = [
        (t.is_symlink(), "a symlink"),
        (t.is_fifo(), "a FIFO"),
        (t.is_socket(), "a socket"),
        (t.is_char_device(), "a character device"),
        (t.is_block_device(), "a block device"),
        (t.is_dir(), "a directory"),
    ];
    what.iter().find(|(is, _)| *is).map(|(_, w)| *w)
}

fn same(a: &sys::Meta, b: &sys::Meta) -> bool {
    (a.dev, a.ino) == (b.dev, b.ino)
}

/// `path` made absolute (from the working directory) with `.` and `..` resolved lexically.
fn normalize(path: &Path) -> PathBuf {
    let abs = if path.is_absolute() {
        path.to_path_buf()
    } else {
        std::env::current_dir().unwrap_or_else(|_| PathBuf::from("/")).join(path)
    };
    let mut out = PathBuf::from("/");
    for c in abs.components() {
        match c {
            Component::Normal(n) => out.push(n),
            Component::ParentDir => {
                out.pop();
            }
            _ => {}
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalize_is_lexical() {
        assert_eq!(normalize(Path::new("/a/./b/../c/")), Path::new("/a/c"));
        assert_eq!(normalize(Path::new("/../..")), Path::new("/"));
        assert!(normalize(Path::new("x")).is_absolute());
    }

    #[test]
    fn system_dirs_are_known_and_a_temp_dir_is_not() {
        assert_eq!(system_dir(Path::new("/")).as_deref(), Some("is /"));
        assert_eq!(system_dir(Path::new("/etc/")).as_deref(), Some("is /etc"));
        assert!(system_dir(Path::new("/proc/self")).is_some());
        let t = tempfile_dir();
        assert_eq!(system_dir(&t), None);
        let _ = std::fs::remove_dir(&t);
    }

    fn tempfile_dir() -> PathBuf {
        let p = std::env::temp_dir().join(format!("volprep-guard-{}", std::process::id()));
        std::fs::create_dir_all(&p).unwrap();
        p
    }
}
