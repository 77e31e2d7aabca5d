//! A resumed `apply` stays sound when the tree changes between the kill and the rerun: a change
//! inside a subtree the interrupted run had finished (an unvisited directory moved in, two
//! directories exchanged across parents, a file of an unvisited directory hardlinked in) is
//! found and walked, so a `done` marker still means every entry conforms. And `--cross-devices`
//! records of a nested filesystem never skip anything of a clone mounted in its place.

mod common;

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt as _;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};

use common::clones::attach;
use common::kill;
use common::mounts::{sh, try_sh};
use common::xattr::{CHECKPOINT, MARKER, xattr_json};
use common::*;

const GID: u32 = 2000;
const TOPS: usize = 80;
const FILES: usize = 250;

/// `TOPS` directories `dNNN`, each with `sub/` holding `FILES` files, all root:root.
fn build(vol: &Path) -> u64 {
    std::fs::create_dir(vol).unwrap();
    for t in 0..TOPS {
        let sub = vol.join(format!("d{t:03}/sub"));
        std::fs::create_dir_all(&sub).unwrap();
        for f in 0..FILES {
            std::fs::write(sub.join(format!("f{f}")), b"").unwrap();
        }
    }
    (1 + TOPS * (2 + FILES)) as u64
}

/// The top-level directories the checkpoint's record of the root says are finished.
fn finished_tops(vol: &Path) -> Vec<String> {
    let cp = xattr_json(vol, CHECKPOINT).expect("a checkpoint after the kill");
    let root_ino = std::fs::metadata(vol).unwrap().ino().to_string();
    let names: Vec<String> = std::fs::read_dir(vol)
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| e.file_type().unwrap().is_dir())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    let mut out = Vec::new();
    for rec in cp["dirs"].as_array().unwrap() {
        let fields: Vec<&str> = rec.as_str().unwrap().split(':').collect();
        if fields[0].split('/').next() != Some(root_ino.as_str()) {
            continue;
        }
        for span in fields.last().unwrap().split(',').filter(|s| !s.is_empty()) {
            let range = span.split('@').next().unwrap();
            let (a, b) = range.split_once('-').unwrap_or((range, range));
            out.extend(names[a.parse::<usize>().unwrap()..=b.parse::<usize>().unwrap()].iter().cloned());
        }
    }
    out
}

/// A top-level directory the interrupted run did not enter: nothing in it has the group.
fn unvisited_top(vol: &Path, finished: &[String]) -> String {
    let mut names: Vec<String> = std::fs::read_dir(vol)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with('d') && !finished.contains(n))
        .collect();
    names.sort();
    let untouched = |n: &String| {
        let sub = vol.join(n).join("sub");
        std::fs::metadata(&sub).unwrap().gid() != GID
            && std::fs::read_dir(&sub).unwrap().all(|e| e.unwrap().metadata().unwrap().gid() != GID)
    };
    names.into_iter().find(untouched).expect("an unvisited top-level directory after the kill")
}

fn mv(from: &Path, to: &Path) {
    std::fs::rename(from, to).unwrap_or_else(|e| panic!("mv {} {}: {e}", from.display(), to.display()));
}

/// `renameat2(a, b, RENAME_EXCHANGE)` across two directories.
fn exchange(a: &Path, b: &Path) {
    let (ca, cb) = (common::fd::cstr(a.as_os_str().as_bytes()), common::fd::cstr(b.as_os_str().as_bytes()));
    // SAFETY: `ca` and `cb` are valid C strings alive across the call.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_renameat2,
            libc::AT_FDCWD,
            ca.as_ptr(),
            libc::AT_FDCWD,
            cb.as_ptr(),
            libc::RENAME_EXCHANGE,
        )
    };
    assert_eq!(ret, 0, "exchange {} {}: {}", a.display(), b.display(), std::io::Error::last_os_error());
}

/// A change between the kill and the rerun; `s` finished, `u` not entered.
#[derive(Clone, Copy, Debug)]
enum Mutation {
    /// `mv U/sub S/sub/moved`
    MoveIntoFinished,
    /// `renameat2(S/sub, U/sub, RENAME_EXCHANGE)`
    ExchangeAcrossParents,
    /// `mkdir S/new; mv U/sub S/new/`
    MkdirThenMove,
    /// `mv S/sub S/sub.old; mv U/sub S/sub`
    ReplaceByUnvisited,
    /// `ln U/sub/f0 S/sub/linked; rm U/sub/f0`
    HardlinkThenUnlink,
}

fn mutate(m: Mutation, s: &Path, u: &Path) {
    match m {
        Mutation::MoveIntoFinished => mv(&u.join("sub"), &s.join("sub/moved")),
        Mutation::ExchangeAcrossParents => exchange(&s.join("sub"), &u.join("sub")),
        Mutation::MkdirThenMove => {
            std::fs::create_dir(s.join("new")).unwrap();
            mv(&u.join("sub"), &s.join("new/sub"));
        }
        Mutation::ReplaceByUnvisited => {
            mv(&s.join("sub"), &s.join("sub.old"));
            mv(&u.join("sub"), &s.join("sub"));
        }
        Mutation::HardlinkThenUnlink => {
            std::fs::hard_link(u.join("sub/f0"), s.join("sub/linked")).unwrap();
            std::fs::remove_file(u.join("sub/f0")).unwrap();
        }
    }
}

/// Entries of the volume that do not have the group (what `find ! -group 2000` lists).
fn without_group(vol: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![vol.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            let m = e.metadata().unwrap();
            if m.gid() != GID {
                out.push(e.path());
            }
            if m.is_dir() {
                stack.push(e.path());
            }
        }
    }
    out
}

/// Kill a `-j 1` pass at a quarter of its entries (a checkpoint after every finished directory), change
/// the tree with `m`, rerun: the rerun must end `done` with every entry conforming.
fn killed_then_changed(base: &Path, m: Mutation) {
    let vol = base.join("vol");
    let n = build(&vol);
    let args = ["apply", "--fs-group", "2000", "--threads", "1", "--checkpoint-interval", "0"];
    let mut cmd = volprep();
    cmd.args(args).arg(&vol);
    // Early enough that the rest of the pass outlasts a slow reader of its progress lines.
    kill::killed_at(cmd, n / 4);
    let finished = finished_tops(&vol);
    assert!(finished.len() >= 3, "{m:?}: the kill should leave finished subtrees recorded: {finished:?}");
    // The first finished one recorded (not the last, which a kill may catch half-recorded).
    let s = vol.join(&finished[0]);
    let u = vol.join(unvisited_top(&vol, &finished));
    tick();
    mutate(m, &s, &u);

    let r = run(volprep().args(&args[..args.len() - 2]).args(["--report", "-"]).arg(&vol)).expect_code(0);
    let marker = xattr_json(&vol, MARKER).expect("a marker");
    let left = without_group(&vol);
    assert!(
        left.is_empty(),
        "{m:?}: the rerun ended with marker {} yet {} entries lack the group, e.g. {:?}\n{}",
        marker["state"],
        left.len(),
        &left[..left.len().min(5)],
        r.describe()
    );
    assert_eq!(marker["state"], "done", "{m:?}\n{}", r.describe());
    let check = run(volprep().args(["check", "--fs-group", "2000"]).arg(&vol));
    assert_eq!(check.code, 0, "{m:?}: check after a `done` rerun\n{}", check.describe());
    // Only what changed was read again: the finished subtrees not touched were verified.
    assert!(r.count("entries") < n, "{m:?}: the rerun resumed\n{}", r.describe());
}

fn on_ext4(m: Mutation) {
    privileged(&["mkfs.ext4"]);
    let fs = LoopFs::new(FsKind::Ext4, 256);
    killed_then_changed(fs.path(), m);
}

fn on_tmpfs(m: Mutation) {
    privileged(&[]);
    let fs = Tmpfs::new();
    killed_then_changed(fs.path(), m);
}

#[test]
#[ignore = "needs root, loop devices, mkfs.ext4 and --features test-hooks"]
fn move_into_a_finished_subtree_ext4() {
    on_ext4(Mutation::MoveIntoFinished);
}

#[test]
#[ignore = "needs root, loop devices and --features test-hooks"]
fn move_into_a_finished_subtree_tmpfs() {
    on_tmpfs(Mutation::MoveIntoFinished);
}

#[test]
#[ignore = "needs root, loop devices, mkfs.ext4 and --features test-hooks"]
fn exchange_across_parents_ext4() {
    on_ext4(Mutation::ExchangeAcrossParents);
}

#[test]
#[ignore = "needs root, loop devices and --features test-hooks"]
fn exchange_across_parents_tmpfs() {
    on_tmpfs(Mutation::ExchangeAcrossParents);
}

#[test]
#[ignore = "needs root, loop devices, mkfs.ext4 and --features test-hooks"]
fn mkdir_then_move_into_a_finished_subtree_ext4() {
    on_ext4(Mutation::MkdirThenMove);
}

#[test]
#[ignore = "needs root, loop devices and --features test-hooks"]
fn mkdir_then_move_into_a_finished_subtree_tmpfs() {
    on_tmpfs(Mutation::MkdirThenMove);
}

#[test]
#[ignore = "needs root, loop devices, mkfs.ext4 and --features test-hooks"]
fn finished_directory_replaced_by_an_unvisited_one_ext4() {
    on_ext4(Mutation::ReplaceByUnvisited);
}

#[test]
#[ignore = "needs root, loop devices and --features test-hooks"]
fn finished_directory_replaced_by_an_unvisited_one_tmpfs() {
    on_tmpfs(Mutation::ReplaceByUnvisited);
}

#[test]
#[ignore = "needs root, loop devices, mkfs.ext4 and --features test-hooks"]
fn hardlink_into_a_finished_subtree_then_unlink_ext4() {
    on_ext4(Mutation::HardlinkThenUnlink);
}

#[test]
#[ignore = "needs root, loop devices and --features test-hooks"]
fn hardlink_into_a_finished_subtree_then_unlink_tmpfs() {
    on_tmpfs(Mutation::HardlinkThenUnlink);
}

// ---------------------------------------------------------------------------------------------
// Nested filesystems

/// Two loop devices holding clones of one ext4 image, mounted at `vol/a` and `vol/b`.
struct Clones {
    imgs: [PathBuf; 2],
    devs: [String; 2],
    mnts: [PathBuf; 2],
    mounted: bool,
}

impl Clones {
    fn new(dir: &Path, vol: &Path) -> Clones {
        let imgs = [dir.join("a.img"), dir.join("b.img")];
        std::fs::File::create(&imgs[0]).unwrap().set_len(64 << 20).unwrap();
        let mut mkfs: Vec<&OsStr> = ["-q", "-F", "-I", "256", "-b", "4096"].map(OsStr::new).to_vec();
        mkfs.push(imgs[0].as_os_str());
        sh("mkfs.ext4", &mkfs);
        let mnts = [vol.join("a"), vol.join("b")];
        // From here on, Drop detaches and unmounts whatever was set up. Devices are attached
        // with a retry: a parallel test may take the free device `losetup --find` saw.
        let mut c = Clones { imgs, devs: [String::new(), String::new()], mnts, mounted: false };
        c.devs[0] = attach(&c.imgs[0], None);
        // One tree in the image, then the clone: same inodes, ctimes and link counts.
        std::fs::create_dir(&c.mnts[0]).unwrap();
        sh("mount", &[OsStr::new(&c.devs[0]), c.mnts[0].as_os_str()]);
        c.mounted = true;
        for t in 0..40 {
            let sub = c.mnts[0].join(format!("e{t:02}/sub"));
            std::fs::create_dir_all(&sub).unwrap();
            for f in 0..100 {
                std::fs::write(sub.join(format!("g{f}")), b"").unwrap();
            }
        }
        sh("umount", &[c.mnts[0].as_os_str()]);
        c.mounted = false;
        sh("blockdev", &[OsStr::new("--flushbufs"), OsStr::new(&c.devs[0])]);
        sh("cp", &[OsStr::new("--sparse=always"), c.imgs[0].as_os_str(), c.imgs[1].as_os_str()]);
        std::fs::create_dir(&c.mnts[1]).unwrap();
        c.devs[1] = attach(&c.imgs[1], None);
        c.mount();
        c
    }

    fn mount(&mut self) {
        // Set first: if the second mount fails, Drop still unmounts the first.
        self.mounted = true;
        for i in 0..2 {
            sh("mount", &[OsStr::new(&self.devs[i]), self.mnts[i].as_os_str()]);
        }
    }

    fn umount(&mut self) {
        for m in &self.mnts {
            let _ = try_sh("umount", &[m.as_os_str()]);
        }
        self.mounted = false;
    }

    /// Swaps what the two loop devices hold (each mount point keeps its device number): the
    /// tree a mount point shows is now the other clone. The images' contents are swapped in
    /// place (the devices stay attached to the same files) and the devices' caches dropped.
    fn swap_contents(&mut self) {
        self.umount();
        let tmp = self.imgs[0].with_extension("swap");
        let cp = |a: &Path, b: &Path| sh("cp", &[OsStr::new("--sparse=always"), a.as_os_str(), b.as_os_str()]);
        cp(&self.imgs[0], &tmp);
        cp(&self.imgs[1], &self.imgs[0]);
        cp(&tmp, &self.imgs[1]);
        std::fs::remove_file(&tmp).unwrap();
        for d in &self.devs {
            sh("blockdev", &[OsStr::new("--flushbufs"), OsStr::new(d)]);
        }
        self.mount();
    }
}

impl Drop for Clones {
    fn drop(&mut self) {
        if self.mounted {
            self.umount();
        }
        for d in &self.devs {
            if !d.is_empty() {
                let _ = try_sh("losetup", &[OsStr::new("-d"), OsStr::new(d)]);
            }
        }
    }
}

/// Two clones of one ext4 image inside the volume; a `--cross-devices` pass killed midway; the
/// loop devices then hold the clones the other way round (what a remount that hands device
/// numbers out in another order does): the rerun must prepare both, whatever the checkpoint
/// recorded of either.
#[test]
#[ignore = "needs root, loop devices, blockdev, cp, mkfs.ext4 and --features test-hooks"]
fn cross_devices_clones_swapped_after_a_kill() {
    privileged(&["mkfs.ext4", "cp", "blockdev"]);
    let base = tempfile::Builder::new().prefix("volprep-clones-").tempdir().unwrap();
    let vol = base.path().join("vol");
    std::fs::create_dir(&vol).unwrap();
    for t in 0..10 {
        std::fs::create_dir_all(vol.join(format!("top{t}"))).unwrap();
        std::fs::write(vol.join(format!("top{t}/f")), b"").unwrap();
    }
    let mut clones = Clones::new(base.path(), &vol);
    let n = 1 + 10 * 2 + 2 * (1 + 40 * (2 + 100));
    let args = ["apply", "--fs-group", "2000", "--threads", "1", "--checkpoint-interval", "0", "--cross-devices"];
    let mut cmd = volprep();
    cmd.args(args).arg(&vol);
    kill::killed_at(cmd, (n / 2) as u64);
    let half: Vec<usize> = (0..2)
        .filter(|&i| {
            let done = without_group(&clones.mnts[i]).len();
            done > 0 && done < 40 * 102
        })
        .collect();
    clones.swap_contents();
    let r = run(volprep().args(["apply", "--fs-group", "2000", "--cross-devices", "--report", "-"]).arg(&vol))
        .expect_code(0);
    let left = without_group(&vol);
    assert!(
        left.is_empty(),
        "after swapping the clones (half-done: {half:?}), {} entries lack the group, e.g. {:?}\n{}",
        left.len(),
        &left[..left.len().min(5)],
        r.describe()
    );
    let check = run(volprep().args(["check", "--fs-group", "2000", "--cross-devices"]).arg(&vol));
    assert_eq!(check.code, 0, "{}", check.describe());
}
