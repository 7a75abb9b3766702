#!/usr/bin/env python3
"""A PyTorch process for the benchmark: a tensor on one CUDA device plus a chosen amount of host
memory, half pinned (page-locked through CUDA, `pin_memory=True`) and half pageable, every byte
written (untouched pages would not be dumped and would flatter CRIU's numbers).

Protocol in --dir D (no fd into D stays open, so CRIU can dump the process at any time):
  D/ready             its pid, once stage 1 is in place
  D/go<k>, k >= 2     switch to stage k (frees stage k-1 first), then write D/ready<k>
  D/verify            check the device tensor and every host buffer, run new GPU work, write
                      D/report.json, then exit
Stages come from --host-mib (e.g. 1024,4096,16384: MiB of host memory per stage).
"""

import argparse
import json
import os
import sys
import time
import traceback

POLL_S = 0.02


def write_atomic(directory, name, data):
    tmp = os.path.join(directory, f".{name}.tmp")
    with open(tmp, "w") as f:
        f.write(data)
    os.rename(tmp, os.path.join(directory, name))


def host_buffers(torch, mib, seed):
    """mib MiB of host memory: half pinned, half pageable, each filled with its own byte."""
    half = (mib << 20) // 2
    pinned = torch.empty(half, dtype=torch.uint8, pin_memory=True)
    pinned.fill_((seed * 7 + 1) % 251 + 1)
    pageable = torch.empty(half, dtype=torch.uint8)
    pageable.fill_((seed * 13 + 2) % 251 + 1)
    return [pinned, pageable]


def buffers_ok(torch, bufs, seed):
    want = [(seed * 7 + 1) % 251 + 1, (seed * 13 + 2) % 251 + 1]
    return all(bool(torch.all(b == w)) for b, w in zip(bufs, want))


def main():
    os.closerange(3, os.sysconf("SC_OPEN_MAX"))
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dir", required=True)
    p.add_argument("--device", default="cuda:0")
    p.add_argument("--device-mib", type=int, default=256)
    p.add_argument("--host-mib", default="1024", help="MiB of host memory per stage, comma-separated")
    p.add_argument("--timeout", type=float, default=900.0, help="exit when no trigger comes for this long")
    a = p.parse_args()
    stages = [int(x) for x in a.host_mib.split(",") if x.strip()]

    import torch

    dev = torch.device(a.device)
    torch.cuda.set_device(dev)
    n = (a.device_mib << 20) // 4
    data = torch.arange(n, dtype=torch.int32, device=dev) % 65521
    t0 = time.time()
    bufs = host_buffers(torch, stages[0], 1)
    torch.cuda.synchronize()
    print(f"torch_hostmem[{os.getpid()}]: stage 1 ({stages[0]} MiB host) in {time.time() - t0:.2f} s", flush=True)
    write_atomic(a.dir, "ready", f"{os.getpid()}\n")

    stage = 1
    deadline = time.time() + a.timeout
    while time.time() < deadline:
        nxt = os.path.join(a.dir, f"go{stage + 1}")
        if stage < len(stages) and os.path.exists(nxt):
            stage += 1
            bufs = None  # free the previous stage before allocating the next
            # PyTorch caches freed pinned blocks; give them back so each stage holds only its own.
            getattr(torch._C, "_host_emptyCache", lambda: None)()
            t0 = time.time()
            bufs = host_buffers(torch, stages[stage - 1], stage)
            print(f"torch_hostmem: stage {stage} ({stages[stage - 1]} MiB host) in {time.time() - t0:.2f} s", flush=True)
            write_atomic(a.dir, f"ready{stage}", f"{os.getpid()}\n")
            deadline = time.time() + a.timeout
        elif os.path.exists(os.path.join(a.dir, "verify")):
            report = {"pid": os.getpid(), "stage": stage, "data_ok": False, "host_ok": False, "work_ok": False,
                      "error": None}
            try:
                report["data_ok"] = bool(torch.equal(data, torch.arange(n, dtype=torch.int32, device=dev) % 65521))
                report["host_ok"] = buffers_ok(torch, bufs, stage)
                x = torch.randn(1024, 1024, device=dev)
                report["work_ok"] = bool(torch.isfinite((x @ x.T).trace()))
                torch.cuda.synchronize()
            except Exception as e:  # the report must be written whatever failed
                report["error"] = f"{e.__class__.__name__}: {e}"
                traceback.print_exc()
            write_atomic(a.dir, "report.json", json.dumps(report))
            return 0
        else:
            time.sleep(POLL_S)
    print("torch_hostmem: no trigger before the timeout; exiting", flush=True)
    return 1


if __name__ == "__main__":
    sys.exit(main())
