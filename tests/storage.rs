//! Shared storage: a filesystem that ignores ownership changes or refuses them (FUSE
//! filesystems of the test suite, `common::fusefs`) stops the pass with one line and exit 6,
//! never `done`; one that honours them is prepared, with the adaptive load policy FUSE gets by
//! default; and `--max-ops` is a ceiling.

mod common;

use std::os::unix::fs::MetadataExt;
use std::path::Path;

use common::fusefs::{self, FuseFs, Owners};
use common::*;

/// The exit code of a storage that ignores or refuses ownership changes.
const IGNORED: i32 = 6;

/// A volume of `dirs` directories of `files` files each (plus as many at the top), every entry
/// root:root with private modes: every one needs a group and a mode.
fn volume(root: &Path, dirs: usize, files: usize) -> usize {
    let mut t = Tree::new();
    t.root(0, 0, 0o755);
    for d in 0..dirs {
        t.dir(format!("d{d}"), 0, 0, 0o700);
        for f in 0..files {
            t.file(format!("d{d}/f{f}"), 0, 0, 0o600);
        }
    }
    for f in 0..files {
        t.file(format!("top{f}"), 0, 0, 0o644);
    }
    t.build(root);
    t.len()
}

/// Every entry below `root` (the root included) still has group 0.
fn untouched(root: &Path) -> bool {
    fn walk(p: &Path) -> bool {
        let m = std::fs::symlink_metadata(p).unwrap();
        m.gid() == 0 && (!m.is_dir() || std::fs::read_dir(p).unwrap().all(|e| walk(&e.unwrap().path())))
    }
    walk(root)
}

/// `apply --fs-group 2000` on the FUSE mount of `src` with `owners`.
fn apply_on(src: &Path, owners: Owners, extra: &[&str]) -> Run {
    let fuse = FuseFs::mount(src, owners);
    let mut args = vec!["--fs-group", "2000", "--progress-interval", "0"];
    args.extend_from_slice(extra);
    pass("apply", &args, fuse.path())
}

/// The one ERROR line, and no WARN line: the verdict is said once, not entry by entry.
#[track_caller]
fn one_error_line(run: &Run) -> String {
    let lines = run.stderr_lines();
    let loud: Vec<&&str> = lines.iter().filter(|l| l.contains(" ERROR ") || l.contains(" WARN ")).collect();
    assert_eq!(loud.len(), 1, "one line, an error\n{}", run.describe());
    assert!(loud[0].contains(" ERROR "), "{}", run.describe());
    for per_entry in ["failed: Operation", "did not change"] {
        assert!(!run.stderr.contains(per_entry), "no per-entry error\n{}", run.describe());
    }
    for claim in ["changed owner", "changed group"] {
        assert!(!run.stderr.contains(claim), "nothing claimed as changed\n{}", run.describe());
    }
    // Shown with --nocapture: what the operator sees.
    println!("{}", run.stderr);
    loud[0].to_string()
}

#[test]
#[ignore = "needs root and /dev/fuse"]
fn a_filesystem_that_ignores_ownership_changes_stops_the_pass_with_one_line() {
    if !fusefs::available() {
        return;
    }
    let src = tempfile::tempdir().unwrap();
    let total = volume(src.path(), 10, 10) as u64;
    let run = apply_on(src.path(), Owners::Ignore, &["--threads", "2", "--log-format", "text"]).expect_code(IGNORED);
    let line = one_error_line(&run);
    for fact in ["this filesystem (fuse from volprep-ignore) ignores ownership changes", "fsGroupPolicy", "in-progress"]
    {
        assert!(line.contains(fact), "{fact:?} in {line}");
    }
    let v = run.volume();
    assert_eq!(v["ownership"], "ignored", "{}", run.describe());
    assert_eq!((v["changed_owner"].as_u64(), v["changed_mode"].as_u64()), (Some(0), Some(0)), "{v}");
    assert_ne!(v["marker_after"], "done", "{v}");
    assert!(v["fatal"].as_str().unwrap().starts_with("this filesystem"), "{v}");
    assert!(v["entries"].as_u64().unwrap() < total / 2, "stopped early: {v}");
    assert_eq!(v["load"]["policy"], "adaptive", "FUSE gets the adaptive load by default: {v}");
    assert!(untouched(src.path()));
    // The next start walks again (no `done`) and says the same.
    let again = apply_on(src.path(), Owners::Ignore, &[]).expect_code(IGNORED);
    assert_eq!(again.volume()["ownership"], "ignored");

    // A volume with a single change to make: the end of the walk gives the verdict.
    let small = tempfile::tempdir().unwrap();
    Tree::new().root(0, 2000, 0o2775).file("only", 0, 0, 0o600).build(small.path());
    let run = apply_on(small.path(), Owners::Ignore, &["--log-format", "text"]).expect_code(IGNORED);
    assert!(one_error_line(&run).contains("ignores ownership changes"));
    assert_ne!(run.volume()["marker_after"], "done");
}

#[test]
#[ignore = "needs root and /dev/fuse"]
fn a_filesystem_that_refuses_ownership_changes_stops_the_pass_with_one_line() {
    if !fusefs::available() {
        return;
    }
    let src = tempfile::tempdir().unwrap();
    let total = volume(src.path(), 10, 10) as u64;
    let run = apply_on(src.path(), Owners::Refuse, &["--threads", "2", "--log-format", "text"]).expect_code(IGNORED);
    let line = one_error_line(&run);
    for fact in ["this filesystem (fuse from volprep-refuse) refuses ownership changes", "root_squash", "fsGroupPolicy"]
    {
        assert!(line.contains(fact), "{fact:?} in {line}");
    }
    let v = run.volume();
    assert_eq!(v["ownership"], "refused", "{v}");
    assert_ne!(v["marker_after"], "done", "{v}");
    assert!(v["entries"].as_u64().unwrap() < total / 2, "stopped early: {v}");
    assert_eq!(v["error_list"][0]["errno"], "EPERM", "the entries are listed in the report: {v}");
    assert!(untouched(src.path()));
}

#[test]
#[ignore = "needs root and /dev/fuse"]
fn a_filesystem_that_honours_ownership_changes_is_prepared_with_the_adaptive_load() {
    if !fusefs::available() {
        return;
    }
    let src = tempfile::tempdir().unwrap();
    let total = volume(src.path(), 10, 10) as u64;
    let run = apply_on(src.path(), Owners::Honour, &["--log-format", "text"]).expect_code(0);
    assert!(run.stderr_lines()[0].contains("load=\"adaptive\""), "the first line says the policy\n{}", run.describe());
    let v = run.volume();
    assert_eq!((v["entries"].as_u64(), v["changed_owner"].as_u64()), (Some(total), Some(total)), "{v}");
    assert_eq!(v["marker_after"], "done", "{v}");
    assert!(v.get("ownership").is_none(), "{v}");
    let load = &v["load"];
    assert_eq!(load["policy"], "adaptive", "{v}");
    let limit = &load["in_flight_limit"];
    assert!(limit["min"].as_u64() >= Some(1) && limit["max"].as_u64() <= v["threads"].as_u64(), "{v}");
    assert!(load["ops"].as_u64().unwrap() >= 3 * total, "a stat, a chown and a chmod each at least: {v}");
    let m = std::fs::metadata(src.path().join("d3/f4")).unwrap();
    assert_eq!((m.gid(), m.mode() & 0o7777), (2000, 0o660));
}

/// `--max-ops` holds whatever the storage: the gate's operations over the pass's wall time.
#[test]
fn the_operations_ceiling_holds_and_the_first_line_says_it() {
    let dir = tempfile::tempdir().unwrap();
    let vol = dir.path().join("vol");
    std::fs::create_dir(&vol).unwrap();
    for i in 0..40 {
        std::fs::write(vol.join(format!("f{i}")), b"").unwrap();
    }
    // SAFETY: getegid has no preconditions and cannot fail.
    let gid = unsafe { libc::getegid() }.to_string();
    let run = pass("apply", &["--fs-group", &gid, "--max-ops", "200", "--log-format", "text"], &vol).expect_code(0);
    let first = run.stderr_lines()[0].to_string();
    assert!(first.contains("load=\"full\"") && first.contains("max_ops=200"), "{first}");
    let v = run.volume();
    let load = &v["load"];
    assert_eq!((load["policy"].as_str(), load["max_ops"].as_u64()), (Some("full"), Some(200)), "{v}");
    let ops = load["ops"].as_u64().unwrap();
    assert!(ops >= 40, "a stat of each file at least: {v}");
    // n operations paced at 200/s span at least (n - 1) / 200 s.
    let elapsed_ms = v["elapsed_ms"].as_u64().unwrap();
    assert!(elapsed_ms * 200 >= (ops - 1) * 1000, "{ops} operations in {elapsed_ms} ms: {v}");
    assert!(load["in_flight_limit"].is_null(), "not adaptive: {v}");

    // Without a ceiling, on local storage the gate has nothing to do.
    let run = pass("apply", &["--fs-group", &gid, "--force"], &vol).expect_code(0);
    let v = run.volume();
    assert_eq!(v["load"], serde_json::json!({"policy": "full", "max_ops": null}), "{v}");
}
