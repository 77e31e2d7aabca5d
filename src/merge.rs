//! `volprep report merge`: reads reports (e.g. one per shard) and merges the volumes that share a
//! path; prints summary lines or the merged JSON report, and exits with what the merged outcome
//! stands for.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::error::{Error, ExitCode};
use crate::options::Tolerance;
use crate::report::{self, Report, Timing, VolumeReport};

/// What `report merge` was asked.
#[derive(Debug, Clone)]
pub struct Options {
    /// Print the merged report as JSON instead of summary lines.
    pub json: bool,
    /// Reports written with `--report`.
    pub files: Vec<PathBuf>,
}

pub fn run(opts: &Options) -> Result<ExitCode, Error> {
    let mut merged: Vec<(VolumeReport, Vec<String>)> = Vec::new();
    for f in &opts.files {
        let text = std::fs::read(f).map_err(|e| Error::ReportUnreadable { path: f.clone(), why: e.to_string() })?;
        let report: Report =
            serde_json::from_slice(&text).map_err(|e| Error::NotAReport { path: f.clone(), why: e.to_string() })?;
        for v in report.volumes {
            let label = v.shard.clone().unwrap_or_else(|| f.display().to_string());
            match merged.iter_mut().find(|(m, _)| m.path == v.path) {
                Some((m, parts)) => {
                    m.merge(v);
                    parts.push(label);
                }
                None => merged.push((v, vec![label])),
            }
        }
    }
    let mut codes = Vec::new();
    let mut volumes = Vec::new();
    for (mut v, parts) in merged {
        v.shard = Some(format!("merged from {}: {}", parts.len(), parts.join(", ")));
        v.timing = Timing::of(Duration::from_millis(v.timing.elapsed_ms), v.counts.entries);
        codes.push(v.exit_code(Tolerance::NONE));
        if !opts.json {
            let line = format!("{} [{}, marker {}]\n", v.summary(), v.shard.as_deref().unwrap_or(""), v.marker_after);
            report::print(line.as_bytes())?;
        }
        volumes.push(v);
    }
    if opts.json {
        report::write(&Report::new(volumes), Path::new("-"))?;
    }
    Ok(ExitCode::merge(codes))
}
