//! Many shards on small xattr space: the shard record on the root takes one byte per shard (and
//! a heartbeat per running shard, a few claim groups) whatever how many are done, so a round of
//! `--shard I/1024` completes on ext4 with 4 KiB blocks and one of 64 on 1 KiB blocks, shards
//! running several at once (those that find no room wait for a running one to finish). A round
//! larger than the root can hold is refused by its first shard, before anything is walked.

mod common;

use std::path::Path;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Instant;

use common::snap::conforms;
use common::xattr::{MARKER, xattr_json};
use common::*;

const GID: u32 = 2000;

/// `anchors` top directories, each with a file: what `--shard-depth 1` splits.
fn build(vol: &Path, anchors: u32) {
    for a in 0..anchors {
        let d = vol.join(format!("a{a}"));
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("f"), b"x").unwrap();
    }
}

fn shard(vol: &Path, i: u32, n: u32) -> Run {
    let mut cmd = volprep();
    cmd.args(["apply", "--fs-group", "2000", "--shard-depth", "1", "--threads", "1", "--lock-timeout", "600s"]);
    run(cmd.arg(format!("--shard={i}/{n}")).arg(vol))
}

/// Runs every shard of a round of `n`, `at_once` processes at a time; panics with the first
/// failures. Returns the seconds it took.
fn round(vol: &Path, n: u32, at_once: u32) -> f64 {
    let start = Instant::now();
    let next = AtomicU32::new(0);
    let failed = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..at_once {
            s.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= n {
                        break;
                    }
                    let r = shard(vol, i, n);
                    if r.code != 0 {
                        failed.lock().unwrap().push(format!("shard {i}/{n}: {}", r.describe()));
                    }
                }
            });
        }
    });
    let failed = failed.into_inner().unwrap();
    assert!(
        failed.is_empty(),
        "{} of {n} shards failed; first:\n{}",
        failed.len(),
        failed[..failed.len().min(2)].join("\n")
    );
    start.elapsed().as_secs_f64()
}

#[track_caller]
fn assert_done(vol: &Path, what: &str) {
    let m = xattr_json(vol, MARKER).expect("a marker");
    assert_eq!(m["state"], "done", "{what}: {m}");
    let wrong = snapshot(vol).values().filter(|m| !conforms(m, GID, false)).count();
    assert_eq!(wrong, 0, "{what}: entries that do not conform");
    run(volprep().args(["check", "--fs-group", "2000"]).arg(vol)).expect_code(0);
}

fn complete_round(block: &str, n: u32, at_once: u32) {
    privileged(&["mkfs.ext4"]);
    let fs = LoopFs::new_ext4_blocks(64, block);
    let vol = fs.path().join("V");
    build(&vol, 2 * n);
    let secs = round(&vol, n, at_once);
    assert_done(&vol, &format!("{n} shards on ext4 with {block}-byte blocks"));
    eprintln!("{n} shards ({at_once} at once) on ext4 with {block}-byte blocks: done in {secs:.1}s");
}

#[test]
#[ignore = "needs root and loop devices (mkfs.ext4)"]
fn a_round_of_1024_shards_completes_on_ext4_with_4k_blocks() {
    complete_round("4096", 1024, 8);
}

#[test]
#[ignore = "needs root and loop devices (mkfs.ext4)"]
fn a_round_of_64_shards_completes_on_ext4_with_1k_blocks() {
    complete_round("1024", 64, 16);
}

/// The largest round the 1 KiB-block root holds, shards one after another (the record with one
/// running shard is the most it must hold).
#[test]
#[ignore = "needs root and loop devices (mkfs.ext4)"]
fn a_round_of_the_documented_most_shards_completes_on_ext4_with_1k_blocks() {
    complete_round("1024", 600, 1);
}

/// More shards than the root can hold: the first shard refuses with the limit in its message,
/// before walking anything; past the cap, the command line refuses.
#[test]
#[ignore = "needs root and loop devices (mkfs.ext4)"]
fn a_round_the_root_cannot_hold_is_refused_before_any_walk() {
    privileged(&["mkfs.ext4"]);
    let fs = LoopFs::new_ext4_blocks(64, "1024");
    let vol = fs.path().join("V");
    build(&vol, 64);
    let before = snapshot(&vol);
    let r = shard(&vol, 0, 1024);
    assert_eq!(r.code, 1, "{}", r.describe());
    let line =
        r.stderr_lines().into_iter().find(|l| l.contains("does not fit")).unwrap_or_else(|| panic!("{}", r.describe()));
    assert!(line.contains("1024 shards") && line.contains("use fewer shards") && line.contains("up to 600"), "{line}");
    assert_same(&before, &snapshot(&vol), |m| m.attrs(), "nothing walked");
    let r = run(volprep().args(["apply", "--fs-group", "2000", "--shard=0/1025"]).arg(&vol));
    assert_eq!(r.code, 2, "{}", r.describe());
    assert!(r.stderr.contains("at most 1024 shards"), "{}", r.describe());
}
