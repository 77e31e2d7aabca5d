//! Shared helpers of the integration tests: the privileged-test gate, running the real binary,
//! real filesystems (`mounts`), a tree builder (`tree`), snapshots and the kubelet reference
//! (`snap`), the mixed-owner volume of the unprivileged mode (`mixed`), the Kubernetes
//! examples' tools and checks (`k8s`), a pass killed midway (`kill`), real apps on prepared
//! volumes (`apps`), FUSE filesystems that ignore or refuse ownership changes (`fusefs`, on the
//! passthrough the benchmark's slow-storage model shares, `fuse_passthrough`). Each
//! test file uses a part of it.
#![allow(dead_code, unused_imports)]

pub mod apps;
pub mod clones;
pub mod containers;
pub mod fd;
pub mod fuse_passthrough;
pub mod fusefs;
pub mod k8s;
pub mod kill;
pub mod mixed;
pub mod mounts;
pub mod play;
pub mod snap;
pub mod tree;
pub mod xattr;

use std::ffi::OsStr;
use std::io::Write as _;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::{CommandExt as _, ExitStatusExt};
use std::path::Path;
use std::process::Command;

pub use mounts::{Bind, FsKind, LoopFs, Overlay, Ramfs, Tmpfs};
pub use snap::{Kind, Meta, Mounts, Snapshot, assert_same, show, snapshot, snapshot_with};
pub use tree::Tree;

/// Set to `1` by `.ci/run`. Every test gated by [`privileged`] is `#[ignore]`d, so it runs only
/// when asked (`-- --include-ignored`); the variable is kept for the gates that need it.
pub const PRIVILEGED_ENV: &str = "VOLPREP_PRIVILEGED_TESTS";

/// The gate of tests that need root, loop devices, mount and the given tools. Each such test is
/// `#[ignore = "needs root, loop devices …"]`: a plain `cargo test` reports it as ignored, never
/// as passed. Run anyway (`--include-ignored`) where it cannot run, it fails, naming what is
/// missing: a test asked for and not run must not look passed.
#[track_caller]
pub fn privileged(tools: &[&str]) {
    let mut missing = Vec::new();
    if rustix::process::geteuid().as_raw() != 0 {
        missing.push("not running as root".to_string());
    }
    if !Path::new("/dev/loop-control").exists() {
        missing.push("no /dev/loop-control".to_string());
    }
    for t in ["losetup", "mount", "umount"].iter().chain(tools) {
        if mounts::tool(t).is_none() {
            missing.push(format!("`{t}` not found"));
        }
    }
    if !missing.is_empty() {
        let test = std::thread::current().name().unwrap_or("?").to_string();
        panic!("{test}: privileged test cannot run: {}", missing.join(", "));
    }
}

/// The binary under test, with every `VOLPREP_*` and `RUST_LOG` variable of the test's own
/// environment removed (a test sets what it means).
pub fn volprep() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_volprep"));
    for (k, _) in std::env::vars_os() {
        if k.as_bytes().starts_with(b"VOLPREP_") || k == "RUST_LOG" {
            c.env_remove(k);
        }
    }
    c
}

/// Makes `cmd` run as `uid`/`gid` with the supplementary `groups`, no capabilities and
/// no_new_privs: what a pod's `runAsUser`, `runAsGroup`, `supplementalGroups`,
/// `capabilities: drop: [ALL]` and `allowPrivilegeEscalation: false` give a process. The test
/// must run as root.
pub fn as_user<'c>(cmd: &'c mut Command, uid: u32, gid: u32, groups: &[u32]) -> &'c mut Command {
    let groups: Vec<libc::gid_t> = groups.to_vec();
    // SAFETY: only async-signal-safe calls between fork and exec; `groups` was allocated before.
    unsafe {
        cmd.pre_exec(move || {
            // setuid from root to another uid clears the permitted and effective capabilities.
            if libc::setgroups(groups.len(), groups.as_ptr()) != 0
                || libc::setgid(gid) != 0
                || libc::setuid(uid) != 0
                || libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        })
    }
}

/// Sets the command's open-file limit (soft and hard) to `n` in the child, before it runs.
pub fn limit_fds(cmd: &mut Command, n: u64) -> &mut Command {
    use std::os::unix::process::CommandExt as _;
    // SAFETY: only async-signal-safe setrlimit runs between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            let lim = libc::rlimit { rlim_cur: n, rlim_max: n };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    cmd
}

/// A finished run of the binary.
#[derive(Debug)]
pub struct Run {
    pub cmdline: String,
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    /// Panics (showing the command and its output) unless the exit code is `code`.
    #[track_caller]
    pub fn expect_code(self, code: i32) -> Run {
        if self.code != code {
            panic!("expected exit code {code}, got {}\n{}", self.code, self.describe());
        }
        self
    }

    pub fn describe(&self) -> String {
        format!(
            "command: {}\nexit code: {}\n--- stdout ---\n{}\n--- stderr ---\n{}\n---",
            self.cmdline,
            self.code,
            truncate(&self.stdout),
            truncate(&self.stderr)
        )
    }

    /// The JSON report on stdout (run with `--report -`).
    #[track_caller]
    pub fn report(&self) -> serde_json::Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("stdout is not a JSON report: {e}\n{}", self.describe()))
    }

    /// The report's only volume.
    #[track_caller]
    pub fn volume(&self) -> serde_json::Value {
        let r = self.report();
        assert_eq!(r["version"], 1, "report version\n{}", self.describe());
        let vols = r["volumes"].as_array().unwrap_or_else(|| panic!("no volumes array\n{}", self.describe()));
        assert_eq!(vols.len(), 1, "one volume expected\n{}", self.describe());
        vols[0].clone()
    }

    /// A numeric field of the report's only volume.
    #[track_caller]
    pub fn count(&self, field: &str) -> u64 {
        let v = self.volume();
        v[field].as_u64().unwrap_or_else(|| panic!("report field {field} missing or not a number\n{}", self.describe()))
    }

    /// Non-empty stderr lines.
    pub fn stderr_lines(&self) -> Vec<&str> {
        self.stderr.lines().filter(|l| !l.trim().is_empty()).collect()
    }
}

/// Output for a failure message: very long lines (paths past PATH_MAX) shortened in the
/// middle, at most ~8000 bytes in all.
fn truncate(s: &str) -> String {
    let mut out = String::new();
    for line in s.lines() {
        if out.len() > 8000 {
            out.push_str(&format!("... ({} bytes in all)\n", s.len()));
            break;
        }
        let chars: Vec<char> = line.chars().collect();
        if chars.len() > 400 {
            let head: String = chars[..150].iter().collect();
            let tail: String = chars[chars.len() - 150..].iter().collect();
            out.push_str(&format!("{head}[...{} chars...]{tail}\n", chars.len() - 300));
        } else {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

/// Runs a command to completion and captures its outcome; a death by signal panics.
#[track_caller]
pub fn run(cmd: &mut Command) -> Run {
    let cmdline = format!("{cmd:?}");
    let out = cmd.output().unwrap_or_else(|e| panic!("cannot run {cmdline}: {e}"));
    let run = Run {
        cmdline,
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    };
    if let Some(sig) = out.status.signal() {
        panic!("killed by signal {sig}\n{}", run.describe());
    }
    run
}

/// `volprep ARGS...`.
#[track_caller]
pub fn vp<I, S>(args: I) -> Run
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    run(volprep().args(args))
}

/// `volprep COMMAND ARGS... --report - PATH` (any exit code).
#[track_caller]
pub fn pass(command: &str, args: &[&str], path: &Path) -> Run {
    run(volprep().arg(command).args(args).args(["--report", "-"]).arg(path))
}

/// `volprep apply --fs-group GID EXTRA... --report - PATH`, expecting exit 0.
#[track_caller]
pub fn apply_fs_group(path: &Path, gid: u32, extra: &[&str]) -> Run {
    let gid = gid.to_string();
    let mut args = vec!["--fs-group", &gid];
    args.extend_from_slice(extra);
    pass("apply", &args, path).expect_code(0)
}

/// Waits long enough that a change made now gets a ctime distinct from one made before,
/// even with coarse (jiffy) timestamps.
pub fn tick() {
    std::thread::sleep(std::time::Duration::from_millis(30));
}
