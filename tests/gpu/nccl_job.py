#!/usr/bin/env python3
"""A 2-rank PyTorch + NCCL job for the GPU tests, as one process tree (a parent and its ranks)
that CRIU dumps and restores whole.

NCCL is never set up before the dump: each rank holds a tensor and waits. On the trigger
D/go<k> every rank checks its tensor, reports the device identity its libcuda gives, then
creates the NCCL process group, runs an all-reduce of (rank + 1) and destroys the group. So
NCCL sees only the restored (possibly remapped) process, as in a job restarted after migration.

Variants (--variant):
  a  every rank sees every GPU and uses cuda:<rank> (torchrun in a pod; the seed's setup)
  b  every rank sees only its own GPU (CUDA_VISIBLE_DEVICES=<its UUID>) and uses cuda:0

Files in --dir D: ready-rank<r> (pid), report-rank<r>-<k>.json, done-rank<r>-<k>, rank<r>.log,
NCCL's log nccl-rank<r>.<pid>.log (NCCL_DEBUG=INFO). The parent writes D/parent.pid.
"""

import argparse
import ctypes
import datetime
import json
import os
import subprocess
import sys
import time
import traceback

POLL_S = 0.02
MODULUS = 65521


def write_atomic(directory, name, data):
    tmp = os.path.join(directory, f".{name}.tmp")
    with open(tmp, "w") as f:
        f.write(data)
    os.rename(tmp, os.path.join(directory, name))


def wait_for(directory, name):
    path = os.path.join(directory, name)
    while not os.path.exists(path):
        time.sleep(POLL_S)


def cuda_identity():
    cu = ctypes.CDLL("libcuda.so.1")
    dev = ctypes.c_int()
    if cu.cuCtxGetDevice(ctypes.byref(dev)) != 0:
        return None, None
    bus = ctypes.create_string_buffer(64)
    uuid = (ctypes.c_ubyte * 16)()
    if cu.cuDeviceGetPCIBusId(bus, 64, dev) != 0 or cu.cuDeviceGetUuid_v2(uuid, dev) != 0:
        return None, None
    b = bytes(uuid).hex()
    return f"GPU-{b[0:8]}-{b[8:12]}-{b[12:16]}-{b[16:20]}-{b[20:32]}", bus.value.decode()


def parent(a):
    """Starts the ranks (each its own process, stdio to files) and waits for them."""
    write_atomic(a.dir, "parent.pid", f"{os.getpid()}\n")
    uuids = a.uuids.split(",") if a.uuids else []
    if a.variant == "b" and len(uuids) < a.ranks:
        print("nccl_job: variant b needs --uuids with one GPU UUID per rank", file=sys.stderr)
        return 2
    children = []
    for rank in range(a.ranks):
        env = dict(os.environ)
        env["NCCL_DEBUG"] = "INFO"
        env["NCCL_DEBUG_FILE"] = os.path.join(a.dir, f"nccl-rank{rank}.%p.log")
        env.setdefault("NCCL_NVLS_ENABLE", "0")
        if a.variant == "b":
            env["CUDA_VISIBLE_DEVICES"] = uuids[rank]
        else:
            env.pop("CUDA_VISIBLE_DEVICES", None)
        log = open(os.path.join(a.dir, f"rank{rank}.log"), "w")
        cmd = [sys.executable, os.path.abspath(__file__), "--rank", str(rank), "--dir", a.dir, "--variant", a.variant,
               "--ranks", str(a.ranks), "--mib", str(a.mib), "--rounds", str(a.rounds)]
        children.append(subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                         close_fds=True))
        # The child has its own copy; the parent keeps no fd into D while CRIU dumps the tree.
        log.close()
    rc = 0
    for c in children:
        rc = max(rc, c.wait())
    return rc


def rank_main(a):
    import torch
    import torch.distributed as dist

    dev = torch.device(f"cuda:{a.rank}" if a.variant == "a" else "cuda:0")
    torch.cuda.set_device(dev)
    n = a.mib * (1 << 20) // 4
    seed = 7000 + a.rank

    def pattern():
        return torch.remainder(torch.arange(n, dtype=torch.int64, device=dev), MODULUS).to(torch.int32) + seed

    data = pattern()
    torch.cuda.synchronize()
    write_atomic(a.dir, f"ready-rank{a.rank}", f"{os.getpid()}\n")
    print(f"rank {a.rank} [{os.getpid()}]: ready on {dev}", flush=True)

    for k in range(1, a.rounds + 1):
        wait_for(a.dir, f"go{k}")
        expected = float(sum(r + 1 for r in range(a.ranks)))
        report = {"rank": a.rank, "pid": os.getpid(), "round": k, "device": str(dev),
                  "visible": os.environ.get("CUDA_VISIBLE_DEVICES"), "data_ok": False, "allreduce": None,
                  "allreduce_expected": expected, "allreduce_ok": False, "error": None}
        try:
            report["data_ok"] = bool(torch.equal(data, pattern()))
            report["cuda_uuid"], report["cuda_bus_id"] = cuda_identity()
            started = time.monotonic()
            dist.init_process_group("nccl", init_method=f"file://{os.path.join(a.dir, f'store{k}')}", rank=a.rank,
                                    world_size=a.ranks, timeout=datetime.timedelta(seconds=a.timeout))
            x = torch.full((1 << 16,), float(a.rank + 1), device=dev)
            dist.all_reduce(x)
            torch.cuda.synchronize()
            report["allreduce"] = float(x[0])
            report["allreduce_ok"] = bool(torch.all(x == expected))
            report["nccl_seconds"] = round(time.monotonic() - started, 3)
            dist.destroy_process_group()
        except Exception as e:  # the report must be written whatever failed
            report["error"] = f"{e.__class__.__name__}: {e}"
            traceback.print_exc()
        write_atomic(a.dir, f"report-rank{a.rank}-{k}.json", json.dumps(report, indent=2))
        write_atomic(a.dir, f"done-rank{a.rank}-{k}", "")
        print(f"rank {a.rank}: round {k}: {report}", flush=True)
    return 0


def main():
    os.closerange(3, os.sysconf("SC_OPEN_MAX"))  # see torch_workload.py: CRIU must dump us
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dir", required=True)
    p.add_argument("--variant", choices=["a", "b"], default="a")
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--uuids", help="GPU UUIDs, one per rank, comma-separated (variant b)")
    p.add_argument("--mib", type=int, default=128)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--timeout", type=int, default=90, help="NCCL process group timeout, seconds")
    p.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.rank is None:
        return parent(a)
    return rank_main(a)


if __name__ == "__main__":
    sys.exit(main())
