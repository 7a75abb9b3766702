#!/usr/bin/env python3
"""Drives NVIDIA's checkpoint API on another process from outside, for tests/gpu/run.sh's
`recover` case: it leaves a process the way an interrupted dump does (LOCKED, or CHECKPOINTED
with its device memory in host memory), so that `criu-cuda-migrate recover` has something to
recover. Standard library only (ctypes on libcuda.so.1).

  ckpt_ctl.py state PID                 prints the process's state (running, locked, checkpointed, failed)
  ckpt_ctl.py lock-checkpoint PID       cuCheckpointProcessLock (10 s timeout), then cuCheckpointProcessCheckpoint
  ckpt_ctl.py unlock PID                cuCheckpointProcessUnlock (a process a failed checkpoint left LOCKED)
  ckpt_ctl.py restore-unlock PID [--no-cuinit]
                                        cuCheckpointProcessRestore onto the same GPUs, then Unlock; prints each
                                        call's time (with --no-cuinit this process never calls cuInit: the driver
                                        documents persistence mode as the alternative)

Exits 1 when a driver call fails (the error name is printed), 2 on bad usage.
"""

import ctypes
import sys
import time

STATES = {0: "running", 1: "locked", 2: "checkpointed", 3: "failed"}


class LockArgs(ctypes.Structure):
    # CUcheckpointLockArgs (cuda.h): 64 bytes.
    _fields_ = [("timeoutMs", ctypes.c_uint), ("reserved0", ctypes.c_uint), ("reserved1", ctypes.c_uint64 * 7)]


class ReservedArgs(ctypes.Structure):
    # CUcheckpointCheckpointArgs (cuda.h): 64 reserved bytes.
    _fields_ = [("reserved", ctypes.c_uint64 * 8)]


def driver(init=True, timed=False):
    cuda = ctypes.CDLL("libcuda.so.1")
    if init:
        t0 = time.monotonic()
        check(cuda, "cuInit", cuda.cuInit(0))
        if timed:
            print(f"cuInit {time.monotonic() - t0:.3f} s")
    return cuda


def check(cuda, call, rc):
    if rc != 0:
        name = ctypes.c_char_p()
        cuda.cuGetErrorName(rc, ctypes.byref(name))
        print(f"{call}: {name.value.decode() if name.value else rc}")
        sys.exit(1)


def state(cuda, pid):
    st = ctypes.c_int(-1)
    check(cuda, "cuCheckpointProcessGetState", cuda.cuCheckpointProcessGetState(pid, ctypes.byref(st)))
    return STATES.get(st.value, f"state {st.value}")


def main(argv):
    flags = argv[3:]
    if (
        len(argv) < 3
        or argv[1] not in ("state", "lock-checkpoint", "unlock", "restore-unlock")
        or not argv[2].isdigit()
        or any(f != "--no-cuinit" for f in flags)
    ):
        print(__doc__.strip(), file=sys.stderr)
        return 2
    cuda = driver(init="--no-cuinit" not in flags, timed=argv[1] == "restore-unlock")
    pid = int(argv[2])
    if argv[1] == "restore-unlock":
        # NULL restore args: onto the same GPUs (cuda.h); zeroed reserved args for the unlock.
        for name, call, args in (
            ("cuCheckpointProcessRestore", cuda.cuCheckpointProcessRestore, None),
            ("cuCheckpointProcessUnlock", cuda.cuCheckpointProcessUnlock, ctypes.byref(ReservedArgs())),
        ):
            t0 = time.monotonic()
            check(cuda, name, call(pid, args))
            print(f"{name} {time.monotonic() - t0:.3f} s")
    if argv[1] == "unlock":
        check(cuda, "cuCheckpointProcessUnlock", cuda.cuCheckpointProcessUnlock(pid, ctypes.byref(ReservedArgs())))
    if argv[1] == "lock-checkpoint":
        lock = LockArgs(timeoutMs=10000)
        check(cuda, "cuCheckpointProcessLock", cuda.cuCheckpointProcessLock(pid, ctypes.byref(lock)))
        ckpt = ReservedArgs()
        check(cuda, "cuCheckpointProcessCheckpoint", cuda.cuCheckpointProcessCheckpoint(pid, ctypes.byref(ckpt)))
    print(state(cuda, pid))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
