//! Real filesystems for tests: loop-mounted ext4/xfs/btrfs images and tmpfs, each in its own
//! temp dir (tests run in parallel), bind and overlayfs mounts, unmounted and detached on drop,
//! panics included.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use tempfile::TempDir;

/// Finds a system tool on PATH or in the sbin directories (not always on a user's PATH).
pub fn tool(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/local/sbin", "/usr/sbin", "/sbin", "/usr/bin", "/bin"].map(PathBuf::from))
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// Runs a system tool; panics with its output if it fails.
#[track_caller]
pub fn sh(name: &str, args: &[&std::ffi::OsStr]) -> String {
    try_sh(name, args).unwrap_or_else(|e| panic!("{e}"))
}

pub fn try_sh(name: &str, args: &[&std::ffi::OsStr]) -> Result<String, String> {
    let exe = tool(name).ok_or_else(|| format!("{name}: not found"))?;
    let out = Command::new(&exe).args(args).output().map_err(|e| format!("{name}: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "`{name} {}` failed ({}):\n{}{}",
            args.iter().map(|a| a.to_string_lossy()).collect::<Vec<_>>().join(" "),
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

fn os(s: &str) -> &std::ffi::OsStr {
    std::ffi::OsStr::new(s)
}

/// Unmounts `mnt`, lazily if it is busy.
fn unmount(mnt: &Path) {
    if let Err(e) = try_sh("umount", &[mnt.as_os_str()]) {
        eprintln!("{e}; retrying with umount -l");
        if let Err(e) = try_sh("umount", &[os("-l"), mnt.as_os_str()]) {
            eprintln!("{e}");
        }
    }
}

/// Filesystem of a loop image.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FsKind {
    Ext4,
    Xfs,
    Btrfs,
}

impl FsKind {
    pub fn mkfs(self) -> &'static str {
        match self {
            FsKind::Ext4 => "mkfs.ext4",
            FsKind::Xfs => "mkfs.xfs",
            FsKind::Btrfs => "mkfs.btrfs",
        }
    }

    /// The smallest image the mkfs accepts, in MiB (rounded up).
    pub fn min_mib(self) -> u64 {
        match self {
            FsKind::Ext4 => 64,
            FsKind::Xfs => 300,
            FsKind::Btrfs => 128,
        }
    }
}

/// A sparse image file, attached to a free loop device, formatted and mounted.
pub struct LoopFs {
    pub kind: FsKind,
    mnt: PathBuf,
    dev: Option<String>,
    mounted: bool,
    // Dropped last (fields drop after `Drop::drop`): removes the image and the mount point.
    _dir: TempDir,
}

impl LoopFs {
    /// An image of at least `mib` MiB (raised to the mkfs minimum). ext4 gets 4 KiB blocks,
    /// like any volume over 512 MiB.
    pub fn new(kind: FsKind, mib: u64) -> LoopFs {
        let extra: &[&str] = if kind == FsKind::Ext4 { &["-b", "4096"] } else { &[] };
        LoopFs::with_mkfs_args(kind, mib, extra)
    }

    /// Like `new`, with extra mkfs arguments (e.g. `-b 1024`, what mke2fs picks below 512 MiB).
    pub fn with_mkfs_args(kind: FsKind, mib: u64, extra: &[&str]) -> LoopFs {
        let dir = tempfile::Builder::new().prefix("volprep-loop-").tempdir().expect("tempdir");
        let img = dir.path().join("image");
        let mnt = dir.path().join("mnt");
        std::fs::create_dir(&mnt).expect("mkdir mnt");
        let file = std::fs::File::create(&img).expect("create image");
        file.set_len(mib.max(kind.min_mib()) << 20).expect("size image");
        drop(file);
        // From here on, Drop cleans up whatever was set up.
        let mut fs = LoopFs { kind, mnt, dev: None, mounted: false, _dir: dir };
        let mkfs_args: &[&str] = match kind {
            // 256-byte inodes: nanosecond ctimes (ctime tests need them); plenty of inodes.
            FsKind::Ext4 => &["-q", "-F", "-I", "256", "-N", "100000", "-E", "nodiscard"],
            FsKind::Xfs => &["-q", "-f", "-K"],
            FsKind::Btrfs => &["-q", "-f", "--nodiscard"],
        };
        let mut args: Vec<&std::ffi::OsStr> = mkfs_args.iter().chain(extra).map(|a| os(a)).collect();
        args.push(img.as_os_str());
        sh(kind.mkfs(), &args);
        // `losetup --find` can race with another test taking the same free device: retry.
        let mut last = String::new();
        for _ in 0..20 {
            match try_sh("losetup", &[os("--find"), os("--show"), img.as_os_str()]) {
                Ok(out) => {
                    fs.dev = Some(out.trim().to_string());
                    break;
                }
                Err(e) => {
                    last = e;
                    std::thread::sleep(std::time::Duration::from_millis(100));
                }
            }
        }
        let dev = fs.dev.clone().unwrap_or_else(|| panic!("losetup failed: {last}"));
        sh("mount", &[os(&dev), fs.mnt.as_os_str()]);
        fs.mounted = true;
        fs
    }

    /// ext4 with `block`-byte blocks (`"1024"`, what mke2fs picks below 512 MiB, whose inodes
    /// hold ~1 KiB of xattrs; `"4096"`, ~4 KiB).
    pub fn new_ext4_blocks(mib: u64, block: &str) -> LoopFs {
        LoopFs::with_mkfs_args(FsKind::Ext4, mib, &["-b", block])
    }

    /// The mount point (the filesystem's root directory).
    pub fn path(&self) -> &Path {
        &self.mnt
    }

    /// `mount -o remount,ro`.
    pub fn remount_ro(&self) {
        sh("mount", &[os("-o"), os("remount,ro"), self.mnt.as_os_str()]);
    }
}

impl Drop for LoopFs {
    fn drop(&mut self) {
        if self.mounted {
            unmount(&self.mnt);
        }
        if let Some(dev) = &self.dev {
            if let Err(e) = try_sh("losetup", &[os("-d"), os(dev)]) {
                eprintln!("{e}");
            }
        }
    }
}

/// A tmpfs, mounted on a fresh temp dir (`new`) or on an existing directory (`at`, for a
/// nested mount inside a volume). Unmounted on drop.
pub struct Tmpfs {
    mnt: PathBuf,
    _dir: Option<TempDir>,
}

impl Tmpfs {
    pub fn new() -> Tmpfs {
        let dir = tempfile::Builder::new().prefix("volprep-tmpfs-").tempdir().expect("tempdir");
        let mnt = dir.path().to_path_buf();
        Tmpfs::mount(&mnt);
        Tmpfs { mnt, _dir: Some(dir) }
    }

    pub fn at(mnt: &Path) -> Tmpfs {
        Tmpfs::mount(mnt);
        Tmpfs { mnt: mnt.to_path_buf(), _dir: None }
    }

    fn mount(mnt: &Path) {
        sh("mount", &[os("-t"), os("tmpfs"), os("-o"), os("size=1g,mode=0755"), os("tmpfs"), mnt.as_os_str()]);
    }

    pub fn path(&self) -> &Path {
        &self.mnt
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        unmount(&self.mnt);
    }
}

/// A ramfs (no extended attributes at all), on a fresh temp dir. Unmounted on drop.
pub struct Ramfs {
    dir: TempDir,
}

impl Ramfs {
    pub fn new() -> Ramfs {
        let dir = tempfile::Builder::new().prefix("volprep-ramfs-").tempdir().expect("tempdir");
        sh("mount", &[os("-t"), os("ramfs"), os("-o"), os("mode=0755"), os("ramfs"), dir.path().as_os_str()]);
        Ramfs { dir }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for Ramfs {
    fn drop(&mut self) {
        unmount(self.dir.path());
    }
}

/// A bind mount of `src` (a directory or a file) on `dst` (which must exist and be of the same
/// type), e.g. a directory of the test's own filesystem inside a volume on that filesystem: the
/// same device, another mount. Unmounted on drop.
pub struct Bind {
    mnt: PathBuf,
}

impl Bind {
    pub fn new(src: &Path, dst: &Path) -> Bind {
        sh("mount", &[os("--bind"), src.as_os_str(), dst.as_os_str()]);
        Bind { mnt: dst.to_path_buf() }
    }

    pub fn path(&self) -> &Path {
        &self.mnt
    }
}

impl Drop for Bind {
    fn drop(&mut self) {
        unmount(&self.mnt);
    }
}

/// An overlayfs mount at `at` with the mount options `opts` (`lowerdir=…,upperdir=…,workdir=…`).
/// Unmounted on drop; a failure to unmount goes to the process's stderr (libtest captures
/// `eprintln!` of passing tests).
pub struct Overlay {
    mnt: PathBuf,
}

impl Overlay {
    pub fn mount(opts: &str, at: &Path) -> Overlay {
        sh("mount", &[os("-t"), os("overlay"), os("overlay"), os("-o"), os(opts), at.as_os_str()]);
        Overlay { mnt: at.to_path_buf() }
    }

    pub fn path(&self) -> &Path {
        &self.mnt
    }
}

impl Drop for Overlay {
    fn drop(&mut self) {
        if let Err(e) = try_sh("umount", &[self.mnt.as_os_str()]) {
            let _ = writeln!(std::io::stderr().lock(), "{e}");
        }
    }
}
