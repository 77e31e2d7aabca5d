//! The record of a sharded pass in the marker: which shards are done (with what they claim to
//! have walked) and which are being walked (with their heartbeats).

use serde::{Deserialize, Serialize};

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
    /// Shards being walked, each with its run and last heartbeat.
    pub running: Vec<Heartbeat>,
    /// What each shard in `done` claims to have walked, for the run that completes the volume
    /// to check (absent in records of earlier versions: a done shard without a claim has its
    /// part walked again by that run).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub claims: Vec<Claim>,
}

/// A shard being walked: which, by which run, and when that run last said it is alive. On the
/// wire a `[shard, run, at]` array.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "(u32, String, u64)", into = "(u32, String, u64)")]
pub struct Heartbeat {
    pub shard: u32,
    pub run: String,
    /// Unix seconds.
    pub at: u64,
}

impl From<(u32, String, u64)> for Heartbeat {
    fn from((shard, run, at): (u32, String, u64)) -> Self {
        Heartbeat { shard, run, at }
    }
}

impl From<Heartbeat> for (u32, String, u64) {
    fn from(h: Heartbeat) -> Self {
        (h.shard, h.run, h.at)
    }
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
        if let Some(i) = self.done.iter().chain(self.running.iter().map(|r| &r.shard)).find(|&&i| i >= n) {
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
