//! One directory's read: its subdirectories become jobs, its other entries batches of names (or a count).

use std::ffi::CStr;

use rayon_core::Scope;
use rustix::io::Errno;

use super::node::Lease;
use super::stock::Batch;
use super::traverse::Walk;
use super::{At, Contents, Visitor};
use crate::error::Op;
use crate::sys::{self, DType, Kind};

/// Names handled per batch job.
pub(super) const BATCH: usize = 256;

/// What one directory's read hands on: subdirectories as jobs, other entries in batches (or, in a
/// verified directory, only a count).
pub(super) struct Listing<'a, 's, 'v, V: Visitor> {
    walk: &'s Walk<'v, V>,
    s: &'a Scope<'s>,
    lease: &'a Lease,
    contents: Contents,
    /// The names not handed on yet (`None` until the first, then after each batch handed on).
    batch: Option<Batch>,
    /// Entries of a verified directory that are not directories: counted, not visited.
    others: u64,
    /// The subdirectories `getdents` typed so far: the next one's ordinal.
    ord: u32,
}

impl<'a, 's, 'v, V: Visitor> Listing<'a, 's, 'v, V> {
    pub(super) fn new(walk: &'s Walk<'v, V>, s: &'a Scope<'s>, lease: &'a Lease, contents: Contents) -> Self {
        Listing { walk, s, lease, contents, batch: None, others: 0, ord: 0 }
    }

    /// One entry as `getdents` listed it.
    pub(super) fn entry(&mut self, name: &CStr, dtype: DType, ino: u64) {
        match (dtype, self.contents) {
            (DType::Dir, _) => {
                self.walk.subdir(self.s, self.lease, name, ino, Some(self.ord));
                self.ord = self.ord.saturating_add(1);
            }
            (DType::Other, Contents::Verified) => self.others += 1,
            (DType::Unknown, Contents::Verified) => self.untyped(name),
            (DType::Other | DType::Unknown, Contents::Read) => {
                let walk = self.walk;
                let batch = self.batch.get_or_insert_with(|| walk.stock.batch());
                batch.push(name);
                if batch.len() >= BATCH {
                    let full = self.batch.take().expect("just pushed to");
                    walk.dispatch(self.s, self.lease, full);
                }
            }
        }
    }

    /// An entry of a verified directory whose type `getdents` did not tell: a stat tells.
    fn untyped(&mut self, name: &CStr) {
        match sys::stat_at(self.lease.fd(), name) {
            Ok(meta) if meta.kind() == Kind::Dir => self.walk.subdir(self.s, self.lease, name, meta.ino, None),
            Ok(_) => self.others += 1,
            Err(Errno::NOENT) => {}
            Err(e) => self.walk.visitor.error(At::Entry(self.lease.dir(), name), Op::Stat, e),
        }
    }

    /// The read is over: the last batch goes, and a verified directory reports its count.
    pub(super) fn finish(self) {
        if let Some(batch) = self.batch {
            self.walk.dispatch(self.s, self.lease, batch);
        }
        if self.contents == Contents::Verified {
            self.walk.visitor.listed(&self.lease.dir(), self.others);
        }
    }
}
