//! The experiment that proves a verdict: volprep makes a change it certainly may make, to a file
//! it creates itself (owned by it, no inode flag, no other writer), reads it back, and waits out
//! an attribute cache before concluding that the storage ignores it. Where no file can be
//! created, a chown of the directory to its own owner and group tells a refusal (root squash)
//! and nothing else.

use std::ffi::{CStr, CString};
use std::os::fd::BorrowedFd;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use rustix::io::Errno;

use super::Verdict;
use crate::sys::{self, Meta};

/// How long a change that reads back unchanged is read again before the storage is said to
/// ignore it: longer than the attribute caches of network filesystems and FUSE daemons (a few
/// seconds) that a change's reply does not refresh.
pub const CACHE_WAIT: Duration = Duration::from_secs(10);

/// How often a change is read again while the wait lasts.
const STEP: Duration = Duration::from_millis(250);

/// How the name of the experiment's file begins: `.volprep-probe-<pid>-<16 hex digits>`, the
/// first 8 this process's own (drawn once), the last 8 counting its experiments.
pub const PROBE_PREFIX: &str = ".volprep-probe-";

/// What the experiment found, and how (the report's `ownership_evidence`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Proof {
    /// `Honours`, or a verdict that stops the pass; `Unknown` when nothing could be proven.
    pub verdict: Verdict,
    pub evidence: String,
}

impl Proof {
    fn new(verdict: Verdict, evidence: String) -> Proof {
        Proof { verdict, evidence }
    }
}

/// Who may chown the directory to its own owner and group: anyone privileged, else its owner.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Chowner {
    Privileged,
    Unprivileged { uid: u32 },
}

/// The experiment in `dir` (an open directory of the volume): a new file's group changed to
/// `gid` (or another group of this process) and its mode to another, read back until they hold
/// or `wait` has passed; the file is removed.
pub fn run(dir: BorrowedFd<'_>, gid: Option<u32>, who: Chowner, wait: Duration) -> Proof {
    let name = probe_name();
    match sys::create_new_at(dir, &name, 0o600) {
        Ok(file) => {
            let proof = on_own_file(sys::fd(&file), gid, wait);
            drop(file);
            let _ = sys::unlink_at(dir, &name);
            proof
        }
        Err(e) => on_dir(dir, who, e),
    }
}

/// A name no app uses, unique to this process and experiment.
fn probe_name() -> CString {
    static SEQ: AtomicU32 = AtomicU32::new(0);
    let seq = SEQ.fetch_add(1, Ordering::Relaxed);
    CString::new(format!("{PROBE_PREFIX}{}-{:08x}{seq:08x}", std::process::id(), process_token())).expect("no NUL")
}

/// 32 random bits drawn once per process: they tell this process's experiment files from those
/// of an earlier process that had the same pid (a restarted container, where volprep is pid 1
/// again).
fn process_token() -> u32 {
    static TOKEN: OnceLock<u32> = OnceLock::new();
    *TOKEN.get_or_init(|| sys::random_u64().map_or(std::process::id(), |n| n as u32))
}

/// Whose experiment file a name is: `pid` and its process's token (see [`probe_name`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ProbeOwner {
    pid: u32,
    token: u32,
}

impl ProbeOwner {
    /// The owner of `name` if it is exactly an experiment file's name, else `None`.
    fn of(name: &[u8]) -> Option<ProbeOwner> {
        let rest = name.strip_prefix(PROBE_PREFIX.as_bytes())?;
        let dash = rest.iter().position(|&b| b == b'-')?;
        let (pid, hex) = (&rest[..dash], &rest[dash + 1..]);
        let digits = |s: &[u8], ok: fn(&u8) -> bool| !s.is_empty() && s.iter().all(ok);
        if !digits(pid, u8::is_ascii_digit)
            || hex.len() != 16
            || !digits(hex, |b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
        {
            return None;
        }
        let pid = std::str::from_utf8(pid).ok()?.parse().ok().filter(|&p| p > 0)?;
        let token = u32::from_str_radix(std::str::from_utf8(&hex[..8]).ok()?, 16).ok()?;
        Some(ProbeOwner { pid, token })
    }

    /// Whether its process is gone (pure): another pid that is not `alive`, or this very pid
    /// with another token (an earlier process that had it). A live other pid's file is its
    /// experiment under way.
    fn gone(self, me: ProbeOwner, alive: impl FnOnce(u32) -> bool) -> bool {
        if self.pid == me.pid { self.token != me.token } else { !alive(self.pid) }
    }
}

/// Removes `name` in `dir` (seen as `meta`, not followed) when it is the experiment file of a
/// process that is gone, killed before it could remove it: exactly an experiment file's name, a
/// regular file, owned by this process's uid (who creates them). Returns whether it was removed.
///
/// Whether a pid is alive is known only in this pid namespace: another node's (or another pod's)
/// experiment under way whose pid is free here loses its file's name, which its open fd
/// outlives on local filesystems; where it does not, its read-back fails and it proves nothing.
pub fn remove_stale(dir: BorrowedFd<'_>, name: &CStr, meta: &Meta) -> bool {
    let Some(owner) = ProbeOwner::of(name.to_bytes()) else { return false };
    let me = ProbeOwner { pid: std::process::id(), token: process_token() };
    if meta.kind() != sys::Kind::File || meta.uid != sys::euid() || !owner.gone(me, sys::process_alive) {
        return false;
    }
    sys::unlink_at(dir, name).is_ok()
}

/// The change to make to a new file seen as `m`: its group to `want` (or another group of this
/// process when it already has that one), and its group-read bit flipped.
fn target(m: &Meta, want: Option<u32>) -> (Option<u32>, u32) {
    let gid = want.filter(|&g| g != m.gid).or_else(|| sys::groups().into_iter().find(|&g| g != m.gid));
    (gid, m.perm() ^ 0o040)
}

fn on_own_file(fd: BorrowedFd<'_>, want: Option<u32>, wait: Duration) -> Proof {
    let m = match sys::stat_fd(fd) {
        Ok(m) => m,
        Err(e) => return Proof::new(Verdict::Unknown, format!("cannot read back a file volprep created: {e}")),
    };
    let (gid, mode) = target(&m, want);
    let what = match gid {
        Some(g) => format!("group {} -> {g} and mode {:04o} -> {mode:04o}", m.gid, m.perm()),
        None => format!("mode {:04o} -> {mode:04o}", m.perm()),
    };
    let refused = |op: &str, e: Errno| {
        let verdict = if e == Errno::PERM { Verdict::Refuses } else { Verdict::Unknown };
        Proof::new(verdict, format!("{op} of a file volprep created ({what}) answered {}", text(e)))
    };
    if let Some(g) = gid {
        if let Err(e) = sys::chown_fd(fd, None, Some(g)) {
            return refused("chown", e);
        }
    }
    if let Err(e) = sys::chmod_fd(fd, mode) {
        return refused("chmod", e);
    }
    read_until_held(fd, gid, mode, wait, &what)
}

/// Reads the file back until it has `gid` and `mode`, for at most `wait`, or until SIGTERM or
/// SIGINT stops the pass (the caller removes the file either way).
fn read_until_held(fd: BorrowedFd<'_>, gid: Option<u32>, mode: u32, wait: Duration, what: &str) -> Proof {
    let start = Instant::now();
    loop {
        let now = match sys::stat_fd(fd) {
            Ok(m) => m,
            Err(e) => {
                return Proof::new(
                    Verdict::Unknown,
                    format!("a file volprep changed cannot be read back: {}", text(e)),
                );
            }
        };
        let held = gid.is_none_or(|g| g == now.gid) && now.perm() == mode;
        let waited = start.elapsed();
        if held {
            let after = if waited < STEP { String::new() } else { format!(" after {} ms", waited.as_millis()) };
            return Proof::new(Verdict::Honours, format!("a file volprep created took {what}{after}"));
        }
        if let Some(sig) = sys::termination() {
            return Proof::new(
                Verdict::Unknown,
                format!(
                    "{sig} came after {} ms of reading back a file volprep changed ({what}), before it held: no verdict",
                    waited.as_millis()
                ),
            );
        }
        if waited >= wait {
            let seen = format!("group {} mode {:04o}", now.gid, now.perm());
            return Proof::new(
                Verdict::Ignores,
                format!(
                    "chown and chmod of a file volprep created ({what}) reported success; read back for {} s it still had {seen}",
                    wait.as_secs()
                ),
            );
        }
        std::thread::sleep(STEP);
    }
}

/// No file could be created in `dir` (`create`: why): a chown of `dir` to its own owner and
/// group, which changes nothing and which `who` may make, refused with EPERM is the storage's
/// refusal, unless an inode flag or an unmapped owner explains it.
fn on_dir(dir: BorrowedFd<'_>, who: Chowner, create: Errno) -> Proof {
    let unknown =
        |why: String| Proof::new(Verdict::Unknown, format!("no file could be created ({}); {why}", text(create)));
    let Ok(m) = sys::stat_fd(dir) else { return unknown("the directory cannot be read back".into()) };
    if let Some(l) = sys::locked_at(dir, c"") {
        return unknown(format!("the directory is {l:?}"));
    }
    if !sys::Mapped::of_self().maps(m.uid, m.gid) {
        return unknown("the directory's owner is not mapped into this user namespace".into());
    }
    if matches!(who, Chowner::Unprivileged { uid } if uid != m.uid) {
        return unknown("the directory is another user's".into());
    }
    match sys::chown_fd(dir, Some(m.uid), Some(m.gid)) {
        Err(Errno::PERM) => Proof::new(
            Verdict::Refuses,
            format!(
                "no file could be created ({create}); a chown of a directory to its own owner and group ({}:{}) failed: EPERM",
                m.uid, m.gid
            ),
        ),
        Err(e) => unknown(format!("a chown of the directory to its own owner answered {}", text(e))),
        Ok(()) => unknown("a chown of the directory to its own owner succeeded: the storage takes chowns".into()),
    }
}

/// An errno as the report words it: `Operation not permitted (EPERM)`.
fn text(e: Errno) -> String {
    crate::error::errno_text(e.raw_os_error())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    fn dir() -> (tempfile::TempDir, std::os::fd::OwnedFd) {
        let t = tempfile::tempdir().unwrap();
        let fd = sys::open_root(t.path()).unwrap();
        (t, fd)
    }

    #[test]
    fn on_a_local_filesystem_the_change_holds_at_once_and_the_file_is_gone() {
        let (t, fd) = dir();
        let p = run(fd.as_fd(), None, Chowner::Unprivileged { uid: sys::euid() }, Duration::from_secs(1));
        assert_eq!(p.verdict, Verdict::Honours, "{p:?}");
        assert!(p.evidence.starts_with("a file volprep created took "), "{p:?}");
        assert!(!p.evidence.contains(" after "), "read back at once: {p:?}");
        assert_eq!(std::fs::read_dir(t.path()).unwrap().count(), 0, "the probe file is removed");
    }

    #[test]
    fn only_an_experiment_file_of_a_process_that_is_gone_is_stale() {
        let me = ProbeOwner { pid: 1, token: 0xabcd_0123 };
        let owner = |n: &str| ProbeOwner::of(n.as_bytes());
        let earlier = owner(".volprep-probe-1-0badf00d00000003").unwrap();
        assert_eq!(earlier, ProbeOwner { pid: 1, token: 0x0bad_f00d });
        assert!(earlier.gone(me, |_| unreachable!("this pid is alive")), "a restarted container's pid 1");
        assert!(!owner(".volprep-probe-1-abcd012300000007").unwrap().gone(me, |_| true), "this process's own");
        let other = owner(".volprep-probe-4242-0000000100000000").unwrap();
        assert!(other.gone(me, |_| false) && !other.gone(me, |_| true), "another pid: gone unless alive");
        for not in [
            ".volprep-probe-42-00000001",
            ".volprep-probe-42-0000000100000000x",
            ".volprep-probe--0000000100000000",
            ".volprep-probe-0-0000000100000000",
            ".volprep-probe-4a-0000000100000000",
            ".volprep-probe-42-00000001000000AB",
            "volprep-probe-42-0000000100000000",
        ] {
            assert_eq!(owner(not), None, "{not}");
        }
        let name = probe_name();
        let own = owner(name.to_str().unwrap()).expect("the experiment's own name has the pattern");
        assert_eq!(own.pid, std::process::id());
        assert!(!own.gone(ProbeOwner { pid: own.pid, token: process_token() }, |_| false));
    }

    #[test]
    fn a_new_file_gets_another_group_when_it_has_the_wanted_one_already() {
        let m = Meta { dev: 1, ino: 1, mode: libc::S_IFREG | 0o600, uid: 0, gid: 7, nlink: 1, mnt_id: 0 };
        assert_eq!(target(&m, Some(9)), (Some(9), 0o640));
        let (gid, mode) = target(&Meta { mode: libc::S_IFREG | 0o640, ..m }, Some(7));
        assert_ne!(gid, Some(7), "the wanted group is the file's: another one, or none");
        assert_eq!(mode, 0o600);
    }
}
