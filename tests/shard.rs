//! Sharded passes (`--shard I/N`): concurrent shards on one loop-mounted volume end like the
//! kubelet, count every entry exactly once, mark the volume done only after the last shard, and
//! a killed shard is simply run again. Balance on an atlantis-shaped tree.

mod common;

use std::os::unix::fs::MetadataExt as _;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};

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
    c.args(["apply", "--fs-group", "2000", "--progress-interval", "0", "--threads", "2", "--report", "-", "--shard"])
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
fn four_concurrent_shards_prepare_the_volume_once() {
    if !privileged(&["mkfs.ext4"]) {
        return;
    }
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
fn a_killed_shard_is_run_again_and_the_volume_completes() {
    if !privileged(&["mkfs.ext4"]) {
        return;
    }
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
    let gid = unsafe { libc::getegid() };
    let mut counts = Vec::new();
    for i in 0..N {
        let run = run(volprep()
            .args(["apply", "--owner", &format!("{}:{gid}", unsafe { libc::geteuid() }), "--force", "--report", "-"])
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
fn each_shard_resumes_from_its_own_checkpoint() {
    if !privileged(&["mkfs.ext4"]) {
        return;
    }
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
        assert_eq!(cp["v"], 2, "{cp}");
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
