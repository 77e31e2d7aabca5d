//! SIGTERM and SIGINT: a flag a pass polls to stop its walk and save its state.

use std::sync::atomic::{AtomicI32, Ordering};

/// The signal (SIGTERM, SIGINT) that asked this process to stop, 0 while none did.
static TERMINATION: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_termination(sig: libc::c_int) {
    // Async-signal-safe: atomic stores. Nothing waits at a load gate any more.
    TERMINATION.store(sig, Ordering::SeqCst);
    crate::throttle::stop_waiting();
}

/// Catches SIGTERM and SIGINT: the first one sets a flag that a pass polls to stop its walk and
/// save its state (the kubelet's grace period); a second one ends the process as usual.
pub fn catch_termination() {
    for sig in [libc::SIGTERM, libc::SIGINT] {
        // SAFETY: a handler that only stores to an atomic; sigaction with a zeroed, filled-in struct.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_termination as extern "C" fn(libc::c_int) as libc::sighandler_t;
            sa.sa_flags = libc::SA_RESTART | libc::SA_RESETHAND;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(sig, &sa, std::ptr::null_mut());
        }
    }
}

/// Sends `sig` to the calling thread (`raise(sig)`): the test hook of
/// `progress::arm_test_hook`.
pub fn signal_self(sig: libc::c_int) {
    // raise(3) directs the signal at this thread, which runs the handler before raise returns;
    // kill(getpid()) may hand it to another thread, later: the caller would then go on as if no
    // signal had come (a walk finishing right after it would not see its flag).
    // SAFETY: raise(3) with a plain signal number.
    unsafe {
        libc::raise(sig);
    }
}

/// The signal that asked this process to stop, if one did (only SIGINT and SIGTERM are caught).
pub fn termination() -> Option<crate::state::Stop> {
    match TERMINATION.load(Ordering::SeqCst) {
        0 => None,
        libc::SIGINT => Some(crate::state::Stop::Int),
        _ => Some(crate::state::Stop::Term),
    }
}
