#!/usr/bin/env python3
"""Checks and log parsing for tests/gpu/run.sh (standard library only: the GPU machine has no
registry access).

Subcommands print one short line meant for the `seen` column of run.sh's table and exit 1 when
the expectation does not hold (2 on bad input).

  gpus                         nvidia-smi's GPUs as shell lines: `index uuid bus memory_mib`
  report FILE [checks...]      check a ccm-sample-workload report<k>.json
  torch FILE [checks...]       check a torch_workload.py report
  nccl DIR --ranks N [checks]  check nccl_job.py's per-rank reports and NCCL's logs
  phase LOG checkpoint|restore the plugin's checkpoint / restore time from its log lines (n/a)
  identity-times DUMP RESTORE  the plugin's identity scan (dump) and rewrite (restore) times
  plugin-lines LOG [REGEX]     the plugin's log lines (optionally filtered)
  plugin-error LOG             the first error line the plugin (or CRIU) wrote
  ratio A B C                  A / (B + C), for the parallel-vs-sequential checkpoint time (n/a)

phase and ratio always exit 0 (they print n/a when they cannot tell): run.sh uses them inside
assignments under `set -e`.
"""

import argparse
import json
import os
import re
import subprocess
import sys

PLUGIN_TAG = "criu-cuda-migrate"
# CRIU's log lines: `(SS.uuuuuu) [pid: ]message`; with -v4 every line carries the timestamp.
CRIU_LINE = re.compile(r"^\((\d+\.\d+)\)\s*(.*)$")


def short_uuid(u):
    """GPU-0a1b2c3d-... -> GPU-0a1b2c3d: enough to tell the machine's GPUs apart in a table."""
    if isinstance(u, str) and u.startswith("GPU-"):
        return u[:12]
    return str(u)


def short_bus(b):
    """0000:00:06.0 -> 00:06.0 (the domain is 0 on every machine these tests run on)."""
    t = norm_bus(b)
    if t is None:
        return str(b)
    return (f"{t[0]:x}:" if t[0] else "") + f"{t[1]:02x}:{t[2]:02x}.{t[3]:x}"


def norm_bus(b):
    """A PCI address in any of CUDA's / NVML's / NCCL's spellings -> (domain, bus, device, function)."""
    if not isinstance(b, str):
        return None
    m = re.fullmatch(r"\s*(?:([0-9a-fA-F]+):)?([0-9a-fA-F]+):([0-9a-fA-F]+)(?:\.([0-7]))?\s*", b)
    if not m:
        return None
    dom, bus, dev, fn = m.groups()
    return (int(dom or "0", 16), int(bus, 16), int(dev, 16), int(fn or "0", 16))


def nccl_bus_int(b):
    """NCCL prints a bus id as the hex digits of the address without separators, as one number
    (`0000:00:07.0` -> busId 70)."""
    t = norm_bus(b)
    if t is None:
        return None
    return (t[0] << 20) | (t[1] << 12) | (t[2] << 4) | t[3]


def parse_pairs(items, what):
    out = {}
    for it in items or []:
        k, sep, v = it.partition("=")
        if not sep:
            sys.exit(f"gpu_check: {what} wants KEY=VALUE, got {it!r}")
        out[int(k)] = v
    return out


def load_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        print(f"no report: {e}")
        sys.exit(1)


def cmd_gpus(_args):
    out = subprocess.run(
        ["nvidia-smi", "--query-gpu=index,uuid,pci.bus_id,memory.total", "--format=csv,noheader,nounits"],
        check=True, capture_output=True, text=True,
    ).stdout
    for line in out.strip().splitlines():
        idx, uuid, bus, mem = [x.strip() for x in line.split(",")]
        print(idx, uuid, bus, mem)


def cmd_report(a):
    r = load_json(a.file)
    want_uuid = parse_pairs(a.uuid, "--uuid")
    want_bus = parse_pairs(a.bus, "--bus")
    want_nvml = parse_pairs(a.nvml_by_bus, "--nvml-by-bus")
    devs = {d["ordinal"]: d for d in r.get("devices", [])}
    seen, bad = [], []
    for o in sorted(devs):
        d = devs[o]
        data = "-" if d.get("data_ok") is None else ("ok" if d["data_ok"] else f"BAD({d.get('bad_words')})")
        ctx = "-" if d.get("ctx_works") is None else ("ok" if d["ctx_works"] else "BAD")
        agree = "agree" if d.get("agree") else "DISAGREE"
        if d.get("agree") and not d.get("consistent"):
            agree = "agree(attrs/nvml-bus differ)"
        seen.append(
            f"o{o}:{short_uuid(d.get('uuid'))}@{short_bus(d.get('cuda_bus_id'))} "
            f"nvml:{short_uuid(d.get('nvml_uuid_by_bus'))} {agree} data:{data}" + ("" if ctx in ("ok", "-") else f" ctx:{ctx}")
        )
    for o, u in want_uuid.items():
        got = devs.get(o, {}).get("uuid")
        if got != u:
            bad.append(f"o{o} uuid {short_uuid(got)} != {short_uuid(u)}")
    for o, b in want_bus.items():
        got = devs.get(o, {}).get("cuda_bus_id")
        if norm_bus(got) is None or norm_bus(got)[:3] != (norm_bus(b) or (None,))[:3]:
            bad.append(f"o{o} bus {got} != {b}")
    for o, u in want_nvml.items():
        got = devs.get(o, {}).get("nvml_uuid_by_bus")
        if got != u:
            bad.append(f"o{o} nvml-by-bus {short_uuid(got)} != {short_uuid(u)}")
    for o in a.disagree or []:
        if devs.get(o, {}).get("agree", True):
            bad.append(f"o{o} agrees (expected the stale disagreement)")
    if a.consistent and not r.get("all_consistent"):
        bad.append("not all ordinals consistent")
    if a.data_ok and not (r.get("all_data_ok") and r.get("all_ctx_ok")):
        bad.append("data or context check failed")
    if r.get("errors"):
        bad.append("errors: " + "; ".join(r["errors"]))
    for d in devs.values():
        if a.strict_errors and d.get("errors"):
            bad.append(f"o{d['ordinal']} errors: " + "; ".join(d["errors"]))
    print(" | ".join(seen) + ("" if not bad else "  MISMATCH: " + "; ".join(bad)))
    return 1 if bad else 0


def cmd_torch(a):
    r = load_json(a.file)
    seen = (
        f"{r.get('device')} uuid={short_uuid(r.get('cuda_uuid'))} bus={r.get('cuda_bus_id')} "
        f"data={'ok' if r.get('data_ok') else 'BAD'} work={'ok' if r.get('work_ok') else 'BAD'}"
    )
    bad = []
    if not r.get("data_ok"):
        bad.append("tensor data changed")
    if not r.get("work_ok"):
        bad.append("new GPU work failed")
    if a.uuid and r.get("cuda_uuid") != a.uuid:
        bad.append(f"uuid {short_uuid(r.get('cuda_uuid'))} != {short_uuid(a.uuid)}")
    if r.get("error"):
        bad.append("error: " + r["error"])
    print(seen + ("" if not bad else "  MISMATCH: " + "; ".join(bad)))
    return 1 if bad else 0


NCCL_BUS = re.compile(r"busId ([0-9a-fA-F]+)")


def nccl_bus_ids(directory, rank):
    """Every busId NCCL logged for `rank` (NCCL_DEBUG_FILE=DIR/nccl-rank<r>.<pid>.log)."""
    ids = []
    for name in sorted(os.listdir(directory)):
        if name.startswith(f"nccl-rank{rank}.") and name.endswith(".log"):
            with open(os.path.join(directory, name), errors="replace") as f:
                for line in f:
                    ids.extend(m.group(1).lower() for m in NCCL_BUS.finditer(line))
    return ids


def cmd_nccl(a):
    want_uuid = parse_pairs(a.uuid, "--uuid")
    want_bus = parse_pairs(a.bus, "--bus")
    smi = {}
    for line in (a.smi or "").splitlines():
        parts = line.split()
        if len(parts) >= 3 and norm_bus(parts[2]) is not None:
            smi[norm_bus(parts[2])[:3]] = parts[1]
    seen, bad = [], []
    for rank in range(a.ranks):
        path = os.path.join(a.dir, f"report-rank{rank}-{a.round}.json")
        try:
            with open(path) as f:
                r = json.load(f)
        except (OSError, ValueError) as e:
            seen.append(f"r{rank}: no report ({e.__class__.__name__})")
            bad.append(f"rank {rank} wrote no report")
            continue
        ids = nccl_bus_ids(a.dir, rank)
        nccl_bus = ids[0] if ids else None
        bus = r.get("cuda_bus_id")
        owner = smi.get((norm_bus(bus) or (None, None, None))[:3])
        agree = owner is not None and owner == r.get("cuda_uuid")
        seen.append(
            f"r{rank}:{short_uuid(r.get('cuda_uuid'))}@{short_bus(bus)} nvml:{short_uuid(owner)} "
            f"agree={'y' if agree else 'n'} nccl_busId={nccl_bus} sum={r.get('allreduce')} "
            f"data={'ok' if r.get('data_ok') else 'BAD'}" + (f" error={r['error'][:160]}" if r.get("error") else "")
        )
        if r.get("error"):
            bad.append(f"rank {rank}: {r['error'][:200]}")
        if not r.get("data_ok"):
            bad.append(f"rank {rank}: tensor data changed")
        if not r.get("allreduce_ok"):
            bad.append(f"rank {rank}: all-reduce gave {r.get('allreduce')}, expected {r.get('allreduce_expected')}")
        if smi and not agree:
            bad.append(f"rank {rank}: NVML places {bus} on {short_uuid(owner)}, CUDA says {short_uuid(r.get('cuda_uuid'))}")
        if rank in want_uuid and r.get("cuda_uuid") != want_uuid[rank]:
            bad.append(f"rank {rank}: uuid {short_uuid(r.get('cuda_uuid'))} != {short_uuid(want_uuid[rank])}")
        if rank in want_bus:
            want_int = nccl_bus_int(want_bus[rank])
            if nccl_bus is None or want_int is None or int(nccl_bus, 16) != want_int:
                bad.append(f"rank {rank}: NCCL busId {nccl_bus} != {want_int:x} ({want_bus[rank]})" if want_int is not None
                           else f"rank {rank}: bad expected bus {want_bus[rank]}")
    print(" | ".join(seen) + ("" if not bad else "  MISMATCH: " + "; ".join(bad)))
    return 1 if bad else 0


def plugin_lines(path, pattern=None):
    """(timestamp or None, text) of each line of a CRIU log that the plugin wrote."""
    rx = re.compile(pattern, re.I) if pattern else None
    out = []
    try:
        with open(path, errors="replace") as f:
            for raw in f:
                m = CRIU_LINE.match(raw.rstrip("\n"))
                ts, text = (float(m.group(1)), m.group(2)) if m else (None, raw.rstrip("\n"))
                if PLUGIN_TAG in text and (rx is None or rx.search(text)):
                    out.append((ts, text))
    except OSError:
        pass
    return out


def phase_seconds(log, phase):
    """Seconds the plugin spent in its checkpoint (dump log) or restore (restore log) phase for all
    processes together, from its own timing lines:
      1. `driver checkpoint of N CUDA process(es) took X s` / `driver restore of N ... took X s` (the
         driver's part of the parallel batch), else `checkpoint of N ... took X s` / `restore of N ...`
         (the whole batch, as older plugins log it);
      2. else the longest per-process driver call (`cuCheckpointProcessCheckpoint X s` /
         `cuCheckpointProcessRestore ... X s`);
      3. else, by CRIU's timestamps, the span from the first to the last plugin line naming the
         phase.
    None when the log has none of these."""
    lines = plugin_lines(log)
    # `driver checkpoint of N ... took` first: the driver's part alone (the batch's line also counts the staging
    # pages' write or fill, which have timing lines of their own); older plugins log only the batch's line.
    for pattern in (rf"\bdriver {phase} of \d+ .*?took ([0-9.]+) ?s", rf"\b{phase} of \d+ .*?took ([0-9.]+) ?s"):
        batch = re.compile(pattern, re.I)
        for _ts, text in lines:
            m = batch.search(text)
            if m:
                return float(m.group(1))
    call = re.compile(rf"cuCheckpointProcess{phase}\b[^;]*?([0-9]+\.[0-9]+) ?s", re.I)
    calls = [float(m.group(1)) for _ts, text in lines for m in [call.search(text)] if m]
    if calls:
        return max(calls)
    stamped = [ts for ts, text in lines if ts is not None and phase in text.lower()]
    if len(stamped) >= 2:
        return stamped[-1] - stamped[0]
    return None


def cmd_phase(a):
    v = phase_seconds(a.log, a.phase)
    print("n/a" if v is None else f"{v:.3f}")
    return 0


def cmd_identity_times(a):
    """Issue 6 asks for the dump-side scan and the restore-side rewrite time per process: from the
    engine's `identity: ... in X s (total ...)` (dump) and `identity reconciliation: N site(s)
    rewritten ..., X s` (restore) lines."""
    scan = re.compile(r"identity: .*? in ([0-9.]+) s \(total")
    rewrite = re.compile(r"identity reconciliation: (\d+) site\(s\) rewritten .*?([0-9.]+) s")
    scans = [m.group(1) for _t, text in plugin_lines(a.dump_log) for m in [scan.search(text)] if m]
    rewrites = [f"{m.group(2)}s({m.group(1)} sites)" for _t, text in plugin_lines(a.restore_log)
                for m in [rewrite.search(text)] if m]
    print(f"scan {'/'.join(s + 's' for s in scans) or 'n/a'} rewrite {'/'.join(rewrites) or 'n/a'}")
    return 0


def cmd_plugin_lines(a):
    for ts, text in plugin_lines(a.log, a.regex):
        print(f"({ts:.6f}) {text}" if ts is not None else text)
    return 0


def cmd_plugin_error(a):
    """The plugin's first error line, else CRIU's first `Error` line: what a refused restore said."""
    # ERROR lines of the plugin carry `Error: `; else any line of it that sounds like a refusal
    # (not the DEBUG echo of CRIU's command line, whose paths may contain those words).
    mine = plugin_lines(a.log, r"Error: ") or [
        l for l in plugin_lines(a.log, r"error|refus|preflight|cannot|fail") if "command line" not in l[1]
    ]
    if mine:
        print(mine[0][1][:300])
        return 0
    try:
        with open(a.log, errors="replace") as f:
            for raw in f:
                if "Error" in raw or "error" in raw:
                    print(raw.strip()[:300])
                    return 0
    except OSError as e:
        print(f"no log: {e}")
    return 1


def cmd_ratio(a):
    try:
        par, s1, s2 = float(a.parallel), float(a.first), float(a.second)
    except ValueError:
        print("n/a")
        return 0
    if s1 + s2 <= 0:
        print("n/a")
        return 0
    print(f"{par / (s1 + s2):.2f}")
    return 0


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("gpus").set_defaults(fn=cmd_gpus)

    r = sub.add_parser("report")
    r.add_argument("file")
    r.add_argument("--uuid", action="append", help="ORDINAL=UUID expected from cuDeviceGetUuid_v2")
    r.add_argument("--bus", action="append", help="ORDINAL=BUS expected from cuDeviceGetPCIBusId")
    r.add_argument("--nvml-by-bus", action="append", help="ORDINAL=UUID expected from NVML by that bus id")
    r.add_argument("--disagree", action="append", type=int, help="ORDINAL expected to disagree (stale)")
    r.add_argument("--consistent", action="store_true", help="every ordinal: CUDA bus id, attributes, UUID and NVML agree")
    r.add_argument("--data-ok", action="store_true", help="device data and contexts intact")
    r.add_argument("--strict-errors", action="store_true", help="any per-ordinal error fails")
    r.set_defaults(fn=cmd_report)

    t = sub.add_parser("torch")
    t.add_argument("file")
    t.add_argument("--uuid")
    t.set_defaults(fn=cmd_torch)

    n = sub.add_parser("nccl")
    n.add_argument("dir")
    n.add_argument("--ranks", type=int, default=2)
    n.add_argument("--round", type=int, default=1)
    n.add_argument("--uuid", action="append", help="RANK=UUID expected")
    n.add_argument("--bus", action="append", help="RANK=BUS expected in NCCL's busId")
    n.add_argument("--smi", help="output of `gpu_check.py gpus`, to check CUDA's bus id against NVML")
    n.set_defaults(fn=cmd_nccl)

    s = sub.add_parser("phase")
    s.add_argument("log")
    s.add_argument("phase", choices=["checkpoint", "restore"])
    s.set_defaults(fn=cmd_phase)

    it = sub.add_parser("identity-times")
    it.add_argument("dump_log")
    it.add_argument("restore_log")
    it.set_defaults(fn=cmd_identity_times)

    pl = sub.add_parser("plugin-lines")
    pl.add_argument("log")
    pl.add_argument("regex", nargs="?")
    pl.set_defaults(fn=cmd_plugin_lines)

    pe = sub.add_parser("plugin-error")
    pe.add_argument("log")
    pe.set_defaults(fn=cmd_plugin_error)

    ra = sub.add_parser("ratio")
    ra.add_argument("parallel")
    ra.add_argument("first")
    ra.add_argument("second")
    ra.set_defaults(fn=cmd_ratio)

    a = p.parse_args()
    sys.exit(a.fn(a) or 0)


if __name__ == "__main__":
    main()
