#!/usr/bin/env bash
# Facts the framework-cache rewrite and the memory preflight are built on, read off the GPU machine:
# cudaDeviceProp's layout in the installed CUDA headers, which libcudart builds exist, NVML's init and
# memory queries (times, per-process use), /proc/driver/nvidia vs NVML, and where a libcudart program and
# PyTorch keep cudaDeviceProp copies in their memory.
#   bash tests/gpu/probe-props.sh        (writes to $OUT or /tmp/probe)
set -uo pipefail
# No -e: a probe. Each section prints what it finds, or the error, and the next one runs.
OUT=${OUT:-/tmp/probe}; mkdir -p "$OUT"
exec > >(tee "$OUT/probe.txt") 2>&1
PY=$(command -v python3)
echo "== GPU"; nvidia-smi --query-gpu=name,uuid,pci.bus_id,pci.device_id,pci.sub_device_id,memory.total,memory.free,persistence_mode --format=csv
echo "== /proc/driver/nvidia"; for f in /proc/driver/nvidia/gpus/*/information; do echo "$f"; cat "$f"; b=$(basename "$(dirname "$f")"); for k in vendor device subsystem_vendor subsystem_device; do echo "sysfs $k $(cat "/sys/bus/pci/devices/$b/$k" 2>/dev/null)"; done; done
echo "== CUDA headers"; ls -d /usr/local/cuda*/include 2>/dev/null
# shellcheck disable=SC2012 # CUDA's install directories, no odd names; ls's sorted order is the one wanted
INC=$(ls -d /usr/local/cuda/include /usr/local/cuda-*/include 2>/dev/null | head -1); echo "INC=$INC"
echo "== libcudart"; find / -xdev -name 'libcudart.so*' 2>/dev/null | head -20
"$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)' 2>&1 | tail -1
"$PY" -c 'import cupy; print("cupy", cupy.__version__, cupy.cuda.runtime.runtimeGetVersion())' 2>&1 | tail -1
cat > /tmp/layout.c <<'C'
#include <stdio.h>
#include <stddef.h>
#include <cuda_runtime_api.h>
int main(void){ printf("CUDART_VERSION %d sizeof %zu name %zu uuid %zu luid %zu totalGlobalMem %zu pciBusID %zu pciDeviceID %zu pciDomainID %zu major %zu minor %zu multiProcessorCount %zu\n", CUDART_VERSION, sizeof(struct cudaDeviceProp), offsetof(struct cudaDeviceProp,name), offsetof(struct cudaDeviceProp,uuid), offsetof(struct cudaDeviceProp,luid), offsetof(struct cudaDeviceProp,totalGlobalMem), offsetof(struct cudaDeviceProp,pciBusID), offsetof(struct cudaDeviceProp,pciDeviceID), offsetof(struct cudaDeviceProp,pciDomainID), offsetof(struct cudaDeviceProp,major), offsetof(struct cudaDeviceProp,minor), offsetof(struct cudaDeviceProp,multiProcessorCount)); return 0; }
C
gcc -I"$INC" /tmp/layout.c -o /tmp/layout && /tmp/layout
grep -n "cudaGetDeviceProperties" "$INC/cuda_runtime_api.h" | head -5
# A libcudart program: props into a heap struct (a framework's cache), then sleeps for the scan.
CUDART=$(find / -xdev -name 'libcudart.so.13*' 2>/dev/null | head -1); [ -z "$CUDART" ] && CUDART=$(find / -xdev -name 'libcudart.so*' 2>/dev/null | head -1)
echo "CUDART=$CUDART"
cat > /tmp/props.c <<'C'
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
#include <cuda_runtime_api.h>
int main(void){ struct cudaDeviceProp *p = malloc(sizeof *p); int r = cudaGetDeviceProperties(p, 0); void *d; cudaMalloc(&d, 64<<20);
 printf("props rc %d name %s bus %d dev %d dom %d at %p\n", r, p->name, p->pciBusID, p->pciDeviceID, p->pciDomainID, (void*)p); fflush(stdout); sleep(30); return 0; }
C
gcc -I"$INC" /tmp/props.c -o /tmp/props "$CUDART" -Wl,-rpath,"$(dirname "$CUDART")" && { /tmp/props & PROPS=$!; }
"$PY" - <<'PYEOF' &
import torch, time, os
p = torch.cuda.get_device_properties(0); x = torch.ones(1<<26, device="cuda")
print("torch props", p.name, p.pci_bus_id, p.pci_device_id, p.pci_domain_id, p.uuid, flush=True)
open("/tmp/torch.pid","w").write(str(os.getpid())); time.sleep(30)
PYEOF
sleep 12
cat > /tmp/scan.py <<'PYEOF'
import re, sys, struct, ctypes, time, uuid as U
nv = ctypes.CDLL("libnvidia-ml.so.1")
t = time.perf_counter(); r = nv.nvmlInit_v2(); t1 = time.perf_counter()
print(f"nvmlInit_v2 rc {r} {1000*(t1-t):.1f} ms")
h = ctypes.c_void_p(); nv.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(h))
class Mem(ctypes.Structure): _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]
m = Mem(); t = time.perf_counter(); r = nv.nvmlDeviceGetMemoryInfo(h, ctypes.byref(m)); t1 = time.perf_counter()
print(f"memory rc {r} total {m.total} free {m.free} used {m.used} {1000*(t1-t):.2f} ms")
class PI(ctypes.Structure): _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong), ("gpuInstanceId", ctypes.c_uint), ("computeInstanceId", ctypes.c_uint)]
n = ctypes.c_uint(32); arr = (PI*32)(); t = time.perf_counter(); r = nv.nvmlDeviceGetComputeRunningProcesses_v3(h, ctypes.byref(n), arr); t1 = time.perf_counter()
print(f"procs rc {r} n {n.value} {1000*(t1-t):.2f} ms", [(arr[i].pid, arr[i].usedGpuMemory) for i in range(n.value)])
nv.nvmlShutdown()
for flags in (2, 1):
    t = time.perf_counter(); r = nv.nvmlInitWithFlags(flags); t1 = time.perf_counter()
    r2 = nv.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(h)); r3 = nv.nvmlDeviceGetMemoryInfo(h, ctypes.byref(m))
    print(f"nvmlInitWithFlags({flags}) rc {r} {1000*(t1-t):.1f} ms; handle rc {r2} memory rc {r3} free {m.free}"); nv.nvmlShutdown()
name = sys.argv[1].encode(); ub = U.UUID(sys.argv[2][4:]).bytes
dom, bus, rest = sys.argv[3].split(":"); BDD = (int(bus, 16), int(rest.split(".")[0], 16), int(dom, 16))
for pid in sys.argv[4:]:
    pid = int(pid); hits = 0
    maps = [l.split() for l in open(f"/proc/{pid}/maps")]
    with open(f"/proc/{pid}/mem", "rb", 0) as mem:
        for f in maps:
            a, b = (int(x, 16) for x in f[0].split("-")); nm = f[5] if len(f) > 5 else ""
            if "r" not in f[1] or b - a > (1 << 30): continue
            try: mem.seek(a); buf = mem.read(b - a)
            except Exception: continue
            for mo in re.finditer(re.escape(ub), buf):
                o = mo.start(); s = o - 256
                nm_ok = s >= 0 and buf[s:s+len(name)+1] == name + b"\0"
                offs = [off for off in range(272, 1200, 4) if s >= 0 and s + off + 12 <= len(buf) and struct.unpack_from("<3i", buf, s + off) == BDD] if nm_ok else []
                print(f"pid {pid} uuid at {a+o:#x} in {nm or '[anon]'} ({(b-a)>>10} KiB) name at -256: {nm_ok}; (bus, device, domain) at offsets {offs}")
                hits += 1
    print(f"pid {pid}: {hits} uuid copies")
PYEOF
UUID=$(nvidia-smi --query-gpu=uuid --format=csv,noheader | head -1); NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
BUS=$(nvidia-smi --query-gpu=pci.bus_id --format=csv,noheader | head -1)
# shellcheck disable=SC2086,SC2046 # PROPS and the pid file are lists of words, split on purpose
"$PY" /tmp/scan.py "$NAME" "$UUID" "$BUS" ${PROPS:-} $(cat /tmp/torch.pid)
wait
