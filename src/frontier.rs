//! Finished work at any depth, for resume: per unfinished directory, the ordinals of its finished subdirectories as ranges, each record with the time its claim holds from, bounded in bytes. Pure: no I/O.
//!
//! A subdirectory's ordinal is its index among its parent's `DT_DIR` entries in `getdents`
//! order. A record holds for its directory only while the directory is unchanged: same inode,
//! same change time and link count ([`Seal`], taken when the recording run opened it and
//! older than that run's start: see `verify::seal_trusted`); then its entries, and so the order
//! `getdents` returns them in, are the same. Each range also keeps the inode of its first
//! subdirectory, which a resumed walk checks before trusting anything of that range.
//!
//! A record's claim, "these subtrees were finished", holds from its clock on (the filesystem
//! time read just before the checkpoint write that first carried it): a resumed walk verifies
//! each such subtree against it (`walk::Descend::Verify`) instead of reading it. A record
//! carried over from an older checkpoint keeps its older clock, so one directory may have a
//! record of each run that recorded it; one whose every ordinal a newer one holds is not
//! written.
//!
//! One record is one string: `INO:SEC.NSEC:NLINK:COVERED:CLOCK:FIRST[-LAST]@INO,...`, where
//! COVERED counts the entries inside the finished subtrees (what a resume saves; the records
//! that save least are dropped first when the checkpoint outgrows its bound) and CLOCK is
//! `SEC.NSEC`.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use crate::verify::Stamp;

/// A record's key: its directory's inode (on the root's mount: nothing of another mount is
/// recorded) and the time from which its claim holds (`None`: this run's, the time of the
/// checkpoint write that will carry it).
pub type Key = (u64, Option<Stamp>);

/// What must not have changed for a record to hold: the directory's change time (any entry
/// added, removed or renamed in it changes it, and no user can set it back) and link count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Seal {
    pub sec: i64,
    pub nsec: u32,
    pub nlink: u64,
}

impl Seal {
    /// Its time.
    pub fn at(&self) -> Stamp {
        Stamp { sec: self.sec, nsec: self.nsec }
    }
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

    /// The spans of both records, merged (overlapping or adjacent spans join; a joined span
    /// keeps the first inode of the one that starts it). Covers what the larger covers.
    pub fn union(&self, other: &Record) -> Record {
        let mut all: Vec<Span> = self.spans.iter().chain(&other.spans).copied().collect();
        all.sort_by_key(|s| (s.first, std::cmp::Reverse(s.last)));
        let mut spans: Vec<Span> = Vec::with_capacity(all.len());
        for s in all {
            match spans.last_mut() {
                Some(p) if p.last.checked_add(1).is_none_or(|n| n >= s.first) => p.last = p.last.max(s.last),
                _ => spans.push(s),
            }
        }
        Record { seal: self.seal, spans, covered: self.covered.max(other.covered) }
    }

    /// Whether every ordinal of this record is in one span of `other`.
    pub fn within(&self, other: &Record) -> bool {
        self.seal == other.seal && self.spans.iter().all(|s| other.span_of(s.first).is_some_and(|o| o.last >= s.last))
    }

    /// The record as one checkpoint string (see the module doc); `clock`: when its claim holds
    /// from.
    pub fn encode(&self, ino: u64, clock: Stamp) -> String {
        let Seal { sec, nsec, nlink } = self.seal;
        let mut s = format!("{ino}:{sec}.{nsec:09}:{nlink}:{}:{clock}:", self.covered);
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

    /// Parses a checkpoint string: (inode, clock, record); `None` when it is not one this
    /// version wrote (spans must be in order and apart).
    pub fn decode(text: &str) -> Option<(u64, Stamp, Record)> {
        let mut parts = text.split(':');
        let (ino, seal, nlink, covered, clock, spans) =
            (parts.next()?, parts.next()?, parts.next()?, parts.next()?, parts.next()?, parts.next()?);
        if parts.next().is_some() {
            return None;
        }
        let seal_at = Stamp::parse(seal)?;
        let seal = Seal { sec: seal_at.sec, nsec: seal_at.nsec, nlink: nlink.parse().ok()? };
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
        Some((ino.parse().ok()?, Stamp::parse(clock)?, r))
    }
}

/// The records of one run, by directory and clock.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Frontier {
    records: BTreeMap<Key, Record>,
}

impl Frontier {
    /// Reads checkpoint strings; one that does not parse is left out (its directory is read),
    /// and so is a second one of the same directory and clock.
    pub fn decode(lines: &[String]) -> Frontier {
        let mut records = BTreeMap::new();
        for (ino, clock, r) in lines.iter().filter_map(|l| Record::decode(l)) {
            records.entry((ino, Some(clock))).or_insert(r);
        }
        Frontier { records }
    }

    /// The records of directory `ino`, with their clocks.
    pub fn of(&self, ino: u64) -> impl Iterator<Item = (Option<Stamp>, &Record)> {
        let last = Some(Stamp { sec: i64::MAX, nsec: u32::MAX });
        self.records.range((ino, None)..=(ino, last)).map(|(k, r)| (k.1, r))
    }

    pub fn insert(&mut self, key: Key, r: Record) {
        self.records.insert(key, r);
    }

    pub fn remove(&mut self, key: Key) -> Option<Record> {
        self.records.remove(&key)
    }

    /// Removes every record of directory `ino`.
    pub fn remove_all(&mut self, ino: u64) {
        // One at a time, the first left each time: no list of keys is built.
        loop {
            let Some(clock) = self.of(ino).next().map(|(c, _)| c) else { break };
            self.records.remove(&(ino, clock));
        }
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
    /// finished by this run. A record of `parent` under another seal is replaced.
    pub fn finish(&mut self, parent: u64, seal: Seal, ord: u32, ino: u64, covered: u64) {
        let r = self.records.entry((parent, None)).or_insert_with(|| Record::new(seal));
        if r.seal != seal {
            *r = Record::new(seal);
        }
        r.add(ord, ino, covered);
    }

    /// Whether a record says nothing that the newer ones of its directory (this run's is the
    /// newest) under its seal do not say too: it need not be written.
    fn superseded(&self, (ino, clock): Key, r: &Record) -> bool {
        let Some(clock) = clock else {
            return false;
        };
        let newer = self.of(ino).filter(|(c, n)| c.is_none_or(|c| c > clock) && n.seal == r.seal);
        newer.map(|(_, n)| n).cloned().reduce(|a, b| a.union(&b)).is_some_and(|u| r.within(&u))
    }

    /// The records as checkpoint strings, those covering most first, as many as fit `budget`
    /// bytes where each costs its length plus `overhead` (JSON quotes and a comma). A record
    /// too long for what is left is dropped, and smaller ones still tried. This run's records
    /// get the clock `now`.
    pub fn encode(&self, now: Stamp, budget: usize, overhead: usize) -> Vec<String> {
        let mut all: Vec<(&Key, &Record)> = self.records.iter().filter(|(k, r)| !self.superseded(**k, r)).collect();
        all.sort_by(|a, b| b.1.covered.cmp(&a.1.covered).then(a.0.cmp(b.0)));
        let mut left = budget;
        let mut out = Vec::new();
        for ((ino, clock), r) in all {
            let s = r.encode(*ino, clock.unwrap_or(now));
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
    const CLOCK: Stamp = Stamp { sec: 1_700_000_100, nsec: 7 };

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
        let s = r.encode(42, CLOCK);
        assert_eq!(Record::decode(&s), Some((42, CLOCK, r.clone())), "{s}");
        assert_eq!(s, "42:-3.999999999:2:12:1700000100.000000007:0-1@11,7@17");
        let empty = Record::new(SEAL);
        assert_eq!(Record::decode(&empty.encode(1, CLOCK)).unwrap().2, empty);
        for bad in [
            "",
            "42",
            "42:1.0:2:3:0@1",
            "42:1.0:2:3:5.0:0@1:extra",
            "x:1.0:2:3:5.0:",
            "42:1:2:3:5.0:",
            "42:1.0:2:3:5:",
            "42:1.1000000000:2:3:5.0:",
            "42:1.0:2:3:5.0:5-4@1",
            "42:1.0:2:3:5.0:0-4@1,5@9",
            "42:1.0:2:3:5.0:5@1,2@9",
            "42:1.0:2:3:5.0:5",
            "42:1.0:2:3:5.0:5@",
            // The format before clocks: its claims can't be verified.
            "42:1.0:2:3:0-1@11",
        ] {
            assert_eq!(Record::decode(bad), None, "{bad}");
        }
    }

    #[test]
    fn finishing_builds_records_of_this_run_and_a_new_seal_starts_over() {
        let mut f = Frontier::default();
        f.finish(2, SEAL, 0, 10, 5);
        f.finish(2, SEAL, 1, 11, 6);
        let mine = |f: &Frontier| f.of(2).find(|(c, _)| c.is_none()).map(|(_, r)| r.clone());
        assert_eq!(mine(&f).map(|r| (spans(&r), r.covered)), Some((vec![(0, 1, 10)], 11)));
        let changed = Seal { nsec: 6, ..SEAL };
        f.finish(2, changed, 3, 13, 1);
        assert_eq!(mine(&f).map(|r| (spans(&r), r.covered, r.seal)), Some((vec![(3, 3, 13)], 1, changed)));
        // A carried record of the same directory lives next to this run's.
        f.insert((2, Some(CLOCK)), Record::new(SEAL));
        assert_eq!(f.of(2).count(), 2);
        assert_eq!(f.of(3).count(), 0);
        f.remove_all(2);
        assert!(f.is_empty());
    }

    #[test]
    fn a_record_a_newer_one_holds_in_full_is_not_written() {
        let older = Stamp { sec: CLOCK.sec - 50, nsec: 0 };
        let mut f = Frontier::default();
        let mut old = Record::new(SEAL);
        for ord in [0, 1, 2, 8] {
            old.add(ord, 100 + u64::from(ord), 10);
        }
        f.insert((7, Some(older)), old.clone());
        // A newer carried record holding ordinals 0..=9 supersedes it; one holding 0..=2 only would not.
        let mut newer = Record::new(SEAL);
        (0..=2).for_each(|ord| newer.add(ord, 100 + u64::from(ord), 10));
        f.insert((7, Some(CLOCK)), newer.clone());
        assert!(!old.within(&newer));
        assert_eq!(f.encode(CLOCK, usize::MAX, 3).len(), 2, "each says something the other does not");
        (3..=9).for_each(|ord| f.finish(7, SEAL, ord, 100 + u64::from(ord), 10));
        assert!(!old.within(f.of(7).find(|(c, _)| c.is_none()).unwrap().1), "only both newer ones hold all of it");
        let now = Stamp { sec: CLOCK.sec + 50, nsec: 0 };
        let written = f.encode(now, usize::MAX, 3);
        assert_eq!(written.len(), 2, "the oldest is held by this run's record: {written:?}");
        assert!(written.iter().all(|w| Record::decode(w).unwrap().1 != older), "{written:?}");
        // Under another seal, a record proves nothing for the other and is kept.
        let mut other = Record::new(Seal { nlink: SEAL.nlink + 1, ..SEAL });
        other.add(0, 100, 10);
        assert!(!other.within(&old) && old.within(&old));
    }

    #[test]
    fn a_union_joins_overlapping_and_adjacent_spans() {
        let mut a = Record::new(SEAL);
        let mut b = Record::new(SEAL);
        for ord in [0, 1, 2, 8, 9, 20] {
            a.add(ord, 100 + u64::from(ord), 1);
        }
        for ord in [2, 3, 4, 6, 15, 16] {
            b.add(ord, 100 + u64::from(ord), 1);
        }
        let u = a.union(&b);
        assert_eq!(spans(&u), vec![(0, 4, 100), (6, 6, 106), (8, 9, 108), (15, 16, 115), (20, 20, 120)]);
        assert_eq!(u.covered, 6);
        assert_eq!(b.union(&a), u);
    }

    #[test]
    fn encoding_keeps_what_saves_most_within_the_bound_and_clocks_this_runs_records() {
        let mut f = Frontier::default();
        for d in 0..200u64 {
            // Records of one length (same digit counts), covering 1..=200 entries.
            f.finish(1000 + d, SEAL, 10, 5000, 100 + d);
            f.finish(1000 + d, SEAL, 12, 5002, 0);
        }
        let all = f.encode(CLOCK, usize::MAX, 3);
        assert_eq!(all.len(), 200);
        let each = all[0].len() + 3;
        assert!(all.iter().all(|s| s.len() + 3 == each));
        for budget in [0, each - 1, each, 10 * each + 5, 3000] {
            let kept = f.encode(CLOCK, budget, 3);
            let bytes: usize = kept.iter().map(|s| s.len() + 3).sum();
            assert!(bytes <= budget && budget - bytes < each, "{bytes} of {budget}: as many as fit");
            let back = Frontier::decode(&kept);
            assert_eq!(back.len(), kept.len());
            // The ones kept are those covering most, exactly as they were, with the clock.
            for ((ino, clock), r) in &back.records {
                assert_eq!(*clock, Some(CLOCK));
                assert_eq!(f.records.get(&(*ino, None)), Some(r));
                assert!(r.covered >= 100 + 200 - kept.len() as u64, "{ino} covers {}", r.covered);
            }
        }
        // A long record that no longer fits is dropped, and shorter ones still go in.
        for ord in (0..400).step_by(2) {
            f.finish(1, SEAL, ord, 7, 1);
        }
        f.records.get_mut(&(1, None)).unwrap().covered = 250;
        let kept = f.encode(CLOCK, 1000, 3);
        assert!(!kept.iter().any(|s| s.starts_with("1:")) && kept.len() == 1000 / each, "{kept:?}");
        let garbage = vec!["nonsense".to_string(), all[0].clone(), all[0].clone()];
        assert_eq!(Frontier::decode(&garbage).len(), 1, "what does not parse is left out, and a duplicate");
        // A carried record keeps its own clock.
        let old = Stamp { sec: 5, nsec: 0 };
        let mut g = Frontier::default();
        g.insert((9, Some(old)), Record::new(SEAL));
        assert!(g.encode(CLOCK, 1000, 3)[0].contains(":5.000000000:"));
    }
}
