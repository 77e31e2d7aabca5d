//! The adaptive limit on metadata operations in flight (pure): a latency-ratio controller.
//!
//! It compares what the operations of each window took with what the same operations took
//! unloaded (the baseline of each kind, from the first, nearly idle windows and from a probe at
//! a quarter of the limit every [`PROBE_EVERY`]): a storage answers as fast with more requests
//! in flight until it is saturated, and from then on each request more only waits in its queue.
//! The limit starts at 1 and doubles while the ratio stays near 1 (slow start), then grows by an
//! eighth while the ratio is below [`LOW`], holds up to [`HIGH`], and above it shrinks towards
//! [`TARGET`] (by half at most): a saturated storage is kept just past its capacity, with
//! every request taking about [`TARGET`] times its unloaded latency instead of waiting in a
//! queue that more threads would only lengthen.
//! One window alone past the ratio that ends slow start or shrinks the limit holds it (on a
//! busy client a slow window is often noise); the second in a row acts.
//!
//! Slow start's baseline is the mean of its windows, not the fastest one (noise made that one
//! fast), and a descent of the limit that the latency does not follow is no queue of the walk's
//! ([`Controller::followed`]): that window is the new baseline, and the limit grows again from
//! there instead of halving towards one in flight.
//!
//! It cannot latch at one in flight: a window at a limit of 1 is itself an unloaded measurement
//! (nothing of this walk queues behind anything), so it re-bases every kind it saw (and the
//! limit grows again from there as at the start), and a
//! baseline that was too low (a first window answered from a client cache, a service time that
//! stepped up and stayed up, fast and slow storage in one run) is replaced there. A probe runs
//! at any limit, and a kind whose baseline is older than [`BASE_TTL`] is re-based by the next
//! probe that sees it at all.
//!
//! Only a kind with a baseline steers: a kind first seen above one in flight (a directory open
//! after the first files' changes) has its loaded latency there, which taken as its baseline
//! would read as no load and let the limit grow past what the storage serves, so a probe
//! measures it first. A kind whose latency is past [`IMPOSSIBLE`] times the limit times its
//! baseline has a baseline the walk's own queue cannot explain (each request waits behind the
//! limit's others at most): it is forgotten and a probe measures it, instead of the limit
//! halving towards one on a figure that says nothing of the load.

use std::time::Duration;

/// What a metadata operation is, for its baseline: kinds differ in cost (a change is a round
/// trip to the server, a stat of an open inode is often answered from the client's cache).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpKind {
    /// A stat by name (a lookup).
    Lookup,
    /// A stat of an open fd.
    Fstat,
    /// An `O_PATH` pin of an entry, or an open of a file through its pin.
    Open,
    /// An open of a directory (costs more than a pin: a network filesystem asks its server).
    OpenDir,
    /// One `getdents64` call.
    Read,
    /// A chown or chmod.
    Change,
}

/// The number of [`OpKind`]s.
pub const KINDS: usize = 6;

impl OpKind {
    fn index(self) -> usize {
        self as usize
    }
}

/// How far the operations in flight went during a window: a window that never reached the
/// limit (the walk had fewer to send) says nothing about a higher one.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
enum Reach {
    #[default]
    Below,
    Limit,
}

/// Latency buckets of a window: powers of two of microseconds.
const BUCKETS: usize = 32;

/// The bucket of a latency of `us` microseconds.
fn bucket(us: f64) -> usize {
    ((us.max(1.0) as u64).ilog2() as usize).min(BUCKETS - 1)
}

/// An operation more than this many times faster than its kind's baseline was answered from a
/// cache (the client's, the kernel's): it says nothing of the server's load, and is left out of
/// the ratio and of the baselines.
const CACHED: f64 = 8.0;

/// Buckets below its 7/8 quantile from which a kind's operations count (2 to 4 times faster):
/// the server's hump; faster ones were answered by a cache on the way, and how many of them a
/// window has says nothing of the load.
const HUMP: usize = 1;

/// Latencies of the operations completed in one window, by kind and bucket.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Window {
    n: [[u64; BUCKETS]; KINDS],
    /// Sums of latencies, in microseconds.
    sum_us: [[f64; BUCKETS]; KINDS],
    reach: Reach,
}

impl Default for Window {
    fn default() -> Self {
        Window { n: [[0; BUCKETS]; KINDS], sum_us: [[0.0; BUCKETS]; KINDS], reach: Reach::Below }
    }
}

impl Window {
    pub fn add(&mut self, kind: OpKind, latency: Duration) {
        let (k, us) = (kind.index(), latency.as_secs_f64() * 1e6);
        let b = bucket(us);
        self.n[k][b] += 1;
        self.sum_us[k][b] += us;
    }

    /// Operations of kind `k`.
    fn count(&self, k: usize) -> u64 {
        self.n[k].iter().sum()
    }

    /// Operations of kind `k` that took at least about `floor_us` (by bucket), and no more than
    /// [`HUMP`] buckets less than its 7/8 quantile (a kind some of whose operations a cache on
    /// the way answers has two humps, and only the server's is its load: how many fall in the
    /// other changes from window to window, and would move a mean of both), and their summed
    /// latency.
    fn served(&self, k: usize, floor_us: Option<f64>) -> (u64, f64) {
        let Some((from, _)) = self.hump(k, floor_us) else { return (0, 0.0) };
        (self.n[k][from..].iter().sum(), self.sum_us[k][from..].iter().sum())
    }

    /// Where the server's hump of kind `k` begins (the bucket [`HUMP`] below its 7/8 quantile,
    /// and not below about `floor_us`), and the bucket of that quantile; `None` without an
    /// operation from `floor_us` up.
    fn hump(&self, k: usize, floor_us: Option<f64>) -> Option<(usize, usize)> {
        let low = floor_us.map_or(0, bucket);
        let n: u64 = self.n[k][low..].iter().sum();
        let mut seen = 0;
        let q = (low..BUCKETS).find(|&b| {
            seen += self.n[k][b];
            n > 0 && 8 * seen >= 7 * n
        })?;
        Some((low.max(q.saturating_sub(HUMP)), q))
    }

    /// The operations of kind `k` that took at least about `floor_us` and are neither far faster
    /// (answered by a cache, as in [`Self::served`]) nor more than [`STALL`] buckets slower (4 to
    /// 8 times) than its 7/8 quantile, and their summed latency: the typical latency, for a
    /// baseline. An operation far slower than most of its window stalled on the client (its
    /// thread descheduled on a busy machine); at one in flight the mean alone would take that
    /// stall for the storage's unloaded latency, and the limit would grow past the storage on it.
    fn typical(&self, k: usize, floor_us: Option<f64>) -> (u64, f64) {
        let Some((from, q)) = self.hump(k, floor_us) else { return (0, 0.0) };
        let upto = (q + STALL).min(BUCKETS - 1);
        (self.n[k][from..=upto].iter().sum(), self.sum_us[k][from..=upto].iter().sum())
    }

    /// The operations in flight reached the limit.
    pub fn reached_limit(&mut self) {
        self.reach = Reach::Limit;
    }

    /// Operations in the window.
    pub fn samples(&self) -> u64 {
        (0..KINDS).map(|k| self.count(k)).sum()
    }

    /// Their total latency, in microseconds.
    pub fn total_us(&self) -> f64 {
        self.sum_us.iter().flatten().sum()
    }
}

/// Buckets above the 7/8 quantile of its window past which an operation stalled on the client
/// and is left out of a baseline (see [`Window::typical`]).
const STALL: usize = 2;

/// Samples a window needs at least (with 2 × the limit: about two round trips of every slot).
pub const MIN_SAMPLES: u64 = 16;
/// Samples of a kind a probe window needs to re-base it.
const PROBE_MIN: u64 = 4;
/// Windows after a probe before a missing or wrong baseline starts another (a kind too rare
/// to be in a probe window does not make every other window one).
const PROBE_GAP: u32 = 3;
/// A ratio past this many times the limit is not the walk's own load: a baseline is too low.
const IMPOSSIBLE: f64 = 2.0;
/// A descent of the limit to this share of where it began that leaves the ratio as it was is
/// no queue of the walk's (see [`Controller::followed`]).
const FOLLOW: f64 = 0.7;
/// Slow start ends at this ratio.
const SLOW_START_EXIT: f64 = 1.3;
/// Below this ratio the limit grows.
pub const LOW: f64 = 1.15;
/// Above this ratio the limit shrinks ...
pub const HIGH: f64 = 1.5;
/// ... towards this one.
pub const TARGET: f64 = 1.25;
/// How often the baseline is measured again at a quarter of the limit (the storage's unloaded
/// latency may change: other clients come and go).
pub const PROBE_EVERY: Duration = Duration::from_secs(3);
/// A baseline older than this is replaced by the next probe window that has the kind at all
/// (as BBR expires its minimum round-trip time).
pub const BASE_TTL: Duration = Duration::from_secs(10);

#[derive(Debug, Clone, Copy, PartialEq)]
enum Phase {
    SlowStart,
    Steady,
}

/// The limit and what it is based on.
#[derive(Debug, Clone)]
pub struct Controller {
    limit: f64,
    max: f64,
    phase: Phase,
    /// Unloaded mean latency of each kind, in microseconds, and when it was measured.
    base: [Option<f64>; KINDS],
    based_at: [Duration; KINDS],
    last_probe: Duration,
    /// While a probe measures the baselines at a lower limit: the limit to come back to.
    probe: Option<f64>,
    /// Windows since the last probe (or re-base at one in flight).
    since_probe: u32,
    /// Consecutive windows whose ratio said "loaded" (past [`SLOW_START_EXIT`] in slow start,
    /// past [`HIGH`] after): one window alone is noise (a scheduler's delay, a cache's miss)
    /// and leaves the limit as it is; the second acts.
    loaded: u8,
    /// While the limit shrinks window after window: the limit and the ratio it shrank from first
    /// (see [`Controller::followed`]).
    descent: Option<(f64, f64)>,
    /// Slow start's operations of each kind so far, and their summed latency (µs).
    start: [(u64, f64); KINDS],
}

impl Controller {
    /// A controller of at most `max` operations in flight (the walk's threads), starting at 1.
    pub fn new(max: usize) -> Controller {
        Controller {
            limit: 1.0,
            max: max.max(1) as f64,
            phase: Phase::SlowStart,
            base: [None; KINDS],
            based_at: [Duration::ZERO; KINDS],
            last_probe: Duration::ZERO,
            probe: None,
            since_probe: 0,
            loaded: 0,
            descent: None,
            start: [(0, 0.0); KINDS],
        }
    }

    /// Operations allowed in flight now.
    pub fn limit(&self) -> usize {
        self.limit.round().clamp(1.0, self.max) as usize
    }

    /// Samples of the next window.
    pub fn window_size(&self) -> u64 {
        (2 * self.limit() as u64).max(MIN_SAMPLES)
    }

    /// The unloaded latency of `kind` in microseconds, once measured.
    #[cfg(test)]
    pub fn base_us(&self, kind: OpKind) -> Option<f64> {
        self.base[kind.index()]
    }

    /// The mean unloaded latency of the operations counted in `w` (each kind at its baseline),
    /// in microseconds; `None` before any baseline.
    pub fn unloaded_us(&self, w: &Window) -> Option<f64> {
        let (mut n, mut sum) = (0, 0.0);
        for k in 0..KINDS {
            if let Some(base) = self.base[k] {
                n += w.count(k);
                sum += w.count(k) as f64 * base;
            }
        }
        (n > 0).then(|| sum / n as f64)
    }

    /// The latency below which an operation of kind `k` was answered from a cache.
    fn floor(&self, k: usize) -> Option<f64> {
        self.base[k].map(|b| b / CACHED)
    }

    /// What the window's operations the server answered took over what they take unloaded;
    /// `None` when no kind of the window has a baseline (kinds without one do not steer: a
    /// baseline taken at a high limit would be the loaded latency, and the limit would grow
    /// past what the storage serves).
    fn ratio(&self, w: &Window) -> Option<f64> {
        let (mut now, mut unloaded) = (0.0, 0.0);
        for k in 0..KINDS {
            let (n, sum) = w.served(k, self.floor(k));
            if let (true, Some(base)) = (n > 0, self.base[k]) {
                now += sum;
                unloaded += n as f64 * base;
            }
        }
        (unloaded > 0.0).then(|| now / unloaded)
    }

    /// Whether `w` has at least [`PROBE_MIN`] served operations of a kind without a baseline:
    /// it is measured by a probe (at a quarter of the limit) before it steers.
    fn unbased(&self, w: &Window) -> bool {
        (0..KINDS).any(|k| self.base[k].is_none() && w.served(k, None).0 >= PROBE_MIN)
    }

    /// Re-bases each kind `w` has at least `min` served samples of; with fewer, lowers its
    /// baseline to the window's mean (a less loaded window), or replaces it (cached answers
    /// included) when it is older than [`BASE_TTL`].
    fn rebase(&mut self, w: &Window, now: Duration, min: u64) {
        for k in 0..KINDS {
            let stale = now.saturating_sub(self.based_at[k]) >= BASE_TTL;
            let (n, sum) = w.typical(k, if stale { None } else { self.floor(k) });
            if n == 0 {
                continue;
            }
            let mean = sum / n as f64;
            if n >= min || stale || self.base[k].is_none_or(|b| mean < b) {
                self.base[k] = Some(mean);
                self.based_at[k] = now;
            }
        }
    }

    /// How many of the window's operations the server answered (not a cache).
    fn served(&self, w: &Window) -> u64 {
        (0..KINDS).map(|k| w.served(k, self.floor(k)).0).sum()
    }

    /// Takes a finished window (of operations admitted at the current limit) at `now` since the
    /// walk began; the limit may change.
    pub fn update(&mut self, w: &Window, now: Duration) {
        if w.samples() == 0 {
            return;
        }
        if self.served(w) < PROBE_MIN && self.base.iter().any(Option::is_some) {
            // Answered from caches: nothing said of the server's load.
            return;
        }
        self.since_probe = self.since_probe.saturating_add(1);
        if let Some(resume) = self.probe.take() {
            // A probe lowers baselines, sets missing ones and replaces expired ones; it raises
            // none: a quarter of the limit is not always unloaded (requests the gate does not
            // see, a busy client), and a baseline too high lets the limit grow past the storage.
            self.rebase(w, now, u64::MAX);
            self.descent = None;
            self.limit = resume;
            self.last_probe = now;
            self.since_probe = 0;
            return;
        }
        if self.limit() == 1 {
            // One in flight: this window is unloaded, whatever the baselines said; from there
            // the limit grows again as at the start. (A kind with fewer than PROBE_MIN
            // operations here only lowers its baseline: one operation alone may have stalled.)
            self.start_again(w, now);
            self.last_probe = now;
            self.since_probe = 0;
            self.limit = 1.0;
        }
        let due = match self.phase {
            Phase::SlowStart => false,
            Phase::Steady => now.saturating_sub(self.last_probe) >= PROBE_EVERY,
        };
        if self.limit() >= 2 && (due || self.since_probe >= PROBE_GAP && self.distrusts(w)) {
            self.probe = Some(self.limit);
            self.limit = (self.limit / 4.0).max(1.0);
            return;
        }
        let Some(r) = self.ratio(w) else { return };
        match self.phase {
            Phase::SlowStart => self.slow_start(w, r, now),
            Phase::Steady => self.steady(w, r, now),
        }
    }

    /// Takes `w` as unloaded: re-bases every kind it has [`PROBE_MIN`] operations of (fewer
    /// only lower a baseline) and grows the limit again from where it is, as at the start.
    fn start_again(&mut self, w: &Window, now: Duration) {
        self.rebase(w, now, PROBE_MIN);
        self.phase = Phase::SlowStart;
        self.descent = None;
        self.start = [(0, 0.0); KINDS];
    }

    /// Steady steering of the window `w` of ratio `r`, unless the latency did not follow a
    /// descent of the limit ([`Self::followed`]).
    fn steady(&mut self, w: &Window, r: f64, now: Duration) {
        if self.followed(w, r, now) {
            self.steer(r, w.reach);
        }
    }

    /// Whether the latency followed the limit down, as a queue's does: a descent that has
    /// taken the limit to [`FOLLOW`] of what it was when the ratio last fell and left the ratio
    /// `r` at nine tenths or more of that one did not shorten a queue of this walk's requests
    /// (in a queue, a third fewer requests wait a third less).
    /// The baselines are too low (taken from slow start's windows, which a warm cache or a
    /// lighter mix of operations made faster than the storage is now): this window is
    /// measured as the new baseline and the limit grows again from there as at the start,
    /// instead of halving towards one in flight and climbing back from there.
    fn followed(&mut self, w: &Window, r: f64, now: Duration) -> bool {
        if r <= HIGH {
            self.descent = None;
            return true;
        }
        match self.descent {
            Some((from, r0)) if r >= 0.9 * r0 => {
                if self.limit > FOLLOW * from {
                    return true;
                }
                self.start_again(w, now);
                self.loaded = 0;
                false
            }
            // The latency followed (or the descent begins): measured from here on.
            _ => {
                self.descent = Some((self.limit, r));
                true
            }
        }
    }

    /// Whether `w` says a baseline is missing or wrong: a kind without one ([`Self::unbased`]),
    /// or one whose latency in `w` is past [`IMPOSSIBLE`] times the limit times its baseline,
    /// which the walk's own requests cannot cause (each queues behind the limit's others at
    /// most): that baseline is too low (taken from a cache's answers, or the storage's service
    /// time stepped up) and is forgotten, to be measured again by a probe.
    fn distrusts(&mut self, w: &Window) -> bool {
        let mut wrong = false;
        for k in 0..KINDS {
            let (n, sum) = w.served(k, self.floor(k));
            if let (true, Some(base)) = (n >= PROBE_MIN, self.base[k]) {
                if sum / n as f64 > IMPOSSIBLE * self.limit * base {
                    self.base[k] = None;
                    wrong = true;
                }
            }
        }
        wrong || self.unbased(w)
    }

    /// Slow start: doubles the limit while the ratio `r` stays below [`SLOW_START_EXIT`]; the
    /// second window in a row past it goes to steady steering.
    fn slow_start(&mut self, w: &Window, r: f64, now: Duration) {
        // Still (nearly) unloaded: the mean of every window so far is the baseline (the lowest
        // window's mean would be one the noise made low, and the limit would shrink later on a
        // ratio the storage's own latency gives).
        if r < SLOW_START_EXIT {
            for k in 0..KINDS {
                let (n, sum) = w.served(k, self.floor(k));
                if n > 0 && self.base[k].is_some() {
                    let (an, asum) = &mut self.start[k];
                    *an += n;
                    *asum += sum;
                    self.base[k] = Some(*asum / *an as f64);
                    self.based_at[k] = now;
                }
            }
        }
        if r < SLOW_START_EXIT && self.limit < self.max {
            self.loaded = 0;
            if w.reach == Reach::Limit {
                self.limit = (self.limit * 2.0).min(self.max);
            }
        } else if self.limit < self.max && self.confirm_loaded() {
            // Once: the next window says whether the storage is loaded.
        } else {
            self.phase = Phase::Steady;
            self.last_probe = now;
            self.steady(w, r, now);
        }
    }

    /// Counts a window that said "loaded"; true when it is the first of a row (then nothing
    /// changes yet).
    fn confirm_loaded(&mut self) -> bool {
        self.loaded = self.loaded.saturating_add(1);
        self.loaded == 1
    }

    /// Grows (when the window's operations `reach`ed the limit), holds or shrinks the limit for
    /// ratio `r`.
    fn steer(&mut self, r: f64, reach: Reach) {
        if r <= HIGH {
            self.loaded = 0;
        } else if self.confirm_loaded() {
            return;
        }
        if r > HIGH {
            self.limit = (self.limit * (TARGET / r).clamp(0.5, 1.0)).max(1.0);
        } else if r < LOW && reach == Reach::Limit {
            self.limit = (self.limit + (self.limit / 8.0).max(1.0)).min(self.max);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A metadata server with `slots` service slots of `service` each, and a queue: with `n`
    /// requests in flight each takes `service × max(1, n / slots)`. Runs the controller against
    /// it for `secs` and returns (requests served per second over the last half, mean ratio of
    /// latency to `service` over the last half).
    fn closed_loop(slots: f64, service_us: f64, max: usize, secs: f64) -> (f64, f64) {
        let mut c = Controller::new(max);
        let mut t = 0.0;
        let (mut served, mut ratio_sum, mut windows) = (0.0, 0.0, 0.0);
        while t < secs {
            let n = c.limit() as f64;
            let latency = service_us * (n / slots).max(1.0);
            let size = c.window_size();
            let mut w = Window { reach: Reach::Limit, ..Window::default() };
            // A mix: lookups and changes at the server's latency, cached fstats at 3 µs.
            for i in 0..size {
                let (kind, us) = match i % 4 {
                    0 => (OpKind::Fstat, 3.0),
                    1 => (OpKind::Lookup, latency),
                    _ => (OpKind::Change, latency),
                };
                w.add(kind, Duration::from_secs_f64(us / 1e6));
            }
            // The window lasts as long as its server requests take with n in flight.
            let dt = (size as f64 * 0.75) * latency / n / 1e6;
            t += dt;
            if t > secs / 2.0 {
                served += size as f64 * 0.75;
                ratio_sum += latency / service_us * dt;
                windows += dt;
            }
            c.update(&w, Duration::from_secs_f64(t));
        }
        (served / windows, ratio_sum / windows)
    }

    #[test]
    fn a_saturated_server_is_kept_near_its_capacity_at_a_low_latency_ratio() {
        for slots in [1.0, 4.0, 16.0, 50.0] {
            for max in [32, 128, 256] {
                let (rate, ratio) = closed_loop(slots, 2000.0, max, 30.0);
                let capacity = slots.min(max as f64) / 2000e-6;
                assert!(rate >= 0.85 * capacity, "{slots} slots, {max} threads: {rate:.0}/s of {capacity:.0}/s");
                assert!(ratio <= 2.0, "{slots} slots, {max} threads: latency {ratio:.2}× unloaded");
            }
        }
    }

    /// What the closed-loop server does, window by window.
    struct Scenario {
        slots: f64,
        /// The service time of a request at `t` seconds, in µs.
        service_us: fn(f64) -> f64,
        /// The share of lookups and changes of window `i` a client cache answers (3 µs).
        cached: fn(u64) -> f64,
        /// Most operations the walk has to send at once (`None`: always more than the limit).
        sends: Option<f64>,
        max: usize,
        /// From window `.0` on, every third operation is a `getdents64`, a kind not seen before, whose service time is `.1` times the others'.
        late: Option<(u64, f64)>,
    }

    /// Runs the controller against `sc` for `secs`; returns the limit after each window, with
    /// the time it ended at.
    fn trace(sc: &Scenario, secs: f64) -> Vec<(f64, usize)> {
        let mut c = Controller::new(sc.max);
        let (mut t, mut i, mut out) = (0.0, 0, Vec::new());
        while t < secs {
            let limit = c.limit() as f64;
            let n = sc.sends.map_or(limit, |m| m.min(limit));
            let service = (sc.service_us)(t);
            let latency = service * (n / sc.slots).max(1.0);
            let reach = if sc.sends.is_none_or(|m| limit <= m) { Reach::Limit } else { Reach::Below };
            let mut w = Window { reach, ..Window::default() };
            let size = c.window_size();
            let cached = (sc.cached)(i);
            let (mut busy_us, mut remote) = (0.0, 0.0);
            for j in 0..size {
                let (kind, us) = match sc.late {
                    Some((from, times)) if i >= from && j % 3 == 0 => (OpKind::Read, latency * times),
                    _ if j % 2 == 0 => (OpKind::Lookup, latency),
                    _ => (OpKind::Change, latency),
                };
                let us = if (j as f64 + 0.5) / size as f64 <= cached { 3.0 } else { us };
                remote += f64::from(us > 3.0);
                busy_us += us;
                w.add(kind, Duration::from_secs_f64(us / 1e6));
            }
            let _ = remote;
            t += busy_us / n / 1e6;
            c.update(&w, Duration::from_secs_f64(t));
            out.push((t, c.limit()));
            i += 1;
        }
        out
    }

    /// The first window after `from` seconds whose limit is at least `share` of the server's
    /// slots, counted from the first window after `from`; and the mean limit over the last
    /// quarter of the run.
    fn recovery(sc: &Scenario, secs: f64, from: f64, share: f64) -> (Option<usize>, f64) {
        let tr = trace(sc, secs);
        let after: Vec<_> = tr.iter().filter(|(t, _)| *t >= from).collect();
        let at = after.iter().position(|(_, l)| *l as f64 >= share * sc.slots);
        let tail = &tr[tr.len() * 3 / 4..];
        (at, tail.iter().map(|(_, l)| *l as f64).sum::<f64>() / tail.len() as f64)
    }

    fn fixed(_: f64) -> f64 {
        2000.0
    }
    fn uncached(_: u64) -> f64 {
        0.0
    }

    /// Each latch trigger: the limit comes back to at least 0.85 × the server's slots within a
    /// bounded number of windows, and stays there.
    #[track_caller]
    fn recovers(name: &str, sc: Scenario, from: f64) {
        let (at, tail) = recovery(&sc, 40.0, from, 0.85);
        let at = at.unwrap_or_else(|| panic!("{name}: never back to 0.85 × {} slots", sc.slots));
        assert!(at <= 40, "{name}: back to 0.85 × {} slots after {at} windows", sc.slots);
        assert!(tail >= 0.85 * sc.slots, "{name}: mean limit {tail:.1} at the end, {} slots", sc.slots);
    }

    #[test]
    fn a_first_window_answered_from_a_cache_does_not_latch_the_limit() {
        for slots in [4.0, 16.0] {
            let first_cached = |i: u64| if i == 0 { 1.0 } else { 0.0 };
            recovers(
                "cached first window",
                Scenario { slots, service_us: fixed, cached: first_cached, sends: None, max: 32, late: None },
                0.0,
            );
        }
    }

    #[test]
    fn a_service_time_that_steps_up_and_stays_up_does_not_latch_the_limit() {
        fn step(t: f64) -> f64 {
            if t < 5.0 { 2000.0 } else { 8000.0 }
        }
        for slots in [4.0, 16.0] {
            recovers(
                "step up",
                Scenario { slots, service_us: step, cached: uncached, sends: None, max: 32, late: None },
                5.0,
            );
        }
    }

    #[test]
    fn a_descent_the_latency_does_not_follow_re_bases_instead_of_going_down_to_one() {
        // Slow start's windows are answered in 1.1 ms (a warm cache, a lighter mix), then every
        // request takes 2 ms: the ratio reads 1.8 at any limit up to the slots, a queue's
        // would halve with the limit.
        fn warm_start(t: f64) -> f64 {
            if t < 0.03 { 1100.0 } else { 2000.0 }
        }
        for slots in [4.0, 16.0] {
            let sc = Scenario { slots, service_us: warm_start, cached: uncached, sends: None, max: 32, late: None };
            let tr = trace(&sc, 10.0);
            // No window after the step below a third of the slots, but a probe's (a quarter of
            // the limit between two windows at it).
            let after: Vec<usize> = tr.iter().filter(|(t, _)| *t >= 0.03).map(|(_, l)| *l).collect();
            for w in after.windows(3) {
                let probe = w[0] >= 3 * w[1] && w[2] >= 3 * w[1];
                assert!(probe || w[1] as f64 >= slots / 3.0, "{slots} slots: down to {} in flight: {w:?}", w[1]);
            }
            recovers("warm start", sc, 0.03);
        }
    }

    #[test]
    fn fast_and_slow_storage_in_one_run_do_not_latch_the_limit() {
        // A local volume first (every operation a few µs), then a remote one; then windows that
        // mix both.
        let local_first = |i: u64| if i < 30 { 1.0 } else { 0.0 };
        let mixed = |i: u64| {
            if i < 30 {
                1.0
            } else if i % 7 == 0 {
                0.5
            } else {
                0.0
            }
        };
        for slots in [4.0, 16.0] {
            recovers(
                "local then remote",
                Scenario { slots, service_us: fixed, cached: local_first, sends: None, max: 32, late: None },
                0.0,
            );
            recovers(
                "mixed",
                Scenario { slots, service_us: fixed, cached: mixed, sends: None, max: 32, late: None },
                0.0,
            );
        }
    }

    #[test]
    fn windows_that_never_reach_the_limit_do_not_latch_it() {
        let first_cached = |i: u64| if i == 0 { 1.0 } else { 0.0 };
        for slots in [4.0, 16.0] {
            let sc =
                Scenario { slots, service_us: fixed, cached: first_cached, sends: Some(slots), max: 32, late: None };
            recovers("walk sends no more than the slots", sc, 0.0);
        }
    }

    #[test]
    fn a_kind_first_seen_at_a_high_limit_does_not_push_the_limit_past_the_server() {
        // A kind 4 times cheaper than the others, or 4 times dearer, first seen in the 4th window
        // (slow start, at 8 in flight) or the 40th (steady, near the server's slots): had it its
        // loaded latency as baseline, the ratio would read low and the limit grow past the server.
        for slots in [4.0, 16.0] {
            for from in [3, 40] {
                for times in [0.25, 4.0] {
                    let sc = Scenario {
                        slots,
                        service_us: fixed,
                        cached: uncached,
                        sends: None,
                        max: 64,
                        late: Some((from, times)),
                    };
                    let tr = trace(&sc, 30.0);
                    // The time-weighted mean of what a request waits (latency over service).
                    let (mut t0, mut waited) = (0.0, 0.0);
                    for (t, limit) in &tr {
                        waited += (*limit as f64 / slots).max(1.0) * (t - t0);
                        t0 = *t;
                    }
                    let ratio = waited / t0;
                    let name = format!("{slots} slots, a kind {times} × as dear from window {from}");
                    assert!(ratio <= 1.35, "{name}: latency {ratio:.2} × unloaded");
                    // Slow start doubles up to twice the slots (one window there says "loaded").
                    let most = tr.iter().map(|(_, l)| *l).max().unwrap_or(0);
                    assert!(most as f64 <= 2.0 * slots, "{name}: {most} in flight");
                    recovers(&name, sc, 0.0);
                }
            }
        }
    }

    /// A window of `n` operations of `kind` taking `us` µs each, in which the operations in
    /// flight went as far as `reach`.
    fn window(reach: Reach, kind: OpKind, n: u64, us: u64) -> Window {
        let mut w = Window { reach, ..Window::default() };
        for _ in 0..n {
            w.add(kind, Duration::from_micros(us));
        }
        w
    }

    /// A controller past its start at a limit of 40, whose baseline for `kind` is 1000 µs, and
    /// windows of 20 operations of `kind` taking the µs they are given, at the limit.
    fn steady(kind: OpKind) -> (Controller, impl Fn(u64) -> Window) {
        let mut c = Controller { limit: 40.0, phase: Phase::Steady, ..Controller::new(64) };
        c.base[kind.index()] = Some(1000.0);
        (c, move |us| window(Reach::Limit, kind, 20, us))
    }

    #[test]
    fn an_unsaturated_server_gets_every_thread_the_walk_uses() {
        let mut c = Controller::new(64);
        // A walk with only 3 operations to send at once: the limit goes no further than 4.
        for i in 0..40 {
            let reach = if c.limit() <= 3 { Reach::Limit } else { Reach::Below };
            c.update(&window(reach, OpKind::Lookup, c.window_size(), 500), Duration::from_millis(i * 10));
        }
        assert_eq!(c.limit(), 4);
        for i in 40..80 {
            c.update(&window(Reach::Limit, OpKind::Lookup, c.window_size(), 500), Duration::from_millis(i * 10));
        }
        assert_eq!(c.limit(), 64);
    }

    #[test]
    fn latency_rising_shrinks_the_limit_by_half_at_most() {
        let (mut c, window) = steady(OpKind::Change);
        c.update(&window(2500), Duration::from_millis(1));
        assert_eq!(c.limit(), 40, "one loaded window alone: held");
        c.update(&window(2500), Duration::from_millis(2));
        assert_eq!(c.limit(), 20, "ratio 2.5 twice: × 1.25/2.5");
        c.update(&window(1400), Duration::from_millis(3));
        assert_eq!(c.limit(), 20, "ratio 1.4: held");
        c.update(&window(30_000), Duration::from_millis(4));
        c.update(&window(30_000), Duration::from_millis(5));
        assert_eq!(c.limit(), 10, "by half at most");
    }

    #[test]
    fn a_ratio_the_walks_own_load_cannot_cause_is_measured_again_not_obeyed() {
        let (mut c, window) = steady(OpKind::Change);
        c.limit = 10.0;
        c.since_probe = PROBE_GAP;
        // 100 times the baseline with 10 in flight: no queue of 10 does that, the baseline is
        // too low (the service time stepped up). A probe at a quarter of the limit measures it.
        c.update(&window(100_000), Duration::from_millis(1));
        assert_eq!((c.limit(), c.base_us(OpKind::Change)), (3, None), "probing at a quarter");
        c.update(&window(100_000), Duration::from_millis(2));
        assert_eq!((c.limit(), c.base_us(OpKind::Change)), (10, Some(100_000.0)), "re-based, back");
        c.update(&window(100_000), Duration::from_millis(3));
        assert_eq!(c.limit(), 11, "ratio 1: growing");
    }

    #[test]
    fn a_window_at_one_in_flight_re_bases_and_the_limit_grows_again() {
        let (mut c, window) = steady(OpKind::Change);
        c.limit = 1.0;
        // At one in flight the window is unloaded: 100 ms is what a request costs now.
        c.update(&window(100_000), Duration::from_millis(20));
        assert_eq!((c.limit(), c.base_us(OpKind::Change)), (2, Some(100_000.0)), "re-based at 1, growing again");
        c.update(&window(100_000), Duration::from_millis(21));
        assert_eq!(c.limit(), 4, "as at the start");
    }

    #[test]
    fn an_operation_that_stalled_on_the_client_is_no_baseline() {
        let mut c = Controller::new(64);
        // One in flight: 15 changes take 2 ms, one took a second (its thread descheduled).
        let mut w = window(Reach::Limit, OpKind::Change, 15, 2000);
        w.add(OpKind::Change, Duration::from_secs(1));
        for _ in 0..PROBE_MIN {
            w.add(OpKind::Read, Duration::from_millis(2));
        }
        c.update(&w, Duration::from_millis(100));
        assert_eq!((c.base_us(OpKind::Change), c.base_us(OpKind::Read)), (Some(2000.0), Some(2000.0)));
        // Back at one: a kind with one operation in the window, which stalled, keeps its baseline.
        c.limit = 1.0;
        let mut w = window(Reach::Limit, OpKind::Change, 16, 2000);
        w.add(OpKind::Read, Duration::from_millis(900));
        c.update(&w, Duration::from_millis(200));
        assert_eq!(c.base_us(OpKind::Read), Some(2000.0));
    }

    #[test]
    fn a_kind_first_seen_at_a_high_limit_does_not_steer_before_a_probe_measures_it() {
        let (mut c, window) = steady(OpKind::Lookup);
        c.since_probe = PROBE_GAP;
        // Opens of directories appear at 40 in flight, each taking 4 ms (loaded): taken as their
        // baseline, the ratio would say "unloaded" and the limit would grow past the storage.
        let mut w = window(1000);
        for _ in 0..20 {
            w.add(OpKind::OpenDir, Duration::from_millis(4));
        }
        c.update(&w, Duration::from_millis(1));
        assert_eq!((c.limit(), c.base_us(OpKind::OpenDir)), (10, None), "probing at a quarter");
        let mut probe = window(1000);
        for _ in 0..PROBE_MIN {
            probe.add(OpKind::OpenDir, Duration::from_millis(1));
        }
        c.update(&probe, Duration::from_millis(2));
        assert_eq!((c.limit(), c.base_us(OpKind::OpenDir)), (40, Some(1000.0)));
        // Now 4 ms opens are a ratio of 2.5 (with the lookups at theirs): the limit shrinks.
        c.update(&w, Duration::from_millis(3));
        c.update(&w, Duration::from_millis(4));
        assert!(c.limit() < 40, "{}", c.limit());
    }

    #[test]
    fn a_lone_loaded_window_between_unloaded_ones_leaves_the_limit_as_it_is() {
        let (mut c, window) = steady(OpKind::Lookup);
        for i in 0..20 {
            // Every other window slow (a scheduler's delay on a busy client): never two in a row.
            c.update(&window(if i % 2 == 0 { 2500 } else { 1300 }), Duration::from_millis(i));
            assert_eq!(c.limit(), 40, "window {i}");
        }
        let mut start = Controller::new(64);
        for (i, us) in [1000, 1000, 1600, 1000].into_iter().enumerate() {
            start.update(&window(us), Duration::from_millis(i as u64));
        }
        assert_eq!((start.limit(), start.phase), (8, Phase::SlowStart), "one window past the exit: still doubling");
    }

    #[test]
    fn slow_start_takes_the_mean_of_its_windows_as_baseline_not_the_lowest() {
        // Unloaded windows a storage answers in 2.4, 1.6, 2.0 and 2.0 ms: the lowest, 1.6 ms,
        // is noise, and a later 2 ms would read as 1.25 times unloaded.
        let mut c = Controller::new(64);
        for (i, us) in [2400, 1600, 2000, 2000].into_iter().enumerate() {
            let w = window(Reach::Limit, OpKind::Change, c.window_size(), us);
            c.update(&w, Duration::from_millis(10 * i as u64));
        }
        assert_eq!(c.limit(), 16, "doubling all along");
        let base = c.base_us(OpKind::Change).unwrap_or(0.0);
        assert!((1900.0..2100.0).contains(&base), "baseline {base} µs");
    }

    #[test]
    fn how_many_operations_a_cache_on_the_way_answers_does_not_move_the_ratio() {
        // Changes the server answers in 2 ms, and some the client answers in 0.3 ms (too slow
        // to be a cache's at once, the kernel asking the FUSE daemon): half of them at first,
        // three in four later. The ratio is the server's, 1, both times.
        let mix = |fast: u64| {
            let mut w = window(Reach::Limit, OpKind::Change, 16 - fast, 2000);
            (0..fast).for_each(|_| w.add(OpKind::Change, Duration::from_micros(300)));
            w
        };
        let mut c = Controller::new(64);
        c.update(&mix(8), Duration::from_millis(10));
        let base = c.base_us(OpKind::Change).unwrap_or(0.0);
        assert!((1900.0..2100.0).contains(&base), "baseline {base} µs");
        let r = c.ratio(&mix(12)).unwrap_or(0.0);
        assert!((0.9..1.1).contains(&r), "ratio {r:.2}");
    }

    #[test]
    fn a_probe_measures_the_baseline_again_and_comes_back() {
        let (mut c, window) = steady(OpKind::Lookup);
        c.update(&window(1300), PROBE_EVERY);
        assert_eq!(c.limit(), 10, "a quarter of the limit while probing");
        // A probe that saw less lowers the baseline; one that saw more leaves it as it is (a
        // quarter of the limit may still be loaded) until the baseline expires.
        c.update(&window(800), PROBE_EVERY + Duration::from_millis(5));
        assert_eq!((c.limit(), c.base_us(OpKind::Lookup)), (40, Some(800.0)));
        let at = |s: u64| Duration::from_secs(s);
        c.update(&window(1000), at(7));
        assert_eq!(c.limit(), 10, "probing");
        c.update(&window(3000), at(7) + Duration::from_millis(5));
        assert_eq!((c.limit(), c.base_us(OpKind::Lookup)), (40, Some(800.0)));
        // The storage got slower for everyone: once expired, the probe's latency is the new one.
        c.update(&window(1000), at(14));
        c.update(&window(3000), at(14) + Duration::from_millis(5));
        assert_eq!((c.limit(), c.base_us(OpKind::Lookup)), (40, Some(3000.0)));
        c.update(&window(3300), at(14) + Duration::from_millis(10));
        assert_eq!(c.limit(), 45, "ratio 1.1 against the new baseline: it grows");
    }
}
