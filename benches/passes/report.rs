//! Figures: one record per timed run, grouped into table rows with ratios computed from the
//! same run, the markdown table, the targets check, and the JSON file.

use std::collections::BTreeMap;
use std::fmt::Write;

use serde_json::{Value, json};

use crate::child::Measured;
use crate::methods::label;

/// One timed run.
#[derive(Debug, Clone)]
pub struct Run {
    pub storage: String,
    pub method: &'static str,
    pub threads: Option<usize>,
    pub temp: &'static str,
    pub rep: usize,
    pub m: Measured,
    pub sync_s: f64,
    /// Entries the method reported reading (volprep's report; the kubelet's count).
    pub entries_read: Option<u64>,
    /// volprep's `action`.
    pub action: Option<String>,
    /// Slow storage: delayed requests the server answered during the run.
    pub requests: Option<u64>,
    /// Slow storage: the server's counts by request kind.
    pub request_mix: Option<Value>,
    pub ok: bool,
    pub note: String,
}

/// A table row: the runs of one (storage, method, threads, temperature).
#[derive(Debug, Clone)]
pub struct Row {
    pub storage: String,
    pub method: &'static str,
    pub threads: Option<usize>,
    pub temp: &'static str,
    pub min: f64,
    pub median: f64,
    pub max: f64,
    pub user: f64,
    pub sys: f64,
    pub rss_mib: f64,
    pub sync: f64,
    pub entries_per_s: f64,
    pub entries_read: Option<u64>,
    /// Slow storage: median delayed requests per entry.
    pub requests_per_entry: Option<f64>,
    pub failed: bool,
    pub na: Option<String>,
    pub notes: Vec<String>,
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n == 0 {
        f64::NAN
    } else if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// Groups runs into rows, keeping first-seen order. `entries` is the tree size per storage.
pub fn rows(runs: &[Run], entries: &BTreeMap<String, u64>, na: &BTreeMap<&str, String>) -> Vec<Row> {
    let mut order: Vec<(String, &'static str, Option<usize>, &'static str)> = Vec::new();
    for r in runs {
        let k = (r.storage.clone(), r.method, r.threads, r.temp);
        if !order.contains(&k) {
            order.push(k);
        }
    }
    order
        .into_iter()
        .map(|(storage, method, threads, temp)| {
            let rs: Vec<&Run> = runs
                .iter()
                .filter(|r| r.storage == storage && r.method == method && r.threads == threads && r.temp == temp)
                .collect();
            // Figures of the runs that went right; of all runs when none did (marked FAILED).
            let mut good: Vec<&&Run> = rs.iter().filter(|r| r.ok).collect();
            let failed = good.len() < rs.len();
            if good.is_empty() {
                good = rs.iter().collect();
            }
            let pick = |f: &dyn Fn(&Run) -> f64| median(&mut good.iter().map(|r| f(r)).collect::<Vec<_>>());
            let walls: Vec<f64> = good.iter().map(|r| r.m.wall_s).collect();
            let med = pick(&|r| r.m.wall_s);
            let mut notes: Vec<String> = rs.iter().map(|r| r.note.clone()).filter(|n| !n.is_empty()).collect();
            notes.sort();
            notes.dedup();
            Row {
                entries_per_s: entries.get(&storage).copied().unwrap_or(0) as f64 / med,
                min: walls.iter().copied().fold(f64::INFINITY, f64::min),
                max: walls.iter().copied().fold(f64::NEG_INFINITY, f64::max),
                median: med,
                user: pick(&|r| r.m.user_s),
                sys: pick(&|r| r.m.sys_s),
                rss_mib: good.iter().map(|r| r.m.maxrss_kib).max().unwrap_or(0) as f64 / 1024.0,
                sync: pick(&|r| r.sync_s),
                entries_read: good.iter().filter_map(|r| r.entries_read).max(),
                requests_per_entry: {
                    let mut q: Vec<f64> = good.iter().filter_map(|r| r.requests).map(|q| q as f64).collect();
                    let n = entries.get(&storage).copied().unwrap_or(1).max(1) as f64;
                    (!q.is_empty()).then(|| median(&mut q) / n)
                },
                failed,
                na: na.get(method).cloned(),
                notes,
                storage,
                method,
                threads,
                temp,
            }
        })
        .collect()
}

/// The median of the row for (storage, method, temp), the best over thread counts.
pub fn best(rows: &[Row], storage: &str, method: &str, temp: &str) -> Option<(f64, Option<usize>)> {
    rows.iter()
        .filter(|r| r.storage == storage && r.method == method && r.temp == temp && r.na.is_none() && !r.failed)
        .map(|r| (r.median, r.threads))
        .min_by(|a, b| a.0.total_cmp(&b.0))
}

fn fmt_s(x: f64) -> String {
    if !x.is_finite() {
        "-".into()
    } else if x < 0.01 {
        format!("{:.4}", x)
    } else if x < 10.0 {
        format!("{:.3}", x)
    } else {
        format!("{:.1}", x)
    }
}

/// The markdown table of one storage.
pub fn table(rows: &[Row], storage: &str) -> String {
    let mut s = String::new();
    s.push_str("| method | threads | cache | min s | median s | max s | entries/s | user s | sys s | RSS MiB | sync s | kubelet ÷ this | this ÷ floor | notes |\n");
    s.push_str("|---|--:|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|---|\n");
    for r in rows.iter().filter(|r| r.storage == storage) {
        let kubelet = best(rows, storage, "kubelet", r.temp).map(|x| x.0);
        let floor = best(rows, storage, "floor", r.temp).map(|x| x.0);
        let threads = r.threads.map_or("1".into(), |t| t.to_string());
        let mut notes = r.notes.clone();
        if let Some(q) = r.requests_per_entry {
            notes.insert(0, format!("{q:.2} delayed requests/entry"));
        }
        if r.failed {
            notes.insert(0, "FAILED".into());
        }
        if let Some(na) = &r.na {
            let _ = writeln!(
                s,
                "| {} | {threads} | {} | n/a | n/a | n/a | n/a | | | | | | | {na} |",
                label(r.method),
                r.temp
            );
            continue;
        }
        let ratio = |x: Option<f64>| x.filter(|x| x.is_finite() && *x > 0.0);
        let _ = writeln!(
            s,
            "| {} | {threads} | {} | {} | {} | {} | {:.0} | {} | {} | {:.1} | {} | {} | {} | {} |",
            label(r.method),
            r.temp,
            fmt_s(r.min),
            fmt_s(r.median),
            fmt_s(r.max),
            r.entries_per_s,
            fmt_s(r.user),
            fmt_s(r.sys),
            r.rss_mib,
            fmt_s(r.sync),
            ratio(kubelet).map_or("-".into(), |k| format!("{:.2}×", k / r.median)),
            ratio(floor).map_or("-".into(), |f| format!("{:.2}×", r.median / f)),
            notes.join("; ")
        );
    }
    s
}

/// The targets that one run can judge, each "met"/"missed" with its figures.
pub fn targets(rows: &[Row], local: &str, slow: Option<&str>, na: &BTreeMap<&str, String>) -> Vec<String> {
    let mut out = Vec::new();
    let verdict = |ok: bool| if ok { "met" } else { "MISSED" };
    let med = |st: &str, m: &str, t: &str| best(rows, st, m, t);
    for temp in ["cold", "warm"] {
        if let (Some((v, vt)), Some((k, _))) = (med(local, "full", temp), med(local, "kubelet", temp)) {
            let t = vt.unwrap_or(1);
            out.push(format!(
                "full pass ({temp}, {local}): volprep {:.3} s (best, {t} threads) vs kubelet {:.3} s = {:.2}× faster (target ≥ 3×): {}",
                v, k, k / v, verdict(k / v >= 3.0)
            ));
            if let Some((c, _)) = med(local, "chown", temp) {
                out.push(format!(
                    "full pass ({temp}, {local}): vs chown -R {:.3} s = {:.2}× faster (target ≥ 2×): {}",
                    c,
                    c / v,
                    verdict(c / v >= 2.0)
                ));
            }
        }
        if let (Some((r, rt)), Some((f, _))) = (med(local, "rescan", temp), med(local, "floor", temp)) {
            out.push(format!(
                "rescan ({temp}, {local}): {:.3} s (best, {} threads) = {:.2}× the floor {:.3} s (target ≤ 1.3×): {}",
                r,
                rt.unwrap_or(1),
                r / f,
                f,
                verdict(r / f <= 1.3)
            ));
            if let Some((k2, _)) = med(local, "kubelet-2nd", temp) {
                out.push(format!(
                    "rescan ({temp}, {local}): vs kubelet-2nd {:.3} s = {:.2}× faster (target ≥ 5×): {}",
                    k2,
                    k2 / r,
                    verdict(k2 / r >= 5.0)
                ));
            }
        }
    }
    if let Some(slow) = slow
        && let (Some((v, vt)), Some((k, _))) = (med(slow, "full", "cold"), med(slow, "kubelet", "cold"))
    {
        out.push(format!(
            "slow storage full pass: volprep {:.3} s (best, {} threads) vs kubelet {:.3} s = {:.2}× faster (target ≥ 10×): {}",
            v, vt.unwrap_or(1), k, k / v, verdict(k / v >= 10.0)
        ));
    }
    match na.get("skip") {
        Some(why) => out.push(format!("skip with a valid marker (≤ 20 ms): n/a ({why})")),
        None => {
            for r in rows.iter().filter(|r| r.method == "skip" && r.storage == local && !r.failed) {
                out.push(format!(
                    "skip ({}, {local}): {:.1} ms (target ≤ 20 ms): {}",
                    r.temp,
                    r.median * 1e3,
                    verdict(r.median <= 0.020)
                ));
            }
        }
    }
    match na.get("resume") {
        Some(why) => out.push(format!("resume after a kill at 50 % (reads ≤ 60 %): n/a ({why})")),
        None => {
            for r in rows.iter().filter(|r| r.method == "resume" && r.storage == local && !r.failed) {
                if let Some(n) = r.entries_read {
                    let total = r.entries_per_s * r.median;
                    out.push(format!(
                        "resume ({}, {local}): read {n} of {total:.0} entries = {:.0} % (target ≤ 60 %): {}",
                        r.temp,
                        100.0 * n as f64 / total,
                        verdict(n as f64 <= 0.6 * total)
                    ));
                }
            }
        }
    }
    let rss = rows
        .iter()
        .filter(|r| r.storage == local && ["full", "rescan", "check"].contains(&r.method))
        .map(|r| r.rss_mib)
        .fold(0.0, f64::max);
    out.push(format!(
        "peak RSS of volprep on this tree: {rss:.1} MiB (targets: ≤ 64 MiB atlantis 1M, ≤ 256 MiB flat 1M)"
    ));
    for temp in ["cold", "warm"] {
        let p = rows.iter().find(|r| r.storage == local && r.method == "progress" && r.temp == temp);
        let f = p.and_then(|p| {
            rows.iter().find(|r| r.storage == local && r.method == "full" && r.temp == temp && r.threads == p.threads)
        });
        if let (Some(p), Some(f)) = (p, f) {
            let cost = p.median / f.median - 1.0;
            out.push(format!(
                "progress cost ({temp}): {:+.1} % (target < 2 %; one noisy run): {}",
                cost * 100.0,
                verdict(cost < 0.02)
            ));
        }
    }
    out
}

/// The JSON file: environment, tree, every run, every row.
pub fn json(meta: Value, runs: &[Run], rows: &[Row], targets: &[String], syscalls: Value) -> Value {
    let runs: Vec<Value> = runs
        .iter()
        .map(|r| {
            json!({
                "storage": r.storage, "method": r.method, "threads": r.threads, "cache": r.temp,
                "rep": r.rep, "wall_s": r.m.wall_s, "user_s": r.m.user_s, "sys_s": r.m.sys_s,
                "maxrss_kib": r.m.maxrss_kib, "exit": r.m.exit.describe(), "sync_s": r.sync_s,
                "entries_read": r.entries_read, "action": r.action, "requests": r.requests,
                "request_mix": r.request_mix,
                "ok": r.ok, "note": r.note,
            })
        })
        .collect();
    let summary: Vec<Value> = rows
        .iter()
        .map(|r| {
            let kubelet = best(rows, &r.storage, "kubelet", r.temp).map(|x| x.0 / r.median);
            let floor = best(rows, &r.storage, "floor", r.temp).map(|x| r.median / x.0);
            json!({
                "storage": r.storage, "method": r.method, "threads": r.threads, "cache": r.temp,
                "min_s": r.min, "median_s": r.median, "max_s": r.max,
                "entries_per_s": r.entries_per_s, "user_s": r.user, "sys_s": r.sys,
                "peak_rss_mib": r.rss_mib, "sync_s": r.sync, "entries_read": r.entries_read,
                "requests_per_entry": r.requests_per_entry,
                "kubelet_over_this": kubelet, "this_over_floor": floor,
                "failed": r.failed, "na": r.na, "notes": r.notes,
            })
        })
        .collect();
    json!({
        "version": 1,
        "meta": meta,
        "runs": runs,
        "summary": summary,
        "targets": targets,
        "syscalls": syscalls,
    })
}
