//! Unprivileged mode (issue 16): volprep run as the app's own user (uid 1000, groups 1000 and
//! 2000, no capabilities, as in a `restricted` pod) fixes only the entries it owns, leaves every
//! other entry exactly as it was, lists the ones that do not conform, and says so in the exit
//! code (4) and the marker (`in-progress`, walked again next time). Real filesystems: a loop
//! ext4 (with its root-owned `lost+found`) and tmpfs.

mod common;

use std::collections::BTreeSet;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use common::kill;
use common::mixed::{self, APP, GROUP, expected_left, mixed_tree};
use common::snap::{self, ROOT};
use common::*;

/// `volprep COMMAND ARGS... --report - PATH` as uid/gid APP with the supplementary `groups`.
fn as_app(command: &str, args: &[&str], groups: &[u32], path: &Path) -> Run {
    let mut cmd = volprep();
    cmd.arg(command).args(args).args(["--report", "-", "--log-format", "text"]).arg(path);
    as_user(&mut cmd, APP, APP, groups);
    run(&mut cmd)
}

/// The report's `foreign_owned_list`, as (path relative to `vol`, `.` for the root; unread).
fn listed(r: &Run, vol: &Path) -> BTreeSet<(String, bool)> {
    mixed::listed(&r.volume(), vol)
}

/// A loop ext4 of `mib` MiB whose mount point the app can reach (the temp dir above it is 0700).
fn ext4(mib: u64) -> LoopFs {
    let fs = LoopFs::new(FsKind::Ext4, mib);
    let parent = fs.path().parent().expect("mount point has a parent");
    std::fs::set_permissions(parent, std::fs::Permissions::from_mode(0o755)).expect("chmod mount parent");
    fs
}

#[test]
#[ignore = "needs root, loop devices and mkfs.ext4"]
fn mixed_owners_the_app_fixes_its_own_entries_and_lists_the_others() {
    privileged(&["mkfs.ext4"]);
    let fs = ext4(64);
    let vol = fs.path();
    let t = mixed_tree();
    t.build(vol);
    let before = snapshot(vol);
    assert_eq!(before[&b"lost+found"[..]].attrs().0, Kind::Dir, "ext4 has a lost+found");
    assert_eq!(mixed::left_by_app(&before, GROUP, &[GROUP]), expected_left(), "what must be left, as root sees it");
    let gid = GROUP.to_string();
    let spec = ["--fs-group", gid.as_str()];

    // check: counts what apply would change and what it would leave; changes nothing.
    let checked = as_app("check", &spec, &[GROUP], vol);
    assert_eq!(checked.code, 4, "check: entries would be left for a privileged run\n{}", checked.describe());
    assert!(checked.count("changed_owner") > 0 && checked.count("changed_mode") > 0, "{}", checked.describe());
    assert_eq!(listed(&checked, vol), expected_left(), "check lists what apply would leave\n{}", checked.describe());
    assert_same(&before, &snapshot(vol), |m| m.attrs_ctime(), "check changes nothing");

    let first = as_app("apply", &spec, &[GROUP], vol);
    assert_eq!(first.code, 4, "exit 4: partial\n{}", first.describe());
    let v = first.volume();
    assert_eq!(v["unprivileged"], true, "{}", first.describe());
    assert_eq!(
        (v["errors"].as_u64(), v["marker_after"].as_str()),
        (Some(0), Some("in-progress")),
        "{}",
        first.describe()
    );
    assert_eq!(listed(&first, vol), expected_left(), "{}", first.describe());
    assert_eq!(first.count("foreign_owned"), expected_left().len() as u64, "{}", first.describe());
    assert_eq!(first.count("foreign_unread_dirs"), 2, "{}", first.describe());
    mixed::assert_listed_as_they_are(&v, vol, &before, GROUP);
    let warning = first.stderr_lines().into_iter().find(|l| l.contains("entries owned by other users do not conform"));
    let warning = warning.unwrap_or_else(|| panic!("no log line about the entries left\n{}", first.describe()));
    for part in ["6 entries", "2 of them directories this user may not read", "A privileged run", "examples/fleet"] {
        assert!(warning.contains(part), "{part:?} missing from: {warning}");
    }
    assert!(warning.contains(&format!("volprep apply --fs-group=2000 {}", vol.display())), "{warning}");
    let first = warning.split("first: ").nth(1).and_then(|s| s.split(". A privileged").next()).unwrap_or_default();
    let prefix = format!("{}/", vol.display());
    let shown: BTreeSet<&str> = first.split(' ').filter_map(|p| p.strip_prefix(&prefix)).collect();
    assert_eq!(shown.len(), 5, "the first five paths: {warning}");
    assert!(shown.iter().all(|p| expected_left().iter().any(|(e, _)| e == p)), "{shown:?}");

    // Every entry of the app conforms now, exactly as the kubelet would leave it; every other
    // entry is untouched, ctime included (the root is the app's: it is fixed too).
    let after = snapshot(vol);
    let fixed = mixed::assert_app_fixed_others_untouched(&before, &after, GROUP, "first run");
    assert_eq!(fixed, 13, "the app's entries, the root included");
    assert_eq!(after[&b"app/suid"[..]].mode, 0o4775, "setuid comes back after the app's chgrp cleared it");
    assert_eq!(after[&b"app/sgid"[..]].mode, 0o2775, "setgid too");
    assert_eq!(after[ROOT].mode, 0o2775);

    // The marker says so, and `status` shows it.
    let status = run(volprep().args(["status", "--json"]).arg(vol)).expect_code(0);
    let s: serde_json::Value = serde_json::from_str(&status.stdout).unwrap();
    assert_eq!((s[0]["state"].as_str(), s[0]["marker"]["left"].as_u64()), (Some("in-progress"), Some(6)), "{status:?}");

    // The next run does not pretend: it walks again, says why, changes nothing, says the same.
    tick();
    let second = as_app("apply", &spec, &[GROUP], vol);
    assert_eq!(second.code, 4, "{}", second.describe());
    let reason = second.volume()["reason"].as_str().unwrap_or_default().to_string();
    assert!(reason.contains("left 6 entries of other users") && reason.contains("walking again"), "{reason}");
    assert_eq!((second.count("changed_owner"), second.count("changed_mode")), (0, 0), "{}", second.describe());
    assert_eq!(listed(&second, vol), expected_left());
    assert_eq!(second.volume()["marker_after"], "in-progress");
    // Nothing below the root changes, not even a ctime; the root's ctime moves only because the
    // marker (an xattr) is rewritten.
    let (mut after, mut again) = (after, snapshot(vol));
    assert_eq!(after.remove(ROOT).map(|m| m.attrs()), again.remove(ROOT).map(|m| m.attrs()));
    assert_same(&after, &again, |m| m.attrs_ctime(), "a second unprivileged run changes nothing");

    // `--allow-foreign`: the same walk, list, warning and in-progress marker, but exit 0 (a pod
    // may start on a volume whose root-owned lost+found the app never uses).
    let allowed = as_app("apply", &[&spec[..], &["--allow-foreign"]].concat(), &[GROUP], vol).expect_code(0);
    assert_eq!(listed(&allowed, vol), expected_left(), "{}", allowed.describe());
    assert_eq!(allowed.volume()["marker_after"], "in-progress", "{}", allowed.describe());
    assert!(
        allowed.stderr_lines().iter().any(|l| l.contains("WARN") && l.contains("left 6 entries of other users")),
        "{}",
        allowed.describe()
    );

    // A privileged run finishes the volume; after it the app's runs skip.
    let root_run = apply_fs_group(vol, GROUP, &[]);
    assert_eq!(root_run.volume()["marker_after"], "done", "{}", root_run.describe());
    assert_eq!(root_run.count("foreign_owned"), 0);
    for (path, m) in snapshot(vol) {
        assert!(snap::conforms(&m, GROUP, false), "{} after the privileged run: {m:?}", snap::show(&path));
    }
    let third = as_app("apply", &spec, &[GROUP], vol).expect_code(0);
    assert_eq!(third.volume()["action"], "skipped", "{}", third.describe());
}

#[test]
#[ignore = "needs root and loop devices"]
fn a_group_the_app_is_not_in_is_refused_before_any_change() {
    privileged(&[]);
    let tmpfs = Tmpfs::new();
    let (good, bad) = (tmpfs.path().join("good"), tmpfs.path().join("bad"));
    for vol in [&good, &bad] {
        mixed_tree().build(vol);
    }
    let before = (snapshot(&good), snapshot(&bad));
    // The whole spec is one group the app is not in; then one volume of two.
    for (args, groups) in [
        (vec!["--fs-group", "2000"], vec![3000]),
        (vec!["--fs-group", "3000", "--volume", &format!("{},fs-group=2000", bad.display())], vec![3000]),
    ] {
        let r = as_app("apply", &args, &groups, &good);
        assert_eq!(r.code, 2, "{}", r.describe());
        let lines = r.stderr_lines();
        assert_eq!(lines.len(), 1, "one line: {}", r.describe());
        for part in ["ERROR", "group 2000 is not one of this process's groups", "supplementalGroups: [2000]"] {
            assert!(lines[0].contains(part), "{part:?} missing: {}", lines[0]);
        }
        assert!(r.stdout.is_empty(), "no report: nothing was done\n{}", r.describe());
        assert_same(&before.0, &snapshot(&good), |m| m.attrs_ctime(), "first volume untouched");
        assert_same(&before.1, &snapshot(&bad), |m| m.attrs_ctime(), "second volume untouched");
        let status = run(volprep().arg("status").arg(&good).arg(&bad)).expect_code(0);
        assert_eq!(status.stdout.matches("no marker").count(), 2, "{}", status.describe());
    }
}

#[test]
#[ignore = "needs root and loop devices"]
fn owner_is_a_usage_error_when_unprivileged() {
    privileged(&[]);
    let tmpfs = Tmpfs::new();
    let vol = tmpfs.path().join("vol");
    mixed_tree().build(&vol);
    let before = snapshot(&vol);
    let as_root = |args: &[&str], env: Option<(&str, &str)>| {
        let mut cmd = volprep();
        cmd.arg("apply").args(args).arg(&vol);
        if let Some((k, v)) = env {
            cmd.env(k, v);
        }
        run(&mut cmd)
    };
    let runs = [
        as_app("apply", &["--owner", "1000:2000"], &[GROUP], &vol),
        as_app("apply", &["--fs-group", "2000", "--owner", "1000"], &[GROUP], &vol),
        as_root(&["--unprivileged", "--owner", "1000"], None),
        as_root(&["--owner", "1000"], Some(("VOLPREP_UNPRIVILEGED", "true"))),
    ];
    for r in runs {
        assert_eq!(r.code, 2, "{}", r.describe());
        let lines = r.stderr_lines();
        assert_eq!(lines.len(), 1, "{}", r.describe());
        assert!(lines[0].contains("--owner needs root"), "{}", lines[0]);
    }
    assert_same(&before, &snapshot(&vol), |m| m.attrs_ctime(), "nothing changed");
}

/// A volume root of another user that the app may not write (a fresh volume is root's): the
/// app's entries are fixed all the same; there is no marker, so every start walks.
#[test]
#[ignore = "needs root and loop devices"]
fn a_root_the_app_may_not_write_gets_no_marker_but_its_entries_are_fixed() {
    privileged(&[]);
    let tmpfs = Tmpfs::new();
    let vol = tmpfs.path().join("vol");
    let mut t = mixed_tree();
    t.root(0, 0, 0o755);
    t.build(&vol);
    let r = as_app("apply", &["--fs-group", "2000"], &[GROUP], &vol);
    assert_eq!(r.code, 4, "{}", r.describe());
    let v = r.volume();
    assert_eq!((v["marker_after"].as_str(), v["errors"].as_u64()), (Some("none"), Some(0)), "{}", r.describe());
    assert!(listed(&r, &vol).contains(&(".".to_string(), false)), "the root itself is listed\n{}", r.describe());
    assert!(r.stderr.contains("the root is not writable by this user"), "{}", r.describe());
    for (path, m) in snapshot(&vol) {
        if m.uid == APP {
            assert!(snap::conforms(&m, GROUP, false), "{}: {m:?}", snap::show(&path));
        }
    }
}

/// An unprivileged pass killed midway resumes like a root one (top-level subtrees it finished
/// are not read again; one holding an entry of another user is never "finished") and ends the
/// same: the app's entries conform, the others are untouched and listed, exit 4.
#[test]
#[ignore = "needs root, loop devices, mkfs.ext4 and --features test-hooks"]
fn a_killed_unprivileged_pass_resumes_and_ends_the_same() {
    privileged(&["mkfs.ext4"]);
    // Every file holds its path: one 4 KiB block each.
    let fs = ext4(512);
    let vol = fs.path().join("vol");
    let (tops, per_top) = (40, 1000);
    let mut t = Tree::new();
    t.root(APP, APP, 0o755);
    for i in 0..tops {
        t.dir(format!("top{i:02}"), APP, APP, 0o755);
        for f in 0..per_top {
            t.file(format!("top{i:02}/f{f}"), APP, APP, 0o644);
        }
        if i % 4 == 0 {
            t.file(format!("top{i:02}/root-owned"), 0, 0, 0o644);
        }
    }
    t.build(&vol);
    let before = snapshot(&vol);
    let args = ["--fs-group", "2000", "--threads", "2", "--checkpoint-interval", "10ms"];

    let mut cmd = volprep();
    cmd.arg("apply").args(args).arg(&vol);
    as_user(&mut cmd, APP, APP, &[GROUP]);
    let log = kill::killed_at(cmd, before.len() as u64 / 2);
    assert!(log.contains("decision=\"walk\"") || log.contains("decision=walk"), "{log}");

    let r = as_app("apply", &args, &[GROUP], &vol);
    assert_eq!(r.code, 4, "{}", r.describe());
    let reason = r.volume()["reason"].as_str().unwrap_or_default().to_string();
    assert!(reason.contains("did not finish") && reason.ends_with(": resuming"), "{reason}");
    let skipped = r.count("skipped_subtrees");
    assert!(skipped > 0, "finished subtrees are not read again\n{}", r.describe());
    assert!(skipped <= (tops - tops / 4) as u64, "a subtree with a root-owned file is never finished: {skipped}");
    let want: BTreeSet<(String, bool)> =
        (0..tops).step_by(4).map(|i| (format!("top{i:02}/root-owned"), false)).collect();
    assert_eq!(listed(&r, &vol), want, "{}", r.describe());
    assert_eq!(r.volume()["marker_after"], "in-progress");
    for (path, a) in snapshot(&vol) {
        let b = before[&path];
        if b.uid == APP {
            assert!(snap::conforms(&a, GROUP, false), "{}: {a:?}", snap::show(&path));
        } else {
            assert_eq!(a.attrs_ctime(), b.attrs_ctime(), "{}", snap::show(&path));
        }
    }
}
