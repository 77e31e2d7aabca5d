//! `snapshot(root)`: the metadata of every entry below a root, and `kubelet_reference`: a
//! serial model of the kubelet's fsGroup pass. Both walk dirfd-relative (no path is ever longer
//! than one name), never follow symlinks and stay on the root's device unless told otherwise.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::os::fd::{AsRawFd, RawFd};
use std::path::Path;

use super::fd;

/// File type of an entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    Dir,
    File,
    Symlink,
    Fifo,
    Socket,
    CharDev,
    BlockDev,
}

impl Kind {
    pub fn of(mode: u32) -> Kind {
        match mode & libc::S_IFMT {
            libc::S_IFDIR => Kind::Dir,
            libc::S_IFREG => Kind::File,
            libc::S_IFLNK => Kind::Symlink,
            libc::S_IFIFO => Kind::Fifo,
            libc::S_IFSOCK => Kind::Socket,
            libc::S_IFCHR => Kind::CharDev,
            libc::S_IFBLK => Kind::BlockDev,
            other => panic!("unknown file type {other:o}"),
        }
    }
}

/// One entry's metadata. `mode` holds the permission and special bits (07777), not the type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Meta {
    pub kind: Kind,
    pub uid: u32,
    pub gid: u32,
    pub mode: u32,
    pub ctime: (i64, i64),
    pub dev: u64,
    pub ino: u64,
}

impl Meta {
    pub fn from_stat(st: &libc::stat) -> Meta {
        Meta {
            kind: Kind::of(st.st_mode),
            uid: st.st_uid,
            gid: st.st_gid,
            mode: st.st_mode & 0o7777,
            ctime: (st.st_ctime, st.st_ctime_nsec),
            dev: st.st_dev,
            ino: st.st_ino,
        }
    }

    /// What the equivalence tests compare: (type, uid, gid, mode).
    pub fn attrs(&self) -> (Kind, u32, u32, Octal) {
        (self.kind, self.uid, self.gid, Octal(self.mode))
    }

    /// Attributes plus ctime: what "nothing changed" compares.
    pub fn attrs_ctime(&self) -> (Kind, u32, u32, Octal, (i64, i64)) {
        (self.kind, self.uid, self.gid, Octal(self.mode), self.ctime)
    }
}

/// A mode that prints in octal in failure messages.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Octal(pub u32);

impl std::fmt::Debug for Octal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "0o{:04o}", self.0)
    }
}

/// Relative path (root = `.`) to metadata, sorted.
pub type Snapshot = BTreeMap<Vec<u8>, Meta>;

/// What a walk does at a directory on another device (a nested mount).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mounts {
    /// Not entered (the mount point's own entry is still in a snapshot, but the reference
    /// leaves it unchanged).
    Skip,
    /// Entered like any directory.
    Enter,
    /// What a pass without `--cross-devices` covers: entries on the root's mount (by mount
    /// id), whatever their device (a btrfs subvolume, an overlayfs layer's file). A mount point
    /// (a nested filesystem, a bind mount of a directory or file) is left out, entry and all.
    Volume,
}

/// Key of the root in a snapshot.
pub const ROOT: &[u8] = b".";

pub fn join(parent: &[u8], name: &[u8]) -> Vec<u8> {
    if parent == ROOT {
        name.to_vec()
    } else {
        let mut p = Vec::with_capacity(parent.len() + 1 + name.len());
        p.extend_from_slice(parent);
        p.push(b'/');
        p.extend_from_slice(name);
        p
    }
}

/// Snapshot of `root`, not entering nested mounts.
pub fn snapshot(root: &Path) -> Snapshot {
    snapshot_with(root, Mounts::Skip)
}

pub fn snapshot_with(root: &Path, mounts: Mounts) -> Snapshot {
    let mut out = Snapshot::new();
    let root_st = walk("snapshot", root, mounts, |_, parent, name, st| {
        out.insert(join(parent, name), Meta::from_stat(st));
    });
    out.insert(ROOT.to_vec(), Meta::from_stat(&root_st));
    out
}

/// Calls `visit(dirfd, parent, name, stat)` for every entry below `root` (not the root itself,
/// whose stat it returns), a directory after its contents, where `dirfd` is the entry's
/// directory and `parent` its root-relative path (`ROOT` for the root). It never follows a
/// symlink; a directory on another device is entered with `Mounts::Enter` and `Mounts::Volume`,
/// which leaves out every entry on another mount, entry and all. Iterative and
/// through a `DirStack`: no recursion and a bounded number of open descriptors at any depth.
/// `what` names the caller in a failure.
pub fn walk(
    what: &str,
    root: &Path,
    mounts: Mounts,
    mut visit: impl FnMut(RawFd, &[u8], &[u8], &libc::stat),
) -> libc::stat {
    struct Frame {
        path: Vec<u8>,
        names: std::vec::IntoIter<Vec<u8>>,
        /// The subdirectory being walked, visited when it is done.
        entered: Option<(Vec<u8>, libc::stat)>,
    }
    let fail = |op: &str, path: &[u8], e: std::io::Error| -> ! { panic!("{what}: {op} {}: {e}", show(path)) };
    let mut dirs = fd::DirStack::open(root).unwrap_or_else(|e| panic!("{what}: open {}: {e}", root.display()));
    let dirfd = dirs.top().unwrap_or_else(|e| fail("open", ROOT, e));
    let root_st = fd::stat_at(dirfd, b"").unwrap_or_else(|e| fail("stat", ROOT, e));
    let root_mnt =
        if mounts == Mounts::Volume { fd::mnt_id_at(dirfd, b"").unwrap_or_else(|e| fail("statx", ROOT, e)) } else { 0 };
    let names = fd::read_names(dirfd).unwrap_or_else(|e| fail("readdir", ROOT, e));
    let mut frames = vec![Frame { path: ROOT.to_vec(), names: names.into_iter(), entered: None }];
    while let Some(frame) = frames.last_mut() {
        let dirfd = dirs.top().unwrap_or_else(|e| fail("re-open", &frame.path, e));
        if let Some((name, st)) = frame.entered.take() {
            visit(dirfd, &frame.path, &name, &st);
        }
        let Some(name) = frame.names.next() else {
            frames.pop();
            if !frames.is_empty() {
                dirs.pop();
            }
            continue;
        };
        let path = join(&frame.path, &name);
        if mounts == Mounts::Volume && fd::mnt_id_at(dirfd, &name).is_ok_and(|m| m != root_mnt) {
            continue;
        }
        let st = fd::stat_at(dirfd, &name).unwrap_or_else(|e| fail("stat", &path, e));
        let enter = Kind::of(st.st_mode) == Kind::Dir && (st.st_dev == root_st.st_dev || mounts != Mounts::Skip);
        if !enter {
            visit(dirfd, &frame.path, &name, &st);
            continue;
        }
        let sub = dirs.push(&name, fd::Missing::Fail).unwrap_or_else(|e| fail("open", &path, e));
        let names = fd::read_names(sub).unwrap_or_else(|e| fail("readdir", &path, e));
        frame.entered = Some((name, st));
        frames.push(Frame { path, names: names.into_iter(), entered: None });
    }
    root_st
}

/// Printable form of a relative path (non-UTF-8 bytes as `\xNN`, long paths shortened).
pub fn show(path: &[u8]) -> String {
    let s: String = path.escape_ascii().to_string();
    if s.len() > 160 { format!("{}...{} ({} bytes)", &s[..60], &s[s.len() - 60..], path.len()) } else { s }
}

/// Lists the differences between two snapshots under the projection `f`, at most 30 lines.
pub fn diff<T: PartialEq + std::fmt::Debug>(a: &Snapshot, b: &Snapshot, f: impl Fn(&Meta) -> T) -> Vec<String> {
    let mut out = Vec::new();
    for (k, ma) in a {
        match b.get(k) {
            None => out.push(format!("only left:  {} {:?}", show(k), f(ma))),
            Some(mb) if f(ma) != f(mb) => out.push(format!("differs:    {} {:?} != {:?}", show(k), f(ma), f(mb))),
            _ => {}
        }
    }
    for (k, mb) in b {
        if !a.contains_key(k) {
            out.push(format!("only right: {} {:?}", show(k), f(mb)));
        }
    }
    out
}

/// Panics with a readable diff unless `a` and `b` agree under the projection `f`.
#[track_caller]
pub fn assert_same<T: PartialEq + std::fmt::Debug>(a: &Snapshot, b: &Snapshot, f: impl Fn(&Meta) -> T, context: &str) {
    let d = diff(a, b, f);
    if !d.is_empty() {
        let mut msg = format!("{context}: {} of {}/{} entries differ (left vs right):\n", d.len(), a.len(), b.len());
        for line in d.iter().take(30) {
            let _ = writeln!(msg, "  {line}");
        }
        if d.len() > 30 {
            let _ = writeln!(msg, "  ... and {} more", d.len() - 30);
        }
        panic!("{msg}");
    }
}

/// The kubelet's target for one entry (volume_linux.go): group := gid, uid kept; non-symlinks
/// get `old | 0660` (`0440` read-only), directories also `| 0110 | S_ISGID`.
pub fn kubelet_target(m: &Meta, gid: u32, read_only: bool) -> (u32, u32, u32) {
    (m.uid, gid, kubelet_mode(m.kind, m.mode, read_only))
}

pub fn kubelet_mode(kind: Kind, old: u32, read_only: bool) -> u32 {
    let mut mask = if read_only { 0o440 } else { 0o660 };
    if kind == Kind::Dir {
        mask |= 0o110 | libc::S_ISGID;
    }
    if kind == Kind::Symlink { old } else { old | mask }
}

/// True if the kubelet formula would leave `m` as it is.
pub fn conforms(m: &Meta, gid: u32, read_only: bool) -> bool {
    kubelet_target(m, gid, read_only) == (m.uid, m.gid, m.mode)
}

/// The kubelet's pass, serially and unconditionally: post-order, `lchown(-1, gid)` on every
/// entry, then `chmod(old | mask)` on every non-symlink with the mode read before the chown
/// (the chown may clear setuid/setgid; the chmod puts them back). The root is an entry.
pub fn kubelet_reference(root: &Path, gid: u32, read_only: bool, mounts: Mounts) {
    let root_dev = dev_of(root);
    let st = walk("reference", root, mounts, |dirfd, parent, name, st| {
        let kind = Kind::of(st.st_mode);
        // A mount point is left as it is unless the walk enters it.
        if st.st_dev != root_dev && mounts == Mounts::Skip {
            return;
        }
        let old = st.st_mode & 0o7777;
        let path = || show(&join(parent, name));
        fd::lchown_at(dirfd, name, u32::MAX, gid).unwrap_or_else(|e| panic!("reference: lchown {}: {e}", path()));
        if kind != Kind::Symlink {
            fd::chmod_at(dirfd, name, kubelet_mode(kind, old, read_only))
                .unwrap_or_else(|e| panic!("reference: chmod {}: {e}", path()));
        }
    });
    let rootfd = fd::open_dir(root).unwrap_or_else(|e| panic!("reference: open {}: {e}", root.display()));
    fd::fchown(rootfd.as_raw_fd(), u32::MAX, gid).expect("reference: fchown root");
    fd::fchmod(rootfd.as_raw_fd(), kubelet_mode(Kind::Dir, st.st_mode & 0o7777, read_only))
        .expect("reference: fchmod root");
}

fn dev_of(root: &Path) -> u64 {
    let rootfd = fd::open_dir(root).unwrap_or_else(|e| panic!("open {}: {e}", root.display()));
    fd::stat_at(rootfd.as_raw_fd(), b"").expect("fstat root").st_dev
}

/// Sets every entry's group to `gid` (lchown, nested mounts untouched): gives the next pass work
/// to do. The kernel clears setuid/setgid of non-directories on chown; trees that care about
/// those bits should not use this.
pub fn chgrp_all(root: &Path, gid: u32) {
    let root_dev = dev_of(root);
    walk("chgrp_all", root, Mounts::Skip, |dirfd, parent, name, st| {
        if st.st_dev == root_dev {
            fd::lchown_at(dirfd, name, u32::MAX, gid)
                .unwrap_or_else(|e| panic!("chgrp_all: lchown {}: {e}", show(&join(parent, name))));
        }
    });
    let rootfd = fd::open_dir(root).expect("chgrp_all: open root");
    fd::fchown(rootfd.as_raw_fd(), u32::MAX, gid).expect("chgrp_all: fchown root");
}
