//! The log sink: stderr, where a line that cannot be written (a closed pipe, EIO, a full disk)
//! is dropped and counted, so a dead log reader never stops, panics or changes the pass.

use std::io::{self, Write};
use std::sync::atomic::{AtomicU64, Ordering};

use tracing_subscriber::fmt::MakeWriter;

/// Log lines dropped because stderr refused them. Process-wide, as the subscriber is.
static DROPPED: AtomicU64 = AtomicU64::new(0);

/// Log lines that could not be written so far.
pub fn dropped() -> u64 {
    DROPPED.load(Ordering::Relaxed)
}

/// The `tracing` writer: stderr, never failing (see the module docs).
#[derive(Debug, Clone, Copy, Default)]
pub struct Stderr;

impl<'a> MakeWriter<'a> for Stderr {
    type Writer = Line;

    fn make_writer(&'a self) -> Line {
        Line
    }
}

/// One formatted event (the subscriber writes each event with one `write_all`).
#[derive(Debug)]
pub struct Line;

impl Write for Line {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        // `write_all` on the unbuffered stderr: retried on EINTR and short writes; any other
        // error (EPIPE: Rust ignores SIGPIPE, so a closed pipe is an error, not a signal) drops it.
        if io::stderr().lock().write_all(buf).is_err() {
            DROPPED.fetch_add(1, Ordering::Relaxed);
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}
