//! The record of a sharded pass in the marker: which shards are done (with what they claim to
//! have walked) and which are being walked (with their heartbeats).

use serde::{Deserialize, Serialize};

use crate::runid::RunId;
use crate::verify::Stamp;

/// Claim groups kept at most: past this, the two whose clocks are closest are merged.
pub const MAX_CLAIMS: usize = 14;

/// Where the shards of one sharded pass stand: the meeting point of their Jobs. Its size does
/// not grow with the shards that finish: one hex digit per shard, at most [`MAX_CLAIMS`] claim
/// groups, and a heartbeat per shard being walked.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Shards {
    /// N of `--shard I/N`.
    pub n: u32,
    /// `--shard-depth` (every shard must split the tree the same way).
    pub depth: u32,
    /// One hex digit per shard, shard 0 first: `0` not done; `1` done with nothing to check
    /// (no claim: the run that completes the volume walks its part again); `2`+k done, its
    /// claim in `claims[k]`. A record of an earlier version has none: it does not fit its
    /// layout, and a new round starts.
    #[serde(default)]
    pub parts: String,
    /// Entries of the shards that are done.
    pub entries: u64,
    /// Shards being walked, each with its run and last heartbeat.
    pub running: Vec<Heartbeat>,
    /// Claim groups of done shards, for the run that completes the volume to check.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub claims: Vec<Claim>,
}

/// A shard being walked: which, by which run, and when that run last said it is alive. On the
/// wire a `[shard, run, at]` array.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "(u32, RunId, u64)", into = "(u32, RunId, u64)")]
pub struct Heartbeat {
    pub shard: u32,
    pub run: RunId,
    /// Unix seconds.
    pub at: u64,
}

impl From<(u32, RunId, u64)> for Heartbeat {
    fn from((shard, run, at): (u32, RunId, u64)) -> Self {
        Heartbeat { shard, run, at }
    }
}

impl From<Heartbeat> for (u32, RunId, u64) {
    fn from(h: Heartbeat) -> Self {
        (h.shard, h.run, h.at)
    }
}

/// The claim of a group of done shards: the earliest of the times their walks ended, and the
/// XOR of their anchor digests. Every directory of their parts changed after its shard's walk
/// ended has a change time (ctime) at or past `t`; a part whose anchors changed changes `a`.
/// On the wire `{"t":[SEC,NSEC],"a":"HEX16"}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claim {
    /// The root's ctime read right after a write on the root that followed the walk: the
    /// filesystem's clock, not this process's (the earliest of the group).
    pub t: Stamp,
    /// The XOR ([`AnchorDigest::xor`]) of the group's digests of the parts' anchors (and, for
    /// shard 0, the entries above the split depth), each listed before its shard's walk.
    pub a: AnchorDigest,
}

/// The digest of a part's anchors ([`AnchorDigest::of`]), or the XOR of several parts'
/// ([`AnchorDigest::xor`]): 16 hex digits. Read back from the root it is whatever the record
/// held, only ever compared with a computed one (what is not 16 hex digits never equals one).
/// On the wire the plain string.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct AnchorDigest(String);

impl AnchorDigest {
    /// The digest of a part's anchors: each one's path relative to the root and inode number,
    /// in any order. 16 hex digits of SHA-256.
    pub fn of(anchors: &mut [(Vec<u8>, u64)]) -> AnchorDigest {
        use sha2::{Digest, Sha256};
        anchors.sort_unstable();
        let mut h = Sha256::new();
        for (rel, ino) in anchors.iter() {
            h.update(rel);
            h.update([0]);
            h.update(ino.to_le_bytes());
        }
        AnchorDigest(h.finalize().iter().take(8).map(|b| format!("{b:02x}")).collect())
    }

    /// The XOR of `digests` (one that does not parse counts as a digest no part has).
    pub fn xor<'d>(digests: impl IntoIterator<Item = &'d AnchorDigest>) -> AnchorDigest {
        let x = digests.into_iter().fold(0u64, |x, d| x ^ u64::from_str_radix(&d.0, 16).unwrap_or(u64::MAX));
        AnchorDigest(format!("{x:016x}"))
    }
}

/// Tests name digests by their hex digits.
#[cfg(test)]
impl From<String> for AnchorDigest {
    fn from(s: String) -> Self {
        AnchorDigest(s)
    }
}

impl Shards {
    /// A new round of `n` shards split at `depth`, none done.
    pub fn new(n: u32, depth: u32) -> Shards {
        Shards { n, depth, parts: "0".repeat(n as usize), ..Default::default() }
    }

    /// Why this record does not fit the layout of `n` shards split at `depth`, if it does not:
    /// another layout, a parts map that is not one digit per shard (or a record of an earlier
    /// version), or a shard past N. A record that does not fit is not trusted at all.
    pub fn misfit(&self, n: u32, depth: u32) -> Option<String> {
        if (self.n, self.depth) != (n, depth) {
            return Some(format!(
                "it is for {} shards split at depth {}, not {n} at depth {depth}",
                self.n, self.depth
            ));
        }
        if self.parts.len() != n as usize || !self.parts.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Some(format!("its parts map is not one hex digit for each of the {n} shards"));
        }
        if let Some(i) = self.running.iter().map(|r| r.shard).find(|&i| i >= n) {
            return Some(format!("it lists shard {i}, past the last of {n}"));
        }
        None
    }

    fn digit(&self, i: u32) -> u32 {
        self.parts.as_bytes().get(i as usize).and_then(|&b| (b as char).to_digit(16)).unwrap_or(0)
    }

    fn set_digit(&mut self, i: u32, d: u32) {
        let c = char::from_digit(d, 16).expect("a hex digit") as u8;
        // The map is ASCII (checked by `misfit`): one byte is one digit.
        let mut bytes = std::mem::take(&mut self.parts).into_bytes();
        if let Some(b) = bytes.get_mut(i as usize) {
            *b = c;
        }
        self.parts = String::from_utf8(bytes).unwrap_or_default();
    }

    /// Whether shard `i` is done.
    pub fn is_done(&self, i: u32) -> bool {
        self.digit(i) != 0
    }

    /// The shards that are done, in order.
    pub fn done(&self) -> Vec<u32> {
        (0..self.n).filter(|&i| self.is_done(i)).collect()
    }

    /// Whether every shard is done (for a record that fits its layout).
    pub fn complete(&self) -> bool {
        !self.parts.is_empty() && (0..self.n).all(|i| self.is_done(i))
    }

    /// The claim group of shard `i`, if it is done and made one (its index and the claim).
    pub fn claim(&self, i: u32) -> Option<(usize, &Claim)> {
        let k = self.digit(i).checked_sub(2)? as usize;
        self.claims.get(k).map(|c| (k, c))
    }

    /// The shards whose claims are in group `k`.
    pub fn members(&self, k: usize) -> Vec<u32> {
        (0..self.n).filter(|&i| self.digit(i) as usize == k + 2).collect()
    }

    /// Records shard `i` as done with its claim (the time its walk ended and its anchor
    /// digest; none when its anchors could not be listed or its part is not to be trusted).
    pub fn set_done(&mut self, i: u32, claim: Option<(Stamp, &AnchorDigest)>) {
        self.undo(i, None);
        let Some((t, a)) = claim else {
            return self.set_digit(i, 1);
        };
        while self.claims.len() >= MAX_CLAIMS {
            self.merge_closest();
        }
        self.claims.push(Claim { t, a: AnchorDigest::xor([a]) });
        self.set_digit(i, self.claims.len() as u32 + 1);
    }

    /// Takes shard `i` out of the done ones. Its anchor digest, as it is now (`digest`), is
    /// taken out of its claim group's; without one, the other shards of the group lose their
    /// claim (their parts are walked again by the completing run).
    pub fn undo(&mut self, i: u32, digest: Option<&AnchorDigest>) {
        if let Some((k, c)) = self.claim(i) {
            match digest {
                Some(d) => self.claims[k].a = AnchorDigest::xor([&c.a, d]),
                None => {
                    for m in self.members(k) {
                        self.set_digit(m, 1);
                    }
                    self.drop_group(k);
                }
            }
        }
        if self.is_done(i) {
            self.set_digit(i, 0);
        }
        self.drop_empty_groups();
    }

    /// Merges the two claim groups whose clocks are closest into one (the earlier clock, the
    /// XOR of the digests): the claim then holds from the earlier time, which only makes the
    /// completing run read again what changed after it. Returns false with fewer than two.
    pub fn merge_closest(&mut self) -> bool {
        if self.claims.len() < 2 {
            return false;
        }
        let mut order: Vec<usize> = (0..self.claims.len()).collect();
        order.sort_by_key(|&k| self.claims[k].t);
        let gap = |w: &[usize]| {
            let (a, b) = (self.claims[w[0]].t, self.claims[w[1]].t);
            (b.sec - a.sec) as i128 * 1_000_000_000 + (b.nsec as i128 - a.nsec as i128)
        };
        let pair = order.windows(2).min_by_key(|w| gap(w)).expect("two groups");
        let (keep, gone) = (pair[0], pair[1]);
        let a = AnchorDigest::xor([&self.claims[keep].a, &self.claims[gone].a]);
        self.claims[keep].a = a;
        for m in self.members(gone) {
            self.set_digit(m, keep as u32 + 2);
        }
        self.drop_group(gone);
        true
    }

    /// Drops claim group `k` (no shard refers to it any more) and renumbers the later ones.
    fn drop_group(&mut self, k: usize) {
        self.claims.remove(k);
        for i in 0..self.n {
            let d = self.digit(i);
            if d as usize > k + 2 {
                self.set_digit(i, d - 1);
            }
        }
    }

    fn drop_empty_groups(&mut self) {
        while let Some(k) = (0..self.claims.len()).rev().find(|&k| self.members(k).is_empty()) {
            self.drop_group(k);
        }
    }

    /// Makes a done shard whose digit names no claim group (a record edited by hand, or
    /// forged) a done shard without a claim, so that a group added later is not taken for its.
    pub fn forget_dangling(&mut self) {
        for i in 0..self.n {
            if self.digit(i) >= 2 && self.claim(i).is_none() {
                self.set_digit(i, 1);
            }
        }
    }

    /// Forgets every claim (each done shard then has its part walked again by the completing
    /// run): the smallest record, for a root that holds nothing bigger.
    pub fn drop_claims(&mut self) {
        for i in 0..self.n {
            if self.digit(i) >= 2 {
                self.set_digit(i, 1);
            }
        }
        self.claims.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_claim_is_written_as_a_stamp_array_and_a_hex_string() {
        let a = AnchorDigest::of(&mut [(b"a".to_vec(), 1)]);
        let c = Claim { t: Stamp { sec: 1_700_000_000, nsec: 5 }, a: a.clone() };
        let text = serde_json::to_string(&c).unwrap();
        assert_eq!(text, format!(r#"{{"t":[1700000000,5],"a":"{}"}}"#, a.0));
        assert_eq!(a.0.len(), 16);
        assert_eq!(serde_json::from_str::<Claim>(&text).unwrap(), c);
        // A record as the versions before these types wrote it reads, and is written back as it was.
        let old = r#"{"n":2,"depth":1,"parts":"20","entries":5,"running":[[1,"r1",9]],"claims":[{"t":[-1,999999999],"a":"00000000000000ff"}]}"#;
        let s: Shards = serde_json::from_str(old).unwrap();
        let (_, c) = s.claim(0).expect("shard 0 claims");
        assert_eq!((c.t, &c.a), (Stamp { sec: -1, nsec: 999_999_999 }, &AnchorDigest("00000000000000ff".into())));
        assert_eq!(serde_json::to_string(&s).unwrap(), old);
    }

    #[test]
    fn a_digest_that_is_not_hex_counts_as_one_no_part_has() {
        let (x, y) = (AnchorDigest("00000000000000ff".into()), AnchorDigest("not hex".into()));
        assert_eq!(AnchorDigest::xor([&x, &x]), AnchorDigest("0000000000000000".into()));
        assert_eq!(AnchorDigest::xor([&x, &y]), AnchorDigest("ffffffffffffff00".into()));
        assert_ne!(AnchorDigest::xor([&y]), y, "never equal to what was read");
    }
}
