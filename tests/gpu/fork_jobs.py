#!/usr/bin/env python3
"""Deterministic jobs with forked or spawned children for tests/gpu/fork-workers.sh (issue 40).

  fork_jobs.py SHAPE --steps N --log FILE [--pause-at K] [--sleep S]

SHAPE:
  dl-fork-pin     torch training (a small MLP, Adam, fixed seed, deterministic algorithms) fed by a DataLoader with
                  2 persistent workers, pin_memory=True, the default start method (fork on Linux); the workers are
                  created after CUDA init (the model is on the GPU and one CUDA op ran before the first iter())
  dl-fork-nopin   the same with pin_memory=False
  dl-forkserver   the same (pin_memory=True) with multiprocessing_context='forkserver'
  dl-spawn        the same (pin_memory=True) with multiprocessing_context='spawn'
  pool-fork       the same training; each step's batch comes from multiprocessing.get_context('fork').Pool(2),
                  created after CUDA init (CPU work only in the pool: the rows of the batch)
  bare-fork       the same training without workers; after CUDA init the process os.fork()s a child that only
                  waits (for FILE.release, which the parent writes 5 steps before the end) and exits 7; the parent
                  reaps it with os.waitpid and logs `child_exit=<code>` before `done`
  c-fork          bare-fork without torch: libcuda through ctypes (a 16 KiB state buffer updated every step and
                  16 MiB of patterned device memory), for small images (cross-machine moves); runs on a python3
                  without torch
  c-uvm           c-fork without the fork, plus 64 MiB of managed memory (cuMemAllocManaged, attached globally)
                  written on the GPU and read by the host every step: driver 580's checkpoint refuses managed memory
                  (CUDA_ERROR_NOT_SUPPORTED), so the job check must not say ready and the dump must leave it running
  mps             the training loop without workers, meant to run as an MPS client (the test starts the daemon)
  tr-dl           one rank of a torchrun job (issue 46): run by torchrun (RANK, WORLD_SIZE, LOCAL_RANK from it),
                  DDP over NCCL when the job has one rank, over gloo when several ranks share the one GPU (NCCL
                  refuses two ranks on one GPU), the model and its data on cuda:0, fed by a DataLoader of
                  --workers forked workers (pin_memory=True) created after CUDA init; rank 0 logs the all-reduced
                  loss and the parameters' hash (DDP keeps them equal on every rank), the others log to FILE.rankN

--extra-managed SIZES (c-uvm): more managed allocations of those byte sizes, for the probe of what they map.

FILE gets, every step, `step=i loss=<repr of the float>`; at step K (--pause-at) also `ready step=K` (the test
dumps after that line) and the job goes on; at the end `identity uuid=... bus=...` (c-fork only: what libcuda
names after a move; the torch shapes: torch's device properties), then `done params_sha256=<hex>` (the parameters' bytes; c-fork: the device buffers'), and
exit 0. Each line is one open/append/close: no fd of FILE stays open between steps. --sleep (default 0.2 s) paces
the steps so that a dump lands mid-run; a reference run uses --sleep 0 (the results do not depend on it).
Inherited fds above stdio are closed first (CRIU cannot dump fds of the launcher's files).
"""

import argparse
import hashlib
import math
import os
import random
import struct
import sys
import time

D_IN = 64
HIDDEN = 256
BATCH = 32
EPOCH_BATCHES = 8  # the dataset is 8 batches long: the persistent workers feed several epochs
SHAPES = (
    "dl-fork-pin", "dl-fork-8w", "dl-fork-nopin", "dl-forkserver", "dl-spawn", "pool-fork", "bare-fork", "c-fork", "c-uvm",
    "mps", "tr-dl",
)
CHILD_EXIT = 7


def close_inherited_fds():
    os.closerange(3, os.sysconf("SC_OPEN_MAX"))


class Log:
    def __init__(self, path):
        self.path = path

    def __call__(self, line):
        with open(self.path, "a") as f:
            f.write(line + "\n")


# ---------------------------------------------------------------------------------------------------------------
# Data: top-level and picklable (spawn and forkserver workers unpickle them); no torch import at module level, so
# that a spawned child or the forkserver imports this file cheaply and c-fork runs without torch.


class SynthDataset:
    """Sample i: x = 64 normal values from a generator seeded by i (CPU), y = a fixed function of x."""

    def __len__(self):
        return BATCH * EPOCH_BATCHES

    def __getitem__(self, i):
        import torch

        g = torch.Generator().manual_seed(1000 + i)
        x = torch.randn(D_IN, generator=g)
        y = (x[:8].sum() + torch.sin(x[8:16]).sum() - 0.5 * x[16:24].abs().sum()).reshape(1)
        return x, y


def pool_rows(job):
    """Half a batch, computed in a Pool worker without torch: (list of x rows, list of y)."""
    batch, half = job
    xs, ys = [], []
    for k in range(BATCH // 2):
        r = random.Random(7919 * (batch * BATCH + half * (BATCH // 2) + k) + 17)
        x = [r.gauss(0.0, 1.0) for _ in range(D_IN)]
        xs.append(x)
        ys.append([sum(x[:8]) + sum(math.sin(v) for v in x[8:16]) - 0.5 * sum(abs(v) for v in x[16:24])])
    return xs, ys


def child_wait(release, parent):
    """A forked child of a CUDA process: touches no CUDA, waits for the release file, exits CHILD_EXIT (9 when its
    parent went away first)."""
    while not os.path.exists(release):
        if os.getppid() != parent:
            os._exit(9)
        time.sleep(0.05)
    os._exit(CHILD_EXIT)


# ---------------------------------------------------------------------------------------------------------------
# Torch training


def params_sha256(model):
    h = hashlib.sha256()
    for p in model.parameters():
        t = p.detach().to("cpu").contiguous().view(-1)
        try:
            b = t.numpy().tobytes()
        except Exception:  # noqa: BLE001 - torch without numpy: the same bytes through floats
            b = struct.pack("<%df" % t.numel(), *t.tolist())
        h.update(b)
    return h.hexdigest()


def mlp(torch, dev):
    """The training's model: a small MLP on `dev` (the same for every shape, seeded by the caller)."""
    return torch.nn.Sequential(
        torch.nn.Linear(D_IN, HIDDEN),
        torch.nn.ReLU(),
        torch.nn.Linear(HIDDEN, HIDDEN),
        torch.nn.ReLU(),
        torch.nn.Linear(HIDDEN, 1),
    ).to(dev)


def log_result(torch, log, digest):
    """The last two lines: what the process's CUDA names its GPU after a move (torch's cached properties, which the
    plugin rewrites), then the parameters' hash."""
    prop = torch.cuda.get_device_properties(0)
    pci = [getattr(prop, k, 0) for k in ("pci_domain_id", "pci_bus_id", "pci_device_id")]
    log("identity uuid=GPU-%s bus=%04x:%02x:%02x.0" % (prop.uuid, pci[0], pci[1], pci[2]))
    log("done params_sha256=%s" % digest)


def torch_job(a, log):
    # Before torch initialises cuBLAS.
    os.environ["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"
    import torch

    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    dev = torch.device("cuda:0")
    model = mlp(torch, dev)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    # CUDA (and cuBLAS) initialised before any worker exists: the workers below are forked after CUDA init.
    with torch.no_grad():
        model(torch.zeros(1, D_IN, device=dev))
    torch.cuda.synchronize()

    shape = a.shape
    pin = shape in ("dl-fork-pin", "dl-fork-8w", "dl-forkserver", "dl-spawn")
    child = None
    release = a.log + ".release"
    pool = None
    loader = None
    if shape.startswith("dl-"):
        ctx = {"dl-forkserver": "forkserver", "dl-spawn": "spawn"}.get(shape)
        loader = torch.utils.data.DataLoader(
            SynthDataset(),
            batch_size=BATCH,
            shuffle=False,
            # dl-fork-8w: eight workers, for the claims' cost per process (docs/BENCHMARKS.md).
            num_workers=8 if shape == "dl-fork-8w" else 2,
            persistent_workers=True,
            pin_memory=pin,
            multiprocessing_context=ctx,
        )
        it = iter(loader)

        def next_batch(step):
            nonlocal it
            try:
                return next(it)
            except StopIteration:
                it = iter(loader)  # a new epoch: the persistent workers go on
                return next(it)

    elif shape == "pool-fork":
        import multiprocessing

        pool = multiprocessing.get_context("fork").Pool(2)

        def next_batch(step):
            b = (step - 1) % EPOCH_BATCHES
            parts = pool.map(pool_rows, [(b, 0), (b, 1)])
            xs = [row for p in parts for row in p[0]]
            ys = [row for p in parts for row in p[1]]
            return torch.tensor(xs, dtype=torch.float32), torch.tensor(ys, dtype=torch.float32)

    else:  # bare-fork, mps: the batches made in this process
        ds = SynthDataset()

        def next_batch(step):
            b = (step - 1) % EPOCH_BATCHES
            items = [ds[b * BATCH + k] for k in range(BATCH)]
            return torch.stack([x for x, _ in items]), torch.stack([y for _, y in items])

        if shape == "bare-fork":
            parent = os.getpid()
            child = os.fork()
            if child == 0:
                child_wait(release, parent)

    for step in range(1, a.steps + 1):
        x, y = next_batch(step)
        x = x.to(dev, non_blocking=pin)
        y = y.to(dev, non_blocking=pin)
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        log("step=%d loss=%r" % (step, loss.item()))
        if step == a.pause_at:
            log("ready step=%d" % step)
        if child is not None and step == max(1, a.steps - 5):
            open(release, "w").close()
        if a.sleep > 0:
            time.sleep(a.sleep)

    if child is not None:
        if not os.path.exists(release):
            open(release, "w").close()
        _, status = os.waitpid(child, 0)
        log("child_exit=%d" % os.waitstatus_to_exitcode(status))
    if pool is not None:
        pool.close()
        pool.join()
    torch.cuda.synchronize()
    digest = params_sha256(model)
    if loader is not None:
        del it
        del loader
    log_result(torch, log, digest)
    return 0


class RankDataset(SynthDataset):
    """A rank's share: the samples of SynthDataset shifted by the rank (every rank trains on its own data).
    `epoch_batches`: its length in batches (tr-dl --epoch-batches): longer than the run, no epoch ends while a
    checkpoint may be taken (the workers of a rank with more workers than batches come and go at an epoch's end)."""

    def __init__(self, rank, epoch_batches=EPOCH_BATCHES):
        self.rank = rank
        self.epoch_batches = epoch_batches

    def __len__(self):
        return BATCH * self.epoch_batches

    def __getitem__(self, i):
        return SynthDataset.__getitem__(self, i + 7 * BATCH * self.rank)


def torchrun_job(a, log):
    """tr-dl: one rank of a torchrun job (see the module's docstring)."""
    os.environ["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"
    import torch
    import torch.distributed as dist

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if rank != 0:
        log = Log(a.log + ".rank%d" % rank)
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    dev = torch.device("cuda:0")
    torch.cuda.set_device(dev)
    backend = "nccl" if world == 1 else "gloo"
    dist.init_process_group(backend)
    model = mlp(torch, dev)
    ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[0] if backend == "nccl" else None)
    opt = torch.optim.Adam(ddp.parameters(), lr=1e-3)
    with torch.no_grad():
        model(torch.zeros(1, D_IN, device=dev))
    torch.cuda.synchronize()
    loader = torch.utils.data.DataLoader(
        RankDataset(rank, a.epoch_batches), batch_size=BATCH, shuffle=False, num_workers=a.workers, persistent_workers=True,
        pin_memory=True,
    )
    it = iter(loader)
    for step in range(1, a.steps + 1):
        try:
            x, y = next(it)
        except StopIteration:
            it = iter(loader)
            x, y = next(it)
        x, y = x.to(dev, non_blocking=True), y.to(dev, non_blocking=True)
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        log("step=%d loss=%r" % (step, mean.item() / world))
        if step == a.pause_at:
            log("ready step=%d" % step)
        if a.sleep > 0:
            time.sleep(a.sleep)
    torch.cuda.synchronize()
    digest = params_sha256(model)
    dist.barrier()
    del it
    del loader
    log_result(torch, log, digest)
    dist.destroy_process_group()
    return 0


# ---------------------------------------------------------------------------------------------------------------
# c-fork: libcuda through ctypes, no torch


def c_fork_job(a, log):
    import ctypes

    from cuda_ctypes import check, libcuda, primary_context, u64

    cu = libcuda()
    dev = primary_context(cu)
    n_state = 4096  # 16 KiB, updated every step
    n_ballast = 4 << 20  # 16 MiB of a pattern, read back at the end
    state, ballast = u64(), u64()
    check("cuMemAlloc", cu.cuMemAlloc_v2(ctypes.byref(state), n_state * 4))
    check("cuMemAlloc", cu.cuMemAlloc_v2(ctypes.byref(ballast), n_ballast * 4))
    check("cuMemsetD32", cu.cuMemsetD32_v2(state, 1, n_state))
    check("cuMemsetD32", cu.cuMemsetD32_v2(ballast, 0x5EED0001, n_ballast))
    managed, n_managed = u64(), 16 << 20  # c-uvm: 64 MiB of managed memory
    if a.shape == "c-uvm":
        check("cuMemAllocManaged", cu.cuMemAllocManaged(ctypes.byref(managed), n_managed * 4, 1))  # CU_MEM_ATTACH_GLOBAL
        check("cuMemsetD32", cu.cuMemsetD32_v2(managed.value, 0x0C0FFEE0, n_managed))
        for size in a.extra_managed:
            extra = u64()
            check("cuMemAllocManaged", cu.cuMemAllocManaged(ctypes.byref(extra), size, 1))
            check("cuMemsetD8", cu.cuMemsetD8_v2(extra.value, 0x5A, size))
    check("cuCtxSynchronize", cu.cuCtxSynchronize())
    host = (ctypes.c_uint32 * n_state)()

    release = a.log + ".release"
    parent = os.getpid()
    child = os.fork() if a.shape == "c-fork" else -1
    if child == 0:
        child_wait(release, parent)

    for step in range(1, a.steps + 1):
        check("cuMemcpyDtoH", cu.cuMemcpyDtoH_v2(host, state, n_state * 4))
        for i in range(n_state):
            host[i] = (host[i] * 1103515245 + 12345 + step * i) & 0xFFFFFFFF
        check("cuMemcpyHtoD", cu.cuMemcpyHtoD_v2(state, host, n_state * 4))
        if managed.value:
            # The host reads and writes the managed words the GPU wrote (page migration both ways).
            view = (ctypes.c_uint32 * 1024).from_address(managed.value + (step % 64) * 4096)
            view[step % 1024] ^= host[step % n_state]
            check("cuMemsetD32", cu.cuMemsetD32_v2(managed.value + (step % 64) * 4096 + 4096 * 64, step, 1024))
        check("cuCtxSynchronize", cu.cuCtxSynchronize())
        log("step=%d loss=%r" % (step, sum(host) / (n_state * 4294967296.0)))
        if step == a.pause_at:
            log("ready step=%d" % step)
        if step == max(1, a.steps - 5):
            open(release, "w").close()
        if a.sleep > 0:
            time.sleep(a.sleep)

    if not os.path.exists(release):
        open(release, "w").close()
    if child > 0:
        _, status = os.waitpid(child, 0)
        log("child_exit=%d" % os.waitstatus_to_exitcode(status))
    big = (ctypes.c_uint32 * n_ballast)()
    check("cuMemcpyDtoH", cu.cuMemcpyDtoH_v2(big, ballast, n_ballast * 4))
    check("cuMemcpyDtoH", cu.cuMemcpyDtoH_v2(host, state, n_state * 4))
    h = hashlib.sha256()
    h.update(bytes(host))
    h.update(bytes(big))
    if managed.value:
        h.update(bytes((ctypes.c_uint32 * n_managed).from_address(managed.value)))
    bus = ctypes.create_string_buffer(64)
    uuid = (ctypes.c_ubyte * 16)()
    check("cuDeviceGetPCIBusId", cu.cuDeviceGetPCIBusId(bus, 64, dev))
    check("cuDeviceGetUuid_v2", cu.cuDeviceGetUuid_v2(uuid, dev))
    u = bytes(uuid).hex()
    log("identity uuid=GPU-%s-%s-%s-%s-%s bus=%s" % (u[0:8], u[8:12], u[12:16], u[16:20], u[20:32], bus.value.decode()))
    log("done params_sha256=%s" % h.hexdigest())
    return 0


def main():
    close_inherited_fds()
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("shape", choices=SHAPES)
    p.add_argument("--steps", type=int, required=True)
    # --logfile: under torchrun, whose own options --log-dir and --logs-specs make --log ambiguous to its parser.
    p.add_argument("--log", "--logfile", dest="log", required=True)
    p.add_argument("--pause-at", type=int, default=0)
    p.add_argument("--sleep", type=float, default=0.2)
    p.add_argument("--extra-managed", type=lambda t: [int(x) for x in t.split(",") if x], default=[],
                   help="c-uvm: more managed allocations of these byte sizes (comma-separated), for the probe")
    p.add_argument("--workers", type=int, default=2, help="tr-dl: DataLoader workers per rank")
    p.add_argument("--epoch-batches", type=int, default=EPOCH_BATCHES, help="tr-dl: a rank's epoch, in batches")
    a = p.parse_args()
    a.log = os.path.abspath(a.log)
    log = Log(a.log)
    try:
        if a.shape in ("c-fork", "c-uvm"):
            return c_fork_job(a, log)
        if a.shape == "tr-dl":
            return torchrun_job(a, log)
        return torch_job(a, log)
    except Exception as e:  # noqa: BLE001 - the test reads what failed
        log("error %s: %s" % (type(e).__name__, e))
        raise


if __name__ == "__main__":
    sys.exit(main())
