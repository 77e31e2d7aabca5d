//! Watching a pass: progress lines that count up to the report's total (none with
//! `--progress-interval 0`), JSON logs that parse line by line, `--log-level` and `RUST_LOG`,
//! the startup line's filesystem type and estimate, and the termination message (one line per
//! volume, at most 4096 bytes with thousands of errors; no default file is no error).

mod common;

use std::fs::File;
use std::path::Path;

use common::snap::{conforms, kubelet_target};
use common::*;
use serde_json::Value;

/// The Kubernetes limit on a termination message.
const TERMINATION_MAX: usize = 4096;

/// Whether the tests run as root (then they chown; otherwise they use the user's own group).
fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// A group every entry of a `plain_tree` can be given: 2000 as root, else the user's own group
/// (then only modes change).
fn target_gid() -> u32 {
    // SAFETY: getegid has no preconditions.
    if is_root() { 2000 } else { rustix::process::getegid().as_raw() }
}

/// `dirs` directories of `files` empty files each below `root` (0755 and 0644: every entry
/// needs a mode change, and as root a group change too). Returns the entry count, root included.
fn plain_tree(root: &Path, dirs: usize, files: usize) -> u64 {
    std::fs::create_dir_all(root).unwrap();
    for d in 0..dirs {
        let dir = root.join(format!("d{d:04}"));
        std::fs::create_dir(&dir).unwrap();
        for f in 0..files {
            File::create(dir.join(format!("f{f:03}"))).unwrap();
        }
    }
    (1 + dirs * (1 + files)) as u64
}

/// The value of `key=` in a text log line (the first whitespace-separated token so named),
/// without the quotes tracing puts around some strings.
fn text_field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    let v = line.split_whitespace().find_map(|t| t.strip_prefix(key)?.strip_prefix('='))?;
    Some(v.strip_prefix('"').and_then(|v| v.strip_suffix('"')).unwrap_or(v))
}

/// The count of a text progress line: `... progress <path>: <N> entries, ...`.
#[track_caller]
fn text_progress_entries(line: &str) -> u64 {
    let n = line.split(": ").nth(1).and_then(|m| m.split_once(" entries")).map(|(n, _)| n);
    n.and_then(|n| n.parse().ok()).unwrap_or_else(|| panic!("no count in a progress line: {line}"))
}

/// Text progress lines: `<time>  INFO progress <path>: ...`.
fn text_progress_lines(run: &Run) -> Vec<&str> {
    run.stderr_lines().into_iter().filter(|l| l.contains(" INFO progress ")).collect()
}

/// Every stderr line parsed as a JSON object with a timestamp, a level and a message.
#[track_caller]
fn json_lines(run: &Run) -> Vec<Value> {
    let lines = run.stderr_lines();
    assert!(!lines.is_empty(), "no log lines\n{}", run.describe());
    lines
        .iter()
        .map(|l| {
            let v: Value =
                serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l:?}\n{}", run.describe()));
            let ts = v["timestamp"].as_str().unwrap_or_else(|| panic!("no timestamp string: {l}"));
            assert!(ts.len() >= 20 && ts.as_bytes()[10] == b'T' && ts.ends_with('Z'), "RFC 3339 UTC timestamp: {l}");
            let level = v["level"].as_str().unwrap_or_else(|| panic!("no level: {l}"));
            assert!(["TRACE", "DEBUG", "INFO", "WARN", "ERROR"].contains(&level), "level {level:?}: {l}");
            let msg = v["message"].as_str().unwrap_or_else(|| panic!("no message: {l}"));
            assert!(!msg.is_empty(), "empty message: {l}");
            v
        })
        .collect()
}

/// A count in a log field: a JSON number, or a string of digits.
fn count_of(v: &Value) -> Option<u64> {
    v.as_u64().or_else(|| v.as_str()?.parse().ok())
}

/// The report's truth for `plain_tree` under `gid`, from a snapshot taken before the pass:
/// (entries whose owner or group must change, entries whose mode must change).
fn needed_changes(before: &Snapshot, gid: u32) -> (u64, u64) {
    let owner = before.values().filter(|m| kubelet_target(m, gid, false).1 != m.gid).count() as u64;
    let mode = before.values().filter(|m| kubelet_target(m, gid, false).2 != m.mode).count() as u64;
    (owner, mode)
}

/// With `--threads 1` and a 20 ms interval, a 100,001-entry pass (every entry changed) lasts
/// long enough for several progress lines; their counts grow and stay within the final count.
#[test]
fn progress_lines_count_up_to_the_report() {
    let dir = tempfile::tempdir().unwrap();
    let vol = dir.path().join("vol");
    let total = plain_tree(&vol, 1000, 99);
    let gid = target_gid();
    let before = snapshot(&vol);
    assert_eq!(before.len() as u64, total);
    let (owner, mode) = needed_changes(&before, gid);
    let g = gid.to_string();

    let run = pass("apply", &["--fs-group", &g, "--threads", "1", "--progress-interval", "20ms"], &vol).expect_code(0);
    let lines = text_progress_lines(&run);
    let elapsed = run.count("elapsed_ms");
    assert!(lines.len() >= 2, "at least two progress lines in a {elapsed} ms pass\n{}", run.describe());
    let counts: Vec<u64> = lines.iter().map(|l| text_progress_entries(l)).collect();
    assert!(counts.windows(2).all(|w| w[0] <= w[1]), "progress counts never go down: {counts:?}");
    assert!(counts.first() < counts.last(), "progress counts grow: {counts:?}");
    assert!(*counts.last().unwrap() <= run.count("entries"), "last progress {counts:?} > final\n{}", run.describe());
    for l in &lines {
        assert!(l.contains(" entries, changed group ") && l.contains(" errors, ") && l.contains("/s"), "figures: {l}");
        // The message and the fields come from one read of the counters.
        let field = text_field(l, "entries").and_then(|n| n.parse().ok());
        assert_eq!(field, Some(text_progress_entries(l)), "message and field agree: {l}");
    }
    // Startup line first, summary last, progress in between.
    let all = run.stderr_lines();
    assert_eq!(text_field(all[0], "decision"), Some("walk"), "startup line first\n{}", run.describe());
    assert!(all.last().unwrap().contains(&format!("prepared {total} entries")), "summary last\n{}", run.describe());

    // The report's counts are the truth of the tree.
    assert_eq!(run.count("entries"), total, "{}", run.describe());
    assert_eq!((run.count("dirs"), run.count("files")), (1001, 99_000), "{}", run.describe());
    assert_eq!((run.count("changed_owner"), run.count("changed_mode")), (owner, mode), "{}", run.describe());
    assert!(snapshot(&vol).values().all(|m| conforms(m, gid, false)), "the volume conforms");

    // Interval 0: no progress at all, however long the pass.
    let quiet = pass("apply", &["--fs-group", &g, "--threads", "1", "--progress-interval", "0", "--force"], &vol)
        .expect_code(0);
    assert_eq!(quiet.count("entries"), total, "{}", quiet.describe());
    assert!(text_progress_lines(&quiet).is_empty(), "no progress with interval 0\n{}", quiet.describe());
    assert_eq!(quiet.stderr_lines().len(), 2, "startup and summary only\n{}", quiet.describe());
}

/// `--log-format json`: one object per line, for every kind of line: startup (with its
/// fields), progress (with figures), summary, per-entry debug lines and a fatal error.
#[test]
fn json_logs_parse_line_by_line() {
    let dir = tempfile::tempdir().unwrap();
    let vol = dir.path().join("vol");
    let total = plain_tree(&vol, 500, 99);
    let g = target_gid().to_string();
    let args = ["--fs-group", &g, "--threads", "1", "--progress-interval", "10ms", "--log-format", "json"];
    let run = pass("apply", &args, &vol).expect_code(0);
    let lines = json_lines(&run);

    let start = &lines[0];
    for key in ["fs", "spec", "digest", "threads", "estimated_entries", "marker", "decision", "reason"] {
        assert!(!start[key].is_null(), "startup line lacks {key}: {start}");
    }
    assert_eq!(start["decision"], "walk", "{start}");
    assert_eq!(start["reason"], "no marker", "{start}");
    assert_eq!(start["marker"], "none", "{start}");
    assert_eq!(start["spec"], format!("fs-group={g}"), "{start}");
    assert_eq!(start["threads"], 1, "{start}");
    assert_eq!(start["estimated_entries"], "unknown", "a subdirectory has no estimate: {start}");
    assert!(start["fs"].as_str().is_some_and(|f| !f.is_empty()), "{start}");

    let progress: Vec<&Value> =
        lines.iter().filter(|v| v["message"].as_str().unwrap().starts_with("progress ")).collect();
    assert!(progress.len() >= 2, "progress lines in JSON too\n{}", run.describe());
    let mut last = 0;
    for p in &progress {
        let n = p["entries"].as_u64().unwrap_or_else(|| panic!("entries is a number: {p}"));
        assert!(n >= last && n <= total, "progress counts grow within the total: {p}");
        last = n;
        for key in ["changed_group", "changed_mode", "errors", "entries_per_s"] {
            assert!(p[key].as_u64().is_some(), "progress lacks a numeric {key}: {p}");
        }
        assert!(p["path"].as_str().is_some(), "progress names the volume: {p}");
        let rate = format!(" {}/s", p["entries_per_s"]);
        assert!(p["message"].as_str().unwrap().contains(&rate), "the message shows the rate field: {p}");
        assert!(p["percent"].is_null(), "no estimate, no percent: {p}");
    }
    let summary = lines.last().unwrap()["message"].as_str().unwrap();
    assert!(summary.contains(&format!("prepared {total} entries")), "summary last: {summary}");

    // Debug: a line per changed entry, still one JSON object each.
    let small = dir.path().join("small");
    let n = plain_tree(&small, 3, 4);
    let debug = pass("apply", &["--fs-group", &g, "--log-format", "json", "--log-level", "debug"], &small);
    let debug_lines = json_lines(&debug.expect_code(0));
    let per_entry = debug_lines.iter().filter(|v| v["level"] == "DEBUG" && v["path"].is_string()).count() as u64;
    assert_eq!(per_entry, n, "one debug line per changed entry\n{debug_lines:#?}");

    // A fatal error is JSON too.
    let missing = dir.path().join("missing");
    let fatal = pass("apply", &["--fs-group", &g, "--log-format", "json"], &missing).expect_code(1);
    let fatal_lines = json_lines(&fatal);
    assert!(fatal_lines.iter().any(|v| v["level"] == "ERROR"), "{}", fatal.describe());
}

/// `--log-level` filters; `RUST_LOG` overrides it.
#[test]
fn log_level_and_rust_log() {
    let dir = tempfile::tempdir().unwrap();
    let vol = dir.path().join("vol");
    plain_tree(&vol, 2, 3);
    let g = target_gid().to_string();
    let quiet = pass("check", &["--fs-group", &g, "--log-level", "warn"], &vol).expect_code(3);
    assert!(quiet.stderr_lines().is_empty(), "warn hides info lines\n{}", quiet.describe());
    let loud = run(volprep()
        .args(["check", "--fs-group", &g, "--log-level", "warn", "--report", "-"])
        .arg(&vol)
        .env("RUST_LOG", "debug"))
    .expect_code(3);
    assert!(loud.stderr.contains(" DEBUG would change "), "RUST_LOG=debug wins\n{}", loud.describe());
    assert!(loud.stderr.contains(" INFO check "), "{}", loud.describe());
}

/// A misspelt level is a usage error naming it (flag or variable), not a silent `info`; a
/// `RUST_LOG` that is no valid filter is ignored with a warning naming it.
#[test]
fn a_misspelt_log_level_is_a_usage_error_and_a_bad_rust_log_a_warning() {
    let dir = tempfile::tempdir().unwrap();
    let vol = dir.path().join("vol");
    plain_tree(&vol, 2, 3);
    let g = target_gid().to_string();
    let flag = run(volprep().args(["check", "--fs-group", &g, "--log-level", "inf"]).arg(&vol)).expect_code(2);
    let first = flag.stderr.lines().next().unwrap_or_default();
    assert!(first.contains("'inf'") && first.contains("--log-level"), "{}", flag.describe());
    let env =
        run(volprep().args(["check", "--fs-group", &g]).arg(&vol).env("VOLPREP_LOG_LEVEL", "verbose")).expect_code(2);
    assert!(env.stderr.lines().next().unwrap_or_default().contains("'verbose'"), "{}", env.describe());
    let upper = run(volprep().args(["check", "--fs-group", &g, "--log-level", "WARN"]).arg(&vol)).expect_code(3);
    assert!(upper.stderr_lines().is_empty(), "WARN is warn\n{}", upper.describe());

    let typo = run(volprep().args(["check", "--fs-group", &g, "--log-level", "info"]).arg(&vol).env("RUST_LOG", "inf"))
        .expect_code(3);
    let warned = typo.stderr_lines().iter().any(|l| l.contains(" WARN RUST_LOG ignored: 'inf'"));
    assert!(warned, "{}", typo.describe());
    assert!(typo.stderr.contains(" INFO check "), "--log-level info applies\n{}", typo.describe());
}

/// The startup line names the filesystem and, at the root of a whole filesystem, estimates the
/// entries from the inodes in use (close to what the walk then counts); below the root, or at a
/// bind mount of a directory, the estimate is unknown.
/// The report carries both.
#[test]
#[ignore = "needs root, loop devices and mkfs.ext4"]
fn startup_line_names_fs_and_estimate() {
    privileged(&["mkfs.ext4"]);
    let ext4 = LoopFs::new(FsKind::Ext4, 64);
    let tmpfs = Tmpfs::new();
    for (mnt, fs) in [(ext4.path(), "ext4"), (tmpfs.path(), "tmpfs")] {
        plain_tree(&mnt.join("sub"), 20, 50);
        let root = pass("check", &["--fs-group", "2000"], mnt).expect_code(3);
        let start = root.stderr_lines()[0];
        assert_eq!(text_field(start, "fs"), Some(fs), "{}", root.describe());
        let est: u64 = text_field(start, "estimated_entries")
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("a number at the mount root\n{}", root.describe()));
        let entries = root.count("entries");
        // ext4 counts its reserved inodes as used; tmpfs counts the root.
        assert!(est >= entries && est <= entries + 16, "estimate {est} vs {entries} entries\n{}", root.describe());
        let v = root.volume();
        assert_eq!((v["fs_type"].as_str(), v["estimated_entries"].as_u64()), (Some(fs), Some(est)), "{v}");

        let sub = pass("check", &["--fs-group", "2000", "--log-format", "json"], &mnt.join("sub")).expect_code(3);
        let start = &json_lines(&sub)[0];
        assert_eq!(start["fs"], fs, "{start}");
        assert_eq!(start["estimated_entries"], "unknown", "{start}");
        assert!(sub.volume()["estimated_entries"].is_null(), "{}", sub.describe());

        // In JSON at the mount root, the estimate is a count.
        let json = pass("check", &["--fs-group", "2000", "--log-format", "json"], mnt).expect_code(3);
        assert_eq!(count_of(&json_lines(&json)[0]["estimated_entries"]), Some(est), "{}", json.describe());

        // A directory bind-mounted (a subPath, a local-path volume) is a mount root too, but the
        // filesystem's inode count is not its size: no estimate.
        let at = tempfile::tempdir().unwrap();
        let bind = Bind::new(&mnt.join("sub"), at.path());
        let bound = pass("check", &["--fs-group", "2000", "--log-format", "json"], bind.path()).expect_code(3);
        assert_eq!(json_lines(&bound)[0]["estimated_entries"], "unknown", "{}", bound.describe());
        assert!(bound.volume()["estimated_entries"].is_null(), "{}", bound.describe());
    }

    // With an estimate, progress says how far along the pass is.
    plain_tree(&tmpfs.path().join("big"), 500, 99);
    let args = ["--fs-group", "2000", "--threads", "1", "--progress-interval", "10ms", "--log-format", "json"];
    let run = pass("apply", &args, tmpfs.path()).expect_code(0);
    let lines = json_lines(&run);
    let progress: Vec<&Value> =
        lines.iter().filter(|v| v["message"].as_str().unwrap().starts_with("progress ")).collect();
    assert!(progress.len() >= 2, "{}", run.describe());
    let percents: Vec<u64> = progress.iter().map(|p| p["percent"].as_u64().expect("a percent")).collect();
    assert!(percents.windows(2).all(|w| w[0] <= w[1]) && percents.iter().all(|&p| p <= 100), "{percents:?}");
    for p in &progress {
        let msg = p["message"].as_str().unwrap();
        assert!(msg.contains(&format!(", {}%", p["percent"])), "the message shows the percent field: {p}");
        assert!(p["eta_s"].as_f64().is_some_and(|e| e >= 0.0), "an ETA field in seconds: {p}");
    }
    // The first line with something counted has an ETA (with nothing counted, the rate and so
    // the ETA are unknown: a walker thread may not have run yet on a busy machine).
    let first = progress.iter().find(|p| p["entries"].as_u64().is_some_and(|n| n > 0)).expect("a line with entries");
    assert!(first["message"].as_str().unwrap().contains(", ETA "), "an ETA early on: {first}");
}

/// Thousands of EROFS errors on two read-only volumes: the termination message has one line
/// per volume, each naming its error count and first error, within 4096 bytes.
#[test]
#[ignore = "needs root, loop devices and mkfs.ext4"]
fn termination_message_with_thousands_of_errors() {
    privileged(&["mkfs.ext4"]);
    let fs = LoopFs::new(FsKind::Ext4, 64);
    let (a, b) = (fs.path().join("vol-a"), fs.path().join("vol-b"));
    plain_tree(&a, 40, 99);
    plain_tree(&b, 20, 99);
    fs.remount_ro();
    let out = tempfile::tempdir().unwrap();
    let term = out.path().join("termination-log");
    let run = run(volprep()
        .args(["apply", "--fs-group", "2000", "--report", "-", "--termination-log"])
        .arg(&term)
        .arg(&a)
        .arg(&b))
    .expect_code(1);
    let report = run.report();
    let vols = report["volumes"].as_array().unwrap();
    let msg = std::fs::read_to_string(&term).unwrap_or_else(|e| panic!("no termination message: {e}"));
    assert!(msg.len() <= TERMINATION_MAX, "{} bytes", msg.len());
    assert!(msg.ends_with('\n'), "{msg:?}");
    let lines: Vec<&str> = msg.lines().collect();
    assert_eq!(lines.len(), 2, "one line per volume:\n{msg}");
    for (line, v) in lines.iter().zip(vols) {
        let errors = v["errors"].as_u64().unwrap();
        assert!(errors >= 2000, "thousands of errors: {errors}\n{}", run.describe());
        assert_eq!(v["error_list"].as_array().unwrap().len(), 100, "the first 100 are listed");
        assert!(line.starts_with(&format!("{}: walked ", v["path"].as_str().unwrap())), "not 'prepared': {line}");
        assert!(line.contains(&format!(", {errors} error(s)")), "{line}");
        assert!(line.contains("EROFS)"), "the first error: {line}");
    }
}

/// Many volumes with long names: the message is cut at 4096 bytes and says how many volumes it
/// left out.
#[test]
fn termination_message_is_cut_at_4096_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let name = "v".repeat(200);
    let vols: Vec<_> = (0..40).map(|i| dir.path().join(format!("{name}{i:02}"))).collect();
    for v in &vols {
        plain_tree(v, 1, 1);
    }
    let term = dir.path().join("termination-log");
    let g = target_gid().to_string();
    let run = run(volprep().args(["apply", "--fs-group", &g, "--termination-log"]).arg(&term).args(&vols));
    run.expect_code(0);
    let msg = std::fs::read_to_string(&term).unwrap();
    assert!(msg.len() <= TERMINATION_MAX, "{} bytes", msg.len());
    assert!(msg.len() > TERMINATION_MAX - 400, "the room is used: {} bytes", msg.len());
    let last = msg.lines().last().unwrap();
    let left: usize = last
        .strip_prefix("... and ")
        .and_then(|r| r.strip_suffix(" more volume(s)"))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("last line says how many were left out: {last:?}"));
    let whole = msg.lines().filter(|l| l.ends_with("0 error(s)")).count();
    assert!(whole >= 10 && whole + left >= vols.len(), "{whole} shown + {left} left out of {}:\n{msg}", vols.len());
}

/// No `--termination-log` and no /dev/termination-log (outside Kubernetes): nothing is written,
/// nothing is said, exit 0. A termination log that cannot be written is a warning, not a failure.
#[test]
fn termination_log_absent_or_unwritable_is_no_error() {
    let dir = tempfile::tempdir().unwrap();
    let vol = dir.path().join("vol");
    plain_tree(&vol, 2, 3);
    let g = target_gid().to_string();
    let default = Path::new("/dev/termination-log");
    if default.exists() {
        let _ = std::io::Write::write_all(
            &mut std::io::stderr(),
            b"termination_log_absent_or_unwritable_is_no_error: /dev/termination-log exists here; default case not run\n",
        );
    } else {
        let run = pass("apply", &["--fs-group", &g], &vol).expect_code(0);
        assert!(!run.stderr.contains("termination"), "{}", run.describe());
        assert!(!default.exists(), "the default file is never created");
    }
    let bad = dir.path().join("no-such-dir/termination-log");
    let run = run(volprep().args(["apply", "--force", "--fs-group", &g, "--termination-log"]).arg(&bad).arg(&vol));
    let run = run.expect_code(0);
    let warn = run.stderr_lines().into_iter().find(|l| l.contains(" WARN "));
    let warn = warn.unwrap_or_else(|| panic!("a warning\n{}", run.describe()));
    assert!(warn.contains("termination message") && warn.contains("no-such-dir"), "{warn}");
}

/// The reference's report sample (a stable interface) has exactly the keys of a real report: a
/// key added, renamed or dropped shows here.
#[test]
fn readme_report_sample_has_the_keys_of_a_real_report() {
    let readme = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/reference.md")).unwrap();
    let start =
        readme.find("```json\n{\n  \"version\"").expect("docs/reference.md has a report sample") + "```json\n".len();
    let sample: Value = serde_json::from_str(&readme[start..][..readme[start..].find("```").unwrap()]).unwrap();
    let dir = tempfile::tempdir().unwrap();
    plain_tree(dir.path(), 2, 3);
    let run = apply_fs_group(dir.path(), target_gid(), &[]);
    let real: Value = serde_json::from_str(&run.stdout).unwrap();
    let keys = |v: &Value| v.as_object().unwrap().keys().cloned().collect::<Vec<_>>();
    assert_eq!(keys(&sample), keys(&real));
    assert_eq!(keys(&sample["volumes"][0]), keys(&real["volumes"][0]));
}
