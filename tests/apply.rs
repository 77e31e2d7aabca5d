//! `apply` and `check` against real filesystems (ext4, xfs, btrfs loop images; tmpfs): the
//! result equals the kubelet's fsGroup pass, serial and parallel agree, conforming entries are
//! not touched (ctime), `check` changes nothing, the report's counts are the truth, nested
//! mounts are skipped unless `--cross-devices`, and the env vars work like the flags.

mod common;

use std::collections::BTreeSet;
use std::path::Path;

use common::snap::{self, ROOT, chgrp_all, conforms, kubelet_reference, kubelet_target};
use common::tree::{self, GenOpts};
use common::*;

const GID: u32 = 2000;

/// Entries of the generated part of the big trees (the zoo adds ~60 more).
const BIG: usize = 10_000;

/// Makes `base/outside` (what the trees' outside symlinks point to) with a canary file.
fn make_outside(base: &Path) -> std::path::PathBuf {
    let out = base.join("outside");
    std::fs::create_dir_all(&out).unwrap();
    std::fs::write(out.join("canary-file"), b"canary").unwrap();
    out
}

/// The zoo of special cases plus `n` generated entries.
fn big_tree(outside: &Path, seed: u64, n: usize, opts: GenOpts) -> Tree {
    let mut t = Tree::new();
    t.root(0, 0, 0o755);
    t.nest("zoo", &tree::zoo(outside));
    t.nest("gen", &tree::generated(seed, n, outside, opts));
    t
}

/// Builds the same tree twice below `base`, runs the kubelet reference on one and
/// `volprep apply --fs-group 2000 EXTRA` on the other, and compares (type, uid, gid, mode).
fn equivalence(base: &Path, read_only: bool, extra: &[&str]) {
    let outside = make_outside(base);
    let t = big_tree(&outside, 7, BIG, GenOpts::default());
    let (want, got) = (base.join("reference"), base.join("volprep"));
    t.build(&want);
    t.build(&got);
    let before = snapshot(&got);
    assert_eq!(before.len(), t.len(), "snapshot sees every built entry");
    assert!(before.keys().any(|k| k.len() > 4096), "the tree holds a path longer than PATH_MAX");
    let outside_before = snapshot(&outside);

    kubelet_reference(&want, GID, read_only, Mounts::Skip);
    let mut args = extra.to_vec();
    if read_only {
        args.push("--read-only");
    }
    let run = apply_fs_group(&got, GID, &args);

    assert_same(&snapshot(&want), &snapshot(&got), Meta::attrs, "kubelet reference vs volprep apply");
    assert_same(&outside_before, &snapshot(&outside), Meta::attrs_ctime, "outside the volume");
    let vol = run.volume();
    assert_eq!(vol["action"], "walked", "{}", run.describe());
    assert_eq!(run.count("entries"), t.len() as u64, "entries counts every entry, root included\n{}", run.describe());
    assert_eq!(run.count("errors"), 0, "{}", run.describe());
    assert!(run.count("changed_owner") > 0 && run.count("changed_mode") > 0, "{}", run.describe());
}

#[test]
#[ignore = "needs root, loop devices and mkfs.ext4"]
fn apply_equals_kubelet_on_ext4() {
    privileged(&["mkfs.ext4"]);
    let fs = LoopFs::new(FsKind::Ext4, 256);
    equivalence(fs.path(), false, &[]);
}

/// mke2fs gives images under 512 MiB 1 KiB blocks: small PVCs look like this (and an xattr
/// holds at most ~1 KiB there).
#[test]
#[ignore = "needs root, loop devices and mkfs.ext4"]
fn apply_equals_kubelet_on_ext4_with_1k_blocks() {
    privileged(&["mkfs.ext4"]);
    let fs = LoopFs::with_mkfs_args(FsKind::Ext4, 256, &["-b", "1024"]);
    equivalence(fs.path(), false, &[]);
}

/// Setuid/setgid files need a chmod after their chown (which clears the bits). One of them
/// below a path longer than PATH_MAX must be fixed like the others, and must not keep the
/// others from being fixed (ext4: an xattr holds at most one block).
#[test]
#[ignore = "needs root, loop devices and mkfs.ext4"]
fn setuid_files_below_a_long_path_on_ext4() {
    privileged(&["mkfs.ext4"]);
    let fs = LoopFs::new(FsKind::Ext4, 128);
    let mut t = Tree::new();
    t.root(0, 0, 0o755);
    for i in 0..20 {
        t.file(format!("s{i}"), 1000, 1000, 0o4755).file(format!("g{i}"), 1000, 1000, 0o2755);
    }
    for d in ["a", "b", "c", "d", "e"] {
        t.dir(d, 0, 0, 0o755);
        for i in 0..10 {
            t.file(format!("{d}/s{i}"), 1000, 1000, 0o4755);
        }
    }
    let long = tree::long_path();
    t.file(format!("{long}/setuid"), 1000, 1000, 0o4755);
    t.file(format!("{long}/setgid"), 1000, 1000, 0o2755);
    let want = fs.path().join("reference");
    t.build(&want);
    kubelet_reference(&want, GID, false, Mounts::Skip);
    let mut failures = Vec::new();
    for threads in ["1", "8"] {
        let got = fs.path().join(format!("threads-{threads}"));
        t.build(&got);
        let run = pass("apply", &["--fs-group", "2000", "--threads", threads], &got);
        let diff = snap::diff(&snapshot(&want), &snapshot(&got), Meta::attrs);
        if run.code != 0 || !diff.is_empty() {
            failures.push(format!(
                "--threads {threads}: exit code {}, {} entries differ from the reference (left):\n  {}",
                run.code,
                diff.len(),
                diff.iter().take(30).cloned().collect::<Vec<_>>().join("\n  ")
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
#[ignore = "needs root, loop devices and mkfs.xfs (apt-get install xfsprogs)"]
fn apply_equals_kubelet_on_xfs() {
    privileged(&["mkfs.xfs"]);
    let fs = LoopFs::new(FsKind::Xfs, 300);
    equivalence(fs.path(), false, &[]);
}

#[test]
#[ignore = "needs root, loop devices and mkfs.btrfs (apt-get install btrfs-progs)"]
fn apply_equals_kubelet_on_btrfs() {
    privileged(&["mkfs.btrfs"]);
    let fs = LoopFs::new(FsKind::Btrfs, 256);
    equivalence(fs.path(), false, &[]);
}

#[test]
#[ignore = "needs root and loop devices"]
fn apply_equals_kubelet_on_tmpfs() {
    privileged(&[]);
    let fs = Tmpfs::new();
    equivalence(fs.path(), false, &[]);
}

#[test]
#[ignore = "needs root and loop devices"]
fn read_only_equals_kubelet_read_only() {
    privileged(&[]);
    let fs = Tmpfs::new();
    equivalence(fs.path(), true, &[]);
}

/// The harness itself: the reference pass gives every entry the kubelet formula's target, and
/// snapshots see long paths, non-UTF-8 names and every file type.
#[test]
#[ignore = "needs root and loop devices"]
fn reference_follows_the_kubelet_formula() {
    privileged(&[]);
    let fs = Tmpfs::new();
    let outside = make_outside(fs.path());
    let vol = fs.path().join("vol");
    big_tree(&outside, 3, 2_000, GenOpts::default()).build(&vol);
    let before = snapshot(&vol);
    let kinds: BTreeSet<Kind> = before.values().map(|m| m.kind).collect();
    for k in [Kind::Dir, Kind::File, Kind::Symlink, Kind::Fifo, Kind::Socket, Kind::CharDev, Kind::BlockDev] {
        assert!(kinds.contains(&k), "tree lacks a {k:?}");
    }
    assert!(before.contains_key(&b"zoo/caf\xe9/\xff\xfe"[..]), "non-UTF-8 names are kept as bytes");
    assert!(before.keys().any(|k| k.len() > 4096 && k.ends_with(b"deep-file")));
    assert_eq!(before[&b"zoo/special/setuid"[..]].mode, 0o4755, "builder sets special bits after chown");
    assert!(before.values().any(|m| !conforms(m, GID, false)) && before.values().any(|m| conforms(m, GID, false)));

    kubelet_reference(&vol, GID, false, Mounts::Skip);
    let after = snapshot(&vol);
    assert_eq!(before.keys().collect::<Vec<_>>(), after.keys().collect::<Vec<_>>());
    for (k, b) in &before {
        let a = &after[k];
        assert_eq!((a.uid, a.gid, a.mode), kubelet_target(b, GID, false), "{}", show(k));
    }
    assert_eq!(after[&b"zoo/special/setuid"[..]].mode, 0o4775, "setuid survives the chown");
    assert_eq!(after[&b"zoo/special/sticky-dir"[..]].mode, 0o3777);
    assert_eq!(after[&b"zoo/links/dangling"[..]].gid, GID, "a symlink's own group changes");
    assert_eq!(after[ROOT].mode, 0o2775);
}

#[test]
#[ignore = "needs root, loop devices and mkfs.ext4"]
fn one_thread_and_eight_threads_agree() {
    privileged(&["mkfs.ext4"]);
    let fs = LoopFs::new(FsKind::Ext4, 256);
    let outside = make_outside(fs.path());
    let t = big_tree(&outside, 11, BIG, GenOpts::default());
    let (serial, parallel, reference) = (fs.path().join("t1"), fs.path().join("t8"), fs.path().join("ref"));
    for root in [&serial, &parallel, &reference] {
        t.build(root);
    }
    let r1 = apply_fs_group(&serial, GID, &["--threads", "1"]);
    let r8 = apply_fs_group(&parallel, GID, &["--threads", "8"]);
    kubelet_reference(&reference, GID, false, Mounts::Skip);
    let (s1, s8) = (snapshot(&serial), snapshot(&parallel));
    assert_same(&s1, &s8, Meta::attrs, "--threads 1 vs --threads 8");
    assert_same(&snapshot(&reference), &s1, Meta::attrs, "kubelet reference vs --threads 1");
    assert_eq!(r1.count("entries"), r8.count("entries"));
    assert_eq!(r1.count("entries"), t.len() as u64);
    assert_eq!(r1.volume()["threads"], 1, "{}", r1.describe());
    assert_eq!(r8.volume()["threads"], 8, "{}", r8.describe());
}

/// ctime is the witness of a syscall: entries that conform are not touched, a second apply
/// touches nothing, and `check` never touches anything.
fn ctime_and_check(base: &Path) {
    let outside = make_outside(base);
    let vol = base.join("vol");
    big_tree(&outside, 5, BIG, GenOpts::default()).build(&vol);
    tick();
    let s0 = snapshot(&vol);
    let conforming: Vec<&Vec<u8>> = s0.iter().filter(|(_, m)| conforms(m, GID, false)).map(|(k, _)| k).collect();
    assert!(conforming.len() > 500, "the tree conforms in part ({} entries)", conforming.len());

    let check = pass("check", &["--fs-group", "2000"], &vol);
    let check = check.expect_code(3);
    assert_eq!(check.volume()["action"], "checked", "{}", check.describe());
    assert!(check.count("changed_owner") > 0 && check.count("changed_mode") > 0, "{}", check.describe());
    assert_same(&s0, &snapshot(&vol), Meta::attrs_ctime, "check changed something");

    let first = apply_fs_group(&vol, GID, &[]);
    let s1 = snapshot(&vol);
    for k in &conforming {
        assert_eq!(s0[*k].ctime, s1[*k].ctime, "conforming entry {} was touched by apply", show(k));
    }
    assert!(first.count("changed_owner") > 0);
    assert!(s1.values().all(|m| conforms(m, GID, false)), "apply made everything conform");

    // Again: whether volprep skips the walk (its marker) or walks, nothing is touched.
    tick();
    let second = apply_fs_group(&vol, GID, &[]);
    assert_same(&s1, &snapshot(&vol), Meta::attrs_ctime, "second apply touched entries");
    assert_eq!((second.count("changed_owner"), second.count("changed_mode")), (0, 0), "{}", second.describe());

    // A full walk over a conforming tree: every entry visited, none chowned or chmodded. The
    // root's ctime may move: volprep rewrites its marker xattr there after a walk.
    tick();
    let full = apply_fs_group(&vol, GID, &["--verify", "full"]);
    let s2 = snapshot(&vol);
    assert_eq!(s1[ROOT].attrs(), s2[ROOT].attrs(), "the root's owner and mode stay");
    let but_root =
        |s: &Snapshot| s.iter().filter(|(k, _)| k.as_slice() != ROOT).map(|(k, m)| (k.clone(), *m)).collect();
    let (s1_, s2_): (Snapshot, Snapshot) = (but_root(&s1), but_root(&s2));
    assert_same(&s1_, &s2_, Meta::attrs_ctime, "apply --verify full on a conforming tree touched entries");
    assert_eq!((full.count("changed_owner"), full.count("changed_mode")), (0, 0), "{}", full.describe());
    assert_eq!(full.count("entries"), s1.len() as u64, "{}", full.describe());

    for extra in [&[][..], &["--verify", "full"][..]] {
        let args = [&["--fs-group", "2000"][..], extra].concat();
        let after = pass("check", &args, &vol).expect_code(0);
        assert_eq!((after.count("changed_owner"), after.count("changed_mode")), (0, 0), "{}", after.describe());
        assert_same(&s2, &snapshot(&vol), Meta::attrs_ctime, "check after apply changed something");
    }
}

#[test]
#[ignore = "needs root, loop devices and mkfs.ext4"]
fn conforming_entries_keep_their_ctime_on_ext4() {
    privileged(&["mkfs.ext4"]);
    let fs = LoopFs::new(FsKind::Ext4, 256);
    ctime_and_check(fs.path());
}

#[test]
#[ignore = "needs root and loop devices"]
fn conforming_entries_keep_their_ctime_on_tmpfs() {
    privileged(&[]);
    let fs = Tmpfs::new();
    ctime_and_check(fs.path());
}

/// Per-name and per-inode counts of what changed between two snapshots.
struct Truth {
    owner_names: u64,
    owner_inodes: u64,
    mode_names: u64,
    mode_inodes: u64,
    /// Non-directories whose chown clears setuid/setgid although the final mode is the old one:
    /// volprep must chmod them back (a chmod it may count) without a visible mode change.
    restored_bits: u64,
}

fn truth(before: &Snapshot, after: &Snapshot) -> Truth {
    let mut t = Truth { owner_names: 0, owner_inodes: 0, mode_names: 0, mode_inodes: 0, restored_bits: 0 };
    let (mut owner_ino, mut mode_ino) = (BTreeSet::new(), BTreeSet::new());
    for (k, b) in before {
        let a = &after[k];
        if (a.uid, a.gid) != (b.uid, b.gid) {
            t.owner_names += 1;
            owner_ino.insert(b.ino);
            let kills = b.mode & libc::S_ISUID != 0 || b.mode & (libc::S_ISGID | 0o010) == libc::S_ISGID | 0o010;
            if a.mode == b.mode && b.kind != Kind::Dir && b.kind != Kind::Symlink && kills {
                t.restored_bits += 1;
            }
        }
        if a.mode != b.mode {
            t.mode_names += 1;
            mode_ino.insert(b.ino);
        }
    }
    t.owner_inodes = owner_ino.len() as u64;
    t.mode_inodes = mode_ino.len() as u64;
    t
}

/// Without hardlinks and special bits, every changed entry is one name and one chown/chmod:
/// the report's counts (and `check`'s would-change counts) equal the truth exactly.
#[test]
#[ignore = "needs root and loop devices"]
fn report_counts_equal_the_truth() {
    privileged(&[]);
    let fs = Tmpfs::new();
    let outside = make_outside(fs.path());
    let vol = fs.path().join("vol");
    tree::generated(13, BIG, &outside, GenOpts { hardlinks: false, special_bits: false }).build(&vol);
    let before = snapshot(&vol);
    let check = pass("check", &["--fs-group", "2000"], &vol).expect_code(3);
    let run = apply_fs_group(&vol, GID, &[]);
    let after = snapshot(&vol);
    let t = truth(&before, &after);
    assert!(t.owner_names > 1000 && t.mode_names > 1000 && t.owner_names < before.len() as u64, "a mixed tree");
    assert_eq!(t.restored_bits, 0);
    assert_eq!(run.count("entries"), before.len() as u64, "{}", run.describe());
    assert_eq!(run.count("changed_owner"), t.owner_names, "changed_owner\n{}", run.describe());
    assert_eq!(run.count("changed_mode"), t.mode_names, "changed_mode\n{}", run.describe());
    assert_eq!(run.count("errors"), 0);
    assert_eq!(check.count("entries"), before.len() as u64, "{}", check.describe());
    assert_eq!(check.count("changed_owner"), t.owner_names, "check's would-change owner count\n{}", check.describe());
    assert_eq!(check.count("changed_mode"), t.mode_names, "check's would-change mode count\n{}", check.describe());
}

/// Setuid/setgid files whose bits a chown drops and a chmod puts back need that chmod, but
/// their mode does not change: `changed_mode` counts entries whose final mode differs from their
/// initial one, so with special bits (and no hardlinks) it still equals the truth exactly.
#[test]
#[ignore = "needs root and loop devices"]
fn changed_mode_counts_final_modes_not_chmods() {
    privileged(&[]);
    let fs = Tmpfs::new();
    let outside = make_outside(fs.path());
    let vol = fs.path().join("vol");
    tree::generated(19, BIG, &outside, GenOpts { hardlinks: false, special_bits: true }).build(&vol);
    let before = snapshot(&vol);
    let check = pass("check", &["--fs-group", "2000"], &vol).expect_code(3);
    let run = apply_fs_group(&vol, GID, &[]);
    let t = truth(&before, &snapshot(&vol));
    assert!(t.restored_bits > 50, "the tree has files whose bits are put back: {}", t.restored_bits);
    assert_eq!(run.count("changed_mode"), t.mode_names, "changed_mode\n{}", run.describe());
    assert_eq!(run.count("changed_owner"), t.owner_names, "changed_owner\n{}", run.describe());
    assert_eq!(check.count("changed_mode"), t.mode_names, "check's would-change mode count\n{}", check.describe());
    assert_eq!(run.count("errors"), 0);
}

/// With hardlinks (one inode, several names) and setuid/setgid files (a chmod that restores
/// the mode after the chown), the counts lie between the per-inode and the per-name truth.
#[test]
#[ignore = "needs root and loop devices"]
fn report_counts_bound_the_truth_with_hardlinks_and_special_bits() {
    privileged(&[]);
    let fs = Tmpfs::new();
    let outside = make_outside(fs.path());
    let vol = fs.path().join("vol");
    big_tree(&outside, 17, BIG, GenOpts::default()).build(&vol);
    let before = snapshot(&vol);
    let run = apply_fs_group(&vol, GID, &["--threads", "1"]);
    let t = truth(&before, &snapshot(&vol));
    assert!(t.owner_names > t.owner_inodes && t.restored_bits > 0, "the tree has the hard cases");
    let (owner, mode) = (run.count("changed_owner"), run.count("changed_mode"));
    assert!(
        (t.owner_inodes..=t.owner_names).contains(&owner),
        "changed_owner {owner} not in [{}, {}] (inodes, names)\n{}",
        t.owner_inodes,
        t.owner_names,
        run.describe()
    );
    assert!(
        (t.mode_inodes..=t.mode_names).contains(&mode),
        "changed_mode {mode} not in [{}, {}] (inodes, names)\n{}",
        t.mode_inodes,
        t.mode_names,
        run.describe()
    );
    assert_eq!(run.count("entries"), before.len() as u64);
}

/// A chain of 3,000 directories (each with a file, every 100th level a side directory) under an
/// open-file limit of 64, far below one descriptor per level: the walker closes far ancestors
/// and re-opens them, so it completes with any thread count (64 threads are cut to what the
/// limit carries, with a warning) and leaves exactly the kubelet's result, marker `done`.
#[test]
#[ignore = "needs root and loop devices"]
fn a_3000_deep_chain_completes_under_an_fd_limit_of_64() {
    privileged(&[]);
    let fs = Tmpfs::new();
    let mut t = Tree::new();
    t.root(0, 0, 0o755);
    let mut path = String::from("d");
    for level in 0..3000 {
        if level > 0 {
            path.push_str("/d");
        }
        t.dir(&path, 0, 0, 0o700).file(format!("{path}/f"), 0, 0, 0o640);
        if level % 100 == 0 {
            t.dir(format!("{path}/side"), 0, 0, 0o755).file(format!("{path}/side/g"), 0, 0, 0o600);
        }
    }
    let (vol, want) = (fs.path().join("vol"), fs.path().join("want"));
    t.build(&vol);
    t.build(&want);
    kubelet_reference(&want, GID, false, snap::Mounts::Skip);
    let want = snapshot(&want);
    let n = t.len() as u64;
    for (i, threads) in ["1", "8", "64"].iter().enumerate() {
        if i > 0 {
            chgrp_all(&vol, 0);
        }
        let mut cmd = volprep();
        cmd.args(["apply", "--fs-group", "2000", "--threads", threads, "--report", "-"]).arg(&vol);
        let run = run(limit_fds(&mut cmd, 64)).expect_code(0);
        let v = run.volume();
        assert_eq!(v["marker_after"], "done", "{}", run.describe());
        assert_eq!(run.count("errors"), 0, "{}", run.describe());
        assert_eq!(run.count("entries"), n, "{}", run.describe());
        assert_same(&want, &snapshot(&vol), Meta::attrs, &format!("kubelet vs volprep -j{threads}"));
        if *threads == "64" {
            assert!(run.stderr.contains("open-file limit"), "64 threads are cut, saying so\n{}", run.describe());
            assert!(run.count("threads") < 64, "{}", run.describe());
        }
    }
}

/// A tree with a tmpfs mounted on `nested` (holding entries that need changes).
fn tree_with_nested_mount(base: &Path) -> (std::path::PathBuf, Tmpfs) {
    let vol = base.to_path_buf();
    let mut t = Tree::new();
    t.root(0, 0, 0o755)
        .dir("a", 0, 0, 0o755)
        .file("a/f", 0, 0, 0o644)
        .dir("nested", 0, 0, 0o700)
        .file("z", 0, 0, 0o600);
    t.build(&vol);
    let nested = Tmpfs::at(&vol.join("nested"));
    let mut inner = Tree::new();
    inner.root(0, 0, 0o755).dir("d", 1000, 1000, 0o755).file("d/f", 1000, 1000, 0o644).file("g", 0, 0, 0o600);
    inner.build(nested.path());
    (vol, nested)
}

fn skipped_mounts(run: &Run) -> Vec<String> {
    let v = run.volume();
    let list = v["skipped_mounts"].as_array().unwrap_or_else(|| panic!("no skipped_mounts\n{}", run.describe()));
    list.iter().map(|s| s.as_str().expect("skipped_mounts holds strings").to_string()).collect()
}

#[test]
#[ignore = "needs root and loop devices"]
fn nested_mount_is_skipped_and_reported() {
    privileged(&[]);
    let fs = Tmpfs::new();
    let (want, _m1) = tree_with_nested_mount(&fs.path().join("ref"));
    let (got, _m2) = tree_with_nested_mount(&fs.path().join("vol"));
    let inside_before = snapshot(&got.join("nested"));
    let before = snapshot(&got);
    tick();

    kubelet_reference(&want, GID, false, Mounts::Skip);
    let run = apply_fs_group(&got, GID, &[]);
    assert_same(&snapshot(&want), &snapshot(&got), Meta::attrs, "reference (skipping mounts) vs volprep");
    assert_same(&inside_before, &snapshot(&got.join("nested")), Meta::attrs_ctime, "inside the nested mount");
    let skipped = skipped_mounts(&run);
    let abs = got.join("nested").to_string_lossy().into_owned();
    assert!(
        skipped.len() == 1 && (skipped[0] == abs || skipped[0] == "nested"),
        "skipped_mounts should name {abs}\n{}",
        run.describe()
    );
    assert_eq!(
        run.count("entries"),
        before.len() as u64 - 1,
        "a skipped mount point is not an entry\n{}",
        run.describe()
    );
}

#[test]
#[ignore = "needs root and loop devices"]
fn cross_devices_enters_nested_mount() {
    privileged(&[]);
    let fs = Tmpfs::new();
    let (want, _m1) = tree_with_nested_mount(&fs.path().join("ref"));
    let (got, _m2) = tree_with_nested_mount(&fs.path().join("vol"));
    let before = snapshot_with(&got, Mounts::Enter);

    kubelet_reference(&want, GID, false, Mounts::Enter);
    let run = apply_fs_group(&got, GID, &["--cross-devices"]);
    let after = snapshot_with(&got, Mounts::Enter);
    assert_same(&snapshot_with(&want, Mounts::Enter), &after, Meta::attrs, "reference (entering mounts) vs volprep");
    assert_eq!(after[&b"nested/d/f"[..]].gid, GID, "entries inside the nested mount changed");
    assert_eq!(after[&b"nested"[..]].mode, 0o2775, "the nested mount's root changed");
    assert!(skipped_mounts(&run).is_empty(), "{}", run.describe());
    assert_eq!(run.count("entries"), before.len() as u64, "{}", run.describe());
}

#[test]
#[ignore = "needs root and loop devices"]
fn env_vars_work_like_the_flags() {
    privileged(&[]);
    let fs = Tmpfs::new();
    let outside = make_outside(fs.path());
    let t = big_tree(&outside, 19, 500, GenOpts::default());
    let (flag, env, flag_ro, env_ro) =
        (fs.path().join("flag"), fs.path().join("env"), fs.path().join("flag-ro"), fs.path().join("env-ro"));
    for root in [&flag, &env, &flag_ro, &env_ro] {
        t.build(root);
    }
    apply_fs_group(&flag, GID, &[]);
    run(volprep().arg("apply").arg(&env).env("VOLPREP_FS_GROUP", "2000")).expect_code(0);
    assert_same(&snapshot(&flag), &snapshot(&env), Meta::attrs, "--fs-group 2000 vs VOLPREP_FS_GROUP=2000");
    assert!(snapshot(&env).values().all(|m| m.gid == GID));

    apply_fs_group(&flag_ro, GID, &["--read-only"]);
    run(volprep()
        .args(["apply", "--threads", "1"])
        .arg(&env_ro)
        .env("VOLPREP_FS_GROUP", "2000")
        .env("VOLPREP_READ_ONLY", "true"))
    .expect_code(0);
    let ro = snapshot(&env_ro);
    assert_same(&snapshot(&flag_ro), &ro, Meta::attrs, "--read-only vs VOLPREP_READ_ONLY=true");
    assert_ne!(snapshot(&flag), ro, "read-only differs from read-write");
}

/// `--owner U:G` alone: chown only (symlinks included), modes untouched.
#[test]
#[ignore = "needs root and loop devices"]
fn owner_alone_changes_owner_not_mode() {
    privileged(&[]);
    let fs = Tmpfs::new();
    let outside = make_outside(fs.path());
    let (vol, env) = (fs.path().join("vol"), fs.path().join("env"));
    let t = tree::generated(23, 2_000, &outside, GenOpts { hardlinks: true, special_bits: false });
    t.build(&vol);
    t.build(&env);
    let before = snapshot(&vol);
    pass("apply", &["--owner", "3000:4000"], &vol).expect_code(0);
    let after = snapshot(&vol);
    for (k, b) in &before {
        let a = &after[k];
        assert_eq!((a.uid, a.gid, a.mode), (3000, 4000, b.mode), "{} ({:?})", show(k), b.kind);
    }
    run(volprep().arg("apply").arg(&env).env("VOLPREP_OWNER", "3000:4000")).expect_code(0);
    assert_same(&after, &snapshot(&env), Meta::attrs, "--owner 3000:4000 vs VOLPREP_OWNER=3000:4000");
}

/// `--fs-group G --owner U`: uid U, gid G, and the fsGroup mode policy.
#[test]
#[ignore = "needs root and loop devices"]
fn owner_with_fs_group() {
    privileged(&[]);
    let fs = Tmpfs::new();
    let outside = make_outside(fs.path());
    let vol = fs.path().join("vol");
    big_tree(&outside, 29, 2_000, GenOpts::default()).build(&vol);
    let before = snapshot(&vol);
    pass("apply", &["--fs-group", "2000", "--owner", "3000"], &vol).expect_code(0);
    let after = snapshot(&vol);
    for (k, b) in &before {
        let a = &after[k];
        let (_, gid, mode) = kubelet_target(b, GID, false);
        assert_eq!((a.uid, a.gid, a.mode), (3000, gid, mode), "{} ({:?})", show(k), b.kind);
    }
}
