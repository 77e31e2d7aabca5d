//! Issue 4 on real filesystems: the marker xattr and the skip it allows (no directory read), every
//! reason to walk, SIGKILL and resume (finished subtrees at any depth not read again), no `done`
//! while an entry does not conform, the ramfs fallback, the root lock, `status`, and the
//! crash-safe window between a setuid/setgid file's chown and its chmod.

mod common;

use std::collections::BTreeSet;
use std::os::unix::ffi::OsStrExt as _;
use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::kill::{self, field};
use common::mounts::{sh, try_sh};
use common::snap::{self, ROOT, conforms, kubelet_reference};
use common::tree::{self, GenOpts, Node};
use common::xattr::{CHECKPOINT, MARKER, dir_record, get_xattr, set_xattr, xattr_json};
use common::*;
use serde_json::Value;

const GID: u32 = 2000;

// ---------------------------------------------------------------------------------------------
// Helpers

/// An ext4 image with room for `inodes` inodes (the shared default of 100,000 is too few for a
/// 100,000-entry tree, or for two copies of a 50,000-entry one). 4 KiB blocks, like real volumes.
fn ext4(mib: u64, inodes: u32) -> LoopFs {
    let n = inodes.to_string();
    LoopFs::with_mkfs_args(FsKind::Ext4, mib, &["-b", "4096", "-N", &n])
}

/// Makes `base/outside` (what the trees' outside symlinks point to) with a canary file.
fn make_outside(base: &Path) -> PathBuf {
    let out = base.join("outside");
    std::fs::create_dir_all(&out).unwrap();
    std::fs::write(out.join("canary-file"), b"canary").unwrap();
    out
}

fn top_name(i: usize) -> String {
    format!("top{i:03}")
}

/// `tops` top-level directories `top000`.., each a generated subtree of `per_top` entries:
/// resume works at the granularity of top-level subtrees, so a resumable tree is wide.
fn wide_tree(outside: &Path, seed: u64, tops: usize, per_top: usize, opts: GenOpts) -> Tree {
    let mut t = Tree::new();
    t.root(0, 0, 0o755);
    for i in 0..tops {
        t.nest(&top_name(i), &tree::generated(seed + i as u64, per_top, outside, opts));
    }
    t
}

/// Removes setuid from regular files (setgid stays). A kill between a setuid file's chown and
/// its chmod loses a bit that a run with `--fs-group` alone refuses to restore (and reports):
/// trees that are killed at random points must not hold any.
fn without_setuid_files(mut t: Tree) -> Tree {
    for e in &mut t.entries {
        if matches!(e.node, Node::File(_)) {
            e.mode &= !libc::S_ISUID;
        }
    }
    t
}

fn chmod(path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .unwrap_or_else(|e| panic!("chmod {}: {e}", path.display()));
}

fn mode_of(path: &Path) -> u32 {
    std::fs::symlink_metadata(path).unwrap().mode() & 0o7777
}

/// `volprep apply ARGS --report - PATH` (any exit code).
#[track_caller]
fn apply(path: &Path, args: &[&str]) -> Run {
    pass("apply", args, path)
}

/// `volprep status --json PATH`: the one volume's object.
#[track_caller]
fn status_json(path: &Path) -> Value {
    let r = run(volprep().args(["status", "--json"]).arg(path)).expect_code(0);
    let v: Value =
        serde_json::from_str(&r.stdout).unwrap_or_else(|e| panic!("status --json is not JSON: {e}\n{}", r.describe()));
    let arr = v.as_array().unwrap_or_else(|| panic!("status --json: array expected\n{}", r.describe()));
    assert_eq!(arr.len(), 1, "{}", r.describe());
    arr[0].clone()
}

/// The spec's digest and text, as `volprep check SPEC` reports them.
fn spec_of(path: &Path, spec: &[&str]) -> (String, String) {
    let r = pass("check", spec, path);
    assert!(r.code == 0 || r.code == 3, "{}", r.describe());
    let v = r.volume();
    (v["spec_digest"].as_str().unwrap().to_string(), v["spec"].as_str().unwrap().to_string())
}

/// The startup log line (the one with `decision=`).
#[track_caller]
fn startup_line(stderr: &str) -> &str {
    stderr
        .lines()
        .find(|l| l.contains("decision="))
        .unwrap_or_else(|| panic!("no startup line with decision= on stderr:\n{stderr}"))
}

fn reason(r: &Run) -> String {
    r.volume()["reason"].as_str().unwrap_or("").to_string()
}

/// Asserts an `apply` walked, for a reason containing every one of `why`, and that the startup
/// line (stderr) says `decision=walk` (or `resume`) with that reason.
#[track_caller]
fn assert_walked(r: &Run, decision: &str, why: &[&str]) {
    let v = r.volume();
    assert_eq!(v["action"], "walked", "action\n{}", r.describe());
    let line = startup_line(&r.stderr);
    assert_eq!(field(line, "decision"), Some(decision), "decision\n{}", r.describe());
    let reason = reason(r);
    for w in why {
        assert!(reason.contains(w), "report reason {reason:?} should contain {w:?}\n{}", r.describe());
    }
    assert!(
        line.contains(&format!("reason={reason:?}")),
        "the startup line should give the report's reason\n{}",
        r.describe()
    );
    assert!(r.count("dirs_read") > 0, "a walk reads directories\n{}", r.describe());
}

/// Asserts an `apply` skipped without reading anything.
#[track_caller]
fn assert_skipped(r: &Run) {
    let v = r.volume();
    assert_eq!(v["action"], "skipped", "action\n{}", r.describe());
    for f in ["entries", "dirs_read", "changed_owner", "changed_mode", "errors"] {
        assert_eq!(r.count(f), 0, "{f} of a skip\n{}", r.describe());
    }
    assert!(!reason(r).is_empty(), "a skip says why\n{}", r.describe());
    let line = startup_line(&r.stderr);
    assert_eq!(field(line, "decision"), Some("skip"), "{}", r.describe());
}

/// A snapshot without the root (the root's ctime moves when volprep rewrites its marker).
fn below_root(s: &Snapshot) -> Snapshot {
    s.iter().filter(|(k, _)| k.as_slice() != ROOT).map(|(k, m)| (k.clone(), *m)).collect()
}

#[track_caller]
fn assert_all_conform(vol: &Path, context: &str) {
    let bad: Vec<String> = snapshot(vol)
        .iter()
        .filter(|(_, m)| !conforms(m, GID, false))
        .map(|(k, m)| format!("{} {:?}", show(k), m.attrs()))
        .collect();
    assert!(
        bad.is_empty(),
        "{context}: {} entries do not conform, e.g.\n  {}",
        bad.len(),
        bad.iter().take(20).cloned().collect::<Vec<_>>().join("\n  ")
    );
}

/// Entries of the top-level subtree `name` (the directory itself included) in a snapshot.
fn subtree_size(s: &Snapshot, name: &str) -> u64 {
    let pre = format!("{name}/");
    s.keys().filter(|k| k.as_slice() == name.as_bytes() || k.starts_with(pre.as_bytes())).count() as u64
}

/// Runs `volprep apply ARGS PATH` and SIGKILLs it (the binary's test hook) once its pass has
/// counted `at` entries (see [`kill::killed_at`]). Returns its stderr.
fn apply_killed_at(path: &Path, args: &[&str], at: u64) -> String {
    let mut cmd = volprep();
    cmd.arg("apply").args(args).arg(path);
    kill::killed_at(cmd, at)
}

// ---------------------------------------------------------------------------------------------
// 1. The fast path

/// On a 100,000-entry ext4 volume, the first apply walks and leaves a `done` marker; the second
/// reads no directory, changes nothing (not even the root's ctime) and says why.
#[test]
#[ignore = "needs root, loop devices and mkfs.ext4"]
fn second_apply_skips_a_100k_tree_without_reading_it() {
    privileged(&["mkfs.ext4"]);
    let fs = ext4(1024, 250_000);
    let outside = make_outside(fs.path());
    let vol = fs.path().join("vol");
    let t = wide_tree(&outside, 101, 50, 2_000, GenOpts::default());
    assert!(t.len() > 100_000);
    t.build(&vol);

    let first = apply(&vol, &["--fs-group", "2000"]).expect_code(0);
    assert_walked(&first, "walk", &["no marker"]);
    let v = first.volume();
    assert_eq!(v["marker_before"], "none", "{}", first.describe());
    assert_eq!(v["marker_after"], "done", "{}", first.describe());
    assert_eq!(first.count("entries"), t.len() as u64, "{}", first.describe());
    assert!(first.count("dirs_read") > 1000, "{}", first.describe());

    // The marker: compact JSON with the documented keys, for this spec, counting the pass.
    let raw = get_xattr(&vol, MARKER).expect("a marker after a clean pass");
    assert!(!raw.contains(&b'\n') && !raw.contains(&b' '), "compact JSON: {}", String::from_utf8_lossy(&raw));
    let m: Value = serde_json::from_slice(&raw).unwrap();
    let keys: BTreeSet<&str> = m.as_object().unwrap().keys().map(String::as_str).collect();
    for k in ["v", "state", "digest", "spec", "run", "started", "finished", "entries"] {
        assert!(keys.contains(k), "the marker lacks {k:?}: {m}");
    }
    assert_eq!(m["v"], 1, "{m}");
    assert_eq!(m["state"], "done", "{m}");
    assert_eq!(m["digest"], v["spec_digest"], "{m}");
    assert_eq!(m["spec"], "fs-group=2000", "{m}");
    assert_eq!(m["entries"], t.len() as u64, "{m}");
    assert!(m["finished"].as_u64() >= m["started"].as_u64(), "{m}");
    assert!(!m["run"].as_str().unwrap().is_empty(), "{m}");
    assert_eq!(get_xattr(&vol, CHECKPOINT), None, "no checkpoint left after a clean pass");

    let before = snapshot(&vol);
    tick();
    let second = apply(&vol, &["--fs-group", "2000"]).expect_code(0);
    assert_skipped(&second);
    assert_eq!(second.volume()["marker_before"], "done", "{}", second.describe());
    assert_eq!(second.volume()["marker_after"], "done", "{}", second.describe());
    assert!(reason(&second).contains("done"), "{}", second.describe());
    assert_same(&before, &snapshot(&vol), Meta::attrs_ctime, "a skipped apply touched something");
    assert_eq!(xattr_json(&vol, MARKER).unwrap(), m, "a skip leaves the marker as it was");
}

/// A restart that skips starts no walk thread, whatever `--threads` says (the pool starts with
/// the first walk); a walk starts the threads asked for, once.
#[test]
#[ignore = "needs root, loop devices and mkfs.ext4"]
fn a_skip_starts_no_walk_thread() {
    privileged(&["mkfs.ext4"]);
    let fs = ext4(64, 10_000);
    let outside = make_outside(fs.path());
    let vol = fs.path().join("vol");
    wide_tree(&outside, 7, 4, 50, GenOpts::default()).build(&vol);
    let args = ["--fs-group", "2000", "--threads", "48", "--log-level", "debug"];
    let first = apply(&vol, &args).expect_code(0);
    assert_walked(&first, "walk", &["no marker"]);
    assert_eq!(first.stderr.matches("started 48 walk threads").count(), 1, "{}", first.describe());
    let second = apply(&vol, &args).expect_code(0);
    assert_skipped(&second);
    assert!(!second.stderr.contains("walk threads"), "a skip started threads\n{}", second.describe());
}

// ---------------------------------------------------------------------------------------------
// 2. Every other case walks

/// A spec change walks although the root looks prepared for the new spec; `--force`,
/// `--verify full`, a non-conforming root and an old marker under `--reverify-after` walk too,
/// changing only what differs.
#[test]
#[ignore = "needs root, loop devices and mkfs.ext4"]
fn every_reason_to_walk() {
    privileged(&["mkfs.ext4"]);
    let fs = LoopFs::new(FsKind::Ext4, 256);
    let outside = make_outside(fs.path());
    // No hardlinks: one chown per name, so `changed_owner` can be asserted exactly.
    let mut t = wide_tree(&outside, 202, 8, 250, GenOpts { hardlinks: false, special_bits: true });
    t.file("plain.txt", 1000, 1000, 0o644);
    let n = t.len() as u64;

    // Spec change: prepared for fsGroup 1000, then only the root made to look like 2000.
    let vol = fs.path().join("spec-change");
    t.build(&vol);
    let g1000 = apply(&vol, &["--fs-group", "1000"]).expect_code(0);
    assert_eq!(g1000.volume()["marker_after"], "done", "{}", g1000.describe());
    std::os::unix::fs::chown(&vol, None, Some(GID)).unwrap();
    chmod(&vol, 0o2770);
    assert!(conforms(&snapshot(&vol)[ROOT], GID, false), "the root looks prepared for 2000");
    let changed = apply(&vol, &["--fs-group", "2000"]).expect_code(0);
    assert_walked(&changed, "walk", &["spec changed", "fs-group=1000", "fs-group=2000"]);
    assert_eq!(changed.volume()["marker_before"], "done", "{}", changed.describe());
    assert_eq!(
        changed.count("changed_owner"),
        n - 1,
        "every entry but the root had group 1000\n{}",
        changed.describe()
    );
    assert_all_conform(&vol, "after the spec change");
    assert_eq!(
        xattr_json(&vol, MARKER).unwrap()["digest"],
        changed.volume()["spec_digest"],
        "the marker is for the new spec"
    );
    let again = apply(&vol, &["--fs-group", "2000"]).expect_code(0);
    assert_skipped(&again);

    // The others, on a tree prepared for 2000.
    let vol = fs.path().join("vol");
    t.build(&vol);
    let first = apply(&vol, &["--fs-group", "2000"]).expect_code(0);
    assert_walked(&first, "walk", &["no marker"]);
    assert_skipped(&apply(&vol, &["--fs-group", "2000"]).expect_code(0));

    // A root that does not conform (the marker says done).
    chmod(&vol, 0o755);
    let r = apply(&vol, &["--fs-group", "2000"]).expect_code(0);
    assert_walked(&r, "walk", &["root does not conform"]);
    assert_eq!((r.count("changed_owner"), r.count("changed_mode")), (0, 1), "only the root is fixed\n{}", r.describe());
    assert_eq!(r.count("entries"), n, "{}", r.describe());

    // --force and --verify full: every entry read, none changed, no ctime below the root moved.
    for flag in [&["--force"][..], &["--verify", "full"][..]] {
        let s0 = snapshot(&vol);
        tick();
        let args = [&["--fs-group", "2000"][..], flag].concat();
        let r = apply(&vol, &args).expect_code(0);
        assert_walked(&r, "walk", &[flag.join(" ").as_str()]);
        assert_eq!(r.count("entries"), n, "{}", r.describe());
        assert_eq!((r.count("changed_owner"), r.count("changed_mode")), (0, 0), "{}", r.describe());
        assert_eq!(r.volume()["marker_after"], "done", "{}", r.describe());
        let s1 = snapshot(&vol);
        assert_same(
            &below_root(&s0),
            &below_root(&s1),
            Meta::attrs_ctime,
            &format!("{flag:?} on a conforming tree touched entries"),
        );
        assert_eq!(s0[ROOT].attrs(), s1[ROOT].attrs());
    }

    // Drift below a conforming root: the marker is trusted (skip), --verify full repairs it.
    let plain = vol.join("plain.txt");
    chmod(&plain, 0o600);
    assert_skipped(&apply(&vol, &["--fs-group", "2000"]).expect_code(0));
    let r = apply(&vol, &["--fs-group", "2000", "--verify", "full"]).expect_code(0);
    assert_walked(&r, "walk", &["--verify full"]);
    assert_eq!((r.count("changed_owner"), r.count("changed_mode")), (0, 1), "{}", r.describe());
    assert_eq!(snapshot(&vol)[&b"plain.txt"[..]].mode, 0o660);

    // --reverify-after: a fresh marker still skips; one older than the limit walks.
    assert_skipped(&apply(&vol, &["--fs-group", "2000", "--reverify-after", "1h"]).expect_code(0));
    std::thread::sleep(Duration::from_millis(2100));
    let s0 = snapshot(&vol);
    let r = apply(&vol, &["--fs-group", "2000", "--reverify-after", "1s"]).expect_code(0);
    assert_walked(&r, "walk", &["--reverify-after"]);
    assert_eq!(r.count("entries"), n, "{}", r.describe());
    assert_eq!((r.count("changed_owner"), r.count("changed_mode")), (0, 0), "{}", r.describe());
    assert_same(&below_root(&s0), &below_root(&snapshot(&vol)), Meta::attrs_ctime, "reverify");
    assert_skipped(&apply(&vol, &["--fs-group", "2000", "--reverify-after", "1h"]).expect_code(0));
}

/// A checkpoint only ever skips subtrees for the run and spec that wrote it: with another spec,
/// `--force`, a `done` marker, or a checkpoint of another run or digest, everything is read.
#[test]
#[ignore = "needs root, loop devices and mkfs.ext4"]
fn a_checkpoint_skips_nothing_for_another_spec_run_or_after_done() {
    privileged(&["mkfs.ext4"]);
    let fs = LoopFs::new(FsKind::Ext4, 256);
    let outside = make_outside(fs.path());
    let opts = GenOpts { hardlinks: true, special_bits: false };
    let t = wide_tree(&outside, 303, 6, 200, opts);
    let vol = fs.path().join("vol");
    t.build(&vol);
    let n = t.len() as u64;
    let (d2000, s2000) = spec_of(&vol, &["--fs-group", "2000"]);
    let (d1000, s1000) = spec_of(&vol, &["--fs-group", "1000"]);
    assert_ne!(d2000, d1000);
    apply(&vol, &["--fs-group", "2000"]).expect_code(0);

    // An interrupted run that finished every top-level subtree, over a tree that no longer
    // conforms anywhere (group 0): a pass that wrongly trusts the checkpoint leaves group 0.
    let craft = |state: &str, mdigest: &str, mspec: &str, crun: &str, cdigest: &str| {
        snap::chgrp_all(&vol, 0);
        let marker = serde_json::json!({"v": 1, "state": state, "digest": mdigest, "spec": mspec,
            "run": "r1", "started": 1, "finished": 2, "entries": 5});
        set_xattr(&vol, MARKER, marker.to_string().as_bytes());
        let dirs = [dir_record(&vol, n - 1, |_| true)];
        let cp = serde_json::json!({"run": crun, "digest": cdigest, "v": 3, "dirs": dirs, "pending": []});
        set_xattr(&vol, CHECKPOINT, cp.to_string().as_bytes());
    };

    // The crafted state is honoured by its own run and spec: all six subtrees skipped.
    craft("in-progress", &d2000, &s2000, "r1", &d2000);
    let r = apply(&vol, &["--fs-group", "2000"]).expect_code(0);
    assert_walked(&r, "resume", &["interrupted"]);
    assert_eq!(r.count("skipped_subtrees"), 6, "{}", r.describe());
    assert_eq!(r.count("entries"), 1, "only the root is read\n{}", r.describe());

    let cases: [(&str, [&str; 5], &[&str], &str); 5] = [
        ("--force", ["in-progress", &d2000, &s2000, "r1", &d2000], &["--force"], "--force"),
        ("another spec", ["in-progress", &d1000, &s1000, "r1", &d1000], &[], "spec changed"),
        ("a done marker (stale checkpoint)", ["done", &d2000, &s2000, "r1", &d2000], &[], "root does not conform"),
        ("a checkpoint of another run", ["in-progress", &d2000, &s2000, "r0", &d2000], &[], "interrupted"),
        ("a checkpoint of another digest", ["in-progress", &d2000, &s2000, "r1", &d1000], &[], "interrupted"),
    ];
    for (what, [state, md, ms, crun, cd], extra, why) in cases {
        craft(state, md, ms, crun, cd);
        let args = [&["--fs-group", "2000"][..], extra].concat();
        let r = apply(&vol, &args).expect_code(0);
        assert!(reason(&r).contains(why), "{what}: reason\n{}", r.describe());
        assert_eq!(r.count("skipped_subtrees"), 0, "{what}\n{}", r.describe());
        assert_eq!(r.count("entries"), n, "{what}: every entry read\n{}", r.describe());
        assert_eq!(r.volume()["marker_after"], "done", "{what}\n{}", r.describe());
        assert_all_conform(&vol, what);
        assert_eq!(get_xattr(&vol, CHECKPOINT), None, "{what}: checkpoint removed");
    }
}

// ---------------------------------------------------------------------------------------------
// 3. Kill and resume

/// What a resumed run must skip on the word of checkpoint `cp` over `vol` as it is now:
/// (subtrees, entries in them not read), `before` giving the subtree sizes and change times.
/// Follows the rule: a record holds while its directory's inode, change time (the root's
/// modification time) and link count are those recorded; the subdirectories at its ordinals
/// among the directory's `DT_DIR` entries in `getdents` order are then verified, not read: in
/// each, a directory whose change time is not before the record's clock (the latest of the
/// records naming it) is read with everything below it, the rest is not.
fn skipped_by_checkpoint(vol: &Path, before: &Snapshot, cp: &Value) -> (u64, u64) {
    let by_ino: std::collections::HashMap<u64, &Vec<u8>> =
        before.iter().filter(|(_, m)| m.kind == Kind::Dir).map(|(k, m)| (m.ino, k)).collect();
    let mut skipped: std::collections::BTreeMap<Vec<u8>, (i64, i64)> = Default::default();
    for rec in cp["dirs"].as_array().expect("a v3 checkpoint") {
        let f: Vec<&str> = rec.as_str().unwrap().split(':').collect();
        let rel = by_ino[&f[0].parse::<u64>().unwrap()];
        let dir = if rel.as_slice() == ROOT { vol.to_path_buf() } else { vol.join(std::ffi::OsStr::from_bytes(rel)) };
        let m = std::fs::symlink_metadata(&dir).unwrap();
        let (sec, nsec) =
            if rel.as_slice() == ROOT { (m.mtime(), m.mtime_nsec()) } else { (m.ctime(), m.ctime_nsec()) };
        if f[1] != format!("{sec}.{nsec:09}") || f[2] != m.nlink().to_string() {
            continue;
        }
        let (csec, cnsec) = f[4].split_once('.').unwrap();
        let clock = (csec.parse::<i64>().unwrap(), cnsec.parse::<i64>().unwrap());
        let subdirs: Vec<Vec<u8>> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap())
            .filter(|e| e.file_type().unwrap().is_dir())
            .map(|e| snap::join(rel, e.file_name().as_encoded_bytes()))
            .collect();
        for span in f[5].split(',').filter(|s| !s.is_empty()) {
            let range = span.split('@').next().unwrap();
            let (a, b) = range.split_once('-').unwrap_or((range, range));
            let (a, b) = (a.parse::<usize>().unwrap(), b.parse::<usize>().unwrap());
            for p in &subdirs[a..=b] {
                let c = skipped.entry(p.clone()).or_insert(clock);
                *c = (*c).max(clock);
            }
        }
    }
    let below = |k: &Vec<u8>, p: &Vec<u8>| k == p || (k.starts_with(p) && k.get(p.len()) == Some(&b'/'));
    // A subtree inside another one skipped is never reached.
    let outer: Vec<(&Vec<u8>, (i64, i64))> =
        skipped.iter().filter(|(p, _)| !skipped.keys().any(|q| q != *p && below(p, q))).map(|(p, c)| (p, *c)).collect();
    let mut entries = 0;
    for (p, clock) in &outer {
        let changed: Vec<&Vec<u8>> = before
            .iter()
            .filter(|(k, m)| below(k, p) && m.kind == Kind::Dir && m.ctime >= *clock)
            .map(|(k, _)| k)
            .collect();
        entries += before.keys().filter(|k| below(k, p) && !changed.iter().any(|c| below(k, c))).count() as u64;
    }
    (outer.len() as u64, entries)
}

/// Entries the checkpoint's records say they cover (their fourth field).
fn covered(cp: &Value) -> u64 {
    cp["dirs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r.as_str().unwrap().split(':').nth(3).unwrap().parse::<u64>().unwrap())
        .sum()
}

/// The shape resume must handle: everything under one top-level directory (`repos/`, as on an
/// Atlantis data volume), a few hundred repositories of nested directories.
fn one_top_tree(outside: &Path, repos: usize, per_repo: usize) -> Tree {
    let mut t = Tree::new();
    t.root(0, 0, 0o755);
    t.nest("repos", &without_setuid_files(wide_tree(outside, 404, repos, per_repo, GenOpts::default())));
    t
}

/// SIGKILL at three points of a pass over a volume where everything sits under one top-level
/// directory (after ~30 % of the entries, then ~30 % and ~25 % more of each resumed run's own
/// count); every rerun adopts the interrupted run and its records of finished directories at
/// any depth, the checkpoint covers more after each kill, and the last run completes. It reads
/// exactly the entries outside the subtrees the last checkpoint's records skip (clearly fewer
/// than a full pass), and the result is the kubelet's.
fn killed_passes_resume_at_any_depth(base: &Path, what: &str) {
    let outside = make_outside(base);
    let t = one_top_tree(&outside, 300, 180);
    let n = t.len() as u64;
    assert!(n > 50_000);
    let (vol, want) = (base.join("vol"), base.join("reference"));
    t.build(&vol);
    t.build(&want);
    kubelet_reference(&want, GID, false, Mounts::Skip);
    let before = snapshot(&vol);
    assert_eq!(before.len() as u64, n);
    let digest = spec_of(&vol, &["--fs-group", "2000"]).0;

    // A checkpoint at every finished directory: a kill at an exact entry leaves an exact record.
    let args = ["--fs-group", "2000", "--threads", "4", "--checkpoint-interval", "0"];
    let mut run_id: Option<String> = None;
    let mut covered_before = 0;
    for (i, f) in [0.30, 0.30, 0.25].iter().enumerate() {
        let at = (f * n as f64) as u64;
        let log = apply_killed_at(&vol, &args, at);
        let line = startup_line(&log);
        if i == 0 {
            assert_eq!(field(line, "decision"), Some("walk"), "{what} kill {i}:\n{log}");
        } else {
            assert_eq!(field(line, "decision"), Some("resume"), "{what} kill {i}:\n{log}");
            assert!(
                log.contains(&format!("covering {covered_before} entries")),
                "{what} kill {i}: the run should adopt the records covering {covered_before} entries\n{log}"
            );
        }
        let m = xattr_json(&vol, MARKER).unwrap_or_else(|| panic!("{what} kill {i}: no marker\n{log}"));
        assert_eq!(m["state"], "in-progress", "{what} kill {i}: {m}");
        let run = m["run"].as_str().unwrap().to_string();
        if let Some(prev) = &run_id {
            assert_eq!(&run, prev, "{what} kill {i}: a resumed run keeps the interrupted run's id");
        }
        run_id = Some(run.clone());
        let cp = xattr_json(&vol, CHECKPOINT)
            .unwrap_or_else(|| panic!("{what} kill {i}: no checkpoint after a kill at {at} entries\n{log}"));
        assert_eq!(
            (cp["run"].as_str(), cp["digest"].as_str(), cp["v"].as_u64()),
            (Some(run.as_str()), Some(digest.as_str()), Some(3)),
            "{cp}"
        );
        let bytes = get_xattr(&vol, CHECKPOINT).unwrap().len();
        assert!(bytes <= 3000, "{what} kill {i}: the checkpoint is bounded: {bytes} bytes");
        let now = covered(&cp);
        assert!(
            now > covered_before,
            "{what} kill {i} at {at} entries: the checkpoint should cover more than {covered_before}: {cp}"
        );
        covered_before = now;
        assert_eq!(status_json(&vol)["state"], "in-progress");
    }

    let cp = xattr_json(&vol, CHECKPOINT).unwrap();
    let (subtrees, skipped) = skipped_by_checkpoint(&vol, &before, &cp);
    let last = apply(&vol, &args).expect_code(0);
    assert_walked(&last, "resume", &["interrupted"]);
    let v = last.volume();
    assert_eq!(
        (v["marker_before"].as_str(), v["marker_after"].as_str()),
        (Some("in-progress"), Some("done")),
        "{}",
        last.describe()
    );
    assert_eq!(last.count("skipped_subtrees"), subtrees, "{what}: {cp}\n{}", last.describe());
    // Every entry outside the skipped subtrees is read, and none inside them: a checkpoint's
    // clock is strictly after every change the run made before it (the directories it fixed in
    // the clock's last tick included), and a subtree verified by one killed run and recorded
    // again under its clock is verified against that clock by the next, not an older one.
    let read = last.count("entries");
    assert_eq!(
        read,
        n - skipped,
        "{what}: every entry outside the skipped subtrees is read, and none inside them\n{}",
        last.describe()
    );
    assert!(
        last.count("entries") * 2 < n,
        "{what}: after kills at ~70 % in all, a resumed run reads clearly fewer entries ({}) than a full pass ({n})\n{}",
        last.count("entries"),
        last.describe()
    );
    assert_eq!(last.count("errors"), 0, "{}", last.describe());
    eprintln!(
        "{what}: {n} entries; after three kills the last run read {} ({subtrees} subtrees skipped)",
        last.count("entries")
    );

    assert_same(&snapshot(&want), &snapshot(&vol), Meta::attrs, "kubelet reference vs killed-and-resumed volprep");
    let st = status_json(&vol);
    assert_eq!(st["state"], "done", "{st}");
    assert_eq!(st["checkpoint"], Value::Null, "{st}");
    assert_eq!(st["marker"]["run"], run_id.unwrap().as_str(), "{st}");
    assert_eq!(get_xattr(&vol, CHECKPOINT), None);
    assert_skipped(&apply(&vol, &args).expect_code(0));
}

#[test]
#[ignore = "needs root, loop devices, mkfs.ext4 and --features test-hooks"]
fn killed_passes_resume_at_any_depth_on_ext4() {
    privileged(&["mkfs.ext4"]);
    let fs = ext4(1024, 250_000);
    killed_passes_resume_at_any_depth(fs.path(), "ext4");
}

#[test]
#[ignore = "needs root, loop devices and --features test-hooks"]
fn killed_passes_resume_at_any_depth_on_tmpfs() {
    privileged(&[]);
    let fs = Tmpfs::new();
    killed_passes_resume_at_any_depth(fs.path(), "tmpfs");
}

/// A directory changed after the kill (an entry added) no longer matches its record: it is
/// read again, the new entry fixed; records of directories not changed still skip.
#[test]
#[ignore = "needs root, loop devices, mkfs.ext4 and --features test-hooks"]
fn a_directory_changed_after_a_kill_is_read_again() {
    privileged(&["mkfs.ext4"]);
    let fs = ext4(512, 100_000);
    let outside = make_outside(fs.path());
    let t = one_top_tree(&outside, 200, 150);
    let n = t.len() as u64;
    let vol = fs.path().join("vol");
    t.build(&vol);
    // A checkpoint at every finished directory: a kill at an exact entry leaves an exact record.
    let args = ["--fs-group", "2000", "--threads", "4", "--checkpoint-interval", "0"];
    apply_killed_at(&vol, &args, n / 2);
    let cp = xattr_json(&vol, CHECKPOINT).expect("a checkpoint");
    let repos = std::fs::symlink_metadata(vol.join("repos")).unwrap().ino();
    let rec = cp["dirs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r.as_str().unwrap())
        .find(|r| r.starts_with(&format!("{repos}:")));
    let rec = rec.unwrap_or_else(|| panic!("a record of repos/: {cp}"));
    // The first finished repository of repos/'s record, and a new directory next to it.
    let first: usize = rec.split(':').nth(5).unwrap().split(['-', '@']).next().unwrap().parse().unwrap();
    let names: Vec<_> = std::fs::read_dir(vol.join("repos"))
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| e.file_type().unwrap().is_dir())
        .map(|e| e.file_name())
        .collect();
    let finished = vol.join("repos").join(&names[first]);
    let (_, skipped_unchanged) = skipped_by_checkpoint(&vol, &snapshot(&vol), &cp);
    std::fs::create_dir(vol.join("repos/added-after-the-kill")).unwrap();
    std::fs::write(vol.join("repos/added-after-the-kill/f"), b"").unwrap();
    std::fs::write(finished.join("added-too"), b"").unwrap();
    let before = snapshot(&vol);
    let (_, skipped) = skipped_by_checkpoint(&vol, &before, &cp);
    let r = apply(&vol, &args).expect_code(0);
    assert_walked(&r, "resume", &["interrupted"]);
    assert_eq!(r.count("entries"), before.len() as u64 - skipped, "{}", r.describe());
    assert!(
        skipped < skipped_unchanged,
        "repos/ changed: its record no longer holds, its finished repositories are read again ({skipped} < {skipped_unchanged})"
    );
    assert_all_conform(&vol, "after a resume over changed directories");
    assert_eq!(r.volume()["marker_after"], "done");
}
// ---------------------------------------------------------------------------------------------
// 4. Never done while an entry does not conform

/// `chattr -i` on drop, so a failing test leaves no immutable file behind.
struct Immutable(PathBuf);

impl Immutable {
    fn new(path: &Path) -> Immutable {
        sh("chattr", &["+i".as_ref(), path.as_os_str()]);
        Immutable(path.to_path_buf())
    }
}

impl Drop for Immutable {
    fn drop(&mut self) {
        if let Err(e) = try_sh("chattr", &["-i".as_ref(), self.0.as_os_str()]) {
            eprintln!("{e}");
        }
    }
}

#[test]
#[ignore = "needs root, loop devices, chattr and mkfs.ext4"]
fn marker_is_never_done_while_an_entry_does_not_conform() {
    privileged(&["mkfs.ext4", "chattr"]);
    let fs = LoopFs::new(FsKind::Ext4, 256);
    let outside = make_outside(fs.path());
    let mut t = wide_tree(&outside, 505, 5, 100, GenOpts::default());
    t.file("top002/stuck", 1000, 1000, 0o644);
    let vol = fs.path().join("vol");
    t.build(&vol);
    let before = snapshot(&vol);
    let stuck = vol.join("top002/stuck");
    let guard = Immutable::new(&stuck);

    for (i, extra) in [&[][..], &["--max-errors", "10"][..]].iter().enumerate() {
        let args = [&["--fs-group", "2000"][..], extra].concat();
        let r = apply(&vol, &args).expect_code(if i == 0 { 1 } else { 0 });
        let v = r.volume();
        assert_eq!(v["marker_after"], "in-progress", "run {i}\n{}", r.describe());
        assert!(r.count("errors") >= 1, "{}", r.describe());
        let errs = v["error_list"].as_array().unwrap();
        assert!(
            errs.iter()
                .any(|e| e["path"].as_str().is_some_and(|p| p.ends_with("top002/stuck")) && e["errno"] == "EPERM"),
            "the immutable file is named with EPERM\n{}",
            r.describe()
        );
        let st = status_json(&vol);
        assert_eq!(st["state"], "in-progress", "run {i}: {st}");
        assert_eq!(xattr_json(&vol, MARKER).unwrap()["state"], "in-progress");
        if i == 1 {
            // The first run finished the four other subtrees: the second one adopts that. The
            // first one failed (EPERM), it was not stopped: the reason does not claim it was.
            assert_walked(&r, "resume", &["did not finish", "some entries failed"]);
            assert!(!r.stderr.contains("was interrupted"), "{}", r.describe());
            assert_eq!(r.count("skipped_subtrees"), 4, "{}", r.describe());
        }
    }
    // Everything else conforms: the error stopped only the marker.
    let after = snapshot(&vol);
    for (k, m) in &after {
        if k.as_slice() != b"top002/stuck" {
            assert!(conforms(m, GID, false), "{} {:?}", show(k), m.attrs());
        }
    }
    assert!(!conforms(&after[&b"top002/stuck"[..]], GID, false));

    drop(guard);
    // The four other subtrees are in the root's record; top002's finished subdirectories in
    // its own (top002 itself was fixed by the first run only, so the second one's holds).
    let cp = xattr_json(&vol, CHECKPOINT).expect("a checkpoint");
    let (subtrees, skipped) = skipped_by_checkpoint(&vol, &snapshot(&vol), &cp);
    assert!(subtrees >= 4, "{cp}");
    let r = apply(&vol, &["--fs-group", "2000"]).expect_code(0);
    assert_walked(&r, "resume", &["interrupted"]);
    assert_eq!(r.volume()["marker_after"], "done", "{}", r.describe());
    assert_eq!(r.count("skipped_subtrees"), subtrees, "{}", r.describe());
    assert_eq!(r.count("entries"), before.len() as u64 - skipped, "{}", r.describe());
    assert!(
        r.count("entries") <= 1 + subtree_size(&before, "top002"),
        "at most the root and the subtree with the failure\n{}",
        r.describe()
    );
    assert_eq!(status_json(&vol)["state"], "done");
    assert_all_conform(&vol, "after the immutable flag is gone");
}

// ---------------------------------------------------------------------------------------------
// 5. ramfs (no xattrs) and the lock

fn names(dir: &Path) -> BTreeSet<std::ffi::OsString> {
    std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name()).collect()
}

/// Without xattrs: a warning, the kubelet's root-only rule, `unsupported` in the report and
/// `status`, and no marker file written into the volume.
#[test]
#[ignore = "needs root and loop devices"]
fn ramfs_falls_back_to_the_root_check() {
    privileged(&[]);
    let fs = Ramfs::new();
    let outside = make_outside(fs.path());
    let t = wide_tree(&outside, 606, 4, 200, GenOpts::default());
    let (vol, want) = (fs.path().join("vol"), fs.path().join("reference"));
    t.build(&vol);
    t.build(&want);
    kubelet_reference(&want, GID, false, Mounts::Skip);
    let top = names(&vol);

    let first = apply(&vol, &["--fs-group", "2000"]).expect_code(0);
    assert_walked(&first, "walk", &["no xattr support"]);
    let v = first.volume();
    assert_eq!(v["marker_before"], "unsupported", "{}", first.describe());
    assert_eq!(v["marker_after"], "unsupported", "{}", first.describe());
    assert_eq!(first.count("entries"), t.len() as u64, "{}", first.describe());
    assert!(
        first.stderr_lines().iter().any(|l| l.contains("WARN") && l.contains("extended attributes")),
        "a warning about the missing xattr support\n{}",
        first.describe()
    );
    assert_same(&snapshot(&want), &snapshot(&vol), Meta::attrs, "kubelet reference vs volprep on ramfs");
    assert_eq!(names(&vol), top, "nothing written into the volume");

    let second = apply(&vol, &["--fs-group", "2000"]).expect_code(0);
    assert_skipped(&second);
    assert_eq!(second.volume()["marker_before"], "unsupported", "{}", second.describe());
    assert!(reason(&second).contains("root conforms"), "{}", second.describe());

    // The root-only rule: a root that does not conform walks.
    chmod(&vol, 0o755);
    let third = apply(&vol, &["--fs-group", "2000"]).expect_code(0);
    assert_walked(&third, "walk", &["root does not conform"]);
    assert_eq!(third.count("changed_mode"), 1, "{}", third.describe());
    assert_eq!(names(&vol), top, "nothing written into the volume");

    let st = status_json(&vol);
    assert_eq!(st["state"], "unsupported", "{st}");
    let line = run(volprep().arg("status").arg(&vol)).expect_code(0);
    assert!(line.stdout.contains("no marker possible"), "{}", line.describe());
}

/// Two applies started together on one volume: one walks, the other waits for the lock, then
/// reads the `done` marker and skips. Both exit 0 and the tree is the kubelet's.
#[test]
#[ignore = "needs root, loop devices, mkfs.ext4 and --features test-hooks"]
fn concurrent_applies_walk_once() {
    privileged(&["mkfs.ext4"]);
    let fs = LoopFs::new(FsKind::Ext4, 512);
    let outside = make_outside(fs.path());
    let t = wide_tree(&outside, 707, 40, 700, GenOpts::default());
    let (vol, want) = (fs.path().join("vol"), fs.path().join("reference"));
    t.build(&vol);
    t.build(&want);
    kubelet_reference(&want, GID, false, Mounts::Skip);

    // The first run holds itself in its walk (its lock taken); the second starts then, and the
    // first goes on once the second says it waits for the lock.
    let cmd = || {
        let mut c = volprep();
        c.args(["apply", "--fs-group", "2000", "--threads", "2", "--report", "-"]).arg(&vol);
        c.stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped());
        c
    };
    let (first, held) = kill::held_at(cmd(), 1000);
    let mut second = cmd().spawn().unwrap();
    let _second_held = kill::Held(second.id() as i32);
    let mut err = std::io::BufReader::new(second.stderr.take().unwrap());
    let waited = kill::read_until(&mut err, "waiting for its lock", "the second run ended");
    drop(held);
    let rest = std::thread::spawn(move || std::io::read_to_string(err).unwrap());
    let done = |o: std::process::Output, stderr: String| Run {
        cmdline: "volprep apply".into(),
        code: o.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
        stderr,
    };
    let o = first.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr).into_owned();
    let walked = done(o, stderr);
    let waiter = done(second.wait_with_output().unwrap(), waited + &rest.join().unwrap());
    let runs = [walked, waiter];
    let both = format!("{}\n{}", runs[0].describe(), runs[1].describe());
    for r in &runs {
        assert_eq!(r.code, 0, "{both}");
    }
    let actions: BTreeSet<String> = runs.iter().map(|r| r.volume()["action"].as_str().unwrap().to_string()).collect();
    assert_eq!(actions, BTreeSet::from(["skipped".to_string(), "walked".to_string()]), "exactly one walks\n{both}");
    let walker = runs.iter().find(|r| r.volume()["action"] == "walked").unwrap();
    let waiter = runs.iter().find(|r| r.volume()["action"] == "skipped").unwrap();
    assert_eq!(walker.count("entries"), t.len() as u64, "{both}");
    assert_skipped(waiter);
    assert_eq!(waiter.volume()["marker_before"], "done", "the waiter reads the marker after the lock\n{both}");
    assert!(waiter.stderr.contains("waiting for its lock"), "the second run waited for the lock (and said so)\n{both}");
    assert_same(&snapshot(&want), &snapshot(&vol), Meta::attrs, "kubelet reference vs volprep");
    assert_eq!(status_json(&vol)["state"], "done");
}

// ---------------------------------------------------------------------------------------------
// 6. status

#[test]
#[ignore = "needs root, loop devices and mkfs.ext4"]
fn status_shows_no_marker_then_the_marker() {
    privileged(&["mkfs.ext4"]);
    let fs = LoopFs::new(FsKind::Ext4, 64);
    let (fresh, vol) = (fs.path().join("fresh"), fs.path().join("vol"));
    std::fs::create_dir(&fresh).unwrap();
    let mut t = Tree::new();
    t.root(0, 0, 0o755).dir("a", 1000, 1000, 0o755).file("a/f", 1000, 1000, 0o644).symlink("a/l", "f", 1000, 1000);
    t.build(&vol);

    let r = run(volprep().arg("status").arg(&fresh)).expect_code(0);
    let lines = r.stdout.lines().collect::<Vec<_>>();
    assert_eq!(lines.len(), 1, "{}", r.describe());
    assert!(lines[0].contains(fresh.to_str().unwrap()) && lines[0].contains("no marker"), "{}", r.describe());
    let st = status_json(&fresh);
    assert_eq!(st["state"], "none", "{st}");
    assert_eq!(st["marker"], Value::Null, "{st}");

    // check changes nothing, the marker included.
    pass("check", &["--fs-group", "2000"], &vol).expect_code(3);
    assert_eq!(status_json(&vol)["state"], "none");
    assert_eq!(get_xattr(&vol, MARKER), None, "check writes no marker");

    let a = apply(&vol, &["--fs-group", "2000"]).expect_code(0);
    let digest = a.volume()["spec_digest"].as_str().unwrap().to_string();
    let st = status_json(&vol);
    assert_eq!(st["state"], "done", "{st}");
    assert_eq!(st["path"], vol.to_str().unwrap(), "{st}");
    assert_eq!(st["marker"]["state"], "done", "{st}");
    assert_eq!(st["marker"]["digest"], digest.as_str(), "{st}");
    assert_eq!(st["marker"]["spec"], "fs-group=2000", "{st}");
    assert_eq!(st["marker"]["entries"], a.count("entries"), "{st}");
    assert_eq!(st["marker"], xattr_json(&vol, MARKER).unwrap(), "status shows the xattr");
    assert_eq!(st["checkpoint"], Value::Null, "{st}");

    // Several paths, in order; status changes nothing.
    let s0 = snapshot(&vol);
    let r = run(volprep().arg("status").arg(&fresh).arg(&vol)).expect_code(0);
    let lines = r.stdout.lines().collect::<Vec<_>>();
    assert_eq!(lines.len(), 2, "{}", r.describe());
    assert!(lines[0].contains("no marker"), "{}", r.describe());
    assert!(lines[1].contains("done for fs-group=2000") && lines[1].contains(&digest), "{}", r.describe());
    assert_same(&s0, &snapshot(&vol), Meta::attrs_ctime, "status changed something");
}

// ---------------------------------------------------------------------------------------------
// 7. Crash-safe special bits

/// The state a kill leaves between a setuid/setgid file's chown and its chmod, made by hand: the
/// files have the spec's group and have lost their bits; the checkpoint lists them as pending.
/// Returns the volume.
fn in_between_state(base: &Path, name: &str, spec: &[&str]) -> PathBuf {
    let vol = base.join(name);
    let mut t = Tree::new();
    t.root(0, 0, 0o755)
        .dir("sub", 1000, GID, 0o2775)
        .file("sub/sgid", 1000, GID, 0o775)
        .file("sub/suid", 1000, GID, 0o775)
        .file("sub/replaced", 1000, GID, 0o775)
        .file("sub/plain", 1000, 1000, 0o644)
        .dir("other", 0, 0, 0o755)
        .file("other/f", 0, 0, 0o600);
    t.build(&vol);
    let (digest, spec_text) = spec_of(&vol, spec);
    let ino = |rel: &str| std::fs::symlink_metadata(vol.join(rel)).unwrap().ino();
    let marker = serde_json::json!({"v": 1, "state": "in-progress", "digest": digest,
        "spec": spec_text, "run": "r1", "started": 1});
    let cp = serde_json::json!({"run": "r1", "digest": digest, "done": [], "pending": [
        ["sub/sgid", ino("sub/sgid"), 0o2775],
        ["sub/suid", ino("sub/suid"), 0o4775],
        // A record whose inode is not the file's any more (replaced since): not trusted.
        ["sub/replaced", ino("sub/replaced") + 100_000, 0o2775],
    ]});
    set_xattr(&vol, MARKER, marker.to_string().as_bytes());
    set_xattr(&vol, CHECKPOINT, cp.to_string().as_bytes());
    vol
}

#[test]
#[ignore = "needs root, loop devices and mkfs.ext4"]
fn special_bits_lost_by_a_kill_are_restored_or_reported() {
    privileged(&["mkfs.ext4"]);
    let fs = LoopFs::new(FsKind::Ext4, 64);

    // fsGroup alone: setgid comes back (its group is the spec's); setuid is not granted on the
    // word of a record the app could write, and the refusal is an error naming the file.
    let vol = in_between_state(fs.path(), "fs-group", &["--fs-group", "2000"]);
    let r = apply(&vol, &["--fs-group", "2000"]).expect_code(1);
    assert_walked(&r, "resume", &["interrupted"]);
    assert_eq!(mode_of(&vol.join("sub/sgid")), 0o2775, "setgid restored\n{}", r.describe());
    assert_eq!(mode_of(&vol.join("sub/suid")), 0o775, "setuid not restored\n{}", r.describe());
    assert_eq!(mode_of(&vol.join("sub/replaced")), 0o775, "a record for another inode is ignored\n{}", r.describe());
    let errs = r.volume()["error_list"].as_array().unwrap().clone();
    assert_eq!(r.count("errors"), 1, "{}", r.describe());
    assert!(
        errs[0]["path"].as_str().unwrap().ends_with("sub/suid")
            && errs[0]["op"] == "restore"
            && errs[0]["error"].as_str().unwrap().contains("chmod u+s"),
        "the refused setuid is a restore error on sub/suid naming the command\n{}",
        r.describe()
    );
    assert_eq!(r.volume()["marker_after"], "in-progress", "{}", r.describe());
    assert_eq!(status_json(&vol)["state"], "in-progress");
    // The rest of the volume was prepared all the same.
    assert_eq!(snapshot(&vol)[&b"other/f"[..]].attrs(), (Kind::File, 0, GID, snap::Octal(0o660)));

    // With --owner 1000 (the files' owner): setuid is the spec's to give, so it comes back too.
    let spec = ["--fs-group", "2000", "--owner", "1000"];
    let vol = in_between_state(fs.path(), "owner", &spec);
    let r = apply(&vol, &spec).expect_code(0);
    assert_walked(&r, "resume", &["interrupted"]);
    assert_eq!(mode_of(&vol.join("sub/sgid")), 0o2775, "{}", r.describe());
    assert_eq!(mode_of(&vol.join("sub/suid")), 0o4775, "setuid restored\n{}", r.describe());
    assert_eq!(mode_of(&vol.join("sub/replaced")), 0o775, "{}", r.describe());
    assert_eq!(r.count("errors"), 0, "{}", r.describe());
    assert_eq!(r.volume()["marker_after"], "done", "{}", r.describe());
    assert_eq!(get_xattr(&vol, CHECKPOINT), None, "the checkpoint is gone once done");
}
