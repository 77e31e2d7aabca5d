//! `volprep inspect`: each finding counted exactly on a known tree, serial and parallel runs
//! agree, and nothing on disk changes.

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt, lchown, symlink};
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

mod common;

/// A group nobody in the tree has.
const FS_GROUP: u32 = 4242;

/// Runs `volprep inspect ARGS` without any `VOLPREP_*` variable of the test's environment;
/// returns (exit code, stdout, stderr).
fn inspect(args: &[&str], path: &Path) -> (i32, String, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_volprep"));
    for (k, _) in std::env::vars() {
        if k.starts_with("VOLPREP_") || k == "RUST_LOG" {
            cmd.env_remove(k);
        }
    }
    let out = cmd.arg("inspect").args(args).arg(path).output().expect("run volprep");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `inspect --json ARGS PATH`, expecting exit 0.
#[track_caller]
fn inspect_json(args: &[&str], path: &Path) -> Value {
    let mut all = vec!["--json"];
    all.extend_from_slice(args);
    let (code, stdout, stderr) = inspect(&all, path);
    assert_eq!(code, 0, "inspect {all:?}: stdout:\n{stdout}\nstderr:\n{stderr}");
    serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("not JSON ({e}):\n{stdout}"))
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// A tmpfs mounted on a directory, unmounted on drop (also when the test panics).
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(at: &Path) -> Result<Tmpfs, String> {
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=1m,mode=0755", "tmpfs"])
            .arg(at)
            .output()
            .map_err(|e| format!("cannot run mount: {e}"))?;
        if !out.status.success() {
            return Err(format!("mount tmpfs failed: {}", String::from_utf8_lossy(&out.stderr).trim()));
        }
        Ok(Tmpfs(at.to_path_buf()))
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let ok = Command::new("umount").arg(&self.0).status().is_ok_and(|s| s.success());
        if !ok {
            let _ = Command::new("umount").arg("-l").arg(&self.0).status();
        }
    }
}

/// (uid, gid, mode, ctime) of every entry, by path relative to `root`; never follows a symlink.
type Snapshot = BTreeMap<PathBuf, (u32, u32, u32, i64, i64)>;

fn snapshot(root: &Path) -> Snapshot {
    fn walk(root: &Path, rel: &Path, out: &mut Snapshot) {
        let m = fs::symlink_metadata(root.join(rel)).expect("lstat");
        out.insert(rel.to_path_buf(), (m.uid(), m.gid(), m.mode(), m.ctime(), m.ctime_nsec()));
        if m.file_type().is_dir() {
            for e in fs::read_dir(root.join(rel)).expect("readdir") {
                walk(root, &rel.join(e.expect("entry").file_name()), out);
            }
        }
    }
    let mut out = Snapshot::new();
    walk(root, Path::new(""), &mut out);
    out
}

/// The test volume (16 entries), every mode set explicitly:
///
/// ```text
/// .        0755           a/ 0755  f1 0644, f2 0664, f3 0664, up -> ../../.., in2 -> ../b/g1
/// t/       1777 (sticky)  b/ 0777  g1 0660                     (world-writable, no sticky)
/// abs -> /etc/passwd      c/ 2770  h1 0600, h2 0660
/// in -> a/f1, dotdot -> ..
/// ```
///
/// As root, `a/`, `b/` and `c/` and everything in them belong to 100, 200 and 300; the rest
/// to 0. `m/` is made for a nested mount (it is not counted when a filesystem is mounted on it).
fn build(root: &Path, owners: bool) {
    let dir = |p: &str, mode: u32| {
        let p = root.join(p);
        fs::create_dir_all(&p).unwrap();
        fs::set_permissions(&p, fs::Permissions::from_mode(mode)).unwrap();
    };
    let file = |p: &str, mode: u32| {
        let p = root.join(p);
        fs::write(&p, b"x").unwrap();
        fs::set_permissions(&p, fs::Permissions::from_mode(mode)).unwrap();
    };
    let link = |p: &str, target: &str| symlink(target, root.join(p)).unwrap();
    dir("", 0o755);
    dir("a", 0o755);
    file("a/f1", 0o644);
    file("a/f2", 0o664);
    file("a/f3", 0o664);
    link("a/up", "../../..");
    link("a/in2", "../b/g1");
    dir("b", 0o777);
    file("b/g1", 0o660);
    dir("c", 0o2770);
    file("c/h1", 0o600);
    file("c/h2", 0o660);
    dir("t", 0o1777);
    link("abs", "/etc/passwd");
    link("in", "a/f1");
    link("dotdot", "..");
    if owners {
        for (sub, id) in [("a", 100), ("b", 200), ("c", 300)] {
            for e in fs::read_dir(root.join(sub)).unwrap() {
                lchown(e.unwrap().path(), Some(id), Some(id)).unwrap();
            }
            lchown(root.join(sub), Some(id), Some(id)).unwrap();
            // chown clears setgid on c/: set it again.
            if sub == "c" {
                fs::set_permissions(root.join(sub), fs::Permissions::from_mode(0o2770)).unwrap();
            }
        }
        lchown(root, Some(0), Some(0)).unwrap();
    }
}

fn volume() -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::Builder::new().prefix("volprep-inspect-").tempdir().unwrap();
    let root = tmp.path().join("vol");
    (tmp, root)
}

fn strings(v: &Value) -> Vec<&str> {
    v.as_array().unwrap().iter().map(|s| s.as_str().unwrap()).collect()
}

/// The findings that do not depend on owners or mounts.
#[track_caller]
fn assert_mode_and_link_findings(r: &Value) {
    assert_eq!(
        (&r["entries"], &r["dirs"], &r["files"], &r["symlinks"], &r["others"]),
        (&16.into(), &5.into(), &6.into(), &5.into(), &0.into()),
        "{r:#}"
    );
    assert_eq!((&r["file_mask"], &r["dir_mask"]), (&"0660".into(), &"2770".into()));
    let lacking = &r["lacking_group_bits"];
    assert_eq!(lacking["count"], 6, "{lacking}");
    assert_eq!(strings(&lacking["examples"]), [".", "a", "a/f1", "b", "c/h1", "t"]);
    let setgid = &r["dirs_without_setgid"];
    assert_eq!(setgid["count"], 4);
    assert_eq!(strings(&setgid["examples"]), [".", "a", "b", "t"]);
    let ww = &r["world_writable_dirs_without_sticky"];
    assert_eq!(ww["count"], 1);
    assert_eq!(strings(&ww["examples"]), ["b"]);
    let out = &r["symlinks_outside"];
    assert_eq!(out["count"], 3, "{out}");
    let links: Vec<(&str, &str)> = out["examples"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| (l["path"].as_str().unwrap(), l["target"].as_str().unwrap()))
        .collect();
    assert_eq!(links, [("a/up", "../../.."), ("abs", "/etc/passwd"), ("dotdot", "..")]);
    assert_eq!(r["errors"], 0, "{r:#}");
}

#[track_caller]
fn assert_fs_group_view(r: &Value, root_gid: u32) {
    let g = &r["fs_group"];
    assert_eq!(g["gid"], FS_GROUP);
    let k = &g["kubelet"];
    assert_eq!((&k["rewrites"], &k["chowns"], &k["chmods"]), (&16.into(), &16.into(), &11.into()));
    assert_eq!(k["on_root_mismatch"], "walks");
    assert_eq!(k["reason"], format!("root group {root_gid} is not fsGroup {FS_GROUP}"));
    let a = &g["volprep_apply"];
    assert_eq!((&a["changed"], &a["changed_owner"], &a["changed_mode"]), (&16.into(), &16.into(), &6.into()));
}

#[test]
fn reports_modes_links_and_what_would_change() {
    let (_tmp, root) = volume();
    build(&root, false);
    let before = snapshot(&root);
    let r = inspect_json(&["--fs-group", &FS_GROUP.to_string()], &root);
    assert_mode_and_link_findings(&r);
    assert_fs_group_view(&r, fs::metadata(&root).unwrap().gid());
    assert_eq!(r["nested_mounts"]["count"], 0);
    let owners = r["owners"].as_array().unwrap();
    assert_eq!(owners.len(), 1, "{owners:?}");
    assert_eq!(owners[0]["entries"], 16);
    assert_eq!(owners[0]["top_dirs"], Value::Array(vec![]), "the majority owner lists no dirs");
    assert_eq!(snapshot(&root), before, "inspect changed something");
}

#[test]
#[ignore = "needs root and loop devices"]
fn reports_three_owners_and_a_nested_mount_and_changes_nothing() {
    let test = "reports_three_owners_and_a_nested_mount_and_changes_nothing";
    assert!(is_root(), "{test}: cannot run: needs root (chown, mount)");
    let (_tmp, root) = volume();
    build(&root, true);
    fs::create_dir(root.join("m")).unwrap();
    let _mount = match Tmpfs::mount(&root.join("m")) {
        Ok(m) => m,
        Err(why) => panic!("{test}: cannot run: {why}"),
    };
    fs::write(root.join("m/inside"), b"not counted").unwrap();
    let before = snapshot(&root);

    let r = inspect_json(&["--fs-group", &FS_GROUP.to_string(), "--threads", "4"], &root);
    assert_mode_and_link_findings(&r);
    assert_fs_group_view(&r, 0);
    assert_eq!(r["nested_mounts"]["count"], 1);
    assert_eq!(strings(&r["nested_mounts"]["examples"]), ["m"]);
    let owners: Vec<String> = r["owners"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| {
            let dirs: Vec<String> = o["top_dirs"]
                .as_array()
                .unwrap()
                .iter()
                .map(|d| format!("{} ({})", d["path"].as_str().unwrap(), d["entries"]))
                .collect();
            format!("{}:{} {} [{}]", o["uid"], o["gid"], o["entries"], dirs.join(", "))
        })
        .collect();
    assert_eq!(owners, ["100:100 6 []", "0:0 5 [. (4), t (1)]", "300:300 3 [c (3)]", "200:200 2 [b (2)]"], "{r:#}");

    // The human table names the same things.
    let (code, text, stderr) = inspect(&[], &root);
    assert_eq!(code, 0, "{stderr}");
    for needle in ["0:0", "100:100", "c (3)", "nested mounts (not entered)", "abs -> /etc/passwd"] {
        assert!(text.contains(needle), "{needle:?} missing in:\n{text}");
    }
    assert_eq!(snapshot(&root), before, "inspect changed something");
}

#[test]
fn serial_and_parallel_runs_agree() {
    let (_tmp, root) = volume();
    build(&root, false);
    let strip = |mut v: Value| {
        v.as_object_mut().unwrap().remove("elapsed_ms");
        v.as_object_mut().unwrap().remove("threads");
        v
    };
    let g = FS_GROUP.to_string();
    let one = strip(inspect_json(&["--fs-group", &g, "--threads", "1"], &root));
    let many = strip(inspect_json(&["--fs-group", &g, "--threads", "8"], &root));
    assert_eq!(one, many);
}

#[test]
fn on_root_mismatch_skips_a_conforming_root_and_apply_still_finds_work() {
    let (_tmp, root) = volume();
    fs::create_dir(&root).unwrap();
    fs::set_permissions(&root, fs::Permissions::from_mode(0o2770)).unwrap();
    let file = root.join("private");
    fs::write(&file, b"x").unwrap();
    fs::set_permissions(&file, fs::Permissions::from_mode(0o600)).unwrap();
    let gid = fs::metadata(&root).unwrap().gid().to_string();
    let r = inspect_json(&["--fs-group", &gid], &root);
    let g = &r["fs_group"];
    assert_eq!(g["kubelet"]["on_root_mismatch"], "skips", "{g}");
    assert_eq!(g["kubelet"]["reason"], Value::Null);
    assert_eq!((&g["volprep_apply"]["changed"], &g["volprep_apply"]["changed_mode"]), (&1.into(), &1.into()));
    let (code, text, _) = inspect(&["--fs-group", &gid], &root);
    assert_eq!(code, 0);
    assert!(text.contains("skips: the root conforms"), "{text}");
}

#[test]
fn human_table_is_aligned_and_without_fs_group_has_no_kubelet_part() {
    let (_tmp, root) = volume();
    build(&root, false);
    let (code, text, stderr) = inspect(&[], &root);
    assert_eq!(code, 0, "{stderr}");
    assert!(!text.contains("kubelet"), "{text}");
    let rows: Vec<&str> =
        text.lines().skip_while(|l| !l.starts_with("FINDING")).take_while(|l| !l.is_empty()).collect();
    assert_eq!(rows.len(), 11, "{text}");
    // COUNT is right-aligned: every row's count ends in the same column.
    let end = rows[0].find("COUNT").unwrap() + "COUNT".len();
    for row in &rows[1..] {
        assert!(row.as_bytes()[end - 1].is_ascii_digit(), "{row:?}\n{text}");
        assert!(row.len() == end || row.as_bytes()[end] == b' ', "{row:?}\n{text}");
    }
    assert!(text.contains("world-writable directories without sticky bit      1  b"), "{text}");
}

#[test]
fn a_missing_volume_is_a_one_line_error_with_exit_1() {
    let (_tmp, root) = volume();
    let (code, stdout, stderr) = inspect(&[], &root.join("absent"));
    assert_eq!(code, 1, "{stderr}");
    assert!(stdout.is_empty(), "{stdout}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("No such file or directory"), "{stderr}");
}

/// `inspect --owner`: a preview of a migration. It counts and lists the entries `apply --owner`
/// would change (the same count as `check`), with `--fs-group` too, and changes nothing.
#[test]
fn owner_preview_lists_the_entries_apply_would_change() {
    let (_tmp, root) = volume();
    build(&root, is_root());
    let before = snapshot(&root);
    let me = fs::metadata(&root).unwrap();

    // Everything belongs to someone else: every entry would change, owner only.
    let r = inspect_json(&["--owner", "4243:4243"], &root);
    let o = &r["owner"];
    assert_eq!((&o["uid"], &o["gid"]), (&4243.into(), &4243.into()), "{r:#}");
    let a = &o["volprep_apply"];
    assert_eq!((&a["changed"], &a["changed_owner"], &a["changed_mode"]), (&16.into(), &16.into(), &0.into()), "{o}");
    assert_eq!(o["would_change"]["count"], 16);
    assert_eq!(o["would_change"]["examples"].as_array().unwrap().len(), 16);
    assert!(r["fs_group"].is_null(), "no --fs-group, no kubelet view");

    // The volume's own owner: only the entries of the other owners would change.
    let own = format!("{}:{}", me.uid(), me.gid());
    let r = inspect_json(&["--owner", &own], &root);
    let wc = &r["owner"]["would_change"];
    if is_root() {
        // a/ and its 5 entries belong to 100, b/ and g1 to 200, c/ and its 2 files to 300.
        assert_eq!(wc["count"], 11, "{wc}");
        let want = ["a", "a/f1", "a/f2", "a/f3", "a/in2", "a/up", "b", "b/g1", "c", "c/h1", "c/h2"];
        assert_eq!(strings(&wc["examples"]), want);
    } else {
        assert_eq!(wc["count"], 0, "{wc}");
    }

    // With --fs-group: the mode bits join in, and the kubelet view is there too.
    let g = FS_GROUP.to_string();
    let r = inspect_json(&["--owner", "4243", "--fs-group", &g], &root);
    let a = &r["owner"]["volprep_apply"];
    assert_eq!((&a["changed"], &a["changed_mode"]), (&16.into(), &6.into()), "{r:#}");
    assert_eq!(r["fs_group"]["volprep_apply"], r["owner"]["volprep_apply"]);

    let (code, human, _) = inspect(&["--owner", "4243"], &root);
    assert_eq!(code, 0);
    assert!(human.contains("WITH --owner 4243") && human.contains("entries it would change"), "{human}");
    assert!(human.contains("only what differs: owner 16, mode 0, untouched 0"), "{human}");
    // --owner changes no mode: the kubelet's mode findings are not listed (the JSON keeps them).
    assert!(!human.contains("lacking mode bits") && !human.contains("directories without setgid"), "{human}");
    assert!(human.contains("not listed: --owner changes no mode"), "{human}");
    let (_, human, _) = inspect(&["--owner", "4243:4243"], &root);
    assert!(human.contains("only what differs: owner and group 16, mode 0"), "{human}");
    let (_, human, _) = inspect(&["--owner", "4243", "--fs-group", &g], &root);
    assert!(human.contains("lacking mode bits") && human.contains("directories without setgid"), "{human}");

    if is_root() {
        // `check --owner` (root only) counts the same.
        let out = Command::new(env!("CARGO_BIN_EXE_volprep"))
            .args(["check", "--owner", &own, "--report", "-"])
            .arg(&root)
            .output()
            .unwrap();
        let rep: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(rep["volumes"][0]["changed_owner"], 11, "{rep:#}");
    }
    assert_eq!(snapshot(&root), before, "inspect changed something");
}

/// An entry that cannot be read is listed under `errors` with its path escaped once, as every
/// path volprep prints: a directory `x\y` is `x\\y` in the document (a JSON string `"x\\\\y"`)
/// and in the table, not the escape of that escape.
#[test]
fn an_unreadable_directory_is_listed_with_its_path_escaped_once() {
    let (tmp, root) = volume();
    fs::set_permissions(tmp.path(), fs::Permissions::from_mode(0o755)).unwrap();
    fs::create_dir_all(root.join("x\\y")).unwrap();
    fs::set_permissions(root.join("x\\y"), fs::Permissions::from_mode(0o000)).unwrap();
    let run = |json: bool| {
        let mut cmd = common::volprep();
        cmd.arg("inspect").args(json.then_some("--json")).arg(&root);
        if is_root() {
            // Root reads any directory: inspect as nobody, who cannot.
            common::as_user(&mut cmd, 65534, 65534, &[]);
        }
        let out = cmd.output().expect("run volprep");
        assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    };
    let r: Value = serde_json::from_str(&run(true)).unwrap();
    assert_eq!(r["errors"], 1, "{r:#}");
    assert_eq!(r["error_list"][0]["path"], "x\\\\y", "{r:#}");
    assert_eq!(r["error_list"][0]["errno"], "EACCES", "{r:#}");
    let human = run(false);
    assert!(human.contains("x\\\\y: "), "{human}");
    assert!(!human.contains("x\\\\\\\\y"), "{human}");
}

/// With a POSIX ACL, the mode's group bits are the ACL mask: `chmod g+rw` (the kubelet's
/// `os.Chmod(mode|0660)`, and `apply`'s) changes the mask and leaves `group::` as it was, so
/// the fsGroup may still not write. `apply` does exactly what the kubelet does, and `inspect`
/// lists such entries with their `group::` and mask.
#[test]
#[ignore = "needs root and loop devices (setfacl, getfacl)"]
fn an_acl_whose_group_entry_lacks_the_group_bits_is_reported() {
    common::privileged(&["setfacl", "getfacl"]);
    let fs = common::Tmpfs::new();
    let vol = fs.path().join("vol");
    fs::create_dir_all(vol.join("d")).unwrap();
    for f in ["f", "kubelet", "d/plain"] {
        fs::write(vol.join(f), b"x").unwrap();
        fs::set_permissions(vol.join(f), fs::Permissions::from_mode(0o640)).unwrap();
    }
    let setfacl = |args: &[&str], p: &Path| {
        common::mounts::sh(
            "setfacl",
            &[args, &[p.to_str().unwrap()]].concat().iter().map(|a| a.as_ref()).collect::<Vec<_>>(),
        )
    };
    let getfacl = |p: &Path| {
        let out = common::mounts::sh("getfacl", &["-cp".as_ref(), p.as_os_str()]);
        out.lines()
            .filter(|l| l.starts_with("group::") || l.starts_with("mask::"))
            .map(str::to_string)
            .collect::<Vec<_>>()
    };
    for p in [vol.join("f"), vol.join("kubelet"), vol.join("d")] {
        setfacl(&["-m", "u:1000:r-x,g::r-x"], &p);
    }
    // The kubelet's chmod, by hand, on one file: the other entries get `apply`'s.
    let kubelet = vol.join("kubelet");
    let mode = fs::symlink_metadata(&kubelet).unwrap().mode() & 0o7777;
    fs::set_permissions(&kubelet, fs::Permissions::from_mode(mode | 0o660)).unwrap();
    common::apply_fs_group(&vol, 2000, &[]);
    assert_eq!(getfacl(&vol.join("f")), ["group::r-x", "mask::rwx"], "g+rw lands in the mask; group:: stays");
    assert_eq!(getfacl(&vol.join("f")), getfacl(&kubelet), "apply does what the kubelet's chmod does");
    assert_eq!(getfacl(&vol.join("d")), ["group::r-x", "mask::rwx"]);
    let r = inspect_json(&["--fs-group", "2000"], &vol);
    let acl = &r["acl_group_entry_lacking_bits"];
    assert_eq!(acl["count"], 3, "{r}");
    let ex: Vec<(String, String, String)> = acl["examples"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["path"].as_str().unwrap().into(),
                e["group_obj"].as_str().unwrap().into(),
                e["mask"].as_str().unwrap().into(),
            )
        })
        .collect();
    let want = |p: &str| (p.to_string(), "r-x".to_string(), "rwx".to_string());
    assert_eq!(ex, [want("d"), want("f"), want("kubelet")]);
    let (code, human, _) = inspect(&["--fs-group", "2000"], &vol);
    assert_eq!(code, 0);
    let line = human.lines().find(|l| l.contains("POSIX ACLs")).unwrap_or_else(|| panic!("{human}"));
    assert!(line.contains("group::") && line.contains("mask") && line.contains("f (group::r-x, mask::rwx)"), "{line}");
    // Entries without an ACL, or whose group:: has the bits, are not listed.
    setfacl(&["-m", "g::rwx"], &vol.join("f"));
    assert_eq!(inspect_json(&[], &vol)["acl_group_entry_lacking_bits"]["count"], 2);
}
