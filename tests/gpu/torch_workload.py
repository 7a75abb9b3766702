#!/usr/bin/env python3
"""A PyTorch process for the GPU tests: holds a tensor with a known pattern on one CUDA device
and, on each trigger, checks it and runs new GPU work.

Protocol in --dir D (like ccm-sample-workload; no fd into D stays open, so CRIU can dump the
process between rounds):
  D/ready                    its pid, once the tensor is on the device
  D/go<k>   (from the test)  run round k
  D/report<k>.json, D/done<k>
It exits after --rounds rounds.
"""

import argparse
import ctypes
import json
import os
import sys
import time
import traceback

POLL_S = 0.02
# The pattern: position-dependent, different per --seed, exactly representable in int32.
MODULUS = 65521


def close_inherited_fds():
    """Inherited fds CRIU cannot restore (the launcher's files on other mounts) would fail the
    dump; nothing of ours is open yet."""
    os.closerange(3, os.sysconf("SC_OPEN_MAX"))


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
    """What this process's libcuda says about its current device: (uuid, bus id) through the
    driver API, the values a remapped restore can leave stale."""
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


# The pattern is made and checked CHUNK elements (256 MiB of int32) at a time: made whole, its int64 temporaries
# take about four times the tensor's size on the device, torch's caching allocator keeps them reserved, and the
# driver's checkpoint copies all of it to the host (issue 47's first KV run failed its dumps so, most likely).
CHUNK = 1 << 26


def pattern(torch, start, n, seed, device):
    return torch.remainder(torch.arange(start, start + n, dtype=torch.int64, device=device), MODULUS).to(torch.int32) + seed


def pieces(n):
    """(start, length) of each CHUNK-sized piece of n elements."""
    return ((start, min(CHUNK, n - start)) for start in range(0, n, CHUNK))


def fill_pattern(torch, t, n, seed):
    for start, m in pieces(n):
        t[start:start + m] = pattern(torch, start, m, seed, t.device)


def has_pattern(torch, t, n, seed):
    return all(torch.equal(t[start:start + m], pattern(torch, start, m, seed, t.device)) for start, m in pieces(n))


def main():
    close_inherited_fds()
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--dir", required=True)
    p.add_argument("--mib", type=int, default=256)
    p.add_argument("--device", default="cuda:0")
    p.add_argument("--seed", type=int, default=1000)
    p.add_argument("--rounds", type=int, default=1)
    # A KV-cache-like allocation (issue 47's benchmark): --kv-mib of device memory of which only the first
    # --kv-written-mib are written (a pattern of another seed), the rest never touched.
    p.add_argument("--kv-mib", type=int, default=0)
    p.add_argument("--kv-written-mib", type=int, default=0)
    a = p.parse_args()

    import torch  # after closing fds: importing opens nothing that must survive

    dev = torch.device(a.device)
    torch.cuda.set_device(dev)
    n = a.mib * (1 << 20) // 4
    data = torch.empty(n, dtype=torch.int32, device=dev)
    fill_pattern(torch, data, n, a.seed)
    kv, kv_n = None, a.kv_written_mib * (1 << 20) // 4
    if a.kv_mib > 0:
        kv = torch.empty(a.kv_mib * (1 << 20) // 4, dtype=torch.int32, device=dev)
        fill_pattern(torch, kv, kv_n, a.seed + 1)
    torch.cuda.synchronize()
    # What the driver will copy at the checkpoint: the tensors, not the pattern's temporaries.
    torch.cuda.empty_cache()
    reserved = torch.cuda.memory_reserved(dev) >> 20
    write_atomic(a.dir, "ready", f"{os.getpid()}\n")
    print(f"torch_workload[{os.getpid()}]: ready, {a.mib} MiB (+ {a.kv_mib} MiB KV, {a.kv_written_mib} written) on {dev}; torch holds {reserved} MiB of device memory", flush=True)

    for k in range(1, a.rounds + 1):
        wait_for(a.dir, f"go{k}")
        report = {"pid": os.getpid(), "round": k, "device": str(dev), "data_ok": False, "work_ok": False, "error": None}
        try:
            report["data_ok"] = has_pattern(torch, data, n, a.seed)
            if kv is not None:
                report["data_ok"] = report["data_ok"] and has_pattern(torch, kv, kv_n, a.seed + 1)
            x = torch.randn(2048, 2048, device=dev)
            y = (x @ x.T).trace()
            z = torch.ones(1 << 20, device=dev).sum()
            torch.cuda.synchronize()
            report["work_ok"] = bool(torch.isfinite(y)) and float(z) == float(1 << 20)
            report["cuda_uuid"], report["cuda_bus_id"] = cuda_identity()
            # PyTorch's own cached cudaDeviceProp (issue 6's stretch goal); informational only.
            props = torch.cuda.get_device_properties(dev)
            pci = [getattr(props, n, None) for n in ("pci_domain_id", "pci_bus_id", "pci_device_id")]
            report["torch_pci"] = None if None in pci else "{:04x}:{:02x}:{:02x}".format(*pci)
        except Exception as e:  # the report must be written whatever failed
            report["error"] = f"{e.__class__.__name__}: {e}"
            traceback.print_exc()
        write_atomic(a.dir, f"report{k}.json", json.dumps(report, indent=2))
        write_atomic(a.dir, f"done{k}", "")
        print(f"torch_workload[{os.getpid()}]: round {k}: {report}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
