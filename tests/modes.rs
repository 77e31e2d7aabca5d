//! `--modes app-safe` on a real filesystem: a volume an earlier kubelet widened (dirs 2770,
//! files 0660) gets its app-private paths back to what their apps accept, everything else gets
//! the kubelet's bits or keeps a private mode, the log and report say what was tightened, the
//! marker keeps the policy, and `inspect` names the app paths. Run as any user (a non-root
//! pass changes its own entries, with its own group); the test of other uids' entries needs
//! root.

mod common;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use common::{pass, privileged, run, volprep};

/// Entries of the widened volume: path, directory?, mode as the kubelet left it, mode after
/// app-safe.
const WIDENED: &[(&str, bool, u32, u32)] = &[
    ("", true, 0o2770, 0o2750), // the home holding .ssh: no group write
    (".ssh", true, 0o2770, 0o2700),
    (".ssh/id_ed25519", false, 0o660, 0o600),
    (".ssh/id_ed25519.pub", false, 0o664, 0o664),
    (".ssh/known_hosts", false, 0o660, 0o660),
    (".ssh/authorized_keys", false, 0o660, 0o640),
    (".ssh/config", false, 0o660, 0o640),
    (".erlang.cookie", false, 0o660, 0o600),
    (".pgpass", false, 0o660, 0o600),
    ("pgdata", true, 0o2770, 0o2750),
    ("pgdata/PG_VERSION", false, 0o660, 0o660),
    ("pgdata/global", true, 0o2770, 0o2770),
    ("pgdata/base", true, 0o2770, 0o2770),
    ("pgdata/base/5", true, 0o2770, 0o2770), // a database: PG_VERSION but no global/
    ("pgdata/base/5/PG_VERSION", false, 0o660, 0o660),
    ("pgdata/server.key", false, 0o660, 0o600),
    ("gnupg", true, 0o2770, 0o2700),
    ("gnupg/pubring.kbx", false, 0o660, 0o660),
    ("gnupg/private-keys-v1.d", true, 0o2770, 0o2700),
    ("etcd", true, 0o2770, 0o2700),
    ("etcd/member", true, 0o2770, 0o2700),
    ("etcd/member/wal", true, 0o2770, 0o2700),
    ("etcd/member/snap", true, 0o2770, 0o2700),
    ("etcd/member/snap/db", false, 0o660, 0o660),
    // Not app paths: the kubelet's bits, or a private mode kept.
    ("shared", true, 0o755, 0o2775),
    ("shared/notes", false, 0o640, 0o660),
    ("private", true, 0o700, 0o700),
    ("private/secret", false, 0o600, 0o600),
    ("member", true, 0o2770, 0o2770),     // no wal/ or snap/: not etcd's
    ("keys/id_rsa", false, 0o660, 0o660), // a key outside .ssh: not recognised
];

/// The entries tightened (mode after < mode before).
fn tightened() -> usize {
    WIDENED.iter().filter(|(_, _, before, after)| before & !after != 0).count()
}

fn build(root: &Path) {
    for (rel, dir, mode, _) in WIDENED {
        let p = root.join(rel);
        if let Some(parent) = p.parent() {
            std::fs::create_dir_all(parent).unwrap();
        }
        if *dir {
            std::fs::create_dir_all(&p).unwrap();
        } else {
            std::fs::write(&p, "x").unwrap();
        }
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(*mode)).unwrap();
    }
    // Parents made on the way (keys/) are the app's, private.
    std::fs::set_permissions(root.join("keys"), std::fs::Permissions::from_mode(0o700)).unwrap();
}

fn mode_of(p: &Path) -> u32 {
    std::fs::symlink_metadata(p).unwrap().mode() & 0o7777
}

fn gid() -> String {
    rustix::process::getegid().as_raw().to_string()
}

#[test]
fn app_safe_repairs_a_widened_volume_and_says_what_it_tightened() {
    let dir = tempfile::tempdir().unwrap();
    let vol = dir.path().join("home");
    build(&vol);
    let gid = gid();
    let run1 = pass("apply", &["--fs-group", &gid, "--modes", "app-safe"], &vol).expect_code(0);
    for (rel, _, before, after) in WIDENED {
        let got = mode_of(&vol.join(rel));
        assert_eq!(got, *after, "{rel:?}: {before:o} became {got:o}, want {after:o}\n{}", run1.describe());
    }
    let v = run1.volume();
    assert_eq!(v["spec"], format!("fs-group={gid} modes=app-safe"));
    assert_eq!(v["tightened"], tightened() as u64, "{}", run1.describe());
    let listed: Vec<&str> =
        v["tightened_list"].as_array().unwrap().iter().map(|t| t["app"].as_str().unwrap()).collect();
    for app in ["PostgreSQL data directory", "OpenSSH private key", "Erlang cookie", "etcd member directory"] {
        assert!(listed.contains(&app), "{app} in {listed:?}");
    }
    let lines = run1.stderr.lines().filter(|l| l.contains(" INFO tightened ")).count();
    assert_eq!(lines, tightened(), "a log line per entry tightened:\n{}", run1.stderr);
    assert!(run1.stderr.contains("tightened PostgreSQL data directory 2770 -> 2750: PostgreSQL wants 0700 or 0750"));
    assert!(run1.stderr.contains(&format!("tightened {} app-private path(s)", tightened())), "the summary says so");

    // The marker keeps the policy: the same spec skips, the kubelet's rule walks (and widens
    // again), and app-safe after it walks and tightens again.
    let again = pass("apply", &["--fs-group", &gid, "--modes", "app-safe"], &vol).expect_code(0);
    assert_eq!(again.volume()["action"], "skipped", "{}", again.describe());
    let kubelet = pass("apply", &["--fs-group", &gid], &vol).expect_code(0);
    assert_eq!(kubelet.volume()["action"], "walked", "{}", kubelet.describe());
    assert!(kubelet.volume()["reason"].as_str().unwrap().contains("spec"), "{}", kubelet.describe());
    assert_eq!(mode_of(&vol.join("pgdata")), 0o2770, "the kubelet's rule widens it again");
    let check = pass("check", &["--fs-group", &gid, "--modes", "app-safe"], &vol).expect_code(3);
    assert_eq!(check.volume()["tightened"], tightened() as u64);
    assert!(check.stderr.contains("would tighten"), "{}", check.stderr);
    assert_eq!(mode_of(&vol.join("pgdata")), 0o2770, "check changes nothing");
}

#[test]
fn inspect_names_the_app_paths_and_what_each_setting_leaves() {
    let dir = tempfile::tempdir().unwrap();
    let vol = dir.path().join("home");
    build(&vol);
    let gid = gid();
    let out = run(volprep().args(["inspect", "--fs-group", &gid]).arg(&vol)).expect_code(0);
    let line = |start: &str| {
        out.stdout.lines().find(|l| l.starts_with(start)).unwrap_or_else(|| panic!("{start:?}:\n{}", out.stdout))
    };
    let pg = line("pgdata ");
    for part in ["PostgreSQL data directory", "2770", "2770 (refuses)", "--modes app-safe: 2750"] {
        assert!(pg.contains(part), "{part:?} in {pg:?}");
    }
    assert!(line("gnupg ").contains("(warns)"), "GnuPG only warns");
    assert!(line(".ssh/id_ed25519 ").contains("OpenSSH private key"));
    assert!(!out.stdout.lines().any(|l| l.starts_with("pgdata/base/5 ")), "a database directory is no data directory");
    assert!(!out.stdout.lines().any(|l| l.starts_with("keys/id_rsa ")), "a key outside .ssh is not known");

    let uid = rustix::process::geteuid().as_raw().to_string();
    let json = run(volprep().args(["inspect", "--json", "--owner", &uid]).arg(&vol)).expect_code(0);
    let doc: serde_json::Value = serde_json::from_str(&json.stdout).unwrap();
    assert_eq!(doc["app_paths"]["count"], tightened() as u64, "{}", json.stdout);
    let data = doc["app_paths"]["examples"].as_array().unwrap().iter().find(|e| e["path"] == "pgdata").unwrap();
    assert_eq!(data["with_spec"]["mode"], "2770", "--owner alone leaves the widened mode");
    assert_eq!(data["with_spec"]["app"], "refuses");
    assert_eq!((data["app_safe"]["mode"].as_str(), data["app_safe"]["app"].as_str()), (Some("2750"), Some("accepts")));
}

/// Bits are removed only on entries owned by the uid owning the app's path: a root-owned key in
/// a home of uid 2000 keeps its mode (so does PostgreSQL's root-owned server.key, which it
/// accepts at 0640); with --owner, everything is the app's and is tightened.
#[test]
#[ignore = "needs root and loop devices"]
fn app_safe_never_tightens_another_uids_entries() {
    privileged(&[]);
    let fs = common::Tmpfs::new();
    let vol = fs.path().join("home");
    build(&vol);
    let chown = |rel: &str, uid: u32| std::os::unix::fs::lchown(vol.join(rel), Some(uid), Some(uid)).unwrap();
    for (rel, ..) in WIDENED {
        chown(rel, 2000);
    }
    chown("keys", 2000);
    chown(".ssh/id_ed25519", 0);
    chown("pgdata/server.key", 0);
    std::fs::set_permissions(vol.join("pgdata/server.key"), std::fs::Permissions::from_mode(0o640)).unwrap();
    let out = pass("apply", &["--fs-group", "2000", "--modes", "app-safe"], &vol).expect_code(0);
    assert_eq!(mode_of(&vol.join(".ssh/id_ed25519")), 0o660, "root's key in uid 2000's .ssh: left\n{}", out.describe());
    assert_eq!(mode_of(&vol.join("pgdata/server.key")), 0o640, "root's key: neither tightened nor widened");
    assert_eq!(mode_of(&vol.join(".ssh/config")), 0o640, "the app's own: tightened");
    assert_eq!(out.volume()["tightened"], tightened() as u64 - 2);

    // With --owner the owner changes first, and every app path is the app's.
    let out = pass("apply", &["--owner", "2000", "--fs-group", "2000", "--modes", "app-safe"], &vol).expect_code(0);
    assert_eq!(mode_of(&vol.join(".ssh/id_ed25519")), 0o600, "{}", out.describe());
    assert_eq!(mode_of(&vol.join("pgdata/server.key")), 0o600);
}

/// A sharded app-safe pass: the run that completes the volume checks the other shards' parts
/// again where they changed after their claim, and what it tightens there is in its report (count
/// and list), as for the entries of its own part.
#[test]
fn a_shards_check_of_the_other_parts_reports_what_it_tightened() {
    let dir = tempfile::tempdir().unwrap();
    let vol = dir.path().join("vol");
    for top in ["a", "b"] {
        std::fs::create_dir_all(vol.join(top)).unwrap();
        std::fs::write(vol.join(top).join("f"), "x").unwrap();
        std::fs::set_permissions(vol.join(top).join("f"), std::fs::Permissions::from_mode(0o644)).unwrap();
    }
    let gid = gid();
    let shard = |i: u32| {
        pass(
            "apply",
            &["--fs-group", &gid, "--modes", "app-safe", "--shard-depth", "1", "--shard", &format!("{i}/2")],
            &vol,
        )
    };
    let first = shard(0).expect_code(0);
    // Shard 0's part is the top directory its pass changed.
    let mine: Vec<&str> = ["a", "b"].into_iter().filter(|t| mode_of(&vol.join(t).join("f")) == 0o664).collect();
    assert_eq!(mine.len(), 1, "one top directory per shard\n{}", first.describe());
    // After shard 0's claim, an Erlang cookie the kubelet's rule would have widened lands there.
    let cookie = vol.join(mine[0]).join(".erlang.cookie");
    std::fs::write(&cookie, "secret").unwrap();
    std::fs::set_permissions(&cookie, std::fs::Permissions::from_mode(0o660)).unwrap();
    let last = shard(1).expect_code(0);
    assert_eq!(mode_of(&cookie), 0o600, "tightened by the check of shard 0's part\n{}", last.describe());
    let v = last.volume();
    assert_eq!(v["tightened"], 1, "{}", last.describe());
    assert_eq!(v["tightened_list"][0]["app"], "Erlang cookie", "{}", last.describe());
}
