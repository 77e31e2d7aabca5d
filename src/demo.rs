//! `volprep demo`: makes a small volume the way an app leaves one (mixed modes and, as root,
//! mixed owners, a setuid file, symlinks pointing outside), then checks, applies and checks it.
//!
//! The volume is made in a new temp dir with an unpredictable name (mode 0700, `mkdir` failing
//! on any existing entry), or in a directory the user names that must be new or empty. Every
//! entry is made relative to its directory's fd by calls that never follow a symlink
//! (`mkdirat`, `openat(O_CREAT|O_EXCL|O_NOFOLLOW)`, `fchown`/`fchmod` on the new fd), so nothing
//! planted in a shared temp dir can redirect a change outside.

use std::ffi::CString;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use rustix::io::Errno;
use tracing::info;

use crate::error::{Error, ExitCode, Op};
use crate::escape::{Escaped, escape_bytes};
use crate::options::{Mode, RunOptions, resolve_threads};
use crate::report::{self, Report, VolumeReport};
use crate::spec::Spec;
use crate::sys::{self, fd};
use crate::throttle::{Concurrency, Policy, Storage};
use crate::volume;
use crate::walk::Pool;

/// What `demo` was asked.
#[derive(Debug, Clone)]
pub struct Options {
    /// Where to make the demo volume (a new or empty directory); `None`: a temp dir.
    pub dir: Option<PathBuf>,
    /// Entries in the demo volume.
    pub entries: u64,
    /// Keep the demo volume afterwards.
    pub keep: bool,
    /// Where the JSON report of the three passes goes ('-': stdout); none by default, the
    /// summary lines say what they did.
    pub report: Option<PathBuf>,
}

pub fn run(args: &Options) -> Result<ExitCode, Error> {
    if let Some(dest) = &args.report {
        let areas: Vec<&Path> = args.dir.iter().map(PathBuf::as_path).collect();
        crate::guard::output_file("--report", dest, &areas)?;
    }
    let (dir, root, made_temp) = match &args.dir {
        Some(d) => (d.clone(), empty_dir(d)?, false),
        None => {
            let (path, root) = new_temp_dir(&std::env::temp_dir())?;
            (path, root, true)
        }
    };
    let is_root = rustix::process::geteuid().is_root();
    // As root the demo uses the group an fsGroup would name; otherwise one the user may chown to.
    let gid = if is_root { 2000 } else { rustix::process::getegid().as_raw() };
    info!("making a demo volume of about {} entries in {}", args.entries, Escaped(dir.as_os_str()));
    Maker { top: &dir, is_root, seed: 0x9e37_79b9_7f4a_7c15 }.tree(fd(&root), args.entries)?;
    drop(root);

    let volumes = check_apply_check(&dir, gid)?;
    let last = volumes.last().expect("three steps");
    let ok = last.counts.changed_owner + last.counts.changed_mode == 0 && volumes.iter().all(|v| v.counts.errors == 0);
    let entries = last.counts.entries;
    if let Some(dest) = &args.report {
        report::write(&Report::new(volumes), dest)?;
    }
    if args.keep || !made_temp {
        info!("demo volume kept at {}", Escaped(dir.as_os_str()));
    } else {
        info!("removing the demo volume ({entries} entries; --keep keeps it)");
        // `remove_dir_all` works by dir fds and never follows a symlink.
        std::fs::remove_dir_all(&dir)
            .map_err(|e| Error::sys(&dir, Op::Open, Errno::from_io_error(&e).unwrap_or(Errno::IO)))?;
    }
    info!("demo {}", if ok { "done: the volume conforms" } else { "found a problem (see above)" });
    Ok(if ok { ExitCode::Success } else { ExitCode::Failure })
}

/// The demo's three passes over `dir` with `--fs-group gid`: check, apply, check, each with its
/// summary line.
fn check_apply_check(dir: &Path, gid: u32) -> Result<Vec<VolumeReport>, Error> {
    let spec = Spec::group(gid);
    let threads = resolve_threads(0, || Storage::Local);
    let pool = Pool::new(threads);
    let mut volumes = Vec::new();
    for (step, mode) in [("1/3 check", Mode::Check), ("2/3 apply", Mode::Apply), ("3/3 check", Mode::Check)] {
        // A temp dir on local storage: full speed, as `--load auto` resolves there (the gate,
        // which only `apply`/`check` start, is not needed), and the log line says so.
        let load = Policy { concurrency: Concurrency::Auto.resolve(Storage::Local), max_ops: None };
        let opts = RunOptions { load, ..RunOptions::new(mode, threads) };
        info!(
            "step {step}: volprep {} --fs-group {gid} {}",
            if mode == Mode::Apply { "apply" } else { "check" },
            Escaped(dir.as_os_str())
        );
        let vol = volume::run(dir, &spec, &opts, &pool)?;
        info!("{}", vol.summary());
        volumes.push(vol);
    }
    Ok(volumes)
}

/// Makes `volprep-demo-<16 random hex digits>` in `tmp`, mode 0700: `mkdirat` fails on any
/// entry already there (a directory or symlink planted under a guessed name), and a new name is
/// drawn. Returns its path and fd, opened without following a symlink and checked to be ours.
fn new_temp_dir(tmp: &Path) -> Result<(PathBuf, OwnedFd), Error> {
    let parent = sys::open_root(tmp).map_err(|e| Error::sys(tmp, Op::Open, e))?;
    const TRIES: u32 = 64;
    for _ in 0..TRIES {
        let n = sys::random_u64().map_err(|e| Error::sys(tmp, Op::Open, e))?;
        let name = format!("volprep-demo-{n:016x}");
        let path = tmp.join(&name);
        let cname = CString::new(name).expect("no NUL");
        match sys::mkdir_at(fd(&parent), &cname, 0o700) {
            Err(Errno::EXIST) => continue,
            Err(e) => return Err(Error::sys(&path, Op::Mkdir, e)),
            Ok(()) => {}
        }
        return match settle_dir(fd(&parent), &cname, 0o700, Owner::Me) {
            Ok(dir) => Ok((path, dir)),
            Err(Settle::Replaced) => Err(Error::TempDirReplaced { path }),
            Err(Settle::Sys(op, e)) => Err(Error::sys(&path, op, e)),
        };
    }
    Err(Error::TempNamesTaken { path: tmp.to_path_buf(), tries: TRIES })
}

/// Why [`settle_dir`] failed.
enum Settle {
    Sys(Op, Errno),
    /// Not a directory (or, with [`Owner::Me`], not this user's), or another inode by the time
    /// it was opened.
    Replaced,
}

/// Whose directory [`settle_dir`] accepts.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Owner {
    /// Only this user's: a temp dir in a shared directory, which anyone could have made first.
    Me,
    /// Anyone's: a directory of the demo tree (as root, made for other users).
    Anyone,
}

/// Directory `name` below `dir`, just made (or made before): pinned (`O_PATH|O_NOFOLLOW`: no
/// permission needed, whatever the umask left), checked to be a directory (of `owner`), made
/// exactly `mode` through the pin, then opened without following a symlink and checked to be
/// the same inode.
fn settle_dir(dir: BorrowedFd<'_>, name: &std::ffi::CStr, mode: u32, owner: Owner) -> Result<OwnedFd, Settle> {
    let pin = sys::pin_at(dir, name).map_err(|e| Settle::Sys(Op::Open, e))?;
    let meta = sys::stat_fd(fd(&pin)).map_err(|e| Settle::Sys(Op::Stat, e))?;
    if meta.kind() != sys::Kind::Dir || (owner == Owner::Me && meta.uid != sys::euid()) {
        return Err(Settle::Replaced);
    }
    sys::chmod_fd(fd(&pin), mode).map_err(|e| Settle::Sys(Op::Chmod, e))?;
    let opened = sys::open_subdir(dir, name).map_err(|e| Settle::Sys(Op::Open, e))?;
    let now = sys::stat_fd(fd(&opened)).map_err(|e| Settle::Sys(Op::Stat, e))?;
    if (now.dev, now.ino) != (meta.dev, meta.ino) {
        return Err(Settle::Replaced);
    }
    Ok(opened)
}

/// The directory `dir` the user named, made if missing, opened; refused unless empty (the
/// demo would change the group and modes of whatever is there).
fn empty_dir(dir: &Path) -> Result<OwnedFd, Error> {
    if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent)
            .map_err(|e| Error::sys(parent, Op::Mkdir, Errno::from_io_error(&e).unwrap_or(Errno::IO)))?;
    }
    let c = CString::new(dir.as_os_str().as_bytes()).map_err(|_| Error::sys(dir, Op::Mkdir, Errno::INVAL))?;
    match sys::mkdir_at(rustix::fs::CWD, &c, 0o755) {
        Ok(()) | Err(Errno::EXIST) => {}
        Err(e) => return Err(Error::sys(dir, Op::Mkdir, e)),
    }
    let root = sys::open_root(dir).map_err(|e| Error::sys(dir, Op::Open, e))?;
    match sys::first_entry(fd(&root)).map_err(|e| Error::sys(dir, Op::Readdir, e))? {
        None => Ok(root),
        Some(name) => Err(Error::Usage(format!(
            "{}: not empty (it holds '{}'): demo makes its volume in a new or empty directory, and would change what is there",
            Escaped(dir.as_os_str()),
            escape_bytes(&name)
        ))),
    }
}

/// Makes the demo tree below a directory fd; `top` is its path, for errors.
struct Maker<'a> {
    top: &'a Path,
    is_root: bool,
    seed: u64,
}

impl Maker<'_> {
    /// A deterministic tree of about `entries` entries: repositories with fan-out directories
    /// of small files, restrictive modes here and there, a setuid file and symlinks (one
    /// dangling, one pointing outside the volume, which volprep must leave alone).
    fn tree(&mut self, root: BorrowedFd<'_>, entries: u64) -> Result<(), Error> {
        let mut made = 0u64;
        let mut repo = 0;
        while made < entries {
            let name = format!("repo-{repo:03}");
            let r = self.dir(root, &name, 0o755, &name)?;
            let git = self.dir(fd(&r), ".git", 0o755, &format!("{name}/.git"))?;
            let refs = self.dir(fd(&git), "refs", 0o755, &format!("{name}/.git/refs"))?;
            self.dir(fd(&refs), "heads", 0o755, &format!("{name}/.git/refs/heads"))?;
            self.file(fd(&git), "HEAD", b"ref: refs/heads/main\n", 0o644, None, &format!("{name}/.git/HEAD"))?;
            self.link(fd(&r), "../../../../etc/hosts", "outside-link", &name)?;
            self.link(fd(&r), "missing-target", "dangling-link", &name)?;
            let objects = self.dir(fd(&git), "objects", 0o755, &format!("{name}/.git/objects"))?;
            made += 6 + self.fan_out(fd(&objects), &format!("{name}/.git/objects"))?;
            if repo == 0 {
                self.file(fd(&r), "run-as-owner", b"#!/bin/sh\n", 0o4755, None, &format!("{name}/run-as-owner"))?;
            }
            repo += 1;
        }
        Ok(())
    }

    /// 16 fan-out directories of 20 files each below `objects`; returns the entries made.
    fn fan_out(&mut self, objects: BorrowedFd<'_>, rel: &str) -> Result<u64, Error> {
        let mut made = 0;
        for fan in 0..16 {
            let name = format!("{:02x}", self.next() & 0xff);
            let d = self.dir(objects, &name, if fan % 3 == 0 { 0o700 } else { 0o755 }, &format!("{rel}/{name}"))?;
            made += 1;
            for _ in 0..20 {
                let f = format!("{:038x}", self.next());
                let mode = if self.next() % 4 == 0 { 0o600 } else { 0o644 };
                let owner = (self.is_root && self.next() % 3 == 0).then(|| 100 + (self.next() % 3) as u32);
                self.file(fd(&d), &f, b"x", mode, owner, &format!("{rel}/{name}/{f}"))?;
                made += 1;
            }
        }
        Ok(made)
    }

    fn next(&mut self) -> u64 {
        self.seed ^= self.seed << 13;
        self.seed ^= self.seed >> 7;
        self.seed ^= self.seed << 17;
        self.seed
    }

    fn err(&self, rel: &str, op: Op) -> impl Fn(Errno) -> Error {
        let path = self.top.join(rel);
        move |e| Error::sys(&path, op, e)
    }

    /// `name` below `dir` with `mode`: made by `mkdirat`, or, when a fan-out name repeats, the
    /// one made before; settled (see [`settle_dir`]) either way.
    fn dir(&self, dir: BorrowedFd<'_>, name: &str, mode: u32, rel: &str) -> Result<OwnedFd, Error> {
        let c = CString::new(name).expect("no NUL");
        match sys::mkdir_at(dir, &c, mode) {
            Ok(()) | Err(Errno::EXIST) => {}
            Err(e) => return Err(self.err(rel, Op::Mkdir)(e)),
        }
        settle_dir(dir, &c, mode, Owner::Anyone).map_err(|s| match s {
            Settle::Sys(op, e) => self.err(rel, op)(e),
            Settle::Replaced => self.err(rel, Op::Mkdir)(Errno::EXIST),
        })
    }

    /// A new file `name` below `dir` holding `data`, with `mode` and, given one, owner uid
    /// (group 100), set on its own fd.
    fn file(
        &self,
        dir: BorrowedFd<'_>,
        name: &str,
        data: &[u8],
        mode: u32,
        owner: Option<u32>,
        rel: &str,
    ) -> Result<(), Error> {
        let c = CString::new(name).expect("no NUL");
        let f = sys::create_new_at(dir, &c, 0o600).map_err(self.err(rel, Op::Open))?;
        rustix::io::write(&f, data).map_err(self.err(rel, Op::Open))?;
        if let Some(uid) = owner {
            sys::chown_fd(fd(&f), Some(uid), Some(100)).map_err(self.err(rel, Op::Chown))?;
        }
        // After the chown, which clears setuid/setgid bits.
        sys::chmod_fd(fd(&f), mode).map_err(self.err(rel, Op::Chmod))
    }

    fn link(&self, dir: BorrowedFd<'_>, target: &str, name: &str, rel: &str) -> Result<(), Error> {
        let (t, c) = (CString::new(target).expect("no NUL"), CString::new(name).expect("no NUL"));
        sys::symlink_at(&t, dir, &c).map_err(self.err(&format!("{rel}/{name}"), Op::Open))
    }
}
