//! A pass killed midway: run a volprep command with a progress line every 20 ms and SIGKILL it
//! once a line counts enough entries (tests/marker.rs, tests/unprivileged.rs); reading text log
//! fields.

use std::io::BufRead as _;
use std::os::unix::process::ExitStatusExt;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
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

/// Entries counted in a progress log line, if `line` is one.
pub fn progress_entries(line: &str) -> Option<u64> {
    if !line.contains(" progress ") {
        return None;
    }
    field(line, "entries")?.parse().ok()
}

/// Runs `cmd` (a volprep pass) with a progress line every 20 ms and SIGKILLs it as soon as a
/// line counts at least `at` entries. Returns its stderr. Panics if the pass ends first (the
/// kill point was missed) or if it makes no progress for a minute.
pub fn killed_at(mut cmd: Command, at: u64) -> String {
    cmd.args(["--progress-interval", "20ms", "--log-format", "text"]).stdout(Stdio::null()).stderr(Stdio::piped());
    let cmdline = format!("{cmd:?}");
    let mut child = KillOnDrop(cmd.spawn().expect("spawn volprep"));
    let stderr = child.0.stderr.take().unwrap();
    let (tx, rx) = mpsc::channel::<String>();
    std::thread::spawn(move || {
        let mut r = std::io::BufReader::new(stderr);
        let mut buf = Vec::new();
        while r.read_until(b'\n', &mut buf).is_ok_and(|n| n > 0) {
            if tx.send(String::from_utf8_lossy(&buf).into_owned()).is_err() {
                return;
            }
            buf.clear();
        }
    });
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut log = String::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) => {
                log.push_str(&line);
                if progress_entries(&line).is_some_and(|n| n >= at) {
                    child.0.kill().expect("kill volprep");
                    break;
                }
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                let status = child.0.wait().unwrap();
                panic!(
                    "the pass ended ({status}) before a progress line showed {at} entries: kill point missed\ncommand: {cmdline}\nstderr:\n{log}"
                );
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {
                panic!("no progress line showing {at} entries within 60s\ncommand: {cmdline}\nstderr:\n{log}")
            }
        }
    }
    let status = child.0.wait().unwrap();
    // The rest of stderr, up to the kill.
    log.extend(rx.iter());
    assert_eq!(
        status.signal(),
        Some(libc::SIGKILL),
        "volprep should have died by SIGKILL, got {status}\ncommand: {cmdline}\nstderr:\n{log}"
    );
    log
}
