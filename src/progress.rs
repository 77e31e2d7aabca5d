//! Live counters of a pass (lock-free atomics shared by every walker thread) and the progress
//! they drive: a log line every interval, or a live bar when stderr is a terminal.

pub mod allocs;

use std::sync::OnceLock;
use std::sync::atomic::{AtomicI32, AtomicU64, Ordering::Relaxed};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use tracing::info;

use crate::escape::EscapedPath;
use crate::options::ProgressStyle as Style;
use crate::report::Counts;
use crate::spec::Ownership;
use crate::state::MarkerState;
use crate::sys::{self, Kind, Meta};
use crate::throttle::Policy;

/// The environment variable of the kill test hook (see [`arm_test_hook`]).
pub const KILL_AFTER_ENV: &str = "VOLPREP_TEST_KILL_AFTER";
/// The environment variable of the panic test hook (see [`arm_test_hook`]).
pub const PANIC_AFTER_ENV: &str = "VOLPREP_TEST_PANIC_AFTER";

/// What a test hook does when one volume's pass has counted `after` entries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hook {
    /// The process sends itself `signal` (SIGKILL, SIGTERM or SIGSTOP).
    Signal { after: u64, signal: i32 },
    /// The walker thread that counts the entry panics, as a bug would.
    Panic { after: u64 },
}

/// Whether this binary has the test hooks (`--features test-hooks`); see [`arm_test_hook`].
const HOOKS: bool = cfg!(feature = "test-hooks");
/// Entries after which the armed hook fires (u64::MAX: never). See [`arm_test_hook`].
static HOOK_AFTER: AtomicU64 = AtomicU64::new(u64::MAX);
/// The armed hook's signal, or [`PANIC`].
static HOOK_ACTION: AtomicI32 = AtomicI32::new(libc::SIGKILL);
/// The hook's action that stands for a panic rather than a signal.
const PANIC: i32 = 0;

/// TEST HOOKS, only in a binary built with `--features test-hooks` (what the tests run); the
/// shipped binary (the image, the release binaries, `cargo install`) has none: it never reads
/// the variables. Read once at the start of `apply`/`check`; at most one may be set.
/// `VOLPREP_TEST_KILL_AFTER=<entries>` (or `<entries>:kill`) makes the process SIGKILL itself
/// when one volume's pass has counted that many entries; `<entries>:term` sends SIGTERM instead,
/// which takes the graceful-stop path (checkpoint, report, exit 143); `<entries>:stop` sends
/// SIGSTOP, which holds the whole process there until a SIGCONT. Tests use it to interrupt (or
/// hold) a pass at an exact point rather than racing a progress line. `VOLPREP_TEST_PANIC_AFTER=<entries>`
/// makes the walker thread that counts that many entries panic, as a bug would: tests see that
/// volume end with a failed report and the others go on. When unset, each entry costs one
/// relaxed atomic load (none without the feature). Returns the hook armed, or an error text for
/// a value that does not parse or for both set.
pub fn arm_test_hook() -> Result<Option<Hook>, String> {
    if !HOOKS {
        return Ok(None);
    }
    let var = |name| std::env::var_os(name).map(|v| v.to_string_lossy().into_owned());
    let hook = parse_hook(var(KILL_AFTER_ENV).as_deref(), var(PANIC_AFTER_ENV).as_deref())?;
    if let Some(h) = hook {
        let (after, action) = match h {
            Hook::Signal { after, signal } => (after, signal),
            Hook::Panic { after } => (after, PANIC),
        };
        HOOK_ACTION.store(action, Relaxed);
        HOOK_AFTER.store(after, Relaxed);
    }
    Ok(hook)
}

/// The hook the two variables' values ask for (see [`arm_test_hook`]).
fn parse_hook(kill: Option<&str>, panic: Option<&str>) -> Result<Option<Hook>, String> {
    let entries = |v: &str| v.parse::<u64>().ok().filter(|&n| n > 0 && n < u64::MAX);
    match (kill, panic) {
        (None, None) => Ok(None),
        (Some(_), Some(_)) => Err(format!("{KILL_AFTER_ENV} and {PANIC_AFTER_ENV}: set one of them, not both")),
        (Some(v), None) => {
            let (n, sig) = v.split_once(':').unwrap_or((v, "kill"));
            let signal = match sig {
                "kill" => Some(libc::SIGKILL),
                "term" => Some(libc::SIGTERM),
                "stop" => Some(libc::SIGSTOP),
                _ => None,
            };
            match (entries(n), signal) {
                (Some(after), Some(signal)) => Ok(Some(Hook::Signal { after, signal })),
                _ => Err(format!("{KILL_AFTER_ENV}={v}: expected <entries>[:kill|:term|:stop]")),
            }
        }
        (None, Some(v)) => match entries(v) {
            Some(after) => Ok(Some(Hook::Panic { after })),
            None => Err(format!("{PANIC_AFTER_ENV}={v}: expected <entries>")),
        },
    }
}

/// What the armed hook does once its point is reached (`n` entries): a signal, or a panic.
fn fire(n: u64) {
    match HOOK_ACTION.load(Relaxed) {
        PANIC => panic!("test hook {PANIC_AFTER_ENV}: a panic after {n} entries"),
        sig => sys::signal_self(sig),
    }
}

/// One count, shared by every walker thread (relaxed atomic: it only grows).
#[derive(Debug, Default)]
pub struct Counter(AtomicU64);

impl Counter {
    /// Adds `n`; returns the new count.
    pub fn add(&self, n: u64) -> u64 {
        self.0.fetch_add(n, Relaxed).wrapping_add(n)
    }

    /// Adds one; returns the new count.
    pub fn inc(&self) -> u64 {
        self.add(1)
    }

    pub fn get(&self) -> u64 {
        self.0.load(Relaxed)
    }
}

/// Counts for one volume (see [`Counts`] for what each means). Every field only grows; read
/// them at any time.
#[derive(Debug, Default)]
pub struct Counters {
    pub entries: Counter,
    pub dirs: Counter,
    pub files: Counter,
    pub symlinks: Counter,
    pub others: Counter,
    pub changed_owner: Counter,
    pub changed_mode: Counter,
    pub errors: Counter,
    pub dirs_read: Counter,
    pub skipped_subtrees: Counter,
    pub verified_dirs: Counter,
    pub hardlinked: Counter,
    pub foreign_owned: Counter,
    pub foreign_unread: Counter,
    pub tightened: Counter,
}

impl Counters {
    /// Counts one entry of `meta`'s kind (and a hard-linked one).
    pub fn seen_meta(&self, meta: &Meta) {
        self.seen(meta.kind());
        if meta.kind() != Kind::Dir && meta.nlink > 1 {
            self.hardlinked.inc();
        }
    }

    pub fn seen(&self, kind: Kind) {
        let n = self.entries.inc();
        if HOOKS && n == HOOK_AFTER.load(Relaxed) {
            fire(n);
        }
        let by_kind = match kind {
            Kind::Dir => &self.dirs,
            Kind::File => &self.files,
            Kind::Symlink => &self.symlinks,
            _ => &self.others,
        };
        by_kind.inc();
    }

    /// The counts now, as the report has them.
    pub fn snapshot(&self) -> Counts {
        Counts {
            entries: self.entries.get(),
            dirs: self.dirs.get(),
            files: self.files.get(),
            symlinks: self.symlinks.get(),
            others: self.others.get(),
            changed_owner: self.changed_owner.get(),
            changed_mode: self.changed_mode.get(),
            errors: self.errors.get(),
            foreign_owned: self.foreign_owned.get(),
            foreign_unread_dirs: self.foreign_unread.get(),
            dirs_read: self.dirs_read.get(),
            skipped_subtrees: self.skipped_subtrees.get(),
            verified_dirs: self.verified_dirs.get(),
            hardlinked: self.hardlinked.get(),
            tightened: self.tightened.get(),
        }
    }
}

/// Runs `work` while a side thread shows the progress of `counters`; returns `work`'s result.
/// The side thread only reads the atomics: it costs the walk nothing.
pub fn watch<T>(counters: &Counters, shown: &Shown<'_>, style: Style, work: impl FnOnce() -> T) -> T {
    if style == Style::Off {
        return work();
    }
    std::thread::scope(|s| {
        let (stop, stopped) = mpsc::channel::<()>();
        s.spawn(move || show(counters, shown, style, &stopped));
        let out = work();
        drop(stop);
        out
    })
}

/// What a progress line names besides the counts.
pub struct Shown<'a> {
    /// The volume's path, escaped.
    pub path: &'a EscapedPath,
    /// The entries expected, when known.
    pub estimate: Option<u64>,
    /// What `changed_owner` counts changes of.
    pub ownership: Ownership,
}

/// Shows the progress of `counters` until `stopped` fires: a bar, or a log line every interval.
fn show(counters: &Counters, shown: &Shown<'_>, style: Style, stopped: &mpsc::Receiver<()>) {
    let Shown { path, estimate, ownership } = *shown;
    let start = Instant::now();
    let bar = (style == Style::Bar).then(|| new_bar(estimate));
    let tick = match style {
        Style::Lines(d) => d,
        _ => Duration::from_millis(200),
    };
    while let Err(mpsc::RecvTimeoutError::Timeout) = stopped.recv_timeout(tick) {
        // One read of the counters: the line and its fields show the same figures.
        let snap = Snapshot::take(counters, start.elapsed(), estimate, ownership);
        let line = snap.line();
        match &bar {
            Some(b) => {
                b.set_position(snap.entries);
                b.set_message(line);
            }
            None => {
                let percent = snap.percent();
                let group_only = ownership == Ownership::Group;
                let changed_group = group_only.then_some(snap.changed_owner);
                let changed_owner = (!group_only).then_some(snap.changed_owner);
                info!(
                    path = path.as_str(),
                    entries = snap.entries,
                    changed_group,
                    changed_owner,
                    changed_mode = snap.changed_mode,
                    errors = snap.errors,
                    entries_per_s = snap.rate().round() as u64,
                    percent = percent.map(|p| p.round() as u64),
                    eta_s = percent.map(|_| snap.eta().map_or(0.0, |e| (e * 10.0).round() / 10.0)),
                    "progress {path}: {line}"
                )
            }
        }
    }
    if let Some(b) = bar {
        b.finish_and_clear();
        bars().remove(&b);
    }
}

/// The one set of bars of this process: volumes walked at once each get a line of it.
fn bars() -> &'static indicatif::MultiProgress {
    static BARS: OnceLock<indicatif::MultiProgress> = OnceLock::new();
    BARS.get_or_init(|| indicatif::MultiProgress::with_draw_target(indicatif::ProgressDrawTarget::stderr()))
}

fn new_bar(estimate: Option<u64>) -> indicatif::ProgressBar {
    let bar = match estimate {
        Some(n) => indicatif::ProgressBar::new(n),
        None => indicatif::ProgressBar::new_spinner(),
    };
    let template = if estimate.is_some() { "{bar:30} {percent:>3}% {msg}" } else { "{spinner} {msg}" };
    if let Ok(style) = indicatif::ProgressStyle::with_template(template) {
        bar.set_style(style);
    }
    bars().add(bar)
}

/// The line a volume's run logs once it has decided (its fields for JSON logs).
pub struct DecisionLine<'a> {
    /// The volume's path, escaped.
    pub shown: &'a EscapedPath,
    pub fs: &'a str,
    pub spec: &'a str,
    pub digest: &'a str,
    pub threads: usize,
    /// The load on the storage (`--load`, `--max-ops`).
    pub load: &'a Policy,
    pub estimate: Option<u64>,
    pub marker: MarkerState,
    /// `skip`, `check`, `resume`, `walk`.
    pub decision: &'a str,
    pub reason: &'a str,
}

impl DecisionLine<'_> {
    /// Logs it: the estimate is a number when known (JSON logs keep its type), else the word
    /// "unknown".
    pub fn log(&self) {
        let d = self;
        macro_rules! line {
            ($estimate:expr) => {
                info!(
                    fs = d.fs,
                    spec = d.spec,
                    digest = d.digest,
                    threads = d.threads,
                    load = d.load.concurrency.name(),
                    max_ops = d.load.max_ops,
                    estimated_entries = $estimate,
                    marker = d.marker.name(),
                    decision = d.decision,
                    reason = d.reason,
                    "{} {}",
                    d.decision,
                    d.shown
                )
            };
        }
        match d.estimate {
            Some(n) => line!(n),
            None => line!("unknown"),
        }
    }
}

/// The figures of one progress line.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Snapshot {
    pub entries: u64,
    pub changed_owner: u64,
    pub changed_mode: u64,
    pub errors: u64,
    pub elapsed: Duration,
    pub estimate: Option<u64>,
    /// What `changed_owner` counts changes of.
    pub ownership: Ownership,
}

impl Snapshot {
    fn take(c: &Counters, elapsed: Duration, estimate: Option<u64>, ownership: Ownership) -> Snapshot {
        Snapshot {
            entries: c.entries.get(),
            changed_owner: c.changed_owner.get(),
            changed_mode: c.changed_mode.get(),
            errors: c.errors.get(),
            elapsed,
            estimate,
            ownership,
        }
    }

    /// Entries per second since the walk began.
    pub fn rate(&self) -> f64 {
        self.entries as f64 / self.elapsed.as_secs_f64().max(1e-3)
    }

    /// Share of the estimate seen so far (capped at 100), when there is an estimate.
    pub fn percent(&self) -> Option<f64> {
        self.estimate.filter(|&t| t > 0).map(|t| (self.entries as f64 * 100.0 / t as f64).min(100.0))
    }

    /// `12000 entries, changed group 9000 mode 100, 0 errors, 4000/s, 40%, ETA 4.5s`.
    pub fn line(&self) -> String {
        let rate = self.rate();
        let mut s = format!(
            "{} entries, changed {} {} mode {}, {} errors, {:.0}/s",
            self.entries, self.ownership, self.changed_owner, self.changed_mode, self.errors, rate
        );
        if let Some(pct) = self.percent() {
            s += &format!(", {pct:.0}%");
            if let Some(eta) = self.eta() {
                s += &format!(", ETA {}", human_secs(eta));
            }
        }
        s
    }

    /// Seconds until the estimate is reached at the rate so far; none without an estimate, before
    /// the first entry, or once the count has reached the estimate.
    pub fn eta(&self) -> Option<f64> {
        let total = self.estimate?;
        let rate = self.rate();
        (rate > 0.0 && self.entries < total).then(|| (total - self.entries) as f64 / rate)
    }
}

/// `0.4s`, `12s`, `3m05s`, `2h07m`: precise when short, readable when long.
fn human_secs(secs: f64) -> String {
    if secs < 9.95 {
        format!("{secs:.1}s")
    } else if secs < 59.5 {
        format!("{secs:.0}s")
    } else {
        let s = secs.round() as u64;
        if s < 3600 { format!("{}m{:02}s", s / 60, s % 60) } else { format!("{}h{:02}m", s / 3600, s % 3600 / 60) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_has_rate_percent_and_eta() {
        let s = Snapshot {
            entries: 1000,
            changed_owner: 10,
            changed_mode: 5,
            errors: 1,
            elapsed: Duration::from_secs(2),
            estimate: Some(4000),
            ownership: Ownership::Group,
        };
        assert_eq!(s.line(), "1000 entries, changed group 10 mode 5, 1 errors, 500/s, 25%, ETA 6.0s");
        assert_eq!((s.rate(), s.percent()), (500.0, Some(25.0)));
        let s = Snapshot { estimate: None, ..s };
        let s = Snapshot { ownership: Ownership::OwnerAndGroup, ..s };
        assert_eq!(s.line(), "1000 entries, changed owner and group 10 mode 5, 1 errors, 500/s");
        assert_eq!(s.percent(), None);
        // More entries than estimated (the estimate counts inodes, not names): capped, no ETA.
        let s = Snapshot { entries: 5000, estimate: Some(4000), ..s };
        assert_eq!(s.line(), "5000 entries, changed owner and group 10 mode 5, 1 errors, 2500/s, 100%");
        assert_eq!(s.eta(), None);
    }

    #[test]
    fn test_hooks_parse_and_only_one_may_be_set() {
        let kill = |v| parse_hook(Some(v), None);
        assert_eq!(kill("12"), Ok(Some(Hook::Signal { after: 12, signal: libc::SIGKILL })));
        assert_eq!(kill("12:kill"), Ok(Some(Hook::Signal { after: 12, signal: libc::SIGKILL })));
        assert_eq!(kill("7:term"), Ok(Some(Hook::Signal { after: 7, signal: libc::SIGTERM })));
        assert_eq!(kill("9:stop"), Ok(Some(Hook::Signal { after: 9, signal: libc::SIGSTOP })));
        for bad in ["", "0", "x", "12:int", "12:", ":term", "-1", "18446744073709551615"] {
            assert!(kill(bad).unwrap_err().starts_with(&format!("{KILL_AFTER_ENV}={bad}: expected")), "{bad}");
            assert!(parse_hook(None, Some(bad)).is_err(), "{bad}");
        }
        assert_eq!(parse_hook(None, Some("40")), Ok(Some(Hook::Panic { after: 40 })));
        assert_eq!(parse_hook(None, None), Ok(None));
        let both = parse_hook(Some("12"), Some("40")).unwrap_err();
        assert!(both.contains("not both"), "{both}");
    }

    #[test]
    fn eta_is_precise_when_short_and_readable_when_long() {
        let got: Vec<String> = [0.04, 0.44, 9.94, 9.96, 42.4, 59.6, 185.0, 3599.4, 3600.0, 7650.0]
            .iter()
            .map(|&s| human_secs(s))
            .collect();
        assert_eq!(got, ["0.0s", "0.4s", "9.9s", "10s", "42s", "1m00s", "3m05s", "59m59s", "1h00m", "2h07m"]);
    }
}
