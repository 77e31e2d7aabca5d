//! What `inject` says of a run: a log line per object, the summary line, `--strict`'s reasons.

use super::object::app_modes_text;
use super::{APP_MODES_ANNOTATION, Event, Outcome, REFUSED_ANNOTATION, Refusal};

/// How many objects had each outcome.
#[derive(Debug, Default)]
pub(super) struct Tally {
    injected: usize,
    /// Injected workloads running an app of the table under the kubelet's rule.
    apps: usize,
    pub(super) refused: usize,
    unsupported: usize,
    skipped: usize,
}

impl Tally {
    /// One line for the whole run: at warning level when a workload was refused or not read.
    pub(super) fn summary(&self) {
        let mut line = format!(
            "volprep inject: {} injected, {} refused (left to the kubelet, annotated {REFUSED_ANNOTATION}), {} not read (merge keys), {} without anything to prepare",
            self.injected, self.refused, self.unsupported, self.skipped
        );
        if self.apps > 0 {
            line += &format!(
                "; {} injected with the kubelet's rule run an app that insists on private modes (annotated {APP_MODES_ANNOTATION}): give them app-safe",
                self.apps
            );
        }
        if self.refused + self.unsupported + self.apps > 0 {
            tracing::warn!("{line}");
        } else {
            tracing::info!("{line}");
        }
    }
}

/// A line per reason of each refused object (`FILE:LINE: Kind/name: refused: why`).
pub(super) fn refusals(events: &[Event]) -> Vec<String> {
    let mut out = Vec::new();
    for e in events {
        if let Outcome::Refused(why) = &e.outcome {
            out.extend(why.iter().map(|w| format!("{}: {}: refused: {w}", e.at, e.what)));
        }
    }
    out
}

/// One log line per injected, refused or unsupported object; the tally.
pub(super) fn log_events(events: &[Event], refusal: Refusal) -> Tally {
    let mut t = Tally::default();
    for e in events {
        match &e.outcome {
            Outcome::Injected => {
                t.injected += 1;
                tracing::info!("{}: {}: volprep injected", e.at, e.what);
                if !e.apps.is_empty() {
                    t.apps += 1;
                    tracing::warn!("{}: {}: runs {}", e.at, e.what, app_modes_text(&e.apps));
                }
            }
            Outcome::Skipped(why) => {
                t.skipped += 1;
                tracing::debug!("{}: {}: left alone: {why}", e.at, e.what);
            }
            Outcome::Unsupported(why) => {
                t.unsupported += 1;
                tracing::info!("{}: {}: left alone: {why}", e.at, e.what);
            }
            Outcome::Refused(why) => {
                t.refused += 1;
                for w in why {
                    match refusal {
                        Refusal::Error => tracing::error!("{}: {}: refused: {w}", e.at, e.what),
                        Refusal::Warn => tracing::warn!("{}: {}: left unchanged: {w}", e.at, e.what),
                    }
                }
            }
        }
    }
    t
}
