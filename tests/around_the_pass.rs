//! What lies around a pass never breaks it nor reaches outside: a log reader that went away, a
//! FIFO named as an output file, `demo` in a shared temp dir or a non-empty directory, and names
//! (and forged run ids) made of characters that print nothing.

mod common;

use std::io::Read as _;
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::fs::{PermissionsExt as _, symlink};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::xattr::{MARKER, set_json, xattr_json};
use common::*;
use serde_json::json;

/// A pipe whose read end is already closed: every write to the other end fails with EPIPE.
fn closed_pipe() -> OwnedFd {
    let mut fds = [0; 2];
    // SAFETY: `fds` has room for the two descriptors pipe2 writes.
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    // SAFETY: both descriptors were just created by pipe2 and are owned by nothing else; the read end is closed once.
    unsafe {
        libc::close(fds[0]);
        OwnedFd::from_raw_fd(fds[1])
    }
}

/// Waits for `child` at most `limit`; kills it and panics past that.
fn wait_or_kill(mut child: Child, limit: Duration, what: &str) -> (i32, String) {
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let mut err = String::new();
            if let Some(mut e) = child.stderr.take() {
                e.read_to_string(&mut err).unwrap();
            }
            return (status.code().unwrap_or(-1), err);
        }
        if start.elapsed() > limit {
            child.kill().unwrap();
            child.wait().unwrap();
            panic!("{what}: still running after {limit:?} (hung)");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A volume of 3 × 200 files that does not conform.
fn volume(base: &Path, name: &str) -> PathBuf {
    let mut t = Tree::new();
    t.root(0, 0, 0o755);
    for d in 0..3 {
        t.dir(format!("d{d}"), 0, 0, 0o700);
        for f in 0..200 {
            t.file(format!("d{d}/f{f}"), 0, 0, 0o600);
        }
    }
    let vol = base.join(name);
    t.build(&vol);
    vol
}

fn marker_state(vol: &Path) -> String {
    xattr_json(vol, MARKER).map_or_else(|| "none".into(), |m| m["state"].as_str().unwrap_or("?").to_string())
}

/// `apply … 2>&1 | head` and stderr into a pipe nobody reads, at debug (a line per entry) and
/// info: the pass ends as it would with a reader (exit 0, marker `done`, `check` exit 0), and
/// the lines it could not write are counted in the report.
#[test]
#[ignore = "needs root, loop devices, head and mkfs.ext4"]
fn a_log_reader_that_went_away_changes_nothing_of_the_pass() {
    privileged(&["mkfs.ext4", "head"]);
    let fs = LoopFs::new(FsKind::Ext4, 64);
    let out = tempfile::tempdir().unwrap();
    for (i, level) in ["debug", "info"].into_iter().enumerate() {
        for sink in ["closed pipe", "head -c 10"] {
            let what = format!("--log-level {level}, stderr to a {sink}");
            let vol = volume(fs.path(), &format!("v-{level}-{}", sink.len()));
            let report = out.path().join(format!("report-{i}-{}.json", sink.len()));
            let mut cmd = volprep();
            cmd.args(["apply", "--fs-group", "2000", "--log-format", "text", "--log-level", level, "--report"])
                .arg(&report)
                .arg(&vol)
                .stdout(Stdio::null());
            let mut head = None;
            if sink == "closed pipe" {
                cmd.stderr(Stdio::from(closed_pipe()));
            } else {
                let mut h = Command::new("head")
                    .args(["-c", "10"])
                    .stdin(Stdio::piped())
                    .stdout(Stdio::null())
                    .spawn()
                    .unwrap();
                cmd.stderr(Stdio::from(h.stdin.take().unwrap()));
                head = Some(h);
            }
            let (code, _) = wait_or_kill(cmd.spawn().unwrap(), Duration::from_secs(60), &what);
            if let Some(mut h) = head {
                h.wait().unwrap();
            }
            assert_eq!(code, 0, "{what}: exit code");
            assert_eq!(marker_state(&vol), "done", "{what}");
            run(volprep().args(["check", "--fs-group", "2000"]).arg(&vol)).expect_code(0);
            let r: serde_json::Value = serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap();
            if sink == "closed pipe" {
                // (`head` may exit only after a short log was all in the pipe's buffer.)
                assert!(r["log_lines_dropped"].as_u64().is_some_and(|n| n > 0), "{what}: {r}");
            }
            assert_eq!(r["volumes"][0]["marker_after"], "done", "{what}");
        }
    }
    // The report to a stdout nobody reads: the pass and its exit code are unchanged too.
    let vol = volume(fs.path(), "v-stdout");
    let child = volprep()
        .args(["apply", "--fs-group", "2000", "--report", "-"])
        .arg(&vol)
        .stdout(Stdio::from(closed_pipe()))
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (code, err) = wait_or_kill(child, Duration::from_secs(60), "--report - to a closed pipe");
    assert_eq!(code, 0, "{err}");
    assert_eq!(marker_state(&vol), "done");
}

/// A FIFO as `--report` or `--termination-log`, with or without a reader, is refused at once
/// (exit 2, one line naming it) instead of blocking in `open`; a device too. `-` and
/// `/dev/stdout` are stdout.
#[test]
fn a_fifo_or_device_as_an_output_file_is_refused_at_once() {
    let t = tempfile::tempdir().unwrap();
    let vol = t.path().join("vol");
    std::fs::create_dir(&vol).unwrap();
    std::fs::write(vol.join("f"), b"x").unwrap();
    let fifo = t.path().join("out.fifo");
    let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: `c` is a valid C string alive across the call.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
    let gid = rustix::process::getegid().as_raw().to_string();
    for flag in ["--report", "--termination-log"] {
        for dest in [fifo.as_path(), Path::new("/dev/null")] {
            let what = format!("{flag} {}", dest.display());
            let child = volprep()
                .args(["check", "--fs-group", &gid, flag])
                .arg(dest)
                .arg(&vol)
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap();
            let (code, err) = wait_or_kill(child, Duration::from_secs(20), &what);
            assert_eq!(code, 2, "{what}: {err}");
            let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
            assert_eq!(lines.len(), 1, "{what}: {err}");
            assert!(
                lines[0].contains(&*dest.to_string_lossy()) && lines[0].contains("not a regular file"),
                "{what}: {err}"
            );
        }
    }
    // With a reader on the FIFO (it would not block): refused all the same.
    let mut reader = Command::new("cat").arg(&fifo).stdout(Stdio::null()).spawn().unwrap();
    let r = run(volprep().args(["check", "--fs-group", &gid, "--report"]).arg(&fifo).arg(&vol));
    let _ = std::fs::OpenOptions::new().write(true).open(&fifo); // lets `cat` see an end
    reader.wait().unwrap();
    assert_eq!(r.code, 2, "{}", r.describe());
    for dest in ["-", "/dev/stdout"] {
        let r = run(volprep().args(["check", "--fs-group", &gid, "--report", dest]).arg(&vol));
        assert!(r.code == 0 || r.code == 3, "{dest}: {}", r.describe());
        assert_eq!(r.volume()["entries"], 2, "{dest}: {}", r.describe());
    }
}

/// As root with a shared TMPDIR: another user pre-creates the names `demo` used to pick
/// (`volprep-demo-<pid>`) with symlinks into a directory of theirs. `demo` makes its own
/// unpredictable directory, never follows their links, and leaves nothing behind.
#[test]
#[ignore = "needs root and loop devices"]
fn demo_in_a_shared_temp_dir_never_follows_a_planted_link() {
    privileged(&[]);
    let t = tempfile::tempdir().unwrap();
    let tmp = t.path().join("tmp");
    std::fs::create_dir(&tmp).unwrap();
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o1777)).unwrap();
    let victim = t.path().join("victim");
    std::fs::create_dir(&victim).unwrap();
    std::fs::write(victim.join("secret"), b"s").unwrap();
    std::fs::set_permissions(victim.join("secret"), std::fs::Permissions::from_mode(0o600)).unwrap();
    // The next pids, as a local user could guess them: each name a directory whose every
    // fixed entry name is a symlink into the victim directory.
    let last: u32 = std::fs::read_to_string("/proc/sys/kernel/ns_last_pid").unwrap().trim().parse().unwrap();
    let planted: Vec<PathBuf> = (last + 1..last + 400).map(|p| tmp.join(format!("volprep-demo-{p}"))).collect();
    for d in &planted {
        std::fs::create_dir(d).unwrap();
        symlink(&victim, d.join("repo-000")).unwrap();
        symlink(victim.join("secret"), d.join("repo-001")).unwrap();
    }
    let before_victim = snapshot(&victim);
    // TMPDIR itself gets the demo's directory and loses it again: its times change.
    let below = |s: Snapshot| s.into_iter().filter(|(k, _)| k != common::snap::ROOT).collect::<Snapshot>();
    let before_tmp = below(snapshot(&tmp));
    let r = run(volprep().args(["demo", "--entries", "500", "--report", "-"]).env("TMPDIR", &tmp));
    assert_same(&before_victim, &snapshot(&victim), Meta::attrs_ctime, "the victim directory");
    assert_same(&before_tmp, &below(snapshot(&tmp)), Meta::attrs_ctime, "the planted names, and nothing left behind");
    let r = r.expect_code(0);
    assert_eq!(r.report()["volumes"].as_array().unwrap().len(), 3, "{}", r.describe());
    assert!(r.stderr.contains("removing the demo volume"), "the pause before the end is named\n{}", r.describe());
}

/// `demo DIR` on a directory with entries is refused (exit 2, one line naming it and an entry)
/// and nothing there changes; a new or empty DIR is used.
#[test]
fn demo_refuses_a_directory_that_is_not_empty() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("data");
    std::fs::create_dir(&dir).unwrap();
    std::fs::write(dir.join("precious"), b"p").unwrap();
    std::fs::set_permissions(dir.join("precious"), std::fs::Permissions::from_mode(0o600)).unwrap();
    let before = snapshot(&dir);
    let r = run(volprep().args(["demo", "--entries", "100"]).arg(&dir));
    assert_eq!(r.code, 2, "{}", r.describe());
    assert_eq!(r.stderr_lines().len(), 1, "{}", r.describe());
    let line = r.stderr_lines()[0];
    assert!(
        line.contains(&*dir.to_string_lossy()) && line.contains("not empty") && line.contains("precious"),
        "{line}"
    );
    assert!(r.stdout.is_empty(), "{}", r.describe());
    assert_same(&before, &snapshot(&dir), Meta::attrs_ctime, "the non-empty DIR");
    let empty = t.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    let r = run(volprep().args(["demo", "--entries", "100"]).arg(&empty)).expect_code(0);
    assert!(std::fs::read_dir(&empty).unwrap().count() > 0, "an empty DIR holds the demo volume");
    // Its three summary lines say what it did; the JSON report only with --report.
    assert!(r.stdout.is_empty(), "{}", r.describe());
    assert_eq!(r.stderr.matches("/s): ").count(), 3, "{}", r.describe());
    assert!(r.stderr.contains("demo volume kept at"), "{}", r.describe());
    // Each pass's first line names the load policy it runs with (a temp dir: full speed).
    assert_eq!(r.stderr.matches(" load=\"full\" ").count(), 3, "{}", r.describe());
}

/// Names with line and paragraph separators, zero-width, tag and no-break space characters,
/// and a forged run id made of them: none reaches the text logs, the JSON report or the new
/// marker raw (each shows as `\u{…}`).
#[test]
#[ignore = "needs root, loop devices and mkfs.ext4"]
fn non_printing_characters_never_reach_logs_reports_or_the_marker_raw() {
    privileged(&["mkfs.ext4"]);
    const RAW: [char; 6] = ['\u{2028}', '\u{2029}', '\u{200b}', '\u{e0041}', '\u{a0}', '\u{feff}'];
    let fs = LoopFs::new(FsKind::Ext4, 64);
    let vol = fs.path().join("vol");
    let mut t = Tree::new();
    t.root(0, 0, 0o755);
    let names = ["a\u{2028}FAKE", "b\u{2029}x", "c\u{200b}", "d\u{e0041}\u{e007f}", "e\u{a0}f", "\u{feff}g"];
    for n in names {
        t.file(n, 1234, 1234, 0o600);
    }
    t.build(&vol);
    // Entries of another user in an unprivileged pass are listed by name in the report (the
    // group is root's own: an unprivileged pass only gives a group it is in).
    let r = run(volprep()
        .args(["apply", "--unprivileged", "--fs-group", "0", "--log-level", "debug", "--log-format", "text"])
        .args(["--report", "-"])
        .arg(&vol));
    assert_eq!(r.code, 4, "{}", r.describe());
    let listed: Vec<String> = r.volume()["foreign_owned_list"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["path"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(listed.len(), names.len(), "{}", r.describe());
    for s in [&r.stdout, &r.stderr] {
        assert!(!s.contains(RAW), "a raw non-printing character:\n{}", r.describe());
    }
    for want in ["a\\u{2028}FAKE", "b\\u{2029}x", "c\\u{200b}", "d\\u{e0041}\\u{e007f}", "e\\u{a0}f", "\\u{feff}g"] {
        assert!(listed.iter().any(|p| p.ends_with(want)), "{want} in {listed:?}");
        assert!(r.stderr.contains(want), "{want} in the text log\n{}", r.stderr);
    }
    // A forged in-progress marker whose run id a resumed pass would carry into its own marker.
    let check = run(volprep().args(["check", "--fs-group", "2000", "--report", "-"]).arg(&vol));
    let digest = check.volume()["spec_digest"].as_str().unwrap().to_string();
    let spec = check.volume()["spec"].as_str().unwrap().to_string();
    let run_id = "r1\u{2028}FAKE line\u{e0041}\u{200b}";
    set_json(
        &vol,
        MARKER,
        &json!({"v": 1, "state": "in-progress", "digest": digest, "spec": spec, "run": run_id, "started": 1}),
    );
    let r = run(volprep().args(["apply", "--fs-group", "2000", "--log-format", "text", "--report", "-"]).arg(&vol))
        .expect_code(0);
    for s in [&r.stdout, &r.stderr] {
        assert!(!s.contains(RAW), "a raw non-printing character:\n{}", r.describe());
    }
    let reason = r.volume()["reason"].as_str().unwrap().to_string();
    assert!(reason.contains("r1\\u{2028}FAKE"), "the forged run id shown escaped\n{}", r.describe());
    let m = xattr_json(&vol, MARKER).unwrap();
    assert_eq!(m["state"], "done");
    let new_run = m["run"].as_str().unwrap();
    assert!(new_run.bytes().all(|b| b.is_ascii_graphic()) && !new_run.contains("FAKE"), "{m}");
}
