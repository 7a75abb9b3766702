#!/usr/bin/env bash
# GPU proofs for the runtimes users run GPUs with (issue 25): Podman and containerd 2.1 with a CDI GPU, and a torchrun
# job under Podman, on one machine and across machines (each GPU machine is another H200 at 0000:00:06.0, so a dump
# on one and a restore on the next is a cross-node move onto another GPU).
#
# Run THERE, from the repository root, as root, after tests/gpu/prepare.sh ran HERE with CCM_PREPARE_RUNTIMES=1
# (docs/GPU-TESTING.md, "Runtimes with CDI on the GPU (issue 25): how to run", says what to carry in which call):
#
#   bash tests/gpu/runtimes.sh stage DIR...          copies carried folders into /var/tmp/ccm-rt (kept while the
#                                                    machine stays warm): runtime-debs-* folders, and the parts of a
#                                                    dump phase (for a restore phase on this machine)
#   bash tests/gpu/runtimes.sh podman-same           Podman + CDI on this machine: run, --leave-running, export and
#                                                    import (zstd), a restore the preflight refuses (archive intact),
#                                                    the same with crun
#   bash tests/gpu/runtimes.sh podman-dump           phase 1 on machine A: $OUT gets meta-podman.txt and the first
#                                                    parts of podman.tar.xz (15 MiB each; `fetch podman` the rest)
#   bash tests/gpu/runtimes.sh podman-restore [DIR]  phase 2 on machine B, with the parts staged or in DIR
#   bash tests/gpu/runtimes.sh containerd-same       containerd 2.1 + CDI: `ctr run --device nvidia.com/gpu=0`,
#                                                    `ctr task checkpoint`, `ctr containers checkpoint --task` and
#                                                    `restore --live`; CRI (CDI_devices, CheckpointContainer, restore
#                                                    by CreateContainer) where python3 has grpc, else a loud skip
#   bash tests/gpu/runtimes.sh containerd-dump       phase 1 (ctr, and CRI where it can run)
#   bash tests/gpu/runtimes.sh containerd-restore [DIR]
#   bash tests/gpu/runtimes.sh torchrun-dump         a 2-rank torchrun job (gloo, both ranks on the GPU) in one Podman
#                                                    container with its own network namespace, checkpointed with
#                                                    --tcp-established mid-training; the uninterrupted run's losses
#   bash tests/gpu/runtimes.sh torchrun-restore [DIR]  restored on machine B: losses equal the uninterrupted run's
#   bash tests/gpu/runtimes.sh torchrun-same         the same on one machine (checkpoint, restore here)
#   bash tests/gpu/runtimes.sh fetch NAME            the next parts of NAME's archive into $OUT
#   Several phases in one call run in order (`stage DIR podman-same podman-dump`).
#
# How the runtimes get here: the machine (Ubuntu 24.04, glibc 2.39) reaches no registry. Debian's .debs are unpacked
# with dpkg -x into /var/tmp/ccm-rt/root (nothing installed system-wide), and each binary runs through a wrapper in
# /var/tmp/ccm-rt/bin that points LD_LIBRARY_PATH at the carried libraries for that binary only: Podman 5.4, crun
# 1.21, conmon, iptables (trixie), containerd 2.1 with its runc shim and ctr (forky), runc 1.1.15 and CRIU 4.1.1 as
# tests/gpu/container.sh has them. Their newest glibc symbol is GLIBC_2.38 (../shared/GPU-FACTS.md), so they run on
# the host's glibc; no Debian root is needed. The machine file in the logs says which way each runtime went.
#
# The containers, as CDI sets them up (tests/gpu/cdi-spec.sh writes /etc/cdi/nvidia.json like `nvidia-ctk cdi
# generate`): the GPU's nodes with their real numbers, the driver's libraries as bind mounts, LD_LIBRARY_PATH. The
# sample workload's image is made here (`podman import` / an OCI archive for ctr) of the workload and the C libraries
# it and the driver's libraries need; the torchrun job's image is an empty root whose /usr is the host's (bound
# read-only, not recursively: CRIU refuses the driver's mount as a submount of /usr) with /opt (torch) and the
# driver's directory (CDI, --libs dir) bound. The plugin comes from the project's .deb, its libdir line in
# /etc/criu/runc.conf (runc), and in /etc/criu/default.conf for crun 1.21 (libcriu 4.1 passes CRIU no other file).
# No plugin setting is given anywhere except where a case says so.
#
# What the doubles in CI (tests/container/podman-cdi-flow.sh, cri-cdi-flow.sh) found, and these runs check on the GPU:
#   - Podman's restore --import takes no --device and reuses the checkpoint's spec: the restored container keeps the
#     dumped node's CDI devices, with the majors of the machine it was dumped on. The machines' majors are compared
#     and a difference is said loudly (the restored /dev and the devices cgroup then name the old majors);
#   - containerd's CRI restore builds the spec from the new CreateContainer request (its CDI devices resolved again);
#   - under crun the plugin does not see the restoring runtime (crun's /proc/PID/exe is "/"): the usable set then
#     comes from no spec; the row says what the restore log says.
#
# Network: Podman's `--network none` gives a container its own network namespace, which CRIU locks with iptables
# (default) or nftables while it dumps. The setup probes which works on this kernel (the host's iptables-restore,
# the carried one, or CRIU's nftables); with none, the sample-workload containers use `--network host` (said in the
# machine file and the rows) and the torchrun case is skipped loudly.
#
# Knobs: CCM_PODMAN_RUNTIME (runc, or crun for every Podman case), CCM_TORCH_PY, CCM_TORCH_STEPS1/2, CCM_XZ_LEVEL,
# CCM_READY_TIMEOUT / CCM_ROUND_TIMEOUT, CCM_REGISTRY_PORT. Only for a dry run of this script on the test doubles
# (tests/gpu/runtimes-dry.sh; never on a GPU machine): CCM_RT_CRIU_ENV (VAR=VALUE words for CRIU's wrapper),
# CCM_RT_CRIU_CONF (more lines for the CRIU configuration files), CCM_RT_CONTAINERS_CONF (more lines for
# containers.conf's [containers]), CCM_RT_CTR_RUN_ARGS (more `ctr run` options), CCM_RT_NO_CRI=1, CCM_RT_SKIP_CRUN
# (why the crun case is not run), CCM_RT_CRI_EXTRA (more lines for containerd's CRI runtime section),
# CCM_RT_RUNC_BINARY (the runc containerd's CRI runs).
#
# Results: $OUT/runtimes-table.md (`| case | expected | seen | result | times |`), $OUT/runtimes-logs.tar.gz (every
# case's CRIU logs, reports, the machine file), and for dump phases meta-NAME.txt and parts; at most 8 files.
set -uo pipefail
# No -e: a status-recording flow. A failed case is recorded as a FAIL row and the next case runs.

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
DEVICE_DIR=${CCM_DEVICE_DIR:-$REPO/.device}
RTD=/var/tmp/ccm-rt
STAGE=$RTD/stage
RT_ROOT=$RTD/root
RT_BIN=$RTD/bin
RT_LIBS=$RT_ROOT/usr/lib/x86_64-linux-gnu:$RT_ROOT/lib/x86_64-linux-gnu
WORK=$RTD/work
XFER=$RTD/xfer
OUTPARTS=$RTD/out
INPARTS=$RTD/in
RESULTS_DIR=$(realpath -m "${OUT:-$WORK/out}")
RESULTS=$RESULTS_DIR/runtimes-results.tsv
LOGS=$RESULTS_DIR/logs
CRIU_ROOT=/opt/criu
CRIU_BIN=$CRIU_ROOT/usr/sbin/criu
CRIU_LIBS=$CRIU_ROOT/usr/lib/x86_64-linux-gnu
RUNC_ROOT_DIR=/opt/runc
DRIVER=${CCM_DRIVER_DIR:-/usr/local/nvidia}
PODMAN_RUNTIME=${CCM_PODMAN_RUNTIME:-runc}
WORKLOAD=$DEVICE_DIR/bin/ccm-sample-workload
CHECK=(python3 "$REPO/tests/gpu/gpu_check.py")
TORCH_PY=${CCM_TORCH_PY:-/opt/torch/.venv/bin/python3}
XZ_LEVEL=${CCM_XZ_LEVEL:-3}
PART_BYTES=15M
# $OUT takes 8 files and 64 MiB: the table, the logs, meta-NAME.txt and this many parts of 15 MiB.
PARTS_PER_CALL=4
READY_TIMEOUT=${CCM_READY_TIMEOUT:-120}
# A round of the sample workload takes well under a second; a restored torch job's second phase some seconds.
ROUND_TIMEOUT=${CCM_ROUND_TIMEOUT:-60}
TORCH_TIMEOUT=${CCM_TORCH_TIMEOUT:-300}
CGROUP_PARENT=/ccm-rt
CTRD_SOCK=/run/ccm-containerd/containerd.sock
CTRD_NS=ccm-rt
# containerd 2.1's CRI restore pulls the checkpoint's base image again by NAME@DIGEST: a registry on a fixed loopback
# port, the same on both machines.
REG=127.0.0.1:${CCM_REGISTRY_PORT:-5055}
IMAGE=localhost/ccm-sample:1
TORCH_IMAGE=localhost/ccm-hostusr:1
export NCCL_NVLS_ENABLE=0

# The phases and their helpers, by runtime (tests/gpu/runtimes/): common.sh (results, .debs, stage, the base setup,
# the parts of a dump), podman.sh, containerd.sh (ctr), cri.sh (containerd's CRI), torchrun.sh.
# shellcheck source=tests/gpu/runtimes/common.sh
source "$REPO/tests/gpu/runtimes/common.sh"
# shellcheck source=tests/gpu/runtimes/podman.sh
source "$REPO/tests/gpu/runtimes/podman.sh"
# shellcheck source=tests/gpu/runtimes/containerd.sh
source "$REPO/tests/gpu/runtimes/containerd.sh"
# shellcheck source=tests/gpu/runtimes/cri.sh
source "$REPO/tests/gpu/runtimes/cri.sh"
# shellcheck source=tests/gpu/runtimes/torchrun.sh
source "$REPO/tests/gpu/runtimes/torchrun.sh"

# ------------------------------------------------------------------------------------------------

cleanup() {
    local t pid
    if [[ -x $RT_BIN/podman ]]; then
        for t in $("$RT_BIN/podman" ps -a --format '{{.Names}}' 2>/dev/null | grep '^ccm-rt-'); do
            "$RT_BIN/podman" rm -f --time 0 "$t" >/dev/null 2>&1
        done
    fi
    if [[ -n ${CONTAINERD_PID:-} ]]; then
        for t in $(C task ls -q 2>/dev/null); do C task kill -s KILL "$t" >/dev/null 2>&1; done
        sleep 0.5
        for t in $(C task ls -q 2>/dev/null); do C task rm -f "$t" >/dev/null 2>&1; done
        for t in $(C containers ls -q 2>/dev/null); do C containers rm "$t" >/dev/null 2>&1; done
        if [[ -n ${POD:-} ]]; then
            cri StopPodSandbox "{\"pod_sandbox_id\":\"$POD\"}" >/dev/null 2>&1
            cri RemovePodSandbox "{\"pod_sandbox_id\":\"$POD\"}" >/dev/null 2>&1
        fi
        kill "$CONTAINERD_PID" 2>/dev/null && wait "$CONTAINERD_PID" 2>/dev/null
        # The shims of this containerd outlive it: by their -address argument.
        for pid in $(pgrep -f "containerd-shim-runc-v2 .*-address $CTRD_SOCK" 2>/dev/null); do kill -9 "$pid" 2>/dev/null; done
    fi
    [[ -n ${REGISTRY_PID:-} ]] && kill "$REGISTRY_PID" 2>/dev/null && wait "$REGISTRY_PID" 2>/dev/null
    # Whatever the runtimes left in this script's cgroup parent.
    if [[ -d /sys/fs/cgroup$CGROUP_PARENT ]]; then
        find "/sys/fs/cgroup$CGROUP_PARENT" -name cgroup.procs -exec cat {} + 2>/dev/null | while read -r pid; do kill -9 "$pid" 2>/dev/null; done
        sleep 0.3
        find "/sys/fs/cgroup$CGROUP_PARENT" -depth -type d -exec rmdir {} + 2>/dev/null
    fi
}
trap cleanup EXIT

main() {
    [[ $# -gt 0 ]] || { sed -n '2,/^set -uo/p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 2; }
    mkdir -p "$RESULTS_DIR" "$LOGS" "$WORK"
    [[ -f $RESULTS ]] || : >"$RESULTS"
    while [[ $# -gt 0 ]]; do
        case $1 in
        stage)
            shift
            local dirs=()
            while [[ $# -gt 0 && -d $1 ]]; do dirs+=("$1"); shift; done
            phase_stage "${dirs[@]}"
            continue
            ;;
        podman-same) phase_podman_same ;;
        podman-dump) phase_podman_dump ;;
        podman-restore | containerd-restore | torchrun-restore)
            local p=$1 dir=
            [[ $# -gt 1 && -d $2 ]] && { dir=$2; shift; }
            "phase_${p//-/_}" "$dir"
            ;;
        containerd-same) phase_containerd_same ;;
        containerd-dump) phase_containerd_dump ;;
        torchrun-same) phase_torchrun_same ;;
        torchrun-dump) phase_torchrun_dump ;;
        fetch)
            shift
            hand_out "${1:?fetch needs a name: podman, containerd or torchrun}"
            ;;
        *) echo "unknown phase $1 (see the header of $0)" >&2; exit 2 ;;
        esac
        shift
    done
    print_table | tee "$RESULTS_DIR/runtimes-table.md"
    cp "$RESULTS" "$LOGS/" 2>/dev/null
    tar -C "$RESULTS_DIR" -czf "$RESULTS_DIR/runtimes-logs.tar.gz" logs && rm -rf "$LOGS"
    rm -f "$RESULTS"
    ! grep -q '| FAIL |' "$RESULTS_DIR/runtimes-table.md"
}

main "$@"
