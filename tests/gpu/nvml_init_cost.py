"""How long NVML takes to answer one GPU's free memory, by init flavour, each in a fresh process
(issue 24 item 8: the restore's init waits for exactly this). Prints one line per flavour: median and
range of 7 runs, in ms."""
import ctypes, subprocess, sys, time, statistics

CHILD = r'''
import ctypes, time, sys
t0 = time.perf_counter()
nv = ctypes.CDLL("libnvidia-ml.so.1")
t1 = time.perf_counter()
flags = int(sys.argv[1])
rc = nv.nvmlInitWithFlags(ctypes.c_uint(flags)) if flags >= 0 else nv.nvmlInit_v2()
t2 = time.perf_counter()
h = ctypes.c_void_p()
rc2 = nv.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(h))
class Mem(ctypes.Structure):
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]
m = Mem()
rc3 = nv.nvmlDeviceGetMemoryInfo(h, ctypes.byref(m))
t3 = time.perf_counter()
print(f"{(t1-t0)*1e3:.2f} {(t2-t1)*1e3:.2f} {(t3-t2)*1e3:.2f} {rc} {rc2} {rc3} {m.free}")
'''
for name, flags in [("nvmlInit_v2", -1), ("nvmlInitWithFlags(0)", 0), ("nvmlInitWithFlags(NO_ATTACH=2)", 2)]:
    rows = []
    for _ in range(7):
        out = subprocess.run([sys.executable, "-c", CHILD, str(flags)], capture_output=True, text=True).stdout.split()
        rows.append([float(x) for x in out[:3]] + out[3:])
    for i, what in enumerate(["dlopen", "init", "handle+memory"]):
        v = [r[i] for r in rows]
        print(f"{name:32s} {what:14s} median {statistics.median(v):7.2f} ms  ({min(v):.2f}-{max(v):.2f})")
    tot = [r[0] + r[1] + r[2] for r in rows]
    print(f"{name:32s} {'total':14s} median {statistics.median(tot):7.2f} ms  rc={rows[0][3:6]}")
