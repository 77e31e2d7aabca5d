#!/usr/bin/env python3
"""Plots a thread-count sweep of the `passes` benchmark and prints its table.

    cargo bench --bench passes -- --entries 100000 --temps cold --reps 3 \
        --threads-list 1,2,4,8,16,32,64,128 --methods full,check --slow-entries 10000 \
        --out target/sweep.json
    python3 benches/thread_sweep.py target/sweep.json docs/thread-sweep.png

Needs matplotlib (e.g. `python3 -m venv v && v/bin/pip install matplotlib`). One panel per
storage of the run: the median wall time of volprep `full` (and `check`) per thread count,
with the min–max range of the repetitions.
"""

import json
import sys


def rows(summary, storage, method):
    r = [x for x in summary if x["storage"] == storage and x["method"] == method and not x["failed"]]
    return sorted(r, key=lambda x: x["threads"])


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    src, png = sys.argv[1], sys.argv[2]
    with open(src) as f:
        run = json.load(f)
    summary = run["summary"]
    storages = list(dict.fromkeys(x["storage"] for x in summary))
    entries = run["meta"]["entries_by_storage"]
    loads = [r["load1"] for r in run["runs"] if r.get("load1") is not None]

    # The table.
    threads = sorted({x["threads"] for x in summary if x["threads"]})
    print("| storage | method | " + " | ".join(f"-j{t}" for t in threads) + " |")
    print("|---|---|" + "--:|" * len(threads))
    for s in storages:
        for m in ("full", "check"):
            by_t = {x["threads"]: x for x in rows(summary, s, m)}
            if not by_t:
                continue
            cells = [f"{by_t[t]['median_s']:.2f}" if t in by_t else "" for t in threads]
            print(f"| {s} ({entries.get(s, '?')} entries) | {m} | " + " | ".join(cells) + " |")
    if loads:
        print(f"\n1-minute load average before the runs: {min(loads):.1f}–{max(loads):.1f}")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(storages), figsize=(5.5 * len(storages), 4.2), squeeze=False)
    for ax, s in zip(axes[0], storages):
        for m, style in (("full", "o-"), ("check", "s")):
            r = rows(summary, s, m)
            if not r:
                continue
            t = [x["threads"] for x in r]
            med = [x["median_s"] for x in r]
            lo = [x["median_s"] - x["min_s"] for x in r]
            hi = [x["max_s"] - x["median_s"] for x in r]
            label = "volprep apply (every entry changes)" if m == "full" else "volprep check (read-only)"
            ax.errorbar(t, med, yerr=[lo, hi], fmt=style, capsize=3, label=label)
        ax.set_xscale("log", base=2)
        ax.set_xticks(threads)
        ax.set_xticklabels([str(t) for t in threads])
        ax.set_ylim(bottom=0)
        ax.set_xlabel("--threads")
        ax.set_ylabel("wall time, s (median, min–max)")
        ax.set_title(f"{s}, {entries.get(s, '?')} entries, cold")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    m = run["meta"]["machine"]
    fig.suptitle(f"volprep thread sweep: {m['cores']} cores, kernel {m['kernel']}", fontsize=10)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    print(f"\nplot written to {png}", file=sys.stderr)


if __name__ == "__main__":
    main()
