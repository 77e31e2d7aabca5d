//! Buffers a walk reuses rather than allocating them anew: each thread's `getdents64` buffers
//! ([`DirentBuf`]), and one stock of name buffers shared by the walk's batches ([`Stock`]), which
//! move from the thread that fills them to the one that handles them.

use std::cell::RefCell;
use std::ffi::CStr;
use std::mem::MaybeUninit;
use std::ops::{Deref, DerefMut};
use std::sync::Mutex;

use crate::sync::lock;

/// `getdents64` buffer per directory being read.
pub const DIRENT_BUF: usize = 32 * 1024;

/// Buffers a thread keeps for its next reads: one per directory it reads at once (a reader may
/// run queued jobs, which read directories, while its own read is paused: see `traverse::pace`).
const KEPT_PER_THREAD: usize = 4;

/// Name buffers the stock keeps; more at once are freed when handed back.
const KEPT_NAMES: usize = 64;

/// Bytes a fresh name buffer reserves: a batch of names of up to 31 bytes fits without growing
/// (a buffer that grew keeps its size when handed back).
const NAMES_RESERVED: usize = super::listing::BATCH * 32;

type Bytes = Box<[MaybeUninit<u8>]>;

thread_local! {
    /// This thread's idle `getdents64` buffers.
    static DIRENT_BUFS: RefCell<Vec<Bytes>> = const { RefCell::new(Vec::new()) };
}

/// A `getdents64` buffer of [`DIRENT_BUF`] bytes, taken from the thread's idle ones (allocated
/// when there is none) and handed back to them when dropped.
pub(super) struct DirentBuf(Option<Bytes>);

impl DirentBuf {
    pub(super) fn take() -> DirentBuf {
        let kept = DIRENT_BUFS.with(|b| b.borrow_mut().pop());
        DirentBuf(Some(kept.unwrap_or_else(|| vec![MaybeUninit::uninit(); DIRENT_BUF].into_boxed_slice())))
    }
}

impl Deref for DirentBuf {
    type Target = [MaybeUninit<u8>];

    fn deref(&self) -> &Self::Target {
        self.0.as_deref().expect("held until dropped")
    }
}

impl DerefMut for DirentBuf {
    fn deref_mut(&mut self) -> &mut Self::Target {
        self.0.as_deref_mut().expect("held until dropped")
    }
}

impl Drop for DirentBuf {
    fn drop(&mut self) {
        let Some(buf) = self.0.take() else { return };
        // `try_with`: a thread being torn down has no list left to keep it in.
        let _ = DIRENT_BUFS.try_with(|b| {
            let mut b = b.borrow_mut();
            if b.len() < KEPT_PER_THREAD {
                b.push(buf);
            }
        });
    }
}

/// The idle name buffers of one walk's batches.
#[derive(Default)]
pub(super) struct Stock {
    names: Mutex<Vec<Vec<u8>>>,
}

impl Stock {
    /// An empty batch, on an idle buffer of the stock when there is one.
    pub(super) fn batch(&self) -> Batch {
        let bytes = lock(&self.names).pop().unwrap_or_else(|| Vec::with_capacity(NAMES_RESERVED));
        Batch { bytes, count: 0 }
    }

    /// Takes `batch`'s buffer back, emptied, for a later batch.
    pub(super) fn put(&self, batch: Batch) {
        let mut bytes = batch.bytes;
        bytes.clear();
        let mut names = lock(&self.names);
        if names.len() < KEPT_NAMES {
            names.push(bytes);
        }
    }
}

/// Names of one directory's entries, NUL-terminated, in one buffer of a [`Stock`].
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

    /// The names in the order pushed, each found by one scan for its NUL.
    pub(super) fn iter(&self) -> impl Iterator<Item = &CStr> {
        let mut rest = &self.bytes[..];
        std::iter::from_fn(move || {
            let name = CStr::from_bytes_until_nul(rest).ok()?;
            rest = &rest[name.to_bytes_with_nul().len()..];
            Some(name)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_lists_its_names_in_order_and_its_buffer_is_reused() {
        let stock = Stock::default();
        let mut b = stock.batch();
        for n in [c"a", c"", c"long name"] {
            b.push(n);
        }
        assert_eq!(b.len(), 3);
        assert_eq!(b.iter().collect::<Vec<_>>(), [c"a", c"", c"long name"]);
        let ptr = b.bytes.as_ptr();
        stock.put(b);
        let again = stock.batch();
        assert_eq!((again.len(), again.iter().count(), again.bytes.as_ptr()), (0, 0, ptr), "the same buffer, emptied");
    }

    #[test]
    fn a_thread_reuses_its_dirent_buffer() {
        let first = DirentBuf::take();
        let ptr = first.as_ptr();
        let nested = DirentBuf::take();
        assert_ne!(nested.as_ptr(), ptr, "a read paused for another gets its own buffer");
        assert_eq!(first.len(), DIRENT_BUF);
        drop((nested, first));
        assert!([DirentBuf::take().as_ptr(), DirentBuf::take().as_ptr()].contains(&ptr));
    }
}
