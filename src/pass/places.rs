//! Where `--modes app-safe` looks: the app-private path ([`apps`]) of each entry a pass decides,
//! from its name and its directory's (the signs a directory's entries give it, gathered while it
//! is read, or looked up for the few names that need it), and the list of what was tightened.
//! A sign counts only when the app owns it (after `--owner`), with one link for a file: a name
//! another uid planted proves nothing.

use std::collections::HashMap;
use std::ffi::CStr;
use std::os::fd::BorrowedFd;
use std::path::PathBuf;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

use tracing::{info, warn};

use crate::apps::{self, Anchor, AppPath, DirFacts, Links, ParentFacts, Private, Signs, Whose};
use crate::escape::EscapedPath;
use crate::fix::Fixed;
use crate::options::Mode;
use crate::report::{TightenedEntry, TightenedList};
use crate::spec::{Modes, PathRule, Spec};
use crate::sys::{self, Kind, Meta};
use crate::walk::{Dir, Node};

/// A directory's identity while it is walked.
type DirKey = (u64, u64);

/// Whose entries give an app path's signs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Proof {
    /// The app's (this uid, after `--owner`): what a pass acts on.
    App(u32),
    /// Anyone's: `inspect` without the app's uid names what the names alone suggest.
    Names,
    /// No one's: the app's uid is not known, so nothing is the app's.
    Nothing,
}

/// The app-private paths of one app-safe pass.
pub struct Places {
    /// `--owner`: an app path's owner is its owner after it.
    owner: Option<u32>,
    /// Whose entries give signs.
    proof: Proof,
    /// The user's rules (`--rule`), sorted by path: they win over the names.
    rules: Vec<PathRule>,
    /// The signs of directories being read, from their entries' names. Few directories have any.
    signs: Mutex<HashMap<DirKey, Signs>>,
    /// How many directories `signs` holds: a directory with none takes no lock when it is done.
    held: AtomicUsize,
    /// The first entries tightened (all are counted in the pass's counters).
    pub tightened: Mutex<TightenedList>,
}

impl Places {
    /// The places of a pass of `spec`: `None` unless it is app-safe (the kubelet's rule has none).
    pub fn of(spec: &Spec) -> Option<Places> {
        let proof = spec.app().map_or(Proof::Nothing, Proof::App);
        (spec.modes == Modes::AppSafe).then(|| Places { rules: spec.rules.clone(), ..Places::new(spec.uid(), proof) })
    }

    /// The places of `inspect`: those of `spec`'s rules too.
    pub fn with_rules(self, rules: &[PathRule]) -> Places {
        Places { rules: rules.to_vec(), ..self }
    }

    /// The user's rule for the entry at `rel` (relative to the volume root), if any. `rel` is
    /// built only when there are rules.
    fn rule_at(&self, rel: impl FnOnce() -> PathBuf) -> Option<Private> {
        if self.rules.is_empty() {
            return None;
        }
        let rel = rel();
        let at = self.rules.binary_search_by(|r| r.path.as_path().cmp(&rel)).ok()?;
        Some(Private { path: AppPath::Rule(self.rules[at].rule), anchor: Anchor::Itself })
    }

    /// Places whose app paths' owners are `owner` (`--owner`) when given, else their own, and
    /// whose signs are given by the entries `proof` says.
    pub fn new(owner: Option<u32>, proof: Proof) -> Places {
        Places {
            owner,
            proof,
            rules: Vec::new(),
            signs: Mutex::default(),
            held: AtomicUsize::new(0),
            tightened: Mutex::default(),
        }
    }

    /// A uid as it will be after the pass.
    fn after(&self, uid: u32) -> u32 {
        self.owner.unwrap_or(uid)
    }

    /// Whether `meta` may give a sign: the app owns it (after `--owner`) and, if not a
    /// directory, it has no other name (a hard link of the app's file proves nothing).
    fn proves(&self, meta: &Meta) -> bool {
        let whose = match self.proof {
            Proof::App(uid) => uid == self.after(meta.uid),
            Proof::Names => true,
            Proof::Nothing => false,
        };
        whose && (meta.kind() == Kind::Dir || meta.nlink == 1)
    }

    /// A subdirectory `name` of `dir` about to be entered: its sign, if any and the app owns it,
    /// is kept for `dir`'s own decision.
    pub fn note_dir(&self, dir: &Dir<'_>, name: &CStr) {
        if Signs::of(name.to_bytes(), Kind::Dir).is_empty() {
            return;
        }
        if let Ok(meta) = sys::stat_at(dir.fd(), name) {
            self.note(dir, name, &meta);
        }
    }

    /// An entry `name` of `dir` (a subdirectory too): its sign, if any and the app owns it, is
    /// kept for `dir`'s own decision.
    pub fn note(&self, dir: &Node, name: &CStr, meta: &Meta) {
        let sign = Signs::of(name.to_bytes(), meta.kind());
        if sign.is_empty() || !self.proves(meta) {
            return;
        }
        let mut signs = crate::sync::lock(&self.signs);
        let slot = signs.entry((dir.meta.dev, dir.meta.ino)).or_insert_with(|| {
            self.held.fetch_add(1, Relaxed);
            Signs::NONE
        });
        *slot = slot.with(sign);
    }

    /// The app path of a non-directory entry `name` of `parent`.
    pub fn of_entry(&self, parent: &Dir<'_>, name: &CStr, kind: Kind) -> Option<Private> {
        if kind == Kind::Symlink {
            return None;
        }
        if let Some(rule) = self.rule_at(|| crate::walk::rel_child(parent, name)) {
            return Some(rule);
        }
        let facts = ParentFacts {
            name: parent.name(),
            owner: self.after(parent.meta.uid),
            grand_owner: parent.parent().map(|g| self.after(g.meta.uid)),
        };
        let pg_data = || self.has(parent.fd(), "PG_VERSION", Kind::File) && self.has(parent.fd(), "global", Kind::Dir);
        apps::classify_file(name.to_bytes(), kind, &facts, pg_data)
    }

    /// The app path of a directory all of whose entries were seen (its signs are let go).
    pub fn of_dir(&self, dir: &Dir<'_>) -> Option<Private> {
        let signs = if self.held.load(Relaxed) == 0 {
            Signs::NONE
        } else {
            let taken = crate::sync::lock(&self.signs).remove(&(dir.meta.dev, dir.meta.ino));
            taken.inspect(|_| {
                self.held.fetch_sub(1, Relaxed);
            });
            taken.unwrap_or_default()
        };
        if let Some(rule) = self.rule_at(|| dir.rel_path()) {
            return Some(rule);
        }
        let parent = dir.parent();
        let facts = DirFacts {
            name: dir.name(),
            parent_name: parent.map_or(&[][..], |p| p.name()),
            signs,
            parent_owner: parent.map(|p| self.after(p.meta.uid)),
        };
        apps::classify_dir(&facts, || self.etcd_member(dir.fd()))
    }

    /// The app path of subdirectory `name` of `parent` that this pass cannot read (by its name
    /// alone).
    pub fn of_unread_dir(&self, parent: &Dir<'_>, name: &CStr) -> Option<Private> {
        if let Some(rule) = self.rule_at(|| crate::walk::rel_child(parent, name)) {
            return Some(rule);
        }
        let facts = DirFacts {
            name: name.to_bytes(),
            parent_name: parent.name(),
            signs: Signs::NONE,
            parent_owner: Some(self.after(parent.meta.uid)),
        };
        apps::classify_dir(&facts, || false)
    }

    /// Counts and records `fixed` when it removed bits of the app path `private` (in `check`:
    /// would remove): a log line and an entry of the report's list.
    pub fn record(&self, private: Option<Private>, fixed: &Fixed, mode: Mode, path: impl FnOnce() -> PathBuf) -> bool {
        let (Some(p), Some(want)) = (private, fixed.change.mode) else { return false };
        if fixed.old_perm & !want == 0 {
            return false;
        }
        let entry = TightenedEntry {
            path: EscapedPath::new(path()),
            app: p.path.to_string(),
            mode: format!("{:04o}", fixed.old_perm),
            want_mode: format!("{want:04o}"),
        };
        let verb = if mode == Mode::Check { "would tighten" } else { "tightened" };
        let why = match p.path {
            AppPath::Rule(_) => "the rule given for this path (--rule)".to_string(),
            _ => format!("{} wants {} ({})", p.path.app(), p.path.wants(), p.path.row().map_or("", |r| r.check)),
        };
        info!(path = %entry.path, app = entry.app.as_str(), mode = entry.mode.as_str(), want_mode = entry.want_mode.as_str(),
              "{verb} {} {} -> {}: {why}", entry.app, entry.mode, entry.want_mode);
        crate::sync::lock(&self.tightened).push(entry);
        true
    }

    /// Warns when the app's entry `meta` at `private` keeps a mode its app refuses because it
    /// has more than one link (app-safe never removes a bit through a hard link).
    pub fn warn_held_back(&self, private: Option<Private>, meta: &Meta, path: impl FnOnce() -> PathBuf) {
        let Proof::App(app) = self.proof else { return };
        let whose = Whose { owner: self.after(meta.uid), app: Some(app) };
        let Some(p) = apps::held_back(private, meta.perm(), whose, Links::of(meta.kind(), meta.nlink)) else { return };
        let path = EscapedPath::new(path());
        warn!(path = %path, app = %p, mode = %format_args!("{:04o}", meta.perm()), links = meta.nlink,
              "{p} has {} links: left at {:04o}, not tightened (the same inode may be outside the volume); {} wants {}: give it one link and apply again",
              meta.nlink, meta.perm(), p.app(), p.wants());
    }

    /// Whether `dir` holds `name` as a `kind` (never following a symlink) that gives a sign.
    fn has(&self, dir: BorrowedFd<'_>, name: &str, kind: Kind) -> bool {
        let Ok(name) = std::ffi::CString::new(name) else { return false };
        sys::stat_at(dir, &name).is_ok_and(|m: Meta| m.kind() == kind && self.proves(&m))
    }
}

/// The app path of the volume root `root` for `spec` (none unless app-safe), from a lookup of
/// the names that give signs: what the skip rule and a shard sealing the root decide with.
pub fn root_place(root: BorrowedFd<'_>, spec: &Spec) -> Option<Private> {
    let places = Places::of(spec)?;
    if let Some(rule) = places.rule_at(PathBuf::new) {
        return Some(rule);
    }
    let signs = Signs::NAMES
        .iter()
        .filter(|(name, kind)| places.has(root, name, *kind))
        .fold(Signs::NONE, |s, (name, kind)| s.with(Signs::of(name.as_bytes(), *kind)));
    let facts = DirFacts { name: b"", parent_name: b"", signs, parent_owner: None };
    apps::classify_dir(&facts, || places.etcd_member(root))
}

impl Places {
    /// Whether `dir/member` is etcd's: a directory (not a symlink) of the app holding `wal/` or
    /// `snap/`.
    fn etcd_member(&self, dir: BorrowedFd<'_>) -> bool {
        if !self.has(dir, "member", Kind::Dir) {
            return false;
        }
        let Ok(member) = sys::open_subdir(dir, c"member") else { return false };
        let member = sys::fd(&member);
        self.has(member, "wal", Kind::Dir) || self.has(member, "snap", Kind::Dir)
    }
}
