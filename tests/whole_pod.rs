//! Whole-pod preparation: several volumes with their own specs in one run, `--sticky` temp dirs,
//! and a real client (Ruby's `Dir.tmpdir`) accepting the result as a non-root user.

mod common;

use std::os::unix::fs::{MetadataExt, PermissionsExt, symlink};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;

use common::snap::conforms;
use common::*;

const NOBODY: u32 = 65534;

/// A small tree needing work under any spec: files 0600/0644 owned by 999:999, dirs 0700/0755.
fn mixed_tree(root: &Path) {
    let mut t = Tree::new();
    t.root(999, 999, 0o755).dir("a", 999, 999, 0o700).dir("a/b", 999, 999, 0o755);
    for i in 0..50 {
        t.file(format!("a/f{i}"), 999, 999, if i % 2 == 0 { 0o600 } else { 0o644 });
        t.file(format!("a/b/g{i}"), 999, 999, 0o640);
    }
    t.symlink("a/link", "/etc/hostname", 999, 999);
    t.build(root);
}

fn volumes(run: &Run) -> Vec<serde_json::Value> {
    run.report()["volumes"].as_array().unwrap_or_else(|| panic!("no volumes\n{}", run.describe())).clone()
}

#[track_caller]
fn assert_all(root: &Path, what: &str, f: impl Fn(&Meta) -> bool) {
    let snap = snapshot(root);
    assert!(snap.len() > 100, "{what}: tree too small: {}", snap.len());
    let bad: Vec<_> = snap.iter().filter(|(_, m)| !f(m)).map(|(p, m)| format!("{} {m:?}", show(p))).take(5).collect();
    assert!(bad.is_empty(), "{what}: entries not as specified: {bad:#?}");
}

#[test]
#[ignore = "needs root, loop devices and mkfs.ext4"]
fn three_volumes_three_specs_in_one_run() {
    privileged(&["mkfs.ext4"]);
    let ext4 = LoopFs::new(FsKind::Ext4, 64);
    let tmpfs = Tmpfs::new();
    let plain = tempfile::tempdir().unwrap();
    let (data, cache, logs) = (ext4.path().join("data"), tmpfs.path().join("cache"), plain.path().join("logs"));
    for d in [&data, &cache, &logs] {
        mixed_tree(d);
    }
    let run = run(volprep()
        .args(["apply", "--report", "-", "--progress-interval", "0", "--fs-group", "2000"])
        .arg(&data)
        .arg("--volume")
        .arg(format!("{},owner=1001:3000", cache.display()))
        .arg("--volume")
        .arg(format!("path={},fs-group=4000,read-only", logs.display())))
    .expect_code(0);
    let vols = volumes(&run);
    assert_eq!(vols.len(), 3, "{}", run.describe());
    for (v, p) in vols.iter().zip([&data, &cache, &logs]) {
        assert_eq!(v["path"], p.to_str().unwrap(), "{}", run.describe());
        assert_eq!(v["action"], "walked");
        assert_eq!(v["entries"], 104, "root + 2 dirs + 100 files + 1 symlink\n{}", run.describe());
    }
    assert_eq!(vols[1]["spec"], "owner=1001:3000");
    assert_all(&data, "fs-group 2000", |m| conforms(m, 2000, false) && m.uid == 999);
    assert_all(&cache, "owner 1001:3000", |m| {
        // --owner alone: ownership only, modes as they were.
        m.uid == 1001 && m.gid == 3000 && (m.kind == Kind::Symlink || m.mode & 0o070 != 0o070)
    });
    assert_all(&logs, "fs-group 4000 read-only", |m| conforms(m, 4000, true));
}

#[test]
#[ignore = "needs root, loop devices and mkfs.ext4"]
fn a_failing_volume_fails_the_run_but_the_others_are_prepared() {
    privileged(&["mkfs.ext4"]);
    let ro = LoopFs::new(FsKind::Ext4, 64);
    mixed_tree(&ro.path().join("v"));
    ro.remount_ro();
    let tmpfs = Tmpfs::new();
    let ok = tmpfs.path().join("ok");
    mixed_tree(&ok);
    let run = run(volprep()
        .args(["apply", "--report", "-", "--progress-interval", "0", "--fs-group", "2000"])
        .arg(ro.path().join("v"))
        .arg(&ok))
    .expect_code(1);
    let vols = volumes(&run);
    assert_eq!(vols.len(), 2);
    assert!(vols[0]["errors"].as_u64().unwrap() > 0, "{}", run.describe());
    assert_eq!(vols[0]["error_list"][0]["errno"], "EROFS", "{}", run.describe());
    assert_eq!(vols[1]["errors"], 0);
    assert_all(&ok, "the healthy volume", |m| conforms(m, 2000, false));
}

#[test]
#[ignore = "needs root and loop devices"]
fn volumes_and_sticky_dirs_from_the_environment() {
    privileged(&[]);
    let tmpfs = Tmpfs::new();
    let (a, b, tmp) = (tmpfs.path().join("a"), tmpfs.path().join("b"), tmpfs.path().join("tmp"));
    mixed_tree(&a);
    mixed_tree(&b);
    let run = run(volprep()
        .args(["apply", "--report", "-", "--progress-interval", "0"])
        .env("VOLPREP_VOLUMES", format!("{},fs-group=2000;\n{},fs-group=3000\n", a.display(), b.display()))
        .env("VOLPREP_STICKY", &tmp))
    .expect_code(0);
    assert_eq!(volumes(&run).len(), 3, "{}", run.describe());
    assert_all(&a, "a", |m| conforms(m, 2000, false));
    assert_all(&b, "b", |m| conforms(m, 3000, false));
    assert_eq!(std::fs::metadata(&tmp).unwrap().mode() & 0o7777, 0o1777);
}

#[test]
#[ignore = "needs root and loop devices"]
fn sticky_creates_fixes_and_leaves_alone() {
    privileged(&[]);
    let tmpfs = Tmpfs::new();
    let (missing, open, right) = (tmpfs.path().join("missing"), tmpfs.path().join("open"), tmpfs.path().join("right"));
    for (d, mode) in [(&open, 0o777), (&right, 0o1777)] {
        std::fs::create_dir(d).unwrap();
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(mode)).unwrap();
    }
    std::fs::write(open.join("keep"), b"x").unwrap();
    std::fs::set_permissions(open.join("keep"), std::fs::Permissions::from_mode(0o600)).unwrap();
    let before_right = snapshot(&right);
    // check: would change two of the three, changes nothing.
    let check = run(volprep()
        .args(["check", "--report", "-", "--sticky"])
        .arg(&missing)
        .arg("--sticky")
        .arg(&open)
        .arg("--sticky")
        .arg(&right));
    assert_eq!(check.code, 3, "{}", check.describe());
    assert!(!missing.exists());
    let applied = run(volprep()
        .args(["apply", "--report", "-", "--sticky"])
        .arg(&missing)
        .arg("--sticky")
        .arg(&open)
        .arg("--sticky")
        .arg(&right))
    .expect_code(0);
    let vols = volumes(&applied);
    assert_eq!(vols.len(), 3);
    assert_eq!((vols[0]["sticky"]["created"].as_bool(), vols[0]["changed_mode"].as_u64()), (Some(true), Some(1)));
    assert_eq!(vols[1]["sticky"]["mode_before"], "0777");
    assert_eq!((vols[2]["sticky"]["mode_before"].as_str(), vols[2]["changed_mode"].as_u64()), (Some("1777"), Some(0)));
    for d in [&missing, &open, &right] {
        assert_eq!(std::fs::metadata(d).unwrap().mode() & 0o7777, 0o1777, "{}", d.display());
    }
    // Not recursive: the file inside keeps its mode; the right one is untouched (ctime too).
    assert_eq!(std::fs::metadata(open.join("keep")).unwrap().mode() & 0o7777, 0o600);
    assert_same(&before_right, &snapshot(&right), |m| m.attrs_ctime(), "an already-right temp dir");
    // A second run changes nothing.
    let again = run(volprep().args(["check", "--sticky"]).arg(&missing).arg("--sticky").arg(&open));
    assert_eq!(again.code, 0, "{}", again.describe());
}

#[test]
fn sticky_refuses_a_symlink_and_a_missing_parent() {
    let dir = tempfile::tempdir().unwrap();
    let outside = dir.path().join("outside");
    std::fs::create_dir(&outside).unwrap();
    std::fs::set_permissions(&outside, std::fs::Permissions::from_mode(0o755)).unwrap();
    let vol = dir.path().join("vol");
    std::fs::create_dir(&vol).unwrap();
    symlink(&outside, vol.join("tmp")).unwrap();
    let before = std::fs::metadata(&outside).unwrap();
    let refused = run(volprep().arg("apply").arg("--sticky").arg(vol.join("tmp")));
    assert_eq!(refused.code, 1, "{}", refused.describe());
    assert!(refused.stderr.contains("symlink"), "{}", refused.describe());
    let after = std::fs::metadata(&outside).unwrap();
    assert_eq!((after.mode(), after.ctime(), after.ctime_nsec()), (before.mode(), before.ctime(), before.ctime_nsec()));
    let refused = run(volprep().arg("apply").arg("--sticky").arg(dir.path().join("no/such/tmp")));
    assert_eq!(refused.code, 1, "{}", refused.describe());
    assert!(!dir.path().join("no").exists());
}

/// `ruby -e 'puts Dir.tmpdir'` as uid/gid 65534 with TMPDIR=dir.
fn ruby_tmpdir(dir: &Path) -> (String, String) {
    let mut cmd = Command::new("ruby");
    cmd.args(["-rtmpdir", "-e", "puts Dir.tmpdir"]).env("TMPDIR", dir).current_dir("/");
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            if libc::setgroups(0, std::ptr::null()) != 0 || libc::setgid(NOBODY) != 0 || libc::setuid(NOBODY) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let out = cmd.output().expect("run ruby");
    assert!(out.status.success(), "ruby failed: {}", String::from_utf8_lossy(&out.stderr));
    (String::from_utf8_lossy(&out.stdout).trim().to_string(), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
#[ignore = "needs root and ruby (apt-get install ruby)"]
fn ruby_accepts_the_prepared_tmp_dir_as_a_non_root_user() {
    privileged(&["ruby"]);
    // An emptyDir as the kubelet makes it: world-writable, no sticky bit.
    let tmpfs = Tmpfs::new();
    let tmp = tmpfs.path().join("tmp");
    std::fs::create_dir(&tmp).unwrap();
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o777)).unwrap();
    let (before, warning) = ruby_tmpdir(&tmp);
    eprintln!("before volprep: Dir.tmpdir = {before:?}; ruby said: {}", warning.trim());
    assert_ne!(before, tmp.to_str().unwrap(), "Ruby must reject a world-writable dir without the sticky bit");
    assert!(warning.contains("world-writable"), "{warning}");
    run(volprep().arg("apply").arg("--sticky").arg(&tmp)).expect_code(0);
    let (after, warning) = ruby_tmpdir(&tmp);
    eprintln!("after volprep: Dir.tmpdir = {after:?}");
    assert_eq!(after, tmp.to_str().unwrap(), "ruby said: {warning}");
}
