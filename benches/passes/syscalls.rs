//! Syscalls per entry, from `strace -f -c` (`--syscalls`): the mix that a profile of a pass
//! starts from. Counts include process start-up (a few hundred calls, constant).

use std::path::Path;
use std::process::{Command, Stdio};

use serde_json::{Value, json};

/// Parses `strace -c` output: (syscall, calls), most called first.
pub fn parse(text: &str) -> Vec<(String, u64)> {
    let mut v: Vec<(String, u64)> = text
        .lines()
        .filter_map(|l| {
            let t: Vec<&str> = l.split_whitespace().collect();
            // "% time  seconds  usecs/call  calls  [errors]  syscall"
            if t.len() < 5 || t[0].parse::<f64>().is_err() || *t.last()? == "total" {
                return None;
            }
            Some((t.last()?.to_string(), t[3].parse().ok()?))
        })
        .collect();
    v.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    v
}

/// Runs `cmd` under `strace -f -c -o OUT`; returns the parsed counts.
pub fn count(cmd: &Command, out: &Path) -> std::io::Result<Vec<(String, u64)>> {
    let mut s = Command::new("strace");
    s.args(["-f", "-c", "-o"]).arg(out).arg("--").arg(cmd.get_program());
    s.args(cmd.get_args());
    for (k, v) in cmd.get_envs() {
        match v {
            Some(v) => s.env(k, v),
            None => s.env_remove(k),
        };
    }
    s.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null());
    s.status()?;
    Ok(parse(&std::fs::read_to_string(out)?))
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
