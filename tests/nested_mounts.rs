//! Mounts inside a volume, and what only looks like one. A nested mount (a tmpfs, a bind mount of
//! a directory or of a file) hides what lies under its name on the volume's own filesystem; once
//! it is unmounted, that shows again, and no claim of a run that met the mount (a resume record,
//! a shard's claim, the `done` marker) may pass over it. A btrfs subvolume and an overlayfs
//! volume whose layers lie on different filesystems give entries device numbers of their own on
//! the same mount: they are walked and prepared like the rest, as the kubelet's walk does.

mod common;

use std::path::{Path, PathBuf};

use common::mounts::{sh, try_sh};
use common::snap::conforms;
use common::xattr::{CHECKPOINT, MARKER, xattr_json};
use common::*;

const GID: u32 = 2000;

/// Entries of `vol` (nested mounts and subvolumes entered) that do not conform to
/// `--fs-group 2000`.
fn wrong(vol: &Path) -> Vec<String> {
    snapshot_with(vol, Mounts::Enter)
        .iter()
        .filter(|(_, m)| !conforms(m, GID, false))
        .map(|(k, m)| format!("{} {}:{} {:04o}", show(k), m.uid, m.gid, m.mode))
        .collect()
}

/// The property: a volume marked `done` passes `check`, and every entry conforms.
#[track_caller]
fn assert_done_and_conforming(vol: &Path, what: &str, last: &Run) {
    let m = xattr_json(vol, MARKER).expect("a marker");
    assert_eq!(m["state"], "done", "{what}: {m}\n{}", last.describe());
    let wrong = wrong(vol);
    let check = run(volprep().args(["check", "--fs-group", "2000"]).arg(vol));
    assert!(
        check.code == 0 && wrong.is_empty(),
        "{what}: marker `done` but check exits {} and {} entries do not conform: {:?}\n{}\n{}",
        check.code,
        wrong.len(),
        &wrong[..wrong.len().min(10)],
        last.describe(),
        check.describe()
    );
}

fn apply(vol: &Path, extra: &[&str]) -> Run {
    let mut cmd = volprep();
    cmd.args(["apply", "--fs-group", "2000", "--threads", "1", "--checkpoint-interval", "0", "--report", "-"]);
    run(cmd.args(extra).arg(vol))
}

fn mkfile(p: &Path) {
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, b"x").unwrap();
}

/// `chattr +i` until dropped: an entry whose chown fails, so that a pass ends with an error
/// and leaves a checkpoint (no kill needed).
struct Immutable(PathBuf);

impl Immutable {
    fn new(p: &Path) -> Immutable {
        sh("chattr", &["+i".as_ref(), p.as_os_str()]);
        Immutable(p.to_path_buf())
    }
}

impl Drop for Immutable {
    fn drop(&mut self) {
        if let Err(e) = try_sh("chattr", &["-i".as_ref(), self.0.as_os_str()]) {
            eprintln!("{e}");
        }
    }
}

/// Under `P`: `M/` (a tmpfs over a directory holding `hidden1` and `hidden_sub/h2`), `B/` (a bind
/// mount of a directory outside the volume over one holding `b1`), `F` (a file outside bound
/// over a file); beside them `other/o1`. Returns the mounts (unmounted when dropped).
fn hidden_under_mounts(vol: &Path, p: &str, outside: &Path) -> Vec<Box<dyn std::any::Any>> {
    let p = vol.join(p);
    mkfile(&p.join("M/hidden1"));
    mkfile(&p.join("M/hidden_sub/h2"));
    mkfile(&p.join("B/b1"));
    mkfile(&p.join("F"));
    mkfile(&p.join("other/o1"));
    mkfile(&outside.join("bdir/x"));
    mkfile(&outside.join("bfile"));
    vec![
        Box::new(Tmpfs::at(&p.join("M"))),
        Box::new(Bind::new(&outside.join("bdir"), &p.join("B"))),
        Box::new(Bind::new(&outside.join("bfile"), &p.join("F"))),
    ]
}

/// A fresh ext4 filesystem, the volume `V` on it (made by what the test puts there) and
/// `outside`, a directory beside the volume for what the bind mounts show.
fn ext4_volume() -> (LoopFs, PathBuf, PathBuf) {
    let fs = LoopFs::new(FsKind::Ext4, 64);
    let (vol, outside) = (fs.path().join("V"), fs.path().join("outside"));
    (fs, vol, outside)
}

/// A pass (`apply` with `extra`) ends with an error (an immutable file elsewhere) after it
/// finished the directory holding the mount points, and leaves a checkpoint; the mounts are
/// unmounted; the resumed run must read what they hid, not verify it on the first run's word.
#[track_caller]
fn resume_reads_what_the_mounts_hid(extra: &[&str], what: &str) {
    privileged(&["mkfs.ext4", "chattr"]);
    let (_fs, vol, outside) = ext4_volume();
    let mounts = hidden_under_mounts(&vol, "P", &outside);
    mkfile(&vol.join("Q/f"));
    let stuck = Immutable::new(&vol.join("Q/f"));
    let first = apply(&vol, extra);
    assert_eq!(first.code, 1, "the immutable file fails\n{}", first.describe());
    assert!(xattr_json(&vol, CHECKPOINT).is_some(), "a checkpoint for the resume\n{}", first.describe());
    drop(stuck);
    drop(mounts);
    let second = apply(&vol, extra).expect_code(0);
    assert_done_and_conforming(&vol, what, &second);
}

/// A pass that failed after it met the mounts of [`hidden_under_mounts`], resumed once they are gone.
#[test]
#[ignore = "needs root and loop devices (mkfs.ext4, chattr)"]
fn resume_reads_what_an_unmounted_nested_mount_hid() {
    resume_reads_what_the_mounts_hid(&[], "resumed after the mounts went away");
}

/// The same with `--cross-devices`: the first run entered the mounts (and fixed what they
/// showed), not what they hid.
#[test]
#[ignore = "needs root and loop devices (mkfs.ext4, chattr)"]
fn resume_with_cross_devices_reads_what_an_unmounted_nested_mount_hid() {
    resume_reads_what_the_mounts_hid(&["--cross-devices"], "resumed (--cross-devices) after the mounts went away");
}

/// A volume marked `done` by a pass that met nested mounts: once one is unmounted, the next
/// start walks (what it hid was never seen) instead of skipping; with the same mounts it skips.
#[test]
#[ignore = "needs root and loop devices (mkfs.ext4)"]
fn a_done_volume_is_walked_again_when_a_nested_mount_goes_away() {
    privileged(&["mkfs.ext4"]);
    let (_fs, vol, outside) = ext4_volume();
    let mut mounts = hidden_under_mounts(&vol, "P", &outside);
    apply(&vol, &[]).expect_code(0);
    let again = apply(&vol, &[]).expect_code(0);
    assert_eq!(again.volume()["action"], "skipped", "the same mounts: skipped\n{}", again.describe());
    // The file bind mount goes first, then the rest.
    mounts.pop();
    let walked = apply(&vol, &[]).expect_code(0);
    assert_eq!(walked.volume()["action"], "walked", "{}", walked.describe());
    let f = std::os::unix::fs::MetadataExt::gid(&std::fs::symlink_metadata(vol.join("P/F")).unwrap());
    assert_eq!(f, GID, "the file the bind mount hid is prepared");
    run(volprep().args(["check", "--fs-group", "2000"]).arg(&vol)).expect_code(0);
    drop(mounts);
    let walked = apply(&vol, &[]).expect_code(0);
    assert_eq!(walked.volume()["action"], "walked", "{}", walked.describe());
    assert_done_and_conforming(&vol, "every nested mount gone", &walked);
    let skipped = apply(&vol, &[]).expect_code(0);
    assert_eq!(skipped.volume()["action"], "skipped", "no mounts left: skipped\n{}", skipped.describe());
}

/// The shard variant: a tmpfs over a directory and a file bound over a file in each anchor;
/// shard 0 of 2 runs, every mount goes away, shard 1 completes the volume: the completing run
/// must not verify shard 0's part on a claim made while the mounts hid part of it.
#[test]
#[ignore = "needs root and loop devices (mkfs.ext4)"]
fn shard_completion_reads_what_unmounted_nested_mounts_hid() {
    privileged(&["mkfs.ext4"]);
    let (_fs, vol, outside) = ext4_volume();
    let mut mounts = Vec::new();
    for a in 0..6 {
        mounts.extend(hidden_under_mounts(&vol, &format!("a{a}"), &outside.join(format!("o{a}"))));
    }
    let shard = |i: u32| apply(&vol, &[&format!("--shard={i}/2"), "--shard-depth=1"]);
    shard(0).expect_code(0);
    drop(mounts);
    let last = shard(1).expect_code(0);
    assert_done_and_conforming(&vol, "shard 1/2 completed after the mounts went away", &last);
}

/// A btrfs subvolume inside the volume (any user can create one) is on the volume's mount:
/// walked and prepared like the kubelet does, and `check` does not pass it over.
#[test]
#[ignore = "needs root and loop devices (mkfs.btrfs, btrfs)"]
fn a_btrfs_subvolume_is_walked_and_checked() {
    privileged(&["mkfs.btrfs", "btrfs"]);
    let fs = LoopFs::new(FsKind::Btrfs, 128);
    let vol = fs.path().join("V");
    std::fs::create_dir(&vol).unwrap();
    sh("btrfs", &["subvolume".as_ref(), "create".as_ref(), vol.join("sub").as_os_str()]);
    mkfile(&vol.join("sub/d/f"));
    mkfile(&vol.join("top/g"));
    let check = run(volprep().args(["check", "--fs-group", "2000"]).arg(&vol));
    assert_eq!(check.code, 3, "nothing is prepared yet\n{}", check.describe());
    let r = apply(&vol, &[]).expect_code(0);
    assert!(r.volume()["skipped_mounts"].as_array().is_none_or(|a| a.is_empty()), "{}", r.describe());
    assert_done_and_conforming(&vol, "a subvolume", &r);
    // A snapshot of the prepared subvolume with an unprepared file added: walked again in full
    // on a resume, never verified as a clone of what was finished.
    sh(
        "btrfs",
        &["subvolume".as_ref(), "snapshot".as_ref(), vol.join("sub").as_os_str(), vol.join("snap").as_os_str()],
    );
    mkfile(&vol.join("snap/d/new"));
    let r = apply(&vol, &["--force"]).expect_code(0);
    assert_done_and_conforming(&vol, "a snapshot added", &r);
}

/// An overlayfs volume whose lower layer is a tmpfs and whose upper layer is on ext4: lower
/// files report the lower layer's device. Every entry is prepared (copied up) as the kubelet
/// does, and `check` passes only then.
#[test]
#[ignore = "needs root and loop devices (mkfs.ext4)"]
fn an_overlay_volume_with_layers_on_two_filesystems_is_prepared() {
    privileged(&["mkfs.ext4"]);
    let upper_fs = LoopFs::new(FsKind::Ext4, 64);
    let lower = Tmpfs::new();
    mkfile(&lower.path().join("d/sub/f1"));
    mkfile(&lower.path().join("d/f2"));
    mkfile(&lower.path().join("top"));
    let (upper, work, merged) =
        (upper_fs.path().join("upper"), upper_fs.path().join("work"), upper_fs.path().join("merged"));
    for d in [&upper, &work, &merged] {
        std::fs::create_dir(d).unwrap();
    }
    mkfile(&upper.join("d/u1"));
    let opts = format!("lowerdir={},upperdir={},workdir={}", lower.path().display(), upper.display(), work.display());
    let overlay = Overlay::mount(&opts, &merged);
    let check = run(volprep().args(["check", "--fs-group", "2000"]).arg(overlay.path()));
    assert_eq!(check.code, 3, "nothing is prepared yet\n{}", check.describe());
    let r = apply(overlay.path(), &[]).expect_code(0);
    assert!(r.volume()["skipped_mounts"].as_array().is_none_or(|a| a.is_empty()), "{}", r.describe());
    assert_done_and_conforming(overlay.path(), "an overlay volume", &r);
}
