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
    let rootfd = fd::open_dir(root).unwrap_or_else(|e| panic!("snapshot: open {}: {e}", root.display()));
    let st = fd::stat_at(rootfd.as_raw_fd(), b"").expect("fstat root");
    let mut out = Snapshot::new();
    out.insert(ROOT.to_vec(), Meta::from_stat(&st));
    let root_mnt =
        if mounts == Mounts::Volume { fd::mnt_id_at(rootfd.as_raw_fd(), b"").expect("statx root") } else { 0 };
    snap_dir(rootfd.as_raw_fd(), ROOT, (st.st_dev, root_mnt), mounts, &mut out);
    out
}

fn snap_dir(dirfd: RawFd, rel: &[u8], (root_dev, root_mnt): (u64, u64), mounts: Mounts, out: &mut Snapshot) {
    let names = fd::read_names(dirfd).unwrap_or_else(|e| panic!("snapshot: readdir {}: {e}", show(rel)));
    for name in names {
        let path = join(rel, &name);
        if mounts == Mounts::Volume && fd::mnt_id_at(dirfd, &name).is_ok_and(|m| m != root_mnt) {
            continue;
        }
        let st = fd::stat_at(dirfd, &name).unwrap_or_else(|e| panic!("snapshot: stat {}: {e}", show(&path)));
        let meta = Meta::from_stat(&st);
        out.insert(path.clone(), meta);
        if meta.kind == Kind::Dir && (meta.dev == root_dev || mounts != Mounts::Skip) {
            let sub = fd::open_dir_at(dirfd, &name).unwrap_or_else(|e| panic!("snapshot: open {}: {e}", show(&path)));
            snap_dir(sub.as_raw_fd(), &path, (root_dev, root_mnt), mounts, out);
        }
    }
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
    let rootfd = fd::open_dir(root).unwrap_or_else(|e| panic!("reference: open {}: {e}", root.display()));
    let st = fd::stat_at(rootfd.as_raw_fd(), b"").expect("fstat root");
    ref_dir(rootfd.as_raw_fd(), ROOT, st.st_dev, gid, read_only, mounts);
    let old = st.st_mode & 0o7777;
    fd::fchown(rootfd.as_raw_fd(), u32::MAX, gid).expect("reference: fchown root");
    fd::fchmod(rootfd.as_raw_fd(), kubelet_mode(Kind::Dir, old, read_only)).expect("reference: fchmod root");
}

fn ref_dir(dirfd: RawFd, rel: &[u8], root_dev: u64, gid: u32, read_only: bool, mounts: Mounts) {
    let names = fd::read_names(dirfd).unwrap_or_else(|e| panic!("reference: readdir {}: {e}", show(rel)));
    for name in names {
        let path = join(rel, &name);
        let st = fd::stat_at(dirfd, &name).unwrap_or_else(|e| panic!("reference: stat {}: {e}", show(&path)));
        let kind = Kind::of(st.st_mode);
        if kind == Kind::Dir {
            if st.st_dev != root_dev && mounts == Mounts::Skip {
                continue;
            }
            let sub = fd::open_dir_at(dirfd, &name).unwrap_or_else(|e| panic!("reference: open {}: {e}", show(&path)));
            ref_dir(sub.as_raw_fd(), &path, root_dev, gid, read_only, mounts);
        }
        let old = st.st_mode & 0o7777;
        fd::lchown_at(dirfd, &name, u32::MAX, gid).unwrap_or_else(|e| panic!("reference: lchown {}: {e}", show(&path)));
        if kind != Kind::Symlink {
            fd::chmod_at(dirfd, &name, kubelet_mode(kind, old, read_only))
                .unwrap_or_else(|e| panic!("reference: chmod {}: {e}", show(&path)));
        }
    }
}

/// Sets every entry's group to `gid` (lchown, nested mounts untouched): gives the next pass work
/// to do. The kernel clears setuid/setgid of non-directories on chown; trees that care about
/// those bits should not use this.
pub fn chgrp_all(root: &Path, gid: u32) {
    fn walk(dirfd: RawFd, gid: u32, root_dev: u64) {
        for name in fd::read_names(dirfd).expect("chgrp_all: readdir") {
            let st = fd::stat_at(dirfd, &name).expect("chgrp_all: stat");
            if st.st_dev != root_dev {
                continue;
            }
            fd::lchown_at(dirfd, &name, u32::MAX, gid).expect("chgrp_all: lchown");
            if Kind::of(st.st_mode) == Kind::Dir {
                let sub = fd::open_dir_at(dirfd, &name).expect("chgrp_all: open");
                walk(sub.as_raw_fd(), gid, root_dev);
            }
        }
    }
    let rootfd = fd::open_dir(root).expect("chgrp_all: open root");
    let st = fd::stat_at(rootfd.as_raw_fd(), b"").expect("fstat root");
    walk(rootfd.as_raw_fd(), gid, st.st_dev);
    fd::fchown(rootfd.as_raw_fd(), u32::MAX, gid).expect("chgrp_all: fchown root");
}
