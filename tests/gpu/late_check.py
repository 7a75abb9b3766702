#!/usr/bin/env python3
"""Checks a late_nccl.py report after a cross-machine restore (tests/gpu/container.sh).

  late_check.py REPORT NEW_UUID OLD_UUID NEW_BUS

Prints one line for the results table; exits 1 when the restored process does not name the new
GPU in every view, lost its data, or NCCL failed after the restore.
"""

import json
import sys


def main():
    path, new, old, bus = sys.argv[1:5]
    r = json.load(open(path))
    bad = []
    if r.get("error"):
        bad.append(r["error"].splitlines()[0])
    if r.get("cuda_uuid") != new:
        bad.append(f"cuDeviceGetUuid {r.get('cuda_uuid')} != {new}")
    if (r.get("cuda_bus") or "").lower() != bus.lower():
        bad.append(f"cuDeviceGetPCIBusId {r.get('cuda_bus')} != {bus}")
    if r.get("nvml_uuid_at_cuda_bus") != new:
        bad.append(f"NVML by CUDA's bus id: {r.get('nvml_uuid_at_cuda_bus')}")
    if not r.get("data_ok"):
        bad.append("device data not intact")
    nccl = r.get("nccl") or {}
    if not nccl.get("nccl_all_reduce_ok"):
        bad.append("NCCL all-reduce after the restore failed")
    if (r.get("before_dump") or {}).get("cuda_uuid") != old:
        bad.append(f"dumped on {(r.get('before_dump') or {}).get('cuda_uuid')}, not on {old}")
    if bad:
        print("; ".join(bad))
        return 1
    print(
        f"pid {r['pid']}: dumped on {old[:12]}, now {new[:12]} by cuDeviceGetUuid, bus {bus}, NVML by that bus "
        f"{new[:12]}; data intact; NCCL 1-rank all-reduce OK after the restore ({nccl.get('seconds')} s, torch "
        f"{nccl.get('torch_version')})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
