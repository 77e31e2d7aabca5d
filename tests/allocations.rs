//! The walk's allocations, counted by the test-hook allocator (`VOLPREP_TEST_COUNT_ALLOCATIONS=1`,
//! only in a `--features test-hooks` build): a first pass, where every entry changes, and a
//! conforming pass read in full (`--verify full`) stay within a few allocations per directory
//! and one per hundred entries, whatever the tree's shape. Any user, on a temp directory, with
//! one of the user's own groups (as `tests/storage.rs` and `tests/core_unprivileged.rs`); the
//! thread count is fixed, so the count does not depend on the machine's cores.

mod common;

use std::path::Path;

use common::*;

/// The walk's threads in every run here (pass counts never depend on the machine's cores).
const THREADS: &str = "4";

/// `dirs` directories of `files` files each below `root`, every entry private (0700/0600): the
/// kubelet's rule changes every one of them. Returns (directories with the root, entries).
fn tree(root: &Path, dirs: usize, files: usize) -> (u64, u64) {
    use std::os::unix::fs::PermissionsExt;
    for d in 0..dirs {
        let dir = root.join(format!("dir{d:04}"));
        std::fs::create_dir(&dir).unwrap();
        for f in 0..files {
            let file = dir.join(format!("file-{f:05}.dat"));
            std::fs::write(&file, b"").unwrap();
            std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
        }
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    }
    (dirs as u64 + 1, (dirs * (files + 1)) as u64)
}

/// The group to apply: 2000 as root, else the user's own (then only modes change).
fn group() -> String {
    match rustix::process::geteuid().as_raw() {
        0 => "2000".into(),
        _ => rustix::process::getegid().as_raw().to_string(),
    }
}

/// Runs `volprep apply` with the allocation count armed and returns the walk's count.
fn walk_allocations(vol: &Path, extra: &[&str]) -> u64 {
    let g = group();
    let mut cmd = volprep();
    cmd.env("VOLPREP_TEST_COUNT_ALLOCATIONS", "1")
        .args(["apply", "--fs-group", &g, "--threads", THREADS, "--progress-interval", "0"])
        .args(["--log-format", "json", "--report", "-"])
        .args(extra)
        .arg(vol);
    let r = run(&mut cmd).expect_code(0);
    let counts: Vec<u64> = r
        .stderr
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|l| l["walk_allocations"].as_u64())
        .collect();
    match counts[..] {
        [n] => n,
        _ => panic!("one walk_allocations line expected, got {counts:?}\n{}", r.describe()),
    }
}

/// A first pass and a conforming pass read in full over `dirs` × `files` each make at most
/// 256 + 4 per directory + 1 per 100 entries allocations in the walk.
fn bounded(dirs: usize, files: usize) {
    let vol = tempfile::tempdir().unwrap();
    let (dirs, entries) = tree(vol.path(), dirs, files);
    let bound = 256 + 4 * dirs + entries / 100;
    let first = walk_allocations(vol.path(), &[]);
    let conforming = walk_allocations(vol.path(), &["--verify", "full"]);
    eprintln!(
        "{dirs} dirs, {entries} entries: first pass {first} allocations ({:.3}/entry), conforming pass \
         {conforming} ({:.3}/entry); bound {bound}",
        first as f64 / entries as f64,
        conforming as f64 / entries as f64
    );
    assert!(first <= bound, "first pass: {first} allocations > {bound} ({dirs} dirs, {entries} entries)");
    assert!(
        conforming <= bound,
        "conforming pass: {conforming} allocations > {bound} ({dirs} dirs, {entries} entries)"
    );
}

#[test]
#[cfg_attr(not(feature = "test-hooks"), ignore = "needs --features test-hooks")]
fn a_walk_of_few_large_directories_allocates_per_directory_not_per_entry() {
    bounded(11, 2000);
}

#[test]
#[cfg_attr(not(feature = "test-hooks"), ignore = "needs --features test-hooks")]
fn a_walk_of_many_small_directories_allocates_a_few_times_per_directory() {
    bounded(1001, 5);
}
