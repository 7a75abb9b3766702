#!/usr/bin/env python3
"""A small CUDA process for cross-machine and container runs: libcuda through ctypes only, so its
CRIU image stays small (no framework is loaded before the dump), and PyTorch + NCCL are loaded
only AFTER the restore, in the restored process itself, as in a job that sets up NCCL after it
was migrated.

Protocol in --dir D (no fd into D stays open, so CRIU can dump it between rounds):
  D/ready                its pid (as the process sees it), once the data is on the GPU
  D/go<k>   (the test)   run round k: check the data, report every identity view; in round
                         --nccl-round also import torch and run a 1-rank NCCL all-reduce
  D/report<k>.json, D/done<k>
It exits after --rounds rounds. Standard library only (the GPU machine has no registry).
"""

import argparse
import ctypes
import json
import os
import sys
import time
import traceback

POLL_S = 0.02
PATTERN = 0x5EED1234


def cuda():
    lib = ctypes.CDLL("libcuda.so.1")

    def call(name, *args):
        r = getattr(lib, name)(*args)
        if r != 0:
            raise RuntimeError(f"{name} failed: CUresult {r}")

    return lib, call


def nvml_uuid_at(bus):
    """NVML's nvmlDeviceGetHandleByPciBusId_v2(bus) -> UUID, or the error."""
    try:
        nv = ctypes.CDLL("libnvidia-ml.so.1")
        r = nv.nvmlInit_v2()
        if r != 0:
            return f"error: nvmlInit_v2 {r}"
        h = ctypes.c_void_p()
        r = nv.nvmlDeviceGetHandleByPciBusId_v2(bus.encode(), ctypes.byref(h))
        if r != 0:
            return f"error: nvmlDeviceGetHandleByPciBusId_v2({bus}) returned {r}" + (" (Not Found)" if r == 6 else "")
        buf = ctypes.create_string_buffer(96)
        r = nv.nvmlDeviceGetUUID(h, buf, 96)
        return buf.value.decode() if r == 0 else f"error: nvmlDeviceGetUUID {r}"
    except OSError as e:
        return f"error: {e}"


def uuid_text(raw):
    h = bytes(raw).hex()
    return f"GPU-{h[0:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def identity(lib, call, dev):
    bus = ctypes.create_string_buffer(32)
    call("cuDeviceGetPCIBusId", bus, 32, dev)
    raw = (ctypes.c_ubyte * 16)()
    call("cuDeviceGetUuid_v2", raw, dev)
    bus_text = bus.value.decode()
    return {"cuda_bus": bus_text, "cuda_uuid": uuid_text(raw), "nvml_uuid_at_cuda_bus": nvml_uuid_at(bus_text)}


def nccl_all_reduce():
    t0 = time.time()
    import torch
    import torch.distributed as dist

    torch.cuda.set_device(0)
    path = f"/tmp/late-nccl-{os.getpid()}-{time.time_ns()}"
    dist.init_process_group("nccl", init_method=f"file://{path}", rank=0, world_size=1)
    t = torch.full((1024,), 3.0, device="cuda:0")
    dist.all_reduce(t)
    torch.cuda.synchronize()
    ok = bool((t == 3.0).all().item())
    props = torch.cuda.get_device_properties(0)
    dist.destroy_process_group()
    return {
        "nccl_all_reduce_ok": ok,
        "torch_version": torch.__version__,
        "torch_props_uuid": "GPU-" + str(getattr(props, "uuid", "")),
        "seconds": round(time.time() - t0, 3),
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", required=True)
    ap.add_argument("--mib", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--nccl-round", type=int, default=0, help="round in which torch + NCCL run (0: never)")
    a = ap.parse_args()
    lib, call = cuda()
    call("cuInit", 0)
    dev = ctypes.c_int()
    call("cuDeviceGet", ctypes.byref(dev), 0)
    ctx = ctypes.c_void_p()
    call("cuDevicePrimaryCtxRetain", ctypes.byref(ctx), dev)
    call("cuCtxSetCurrent", ctx)
    n = a.mib << 18
    dptr = ctypes.c_uint64()
    call("cuMemAlloc_v2", ctypes.byref(dptr), ctypes.c_size_t(n * 4))
    call("cuMemsetD32_v2", dptr, ctypes.c_uint(PATTERN), ctypes.c_size_t(n))
    call("cuCtxSynchronize")
    before = identity(lib, call, dev)
    with open(os.path.join(a.dir, "ready"), "w") as f:
        f.write(str(os.getpid()))
    for k in range(1, a.rounds + 1):
        go = os.path.join(a.dir, f"go{k}")
        while not os.path.exists(go):
            time.sleep(POLL_S)
        rep = {"pid": os.getpid(), "round": k, "before_dump": before}
        try:
            probe = (ctypes.c_uint * 1)()
            ok = True
            for off in (0, (n // 2) * 4, (n - 1) * 4):
                call("cuMemcpyDtoH_v2", probe, ctypes.c_uint64(dptr.value + off), ctypes.c_size_t(4))
                ok = ok and probe[0] == PATTERN
            call("cuMemsetD32_v2", dptr, ctypes.c_uint(PATTERN), ctypes.c_size_t(n))
            call("cuCtxSynchronize")
            rep["data_ok"] = ok
            rep["new_work_ok"] = True
            rep.update(identity(lib, call, dev))
            rep["consistent"] = rep["nvml_uuid_at_cuda_bus"] == rep["cuda_uuid"]
            if k == a.nccl_round:
                rep["nccl"] = nccl_all_reduce()
        except Exception as e:  # the report says what failed; the test reads it
            rep["error"] = f"{e}\n{traceback.format_exc()}"
        tmp = os.path.join(a.dir, f".report{k}.json")
        with open(tmp, "w") as f:
            json.dump(rep, f, indent=1)
        os.rename(tmp, os.path.join(a.dir, f"report{k}.json"))
        open(os.path.join(a.dir, f"done{k}"), "w").close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
