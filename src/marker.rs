//! The marker: xattr state on the volume root (`user.volprep`) saying which spec the volume was
//! prepared for, the resume checkpoint (`user.volprep.checkpoint`, `.checkpoint.I` for shard I)
//! of an unfinished pass, and its special-bit records (`user.volprep.pending`, `.pending.I`).
//!
//! All xattrs of the root share one space, as small as ~900 bytes on ext4 with 1 KiB blocks
//! (what mke2fs picks below 512 MiB). The marker comes first: when it does not fit, the
//! checkpoints give way (they only save re-reading). Special-bit records live in their own
//! small xattr, so a big checkpoint never pushes them out.
//! Encoding and the skip/walk decision are pure; reads and writes go through `sys`. The room in
//! the root's xattr space is [`room`]'s; the mount points a `done` marker records, [`mounts`]'.

use std::ffi::CStr;
use std::os::fd::BorrowedFd;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rustix::io::Errno;
use serde::{Deserialize, Serialize};

use crate::escape::{Untrusted, escape_bytes};
use crate::options::Verify;
use crate::runid::{NotARunId, RunId};
use crate::spec::Digest;
use crate::special::SpecialRecord;
use crate::state::MarkerState;
use crate::sys;

mod mounts;
mod room;
mod shards;

pub use mounts::{MountsDigest, mounts_changed, mounts_digest};
pub use room::{Foreign, list_ours, no_room, refused, remove_ours};
pub use shards::{AnchorDigest, Heartbeat, Shards};

/// The most shards a round can have on ext4 with 1 KiB blocks (what mke2fs picks below 512
/// MiB): the root's xattr space holds no bigger record (measured; see docs/shards.md).
pub const SHARDS_ON_1K_EXT4: u32 = 600;

/// The root xattr holding the [`Marker`].
pub const MARKER_XATTR: &CStr = c"user.volprep";
/// The root xattr holding the [`Checkpoint`] of an unfinished (unsharded) pass.
pub const CHECKPOINT_XATTR: &CStr = c"user.volprep.checkpoint";
/// The root xattr holding the special-bit records of an unsharded pass (see [`Pending`]).
pub const PENDING_XATTR: &CStr = c"user.volprep.pending";
/// Format version written in every marker.
pub const FORMAT: u32 = 1;
/// Format of [`Checkpoint::dirs`]; a checkpoint of another format skips nothing.
pub const CHECKPOINT_FORMAT: u32 = 3;
/// A checkpoint never grows past this (it must fit one xattr block beside the marker: ext4
/// keeps all of an inode's xattrs in one 4 KiB block by default).
pub const CHECKPOINT_MAX_BYTES: usize = 3000;

/// The xattr of the checkpoint of the unsharded pass (`None`) or of shard I.
pub fn checkpoint_xattr(shard: Option<u32>) -> std::ffi::CString {
    let base = CHECKPOINT_XATTR.to_str().expect("ASCII");
    let name = shard.map_or_else(|| base.to_string(), |i| format!("{base}.{i}"));
    std::ffi::CString::new(name).expect("no NUL")
}

/// The xattr of the special-bit records of the unsharded pass (`None`) or of shard I.
pub fn pending_xattr(shard: Option<u32>) -> std::ffi::CString {
    let base = PENDING_XATTR.to_str().expect("ASCII");
    let name = shard.map_or_else(|| base.to_string(), |i| format!("{base}.{i}"));
    std::ffi::CString::new(name).expect("no NUL")
}

/// The state a pass leaves on the root. Short keys keep it small.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Marker {
    /// Format version.
    pub v: u32,
    pub state: State,
    /// `Spec::coverage_digest` of the spec this state is for.
    pub digest: Digest,
    /// The spec in words, for people (`status`, logs).
    pub spec: Untrusted,
    /// The run that wrote it; a checkpoint belongs to one run.
    pub run: RunId,
    /// Unix seconds.
    pub started: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished: Option<u64>,
    /// Entries of the finished pass.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entries: Option<u64>,
    /// The state of a sharded pass (`--shard I/N`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shards: Option<Shards>,
    /// An unprivileged pass that finished but left this many entries of other users that do not
    /// conform (the state stays `in-progress`: only a privileged run can finish the volume).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub left: Option<u64>,
    /// The pass that marked it done met mount points: the [`mounts_digest`] of the mount points
    /// below the root then. What a mount hides was not walked, so a start that finds another
    /// set (one unmounted) walks again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mounts: Option<MountsDigest>,
}

/// The state a marker records (see [`MarkerState`] for what a report says of a root).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum State {
    Done,
    InProgress,
}

impl From<State> for MarkerState {
    fn from(s: State) -> MarkerState {
        match s {
            State::Done => MarkerState::Done,
            State::InProgress => MarkerState::InProgress,
        }
    }
}

/// What an unfinished run has finished, kept on the root only (nothing is written below it).
/// One whose run id volprep would not write does not decode: it is no checkpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checkpoint {
    pub run: RunId,
    pub digest: Digest,
    /// [`CHECKPOINT_FORMAT`] (absent in checkpoints of the first format, which skip nothing).
    #[serde(default)]
    pub v: u32,
    /// Finished work, one record per unfinished directory (see the `frontier` module).
    #[serde(default)]
    pub dirs: Vec<String>,
    /// Special-bit records, as checkpoints held them before they got their own xattr
    /// ([`Pending`]): still read, never written.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pending: Vec<SpecialRecord>,
}

impl Checkpoint {
    pub fn new(run: &RunId, digest: &Digest) -> Self {
        Checkpoint {
            run: run.clone(),
            digest: digest.clone(),
            v: CHECKPOINT_FORMAT,
            dirs: Vec::new(),
            pending: Vec::new(),
        }
    }

    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("checkpoint serializes")
    }

    /// The directory records, if they are of this version's format.
    pub fn records(&self) -> &[String] {
        if self.v == CHECKPOINT_FORMAT { &self.dirs } else { &[] }
    }
}

/// Files whose setuid/setgid bits a chown is about to clear, of one run: (escaped relative
/// path, inode, mode to restore). Normally empty: a record lives for the time of two syscalls.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pending {
    pub run: RunId,
    pub digest: Digest,
    pub pending: Vec<SpecialRecord>,
}

impl Marker {
    /// A marker of this format with `state` for spec `digest` (in words: `spec`), written by
    /// `run` that started at `started`; nothing finished, no shards, nothing left.
    pub fn new(state: State, digest: &Digest, spec: &str, run: &RunId, started: u64) -> Marker {
        Marker {
            v: FORMAT,
            state,
            digest: digest.clone(),
            spec: spec.into(),
            run: run.clone(),
            started,
            finished: None,
            entries: None,
            shards: None,
            left: None,
            mounts: None,
        }
    }

    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("marker serializes")
    }

    /// The marker in `bytes`, or why it is none: text safe to log as it is. A run id volprep
    /// would not write (U+2028, a tag character, a forged line: a resumed pass carries the run
    /// id into its own marker and logs) makes the whole marker untrusted.
    pub fn decode(bytes: &[u8]) -> Result<Marker, String> {
        let m: Marker = serde_json::from_slice(bytes).map_err(|e| match forged_run_id(bytes) {
            Some(bad) => format!("marker has {bad}"),
            None => format!("unreadable marker: {}", escape_bytes(e.to_string().as_bytes())),
        })?;
        if m.v != FORMAT {
            return Err(format!("marker format {} is not {FORMAT}", m.v));
        }
        Ok(m)
    }
}

/// The first of the run ids in a marker (its own, then its shards' heartbeats) that is none,
/// read as plain strings: when a marker does not decode, the one to name.
fn forged_run_id(bytes: &[u8]) -> Option<NotARunId> {
    #[derive(Deserialize)]
    struct Runs {
        run: String,
        #[serde(default)]
        shards: Option<Running>,
    }
    #[derive(Deserialize)]
    struct Running {
        running: Vec<(u32, String, u64)>,
    }
    let runs: Runs = serde_json::from_slice(bytes).ok()?;
    let shard_runs = runs.shards.into_iter().flat_map(|s| s.running).map(|(_, run, _)| run);
    std::iter::once(runs.run).chain(shard_runs).find_map(|r| RunId::parse(r).err())
}

/// What was found on the root.
#[derive(Debug, Clone, PartialEq, Eq)]
// One per volume and run: boxing the marker would buy nothing.
#[allow(clippy::large_enum_variant)]
pub enum Found {
    /// The filesystem has no user xattrs (ramfs, some NFS).
    Unsupported,
    Absent,
    /// Present but not a marker of this format, and why: text safe to log as it is (whatever
    /// it quotes from the xattr is escaped).
    Unreadable(String),
    Marker(Marker),
}

impl Found {
    /// What reports say of it.
    pub fn state(&self) -> MarkerState {
        match self {
            Found::Unsupported => MarkerState::Unsupported,
            Found::Absent => MarkerState::None,
            Found::Unreadable(_) => MarkerState::Unreadable,
            Found::Marker(m) => m.state.into(),
        }
    }
}

/// Everything the skip-or-walk decision depends on.
#[derive(Debug, Clone)]
pub struct Inputs<'a> {
    pub found: &'a Found,
    pub digest: &'a Digest,
    pub spec: &'a str,
    pub root_conforms: bool,
    pub force: bool,
    pub verify: Verify,
    pub reverify_after: Option<Duration>,
    pub now: u64,
    /// The [`mounts_digest`] of the mount points below the root now, when the marker records
    /// one (else not looked up).
    pub mounts_now: Option<MountsDigest>,
}

/// Skip the walk, or walk and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    Skip(String),
    /// Walk; `resume` is true when an interrupted run of this spec may be continued.
    Walk {
        reason: String,
        resume: bool,
    },
}

/// Why an `in-progress` marker (without `left`) may be there: the marker does not say which.
const UNFINISHED: &str = "interrupted, or some entries failed";

/// The skip-or-walk rule. Skipping needs a `done` marker for this very spec digest AND a
/// conforming root; anything else walks. Only an `in-progress` marker of the same spec resumes.
pub fn decide(i: &Inputs<'_>) -> Decision {
    if i.force {
        return walk("--force".into());
    }
    match i.found {
        Found::Unsupported if i.verify == Verify::Marker && i.root_conforms => {
            Decision::Skip("no xattr support here; the root conforms (the kubelet's OnRootMismatch rule)".into())
        }
        Found::Unsupported => walk("no xattr support here and the root does not conform".into()),
        Found::Absent => walk("no marker".into()),
        Found::Unreadable(e) => walk(e.clone()),
        Found::Marker(m) if m.digest != *i.digest => {
            walk(format!("spec changed: marker is for '{}', now '{}'", m.spec, i.spec))
        }
        Found::Marker(m) if m.state == State::InProgress => unfinished(i, m),
        Found::Marker(_) if !i.root_conforms => walk("marker says done, but the root does not conform".into()),
        Found::Marker(m) if m.mounts.is_some() && m.mounts != i.mounts_now => walk(
            "the mount points below the root are not those of the pass that marked it done (what an unmounted one hid was never walked)".into(),
        ),
        Found::Marker(_) if i.verify == Verify::Full => walk("--verify full".into()),
        Found::Marker(m) => by_age(i, m),
    }
}

/// Walk the whole tree, for `reason`.
fn walk(reason: String) -> Decision {
    Decision::Walk { reason, resume: false }
}

/// Walk, continuing the interrupted run of this spec, for `reason`.
fn resume(reason: String) -> Decision {
    Decision::Walk { reason, resume: true }
}

/// An `in-progress` marker of this spec: resume, unless the pass finished unprivileged (walk
/// again: nothing to resume).
fn unfinished(i: &Inputs<'_>, m: &Marker) -> Decision {
    let run = &m.run;
    if i.verify == Verify::Full {
        // Nothing is skipped on the checkpoint's word; its special-bit records are still honoured.
        return resume(format!(
            "previous pass (run {run}) did not finish ({UNFINISHED}); --verify full: walking everything"
        ));
    }
    match m.left {
        Some(n) => walk(format!(
            "previous pass (run {run}) finished unprivileged and left {n} {} of other users that do not conform: walking again (a privileged run fixes them)",
            if n == 1 { "entry" } else { "entries" }
        )),
        None => resume(format!("previous pass (run {run}) did not finish ({UNFINISHED}): resuming")),
    }
}

/// A `done` marker of this spec on a conforming root: skip, unless `--reverify-after` finds it
/// too old (or from the future).
fn by_age(i: &Inputs<'_>, m: &Marker) -> Decision {
    let when = m.finished.unwrap_or(m.started);
    let age = i.now.saturating_sub(when);
    if let Some(max) = i.reverify_after {
        // A time in the future (forged, or a skewed clock) would never grow old: it is stale.
        if when > i.now {
            let ahead = human_age(when - i.now);
            return walk(format!("marker's finish time is {ahead} in the future: taken as stale"));
        }
        if age > max.as_secs() {
            return walk(format!("marker is {} old, more than --reverify-after", human_age(age)));
        }
    }
    Decision::Skip(format!("marker says done for this spec ({} ago) and the root conforms", human_age(age)))
}

/// `90061` → `1d1h1m`.
pub fn human_age(secs: u64) -> String {
    let (d, h, m, s) = (secs / 86400, secs / 3600 % 24, secs / 60 % 60, secs % 60);
    match (d, h, m) {
        (0, 0, 0) => format!("{s}s"),
        (0, 0, _) => format!("{m}m{s}s"),
        (0, _, _) => format!("{h}h{m}m"),
        _ => format!("{d}d{h}h"),
    }
}

pub fn now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// Reads the marker on the root.
pub fn read(root: BorrowedFd<'_>) -> Found {
    match sys::get_xattr(root, MARKER_XATTR) {
        Ok(None) => Found::Absent,
        Ok(Some(b)) => Marker::decode(&b).map_or_else(Found::Unreadable, Found::Marker),
        Err(Errno::OPNOTSUPP) => Found::Unsupported,
        Err(e) => Found::Unreadable(format!("cannot read marker: {e}")),
    }
}

/// The most per-shard checkpoints looked at or removed: the shard count on the root is
/// app-writable, and a forged one must not cost a syscall per claimed shard.
const MAX_SHARD_CHECKPOINTS: u32 = 1024;

/// The indices of the per-shard checkpoints of a round of `n` shards that are looked at.
pub fn shard_indices(n: u32) -> std::ops::Range<u32> {
    0..n.min(MAX_SHARD_CHECKPOINTS)
}

/// Writes the marker. When it does not fit beside the checkpoints (a small filesystem), they are
/// removed and the write is tried again: a missing checkpoint only makes a resume read again
/// what it had recorded, and the special-bit records stay (they have their own xattr).
pub fn write(root: BorrowedFd<'_>, m: &Marker) -> Result<(), Errno> {
    let bytes = m.encode();
    match sys::set_xattr(root, MARKER_XATTR, &bytes) {
        Err(e) if no_room(e) => {
            let _ = remove_checkpoint(root, CHECKPOINT_XATTR);
            for i in shard_indices(m.shards.as_ref().map_or(0, |s| s.n)) {
                let _ = remove_checkpoint(root, &checkpoint_xattr(Some(i)));
            }
            sys::set_xattr(root, MARKER_XATTR, &bytes)
        }
        other => other,
    }
}

/// Reads the checkpoint in xattr `name` ([`checkpoint_xattr`]); a missing or unreadable one is
/// no checkpoint.
pub fn read_checkpoint(root: BorrowedFd<'_>, name: &CStr) -> Option<Checkpoint> {
    let bytes = sys::get_xattr(root, name).ok()??;
    serde_json::from_slice(&bytes).ok()
}

pub fn write_checkpoint(root: BorrowedFd<'_>, name: &CStr, c: &Checkpoint) -> Result<(), Errno> {
    sys::set_xattr(root, name, &c.encode())
}

/// Reads the special-bit records in xattr `name` ([`pending_xattr`]); missing or unreadable ones
/// are none.
pub fn read_pending(root: BorrowedFd<'_>, name: &CStr) -> Option<Pending> {
    let bytes = sys::get_xattr(root, name).ok()??;
    serde_json::from_slice(&bytes).ok()
}

/// Writes the special-bit records (removes the xattr when there are none).
pub fn write_pending(root: BorrowedFd<'_>, name: &CStr, p: &Pending) -> Result<(), Errno> {
    if p.pending.is_empty() {
        return sys::remove_xattr(root, name);
    }
    sys::set_xattr(root, name, &serde_json::to_vec(p).expect("records serialize"))
}

/// Removes the marker (an absent one is no error).
pub fn remove(root: BorrowedFd<'_>) -> Result<(), Errno> {
    sys::remove_xattr(root, MARKER_XATTR)
}

pub fn remove_checkpoint(root: BorrowedFd<'_>, name: &CStr) -> Result<(), Errno> {
    sys::remove_xattr(root, name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::marker::shards::MAX_CLAIMS;
    use crate::verify::Stamp;

    /// The digest of the spec the tests' runs are for.
    static D1: std::sync::LazyLock<Digest> = std::sync::LazyLock::new(|| "d1".into());

    fn run(id: &str) -> RunId {
        RunId::parse(id).unwrap()
    }

    fn marker(state: State, digest: &str) -> Marker {
        Marker {
            finished: Some(1100),
            entries: Some(5),
            ..Marker::new(state, &digest.into(), "fs-group=1000", &run("r1"), 1000)
        }
    }

    fn inputs(found: &Found) -> Inputs<'_> {
        Inputs {
            found,
            digest: &D1,
            spec: "fs-group=1000",
            root_conforms: true,
            force: false,
            verify: Verify::Marker,
            reverify_after: None,
            now: 2000,
            mounts_now: None,
        }
    }

    #[test]
    fn marker_round_trips_and_is_small() {
        let m = marker(State::Done, "0123456789abcdef");
        let bytes = m.encode();
        assert_eq!(Marker::decode(&bytes).unwrap(), m);
        assert!(bytes.len() < 200, "{}", bytes.len());
        let text = String::from_utf8(bytes).unwrap();
        assert!(text.contains("\"state\":\"done\""), "{text}");
        assert!(Marker::decode(b"{\"v\":2}").is_err());
        assert!(Marker::decode(b"garbage").is_err());
    }

    #[test]
    fn done_marker_for_this_spec_skips() {
        let f = Found::Marker(marker(State::Done, "d1"));
        assert!(matches!(decide(&inputs(&f)), Decision::Skip(_)));
    }

    #[test]
    fn everything_else_walks() {
        let done = Found::Marker(marker(State::Done, "d1"));
        let other = Found::Marker(marker(State::Done, "d0"));
        let cases: Vec<(Inputs<'_>, &str)> = vec![
            (Inputs { force: true, ..inputs(&done) }, "--force"),
            (inputs(&Found::Absent), "no marker"),
            (inputs(&other), "spec changed"),
            (Inputs { root_conforms: false, ..inputs(&done) }, "root does not conform"),
            (Inputs { verify: Verify::Full, ..inputs(&done) }, "--verify full"),
            (Inputs { reverify_after: Some(Duration::from_secs(60)), ..inputs(&done) }, "reverify"),
        ];
        for (i, why) in cases {
            match decide(&i) {
                Decision::Walk { resume, reason } => {
                    assert!(!resume, "{why}");
                    assert!(reason.contains(why), "{reason} / {why}");
                }
                d => panic!("{why}: {d:?}"),
            }
        }
    }

    #[test]
    fn a_done_marker_that_met_mounts_skips_only_while_the_same_mounts_are_there() {
        let digest = mounts_digest(Some(&[b"a/m".to_vec(), b"f".to_vec()]));
        assert_eq!(digest.as_ref().map(|d| d.to_string().len()), Some(16));
        assert_ne!(digest, mounts_digest(Some(&[b"a/m".to_vec()])));
        assert_ne!(mounts_digest(Some(&[])), None);
        let f = Found::Marker(Marker { mounts: digest.clone(), ..marker(State::Done, "d1") });
        assert!(matches!(decide(&Inputs { mounts_now: digest.clone(), ..inputs(&f) }), Decision::Skip(_)));
        for now in [mounts_digest(Some(&[b"f".to_vec()])), None] {
            let Decision::Walk { reason, resume: false } = decide(&Inputs { mounts_now: now, ..inputs(&f) }) else {
                panic!("a mount point gone (or mounts that can't be listed) walks");
            };
            assert!(reason.contains("mount points"), "{reason}");
        }
        // A marker of a pass that met none does not look.
        assert!(matches!(decide(&inputs(&Found::Marker(marker(State::Done, "d1")))), Decision::Skip(_)));
    }

    #[test]
    fn only_an_interrupted_run_of_the_same_spec_resumes() {
        let ip = Found::Marker(marker(State::InProgress, "d1"));
        assert!(matches!(decide(&inputs(&ip)), Decision::Walk { resume: true, .. }));
        let ip_other = Found::Marker(marker(State::InProgress, "d0"));
        assert!(matches!(decide(&inputs(&ip_other)), Decision::Walk { resume: false, .. }));
        assert!(matches!(decide(&Inputs { force: true, ..inputs(&ip) }), Decision::Walk { resume: false, .. }));
    }

    #[test]
    fn a_partial_unprivileged_pass_is_walked_again_not_resumed() {
        let partial = Found::Marker(Marker { left: Some(3), ..marker(State::InProgress, "d1") });
        match decide(&inputs(&partial)) {
            Decision::Walk { resume, reason } => {
                assert!(!resume, "a finished pass has nothing to resume");
                assert!(reason.contains("left 3 entries of other users"), "{reason}");
            }
            d => panic!("{d:?}"),
        }
        // The field is optional: markers without it read as before.
        let m = marker(State::Done, "d1");
        assert!(!String::from_utf8(m.encode()).unwrap().contains("left"));
    }

    #[test]
    fn no_xattrs_falls_back_to_the_root_check() {
        let u = Found::Unsupported;
        assert!(matches!(decide(&inputs(&u)), Decision::Skip(_)));
        assert!(matches!(decide(&Inputs { root_conforms: false, ..inputs(&u) }), Decision::Walk { .. }));
        assert!(matches!(decide(&Inputs { verify: Verify::Full, ..inputs(&u) }), Decision::Walk { .. }));
    }

    #[test]
    fn shard_records_must_fit_the_layout() {
        let s = |parts: &str| Shards { n: 2, depth: 1, parts: parts.into(), ..Default::default() };
        assert_eq!(s("11").misfit(2, 1), None);
        assert!(s("11").complete() && !s("10").complete() && s("10").is_done(0));
        assert_eq!(Shards::new(2, 1), s("00"));
        for bad in ["", "1", "111", "1x", "1\u{e9}"] {
            assert!(s(bad).misfit(2, 1).is_some(), "{bad:?}");
        }
        assert!(s("11").misfit(3, 1).is_some() && s("11").misfit(2, 2).is_some());
        let running = Shards { running: vec![(7, run("r"), 1).into()], ..s("00") };
        assert!(running.misfit(2, 1).is_some());
        // A record of an earlier version (a `done` list, per-shard claims): a new round.
        let old = br#"{"n":2,"depth":1,"done":[0],"entries":5,"running":[],"claims":[{"i":0,"t":[1,2],"a":"00"}]}"#;
        assert!(serde_json::from_slice::<Shards>(old).map_or(true, |s| s.misfit(2, 1).is_some()));
    }

    #[test]
    fn shard_claims_group_by_clock_and_the_record_does_not_grow_with_the_shards_done() {
        let t = |sec: i64| Stamp { sec: 1_700_000_000 + sec, nsec: 5 };
        let digest = |i: u32| AnchorDigest::from(format!("{:016x}", 0x1234_5678_9abc_def0u64.rotate_left(i)));
        let mut s = Shards::new(40, 1);
        s.set_done(3, None);
        assert!(s.is_done(3) && s.claim(3).is_none(), "done without a claim");
        s.set_done(5, Some((t(0), &digest(5))));
        let (k, c) = s.claim(5).expect("a claim");
        assert_eq!((k, c.t, c.a.clone()), (0, t(0), digest(5)));
        // Every shard done, each at its own time: at most MAX_CLAIMS groups, each the earliest
        // clock of its members and the XOR of their digests.
        let mut sizes = Vec::new();
        for i in 0..40 {
            s.set_done(i, Some((t(i as i64 * 7 % 13), &digest(i))));
            sizes.push(serde_json::to_vec(&s).unwrap().len());
        }
        assert!(s.complete() && s.claims.len() <= MAX_CLAIMS, "{s:?}");
        assert!(sizes.iter().skip(MAX_CLAIMS).all(|&n| n <= sizes[MAX_CLAIMS]), "{sizes:?}");
        for (k, c) in s.claims.iter().enumerate() {
            let members = s.members(k);
            let ds: Vec<AnchorDigest> = members.iter().map(|&i| digest(i)).collect();
            assert_eq!(c.a, AnchorDigest::xor(&ds), "group {k}");
            assert_eq!(c.t, members.iter().map(|&i| t(i as i64 * 7 % 13)).min().unwrap(), "group {k}");
        }
        // Undone with its digest: the group keeps the others'; without: the others lose the claim.
        let (k, _) = s.claim(7).unwrap();
        let others: Vec<u32> = s.members(k).into_iter().filter(|&i| i != 7).collect();
        s.undo(7, Some(&digest(7)));
        assert!(!s.is_done(7));
        if let Some(&o) = others.first() {
            let (k, c) = s.claim(o).unwrap();
            let ds: Vec<AnchorDigest> = s.members(k).iter().map(|&i| digest(i)).collect();
            assert_eq!(c.a, AnchorDigest::xor(&ds));
        }
        let (k, _) = s.claim(8).unwrap();
        let group = s.members(k);
        s.undo(8, None);
        assert!(group.iter().all(|&i| i == 8 || (s.is_done(i) && s.claim(i).is_none())), "{s:?}");
        let m = Marker { shards: Some(s.clone()), ..marker(State::InProgress, "d1") };
        assert_eq!(Marker::decode(&m.encode()).unwrap(), m);
        let mut dangling = s.clone();
        dangling.claims.truncate(1);
        dangling.forget_dangling();
        assert!((0..40).all(|i| dangling.claim(i).is_none_or(|(k, _)| k == 0)), "{dangling:?}");
        assert_eq!(dangling.done(), s.done());
        s.drop_claims();
        assert!(s.claims.is_empty() && s.done().len() == 38 && (0..40).all(|i| s.claim(i).is_none()));
    }

    #[test]
    fn a_round_of_1024_shards_fits_a_4k_block_with_room_for_running_ones() {
        let mut m = Marker {
            run: run("61b8369b5344-4f53@volprep-fleet-1023-abcde"),
            ..marker(State::InProgress, "0123456789abcdef")
        };
        let mut s = Shards::new(1024, 3);
        let a = AnchorDigest::from("0123456789abcdef".to_string());
        for i in 0..1023 {
            s.set_done(i, Some((Stamp { sec: 1_800_000_000 + i as i64, nsec: 999_999_999 }, &a)));
        }
        m.shards = Some(s);
        let bytes = m.encode().len();
        assert!(bytes < 2100, "1023 of 1024 shards done: {bytes} bytes");
    }

    #[test]
    fn the_anchor_digest_is_of_names_and_inodes_in_any_order() {
        let d = |v: &[(&str, u64)]| {
            AnchorDigest::of(&mut v.iter().map(|(n, i)| (n.as_bytes().to_vec(), *i)).collect::<Vec<_>>())
        };
        let a = d(&[("a", 1), ("c", 3)]);
        assert_eq!(serde_json::to_string(&a).unwrap().len(), 18, "16 hex digits, quoted");
        assert_eq!(a, d(&[("c", 3), ("a", 1)]));
        assert_ne!(a, d(&[("a", 1), ("e", 3)]), "a renamed anchor");
        assert_ne!(a, d(&[("a", 1), ("c", 4)]), "a replaced anchor");
        assert_ne!(a, d(&[("a", 1)]), "a removed anchor");
        assert_ne!(d(&[("ab", 1)]), d(&[("a", 0x62)]), "names and inodes do not run together");
    }

    #[test]
    fn a_finish_time_in_the_future_is_stale_for_reverify() {
        let mut m = marker(State::Done, "d1");
        m.finished = Some(1_000_000);
        let f = Found::Marker(m);
        let i = Inputs { reverify_after: Some(Duration::from_secs(3600)), ..inputs(&f) };
        assert!(matches!(decide(&i), Decision::Walk { reason, .. } if reason.contains("future")));
        assert!(matches!(decide(&inputs(&f)), Decision::Skip(_)), "without --reverify-after, age does not matter");
    }

    #[test]
    fn verify_full_resumes_without_skipping_and_strings_are_escaped() {
        let f = Found::Marker(marker(State::InProgress, "d1"));
        match decide(&Inputs { verify: Verify::Full, ..inputs(&f) }) {
            Decision::Walk { reason, resume } => {
                assert!(resume && reason.contains("--verify full") && reason.contains("(run r1)"), "{reason}");
            }
            d => panic!("{d:?}"),
        }
        let forged = Marker { spec: "fs-group=1\nFAKE\u{2028}".into(), ..marker(State::Done, "d0") };
        match decide(&inputs(&Found::Marker(forged))) {
            Decision::Walk { reason, .. } => {
                assert!(reason.contains("'fs-group=1\\nFAKE\\u{2028}'"), "{reason}");
            }
            d => panic!("{d:?}"),
        }
    }

    #[test]
    fn checkpoints_of_the_first_format_skip_nothing() {
        let old = br#"{"run":"r1","digest":"d1","done":[[7,"repo-1"]],"pending":[["a",1,2048]]}"#;
        let c: Checkpoint = serde_json::from_slice(old).unwrap();
        assert!(c.records().is_empty(), "{c:?}");
        assert_eq!(c.pending.len(), 1, "its special-bit records are still honoured");
        let mut new = Checkpoint::new(&run("r1"), &D1);
        new.dirs.push("2:1.0:3:4:0@9".into());
        let back: Checkpoint = serde_json::from_slice(&new.encode()).unwrap();
        assert_eq!(back.records(), ["2:1.0:3:4:0@9".to_string()]);
        assert_eq!(checkpoint_xattr(None).as_c_str(), CHECKPOINT_XATTR);
        assert_eq!(checkpoint_xattr(Some(3)).to_str().unwrap(), "user.volprep.checkpoint.3");
    }

    #[test]
    fn a_forged_run_id_makes_the_marker_unreadable() {
        let good = Marker {
            shards: Some(Shards { n: 2, running: vec![(0, run("r2"), 1).into()], ..Shards::default() }),
            ..marker(State::InProgress, "d1")
        };
        assert_eq!(Marker::decode(&good.encode()).unwrap(), good);
        let forge = |bad: &str, at: &str| {
            let mut v: serde_json::Value = serde_json::from_slice(&good.encode()).unwrap();
            *v.pointer_mut(at).unwrap() = bad.into();
            Marker::decode(&serde_json::to_vec(&v).unwrap()).unwrap_err()
        };
        for bad in ["", "r\u{2028}FAKE", "r\u{e0041}", "r\u{200b}", "a b", "r\nx", "r\\x", &"r".repeat(101)] {
            let shown = crate::escape::escape_bytes(bad.as_bytes());
            for at in ["/run", "/shards/running/0/1"] {
                let e = forge(bad, at);
                assert_eq!(e, format!("marker has a run id volprep does not write: '{shown}'"), "{bad:?} at {at}");
            }
        }
        // A marker that does not parse for another reason says that reason.
        let e = forge("x", "/started");
        assert!(e.starts_with("unreadable marker: invalid type"), "{e}");
        let e = Marker::decode(br#"{"v":2,"state":"done","digest":"d","spec":"s","run":"r1","started":1}"#);
        assert_eq!(e.unwrap_err(), "marker format 2 is not 1");
    }

    /// A checkpoint or special-bit record of a run id volprep never writes is none at all (it
    /// could never belong to the run a valid marker names).
    #[test]
    fn a_forged_run_id_makes_checkpoints_and_records_unreadable() {
        let c = br#"{"run":"r1\nX","digest":"d1","v":3,"dirs":[],"pending":[]}"#;
        assert!(serde_json::from_slice::<Checkpoint>(c).is_err());
        let p = br#"{"run":"r1\u2028","digest":"d1","pending":[["a",1,2048]]}"#;
        assert!(serde_json::from_slice::<Pending>(p).is_err());
        let ok = br#"{"run":"r1","digest":"d1","pending":[["a",1,2048]]}"#;
        assert_eq!(serde_json::from_slice::<Pending>(ok).unwrap().run, run("r1"));
    }

    #[test]
    fn heartbeats_keep_their_wire_format() {
        let old = br#"{"n":2,"depth":1,"parts":"00","entries":0,"running":[[1,"5f-7@h",1700000000]]}"#;
        let s: Shards = serde_json::from_slice(old).unwrap();
        assert_eq!(s.running, [Heartbeat { shard: 1, run: run("5f-7@h"), at: 1_700_000_000 }]);
        assert_eq!(serde_json::to_vec(&s).unwrap(), old.to_vec());
    }

    #[test]
    fn the_report_word_of_each_marker_found() {
        let words: Vec<String> = [
            Found::Unsupported,
            Found::Absent,
            Found::Unreadable("x".into()),
            Found::Marker(marker(State::Done, "d")),
            Found::Marker(marker(State::InProgress, "d")),
        ]
        .iter()
        .map(|f| f.state().to_string())
        .collect();
        assert_eq!(words, ["unsupported", "none", "unreadable", "done", "in-progress"]);
    }

    #[test]
    fn ages_read_well() {
        assert_eq!(human_age(90061), "1d1h");
        assert_eq!(human_age(59), "59s");
    }
}
