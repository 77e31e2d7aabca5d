//! Directory listings: `getdents64` batches into the caller's buffer, and reads past ceph-fuse's `.` and `..`.

use std::ffi::CStr;
use std::mem::MaybeUninit;
use std::os::fd::BorrowedFd;
use std::sync::atomic::{AtomicU64, Ordering};

use rustix::fs::{FileType, RawDir};
use rustix::io::Errno;

use crate::throttle::{self, OpKind};

/// Reads a directory in fixed-size `getdents64` batches, from the start (`from` 0) or from
/// position `from`, calling `each(name, d_type, d_ino)` for every entry but `.` and `..` whose
/// position is below `until` (`u64::MAX`: all). Memory is the caller's buffer, whatever the
/// directory's size. A read of everything from 0 expects a fresh fd (no `lseek`, one syscall
/// per directory less); any other read seeks first.
///
/// Returns the position right after `..` when a read from the start found `.` first, at
/// position 0 and ending at 1, then `..` (see [`DOTS_FIRST_FS`]); `None` otherwise.
pub fn read_dir(
    dir: BorrowedFd<'_>,
    buf: &mut [MaybeUninit<u8>],
    from: u64,
    until: u64,
    mut each: impl FnMut(&CStr, DType, u64),
) -> Result<Option<u64>, Errno> {
    if from != 0 || until != u64::MAX {
        rustix::fs::seek(dir, rustix::fs::SeekFrom::Start(from))?;
    }
    let mut raw = RawDir::new(dir, buf);
    let mut began = if from == 0 { Began::Nothing } else { Began::Otherwise };
    // The position of the next entry (where a read from `from` finds it).
    let mut at = from;
    loop {
        // A `getdents64` call when the buffer is used up: one metadata operation for the gate.
        let next = if raw.is_buffer_empty() { throttle::op(OpKind::Read, || raw.next()) } else { raw.next() };
        let Some(entry) = next else { break };
        let entry = match entry {
            Ok(e) => e,
            Err(Errno::INTR) => continue,
            Err(e) => return Err(e),
        };
        if at >= until {
            break;
        }
        at = entry.next_entry_cookie();
        let name = entry.file_name();
        let bytes = name.to_bytes();
        began = began.then(bytes, entry.next_entry_cookie());
        if bytes == b"." || bytes == b".." {
            continue;
        }
        let t = entry.file_type();
        let dtype = if t == FileType::Directory {
            DType::Dir
        } else if t == FileType::Unknown {
            DType::Unknown
        } else {
            DType::Other
        };
        each(name, dtype, entry.ino());
    }
    Ok(match began {
        Began::DotDot(end) => Some(end),
        _ => None,
    })
}

/// How a read from position 0 began: whether it found `.` at 0 and then `..` (where the other
/// entries start, on a [`DOTS_FIRST_FS`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Began {
    /// No entry read yet.
    Nothing,
    /// `.`, ending at position 1.
    Dot,
    /// `.` then `..`, ending at this position.
    DotDot(u64),
    /// Anything else first (or a read that did not start at 0).
    Otherwise,
}

impl Began {
    /// The state after the entry `name`, which ends at position `end`.
    fn then(self, name: &[u8], end: u64) -> Began {
        match (self, name) {
            (Began::Nothing, b".") if end == 1 => Began::Dot,
            (Began::Dot, b"..") => Began::DotDot(end),
            (Began::Nothing | Began::Dot, _) => Began::Otherwise,
            (b, _) => b,
        }
    }
}

/// The filesystem (as `/proc/self/mountinfo` names it) whose directories list `.` at position 0
/// and `..` at 1, and every other entry at a position of at least 2: ceph-fuse, whose readdir
/// positions carry a fragment or hash in their high bits and an index from 2 in their low ones
/// (the client's `dir_result_t`). Its `.` and `..` each cost a `getattr` round trip to the MDS
/// (forced: it asks for recursive stats), two per directory, which a read from position 2
/// does not make. A [`DirReader`] reads from 2 only on such a mount, and only after the volume
/// root, read from the start, showed exactly that layout.
const DOTS_FIRST_FS: &str = "fuse.ceph-fuse";

/// Where `.` and `..` end on a [`DOTS_FIRST_FS`] directory.
const PAST_DOTS: u64 = 2;

/// Which directory of a walk a [`DirReader`] reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Place {
    /// The walk's root: always read from the start; its layout tells where the others start.
    Root,
    /// A directory on the root's mount.
    RootMount,
    /// A directory on another mount (the walk crosses devices): read from the start.
    OtherMount,
}

/// Entries a [`DirReader`] found below the position its reads of the root's mount started from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Below {
    pub entries: u32,
    pub from: u64,
}

/// Where a filesystem's directories list `.` and `..` (see [`DOTS_FIRST_FS`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Dots {
    /// Wherever its listing puts them.
    Anywhere,
    /// First, at positions 0 and 1, when the root's listing showed that layout.
    First,
}

/// Reads the directories of one walk with [`read_dir`], past `.` and `..` where the root's
/// mount is a [`DOTS_FIRST_FS`] one and the root showed that layout (from the start elsewhere).
#[derive(Debug)]
pub struct DirReader {
    /// `First` when the root's mount is a [`DOTS_FIRST_FS`] one.
    dots: Dots,
    /// Where reads of directories on the root's mount start: 0, or [`PAST_DOTS`].
    from: AtomicU64,
}

impl DirReader {
    /// The reader of a walk whose root's mount has the filesystem type `fs` (as mountinfo names it).
    pub fn new(fs: Option<&str>) -> DirReader {
        let dots = if fs == Some(DOTS_FIRST_FS) { Dots::First } else { Dots::Anywhere };
        DirReader { dots, from: AtomicU64::new(0) }
    }

    /// Reads every entry of `dir` but `.` and `..` into `each`, as [`read_dir`] does (`dir`
    /// freshly opened, `nlink` its link count). Returns what turned up below where the read
    /// started, when that made every later read start from the beginning.
    pub fn read(
        &self,
        dir: BorrowedFd<'_>,
        buf: &mut [MaybeUninit<u8>],
        (place, nlink): (Place, u64),
        mut each: impl FnMut(&CStr, DType, u64),
    ) -> Result<Option<Below>, Errno> {
        let from = if place == Place::OtherMount { 0 } else { self.from.load(Ordering::Relaxed) };
        // Subdirectories met, and whether every entry came with its type (ceph-fuse's do).
        let (mut dirs, mut typed) = (0u64, true);
        let dots_end = read_dir(dir, buf, from, u64::MAX, |name, dtype, ino| {
            match dtype {
                DType::Dir => dirs += 1,
                DType::Unknown => typed = false,
                DType::Other => {}
            }
            each(name, dtype, ino)
        })?;
        if place == Place::Root && self.dots == Dots::First && dots_end == Some(PAST_DOTS) {
            self.from.store(PAST_DOTS, Ordering::Relaxed);
        }
        // Read past `.` and `..`, the subdirectories met must be what the link count says
        // (ceph-fuse: 2 + subdirectories). Fewer, and one may sit below the start: read what is
        // there, and if anything is, read every directory from the start from now on.
        if from == 0 || !typed || nlink < 2 || dirs == nlink - 2 {
            return Ok(None);
        }
        let mut below = 0u32;
        let res = read_dir(dir, buf, 0, from, |name, dtype, ino| {
            below += 1;
            each(name, dtype, ino)
        });
        let switched = below > 0 && self.from.swap(0, Ordering::Relaxed) != 0;
        res.map(|_| switched.then_some(Below { entries: below, from }))
    }
}

/// What `getdents` said about an entry's type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DType {
    Dir,
    Other,
    /// The filesystem does not fill `d_type`: stat to know.
    Unknown,
}

/// The first entry of a directory but `.` and `..`, if any (`dir` freshly opened).
pub fn first_entry(dir: BorrowedFd<'_>) -> Result<Option<Vec<u8>>, Errno> {
    let mut buf = vec![MaybeUninit::<u8>::uninit(); 4096];
    let mut first = None;
    read_dir(dir, &mut buf, 0, u64::MAX, |name, _, _| {
        first.get_or_insert_with(|| name.to_bytes().to_vec());
    })?;
    Ok(first)
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::os::fd::AsFd;

    #[test]
    fn only_dot_at_0_then_dotdot_tells_where_the_dots_end() {
        let read = |names: &[(&[u8], u64)]| names.iter().fold(Began::Nothing, |b, (n, end)| b.then(n, *end));
        assert_eq!(read(&[(b".", 1), (b"..", 2), (b"a", 3)]), Began::DotDot(2));
        assert_eq!(read(&[(b".", 7), (b"..", 9)]), Began::Otherwise, "`.` not ending at 1");
        assert_eq!(read(&[(b"..", 1), (b".", 2)]), Began::Otherwise, "`..` first");
        assert_eq!(read(&[(b".", 1), (b"a", 2), (b"..", 3)]), Began::Otherwise);
        assert_eq!(read(&[(b".", 1)]), Began::Dot);
        assert_eq!(Began::Otherwise.then(b".", 1), Began::Otherwise, "a read not from 0 stays so");
    }

    #[test]
    fn a_directory_read_from_the_start_tells_where_its_dots_end() {
        let t = tempfile::tempdir().unwrap();
        for n in ["a", "b", "c"] {
            std::fs::write(t.path().join(n), b"").unwrap();
        }
        let fd = super::super::open_root(t.path()).unwrap();
        let mut buf = vec![MaybeUninit::<u8>::uninit(); 4096];
        let mut names = Vec::new();
        let end = read_dir(fd.as_fd(), &mut buf, 0, u64::MAX, |n, _, _| names.push(n.to_bytes().to_vec())).unwrap();
        names.sort();
        assert_eq!(names, [b"a".to_vec(), b"b".to_vec(), b"c".to_vec()], "no dots");
        // Whatever this filesystem's layout, reading again from where it said the dots end
        // lists the same names; a read from elsewhere reports no dots.
        if let Some(end) = end {
            let fd = super::super::open_root(t.path()).unwrap();
            let mut again = Vec::new();
            assert_eq!(
                read_dir(fd.as_fd(), &mut buf, end, u64::MAX, |n, _, _| again.push(n.to_bytes().to_vec())),
                Ok(None)
            );
            again.sort();
            assert_eq!(again, names);
            // Below where the dots end there is nothing but the dots.
            let mut below = 0;
            assert_eq!(read_dir(fd.as_fd(), &mut buf, 0, end, |_, _, _| below += 1), Ok(Some(end)));
            assert_eq!(below, 0);
        }
        // A bounded read seeks first (the fd is at the end here) and stops at its bound.
        let mut none = 0;
        read_dir(fd.as_fd(), &mut buf, 0, 0, |_, _, _| none += 1).unwrap();
        assert_eq!(none, 0);
        let mut all = Vec::new();
        read_dir(fd.as_fd(), &mut buf, 0, u64::MAX - 1, |n, _, _| all.push(n.to_bytes().to_vec())).unwrap();
        all.sort();
        assert_eq!(all, names, "a read bounded past every position sees every entry again");
    }

    /// The names of a directory's entries (`.` and `..` included) and the position after each.
    fn positions(dir: BorrowedFd<'_>) -> Vec<(Vec<u8>, u64)> {
        let mut buf = vec![MaybeUninit::<u8>::uninit(); 4096];
        let mut raw = RawDir::new(dir, &mut buf);
        let mut out = Vec::new();
        while let Some(e) = raw.next() {
            let e = e.unwrap();
            out.push((e.file_name().to_bytes().to_vec(), e.next_entry_cookie()));
        }
        out
    }

    #[test]
    fn a_reader_past_the_dots_that_misses_a_subdirectory_reads_below_and_starts_from_zero_after() {
        let t = tempfile::tempdir().unwrap();
        for n in ["a", "b", "c"] {
            std::fs::create_dir(t.path().join(n)).unwrap();
        }
        let open = || super::super::open_root(t.path()).unwrap();
        let nlink = super::super::stat_fd(open().as_fd()).unwrap().nlink;
        if nlink != 2 + 3 {
            return; // This filesystem does not count subdirectories in the link count.
        }
        // Start right after the first entry that is no dot: the read from there misses it.
        let at = positions(open().as_fd());
        let first = at.iter().position(|(n, _)| n != b"." && n != b"..").unwrap();
        let reader = DirReader { dots: Dots::First, from: AtomicU64::new(at[first].1) };
        let mut buf = vec![MaybeUninit::<u8>::uninit(); 4096];
        let mut names = Vec::new();
        let below = reader.read(open().as_fd(), &mut buf, (Place::RootMount, nlink), |n, _, _| {
            names.push(n.to_bytes().to_vec());
        });
        let dots_below = at[..first].iter().filter(|(n, _)| n == b"." || n == b"..").count();
        let from = at[first].1;
        assert_eq!(below, Ok(Some(Below { entries: (first + 1 - dots_below) as u32, from })), "{at:?}");
        names.sort();
        assert_eq!(names, [b"a".to_vec(), b"b".to_vec(), b"c".to_vec()]);
        assert_eq!(reader.from.load(Ordering::Relaxed), 0, "later reads start from the beginning");
        // Elsewhere than on the root's mount, and on a mount of another type, reads start at 0.
        let mut again = 0;
        let plain = DirReader::new(Some("ext4"));
        assert_eq!(plain.read(open().as_fd(), &mut buf, (Place::Root, nlink), |_, _, _| again += 1), Ok(None));
        assert_eq!((again, plain.from.load(Ordering::Relaxed)), (3, 0));
    }
}
