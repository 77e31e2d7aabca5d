//! Whether a subtree recorded finished is still what was finished: the filesystem's own clock, and the rule that trusts a directory's listing without reading its entries' metadata.
//!
//! A claim "this subtree was finished" is made at a time `T` read from the filesystem itself
//! ([`take`]: a no-op `fchown(root, -1, -1)` that sets the root's change time to the
//! filesystem's "now", read back with `fstat`), so `T` has the filesystem's clock and
//! granularity. Everything the claiming run did to the subtree happened before `T`; any later
//! entry added, removed or renamed in a directory sets that directory's change time to a value
//! `>= T`. So a directory whose change time is `< T` ([`unchanged`]) lists the same entries it
//! listed when it was finished, and its files need not be looked at again; one whose change
//! time is `>= T`, or that is on another mount than the root, is read and walked in full, with
//! everything below it (a directory moved in may keep an old change time on some filesystems).
//! The walk does this with `Descend::Verify` (see `walk`): `getdents` with `d_type` and one
//! `statx` per directory, none per file; a directory without subdirectories (a link count of 2
//! on a filesystem that counts them) is not even opened.
//!
//! Assumptions: the filesystem's timestamps of changes made after `T` are not earlier than `T`
//! (no backward step of the clock that stamps them: a local filesystem's kernel clock, or on a
//! network filesystem the clocks of every client that changes the tree, kept in sync with the
//! one that read `T`); and nothing writes into the tree while a pass runs (a change made
//! between a directory's read and `T` is not seen by any run).
//!
//! A record of an unfinished directory is kept by the order of its entries, sealed by its
//! change time when it was opened: that seal proves the directory unchanged only if it is
//! older than the start of the run that made it ([`seal_trusted`]), or a change made within the
//! same timestamp tick right after it was read would keep it.

use std::fmt;
use std::os::fd::BorrowedFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use rustix::io::Errno;
use serde::{Deserialize, Serialize};

use crate::sys::{self, Meta, Times};

/// A timestamp of the filesystem (seconds, nanoseconds), as `statx` gives it. On the wire (a
/// shard's claim in the marker) a `[SEC, NSEC]` array.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize)]
#[serde(from = "(i64, u32)", into = "(i64, u32)")]
pub struct Stamp {
    pub sec: i64,
    pub nsec: u32,
}

impl From<(i64, u32)> for Stamp {
    fn from((sec, nsec): (i64, u32)) -> Stamp {
        Stamp { sec, nsec }
    }
}

impl From<Stamp> for (i64, u32) {
    fn from(s: Stamp) -> (i64, u32) {
        (s.sec, s.nsec)
    }
}

impl fmt::Display for Stamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{:09}", self.sec, self.nsec)
    }
}

impl Stamp {
    /// Parses `SEC.NSEC` as [`Display`](fmt::Display) writes it (nine digits of nanoseconds).
    pub fn parse(text: &str) -> Option<Stamp> {
        let (sec, nsec) = text.split_once('.')?;
        let nsec: u32 = nsec.parse().ok().filter(|&n| n < 1_000_000_000)?;
        Some(Stamp { sec: sec.parse().ok()?, nsec })
    }
}

/// The filesystem's "now", as the change time of the root after a metadata write that changes
/// nothing else (`fchown(root, -1, -1)`). Fails where the root can't be changed (read-only,
/// another user's root): then nothing may be claimed. The kernel lets any user make that
/// no-op write, and it moves the root's change time: an unprivileged run (not root) leaves a
/// root it does not own untouched, so it never takes the clock there.
pub fn take(root: BorrowedFd<'_>) -> Result<Stamp, Errno> {
    let me = sys::euid();
    if me != 0 && sys::stat_fd(root)?.uid != me {
        return Err(Errno::PERM);
    }
    stamp(root)
}

/// The no-op metadata write and the change time it gave (see [`take`]).
fn stamp(root: BorrowedFd<'_>) -> Result<Stamp, Errno> {
    sys::chown_fd(root, None, None)?;
    let (_, times) = sys::stat_fd_times(root)?;
    Ok(times.ctime.into())
}

/// The clock of a claim: a stamp of the filesystem strictly later than every stamp it gave
/// before the call, so that a directory changed in the same timestamp tick as the claim (its
/// change time equal to the first [`take`]) is still before the clock and need not be read
/// again. It takes the clock again until it moves: at once where the filesystem stamps a
/// change after a read of the time finer than its tick (Linux's multigrain timestamps), within
/// a tick elsewhere. On timestamps of whole seconds, or where it has not moved within
/// [`CLAIM_PATIENCE`], the first stamp is the clock (still sound: such directories are read
/// again); in the second case `patient` is cleared, so that later claims do not wait. Changes
/// made between the two takes are no more seen than ones made between a directory's read and
/// the first take (see the module's assumptions).
pub fn claim(root: BorrowedFd<'_>, patient: &AtomicBool) -> Result<Stamp, Errno> {
    let first = take(root)?;
    // Whole seconds (ext4 with 128-byte inodes): the clock moves only with the next second.
    if first.nsec == 0 || !patient.load(Ordering::Relaxed) {
        return Ok(first);
    }
    let give_up = Instant::now() + CLAIM_PATIENCE;
    loop {
        // Read before the stamp: the clock has not moved only if a stamp taken after the
        // patience ran out still is the first (a pause of this thread is no reason to stop).
        let late = Instant::now() >= give_up;
        let now = stamp(root)?;
        if now > first {
            return Ok(now);
        }
        if late {
            patient.store(false, Ordering::Relaxed);
            return Ok(first);
        }
        std::thread::sleep(Duration::from_micros(500));
    }
}

/// How long [`claim`] waits for the filesystem's clock to move: beyond a 100 Hz tick.
pub const CLAIM_PATIENCE: Duration = Duration::from_millis(12);

/// Whether a directory recorded inside a subtree finished before `bound` still lists what it
/// listed then: it is on the root's mount and device (see [`Meta::on_root_fs`]) and its change
/// time is strictly before `bound`.
pub fn unchanged(meta: &Meta, times: &Times, root: &Meta, bound: Stamp) -> bool {
    meta.on_root_fs(root) && Stamp::from(times.ctime) < bound
}

/// Whether a directory's seal (its change time, or the root's modification time, when the run
/// opened it) proves it unchanged later: it must be older than the start of that run.
pub fn seal_trusted(seal: Stamp, run_start: Stamp) -> bool {
    seal < run_start
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(dev: u64, mnt_id: u64) -> Meta {
        Meta { dev, ino: 5, mode: libc::S_IFDIR | 0o755, uid: 0, gid: 0, nlink: 2, mnt_id }
    }

    fn times(sec: i64, nsec: u32) -> Times {
        Times { ctime: (sec, nsec), mtime: (0, 0) }
    }

    #[test]
    fn a_directory_is_unchanged_only_strictly_before_the_bound_and_on_the_roots_mount() {
        let root = meta(7, 30);
        let t = Stamp { sec: 100, nsec: 500 };
        assert!(unchanged(&meta(7, 30), &times(100, 499), &root, t));
        assert!(unchanged(&meta(7, 30), &times(99, 999_999_999), &root, t));
        // The same tick as the bound may be a change made after it (coarse timestamps).
        assert!(!unchanged(&meta(7, 30), &times(100, 500), &root, t));
        assert!(!unchanged(&meta(7, 30), &times(101, 0), &root, t));
        // Another filesystem, or a bind mount of this one: walked, whatever its time.
        assert!(!unchanged(&meta(8, 31), &times(1, 0), &root, t));
        assert!(!unchanged(&meta(7, 31), &times(1, 0), &root, t));
        // The same mount, another device (a btrfs subvolume, maybe a snapshot): walked too.
        assert!(!unchanged(&meta(8, 30), &times(1, 0), &root, t));
        // No mount ids (old kernels): the device decides.
        assert!(unchanged(&meta(7, 0), &times(1, 0), &root, t));
        assert!(!unchanged(&meta(8, 0), &times(1, 0), &root, t));
    }

    #[test]
    fn a_seal_is_trusted_only_before_the_run_started() {
        let start = Stamp { sec: 50, nsec: 0 };
        assert!(seal_trusted(Stamp { sec: 49, nsec: 999_999_999 }, start));
        assert!(!seal_trusted(start, start), "a change in the start's own tick may follow the read");
        assert!(!seal_trusted(Stamp { sec: 51, nsec: 0 }, start));
    }

    #[test]
    fn a_claims_clock_is_after_every_change_made_before_it_even_in_the_same_tick() {
        use std::os::fd::AsFd;
        let tmp = tempfile::tempdir().unwrap();
        std::fs::create_dir(tmp.path().join("d")).unwrap();
        let root = sys::open_root(tmp.path()).unwrap();
        let d = sys::open_root(&tmp.path().join("d")).unwrap();
        let change = || {
            sys::chown_fd(d.as_fd(), None, None).unwrap();
            Stamp::from(sys::stat_fd_times(d.as_fd()).unwrap().1.ctime)
        };
        let patient = AtomicBool::new(true);
        let mut same_tick = 0;
        for _ in 0..200 {
            // One take alone can give the very stamp of a change made before it.
            let changed = change();
            same_tick += usize::from(changed >= take(root.as_fd()).unwrap());
            let changed = change();
            let clock = claim(root.as_fd(), &patient).unwrap();
            if patient.load(Ordering::Relaxed) && clock.nsec != 0 {
                assert!(changed < clock, "{changed} changed before the claim, whose clock is {clock}");
            } else {
                assert!(changed <= clock, "timestamps of a second: the clock is the first stamp");
            }
        }
        eprintln!("a change in the same tick as one take: {same_tick} of 200");
    }

    #[test]
    fn stamps_round_trip_and_order() {
        for s in
            [Stamp { sec: 0, nsec: 0 }, Stamp { sec: -3, nsec: 999_999_999 }, Stamp { sec: 1_700_000_000, nsec: 7 }]
        {
            assert_eq!(Stamp::parse(&s.to_string()), Some(s));
        }
        assert_eq!(Stamp { sec: 1_700_000_000, nsec: 7 }.to_string(), "1700000000.000000007");
        for bad in ["", "1", "1.", ".5", "1.1000000000", "x.1"] {
            assert_eq!(Stamp::parse(bad), None, "{bad}");
        }
        assert!(Stamp { sec: 1, nsec: 999_999_999 } < Stamp { sec: 2, nsec: 0 });
    }
}
