//! A volume's counts, and the report's JSON in the key order of earlier versions.

use serde::ser::{SerializeMap, Serializer};
use serde::{Deserialize, Serialize};

use super::VolumeReport;

/// What a pass counted (`progress::Counters::snapshot`), flattened into the report.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Counts {
    /// Entries looked at (the root and every entry below it, skipped mounts excluded).
    pub entries: u64,
    pub dirs: u64,
    pub files: u64,
    pub symlinks: u64,
    /// FIFOs, sockets and device nodes.
    pub others: u64,
    /// Entries whose owner or group changed (or would, in `check`).
    pub changed_owner: u64,
    /// Entries whose mode changed (or would, in `check`).
    pub changed_mode: u64,
    /// Per-entry failures.
    pub errors: u64,
    /// Unprivileged: entries of other users that do not conform, left as they are.
    pub foreign_owned: u64,
    /// Of those, directories this user may not read: their contents were not checked.
    pub foreign_unread_dirs: u64,
    /// Directories read with `getdents` (0 when the walk was skipped).
    pub dirs_read: u64,
    /// Subtrees an interrupted run had finished, not read again.
    pub skipped_subtrees: u64,
    /// Directories of those subtrees listed to verify they did not change since (their files
    /// not looked at); a changed one is read and counted in `entries` like any other.
    pub verified_dirs: u64,
    /// Non-directory entries whose inode has more than one link (each name counted): changing
    /// one changes every name of the inode, maybe outside the volume.
    pub hardlinked: u64,
    /// `--modes app-safe`: entries at app-private paths that lost bits their app refuses (or
    /// would, in `check`).
    pub tightened: u64,
}

impl Counts {
    /// Adds `o` in. Reports are files anyone may have edited: a sum past u64 stays at the maximum.
    pub fn add(&mut self, o: &Counts) {
        let mut o = *o;
        for ((_, a), (_, b)) in self.fields().into_iter().zip(o.fields()) {
            *a = a.saturating_add(*b);
        }
    }

    /// Every count with its report key, in the report's order.
    fn fields(&mut self) -> [Field<'_>; 15] {
        let Counts {
            entries,
            dirs,
            files,
            symlinks,
            others,
            changed_owner,
            changed_mode,
            errors,
            foreign_owned,
            foreign_unread_dirs,
            dirs_read,
            skipped_subtrees,
            verified_dirs,
            hardlinked,
            tightened,
        } = self;
        [
            ("entries", entries),
            ("dirs", dirs),
            ("files", files),
            ("symlinks", symlinks),
            ("others", others),
            ("changed_owner", changed_owner),
            ("changed_mode", changed_mode),
            ("errors", errors),
            ("foreign_owned", foreign_owned),
            ("foreign_unread_dirs", foreign_unread_dirs),
            ("dirs_read", dirs_read),
            ("skipped_subtrees", skipped_subtrees),
            ("verified_dirs", verified_dirs),
            ("hardlinked", hardlinked),
            ("tightened", tightened),
        ]
    }
}

impl Serialize for VolumeReport {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let v = self;
        let mut counts = v.counts;
        let counts = counts.fields();
        // entries .. errors, then the lists and foreign_owned, then foreign_unread_dirs .. hardlinked
        let (by_kind, rest) = through(&counts, "errors");
        let (foreign, rest) = through(rest, "foreign_owned");
        let mut m = s.serialize_map(None)?;
        m.serialize_entry("path", &v.path)?;
        m.serialize_entry("action", &v.action)?;
        m.serialize_entry("spec", &v.spec)?;
        m.serialize_entry("spec_digest", &v.spec_digest)?;
        m.serialize_entry("threads", &v.threads)?;
        m.serialize_entry("fs_type", &v.fs_type)?;
        m.serialize_entry("estimated_entries", &v.estimated_entries)?;
        m.serialize_entry("reason", &v.reason)?;
        m.serialize_entry("marker_before", &v.marker_before)?;
        m.serialize_entry("marker_after", &v.marker_after)?;
        numbers(&mut m, by_kind)?;
        m.serialize_entry("error_list", &v.error_list)?;
        m.serialize_entry("skipped_mounts", &v.skipped_mounts)?;
        m.serialize_entry("unprivileged", &v.unprivileged)?;
        numbers(&mut m, foreign)?;
        m.serialize_entry("foreign_owned_list", &v.foreign_owned_list)?;
        numbers(&mut m, rest)?;
        m.serialize_entry("tightened_list", &v.tightened_list)?;
        m.serialize_entry("elapsed_ms", &v.timing.elapsed_ms)?;
        m.serialize_entry("entries_per_s", &v.timing.entries_per_s)?;
        m.serialize_entry("load", &v.load)?;
        optional(&mut m, "shard", &v.shard)?;
        optional(&mut m, "sticky", &v.sticky)?;
        optional(&mut m, "fatal", &v.fatal)?;
        optional(&mut m, "interrupted", &v.interrupted)?;
        optional(&mut m, "ownership", &v.ownership)?;
        optional(&mut m, "ownership_evidence", &v.ownership_evidence)?;
        m.end()
    }
}

/// A count with its report key.
type Field<'n> = (&'static str, &'n mut u64);

/// The counts up to and including `key`, and the rest.
fn through<'c, 'n>(counts: &'c [Field<'n>], key: &str) -> (&'c [Field<'n>], &'c [Field<'n>]) {
    let at = counts.iter().position(|(k, _)| *k == key).expect("a count of that name");
    counts.split_at(at + 1)
}

/// Counts, each under its key.
fn numbers<M: SerializeMap>(m: &mut M, counts: &[Field<'_>]) -> Result<(), M::Error> {
    counts.iter().try_for_each(|(k, n)| m.serialize_entry(k, &**n))
}

/// An optional key: absent when `None`.
fn optional<M: SerializeMap, T: Serialize>(m: &mut M, key: &str, v: &Option<T>) -> Result<(), M::Error> {
    v.as_ref().map_or(Ok(()), |v| m.serialize_entry(key, v))
}

#[cfg(test)]
mod tests {
    use super::super::*;

    /// The keys of a report, in their order: those of the version before `Counts`, and `load`
    /// (added before the optional keys).
    const KEYS: &str = "path action spec spec_digest threads fs_type estimated_entries reason marker_before \
        marker_after entries dirs files symlinks others changed_owner changed_mode errors error_list skipped_mounts \
        unprivileged foreign_owned foreign_owned_list foreign_unread_dirs dirs_read skipped_subtrees verified_dirs \
        hardlinked tightened tightened_list elapsed_ms entries_per_s load shard sticky fatal interrupted ownership \
        ownership_evidence";

    #[test]
    fn keys_keep_their_order_and_every_value_comes_back() {
        let n = |i: u64| i + 100;
        let counts = Counts {
            entries: n(1),
            dirs: n(2),
            files: n(3),
            symlinks: n(4),
            others: n(5),
            changed_owner: n(6),
            changed_mode: n(7),
            errors: n(8),
            foreign_owned: n(9),
            foreign_unread_dirs: n(10),
            dirs_read: n(11),
            skipped_subtrees: n(12),
            verified_dirs: n(13),
            hardlinked: n(14),
            tightened: n(15),
        };
        let v = VolumeReport {
            counts,
            timing: Timing { elapsed_ms: n(16), entries_per_s: n(17) },
            marker_before: MarkerState::InProgress,
            shard: Some("0/2".into()),
            sticky: Some(StickyOutcome { created: true, mode_before: None, mode_after: "1777".into() }),
            fatal: Some("x".into()),
            interrupted: Some(Stop::Term),
            ownership: Some("ignored".into()),
            ownership_evidence: Some("a file volprep created ...".into()),
            error_list: [EntryError::new(EscapedPath::new("/a"), Op::Chown, Errno::PERM)].into_iter().collect(),
            ..VolumeReport::default()
        };
        let json = serde_json::to_string(&v).unwrap();
        let keys: Vec<&str> = KEYS.split_whitespace().collect();
        let mut at = 0;
        for k in &keys {
            let found = json[at..].find(&format!("\"{k}\":")).unwrap_or_else(|| panic!("{k} after {at}: {json}"));
            at += found;
        }
        let back: VolumeReport = serde_json::from_str(&json).unwrap();
        assert_eq!((back.counts, back.timing), (counts, v.timing));
        assert_eq!(
            (back.marker_before, back.marker_after, back.interrupted),
            (v.marker_before, v.marker_after, v.interrupted)
        );
        assert!(json.contains(r#""marker_after":"""#) && json.contains(r#""interrupted":"SIGTERM""#), "{json}");
        assert!(json.contains(r#""errno":"EPERM""#), "{json}");
        assert_eq!(back.error_list[0].errno, Some(Errno::PERM));
        let plain = serde_json::to_value(VolumeReport::default()).unwrap();
        assert_eq!(plain.as_object().unwrap().len(), keys.len() - 6, "the optional keys are absent when unset");
    }
}
