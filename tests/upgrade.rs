//! Upgrades and rollbacks (docs/upgrade.md), as any user on plain temp dirs: a `done` marker
//! written by an earlier version, byte for byte, lets this version skip the volume, since the
//! spec digest of marker format 1 is pinned; removing volprep's attributes (docs/upgrade.md's
//! `volprep clear` block, run as written) leaves a volume the next `apply` walks afresh.

mod common;

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use common::xattr::{CHECKPOINT, MARKER, get_xattr, set_xattr};
use common::*;
use sha2::Digest as _;

/// The `done` marker volprep 0.1.0 writes for `--fs-group 2000` on a 2-entry volume, byte for
/// byte (read with `getfattr -n user.volprep --only-values`).
const MARKER_0_1_0_FS_GROUP_2000: &[u8] = br#"{"v":1,"state":"done","digest":"5a8810073d7c0a3d","spec":"fs-group=2000","run":"61ee0094a8cf-25706@vm","started":1796524700,"finished":1796524700,"entries":2}"#;

/// The spec digest of marker format 1 for `--fs-group GID` (kubelet modes, not read-only):
/// the first 16 hex digits of the SHA-256 of the spec's canonical words.
fn digest_v1(gid: u32) -> String {
    let canonical = format!("volprep-spec/1 gid={gid} uid=- file_mask=660 dir_mask=2770");
    sha2::Sha256::digest(canonical.as_bytes()).iter().take(8).map(|b| format!("{b:02x}")).collect()
}

/// The 0.1.0 marker for `--fs-group gid`: the fixture itself for 2000, else the fixture with
/// the group's words and digest (a user without group 2000 can only test its own).
fn marker_0_1_0(gid: u32) -> Vec<u8> {
    let text = std::str::from_utf8(MARKER_0_1_0_FS_GROUP_2000).unwrap();
    text.replace("5a8810073d7c0a3d", &digest_v1(gid)).replace("fs-group=2000", &format!("fs-group={gid}")).into_bytes()
}

/// The group the tests apply: 2000 as root (the fixture as it is), else the user's own.
fn group() -> u32 {
    if rustix::process::geteuid().is_root() { 2000 } else { rustix::process::getegid().as_raw() }
}

/// A 2-entry volume already prepared for `--fs-group gid`: root 2770, one file 0660.
fn prepared(base: &Path, gid: u32) -> std::path::PathBuf {
    let vol = base.join("vol");
    let me = rustix::process::geteuid().as_raw();
    let mut t = Tree::new();
    t.root(me, gid, 0o2770).file("data", me, gid, 0o660);
    t.build(&vol);
    vol
}

#[test]
fn the_spec_digests_of_marker_format_1_do_not_change() {
    assert_eq!(digest_v1(2000), "5a8810073d7c0a3d", "the fixture's digest follows the formula");
    let base = tempfile::tempdir().unwrap();
    let gid = group();
    let vol = prepared(base.path(), gid);
    let r = pass("check", &["--fs-group", &gid.to_string()], &vol).expect_code(0);
    assert_eq!(r.volume()["spec_digest"].as_str(), Some(digest_v1(gid).as_str()), "{}", r.describe());
}

/// A `done` marker of 0.1.0 (format 1) on a volume that conforms: this version skips it without
/// reading a directory, and leaves the marker's bytes as they were.
#[test]
fn a_done_marker_of_0_1_0_is_skipped_without_a_walk() {
    let base = tempfile::tempdir().unwrap();
    let gid = group();
    let vol = prepared(base.path(), gid);
    let old = marker_0_1_0(gid);
    set_xattr(&vol, MARKER, &old);
    let r = pass("apply", &["--fs-group", &gid.to_string()], &vol).expect_code(0);
    let v = r.volume();
    assert_eq!((v["action"].as_str(), v["marker_before"].as_str()), (Some("skipped"), Some("done")), "{v}");
    assert_eq!((r.count("entries"), r.count("dirs_read")), (0, 0), "{}", r.describe());
    assert_eq!(get_xattr(&vol, MARKER), Some(old), "the marker stays as 0.1.0 wrote it");
    let status = run(volprep().args(["status", "--json"]).arg(&vol)).expect_code(0);
    assert!(status.stdout.contains("\"done\""), "{}", status.describe());
}

/// Going back to the kubelet's `fsGroup`: removing volprep's attributes from the root (what
/// `setfattr -x user.volprep ROOT` does) leaves no trace `status` shows, and a later `apply`
/// walks the volume afresh (`no marker`).
#[test]
fn removing_the_attributes_leaves_a_volume_walked_afresh() {
    let base = tempfile::tempdir().unwrap();
    let gid = group();
    let vol = prepared(base.path(), gid);
    let g = gid.to_string();
    pass("apply", &["--fs-group", &g], &vol).expect_code(0);
    assert!(get_xattr(&vol, MARKER).is_some());
    for name in [MARKER, CHECKPOINT] {
        remove_xattr(&vol, name);
    }
    let status = run(volprep().args(["status", "--json"]).arg(&vol)).expect_code(0);
    assert!(!status.stdout.contains("\"done\""), "{}", status.describe());
    let r = pass("apply", &["--fs-group", &g], &vol).expect_code(0);
    assert_eq!(r.volume()["marker_before"], "none", "{}", r.describe());
    assert!(r.volume()["reason"].as_str().unwrap().contains("no marker"), "{}", r.describe());
}

/// `lremovexattr`; an attribute already absent is fine.
fn remove_xattr(path: &Path, name: &str) {
    let (p, n) = (CString::new(path.as_os_str().as_bytes()).unwrap(), CString::new(name).unwrap());
    // SAFETY: `p` and `n` are valid C strings alive across the call.
    if unsafe { libc::lremovexattr(p.as_ptr(), n.as_ptr()) } != 0 {
        let e = std::io::Error::last_os_error();
        assert_eq!(e.raw_os_error(), Some(libc::ENODATA), "removexattr {name}: {e}");
    }
}

/// Back to an earlier version after a later one wrote a marker of a format it does not know:
/// it never skips on it; it walks once (changing only what differs) and writes its own.
#[test]
fn a_marker_of_a_later_format_is_walked_once_never_trusted() {
    let base = tempfile::tempdir().unwrap();
    let gid = group();
    let vol = prepared(base.path(), gid);
    let later = String::from_utf8(marker_0_1_0(gid)).unwrap().replace(r#""v":1"#, r#""v":2"#);
    set_xattr(&vol, MARKER, later.as_bytes());
    let g = gid.to_string();
    let r = pass("apply", &["--fs-group", &g], &vol).expect_code(0);
    let v = r.volume();
    assert_eq!(v["action"], "walked", "{}", r.describe());
    assert!(v["reason"].as_str().unwrap().contains("format 2"), "{}", r.describe());
    assert_eq!((r.count("changed_owner"), r.count("changed_mode")), (0, 0), "{}", r.describe());
    assert_eq!(common::xattr::xattr_json(&vol, MARKER).unwrap()["v"], 1, "its own format now");
    let again = pass("apply", &["--fs-group", &g], &vol).expect_code(0);
    assert_eq!(again.volume()["action"], "skipped", "{}", again.describe());
}

/// docs/upgrade.md's removal block, as written, on a prepared volume with a checkpoint too:
/// `clear --dry-run` lists the attributes, `clear` removes them, and `volprep status` then finds
/// no marker.
#[test]
fn the_documented_removal_block_removes_the_marker() {
    let doc = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/upgrade.md")).unwrap();
    let at = doc.find("<!-- rollback: tested -->\n```sh\n").expect("docs/upgrade.md: the rollback block");
    let body = &doc[at..][doc[at..].find("```sh\n").unwrap() + 6..];
    let block = &body[..body.find("\n```").expect("end of block")];
    let base = tempfile::tempdir().unwrap();
    let gid = group();
    let vol = prepared(base.path(), gid);
    pass("apply", &["--fs-group", &gid.to_string()], &vol).expect_code(0);
    set_xattr(&vol, CHECKPOINT, b"{}");
    let bin = Path::new(env!("CARGO_BIN_EXE_volprep")).parent().unwrap();
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default());
    let mut sh = std::process::Command::new("bash");
    sh.args(["-euo", "pipefail", "-c", block]).env("ROOT", &vol).env("PATH", path);
    for (k, _) in std::env::vars_os() {
        if k.as_bytes().starts_with(b"VOLPREP_") {
            sh.env_remove(k);
        }
    }
    let out = run(&mut sh).expect_code(0);
    let listed = "would remove 2 volprep attribute(s): user.volprep, user.volprep.checkpoint";
    assert!(out.stderr.contains(listed), "the dry run lists them\n{}", out.describe());
    assert!(out.stderr.contains("removed 2 volprep attribute(s)"), "clear removes them\n{}", out.describe());
    assert!(out.stdout.contains("no marker"), "status finds none\n{}", out.describe());
    assert_eq!((get_xattr(&vol, MARKER), get_xattr(&vol, CHECKPOINT)), (None, None));
}
