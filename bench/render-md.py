#!/usr/bin/env python3
"""Renders the results section of docs/BENCHMARKS.md from bench-results.json.

  python3 bench/render-md.py RESULTS.json                  print the tables (markdown)
  python3 bench/render-md.py RESULTS.json --doc FILE.md    replace the text between
                                                           <!-- bench-results:begin --> and
                                                           <!-- bench-results:end --> in FILE.md

Every cell is `median (min-max)` over the repeats; goals missed say so in the row.
"""

import argparse
import json
import sys

BEGIN = "<!-- bench-results:begin -->"
END = "<!-- bench-results:end -->"


def cell(s, unit="s", scale=1.0, digits=3):
    if not s:
        return "n/a"
    f = f"{{:.{digits}f}}"
    med, lo, hi = (f.format(s[k] * scale) for k in ("median", "min", "max"))
    if s.get("n", 1) <= 1 or lo == hi:
        return f"{med} {unit}".strip()
    return f"{med} {unit} ({lo}-{hi})".replace(" )", ")").strip()


def ms(s):
    return cell(s, "ms", 1000.0, 1)


def goal(met):
    return {True: "met", False: "**MISSED**", None: "n/a"}[met]


def table(head, rows):
    out = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def render(res):
    m = res.get("meta", {})
    parts = []
    gpus = (m.get("gpus") or "").replace("\n", "; ")
    parts.append(
        f"Run: {', '.join(m.get('manifest', []) or ['revision unknown'])}; GPUs: {gpus or 'n/a'}; "
        f"{m.get('repeats', '?')} repeats (cells: median (min-max)); images on {m.get('images_fs', '?')}; "
        f"{m.get('criu_version', 'CRIU ?')}; whole run {m.get('elapsed_s', '?')} s.")

    rows = []
    for r in res.get("floor_vs_plugin", []):
        f, p, g = r.get("floor", {}), r.get("plugin"), r.get("goal", {})
        rows.append([f"{r['mib']} MiB", r.get("repeats"), cell(f.get("checkpoint_s")), cell(f.get("restore_s")),
                     ms(f.get("lock_s")) + " / " + ms(f.get("unlock_s")), ms(f.get("cuinit_s")), cell(f.get("total_s")),
                     cell(p["plugin_s"]) if p else "floor only", cell(p["driver_s"]) if p else "-",
                     ms(p["overhead_s"]) if p else "-", cell(p["overhead_pct"], "%", 1.0, 2) if p else "-",
                     (goal(g.get("met")) + f" (≤ {g['limit_s'] * 1000:.0f} ms)") if p else "-"])
    if rows:
        parts.append("### 1. Driver floor vs the plugin (one process, device memory on GPU 0)\n\n" + table(
            ["device memory", "n", "floor checkpoint", "floor restore", "floor lock / unlock", "floor cuInit",
             "floor total", "plugin hooks (dump+restore)", "driver calls in plugin", "plugin overhead", "overhead %",
             "goal ≤ 2% or ≤ 50 ms"], rows))

    rows = []
    for r in res.get("floor_vs_plugin", []):
        p, g = r.get("plugin"), r.get("side_goal")
        if not p or not g:
            continue
        rows.append([f"{r['mib']} MiB", r.get("repeats"), cell(p.get("plugin_dump_s")), cell(p.get("driver_dump_s")),
                     ms(p.get("overhead_dump_s")), goal(g.get("dump_met")), cell(p.get("plugin_restore_s")),
                     cell(p.get("driver_restore_s")), ms(p.get("overhead_restore_s")), goal(g.get("restore_met"))])
    if rows:
        parts.append("### 1b. Plugin overhead per side, beyond the driver's own calls (goal ≤ 10 ms each)\n\n"
                     "Driver time: the cuInit a hook waited for, the locks and the longest checkpoint at dump; the "
                     "longest restore + unlock at restore.\n\n" + table(
                         ["device memory", "n", "dump: plugin hooks", "of it driver", "dump overhead", "goal",
                          "restore: plugin hooks", "of it driver", "restore overhead", "goal"], rows))

    rows = []
    for r in res.get("per_action", []):
        rows.append([r["processes"], r.get("children"), cell(r.get("per_action_s")), cell(r.get("in_process_s")),
                     cell(r.get("ratio"), "×", 1.0, 2), ms(r.get("per_action_overhead_s")),
                     ms(r.get("per_child_overhead_s")), cell(r.get("saved_s"))])
    if rows:
        parts.append("### 2. Per-action tool path vs one in-process controller (1 GiB per process)\n\n" + table(
            ["CUDA processes", "tool runs per process", "per-action total", "in-process total", "ratio",
             "per-action overhead", "per tool run", "saved"], rows))

    par = res.get("parallel") or []
    if isinstance(par, dict):
        par = [par]
    rows = []
    for p in par:
        g = p.get("goal", {})
        where = "one GPU" if p.get("one_gpu") else f"{p.get('gpus') or '?'} GPUs"
        for phase in ("checkpoint", "restore"):
            rows.append([f"{p.get('processes', 2)} on {where}", phase, cell(p.get(f"slowest_single_{phase}_s")),
                         cell(p.get(f"sum_single_{phase}_s")), cell(p.get(f"floor_parallel_{phase}_s")),
                         cell(p.get(f"plugin_tree_{phase}_s")), cell(p.get(f"plugin_tree_{phase}_over_slowest"), "×", 1, 2),
                         cell(p.get(f"plugin_tree_{phase}_over_floor"), "×", 1, 2),
                         f"{goal(g.get(phase + '_met'))} (≤ {g.get(phase + '_limit', 0):.2f}× {g.get('against', '')})"])
    if rows:
        parts.append("### 3. Parallelism: N processes in one tree\n\n" + table(
            ["processes", "phase", "slowest alone (floor)", "sum of singles", "floor, all in parallel",
             "plugin, tree", "plugin / slowest alone", "plugin / floor in parallel", "goal"], rows))

    rows = []
    for r in res.get("identity", []):
        rows.append([r["process"], r.get("repeats"), ms(r.get("scan_s")), cell(r.get("scanned_mib"), "MiB", 1, 0),
                     cell(r.get("sites"), "", 1, 0), ms(r.get("identity_dump_s")), ms(r.get("reconcile_s")),
                     r.get("sites_from") or "-", goal(r.get("goal_met"))])
    if rows:
        parts.append("### 4. Identity: dump-side scan, restore-side verify + rewrite (per process)\n\n" + table(
            ["process", "n", "dump scan", "scanned", "PCI sites", "dump identity total", "restore verify+rewrite",
             "sites from", "goal ≤ 50 ms"], rows))

    rows = []
    for r in res.get("criu_split", []):
        rows.append([r["process"], r.get("repeats"), cell(r.get("image_mib"), "MiB", 1, 0),
                     cell(r.get("dump_wall_s")), cell(r.get("plugin_dump_s")), cell(r.get("driver_dump_s")),
                     cell(r.get("criu_dump_s")), cell(r.get("restore_wall_s")), cell(r.get("plugin_restore_s")),
                     cell(r.get("driver_restore_s")), cell(r.get("criu_restore_s"))])
    if rows:
        parts.append("### 5. Whole CRIU dump and restore of the PyTorch process\n\n" + table(
            ["process", "n", "images", "dump wall", "plugin", "of it driver", "CRIU own", "restore wall", "plugin",
             "of it driver", "CRIU own"], rows))

    parts.extend(render_scale(res.get("scale") or []))

    notes = []
    for c in res.get("checks", []):
        notes.append(f"- check {c['section']} {c['label']}: {'data intact' if c.get('ok') else 'FAILED'} ({c.get('what')})")
    for e in res.get("errors", []):
        notes.append(f"- error {e.get('section')} {e.get('label')} #{e.get('repeat')}: {e.get('error')}")
    for s in res.get("skipped", []):
        notes.append(f"- skipped {s.get('section')} {s.get('label')}: {s.get('skipped')}")
    if notes:
        parts.append("Checks, errors and skipped rows:\n\n" + "\n".join(notes))
    return "\n\n".join(parts) + "\n"


def scaled(s, r, unit="ms"):
    """A median in ms (or s) and its ratio to the one-process row: `12.3 ms ×1.9`."""
    if not s:
        return "n/a"
    v = f"{s['median'] * 1000:.1f} ms" if unit == "ms" else f"{s['median']:.3f} s"
    return v if r is None else f"{v} ×{r:.2f}"


def render_scale(rows):
    """Section 6: how the cost grows with processes and GPUs, each figure with its ratio to the one-process tree on
    as many GPUs (×1.00 on that row)."""
    if not rows:
        return []
    out = []
    t = []
    for r in rows:
        x = r["ratio"]
        t.append([r["gpus"], r["processes"], r["repeats"], f"×{r['processes']}",
                  scaled(r.get("dump_wall_s"), x.get("dump_wall_s"), "s"),
                  scaled(r.get("restore_wall_s"), x.get("restore_wall_s"), "s"),
                  scaled(r.get("plugin_dump_s"), x.get("plugin_dump_s")),
                  scaled(r.get("overhead_dump_s"), x.get("overhead_dump_s")),
                  scaled(r.get("plugin_restore_s"), x.get("plugin_restore_s")),
                  scaled(r.get("overhead_restore_s"), x.get("overhead_restore_s"))])
    out.append("### 6. How the cost grows: N processes of one tree, each on G GPUs\n\n"
               "Each cell: the median, and × its ratio to the one-process tree on as many GPUs (same run). The work "
               "(device memory, PCI sites, driver calls) grows ×N. Plugin: what CRIU waited for in its hooks "
               "(`timing:` lines); beyond driver: that less the driver's critical path (the cuInit a hook waited "
               "for, the locks, the longest checkpoint; the longest restore + unlock).\n\n" + table(
                   ["GPUs", "processes", "n", "work", "dump wall", "restore wall", "plugin, dump",
                    "beyond driver, dump", "plugin, restore", "beyond driver, restore"], t))
    t = []
    for r in rows:
        hd, hr, xd, xr = r["hooks_dump"], r["hooks_restore"], r["ratio_hooks_dump"], r["ratio_hooks_restore"]
        t.append([r["gpus"], r["processes"]] + [scaled(hd.get(h), xd.get(h)) for h in
                                                 ("init", "PAUSE_DEVICES", "CHECKPOINT_DEVICES", "exit")]
                 + [scaled(hr.get(h), xr.get(h)) for h in ("init", "RESUME_DEVICES_LATE", "exit")])
    out.append("#### 6b. The plugin's time at each hook (every call of a hook added up)\n\n" + table(
        ["GPUs", "processes", "init(dump)", "PAUSE_DEVICES", "CHECKPOINT_DEVICES", "exit(dump)", "init(restore)",
         "RESUME_DEVICES_LATE", "exit(restore)"], t))
    t = []
    for r in rows:
        x = r["ratio"]
        t.append([r["gpus"], r["processes"], cell(r.get("sites"), "", 1, 0),
                  scaled(r.get("scan_s"), x.get("scan_s")), scaled(r.get("scan_sum_s"), x.get("scan_sum_s")),
                  scaled(r.get("reconcile_s"), x.get("reconcile_s")),
                  scaled(r.get("reconcile_sum_s"), x.get("reconcile_sum_s")),
                  scaled(r.get("checkpoint_batch_s"), x.get("checkpoint_batch_s")),
                  scaled(r.get("restore_batch_s"), x.get("restore_batch_s"))])
    out.append("#### 6c. The identity scan and the reconciliation, split out\n\n"
               "Scan: the dump's search of each process's memory for the PCI words (beside its checkpoint); "
               "reconciliation: verify the recorded sites, rewrite, validate against NVML (between the driver's "
               "restore and the unlock). Slowest process and all processes added up; the batches they run in.\n\n"
               + table(["GPUs", "processes", "PCI sites per process", "scan, slowest", "scan, all",
                        "reconciliation, slowest", "reconciliation, all", "checkpoint batch", "restore batch"], t))
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("results")
    p.add_argument("--doc", help="markdown file whose results section is replaced")
    a = p.parse_args()
    with open(a.results) as f:
        text = render(json.load(f))
    if not a.doc:
        sys.stdout.write(text)
        return 0
    with open(a.doc) as f:
        doc = f.read()
    if BEGIN not in doc or END not in doc or doc.index(BEGIN) > doc.index(END):
        sys.exit(f"render-md: {a.doc} has no {BEGIN} ... {END} section; add the two markers where the tables go")
    head, rest = doc.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    with open(a.doc, "w") as f:
        f.write(head + BEGIN + "\n" + text + END + tail)
    return 0


if __name__ == "__main__":
    sys.exit(main())
