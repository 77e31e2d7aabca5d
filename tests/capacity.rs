//! The adaptive load end to end, on a FUSE metadata server of finite capacity
//! (`common::fusefs::FuseFs::capacity`: K service slots of 2 ms): volprep's default comes within
//! 1.25 times the time of the best fixed count of operations in flight (`--load full --threads
//! N`, N in 1, 4, 8, 32) with 4 and with 16 slots, at a
//! mean request latency no more than 2.5 times the unloaded one, and its limit is not latched
//! at 1: the default's run is taken up to 3 times (the machine is shared) and one must meet
//! every bound. Every run of one server size is side by side, on a fresh copy
//! of the same tree (2,000 files in 20 directories, every entry to change), the first half of
//! each directory in the kernel's cache (its first windows answered from the cache).

mod common;

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::fusefs::{self, FuseFs, ServerStats};
use common::*;

const SERVICE: Duration = Duration::from_millis(2);

/// 20 directories of 100 files, every entry root:root with private modes.
fn tree(root: &Path) {
    let mut t = Tree::new();
    t.root(0, 0, 0o755);
    for d in 0..20 {
        t.dir(format!("d{d}"), 0, 0, 0o700);
        for f in 0..100 {
            t.file(format!("d{d}/f{f}"), 0, 0, 0o600);
        }
    }
    t.build(root);
}

/// Looks up the first half of each directory's entries (in listing order, the walk's) through
/// the mount at `mnt`: the kernel caches them, and the walk's first operations are answered
/// from that cache, much faster than the server answers the rest (as after an app or a kubelet
/// touched part of the volume).
fn warm(mnt: &Path) {
    for d in std::fs::read_dir(mnt).unwrap() {
        let d = d.unwrap().path();
        let Ok(entries) = std::fs::read_dir(&d) else { continue };
        let names: Vec<_> = entries.map(|e| e.unwrap().path()).collect();
        for p in &names[..names.len() / 2] {
            std::fs::symlink_metadata(p).unwrap();
        }
    }
}

/// One run: its wall time, the server's mean request latency (ms), and the report's volume.
struct Timed {
    secs: f64,
    latency_ms: f64,
    volume: serde_json::Value,
}

/// `apply --fs-group 2000 EXTRA` on a fresh tree behind a server of `slots`.
fn timed(slots: usize, extra: &[&str]) -> Timed {
    let src = tempfile::tempdir().unwrap();
    tree(src.path());
    let stats = Arc::new(ServerStats::default());
    let fuse = FuseFs::capacity(src.path(), slots, SERVICE, Arc::clone(&stats));
    let mut args = vec!["--fs-group", "2000"];
    args.extend_from_slice(extra);
    warm(fuse.path());
    let t = Instant::now();
    let run = pass("apply", &args, fuse.path()).expect_code(0);
    let secs = t.elapsed().as_secs_f64();
    let (latency_us, _) = stats.take();
    if std::env::var_os("VOLPREP_CAPACITY_TRACE").is_some() {
        for l in run.stderr.lines().filter(|l| l.contains("limit changed")) {
            println!("{l}");
        }
    }
    let volume = run.volume();
    assert_eq!(volume["changed_owner"].as_u64(), Some(2021), "{}", run.describe());
    Timed { secs, latency_ms: latency_us / 1000.0, volume }
}

/// The default against every fixed count on a server of `slots`, within `bound` times the best
/// one's time; prints the table.
fn compare(slots: usize, bound: f64) {
    let mut rows = Vec::new();
    let counts: Vec<usize> = match std::env::var("VOLPREP_CAPACITY_THREADS") {
        Ok(l) => l.split(',').filter_map(|n| n.parse().ok()).collect(),
        Err(_) => vec![1, 4, 8, 32],
    };
    for n in counts {
        let threads = n.to_string();
        rows.push((format!("--load full --threads {n}"), timed(slots, &["--load", "full", "--threads", &threads])));
    }
    let best = rows.iter().map(|(_, r)| r.secs).fold(f64::INFINITY, f64::min);
    let trace: &[&str] =
        if std::env::var_os("VOLPREP_CAPACITY_TRACE").is_some() { &["--log-level", "debug"] } else { &[] };
    // The machine is shared: a try may fail on a neighbour's load, so the default's row is
    // taken up to 3 times and the first that meets every bound counts (the defects these bounds
    // catch, a latch or an overshoot, show in every try).
    let mut tries = Vec::new();
    for _ in 0..3 {
        let t = timed(slots, trace);
        let failed = misses(&t, best, bound);
        tries.push((failed, t));
        if tries.last().is_some_and(|(f, _)| f.is_empty()) {
            break;
        }
    }
    let mut table = format!("{slots} slots, {} ms a request unloaded:\n", SERVICE.as_millis());
    let named = rows.iter().map(|(name, r)| (name.clone(), r, None));
    let tried = tries.iter().enumerate().map(|(i, (f, r))| (format!("default (adaptive), try {}", i + 1), r, Some(f)));
    for (name, r, failed) in named.chain(tried) {
        let load = &r.volume["load"];
        let (limit, mean, unloaded) =
            (&load["in_flight_limit"], &load["mean_latency_us"], &load["unloaded_latency_us"]);
        table += &format!(
            "  {name:28} {:6.2} s  {:5.2} ms  limit {limit}  volprep's view {mean} µs against {unloaded} unloaded\n",
            r.secs, r.latency_ms
        );
        if let Some(f) = failed.filter(|f| !f.is_empty()) {
            table += &format!("    missed: {}\n", f.join("; "));
        }
    }
    println!("{table}");
    assert!(tries.iter().any(|(f, _)| f.is_empty()), "no try of the default met every bound\n{table}");
}

/// The bounds the default's run `t` misses, with `best` the best fixed count's time.
fn misses(t: &Timed, best: f64, bound: f64) -> Vec<String> {
    let mut failed = Vec::new();
    if t.secs > bound * best {
        failed.push(format!("{:.2} s > {bound} × the best fixed count ({best:.2} s)", t.secs));
    }
    let unloaded_ms = SERVICE.as_secs_f64() * 1000.0;
    if t.latency_ms > 2.5 * unloaded_ms {
        failed.push(format!("mean latency {:.2} ms > 2.5 × {unloaded_ms} ms unloaded", t.latency_ms));
    }
    if t.volume["load"]["in_flight_limit"]["final"].as_u64() <= Some(1) {
        failed.push("latched at 1".into());
    }
    failed
}

#[test]
#[ignore = "needs root and /dev/fuse; about two minutes of runs side by side"]
fn the_default_comes_near_the_best_fixed_count_on_a_server_of_4_and_of_16_slots() {
    if !fusefs::available() {
        return;
    }
    let sizes: Vec<usize> = match std::env::var("VOLPREP_CAPACITY_SLOTS") {
        Ok(l) => l.split(',').filter_map(|n| n.parse().ok()).collect(),
        Err(_) => vec![4, 16],
    };
    for slots in sizes {
        // With 16 slots the best count's run lasts about a second: the default's start (one in
        // flight, then doubling) is a good part of it; a latch costs 10 × and more.
        compare(slots, 1.25);
    }
}

/// `dirs` directories of `files` files each below `root`, every entry root:root with private
/// modes (each needs a change), written directly (a local volume).
fn local_tree(root: &Path, dirs: usize, files: usize) {
    use std::os::unix::fs::PermissionsExt as _;
    for d in 0..dirs {
        let dir = root.join(format!("d{d}"));
        std::fs::create_dir(&dir).unwrap();
        for f in 0..files {
            let p = dir.join(format!("f{f}"));
            std::fs::File::create(&p).unwrap();
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        }
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    }
}

/// Entries of the local volume: enough that its walk alone lasts a good part of the FUSE one's.
const LOCAL: (usize, usize) = (50, 1000);

/// `apply --fs-group 2000 EXTRA` over a fresh local tree and a fresh tree behind a server of
/// `slots` in one run: its wall time and the report's two volumes (local, FUSE).
fn together(slots: usize, extra: &[&str]) -> (f64, serde_json::Value, serde_json::Value) {
    let (local, src) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    local_tree(local.path(), LOCAL.0, LOCAL.1);
    tree(src.path());
    let fuse = FuseFs::capacity(src.path(), slots, SERVICE, Arc::new(ServerStats::default()));
    warm(fuse.path());
    let t = Instant::now();
    let run = run(volprep()
        .args(["apply", "--fs-group", "2000", "--report", "-"])
        .args(extra)
        .args([local.path(), fuse.path()]))
    .expect_code(0);
    let secs = t.elapsed().as_secs_f64();
    let report = run.report();
    let of = |p: &Path| {
        let v = report["volumes"].as_array().unwrap().iter().find(|v| v["path"] == p.to_str().unwrap()).cloned();
        v.unwrap_or_else(|| panic!("no volume {}\n{}", p.display(), run.describe()))
    };
    let (l, f) = (of(local.path()), of(fuse.path()));
    assert_eq!(l["changed_owner"].as_u64(), Some((LOCAL.0 * (LOCAL.1 + 1) + 1) as u64), "{}", run.describe());
    assert_eq!(f["changed_owner"].as_u64(), Some(2021), "{}", run.describe());
    (secs, l, f)
}

/// The local volume alone, by default: its wall time.
fn local_alone() -> f64 {
    let local = tempfile::tempdir().unwrap();
    local_tree(local.path(), LOCAL.0, LOCAL.1);
    let t = Instant::now();
    pass("apply", &["--fs-group", "2000"], local.path()).expect_code(0);
    t.elapsed().as_secs_f64()
}

#[test]
#[ignore = "needs root and /dev/fuse; about a minute of runs side by side"]
fn a_local_volume_beside_a_fuse_one_has_a_gate_of_its_own_and_the_run_is_no_slower_than_two() {
    if !fusefs::available() {
        return;
    }
    let slots = 16;
    // The machine is shared: the three runs are taken together up to 3 times, and one try
    // must have the run of both no slower than the two alone.
    let mut tries = Vec::new();
    for _ in 0..3 {
        let (local, fuse) = (local_alone(), timed(slots, &[]).secs);
        let (secs, l, f) = together(slots, &[]);
        tries.push((local, fuse, secs, l, f));
        if secs <= local + fuse {
            break;
        }
    }
    let mut table = String::new();
    for (local, fuse, secs, l, f) in &tries {
        table += &format!(
            "local alone {local:.2} s, FUSE ({slots} slots) alone {fuse:.2} s, one after the other {:.2} s, \
             together {secs:.2} s\n  local load {}\n  FUSE load {}\n",
            local + fuse,
            l["load"],
            f["load"]
        );
    }
    let (local, fuse, secs, l, f) = tries.pop().expect("a try");
    println!("{table}");
    assert!(secs <= local + fuse, "together no slower than one after the other\n{table}");
    // `--load auto` by each volume's own storage: the local one is not held to any limit.
    assert_eq!(
        (l["load"]["policy"].as_str(), f["load"]["policy"].as_str()),
        (Some("full"), Some("adaptive")),
        "{table}"
    );
    assert!(
        l["load"]["in_flight_limit"].is_null() && f["load"]["in_flight_limit"]["final"].as_u64() > Some(1),
        "{table}"
    );
    // Adaptive on both: each gate measures its own volume (the local one's operations take
    // microseconds, the server's milliseconds), its baselines too. (Their limits may both end
    // at 32: that says nothing.)
    let (_, l, f) = together(slots, &["--load", "adaptive", "--threads", "32"]);
    let table =
        format!("--load adaptive --threads 32 together:\n  local load {}\n  FUSE load {}", l["load"], f["load"]);
    println!("{table}");
    let us = |v: &serde_json::Value, k: &str| v["load"][k].as_u64().unwrap_or_else(|| panic!("{k}\n{table}"));
    assert!(us(&l, "mean_latency_us") * 4 < us(&f, "unloaded_latency_us"), "{table}");
    assert!(us(&l, "unloaded_latency_us") * 4 < us(&f, "unloaded_latency_us"), "{table}");
}
