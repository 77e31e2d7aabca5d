//! Sharded passes (`--shard I/N`): concurrent shards on one loop-mounted volume end like the
//! kubelet, count every entry exactly once, mark the volume done only after the last shard, and
//! a killed shard is simply run again. Balance on an atlantis-shaped tree. The run that completes
//! the volume checks the other parts, and stops that check on a storage that does not take
//! ownership changes as a pass does (FUSE filesystems of the test suite).

mod common;

use std::os::unix::fs::MetadataExt as _;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};

use common::fusefs::{self, FuseFs, Owners};
use common::snap::kubelet_reference;
use common::tree::{self, GenOpts};
use common::*;
use common::{kill, xattr};
use serde_json::Value;

const GID: u32 = 2000;
const N: u32 = 4;

/// A wide tree: many top-level directories, each a generated subtree.
fn wide_tree(outside: &Path, tops: usize, per_top: usize) -> Tree {
    let mut t = Tree::new();
    t.root(0, 0, 0o755);
    // No setuid files: a shard killed between a setuid file's chown and chmod loses the bit,
    // which a run with --fs-group alone reports but does not restore (its record is on the
    // app-writable root), and the kill test kills at random.
    let opts = GenOpts { hardlinks: false, special_bits: false };
    for i in 0..tops {
        t.nest(&format!("top{i:03}"), &tree::generated(7 + i as u64, per_top, outside, opts));
    }
    t
}

fn shard_cmd(path: &Path, i: u32, extra: &[&str]) -> std::process::Command {
    let mut c = volprep();
    // Two threads unless `extra` says (clap refuses a flag given twice).
    let threads: &[&str] = if extra.contains(&"--threads") { &[] } else { &["--threads", "2"] };
    c.args(["apply", "--fs-group", "2000", "--progress-interval", "0", "--report", "-"])
        .args(threads)
        .arg("--shard")
        .arg(format!("{i}/{N}"))
        .args(extra)
        .arg(path)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c
}

fn report_of(child: Child) -> (i32, Value, String) {
    let out = child.wait_with_output().expect("wait");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.signal().is_none(), "killed: {stderr}");
    let v: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("report: {e}\n{stderr}"));
    (out.status.code().unwrap_or(-1), v["volumes"][0].clone(), stderr)
}

fn status(path: &Path) -> Value {
    let run = run(volprep().args(["status", "--json"]).arg(path)).expect_code(0);
    serde_json::from_str::<Value>(&run.stdout).expect("status json")[0].clone()
}

#[track_caller]
fn assert_like_kubelet(got: &Path, want: &Path) {
    assert_same(&snapshot(want), &snapshot(got), |m| m.attrs(), "sharded apply vs kubelet reference");
}

fn setup(fs: &LoopFs, tops: usize, per_top: usize) -> (PathBuf, PathBuf, usize) {
    let outside = fs.path().join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    let t = wide_tree(&outside, tops, per_top);
    let (vol, want) = (fs.path().join("vol"), fs.path().join("want"));
    t.build(&vol);
    t.build(&want);
    kubelet_reference(&want, GID, false, Mounts::Skip);
    let total = snapshot(&vol).len();
    (vol, want, total)
}

#[test]
#[ignore = "needs root, loop devices and mkfs.ext4"]
fn four_concurrent_shards_prepare_the_volume_once() {
    privileged(&["mkfs.ext4"]);
    let fs = LoopFs::with_mkfs_args(FsKind::Ext4, 512, &["-N", "200000"]);
    let (vol, want, total) = setup(&fs, 60, 900);
    assert!(total > 50_000, "{total}");
    let children: Vec<Child> = (0..N).map(|i| shard_cmd(&vol, i, &[]).spawn().expect("spawn")).collect();
    let reports: Vec<(i32, Value, String)> = children.into_iter().map(report_of).collect();
    let mut sum = 0;
    let mut done_after = 0;
    for (i, (code, v, stderr)) in reports.iter().enumerate() {
        assert_eq!(*code, 0, "shard {i}: {stderr}");
        assert_eq!(v["shard"], format!("{i}/{N}"));
        assert_eq!(v["errors"], 0, "{stderr}");
        sum += v["entries"].as_u64().unwrap();
        if v["marker_after"] == "done" {
            done_after += 1;
        }
    }
    // Every entry (the root included) fixed by exactly one shard; exactly one finished.
    assert_eq!(sum as usize, total, "per-shard entries must add up to the tree's entries");
    assert_eq!(done_after, 1, "exactly one shard (the last) marks the volume done");
    assert_like_kubelet(&vol, &want);
    let st = status(&vol);
    assert_eq!(st["state"], "done", "{st}");
    assert_eq!(st["marker"]["entries"].as_u64(), Some(total as u64), "{st}");
    // Merged reports: one summary for the volume.
    let dir = tempfile::tempdir().unwrap();
    let files: Vec<PathBuf> = reports
        .iter()
        .enumerate()
        .map(|(i, (_, v, _))| {
            let p = dir.path().join(format!("shard{i}.json"));
            std::fs::write(&p, serde_json::json!({"version": 1, "volumes": [v]}).to_string()).unwrap();
            p
        })
        .collect();
    let merged = run(volprep().args(["report", "merge", "--json"]).args(&files)).expect_code(0);
    assert_eq!(merged.volume()["entries"].as_u64(), Some(total as u64), "{}", merged.describe());
    // A fifth run of any shard skips.
    let (code, v, stderr) = report_of(shard_cmd(&vol, 2, &[]).spawn().unwrap());
    assert_eq!((code, v["action"].as_str()), (0, Some("skipped")), "{stderr}");
    assert_eq!(v["dirs_read"], 0);
}

#[test]
#[ignore = "needs root, loop devices, mkfs.ext4 and --features test-hooks"]
fn a_killed_shard_is_run_again_and_the_volume_completes() {
    privileged(&["mkfs.ext4"]);
    let fs = LoopFs::with_mkfs_args(FsKind::Ext4, 512, &["-N", "200000"]);
    let (vol, want, total) = setup(&fs, 40, 1000);
    // Shards 0..3 run to completion; shard 3 is killed mid-walk (one thread, so it lasts).
    for i in 0..N - 1 {
        let (code, v, stderr) = report_of(shard_cmd(&vol, i, &[]).spawn().unwrap());
        assert_eq!(code, 0, "{stderr}");
        assert_eq!(v["marker_after"], "in-progress", "not done before the last shard\n{stderr}");
    }
    // SIGKILLed by its own test hook after 1,000 of its ~10,000 entries: mid-walk, always.
    kill::killed_at(shard_cmd(&vol, N - 1, &[]), 1000);
    let st = status(&vol);
    assert_eq!(st["state"], "in-progress", "marker must not be done before the killed shard reruns: {st}");
    let done: Vec<u64> =
        st["marker"]["shards"]["done"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).collect();
    assert_eq!(done, vec![0, 1, 2], "{st}");
    // The pod restarts: the same shard runs again. Its stale registration is its own index with
    // another run id: it must not wait for the dead run's heartbeat to go stale forever.
    let (code, v, stderr) = report_of(shard_cmd(&vol, N - 1, &["--lock-timeout", "120s"]).spawn().unwrap());
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(v["marker_after"], "done", "{stderr}");
    assert_like_kubelet(&vol, &want);
    assert_eq!(status(&vol)["state"], "done");
    assert!(total > 40_000);
}

#[test]
fn shards_of_an_atlantis_shaped_tree_are_balanced() {
    // `volprep demo` makes Terraform-automation-like checkouts (.git/objects fan-out).
    let dir = tempfile::tempdir().unwrap();
    let vol = dir.path().join("atlantis");
    run(volprep().args(["demo", "--entries", "40000", "--keep"]).arg(&vol)).expect_code(0);
    // Reset the group so each shard has work, as root; otherwise use the user's own group.
    let gid = rustix::process::getegid().as_raw();
    let uid = rustix::process::geteuid().as_raw();
    // --owner needs root; a non-root run gives its own group.
    let spec =
        if uid == 0 { ["--owner".to_string(), format!("{uid}:{gid}")] } else { ["--fs-group".into(), gid.to_string()] };
    let mut counts = Vec::new();
    for i in 0..N {
        let run = run(volprep()
            .args(["apply", &spec[0], &spec[1], "--force", "--report", "-"])
            .arg("--shard")
            .arg(format!("{i}/{N}"))
            .arg(&vol));
        counts.push(run.count("entries") as f64);
    }
    let mean = counts.iter().sum::<f64>() / counts.len() as f64;
    let max = counts.iter().cloned().fold(0.0, f64::max);
    eprintln!("shard entries on an atlantis-shaped tree: {counts:?}, max/mean = {:.3}", max / mean);
    assert!(mean > 9000.0, "{counts:?}");
    assert!(max <= 1.5 * mean, "largest shard {max} > 1.5 x mean {mean}: {counts:?}");
}

/// Everything under one top-level directory, split at depth 2 between two shards: each shard
/// killed half-way through its part leaves its own checkpoint (`user.volprep.checkpoint.I`),
/// and its rerun skips what it finished and restores a setgid bit from its own special-bit
/// record. The volume ends like the kubelet's.
#[test]
#[ignore = "needs root, loop devices, mkfs.ext4 and --features test-hooks"]
fn each_shard_resumes_from_its_own_checkpoint() {
    privileged(&["mkfs.ext4"]);
    const SHARDS: u32 = 2;
    let fs = LoopFs::with_mkfs_args(FsKind::Ext4, 512, &["-N", "200000"]);
    let outside = fs.path().join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    let mut t = Tree::new();
    t.root(0, 0, 0o755);
    t.nest("repos", &wide_tree(&outside, 80, 500));
    // A setgid tool whose bit a killed chown/chmod would have lost (restored from a record).
    t.file("repos/tool", 0, GID, 0o755);
    let (vol, copy, want) = (fs.path().join("vol"), fs.path().join("copy"), fs.path().join("want"));
    for p in [&vol, &copy, &want] {
        t.build(p);
    }
    kubelet_reference(&want, GID, false, Mounts::Skip);
    std::fs::set_permissions(want.join("repos/tool"), std::os::unix::fs::PermissionsExt::from_mode(0o2775)).unwrap();
    let cmd = |path: &Path, i: u32, extra: &[&str]| {
        let mut c = volprep();
        c.args(["apply", "--fs-group", "2000", "--threads", "2", "--shard-depth", "2", "--checkpoint-interval", "0"])
            .arg(format!("--shard={i}/{SHARDS}"))
            .args(extra)
            .arg(path);
        c
    };
    for i in 0..SHARDS {
        // This shard's share, from a full run of it on a copy.
        let full = run(&mut cmd(&copy, i, &["--report", "-"])).expect_code(0);
        let share = full.count("entries");
        assert!(share > 5_000, "{}", full.describe());
        let log = kill::killed_at(cmd(&vol, i, &[]), share / 2);
        let name = format!("user.volprep.checkpoint.{i}");
        let mut cp =
            xattr::xattr_json(&vol, &name).unwrap_or_else(|| panic!("shard {i}: no checkpoint of its own\n{log}"));
        assert_eq!(cp["v"], 3, "{cp}");
        assert!(!cp["dirs"].as_array().unwrap().is_empty(), "shard {i}: {cp}");
        assert_eq!(xattr::get_xattr(&vol, xattr::CHECKPOINT), None, "no unsharded checkpoint");
        if i == 0 {
            let ino = std::fs::symlink_metadata(vol.join("repos/tool")).unwrap().ino();
            cp["pending"] = serde_json::json!([["repos/tool", ino, 0o2775]]);
            xattr::set_json(&vol, &name, &cp);
        }
        let again = run(&mut cmd(&vol, i, &["--report", "-", "--lock-timeout", "120s"])).expect_code(0);
        let read = again.count("entries");
        assert!(again.count("skipped_subtrees") > 0, "shard {i}\n{}", again.describe());
        assert!(
            read * 4 < share * 3,
            "shard {i}: the rerun reads clearly fewer than its share: {read} of {share}\n{}",
            again.describe()
        );
        eprintln!("shard {i}/{SHARDS}: share {share} entries; killed at {}; the rerun read {read}", share / 2);
        assert_eq!(xattr::get_xattr(&vol, &name), None, "shard {i}: its checkpoint is gone once its part is done");
    }
    assert_eq!(status(&vol)["state"], "done");
    let mode = std::fs::symlink_metadata(vol.join("repos/tool")).unwrap().mode() & 0o7777;
    assert_eq!(mode, 0o2775, "the setgid bit is restored from shard 0's own record");
    assert_like_kubelet(&vol, &want);
}

// ---- The completing run checks what the finished shards claim ----------------------------

/// The shard of N that the anchor path `rel` goes to (FNV-1a 64 modulo N, as `--shard` splits).
fn part_of(rel: &str, n: u32) -> u32 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in rel.as_bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    (h % u64::from(n)) as u32
}

/// `k` names `prefix{i}` whose anchor `parent/name` goes to shard `part` of 2.
fn names_in(part: u32, parent: &str, k: usize) -> Vec<String> {
    (0..1000).map(|i| format!("d{i}")).filter(|n| part_of(&format!("{parent}{n}"), 2) == part).take(k).collect()
}

/// A small volume for two shards split at `depth` (1: anchors under the root; 2: under
/// `top/`): two anchors of shard 0, two of shard 1, each a directory with files and a
/// subdirectory with files, everything root:root. Returns the volume and the anchors' parent
/// prefix ("" or "top/").
fn two_part_volume(fs: &LoopFs, depth: u32) -> (PathBuf, String) {
    let parent = if depth == 1 { String::new() } else { "top/".to_string() };
    let mut t = Tree::new();
    t.root(0, 0, 0o755);
    if depth == 2 {
        t.dir("top", 0, 0, 0o755);
    }
    for part in 0..2 {
        for n in names_in(part, &parent, 3).into_iter().take(2) {
            let a = format!("{parent}{n}");
            t.dir(&a, 0, 0, 0o755);
            t.dir(format!("{a}/sub"), 0, 0, 0o755);
            for f in 0..3 {
                t.file(format!("{a}/f{f}"), 0, 0, 0o644);
                t.file(format!("{a}/sub/g{f}"), 0, 0, 0o600);
            }
        }
    }
    let vol = fs.path().join("vol");
    t.build(&vol);
    (vol, parent)
}

fn two_shards(vol: &Path, i: u32, depth: u32) -> Run {
    run(volprep()
        .args(["apply", "--fs-group", "2000", "--report", "-", "--shard-depth", &depth.to_string(), "--shard"])
        .arg(format!("{i}/2"))
        .arg(vol))
}

#[track_caller]
fn assert_conforms(vol: &Path, what: &str) {
    let c = run(volprep().args(["check", "--fs-group", "2000"]).arg(vol));
    assert_eq!(c.code, 0, "{what}: the volume is marked done but does not conform\n{}", c.describe());
}

/// Between two shard runs, `mutate` changes the tree; the run that completes the volume must
/// leave it conforming whenever it marks it done.
fn done_means_conforming(depth: u32, mutate: impl Fn(&Path, &str)) {
    let fs = LoopFs::new(FsKind::Ext4, 64);
    let (vol, parent) = two_part_volume(&fs, depth);
    two_shards(&vol, 0, depth).expect_code(0);
    tick();
    mutate(&vol, &parent);
    let last = two_shards(&vol, 1, depth).expect_code(0);
    assert_eq!(last.volume()["marker_after"], "done", "{}", last.describe());
    assert_conforms(&vol, &last.describe());
}

#[test]
#[ignore = "needs root, loop devices and mkfs.ext4"]
fn an_unvisited_anchor_renamed_into_a_finished_part_is_prepared() {
    privileged(&["mkfs.ext4"]);
    for depth in [1, 2] {
        done_means_conforming(depth, |vol, parent| {
            let pending = &names_in(1, parent, 1)[0];
            // A name that goes to the finished shard 0 and is not taken.
            let target = &names_in(0, parent, 3)[2];
            std::fs::rename(vol.join(format!("{parent}{pending}")), vol.join(format!("{parent}{target}"))).unwrap();
        });
    }
}

#[test]
#[ignore = "needs root, loop devices and mkfs.ext4"]
fn an_unvisited_subtree_moved_into_a_finished_anchor_is_prepared() {
    privileged(&["mkfs.ext4"]);
    for depth in [1, 2] {
        done_means_conforming(depth, |vol, parent| {
            let (pending, finished) = (&names_in(1, parent, 1)[0], &names_in(0, parent, 1)[0]);
            let from = vol.join(format!("{parent}{pending}/sub"));
            std::fs::rename(from, vol.join(format!("{parent}{finished}/sub/moved"))).unwrap();
        });
    }
}

#[test]
#[ignore = "needs root, loop devices and mkfs.ext4"]
fn changes_inside_a_finished_part_are_prepared() {
    privileged(&["mkfs.ext4"]);
    done_means_conforming(1, |vol, parent| {
        let a = vol.join(format!("{parent}{}", names_in(0, parent, 1)[0]));
        std::fs::write(a.join("sub/new"), b"x").unwrap();
        std::fs::create_dir(a.join("newdir")).unwrap();
        std::fs::write(a.join("newdir/file"), b"x").unwrap();
        // A hard link of a file of the pending part, its first name then gone.
        let b = vol.join(format!("{parent}{}", names_in(1, parent, 1)[0]));
        std::fs::hard_link(b.join("f0"), a.join("sub/linked")).unwrap();
        std::fs::remove_file(b.join("f0")).unwrap();
    });
}

/// The same layout with the verification finding nothing: the completing run walks no more
/// than its own part, and every part is counted once.
#[test]
#[ignore = "needs root, loop devices and mkfs.ext4"]
fn an_unchanged_volume_is_verified_without_walking_other_parts_again() {
    privileged(&["mkfs.ext4"]);
    let fs = LoopFs::new(FsKind::Ext4, 64);
    let (vol, _) = two_part_volume(&fs, 1);
    let first = two_shards(&vol, 0, 1).expect_code(0);
    let last = two_shards(&vol, 1, 1).expect_code(0);
    assert_eq!(last.volume()["marker_after"], "done", "{}", last.describe());
    let total = snapshot(&vol).len() as u64;
    assert_eq!(first.count("entries") + last.count("entries"), total, "{}", last.describe());
    assert_conforms(&vol, &last.describe());
}

#[test]
#[ignore = "needs root, loop devices, mkfs.ext4 and --features test-hooks"]
fn a_shard_overlapped_by_an_unsharded_run_of_the_same_spec_ends_well() {
    privileged(&["mkfs.ext4"]);
    let fs = LoopFs::with_mkfs_args(FsKind::Ext4, 512, &["-N", "200000"]);
    let (vol, want, _) = setup(&fs, 40, 1000);
    // The shard holds itself (SIGSTOP) after 100 entries of its walk: registered, not done.
    let (shard, held) = kill::held_at(shard_cmd(&vol, 0, &["--threads", "1", "--lock-timeout", "120s"]), 100);
    let st = status(&vol);
    assert!(
        st["marker"]["shards"]["running"].as_array().is_some_and(|r| !r.is_empty()),
        "the shard held in its walk is registered: {st}"
    );
    let whole = run(volprep().args(["apply", "--fs-group", "2000", "--lock-timeout", "60s"]).arg(&vol));
    drop(held);
    assert_eq!(whole.code, 0, "{}", whole.describe());
    let (code, v, stderr) = report_of(shard);
    assert_eq!(code, 0, "{stderr}");
    assert!(stderr.contains("completed by another run"), "{stderr}");
    assert!(!stderr.contains("took over"), "{stderr}");
    assert_eq!(v["marker_after"], "done", "{stderr}");
    assert_eq!(status(&vol)["state"], "done");
    assert_like_kubelet(&vol, &want);
}

#[test]
#[ignore = "needs root, loop devices and mkfs.ext4"]
fn a_sharded_run_reverifies_an_old_done_marker_with_reverify_after() {
    privileged(&["mkfs.ext4"]);
    let fs = LoopFs::new(FsKind::Ext4, 64);
    let (vol, _) = two_part_volume(&fs, 1);
    for i in 0..2 {
        two_shards(&vol, i, 1).expect_code(0);
    }
    let mut m = xattr::xattr_json(&vol, xattr::MARKER).expect("marker");
    assert_eq!(m["state"], "done", "{m}");
    let two_hours_ago = m["finished"].as_u64().unwrap() - 7200;
    m["finished"] = two_hours_ago.into();
    xattr::set_json(&vol, xattr::MARKER, &m);
    let fresh = two_shards(&vol, 0, 1).expect_code(0);
    assert_eq!(fresh.volume()["action"], "skipped", "without --reverify-after an old marker skips");
    let again = run(volprep()
        .args(["apply", "--fs-group", "2000", "--report", "-", "--reverify-after", "1h", "--shard", "0/2"])
        .arg(&vol))
    .expect_code(0);
    assert_eq!(again.volume()["action"], "walked", "{}", again.describe());
    assert!(again.volume()["reason"].as_str().unwrap().contains("shard 0/2"), "{}", again.describe());
}

#[test]
#[ignore = "needs root, loop devices and mkfs.ext4"]
fn a_shard_reports_the_marker_state_it_found() {
    privileged(&["mkfs.ext4"]);
    let fs = LoopFs::new(FsKind::Ext4, 64);
    let (vol, _) = two_part_volume(&fs, 1);
    let first = two_shards(&vol, 0, 1).expect_code(0);
    assert_eq!(first.volume()["marker_before"], "none", "{}", first.describe());
    let second = two_shards(&vol, 1, 1).expect_code(0);
    assert_eq!(second.volume()["marker_before"], "in-progress", "{}", second.describe());
}

/// A shard recorded done by an earlier version (no claim) is not trusted: the completing run
/// walks its part again, and fixes there even what no directory's ctime shows.
#[test]
#[ignore = "needs root, loop devices and mkfs.ext4"]
fn a_done_shard_without_a_claim_has_its_part_walked_again() {
    privileged(&["mkfs.ext4"]);
    let fs = LoopFs::new(FsKind::Ext4, 64);
    let (vol, parent) = two_part_volume(&fs, 1);
    two_shards(&vol, 0, 1).expect_code(0);
    let mut m = xattr::xattr_json(&vol, xattr::MARKER).expect("marker");
    assert_eq!(m["shards"]["claims"].as_array().map(Vec::len), Some(1), "shard 0 made a claim: {m}");
    m["shards"].as_object_mut().unwrap().remove("claims");
    xattr::set_json(&vol, xattr::MARKER, &m);
    // A file of the finished part put back to root's group: its directory does not change.
    let file = vol.join(format!("{parent}{}/sub/g0", names_in(0, &parent, 1)[0]));
    std::os::unix::fs::lchown(&file, Some(0), Some(0)).unwrap();
    let last = two_shards(&vol, 1, 1).expect_code(0);
    assert_eq!(last.volume()["marker_after"], "done", "{}", last.describe());
    assert!(last.stderr.contains("without a claim"), "{}", last.describe());
    assert_conforms(&vol, &last.describe());
}

/// The run that completes a sharded volume walks again what changed in the other shards'
/// parts, and on a storage that refuses ownership changes to root (NFS `root_squash`) or ignores
/// them, that walk stops as the shard's own would: after the first changes that did not hold,
/// with the one line that says why, `"ownership"` and exit 6, not a plain failure (nor, when
/// refused, one warning per entry).
#[test]
#[ignore = "needs root and /dev/fuse"]
fn the_check_of_the_other_parts_stops_on_a_storage_that_refuses_or_ignores_ownership_changes() {
    if !fusefs::available() {
        return;
    }
    for (owners, word) in [(Owners::Refuse, "refused"), (Owners::Ignore, "ignored")] {
        let src = tempfile::tempdir().unwrap();
        // Everything conforms: shard 0's own walk has nothing to change.
        let mut t = Tree::new();
        t.root(0, GID, 0o2775);
        let parts = [names_in(0, "", 2), names_in(1, "", 2)];
        for n in parts.iter().flatten() {
            t.dir(n, 0, GID, 0o2775);
            t.file(format!("{n}/f"), 0, GID, 0o664);
        }
        t.build(src.path());
        two_shards(src.path(), 1, 1).expect_code(0);
        tick();
        // Then files of root's group land in shard 1's finished part.
        let landed = src.path().join(&parts[1][0]);
        for i in 0..40 {
            let file = landed.join(format!("new{i}"));
            std::fs::write(&file, b"").unwrap();
            std::os::unix::fs::lchown(&file, Some(0), Some(0)).unwrap();
        }
        let fuse = FuseFs::mount(src.path(), owners);
        let last = run(volprep()
            .args(["apply", "--fs-group", "2000", "--report", "-", "--shard-depth", "1", "--shard", "0/2"])
            .args(["--threads", "2", "--progress-interval", "0", "--log-format", "text"])
            .arg(fuse.path()))
        .expect_code(6);
        let v = last.volume();
        assert_eq!(v["ownership"], word, "{}", last.describe());
        assert!(v["fatal"].as_str().unwrap().starts_with("this filesystem"), "{}", last.describe());
        assert_ne!(v["marker_after"], "done", "{}", last.describe());
        assert!(v["errors"].as_u64().unwrap() < 40, "stopped after the first changes: {}", last.describe());
        let per_entry = last.stderr_lines().into_iter().filter(|l| l.contains(" WARN ")).count();
        assert_eq!(per_entry, 0, "no warning per entry\n{}", last.describe());
        // Shown with --nocapture: what the operator sees.
        println!("{}", last.stderr);
        drop(fuse);
        let m = std::fs::metadata(landed.join("new0")).unwrap();
        assert_eq!((m.gid(), m.mode() & 0o7777), (0, 0o644), "nothing changed");
    }
}

/// `--verify full` trusts no claim: the run that completes the volume reads every other part
/// again whole, and fixes there what drifted without any directory changing (files put back to
/// root's group and a private mode after their shard finished).
#[test]
#[ignore = "needs root, loop devices and mkfs.ext4"]
fn verify_full_on_the_completing_shard_reads_every_part_again() {
    privileged(&["mkfs.ext4"]);
    let fs = LoopFs::new(FsKind::Ext4, 64);
    let vol = fs.path().join("vol");
    let mut t = Tree::new();
    t.root(0, 0, 0o755);
    for a in 0..16 {
        t.dir(format!("a{a}"), 0, 0, 0o755);
        for f in 0..4 {
            t.file(format!("a{a}/f{f}"), 0, 0, 0o644);
        }
    }
    t.build(&vol);
    let shard = |i: u32, extra: &[&str]| {
        run(volprep()
            .args(["apply", "--fs-group", "2000", "--report", "-", "--shard-depth", "1"])
            .args(extra)
            .arg(format!("--shard={i}/{N}"))
            .arg(&vol))
        .expect_code(0)
    };
    for i in 0..N - 1 {
        shard(i, &[]);
    }
    // Drift in the finished parts: the files' group and mode, no directory touched.
    let mut drifted = 0;
    for a in (0..16).map(|a| format!("a{a}")).filter(|a| part_of(a, N) != N - 1) {
        for f in 0..4 {
            let p = vol.join(format!("{a}/f{f}"));
            std::os::unix::fs::lchown(&p, Some(0), Some(0)).unwrap();
            std::fs::set_permissions(&p, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
            drifted += 1;
        }
    }
    assert!(drifted >= 8, "the finished parts hold files: {drifted}");
    let last = shard(N - 1, &["--verify", "full"]);
    assert_eq!(last.volume()["marker_after"], "done", "{}", last.describe());
    assert_conforms(&vol, &format!("{drifted} files drifted in the finished parts\n{}", last.describe()));
    assert!(last.stderr.contains("no claim of the other shards is trusted"), "{}", last.describe());
}

/// Fills the extended attribute space of `path` with small `user.*` attributes, as a group
/// member of an app-writable root can; returns how many it took.
fn fill_xattrs(path: &Path) -> usize {
    use std::os::unix::ffi::OsStrExt as _;
    let p = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
    for i in 0.. {
        let name = std::ffi::CString::new(format!("user.t{i:03}")).unwrap();
        let value = b"1";
        // SAFETY: NUL-terminated path and name, a value of its length.
        let rc = unsafe { libc::setxattr(p.as_ptr(), name.as_ptr(), value.as_ptr().cast(), value.len(), 0) };
        if rc != 0 {
            let e = std::io::Error::last_os_error();
            assert_eq!(e.raw_os_error(), Some(libc::ENOSPC), "setxattr {name:?}: {e}");
            return i;
        }
    }
    unreachable!()
}

/// A root whose attribute space is taken by attributes volprep did not write: no round of
/// shards can be recorded. Each shard says so (how many bytes, which attributes, what to do),
/// walks its part unrecorded and exits 0; once every shard has run, every entry conforms. The
/// unsharded pass names them too.
#[test]
#[ignore = "needs root, loop devices and mkfs.ext4"]
fn a_root_full_of_foreign_attributes_degrades_shards_to_unrecorded_walks() {
    privileged(&["mkfs.ext4"]);
    let fs = LoopFs::new_ext4_blocks(64, "4096");
    let vol = fs.path().join("vol");
    let mut t = Tree::new();
    t.root(0, 0, 0o755);
    for a in 0..8 {
        t.dir(format!("a{a}"), 0, 0, 0o755);
        for f in 0..4 {
            t.file(format!("a{a}/f{f}"), 0, 0, 0o644);
        }
    }
    t.build(&vol);
    let filled = fill_xattrs(&vol);
    assert!(filled > 150, "the root took {filled} attributes");
    for round in 0..2 {
        for i in 0..2 {
            let r = two_shards(&vol, i, 1);
            assert_eq!(r.code, 0, "round {round}, shard {i}/2 of a root full of foreign attributes\n{}", r.describe());
            assert!(
                r.stderr.contains(&format!("{filled} extended attribute(s) that volprep did not write hold"))
                    && r.stderr.contains("setfattr -x"),
                "the shard names what fills the root and what to do\n{}",
                r.describe()
            );
            assert!(!r.stderr.contains("use fewer shards"), "{}", r.describe());
        }
        assert_conforms(&vol, "every shard ran unrecorded");
        assert_ne!(xattr::xattr_json(&vol, xattr::MARKER).map(|m| m["state"].clone()), Some("done".into()));
    }
    let whole = apply_fs_group(&vol, GID, &[]);
    assert!(whole.stderr.contains("that volprep did not write hold"), "{}", whole.describe());
}
