//! "The storage ignores or refuses ownership changes" (exit 6) only on proof. Changes that do
//! not hold for an entry's own reason (an immutable flag, an owner not mapped into volprep's
//! user namespace, a setgid bit the kernel dropped for lack of CAP_FSETID, a stale attribute
//! cache, another writer) are per-entry errors that count against `--max-errors`, on real
//! filesystems and with the real binary; the verdict comes only from volprep's own experiment,
//! whose evidence is in the report.

mod common;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use common::fusefs::{self, FuseFs, Owners};
use common::*;

/// The exit code of a storage that ignores or refuses ownership changes.
const IGNORED: i32 = 6;

/// A volume prepared for group 2000 (root 0:2000 2775, `n` files 0:2000 0660): `done`.
fn prepared(root: &Path, n: usize) {
    let mut t = Tree::new();
    t.root(0, 2000, 0o2775);
    for i in 0..n {
        t.file(format!("ok{i}"), 0, 2000, 0o660);
    }
    t.build(root);
    apply_fs_group(root, 2000, &[]);
}

/// The report of a run that is no verdict: no `ownership`, and `errors` errors, each naming
/// `cause`.
#[track_caller]
fn no_verdict(run: &Run, errors: u64, cause: &str) -> serde_json::Value {
    assert_ne!(run.code, IGNORED, "no verdict on a healthy volume\n{}", run.describe());
    let v = run.volume();
    assert!(v.get("ownership").is_none(), "{}", run.describe());
    assert_eq!(v["errors"].as_u64(), Some(errors), "{}", run.describe());
    for e in v["error_list"].as_array().unwrap() {
        assert!(e["error"].as_str().unwrap().contains(cause), "{cause:?} in {e}\n{}", run.describe());
    }
    v
}

fn chattr(flag: &str, path: &Path) {
    let out = Command::new("chattr").arg(flag).arg(path).output().unwrap();
    assert!(out.status.success(), "chattr {flag} {}: {}", path.display(), String::from_utf8_lossy(&out.stderr));
}

/// Eight immutable files and two append-only ones on a prepared ext4 volume that gained them,
/// re-walked: each is an error naming its flag, within `--max-errors`, never exit 6.
#[test]
#[ignore = "needs root, loop devices, mkfs.ext4 and chattr"]
fn immutable_and_append_only_files_are_errors_of_their_own() {
    privileged(&["mkfs.ext4", "chattr"]);
    let fs = LoopFs::new(FsKind::Ext4, 64);
    prepared(fs.path(), 5);
    let mut t = Tree::new();
    for i in 0..10 {
        t.file(format!("locked{i}"), 0, 0, 0o600);
    }
    t.build(fs.path());
    for i in 0..10 {
        chattr(if i < 8 { "+i" } else { "+a" }, &fs.path().join(format!("locked{i}")));
    }
    let run = pass("apply", &["--fs-group", "2000", "--force", "--max-errors", "100"], fs.path());
    let v = no_verdict(&run.expect_code(0), 10, "chattr");
    let text = v["error_list"].to_string();
    assert!(text.contains("immutable (chattr +i)") && text.contains("append-only (chattr +a)"), "{v}");
    assert!(v["error_list"].as_array().unwrap().iter().all(|e| e["errno"] == "EPERM"), "{v}");
    assert_ne!(v["marker_after"], "done", "{v}");
    // Without room for them, the errors fail the run (exit 1), still without a verdict.
    let run = pass("apply", &["--fs-group", "2000", "--force"], fs.path());
    no_verdict(&run.expect_code(1), 10, "chattr");
    for i in 0..10 {
        chattr(if i < 8 { "-i" } else { "-a" }, &fs.path().join(format!("locked{i}")));
    }
    apply_fs_group(fs.path(), 2000, &["--force"]);
}

/// Root in a user namespace that maps only itself (as `hostUsers: false` pods are), re-walking
/// a prepared volume that gained files of an unmapped owner (they read as 65534, and even
/// root's chown and chmod of them fail with EPERM): errors naming the mapping, never exit 6.
#[test]
#[ignore = "needs root, loop devices, mkfs.ext4 and unshare"]
fn files_of_an_owner_unmapped_in_the_user_namespace_are_errors_of_their_own() {
    privileged(&["mkfs.ext4", "unshare"]);
    let fs = LoopFs::new(FsKind::Ext4, 64);
    // Group 0: the one group the namespace maps.
    let mut t = Tree::new();
    t.root(0, 0, 0o2775);
    for i in 0..5 {
        t.file(format!("ok{i}"), 0, 0, 0o660);
    }
    t.build(fs.path());
    apply_fs_group(fs.path(), 0, &[]);
    let mut t = Tree::new();
    for i in 0..10 {
        t.file(format!("theirs{i}"), 1000, 1000, 0o600);
    }
    t.build(fs.path());
    let mut cmd = Command::new("unshare");
    cmd.args(["--user", "--map-root-user", "--"]).arg(env!("CARGO_BIN_EXE_volprep"));
    cmd.args(["apply", "--fs-group", "0", "--force", "--max-errors", "100", "--report", "-"]).arg(fs.path());
    let run = run(cmd.env_remove("RUST_LOG").env_remove("VOLPREP_THREADS"));
    let v = no_verdict(&run.expect_code(0), 10, "not mapped into this user namespace");
    assert!(v["error_list"].to_string().contains("theirs"), "{v}");
    let m = std::fs::metadata(fs.path().join("theirs3")).unwrap();
    assert_eq!((m.uid(), m.gid(), m.mode() & 0o7777), (1000, 1000, 0o600), "left as it was");
}

/// Without CAP_FSETID, eight setgid files of another group: the chowns hold, the kernel drops
/// the setgid bits. Errors naming the capability, never a storage refusal.
#[test]
#[ignore = "needs root, loop devices, mkfs.ext4 and setpriv"]
fn setgid_bits_dropped_for_lack_of_cap_fsetid_are_no_storage_refusal() {
    privileged(&["mkfs.ext4", "setpriv"]);
    let fs = LoopFs::new(FsKind::Ext4, 64);
    prepared(fs.path(), 3);
    let mut t = Tree::new();
    for i in 0..8 {
        t.file(format!("tool{i}"), 1000, 33, 0o2755);
    }
    t.build(fs.path());
    let mut cmd = Command::new("setpriv");
    cmd.args(["--bounding-set", "-fsetid", "--inh-caps", "-fsetid", "--"]).arg(env!("CARGO_BIN_EXE_volprep"));
    cmd.args(["apply", "--fs-group", "2000", "--force", "--max-errors", "100", "--report", "-"]).arg(fs.path());
    let run = run(cmd.env_remove("RUST_LOG").env_remove("VOLPREP_THREADS"));
    assert!(run.stderr.contains("CAP_FSETID"), "the missing capability is named\n{}", run.describe());
    let v = no_verdict(&run.expect_code(0), 8, "EPERM");
    assert!(v["error_list"].as_array().unwrap().iter().all(|e| e["op"] == "chmod"), "{v}");
    let m = std::fs::metadata(fs.path().join("tool5")).unwrap();
    assert_eq!(
        (m.uid(), m.gid(), m.mode() & 0o7777),
        (1000, 2000, 0o775),
        "the chown held, the kernel dropped S_ISGID"
    );
}

/// A FUSE filesystem that applies chown and chmod but answers attributes from a daemon-side
/// cache of a few seconds: the read-backs see the old attributes, but volprep's own test waits
/// the cache out and sees its change hold. No verdict; every entry is changed on the backing
/// directory, and the next run finds the volume conforming.
#[test]
#[ignore = "needs root and /dev/fuse"]
fn a_stale_attribute_cache_is_no_verdict() {
    if !fusefs::available() {
        return;
    }
    let src = tempfile::tempdir().unwrap();
    let mut t = Tree::new();
    t.root(0, 0, 0o755);
    for i in 0..30 {
        t.file(format!("f{i}"), 0, 0, 0o600);
    }
    t.build(src.path());
    let fuse = FuseFs::mount(src.path(), Owners::StaleCache);
    let args = ["--fs-group", "2000", "--max-errors", "100", "--threads", "2"];
    let run = pass("apply", &args, fuse.path());
    assert_ne!(run.code, IGNORED, "{}", run.describe());
    let v = run.volume();
    assert!(v.get("ownership").is_none(), "{}", run.describe());
    let evidence = v["ownership_evidence"].as_str().unwrap_or_else(|| panic!("the experiment's evidence: {v}"));
    assert!(evidence.starts_with("a file volprep created took ") && evidence.contains(" after "), "{v}");
    for i in 0..30 {
        let m = std::fs::metadata(src.path().join(format!("f{i}"))).unwrap();
        assert_eq!((m.gid(), m.mode() & 0o7777), (2000, 0o660), "f{i} was changed: {v}");
    }
    assert_eq!(std::fs::read_dir(src.path()).unwrap().count(), 30, "the experiment's file is removed");
    drop(fuse);
    std::thread::sleep(fusefs::STALE_FOR);
    let fuse = FuseFs::mount(src.path(), Owners::StaleCache);
    let again = pass("apply", &args, fuse.path()).expect_code(0);
    assert_eq!(again.volume()["marker_after"], "done", "{}", again.describe());
}

/// One tenant chmod-looping its own file while re-walks run: a racing entry is retried, then
/// at worst an error of its own; never a verdict on the filesystem.
#[test]
fn a_concurrent_chmod_of_one_entry_is_no_verdict() {
    let dir = tempfile::tempdir().unwrap();
    let vol = dir.path();
    // SAFETY: getegid has no preconditions and cannot fail.
    let gid = unsafe { libc::getegid() };
    for i in 0..4 {
        std::fs::write(vol.join(format!("f{i}")), b"").unwrap();
        std::fs::set_permissions(vol.join(format!("f{i}")), std::fs::Permissions::from_mode(0o660)).unwrap();
    }
    let busy = vol.join("busy");
    std::fs::write(&busy, b"").unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let tenant = {
        let (stop, busy) = (Arc::clone(&stop), busy.clone());
        std::thread::spawn(move || {
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let mode = if n % 2 == 0 { 0o600 } else { 0o660 };
                let _ = std::fs::set_permissions(&busy, std::fs::Permissions::from_mode(mode));
                n += 1;
            }
        })
    };
    let gid = gid.to_string();
    for _ in 0..40 {
        let run = pass("apply", &["--fs-group", &gid, "--force", "--max-errors", "5"], vol);
        assert!(run.code == 0, "exit 0 (a racing entry is within --max-errors)\n{}", run.describe());
        assert!(run.volume().get("ownership").is_none(), "{}", run.describe());
    }
    stop.store(true, Ordering::Relaxed);
    tenant.join().unwrap();
}

/// The names in `dir` that begin as volprep's experiment files do, sorted.
fn probes(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".volprep-probe-"))
        .collect();
    names.sort();
    names
}

/// Starts a pass over `mnt` (a stale attribute cache over `src`, so that volprep's experiment
/// waits), sends it `sig` once its experiment's file shows in `src` (beside the `known` ones),
/// and waits for it to end.
fn stopped_in_experiment(src: &Path, mnt: &Path, sig: i32, report: &Path, known: usize) -> std::process::Output {
    use common::kill::{KillOnDrop, wait_within};
    use std::time::{Duration, Instant};
    let mut cmd = volprep();
    cmd.args(["apply", "--fs-group", "2000", "--max-errors", "100", "--threads", "2", "--report"]);
    cmd.arg(report).arg(mnt).stdout(std::process::Stdio::null()).stderr(std::process::Stdio::piped());
    let cmdline = format!("{cmd:?}");
    let mut child = KillOnDrop(cmd.spawn().expect("spawn volprep"));
    let deadline = Instant::now() + Duration::from_secs(60);
    while probes(src).len() == known {
        assert!(child.0.try_wait().unwrap().is_none(), "volprep ended before its experiment: {cmdline}");
        assert!(Instant::now() < deadline, "no experiment within 60 s: {cmdline}");
        std::thread::sleep(Duration::from_millis(2));
    }
    // SAFETY: kill takes plain integers: no memory is involved.
    unsafe { libc::kill(child.0.id() as i32, sig) };
    wait_within(child, Duration::from_secs(60), &cmdline)
}

/// A volume of 30 files of group 0 (mode 0600) in `src`, served with a stale attribute cache.
fn stale_volume(src: &Path) -> FuseFs {
    let mut t = Tree::new();
    t.root(0, 0, 0o755);
    for i in 0..30 {
        t.file(format!("f{i}"), 0, 0, 0o600);
    }
    t.build(src);
    FuseFs::mount(src, Owners::StaleCache)
}

/// SIGTERM while volprep's experiment waits out an attribute cache: the wait ends at once, the
/// experiment's file is removed, the pass stops as any stopped pass does (exit 143), and the
/// evidence says the experiment proved nothing.
#[test]
#[ignore = "needs root and /dev/fuse"]
fn sigterm_during_the_experiment_ends_its_wait_and_removes_its_file() {
    if !fusefs::available() {
        return;
    }
    let (src, out) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let fuse = stale_volume(src.path());
    let report = out.path().join("report.json");
    let end = stopped_in_experiment(src.path(), fuse.path(), libc::SIGTERM, &report, 0);
    let log = String::from_utf8_lossy(&end.stderr);
    assert_eq!(end.status.code(), Some(143), "{log}");
    assert_eq!(probes(src.path()), Vec::<String>::new(), "the experiment's file is removed\n{log}");
    let r: serde_json::Value = serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap();
    let v = &r["volumes"][0];
    assert!(v.get("ownership").is_none(), "{v}");
    let evidence = v["ownership_evidence"].as_str().unwrap_or_else(|| panic!("the experiment's evidence: {v}"));
    assert!(evidence.starts_with("SIGTERM came after ") && evidence.ends_with("no verdict"), "{v}");
}

/// SIGKILL while volprep's experiment waits: its file stays behind, and the next pass removes
/// it. Files that only look like one are left: of a live pid, of another owner, a symlink.
#[test]
#[ignore = "needs root and /dev/fuse"]
fn the_experiment_file_of_a_killed_pass_is_removed_by_the_next() {
    if !fusefs::available() {
        return;
    }
    let (src, out) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let fuse = stale_volume(src.path());
    // Above any pid_max: no such process.
    let gone = ".volprep-probe-999999999-0000000100000000";
    let live = format!(".volprep-probe-{}-0000000100000000", std::process::id());
    let mut t = Tree::new();
    t.file(&live, 0, 0, 0o600);
    t.file(gone.replacen("0001", "0002", 1), 1000, 1000, 0o600);
    t.build(src.path());
    std::os::unix::fs::symlink("f0", src.path().join(gone)).unwrap();
    let decoys = probes(src.path());
    let end = stopped_in_experiment(src.path(), fuse.path(), libc::SIGKILL, &out.path().join("r.json"), decoys.len());
    assert_eq!(std::os::unix::process::ExitStatusExt::signal(&end.status), Some(libc::SIGKILL));
    let left = probes(src.path());
    assert_eq!(left.len(), decoys.len() + 1, "the killed pass's file stayed: {left:?}");
    let run = pass("apply", &["--fs-group", "2000", "--max-errors", "100", "--threads", "2"], fuse.path());
    assert_ne!(run.code, IGNORED, "{}", run.describe());
    assert_eq!(probes(src.path()), decoys, "only the killed pass's file is removed\n{}", run.describe());
    let m = std::fs::symlink_metadata(src.path().join(gone)).unwrap();
    assert!(m.file_type().is_symlink(), "the symlink is left as it is");
}

/// An immutable root takes no marker: the warning names the flag (not a bare EPERM), and a
/// root that conforms lets the pass fix the entries below it (exit 0; every start walks).
#[test]
#[ignore = "needs root, loop devices, mkfs.ext4 and chattr"]
fn an_immutable_root_that_takes_no_marker_is_named_as_the_cause() {
    privileged(&["mkfs.ext4", "chattr"]);
    let fs = LoopFs::new(FsKind::Ext4, 64);
    let mut t = Tree::new();
    t.root(0, 2000, 0o2775);
    for i in 0..5 {
        t.file(format!("new{i}"), 0, 0, 0o600);
    }
    t.build(fs.path());
    chattr("+i", fs.path());
    let run = pass("apply", &["--fs-group", "2000"], fs.path());
    chattr("-i", fs.path());
    let run = run.expect_code(0);
    let line = run.stderr_lines().into_iter().find(|l| l.contains("cannot write the marker")).unwrap_or_else(|| {
        panic!("a warning says the marker cannot be written\n{}", run.describe());
    });
    assert!(line.contains(&fs.path().display().to_string()), "{line}");
    assert!(line.contains("Operation not permitted (EPERM): the root is immutable (chattr +i)"), "{line}");
    assert_ne!(run.volume()["marker_after"], "done", "{}", run.describe());
    let m = std::fs::metadata(fs.path().join("new3")).unwrap();
    assert_eq!((m.gid(), m.mode() & 0o7777), (2000, 0o660), "the entries are fixed");
}

/// A root marked `done` for one spec, made immutable, and a pass of another spec: it could
/// neither write its own marker nor remove the old one, which would then claim a volume it
/// changed. It fails (exit 1) with one line naming the path, the old spec and the flag, before
/// any entry is changed.
#[test]
#[ignore = "needs root, loop devices, mkfs.ext4 and chattr"]
fn another_specs_done_marker_on_an_immutable_root_fails_before_any_change() {
    privileged(&["mkfs.ext4", "chattr"]);
    let fs = LoopFs::new(FsKind::Ext4, 64);
    prepared(fs.path(), 5);
    fails_immutable_before_any_change(
        fs.path(),
        &["--fs-group", "3000"],
        &[
            "cannot replace the done marker of spec 'fs-group=2000'",
            "the root is immutable (chattr +i)",
            "nothing was changed",
        ],
    );
    let again = apply_fs_group(fs.path(), 3000, &[]);
    assert_eq!(again.volume()["marker_after"], "done", "{}", again.describe());
}

/// A sharded pass on an immutable root cannot register in the root's record: one line naming
/// the path and the flag, exit 1, before any entry is changed.
#[test]
#[ignore = "needs root, loop devices, mkfs.ext4 and chattr"]
fn a_sharded_pass_on_an_immutable_root_names_the_flag_before_any_change() {
    privileged(&["mkfs.ext4", "chattr"]);
    let fs = LoopFs::new(FsKind::Ext4, 64);
    let mut t = Tree::new();
    t.root(0, 0, 0o755);
    for i in 0..4 {
        t.file(format!("d{i}/f"), 0, 0, 0o600);
    }
    t.build(fs.path());
    fails_immutable_before_any_change(
        fs.path(),
        &["--fs-group", "2000", "--shard", "0/2"],
        &["cannot write the shard marker", "the root is immutable (chattr +i)"],
    );
}

/// `apply ARGS` on `root` made immutable (`chattr +i`, taken off again after): exit 1 with one
/// ERROR line that names the path and holds each of `parts`, and no entry changed.
fn fails_immutable_before_any_change(root: &Path, args: &[&str], parts: &[&str]) {
    chattr("+i", root);
    let before = snapshot(root);
    let run = pass("apply", args, root);
    let after = snapshot(root);
    chattr("-i", root);
    let run = run.expect_code(1);
    assert_same(&before, &after, |m| *m, "nothing was changed");
    let errors: Vec<&str> = run.stderr_lines().into_iter().filter(|l| l.contains("ERROR")).collect();
    assert_eq!(errors.len(), 1, "one line\n{}", run.describe());
    let shown = root.display().to_string();
    for part in std::iter::once(shown.as_str()).chain(parts.iter().copied()) {
        assert!(errors[0].contains(part), "{part:?} in {}", errors[0]);
    }
}
