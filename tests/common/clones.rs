//! Two ext4 filesystems cloned from one image (as CSI clones of one snapshot are: the same
//! inode numbers, ctimes and link counts), loop-mounted inside a volume, and a remount that
//! gives each the other's device number (tests/fuzz.rs, tests/fuzz_regressions.rs).

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::mounts::{sh, try_sh};
use super::tree::Tree;

/// The clones, mounted at `vol/m1` and `vol/m2`; unmounted and detached on drop.
pub struct Clones {
    _dir: tempfile::TempDir,
    imgs: [PathBuf; 2],
    devs: [String; 2],
    pub mnts: [PathBuf; 2],
    mounted: bool,
}

fn os(s: &str) -> &OsStr {
    OsStr::new(s)
}

impl Clones {
    /// Formats one image, builds `inner` in it, copies the image and mounts both.
    pub fn new(vol: &Path, inner: &Tree) -> Clones {
        let dir = tempfile::Builder::new().prefix("volprep-clones-").tempdir().expect("tempdir");
        let imgs = [dir.path().join("a.img"), dir.path().join("b.img")];
        let file = std::fs::File::create(&imgs[0]).unwrap();
        file.set_len(64 << 20).unwrap();
        drop(file);
        let mkfs = ["-q", "-F", "-I", "256", "-N", "4096", "-E", "nodiscard"];
        let mut args: Vec<&OsStr> = mkfs.iter().map(|a| os(a)).collect();
        args.push(imgs[0].as_os_str());
        sh("mkfs.ext4", &args);
        let mnts = [vol.join("m1"), vol.join("m2")];
        for m in &mnts {
            std::fs::create_dir_all(m).unwrap();
        }
        let mut c = Clones { _dir: dir, imgs, devs: [String::new(), String::new()], mnts, mounted: false };
        c.devs[0] = attach(&c.imgs[0], None);
        sh("mount", &[os(&c.devs[0]), c.mnts[0].as_os_str()]);
        c.mounted = true;
        inner.build(&c.mnts[0]);
        sh("umount", &[c.mnts[0].as_os_str()]);
        sh("cp", &[os("--sparse=always"), c.imgs[0].as_os_str(), c.imgs[1].as_os_str()]);
        c.devs[1] = attach(&c.imgs[1], None);
        for i in 0..2 {
            sh("mount", &[os(&c.devs[i]), c.mnts[i].as_os_str()]);
        }
        c
    }

    /// Unmounts both, gives each image the other's loop device and mounts them back at their
    /// places: the same trees, device numbers swapped (a remount after a node restart).
    pub fn remount_swapped(&mut self) -> String {
        for m in &self.mnts {
            sh("umount", &[m.as_os_str()]);
        }
        self.mounted = false;
        for d in &self.devs {
            sh("losetup", &[os("-d"), os(d)]);
        }
        let (d0, d1) = (self.devs[0].clone(), self.devs[1].clone());
        self.devs = [attach(&self.imgs[0], Some(&d1)), attach(&self.imgs[1], Some(&d0))];
        for i in 0..2 {
            sh("mount", &[os(&self.devs[i]), self.mnts[i].as_os_str()]);
        }
        self.mounted = true;
        format!("umount m1 m2; m1 now on {} (was {d0}), m2 on {} (was {d1})", self.devs[0], self.devs[1])
    }
}

impl Drop for Clones {
    fn drop(&mut self) {
        if self.mounted {
            for m in &self.mnts {
                let _ = try_sh("umount", &[m.as_os_str()]);
            }
        }
        for d in self.devs.iter().filter(|d| !d.is_empty()) {
            let _ = try_sh("losetup", &[os("-d"), os(d)]);
        }
    }
}

/// Attaches `img` to the loop device `dev` (any free one if `None`, or if `dev` was taken in
/// the meantime); returns the device. Retried: another test may take the free device found.
pub fn attach(img: &Path, dev: Option<&str>) -> String {
    if let Some(d) = dev {
        if try_sh("losetup", &[os(d), img.as_os_str()]).is_ok() {
            return d.to_string();
        }
    }
    for _ in 0..20 {
        if let Ok(out) = try_sh("losetup", &[os("--find"), os("--show"), img.as_os_str()]) {
            return out.trim().to_string();
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("losetup --find {} failed", img.display())
}
