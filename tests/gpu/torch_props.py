#!/usr/bin/env python3
"""A PyTorch process that reads its device properties before the dump (PyTorch keeps that
cudaDeviceProp for the life of the process) and holds a tensor; each round it reports what torch
says about the GPU now, next to what libcuda and NVML say.

Protocol in --dir D: D/ready (pid), then per round k: waits for D/go<k>, writes D/report<k>.json, D/done<k>.
"""
import argparse, ctypes, json, os, time

p = argparse.ArgumentParser()
p.add_argument("--dir", required=True)
p.add_argument("--mib", type=int, default=64)
p.add_argument("--rounds", type=int, default=1)
a = p.parse_args()

import torch

props = torch.cuda.get_device_properties(0)
x = torch.full((a.mib << 18,), 7.0, device="cuda")
torch.cuda.synchronize()


def write(name, text):
    tmp = os.path.join(a.dir, name + ".tmp")
    with open(tmp, "w") as f:
        f.write(text)
    os.rename(tmp, os.path.join(a.dir, name))


def driver_uuid():
    cu = ctypes.CDLL("libcuda.so.1")
    dev, b = ctypes.c_int(), (ctypes.c_ubyte * 16)()
    if cu.cuDeviceGet(ctypes.byref(dev), 0) or cu.cuDeviceGetUuid_v2(b, dev):
        return "error"
    h = bytes(b).hex()
    return f"GPU-{h[0:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


write("ready", f"{os.getpid()}\n")
for k in range(1, a.rounds + 1):
    while not os.path.exists(os.path.join(a.dir, f"go{k}")):
        time.sleep(0.02)
    p = torch.cuda.get_device_properties(0)
    r = {
        "pid": os.getpid(),
        "round": k,
        "torch_uuid": "GPU-" + str(p.uuid),
        "torch_pci": f"{p.pci_domain_id:04x}:{p.pci_bus_id:02x}:{p.pci_device_id:02x}.0",
        "driver_uuid": driver_uuid(),
        "data_ok": bool((x == 7.0).all().item()),
        "work_ok": float((x[:1024] * 2).sum().item()) == 14.0 * 1024,
    }
    write(f"report{k}.json", json.dumps(r) + "\n")
    write(f"done{k}", "")
