//! One directory's read: its subdirectories become jobs, its other entries batches of names (or a count).

use std::ffi::CStr;

use rayon_core::Scope;
use rustix::io::Errno;

use super::node::Lease;
use super::traverse::Walk;
use super::{At, Visitor};
use crate::error::Op;
use crate::sys::{self, DType, Kind};

/// Names handled per batch job.
const BATCH: usize = 256;

/// What one directory's read hands on: subdirectories as jobs, other entries in batches (or, in a
/// verified directory, only a count).
pub(super) struct Listing<'a, 's, 'v, V: Visitor> {
    walk: &'s Walk<'v, V>,
    s: &'a Scope<'s>,
    lease: &'a Lease,
    verified: bool,
    batch: Batch,
    /// Entries of a verified directory that are not directories: counted, not visited.
    others: u64,
    /// The subdirectories `getdents` typed so far: the next one's ordinal.
    ord: u32,
}

impl<'a, 's, 'v, V: Visitor> Listing<'a, 's, 'v, V> {
    pub(super) fn new(walk: &'s Walk<'v, V>, s: &'a Scope<'s>, lease: &'a Lease, verified: bool) -> Self {
        Listing { walk, s, lease, verified, batch: Batch::default(), others: 0, ord: 0 }
    }

    /// One entry as `getdents` listed it.
    pub(super) fn entry(&mut self, name: &CStr, dtype: DType, ino: u64) {
        match dtype {
            DType::Dir => {
                self.walk.subdir(self.s, self.lease, name, ino, Some(self.ord));
                self.ord = self.ord.saturating_add(1);
            }
            DType::Other if self.verified => self.others += 1,
            DType::Unknown if self.verified => self.untyped(name),
            DType::Other | DType::Unknown => {
                self.batch.push(name);
                if self.batch.len() >= BATCH {
                    self.walk.dispatch(self.s, self.lease, std::mem::take(&mut self.batch));
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
        if !self.batch.is_empty() {
            self.walk.dispatch(self.s, self.lease, self.batch);
        }
        if self.verified {
            self.walk.visitor.listed(&self.lease.dir(), self.others);
        }
    }
}

/// Names of one directory's entries, NUL-terminated, in one buffer.
#[derive(Default)]
pub(super) struct Batch {
    bytes: Vec<u8>,
    count: usize,
}

impl Batch {
    pub(super) fn push(&mut self, name: &CStr) {
        self.bytes.extend_from_slice(name.to_bytes_with_nul());
        self.count += 1;
    }
    pub(super) fn len(&self) -> usize {
        self.count
    }
    pub(super) fn is_empty(&self) -> bool {
        self.count == 0
    }
    pub(super) fn iter(&self) -> impl Iterator<Item = &CStr> {
        self.bytes.split_inclusive(|&b| b == 0).map(|n| CStr::from_bytes_with_nul(n).expect("names are NUL-terminated"))
    }
}
