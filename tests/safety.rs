//! The symlink-swap adversary: while `volprep apply` runs, a thread keeps atomically exchanging
//! directories and regular files inside the volume with symlinks to canaries outside it
//! (renameat2 RENAME_EXCHANGE). Whatever volprep does to the names, it must never chown, chmod
//! or otherwise touch what the symlinks point to, also when a tight open-file limit makes it
//! close directories and re-open them during the walk.

mod common;

use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;

use common::snap::{chgrp_all, conforms};
use common::tree::{self, GenOpts};
use common::*;

const PAIRS: usize = 8;
const RUNS: usize = 30;

/// Canaries: a directory and a file outside the volume, owned by root with private modes (an
/// fsGroup pass reaching them would add group bits and change the group).
fn canaries(base: &Path) {
    let mut t = Tree::new();
    t.root(0, 0, 0o700).dir("sub", 0, 0, 0o700).file("sub/secret", 0, 0, 0o600);
    for i in 0..10 {
        // The same names the volume's directories hold: a path-based walk would land on them.
        t.file(format!("f{i}"), 0, 0, 0o600);
    }
    t.build(&base.join("canary-dir"));
    let mut f = Tree::new();
    f.root(0, 0, 0o700).file("file", 0, 0, 0o600);
    f.build(&base.join("canary-file"));
}

/// The volume: `d{i}` directories (holding `f0..f9` and `sub/`), `r{i}` regular files, and for
/// each a symlink twin (`ld{i}` → the canary dir, `lr{i}` → the canary file) the adversary swaps
/// them with; plus a generated bulk that keeps volprep busy.
fn volume(base: &Path) -> std::path::PathBuf {
    let vol = base.join("vol");
    let canary_dir = base.join("canary-dir");
    let canary_file = base.join("canary-file/file");
    let mut t = Tree::new();
    t.root(0, 0, 0o755);
    for i in 0..PAIRS {
        t.dir(format!("d{i}"), 0, 0, 0o755);
        for j in 0..10 {
            t.file(format!("d{i}/f{j}"), 0, 0, 0o644);
        }
        t.dir(format!("d{i}/sub"), 0, 0, 0o755).file(format!("d{i}/sub/secret"), 0, 0, 0o644);
        // One level down too: `sub` and `f0` swap with symlinks into the canary dir.
        t.symlink(format!("d{i}/lsub"), canary_dir.join("sub").as_os_str().as_bytes(), 0, 0);
        t.symlink(format!("d{i}/lf0"), canary_dir.join("f0").as_os_str().as_bytes(), 0, 0);
        t.file(format!("r{i}"), 0, 0, 0o644);
        // Absolute and relative targets.
        let dir_target =
            if i % 2 == 0 { canary_dir.as_os_str().as_bytes().to_vec() } else { b"../canary-dir".to_vec() };
        t.symlink(format!("ld{i}"), dir_target, 0, 0);
        t.symlink(format!("lr{i}"), canary_file.as_os_str().as_bytes(), 0, 0);
    }
    t.nest("bulk", &tree::generated(31, 3_000, base, GenOpts { hardlinks: true, special_bits: false }));
    t.build(&vol);
    vol
}

/// A thread swapping, as fast as it can until stopped, every `d{i}`/`ld{i}` and `r{i}`/`lr{i}`
/// pair in the volume's root and every `sub`/`lsub` and `f0`/`lf0` pair inside the `d{i}`.
/// Stops and joins on drop (a failing test does not leave it running).
struct Adversary {
    stop: Arc<AtomicBool>,
    swaps: Arc<AtomicU64>,
    handle: Option<JoinHandle<()>>,
}

impl Adversary {
    fn start(vol: &Path) -> Adversary {
        let stop = Arc::new(AtomicBool::new(false));
        let swaps = Arc::new(AtomicU64::new(0));
        let root = Arc::new(common::fd::open_dir(vol).expect("open volume"));
        let mut pairs: Vec<(Arc<OwnedFd>, Vec<u8>, Vec<u8>)> = Vec::new();
        for i in 0..PAIRS {
            let (d, ld) = (format!("d{i}").into_bytes(), format!("ld{i}").into_bytes());
            // After an odd number of swaps the directory is named `ld{i}`.
            let dir = common::fd::open_dir_at(root.as_raw_fd(), &d)
                .or_else(|_| common::fd::open_dir_at(root.as_raw_fd(), &ld))
                .expect("open d_i (or ld_i, its swapped name)");
            let dir = Arc::new(dir);
            pairs.push((root.clone(), d, ld));
            pairs.push((root.clone(), format!("r{i}").into_bytes(), format!("lr{i}").into_bytes()));
            pairs.push((dir.clone(), b"sub".to_vec(), b"lsub".to_vec()));
            pairs.push((dir, b"f0".to_vec(), b"lf0".to_vec()));
        }
        let (s, n) = (stop.clone(), swaps.clone());
        let handle = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                for (dirfd, a, b) in &pairs {
                    common::fd::exchange_at(dirfd.as_raw_fd(), a, b).expect("renameat2(RENAME_EXCHANGE)");
                    n.fetch_add(1, Ordering::Relaxed);
                }
            }
        });
        Adversary { stop, swaps, handle: Some(handle) }
    }

    /// Stops the thread; returns the number of swaps it made.
    fn stop(mut self) -> u64 {
        self.halt();
        self.swaps.load(Ordering::Relaxed)
    }

    fn halt(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            if let Err(e) = h.join() {
                if !std::thread::panicking() {
                    std::panic::resume_unwind(e);
                }
            }
        }
    }
}

impl Drop for Adversary {
    fn drop(&mut self) {
        self.halt();
    }
}

fn swap_storm(base: &Path) {
    canaries(base);
    let vol = volume(base);
    let dir_before = snapshot(&base.join("canary-dir"));
    let file_before = snapshot(&base.join("canary-file"));
    tick();

    let mut swaps = 0;
    let mut failed_runs = 0;
    for i in 0..RUNS {
        // Work for the next run: every group wrong again (the adversary is stopped here).
        chgrp_all(&vol, 0);
        let adversary = Adversary::start(&vol);
        let mut cmd = volprep();
        cmd.args(["apply", "--fs-group", "2000", "--threads", "8", "--report", "-"]).arg(&vol);
        // Every other run under a tight open-file limit: the walker then closes idle
        // directories and re-opens them (by name or through `..`) while names are swapped.
        if i % 2 == 1 {
            limit_fds(&mut cmd, 40);
        }
        let run = common::run(&mut cmd);
        swaps += adversary.stop();
        // Races may surface as per-entry errors (exit 1); anything else is a bug.
        assert!(run.code == 0 || run.code == 1, "unexpected exit code\n{}", run.describe());
        if run.code == 1 {
            failed_runs += 1;
        }
        assert!(run.count("changed_owner") > 0, "the run had work to do\n{}", run.describe());
        assert_same(
            &dir_before,
            &snapshot(&base.join("canary-dir")),
            Meta::attrs_ctime,
            "canary dir outside the volume",
        );
        assert_same(
            &file_before,
            &snapshot(&base.join("canary-file")),
            Meta::attrs_ctime,
            "canary file outside the volume",
        );
    }
    eprintln!("{swaps} swaps over {RUNS} runs; {failed_runs} runs reported per-entry errors");
    assert!(swaps > 1000, "the adversary swapped only {swaps} times");

    // Without the adversary, one more pass brings the whole volume to conformity.
    chgrp_all(&vol, 0);
    pass("apply", &["--fs-group", "2000"], &vol).expect_code(0);
    let after = snapshot(&vol);
    let bad: Vec<String> = after.iter().filter(|(_, m)| !conforms(m, 2000, false)).map(|(k, _)| show(k)).collect();
    assert!(bad.is_empty(), "entries not conforming after a quiet apply: {bad:?}");
    assert_same(&dir_before, &snapshot(&base.join("canary-dir")), Meta::attrs_ctime, "canary dir outside the volume");
}

#[test]
#[ignore = "needs root and loop devices"]
fn symlink_swaps_never_touch_outside_on_tmpfs() {
    privileged(&[]);
    let fs = Tmpfs::new();
    swap_storm(fs.path());
}

#[test]
#[ignore = "needs root, loop devices and mkfs.ext4"]
fn symlink_swaps_never_touch_outside_on_ext4() {
    privileged(&["mkfs.ext4"]);
    let fs = LoopFs::new(FsKind::Ext4, 128);
    swap_storm(fs.path());
}
