//! The one lock helper: a mutex whose holder panicked still guards plain data, so its poison is ignored.

use std::sync::{Mutex, MutexGuard};

/// Locks `m`, taking the guard even if a thread panicked while holding it: every mutex of volprep
/// guards plain data (lists, counters, queues) that a panic leaves consistent.
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The value of `m`, taken out even if a thread panicked while holding it (as [`lock`]).
pub fn into_inner<T>(m: Mutex<T>) -> T {
    m.into_inner().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_poisoned_mutex_still_locks() {
        let m = Mutex::new(1);
        let _ = std::panic::catch_unwind(|| {
            let _g = m.lock().unwrap();
            panic!("poison it");
        });
        assert!(m.is_poisoned());
        *lock(&m) += 1;
        assert_eq!(*lock(&m), 2);
    }
}
