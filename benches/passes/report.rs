//! Figures: one record per timed run, grouped into table rows with ratios computed from the
//! same run, the markdown table, the targets check, and the JSON file.

use std::collections::BTreeMap;
use std::fmt::Write;

use serde_json::{Value, json};

use crate::child::Measured;
use crate::methods::{label, threads_label};

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
    /// Slow storage: delayed requests the server answered during the run; CephFS: MDS
    /// requests (the `mds.request` counter's increase).
    pub requests: Option<u64>,
    /// Slow storage: the server's counts by request kind.
    pub request_mix: Option<Value>,
    /// Slow storage: the model's mean latency of a delayed request, arrival to reply; CephFS:
    /// the MDS's mean reply latency over the run's requests. Microseconds.
    pub latency_us: Option<f64>,
    pub ok: bool,
    pub note: String,
    /// The 1-minute load average just before the run (the machine may be shared).
    pub load1: f64,
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
    /// Slow storage / CephFS: median (delayed / MDS) requests per entry.
    pub requests_per_entry: Option<f64>,
    /// Median of the runs' mean request latency (µs).
    pub latency_us: Option<f64>,
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
                latency_us: {
                    let mut l: Vec<f64> = good.iter().filter_map(|r| r.latency_us).collect();
                    (!l.is_empty()).then(|| median(&mut l))
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
    s.push_str("| method | threads | cache | min s | median s | max s | entries/s | user s | sys s | RSS MiB | sync s | requests/entry | request latency ms | kubelet ÷ this | this ÷ floor | notes |\n");
    s.push_str("|---|--:|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|---|\n");
    for r in rows.iter().filter(|r| r.storage == storage) {
        let kubelet = best(rows, storage, "kubelet", r.temp).map(|x| x.0);
        let floor = best(rows, storage, "floor", r.temp).map(|x| x.0);
        let threads = threads_label(r.threads);
        let mut notes = r.notes.clone();
        let requests = r.requests_per_entry.map_or("-".into(), |q| format!("{q:.2}"));
        let latency = r.latency_us.map_or("-".into(), |l| format!("{:.2}", l / 1000.0));
        if r.failed {
            notes.insert(0, "FAILED".into());
        }
        if let Some(na) = &r.na {
            let _ = writeln!(
                s,
                "| {} | {threads} | {} | n/a | n/a | n/a | n/a | | | | | | | | | {na} |",
                label(r.method),
                r.temp
            );
            continue;
        }
        let ratio = |x: Option<f64>| x.filter(|x| x.is_finite() && *x > 0.0);
        let _ = writeln!(
            s,
            "| {} | {threads} | {} | {} | {} | {} | {:.0} | {} | {} | {:.1} | {} | {requests} | {latency} | {} | {} | {} |",
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

/// Per-entry request counts by kind on one storage (CephFS: the MDS's counters), medians
/// over the repetitions of each row, as a markdown table.
pub fn mix_table(runs: &[Run], rows: &[Row], storage: &str, entries: u64) -> String {
    let mut totals: BTreeMap<String, u64> = BTreeMap::new();
    for r in runs.iter().filter(|r| r.storage == storage) {
        for (k, v) in r.request_mix.as_ref().and_then(Value::as_object).into_iter().flatten() {
            *totals.entry(k.clone()).or_default() += v.as_u64().unwrap_or(0);
        }
    }
    let mut keys: Vec<(String, u64)> = totals.into_iter().filter(|(k, _)| k != "request").collect();
    keys.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    let keys: Vec<String> = std::iter::once("request".to_string()).chain(keys.into_iter().map(|k| k.0)).collect();
    let mut s = format!("| method | threads | {} |\n|---|--:|{}\n", keys.join(" | "), "--:|".repeat(keys.len()));
    for row in rows.iter().filter(|r| r.storage == storage && r.na.is_none()) {
        let rs: Vec<&Run> = runs
            .iter()
            .filter(|r| {
                r.storage == storage && r.method == row.method && r.threads == row.threads && r.temp == row.temp
            })
            .collect();
        let cells: Vec<String> = keys
            .iter()
            .map(|k| {
                let mut v: Vec<f64> = rs
                    .iter()
                    .filter_map(|r| r.request_mix.as_ref())
                    .map(|m| m.get(k).and_then(Value::as_u64).unwrap_or(0) as f64 / entries.max(1) as f64)
                    .collect();
                if v.is_empty() { "-".into() } else { format!("{:.2}", median(&mut v)) }
            })
            .collect();
        let _ = writeln!(s, "| {} | {} | {} |", label(row.method), threads_label(row.threads), cells.join(" | "));
    }
    s
}

/// The row that stands for volprep's `full` (or `rescan`): the default thread count when the
/// run measured it, else the best over thread counts.
fn volprep_row(rows: &[Row], storage: &str, method: &str, temp: &str) -> Option<(f64, Option<usize>)> {
    rows.iter()
        .find(|r| r.storage == storage && r.method == method && r.temp == temp && r.threads == Some(0) && !r.failed)
        .map(|r| (r.median, r.threads))
        .or_else(|| best(rows, storage, method, temp))
}

/// Each storage's distance of volprep and the kubelet to the floors (`floors.rs`), per cache
/// temperature: `full` (its best thread count) and the kubelet over the race-safe and the unsafe
/// change floor, `check` over the read floor. Stated, not judged: the ratio to the floor
/// depends on volprep alone, the ratio to the kubelet on the disk too.
pub fn distances(rows: &[Row], storages: &[&str]) -> Vec<String> {
    let mut out = Vec::new();
    for &st in storages.iter().filter(|s| !s.is_empty()) {
        for temp in ["cold", "warm"] {
            let med = |m: &str| best(rows, st, m, temp);
            let over = |what: &str, this: Option<(f64, Option<usize>)>, floor: &str| {
                let ((t, tt), (f, _)) = (this?, med(floor)?);
                Some(format!(
                    "{what} {t:.3} s ({} threads) = {:.2}× the {} {f:.3} s",
                    threads_label(tt),
                    t / f,
                    label(floor)
                ))
            };
            let lines = [
                over("volprep full", med("full"), "race-safe-floor"),
                over("volprep full", med("full"), "unsafe-floor"),
                over("kubelet", med("kubelet"), "race-safe-floor"),
                over("volprep check", med("check"), "read-floor"),
            ];
            out.extend(lines.into_iter().flatten().map(|l| format!("{st}, {temp}: {l}")));
        }
    }
    out
}

/// The targets that one run can judge, each "met"/"missed" with its figures.
pub fn targets(
    rows: &[Row],
    local: &str,
    slow: Option<&str>,
    ceph: Option<&str>,
    na: &BTreeMap<&str, String>,
) -> Vec<String> {
    let mut out = Vec::new();
    let verdict = |ok: bool| if ok { "met" } else { "MISSED" };
    let med = |st: &str, m: &str, t: &str| best(rows, st, m, t);
    for temp in ["cold", "warm"] {
        if let (Some((v, vt)), Some((k, _))) = (volprep_row(rows, local, "full", temp), med(local, "kubelet", temp)) {
            let t = threads_label(vt);
            let want = if temp == "cold" { 4.0 } else { 3.0 };
            out.push(format!(
                "full pass ({temp}, {local}): volprep {:.3} s ({t} threads) vs kubelet {:.3} s = {:.2}× faster (target ≥ {want}×): {}",
                v, k, k / v, verdict(k / v >= want)
            ));
            if let Some((c, _)) = med(local, "chown", temp) {
                out.push(format!(
                    "full pass ({temp}, {local}): vs chown -R {:.3} s = {:.2}× faster (target ≥ 2.5×): {}",
                    c,
                    c / v,
                    verdict(c / v >= 2.5)
                ));
            }
            if temp == "cold"
                && let Some((c, ct)) = volprep_row(rows, local, "check", temp)
            {
                out.push(format!(
                    "full pass ({temp}, {local}): {:.2}× volprep's own check {:.3} s ({} threads) (target ≤ 1.25×): {}",
                    v / c,
                    c,
                    threads_label(ct),
                    verdict(v / c <= 1.25)
                ));
            }
        }
        if let (Some((r, rt)), Some((f, _))) = (med(local, "rescan", temp), med(local, "floor", temp)) {
            out.push(format!(
                "rescan ({temp}, {local}): {:.3} s (best, {} threads) = {:.2}× the floor {:.3} s (target ≤ 1.3×): {}",
                r,
                threads_label(rt),
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
            v, threads_label(vt), k, k / v, verdict(k / v >= 10.0)
        ));
    }
    if let Some(ceph) = ceph {
        let row = |m: &str| rows.iter().find(|r| r.storage == ceph && r.method == m && !r.failed && r.na.is_none());
        let full = rows
            .iter()
            .find(|r| r.storage == ceph && r.method == "full" && r.threads == Some(0) && !r.failed)
            .or_else(|| {
                rows.iter()
                    .filter(|r| r.storage == ceph && r.method == "full" && !r.failed)
                    .min_by(|a, b| a.median.total_cmp(&b.median))
            });
        if let (Some(f), Some(k)) = (full, row("kubelet")) {
            let t = threads_label(f.threads);
            out.push(format!(
                "CephFS full pass: volprep {:.2} s ({t} threads) vs kubelet {:.2} s = {:.2}× faster (target ≥ 6×): {}",
                f.median,
                k.median,
                k.median / f.median,
                verdict(k.median / f.median >= 6.0)
            ));
            if let Some(c) = row("chown") {
                out.push(format!(
                    "CephFS full pass: vs chown -R {:.2} s = {:.2}× faster (target ≥ 1.4×): {}",
                    c.median,
                    c.median / f.median,
                    verdict(c.median / f.median >= 1.4)
                ));
            }
            if let Some(q) = f.requests_per_entry {
                out.push(format!(
                    "CephFS full pass: {q:.2} MDS requests per entry (target ≤ 2.6): {}",
                    verdict(q <= 2.6)
                ));
            }
            let rescan = rows
                .iter()
                .filter(|r| r.storage == ceph && r.method == "rescan" && !r.failed)
                .min_by(|a, b| a.median.total_cmp(&b.median));
            if let Some(r) = rescan {
                out.push(format!(
                    "CephFS rescan: {:.2} s = {:.1}× faster than the kubelet (target ≥ 25×): {}",
                    r.median,
                    k.median / r.median,
                    verdict(k.median / r.median >= 25.0)
                ));
            }
        }
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
    for (id, at, target) in [("resume", 50, 60), ("resume80", 80, 40)] {
        match na.get("resume") {
            Some(why) => out.push(format!("resume after a kill at {at} % (reads ≤ {target} %): n/a ({why})")),
            None => {
                for r in rows.iter().filter(|r| r.method == id && r.storage == local && !r.failed) {
                    if let Some(n) = r.entries_read {
                        let total = r.entries_per_s * r.median;
                        out.push(format!(
                            "resume after a kill at {at} % ({}, {local}): read {n} of {total:.0} entries = {:.0} % (target ≤ {target} %): {}",
                            r.temp,
                            100.0 * n as f64 / total,
                            verdict(n as f64 <= f64::from(target) / 100.0 * total)
                        ));
                    }
                }
            }
        }
    }
    let rss = rows
        .iter()
        .filter(|r| r.storage == local && ["full", "rescan", "check"].contains(&r.method))
        .map(|r| r.rss_mib)
        .fold(0.0, f64::max);
    if rss > 0.0 {
        out.push(format!(
            "peak RSS of volprep on this tree: {rss:.1} MiB (targets: ≤ 64 MiB atlantis 1M, ≤ 256 MiB flat 1M)"
        ));
    }
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
                "request_mix": r.request_mix, "request_latency_us": r.latency_us,
                "ok": r.ok, "note": r.note, "load1": r.load1,
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
                "requests_per_entry": r.requests_per_entry, "request_latency_us": r.latency_us,
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
