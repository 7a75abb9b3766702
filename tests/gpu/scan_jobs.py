#!/usr/bin/env python3
"""Processes for tests/gpu/scan-cost.sh (issue 41 part 2): what the dump's identity scan costs on real shapes.

  scan_jobs.py SHAPE --dir DIR

SHAPE:
  llm      torch with a transformers causal LM (GPT-2 small's shape, random weights from a fixed seed: the machine
           has no model hub), bf16 on cuda:0, greedy `generate` of 32 tokens with the KV cache; then waits.
           Falls back to a torch-only transformer stack when transformers is missing (the `model` line says which).
  tenant   the issue's reproduction: a CUDA process (libcuda through ctypes, 64 MiB of device memory) that maps
           32 000 private writable MAP_NORESERVE chunks of 64 MiB (2 TiB of virtual memory, never touched)

Writes DIR/ready once set up (with `rss_kib=` and `vm_kib=`), then waits for DIR/go; after it (a restore, or a
leave-running dump) runs the same work again and writes DIR/done with `same=1` when the results equal the first
ones (llm: the generated token ids; tenant: the device buffer's bytes) and the GPU's identity as libcuda names it.
Inherited fds above stdio are closed first.
"""

import argparse
import hashlib
import os
import sys
import time


def write_atomic(d, name, text):
    tmp = os.path.join(d, "." + name)
    with open(tmp, "w") as f:
        f.write(text)
    os.rename(tmp, os.path.join(d, name))


def wait_go(d):
    while not os.path.exists(os.path.join(d, "go")):
        time.sleep(0.05)


def status_kib(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return -1


def llm(d):
    import torch

    torch.manual_seed(1234)
    try:
        from transformers import GPT2Config, GPT2LMHeadModel

        model = GPT2LMHeadModel(GPT2Config(n_layer=12, n_embd=768, n_head=12, vocab_size=50257))
        kind = "transformers GPT2LMHeadModel (12 layers, 768 wide, random weights)"

        def run():
            ids = torch.arange(1, 17, device="cuda:0").reshape(1, 16)
            out = model.generate(ids, max_new_tokens=32, do_sample=False, use_cache=True, pad_token_id=0)
            return out.cpu().tolist()

    except ImportError:
        layer = torch.nn.TransformerEncoderLayer(768, 12, batch_first=True)
        model = torch.nn.TransformerEncoder(layer, 12)
        kind = "torch TransformerEncoder (transformers missing)"

        def run():
            x = torch.randn(1, 48, 768, generator=torch.Generator().manual_seed(5)).to("cuda:0", torch.bfloat16)
            return model(x).float().sum().item()

    model = model.to("cuda:0", torch.bfloat16).eval()
    with torch.no_grad():
        first = run()
        torch.cuda.synchronize()
        write_atomic(d, "ready", "model=%s\nrss_kib=%d\nvm_kib=%d\n" % (kind, status_kib("VmRSS"), status_kib("VmSize")))
        wait_go(d)
        again = run()
        torch.cuda.synchronize()
    write_atomic(d, "done", "same=%d\nmodel=%s\nuuid=%s\n" % (int(first == again), kind, torch.cuda.get_device_properties(0).uuid))


def tenant(d):
    import ctypes
    import mmap

    from cuda_ctypes import check, libcuda, primary_context, u64

    cu = libcuda()
    primary_context(cu)
    buf = u64()
    n = 16 << 20
    check("cuMemAlloc", cu.cuMemAlloc_v2(ctypes.byref(buf), n * 4))
    check("cuMemsetD32", cu.cuMemsetD32_v2(buf, 0x7E4A47, n))
    check("cuCtxSynchronize", cu.cuCtxSynchronize())

    def digest():
        host = (ctypes.c_uint32 * n)()
        check("cuMemcpyDtoH", cu.cuMemcpyDtoH_v2(host, buf, n * 4))
        return hashlib.sha256(bytes(host)).hexdigest()

    first = digest()
    chunks = []
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_NORESERVE", 0x4000)
    for _ in range(32000):
        chunks.append(mmap.mmap(-1, 64 << 20, flags=flags, prot=mmap.PROT_READ | mmap.PROT_WRITE))
    write_atomic(d, "ready", "chunks=%d\nrss_kib=%d\nvm_kib=%d\n" % (len(chunks), status_kib("VmRSS"), status_kib("VmSize")))
    wait_go(d)
    write_atomic(d, "done", "same=%d\nrss_kib=%d\n" % (int(first == digest()), status_kib("VmRSS")))


def main():
    os.closerange(3, os.sysconf("SC_OPEN_MAX"))
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("shape", choices=("llm", "tenant"))
    p.add_argument("--dir", required=True)
    a = p.parse_args()
    {"llm": llm, "tenant": tenant}[a.shape](os.path.abspath(a.dir))
    # Stay until killed: the script reads `done` and ends the process.
    while True:
        time.sleep(1)


if __name__ == "__main__":
    sys.exit(main())
