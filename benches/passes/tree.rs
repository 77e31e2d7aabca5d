//! The tree every method runs on: generated once per seed, then reset between methods by a
//! metadata-restore pass that is verified against a digest.
//!
//! The generator records each entry's golden (uid, gid, mode). [`Tree::reset`] re-applies
//! either that golden state (every entry needs a change under `--fs-group 2000`) or the
//! prepared state (what the kubelet's pass makes of it), and [`Tree::verify`] walks the real
//! tree and compares a hash of the sorted (relpath, type, uid, gid, mode, user/trusted xattr
//! names) with the one expected from the record.

use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::shapes;

/// The group the benchmark prepares for.
pub const FS_GROUP: u32 = 2000;

/// Kind of an entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Dir,
    File,
    Symlink,
}

impl Kind {
    fn letter(self) -> u8 {
        match self {
            Kind::Dir => b'd',
            Kind::File => b'f',
            Kind::Symlink => b'l',
        }
    }
}

/// Owner and permission bits (special bits included) of an entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Meta {
    pub uid: u32,
    pub gid: u32,
    pub mode: u32,
}

/// One recorded entry: its path relative to the root ("" for the root) and golden metadata.
#[derive(Debug, Clone)]
pub struct Entry {
    pub rel: Box<str>,
    pub kind: Kind,
    pub golden: Meta,
}

impl Entry {
    /// What the kubelet's pass (and volprep's) makes of the golden state.
    pub fn prepared(&self) -> Meta {
        let g = self.golden;
        let mode = match self.kind {
            Kind::Symlink => g.mode,
            Kind::File => g.mode | 0o660,
            Kind::Dir => g.mode | 0o660 | 0o110 | libc::S_ISGID,
        };
        Meta { uid: g.uid, gid: FS_GROUP, mode }
    }
}

/// What a verification expects of marker xattrs (user.* and trusted.*).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Xattrs {
    /// None anywhere: the state a reset leaves.
    None,
    /// Not looked at: a volprep result carries its marker.
    Ignored,
}

/// Which recorded state to restore or expect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// Mixed owners; every entry differs from the spec.
    Golden,
    /// Already right for `--fs-group 2000`.
    Prepared,
}

impl State {
    pub fn name(self) -> &'static str {
        match self {
            State::Golden => "golden",
            State::Prepared => "prepared",
        }
    }
}

/// Entry counts of a generated tree.
#[derive(Debug, Clone, Copy, Default)]
pub struct Counts {
    pub entries: u64,
    pub dirs: u64,
    pub files: u64,
    pub symlinks: u64,
    pub hardlinks: u64,
    pub setuid: u64,
}

/// A generated tree and its record.
pub struct Tree {
    pub root: PathBuf,
    /// On slow or network storage: resets use more threads.
    pub remote: bool,
    pub entries: Vec<Entry>,
    pub counts: Counts,
    golden_digest: String,
    prepared_digest: String,
}

fn cpath(p: &Path) -> io::Result<CString> {
    CString::new(p.as_os_str().as_bytes()).map_err(|_| io::ErrorKind::InvalidInput.into())
}

fn os_err<T>(what: &str, p: &Path) -> io::Result<T> {
    let e = io::Error::last_os_error();
    Err(io::Error::new(e.kind(), format!("{what} {}: {e}", p.display())))
}

/// xattr names a volprep marker could use (user.* and trusted.*), sorted.
fn marker_xattrs(c: &CString) -> Vec<Vec<u8>> {
    let mut buf = vec![0u8; 4096];
    // SAFETY: valid C string and buffer of the given length.
    let n = unsafe { libc::llistxattr(c.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if n <= 0 {
        return Vec::new();
    }
    let mut names: Vec<Vec<u8>> = buf[..n as usize]
        .split(|&b| b == 0)
        .filter(|n| n.starts_with(b"user.") || n.starts_with(b"trusted."))
        .map(<[u8]>::to_vec)
        .collect();
    names.sort();
    names
}

impl Tree {
    /// Generates the tree under `root` (which must not exist) and sets its golden state.
    /// `remote`: `root` is on network storage (see [`Tree::reset`]).
    pub fn generate(root: &Path, shape: crate::args::Shape, n: u64, seed: u64, remote: bool) -> io::Result<Tree> {
        let (entries, counts) = shapes::generate(root, shape, n, seed)?;
        let mut tree = Tree {
            root: root.to_path_buf(),
            remote: false,
            entries,
            counts,
            golden_digest: String::new(),
            prepared_digest: String::new(),
        };
        tree.golden_digest = tree.expected_digest(State::Golden);
        tree.prepared_digest = tree.expected_digest(State::Prepared);
        tree.remote = remote;
        tree.reset(State::Golden)?;
        Ok(tree)
    }

    pub fn digest_of(&self, state: State) -> &str {
        match state {
            State::Golden => &self.golden_digest,
            State::Prepared => &self.prepared_digest,
        }
    }

    fn expected_digest(&self, state: State) -> String {
        let mut rows: Vec<(&str, Kind, Meta)> = self
            .entries
            .iter()
            .map(|e| {
                let m = match state {
                    State::Golden => e.golden,
                    State::Prepared => e.prepared(),
                };
                (&*e.rel, e.kind, m)
            })
            .collect();
        rows.sort_by(|a, b| a.0.cmp(b.0));
        let mut h = Sha256::new();
        for (rel, kind, m) in rows {
            feed(&mut h, rel.as_bytes(), kind, m, &[]);
        }
        hex(&h.finalize())
    }

    /// Restores `state` on every entry (only what differs), and removes user/trusted xattrs.
    /// Parallel over a few threads (16 on remote storage, where latency rules); path-based
    /// (the tree is ours and nothing else runs).
    pub fn reset(&self, state: State) -> io::Result<()> {
        let threads = if self.remote { 16 } else { std::thread::available_parallelism().map_or(2, |n| n.get().min(8)) };
        let chunk = self.entries.len().div_ceil(threads).max(1);
        std::thread::scope(|s| {
            let jobs: Vec<_> =
                self.entries.chunks(chunk).map(|part| s.spawn(move || self.reset_part(part, state))).collect();
            jobs.into_iter().try_for_each(|j| j.join().expect("reset thread panicked"))
        })
    }

    fn reset_part(&self, part: &[Entry], state: State) -> io::Result<()> {
        for e in part {
            let path = self.root.join(&*e.rel);
            let want = match state {
                State::Golden => e.golden,
                State::Prepared => e.prepared(),
            };
            let c = cpath(&path)?;
            let st = std::fs::symlink_metadata(&path)?;
            let chown = st.uid() != want.uid || st.gid() != want.gid;
            // SAFETY: valid C strings throughout.
            if chown && unsafe { libc::lchown(c.as_ptr(), want.uid, want.gid) } != 0 {
                return os_err("lchown", &path);
            }
            if e.kind == Kind::Symlink {
                continue;
            }
            // A chown clears setuid/setgid on files: always restore the mode after one.
            // SAFETY: `c` is a valid C string alive across the call.
            if (chown || st.mode() & 0o7777 != want.mode) && unsafe { libc::chmod(c.as_ptr(), want.mode) } != 0 {
                return os_err("chmod", &path);
            }
            for name in marker_xattrs(&c) {
                let n = CString::new(name).expect("no NUL in an xattr name");
                // SAFETY: `c` and `n` are valid C strings alive across the call.
                if unsafe { libc::lremovexattr(c.as_ptr(), n.as_ptr()) } != 0 {
                    return os_err("lremovexattr", &path);
                }
            }
        }
        Ok(())
    }

    /// Walks the real tree and returns its digest and entry count.
    /// `xattrs`: whether marker xattrs count (a reset removes them; a result may carry them).
    pub fn actual_digest(&self, xattrs: Xattrs) -> io::Result<(String, u64)> {
        let mut rows: Vec<Row> = Vec::new();
        collect(&self.root, &mut Vec::new(), &mut rows, xattrs)?;
        rows.sort_by(|a, b| a.0.cmp(&b.0));
        let mut h = Sha256::new();
        for (rel, kind, m, x) in &rows {
            feed(&mut h, rel, *kind, *m, x);
        }
        Ok((hex(&h.finalize()), rows.len() as u64))
    }

    /// Checks the real tree against `state`; the error names the first differing entries.
    pub fn verify(&self, state: State, xattrs: Xattrs) -> Result<(), String> {
        let (got, n) = self.actual_digest(xattrs).map_err(|e| format!("digest walk: {e}"))?;
        if got == self.digest_of(state) {
            return Ok(());
        }
        let mut diffs = Vec::new();
        for e in &self.entries {
            let want = match state {
                State::Golden => e.golden,
                State::Prepared => e.prepared(),
            };
            let path = self.root.join(&*e.rel);
            let got = std::fs::symlink_metadata(&path).map(|m| (m.uid(), m.gid(), m.mode() & 0o7777));
            let ok = matches!(got, Ok((u, g, m)) if u == want.uid && g == want.gid && m == want.mode);
            if !ok && diffs.len() < 5 {
                diffs.push(format!("  /{}: want {}:{} {:04o}, got {:?}", e.rel, want.uid, want.gid, want.mode, got));
            }
        }
        Err(format!(
            "tree is not in the {} state ({n} entries found, {} recorded); first differences:\n{}",
            state.name(),
            self.entries.len(),
            if diffs.is_empty() {
                "  (metadata matches: extra or missing entries, or marker xattrs left)".into()
            } else {
                diffs.join("\n")
            }
        ))
    }
}

fn feed(h: &mut Sha256, rel: &[u8], kind: Kind, m: Meta, xattrs: &[Vec<u8>]) {
    h.update(rel);
    h.update([0, kind.letter()]);
    h.update(m.uid.to_le_bytes());
    h.update(m.gid.to_le_bytes());
    h.update(m.mode.to_le_bytes());
    for x in xattrs {
        h.update(x);
        h.update([0]);
    }
    h.update([b'\n']);
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

type Row = (Vec<u8>, Kind, Meta, Vec<Vec<u8>>);

fn collect(path: &Path, rel: &mut Vec<u8>, rows: &mut Vec<Row>, xattrs: Xattrs) -> io::Result<()> {
    let st = std::fs::symlink_metadata(path)?;
    let ft = st.file_type();
    let kind = if ft.is_dir() {
        Kind::Dir
    } else if ft.is_symlink() {
        Kind::Symlink
    } else {
        Kind::File
    };
    let meta = Meta { uid: st.uid(), gid: st.gid(), mode: st.mode() & 0o7777 };
    let names = match xattrs {
        Xattrs::None if kind != Kind::Symlink => marker_xattrs(&cpath(path)?),
        _ => Vec::new(),
    };
    rows.push((rel.clone(), kind, meta, names));
    if kind == Kind::Dir {
        for e in std::fs::read_dir(path)? {
            let name = e?.file_name();
            let len = rel.len();
            if len > 0 {
                rel.push(b'/');
            }
            rel.extend_from_slice(name.as_bytes());
            collect(&path.join(&name), rel, rows, xattrs)?;
            rel.truncate(len);
        }
    }
    Ok(())
}
