#!/usr/bin/env bash
# A dry run of tests/gpu/runtimes.sh on the TEST DOUBLES, on a machine without GPUs, before GPU time is spent on it:
# the carried .debs unpacked and run through their wrappers, the CDI spec, Podman's and containerd's cases, the
# parts of a dump and their restore (on the same "machine": the doubles cannot change GPUs between calls). It proves
# the script's mechanics, not the GPU behaviour.
#
#   bash tests/gpu/runtimes-dry.sh [PHASE...]     as root, HERE; default: podman-same podman-dump podman-restore
#                                                 containerd-same containerd-dump containerd-restore
#
# Needs tests/gpu/prepare.sh's .device (criu-debs, runc-debs, pkg, bin; CCM_DEVICE_DIR elsewhere), the runtime debs
# (CCM_PREPARE_RUNTIMES=only; CCM_RUNTIME_DEBS=DIR names their parent, default .device), `cargo build --workspace`
# (the doubles in target/debug) and the forky runtimes root (tests/criu-root.sh, CCM_CRIU_SUITE=forky). It runs in a
# throw-away copy of that root (the root's glibc is newer than 2.38, as the GPU host's is):
#   - /usr/local/nvidia/lib64 holds the libcuda and NVML doubles, a fake nvidia-smi answers for the doubles' G0;
#   - /dev gets nvidia0 (195:0), nvidiactl (195:255), nvidia-uvm (240:0), nvidia-uvm-tools (240:1);
#   - the doubles' variables reach the container through the CDI spec (CCM_CDI_EXTRA_ENV / _MOUNTS) and CRIU through
#     its wrapper (CCM_RT_CRIU_ENV); on a hybrid cgroup v1 host the two settings of tests/container/podman-flow.sh
#     (CCM_RT_CONTAINERS_CONF, CCM_RT_CRIU_CONF), `ctr run --cpu-shares 0`, and no crun restore (CCM_RT_SKIP_CRUN,
#     as in the busybox flow), and for CRI that flow's runc wrapper that drops the sandbox's CPU shares and
#     `restrict_oom_score_adj` (CCM_RT_RUNC_BINARY, CCM_RT_CRI_EXTRA).
#   - CRIU 4.2.1 (../shared/device/criu-debs-4.2.1, CCM_DRY_CRIU_DEBS) instead of .device's 4.1.1: forky's glibc
#     (2.43) puts guard regions (MADV_GUARD_INSTALL) into thread stacks, which CRIU 4.1.1 cannot dump (`Can't
#     splice pages to pipe (-14/2/70)`, measured); the GPU host's glibc 2.39 has none.
# Output: the script's table and $OUT-like folder in /tmp/ccm-rt-dry.XXXX (printed).
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)

if [[ ${1:-} == __inside ]]; then
    shift
    S=$1
    shift
    # shellcheck source=tests/container/common.sh
    . "$REPO/tests/container/common.sh"
    export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
    mkdir -p /sys/fs/cgroup
    mountpoint -q /sys/fs/cgroup || mount -t cgroup2 cgroup2 /sys/fs/cgroup
    G0=GPU-5e110000-aabb-ccdd-0001-020304050600
    SIM=$S/sim
    mkdir -p "$SIM/state" /usr/local/nvidia/lib64 /usr/local/nvidia/bin
    cp "$REPO/target/debug/libcuda_test_double.so" /usr/local/nvidia/lib64/libcuda.so.1
    cp "$REPO/target/debug/libnvml_test_double.so" /usr/local/nvidia/lib64/libnvidia-ml.so.1
    cat >"$SIM/gpus.json" <<EOF
{"driver_version":"580.159.04","cuda_driver_version":13000,"gpus":[
 {"uuid":"$G0","pci_bus_id":"0000:06:00.0","pci_device_id":"0x233510de","pci_subsystem_id":"0x18bf10de","minor":0,"name":"NVIDIA H200","memory_total":1073741824}
]}
EOF
    cat >/usr/local/nvidia/bin/nvidia-smi <<EOF
#!/bin/sh
# tests/gpu/runtimes-dry.sh: the doubles' GPU, as nvidia-smi --query-gpu prints it.
case "\$*" in
*index,uuid,pci.bus_id*) echo "0, $G0, 00000000:06:00.0" ;;
*uuid*) echo "$G0" ;;
*pci.bus_id*) echo "00000000:06:00.0" ;;
*driver_version*) echo "580.159.04" ;;
*index*) echo 0 ;;
*) echo "GPU 0: NVIDIA H200 (UUID: $G0)" ;;
esac
EOF
    chmod 755 /usr/local/nvidia/bin/nvidia-smi
    ln -sf /usr/local/nvidia/bin/nvidia-smi /usr/local/bin/nvidia-smi
    mknod -m 666 /dev/nvidia0 c 195 0
    mknod -m 666 /dev/nvidiactl c 195 255
    mknod -m 666 /dev/nvidia-uvm c 240 0
    mknod -m 666 /dev/nvidia-uvm-tools c 240 1
    sim_env="CCM_SIM_CONFIG=$SIM/gpus.json CCM_SIM_STATE_DIR=$SIM/state"
    export CCM_CDI_EXTRA_ENV=$sim_env
    export CCM_CDI_EXTRA_MOUNTS="$SIM/gpus.json:$SIM/gpus.json:ro $SIM/state:$SIM/state:rw"
    export CCM_RT_CRIU_ENV="$sim_env CCM_SIM_CALL_TIMEOUT_MS=20000"
    export CCM_TORCH_PY=/nonexistent
    # This machine's root may lack CAP_SYS_RESOURCE (tests/container/cri-flow.sh).
    export CCM_RT_CRI_EXTRA='  restrict_oom_score_adj = true'
    if grep -qv '^0::' /proc/self/cgroup; then
        export CCM_RT_CONTAINERS_CONF='pids_limit = 0' CCM_RT_CRIU_CONF='manage-cgroups=ignore'
        export CCM_RT_SKIP_CRUN="a hybrid cgroup v1 host: crun 1.21 with libcriu 4.1 cannot hand CRIU manage-cgroups=ignore (tests/container/podman-flow.sh)"
        if ! grep -qw cpu /sys/fs/cgroup/cgroup.controllers; then
            export CCM_RT_CTR_RUN_ARGS='--cpu-shares 0'
            # The CRI sandbox always gets CPU shares: tests/container/cri-flow.sh's wrapper drops them.
            export CCM_RT_RUNC_BINARY=/usr/local/sbin/ccm-runc-nocpu
            write_runc_nocpu "$CCM_RT_RUNC_BINARY" /var/tmp/ccm-rt/bin/runc
        fi
    fi
    export OUT=$S/out
    mkdir -p "$OUT"
    rc=0
    bash "$REPO/tests/gpu/runtimes.sh" stage "$RUNTIME_DEBS"/runtime-debs-podman "$RUNTIME_DEBS"/runtime-debs-containerd || rc=$?
    for phase in "$@"; do
        # What a dump phase hands out is what the restore phase stages (as the device tool would carry it).
        case $phase in
        *-restore)
            mkdir -p "$S/carried"
            cp "$S"/out-*/meta-*.txt "$S"/out-*/*.tar.xz.* "$S/carried/" 2>/dev/null || true
            OUT=$S/out-$phase bash "$REPO/tests/gpu/runtimes.sh" "$phase" "$S/carried" || rc=$?
            ;;
        *) OUT=$S/out-$phase bash "$REPO/tests/gpu/runtimes.sh" "$phase" || rc=$? ;;
        esac
    done
    exit "$rc"
fi

[[ $(id -u) == 0 ]] || { echo "runtimes-dry.sh: run it as root" >&2; exit 2; }
[[ $# -gt 0 ]] || set -- podman-same podman-dump podman-restore containerd-same containerd-dump containerd-restore
DEVICE_DIR=${CCM_DEVICE_DIR:-$REPO/.device}
RUNTIME_DEBS=${CCM_RUNTIME_DEBS:-$DEVICE_DIR}
for d in "$DEVICE_DIR/criu-debs" "$DEVICE_DIR/runc-debs" "$DEVICE_DIR/pkg" "$RUNTIME_DEBS/runtime-debs-podman" "$RUNTIME_DEBS/runtime-debs-containerd"; do
    compgen -G "$d/*.deb" >/dev/null || { echo "runtimes-dry.sh: no .debs in $d (tests/gpu/prepare.sh, CCM_PREPARE_RUNTIMES)" >&2; exit 2; }
done
[[ -f $REPO/target/debug/libcuda_test_double.so ]] || { echo "runtimes-dry.sh: cargo build --workspace first" >&2; exit 2; }
CRIU42=${CCM_DRY_CRIU_DEBS:-$REPO/../shared/device/criu-debs-4.2.1}
compgen -G "$CRIU42/criu_4.2*.deb" >/dev/null || { echo "runtimes-dry.sh: no CRIU 4.2 debs in $CRIU42 (CCM_DRY_CRIU_DEBS)" >&2; exit 2; }
export CCM_CRIU_SUITE=forky
bash "$REPO/tests/criu-root.sh" prepare-runtimes >/dev/null
SRC=$(bash "$REPO/tests/criu-root.sh" runtimes-path)
S=$(mktemp -d /tmp/ccm-rt-dry.XXXX)
trap 'rm -rf "$S/root"' EXIT
cp -a --reflink=auto "$SRC" "$S/root"
# What the GPU host has and the root lacks: xz (the parts of a dump), pgrep.
cp /etc/resolv.conf "$S/root/etc/resolv.conf" 2>/dev/null || true
unshare --mount --propagation private -- chroot "$S/root" sh -c 'mount -t proc proc /proc &&
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends xz-utils procps' </dev/null >"$S/apt.log" 2>&1 ||
    { echo "runtimes-dry.sh: apt-get install xz-utils procps in the root copy failed ($S/apt.log)" >&2; exit 2; }
# .device as the GPU machine gets it, with CRIU 4.2.1 (see the header).
mkdir -p "$S/device/criu-debs"
cp "$CRIU42"/*.deb "$S/device/criu-debs/"
for d in runc-debs pkg bin plugin MANIFEST; do [[ -e $DEVICE_DIR/$d ]] && cp -r "$DEVICE_DIR/$d" "$S/device/"; done
echo "runtimes-dry.sh: running $* in a copy of $SRC; results in $S/out-*" >&2
rc=0
export RUNTIME_DEBS
CCM_TRIXIE_ROOT=$S/root CCM_DEVICE_DIR=$S/device bash "$REPO/tests/criu-root.sh" run \
    --bind "$S" --bind "$RUNTIME_DEBS" -- bash "$REPO/tests/gpu/runtimes-dry.sh" __inside "$S" "$@" || rc=$?
cat "$S"/out-*/runtimes-table.md 2>/dev/null
echo "runtimes-dry.sh: results in $S (exit $rc)" >&2
exit "$rc"
