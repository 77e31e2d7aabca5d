//! The ownership histogram of `inspect`: entries per owner, and the directories holding the
//! most entries of each owner.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Mutex;

use super::render::{DirCount, OwnerRow};
use super::{Owner, TOP_DIRS, lock};
use crate::escape::EscapedPath;
use crate::sys::Meta;
use crate::walk::Node;

/// A directory's identity during the walk.
type DirKey = (u64, u64);

/// The ownership histogram. Each thread counts entries in its own shard (an uncontended lock),
/// keyed by the directory they are in. When a directory is done its counts are final: they are
/// gathered from the shards and merged, once per directory, into the totals, where each owner
/// keeps its [`TOP_DIRS`] directories with the most entries. A directory counts its direct
/// entries and itself.
pub struct Owners {
    shards: Vec<Mutex<HashMap<DirKey, HashMap<Owner, u64>>>>,
    totals: Mutex<HashMap<Owner, OwnerTotal>>,
}

#[derive(Default)]
struct OwnerTotal {
    entries: u64,
    /// (entries, directory relative to the root), at most [`TOP_DIRS`].
    top: Vec<(u64, PathBuf)>,
}

impl OwnerTotal {
    fn offer(&mut self, n: u64, path: impl FnOnce() -> PathBuf) {
        if self.top.len() < TOP_DIRS {
            self.top.push((n, path()));
        } else if let Some(min) = self.top.iter_mut().min_by_key(|(c, _)| *c) {
            if n > min.0 {
                *min = (n, path());
            }
        }
    }
}

impl Owners {
    pub fn new(threads: usize) -> Self {
        Owners { shards: (0..threads.max(1)).map(|_| Mutex::default()).collect(), totals: Mutex::default() }
    }

    fn key(dir: &Node) -> DirKey {
        (dir.meta.dev, dir.meta.ino)
    }

    pub fn add(&self, dir: &Node, meta: &Meta) {
        let i = rayon_core::current_thread_index().unwrap_or(0) % self.shards.len();
        let mut shard = lock(&self.shards[i]);
        *shard.entry(Self::key(dir)).or_default().entry((meta.uid, meta.gid)).or_default() += 1;
    }

    pub fn dir_done(&self, dir: &Node) {
        let mut tally = HashMap::from([((dir.meta.uid, dir.meta.gid), 1u64)]);
        for shard in &self.shards {
            if let Some(t) = lock(shard).remove(&Self::key(dir)) {
                for (owner, n) in t {
                    *tally.entry(owner).or_default() += n;
                }
            }
        }
        let mut path = None;
        let mut totals = lock(&self.totals);
        for (owner, n) in tally {
            let t = totals.entry(owner).or_default();
            t.entries += n;
            t.offer(n, || path.get_or_insert_with(|| dir.rel_path()).clone());
        }
    }

    /// Owners by entries (most first); directories only for the minority owners.
    pub fn finish(self) -> Vec<OwnerRow> {
        let mut totals = crate::sync::into_inner(self.totals);
        // Counts of directories cut short (none unless the walk stopped): totals only.
        for shard in self.shards {
            for (_, t) in crate::sync::into_inner(shard) {
                for (owner, n) in t {
                    totals.entry(owner).or_default().entries += n;
                }
            }
        }
        let mut rows: Vec<_> = totals.into_iter().collect();
        rows.sort_by(|a, b| b.1.entries.cmp(&a.1.entries).then(a.0.cmp(&b.0)));
        rows.into_iter()
            .enumerate()
            .map(|(i, ((uid, gid), mut t))| {
                t.top.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
                let top_dirs = if i == 0 { Vec::new() } else { t.top };
                OwnerRow {
                    uid,
                    gid,
                    entries: t.entries,
                    top_dirs: top_dirs
                        .into_iter()
                        .map(|(entries, p)| DirCount { path: EscapedPath::relative(&p), entries })
                        .collect(),
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn top_dirs_keep_the_largest() {
        let mut t = OwnerTotal::default();
        for (n, p) in [(3, "a"), (1, "b"), (7, "c"), (2, "d"), (5, "e"), (4, "f"), (1, "g")] {
            t.offer(n, || PathBuf::from(p));
        }
        let mut got: Vec<_> = t.top.iter().map(|(n, _)| *n).collect();
        got.sort();
        assert_eq!(got, [2, 3, 4, 5, 7]);
    }
}
