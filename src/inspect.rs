//! `volprep inspect`: a read-only, parallel diagnosis of one volume: who owns what, which entries
//! lack the kubelet's mode bits, risky directories and symlinks, and what the kubelet and
//! `volprep apply` would do with a given fsGroup and/or owner (which entries it would change: a
//! preview for a migration). Changes nothing; output is in `render`.

mod apps;
mod owners;
mod render;

use std::ffi::CStr;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Instant;

use rustix::io::Errno;

use crate::apps::Private;
use crate::error::{Error, ExitCode, Op};
use crate::escape::EscapedPath;
use crate::fix;
use crate::options::resolve_threads;
use crate::pass::{Places, Proof};
use crate::progress::Counters;
use crate::report::{EntryError, ErrorList};
use crate::spec::{Access, EXEC_MASK, Ownership, Spec};
use crate::sync::lock;
use crate::sys::{self, Kind, Meta};
use crate::walk::{self, At, Descend, Dir, Needed, Pool, Visitor, Walk};

use owners::Owners;

pub use apps::AppPathView;
use apps::Reach;
pub use render::{AclGroup, Finding, Inspection, KeyView, Kinds, LinkOut, OwnerView};

/// Paths kept as examples per finding (all are counted).
pub const MAX_EXAMPLES: usize = 20;
/// Directories listed per minority owner.
pub const TOP_DIRS: usize = 5;

/// `(uid, gid)`.
pub type Owner = (u32, u32);

/// What `inspect` was asked.
#[derive(Debug, Clone)]
pub struct Options {
    /// With `fs_group`: also show what the kubelet's fsGroup pass and `volprep apply` would do;
    /// with an owner: also show which entries `volprep apply` would change. `access`: the
    /// volume is mounted read-only (the kubelet's read-only mask, 0440). May ask for nothing.
    pub spec: Spec,
    /// Print one JSON document instead of tables.
    pub json: bool,
    /// Worker threads (0: automatic).
    pub threads: usize,
    /// Enter directories on other filesystems (nested mounts); by default they are listed only.
    pub cross_devices: bool,
    /// The volume root (a directory).
    pub path: PathBuf,
}

/// Inspects the volume at `args.path` and prints the diagnosis on stdout. Exit code 0 (it is a
/// diagnosis, whatever it finds); an error only when the volume cannot be walked at all.
pub fn run(args: &Options) -> Result<ExitCode, Error> {
    let started = Instant::now();
    let path = args.path.as_path();
    let threads = resolve_threads(args.threads, || sys::storage(path));
    let workers = Pool::new(threads);
    let pool = workers.start()?;
    let root_fd = crate::lifecycle::open_root(path)?;
    let root = sys::stat_fd(sys::fd(&root_fd)).map_err(|e| Error::sys(path, Op::Stat, e))?;
    let apply_spec = Some(&args.spec).filter(|s| !s.is_empty());
    let inspector = Inspector::new(apply_spec, args.spec.access, threads);
    Walk::new(pool, &inspector, &root, sys::Devices::from_flag(args.cross_devices)).run(root_fd, root);
    let report = inspector.finish(path, &root, threads, started);
    let out = if args.json { render::json(&report) } else { render::human(&report) };
    crate::report::print(out.as_bytes())?;
    Ok(ExitCode::Success)
}

/// Why the kubelet's `OnRootMismatch` policy would walk the volume anyway.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RootMismatch {
    Group {
        have: u32,
        want: u32,
    },
    NotADirectory,
    /// The root's permission bits lack some of `need` (`rwMask`/`roMask` | `execMask`).
    Mode {
        have: u32,
        need: u32,
    },
    NoSetgid,
}

impl fmt::Display for RootMismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RootMismatch::Group { have, want } => {
                write!(f, "root group {have} is not fsGroup {want}")
            }
            RootMismatch::NotADirectory => f.write_str("root is not a directory"),
            RootMismatch::Mode { have, need } => write!(f, "root mode {have:04o} lacks {need:04o}"),
            RootMismatch::NoSetgid => f.write_str("root lacks setgid"),
        }
    }
}

/// The kubelet's `requiresPermissionChange` (pkg/volume/volume_linux.go), which decides for
/// `fsGroupChangePolicy: OnRootMismatch`: the walk is skipped only when the root's group is the
/// fsGroup, it is a directory, its permission bits include `rwMask|execMask` (0770; `roMask|
/// execMask`, 0550, read-only) and it has setgid. `None`: the kubelet would skip the volume.
pub fn root_mismatch(root: &Meta, fs_group: u32, access: Access) -> Option<RootMismatch> {
    if root.gid != fs_group {
        return Some(RootMismatch::Group { have: root.gid, want: fs_group });
    }
    if root.kind() != Kind::Dir {
        return Some(RootMismatch::NotADirectory);
    }
    let need = access.mask() | EXEC_MASK;
    let perm = root.perm() & 0o777;
    if perm & need != need {
        return Some(RootMismatch::Mode { have: perm, need });
    }
    if root.perm() & libc::S_ISGID == 0 {
        return Some(RootMismatch::NoSetgid);
    }
    None
}

/// Whether a symlink in a directory `dir_depth` levels below the root, with `target`, points
/// outside the volume, decided lexically: an absolute target is outside; a relative one escapes
/// when a `..` climbs above the root at any point. (Symlinks along the way are not followed.)
pub fn link_escapes(dir_depth: u32, target: &[u8]) -> bool {
    if target.first() == Some(&b'/') {
        return true;
    }
    let mut depth = dir_depth;
    for part in target.split(|&b| b == b'/') {
        match part {
            b"" | b"." => {}
            b".." => match depth.checked_sub(1) {
                Some(d) => depth = d,
                None => return true,
            },
            _ => depth += 1,
        }
    }
    false
}

/// In a POSIX access ACL (the kernel's `system.posix_acl_access`: a version word, then 8-byte
/// entries of tag, permissions and id), the owning group's permissions (`group::`) and the
/// mask's, if it has them.
pub fn acl_group_and_mask(acl: &[u8]) -> Option<(u16, Option<u16>)> {
    const GROUP_OBJ: u16 = 0x04;
    const MASK: u16 = 0x10;
    let entries = acl.get(4..)?;
    if entries.len() % 8 != 0 || acl[..4] != 2u32.to_le_bytes() {
        return None;
    }
    let (mut group, mut mask) = (None, None);
    for e in entries.chunks_exact(8) {
        let (tag, perm) = (u16::from_le_bytes([e[0], e[1]]), u16::from_le_bytes([e[2], e[3]]) & 7);
        match tag {
            GROUP_OBJ => group = Some(perm),
            MASK => mask = Some(perm),
            _ => {}
        }
    }
    Some((group?, mask))
}

/// `rwx` bits as `getfacl` writes them (`r-x`).
fn rwx(perm: u16) -> String {
    [(4, 'r'), (2, 'w'), (1, 'x')].iter().map(|&(b, c)| if perm & b != 0 { c } else { '-' }).collect()
}

/// A spec used only for its mode masks: the kubelet's policy, whatever the group.
fn mode_policy(access: Access) -> Spec {
    Spec { access, ..Spec::group(0) }
}

/// A counted finding with its first examples.
struct Examples<T> {
    count: AtomicU64,
    list: Mutex<Vec<T>>,
}

impl<T: Ord> Examples<T> {
    fn new() -> Self {
        Examples { count: AtomicU64::new(0), list: Mutex::new(Vec::new()) }
    }

    /// Counts one; builds and keeps the example only while fewer than [`MAX_EXAMPLES`] are kept.
    fn add(&self, example: impl FnOnce() -> T) {
        if self.count.fetch_add(1, Relaxed) < MAX_EXAMPLES as u64 {
            let e = example();
            lock(&self.list).push(e);
        }
    }

    fn finish(self) -> Finding<T> {
        let mut examples = crate::sync::into_inner(self.list);
        examples.sort();
        Finding { count: self.count.into_inner(), examples }
    }
}

/// The visitor of `inspect`: reads, counts, never changes.
struct Inspector<'a> {
    /// `--fs-group` (with `--read-only`): what `apply` would be asked for.
    apply_spec: Option<&'a Spec>,
    /// The kubelet's mode masks (from `apply_spec`, or the same policy without a group).
    policy: Spec,
    counters: Counters,
    /// Entries `apply` would change at all, with examples.
    would_change: Examples<EscapedPath>,
    owners: Owners,
    lacking_bits: Examples<EscapedPath>,
    no_setgid: Examples<EscapedPath>,
    world_writable: Examples<EscapedPath>,
    mounts: Examples<EscapedPath>,
    hardlinked: Examples<EscapedPath>,
    links_out: Examples<LinkOut>,
    /// App-private paths (PostgreSQL's data directory, `.ssh` ...), whatever the mode policy.
    places: Places,
    /// The app-private paths `apply` acts on (its app's, proven by ownership): what `decide`
    /// previews with. None unless app-safe.
    acts: Option<Places>,
    app_paths: Examples<AppPathView>,
    acl_group: Examples<AclGroup>,
    keys: Examples<KeyView>,
    cannot_open: Examples<EscapedPath>,
    errors: Mutex<ErrorList>,
}

impl<'a> Inspector<'a> {
    fn new(apply_spec: Option<&'a Spec>, access: Access, threads: usize) -> Self {
        Inspector {
            apply_spec,
            policy: apply_spec.filter(|s| s.fs_group.is_some()).cloned().unwrap_or_else(|| mode_policy(access)),
            counters: Counters::default(),
            would_change: Examples::new(),
            owners: Owners::new(threads),
            lacking_bits: Examples::new(),
            no_setgid: Examples::new(),
            world_writable: Examples::new(),
            mounts: Examples::new(),
            hardlinked: Examples::new(),
            links_out: Examples::new(),
            places: Places::new(apply_spec.and_then(Spec::uid), Proof::Names)
                .with_rules(apply_spec.map_or(&[][..], |s| &s.rules)),
            acts: apply_spec.and_then(Places::of),
            app_paths: Examples::new(),
            acl_group: Examples::new(),
            keys: Examples::new(),
            cannot_open: Examples::new(),
            errors: Mutex::default(),
        }
    }

    /// A regular file named like a private key that the group can read after the policy (the
    /// spec's change, else the kubelet's rule): listed with the rule that fixes it.
    fn check_key(&self, meta: &Meta, name: &CStr, acted: Option<Private>, rel: impl Fn() -> PathBuf) {
        if meta.kind() != Kind::File || !crate::apps::looks_like_private_key(name.to_bytes()) {
            return;
        }
        let after = match self.apply_spec {
            Some(spec) => fix::Fixed::decided(meta, spec, acted).change.mode.unwrap_or(meta.perm()),
            None => meta.perm() | self.policy.mode_mask(Kind::File).unwrap_or(0),
        };
        if after & 0o044 == 0 {
            return;
        }
        let owner = self.apply_spec.and_then(Spec::uid).unwrap_or(meta.uid);
        let not_app = self.apply_spec.and_then(Spec::app).filter(|&app| app != owner);
        self.keys.add(|| {
            let path = EscapedPath::relative(&rel());
            let mut fix = format!("--modes app-safe --rule {path}=owner-only");
            if let Some(app) = not_app {
                fix += &format!(" (uid {owner} owns it, not the app's uid {app}: give it to the app first)");
            }
            KeyView { path, mode: format!("{:04o}", meta.perm()), mode_after: format!("{after:04o}"), fix }
        });
    }

    /// Notes an entry's sign for both kinds of places.
    fn note(&self, parent: &Dir<'_>, name: &CStr, meta: &Meta) {
        self.places.note(parent, name, meta);
        if let Some(p) = &self.acts {
            p.note(parent, name, meta);
        }
    }

    /// An entry at an app-private path: what each setting leaves on it.
    fn app_path(&self, meta: &Meta, private: Option<Private>, rel: impl Fn() -> PathBuf) {
        if let Some(p) = private {
            let view = || AppPathView::of(EscapedPath::relative(&rel()), meta, p, &self.policy, self.apply_spec);
            self.app_paths.add(view);
        }
    }

    /// The mode findings of any entry; `rel` builds its path when an example is kept.
    fn check_mode(&self, meta: &Meta, rel: impl Fn() -> PathBuf) {
        let kind = meta.kind();
        let perm = meta.perm();
        if let Some(mask) = self.policy.mode_mask(kind) {
            if kind != Kind::Symlink && perm & mask != mask {
                self.lacking_bits.add(|| EscapedPath::relative(&rel()));
            }
        }
        if kind == Kind::Dir {
            if perm & libc::S_ISGID == 0 {
                self.no_setgid.add(|| EscapedPath::relative(&rel()));
            }
            if perm & 0o002 != 0 && perm & libc::S_ISVTX == 0 {
                self.world_writable.add(|| EscapedPath::relative(&rel()));
            }
        }
    }

    fn check_link(&self, parent: &Dir<'_>, name: &CStr) {
        match sys::readlink_at(parent.fd(), name) {
            Ok(target) if link_escapes(parent.depth, &target) => self.links_out.add(|| LinkOut {
                path: EscapedPath::relative(&walk::rel_child(parent, name)),
                target: EscapedPath::from_bytes(&target),
            }),
            // Gone, or no longer a symlink, since it was read.
            Ok(_) | Err(Errno::NOENT) | Err(Errno::INVAL) => {}
            Err(e) => self.error(At::Entry(*parent, name), Op::Stat, e),
        }
    }

    /// An entry's POSIX access ACL (`acl`, if it has one): listed when its `group::` lacks the
    /// group bits of the kubelet's mask for it, which a chmod puts in the ACL mask only.
    fn check_acl(&self, meta: &Meta, acl: Result<Option<Vec<u8>>, Errno>, rel: impl Fn() -> PathBuf) {
        let Ok(Some(acl)) = acl else { return };
        let Some((group, mask)) = acl_group_and_mask(&acl) else { return };
        let need = (self.policy.mode_mask(meta.kind()).unwrap_or(0) >> 3 & 7) as u16;
        if group & need != need {
            self.acl_group.add(|| AclGroup {
                path: EscapedPath::relative(&rel()),
                group_obj: rwx(group),
                mask: mask.map_or_else(|| "(none)".into(), rwx),
            });
        }
    }

    /// What `apply` would change on this entry (at `private`); `rel` builds its path when an
    /// example is kept.
    fn decide(&self, meta: &Meta, private: Option<Private>, rel: impl Fn() -> PathBuf) {
        let Some(spec) = self.apply_spec else { return };
        let fixed = fix::Fixed::decided(meta, spec, private);
        let change = fixed.change;
        if change.owner() {
            self.counters.changed_owner.inc();
        }
        if fixed.mode_changed() {
            self.counters.changed_mode.inc();
        }
        if !change.is_none() {
            self.would_change.add(|| EscapedPath::relative(&rel()));
        }
        let app = apps::App { uid: spec.app(), group: spec.fs_group };
        let (owner, gid) = (change.uid.unwrap_or(meta.uid), change.gid.unwrap_or(meta.gid));
        let perm = change.mode.unwrap_or(meta.perm());
        if app.uid.is_some()
            && meta.kind() != Kind::Symlink
            && app.reach(meta.kind(), perm, owner, gid) == Reach::CannotOpen
        {
            self.cannot_open.add(|| EscapedPath::relative(&rel()));
        }
    }

    fn finish(self, path: &Path, root: &Meta, threads: usize, started: Instant) -> Inspection {
        let c = self.counters.snapshot();
        let seen = Kinds { entries: c.entries, dirs: c.dirs, files: c.files, symlinks: c.symlinks, others: c.others };
        let would_change = self.would_change.finish();
        let apply = render::ApplyView {
            changed: would_change.count,
            changed_owner: c.changed_owner,
            changed_mode: c.changed_mode,
            ownership: self.apply_spec.map_or(Ownership::Group, Spec::ownership),
        };
        let owner = self.apply_spec.and_then(|spec| {
            let uid = spec.owner_uid?;
            Some(OwnerView { uid, gid: spec.owner_gid, volprep_apply: apply, would_change })
        });
        let fs_group = self.apply_spec.and_then(|spec| {
            let gid = spec.fs_group?;
            let mismatch = root_mismatch(root, gid, spec.access);
            Some(render::FsGroupView {
                gid,
                read_only: spec.access == Access::ReadOnly,
                kubelet: render::KubeletView::of(seen, mismatch),
                volprep_apply: apply,
            })
        });
        Inspection {
            version: 1,
            path: EscapedPath::new(path),
            threads,
            seen,
            file_mask: format!("{:04o}", self.policy.mode_mask(Kind::File).unwrap_or(0)),
            dir_mask: format!("{:04o}", self.policy.mode_mask(Kind::Dir).unwrap_or(0)),
            modes: self.apply_spec.map_or(crate::spec::Modes::Kubelet, |s| s.modes).word(),
            owners: self.owners.finish(),
            lacking_group_bits: self.lacking_bits.finish(),
            dirs_without_setgid: self.no_setgid.finish(),
            world_writable_dirs_without_sticky: self.world_writable.finish(),
            nested_mounts: self.mounts.finish(),
            hardlinked: self.hardlinked.finish(),
            symlinks_outside: self.links_out.finish(),
            app_paths: self.app_paths.finish(),
            acl_group_entry_lacking_bits: self.acl_group.finish(),
            group_readable_private_keys: self.keys.finish(),
            app_cannot_open: self.cannot_open.finish(),
            errors: c.errors,
            error_list: crate::sync::into_inner(self.errors).into_vec(),
            fs_group,
            owner,
            elapsed_ms: started.elapsed().as_millis() as u64,
        }
    }
}

impl Visitor for Inspector<'_> {
    fn entry(&self, parent: &Dir<'_>, name: &CStr, meta: &Meta) -> Needed {
        self.counters.seen(meta.kind());
        if meta.kind() != Kind::Dir && meta.nlink > 1 {
            self.hardlinked.add(|| EscapedPath::relative(&walk::rel_child(parent, name)));
        }
        self.owners.add(parent, meta);
        self.check_mode(meta, || walk::rel_child(parent, name));
        if meta.kind() == Kind::Symlink {
            self.check_link(parent, name);
        } else if matches!(meta.kind(), Kind::File | Kind::Dir) {
            self.check_acl(meta, sys::acl_at(parent.fd(), name), || walk::rel_child(parent, name));
        }
        self.note(parent, name, meta);
        let private = self.places.of_entry(parent, name, meta.kind());
        let acted = self.acts.as_ref().and_then(|p| p.of_entry(parent, name, meta.kind()));
        self.app_path(meta, private, || walk::rel_child(parent, name));
        self.decide(meta, acted, || walk::rel_child(parent, name));
        self.check_key(meta, name, acted, || walk::rel_child(parent, name));
        // Read-only: nothing is worth pinning.
        Needed::Nothing
    }

    fn dir_done(&self, dir: &Dir<'_>) {
        self.counters.seen(Kind::Dir);
        self.owners.dir_done(dir);
        self.check_mode(&dir.meta, || dir.rel_path());
        self.check_acl(&dir.meta, sys::acl_fd(dir.fd()), || dir.rel_path());
        let private = self.places.of_dir(dir);
        let acted = self.acts.as_ref().and_then(|p| p.of_dir(dir));
        self.app_path(&dir.meta, private, || dir.rel_path());
        self.decide(&dir.meta, acted, || dir.rel_path());
    }

    fn mount_skipped(&self, parent: &Dir<'_>, name: &CStr, meta: &Meta) {
        self.note(parent, name, meta);
        self.mounts.add(|| EscapedPath::relative(&walk::rel_child(parent, name)));
    }

    fn enter(&self, parent: &Dir<'_>, name: &CStr, _ino: u64, _ord: Option<u32>) -> Descend {
        self.places.note_dir(parent, name);
        if let Some(p) = &self.acts {
            p.note_dir(parent, name);
        }
        Descend::Read
    }

    fn error(&self, at: At<'_>, op: Op, errno: Errno) {
        self.counters.errors.inc();
        lock(&self.errors).push_with(|| EntryError::new(EscapedPath::relative(&at.rel_path()), op, errno));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(perm: u32, gid: u32) -> Meta {
        Meta { dev: 1, ino: 2, mode: libc::S_IFDIR | perm, uid: 0, gid, nlink: 1, mnt_id: 0 }
    }

    #[test]
    fn an_acls_group_entry_and_mask_are_read_from_its_xattr() {
        // user::rw- user:1000:rwx group::r-- group:2000:rw- mask::rw- other::---
        let entries: [(u16, u16, u32); 6] = [
            (0x01, 6, u32::MAX),
            (0x02, 7, 1000),
            (0x04, 4, u32::MAX),
            (0x08, 6, 2000),
            (0x10, 6, u32::MAX),
            (0x20, 0, u32::MAX),
        ];
        let mut acl = 2u32.to_le_bytes().to_vec();
        for (tag, perm, id) in entries {
            acl.extend(tag.to_le_bytes());
            acl.extend(perm.to_le_bytes());
            acl.extend(id.to_le_bytes());
        }
        assert_eq!(acl_group_and_mask(&acl), Some((4, Some(6))));
        assert_eq!((rwx(4), rwx(6), rwx(5), rwx(0)), ("r--".into(), "rw-".into(), "r-x".into(), "---".into()));
        assert_eq!(acl_group_and_mask(&acl[..acl.len() - 3]), None, "a truncated ACL");
        assert_eq!(acl_group_and_mask(&[1, 0, 0, 0]), None, "another version");
        assert_eq!(acl_group_and_mask(&acl[..4]), None, "no group:: entry");
    }

    #[test]
    fn absolute_targets_are_outside() {
        assert!(link_escapes(0, b"/etc/passwd"));
        assert!(link_escapes(5, b"/"));
    }

    #[test]
    fn relative_targets_escape_when_dotdot_climbs_above_the_root() {
        assert!(!link_escapes(0, b"a/b"));
        assert!(!link_escapes(0, b"./a/../b"));
        assert!(link_escapes(0, b".."));
        assert!(link_escapes(0, b"../vol/a"), "leaving the root counts, even to come back");
        assert!(!link_escapes(1, b"../b/g1"));
        assert!(link_escapes(1, b"../../.."));
        assert!(link_escapes(2, b"../../../x"));
        assert!(!link_escapes(2, b"../../x"));
        assert!(!link_escapes(0, b"a/../b/../c"));
        assert!(link_escapes(0, b"a/../../c"));
        assert!(!link_escapes(0, b"a//b/"));
        assert!(!link_escapes(0, b"..."), "'...' is a name");
    }

    #[test]
    fn on_root_mismatch_skips_only_a_conforming_root() {
        assert_eq!(root_mismatch(&dir(0o2770, 2000), 2000, Access::ReadWrite), None);
        assert_eq!(root_mismatch(&dir(0o2775, 2000), 2000, Access::ReadWrite), None);
        assert_eq!(root_mismatch(&dir(0o3777, 2000), 2000, Access::ReadWrite), None);
        assert_eq!(
            root_mismatch(&dir(0o2770, 1999), 2000, Access::ReadWrite),
            Some(RootMismatch::Group { have: 1999, want: 2000 })
        );
        assert_eq!(
            root_mismatch(&dir(0o2750, 2000), 2000, Access::ReadWrite),
            Some(RootMismatch::Mode { have: 0o750, need: 0o770 })
        );
        assert_eq!(root_mismatch(&dir(0o0770, 2000), 2000, Access::ReadWrite), Some(RootMismatch::NoSetgid));
        // Read-only: 0550 and setgid suffice.
        assert_eq!(root_mismatch(&dir(0o2550, 2000), 2000, Access::ReadOnly), None);
        assert!(root_mismatch(&dir(0o2550, 2000), 2000, Access::ReadWrite).is_some());
        let file = Meta { mode: libc::S_IFREG | 0o2770, ..dir(0, 2000) };
        assert_eq!(root_mismatch(&file, 2000, Access::ReadWrite), Some(RootMismatch::NotADirectory));
    }

    #[test]
    fn on_root_mismatch_agrees_with_the_dir_mask_of_the_spec() {
        // The kubelet's root check is exactly "the root has every bit of the directory mask".
        for access in [Access::ReadWrite, Access::ReadOnly] {
            let mask = mode_policy(access).mode_mask(Kind::Dir).unwrap();
            for perm in 0..=0o7777 {
                let skips = root_mismatch(&dir(perm, 7), 7, access).is_none();
                assert_eq!(skips, perm & mask == mask, "{perm:o} {access:?}");
            }
        }
    }
}
