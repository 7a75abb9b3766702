#!/usr/bin/env python3
"""Framework jobs for tests/gpu/ipc-refuse.sh (issue 34): trees that share device memory the way real jobs do,
and single processes that hold the memory kinds that share nothing (so must not be refused).

  share_jobs.py torch-mp DIR        a torch.multiprocessing parent that sends a 256 MiB CUDA tensor to a spawned
                                    child (the child imports it through CUDA IPC)
  share_jobs.py cupy-pair DIR       a CuPy parent that opens its child's 4 MiB allocation with
                                    cupy.cuda.runtime.ipcOpenMemHandle (the parent imports)
  share_jobs.py expandable DIR      torch with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, 256 MiB
  share_jobs.py graph DIR           torch with a captured CUDA graph, replayed every round
  share_jobs.py nccl1 DIR           a one-rank NCCL communicator (file store), all_reduce every round

Every process writes DIR/<role>.pid once set up, then DIR/<role>.log gets a line every 250 ms:
`ok round=N own=V peer=V` while the memory it reads holds what was written (`peer` is the imported memory, 0
when there is none), or `bad ...` / the exception's text. The loops never end by themselves: what a process does
after a refused or a restored checkpoint is what the test looks at. No fd of DIR stays open between lines (CRIU
dumps the process between them), and inherited fds are closed first.
"""

import os
import sys
import time

ROUND_S = 0.25
OWN = 5
PEER = 7


def close_inherited_fds():
    os.closerange(3, os.sysconf("SC_OPEN_MAX"))


def say(d, role, line):
    with open(os.path.join(d, role + ".log"), "a") as f:
        f.write(line + "\n")


def ready(d, role):
    with open(os.path.join(d, role + ".pid.tmp"), "w") as f:
        f.write(str(os.getpid()))
    os.rename(os.path.join(d, role + ".pid.tmp"), os.path.join(d, role + ".pid"))


def loop(d, role, read_own, read_peer=lambda: 0):
    n = 0
    while True:
        n += 1
        try:
            own, peer = read_own(), read_peer()
            good = own == OWN and peer in (0, PEER)
            say(d, role, "%s round=%d own=%s peer=%s" % ("ok" if good else "bad", n, own, peer))
        except Exception as e:  # noqa: BLE001 - the test reads what failed
            say(d, role, "error round=%d %s: %s" % (n, type(e).__name__, e))
        time.sleep(ROUND_S)


def torch_mp_child(d, q):
    import torch

    t = q.get()  # imported through CUDA IPC (torch's storage sharing: cudaIpcOpenMemHandle)
    own = torch.full((1 << 18,), OWN, dtype=torch.int32, device="cuda:0")
    ready(d, "child")
    loop(d, "child", lambda: int(own[-1].item()), lambda: int(t[-1].item()))


def torch_mp(d):
    import torch
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    t = torch.full((64 << 20,), PEER, dtype=torch.int32, device="cuda:0")  # 256 MiB
    child = ctx.Process(target=torch_mp_child, args=(d, q), daemon=False)
    child.start()
    q.put(t)
    ready(d, "parent")
    loop(d, "parent", lambda: OWN if int(t[-1].item()) == PEER else -1)


def cupy_child(d, conn):
    import cupy

    a = cupy.full((1 << 20,), PEER, dtype=cupy.int32)  # 4 MiB
    conn.send(bytes(cupy.cuda.runtime.ipcGetMemHandle(a.data.ptr)))
    conn.close()
    ready(d, "child")
    loop(d, "child", lambda: OWN if int(a[-1]) == PEER else -1)


def cupy_pair(d):
    import multiprocessing as mp

    import cupy

    ctx = mp.get_context("spawn")
    ours, theirs = ctx.Pipe()
    child = ctx.Process(target=cupy_child, args=(d, theirs), daemon=False)
    child.start()
    handle = ours.recv()
    ours.close()
    ptr = cupy.cuda.runtime.ipcOpenMemHandle(handle)
    peer = cupy.ndarray((1 << 20,), dtype=cupy.int32, memptr=cupy.cuda.MemoryPointer(cupy.cuda.UnownedMemory(ptr, 4 << 20, None), 0))
    own = cupy.full((1 << 18,), OWN, dtype=cupy.int32)
    ready(d, "parent")
    loop(d, "parent", lambda: int(own[-1]), lambda: int(peer[-1]))


def expandable(d):
    os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    import torch

    own = [torch.full((16 << 20,), OWN, dtype=torch.int32, device="cuda:0") for _ in range(4)]  # 4 x 64 MiB
    ready(d, "main")
    loop(d, "main", lambda: min(int(t[-1].item()) for t in own))


def graph(d):
    import torch

    x = torch.full((1 << 20,), 2, dtype=torch.int32, device="cuda:0")
    y = torch.zeros_like(x)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        y.copy_(x + 3)  # warm-up outside the capture
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y.copy_(x + 3)

    def replay():
        y.zero_()
        g.replay()
        torch.cuda.synchronize()
        return int(y[-1].item())

    ready(d, "main")
    loop(d, "main", replay)


def nccl1(d):
    import torch
    import torch.distributed as dist

    store = os.path.join(d, "store")
    dist.init_process_group("nccl", init_method="file://" + store, rank=0, world_size=1)
    t = torch.zeros((1 << 20,), dtype=torch.int32, device="cuda:0")

    def reduce():
        t.fill_(OWN)
        dist.all_reduce(t)
        torch.cuda.synchronize()
        return int(t[-1].item())

    reduce()
    ready(d, "main")
    loop(d, "main", reduce)


def main():
    close_inherited_fds()
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    mode, d = sys.argv[1], sys.argv[2]
    os.makedirs(d, exist_ok=True)
    jobs = {"torch-mp": torch_mp, "cupy-pair": cupy_pair, "expandable": expandable, "graph": graph, "nccl1": nccl1}
    if mode not in jobs:
        print("unknown mode %s\n%s" % (mode, __doc__), file=sys.stderr)
        return 2
    jobs[mode](d)
    return 0


if __name__ == "__main__":
    sys.exit(main())
