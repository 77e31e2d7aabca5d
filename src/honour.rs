//! Whether the storage honours ownership changes, from the first changes of a pass: a storage
//! that accepts chown and chmod and changes nothing (SMB and Azure Files with fixed `uid=`,
//! `gid=`, `file_mode=` mount options, EFS access points, blobfuse), or that refuses them to a
//! root that may make them (NFS `root_squash`), stops the pass with one line saying so.
//!
//! Until a change is seen to hold, every change is read back (one stat); after that, none is.
//! Changes that did not hold are only suspects: an entry's own cause (an inode flag, an owner
//! not mapped into this user namespace, a setgid bit the kernel dropped) is its error, never
//! the storage's, and [`VERDICT_AFTER`] suspects with no change that held (or any, at the end of
//! the pass) start the [`experiment`]: a change volprep certainly may make, to a file it
//! creates, read back and waited for. Only its result stops the pass, with its evidence.

pub mod experiment;

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

pub use experiment::Proof;

use crate::sync::lock;

/// Changes that did not hold, with none that did, before the verdict.
pub const VERDICT_AFTER: u32 = 8;

/// What one change did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Read back, the entry has it.
    Held,
    /// Every call succeeded, but the entry is as it was.
    Ignored,
    /// The storage answered EPERM where this process may make the change.
    Refused,
}

/// What the storage does with ownership changes, as far as the changes so far tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Not known yet (or no change was made).
    Unknown,
    /// A change held: the storage applies them.
    Honours,
    /// Changes report success and change nothing.
    Ignores,
    /// Changes fail with EPERM although this process may make them.
    Refuses,
}

impl Verdict {
    /// Whether the pass must stop: the storage will not take the changes.
    pub fn stops(self) -> bool {
        matches!(self, Verdict::Ignores | Verdict::Refuses)
    }

    /// The report's word for it (`ownership`), for a verdict that stops.
    pub fn word(self) -> Option<&'static str> {
        match self {
            Verdict::Ignores => Some("ignored"),
            Verdict::Refuses => Some("refused"),
            Verdict::Unknown | Verdict::Honours => None,
        }
    }

    /// The one line that says what the storage did and what to do instead; `fs` names the
    /// filesystem, `n` the changes seen, `example` one entry's path.
    pub fn explain(self, fs: &str, n: u32, example: &str) -> Option<String> {
        let n = if n == 1 { "1 entry".to_string() } else { format!("{n} entries") };
        let what = match self {
            Verdict::Ignores => format!(
                "this filesystem ({fs}) ignores ownership changes: chown and chmod reported success on {n} and changed nothing (e.g. {example}); set the group with the mount options (SMB, Azure Files: gid=, file_mode=, dir_mode=) or the CSI driver's fsGroupPolicy"
            ),
            Verdict::Refuses => format!(
                "this filesystem ({fs}) refuses ownership changes: chown and chmod failed with EPERM on {n} although volprep may make them (e.g. {example}; NFS root_squash maps root to nobody); export the volume to this host without root squashing, set the group on the server, or use the CSI driver's fsGroupPolicy"
            ),
            Verdict::Unknown | Verdict::Honours => return None,
        };
        Some(format!("{what}; stopped, nothing more was changed and the marker stays in-progress"))
    }
}

/// The pass's record of its first changes (shared by the walker threads).
#[derive(Debug, Default)]
pub struct Probe {
    held: AtomicBool,
    ignored: AtomicU32,
    refused: AtomicU32,
    /// The first entry whose change did not hold, for the verdict's line.
    example: Mutex<Option<String>>,
    /// The experiment's result, once made (one per pass); held while it runs.
    proof: Mutex<Option<Proof>>,
    /// Whether the experiment proved that the storage ignores or refuses changes.
    proven: AtomicBool,
}

impl Probe {
    /// Whether the next change should be read back: none has held yet (after a verdict that
    /// stops the pass too: a change made meanwhile is not counted as made unless it held).
    pub fn wants_readback(&self) -> bool {
        !self.held.load(Ordering::Relaxed)
    }

    /// Whether a change held (the storage honours them).
    pub fn held(&self) -> bool {
        self.held.load(Ordering::Relaxed)
    }

    /// Records what a change to the entry at `path` (shown escaped) did; returns whether the
    /// experiment is due now: enough suspects, none held, none made yet.
    pub fn record(&self, outcome: Outcome, path: impl FnOnce() -> String) -> bool {
        match outcome {
            Outcome::Held => self.held.store(true, Ordering::Relaxed),
            Outcome::Ignored | Outcome::Refused => {
                let count = if outcome == Outcome::Ignored { &self.ignored } else { &self.refused };
                count.fetch_add(1, Ordering::Relaxed);
                lock(&self.example).get_or_insert_with(path);
            }
        }
        self.seen().verdict(VERDICT_AFTER).stops() && !self.tried()
    }

    /// Whether the experiment is due at the end of the pass: a suspect, none held, none made.
    pub fn due_at_end(&self) -> bool {
        let seen = self.seen();
        !seen.held && seen.ignored + seen.refused > 0 && !self.tried()
    }

    /// Whether the experiment was made.
    fn tried(&self) -> bool {
        lock(&self.proof).is_some()
    }

    /// Makes the experiment (`run`) unless it was made; other threads that [`Probe::settle`]
    /// meanwhile wait for it. Returns its result.
    pub fn prove(&self, run: impl FnOnce() -> Proof) -> Proof {
        let mut proof = lock(&self.proof);
        let p = proof.get_or_insert_with(run).clone();
        match p.verdict {
            Verdict::Honours => self.held.store(true, Ordering::Relaxed),
            v if v.stops() => self.proven.store(true, Ordering::Relaxed),
            _ => {}
        }
        p
    }

    /// Waits for an experiment under way (a change made meanwhile would be one more suspect).
    pub fn settle(&self) {
        drop(lock(&self.proof));
    }

    /// The experiment's result, if it was made.
    pub fn proof(&self) -> Option<Proof> {
        lock(&self.proof).clone()
    }

    /// What the changes so far did.
    fn seen(&self) -> Seen {
        Seen {
            held: self.held.load(Ordering::Relaxed),
            ignored: self.ignored.load(Ordering::Relaxed),
            refused: self.refused.load(Ordering::Relaxed),
        }
    }

    /// What the storage does, as far as it is proven: a change that held, or the experiment.
    /// Suspects alone are no verdict.
    pub fn verdict(&self) -> Verdict {
        if self.held.load(Ordering::Relaxed) {
            Verdict::Honours
        } else if self.proven.load(Ordering::Relaxed) {
            lock(&self.proof).as_ref().map_or(Verdict::Unknown, |p| p.verdict)
        } else {
            Verdict::Unknown
        }
    }

    /// The verdict once the pass is over (the experiment, if due, made by then).
    pub fn final_verdict(&self) -> Verdict {
        self.verdict()
    }

    /// The verdict's line (see [`Verdict::explain`]) when it stops the pass, with the
    /// experiment's evidence.
    pub fn explain(&self, verdict: Verdict, fs: &str) -> Option<String> {
        let n = self.ignored.load(Ordering::Relaxed) + self.refused.load(Ordering::Relaxed);
        let example = lock(&self.example).clone().unwrap_or_default();
        let line = verdict.explain(fs, n, &example)?;
        Some(match self.proof() {
            Some(p) => line.replacen("; stopped,", &format!("; volprep's own test: {}; stopped,", p.evidence), 1),
            None => line,
        })
    }
}

/// What a pass's changes did so far: whether any held, and how many did not (the storage
/// ignored them: success and nothing changed; or refused them: EPERM).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Seen {
    held: bool,
    ignored: u32,
    refused: u32,
}

impl Seen {
    /// The verdict (pure): any change that held means the storage honours them; `after` that
    /// did not, with none that did, mean it does not (the more frequent way wins).
    fn verdict(self, after: u32) -> Verdict {
        if self.held {
            Verdict::Honours
        } else if self.ignored + self.refused < after {
            Verdict::Unknown
        } else if self.ignored >= self.refused {
            Verdict::Ignores
        } else {
            Verdict::Refuses
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn proof(verdict: Verdict) -> Proof {
        Proof { verdict, evidence: "a file volprep created ...".into() }
    }

    #[test]
    fn one_change_that_holds_means_the_storage_honours_them() {
        let none_held = |ignored, refused| Seen { held: false, ignored, refused };
        assert_eq!(Seen { held: true, ignored: 30, refused: 30 }.verdict(8), Verdict::Honours);
        assert_eq!(none_held(7, 0).verdict(8), Verdict::Unknown, "a few odd entries are no verdict");
        assert_eq!(none_held(8, 0).verdict(8), Verdict::Ignores);
        assert_eq!(none_held(2, 6).verdict(8), Verdict::Refuses);
    }

    #[test]
    fn suspects_only_start_the_experiment_and_its_result_is_the_verdict() {
        let p = Probe::default();
        assert!(p.wants_readback());
        for i in 0..VERDICT_AFTER - 1 {
            assert!(!p.record(Outcome::Ignored, || format!("/v/f{i}")), "not due yet");
        }
        assert!(p.record(Outcome::Ignored, || "/v/last".into()), "8 suspects: the experiment is due");
        assert_eq!(p.verdict(), Verdict::Unknown, "suspects alone are no verdict");
        assert_eq!(p.prove(|| proof(Verdict::Ignores)).verdict, Verdict::Ignores);
        assert!(!p.record(Outcome::Ignored, || "/v/more".into()), "made once");
        assert_eq!(p.prove(|| unreachable!("made once")).verdict, Verdict::Ignores);
        assert!(p.wants_readback(), "a change made while the pass stops is read back too");
        assert_eq!(p.final_verdict(), Verdict::Ignores);
        let line = p.explain(p.verdict(), "fuse.blobfuse2").unwrap();
        assert!(line.starts_with("this filesystem (fuse.blobfuse2) ignores ownership changes: "), "{line}");
        assert!(line.contains("on 9 entries") && line.contains("e.g. /v/f0") && line.contains("fsGroupPolicy"));
        assert!(line.ends_with("the marker stays in-progress"), "{line}");
    }

    #[test]
    fn an_experiment_whose_change_held_clears_the_suspects() {
        let p = Probe::default();
        for i in 0..VERDICT_AFTER {
            p.record(Outcome::Refused, || format!("/v/immutable{i}"));
        }
        assert_eq!(p.prove(|| proof(Verdict::Honours)).verdict, Verdict::Honours);
        assert_eq!(p.final_verdict(), Verdict::Honours);
        assert!(!p.wants_readback(), "a change held: no more read-backs");
        assert_eq!(p.explain(p.final_verdict(), "ext4"), None);
        let q = Probe::default();
        q.record(Outcome::Refused, || "/v/a".into());
        q.prove(|| proof(Verdict::Unknown));
        assert_eq!(q.final_verdict(), Verdict::Unknown, "nothing proven: no verdict");
        assert!(!q.due_at_end(), "made once");
    }

    #[test]
    fn at_the_end_one_suspect_makes_the_experiment_due() {
        let p = Probe::default();
        assert!(!p.due_at_end(), "nothing suspect");
        p.record(Outcome::Ignored, || "/v/x".into());
        assert!(p.due_at_end());
        assert_eq!(p.final_verdict(), Verdict::Unknown, "not before the experiment");
        let q = Probe::default();
        q.record(Outcome::Refused, || "/v/x".into());
        q.record(Outcome::Held, String::new);
        assert!(!q.due_at_end(), "a change held");
        assert!(Verdict::Refuses.explain("nfs", 8, "/v/x").unwrap().contains("root_squash"));
        assert_eq!(Verdict::Refuses.word(), Some("refused"));
    }
}
