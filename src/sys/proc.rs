//! What the kernel says about this process: mounts, lock holders, credentials, open-file limits, random bits.

use std::os::fd::BorrowedFd;

use rustix::io::Errno;

use super::retry;

/// The filesystem type of the mount with id `mnt_id` (`statx` `STATX_MNT_ID`) as
/// `/proc/self/mountinfo` names it (`ext4`, `fuse.ceph-fuse`, …); `None` when not listed.
pub fn mount_fs_type(mnt_id: u64) -> Option<String> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    mountinfo_fs_type(&text, mnt_id)
}

/// Whether the mount with id `mnt_id` mounts its filesystem's root (mountinfo's ROOT is `/`),
/// not one of its directories (a bind mount, a subPath, a subvolume); `None` when not listed.
pub fn mounts_whole_fs(mnt_id: u64) -> Option<bool> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    Some(mountinfo_line(&text, mnt_id)?.split(' ').nth(3)? == "/")
}

/// The filesystem type of mount `mnt_id` in the text of a mountinfo file.
fn mountinfo_fs_type(text: &str, mnt_id: u64) -> Option<String> {
    mountinfo_line(text, mnt_id)?.split_once(" - ")?.1.split(' ').next().map(str::to_string)
}

/// The line of mount `mnt_id` in the text of a mountinfo file ("ID PARENT MAJ:MIN ROOT POINT
/// OPTIONS [TAGS…] - TYPE SOURCE SUPER-OPTIONS").
fn mountinfo_line(text: &str, mnt_id: u64) -> Option<&str> {
    text.lines().find(|line| line.split(' ').next().and_then(|id| id.parse::<u64>().ok()) == Some(mnt_id))
}

/// The mount points strictly below the directory `root` (relative to it, sorted), as this
/// process's `/proc/self/mountinfo` lists them; `None` when that (or the root's own path, read
/// through `/proc/self/fd`) cannot be read. Mounts hidden under others are listed too.
pub fn mounts_below(root: BorrowedFd<'_>) -> Option<Vec<Vec<u8>>> {
    use std::os::unix::ffi::OsStrExt;
    let link = std::fs::read_link(format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&root))).ok()?;
    let text = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    Some(mountinfo_points_below(&text, link.as_os_str().as_bytes()))
}

/// The mount points of a mountinfo text strictly below the absolute path `root`, relative to
/// it, sorted and without duplicates (a path mounted over twice is one mount point).
fn mountinfo_points_below(text: &str, root: &[u8]) -> Vec<Vec<u8>> {
    let root = root.strip_suffix(b"/").unwrap_or(root);
    let mut out: Vec<Vec<u8>> = text
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .map(unescape_octal)
        .filter_map(|point| Some(point.strip_prefix(root)?.strip_prefix(b"/")?.to_vec()))
        .filter(|rel| !rel.is_empty())
        .collect();
    out.sort_unstable();
    out.dedup();
    out
}

/// A mountinfo field with its `\NNN` octal escapes (space, tab, newline, backslash) undone.
fn unescape_octal(field: &str) -> Vec<u8> {
    let b = field.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let oct = b.get(i + 1..i + 4).filter(|d| b[i] == b'\\' && d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match oct {
            Some(d) => {
                out.push(d.iter().fold(0u8, |v, c| v.wrapping_mul(8).wrapping_add(c - b'0')));
                i += 4;
            }
            None => {
                out.push(b[i]);
                i += 1;
            }
        }
    }
    out
}

/// The mount with id `mnt_id` as a person would name it: its type as mountinfo says it, and
/// where it is mounted from (`nfs from fileserver:/exports/data`, `fuse.ceph-fuse from
/// ceph-fuse`); `None` when not listed.
pub fn mount_name(mnt_id: u64) -> Option<String> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    mountinfo_name(&text, mnt_id)
}

fn mountinfo_name(text: &str, mnt_id: u64) -> Option<String> {
    let mut rest = mountinfo_line(text, mnt_id)?.split_once(" - ")?.1.split(' ');
    let (fs, source) = (rest.next()?, rest.next().unwrap_or(""));
    Some(match source {
        "" | "none" => fs.to_string(),
        s => format!("{fs} from {}", crate::escape::escape_bytes(s.as_bytes())),
    })
}

/// Raises the soft open-file limit to the hard limit: a deep tree keeps one fd per directory
/// on the path being walked.
pub fn raise_fd_limit() {
    let lim = rustix::process::getrlimit(rustix::process::Resource::Nofile);
    if let Some(max) = lim.maximum {
        let _ = rustix::process::setrlimit(
            rustix::process::Resource::Nofile,
            rustix::process::Rlimit { current: Some(max), maximum: Some(max) },
        );
    }
}

/// `kill(pid, 0)`: whether process `pid` exists in this pid namespace (one of another user
/// answers EPERM: it exists).
pub fn process_alive(pid: u32) -> bool {
    let Some(pid) = i32::try_from(pid).ok().and_then(rustix::process::Pid::from_raw) else { return false };
    rustix::process::test_kill_process(pid) != Err(Errno::SRCH)
}

/// `geteuid()`: the user whose entries an unprivileged pass may change.
pub fn euid() -> u32 {
    rustix::process::geteuid().as_raw()
}

/// `getegid()` and `getgroups()`: the groups this process may give its own entries, sorted.
pub fn groups() -> Vec<u32> {
    let mut out: Vec<u32> = rustix::process::getgroups().unwrap_or_default().iter().map(|g| g.as_raw()).collect();
    out.push(rustix::process::getegid().as_raw());
    out.sort_unstable();
    out.dedup();
    out
}

/// The uid an owner that is not mapped in this user namespace reads as
/// (`/proc/sys/kernel/overflowuid`; 65534, the kernel's default, when that is unreadable).
fn overflow_uid() -> u32 {
    std::fs::read_to_string("/proc/sys/kernel/overflowuid").ok().and_then(|s| s.trim().parse().ok()).unwrap_or(65534)
}

/// The gid a group that is not mapped in this user namespace reads as
/// (`/proc/sys/kernel/overflowgid`; 65534 when unreadable).
fn overflow_gid() -> u32 {
    std::fs::read_to_string("/proc/sys/kernel/overflowgid").ok().and_then(|s| s.trim().parse().ok()).unwrap_or(65534)
}

/// The soft open-file limit (`u64::MAX` when unlimited).
pub fn fd_limit() -> u64 {
    rustix::process::getrlimit(rustix::process::Resource::Nofile).current.unwrap_or(u64::MAX)
}

/// `getrandom(buf, 8, 0)`: 64 unpredictable bits from the kernel.
pub fn random_u64() -> Result<u64, Errno> {
    let mut buf = [0u8; 8];
    let mut got = 0;
    while got < buf.len() {
        got += retry(|| rustix::rand::getrandom(&mut buf[got..], rustix::rand::GetRandomFlags::empty()))?;
    }
    Ok(u64::from_ne_bytes(buf))
}

/// Processes holding a lock on the inode `fd` refers to, from `/proc/locks`: their pid (0 when
/// the holder is not visible from this pid namespace) and command name, when known. Empty when
/// no holder is listed (on a network filesystem, a holder on another node never is).
pub fn lock_holders(fd: BorrowedFd<'_>) -> Vec<LockHolder> {
    let Ok(st) = rustix::fs::fstat(fd) else { return Vec::new() };
    let Ok(locks) = std::fs::read_to_string("/proc/locks") else { return Vec::new() };
    let (major, minor) = (rustix::fs::major(st.st_dev), rustix::fs::minor(st.st_dev));
    let mut out: Vec<LockHolder> = Vec::new();
    for pid in locks.lines().filter_map(|l| lock_line_holder(l, major, minor, st.st_ino)) {
        if !out.iter().any(|h| h.pid == pid) {
            let command = (pid != 0)
                .then(|| std::fs::read_to_string(format!("/proc/{pid}/comm")).ok())
                .flatten()
                .map(|c| c.trim().to_string());
            out.push(LockHolder { pid, command });
        }
    }
    out
}

/// A process holding a lock, as `/proc/locks` and `/proc/PID/comm` tell it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockHolder {
    /// 0 when the holder is not visible from this pid namespace.
    pub pid: u32,
    /// Its command name, when known.
    pub command: Option<String>,
}

/// The pid of a `/proc/locks` line (`1: FLOCK  ADVISORY  WRITE 4242 08:01:1234 0 EOF`) when it
/// holds (not waits for: `->`) a lock on inode `ino` of device `major:minor` (hex in the file).
fn lock_line_holder(line: &str, major: u32, minor: u32, ino: u64) -> Option<u32> {
    let fields: Vec<&str> = line.split_whitespace().collect();
    if fields.get(1) == Some(&"->") || fields.len() < 6 {
        return None;
    }
    let mut id = fields[5].split(':');
    let (ma, mi, i) = (id.next()?, id.next()?, id.next()?);
    let same = u32::from_str_radix(ma, 16).ok()? == major
        && u32::from_str_radix(mi, 16).ok()? == minor
        && i.parse::<u64>().ok()? == ino;
    same.then(|| fields[4].parse().ok()).flatten()
}

/// The ids mapped into this process's user namespace (`/proc/self/uid_map` or `gid_map`): an
/// owner or group outside them reads as the overflow id, and the kernel refuses even root's
/// chown and chmod of its entries. Everything is mapped when the map is unreadable.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct IdMap {
    /// (first id inside, count) of each line; empty when unknown (all mapped).
    ranges: Vec<(u32, u32)>,
}

impl IdMap {
    /// This process's map of `which` (`"uid_map"` or `"gid_map"`).
    fn of_self(which: &str) -> IdMap {
        std::fs::read_to_string(format!("/proc/self/{which}")).map(|t| IdMap::parse(&t)).unwrap_or_default()
    }

    /// The map in the text of a `uid_map` or `gid_map` file.
    fn parse(text: &str) -> IdMap {
        let ranges = text
            .lines()
            .filter_map(|l| {
                let mut f = l.split_whitespace().map(|w| w.parse::<u32>().ok());
                let (inside, _outside, count) = (f.next()??, f.next()??, f.next()??);
                Some((inside, count))
            })
            .collect();
        IdMap { ranges }
    }

    /// Whether this is the initial user namespace's map (every id mapped to itself).
    fn is_whole(&self) -> bool {
        self.ranges.is_empty() || self.ranges == [(0, u32::MAX)]
    }

    /// Whether `id`, as read in this namespace, is mapped.
    pub fn maps(&self, id: u32) -> bool {
        self.ranges.is_empty()
            || self.ranges.iter().any(|&(first, n)| id >= first && u64::from(id - first) < u64::from(n))
    }
}

/// The one rule for "is this owner mapped into my user namespace": the kernel refuses even
/// root's chown and chmod of an inode whose owner or group is not mapped, and drops a setgid bit
/// without CAP_FSETID over it. An id is unmapped when it lies outside the map, or, inside a user
/// namespace (a map that is not the whole range), when it is the overflow id an unmapped one
/// reads as. In the initial namespace 65534 is just `nobody`, a mapped owner.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Mapped {
    uids: IdMap,
    gids: IdMap,
    /// The overflow uid and gid (`/proc/sys/kernel/overflowuid`, `overflowgid`).
    overflow: (u32, u32),
}

impl Mapped {
    /// This process's maps (`/proc/self/uid_map`, `gid_map`); all mapped when unreadable.
    pub fn of_self() -> Mapped {
        Mapped {
            uids: IdMap::of_self("uid_map"),
            gids: IdMap::of_self("gid_map"),
            overflow: (overflow_uid(), overflow_gid()),
        }
    }

    /// The rule of the maps in the text of a `uid_map` and a `gid_map` file, with the
    /// `overflow` uid and gid.
    #[cfg(test)]
    pub fn new(uid_map: &str, gid_map: &str, overflow: (u32, u32)) -> Mapped {
        Mapped { uids: IdMap::parse(uid_map), gids: IdMap::parse(gid_map), overflow }
    }

    /// Whether an inode of owner `uid` and group `gid`, as read in this namespace, has both
    /// mapped.
    pub fn maps(&self, uid: u32, gid: u32) -> bool {
        let mapped = |map: &IdMap, id, over| map.maps(id) && (map.is_whole() || id != over);
        mapped(&self.uids, uid, self.overflow.0) && mapped(&self.gids, gid, self.overflow.1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_id_map_maps_its_ranges_only() {
        let all = IdMap::parse("         0          0 4294967295\n");
        assert!(all.maps(0) && all.maps(65534) && all.maps(4_000_000_000) && all.is_whole());
        let userns = IdMap::parse("0 100000 65536\n");
        assert!(userns.maps(0) && userns.maps(65535) && !userns.is_whole());
        assert!(!userns.maps(65536), "outside the range");
        let one = IdMap::parse("0 1000 1\n");
        assert!(one.maps(0) && !one.maps(65534), "the overflow id is not mapped");
        assert!(IdMap::default().maps(65534), "unknown: everything mapped");
    }

    #[test]
    fn an_owner_is_mapped_by_one_rule_the_overflow_id_only_inside_a_user_namespace() {
        let whole = "0 0 4294967295\n";
        let host = Mapped::new(whole, whole, (65534, 65534));
        assert!(host.maps(0, 0) && host.maps(65534, 65534), "nobody is a mapped owner on the host");
        let userns = "0 100000 65536\n";
        let pod = Mapped::new(userns, userns, (65534, 65534));
        assert!(pod.maps(0, 2000));
        assert!(!pod.maps(65534, 0) && !pod.maps(0, 65534), "the overflow id is what an unmapped one reads as");
        assert!(!pod.maps(70000, 0), "outside the map");
        assert!(Mapped::default().maps(65534, 65534), "unknown maps: everything mapped");
    }

    #[test]
    fn mountinfo_lists_the_mount_points_below_a_directory() {
        let text = "\
22 1 8:1 / / rw - ext4 /dev/sda1 rw
40 22 0:50 / /vol rw - ext4 /dev/loop0 rw
41 40 0:51 / /vol/a/m rw - tmpfs t rw
42 40 8:1 /data/x /vol/my\\040dir/f rw - ext4 /dev/sda1 rw
43 41 0:52 / /vol/a/m/deeper rw - tmpfs t rw
44 22 0:53 / /volume rw - tmpfs t rw
45 40 0:54 / /vol/a/m rw - tmpfs t rw
";
        let below = mountinfo_points_below(text, b"/vol");
        assert_eq!(below, vec![b"a/m".to_vec(), b"a/m/deeper".to_vec(), b"my dir/f".to_vec()]);
        assert_eq!(mountinfo_points_below(text, b"/vol/"), below);
        assert_eq!(mountinfo_points_below(text, b"/vol/a/m"), vec![b"deeper".to_vec()]);
        assert!(mountinfo_points_below(text, b"/elsewhere").is_empty());
        assert_eq!(unescape_octal(r"a\134b\011\7"), b"a\\b\t\\7".to_vec());
    }

    #[test]
    fn mountinfo_names_the_filesystem_of_a_mount_id() {
        let text = "\
27 1 253:0 / / rw,relatime shared:1 - ext4 /dev/vda rw
46 27 0:40 / /tmp/x/ceph/mnt rw,nosuid,nodev,relatime - fuse.ceph-fuse ceph-fuse rw,user_id=0,group_id=0
470 27 0:41 / /a\\040b rw shared:5 master:2 - tmpfs tmpfs rw
";
        assert_eq!(mountinfo_fs_type(text, 46).as_deref(), Some("fuse.ceph-fuse"));
        assert_eq!(mountinfo_fs_type(text, 27).as_deref(), Some("ext4"));
        assert_eq!(mountinfo_fs_type(text, 470).as_deref(), Some("tmpfs"));
        assert_eq!(mountinfo_fs_type(text, 4), None);
        assert_eq!(mountinfo_name(text, 46).as_deref(), Some("fuse.ceph-fuse from ceph-fuse"));
        assert_eq!(mountinfo_name(text, 4), None);
        let bind = "81 27 253:0 /var/lib/kubelet/pods/x/volumes/v /data rw - ext4 /dev/vda rw\n";
        fn root_of(text: &str, id: u64) -> Option<&str> {
            mountinfo_line(text, id)?.split(' ').nth(3)
        }
        assert_eq!(root_of(text, 27), Some("/"));
        assert_eq!(root_of(bind, 81), Some("/var/lib/kubelet/pods/x/volumes/v"));
    }

    #[test]
    fn proc_locks_lines() {
        let held = "1: FLOCK  ADVISORY  WRITE 4242 08:01:1234 0 EOF";
        assert_eq!(lock_line_holder(held, 8, 1, 1234), Some(4242));
        assert_eq!(lock_line_holder(held, 8, 1, 1235), None);
        assert_eq!(lock_line_holder(held, 8, 2, 1234), None);
        assert_eq!(lock_line_holder("2: POSIX  ADVISORY  WRITE 7 fd:1a:99 0 EOF", 0xfd, 0x1a, 99), Some(7));
        assert_eq!(lock_line_holder("1: -> FLOCK  ADVISORY  WRITE 5 08:01:1234 0 EOF", 8, 1, 1234), None);
        assert_eq!(lock_line_holder("garbage", 8, 1, 1234), None);
    }
}
