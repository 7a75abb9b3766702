#!/usr/bin/env python3
"""Draws docs/benchmarks.png from bench-results.json (run HERE: `pip install matplotlib`).

  python3 bench/plot.py RESULTS.json [-o docs/benchmarks.png]

Bars are medians, whiskers min-max over the repeats.
"""

import argparse
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def mm(s, scale=1.0):
    """(median, [lower error, upper error]) of a stats cell; zeros when absent."""
    if not s:
        return 0.0, (0.0, 0.0)
    m = s["median"] * scale
    return m, (m - s["min"] * scale, s["max"] * scale - m)


def bars(ax, labels, series, ylabel, title, stacked=False):
    """series: [(name, [stats...], scale)]"""
    n = len(series)
    width = 0.8 / (1 if stacked else max(n, 1))
    xs = range(len(labels))
    bottom = [0.0] * len(labels)
    for i, (name, cells, scale) in enumerate(series):
        vals = [mm(c, scale) for c in cells]
        heights = [v for v, _ in vals]
        err = [[e[0] for _, e in vals], [e[1] for _, e in vals]]
        pos = [x if stacked else x - 0.4 + width * (i + 0.5) for x in xs]
        ax.bar(pos, heights, width, bottom=bottom if stacked else None, label=name,
               yerr=None if stacked else err, capsize=3)
        if stacked:
            bottom = [b + h for b, h in zip(bottom, heights)]
    ax.set_xticks(list(xs))
    ax.set_xticklabels(labels, fontsize=8)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7)


def plot(res, out):
    fig, axes = plt.subplots(2, 3, figsize=(16, 9))
    fig.suptitle("criu-cuda-migrate benchmark (median, min-max whiskers)", fontsize=12)

    rows = res.get("floor_vs_plugin", [])
    bars(axes[0][0], [f"{r['mib'] // 1024 if r['mib'] >= 1024 else r['mib']}{' GiB' if r['mib'] >= 1024 else ' MiB'}"
                      for r in rows],
         [("driver floor (1 controller)", [r["floor"].get("total_s") for r in rows], 1.0),
          ("driver calls in plugin", [(r.get("plugin") or {}).get("driver_s") for r in rows], 1.0),
          ("plugin hooks total", [(r.get("plugin") or {}).get("plugin_s") for r in rows], 1.0)],
         "seconds", "1. Driver floor vs plugin (checkpoint + restore)")

    pa = res.get("per_action", [])
    bars(axes[0][1], [f"{r['processes']} process(es)" for r in pa],
         [("per-action tool path", [r.get("per_action_s") for r in pa], 1.0),
          ("one in-process controller", [r.get("in_process_s") for r in pa], 1.0)],
         "seconds", "2. Per-action tool path vs in-process")

    par = res.get("parallel") or []
    if isinstance(par, dict):
        par = [par]
    labels = [f"{p.get('processes', 2)} x {ph}" for p in par for ph in ("ckpt", "restore")]
    pick = lambda key: [p.get(key.format(ph)) for p in par for ph in ("checkpoint", "restore")]  # noqa: E731
    bars(axes[0][2], labels,
         [("slowest alone", pick("slowest_single_{}_s"), 1.0),
          ("floor, all in parallel", pick("floor_parallel_{}_s"), 1.0),
          ("plugin, tree", pick("plugin_tree_{}_s"), 1.0)],
         "seconds", "3. N processes in one tree" + (" on one GPU" if par and par[0].get("one_gpu") else ""))

    ident = res.get("identity", [])
    ax = axes[1][0]
    bars(ax, [i["process"].replace(", ", "\n") for i in ident],
         [("dump scan", [i.get("scan_s") for i in ident], 1000.0),
          ("restore verify+rewrite", [i.get("reconcile_s") for i in ident], 1000.0)],
         "milliseconds", "4. Identity cost per process")
    ax.axhline(50, color="red", linestyle="--", linewidth=1)
    ax.text(0, 52, "restore goal 50 ms", color="red", fontsize=7)

    split = res.get("criu_split", [])
    labels = [s["label"].replace("host-", "") + " host" for s in split]
    ax = axes[1][1]
    bars(ax, labels,
         [("driver", [s.get("driver_dump_s") for s in split], 1.0),
          ("plugin (non-driver)", [_minus(s.get("plugin_dump_s"), s.get("driver_dump_s")) for s in split], 1.0),
          ("CRIU own", [s.get("criu_dump_s") for s in split], 1.0)],
         "seconds", "5a. PyTorch: CRIU dump wall time", stacked=True)
    ax = axes[1][2]
    bars(ax, labels,
         [("driver", [s.get("driver_restore_s") for s in split], 1.0),
          ("plugin (non-driver)", [_minus(s.get("plugin_restore_s"), s.get("driver_restore_s")) for s in split], 1.0),
          ("CRIU own", [s.get("criu_restore_s") for s in split], 1.0)],
         "seconds", "5b. PyTorch: CRIU restore wall time", stacked=True)

    fig.tight_layout(rect=(0, 0, 1, 0.96))
    fig.savefig(out, dpi=110)


def _minus(a, b):
    """Median of a minus median of b as a stats cell (for the stacked bars)."""
    if not a or not b:
        return None
    v = max(a["median"] - b["median"], 0.0)
    return {"median": v, "min": v, "max": v, "n": 1}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("results")
    p.add_argument("-o", "--out", default="docs/benchmarks.png")
    a = p.parse_args()
    with open(a.results) as f:
        plot(json.load(f), a.out)
    print(f"plot: wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
