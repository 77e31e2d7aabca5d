//! A fresh sparse image, loop device and mount for one benchmark run, with cold-cache resets
//! and cleanup on every exit (Drop, so panics too).

use std::fs;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use crate::args::FsKind;

/// Runs a setup command, turning a failure into an error carrying its stderr.
pub fn sh(cmd: &mut Command) -> io::Result<String> {
    let out = cmd.stdin(Stdio::null()).output()?;
    if !out.status.success() {
        return Err(io::Error::other(format!(
            "{:?} failed ({}): {}",
            cmd,
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// Whether `name` is an executable on PATH.
pub fn have(name: &str) -> bool {
    std::env::var_os("PATH").is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(name).is_file()))
}

/// `echo 3 > /proc/sys/vm/drop_caches`.
pub fn drop_caches() -> io::Result<()> {
    fs::write("/proc/sys/vm/drop_caches", "3")
}

/// A mounted loop image. Dropping it unmounts, detaches and deletes.
pub struct Volume {
    pub fs: FsKind,
    pub img: PathBuf,
    pub mnt: PathBuf,
    pub loopdev: String,
    pub direct_io: bool,
    mounted: bool,
}

impl Volume {
    /// Makes a sparse image of `size` bytes with room for `inodes`, attaches and mounts it.
    pub fn create(dir: &Path, fs: FsKind, size: u64, inodes: u64) -> io::Result<Volume> {
        fs::create_dir_all(dir)?;
        let img = dir.join(format!("{}.img", fs.name()));
        let mnt = dir.join("mnt");
        fs::create_dir_all(&mnt)?;
        let f = fs::File::create(&img)?;
        f.set_len(size)?;
        drop(f);
        let mut vol = Volume { fs, img, mnt, loopdev: String::new(), direct_io: false, mounted: false };
        let img = vol.img.clone();
        match fs {
            // Inode tables written now, not by a background ext4lazyinit thread mid-benchmark.
            FsKind::Ext4 => sh(Command::new("mkfs.ext4")
                .args(["-q", "-F", "-N", &inodes.to_string()])
                .args(["-E", "lazy_itable_init=0,lazy_journal_init=0"])
                .arg(&img))?,
            FsKind::Xfs => sh(Command::new("mkfs.xfs").args(["-q", "-f"]).arg(&img))?,
        };
        // Direct I/O keeps the image's pages out of the host page cache, so the loop device
        // behaves more like a disk; not every backing filesystem allows it.
        let attach = |direct: bool| {
            let mut c = Command::new("losetup");
            if direct {
                c.arg("--direct-io=on");
            }
            sh(c.args(["-f", "--show"]).arg(&img))
        };
        (vol.loopdev, vol.direct_io) = match attach(true) {
            Ok(dev) => (dev, true),
            Err(_) => (attach(false)?, false),
        };
        vol.mount()?;
        Ok(vol)
    }

    fn mount(&mut self) -> io::Result<()> {
        sh(Command::new("mount").args(["-t", self.fs.name(), "-o", "noatime"]).arg(&self.loopdev).arg(&self.mnt))?;
        self.mounted = true;
        Ok(())
    }

    fn umount(&mut self) -> io::Result<()> {
        sh(Command::new("umount").arg(&self.mnt))?;
        self.mounted = false;
        Ok(())
    }

    /// `syncfs` on the mounted filesystem; returns the seconds it took.
    pub fn sync(&self) -> io::Result<f64> {
        syncfs(&self.mnt)
    }

    /// Cold caches: sync, unmount, mount again, drop caches. Unmounting is needed: dropping
    /// caches alone leaves freshly written inode tables cached.
    pub fn cold(&mut self) -> io::Result<()> {
        self.sync()?;
        self.umount()?;
        self.mount()?;
        drop_caches()
    }
}

impl Drop for Volume {
    fn drop(&mut self) {
        if self.mounted && self.umount().is_err() {
            // Something still holds it (an interrupted child?): detach lazily.
            if let Ok(c) = std::ffi::CString::new(self.mnt.as_os_str().as_bytes()) {
                // SAFETY: valid C string.
                unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
            }
        }
        if !self.loopdev.is_empty() {
            let _ = sh(Command::new("losetup").arg("-d").arg(&self.loopdev));
        }
        let _ = fs::remove_file(&self.img);
        let _ = fs::remove_dir(&self.mnt);
    }
}

/// `syncfs` of the filesystem holding `path`; returns the seconds it took.
pub fn syncfs(path: &Path) -> io::Result<f64> {
    let f = fs::File::open(path)?;
    let t = Instant::now();
    use std::os::fd::AsRawFd;
    // SAFETY: a valid open fd.
    if unsafe { libc::syncfs(f.as_raw_fd()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(t.elapsed().as_secs_f64())
}
