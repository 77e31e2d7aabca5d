//! `volprep status`: prints each volume's marker and checkpoint, changing nothing.

use serde_json::json;

use std::os::fd::BorrowedFd;
use std::path::PathBuf;

use crate::error::{Error, ExitCode, Op};
use crate::escape::EscapedPath;
use crate::frontier::Frontier;
use crate::marker::{self, Checkpoint, Found};
use crate::report;
use crate::sys;

/// What `status` was asked.
#[derive(Debug, Clone)]
pub struct Options {
    /// Print JSON instead of text.
    pub json: bool,
    /// Volume roots.
    pub paths: Vec<PathBuf>,
}

pub fn run(args: &Options) -> Result<ExitCode, Error> {
    let mut out = Vec::new();
    let mut text = String::new();
    for path in &args.paths {
        let root = sys::open_root(path).map_err(|e| Error::sys(path, Op::Open, e))?;
        let found = marker::read(sys::fd(&root));
        let checkpoints = checkpoints(sys::fd(&root), &found);
        let shown = EscapedPath::new(path);
        if args.json {
            out.push(json_of(&shown, &found, &checkpoints));
        } else {
            text += &line_of(&shown, &found, &checkpoints);
            text.push('\n');
        }
    }
    if args.json {
        text = serde_json::to_string_pretty(&out).expect("status serializes") + "\n";
    }
    // `volprep status --json | grep -q done`: a reader that stops early is no error.
    report::print(text.as_bytes())?;
    Ok(ExitCode::Success)
}

/// The checkpoints on the root: the unsharded pass's (`None`), or each shard's.
fn checkpoints(root: BorrowedFd<'_>, found: &Found) -> Vec<(Option<u32>, Checkpoint)> {
    let shards = match found {
        Found::Marker(m) => m.shards.as_ref().map(|s| s.n),
        _ => None,
    };
    match shards {
        None => vec![None],
        Some(n) => marker::shard_indices(n).map(Some).collect(),
    }
    .into_iter()
    .filter_map(|i| marker::read_checkpoint(root, &marker::checkpoint_xattr(i)).map(|c| (i, c)))
    .collect()
}

/// One volume's state as JSON.
/// The marker as JSON, with the done shards of a sharded one listed (`shards.done`: the record
/// keeps one digit per shard).
fn marker_json(m: &marker::Marker) -> Option<serde_json::Value> {
    let mut v = serde_json::to_value(m).ok()?;
    if let (Some(sh), Some(obj)) = (&m.shards, v.get_mut("shards").and_then(|s| s.as_object_mut())) {
        obj.insert("done".into(), json!(sh.done()));
    }
    Some(v)
}

fn json_of(shown: &EscapedPath, found: &Found, checkpoints: &[(Option<u32>, Checkpoint)]) -> serde_json::Value {
    let checkpoint = checkpoints.iter().find(|(i, _)| i.is_none()).map(|(_, c)| c);
    json!({
        "path": shown,
        "state": found.state().name(),
        "marker": match found { Found::Marker(m) => marker_json(m), _ => None },
        "checkpoint": checkpoint.map(|c| summary(c, None)),
        "shard_checkpoints": checkpoints.iter().filter(|(i, _)| i.is_some()).map(|(i, c)| summary(c, *i)).collect::<Vec<_>>(),
    })
}

/// One volume's state in a line. Everything but the figures comes from the root, which the app
/// may write: escaped.
fn line_of(shown: &EscapedPath, found: &Found, checkpoints: &[(Option<u32>, Checkpoint)]) -> String {
    let m = match found {
        Found::Marker(m) => m,
        Found::Absent => return format!("{shown}: no marker (never prepared by volprep)"),
        Found::Unsupported => return format!("{shown}: no marker possible (the filesystem has no user xattrs)"),
        // Escaped where it was made (see `Found::Unreadable`).
        Found::Unreadable(e) => return format!("{shown}: {e}"),
    };
    let when = m.finished.unwrap_or(m.started);
    let now = marker::now();
    let age = if when > now {
        format!("{} in the future", marker::human_age(when.saturating_sub(now)))
    } else {
        format!("{} ago", marker::human_age(now.saturating_sub(when)))
    };
    let mut s =
        format!("{shown}: {} for {} (digest {}), run {}, {age}", found.state().name(), m.spec, m.digest, m.run,);
    if let Some(n) = m.entries {
        s += &format!(", {n} entries");
    }
    if let Some(n) = m.left {
        s += &format!(", finished unprivileged: {n} entries of other users left for a privileged run");
    }
    if let Some(sh) = &m.shards {
        let running: Vec<String> = sh.running.iter().map(|h| format!("{} (run {})", h.shard, h.run)).collect();
        s += &format!(", shards of {}: done {:?}, running [{}]", sh.n, sh.done(), running.join(", "));
    }
    for (i, c) in checkpoints {
        let f = Frontier::decode(c.records());
        let whose = i.map_or_else(String::new, |i| format!(" of shard {i}"));
        s += &format!(", checkpoint{whose}: {} directory records covering {} finished entries", f.len(), f.covered());
        if !c.pending.is_empty() {
            s += &format!(", {} special-bit record(s)", c.pending.len());
        }
    }
    s
}

/// A checkpoint in figures: its run (escaped), directory records, entries they cover, and
/// special-bit records.
fn summary(c: &Checkpoint, shard: Option<u32>) -> serde_json::Value {
    let f = Frontier::decode(c.records());
    let mut v =
        json!({ "run": c.run.to_string(), "records": f.len(), "covered": f.covered(), "pending": c.pending.len() });
    if let Some(i) = shard {
        v["shard"] = json!(i);
    }
    v
}
