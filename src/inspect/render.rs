//! What `inspect` found, as one JSON document (the key names are a stable interface) or as
//! aligned tables for a terminal.

use std::fmt;

use serde::Serialize;

use crate::escape::EscapedPath;
use crate::report::EntryError;
use crate::spec::Ownership;

/// The JSON document `inspect --json` prints. Paths inside the volume are relative to its root
/// (the root itself is "."), escaped like every path volprep prints.
#[derive(Debug, Serialize)]
pub struct Inspection {
    pub version: u32,
    pub path: EscapedPath,
    pub threads: usize,
    #[serde(flatten)]
    pub seen: Kinds,
    /// The kubelet's mode bits for non-directories and directories (`lacking_group_bits`), in
    /// octal: "0660" and "2770" ("0440" and "2550" with `--read-only`).
    pub file_mask: String,
    pub dir_mask: String,
    /// The mode policy of the previews (`--modes`): `kubelet` or `app-safe`.
    pub modes: &'static str,
    /// Entries per owner, most first; `top_dirs` only for the minority owners.
    pub owners: Vec<OwnerRow>,
    pub lacking_group_bits: Finding<EscapedPath>,
    pub dirs_without_setgid: Finding<EscapedPath>,
    pub world_writable_dirs_without_sticky: Finding<EscapedPath>,
    /// Nested mounts: other filesystems, and bind mounts (of the same filesystem too).
    pub nested_mounts: Finding<EscapedPath>,
    /// Non-directories with more than one link: a change reaches every name of the inode,
    /// maybe outside the volume.
    pub hardlinked: Finding<EscapedPath>,
    pub symlinks_outside: Finding<LinkOut>,
    /// App-private paths (PostgreSQL's data directory, `.ssh`, Erlang's cookie ...) and what
    /// the kubelet's rule and volprep's settings leave on them.
    pub app_paths: Finding<super::AppPathView>,
    /// Entries with a POSIX ACL whose `group::` lacks the group bits of the masks above: the
    /// group gets them in the ACL mask only, and keeps `group::`'s (the kubelet does the same).
    pub acl_group_entry_lacking_bits: Finding<AclGroup>,
    /// Files named like private keys (`*.key`, `id_*` ...) the group can read after the mode
    /// policy (the spec's, else the kubelet's rule): a confidentiality finding.
    pub group_readable_private_keys: Finding<KeyView>,
    /// With the app's uid (`--app-uid`, or `--owner`'s) and a spec: entries the app could not
    /// open after `apply` (a directory it cannot list and enter, a file it cannot read).
    pub app_cannot_open: Finding<EscapedPath>,
    pub errors: u64,
    pub error_list: Vec<EntryError>,
    /// Present with `--fs-group`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fs_group: Option<FsGroupView>,
    /// Present with `--owner`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub owner: Option<OwnerView>,
    pub elapsed_ms: u64,
}

/// What was seen, by kind: the root and every entry below it (nested mounts excluded).
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Kinds {
    pub entries: u64,
    pub dirs: u64,
    pub files: u64,
    pub symlinks: u64,
    pub others: u64,
}

impl fmt::Display for Kinds {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Kinds { entries, dirs, files, symlinks, others } = self;
        write!(f, "{entries} entries ({dirs} dirs, {files} files, {symlinks} symlinks, {others} others)")
    }
}

#[derive(Debug, Serialize)]
pub struct OwnerRow {
    pub uid: u32,
    pub gid: u32,
    pub entries: u64,
    pub top_dirs: Vec<DirCount>,
}

/// A directory and how many of one owner's entries it holds (its direct entries and itself).
#[derive(Debug, Serialize)]
pub struct DirCount {
    pub path: EscapedPath,
    pub entries: u64,
}

/// How many entries have a finding, and the first few (sorted).
#[derive(Debug, Serialize)]
pub struct Finding<T> {
    pub count: u64,
    pub examples: Vec<T>,
}

/// An entry with a POSIX access ACL whose owning group's entry (`group::`) lacks bits the
/// kubelet gives the group: with an ACL the mode's group bits are the ACL mask, so `chmod g+rw`
/// (the kubelet's and volprep's) changes the mask and `group::` keeps what it had.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct AclGroup {
    pub path: EscapedPath,
    /// `group::` as `getfacl` shows it (e.g. "r--").
    pub group_obj: String,
    /// `mask::`.
    pub mask: String,
}

/// A file named like a private key that the group can read, and the rule that keeps it the
/// app's alone.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct KeyView {
    pub path: EscapedPath,
    /// Its mode now, and after the mode policy.
    pub mode: String,
    pub mode_after: String,
    /// The flag that fixes it: `--rule PATH=owner-only` (with `--modes app-safe`).
    pub fix: String,
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct LinkOut {
    pub path: EscapedPath,
    pub target: EscapedPath,
}

#[derive(Debug, Serialize)]
pub struct FsGroupView {
    pub gid: u32,
    pub read_only: bool,
    pub kubelet: KubeletView,
    pub volprep_apply: ApplyView,
}

/// The kubelet's pass: it lchowns every entry and chmods every non-symlink, changed or not.
#[derive(Debug, Serialize)]
pub struct KubeletView {
    /// Entries its pass rewrites (with `Always`, and with `OnRootMismatch` when it walks). The
    /// kubelet also enters nested mounts, which are not counted here.
    pub rewrites: u64,
    pub chowns: u64,
    pub chmods: u64,
    /// `skips` or `walks`.
    pub on_root_mismatch: &'static str,
    /// Why `OnRootMismatch` walks.
    pub reason: Option<String>,
}

impl KubeletView {
    /// The kubelet's pass over what was `seen`, and whether `OnRootMismatch` walks and why.
    pub fn of(seen: Kinds, mismatch: Option<super::RootMismatch>) -> KubeletView {
        KubeletView {
            rewrites: seen.entries,
            chowns: seen.entries,
            chmods: seen.entries - seen.symlinks,
            on_root_mismatch: if mismatch.is_some() { "walks" } else { "skips" },
            reason: mismatch.map(|m| m.to_string()),
        }
    }
}

/// `--owner UID[:GID]`: what `volprep apply` with it (and `--fs-group`, if given) would change,
/// and which entries: a preview of a migration.
#[derive(Debug, Serialize)]
pub struct OwnerView {
    pub uid: u32,
    /// `None`: the owner's group is kept (or set by `--fs-group`).
    pub gid: Option<u32>,
    pub volprep_apply: ApplyView,
    /// The entries it would change (the root is ".").
    pub would_change: Finding<EscapedPath>,
}

/// What `volprep apply --fs-group` would change (the same figures as `check`).
#[derive(Debug, Clone, Copy, Serialize)]
pub struct ApplyView {
    pub changed: u64,
    pub changed_owner: u64,
    pub changed_mode: u64,
    /// What `changed_owner` counts changes of (the tables say it; the JSON key stays).
    #[serde(skip)]
    pub ownership: Ownership,
}

pub fn json(r: &Inspection) -> String {
    let mut s = serde_json::to_string_pretty(r).expect("inspection serializes");
    s.push('\n');
    s
}

/// Examples shown per finding in the tables (`--json` lists more).
const SHOWN: usize = 3;

pub fn human(r: &Inspection) -> String {
    let mut out = format!("{}: {}, {} threads, {} ms\n", r.path, r.seen, r.threads, r.elapsed_ms);
    out += &owners_table(r);
    out += &findings_table(r);
    if r.app_paths.count > 0 {
        out += &app_paths_table(r);
    }
    if let Some(g) = &r.fs_group {
        out += &fs_group_table(r, g);
    }
    if let Some(o) = &r.owner {
        out += &owner_table(r, o);
    }
    out
}

/// Entries per owner, with their share and top directories.
fn owners_table(r: &Inspection) -> String {
    let mut t =
        Table::new(&["OWNER (UID:GID)", "ENTRIES", "SHARE", "TOP DIRECTORIES (ENTRIES)"], &[Left, Right, Right, Left]);
    for o in &r.owners {
        let share = o.entries as f64 * 100.0 / r.seen.entries.max(1) as f64;
        let dirs: Vec<_> = o.top_dirs.iter().map(|d| format!("{} ({})", d.path, d.entries)).collect();
        t.row(vec![format!("{}:{}", o.uid, o.gid), o.entries.to_string(), format!("{share:.1}%"), dirs.join(", ")]);
    }
    t.render()
}

/// Each finding counted, with its first examples; the errors last.
fn findings_table(r: &Inspection) -> String {
    let mut t = Table::new(&["FINDING", "COUNT", "EXAMPLES"], &[Left, Right, Left]);
    let path = EscapedPath::to_string;
    if r.owner.is_some() && r.fs_group.is_none() {
        t.row(vec!["mode bits and setgid".into(), "-".into(), "not listed: --owner changes no mode".into()]);
    } else {
        let bits = format!("lacking mode bits {} (dirs {})", r.file_mask, r.dir_mask);
        t.finding(&bits, &r.lacking_group_bits, path);
        t.finding("directories without setgid", &r.dirs_without_setgid, path);
    }
    t.finding("world-writable directories without sticky bit", &r.world_writable_dirs_without_sticky, path);
    t.finding("nested mounts (not entered)", &r.nested_mounts, path);
    t.finding("files with more than one link", &r.hardlinked, path);
    t.finding("symlinks pointing outside the volume", &r.symlinks_outside, |l| format!("{} -> {}", l.path, l.target));
    t.finding(
        // chmod (the kubelet's and volprep's) sets the ACL mask; group:: keeps its bits.
        "POSIX ACLs: group:: lacks group bits",
        &r.acl_group_entry_lacking_bits,
        |a| format!("{} (group::{}, mask::{})", a.path, a.group_obj, a.mask),
    );
    t.finding("entries the app could not open after apply", &r.app_cannot_open, path);
    t.finding("private keys (by name) the group can read", &r.group_readable_private_keys, |k| {
        format!("{} {} -> {} ({})", k.path, k.mode, k.mode_after, k.fix)
    });
    let errs: Vec<_> = r.error_list.iter().map(|e| format!("{}: {} failed: {}", e.path, e.op, e.error)).collect();
    t.row(vec!["errors".into(), r.errors.to_string(), shown(&errs, r.errors)]);
    t.render()
}

/// The app-private paths, one line each: what the kubelet's rule leaves on it (and whether the
/// app accepts that), the setting that keeps the app working, and what the spec asked about
/// leaves.
fn app_paths_table(r: &Inspection) -> String {
    let spec = r.fs_group.is_some() || r.owner.is_some();
    let with = format!("WITH{}", spec_flags(r));
    let mut head = vec!["APP PATH", "WHAT", "MODE", "KUBELET'S RULE", "KEEPS THE APP WORKING"];
    if spec {
        head.push(&with);
    }
    let align: &'static [Align] = if spec { &[Left; 6] } else { &[Left; 5] };
    let mut t = Table::new(&head, align);
    for a in &r.app_paths.examples {
        let setting = a
            .assumed_app_uid
            .map_or_else(|| "--modes app-safe".to_string(), |u| format!("--modes app-safe --app-uid {u}"));
        let keeps = if a.kubelet.accepted() {
            "any (the kubelet's rule too)".to_string()
        } else if a.app_safe.accepted() {
            format!("{setting}: {}", a.app_safe.mode)
        } else {
            format!(
                "{setting} leaves {} (owned by uid {}, not the app's: --owner the app's uid first)",
                a.app_safe.short(),
                a.uid
            )
        };
        let mut row = vec![a.path.to_string(), a.app.clone(), a.mode.clone(), a.kubelet.short(), keeps];
        if let Some(w) = &a.with_spec {
            row.push(w.short());
        } else if spec {
            row.push(String::new());
        }
        t.row(row);
    }
    let rest = r.app_paths.count.saturating_sub(r.app_paths.examples.len() as u64);
    let mut out = t.render();
    if rest > 0 {
        out += &format!("(+{rest} more app paths)\n");
    }
    out
}

/// The spec flags `inspect` was given (` --owner 2000 --fs-group 2000 --modes app-safe`).
fn spec_flags(r: &Inspection) -> String {
    let mut s = String::new();
    if let Some(o) = &r.owner {
        s += &o.gid.map_or_else(|| format!(" --owner {}", o.uid), |g| format!(" --owner {}:{g}", o.uid));
    }
    if let Some(g) = &r.fs_group {
        s += &format!(" --fs-group {}{}", g.gid, if g.read_only { " --read-only" } else { "" });
    }
    if r.modes != "kubelet" {
        s += &format!(" --modes {}", r.modes);
    }
    s
}

/// `--fs-group`: what the kubelet's two policies and `volprep apply` would do.
fn fs_group_table(r: &Inspection, g: &FsGroupView) -> String {
    let ro = if g.read_only { " --read-only" } else { "" };
    let modes = if r.modes == "kubelet" { String::new() } else { format!(" --modes {}", r.modes) };
    let head = format!("WITH --fs-group {}{ro}{modes}", g.gid);
    let mut t = Table::new(&[&head, "ENTRIES", "WHAT"], &[Left, Right, Left]);
    let k = &g.kubelet;
    let nested = if r.nested_mounts.count > 0 { ", and the nested mounts too" } else { "" };
    t.row(vec![
        "kubelet, fsGroupChangePolicy Always".into(),
        k.rewrites.to_string(),
        format!("every entry rewritten at every mount: lchown {}, chmod {}{nested}", k.chowns, k.chmods),
    ]);
    let (n, what) = match &k.reason {
        Some(reason) => (k.rewrites, format!("walks: {reason}")),
        None => (0, format!("skips: the root conforms, yet apply would fix {} entries", g.volprep_apply.changed)),
    };
    t.row(vec!["kubelet, OnRootMismatch".into(), n.to_string(), what]);
    t.row(apply_row(&g.volprep_apply, r.seen.entries));
    t.render()
}

/// The "volprep apply" row of a table: what it would change, out of `entries`.
fn apply_row(a: &ApplyView, entries: u64) -> Vec<String> {
    vec![
        "volprep apply".into(),
        a.changed.to_string(),
        format!(
            "only what differs: {} {}, mode {}, untouched {}",
            a.ownership,
            a.changed_owner,
            a.changed_mode,
            entries - a.changed
        ),
    ]
}

/// The `--owner` preview: how many entries `apply` would change, and which.
fn owner_table(r: &Inspection, o: &OwnerView) -> String {
    let head = format!("WITH{}", spec_flags(r));
    let mut t = Table::new(&[&head, "ENTRIES", "WHAT"], &[Left, Right, Left]);
    t.row(apply_row(&o.volprep_apply, r.seen.entries));
    t.finding("entries it would change", &o.would_change, EscapedPath::to_string);
    t.render()
}

/// The first [`SHOWN`] of `items` (out of `count`), comma-separated.
fn shown(items: &[String], count: u64) -> String {
    let mut s = items.iter().take(SHOWN).cloned().collect::<Vec<_>>().join(", ");
    let rest = count.saturating_sub(items.len().min(SHOWN) as u64);
    if rest > 0 {
        s += &format!(" (+{rest} more)");
    }
    s
}

/// Columns padded to their widest cell; numeric columns right-aligned.
struct Table {
    /// Per column: where its cells go.
    align: &'static [Align],
    rows: Vec<Vec<String>>,
}

/// Where a column's cells go: text to the left, numbers to the right.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Align {
    Left,
    Right,
}

use Align::{Left, Right};

impl Table {
    fn new(head: &[&str], align: &'static [Align]) -> Self {
        Table { align, rows: vec![head.iter().map(|h| h.to_string()).collect()] }
    }

    fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    fn finding<T>(&mut self, what: &str, f: &Finding<T>, label: impl Fn(&T) -> String) {
        let items: Vec<_> = f.examples.iter().map(label).collect();
        self.row(vec![what.into(), f.count.to_string(), shown(&items, f.count)]);
    }

    fn render(&self) -> String {
        let cols = self.align.len();
        let width: Vec<usize> =
            (0..cols).map(|i| self.rows.iter().map(|r| r[i].chars().count()).max().unwrap_or(0)).collect();
        let mut out = String::from("\n");
        for r in &self.rows {
            let mut line = String::new();
            for (i, cell) in r.iter().enumerate() {
                let pad = " ".repeat(width[i] - cell.chars().count());
                if self.align[i] == Right {
                    line += &pad;
                    line += cell;
                } else {
                    line += cell;
                    line += &pad;
                }
                line += "  ";
            }
            out += line.trim_end();
            out.push('\n');
        }
        out
    }
}
