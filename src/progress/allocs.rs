//! A TEST HOOK, only in a binary built with `--features test-hooks`: a global allocator that
//! counts allocations (and reallocations) while `VOLPREP_TEST_COUNT_ALLOCATIONS=1` armed it, so
//! a test can hold a walk to a bound on the allocations it makes. Without the feature the
//! process keeps the system allocator and [`count`] is always `None`.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};

/// The environment variable that arms the count (see [`arm`]).
pub const COUNT_ALLOCATIONS_ENV: &str = "VOLPREP_TEST_COUNT_ALLOCATIONS";

/// Whether the count is armed: until then, an allocation costs one relaxed load more.
static ARMED: AtomicBool = AtomicBool::new(false);
/// Allocations and reallocations made since the count was armed, by every thread.
static MADE: AtomicU64 = AtomicU64::new(0);

/// Arms the count when this binary has the test hooks and `VOLPREP_TEST_COUNT_ALLOCATIONS=1`.
/// Read once, at the start of `apply`/`check`.
pub fn arm() {
    if cfg!(feature = "test-hooks") && std::env::var_os(COUNT_ALLOCATIONS_ENV).is_some_and(|v| v == "1") {
        ARMED.store(true, Relaxed);
    }
}

/// Allocations made by the process since the count was armed; `None` when it is not.
pub fn count() -> Option<u64> {
    ARMED.load(Relaxed).then(|| MADE.load(Relaxed))
}

#[cfg(feature = "test-hooks")]
mod counting {
    use std::alloc::{GlobalAlloc, Layout, System};

    use super::{ARMED, MADE, Relaxed};

    /// The system allocator, counting calls that allocate while armed.
    struct Counting;

    impl Counting {
        fn note(&self) {
            if ARMED.load(Relaxed) {
                MADE.fetch_add(1, Relaxed);
            }
        }
    }

    // SAFETY: every call is forwarded unchanged to the system allocator, which upholds the
    // `GlobalAlloc` contract; counting touches only two atomics and never allocates.
    unsafe impl GlobalAlloc for Counting {
        unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
            self.note();
            // SAFETY: the caller's `layout` contract is passed on as is.
            unsafe { System.alloc(layout) }
        }

        unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
            self.note();
            // SAFETY: as for `alloc`.
            unsafe { System.alloc_zeroed(layout) }
        }

        unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
            self.note();
            // SAFETY: `ptr` was allocated by `System` (every allocation goes through here) with
            // `layout`, as the caller guarantees.
            unsafe { System.realloc(ptr, layout, new_size) }
        }

        unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
            // SAFETY: as for `realloc`.
            unsafe { System.dealloc(ptr, layout) }
        }
    }

    #[global_allocator]
    static COUNTING: Counting = Counting;
}
