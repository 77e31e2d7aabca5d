//! Finished work at any depth, for resume: per unfinished directory, the ordinals of its finished subdirectories as ranges, bounded in bytes. Pure: no I/O.
//!
//! A subdirectory's ordinal is its index among its parent's `DT_DIR` entries in `getdents`
//! order. A record holds for its directory only while the directory is unchanged: same inode
//! (and device, off the root's), same change time and link count ([`Seal`]); then its entries,
//! and so the order `getdents` returns them in, are the same. Each range also keeps the inode of
//! its first subdirectory, which a resumed walk checks before skipping anything of that range.
//!
//! One record is one string: `INO[/DEV]:SEC.NSEC:NLINK:COVERED:FIRST[-LAST]@INO,...`, where
//! COVERED counts the entries inside the finished subtrees (what a resume saves; the records
//! that save least are dropped first when the checkpoint outgrows its bound).

use std::collections::HashMap;
use std::fmt::Write as _;

/// A directory as the checkpoint names it: its inode, and its device when that is not the
/// root's (`--cross-devices`; device numbers of one filesystem may change between mounts, so
/// they are kept only where needed).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DirId {
    pub ino: u64,
    pub dev: Option<u64>,
}

/// What must not have changed for a record to hold: the directory's change time (any entry
/// added, removed or renamed in it changes it, and no user can set it back) and link count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Seal {
    pub sec: i64,
    pub nsec: u32,
    pub nlink: u64,
}

/// Finished ordinals `first..=last`; `first_ino` is the inode of the subdirectory at `first`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Span {
    pub first: u32,
    pub last: u32,
    pub first_ino: u64,
}

/// The finished subdirectories of one unfinished directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub seal: Seal,
    /// Sorted, disjoint and not adjacent (adjacent spans are merged).
    pub spans: Vec<Span>,
    /// Entries inside the finished subtrees (the subdirectories themselves included).
    pub covered: u64,
}

impl Record {
    pub fn new(seal: Seal) -> Record {
        Record { seal, spans: Vec::new(), covered: 0 }
    }

    /// Adds the finished ordinal `ord` (a subdirectory of inode `ino` holding `covered` entries
    /// with itself), merged with the spans next to it. An ordinal already in is not added again.
    pub fn add(&mut self, ord: u32, ino: u64, covered: u64) {
        let i = self.spans.partition_point(|s| s.last < ord);
        if self.spans.get(i).is_some_and(|s| s.first <= ord) {
            return;
        }
        self.covered = self.covered.saturating_add(covered);
        let joins_prev = i > 0 && self.spans[i - 1].last.checked_add(1) == Some(ord);
        let joins_next = self.spans.get(i).is_some_and(|s| ord.checked_add(1) == Some(s.first));
        match (joins_prev, joins_next) {
            (true, true) => {
                self.spans[i - 1].last = self.spans[i].last;
                self.spans.remove(i);
            }
            (true, false) => self.spans[i - 1].last = ord,
            (false, true) => self.spans[i] = Span { first: ord, first_ino: ino, ..self.spans[i] },
            (false, false) => self.spans.insert(i, Span { first: ord, last: ord, first_ino: ino }),
        }
    }

    /// The span holding `ord`, if it is finished.
    pub fn span_of(&self, ord: u32) -> Option<&Span> {
        let i = self.spans.partition_point(|s| s.last < ord);
        self.spans.get(i).filter(|s| s.first <= ord)
    }

    /// The record as one checkpoint string (see the module doc).
    pub fn encode(&self, id: DirId) -> String {
        let mut s = id.ino.to_string();
        if let Some(dev) = id.dev {
            let _ = write!(s, "/{dev}");
        }
        let Seal { sec, nsec, nlink } = self.seal;
        let _ = write!(s, ":{sec}.{nsec:09}:{nlink}:{}:", self.covered);
        for (i, span) in self.spans.iter().enumerate() {
            let sep = if i == 0 { "" } else { "," };
            match span.last == span.first {
                true => write!(s, "{sep}{}@{}", span.first, span.first_ino),
                false => write!(s, "{sep}{}-{}@{}", span.first, span.last, span.first_ino),
            }
            .expect("writing to a String");
        }
        s
    }

    /// Parses a checkpoint string; `None` when it is not one this version wrote (spans must be
    /// in order and apart).
    pub fn decode(text: &str) -> Option<(DirId, Record)> {
        let mut parts = text.split(':');
        let (id, seal, nlink, covered, spans) =
            (parts.next()?, parts.next()?, parts.next()?, parts.next()?, parts.next()?);
        if parts.next().is_some() {
            return None;
        }
        let id = match id.split_once('/') {
            Some((ino, dev)) => DirId { ino: ino.parse().ok()?, dev: Some(dev.parse().ok()?) },
            None => DirId { ino: id.parse().ok()?, dev: None },
        };
        let (sec, nsec) = seal.split_once('.')?;
        let nsec: u32 = nsec.parse().ok().filter(|&n| n < 1_000_000_000)?;
        let seal = Seal { sec: sec.parse().ok()?, nsec, nlink: nlink.parse().ok()? };
        let mut r = Record { seal, spans: Vec::new(), covered: covered.parse().ok()? };
        for span in spans.split(',').filter(|s| !s.is_empty()) {
            let (range, ino) = span.split_once('@')?;
            let (first, last) = match range.split_once('-') {
                Some((a, b)) => (a.parse().ok()?, b.parse().ok()?),
                None => (range.parse().ok()?, range.parse().ok()?),
            };
            let apart = r.spans.last().is_none_or(|p: &Span| p.last.checked_add(1).is_some_and(|n| n < first));
            if first > last || !apart {
                return None;
            }
            r.spans.push(Span { first, last, first_ino: ino.parse().ok()? });
        }
        Some((id, r))
    }
}

/// The records of one run, by directory.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Frontier {
    records: HashMap<DirId, Record>,
}

impl Frontier {
    /// Reads checkpoint strings; one that does not parse is left out (its directory is read).
    pub fn decode(lines: &[String]) -> Frontier {
        Frontier { records: lines.iter().filter_map(|l| Record::decode(l)).collect() }
    }

    pub fn get(&self, id: DirId) -> Option<&Record> {
        self.records.get(&id)
    }

    pub fn insert(&mut self, id: DirId, r: Record) {
        self.records.insert(id, r);
    }

    pub fn remove(&mut self, id: DirId) -> Option<Record> {
        self.records.remove(&id)
    }

    pub fn len(&self) -> usize {
        self.records.len()
    }

    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// Entries inside all the finished subtrees recorded.
    pub fn covered(&self) -> u64 {
        self.records.values().map(|r| r.covered).sum()
    }

    /// Records the subdirectory `ord` (inode `ino`, `covered` entries with itself) of `parent`
    /// finished. A record of `parent` under another seal is replaced.
    pub fn finish(&mut self, parent: DirId, seal: Seal, ord: u32, ino: u64, covered: u64) {
        let r = self.records.entry(parent).or_insert_with(|| Record::new(seal));
        if r.seal != seal {
            *r = Record::new(seal);
        }
        r.add(ord, ino, covered);
    }

    /// The records as checkpoint strings, those covering most first, as many as fit `budget`
    /// bytes where each costs its length plus `overhead` (JSON quotes and a comma). A record
    /// too long for what is left is dropped, and smaller ones still tried.
    pub fn encode(&self, budget: usize, overhead: usize) -> Vec<String> {
        let mut all: Vec<(&DirId, &Record)> = self.records.iter().collect();
        all.sort_by(|a, b| b.1.covered.cmp(&a.1.covered).then(a.0.cmp(b.0)));
        let mut left = budget;
        let mut out = Vec::new();
        for (id, r) in all {
            let s = r.encode(*id);
            if s.len() + overhead <= left {
                left -= s.len() + overhead;
                out.push(s);
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEAL: Seal = Seal { sec: 1_700_000_000, nsec: 5, nlink: 12 };

    fn spans(r: &Record) -> Vec<(u32, u32, u64)> {
        r.spans.iter().map(|s| (s.first, s.last, s.first_ino)).collect()
    }

    #[test]
    fn ordinals_merge_into_ranges_in_any_order() {
        let mut r = Record::new(SEAL);
        for ord in [5, 3, 4, 9, 0, 10, 8, 1] {
            r.add(ord, 100 + u64::from(ord), 10);
        }
        assert_eq!(spans(&r), vec![(0, 1, 100), (3, 5, 103), (8, 10, 108)]);
        r.add(2, 102, 10);
        assert_eq!(spans(&r), vec![(0, 5, 100), (8, 10, 108)], "a gap filled joins both sides");
        r.add(4, 104, 10);
        assert_eq!(r.covered, 90, "an ordinal already in counts once");
        r.add(7, 107, 1);
        assert_eq!(spans(&r), vec![(0, 5, 100), (7, 10, 107)], "prepending moves the checked inode");
        for (ord, want) in [(0, Some(100)), (5, Some(100)), (6, None), (7, Some(107)), (10, Some(107)), (11, None)] {
            assert_eq!(r.span_of(ord).map(|s| s.first_ino), want, "ordinal {ord}");
        }
        r.add(u32::MAX, 1, 1);
        assert_eq!(r.span_of(u32::MAX).map(|s| s.last), Some(u32::MAX));
    }

    #[test]
    fn records_round_trip_and_reject_what_this_version_did_not_write() {
        let mut r = Record::new(Seal { sec: -3, nsec: 999_999_999, nlink: 2 });
        r.add(0, 11, 4);
        r.add(1, 12, 4);
        r.add(7, 17, 4);
        for id in [DirId { ino: 42, dev: None }, DirId { ino: 42, dev: Some(2049) }] {
            let s = r.encode(id);
            assert_eq!(Record::decode(&s), Some((id, r.clone())), "{s}");
        }
        assert_eq!(r.encode(DirId { ino: 42, dev: None }), "42:-3.999999999:2:12:0-1@11,7@17");
        let empty = Record::new(SEAL);
        assert_eq!(Record::decode(&empty.encode(DirId { ino: 1, dev: None })).unwrap().1, empty);
        for bad in [
            "",
            "42",
            "42:1.0:2:3:0@1:extra",
            "x:1.0:2:3:",
            "42:1:2:3:",
            "42:1.1000000000:2:3:",
            "42:1.0:2:3:5-4@1",
            "42:1.0:2:3:0-4@1,5@9",
            "42:1.0:2:3:5@1,2@9",
            "42:1.0:2:3:5",
            "42:1.0:2:3:5@",
        ] {
            assert_eq!(Record::decode(bad), None, "{bad}");
        }
    }

    #[test]
    fn finishing_builds_records_and_a_new_seal_starts_over() {
        let mut f = Frontier::default();
        let p = DirId { ino: 2, dev: None };
        f.finish(p, SEAL, 0, 10, 5);
        f.finish(p, SEAL, 1, 11, 6);
        assert_eq!(f.get(p).map(|r| (spans(r), r.covered)), Some((vec![(0, 1, 10)], 11)));
        let changed = Seal { nsec: 6, ..SEAL };
        f.finish(p, changed, 3, 13, 1);
        assert_eq!(f.get(p).map(|r| (spans(r), r.covered, r.seal)), Some((vec![(3, 3, 13)], 1, changed)));
        assert_eq!(f.remove(p).map(|r| r.covered), Some(1));
        assert!(f.is_empty());
    }

    #[test]
    fn encoding_keeps_what_saves_most_within_the_bound() {
        let mut f = Frontier::default();
        for d in 0..200u64 {
            // Records of one length (same digit counts), covering 1..=200 entries.
            let id = DirId { ino: 1000 + d, dev: None };
            f.finish(id, SEAL, 10, 5000, 100 + d);
            f.finish(id, SEAL, 12, 5002, 0);
        }
        let all = f.encode(usize::MAX, 3);
        assert_eq!(all.len(), 200);
        let each = all[0].len() + 3;
        assert!(all.iter().all(|s| s.len() + 3 == each));
        for budget in [0, each - 1, each, 10 * each + 5, 3000] {
            let kept = f.encode(budget, 3);
            let bytes: usize = kept.iter().map(|s| s.len() + 3).sum();
            assert!(bytes <= budget && budget - bytes < each, "{bytes} of {budget}: as many as fit");
            let back = Frontier::decode(&kept);
            assert_eq!(back.len(), kept.len());
            // The ones kept are those covering most, exactly as they were.
            for (id, r) in &back.records {
                assert_eq!(f.get(*id), Some(r));
                assert!(r.covered >= 100 + 200 - kept.len() as u64, "{id:?} covers {}", r.covered);
            }
        }
        // A long record that no longer fits is dropped, and shorter ones still go in.
        let long = DirId { ino: 1, dev: None };
        for ord in (0..400).step_by(2) {
            f.finish(long, SEAL, ord, 7, 1);
        }
        f.records.get_mut(&long).unwrap().covered = 250;
        let kept = f.encode(1000, 3);
        assert!(!kept.iter().any(|s| s.starts_with("1:")) && kept.len() == 1000 / each, "{kept:?}");
        let garbage = vec!["nonsense".to_string(), all[0].clone()];
        assert_eq!(Frontier::decode(&garbage).len(), 1, "what does not parse is left out");
    }
}
