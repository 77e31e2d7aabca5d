//! Bad input and failing volumes: fatal errors (exit 1, one stderr line naming the path),
//! usage errors (exit 2), per-entry errors (EROFS on a read-only mount, EPERM as non-root)
//! against `--max-errors`.

mod common;

use std::path::Path;

use common::snap::conforms;
use common::*;

/// A small tree (plain files; no chown needed, so it works as any user) whose entries need work.
fn plain_tree(dir: &Path) {
    std::fs::create_dir_all(dir.join("a/b")).unwrap();
    std::fs::write(dir.join("a/file"), b"x").unwrap();
    std::fs::write(dir.join("a/b/file"), b"y").unwrap();
}

#[track_caller]
fn assert_one_line_naming(run: &Run, path: &Path, cause: Option<&str>) {
    let lines = run.stderr_lines();
    assert_eq!(lines.len(), 1, "exactly one stderr line expected\n{}", run.describe());
    let p = path.to_string_lossy();
    assert!(lines[0].contains(p.as_ref()), "the stderr line should name {p}\n{}", run.describe());
    if let Some(cause) = cause {
        assert!(
            lines[0].to_lowercase().contains(&cause.to_lowercase()),
            "the stderr line should say {cause:?}\n{}",
            run.describe()
        );
    }
}

#[test]
fn missing_path_is_fatal() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no-such-volume");
    // A group this process is in, so a non-root run gets as far as the path too.
    let gid = rustix::process::getegid().as_raw().to_string();
    for cmd in ["apply", "check"] {
        let run = run(volprep().args([cmd, "--fs-group", &gid]).arg(&missing)).expect_code(1);
        assert_one_line_naming(&run, &missing, None);
    }
    assert!(!missing.exists(), "a missing volume is not created");
}

#[test]
fn regular_file_path_is_not_a_directory() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("file");
    std::fs::write(&file, b"x").unwrap();
    let gid = rustix::process::getegid().as_raw().to_string();
    for cmd in ["apply", "check"] {
        let run = run(volprep().args([cmd, "--fs-group", &gid]).arg(&file)).expect_code(1);
        assert_one_line_naming(&run, &file, Some("not a directory"));
    }
}

#[test]
fn bad_ids_are_usage_errors() {
    let dir = tempfile::tempdir().unwrap();
    plain_tree(dir.path());
    let before = snapshot(dir.path());
    for args in [
        &["--fs-group", "-1"][..],
        &["--fs-group", "4294967295"],
        &["--fs-group", "abc"],
        &["--fs-group", ""],
        &["--fs-group", "2000x"],
        &["--owner", "abc"],
        &["--owner", "-1"],
        &["--owner", "4294967295"],
        &["--owner", "1000:-1"],
        &["--owner", "1000:abc"],
    ] {
        for cmd in ["apply", "check"] {
            let run = run(volprep().arg(cmd).args(args).arg(dir.path())).expect_code(2);
            assert!(!run.stderr.trim().is_empty(), "a usage error says why\n{}", run.describe());
        }
    }
    assert_same(&before, &snapshot(dir.path()), Meta::attrs_ctime, "usage errors changed the tree");
}

#[test]
fn no_spec_is_a_usage_error() {
    let dir = tempfile::tempdir().unwrap();
    plain_tree(dir.path());
    let before = snapshot(dir.path());
    for cmd in ["apply", "check"] {
        let run = run(volprep().arg(cmd).arg(dir.path())).expect_code(2);
        assert!(!run.stderr.trim().is_empty(), "{}", run.describe());
    }
    // A bad value in the environment is a usage error too.
    run(volprep().arg("apply").arg(dir.path()).env("VOLPREP_FS_GROUP", "abc")).expect_code(2);
    assert_same(&before, &snapshot(dir.path()), Meta::attrs_ctime, "usage errors changed the tree");
}

#[test]
#[ignore = "needs root, loop devices and mkfs.ext4"]
fn read_only_mount_reports_erofs() {
    privileged(&["mkfs.ext4"]);
    let fs = LoopFs::new(FsKind::Ext4, 64);
    let vol = fs.path().join("vol");
    let mut t = Tree::new();
    t.root(0, 0, 0o755).dir("d", 0, 0, 0o755).file("d/f", 0, 0, 0o644).file("g", 1000, 1000, 0o600);
    t.file("ok", 0, 2000, 0o660);
    // Names the report must escape: a non-UTF-8 byte as \xNN, a backslash as \\.
    t.file(b"caf\xe9", 0, 0, 0o644).file(r"back\slash", 0, 0, 0o644);
    t.build(&vol);
    fs.remount_ro();
    let before = snapshot(&vol);
    let needing = before.values().filter(|m| !conforms(m, 2000, false)).count() as u64;

    let run = pass("apply", &["--fs-group", "2000"], &vol).expect_code(1);
    let errors = run.count("errors");
    assert!(errors >= needing, "every entry needing a change fails ({needing})\n{}", run.describe());
    let list = run.volume()["error_list"].as_array().cloned().unwrap_or_default();
    assert!(!list.is_empty(), "error_list names the failures\n{}", run.describe());
    assert!(
        list.iter().any(|e| e["errno"] == "EROFS" && (e["op"] == "chown" || e["op"] == "chmod")),
        "a chown/chmod failed with EROFS\n{}",
        run.describe()
    );
    assert!(list.iter().all(|e| e["errno"] == "EROFS"), "only EROFS errors\n{}", run.describe());
    let paths: Vec<&str> = list.iter().filter_map(|e| e["path"].as_str()).collect();
    assert!(
        paths.iter().any(|p| p.to_lowercase().ends_with(r"/caf\xe9")),
        r"a non-UTF-8 byte appears as \xNN in error_list paths: {paths:?}"
    );
    assert!(
        paths.iter().any(|p| p.ends_with(r"/back\\slash")),
        r"a backslash appears as \\ in error_list paths: {paths:?}"
    );

    let tolerant = pass("apply", &["--fs-group", "2000", "--max-errors", "1000"], &vol).expect_code(0);
    assert_eq!(tolerant.count("errors"), errors, "errors are still counted\n{}", tolerant.describe());

    // The threshold is "more than N": exactly `errors` tolerated passes, one fewer fails.
    let limit = errors.to_string();
    pass("apply", &["--fs-group", "2000", "--max-errors", &limit], &vol).expect_code(0);
    let below = (errors - 1).to_string();
    pass("apply", &["--fs-group", "2000", "--max-errors", &below], &vol).expect_code(1);

    // `check` writes nothing: a read-only volume is no obstacle to it.
    let check = pass("check", &["--fs-group", "2000"], &vol).expect_code(3);
    assert_eq!(check.count("errors"), 0, "{}", check.describe());
    assert_same(&before, &snapshot(&vol), Meta::attrs_ctime, "a read-only volume changed");
}

/// Not root is the unprivileged mode (tests/unprivileged.rs has the rest): a group the process
/// is not in is refused before anything is read; with the group, root's entries are listed,
/// not failed on, and none changes.
#[test]
#[ignore = "needs root and loop devices"]
fn non_root_changes_nothing_of_roots() {
    privileged(&[]);
    let fs = Tmpfs::new();
    let vol = fs.path().join("vol");
    let mut t = Tree::new();
    t.root(0, 0, 0o755).dir("d", 0, 0, 0o755).file("d/f", 0, 0, 0o644).file("g", 0, 0, 0o644);
    t.build(&vol);
    let before = snapshot(&vol);
    let as_nobody = |groups: &[u32]| {
        let mut cmd = volprep();
        cmd.args(["apply", "--fs-group", "2000", "--report", "-"]).arg(&vol);
        as_user(&mut cmd, 65534, 65534, groups);
        run(&mut cmd)
    };
    let refused = as_nobody(&[]).expect_code(2);
    assert!(refused.stderr.contains("supplementalGroups: [2000]"), "{}", refused.describe());
    let partial = as_nobody(&[2000]).expect_code(4);
    assert_eq!(partial.count("errors"), 0, "{}", partial.describe());
    assert_eq!(partial.count("foreign_owned"), t.len() as u64, "every entry is root's\n{}", partial.describe());
    assert_eq!(partial.count("changed_owner") + partial.count("changed_mode"), 0, "{}", partial.describe());
    assert_same(&before, &snapshot(&vol), Meta::attrs_ctime, "nobody changed root's files");
}

/// A panic in one volume's pass (the test hook makes a walker thread panic once a volume has
/// counted 40 entries) fails that volume only: exit 1, its report entry failed with the panic's
/// message, the termination message says "internal error", its marker is not `done`; a smaller
/// volume of the same run (it never reaches 40 entries) is prepared and marked done.
#[test]
#[ignore = "needs root, loop devices, mkfs.ext4 and --features test-hooks"]
fn a_panic_in_a_volume_fails_that_volume_only() {
    privileged(&["mkfs.ext4"]);
    let fs = LoopFs::new(FsKind::Ext4, 64);
    let (big, small) = (fs.path().join("big"), fs.path().join("small"));
    let mut t = Tree::new();
    t.root(0, 0, 0o755);
    for d in 0..4 {
        t.dir(format!("d{d}"), 0, 0, 0o700);
        for f in 0..50 {
            t.file(format!("d{d}/f{f}"), 0, 0, 0o600);
        }
    }
    t.build(&big);
    let mut t = Tree::new();
    t.root(0, 0, 0o755).file("f", 0, 0, 0o600);
    t.build(&small);
    let out = tempfile::tempdir().unwrap();
    let term = out.path().join("termination-log");
    let mut cmd = volprep();
    common::kill::hook(&mut cmd, "VOLPREP_TEST_PANIC_AFTER", "40")
        .args(["apply", "--fs-group", "2000", "--threads", "4", "--report", "-", "--termination-log"])
        .arg(&term)
        .args([&big, &small]);
    let r = run(&mut cmd).expect_code(1);
    let report = r.report();
    let vols = report["volumes"].as_array().unwrap_or_else(|| panic!("{}", r.describe()));
    let of = |p: &Path| vols.iter().find(|v| v["path"] == p.to_str().unwrap()).unwrap().clone();
    let v = of(&big);
    assert_eq!(v["action"], "failed", "{v}\n{}", r.describe());
    let fatal = v["fatal"].as_str().unwrap_or_default();
    assert!(fatal.contains("internal error: test hook VOLPREP_TEST_PANIC_AFTER: a panic after 40 entries"), "{fatal}");
    let message = std::fs::read_to_string(&term).unwrap();
    assert!(message.contains("failed") && message.contains("internal error: "), "{message}");
    let state = common::xattr::xattr_json(&big, common::xattr::MARKER).map(|m| m["state"].clone());
    assert_ne!(state, Some("done".into()), "the failed volume is not marked done");
    let s = of(&small);
    assert_eq!((s["action"].as_str(), s["marker_after"].as_str()), (Some("walked"), Some("done")), "{s}");
    assert!(r.stderr.contains("internal error"), "{}", r.describe());
}

/// With JSON logs, a panic is one JSON line like every other (with where in the code it was
/// raised), not Rust's raw "thread … panicked at" text, which would break a log pipeline.
#[test]
#[cfg_attr(not(feature = "test-hooks"), ignore = "needs --features test-hooks")]
fn a_panic_is_logged_as_one_json_line() {
    let vol = tempfile::tempdir().unwrap();
    std::fs::create_dir(vol.path().join("d")).unwrap();
    std::fs::write(vol.path().join("d/f"), "x").unwrap();
    let mut cmd = volprep();
    common::kill::hook(&mut cmd, "VOLPREP_TEST_PANIC_AFTER", "1")
        .args(["check", "--fs-group", "2000", "--log-format", "json", "--threads", "2"])
        .arg(vol.path());
    let r = run(&mut cmd).expect_code(1);
    let lines: Vec<serde_json::Value> = r
        .stderr
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not a JSON line ({e}): {l}\n{}", r.describe())))
        .collect();
    let hook = lines.iter().find(|l| l["at"].as_str().is_some_and(|at| at.starts_with("src/")));
    let hook = hook.unwrap_or_else(|| panic!("no line says where the panic was raised\n{}", r.describe()));
    assert_eq!(hook["level"], "ERROR", "{hook}");
    assert!(hook["message"].as_str().unwrap().starts_with("internal error: test hook"), "{hook}");
}

/// Threads the machine refuses (RLIMIT_NPROC reached) are a failure of the environment: exit 1,
/// one line saying so, not the usage error (exit 2) of a bad command line.
#[test]
#[ignore = "needs root and loop devices"]
fn threads_that_cannot_start_are_a_failure_not_a_usage_error() {
    privileged(&[]);
    let dir = tempfile::tempdir().unwrap();
    let vol = dir.path().join("vol");
    plain_tree(&vol);
    // A uid with no other process: the limit of 1 is this process, so no thread can start (the
    // limit does not hold for root, hence the setuid).
    let mut cmd = volprep();
    cmd.args(["inspect", "--threads", "4"]).arg(&vol);
    as_user(&mut cmd, 54321, 54321, &[]);
    // SAFETY: only async-signal-safe setrlimit runs between fork and exec.
    unsafe {
        use std::os::unix::process::CommandExt as _;
        cmd.pre_exec(|| {
            let lim = libc::rlimit { rlim_cur: 1, rlim_max: 1 };
            if libc::setrlimit(libc::RLIMIT_NPROC, &lim) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let r = run(&mut cmd).expect_code(1);
    assert!(r.stderr.contains("cannot start 4 threads"), "{}", r.describe());
}
