//! The marker: xattr state on the volume root (`user.volprep`) saying which spec the volume was
//! prepared for, the resume checkpoint (`user.volprep.checkpoint`, `.checkpoint.I` for shard I)
//! of an unfinished pass, and its special-bit records (`user.volprep.pending`, `.pending.I`).
//!
//! All xattrs of the root share one space, as small as ~900 bytes on ext4 with 1 KiB blocks
//! (what mke2fs picks below 512 MiB). The marker comes first: when it does not fit, the
//! checkpoints give way (they only save re-reading). Special-bit records live in their own
//! small xattr, so a big checkpoint never pushes them out.
//! Encoding and the skip/walk decision are pure; reads and writes go through `sys`.

use std::ffi::CStr;
use std::os::fd::BorrowedFd;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rustix::io::Errno;
use serde::{Deserialize, Serialize};

use crate::escape::escape_bytes;
use crate::options::Verify;
use crate::special::SpecialRecord;
use crate::sys;

/// A string read from the root (the app may have written it), escaped for logs and messages.
pub fn escape_str(s: &str) -> String {
    escape_bytes(s.as_bytes())
}

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

/// Whether a failed xattr write means the value does not fit (the root's xattr space is full,
/// or the filesystem's limit on one value is smaller): a smaller value may still fit.
pub fn no_room(e: Errno) -> bool {
    matches!(e, Errno::NOSPC | Errno::TOOBIG | Errno::RANGE | Errno::DQUOT)
}

/// The state a pass leaves on the root. Short keys keep it small.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Marker {
    /// Format version.
    pub v: u32,
    pub state: State,
    /// `Spec::digest` of the spec this state is for.
    pub digest: String,
    /// The spec in words, for people (`status`, logs).
    pub spec: String,
    /// The run that wrote it; a checkpoint belongs to one run.
    pub run: String,
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
}

/// Where the shards of one sharded pass stand: the meeting point of their Jobs.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Shards {
    /// N of `--shard I/N`.
    pub n: u32,
    /// `--shard-depth` (every shard must split the tree the same way).
    pub depth: u32,
    /// Shards that finished with no error, in order.
    pub done: Vec<u32>,
    /// Entries of the shards in `done`.
    pub entries: u64,
    /// Shards being walked: index, run id and the last heartbeat (unix seconds).
    pub running: Vec<(u32, String, u64)>,
    /// What each shard in `done` claims to have walked, for the run that completes the volume
    /// to check (absent in records of earlier versions: a done shard without a claim has its
    /// part walked again by that run).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub claims: Vec<Claim>,
}

/// A done shard's claim: the anchors of its part, as they were when its walk began, and the
/// filesystem's time once it ended. A directory of its part changed after that time has a
/// change time (ctime) at or past it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claim {
    /// The shard.
    pub i: u32,
    /// The root's ctime (seconds, nanoseconds) read right after a write on the root that
    /// followed the walk: the filesystem's clock, not this process's.
    pub t: (i64, u32),
    /// [`anchor_digest`] of the part's anchors (and, for shard 0, the entries above the split
    /// depth) listed before the walk.
    pub a: String,
}

/// The digest of a part's anchors: each one's path relative to the root and inode number, in
/// any order. 16 hex digits of SHA-256.
pub fn anchor_digest(anchors: &mut [(Vec<u8>, u64)]) -> String {
    use sha2::{Digest, Sha256};
    anchors.sort_unstable();
    let mut h = Sha256::new();
    for (rel, ino) in anchors.iter() {
        h.update(rel);
        h.update([0]);
        h.update(ino.to_le_bytes());
    }
    h.finalize().iter().take(8).map(|b| format!("{b:02x}")).collect()
}

impl Shards {
    /// Why this record does not fit the layout of `n` shards split at `depth`, if it does not:
    /// another layout, an index past N, or a `done` list that is not a set in order. A record
    /// that does not fit is not trusted at all (a forged `[1, 1]` must not pass for two shards).
    pub fn misfit(&self, n: u32, depth: u32) -> Option<String> {
        if (self.n, self.depth) != (n, depth) {
            return Some(format!(
                "it is for {} shards split at depth {}, not {n} at depth {depth}",
                self.n, self.depth
            ));
        }
        if let Some(i) = self.done.iter().chain(self.running.iter().map(|r| &r.0)).find(|&&i| i >= n) {
            return Some(format!("it lists shard {i}, past the last of {n}"));
        }
        if self.done.windows(2).any(|w| w[0] >= w[1]) {
            return Some(format!("its done list {:?} repeats a shard or is out of order", self.done));
        }
        None
    }

    /// Whether every shard is done (for a record that fits its layout).
    pub fn complete(&self) -> bool {
        self.done.len() as u32 == self.n
    }

    /// The claim of shard `i`, if it is done and made one.
    pub fn claim(&self, i: u32) -> Option<&Claim> {
        self.claims.iter().find(|c| c.i == i).filter(|_| self.done.contains(&i))
    }

    /// Records shard `i` as done with `claim` (none when its anchors could not be listed).
    pub fn set_done(&mut self, i: u32, claim: Option<Claim>) {
        if !self.done.contains(&i) {
            self.done.push(i);
            self.done.sort_unstable();
        }
        self.claims.retain(|c| c.i != i);
        self.claims.extend(claim);
    }

    /// Takes shard `i` out of `done`, with its claim.
    pub fn undo(&mut self, i: u32) {
        self.done.retain(|&d| d != i);
        self.claims.retain(|c| c.i != i);
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum State {
    Done,
    InProgress,
}

/// What an unfinished run has finished, kept on the root only (nothing is written below it).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checkpoint {
    pub run: String,
    pub digest: String,
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
    pub fn new(run: &str, digest: &str) -> Self {
        Checkpoint { run: run.into(), digest: digest.into(), v: CHECKPOINT_FORMAT, ..Default::default() }
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
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pending {
    pub run: String,
    pub digest: String,
    pub pending: Vec<SpecialRecord>,
}

impl Marker {
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("marker serializes")
    }

    pub fn decode(bytes: &[u8]) -> Result<Marker, String> {
        let m: Marker =
            serde_json::from_slice(bytes).map_err(|e| format!("unreadable marker: {}", escape_str(&e.to_string())))?;
        if m.v != FORMAT {
            return Err(format!("marker format {} is not {FORMAT}", m.v));
        }
        // A resumed pass carries the run id into its own marker and logs: one volprep would not
        // write (U+2028, a tag character, a forged line) makes the whole marker untrusted.
        let shard_runs = m.shards.iter().flat_map(|s| s.running.iter().map(|r| r.1.as_str()));
        if let Some(bad) = std::iter::once(m.run.as_str()).chain(shard_runs).find(|r| !valid_run_id(r)) {
            return Err(format!("marker has a run id volprep does not write: '{}'", escape_str(bad)));
        }
        Ok(m)
    }
}

/// What was found on the root.
#[derive(Debug, Clone, PartialEq, Eq)]
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
    /// A short word for reports: `unsupported`, `none`, `unreadable`, `done`, `in-progress`.
    pub fn state_word(&self) -> &'static str {
        match self {
            Found::Unsupported => "unsupported",
            Found::Absent => "none",
            Found::Unreadable(_) => "unreadable",
            Found::Marker(m) if m.state == State::Done => "done",
            Found::Marker(_) => "in-progress",
        }
    }
}

/// Everything the skip-or-walk decision depends on.
#[derive(Debug, Clone)]
pub struct Inputs<'a> {
    pub found: &'a Found,
    pub digest: &'a str,
    pub spec: &'a str,
    pub root_conforms: bool,
    pub force: bool,
    pub verify: Verify,
    pub reverify_after: Option<Duration>,
    pub now: u64,
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
    let walk = |reason: String, resume: bool| Decision::Walk { reason, resume };
    if i.force {
        return walk("--force".into(), false);
    }
    let m = match i.found {
        Found::Unsupported if i.verify == Verify::Marker && i.root_conforms => {
            return Decision::Skip(
                "no xattr support here; the root conforms (the kubelet's OnRootMismatch rule)".into(),
            );
        }
        Found::Unsupported => {
            return walk("no xattr support here and the root does not conform".into(), false);
        }
        Found::Absent => return walk("no marker".into(), false),
        Found::Unreadable(e) => return walk(e.clone(), false),
        Found::Marker(m) => m,
    };
    if m.digest != i.digest {
        return walk(format!("spec changed: marker is for '{}', now '{}'", escape_str(&m.spec), i.spec), false);
    }
    if m.state == State::InProgress && i.verify == Verify::Full {
        // Nothing is skipped on the checkpoint's word; its special-bit records are still honoured.
        let run = escape_str(&m.run);
        return walk(
            format!("previous pass (run {run}) did not finish ({UNFINISHED}); --verify full: walking everything"),
            true,
        );
    }
    if let (State::InProgress, Some(n)) = (m.state, m.left) {
        return walk(
            format!(
                "previous pass (run {}) finished unprivileged and left {n} {} of other users that do not conform: walking again (a privileged run fixes them)",
                escape_str(&m.run),
                if n == 1 { "entry" } else { "entries" }
            ),
            false,
        );
    }
    if m.state == State::InProgress {
        return walk(
            format!("previous pass (run {}) did not finish ({UNFINISHED}): resuming", escape_str(&m.run)),
            true,
        );
    }
    if !i.root_conforms {
        return walk("marker says done, but the root does not conform".into(), false);
    }
    if i.verify == Verify::Full {
        return walk("--verify full".into(), false);
    }
    let when = m.finished.unwrap_or(m.started);
    if i.reverify_after.is_some() {
        // A time in the future (forged, or a skewed clock) would never grow old: it is stale.
        if when > i.now {
            return walk(
                format!("marker's finish time is {} in the future: taken as stale", human_age(when - i.now)),
                false,
            );
        }
    }
    let age = i.now.saturating_sub(when);
    if let Some(max) = i.reverify_after {
        if age > max.as_secs() {
            return walk(format!("marker is {} old, more than --reverify-after", human_age(age)), false);
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

/// A run id: unique enough to tell runs apart (time, pid and host), short enough for the marker.
pub fn new_run_id() -> String {
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    format!("{:x}-{}@{}", (nanos / 1000) as u64 & 0xffff_ffff_ffff, std::process::id(), hostname())
}

/// This machine's (or pod's) host name, or "-", as it goes into a run id: at most 63
/// characters, each not in `[A-Za-z0-9._-]` replaced by `_`.
pub fn hostname() -> String {
    let safe = |c: char| if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') { c } else { '_' };
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map_or_else(|_| "-".into(), |h| h.trim().chars().take(63).map(safe).collect())
}

/// Whether `id` is a run id volprep could have written ([`new_run_id`], or one of an earlier
/// version): 1 to 100 printable ASCII characters, no space, quote or backslash.
pub fn valid_run_id(id: &str) -> bool {
    (1..=100).contains(&id.len()) && id.bytes().all(|b| b.is_ascii_graphic() && !matches!(b, b'"' | b'\\' | b'\''))
}

/// Whether the run `id` is known to be dead: it ran on this host and its process is gone, or it
/// had this very pid (a restarted container, where volprep is pid 1 again).
pub fn run_is_dead_here(id: &str) -> bool {
    let Some((head, host)) = id.split_once('@') else { return false };
    let Some(pid) = head.split_once('-').and_then(|(_, p)| p.parse::<i32>().ok()) else { return false };
    if host != hostname() {
        return false;
    }
    if pid as u32 == std::process::id() {
        return true;
    }
    // SAFETY: signal 0 only checks that the process exists.
    unsafe { libc::kill(pid, 0) != 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH) }
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

/// Writes the marker. When it does not fit beside the checkpoints (a small filesystem), they are
/// removed and the write is tried again: a missing checkpoint only makes a resume read again
/// what it had recorded, and the special-bit records stay (they have their own xattr).
pub fn write(root: BorrowedFd<'_>, m: &Marker) -> Result<(), Errno> {
    let bytes = m.encode();
    match sys::set_xattr(root, MARKER_XATTR, &bytes) {
        Err(e) if no_room(e) => {
            let shards = m.shards.as_ref().map_or(0, |s| s.n.min(1024));
            let _ = remove_checkpoint(root, CHECKPOINT_XATTR);
            for i in 0..shards {
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

    fn marker(state: State, digest: &str) -> Marker {
        Marker {
            v: FORMAT,
            state,
            digest: digest.into(),
            spec: "fs-group=1000".into(),
            run: "r1".into(),
            started: 1000,
            finished: Some(1100),
            entries: Some(5),
            shards: None,
            left: None,
        }
    }

    fn inputs(found: &Found) -> Inputs<'_> {
        Inputs {
            found,
            digest: "d1",
            spec: "fs-group=1000",
            root_conforms: true,
            force: false,
            verify: Verify::Marker,
            reverify_after: None,
            now: 2000,
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
        let s = |done: Vec<u32>| Shards { n: 2, depth: 1, done, ..Default::default() };
        assert_eq!(s(vec![0, 1]).misfit(2, 1), None);
        assert!(s(vec![0, 1]).complete());
        assert!(s(vec![1, 1]).misfit(2, 1).is_some());
        assert!(s(vec![1, 0]).misfit(2, 1).is_some());
        assert!(s(vec![0, 5]).misfit(2, 1).is_some());
        assert!(s(vec![]).misfit(3, 1).is_some());
        assert!(s(vec![]).misfit(2, 2).is_some());
        let running = Shards { running: vec![(7, "r".into(), 1)], ..s(vec![]) };
        assert!(running.misfit(2, 1).is_some());
    }

    #[test]
    fn shard_claims_are_optional_and_only_count_for_done_shards() {
        let old = br#"{"v":1,"state":"in-progress","digest":"d","spec":"s","run":"r","started":1,
            "shards":{"n":2,"depth":1,"done":[0],"entries":5,"running":[]}}"#;
        let m = Marker::decode(old).unwrap();
        let mut s = m.shards.unwrap();
        assert!(s.claims.is_empty() && s.claim(0).is_none(), "a record of an earlier version has no claims");
        let c = Claim { i: 1, t: (1_700_000_000, 5), a: "00112233aabbccdd".into() };
        s.set_done(1, Some(c.clone()));
        assert_eq!((s.done.clone(), s.claim(1)), (vec![0, 1], Some(&c)));
        s.undo(1);
        assert!(s.claim(1).is_none() && s.claims.is_empty());
        s.claims.push(c.clone());
        assert!(s.claim(1).is_none(), "a claim of a shard not in done is no claim");
        let mut m = marker(State::InProgress, "d1");
        m.shards = Some(Shards { n: 16, depth: 1, done: (0..16).collect(), ..Default::default() });
        for i in 0..16 {
            m.shards.as_mut().unwrap().set_done(i, Some(Claim { i, ..c.clone() }));
        }
        let bytes = m.encode();
        assert_eq!(Marker::decode(&bytes).unwrap(), m);
        assert!(bytes.len() < 1200, "16 claims take {} bytes", bytes.len());
    }

    #[test]
    fn the_anchor_digest_is_of_names_and_inodes_in_any_order() {
        let d = |v: &[(&str, u64)]| {
            anchor_digest(&mut v.iter().map(|(n, i)| (n.as_bytes().to_vec(), *i)).collect::<Vec<_>>())
        };
        let a = d(&[("a", 1), ("c", 3)]);
        assert_eq!(a.len(), 16);
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
        let mut m = marker(State::InProgress, "d1");
        m.run = "r\nFAKE".into();
        let f = Found::Marker(m);
        match decide(&Inputs { verify: Verify::Full, ..inputs(&f) }) {
            Decision::Walk { reason, resume } => {
                assert!(resume && reason.contains("--verify full"), "{reason}");
                assert!(!reason.contains('\n'), "{reason}");
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
        let mut new = Checkpoint::new("r1", "d1");
        new.dirs.push("2:1.0:3:4:0@9".into());
        let back: Checkpoint = serde_json::from_slice(&new.encode()).unwrap();
        assert_eq!(back.records(), ["2:1.0:3:4:0@9".to_string()]);
        assert_eq!(checkpoint_xattr(None).as_c_str(), CHECKPOINT_XATTR);
        assert_eq!(checkpoint_xattr(Some(3)).to_str().unwrap(), "user.volprep.checkpoint.3");
    }

    #[test]
    fn a_forged_run_id_makes_the_marker_unreadable() {
        let good = marker(State::InProgress, "d1");
        assert!(valid_run_id(&new_run_id()), "{}", new_run_id());
        assert_eq!(Marker::decode(&good.encode()).unwrap(), good);
        for bad in ["", "r\u{2028}FAKE", "r\u{e0041}", "r\u{200b}", "a b", "r\nx", "r\\x", &"r".repeat(101)] {
            let mut m = good.clone();
            m.run = bad.into();
            let e = Marker::decode(&m.encode()).unwrap_err();
            assert!(e.contains("run id") && !e.contains('\u{2028}') && !e.contains('\n'), "{bad:?}: {e}");
            let mut m = good.clone();
            m.shards = Some(Shards { n: 2, running: vec![(0, bad.into(), 1)], ..Shards::default() });
            assert!(Marker::decode(&m.encode()).is_err(), "a shard's run {bad:?}");
        }
    }

    #[test]
    fn ages_read_well() {
        assert_eq!(human_age(90061), "1d1h");
        assert_eq!(human_age(59), "59s");
    }
}
