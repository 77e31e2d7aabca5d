//! Syscalls per entry (`--syscalls`): the mix that a profile of a pass starts from, counted
//! from a full `strace -f` trace. Counts include process start-up (a few hundred calls,
//! constant).
//!
//! Not `strace -c`: up to strace 6.5 its summary silently leaves out the syscalls it has no
//! name for, among them `fchmodat2` (Linux 6.6), which volprep's every chmod is.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Stdio};

use serde_json::{Value, json};

/// Names of syscalls that older strace shows as `syscall_0xNNN` (x86_64 numbers).
const UNNAMED: [(&str, &str); 1] = [("syscall_0x1c4", "fchmodat2")];

/// Counts the calls in an `strace -f` trace (one call per line; a call interrupted by another
/// thread's shows as `<unfinished ...>`, then `<... name resumed>`, and is counted once):
/// (syscall, calls), most called first.
pub fn parse(text: &str) -> Vec<(String, u64)> {
    let mut calls: BTreeMap<String, u64> = BTreeMap::new();
    for line in text.lines() {
        // "PID name(args) = ret", "PID name(args <unfinished ...>", "PID <... name resumed>…"
        let rest = line.split_once(' ').map_or(line, |(_, r)| r).trim_start();
        let Some((name, _)) = rest.split_once('(') else { continue };
        if name.is_empty() || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
            continue;
        }
        let name = UNNAMED.iter().find(|(raw, _)| *raw == name).map_or(name, |(_, known)| known);
        *calls.entry(name.to_string()).or_default() += 1;
    }
    let mut v: Vec<(String, u64)> = calls.into_iter().collect();
    v.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    v
}

/// Runs `cmd` under `strace -f -qq -e raw=all -o OUT` (raw: short lines); returns the parsed
/// counts.
pub fn count(cmd: &Command, out: &Path) -> std::io::Result<Vec<(String, u64)>> {
    let mut s = Command::new("strace");
    s.args(["-f", "-qq", "-e", "raw=all", "-o"]).arg(out).arg("--").arg(cmd.get_program());
    s.args(cmd.get_args());
    for (k, v) in cmd.get_envs() {
        match v {
            Some(v) => s.env(k, v),
            None => s.env_remove(k),
        };
    }
    s.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null());
    s.status()?;
    let counts = parse(&std::fs::read_to_string(out)?);
    // The trace is big (one line per call); the counts are what is kept.
    let _ = std::fs::remove_file(out);
    Ok(counts)
}

/// One method's line of the syscall table, and its JSON.
pub fn summarize(method: &str, counts: &[(String, u64)], entries: u64) -> (String, Value) {
    let total: u64 = counts.iter().map(|c| c.1).sum();
    let per = |n: u64| n as f64 / entries.max(1) as f64;
    let top: Vec<String> = counts.iter().take(6).map(|(n, c)| format!("{n} {:.2}", per(*c))).collect();
    let line = format!("| {method} | {total} | {:.2} | {} |", per(total), top.join(", "));
    let j = json!({
        "method": method,
        "total": total,
        "per_entry": per(total),
        "calls": counts.iter().map(|(n, c)| json!({"syscall": n, "calls": c})).collect::<Vec<_>>(),
    });
    (line, j)
}
