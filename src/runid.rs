//! Run ids (time, pid and host of the run that wrote a marker or a heartbeat) and whether such a run is known to be dead.

use std::time::{SystemTime, UNIX_EPOCH};

use rustix::process::{Pid, test_kill_process};

/// A run id: unique enough to tell runs apart (time, pid and host), short enough for the marker.
pub fn new_run_id() -> String {
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    format!("{:x}-{}@{}", (nanos / 1000) as u64 & 0xffff_ffff_ffff, std::process::id(), hostname())
}

/// This machine's (or pod's) host name, or "-", as it goes into a run id: at most 63
/// characters, each not in `[A-Za-z0-9._-]` replaced by `_`.
pub fn hostname() -> String {
    let safe = |c: char| if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') { c } else { '_' };
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map_or_else(|_| "-".into(), |h| h.trim().chars().take(63).map(safe).collect())
}

/// Whether `id` is a run id volprep could have written ([`new_run_id`], or one of an earlier
/// version): 1 to 100 printable ASCII characters, no space, quote or backslash.
pub fn valid_run_id(id: &str) -> bool {
    (1..=100).contains(&id.len()) && id.bytes().all(|b| b.is_ascii_graphic() && !matches!(b, b'"' | b'\\' | b'\''))
}

/// The pid and host of run `id` (`<time>-<pid>@<host>`). The id comes from an xattr the app may
/// write: only a positive pid is one (0 and negative numbers name process groups to `kill`).
fn pid_and_host(id: &str) -> Option<(Pid, &str)> {
    let (head, host) = id.split_once('@')?;
    let raw = head.split_once('-')?.1.parse::<i32>().ok().filter(|&p| p > 0)?;
    Some((Pid::from_raw(raw)?, host))
}

/// Whether the run `id` is known to be dead: it ran on this host and its process is gone, or it
/// had this very pid (a restarted container, where volprep is pid 1 again).
pub fn run_is_dead_here(id: &str) -> bool {
    let Some((pid, host)) = pid_and_host(id) else { return false };
    if host != hostname() {
        return false;
    }
    if pid.as_raw_nonzero().get() as u32 == std::process::id() {
        return true;
    }
    // Signal 0 only checks that the process exists.
    test_kill_process(pid) == Err(rustix::io::Errno::SRCH)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_run_id_is_valid_and_names_this_process() {
        let id = new_run_id();
        assert!(valid_run_id(&id), "{id}");
        let (pid, host) = pid_and_host(&id).unwrap();
        assert_eq!((pid.as_raw_nonzero().get() as u32, host), (std::process::id(), hostname().as_str()));
        assert!(run_is_dead_here(&id), "a run of this very pid is an earlier life of this container");
    }

    #[test]
    fn a_forged_pid_is_never_probed() {
        let host = hostname();
        for pid in ["0", "-1", "-2", "-0", "x", "", "99999999999"] {
            let id = format!("abc-{pid}@{host}");
            assert_eq!(pid_and_host(&id), None, "{id}");
            assert!(!run_is_dead_here(&id), "{id}: neither alive nor dead, never probed");
        }
        assert!(pid_and_host("abc-7@h").is_some());
        assert!(!run_is_dead_here(&format!("abc-1@{host}x")), "another host is never known dead");
        assert!(!run_is_dead_here(&format!("abc-1@{host}")), "pid 1 is alive");
    }
}
