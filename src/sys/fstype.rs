//! Filesystem types by `statfs` magic number: one table of names and of which are network or FUSE filesystems.

use std::os::fd::BorrowedFd;
use std::path::Path;

use rustix::fs::AtFlags;

use crate::throttle::Storage;

/// The filesystem's name, from `fstatfs`'s magic number ("0x..." when unknown).
pub fn fs_type(fd: BorrowedFd<'_>) -> String {
    match rustix::fs::fstatfs(fd) {
        Ok(st) => fs_name(st.f_type),
        Err(_) => "unknown".to_string(),
    }
}

/// What a volume's filesystem tells before a walk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FsInfo {
    /// Its name, from `fstatfs`'s magic number ("0x..." when unknown).
    pub name: String,
    /// The inodes in use (`fstatvfs`) when the volume is a whole filesystem (`fd` is the root of
    /// a mount of the filesystem's own root): an estimate of the entries a walk will meet. None
    /// for a directory of a larger filesystem (a bind mount, a subPath, a subvolume), whose
    /// count would be the whole filesystem's, not the volume's.
    pub estimate: Option<u64>,
}

/// The name of the filesystem of `fd` and, when `fd` is a whole filesystem, its inodes in use.
pub fn fs_info(fd: BorrowedFd<'_>) -> FsInfo {
    let name = fs_type(fd);
    let mask = rustix::fs::StatxFlags::MNT_ID;
    let whole_fs = rustix::fs::statx(fd, c"", AtFlags::EMPTY_PATH, mask).ok().is_some_and(|x| {
        let mount_root = x.stx_attributes_mask.contains(rustix::fs::StatxAttributes::MOUNT_ROOT)
            && x.stx_attributes.contains(rustix::fs::StatxAttributes::MOUNT_ROOT);
        mount_root && super::proc::mounts_whole_fs(x.stx_mnt_id) == Some(true)
    });
    let estimate = whole_fs
        .then(|| rustix::fs::fstatvfs(fd).ok())
        .flatten()
        .map(|v| v.f_files.saturating_sub(v.f_ffree))
        .filter(|&n| n > 0);
    FsInfo { name, estimate }
}

/// The [`Storage`] of the filesystem at `path` (`statfs`, which follows a symlink: only a hint;
/// see `options::resolve_threads`).
pub fn storage(path: &Path) -> Storage {
    rustix::fs::statfs(path).ok().and_then(|st| lookup(st.f_type)).map_or(Storage::Local, |fs| fs.storage)
}

/// The filesystem's name for a magic number ("0x..." when unknown).
fn fs_name(magic: i64) -> String {
    lookup(magic).map_or_else(|| format!("0x{magic:x}"), |fs| fs.name.to_string())
}

fn lookup(magic: i64) -> Option<&'static Fs> {
    FILESYSTEMS.iter().find(|fs| fs.magic == magic)
}

/// A filesystem type as `statfs` tells it.
struct Fs {
    magic: i64,
    name: &'static str,
    /// A network or FUSE filesystem: each metadata request is a round trip.
    storage: Storage,
}

const fn local(magic: i64, name: &'static str) -> Fs {
    Fs { magic, name, storage: Storage::Local }
}

const fn remote(magic: i64, name: &'static str) -> Fs {
    Fs { magic, name, storage: Storage::Remote }
}

/// The filesystems volprep names (`f_type` values from `linux/magic.h` and the filesystems' own headers).
const FILESYSTEMS: &[Fs] = &[
    local(0xEF53, "ext4"),
    local(0x5846_5342, "xfs"),
    local(0x9123_683E, "btrfs"),
    local(0x0102_1994, "tmpfs"),
    local(0x8584_58f6, "ramfs"),
    remote(0x6969, "nfs"),
    remote(0x00C3_6400, "ceph"),
    local(0x794C_7630, "overlay"),
    // ceph-fuse, s3fs, gcsfuse, glusterfs, …
    remote(0x6573_5546, "fuse"),
    local(0x2FC1_2FC1, "zfs"),
    remote(0xFF53_4D42, "cifs"),
    remote(0xFE53_4D42, "smb2"),
    remote(0x0102_1997, "v9fs"),
    remote(0x6B41_4653, "afs"),
    remote(0x0BD0_0BD0, "lustre"),
    remote(0x4750_4653, "gpfs"),
    remote(0x0116_1970, "gfs2"),
    remote(0x7461_636F, "ocfs2"),
    local(0x7366_7173, "squashfs"),
    local(0x4244, "hfs"),
    local(0x9FA0, "proc"),
    local(0x6265_6572, "sysfs"),
    local(0x0027_E0EB, "cgroup"),
    local(0x6367_7270, "cgroup2"),
    local(0x1CD1, "devpts"),
    local(0x6462_6720, "debugfs"),
    local(0x7472_6163, "tracefs"),
    local(0x7363_6673, "securityfs"),
    local(0xCAFE_4A11, "bpf"),
    local(0x6165_676C, "pstore"),
    local(0xDE5E_81E4, "efivarfs"),
    local(0x6265_6570, "configfs"),
    local(0x4249_4E4D, "binfmt_misc"),
    local(0x6573_5543, "fusectl"),
    local(0x1980_0202, "mqueue"),
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_magic_number_has_one_name_and_the_remote_ones_are_flagged() {
        let mut magics: Vec<i64> = FILESYSTEMS.iter().map(|fs| fs.magic).collect();
        magics.sort_unstable();
        magics.dedup();
        assert_eq!(magics.len(), FILESYSTEMS.len(), "a magic number listed twice");
        assert_eq!(fs_name(0xEF53), "ext4");
        assert_eq!(fs_name(0x1234), "0x1234");
        let remote: Vec<&str> =
            FILESYSTEMS.iter().filter(|fs| fs.storage == Storage::Remote).map(|fs| fs.name).collect();
        assert_eq!(remote, ["nfs", "ceph", "fuse", "cifs", "smb2", "v9fs", "afs", "lustre", "gpfs", "gfs2", "ocfs2"]);
    }
}
