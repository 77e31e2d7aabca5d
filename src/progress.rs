//! Live counters of a pass: lock-free atomics shared by every walker thread.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use crate::sys::Kind;

/// Counts for one volume. Every field only grows; read them at any time.
#[derive(Debug, Default)]
pub struct Counters {
    /// Entries looked at (the root and every entry below it, skipped mounts excluded).
    pub entries: AtomicU64,
    pub dirs: AtomicU64,
    pub files: AtomicU64,
    pub symlinks: AtomicU64,
    /// FIFOs, sockets and device nodes.
    pub others: AtomicU64,
    /// Entries whose owner or group changed (or would, in `check`).
    pub changed_owner: AtomicU64,
    /// Entries whose mode changed (or would, in `check`).
    pub changed_mode: AtomicU64,
    /// Per-entry failures.
    pub errors: AtomicU64,
}

impl Counters {
    pub fn seen(&self, kind: Kind) {
        self.entries.fetch_add(1, Relaxed);
        let by_kind = match kind {
            Kind::Dir => &self.dirs,
            Kind::File => &self.files,
            Kind::Symlink => &self.symlinks,
            _ => &self.others,
        };
        by_kind.fetch_add(1, Relaxed);
    }

    pub fn get(c: &AtomicU64) -> u64 {
        c.load(Relaxed)
    }

    pub fn add(c: &AtomicU64) {
        c.fetch_add(1, Relaxed);
    }
}
