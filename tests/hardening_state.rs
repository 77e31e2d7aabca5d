//! Issue 17, the state volprep keeps and what it says (items 5-13, 17, 18), on real filesystems
//! with markers, checkpoints and shard records forged the way an app on the volume could:
//! overlapping `--volume`s, `--verify full` and shard lists, `--cross-devices` in the digest,
//! future timestamps, forged crash records, a full filesystem, a setuid bit lost by a kill, a
//! lock held by another process, SIGTERM, and the smaller escapes and parsers.

mod common;

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use common::kill::{KillOnDrop, held_at, wait_within};
use common::mounts::sh;
use common::snap::{self, conforms};
use common::tree::{self, GenOpts};
use common::xattr::{CHECKPOINT, MARKER, dir_record, get_xattr, set_json, xattr_json};
use common::*;
use serde_json::{Value, json};

const GID: u32 = 2000;

// ---------------------------------------------------------------------------------------------
// Helpers

fn ext4() -> LoopFs {
    LoopFs::new(FsKind::Ext4, 64)
}

/// `base/outside` with a canary file: where the trees' outside symlinks point.
fn make_outside(base: &Path) -> PathBuf {
    let out = base.join("outside");
    std::fs::create_dir_all(&out).unwrap();
    std::fs::write(out.join("canary"), b"canary").unwrap();
    out
}

/// `tops` top-level directories `top0`.., each a generated subtree of `per_top` entries, none
/// with setuid/setgid files.
fn wide(outside: &Path, tops: usize, per_top: usize) -> Tree {
    let mut t = Tree::new();
    t.root(0, 0, 0o755);
    let opts = GenOpts { hardlinks: false, special_bits: false };
    for i in 0..tops {
        t.nest(&format!("top{i}"), &tree::generated(17 + i as u64, per_top, outside, opts));
    }
    t
}

/// A volume at `base/name`: a wide tree of 4 × 60 entries that does not conform. Returns the
/// volume and its entry count.
fn volume(base: &Path, name: &str) -> (PathBuf, u64) {
    let outside = make_outside(base);
    let t = wide(&outside, 4, 60);
    let vol = base.join(name);
    t.build(&vol);
    (vol, t.len() as u64)
}

#[track_caller]
fn apply(vol: &Path, args: &[&str]) -> Run {
    pass("apply", &[&["--fs-group", "2000"][..], args].concat(), vol)
}

/// The digest and text of `--fs-group 2000` as `check` reports them.
fn digest_and_spec(vol: &Path) -> (String, String) {
    let r = pass("check", &["--fs-group", "2000"], vol);
    assert!(r.code == 0 || r.code == 3, "{}", r.describe());
    let v = r.volume();
    (v["spec_digest"].as_str().unwrap().to_string(), v["spec"].as_str().unwrap().to_string())
}

/// Entries below `vol` (its own device only) that do not conform to fs-group 2000.
fn nonconforming(vol: &Path) -> Vec<String> {
    snapshot(vol)
        .iter()
        .filter(|(_, m)| !conforms(m, GID, false))
        .map(|(k, m)| format!("{} {:?}", show(k), m.attrs()))
        .collect()
}

#[track_caller]
fn assert_all_conform(vol: &Path, context: &str) {
    let bad = nonconforming(vol);
    assert!(bad.is_empty(), "{context}: {} entries do not conform, e.g. {:?}", bad.len(), &bad[..bad.len().min(10)]);
}

fn now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs()
}

/// An `in-progress` marker of run `run` and, when `checkpoint` is given, its checkpoint.
fn forge_in_progress(vol: &Path, digest: &str, spec: &str, run: &str, checkpoint: Option<Value>) {
    let m = json!({"v": 1, "state": "in-progress", "digest": digest, "spec": spec, "run": run, "started": now() - 60});
    set_json(vol, MARKER, &m);
    if let Some(c) = checkpoint {
        set_json(vol, CHECKPOINT, &c);
    }
}

/// Regroups the whole volume to 0 (nothing conforms), then forges an in-progress marker of run
/// `r1` and its checkpoint recording every top-level subtree of the root finished, claiming
/// from now or, with `ahead`, that many seconds in the future.
fn forge_all_finished(vol: &Path, n: u64, ahead: Option<u64>) {
    snap::chgrp_all(vol, 0);
    let (digest, spec) = digest_and_spec(vol);
    let mut record: Vec<String> = dir_record(vol, n, |_| true).split(':').map(String::from).collect();
    if let Some(secs) = ahead {
        record[4] = format!("{}.000000000", now() + secs);
    }
    let dirs = [record.join(":")];
    let checkpoint = json!({"run": "r1", "digest": digest, "v": 3, "dirs": dirs, "pending": []});
    forge_in_progress(vol, &digest, &spec, "r1", Some(checkpoint));
}

fn reason(r: &Run) -> String {
    r.volume()["reason"].as_str().unwrap_or("").to_string()
}

fn status_text(vol: &Path) -> Run {
    run(volprep().arg("status").arg(vol)).expect_code(0)
}

/// A bind mount made by the test, unmounted on drop.
struct Bind(PathBuf);

impl Bind {
    fn new(from: &Path, to: &Path) -> Bind {
        std::fs::create_dir_all(to).unwrap();
        sh("mount", &[std::ffi::OsStr::new("--bind"), from.as_os_str(), to.as_os_str()]);
        Bind(to.to_path_buf())
    }
}

impl Drop for Bind {
    fn drop(&mut self) {
        let _ = common::mounts::try_sh("umount", &[self.0.as_os_str()]);
    }
}

// ---------------------------------------------------------------------------------------------
// 5. Overlapping volumes

/// A volume inside another with a different spec, the same volume twice with two specs, also
/// reached through a symlink or a bind mount: a usage error (exit 2) naming both, before any
/// change. Nested volumes with one spec, and siblings with different specs, are fine.
#[test]
#[ignore = "needs root, loop devices and mkfs.ext4"]
fn overlapping_volumes_with_different_specs_are_refused_before_any_change() {
    privileged(&["mkfs.ext4"]);
    let fs = ext4();
    let (vol, _) = volume(fs.path(), "data");
    std::os::unix::fs::symlink(&vol, fs.path().join("alias")).unwrap();
    let bind = fs.path().join("bind");
    let _bind = Bind::new(&vol, &bind);
    let s0 = snapshot(&vol);
    let v = |p: &Path, spec: &str| format!("{},{spec}", p.display());
    let inner = vol.join("top1");
    let cases: Vec<(&str, Vec<String>)> = vec![
        ("inner volume, other spec", vec![v(&inner, "fs-group=3000")]),
        ("same volume, other spec", vec![v(&vol, "fs-group=3000")]),
        ("same volume, owner added", vec![v(&vol, "fs-group=2000,owner=1000")]),
        ("inner volume through a symlink", vec![v(&fs.path().join("alias/top1"), "fs-group=3000")]),
        ("inner volume through a bind mount", vec![v(&bind.join("top1"), "fs-group=3000")]),
        ("outer volume of the PATH", vec![v(fs.path(), "fs-group=3000")]),
    ];
    for (what, vols) in &cases {
        for cmd in ["apply", "check"] {
            let mut c = volprep();
            c.args([cmd, "--fs-group", "2000"]).arg(&vol);
            for x in vols {
                c.args(["--volume", x]);
            }
            let r = run(&mut c).expect_code(2);
            let err = r.stderr_lines().join("\n");
            assert!(err.contains("overlap"), "{what}: says why\n{}", r.describe());
            assert!(
                err.contains("fs-group=3000") || err.contains("owner=1000"),
                "{what}: names the specs\n{}",
                r.describe()
            );
            assert_eq!(r.stderr_lines().len(), 1, "{what}: one line\n{}", r.describe());
            assert_same(&s0, &snapshot(&vol), Meta::attrs_ctime, what);
            assert_eq!(get_xattr(&vol, MARKER), None, "{what}: no marker written");
        }
    }
    // From the environment too.
    let r = run(volprep()
        .args(["apply", "--fs-group", "2000"])
        .arg(&vol)
        .env("VOLPREP_VOLUMES", format!("{};{}", v(&inner, "fs-group=3000"), v(&fs.path().join("x"), "fs-group=1"))))
    .expect_code(2);
    assert!(r.stderr.contains("overlap"), "{}", r.describe());
    assert_same(&s0, &snapshot(&vol), Meta::attrs_ctime, "VOLPREP_VOLUMES");

    // The same spec nested: one result, both done. Siblings with their own specs: fine.
    let r = run(volprep()
        .args(["apply", "--fs-group", "2000", "--report", "-"])
        .arg(&vol)
        .args(["--volume", &v(&inner, "fs-group=2000")]))
    .expect_code(0);
    assert_eq!(r.report()["volumes"].as_array().unwrap().len(), 2, "{}", r.describe());
    assert_all_conform(&vol, "nested, one spec");
    let (other, _) = volume(fs.path(), "other");
    run(volprep().args(["apply", "--fs-group", "2000"]).arg(&inner).args(["--volume", &v(&other, "fs-group=3000")]))
        .expect_code(0);
}

// ---------------------------------------------------------------------------------------------
// 6. --verify full and shard lists

/// A forged in-progress marker and checkpoint saying every top-level subtree is finished, over
/// a tree that conforms nowhere: `--verify full` reads and fixes everything.
#[test]
#[ignore = "needs root, loop devices and mkfs.ext4"]
fn verify_full_ignores_a_forged_checkpoint() {
    privileged(&["mkfs.ext4"]);
    let fs = ext4();
    let (vol, n) = volume(fs.path(), "vol");
    apply(&vol, &[]).expect_code(0);
    forge_all_finished(&vol, n, None);
    let r = apply(&vol, &["--verify", "full"]).expect_code(0);
    assert_eq!(r.count("skipped_subtrees"), 0, "nothing skipped on the word of a checkpoint\n{}", r.describe());
    assert_eq!(r.count("entries"), n, "every entry read\n{}", r.describe());
    assert!(reason(&r).contains("--verify full"), "{}", r.describe());
    assert_eq!(r.volume()["marker_after"], "done");
    assert_all_conform(&vol, "--verify full after a forged checkpoint");
    assert_eq!(get_xattr(&vol, CHECKPOINT), None);
}

/// A forged checkpoint whose records claim from a clock after the run's start (a clock stepped
/// back since, or a forgery) skips nothing; the same records claiming from now skip every
/// subtree (the walk trusts a claim only as far as the documented assumptions go).
#[test]
#[ignore = "needs root, loop devices and mkfs.ext4"]
fn a_checkpoint_clock_from_the_future_skips_nothing() {
    privileged(&["mkfs.ext4"]);
    let fs = ext4();
    let (vol, n) = volume(fs.path(), "vol");
    apply(&vol, &[]).expect_code(0);
    forge_all_finished(&vol, n, None);
    let trusted = apply(&vol, &[]).expect_code(0);
    assert!(trusted.count("skipped_subtrees") > 0, "a claim from now is trusted\n{}", trusted.describe());
    forge_all_finished(&vol, n, Some(3600));
    let r = apply(&vol, &[]).expect_code(0);
    assert_eq!(r.count("skipped_subtrees"), 0, "nothing skipped on a claim from the future\n{}", r.describe());
    assert_eq!(r.count("entries"), n, "every entry read\n{}", r.describe());
    assert_all_conform(&vol, "after a checkpoint from the future");
}

fn shard(vol: &Path, i: u32, n: u32, extra: &[&str]) -> Run {
    let s = format!("{i}/{n}");
    pass(
        "apply",
        &[&["--fs-group", "2000", "--shard", &s, "--shard-depth", "1", "--lock-timeout", "5s"][..], extra].concat(),
        vol,
    )
}

fn forge_shards(vol: &Path, digest: &str, spec: &str, shards: Value) {
    let m = json!({"v": 1, "state": "in-progress", "digest": digest, "spec": spec, "run": "r1",
                   "started": now() - 60, "shards": shards});
    set_json(vol, MARKER, &m);
}

/// Forged shard parts maps that do not fit the layout (a digit for a shard past N, a character
/// that is no hex digit) are not trusted at all: no shard finishes the volume for the others, and `done` then means every
/// entry conforms. Under `--verify full` a shard listed as done walks its own part all the same,
/// so once every shard has run, every entry conforms whatever the list said.
#[test]
#[ignore = "needs root, loop devices and mkfs.ext4"]
fn shard_done_lists_are_checked_against_the_layout() {
    privileged(&["mkfs.ext4"]);
    let fs = ext4();
    let (vol, _) = volume(fs.path(), "vol");
    let (digest, spec) = digest_and_spec(&vol);
    let cases: [(&str, Value, &[&str]); 3] = [
        ("a parts map of three shards", json!("111"), &[]),
        ("a parts map of other than hex digits", json!("1z"), &[]),
        ("every shard done, --verify full", json!("11"), &["--verify", "full"]),
    ];
    for (what, done, extra) in cases {
        snap::chgrp_all(&vol, 0);
        forge_shards(&vol, &digest, &spec, json!({"n": 2, "depth": 1, "parts": done, "entries": 0, "running": []}));
        for i in [1, 0] {
            let r = shard(&vol, i, 2, extra);
            assert_eq!(r.code, 0, "{what}: shard {i}\n{}", r.describe());
            assert_eq!(r.volume()["action"], "walked", "{what}: shard {i} walks its part\n{}", r.describe());
            assert!(r.count("entries") > 0, "{what}: shard {i}\n{}", r.describe());
            let state = xattr_json(&vol, MARKER).unwrap()["state"].clone();
            if state == "done" && extra.is_empty() {
                let bad = nonconforming(&vol);
                assert!(
                    bad.is_empty(),
                    "{what}: marked done after shard {i} with {} entries wrong, e.g. {:?}\n{}",
                    bad.len(),
                    &bad[..bad.len().min(5)],
                    r.describe()
                );
            }
        }
        if extra.is_empty() {
            assert_eq!(xattr_json(&vol, MARKER).unwrap()["state"], "done", "{what}: both shards ran");
        }
        assert_all_conform(&vol, what);
    }
}

// ---------------------------------------------------------------------------------------------
// 7. --cross-devices is part of what a pass covers

#[test]
#[ignore = "needs root, loop devices and mkfs.ext4"]
fn cross_devices_added_after_a_done_pass_walks_the_nested_mount() {
    privileged(&["mkfs.ext4"]);
    let fs = ext4();
    let (vol, _) = volume(fs.path(), "vol");
    std::fs::create_dir(vol.join("cache")).unwrap();
    let nested = Tmpfs::at(&vol.join("cache"));
    std::fs::write(nested.path().join("f"), b"x").unwrap();
    std::fs::set_permissions(nested.path().join("f"), std::fs::Permissions::from_mode(0o600)).unwrap();
    let r = apply(&vol, &[]).expect_code(0);
    assert_eq!(r.volume()["skipped_mounts"].as_array().unwrap().len(), 1, "{}", r.describe());
    assert_eq!(std::fs::metadata(nested.path().join("f")).unwrap().gid(), 0);

    let r = apply(&vol, &["--cross-devices"]).expect_code(0);
    assert_eq!(r.volume()["action"], "walked", "--cross-devices covers more: a walk\n{}", r.describe());
    assert!(reason(&r).contains("cross-devices"), "the reason names it\n{}", r.describe());
    let f = std::fs::metadata(nested.path().join("f")).unwrap();
    assert_eq!((f.gid(), f.mode() & 0o7777), (GID, 0o660), "the nested mount is prepared\n{}", r.describe());
    assert_eq!(apply(&vol, &["--cross-devices"]).expect_code(0).volume()["action"], "skipped");
    drop(nested);
}

// ---------------------------------------------------------------------------------------------
// 8. A finish time in the future

#[test]
#[ignore = "needs root, loop devices and mkfs.ext4"]
fn a_marker_finished_in_the_future_is_stale_for_reverify_after() {
    privileged(&["mkfs.ext4"]);
    let fs = ext4();
    let (vol, n) = volume(fs.path(), "vol");
    apply(&vol, &[]).expect_code(0);
    let mut m = xattr_json(&vol, MARKER).unwrap();
    m["finished"] = json!(now() + 10 * 365 * 86400);
    set_json(&vol, MARKER, &m);
    let r = apply(&vol, &["--reverify-after", "1h"]).expect_code(0);
    assert_eq!(r.volume()["action"], "walked", "{}", r.describe());
    assert!(reason(&r).contains("future"), "{}", r.describe());
    assert_eq!(r.count("entries"), n);
    let st = status_text(&vol);
    assert!(!st.stdout.contains("future"), "the rewritten marker is from now\n{}", st.describe());
    assert_eq!(apply(&vol, &["--reverify-after", "1h"]).expect_code(0).volume()["action"], "skipped");
    // `status` says so rather than "0s ago".
    set_json(&vol, MARKER, &m);
    let st = status_text(&vol);
    assert!(st.stdout.contains("in the future"), "{}", st.describe());
}

// ---------------------------------------------------------------------------------------------
// 9. Forged crash records

/// Records pointing outside the volume (`..`, absolute) or that do not even parse are dropped
/// with a warning naming each, not carried into every checkpoint: the pass ends `done`, exit 0,
/// and nothing outside changed.
#[test]
#[ignore = "needs root, loop devices and mkfs.ext4"]
fn forged_pending_records_are_dropped_with_a_warning() {
    privileged(&["mkfs.ext4"]);
    let fs = ext4();
    let (vol, _) = volume(fs.path(), "vol");
    let victim = fs.path().join("outside/victim");
    std::fs::write(&victim, b"x").unwrap();
    std::fs::set_permissions(&victim, std::fs::Permissions::from_mode(0o755)).unwrap();
    let ino = std::fs::metadata(&victim).unwrap().ino();
    let (digest, spec) = digest_and_spec(&vol);
    let pending = json!([["../outside/victim", ino, 0o6775], ["/etc/passwd", 1, 0o4775], ["bad\\q", 1, 0o2775]]);
    forge_in_progress(
        &vol,
        &digest,
        &spec,
        "r1",
        Some(json!({"run": "r1", "digest": digest, "done": [], "pending": pending})),
    );
    let r = apply(&vol, &[]).expect_code(0);
    for rec in ["../outside/victim", "/etc/passwd", "bad\\\\q"] {
        assert!(
            r.stderr.lines().any(|l| l.contains("WARN") && l.contains(rec)),
            "a warning names the record {rec}\n{}",
            r.describe()
        );
    }
    assert_eq!(r.count("errors"), 0, "{}", r.describe());
    assert_eq!(r.volume()["marker_after"], "done", "{}", r.describe());
    assert_eq!(get_xattr(&vol, CHECKPOINT), None, "no record carried on");
    assert_eq!(std::fs::metadata(&victim).unwrap().mode() & 0o7777, 0o755, "outside untouched");
    assert_eq!(apply(&vol, &[]).expect_code(0).volume()["action"], "skipped");
}

// ---------------------------------------------------------------------------------------------
// 10. A heartbeat in the future

#[test]
#[ignore = "needs root, loop devices and mkfs.ext4"]
fn a_shard_heartbeat_in_the_future_is_stale() {
    privileged(&["mkfs.ext4"]);
    let fs = ext4();
    let (vol, _) = volume(fs.path(), "vol");
    let (digest, spec) = digest_and_spec(&vol);
    let running = json!([[0, "deadbeef-7@another-node", now() + 365 * 86400]]);
    forge_shards(&vol, &digest, &spec, json!({"n": 1, "depth": 1, "parts": "0", "entries": 0, "running": running}));
    let r = shard(&vol, 0, 1, &[]);
    assert_eq!(r.code, 0, "a heartbeat from the future does not hold the shard\n{}", r.describe());
    // Taken over at once: a run that trusted the heartbeat would log that it waits for it.
    assert!(!r.stderr.contains("waiting"), "not waited for\n{}", r.describe());
    assert!(
        r.stderr
            .lines()
            .any(|l| l.contains("WARN") && l.contains("deadbeef-7@another-node") && l.contains("taking over")),
        "a warning says the shard is taken over from that run\n{}",
        r.describe()
    );
    assert_eq!(xattr_json(&vol, MARKER).unwrap()["state"], "done");
    assert_all_conform(&vol, "after the takeover");
}

// ---------------------------------------------------------------------------------------------
// 11. A full filesystem

/// Fills the filesystem holding `dir` (as root: the reserved blocks too).
fn fill(dir: &Path) {
    use std::io::Write as _;
    let mut f = std::fs::File::create(dir.join("filler")).unwrap();
    for chunk in [1 << 20, 4096, 512] {
        let buf = vec![0xa5u8; chunk];
        while f.write_all(&buf).is_ok() {}
    }
    let _ = f.sync_all();
}

/// Every entry is fixed but the marker cannot be written (ENOSPC): the volume conforms, so
/// the app may start (exit 0) with a warning; every later start does the same.
#[test]
#[ignore = "needs root, loop devices and mkfs.ext4"]
fn a_conforming_volume_on_a_full_filesystem_is_a_warning() {
    privileged(&["mkfs.ext4"]);
    let fs = ext4();
    let (vol, _) = volume(fs.path(), "vol");
    fill(fs.path());
    for round in 0..2 {
        let r = apply(&vol, &[]);
        assert_eq!(r.code, 0, "round {round}\n{}", r.describe());
        assert_all_conform(&vol, "full filesystem");
        assert!(
            r.stderr.lines().any(|l| l.contains("WARN") && l.contains("marker") && l.contains("ENOSPC")),
            "round {round}: a warning about the marker\n{}",
            r.describe()
        );
        assert_eq!(r.count("errors"), 0, "{}", r.describe());
    }
}

// ---------------------------------------------------------------------------------------------
// 12. A setuid bit lost by a kill

/// The state a kill leaves between the chown and the chmod of a root-owned setuid file: the
/// file has the spec's group and has lost setuid; the checkpoint records it. `apply` refuses to
/// restore setuid on the word of an app-writable record; it and `check` name the real reason and
/// the command that resolves it; after that command both exit 0.
#[test]
#[ignore = "needs root, loop devices and mkfs.ext4"]
fn a_setuid_bit_lost_by_a_kill_is_named_with_its_fix_by_apply_and_check() {
    privileged(&["mkfs.ext4"]);
    let fs = ext4();
    let vol = fs.path().join("vol");
    let mut t = Tree::new();
    t.root(0, GID, 0o2770).dir("bin", 0, GID, 0o2775).file("bin/tool", 0, GID, 0o775).file("bin/other", 0, 0, 0o644);
    t.build(&vol);
    let tool = vol.join("bin/tool");
    let (digest, spec) = digest_and_spec(&vol);
    let ino = std::fs::metadata(&tool).unwrap().ino();
    forge_in_progress(
        &vol,
        &digest,
        &spec,
        "r1",
        Some(json!({"run": "r1", "digest": digest, "done": [], "pending": [["bin/tool", ino, 0o4775]]})),
    );
    for cmd in ["apply", "check"] {
        let r = pass(cmd, &["--fs-group", "2000"], &vol).expect_code(1);
        let v = r.volume();
        assert_eq!(r.count("errors"), 1, "{cmd}\n{}", r.describe());
        let e = &v["error_list"][0];
        assert!(e["path"].as_str().unwrap().ends_with("bin/tool"), "{cmd}\n{}", r.describe());
        assert_ne!(e["op"], "chmod", "{cmd}: no made-up chmod failure\n{}", r.describe());
        let text = e["error"].as_str().unwrap();
        assert!(text.contains("interrupted") && text.contains("setuid"), "{cmd}: the real reason\n{}", r.describe());
        assert!(text.contains(&format!("chmod u+s {}", tool.display())), "{cmd}: the command\n{}", r.describe());
        assert!(r.stderr.contains("chmod u+s"), "{cmd}: logged too\n{}", r.describe());
    }
    assert_eq!(std::fs::metadata(&tool).unwrap().mode() & 0o7777, 0o775, "not restored by volprep");
    std::fs::set_permissions(&tool, std::fs::Permissions::from_mode(0o4775)).unwrap();
    pass("check", &["--fs-group", "2000"], &vol).expect_code(0);
    let r = apply(&vol, &[]).expect_code(0);
    assert_eq!(r.volume()["marker_after"], "done", "{}", r.describe());
    assert_eq!(std::fs::metadata(&tool).unwrap().mode() & 0o7777, 0o4775);
    pass("check", &["--fs-group", "2000"], &vol).expect_code(0);
}

// ---------------------------------------------------------------------------------------------
// 13. Who holds the lock

#[test]
#[ignore = "needs root, loop devices and mkfs.ext4"]
fn a_lock_held_by_another_process_names_it() {
    privileged(&["mkfs.ext4"]);
    let fs = ext4();
    let (vol, _) = volume(fs.path(), "vol");
    let dir = std::fs::File::open(&vol).unwrap();
    // SAFETY: flock on a descriptor this test owns: no pointer involved.
    assert_eq!(unsafe { libc::flock(dir.as_raw_fd(), libc::LOCK_EX) }, 0);
    let r = apply(&vol, &["--lock-timeout", "1s"]).expect_code(1);
    let line = r.stderr_lines().into_iter().find(|l| l.contains("ERROR")).unwrap_or_else(|| panic!("{}", r.describe()));
    assert!(line.contains(&format!("pid {}", std::process::id())), "names the holder\n{}", r.describe());
    assert!(!r.stderr.contains("another volprep"), "does not blame volprep\n{}", r.describe());
    drop(dir);
    apply(&vol, &["--lock-timeout", "1s"]).expect_code(0);
}

// ---------------------------------------------------------------------------------------------
// 17. SIGTERM

/// SIGTERM in the middle of a pass (activeDeadlineSeconds, pod deletion): the walk stops soon,
/// the checkpoint is written, the report and termination message say so, the exit code is 143;
/// the next run resumes and completes.
#[test]
#[ignore = "needs root, loop devices, mkfs.ext4 and --features test-hooks"]
fn sigterm_stops_the_pass_and_leaves_a_checkpoint_report_and_termination_message() {
    privileged(&["mkfs.ext4"]);
    let fs = LoopFs::new(FsKind::Ext4, 512);
    let outside = make_outside(fs.path());
    let t = wide(&outside, 24, 2500);
    let vol = fs.path().join("vol");
    t.build(&vol);
    let n = t.len() as u64;
    let report = fs.path().join("report.json");
    let term = fs.path().join("termination-log");
    let mut cmd = volprep();
    cmd.args(["apply", "--fs-group", "2000", "--threads", "1"])
        .args(["--checkpoint-interval", "0", "--log-format", "text", "--report"])
        .arg(&report)
        .arg("--termination-log")
        .arg(&term)
        .arg(&vol)
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    // Held (SIGSTOP) a quarter of the way through: the SIGTERM sent from here stays pending
    // until the pass is continued, so it always comes in the middle of the walk.
    let (child, held) = held_at(cmd, n / 4);
    // SAFETY: kill takes plain integers: no memory is involved.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTERM) }, 0);
    drop(held);
    let out = wait_within(KillOnDrop(child), Duration::from_secs(60), "volprep apply, SIGTERM at a quarter");
    let (status, log) = (out.status, String::from_utf8_lossy(&out.stderr).into_owned());
    assert_eq!(status.signal(), None, "ended by the signal, not by volprep\n{log}");
    assert_eq!(status.code(), Some(143), "the documented code\n{log}");
    assert!(log.lines().any(|l| l.contains("SIGTERM")), "a log line says why\n{log}");
    let rep: Value = serde_json::from_slice(&std::fs::read(&report).expect("a report")).unwrap();
    let v = &rep["volumes"][0];
    assert_eq!(v["interrupted"], "SIGTERM", "{rep:#}");
    assert_eq!(v["marker_after"], "in-progress", "{rep:#}");
    assert!(v["entries"].as_u64().unwrap() < n, "stopped early: {rep:#}");
    let msg = std::fs::read_to_string(&term).expect("a termination message");
    assert!(msg.contains("SIGTERM"), "{msg}");
    assert_eq!(xattr_json(&vol, MARKER).unwrap()["state"], "in-progress");
    assert!(xattr_json(&vol, CHECKPOINT).is_some(), "the checkpoint is written\n{log}");

    let r = apply(&vol, &[]).expect_code(0);
    assert!(reason(&r).contains("interrupted"), "{}", r.describe());
    assert_eq!(r.volume()["marker_after"], "done");
    assert_all_conform(&vol, "after the resumed pass");
}

// ---------------------------------------------------------------------------------------------
// 18. Smaller ones

/// A newline in a forged marker's run id or spec does not start a line of its own in the text
/// logs or in `status`.
#[test]
#[ignore = "needs root, loop devices and mkfs.ext4"]
fn forged_marker_strings_are_escaped_in_logs_and_status() {
    privileged(&["mkfs.ext4"]);
    let fs = ext4();
    let (vol, _) = volume(fs.path(), "vol");
    let (digest, _) = digest_and_spec(&vol);
    let run_id = "r1\nINJECTED run \u{202e}";
    let spec = "fs-group=2000\nINJECTED spec";
    forge_in_progress(
        &vol,
        &digest,
        spec,
        run_id,
        Some(json!({"run": run_id, "digest": digest, "done": [], "pending": []})),
    );
    let st = status_text(&vol);
    let r = apply(&vol, &["--log-format", "text"]).expect_code(0);
    let st2 = status_text(&vol);
    let (other, _) = volume(fs.path(), "other");
    set_json(
        &other,
        MARKER,
        &json!({"v": 1, "state": "done", "digest": "0000", "spec": spec, "run": run_id, "started": 1}),
    );
    let r2 = apply(&other, &["--log-format", "text"]).expect_code(0);
    // A marker that does not parse: the parser's message quotes the forged text.
    let (third, _) = volume(fs.path(), "third");
    set_json(
        &third,
        MARKER,
        &json!({"v": 1, "state": "x\nINJECTED state", "digest": "0", "spec": "", "run": "", "started": 1}),
    );
    let st3 = status_text(&third);
    let r3 = apply(&third, &["--log-format", "text"]).expect_code(0);
    assert!(!reason(&r3).contains('\n'), "{}", r3.describe());
    for (what, out) in [
        ("status", &st.stdout),
        ("apply", &r.stderr),
        ("status after", &st2.stdout),
        ("apply, spec changed", &r2.stderr),
        ("status, unreadable", &st3.stdout),
        ("apply, unreadable", &r3.stderr),
    ] {
        assert!(!out.lines().any(|l| l.starts_with("INJECTED")), "{what}: a fake line\n{out}");
        assert!(!out.contains('\u{202e}'), "{what}: a raw bidi control\n{out}");
    }
    assert!(st.stdout.contains("r1\\nINJECTED"), "{}", st.describe());
}

/// `status --json | grep -q ...`: the reader is gone before volprep writes; no panic.
#[test]
#[ignore = "needs root, loop devices and mkfs.ext4"]
fn status_into_a_closed_pipe_exits_quietly() {
    privileged(&["mkfs.ext4"]);
    let fs = ext4();
    let (vol, _) = volume(fs.path(), "vol");
    apply(&vol, &[]).expect_code(0);
    for json in [true, false] {
        let mut fds = [0; 2];
        // SAFETY: `fds` has room for the two descriptors pipe2 writes.
        assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
        // SAFETY: both descriptors were just created by pipe2 and are owned by nothing else.
        let (rd, wr) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        drop(rd);
        let mut c = volprep();
        c.arg("status");
        if json {
            c.arg("--json");
        }
        let out = c.arg(&vol).arg(&vol).stdout(Stdio::from(wr)).stderr(Stdio::piped()).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!err.contains("panicked"), "json={json}: {err}");
        assert_eq!(out.status.code(), Some(0), "json={json}: {err}");
    }
}

/// `VOLPREP_FORCE=1`, `=yes`, `=on` (and 0/no/off) as any Kubernetes manifest writes them.
#[test]
#[ignore = "needs root, loop devices and mkfs.ext4"]
fn boolean_env_vars_take_the_usual_words() {
    privileged(&["mkfs.ext4"]);
    let fs = ext4();
    let (vol, _) = volume(fs.path(), "vol");
    apply(&vol, &[]).expect_code(0);
    let with = |var: &str, val: &str, cmd: &str| {
        run(volprep().args([cmd, "--fs-group", "2000", "--report", "-"]).arg(&vol).env(var, val))
    };
    for yes in ["1", "yes", "on", "true", "TRUE", "y"] {
        let r = with("VOLPREP_FORCE", yes, "apply").expect_code(0);
        assert_eq!(reason(&r), "--force", "VOLPREP_FORCE={yes}\n{}", r.describe());
        let r = with("VOLPREP_READ_ONLY", yes, "check");
        assert!(
            r.volume()["spec"].as_str().unwrap().contains("read-only"),
            "VOLPREP_READ_ONLY={yes}\n{}",
            r.describe()
        );
        with("VOLPREP_CROSS_DEVICES", yes, "check").expect_code(0);
    }
    for no in ["0", "no", "off", "false"] {
        let r = with("VOLPREP_FORCE", no, "apply").expect_code(0);
        assert_eq!(r.volume()["action"], "skipped", "VOLPREP_FORCE={no}\n{}", r.describe());
    }
    for bad in ["maybe", "2"] {
        with("VOLPREP_FORCE", bad, "apply").expect_code(2);
    }
    // The same words in --volume's read-only=; anything else is a usage error, not "false".
    let r = run(volprep()
        .args(["check", "--report", "-", "--volume"])
        .arg(format!("{},fs-group=2000,read-only=on", vol.display())));
    assert!(r.volume()["spec"].as_str().unwrap().contains("read-only"), "{}", r.describe());
    run(volprep().args(["check", "--volume"]).arg(format!("{},fs-group=2000,read-only=maybe", vol.display())))
        .expect_code(2);
}

/// `report merge` of counts that do not fit u64 saturates instead of wrapping around.
#[test]
fn report_merge_saturates() {
    let dir = tempfile::tempdir().unwrap();
    let big = u64::MAX - 1;
    let a = json!({"version": 1, "volumes": [{"path": "/v", "action": "walked", "entries": big, "changed_owner": big, "dirs": 3}]});
    let b = json!({"version": 1, "volumes": [{"path": "/v", "action": "walked", "entries": 5, "changed_owner": 5, "dirs": 4}]});
    std::fs::write(dir.path().join("a.json"), a.to_string()).unwrap();
    std::fs::write(dir.path().join("b.json"), b.to_string()).unwrap();
    let r = run(volprep()
        .args(["report", "merge", "--json"])
        .arg(dir.path().join("a.json"))
        .arg(dir.path().join("b.json")));
    let v = r.volume();
    assert_eq!(v["entries"].as_u64(), Some(u64::MAX), "{}", r.describe());
    assert_eq!(v["changed_owner"].as_u64(), Some(u64::MAX), "{}", r.describe());
    assert_eq!(v["dirs"].as_u64(), Some(7), "{}", r.describe());
}

/// A right-to-left override (or any bidi control) in a name is escaped wherever it is printed.
#[test]
#[ignore = "needs root, loop devices and mkfs.ext4"]
fn bidi_controls_in_names_are_escaped() {
    privileged(&["mkfs.ext4"]);
    let fs = ext4();
    let vol = fs.path().join("vol");
    let mut t = Tree::new();
    t.root(0, 0, 0o755)
        .dir("a\u{2066}dir\u{2069}", 0, 0, 0o700)
        .file("a\u{2066}dir\u{2069}/invoice\u{202e}fdp.exe", 0, 0, 0o600)
        .file("mark\u{200f}", 0, 0, 0o600);
    t.build(&vol);
    let r = pass("check", &["--fs-group", "2000", "--log-level", "debug", "--log-format", "text"], &vol).expect_code(3);
    let i = run(volprep().args(["inspect", "--fs-group", "2000"]).arg(&vol)).expect_code(0);
    for (what, out) in [("check", &r.stderr), ("inspect", &i.stdout)] {
        for c in ['\u{202e}', '\u{2066}', '\u{2069}', '\u{200f}'] {
            assert!(!out.contains(c), "{what}: raw U+{:04X}\n{out}", c as u32);
        }
    }
    assert!(r.stderr.contains("invoice\\u{202e}fdp.exe"), "{}", r.describe());
}
