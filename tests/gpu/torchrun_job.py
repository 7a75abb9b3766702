#!/usr/bin/env python3
"""A tiny deterministic training job for torchrun (issue 25, tests/gpu/runtimes.sh torchrun-*): two ranks on the one
GPU (cuda:0 for both; gloo, since NCCL refuses two ranks on one GPU), under torchrun's non-CUDA elastic agent,
checkpointed between two phases with the ranks' TCP connections (gloo's pairs, the rendezvous store) established.

    torchrun --nnodes 1 --nproc-per-node 2 --rdzv-backend static --master-addr 127.0.0.1 --master-port P \\
        torchrun_job.py --ctl DIR --steps1 N1 --steps2 N2 [--seed S]

Determinism: fixed seeds (the model's the same on every rank, the data per rank), torch.use_deterministic_algorithms
(True) and CUBLAS_WORKSPACE_CONFIG=:4096:8 (set by the caller; checked here); gradients are summed with gloo's
all_reduce (two ranks: one order). Losses are written as float.hex(), so "equal" means bit for bit.

Protocol in --ctl DIR (every file opened and closed at once: no fd into DIR stays open, so CRIU may dump the ranks
between the phases; the files are carried with the checkpoint):
  losses-rank<r>.txt            one line per step: `STEP HEX FLOAT` (the global loss, all-reduced)
  phase1-rank<r>.json           after step N1: the parameters' and a sentinel tensor's sha256, the GPU's identity
                                (libcuda's UUID and PCI bus id, NVML's GPU at that bus id, torch's device properties)
  ready1-rank<r>                then each rank waits for
  go2                           (from the test), checks that the parameters and the sentinel are unchanged, records
                                the identity again, runs steps N1+1..N1+N2 (new GPU work, collectives over the
                                restored connections) and writes
  final-rank<r>.json            identity after, data_ok, work_ok, the losses' sha256, the final parameters' sha256
  report-rank<r>.json           the same in tests/gpu/gpu_check.py's `torch` form (device, cuda_uuid, cuda_bus_id,
                                data_ok, work_ok, error)
  done-rank<r>
Without the checkpoint (go2 made at the start) the same job is the uninterrupted reference run.
"""

import argparse
import ctypes
import hashlib
import json
import os
import sys
import time
import traceback

POLL_S = 0.05


def write_atomic(directory, name, text):
    tmp = os.path.join(directory, f".{name}.tmp")
    with open(tmp, "w") as f:
        f.write(text)
    os.rename(tmp, os.path.join(directory, name))


def append_line(path, line):
    with open(path, "a") as f:
        f.write(line + "\n")


def uuid_str(raw):
    h = bytes(raw).hex()
    return f"GPU-{h[0:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def identity(torch, dev):
    """What libcuda, NVML (by libcuda's bus id) and torch's cached device properties say about the current GPU."""
    out = {}
    try:
        cu = ctypes.CDLL("libcuda.so.1")
        d = ctypes.c_int()
        if cu.cuCtxGetDevice(ctypes.byref(d)) == 0:
            bus = ctypes.create_string_buffer(64)
            raw = (ctypes.c_ubyte * 16)()
            if cu.cuDeviceGetPCIBusId(bus, 64, d) == 0 and cu.cuDeviceGetUuid_v2(raw, d) == 0:
                out["cuda_uuid"], out["cuda_bus_id"] = uuid_str(raw), bus.value.decode()
    except OSError as e:
        out["cuda_error"] = str(e)
    try:
        nv = ctypes.CDLL("libnvidia-ml.so.1")
        if nv.nvmlInit_v2() == 0:
            h = ctypes.c_void_p()
            if "cuda_bus_id" in out and nv.nvmlDeviceGetHandleByPciBusId_v2(out["cuda_bus_id"].encode(), ctypes.byref(h)) == 0:
                buf = ctypes.create_string_buffer(96)
                if nv.nvmlDeviceGetUUID(h, buf, 96) == 0:
                    out["nvml_uuid_by_bus"] = buf.value.decode()
            else:
                out["nvml_uuid_by_bus"] = "NOT_FOUND"
            nv.nvmlShutdown()
    except OSError as e:
        out["nvml_error"] = str(e)
    p = torch.cuda.get_device_properties(dev)
    out["torch_uuid"] = "GPU-" + str(p.uuid)
    out["torch_pci"] = f"{p.pci_domain_id:04x}:{p.pci_bus_id:02x}:{p.pci_device_id:02x}.0"
    out["torch_name"] = p.name
    return out


def agrees(ident):
    """CUDA's UUID, NVML's GPU at CUDA's bus id and torch's UUID and PCI location name one GPU."""
    u = ident.get("cuda_uuid")
    return (
        u is not None
        and ident.get("nvml_uuid_by_bus") == u
        and ident.get("torch_uuid") == u
        and (ident.get("cuda_bus_id") or "").lower() == ident.get("torch_pci", "").lower()
    )


def sha(tensors):
    """sha256 of the tensors' bytes (copied to the host; no numpy needed)."""
    h = hashlib.sha256()
    for t in tensors:
        c = t.detach().to("cpu").contiguous()
        h.update(ctypes.string_at(c.data_ptr(), c.numel() * c.element_size()))
    return h.hexdigest()


def main():
    os.closerange(3, os.sysconf("SC_OPEN_MAX"))  # nothing of the launcher's may stay open
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--ctl", required=True)
    p.add_argument("--steps1", type=int, default=40)
    p.add_argument("--steps2", type=int, default=40)
    p.add_argument("--seed", type=int, default=1234)
    a = p.parse_args()
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    ctl = a.ctl
    if os.environ.get("CUBLAS_WORKSPACE_CONFIG") not in (":4096:8", ":16:8"):
        sys.exit("torchrun_job: set CUBLAS_WORKSPACE_CONFIG=:4096:8 (deterministic cuBLAS)")

    import torch
    import torch.distributed as dist

    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False
    dev = torch.device("cuda:0")
    torch.cuda.set_device(dev)
    dist.init_process_group("gloo", rank=rank, world_size=world)

    torch.manual_seed(a.seed)  # the same model on every rank
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1)).to(dev)
    g = torch.Generator().manual_seed(a.seed + 1 + rank)  # this rank's data
    x = torch.randn(512, 32, generator=g).to(dev)
    y = (x[:, :1] * 0.5 - x[:, 1:2].pow(2) * 0.25).detach()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    sentinel = torch.remainder(torch.arange(1 << 18, device=dev, dtype=torch.int64), 65521).to(torch.int32) + rank
    losses = os.path.join(ctl, f"losses-rank{rank}.txt")

    def step(k):
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        for prm in model.parameters():
            dist.all_reduce(prm.grad)
            prm.grad.div_(world)
        opt.step()
        total = loss.detach().clone()
        dist.all_reduce(total)
        v = float(total.item()) / world
        append_line(losses, f"{k} {v.hex()} {v:.9g}")

    def params_sha():
        return sha(list(model.parameters()) + list(opt.state_dict()["state"][0].values()))

    report = {"rank": rank, "pid": os.getpid(), "device": str(dev), "data_ok": False, "work_ok": False, "error": None}
    try:
        for k in range(1, a.steps1 + 1):
            step(k)
        torch.cuda.synchronize()
        before = identity(torch, dev)
        phase1 = {"params_sha": params_sha(), "sentinel_sha": sha([sentinel]), "identity": before, "step": a.steps1}
        write_atomic(ctl, f"phase1-rank{rank}.json", json.dumps(phase1, indent=1))
        write_atomic(ctl, f"ready1-rank{rank}", f"{os.getpid()}\n")
        while not os.path.exists(os.path.join(ctl, "go2")):
            time.sleep(POLL_S)
        after = identity(torch, dev)
        data_ok = params_sha() == phase1["params_sha"] and sha([sentinel]) == phase1["sentinel_sha"]
        for k in range(a.steps1 + 1, a.steps1 + a.steps2 + 1):
            step(k)
        z = torch.ones(1 << 20, device=dev).sum()
        w = (torch.eye(256, device=dev) @ torch.full((256, 256), 2.0, device=dev)).sum()
        torch.cuda.synchronize()
        work_ok = float(z) == float(1 << 20) and float(w) == 2.0 * 256 * 256
        with open(losses, "rb") as f:
            losses_sha = hashlib.sha256(f.read()).hexdigest()
        report.update(
            data_ok=data_ok,
            work_ok=work_ok,
            cuda_uuid=after.get("cuda_uuid"),
            cuda_bus_id=after.get("cuda_bus_id"),
            identity_before=before,
            identity_after=after,
            identity_agrees=agrees(after),
            losses_sha=losses_sha,
            final_params_sha=params_sha(),
            steps=a.steps1 + a.steps2,
        )
    except Exception as e:  # the report must be written whatever failed
        report["error"] = f"{e.__class__.__name__}: {e}"
        traceback.print_exc()
    write_atomic(ctl, f"final-rank{rank}.json", json.dumps(report, indent=1))
    write_atomic(ctl, f"report-rank{rank}.json", json.dumps(report, indent=1))
    write_atomic(ctl, f"done-rank{rank}", "")
    try:
        dist.destroy_process_group()
    except Exception:  # noqa: BLE001 (the job's result is written; teardown errors change nothing)
        pass
    return 0 if report["error"] is None else 1


if __name__ == "__main__":
    sys.exit(main())
