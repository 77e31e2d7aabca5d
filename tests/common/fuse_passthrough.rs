//! The FUSE passthrough (the `fuser` crate) under the tests' filesystems (`fusefs`) and the
//! benchmark's slow-storage model (`benches/passes/slowfs.rs`, which includes this file): the
//! inode table over a source directory, attributes from `lstat`, the requests served by path,
//! the mount's options and its lazy unmount. What a filesystem does beyond passing through
//! (ignore or refuse ownership changes, sleep a latency, count requests) is its [`Model`].

use std::collections::HashMap;
use std::ffi::{CString, OsStr, OsString};
use std::fs;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirEntryExt, FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, RwLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{
    Config, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, KernelConfig,
    MountOption, OpenFlags, ReplyAttr, ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs,
    ReplyXattr, Request,
};

/// A request a [`Model`] sees arrive, by kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Lookup,
    Getattr,
    Setattr,
    Readlink,
    Opendir,
    Readdir,
    /// `getxattr` or `listxattr`.
    XattrRead,
    /// `setxattr` or `removexattr`.
    XattrWrite,
}

/// What a setattr asks to change (its other fields are not served).
#[derive(Debug, Clone, Copy)]
pub struct Change {
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
}

impl Change {
    /// Applies the owner and mode changes to `path`, never following a symlink.
    pub fn chown_chmod(&self, path: &Path) -> Result<(), Errno> {
        let c = cstr(path)?;
        if self.uid.is_some() || self.gid.is_some() {
            let (u, g) = (self.uid.unwrap_or(u32::MAX), self.gid.unwrap_or(u32::MAX));
            // SAFETY: a valid C string.
            if unsafe { libc::lchown(c.as_ptr(), u, g) } != 0 {
                return Err(last());
            }
        }
        if let Some(mode) = self.mode {
            let flags = libc::AT_SYMLINK_NOFOLLOW;
            // SAFETY: a valid C string; fchmodat2 with NOFOLLOW never follows a symlink.
            let r = unsafe { libc::syscall(libc::SYS_fchmodat2, libc::AT_FDCWD, c.as_ptr(), mode & 0o7777, flags) };
            if r != 0 {
                return Err(last());
            }
        }
        Ok(())
    }
}

/// What a filesystem does beyond passing through.
pub trait Model: Send + Sync + 'static {
    /// A request of kind `op` arrives, before it is served (a delay, a count); an error is its
    /// reply.
    fn arrive(&self, op: Op) -> Result<(), Errno>;

    /// Serves a setattr on `path`; the passthrough replies with the attributes `path` has then.
    fn setattr(&self, path: &Path, change: &Change) -> Result<(), Errno>;

    /// The attributes the filesystem answers for `path`, which has `fresh` (a daemon's
    /// attribute cache answers older ones).
    fn answer(&self, _path: &Path, fresh: FileAttr) -> FileAttr {
        fresh
    }

    /// Configures the kernel's side at mount time.
    fn init(&mut self, _config: &mut KernelConfig) {}

    /// The filesystem is unmounted.
    fn destroy(&mut self) {}
}

/// A directory's listing: inode, type and name of each entry.
type Listing = Vec<(u64, FileType, OsString)>;

/// A passthrough of a source directory, its root the mount's root, that `M` models.
pub struct Passthrough<M> {
    model: M,
    /// How long the kernel caches names and attributes.
    ttl: Duration,
    /// The source's inode, which the mount calls 1.
    root_ino: u64,
    /// Every inode looked up, by the number the mount gives it, and its path in the source.
    paths: RwLock<HashMap<u64, PathBuf>>,
    /// Open directories' listings, by handle.
    dirs: Mutex<HashMap<u64, Listing>>,
    next_fh: AtomicU64,
}

/// The mount's options: `name` as its source and subtype (`fuse.NAME` in the mount table), and
/// `threads` server threads.
pub fn config(name: &str, threads: usize) -> Config {
    let mut config = Config::default();
    config.mount_options = vec![MountOption::FSName(name.into()), MountOption::Subtype(name.into())];
    config.n_threads = Some(threads);
    config
}

/// Detaches the mount at `mnt` lazily (`umount -l`): what still uses it keeps it until done.
pub fn detach(mnt: &Path) {
    if let Ok(c) = cstr(mnt) {
        // SAFETY: a valid C string; a failed detach is only reported by the return value.
        unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
    }
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

fn name_cstr(name: &OsStr) -> Result<CString, Errno> {
    CString::new(name.as_bytes()).map_err(|_| Errno::EINVAL)
}

fn last() -> Errno {
    Errno::from(io::Error::last_os_error())
}

impl<M: Model> Passthrough<M> {
    /// A passthrough of `src` whose names and attributes the kernel caches for `ttl`.
    pub fn new(src: &Path, ttl: Duration, model: M) -> io::Result<Self> {
        Ok(Passthrough {
            model,
            ttl,
            root_ino: fs::metadata(src)?.ino(),
            paths: RwLock::new(HashMap::from([(1, src.to_path_buf())])),
            dirs: Mutex::new(HashMap::new()),
            next_fh: AtomicU64::new(1),
        })
    }

    fn fuse_ino(&self, ino: u64) -> u64 {
        if ino == self.root_ino { 1 } else { ino }
    }

    fn path(&self, ino: INodeNo) -> Result<PathBuf, Errno> {
        self.paths.read().expect("paths lock").get(&ino.0).cloned().ok_or(Errno::ENOENT)
    }

    fn attr(&self, path: &Path) -> Result<FileAttr, Errno> {
        Ok(self.model.answer(path, self.fresh_attr(path)?))
    }

    fn fresh_attr(&self, path: &Path) -> Result<FileAttr, Errno> {
        let m = fs::symlink_metadata(path).map_err(Errno::from)?;
        Ok(FileAttr {
            ino: INodeNo(self.fuse_ino(m.ino())),
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

    fn reply_attr(&self, r: Result<FileAttr, Errno>, reply: ReplyAttr) {
        match r {
            Ok(attr) => reply.attr(&self.ttl, &attr),
            Err(e) => reply.error(e),
        }
    }

    /// A getxattr of `name`, or a listxattr (no name), into a buffer of `size` bytes; `size == 0`
    /// asks for the length only.
    fn xattr_read(&self, ino: INodeNo, name: Option<&OsStr>, size: u32, reply: ReplyXattr) {
        let r = self.model.arrive(Op::XattrRead).and_then(|()| {
            let (c, n) = (cstr(&self.path(ino)?)?, name.map(name_cstr).transpose()?);
            let mut buf = vec![0u8; size as usize];
            let (p, b, len) = (c.as_ptr(), buf.as_mut_ptr(), buf.len());
            let got = match n {
                // SAFETY: valid C strings and a buffer of `len` bytes.
                Some(n) => unsafe { libc::lgetxattr(p, n.as_ptr(), b.cast(), len) },
                // SAFETY: a valid C string and a buffer of `len` bytes.
                None => unsafe { libc::llistxattr(p, b.cast(), len) },
            };
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

    /// A setxattr of `name` to `value` with `flags`, or (no value) a removexattr of `name`.
    fn xattr_write(&self, ino: INodeNo, name: &OsStr, value: Option<(&[u8], i32)>, reply: ReplyEmpty) {
        let r = self.model.arrive(Op::XattrWrite).and_then(|()| {
            let (c, n) = (cstr(&self.path(ino)?)?, name_cstr(name)?);
            let r = match value {
                // SAFETY: valid C strings and value slice.
                Some((v, flags)) => unsafe {
                    libc::lsetxattr(c.as_ptr(), n.as_ptr(), v.as_ptr().cast(), v.len(), flags)
                },
                // SAFETY: valid C strings.
                None => unsafe { libc::lremovexattr(c.as_ptr(), n.as_ptr()) },
            };
            if r != 0 { Err(last()) } else { Ok(()) }
        });
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }
}

impl<M: Model> Filesystem for Passthrough<M> {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> io::Result<()> {
        self.model.init(config);
        Ok(())
    }

    fn destroy(&mut self) {
        self.model.destroy();
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let r = self.model.arrive(Op::Lookup).and_then(|()| {
            let path = self.path(parent)?.join(name);
            let attr = self.attr(&path)?;
            self.paths.write().expect("paths lock").insert(attr.ino.0, path);
            Ok(attr)
        });
        match r {
            Ok(attr) => reply.entry(&self.ttl, &attr, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        let r = self.model.arrive(Op::Getattr).and_then(|()| self.attr(&self.path(ino)?));
        self.reply_attr(r, reply);
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
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
        let r = self.model.arrive(Op::Setattr).and_then(|()| {
            let path = self.path(ino)?;
            self.model.setattr(&path, &Change { mode, uid, gid, size })?;
            self.attr(&path)
        });
        self.reply_attr(r, reply);
    }

    /// A new regular file (volprep's own test of the storage creates one), owned by the server.
    fn create(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        _flags: i32,
        reply: fuser::ReplyCreate,
    ) {
        let r = self.model.arrive(Op::Lookup).and_then(|()| {
            let path = self.path(parent)?.join(name);
            let c = cstr(&path)?;
            let flags = libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY | libc::O_NOFOLLOW | libc::O_CLOEXEC;
            // SAFETY: a valid C string; the fd is closed at once.
            let fd = unsafe { libc::open(c.as_ptr(), flags, (mode & !umask & 0o7777) as libc::c_uint) };
            if fd < 0 {
                return Err(last());
            }
            // SAFETY: an fd this call opened.
            unsafe { libc::close(fd) };
            let attr = self.attr(&path)?;
            self.paths.write().expect("paths lock").insert(attr.ino.0, path);
            Ok(attr)
        });
        match r {
            Ok(attr) => reply.created(&self.ttl, &attr, Generation(0), FileHandle(0), FopenFlags::empty()),
            Err(e) => reply.error(e),
        }
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let r = self.model.arrive(Op::Setattr).and_then(|()| {
            let path = self.path(parent)?.join(name);
            fs::remove_file(&path).map_err(Errno::from)
        });
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        let r = self.model.arrive(Op::Readlink).and_then(|()| fs::read_link(self.path(ino)?).map_err(Errno::from));
        match r {
            Ok(t) => reply.data(t.as_os_str().as_bytes()),
            Err(e) => reply.error(e),
        }
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let list = self.model.arrive(Op::Opendir).and_then(|()| {
            let mut list = Listing::new();
            for e in fs::read_dir(self.path(ino)?).map_err(Errno::from)? {
                let e = e.map_err(Errno::from)?;
                let kind = kind_of(e.file_type().map_err(Errno::from)?);
                list.push((self.fuse_ino(e.ino()), kind, e.file_name()));
            }
            Ok(list)
        });
        match list {
            Ok(list) => {
                let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
                self.dirs.lock().expect("dirs lock").insert(fh, list);
                reply.opened(FileHandle(fh), FopenFlags::empty());
            }
            Err(e) => reply.error(e),
        }
    }

    fn readdir(&self, _req: &Request, _ino: INodeNo, fh: FileHandle, offset: u64, mut reply: ReplyDirectory) {
        if let Err(e) = self.model.arrive(Op::Readdir) {
            return reply.error(e);
        }
        let dirs = self.dirs.lock().expect("dirs lock");
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
        self.dirs.lock().expect("dirs lock").remove(&fh.0);
        reply.ok();
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        reply.statfs(1 << 20, 1 << 19, 1 << 19, 1 << 22, 1 << 21, 4096, 255, 4096);
    }

    fn access(&self, _req: &Request, _ino: INodeNo, _mask: fuser::AccessFlags, reply: ReplyEmpty) {
        reply.ok();
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        self.xattr_read(ino, Some(name), size, reply);
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        self.xattr_read(ino, None, size, reply);
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
        self.xattr_write(ino, name, Some((value, flags)), reply);
    }

    fn removexattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.xattr_write(ino, name, None, reply);
    }
}
