//! The mixed-owner volume of the unprivileged mode's tests (run on the host as the app's user,
//! and in the image as a `restricted` init container): the tree, what a pass as the app must
//! leave and list, and the checks of what it did.

use std::collections::BTreeSet;
use std::path::Path;

use super::snap::{self, Kind, Meta, Snapshot, kubelet_target};
use super::tree::Tree;

/// The app's uid and gid.
pub const APP: u32 = 1000;
/// The spec's group: the pod's `supplementalGroups: [2000]`.
pub const GROUP: u32 = 2000;

/// The mixed-owner volume: the app's entries in every shape, root's and another user's, some
/// of them already conforming, one directory the app may not read.
pub fn mixed_tree() -> Tree {
    let mut t = Tree::new();
    t.dir("app", APP, APP, 0o750)
        .file("app/data", APP, APP, 0o600)
        .file("app/conf", APP, GROUP, 0o660)
        .dir("app/sub", APP, 0, 0o700)
        .file("app/sub/deep", APP, 0, 0o644)
        .file("app/suid", APP, APP, 0o4755)
        .file("app/sgid", APP, APP, 0o2755)
        .fifo("app/fifo", APP, APP, 0o600)
        .symlink("app/link", "/etc", APP, APP)
        .file("top-file", APP, APP, 0o640)
        .file("root-file", 0, 0, 0o644)
        .dir("root-dir", 0, 0, 0o700)
        .file("root-dir/secret", 0, 0, 0o600)
        .dir("shared", 0, GROUP, 0o2770)
        .file("shared/ok", 0, GROUP, 0o660)
        .file("shared/mine", APP, APP, 0o600)
        .dir("other", 1001, 1001, 0o755)
        .file("other/x", 1001, 1001, 0o644)
        .file("other/mine", APP, APP, 0o644)
        .symlink("other/link", "x", 1001, 1001)
        .root(APP, APP, 0o755);
    t
}

/// The entries of other users in `mixed_tree` on an ext4 (its root-owned `lost+found`
/// included) that do not conform and that the app can see: what must be listed (`true`: a
/// directory it may not read).
pub fn expected_left() -> BTreeSet<(String, bool)> {
    [("root-file", false), ("root-dir", true), ("other", false), ("other/x", false), ("other/link", false)]
        .into_iter()
        .chain([("lost+found", true)])
        .map(|(p, u)| (p.to_string(), u))
        .collect()
}

/// May a process of uid `APP` with the groups `APP` and `groups` list and enter this directory?
fn app_may_read(m: &Meta, groups: &[u32]) -> bool {
    let bits = if m.uid == APP {
        m.mode >> 6
    } else if m.gid == APP || groups.contains(&m.gid) {
        m.mode >> 3
    } else {
        m.mode
    };
    bits & 0o5 == 0o5
}

/// What a pass as the app (supplementary `groups`) for group `gid` must leave, from a root's
/// view of the volume (`before`): the entries of other users that do not conform and that the
/// app can reach, as (path, a directory it may not read).
pub fn left_by_app(before: &Snapshot, gid: u32, groups: &[u32]) -> BTreeSet<(String, bool)> {
    let unreadable: Vec<&[u8]> = before
        .iter()
        .filter(|(_, m)| m.kind == Kind::Dir && !app_may_read(m, groups))
        .map(|(p, _)| p.as_slice())
        .collect();
    let hidden = |p: &[u8]| {
        unreadable.iter().any(|d| *d != snap::ROOT && p.len() > d.len() && p.starts_with(d) && p[d.len()] == b'/')
    };
    before
        .iter()
        .filter(|(p, m)| m.uid != APP && !snap::conforms(m, gid, false) && !hidden(p))
        .map(|(p, _)| (String::from_utf8_lossy(p).into_owned(), unreadable.contains(&p.as_slice())))
        .collect()
}

/// A report volume's `foreign_owned_list`, as (path relative to `root`, `.` for the root;
/// unread). `root` is the volume as the process saw it.
pub fn listed(volume: &serde_json::Value, root: &Path) -> BTreeSet<(String, bool)> {
    let prefix = format!("{}/", root.display());
    volume["foreign_owned_list"]
        .as_array()
        .unwrap_or_else(|| panic!("no foreign_owned_list in {volume}"))
        .iter()
        .map(|e| {
            let path = e["path"].as_str().expect("path");
            let rel = match path.strip_prefix(&prefix) {
                _ if Path::new(path) == root => ".",
                Some(rel) => rel,
                None => panic!("{path} is not below {prefix}"),
            };
            (rel.to_string(), e["unread"].as_bool().unwrap_or(false))
        })
        .collect()
}

/// Every entry of `foreign_owned_list` shows the entry as it is in `before` and what a
/// privileged run would make of it (the kubelet's rule for `gid`).
pub fn assert_listed_as_they_are(volume: &serde_json::Value, root: &Path, before: &Snapshot, gid: u32) {
    let prefix = format!("{}/", root.display());
    for e in volume["foreign_owned_list"].as_array().expect("foreign_owned_list") {
        let rel = e["path"].as_str().unwrap().strip_prefix(&prefix).unwrap().to_string();
        let m = before[rel.as_bytes()];
        let (_, want_gid, want_mode) = kubelet_target(&m, gid, false);
        assert_eq!(
            (e["uid"].as_u64(), e["gid"].as_u64(), e["mode"].as_str()),
            (Some(m.uid.into()), Some(m.gid.into()), Some(format!("{:04o}", m.mode).as_str())),
            "{rel}: listed as it is"
        );
        assert_eq!(e["want_gid"].as_u64(), Some(want_gid.into()), "{rel}: what a privileged run would do");
        let mode = (want_mode != m.mode).then(|| format!("{want_mode:04o}"));
        assert_eq!(e["want_mode"].as_str(), mode.as_deref(), "{rel}");
    }
}

/// Every entry of the app in `before` is in `after` exactly as the kubelet would leave it for
/// `gid`; every other entry is untouched, ctime included. Returns how many are the app's.
pub fn assert_app_fixed_others_untouched(before: &Snapshot, after: &Snapshot, gid: u32, context: &str) -> usize {
    assert_eq!(after.keys().collect::<Vec<_>>(), before.keys().collect::<Vec<_>>(), "{context}: same entries");
    let mut fixed = 0;
    for (path, a) in after {
        let b = before[path];
        if b.uid == APP {
            let (uid, gid, mode) = kubelet_target(&b, gid, false);
            let want = (uid, gid, snap::Octal(mode));
            assert_eq!((a.uid, a.gid, snap::Octal(a.mode)), want, "{context}: {}", snap::show(path));
            fixed += 1;
        } else {
            let what = "another user's entry must not change";
            assert_eq!(a.attrs_ctime(), b.attrs_ctime(), "{context}: {}: {what}", snap::show(path));
        }
    }
    fixed
}
