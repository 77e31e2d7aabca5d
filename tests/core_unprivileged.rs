//! The core behaviours as any user, on plain temp directories (no root, no loop device, no
//! mount, no test hook): `apply` against the kubelet's rule, `check`, the marker and its skip
//! that reads nothing, spec changes, a pass SIGKILLed midway that resumes, `--sticky`,
//! `inspect`, and a short seeded fuzzer. Every entry is the user's own, so a non-root volprep
//! may change all of them; the group applied is one of the user's groups: as root, group 2000
//! over group 0; as another user, a second group of its own when it has one (`setpriv
//! --groups`), else its only group (then only modes change, and the tests say so on stderr).
//! The root-only tests (other owners, mounts, filesystems, capabilities) stay in their files.

mod common;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use common::kill::{KillOnDrop, field};
use common::snap::{conforms, kubelet_reference};
use common::tree::{self, GenOpts, Node, Rng};
use common::xattr::{CHECKPOINT, MARKER, get_xattr, xattr_json};
use common::*;

/// Who runs the tests and which groups they move entries between.
#[derive(Clone, Copy, Debug)]
struct Ids {
    uid: u32,
    /// The group entries are made with.
    from: u32,
    /// The group applied (`--fs-group`): `from` when the user has no other group.
    to: u32,
}

impl Ids {
    fn get() -> Ids {
        let uid = rustix::process::geteuid().as_raw();
        let egid = rustix::process::getegid().as_raw();
        if uid == 0 {
            return Ids { uid, from: 0, to: 2000 };
        }
        let groups = rustix::process::getgroups().unwrap_or_default();
        let other = groups.iter().map(|g| g.as_raw()).find(|&g| g != egid);
        let ids = Ids { uid, from: egid, to: other.unwrap_or(egid) };
        if !ids.moves_groups() {
            eprintln!("uid {uid} has one group ({egid}): only modes change, no group");
        }
        ids
    }

    fn moves_groups(&self) -> bool {
        self.from != self.to
    }

    fn fs_group(&self) -> String {
        self.to.to_string()
    }
}

/// `t` with every entry made the user's own: owner `uid`, group `to` where `t` said 2000 (the
/// tests' target: those conform already) and `from` elsewhere; directories keep `u+rwx` (a
/// non-root builder must enter them); device nodes dropped (mknod needs a capability).
fn owned(t: &Tree, ids: Ids) -> Tree {
    let group = |g: u32| if g == 2000 { ids.to } else { ids.from };
    let mut out = Tree::new();
    for e in &t.entries {
        if matches!(e.node, Node::CharDev(..) | Node::BlockDev(..)) {
            continue;
        }
        let mut e = e.clone();
        if !matches!(e.node, Node::Hardlink(_)) {
            (e.uid, e.gid) = (ids.uid, group(e.gid));
        }
        if matches!(e.node, Node::Dir) {
            e.mode |= 0o700;
        }
        out.entries.push(e);
    }
    let (_, gid, mode) = t.root.unwrap_or((0, 0, 0o755));
    out.root(ids.uid, group(gid), mode | 0o700);
    out
}

/// Makes `base/outside` (what the trees' outside symlinks point to) with a canary file.
fn make_outside(base: &Path) -> PathBuf {
    let out = base.join("outside");
    std::fs::create_dir_all(&out).unwrap();
    std::fs::write(out.join("canary-file"), b"canary").unwrap();
    out
}

/// The zoo of special cases (no devices) and `n` generated entries, all the user's own; with
/// `hardlinks` false, none (`check` counts names, `apply` the changes it made: with hardlinks
/// a name may find its inode changed already).
fn big_tree(outside: &Path, seed: u64, n: usize, ids: Ids, hardlinks: bool) -> Tree {
    let mut t = Tree::new();
    t.root(0, 0, 0o755);
    t.nest("zoo", &tree::zoo(outside));
    t.nest("gen", &tree::generated(seed, n, outside, GenOpts { hardlinks, special_bits: true }));
    if !hardlinks {
        t.entries.retain(|e| !matches!(e.node, Node::Hardlink(_)));
    }
    owned(&t, ids)
}

/// `tops` top-level directories of `per_top` files each, the user's own, private modes.
fn wide_tree(ids: Ids, tops: usize, per_top: usize) -> Tree {
    let mut t = Tree::new();
    t.root(ids.uid, ids.from, 0o755);
    for d in 0..tops {
        t.dir(format!("top{d:04}"), ids.uid, ids.from, 0o700);
        for f in 0..per_top {
            t.file(format!("top{d:04}/f{f}"), ids.uid, ids.from, 0o600);
        }
    }
    t
}

/// Every entry of `vol` conforms to the kubelet's rule for group `gid`.
#[track_caller]
fn assert_all_conform(vol: &Path, gid: u32, read_only: bool, context: &str) {
    let bad: Vec<String> = snapshot(vol)
        .iter()
        .filter(|(_, m)| !conforms(m, gid, read_only))
        .map(|(k, m)| format!("{} {:?}", show(k), m.attrs()))
        .take(20)
        .collect();
    assert!(bad.is_empty(), "{context}: entries do not conform, e.g.\n  {}", bad.join("\n  "));
}

/// The startup line's `decision=` (text logs).
fn decision(r: &Run) -> String {
    let line = r.stderr.lines().find(|l| l.contains("decision=")).unwrap_or("");
    field(line, "decision").unwrap_or("").to_string()
}

// ---------------------------------------------------------------------------------------------
// apply, check and inspect against the kubelet's rule

/// The same tree twice: the kubelet's pass on one, `volprep apply` on the other, then every
/// entry's (type, owner, group, mode) is the same; nothing outside changed; `check` agrees.
#[test]
fn apply_equals_the_kubelet_rule_as_any_user() {
    let ids = Ids::get();
    let base = tempfile::tempdir().unwrap();
    let outside = make_outside(base.path());
    let t = big_tree(&outside, 11, 3_000, ids, true);
    let (want, got) = (base.path().join("reference"), base.path().join("volprep"));
    t.build(&want);
    t.build(&got);
    let outside_before = snapshot(&outside);
    assert_eq!(snapshot(&got).len(), t.len(), "snapshot sees every built entry");

    let check = pass("check", &["--fs-group", &ids.fs_group()], &got).expect_code(3);
    kubelet_reference(&want, ids.to, false, Mounts::Skip);
    let run = apply_fs_group(&got, ids.to, &["--log-format", "text"]);

    assert_same(&snapshot(&want), &snapshot(&got), Meta::attrs, "kubelet reference vs volprep apply");
    assert_same(&outside_before, &snapshot(&outside), Meta::attrs_ctime, "outside the volume");
    let v = run.volume();
    assert_eq!((v["action"].as_str(), v["marker_after"].as_str()), (Some("walked"), Some("done")), "{v}");
    assert_eq!(run.count("entries"), t.len() as u64, "{}", run.describe());
    assert_eq!(run.count("errors"), 0, "{}", run.describe());
    assert!(run.count("changed_mode") > 0, "{}", run.describe());
    assert_eq!(run.count("changed_owner") > 0, ids.moves_groups(), "{}", run.describe());
    for f in ["changed_owner", "changed_mode"] {
        // Per name: a hardlink's other name may find its inode changed already.
        assert!(check.count(f) >= run.count(f), "check bounds apply's {f}\n{}", check.describe());
    }
    pass("check", &["--fs-group", &ids.fs_group()], &got).expect_code(0);
}

/// `check` and `inspect` change nothing (not a ctime) and see what `apply` then changes.
#[test]
fn check_and_inspect_change_nothing_and_see_what_apply_changes() {
    let ids = Ids::get();
    let base = tempfile::tempdir().unwrap();
    let outside = make_outside(base.path());
    let vol = base.path().join("vol");
    big_tree(&outside, 12, 500, ids, false).build(&vol);
    let before = snapshot(&vol);
    tick();
    let g = ids.fs_group();
    let check = pass("check", &["--fs-group", &g], &vol).expect_code(3);
    let out = run(volprep().args(["inspect", "--json", "--fs-group", &g]).arg(&vol)).expect_code(0);
    let inspect: serde_json::Value = serde_json::from_str(&out.stdout).expect("inspect --json");
    assert_same(&before, &snapshot(&vol), Meta::attrs_ctime, "check and inspect touched the volume");
    assert_eq!(get_xattr(&vol, MARKER), None, "check writes no marker");

    let apply = apply_fs_group(&vol, ids.to, &[]);
    let would = &inspect["fs_group"]["volprep_apply"];
    assert_eq!(would["changed_mode"].as_u64(), Some(apply.count("changed_mode")), "{inspect:#}");
    assert_eq!(would["changed_owner"].as_u64(), Some(apply.count("changed_owner")), "{inspect:#}");
    assert_eq!(check.count("changed_mode"), apply.count("changed_mode"), "{}", check.describe());
    assert_all_conform(&vol, ids.to, false, "after apply");
}

// ---------------------------------------------------------------------------------------------
// The marker

/// The first apply leaves a `done` marker for its spec; the second reads no directory and
/// changes nothing (not a ctime); a spec change walks again; drift below a conforming root is
/// trusted until `--verify full`, which repairs it.
#[test]
fn the_marker_skips_without_reading_and_a_spec_change_walks() {
    let ids = Ids::get();
    let base = tempfile::tempdir().unwrap();
    let vol = base.path().join("vol");
    let t = wide_tree(ids, 40, 50);
    t.build(&vol);
    let g = ids.fs_group();
    let first = pass("apply", &["--fs-group", &g], &vol).expect_code(0);
    assert_eq!(decision(&first), "walk", "{}", first.describe());
    let m = xattr_json(&vol, MARKER).expect("a marker after a clean pass");
    assert_eq!((m["v"].as_u64(), m["state"].as_str()), (Some(1), Some("done")), "{m}");
    assert_eq!(m["spec"], format!("fs-group={g}"), "{m}");
    assert_eq!(m["digest"], first.volume()["spec_digest"], "{m}");
    assert_eq!(m["entries"], t.len() as u64, "{m}");
    assert_eq!(get_xattr(&vol, CHECKPOINT), None, "no checkpoint after a clean pass");

    let before = snapshot(&vol);
    tick();
    let second = pass("apply", &["--fs-group", &g], &vol).expect_code(0);
    assert_eq!((decision(&second), second.volume()["action"].as_str()), ("skip".into(), Some("skipped")));
    for f in ["entries", "dirs_read", "changed_owner", "changed_mode"] {
        assert_eq!(second.count(f), 0, "{f} of a skip\n{}", second.describe());
    }
    assert_same(&before, &snapshot(&vol), Meta::attrs_ctime, "a skip touched something");
    assert_eq!(xattr_json(&vol, MARKER), Some(m), "a skip leaves the marker as it was");

    // A spec change (read-only) walks although nothing else changed, and marks the new spec.
    let ro = pass("apply", &["--fs-group", &g, "--read-only"], &vol).expect_code(0);
    assert_eq!(decision(&ro), "walk", "{}", ro.describe());
    assert!(ro.volume()["reason"].as_str().unwrap().contains("spec changed"), "{}", ro.describe());
    assert_eq!(ro.count("entries"), t.len() as u64, "{}", ro.describe());
    assert_eq!(xattr_json(&vol, MARKER).unwrap()["spec"], format!("fs-group={g} read-only"));

    // Drift below the root: trusted by the marker, repaired by --verify full.
    let f = vol.join("top0007/f3");
    std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).unwrap();
    let args = ["--fs-group", &g, "--read-only"];
    assert_eq!(pass("apply", &args, &vol).expect_code(0).volume()["action"], "skipped");
    let full = pass("apply", &[&args[..], &["--verify", "full"]].concat(), &vol).expect_code(0);
    assert_eq!((full.count("changed_owner"), full.count("changed_mode")), (0, 1), "{}", full.describe());
    assert_eq!(std::fs::metadata(&f).unwrap().mode() & 0o7777, 0o640);
    assert_all_conform(&vol, ids.to, true, "after --verify full");
}

/// A pass SIGKILLed once its checkpoint names finished subtrees (no test hook: a pass slowed by
/// `--max-ops`, killed from outside) resumes: the next run skips those subtrees, reads fewer
/// entries than the volume holds, and every entry conforms at `done`.
#[test]
fn a_pass_killed_midway_resumes_and_ends_done() {
    let ids = Ids::get();
    let base = tempfile::tempdir().unwrap();
    let vol = base.path().join("vol");
    let t = wide_tree(ids, 200, 30);
    t.build(&vol);
    let g = ids.fs_group();
    let mut cmd = volprep();
    cmd.args(["apply", "--fs-group", &g, "--max-ops", "2000", "--threads", "2", "--checkpoint-interval", "100ms"]);
    cmd.args(["--progress-interval", "0"]).arg(&vol).stdout(Stdio::null()).stderr(Stdio::piped());
    let mut child = KillOnDrop(cmd.spawn().expect("spawn volprep"));
    let deadline = Instant::now() + Duration::from_secs(60);
    let killed_with = loop {
        let cp = get_xattr(&vol, CHECKPOINT).map(|b| String::from_utf8_lossy(&b).into_owned());
        if let Some(cp) = cp.filter(|c| c.contains("@")) {
            child.0.kill().expect("SIGKILL the pass");
            break cp;
        }
        assert!(child.0.try_wait().unwrap().is_none(), "the pass ended before its first checkpoint");
        assert!(Instant::now() < deadline, "no checkpoint within 60 s");
        std::thread::sleep(Duration::from_millis(20));
    };
    let status = child.0.wait().unwrap();
    assert_eq!(status.signal(), Some(libc::SIGKILL), "killed midway: {status}");
    assert_eq!(xattr_json(&vol, MARKER).unwrap()["state"], "in-progress", "checkpoint: {killed_with}");

    let r = pass("apply", &["--fs-group", &g], &vol).expect_code(0);
    assert_eq!(decision(&r), "resume", "{}", r.describe());
    assert!(r.count("skipped_subtrees") > 0, "{}", r.describe());
    assert!(r.count("entries") < t.len() as u64, "finished subtrees are not read again\n{}", r.describe());
    assert_eq!(r.volume()["marker_after"], "done", "{}", r.describe());
    assert_eq!(get_xattr(&vol, CHECKPOINT), None, "the checkpoint goes with done");
    assert_all_conform(&vol, ids.to, false, "after the resumed pass");
    pass("check", &["--fs-group", &g], &vol).expect_code(0);
}

// ---------------------------------------------------------------------------------------------
// --sticky

/// `--sticky` makes a missing directory, and an existing open one, a shared temp dir (01777),
/// and changes nothing else; `check` then finds nothing to do.
#[test]
fn sticky_makes_shared_temp_dirs() {
    let base = tempfile::tempdir().unwrap();
    let (made, open) = (base.path().join("tmp-new"), base.path().join("tmp-open"));
    std::fs::create_dir(&open).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
    std::fs::write(open.join("inside"), b"x").unwrap();
    let inside = std::fs::metadata(open.join("inside")).unwrap();
    let sticky = |cmd: &str| {
        let mut c = volprep();
        c.arg(cmd).arg("--sticky").arg(&made).arg("--sticky").arg(&open).args(["--report", "-"]);
        run(&mut c)
    };
    let r = sticky("check");
    assert_eq!(r.code, 3, "check sees work\n{}", r.describe());
    assert!(!made.exists(), "check creates nothing");
    sticky("apply").expect_code(0);
    for d in [&made, &open] {
        assert_eq!(std::fs::metadata(d).unwrap().mode() & 0o7777, 0o1777, "{}", d.display());
    }
    let after = std::fs::metadata(open.join("inside")).unwrap();
    assert_eq!((after.mode(), after.ctime(), after.ctime_nsec()), (inside.mode(), inside.ctime(), inside.ctime_nsec()));
    sticky("check").expect_code(0);
}

// ---------------------------------------------------------------------------------------------
// A short fuzzer

/// Random small trees and specs, passes SIGKILLed after a random delay, random changes between
/// runs; whenever the marker says `done`, every entry conforms and `check` exits 0.
/// `VOLPREP_CORE_FUZZ_ROUNDS` (default 12) and `VOLPREP_CORE_FUZZ_SEED` change the run.
#[test]
fn short_fuzz_done_means_every_entry_conforms() {
    let ids = Ids::get();
    let env = |k: &str, d: u64| std::env::var(k).ok().and_then(|v| v.parse().ok()).unwrap_or(d);
    let seed = env("VOLPREP_CORE_FUZZ_SEED", 0x636f_7265);
    let rounds = env("VOLPREP_CORE_FUZZ_ROUNDS", 12);
    let base = tempfile::tempdir().unwrap();
    let outside = make_outside(base.path());
    let outside_before = snapshot(&outside);
    for round in 0..rounds {
        let mut rng = Rng::new(seed ^ round.wrapping_mul(0x9e37_79b9_7f4a_7c15));
        let vol = base.path().join(format!("r{round}"));
        owned(&tree::generated(rng.next_u64(), 200 + rng.below(1500), &outside, GenOpts::default()), ids).build(&vol);
        let read_only = rng.below(3) == 0;
        let mut args =
            vec!["--fs-group".to_string(), ids.fs_group(), "--threads".into(), (1 + rng.below(8)).to_string()];
        if read_only {
            args.push("--read-only".into());
        }
        let what = format!("seed {seed:#x} round {round} args {args:?}");
        for step in 0..3 {
            if rng.below(2) == 0 {
                kill_after(&vol, &args, Duration::from_millis(rng.below(30) as u64));
            }
            // A mode changed after its entry was seen is drift, which a `done` marker and a
            // resume's finished subtrees trust until `--verify full` (a new or moved entry
            // changes its directory, which they do not trust).
            let drift = mutate(&mut rng, &vol, ids);
            let full = if drift || rng.below(2) == 0 { &["--verify", "full"][..] } else { &[] };
            let argv: Vec<&str> = args.iter().map(String::as_str).chain(full.iter().copied()).collect();
            let mut r = pass("apply", &argv, &vol);
            if r.code == 1 && r.stderr.contains("not restored automatically") {
                // A SIGKILL between a setuid file's chown and chmod: the bit is not restored
                // from the record on the app-writable root; the run exits 1 and says to chmod
                // or to run `--force` once (docs/reference.md), which the operator would do.
                let forced: Vec<&str> = argv.iter().copied().chain(["--force"]).collect();
                r = pass("apply", &forced, &vol);
            }
            assert_eq!(r.code, 0, "{what} step {step}\n{}", r.describe());
            if full.is_empty() && r.volume()["action"] == "skipped" {
                continue; // Drift below a done root is trusted without --verify full.
            }
            assert_eq!(xattr_json(&vol, MARKER).unwrap()["state"], "done", "{what} step {step}");
            assert_all_conform(&vol, ids.to, read_only, &format!("{what} step {step}"));
            let check: Vec<&str> = args.iter().map(String::as_str).collect();
            pass("check", &check, &vol).expect_code(0);
        }
        assert_same(&outside_before, &snapshot(&outside), Meta::attrs_ctime, &format!("outside, {what}"));
    }
    eprintln!("{rounds} rounds from seed {seed:#x}");
}

/// Starts `apply ARGS VOL` and SIGKILLs it after `delay` (if it is still running).
fn kill_after(vol: &Path, args: &[String], delay: Duration) {
    let mut cmd = volprep();
    cmd.arg("apply").args(args).args(["--checkpoint-interval", "1ms"]).arg(vol);
    let mut child = KillOnDrop(cmd.stdout(Stdio::null()).stderr(Stdio::null()).spawn().expect("spawn volprep"));
    std::thread::sleep(delay);
    let _ = child.0.kill();
    let status = child.0.wait().unwrap();
    assert!(status.success() || status.signal() == Some(libc::SIGKILL), "a pass ends done or killed: {status}");
}

/// A few random changes below `vol`: private modes, a new file, a directory renamed. True when
/// a mode was changed (drift).
fn mutate(rng: &mut Rng, vol: &Path, ids: Ids) -> bool {
    let mut dirs = vec![vol.to_path_buf()];
    let mut files = Vec::new();
    let mut i = 0;
    while i < dirs.len() {
        for e in std::fs::read_dir(&dirs[i]).unwrap() {
            let e = e.unwrap();
            let ft = e.file_type().unwrap();
            if ft.is_dir() {
                dirs.push(e.path());
            } else if ft.is_file() {
                files.push(e.path());
            }
        }
        i += 1;
    }
    let mut drift = false;
    for _ in 0..rng.below(4) {
        if let Some(f) = files.get(rng.below(files.len().max(1))) {
            drift |= std::fs::set_permissions(f, std::fs::Permissions::from_mode(0o600)).is_ok();
        }
    }
    if rng.below(2) == 0 {
        let d = &dirs[rng.below(dirs.len())];
        let f = d.join(format!("new{}", rng.next_u64()));
        std::fs::write(&f, b"n").unwrap();
        std::os::unix::fs::chown(&f, Some(ids.uid), Some(ids.from)).unwrap();
    }
    if dirs.len() > 2 && rng.below(2) == 0 {
        let d = &dirs[1 + rng.below(dirs.len() - 1)];
        let _ = std::fs::rename(d, vol.join(format!("moved{}", rng.next_u64())));
    }
    drift
}
