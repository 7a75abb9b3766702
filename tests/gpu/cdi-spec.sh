#!/usr/bin/env bash
# A CDI spec for THIS machine's GPUs, written the way `nvidia-ctk cdi generate` writes one (the NVIDIA Container
# Toolkit is not packaged in Debian and is not on the GPU machines), for Podman (`--device nvidia.com/gpu=0`) and
# containerd (CRI `CDI_devices`, `ctr run --device nvidia.com/gpu=0`). Issue 25; used by tests/gpu/runtimes.sh.
#
#   bash tests/gpu/cdi-spec.sh [--out FILE] [--libs files|dir] [--device0-minor N]
#
# Writes FILE (default /etc/cdi/nvidia.json; CDI's JSON form, which Podman and containerd read like YAML), kind
# nvidia.com/gpu, cdiVersion 0.6.0:
#   devices: one per GPU by its nvidia-smi index (`0`, `1`, ...) and by its UUID (`GPU-...`), and `all`; each GPU's
#            node /dev/nvidia<minor> with its real major:minor (stat; majors differ between machines);
#   containerEdits (every device): /dev/nvidiactl, /dev/nvidia-uvm, /dev/nvidia-uvm-tools (and /dev/nvidia-modeset
#            when there) with their real numbers; NVIDIA_VISIBLE_DEVICES=void (as nvidia-ctk writes it: the legacy
#            hook, if installed, then does nothing) and LD_LIBRARY_PATH=<driver>/lib64 (no ldconfig hook: that needs
#            nvidia-ctk's hook binary; the libraries are found through the environment);
#            the driver's libraries as read-only bind mounts:
#              --libs files (default, what nvidia-ctk does): every file of <driver>/lib64 named like the compute and
#                utility libraries nvidia-ctk mounts (libcuda.so*, libcudadebugger.so*, libnvidia-ml.so*,
#                libnvidia-ptxjitcompiler.so*, libnvidia-nvvm.so*, libnvidia-cfg.so*, libnvidia-opencl.so*,
#                libnvidia-gpucomp.so*, libnvidia-allocator.so*, libnvidia-pkcs11*.so*), each a mount of its own at its
#                own path (a soname link is mounted as the file it names, since there is no hook to make the link);
#                the container's root must be writable for the mount points (an image's overlay is);
#              --libs dir: <driver> itself as one mount (what tests/gpu/container.sh's bundles do), for containers
#                whose /usr is the host's, bound read-only (mount points cannot be made there);
#            nvidia-smi (and nvidia-debugdump) as mounts, when the machine has them.
#   --device0-minor N: device `0` names /dev/nvidiaN (NVIDIA major, minor N) instead: a spec for a GPU this machine
#            does not have (the refusal cases).
# The driver directory is /usr/local/nvidia on the GPU machines (CCM_DRIVER_DIR overrides it). Only for a dry run on
# the test doubles (tests/gpu/runtimes-dry.sh): CCM_CDI_EXTRA_ENV (VAR=VALUE words) and CCM_CDI_EXTRA_MOUNTS
# (HOST:CONTAINER:ro|rw words) are added to containerEdits.
# Prints the devices it wrote.
set -euo pipefail

OUT=/etc/cdi/nvidia.json
LIBS=files
DEV0_MINOR=
while [[ $# -gt 0 ]]; do
    case $1 in
    --out) OUT=$2; shift 2 ;;
    --libs) LIBS=$2; shift 2 ;;
    --device0-minor) DEV0_MINOR=$2; shift 2 ;;
    *) echo "cdi-spec.sh: unknown argument $1 (see the header)" >&2; exit 2 ;;
    esac
done
case $LIBS in files | dir) ;; *) echo "cdi-spec.sh: --libs files or dir" >&2; exit 2 ;; esac
command -v nvidia-smi >/dev/null || { echo "cdi-spec.sh: no nvidia-smi: is this a GPU machine?" >&2; exit 2; }
DRIVER=${CCM_DRIVER_DIR:-/usr/local/nvidia}
[[ -d $DRIVER/lib64 ]] || { echo "cdi-spec.sh: no $DRIVER/lib64 (set CCM_DRIVER_DIR)" >&2; exit 2; }

# index uuid bus, one GPU a line; the minor from the kernel driver's own list (by bus id).
GPUS=$(nvidia-smi --query-gpu=index,uuid,pci.bus_id --format=csv,noheader | tr -d ' ')
mkdir -p "$(dirname "$OUT")"
python3 - "$OUT" "$LIBS" "$DRIVER" "$DEV0_MINOR" "$GPUS" "$(command -v nvidia-smi)" "$(command -v nvidia-debugdump || true)" \
    "${CCM_CDI_EXTRA_ENV:-}" "${CCM_CDI_EXTRA_MOUNTS:-}" <<'PY'
import glob, json, os, re, sys

out, libs, driver, dev0_minor, gpus, smi, debugdump, extra_env, extra_mounts = sys.argv[1:10]


def node(path, minor=None, major=None):
    """A deviceNodes entry with the node's real numbers (or the given ones for a node this machine lacks)."""
    if major is None:
        st = os.stat(path)
        major, minor = os.major(st.st_rdev), os.minor(st.st_rdev)
    return {"path": path, "type": "c", "major": major, "minor": minor, "fileMode": 0o666, "permissions": "rw"}


def minor_of(bus):
    """The Device Minor of /proc/driver/nvidia/gpus/<bus>/information (bus ids there are lower-case, domain 4 digits)."""
    b = bus.lower()
    dom, rest = b.split(":", 1)
    b = "%04x:%s" % (int(dom, 16), rest)
    for info in glob.glob("/proc/driver/nvidia/gpus/*/information"):
        if os.path.basename(os.path.dirname(info)).lower() == b:
            m = re.search(r"Device Minor:\s*(\d+)", open(info).read())
            if m:
                return int(m.group(1))
    return None


ctl_major = os.major(os.stat("/dev/nvidiactl").st_rdev)
devices, all_nodes = [], []
for line in gpus.splitlines():
    idx, uuid, bus = line.split(",")
    minor = minor_of(bus)
    if minor is None:
        minor = int(idx)
    n = node(f"/dev/nvidia{minor}")
    if idx == "0" and dev0_minor:
        n = node(f"/dev/nvidia{int(dev0_minor)}", minor=int(dev0_minor), major=ctl_major)
    all_nodes.append(n)
    for name in (idx, uuid):
        devices.append({"name": name, "containerEdits": {"deviceNodes": [n]}})
devices.append({"name": "all", "containerEdits": {"deviceNodes": all_nodes}})

common_nodes = [node(p) for p in ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset")
                if os.path.exists(p)]
ro = ["ro", "nosuid", "nodev", "bind"]
mounts = []
lib64 = os.path.join(driver, "lib64")
if libs == "dir":
    mounts.append({"hostPath": driver, "containerPath": driver, "type": "bind", "options": ro})
else:
    prefixes = ("libcuda.so", "libcudadebugger.so", "libnvidia-ml.so", "libnvidia-ptxjitcompiler.so",
                "libnvidia-nvvm.so", "libnvidia-cfg.so", "libnvidia-opencl.so", "libnvidia-gpucomp.so",
                "libnvidia-allocator.so", "libnvidia-pkcs11")
    for name in sorted(os.listdir(lib64)):
        path = os.path.join(lib64, name)
        if name.startswith(prefixes) and os.path.isfile(path):
            mounts.append({"hostPath": os.path.realpath(path), "containerPath": path, "type": "bind", "options": ro})
for tool in (smi, debugdump):
    if tool and not (libs == "dir" and os.path.realpath(tool).startswith(driver + "/")):
        mounts.append({"hostPath": os.path.realpath(tool), "containerPath": tool, "type": "bind", "options": ro})

for m in extra_mounts.split():
    host, cont, mode = m.split(":")
    mounts.append({"hostPath": host, "containerPath": cont, "type": "bind", "options": [mode, "nosuid", "nodev", "bind"]})

spec = {
    "cdiVersion": "0.6.0",
    "kind": "nvidia.com/gpu",
    "devices": devices,
    "containerEdits": {
        "env": ["NVIDIA_VISIBLE_DEVICES=void", f"LD_LIBRARY_PATH={lib64}"] + extra_env.split(),
        "deviceNodes": common_nodes,
        "mounts": mounts,
    },
}
tmp = out + ".tmp"
with open(tmp, "w") as f:
    json.dump(spec, f, indent=1)
os.rename(tmp, out)
for d in devices:
    n = d["containerEdits"]["deviceNodes"]
    print(f"nvidia.com/gpu={d['name']}: " + ", ".join(f"{x['path']} ({x['major']}:{x['minor']})" for x in n))
print(f"common: " + ", ".join(f"{x['path']} ({x['major']}:{x['minor']})" for x in common_nodes)
      + f"; {len(mounts)} mount(s) ({libs}); LD_LIBRARY_PATH={lib64}")
PY
