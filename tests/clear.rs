//! `volprep clear` (docs/upgrade.md, going back to the kubelet's `fsGroup`), the real binary on
//! real directories, as any user on plain temp dirs: it removes every `user.volprep*` attribute
//! of the root (the marker first) and nothing else, changes no owner, group, mode or entry, so
//! the next `apply` walks again; `--dry-run` lists and exits 3 (0 when nothing); a symlink, a
//! file or a missing path is refused with its one line; it waits for the volume's lock up to
//! `--lock-timeout`. As root, on a ramfs (no xattrs): nothing to clear.

mod common;

use std::ffi::CString;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt as _;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use common::kill::{KillOnDrop, read_until, wait_within};
use common::xattr::{CHECKPOINT, MARKER, get_xattr, set_xattr};
use common::*;

/// The group the tests apply: 2000 as root, else the user's own (a non-root user may give its
/// entries only a group it is in).
fn group() -> u32 {
    if rustix::process::geteuid().is_root() { 2000 } else { rustix::process::getegid().as_raw() }
}

/// Every attribute name on `path` (`llistxattr`), sorted.
fn attr_names(path: &Path) -> Vec<String> {
    let p = CString::new(path.as_os_str().as_bytes()).unwrap();
    let mut buf = vec![0u8; 65536];
    // SAFETY: `p` is a valid C string; `buf` has room for `buf.len()` bytes.
    let len = unsafe { libc::llistxattr(p.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    assert!(len >= 0, "listxattr {}: {}", path.display(), std::io::Error::last_os_error());
    buf.truncate(len as usize);
    let mut names: Vec<String> =
        buf.split(|&b| b == 0).filter(|n| !n.is_empty()).map(|n| String::from_utf8_lossy(n).into_owned()).collect();
    names.sort();
    names
}

/// volprep's attributes on `path`: `user.volprep` and `user.volprep.*`.
fn volprep_attrs(path: &Path) -> Vec<String> {
    attr_names(path).into_iter().filter(|n| n == MARKER || n.starts_with(&format!("{MARKER}."))).collect()
}

/// A volume of the user's own entries in `base/vol` (private modes, the user's first group),
/// prepared by `apply --fs-group group()`, then given what other runs leave: a checkpoint, a
/// shard's checkpoint and special-bit record, and an attribute of the app's own.
fn prepared(base: &Path) -> PathBuf {
    let vol = base.join("vol");
    let me = rustix::process::geteuid().as_raw();
    let egid = rustix::process::getegid().as_raw();
    let mut t = Tree::new();
    t.root(me, egid, 0o700).dir("d", me, egid, 0o700).file("d/f", me, egid, 0o600).file("g", me, egid, 0o640);
    t.symlink("l", "d/f", me, egid);
    t.build(&vol);
    apply_fs_group(&vol, group(), &[]);
    set_xattr(&vol, CHECKPOINT, b"{}");
    set_xattr(&vol, "user.volprep.checkpoint.1", b"{}");
    set_xattr(&vol, "user.volprep.pending.1", b"{}");
    set_xattr(&vol, "user.app", b"the app's own");
    vol
}

/// `volprep clear --lock-timeout 10m VOL` (its report and log not captured), running, once it
/// has said that it waits for the volume's lock.
struct WaitingClear {
    child: KillOnDrop,
    err: std::io::BufReader<std::process::ChildStderr>,
    said: String,
    cmdline: String,
}

impl WaitingClear {
    fn start(vol: &Path) -> WaitingClear {
        let mut cmd = volprep();
        cmd.args(["clear", "--lock-timeout", "10m"]).arg(vol).stdout(Stdio::null()).stderr(Stdio::piped());
        let cmdline = format!("{cmd:?}");
        let mut child = KillOnDrop(cmd.spawn().unwrap());
        let mut err = std::io::BufReader::new(child.0.stderr.take().unwrap());
        let said = read_until(&mut err, "waiting for its lock", "clear ended without waiting");
        WaitingClear { child, err, said, cmdline }
    }

    /// Waits (a minute at most) for its end: its exit code and all it logged.
    fn end(self) -> (Option<i32>, String) {
        let WaitingClear { mut child, err, said, cmdline } = self;
        child.0.stderr = Some(err.into_inner());
        let out = wait_within(child, Duration::from_secs(60), &cmdline);
        (out.status.code(), said + &String::from_utf8_lossy(&out.stderr))
    }
}

/// `volprep clear ARGS... --report - PATHS...`.
fn clear(args: &[&str], paths: &[&Path]) -> Run {
    run(volprep().arg("clear").args(args).args(["--report", "-"]).args(paths))
}

/// The attribute names the report lists for its only volume.
fn listed(r: &Run) -> Vec<String> {
    let v = r.volume();
    let names = v["attributes"].as_array().unwrap_or_else(|| panic!("no attributes list\n{}", r.describe()));
    names.iter().map(|n| n.as_str().unwrap().to_string()).collect()
}

/// After `apply`, `clear` removes the marker and every `user.volprep.*` attribute (the marker
/// first), keeps the app's attribute, and changes no entry: owners, groups and modes as they
/// were, below the root not even a ctime. The next `apply` walks the volume again (`no
/// marker`), and `clear` again has nothing to clear.
#[test]
fn clear_after_apply_removes_every_volprep_attribute_and_changes_no_entry() {
    let base = tempfile::tempdir().unwrap();
    let vol = prepared(base.path());
    let ours = ["user.volprep", "user.volprep.checkpoint", "user.volprep.checkpoint.1", "user.volprep.pending.1"];
    assert_eq!(volprep_attrs(&vol), ours);
    let before = snapshot(&vol);
    tick();

    let r = clear(&[], &[&vol]).expect_code(0);
    let v = r.volume();
    assert_eq!((v["action"].as_str(), v["marker_before"].as_str()), (Some("cleared"), Some("done")), "{v}");
    assert_eq!(listed(&r), ours, "the marker first, then the others by name\n{}", r.describe());
    assert!(r.stderr.contains("removed 4 volprep attribute(s): user.volprep, "), "{}", r.describe());
    assert_eq!(volprep_attrs(&vol), Vec::<String>::new(), "no user.volprep* left");
    assert_eq!(get_xattr(&vol, "user.app").as_deref(), Some(&b"the app's own"[..]), "the app's attribute stays");
    let after = snapshot(&vol);
    assert_same(&before, &after, Meta::attrs, "clear changed an owner, group or mode");
    let below = |s: &Snapshot| {
        s.iter().filter(|(k, _)| k.as_slice() != b".").map(|(k, m)| (k.clone(), m.attrs_ctime())).collect::<Vec<_>>()
    };
    assert_eq!(below(&before), below(&after), "clear touched an entry below the root");

    let again = pass("apply", &["--fs-group", &group().to_string()], &vol).expect_code(0);
    let v = again.volume();
    assert_eq!((v["action"].as_str(), v["marker_before"].as_str()), (Some("walked"), Some("none")), "{v}");
    assert!(v["reason"].as_str().unwrap().contains("no marker"), "{}", again.describe());
    assert_eq!(again.count("entries"), before.len() as u64, "every entry read again\n{}", again.describe());
    clear(&[], &[&vol]).expect_code(0);
    let none = clear(&[], &[&vol]).expect_code(0);
    assert_eq!(none.volume()["action"], "nothing", "{}", none.describe());
    assert!(none.stderr.contains("nothing to clear (no volprep attributes)"), "{}", none.describe());
}

/// A pass killed midway leaves an `in-progress` marker and its checkpoint; after `clear`, the
/// next `apply` starts a fresh walk (no resume from a checkpoint whose marker is gone).
#[test]
#[cfg_attr(not(feature = "test-hooks"), ignore = "needs --features test-hooks")]
fn clear_after_a_killed_pass_leaves_nothing_to_resume() {
    let base = tempfile::tempdir().unwrap();
    let vol = base.path().join("vol");
    let (me, egid) = (rustix::process::geteuid().as_raw(), rustix::process::getegid().as_raw());
    let mut t = Tree::new();
    t.root(me, egid, 0o700);
    for d in 0..20 {
        t.dir(format!("d{d:02}"), me, egid, 0o700);
        for f in 0..20 {
            t.file(format!("d{d:02}/f{f}"), me, egid, 0o600);
        }
    }
    t.build(&vol);
    let mut cmd = volprep();
    cmd.args(["apply", "--fs-group", &group().to_string(), "--threads", "1", "--checkpoint-interval", "0s"]).arg(&vol);
    common::kill::killed_at(cmd, 300);
    assert_eq!(common::xattr::xattr_json(&vol, MARKER).unwrap()["state"], "in-progress");
    assert!(volprep_attrs(&vol).len() >= 2, "a marker and a checkpoint: {:?}", volprep_attrs(&vol));

    let r = clear(&[], &[&vol]).expect_code(0);
    assert_eq!(r.volume()["marker_before"], "in-progress", "{}", r.describe());
    assert_eq!(volprep_attrs(&vol), Vec::<String>::new());
    let again = pass("apply", &["--fs-group", &group().to_string()], &vol).expect_code(0);
    assert_eq!(again.volume()["marker_before"], "none", "{}", again.describe());
    assert_eq!(again.count("skipped_subtrees"), 0, "nothing resumed\n{}", again.describe());
    assert_eq!(again.count("entries"), t.len() as u64, "{}", again.describe());
}

/// `--dry-run` changes nothing (not the root's ctime), lists what `clear` would remove and
/// exits 3; where there is nothing, 0. It takes no lock (like `check`).
#[test]
fn dry_run_lists_and_exits_3_when_something_would_be_removed() {
    let base = tempfile::tempdir().unwrap();
    let vol = prepared(base.path());
    let attrs = volprep_attrs(&vol);
    let before = snapshot(&vol);
    tick();
    let _lock = Lock::take(&vol);
    let r = clear(&["--dry-run"], &[&vol]).expect_code(3);
    assert_eq!(r.volume()["action"], "would-clear", "{}", r.describe());
    assert_eq!(listed(&r).len(), attrs.len(), "{}", r.describe());
    assert_eq!(listed(&r)[0], MARKER, "{}", r.describe());
    assert!(r.stderr.contains("would remove 4 volprep attribute(s): user.volprep, "), "{}", r.describe());
    assert_eq!(volprep_attrs(&vol), attrs, "dry-run removed something");
    assert_same(&before, &snapshot(&vol), Meta::attrs_ctime, "dry-run changed the volume");
    drop(_lock);

    clear(&[], &[&vol]).expect_code(0);
    let r = clear(&["--dry-run"], &[&vol]).expect_code(0);
    assert_eq!((r.volume()["action"].as_str(), listed(&r).len()), (Some("nothing"), 0), "{}", r.describe());
    // Several volumes: 3 when any would change.
    let other = base.path().join("other");
    std::fs::create_dir(&other).unwrap();
    set_xattr(&other, MARKER, b"{}");
    let both = clear(&["--dry-run"], &[&vol, &other]).expect_code(3);
    let words: Vec<_> = both.report()["volumes"].as_array().unwrap().iter().map(|v| v["action"].clone()).collect();
    assert_eq!(words, ["nothing", "would-clear"], "{}", both.describe());
}

/// The root is opened itself, never through a symlink: a symlink to a prepared volume (and a
/// dangling one) is refused with one line naming it, exit 1, and the volume keeps its marker.
/// A file and a missing path get their own lines; the other volumes of the run are cleared.
#[test]
fn a_symlink_a_file_or_a_missing_path_is_refused_with_one_line() {
    let base = tempfile::tempdir().unwrap();
    let vol = prepared(base.path());
    let (link, dangling, file, missing) =
        (base.path().join("link"), base.path().join("dangling"), base.path().join("file"), base.path().join("missing"));
    std::os::unix::fs::symlink(&vol, &link).unwrap();
    std::os::unix::fs::symlink(base.path().join("nowhere"), &dangling).unwrap();
    std::fs::write(&file, b"x").unwrap();
    let cases = [
        (&link, "is a symlink; refusing to follow it"),
        (&dangling, "is a symlink; refusing to follow it"),
        (&file, "not a directory"),
        (&missing, "open failed: No such file or directory (ENOENT)"),
    ];
    for (path, says) in cases {
        for args in [&[][..], &["--dry-run"]] {
            let r = clear(args, &[path]).expect_code(1);
            let errors: Vec<&str> = r.stderr_lines().into_iter().filter(|l| l.contains("ERROR")).collect();
            let line = format!("{}: {says}", path.display());
            assert!(errors.len() == 1 && errors[0].contains(&line), "one line {line:?}\n{}", r.describe());
            let v = r.volume();
            assert_eq!(v["action"], "failed", "{}", r.describe());
            assert!(v["fatal"].as_str().unwrap().contains(says), "{}", r.describe());
        }
    }
    assert_eq!(get_xattr(&vol, MARKER).map(|_| ()), Some(()), "the link's target keeps its marker");
    let r = run(volprep().args(["clear", "--report", "-"]).arg(&link).arg(&vol)).expect_code(1);
    let words: Vec<_> = r.report()["volumes"].as_array().unwrap().iter().map(|v| v["action"].clone()).collect();
    assert_eq!(words, ["failed", "cleared"], "{}", r.describe());
    assert_eq!(volprep_attrs(&vol), Vec::<String>::new());
}

/// An exclusive `flock` on a volume root, as a running `apply` holds; released when dropped.
struct Lock(#[allow(dead_code)] OwnedFd);

impl Lock {
    fn take(root: &Path) -> Lock {
        use rustix::fs::OFlags;
        // CLOEXEC: a child spawned meanwhile (any test's) must not inherit the lock.
        let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC;
        let fd = rustix::fs::open(root, flags, rustix::fs::Mode::empty()).unwrap();
        rustix::fs::flock(&fd, rustix::fs::FlockOperation::NonBlockingLockExclusive).expect("lock the root");
        Lock(fd)
    }
}

/// While another process holds the volume's lock, `clear` waits: with a short `--lock-timeout`
/// it gives up (exit 1, one line naming the holder and the timeout) and removes nothing; with a
/// long one it waits, removes nothing while waiting, and clears once the lock is released.
#[test]
fn clear_waits_for_the_volume_lock_up_to_its_timeout() {
    let base = tempfile::tempdir().unwrap();
    let vol = prepared(base.path());
    let attrs = volprep_attrs(&vol);
    let lock = Lock::take(&vol);

    let r = clear(&["--lock-timeout", "1s"], &[&vol]).expect_code(1);
    let line = format!("{}: a process (pid {}", vol.display(), std::process::id());
    assert!(r.stderr.contains(&line) && r.stderr.contains("gave up after 1s (--lock-timeout)"), "{}", r.describe());
    assert_eq!(r.volume()["action"], "failed", "{}", r.describe());
    assert_eq!(volprep_attrs(&vol), attrs, "nothing removed without the lock");

    let waiting = WaitingClear::start(&vol);
    assert_eq!(volprep_attrs(&vol), attrs, "nothing removed while waiting");
    drop(lock);
    let (code, log) = waiting.end();
    assert_eq!(code, Some(0), "{log}");
    assert!(log.contains("removed 4 volprep attribute(s)"), "{log}");
    assert_eq!(volprep_attrs(&vol), Vec::<String>::new());
}

/// SIGTERM while `clear` waits for the lock ends it with 143 (as it ends `apply`'s wait), one
/// line naming the path and the signal, and nothing removed.
#[test]
fn a_signal_ends_the_wait_for_the_lock_with_its_code_and_removes_nothing() {
    let base = tempfile::tempdir().unwrap();
    let vol = prepared(base.path());
    let attrs = volprep_attrs(&vol);
    let _lock = Lock::take(&vol);
    let waiting = WaitingClear::start(&vol);
    // SAFETY: kill takes plain integers: no memory is involved.
    assert_eq!(unsafe { libc::kill(waiting.child.0.id() as i32, libc::SIGTERM) }, 0);
    let (code, log) = waiting.end();
    assert_eq!(code, Some(143), "{log}");
    assert!(log.contains(&format!("{}: SIGTERM while waiting for the volume lock", vol.display())), "{log}");
    assert_eq!(volprep_attrs(&vol), attrs, "nothing removed");
}

/// Any `user.volprep.*` name is volprep's to remove, even one an app wrote with a newline in it;
/// the summary line and the report show it escaped, on one line.
#[test]
fn a_name_with_control_characters_is_removed_and_shown_escaped() {
    let base = tempfile::tempdir().unwrap();
    let vol = base.path().join("vol");
    std::fs::create_dir(&vol).unwrap();
    set_xattr(&vol, "user.volprep.x\nINFO forged", b"1");
    let r = clear(&["--log-format", "json"], &[&vol]).expect_code(0);
    assert_eq!(listed(&r), ["user.volprep.x\\nINFO forged"], "{}", r.describe());
    assert_eq!(r.stderr_lines().len(), 1, "one summary line\n{}", r.describe());
    let line: serde_json::Value = serde_json::from_str(r.stderr_lines()[0]).expect("a JSON log line");
    assert_eq!(line["action"], "cleared", "{line}");
    assert_eq!(line["attributes"], 1, "{line}");
    assert_eq!(volprep_attrs(&vol), Vec::<String>::new());
}

/// `volprep --help` lists `clear`.
#[test]
fn help_lists_clear() {
    let r = vp(["--help"]).expect_code(0);
    assert!(r.stdout.lines().any(|l| l.trim_start().starts_with("clear ")), "{}", r.describe());
}

/// On a ramfs (no extended attributes at all): nothing to clear, exit 0 (and 0 for
/// `--dry-run`), after an `apply` that could leave no marker there.
#[test]
#[ignore = "needs root and loop devices (mounts a ramfs)"]
fn on_a_filesystem_without_xattrs_there_is_nothing_to_clear() {
    privileged(&[]);
    let fs = Ramfs::new();
    let vol = fs.path().join("vol");
    std::fs::create_dir(&vol).unwrap();
    std::fs::write(vol.join("f"), b"x").unwrap();
    apply_fs_group(&vol, 2000, &[]);
    for args in [&[][..], &["--dry-run"]] {
        let r = clear(args, &[&vol]).expect_code(0);
        let v = r.volume();
        assert_eq!((v["action"].as_str(), v["marker_before"].as_str()), (Some("nothing"), Some("unsupported")), "{v}");
        assert!(r.stderr.contains("nothing to clear (the filesystem has no user xattrs)"), "{}", r.describe());
    }
}

/// Special-bit records that still name a file (a pass killed between a setuid file's chown and
/// chmod, whose bit the next `apply` restores) keep `clear` off the volume: one line naming the
/// first file, exit 1, nothing removed; `--discard-pending` removes them with the rest.
#[test]
fn special_bit_records_that_name_a_file_keep_clear_off_unless_discarded() {
    let base = tempfile::tempdir().unwrap();
    let vol = prepared(base.path());
    let record = br#"{"run":"r1","digest":"d1","pending":[["d/f",1,2528]]}"#;
    set_xattr(&vol, "user.volprep.pending", record);
    let before = volprep_attrs(&vol);

    let r = clear(&[], &[&vol]);
    assert_eq!(r.code, 1, "{}", r.describe());
    let lines = r.stderr_lines();
    assert!(
        lines.iter().any(|l| l.contains("holds 1 special-bit record(s)") && l.contains("first: d/f")),
        "{}",
        r.describe()
    );
    assert_eq!(r.volume()["action"], "failed", "{}", r.describe());
    assert_eq!(volprep_attrs(&vol), before, "nothing removed");

    // The dry run says what `clear` would do: refuse (exit 1), or with `--discard-pending`
    // remove them with the rest (exit 3).
    clear(&["--dry-run"], &[&vol]).expect_code(1);
    assert_eq!(listed(&clear(&["--dry-run", "--discard-pending"], &[&vol]).expect_code(3)), before);
    assert_eq!(volprep_attrs(&vol), before, "nothing removed");

    let r = clear(&["--discard-pending"], &[&vol]).expect_code(0);
    assert_eq!(r.volume()["action"], "cleared", "{}", r.describe());
    assert_eq!(volprep_attrs(&vol), Vec::<String>::new());
}
