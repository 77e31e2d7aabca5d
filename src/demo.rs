//! `volprep demo`: makes a small volume the way an app leaves one (mixed modes and, as root,
//! mixed owners, a setuid file, symlinks pointing outside), then checks, applies and checks it.

use std::fs;
use std::os::unix::fs::{PermissionsExt, lchown, symlink};
use std::path::{Path, PathBuf};

use tracing::info;

use crate::error::{Error, ExitCode, Op};
use crate::options::{Mode, RunOptions, resolve_threads};
use crate::report::{self, Report};
use crate::spec::Spec;
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
}

pub fn run(args: &Options) -> Result<ExitCode, Error> {
    let (dir, made_temp) = match &args.dir {
        Some(d) => (d.clone(), false),
        None => (std::env::temp_dir().join(format!("volprep-demo-{}", std::process::id())), true),
    };
    let is_root = rustix::process::geteuid().is_root();
    // As root the demo uses the group an fsGroup would name; otherwise one the user may chown to.
    let gid = if is_root { 2000 } else { rustix::process::getegid().as_raw() };
    info!("making a demo volume of about {} entries in {}", args.entries, dir.display());
    make_tree(&dir, args.entries, is_root).map_err(|e| Error::Other { path: dir.clone(), msg: e.to_string() })?;

    let spec = Spec { fs_group: Some(gid), owner_uid: None, owner_gid: None, read_only: false };
    let threads = resolve_threads(0, false);
    let pool = Pool::new(threads);
    let mut volumes = Vec::new();
    for (step, mode) in [("1/3 check", Mode::Check), ("2/3 apply", Mode::Apply), ("3/3 check", Mode::Check)] {
        let opts = RunOptions::new(mode, threads);
        info!(
            "step {step}: volprep {} --fs-group {gid} {}",
            if mode == Mode::Apply { "apply" } else { "check" },
            dir.display()
        );
        let vol = volume::run(&dir, &spec, &opts, &pool)?;
        info!("{}", vol.summary());
        volumes.push(vol);
    }
    let last = volumes.last().expect("three steps");
    let ok = last.changed_owner + last.changed_mode == 0 && volumes.iter().all(|v| v.errors == 0);
    report::write(&Report { version: 1, volumes }, Path::new("-"))?;
    if args.keep || !made_temp {
        info!("demo volume kept at {}", dir.display());
    } else {
        fs::remove_dir_all(&dir).map_err(|e| {
            Error::sys(&dir, Op::Open, rustix::io::Errno::from_io_error(&e).unwrap_or(rustix::io::Errno::IO))
        })?;
    }
    info!("demo {}", if ok { "done: the volume conforms" } else { "found a problem (see above)" });
    Ok(if ok { ExitCode::Success } else { ExitCode::Failure })
}

/// A deterministic tree of about `entries` entries: repositories with fan-out directories of
/// small files, restrictive modes here and there, a setuid file and symlinks (one dangling, one
/// pointing outside the volume, which volprep must leave alone).
fn make_tree(dir: &Path, entries: u64, is_root: bool) -> std::io::Result<()> {
    fs::create_dir_all(dir)?;
    let mut made = 0u64;
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let mut repo = 0;
    while made < entries {
        let r: PathBuf = dir.join(format!("repo-{repo:03}"));
        fs::create_dir_all(r.join(".git/refs/heads"))?;
        fs::write(r.join(".git/HEAD"), "ref: refs/heads/main\n")?;
        symlink("../../../../etc/hosts", r.join("outside-link"))?;
        symlink("missing-target", r.join("dangling-link"))?;
        made += 6;
        for fan in 0..16 {
            let d = r.join(format!(".git/objects/{:02x}", next() & 0xff));
            fs::create_dir_all(&d)?;
            fs::set_permissions(&d, fs::Permissions::from_mode(if fan % 3 == 0 { 0o700 } else { 0o755 }))?;
            made += 1;
            for _ in 0..20 {
                let f = d.join(format!("{:038x}", next()));
                fs::write(&f, b"x")?;
                fs::set_permissions(&f, fs::Permissions::from_mode(if next() % 4 == 0 { 0o600 } else { 0o644 }))?;
                if is_root && next() % 3 == 0 {
                    lchown(&f, Some(100 + (next() % 3) as u32), Some(100))?;
                }
                made += 1;
            }
        }
        repo += 1;
    }
    let setuid = dir.join("repo-000/run-as-owner");
    fs::write(&setuid, b"#!/bin/sh\n")?;
    fs::set_permissions(&setuid, fs::Permissions::from_mode(0o4755))?;
    Ok(())
}
