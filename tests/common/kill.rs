//! A pass killed (or held) midway at an exact point: the binary's test hook
//! `VOLPREP_TEST_KILL_AFTER` makes it SIGKILL (SIGTERM, SIGSTOP) itself after N entries (tests/marker.rs, tests/shard.rs,
//! tests/unprivileged.rs, tests/fuzz.rs); reading text log fields.

use std::os::unix::process::ExitStatusExt;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A process killed with SIGKILL and reaped when dropped: a failing test leaves nothing
/// running that keeps its mount busy.
pub struct KillOnDrop(pub Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The value of `key=` in a text log line (quotes stripped; a `%`-formatted value runs to the
/// end of the line, so only use this for one-word fields).
pub fn field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    let pat = format!(" {key}=");
    let at = line.find(&pat)? + pat.len();
    let rest = &line[at..];
    let word = rest.split_whitespace().next().unwrap_or("");
    Some(word.trim_matches('"'))
}

/// Sets the binary's test hook `var` to `value` on `cmd`. The hooks exist only in a binary built
/// with `--features test-hooks` (tests that use them are ignored without it): run without the
/// feature, such a test fails here, naming it, rather than waiting for a kill that never comes.
#[track_caller]
pub fn hook<'c>(cmd: &'c mut Command, var: &str, value: &str) -> &'c mut Command {
    if !cfg!(feature = "test-hooks") {
        panic!("{var}: the binary has no test hooks: cargo test --features test-hooks");
    }
    cmd.env(var, value)
}

/// How a pass is interrupted at its kill point.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// SIGKILL: nothing more is written.
    Kill,
    /// SIGTERM: the graceful stop (checkpoint, report, exit 143).
    Term,
}

/// Runs `cmd` (a volprep pass, text logs) with the binary's test hook `VOLPREP_TEST_KILL_AFTER`
/// set so that it SIGKILLs itself once its pass has counted exactly `at` entries. Returns its
/// stderr. Panics if the pass ends otherwise (it had fewer than `at` entries to count).
pub fn killed_at(cmd: Command, at: u64) -> String {
    stopped_at(cmd, at, Stop::Kill)
}

/// [`killed_at`] with the stop chosen: SIGTERM lets the pass exit 143 by itself.
pub fn stopped_at(mut cmd: Command, at: u64, stop: Stop) -> String {
    let how = match stop {
        Stop::Kill => "kill",
        Stop::Term => "term",
    };
    hook(&mut cmd, "VOLPREP_TEST_KILL_AFTER", &format!("{at}:{how}")).args(["--log-format", "text"]);
    cmd.stdout(Stdio::null()).stderr(Stdio::piped());
    let cmdline = format!("{cmd:?}");
    let child = KillOnDrop(cmd.spawn().expect("spawn volprep"));
    let out = wait_within(child, Duration::from_secs(120), &cmdline);
    let log = String::from_utf8_lossy(&out.stderr).into_owned();
    let ok = match stop {
        Stop::Kill => out.status.signal() == Some(libc::SIGKILL),
        Stop::Term => out.status.code() == Some(143),
    };
    assert!(
        ok,
        "volprep should have stopped by its {how} point at {at} entries, got {} (fewer entries than that?)\ncommand: {cmdline}\nstderr:\n{log}",
        out.status
    );
    log
}

/// Reads lines from a child's stderr until what it said contains `needle`, and returns what it
/// said; panics with `what` and the text when the stream ends first.
pub fn read_until(err: &mut impl std::io::BufRead, needle: &str, what: &str) -> String {
    let mut said = String::new();
    while !said.contains(needle) {
        let mut line = String::new();
        assert_ne!(err.read_line(&mut line).unwrap(), 0, "{what}: {said}");
        said.push_str(&line);
    }
    said
}

/// Waits for `child` (stderr piped) at most `limit`, then collects its output; kills it and
/// panics after that.
pub fn wait_within(mut child: KillOnDrop, limit: Duration, cmdline: &str) -> std::process::Output {
    let mut stderr = child.0.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = std::io::Read::read_to_end(&mut stderr, &mut buf);
        buf
    });
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(st) = child.0.try_wait().unwrap() {
            break st;
        }
        if Instant::now() > deadline {
            let _ = child.0.kill();
            let _ = child.0.wait();
            let err = String::from_utf8_lossy(&reader.join().unwrap()).into_owned();
            panic!("still running after {limit:?}: {cmdline}\nstderr:\n{err}");
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let stderr = reader.join().unwrap();
    std::process::Output { status, stdout: Vec::new(), stderr }
}

/// A process that stopped itself (SIGSTOP) at its hook's point (or any running one): continued
/// when dropped, or killed if the test is failing, so that nothing keeps its mount busy.
pub struct Held(pub i32);

impl Drop for Held {
    fn drop(&mut self) {
        let sig = if std::thread::panicking() { libc::SIGKILL } else { libc::SIGCONT };
        // SAFETY: kill takes plain integers: no memory is involved.
        unsafe { libc::kill(self.0, sig) };
    }
}

/// Spawns `cmd` (a volprep pass) with the test hook set to stop it once its pass has counted
/// exactly `at` entries, and waits until it is stopped there (holding whatever it holds at that
/// point: its lock, its shard registration). Drop the [`Held`] to let it go on.
pub fn held_at(mut cmd: Command, at: u64) -> (Child, Held) {
    let cmdline = format!("{cmd:?}");
    let child = hook(&mut cmd, "VOLPREP_TEST_KILL_AFTER", &format!("{at}:stop")).spawn().expect("spawn volprep");
    let held = Held(child.id() as i32);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", child.id())).unwrap_or_default();
        match stat.rsplit_once(") ").map(|(_, rest)| rest.chars().next()) {
            Some(Some('T')) => return (child, held),
            Some(Some('Z')) | None => panic!("volprep ended before its stop point at {at} entries: {cmdline}"),
            _ => {}
        }
        assert!(Instant::now() < deadline, "volprep did not reach its stop point at {at} entries: {cmdline}");
        std::thread::sleep(Duration::from_millis(5));
    }
}
