//! FUSE filesystems of the tests (the `fuser` crate, served by a thread of the test process): a
//! passthrough (`fuse_passthrough`) over a directory that honours ownership changes, ignores them
//! (accepts chown and chmod and changes nothing, as SMB or Azure Files with fixed
//! `uid=`/`gid=`/`file_mode=` mount options do), or refuses them with EPERM (NFS
//! `root_squash`). Unmounted on drop.

use std::path::Path;
use std::time::Duration;

use fuser::Errno;
use tempfile::TempDir;

use super::fuse_passthrough::{self, Change, Model, Op, Passthrough};

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

/// The gate of tests that need root and /dev/fuse, like [`super::privileged`]: each such test
/// is `#[ignore = "needs root and /dev/fuse"]`, so it runs only when asked for
/// (`--include-ignored`), and asked for where it cannot run it fails, naming what is missing (a
/// test asked for and not run must not look passed). Returns true when it can run.
#[track_caller]
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
    panic!("{test}: FUSE test cannot run: {}", missing.join(", "));
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
        let fs = Passthrough::new(src, TTL, owners).expect("source");
        let config = fuse_passthrough::config(owners.name(), 4);
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
                // A busy mount is detached lazily.
                fuse_passthrough::detach(self.mnt.path());
            }
        }
    }
}

/// How long the kernel caches names and attributes.
const TTL: Duration = Duration::from_secs(1);

impl Model for Owners {
    /// These filesystems serve no readlink (ENOSYS, as `fuser` answers what is not served).
    fn arrive(&self, op: Op) -> Result<(), Errno> {
        if op == Op::Readlink { Err(Errno::ENOSYS) } else { Ok(()) }
    }

    /// A chown or chmod as `self` says; a change of size is not served (and ignored).
    fn setattr(&self, path: &Path, change: &Change) -> Result<(), Errno> {
        match self {
            Owners::Ignore => Ok(()),
            Owners::Refuse if change.mode.is_some() || change.uid.is_some() || change.gid.is_some() => {
                Err(Errno::EPERM)
            }
            _ => change.chown_chmod(path),
        }
    }
}
