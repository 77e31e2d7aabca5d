//! The load a pass puts on its storage ([`Storage`]: local, or network and FUSE): a ceiling on
//! metadata operations per second (`--max-ops`) and, on network and FUSE filesystems, an
//! adaptive limit on the operations in flight (`--load`, see [`controller`]).
//!
//! Every metadata system call of a pass (a stat, an open, a `getdents64`, a chown or chmod)
//! passes through its volume's [`Gate`] (`sys` wraps each in [`op`]): it waits for its turn under
//! the ceiling, then for room under the limit, and its latency feeds the controller. One gate per
//! pass of a volume, each with its own baselines: the walker threads are one pool for every
//! volume of a run, so a thread takes the gate of the job it runs ([`enter`]: the thread's
//! current gate, which `sys` reaches without a parameter). While no policy asks for anything
//! (local storage, no ceiling) it costs a thread-local read and one atomic load.

mod controller;

use std::cell::RefCell;
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::sync::lock;
pub use controller::OpKind;
use controller::{Controller, Window};

/// Where a filesystem keeps its metadata, as far as its type tells: ordered by how far a request
/// goes (a run over several volumes takes the farthest).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Storage {
    /// On this machine (or a type volprep does not know).
    Local,
    /// A network or FUSE filesystem: every uncached request is a round trip.
    Remote,
}

/// `--load`: how many metadata operations a pass keeps in flight.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Concurrency {
    /// Adaptive on network and FUSE filesystems, full elsewhere (`apply` resolves it).
    #[default]
    Auto,
    /// As many as the storage answers without making them queue (see [`controller`]).
    Adaptive,
    /// One per walker thread: full speed.
    Full,
}

impl Concurrency {
    /// `Auto` resolved for `storage`: adaptive on a network or FUSE filesystem, full elsewhere.
    pub fn resolve(self, storage: Storage) -> Concurrency {
        match (self, storage) {
            (Concurrency::Auto, Storage::Remote) => Concurrency::Adaptive,
            (Concurrency::Auto, Storage::Local) => Concurrency::Full,
            (c, _) => c,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Concurrency::Auto => "auto",
            Concurrency::Adaptive => "adaptive",
            Concurrency::Full => "full",
        }
    }
}

/// How a run loads its storage.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Policy {
    pub concurrency: Concurrency,
    /// Metadata operations per second at most (`--max-ops`).
    pub max_ops: Option<u32>,
}

impl Policy {
    /// Whether the gate has anything to do.
    fn active(&self) -> bool {
        self.concurrency == Concurrency::Adaptive || self.max_ops.is_some()
    }
}

impl fmt::Display for Policy {
    /// `adaptive`, `full`, `adaptive, at most 500 ops/s`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.concurrency.name())?;
        match self.max_ops {
            Some(n) => write!(f, ", at most {n} ops/s"),
            None => Ok(()),
        }
    }
}

/// What the gate saw over a run: the report's `load` figures.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Figures {
    /// Metadata operations that passed the gate.
    pub ops: u64,
    /// Their mean latency, in microseconds.
    pub mean_latency_us: u64,
    /// What the same operations take unloaded, as the controller measured it (adaptive only).
    pub unloaded_latency_us: Option<u64>,
    /// The limit on operations in flight: at the end, lowest and highest (adaptive only).
    pub in_flight_limit: Option<Limits>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Limits {
    #[serde(rename = "final")]
    pub last: u64,
    pub min: u64,
    pub max: u64,
}

/// Set by a stop (SIGTERM) of the process: no gate has anything wait any more.
static STOPPING: AtomicBool = AtomicBool::new(false);

/// Lets every waiting and later operation of every gate through at once: the walks are stopping
/// (async-signal-safe: one atomic store; waiters see it within [`WAIT_STEP`]).
pub fn stop_waiting() {
    STOPPING.store(true, Ordering::Relaxed);
}

thread_local! {
    /// The gate of the pass whose work this thread runs now (see [`enter`]).
    static CURRENT: RefCell<Option<Arc<Gate>>> = const { RefCell::new(None) };
}

/// Runs the metadata operation `f` of kind `kind` through this thread's current gate (none:
/// at once, unmeasured).
pub fn op<T>(kind: OpKind, f: impl FnOnce() -> T) -> T {
    CURRENT.with_borrow(|gate| match gate {
        Some(g) => g.op(kind, f),
        None => f(),
    })
}

/// This thread's current gate.
pub fn current() -> Option<Arc<Gate>> {
    CURRENT.with_borrow(Clone::clone)
}

/// Makes `gate` this thread's current gate until the returned guard is dropped (which puts the
/// one before back).
pub fn enter(gate: Option<Arc<Gate>>) -> Entered {
    Entered { previous: CURRENT.replace(gate) }
}

/// A gate made current by [`enter`]; dropping it puts the previous one back.
pub struct Entered {
    previous: Option<Arc<Gate>>,
}

impl Drop for Entered {
    fn drop(&mut self) {
        let previous = self.previous.take();
        let _ = CURRENT.try_with(|c| c.replace(previous));
    }
}

/// Admits metadata operations under a [`Policy`].
pub struct Gate {
    on: AtomicBool,
    /// Set by a stop (SIGTERM): nothing waits any more.
    stopping: AtomicBool,
    state: Mutex<Option<State>>,
    /// Signalled when an operation ends (room under the limit).
    room: Condvar,
}

struct State {
    in_flight: usize,
    limit: usize,
    /// Changes with the limit: only operations admitted under the current limit are samples.
    epoch: u64,
    controller: Option<Controller>,
    window: Window,
    /// `--max-ops`: the interval between two operations, and when the next may start.
    pace: Option<(Duration, Option<Instant>)>,
    started: Instant,
    total: Window,
    limits: Limits,
}

/// Longest wait between two looks at a stop ([`stop_waiting`], or a test's stop of one gate).
const WAIT_STEP: Duration = Duration::from_millis(50);

impl Gate {
    pub const fn new() -> Gate {
        Gate {
            on: AtomicBool::new(false),
            stopping: AtomicBool::new(false),
            state: Mutex::new(None),
            room: Condvar::new(),
        }
    }

    /// Applies `policy` to what the next walks do, for `threads` walker threads. A policy that
    /// asks for nothing turns the gate off.
    pub fn start(&self, policy: Policy, threads: usize) {
        let adaptive = policy.concurrency == Concurrency::Adaptive;
        let controller = adaptive.then(|| Controller::new(threads));
        let limit = controller.as_ref().map_or(usize::MAX, Controller::limit);
        let pace = policy.max_ops.map(|n| (Duration::from_secs_f64(1.0 / f64::from(n.max(1))), None));
        let l = limit.min(threads) as u64;
        *lock(&self.state) = Some(State {
            in_flight: 0,
            limit,
            epoch: 0,
            controller,
            window: Window::default(),
            pace,
            started: Instant::now(),
            total: Window::default(),
            limits: Limits { last: l, min: l, max: l },
        });
        self.on.store(policy.active(), Ordering::Relaxed);
    }

    /// A gate applying `policy` to a pass on `threads` walker threads.
    pub fn started(policy: Policy, threads: usize) -> Gate {
        let gate = Gate::new();
        gate.start(policy, threads);
        gate
    }

    /// Lets every waiting and later operation of this gate through at once (a process's stop
    /// is [`stop_waiting`]).
    #[cfg(test)]
    pub fn stop_waiting(&self) {
        self.stopping.store(true, Ordering::Relaxed);
    }

    /// Runs the metadata operation `f` of kind `kind` when the policy admits it, and measures it.
    pub fn op<T>(&self, kind: OpKind, f: impl FnOnce() -> T) -> T {
        if !self.on.load(Ordering::Relaxed) {
            return f();
        }
        let epoch = self.admit();
        let t = Instant::now();
        let r = f();
        self.done(epoch, kind, t.elapsed());
        r
    }

    fn stopping(&self) -> bool {
        self.stopping.load(Ordering::Relaxed) || STOPPING.load(Ordering::Relaxed)
    }

    /// Waits for this operation's turn under the ceiling, then for room under the limit.
    fn admit(&self) -> u64 {
        let mut g = lock(&self.state);
        let Some(s) = g.as_mut() else { return 0 };
        if let Some((every, next)) = &mut s.pace {
            let now = Instant::now();
            let at = next.map_or(now, |n| n.max(now));
            *next = Some(at + *every);
            drop(g);
            while !self.stopping() {
                let now = Instant::now();
                if at <= now {
                    break;
                }
                std::thread::sleep((at - now).min(WAIT_STEP));
            }
            g = lock(&self.state);
        }
        loop {
            let Some(s) = g.as_mut() else { return 0 };
            if s.in_flight < s.limit || self.stopping() {
                s.in_flight += 1;
                if s.in_flight >= s.limit {
                    s.window.reached_limit();
                }
                return s.epoch;
            }
            g = self.wait(g);
        }
    }

    fn wait<'g>(&self, g: MutexGuard<'g, Option<State>>) -> MutexGuard<'g, Option<State>> {
        match self.room.wait_timeout(g, WAIT_STEP) {
            Ok((g, _)) => g,
            Err(e) => e.into_inner().0,
        }
    }

    /// An operation admitted under `epoch` took `latency`.
    fn done(&self, epoch: u64, kind: OpKind, latency: Duration) {
        let mut g = lock(&self.state);
        let Some(s) = g.as_mut() else { return };
        s.in_flight = s.in_flight.saturating_sub(1);
        s.total.add(kind, latency);
        let mut grew = false;
        if let Some(c) = s.controller.as_mut().filter(|_| epoch == s.epoch) {
            s.window.add(kind, latency);
            if s.window.samples() >= c.window_size() {
                let (was, unloaded) = (c.limit(), c.unloaded_us(&s.window));
                c.update(&s.window, s.started.elapsed());
                if c.limit() != was && tracing::enabled!(tracing::Level::DEBUG) {
                    let mean = s.window.total_us() / s.window.samples() as f64;
                    tracing::debug!(
                        limit = c.limit(),
                        was,
                        mean_us = mean.round() as u64,
                        unloaded_us = unloaded.map(|u| u.round() as u64),
                        "in-flight limit changed"
                    );
                }
                s.window = Window::default();
                let limit = c.limit();
                if limit != s.limit {
                    grew = limit > s.limit;
                    s.limit = limit;
                    s.epoch += 1;
                    let l = limit as u64;
                    s.limits = Limits { last: l, min: s.limits.min.min(l), max: s.limits.max.max(l) };
                }
            }
        }
        drop(g);
        if grew {
            self.room.notify_all();
        } else {
            self.room.notify_one();
        }
    }

    /// What the gate saw since it started (`None` while off).
    pub fn figures(&self) -> Option<Figures> {
        if !self.on.load(Ordering::Relaxed) {
            return None;
        }
        let g = lock(&self.state);
        let s = g.as_ref()?;
        let ops = s.total.samples();
        let mean = if ops > 0 { s.total.total_us() / ops as f64 } else { 0.0 };
        let controller = s.controller.as_ref();
        Some(Figures {
            ops,
            mean_latency_us: mean.round() as u64,
            unloaded_latency_us: controller.and_then(|c| c.unloaded_us(&s.total)).map(|u| u.round() as u64),
            in_flight_limit: controller.map(|_| s.limits),
        })
    }
}

impl Default for Gate {
    fn default() -> Self {
        Gate::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policies_read_as_words() {
        let p = Policy { concurrency: Concurrency::Adaptive, max_ops: Some(500) };
        assert_eq!(p.to_string(), "adaptive, at most 500 ops/s");
        assert_eq!(Policy { concurrency: Concurrency::Full, max_ops: None }.to_string(), "full");
        assert_eq!(Concurrency::Auto.resolve(Storage::Remote), Concurrency::Adaptive);
        assert_eq!(Concurrency::Auto.resolve(Storage::Local), Concurrency::Full);
        assert_eq!(Concurrency::Full.resolve(Storage::Remote), Concurrency::Full);
        assert!(!Policy { concurrency: Concurrency::Full, max_ops: None }.active());
    }

    #[test]
    fn an_idle_gate_lets_everything_through_and_measures_nothing() {
        let gate = Gate::new();
        assert_eq!(gate.op(OpKind::Lookup, || 7), 7);
        gate.start(Policy { concurrency: Concurrency::Full, max_ops: None }, 8);
        assert_eq!(gate.op(OpKind::Change, || 8), 8);
        assert_eq!(gate.figures(), None);
    }

    #[test]
    fn the_ceiling_holds_across_threads() {
        let gate = Gate::new();
        gate.start(Policy { concurrency: Concurrency::Full, max_ops: Some(200) }, 8);
        let t = Instant::now();
        std::thread::scope(|s| {
            for _ in 0..8 {
                s.spawn(|| {
                    for _ in 0..10 {
                        gate.op(OpKind::Lookup, || ());
                    }
                });
            }
        });
        // 80 operations at 200/s: the last starts 79 intervals after the first.
        let took = t.elapsed();
        assert!(took >= Duration::from_millis(390), "{took:?}");
        assert_eq!(gate.figures().map(|f| f.ops), Some(80));
    }

    #[test]
    fn adaptive_starts_with_one_in_flight() {
        let gate = Gate::new();
        gate.start(Policy { concurrency: Concurrency::Adaptive, max_ops: None }, 16);
        let inside = std::sync::atomic::AtomicUsize::new(0);
        let most = std::sync::atomic::AtomicUsize::new(0);
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for _ in 0..3 {
                        gate.op(OpKind::Change, || {
                            let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                            most.fetch_max(now, Ordering::SeqCst);
                            std::thread::sleep(Duration::from_millis(2));
                            inside.fetch_sub(1, Ordering::SeqCst);
                        });
                    }
                });
            }
        });
        // 12 operations: fewer than the first window, so the limit stayed at 1.
        assert_eq!(most.load(Ordering::SeqCst), 1);
        let f = gate.figures().unwrap();
        assert_eq!((f.ops, f.in_flight_limit.map(|l| l.last)), (12, Some(1)));
        assert!(f.mean_latency_us >= 2000, "{f:?}");
    }

    #[test]
    fn each_thread_measures_through_the_gate_it_entered_and_puts_the_previous_back() {
        let full = Policy { concurrency: Concurrency::Full, max_ops: Some(1_000_000) };
        let (a, b) = (Arc::new(Gate::started(full, 2)), Arc::new(Gate::started(full, 2)));
        op(OpKind::Lookup, || ());
        {
            let _a = enter(Some(Arc::clone(&a)));
            op(OpKind::Lookup, || ());
            std::thread::scope(|s| {
                s.spawn(|| {
                    // A new thread has no gate until it enters one.
                    assert!(current().is_none());
                    let _b = enter(Some(Arc::clone(&b)));
                    (0..3).for_each(|_| op(OpKind::Change, || ()));
                });
            });
            {
                let _b = enter(Some(Arc::clone(&b)));
                op(OpKind::Change, || ());
            }
            assert!(current().is_some_and(|g| Arc::ptr_eq(&g, &a)));
            op(OpKind::Lookup, || ());
        }
        assert!(current().is_none());
        let ops = |g: &Gate| g.figures().map(|f| f.ops);
        assert_eq!((ops(&a), ops(&b)), (Some(2), Some(4)));
    }

    #[test]
    fn a_stop_lets_waiting_operations_through() {
        let gate = Gate::new();
        gate.start(Policy { concurrency: Concurrency::Full, max_ops: Some(1) }, 4);
        gate.op(OpKind::Lookup, || ());
        gate.stop_waiting();
        let t = Instant::now();
        gate.op(OpKind::Lookup, || ());
        assert!(t.elapsed() < Duration::from_millis(500), "the second op waited for its second");
    }
}
