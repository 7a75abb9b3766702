#!/usr/bin/env python3
"""What the legacy NVIDIA container hook (nvidia-container-runtime-hook, libnvidia-container) does to a runc
container at its start, for the GPU tests: nvidia-container-toolkit is not packaged in Debian, so
tests/gpu/container.sh puts this in the spec's createRuntime hooks instead.

It reads the OCI state on stdin, takes NVIDIA_VISIBLE_DEVICES from the bundle's process.env (`all`, NVML indices,
GPU UUIDs; `none`/`void`/empty: control nodes only) and creates the GPU's and the control device nodes in the
container's /dev, inside its mount namespace, before pivot_root: the spec's linux.devices never names them, which is
what the plugin's container-aware usable set has to cope with. The driver's libraries are already bind mounts of the
spec. It never fails the container: at `runc restore` (the hook runs again at CRIU's setup-namespaces, with the
restored /dev already there) it only logs what it found. One line per action into LOG (argv[1]).
"""
import json
import os
import stat
import subprocess
import sys


def gpus():
    """(index, uuid, minor) of this node's GPUs, by nvidia-smi and the driver's /proc files."""
    out = subprocess.run(["nvidia-smi", "--query-gpu=index,uuid,pci.bus_id", "--format=csv,noheader"],
                         capture_output=True, text=True, timeout=30).stdout
    found = []
    for line in out.splitlines():
        idx, uuid, bus = (x.strip() for x in line.split(","))
        dom, rest = bus.lower().split(":", 1)
        info = "/proc/driver/nvidia/gpus/%04x:%s/information" % (int(dom, 16), rest)
        minor = int(idx)
        try:
            for l in open(info):
                if l.startswith("Device Minor:"):
                    minor = int(l.split(":")[1])
        except OSError:
            pass
        found.append((int(idx), uuid, minor))
    return found


def main():
    log = open(sys.argv[1], "a") if len(sys.argv) > 1 else sys.stderr
    try:
        state = json.load(sys.stdin)
        pid, bundle = state["pid"], state["bundle"]
        spec = json.load(open(os.path.join(bundle, "config.json")))
        value = None
        for e in spec.get("process", {}).get("env", []):
            if e.startswith("NVIDIA_VISIBLE_DEVICES="):
                value = e.split("=", 1)[1]
        root = spec["root"]["path"]
        root = root if root.startswith("/") else os.path.join(bundle, root)
        wanted = []
        if value and value not in ("none", "void"):
            for item in value.split(","):
                for idx, uuid, minor in gpus():
                    if item == "all" or item == str(idx) or (item.startswith("GPU-") and uuid.startswith(item)):
                        wanted.append(minor)
        nodes = ["nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"] + ["nvidia%d" % m for m in sorted(set(wanted))]
        rdev = {n: os.stat("/dev/" + n).st_rdev for n in nodes if os.path.exists("/dev/" + n)}
        # The container's mount namespace: its /dev (a tmpfs of runc's) is mounted at ROOT/dev there.
        os.setns(os.open("/proc/%d/ns/mnt" % pid, os.O_RDONLY), os.CLONE_NEWNS)
        made = []
        for n in rdev:
            path = os.path.join(root, "dev", n)
            try:
                os.mknod(path, 0o666 | stat.S_IFCHR, rdev[n])
                os.chmod(path, 0o666)
                made.append(n)
            except OSError as e:
                print("hook: %s: %s (left as it is)" % (path, e.strerror), file=log)
        print("hook: pid %d NVIDIA_VISIBLE_DEVICES=%s: made %s" % (pid, value, " ".join(made) or "nothing"), file=log)
    except Exception as e:  # never fail the container's start or restore
        print("hook: %s: %s" % (type(e).__name__, e), file=log)
    return 0


if __name__ == "__main__":
    sys.exit(main())
