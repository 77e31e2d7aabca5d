//! FUSE filesystems of the tests (the `fuser` crate, served by a thread of the test process): a
//! passthrough over a directory that honours ownership changes, ignores them (accepts chown and
//! chmod and changes nothing, as SMB or Azure Files with fixed `uid=`/`gid=`/`file_mode=`
//! mount options do), or refuses them with EPERM (NFS `root_squash`). Unmounted on drop.

use std::collections::HashMap;
use std::ffi::{CString, OsStr};
use std::fs;
use std::io::Write as _;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, RwLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{
    Config, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, MountOption, OpenFlags,
    ReplyAttr, ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyXattr, Request,
};
use tempfile::TempDir;

use super::PRIVILEGED_ENV;

/// What the filesystem does with a chown or chmod.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Owners {
    /// Applies it (a plain passthrough).
    Honour,
    /// Answers success and changes nothing.
    Ignore,
    /// Answers EPERM.
    Refuse,
}

impl Owners {
    /// The mount's source (`fuse from volprep-…`) and subtype.
    fn name(self) -> &'static str {
        match self {
            Owners::Honour => "volprep-honour",
            Owners::Ignore => "volprep-ignore",
            Owners::Refuse => "volprep-refuse",
        }
    }
}

/// The gate of tests that need root and /dev/fuse: true if they can run; otherwise says why and
/// returns false, or under `VOLPREP_PRIVILEGED_TESTS=1` panics (a skipped test is a failure).
pub fn available() -> bool {
    let mut missing = Vec::new();
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        missing.push("not running as root");
    }
    if !Path::new("/dev/fuse").exists() {
        missing.push("no /dev/fuse (`modprobe fuse`)");
    }
    if missing.is_empty() {
        return true;
    }
    let test = std::thread::current().name().unwrap_or("?").to_string();
    let why = missing.join(", ");
    if std::env::var_os(PRIVILEGED_ENV).is_some_and(|v| v == "1") {
        panic!("{test}: FUSE test cannot run: {why} (and {PRIVILEGED_ENV}=1)");
    }
    let _ = writeln!(std::io::stderr().lock(), "SKIPPED {test}: FUSE test cannot run: {why}");
    false
}

/// A mounted test filesystem over `src`: its mount point is [`FuseFs::path`].
pub struct FuseFs {
    session: Option<fuser::BackgroundSession>,
    mnt: TempDir,
}

impl FuseFs {
    /// Mounts a passthrough of `src` that treats ownership changes as `owners` says.
    pub fn mount(src: &Path, owners: Owners) -> FuseFs {
        let mnt = tempfile::Builder::new().prefix("volprep-fuse-").tempdir().expect("mount point");
        let root_ino = fs::metadata(src).expect("source").ino();
        let fs = Passthrough {
            owners,
            root_ino,
            paths: RwLock::new(HashMap::from([(1, src.to_path_buf())])),
            dirs: Mutex::new(HashMap::new()),
            next_fh: Mutex::new(1),
        };
        let mut config = Config::default();
        config.mount_options =
            vec![MountOption::FSName(owners.name().into()), MountOption::Subtype(owners.name().into())];
        config.n_threads = Some(4);
        let session = fuser::spawn_mount(fs, mnt.path(), &config).expect("mount the test FUSE filesystem");
        FuseFs { session: Some(session), mnt }
    }

    pub fn path(&self) -> &Path {
        self.mnt.path()
    }
}

impl Drop for FuseFs {
    fn drop(&mut self) {
        if let Some(s) = self.session.take() {
            if s.umount_and_join().is_err() {
                let c = CString::new(self.mnt.path().as_os_str().as_bytes()).expect("path");
                // SAFETY: a valid C string; a busy mount is detached lazily.
                unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
            }
        }
    }
}

const TTL: Duration = Duration::from_secs(1);

/// A directory's listing: inode, type and name of each entry.
type Listing = Vec<(u64, FileType, std::ffi::OsString)>;

struct Passthrough {
    owners: Owners,
    root_ino: u64,
    paths: RwLock<HashMap<u64, PathBuf>>,
    dirs: Mutex<HashMap<u64, Listing>>,
    next_fh: Mutex<u64>,
}

fn kind_of(ft: fs::FileType) -> FileType {
    if ft.is_dir() {
        FileType::Directory
    } else if ft.is_symlink() {
        FileType::Symlink
    } else if ft.is_fifo() {
        FileType::NamedPipe
    } else if ft.is_socket() {
        FileType::Socket
    } else if ft.is_char_device() {
        FileType::CharDevice
    } else if ft.is_block_device() {
        FileType::BlockDevice
    } else {
        FileType::RegularFile
    }
}

fn time(secs: i64, nsecs: i64) -> SystemTime {
    UNIX_EPOCH + Duration::new(secs.max(0) as u64, nsecs as u32)
}

fn cstr(p: &Path) -> Result<CString, Errno> {
    CString::new(p.as_os_str().as_bytes()).map_err(|_| Errno::EINVAL)
}

fn last() -> Errno {
    Errno::from(std::io::Error::last_os_error())
}

impl Passthrough {
    fn ino(&self, ino: u64) -> u64 {
        if ino == self.root_ino { 1 } else { ino }
    }

    fn path(&self, ino: INodeNo) -> Result<PathBuf, Errno> {
        self.paths.read().expect("paths").get(&ino.0).cloned().ok_or(Errno::ENOENT)
    }

    fn attr(&self, path: &Path) -> Result<FileAttr, Errno> {
        let m = fs::symlink_metadata(path).map_err(Errno::from)?;
        Ok(FileAttr {
            ino: INodeNo(self.ino(m.ino())),
            size: m.size(),
            blocks: m.blocks(),
            atime: time(m.atime(), m.atime_nsec()),
            mtime: time(m.mtime(), m.mtime_nsec()),
            ctime: time(m.ctime(), m.ctime_nsec()),
            crtime: UNIX_EPOCH,
            kind: kind_of(m.file_type()),
            perm: (m.mode() & 0o7777) as u16,
            nlink: m.nlink() as u32,
            uid: m.uid(),
            gid: m.gid(),
            rdev: m.rdev() as u32,
            blksize: m.blksize() as u32,
            flags: 0,
        })
    }

    fn change(&self, path: &Path, mode: Option<u32>, uid: Option<u32>, gid: Option<u32>) -> Result<(), Errno> {
        match self.owners {
            Owners::Ignore => return Ok(()),
            Owners::Refuse if mode.is_some() || uid.is_some() || gid.is_some() => return Err(Errno::EPERM),
            _ => {}
        }
        let c = cstr(path)?;
        if uid.is_some() || gid.is_some() {
            // SAFETY: a valid C string.
            if unsafe { libc::lchown(c.as_ptr(), uid.unwrap_or(u32::MAX), gid.unwrap_or(u32::MAX)) } != 0 {
                return Err(last());
            }
        }
        if let Some(mode) = mode {
            // SAFETY: a valid C string; fchmodat2 with NOFOLLOW never follows a symlink.
            let r = unsafe {
                libc::syscall(libc::SYS_fchmodat2, libc::AT_FDCWD, c.as_ptr(), mode & 0o7777, libc::AT_SYMLINK_NOFOLLOW)
            };
            if r != 0 {
                return Err(last());
            }
        }
        Ok(())
    }

    fn xattr(&self, ino: INodeNo, size: u32, reply: ReplyXattr, get: impl FnOnce(&CString, &mut [u8]) -> isize) {
        let r = self.path(ino).and_then(|p| {
            let c = cstr(&p)?;
            let mut buf = vec![0u8; size as usize];
            let got = get(&c, &mut buf);
            if got < 0 {
                return Err(last());
            }
            buf.truncate(got as usize);
            Ok(buf)
        });
        match r {
            Ok(v) if size == 0 => reply.size(v.len() as u32),
            Ok(v) => reply.data(&v),
            Err(e) => reply.error(e),
        }
    }
}

impl Filesystem for Passthrough {
    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let r = self.path(parent).and_then(|p| {
            let path = p.join(name);
            let attr = self.attr(&path)?;
            self.paths.write().expect("paths").insert(attr.ino.0, path);
            Ok(attr)
        });
        match r {
            Ok(attr) => reply.entry(&TTL, &attr, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.path(ino).and_then(|p| self.attr(&p)) {
            Ok(attr) => reply.attr(&TTL, &attr),
            Err(e) => reply.error(e),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        _size: Option<u64>,
        _atime: Option<fuser::TimeOrNow>,
        _mtime: Option<fuser::TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let r = self.path(ino).and_then(|p| {
            self.change(&p, mode, uid, gid)?;
            self.attr(&p)
        });
        match r {
            Ok(attr) => reply.attr(&TTL, &attr),
            Err(e) => reply.error(e),
        }
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let list = self.path(ino).and_then(|p| {
            let mut list = Vec::new();
            for e in fs::read_dir(p).map_err(Errno::from)? {
                let e = e.map_err(Errno::from)?;
                let kind = kind_of(e.file_type().map_err(Errno::from)?);
                list.push((self.ino(std::os::unix::fs::DirEntryExt::ino(&e)), kind, e.file_name()));
            }
            Ok(list)
        });
        match list {
            Ok(list) => {
                let mut next = self.next_fh.lock().expect("fh");
                let fh = *next;
                *next += 1;
                self.dirs.lock().expect("dirs").insert(fh, list);
                reply.opened(FileHandle(fh), FopenFlags::empty());
            }
            Err(e) => reply.error(e),
        }
    }

    fn readdir(&self, _req: &Request, _ino: INodeNo, fh: FileHandle, offset: u64, mut reply: ReplyDirectory) {
        let dirs = self.dirs.lock().expect("dirs");
        let Some(list) = dirs.get(&fh.0) else {
            return reply.error(Errno::EBADF);
        };
        for (i, (ino, kind, name)) in list.iter().enumerate().skip(offset as usize) {
            if reply.add(INodeNo(*ino), i as u64 + 1, *kind, name) {
                break;
            }
        }
        reply.ok();
    }

    fn releasedir(&self, _req: &Request, _ino: INodeNo, fh: FileHandle, _flags: OpenFlags, reply: ReplyEmpty) {
        self.dirs.lock().expect("dirs").remove(&fh.0);
        reply.ok();
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        reply.statfs(1 << 20, 1 << 19, 1 << 19, 1 << 22, 1 << 21, 4096, 255, 4096);
    }

    fn access(&self, _req: &Request, _ino: INodeNo, _mask: fuser::AccessFlags, reply: ReplyEmpty) {
        reply.ok();
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        let Ok(n) = CString::new(name.as_bytes()) else { return reply.error(Errno::EINVAL) };
        // SAFETY: valid C strings and a buffer of its own length.
        self.xattr(ino, size, reply, |c, buf| unsafe {
            libc::lgetxattr(c.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len())
        });
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        // SAFETY: a valid C string and a buffer of its own length.
        self.xattr(ino, size, reply, |c, buf| unsafe {
            libc::llistxattr(c.as_ptr(), buf.as_mut_ptr().cast(), buf.len())
        });
    }

    fn setxattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        let r = self.path(ino).and_then(|p| {
            let (c, n) = (cstr(&p)?, CString::new(name.as_bytes()).map_err(|_| Errno::EINVAL)?);
            // SAFETY: valid C strings and value slice.
            let r = unsafe { libc::lsetxattr(c.as_ptr(), n.as_ptr(), value.as_ptr().cast(), value.len(), flags) };
            if r != 0 { Err(last()) } else { Ok(()) }
        });
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn removexattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let r = self.path(ino).and_then(|p| {
            let (c, n) = (cstr(&p)?, CString::new(name.as_bytes()).map_err(|_| Errno::EINVAL)?);
            // SAFETY: valid C strings.
            if unsafe { libc::lremovexattr(c.as_ptr(), n.as_ptr()) } != 0 { Err(last()) } else { Ok(()) }
        });
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }
}
