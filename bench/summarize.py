#!/usr/bin/env python3
"""Records and summarises the benchmark (standard library only: the GPU machine has no registry).

  record --file F ...            append one measurement to bench-raw.jsonl (run-gpu.sh calls it)
  summarize --records F --out D  D/bench-results.json and D/bench-table.txt
  parse-log DUMP RESTORE         the plugin's timings of one CRIU dump + restore, as JSON (a check)

The plugin's own timing lines in CRIU's logs (crates/engine/src/{node,dump,restore}.rs) give
every figure of a CRIU run; see docs/BENCHMARKS.md for how plugin, driver and CRIU time are split.
"""

import argparse
import json
import os
import re
import statistics
import sys
import time

TAG = "criu-cuda-migrate"
CRIU_LINE = re.compile(r"^\((\d+\.\d+)\)\s*(.*)$")
NUM = r"([0-9]+(?:\.[0-9]+)?)"
# Goals of issue 7, raised by issue 16.
OVERHEAD_PCT_GOAL = 2.0
OVERHEAD_FLOOR_S = 0.050
# Plugin overhead per side, beyond what the driver itself takes (cuInit waited for, locks, checkpoint;
# restore, unlock), at any process size.
OVERHEAD_SIDE_GOAL_S = 0.010
PARALLEL_GOAL = 1.25
# N processes on N GPUs: checkpoint / restore of the tree against the slowest alone.
PARALLEL_CKPT_GOAL_N_GPUS = 1.15
PARALLEL_RESTORE_GOAL_N_GPUS = 1.25
# N processes on ONE GPU: against the floor of the same N driven in parallel by a bare controller.
PARALLEL_GOAL_ONE_GPU = 1.05
RECONCILE_GOAL_S = 0.050

# The plugin's own account of what CRIU waited for in it (src/lib.rs, one line per init, hook that did work, exit).
HOOK_TIMING = re.compile(rf"timing: (\S+)\(.*\) {NUM} s in the plugin")

DUMP_PATTERNS = {
    "load_s": re.compile(rf"driver: .* loaded, .*\({NUM} s\)"),
    "nvml_s": re.compile(rf"NVML: driver .*\({NUM} s\)"),
    "cuinit_s": re.compile(rf"\bcuInit {NUM} s"),
    "batch_s": re.compile(rf"checkpoint of (\d+) CUDA process\(es\) took {NUM} s"),
}
RESTORE_PATTERNS = {
    "preflight_s": re.compile(rf"preflight passed for (\d+) CUDA process\(es\) in {NUM} s"),
    "cuinit_s": re.compile(rf"\bcuInit {NUM} s"),
    "batch_s": re.compile(rf"restore of (\d+) CUDA process\(es\) took {NUM} s"),
}
# How long a hook waited for the agent's cuInit (node.rs): driver time, not the plugin's own.
CUINIT_WAIT = re.compile(rf"cuInit {NUM} s in the driver agent \(started at init; this hook waited {NUM} s for it\)")
PID_LOCK = re.compile(rf"pid (\d+): cuCheckpointProcessLock \(timeout \d+ ms\) {NUM} s")
PID_CKPT = re.compile(rf"pid (\d+): cuCheckpointProcessCheckpoint {NUM} s")
PID_IDENT = re.compile(
    rf"pid (\d+): identity: .*?(\d+) PCI site\(s\)(?:, (\d+) cudaDeviceProp cop\(ies\)[^;]*)?; "
    rf"scanned (\d+) MiB in (\d+) mapping\(s\) in {NUM} s \(total {NUM} s\)")
PID_RESTORE = re.compile(rf"pid (\d+): cuCheckpointProcessRestore with (\d+) pair\(s\) {NUM} s")
PID_RECONCILE = re.compile(
    rf"pid (\d+): identity reconciliation: (\d+) site\(s\) rewritten \(([^)]*)\), "
    rf"(?:cudaDeviceProp copies: (\d+) rewritten, \d+ already right, \d+ skipped, )?(\d+) environment edit\(s\), {NUM} s")
PID_UNLOCK = re.compile(rf"pid (\d+): cuCheckpointProcessUnlock {NUM} s")
# CRIU's --display-stats lines (microseconds / pages).
STAT_LINE = re.compile(r"^(Freezing time|Frozen time|Memory dump time|Memory write time|Memory pages written|"
                       r"Restore time|Forking time|Pages restored):\s*(\d+)")


# ---------------------------------------------------------------------------------------------
# Log parsing


def plugin_lines(path):
    """Every line of a CRIU log (without CRIU's timestamp), then the lines of its `.stats` file
    (criu's stdout: --display-stats prints there), when run-gpu.sh kept one."""
    out = []
    stats_file = path[: -len(".log")] + ".stats" if path.endswith(".log") else None
    if stats_file and os.path.exists(stats_file):
        with open(stats_file, errors="replace") as f:
            out.extend(line.rstrip("\n") for line in f)
    try:
        with open(path, errors="replace") as f:
            for raw in f:
                m = CRIU_LINE.match(raw.rstrip("\n"))
                text = m.group(2) if m else raw.rstrip("\n")
                out.append(text)
    except OSError:
        pass
    return out


def criu_stats(lines):
    stats = {}
    for text in lines:
        body = text.split(": ", 1)[1] if text.startswith(("(", "Warn", "Error")) and ": " in text else text
        m = STAT_LINE.match(body.strip())
        if m:
            stats[m.group(1)] = int(m.group(2))
    return stats


def cuinit_wait(lines):
    return sum(float(m.group(2)) for m in (CUINIT_WAIT.search(t) for t in lines) if m)


def parse_dump(path):
    lines = plugin_lines(path)
    mine = [t for t in lines if TAG in t]
    d = {"load_s": 0.0, "nvml_s": 0.0, "cuinit_s": 0.0, "batch_s": None, "processes": 0, "pids": {}, "hooks_s": None}
    for t in mine:
        for key, rx in DUMP_PATTERNS.items():
            m = rx.search(t)
            if m and key == "batch_s":
                d["processes"], d["batch_s"] = int(m.group(1)), float(m.group(2))
            elif m:
                d[key] = float(m.group(1))
        for rx, fn in ((PID_LOCK, lambda p, m: p.__setitem__("lock_s", float(m.group(2)))),
                       (PID_CKPT, lambda p, m: p.__setitem__("checkpoint_s", float(m.group(2)))),
                       (PID_IDENT, lambda p, m: p.update(sites=int(m.group(2)), props=int(m.group(3) or 0),
                                                         scanned_mib=int(m.group(4)), mappings=int(m.group(5)),
                                                         scan_s=float(m.group(6)), identity_s=float(m.group(7))))):
            m = rx.search(t)
            if m:
                fn(d["pids"].setdefault(m.group(1), {}), m)
    d["criu_stats"] = criu_stats(lines)
    d["hooks_s"] = hooks_total(mine)
    d["hooks_by_kind"] = hooks_by_kind(mine)
    d["cuinit_wait_s"] = cuinit_wait(mine)
    return d


def hooks_total(lines):
    """The sum of the plugin's `timing:` lines, or None for logs of builds without them."""
    found = [float(m.group(2)) for m in (HOOK_TIMING.search(t) for t in lines) if m]
    return sum(found) if found else None


def hooks_by_kind(lines):
    """The plugin's `timing:` lines added up per hook (`init`, `PAUSE_DEVICES`, ..., `exit`): a hook CRIU calls
    once per process counts all its calls."""
    out = {}
    for m in (HOOK_TIMING.search(t) for t in lines):
        if m:
            out[m.group(1)] = out.get(m.group(1), 0.0) + float(m.group(2))
    return out


def parse_restore(path):
    lines = plugin_lines(path)
    mine = [t for t in lines if TAG in t]
    d = {"preflight_s": 0.0, "cuinit_s": 0.0, "batch_s": None, "processes": 0, "pids": {}, "hooks_s": None}
    for t in mine:
        for key, rx in RESTORE_PATTERNS.items():
            m = rx.search(t)
            if m and key in ("batch_s", "preflight_s"):
                d[key] = float(m.group(2))
                if key == "batch_s":
                    d["processes"] = int(m.group(1))
            elif m:
                d[key] = float(m.group(1))
        m = PID_RESTORE.search(t)
        if m:
            d["pids"].setdefault(m.group(1), {}).update(pairs=int(m.group(2)), restore_s=float(m.group(3)))
        m = PID_RECONCILE.search(t)
        if m:
            d["pids"].setdefault(m.group(1), {}).update(sites_rewritten=int(m.group(2)), sites_from=m.group(3),
                                                        props_rewritten=int(m.group(4) or 0),
                                                        env_edits=int(m.group(5)), reconcile_s=float(m.group(6)))
        m = PID_UNLOCK.search(t)
        if m:
            d["pids"].setdefault(m.group(1), {})["unlock_s"] = float(m.group(2))
    d["criu_stats"] = criu_stats(lines)
    d["hooks_s"] = hooks_total(mine)
    d["hooks_by_kind"] = hooks_by_kind(mine)
    d["cuinit_wait_s"] = cuinit_wait(mine)
    return d


def split_criu(dump, restore, dump_wall, restore_wall):
    """Plugin, driver and CRIU time of one dump + restore. The plugin's time is what its own
    timers cover: node load + NVML + cuInit + the locks (PAUSE_DEVICES) + the checkpoint batch
    (CHECKPOINT_DEVICES) at dump; preflight (node load + NVML, at init) + the restore batch
    (cuInit, restore, identity, unlock; RESUME_DEVICES_LATE) at restore. Driver time is the
    critical path of driver calls: cuInit + the locks + the longest checkpoint; cuInit + the
    longest restore + unlock. CRIU's own time is its wall time minus the plugin's."""
    pids_d, pids_r = dump["pids"], restore["pids"]
    locks = sum(p.get("lock_s", 0.0) for p in pids_d.values())
    ckpt = max((p.get("checkpoint_s", 0.0) for p in pids_d.values()), default=0.0)
    rst = max((p.get("restore_s", 0.0) + p.get("unlock_s", 0.0) for p in pids_r.values()), default=0.0)
    if dump.get("hooks_s") is not None and restore.get("hooks_s") is not None:
        # The driver agent (since 2026-12-01) runs cuInit and NVML outside the hooks, overlapped with CRIU's
        # own work: the plugin's time is what CRIU waited for in its init, hooks and exit (their `timing:`
        # lines), and the driver's critical path is the locks, the longest checkpoint, the longest
        # restore + unlock. cuInit counts only where a hook waited for it (it is in the hooks' time then).
        plugin_dump, plugin_restore = dump["hooks_s"], restore["hooks_s"]
        driver_dump = locks + ckpt + dump.get("cuinit_wait_s", 0.0)
        driver_restore = rst + restore.get("cuinit_wait_s", 0.0)
    else:
        plugin_dump = dump["load_s"] + dump["nvml_s"] + dump["cuinit_s"] + locks + (dump["batch_s"] or 0.0)
        driver_dump = dump["cuinit_s"] + locks + ckpt
        plugin_restore = restore["preflight_s"] + (restore["batch_s"] or 0.0)
        driver_restore = restore["cuinit_s"] + rst
    out = {
        "dump_wall_s": dump_wall, "restore_wall_s": restore_wall,
        "plugin_dump_s": plugin_dump, "driver_dump_s": driver_dump, "criu_dump_s": dump_wall - plugin_dump,
        "plugin_restore_s": plugin_restore, "driver_restore_s": driver_restore,
        "criu_restore_s": restore_wall - plugin_restore,
        "checkpoint_batch_s": dump["batch_s"], "restore_batch_s": restore["batch_s"],
        "plugin_s": plugin_dump + plugin_restore, "driver_s": driver_dump + driver_restore,
    }
    out["overhead_s"] = out["plugin_s"] - out["driver_s"]
    out["overhead_dump_s"] = plugin_dump - driver_dump
    out["overhead_restore_s"] = plugin_restore - driver_restore
    out["overhead_pct"] = 100.0 * out["overhead_s"] / out["driver_s"] if out["driver_s"] > 0 else None
    ident = [p for p in pids_d.values() if "scan_s" in p]
    if ident:
        out["scan_s"] = max(p["scan_s"] for p in ident)
        out["identity_dump_s"] = max(p["identity_s"] for p in ident)
        out["scanned_mib"] = max(p["scanned_mib"] for p in ident)
        out["sites"] = max(p["sites"] for p in ident)
    out["hooks_dump"] = dump.get("hooks_by_kind", {})
    out["hooks_restore"] = restore.get("hooks_by_kind", {})
    out["locks_s"] = locks
    out["longest_checkpoint_s"] = ckpt
    out["longest_restore_unlock_s"] = rst
    if ident:
        out["scan_sum_s"] = sum(p["scan_s"] for p in ident)
        out["identity_dump_sum_s"] = sum(p["identity_s"] for p in ident)
    rec = [p for p in pids_r.values() if "reconcile_s" in p]
    if rec:
        out["reconcile_sum_s"] = sum(p["reconcile_s"] for p in rec)
        out["reconcile_s"] = max(p["reconcile_s"] for p in rec)
        out["sites_rewritten"] = max(p["sites_rewritten"] for p in rec)
        out["sites_from"] = rec[0]["sites_from"]
    if dump["batch_s"] is None or restore["batch_s"] is None:
        out["warning"] = "the plugin's batch timing line is missing (did the plugin handle this process?)"
    out["criu_stats_dump"] = dump["criu_stats"]
    out["criu_stats_restore"] = restore["criu_stats"]
    return out


# ---------------------------------------------------------------------------------------------
# record


def cmd_record(a):
    r = {"t": round(time.time(), 3)}
    if a.meta:
        r["meta"] = {k: v for k, v in {
            "gpus": a.gpus, "images": a.images, "images_fs": a.images_fs, "repeats": a.repeats,
            "budget_s": a.budget, "hard_s": a.hard, "criu_version": a.criu_version, "elapsed_s": a.elapsed,
        }.items() if v is not None}
        if a.manifest and os.path.exists(a.manifest):
            with open(a.manifest) as f:
                r["meta"]["manifest"] = f.read().splitlines()[:2]
    else:
        r.update(section=a.section, label=a.label, repeat=a.repeat)
        if a.skipped:
            r["skipped"] = a.skipped
        elif a.error:
            r["error"] = a.error
        elif a.json:
            with open(a.json) as f:
                r["bench"] = json.load(f)
        elif a.criu:
            dump, restore = parse_dump(a.criu[0]), parse_restore(a.criu[1])
            r["criu"] = split_criu(dump, restore, a.dump_wall, a.restore_wall)
            r["criu"]["image_mib"] = a.image_mib
            r["criu"]["logs"] = [os.path.basename(a.criu[0]), os.path.basename(a.criu[1])]
        elif a.check:
            try:
                with open(a.check) as f:
                    rep = json.load(f)
            except (OSError, ValueError) as e:
                rep = {"error": f"unreadable report: {e}"}
            r["check"] = summarize_check(rep)
    with open(a.file, "a") as f:
        f.write(json.dumps(r) + "\n")
    return 0


def summarize_check(rep):
    """A workload's final report reduced to: is the data intact, does new GPU work run."""
    if "devices" in rep:  # ccm-sample-workload
        held = [d for d in rep["devices"] if d.get("data_ok") is not None]
        ok = bool(held) and all(d.get("data_ok") for d in held)
        return {"ok": ok, "what": f"{len(held)} device(s) with data, data_ok={ok}"}
    ok = bool(rep.get("data_ok")) and bool(rep.get("host_ok", True)) and bool(rep.get("work_ok", True))
    return {"ok": ok, "what": {k: rep.get(k) for k in ("data_ok", "host_ok", "work_ok", "error") if k in rep}}


# ---------------------------------------------------------------------------------------------
# summarize


def stats(values):
    v = [x for x in values if isinstance(x, (int, float))]
    if not v:
        return None
    return {"min": min(v), "median": statistics.median(v), "max": max(v), "n": len(v)}


def med(s):
    return None if s is None else s["median"]


def load_records(path):
    recs = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line:
                try:
                    recs.append(json.loads(line))
                except ValueError:
                    pass
    return recs


def select(recs, section, label, kind=None, bench_kind=None):
    out = []
    for r in recs:
        if r.get("section") != section or r.get("label") != label:
            continue
        if kind == "criu" and "criu" in r:
            out.append(r)
        elif kind == "bench" and "bench" in r and (bench_kind is None or r["bench"].get("kind") == bench_kind):
            out.append(r)
    return out


def floor_one(r):
    """One floor repeat of one pid: the calls and the total incl. one cuInit (what a controller pays)."""
    b = r["bench"]
    rep = b["repeats"][0]
    return rep, b["cuinit_s"]


def summarize(recs):
    res = {"meta": {}, "floor_vs_plugin": [], "per_action": [], "parallel": [], "identity": [], "criu_split": [],
           "checks": [], "errors": [], "skipped": []}
    for r in recs:
        if "meta" in r:
            res["meta"].update(r["meta"])
        if "error" in r:
            res["errors"].append({k: r.get(k) for k in ("section", "label", "repeat", "error")})
        if "skipped" in r:
            res["skipped"].append({k: r.get(k) for k in ("section", "label", "skipped")})
        if "check" in r:
            res["checks"].append({"section": r["section"], "label": r["label"], **r["check"]})

    # 1. Driver floor vs plugin.
    labels = sorted({r["label"] for r in recs if r.get("section") == "s1" and ("bench" in r or "criu" in r)},
                    key=lambda s: int(re.sub(r"\D", "", s) or 0))
    for label in labels:
        floors = select(recs, "s1", label, "bench", "floor")
        criu = [r["criu"] for r in select(recs, "s1", label, "criu")]
        row = {"label": label, "mib": int(re.sub(r"\D", "", label) or 0), "repeats": len(floors)}
        fr = [floor_one(r) for r in floors]
        row["floor"] = {
            "cuinit_s": stats([c for _, c in fr]),
            "lock_s": stats([x["per_pid"][0]["lock_s"] for x, _ in fr]),
            "checkpoint_s": stats([x["per_pid"][0]["checkpoint_s"] for x, _ in fr]),
            "restore_s": stats([x["per_pid"][0]["restore_s"] for x, _ in fr]),
            "unlock_s": stats([x["per_pid"][0]["unlock_s"] for x, _ in fr]),
            "total_s": stats([x["total_s"] + c for x, c in fr]),
        }
        if criu:
            row["plugin"] = {k: stats([c.get(k) for c in criu]) for k in (
                "plugin_dump_s", "driver_dump_s", "plugin_restore_s", "driver_restore_s", "plugin_s", "driver_s",
                "overhead_s", "overhead_pct", "dump_wall_s", "restore_wall_s", "overhead_dump_s",
                "overhead_restore_s")}
            od, orr = med(row["plugin"]["overhead_dump_s"]), med(row["plugin"]["overhead_restore_s"])
            row["side_goal"] = {"limit_s": OVERHEAD_SIDE_GOAL_S, "dump_s": od, "restore_s": orr,
                                "dump_met": None if od is None else od <= OVERHEAD_SIDE_GOAL_S,
                                "restore_met": None if orr is None else orr <= OVERHEAD_SIDE_GOAL_S}
            limit = max(OVERHEAD_PCT_GOAL / 100.0 * (med(row["plugin"]["driver_s"]) or 0.0), OVERHEAD_FLOOR_S)
            over = med(row["plugin"]["overhead_s"])
            row["goal"] = {"limit_s": limit, "overhead_median_s": over,
                           "met": None if over is None else over <= limit}
            if med(row["floor"]["total_s"]):
                row["plugin_driver_vs_floor"] = med(row["plugin"]["driver_s"]) / med(row["floor"]["total_s"])
        res["floor_vs_plugin"].append(row)

    # 2. Per-action tool path vs the in-process sequence.
    for label, n in (("tree1", 1), ("tree2", 2)):
        pa = {r["repeat"]: r["bench"] for r in select(recs, "s2", label, "bench", "per-action")}
        fl = {r["repeat"]: r["bench"] for r in select(recs, "s2", label, "bench", "floor")}
        if not pa and not fl:
            continue
        per_action = [b["repeats"][0]["total_s"] for b in pa.values()]
        in_process = [b["load_s"] + b["cuinit_s"] + b["repeats"][0]["total_s"] for b in fl.values()]
        ratios = [pa[k]["repeats"][0]["total_s"] / (fl[k]["load_s"] + fl[k]["cuinit_s"] + fl[k]["repeats"][0]["total_s"])
                  for k in pa if k in fl]
        overhead = [b["repeats"][0]["overhead_s"] for b in pa.values()]
        children = [len(b["repeats"][0]["children"]) for b in pa.values()]
        res["per_action"].append({
            "label": label, "processes": n, "children": children[0] if children else None,
            "per_action_s": stats(per_action), "in_process_s": stats(in_process), "ratio": stats(ratios),
            "per_action_overhead_s": stats(overhead),
            "per_child_overhead_s": stats([o / c for o, c in zip(overhead, children) if c]),
            "saved_s": stats([p - i for p, i in zip(per_action, in_process)]),
        })

    # 3. Parallelism: one tree of N processes per N (labels treeN, treeN-single-I, treeN-floor-all).
    res["parallel"] = []
    gpus = len([g for g in str(res["meta"].get("gpus", "")).splitlines() if g.strip()]) or None
    trees = sorted({int(m.group(1)) for r in recs if r.get("section") == "s3"
                    for m in [re.match(r"tree(\d+)", r.get("label", ""))] if m})
    for n in trees:
        tree = {r["repeat"]: r["criu"] for r in select(recs, "s3", f"tree{n}", "criu")}
        singles = [{r["repeat"]: r["bench"]["repeats"][0]["per_pid"][0]
                    for r in select(recs, "s3", f"tree{n}-single-{i}", "bench")} for i in range(1, n + 1)]
        both = {r["repeat"]: r["bench"]["repeats"][0] for r in select(recs, "s3", f"tree{n}-floor-all", "bench")}
        if not tree and not both:
            continue
        ks = sorted(k for k in singles[0] if all(k in sg for sg in singles))
        slow_c = {k: max(sg[k]["checkpoint_s"] for sg in singles) for k in ks}
        slow_r = {k: max(sg[k]["restore_s"] for sg in singles) for k in ks}
        sum_c = {k: sum(sg[k]["checkpoint_s"] for sg in singles) for k in ks}
        sum_r = {k: sum(sg[k]["restore_s"] for sg in singles) for k in ks}
        tc = {k: t["checkpoint_batch_s"] for k, t in tree.items() if t.get("checkpoint_batch_s")}
        tr = {k: t["restore_batch_s"] for k, t in tree.items() if t.get("restore_batch_s")}
        p = {
            "processes": n, "gpus": gpus, "one_gpu": gpus == 1,
            "slowest_single_checkpoint_s": stats(list(slow_c.values())),
            "slowest_single_restore_s": stats(list(slow_r.values())),
            "sum_single_checkpoint_s": stats(list(sum_c.values())),
            "sum_single_restore_s": stats(list(sum_r.values())),
            "floor_parallel_checkpoint_s": stats([b["checkpoint_all_s"] for b in both.values()]),
            "floor_parallel_restore_s": stats([b["restore_all_s"] for b in both.values()]),
            "plugin_tree_checkpoint_s": stats(list(tc.values())),
            "plugin_tree_restore_s": stats(list(tr.values())),
            "plugin_tree_checkpoint_over_slowest": stats([tc[k] / slow_c[k] for k in tc if k in slow_c]),
            "plugin_tree_restore_over_slowest": stats([tr[k] / slow_r[k] for k in tr if k in slow_r]),
            "plugin_tree_checkpoint_over_floor": stats(
                [tc[k] / both[k]["checkpoint_all_s"] for k in tc if k in both and both[k]["checkpoint_all_s"]]),
            "plugin_tree_restore_over_floor": stats(
                [tr[k] / both[k]["restore_all_s"] for k in tr if k in both and both[k]["restore_all_s"]]),
            "floor_parallel_checkpoint_over_slowest": stats(
                [both[k]["checkpoint_all_s"] / slow_c[k] for k in both if k in slow_c]),
            "floor_parallel_restore_over_slowest": stats([both[k]["restore_all_s"] / slow_r[k] for k in both if k in slow_r]),
        }
        if p["one_gpu"]:
            c, r_ = med(p["plugin_tree_checkpoint_over_floor"]), med(p["plugin_tree_restore_over_floor"])
            limits = (PARALLEL_GOAL_ONE_GPU, PARALLEL_GOAL_ONE_GPU)
            against = "the floor of the same processes driven in parallel"
        else:
            c, r_ = med(p["plugin_tree_checkpoint_over_slowest"]), med(p["plugin_tree_restore_over_slowest"])
            limits = (PARALLEL_CKPT_GOAL_N_GPUS, PARALLEL_RESTORE_GOAL_N_GPUS)
            against = "the slowest process alone"
        p["goal"] = {"checkpoint_limit": limits[0], "restore_limit": limits[1], "against": against,
                     "checkpoint_ratio": c, "restore_ratio": r_,
                     "checkpoint_met": None if c is None else c <= limits[0],
                     "restore_met": None if r_ is None else r_ <= limits[1]}
        res["parallel"].append(p)

    # 6. How the cost grows: trees of N processes, each on G GPUs (labels gGpN), every figure also as a ratio to the
    # one-process tree of the same G measured in the same run.
    res["scale"] = summarize_scale(recs)

    # 4. Identity and 5. the whole CRIU run split.
    for section, label in sorted({(r["section"], r["label"]) for r in recs if "criu" in r and r["section"] != "s6"},
                                 key=lambda x: (x[0], int(re.sub(r"\D", "", x[1]) or 0))):
        runs = [r["criu"] for r in select(recs, section, label, "criu")]
        what = {"s1": f"plain CUDA, {label} device", "s3": f"plain CUDA processes in one tree ({label})",
                "s4": f"PyTorch, {label.replace('host-', '')} host (1/2 pinned)"}.get(section, label)
        ident = {"section": section, "label": label, "process": what, "repeats": len(runs)}
        for k in ("scan_s", "identity_dump_s", "scanned_mib", "sites", "reconcile_s", "sites_rewritten"):
            ident[k] = stats([c.get(k) for c in runs])
        ident["sites_from"] = next((c.get("sites_from") for c in runs if c.get("sites_from")), None)
        rc = med(ident["reconcile_s"])
        ident["goal_met"] = None if rc is None else rc <= RECONCILE_GOAL_S
        res["identity"].append(ident)
        if section == "s4":
            res["criu_split"].append({"label": label, "process": what, "repeats": len(runs), **{k: stats([c.get(k) for c in runs]) for k in (
                "dump_wall_s", "plugin_dump_s", "driver_dump_s", "criu_dump_s",
                "restore_wall_s", "plugin_restore_s", "driver_restore_s", "criu_restore_s", "image_mib")}})
    return res


SCALE_FIGURES = (
    "dump_wall_s", "restore_wall_s", "plugin_dump_s", "plugin_restore_s", "driver_dump_s", "driver_restore_s",
    "overhead_dump_s", "overhead_restore_s", "checkpoint_batch_s", "restore_batch_s", "locks_s",
    "longest_checkpoint_s", "longest_restore_unlock_s", "scan_s", "scan_sum_s", "identity_dump_s",
    "identity_dump_sum_s", "reconcile_s", "reconcile_sum_s", "sites", "sites_rewritten", "image_mib")
SCALE_HOOKS_DUMP = ("init", "PAUSE_DEVICES", "CHECKPOINT_DEVICES", "exit")
SCALE_HOOKS_RESTORE = ("init", "RESUME_DEVICES_LATE", "exit")


def summarize_scale(recs):
    """Section s6: one row per (GPUs, processes), medians over the repeats, and each median over the median of the
    one-process row of the same GPU count (the `ratio` dict; None where that row or figure is missing)."""
    rows = {}
    for r in recs:
        m = re.fullmatch(r"g(\d+)p(\d+)", r.get("label", "")) if r.get("section") == "s6" else None
        if m and "criu" in r:
            rows.setdefault((int(m.group(1)), int(m.group(2))), []).append(r["criu"])
    out = []
    for (g, n), runs in sorted(rows.items()):
        row = {"gpus": g, "processes": n, "repeats": len(runs)}
        for k in SCALE_FIGURES:
            row[k] = stats([c.get(k) for c in runs])
        row["hooks_dump"] = {h: stats([c.get("hooks_dump", {}).get(h) for c in runs]) for h in SCALE_HOOKS_DUMP}
        row["hooks_restore"] = {h: stats([c.get("hooks_restore", {}).get(h) for c in runs])
                                for h in SCALE_HOOKS_RESTORE}
        out.append(row)
    base = {r["gpus"]: r for r in out if r["processes"] == 1}
    for row in out:
        b = base.get(row["gpus"])

        def ratio(x, y):
            x, y = med(x), med(y)
            return None if x is None or not y else x / y

        row["ratio"] = {k: ratio(row[k], b[k]) if b else None for k in SCALE_FIGURES}
        row["ratio_hooks_dump"] = {h: ratio(row["hooks_dump"][h], b["hooks_dump"][h]) if b else None
                                   for h in SCALE_HOOKS_DUMP}
        row["ratio_hooks_restore"] = {h: ratio(row["hooks_restore"][h], b["hooks_restore"][h]) if b else None
                                      for h in SCALE_HOOKS_RESTORE}
    return out


def cmd_summarize(a):
    recs = load_records(a.records)
    res = summarize(recs)
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "bench-results.json"), "w") as f:
        json.dump(res, f, indent=1)
    render = _load_render()
    with open(os.path.join(a.out, "bench-table.txt"), "w") as f:
        f.write(render.render(res))
    return 0


def _load_render():
    import importlib.util
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "render-md.py")
    spec = importlib.util.spec_from_file_location("render_md", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def cmd_parse_log(a):
    print(json.dumps(split_criu(parse_dump(a.dump), parse_restore(a.restore), 0.0, 0.0), indent=1))
    return 0


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("record")
    r.add_argument("--file", required=True)
    r.add_argument("--meta", action="store_true")
    for k in ("gpus", "images", "images-fs", "criu-version", "manifest"):
        r.add_argument(f"--{k}")
    for k in ("repeats", "budget", "hard", "elapsed"):
        r.add_argument(f"--{k}", type=int)
    r.add_argument("--section")
    r.add_argument("--label")
    r.add_argument("--repeat", type=int)
    r.add_argument("--skipped")
    r.add_argument("--error")
    r.add_argument("--json")
    r.add_argument("--criu", nargs=2, metavar=("DUMP_LOG", "RESTORE_LOG"))
    r.add_argument("--dump-wall", type=float, default=0.0)
    r.add_argument("--restore-wall", type=float, default=0.0)
    r.add_argument("--image-mib", type=int)
    r.add_argument("--check")
    r.set_defaults(fn=cmd_record)
    s = sub.add_parser("summarize")
    s.add_argument("--records", required=True)
    s.add_argument("--out", required=True)
    s.set_defaults(fn=cmd_summarize)
    pl = sub.add_parser("parse-log")
    pl.add_argument("dump")
    pl.add_argument("restore")
    pl.set_defaults(fn=cmd_parse_log)
    a = p.parse_args()
    return a.fn(a)


if __name__ == "__main__":
    sys.exit(main())
