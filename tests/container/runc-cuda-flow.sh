#!/usr/bin/env bash
# A CUDA container under plain runc, on the TEST DOUBLES (CI has no GPU), with the Debian package installed as a
# user installs it and CRIU configured by /etc/criu/runc.conf alone. Run inside a copy of the runtimes root
# (`tests/criu-root.sh prepare-runtimes`) by tests/container_runtime.rs:
#
#   bash tests/container/runc-cuda-flow.sh SCRATCH
#
# SCRATCH holds package.deb and sim-bin/ (the libcuda and NVML doubles and ccm-sample-workload of the build under
# test) and receives every step's status (`NAME.rc`), output, CRIU's logs and the workload's reports, for the Rust
# test to check. A failed step is recorded and what depends on it skipped; the script itself exits 0.
#
# The container, as tests/gpu/container.sh builds one for a real GPU, minus the device nodes: its own pid, mount,
# ipc and uts namespaces (no network namespace) and /proc, the root's /usr and /etc read-only, stdio on pipes (as a
# shim gives them; CRIU refuses host files as container stdio). The simulated stack (doubles, GPU set, state
# directory) is bind-mounted at its own path and the control directory at /ctl; the doubles' "device nodes" are
# regular files in the state directory, so the bundle has no /dev/nvidiaN. The container finds the doubles through
# LD_LIBRARY_PATH, CRIU's plugin through CRIU_CUDA_MIGRATE_LIBCUDA/LIBNVML in runc's environment (runc hands its
# environment to CRIU), both through CCM_SIM_CONFIG and CCM_SIM_STATE_DIR.
#
# Cases (ccm-sample-workload --dir /ctl, 8 MiB on ordinal 0, 3 rounds):
#   same: round 1, `runc checkpoint`, `runc restore -d`, round 2: identity agrees, data intact, same GPU;
#   move: the same, restored with CRIU_CUDA_MIGRATE_DEVICE_MAP=G0=G1 in runc's environment: round 2 names G1 and
#         every identity agrees.
#   given: the container-aware map and a minor change. The container starts with G0's node /dev/nvidia0 (195:0) in
#         linux.devices and is restored from a bundle that gives it G1's /dev/nvidia1 (195:1) instead, with no map
#         and no usable-GPU setting: the plugin must read the restoring runtime's spec, move G0 to G1, and leave the
#         restored /dev (CRIU's copy of the dumped one) with nvidia1 and without nvidia0 (`given-dev.txt`). The
#         doubles open no device node, so 195:N nodes without a driver are enough here.
# The restored container has a new pid namespace and a new host pid with the same namespace pid: each case records
# both (`NAME-keys.txt`), and the index entry of the doubles' state directory that the restored process is found by.
# After round 2 the workload gets go3 and exits; its registration must be gone (`NAME-left.txt`).
#
# Every process the flow starts (containers, the stdio pipes' far ends) is killed by the EXIT trap, also on failure.
set -u
# No -e (nor pipefail): a status-recording flow. Each step's status goes to S/NAME.rc and the flow goes on;
# the Rust test reads the statuses and names the step that broke.

S=$1
W=$S/rcuda
G0=GPU-5e110000-aabb-ccdd-0001-020304050600
G1=GPU-5e110001-aabb-ccdd-0001-020304050601
RUNC_ROOT=/run/ccm-rcuda-$$
# The containers' cgroups, one parent per run (the cleanup sweeps it and nothing else).
CGROUP_PARENT=/ccm-rcuda-$$
# Pids of the stdio helpers (`sleep` holding a container's stdin open, `cat` draining its output), for the cleanup.
HELPERS=$S/rcuda-helpers.pids
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

# step
# shellcheck source=tests/container/common.sh
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"

note() { printf '%s\n' "$*" >>"$S/flow.log"; }

trap runc_cleanup EXIT

# round CTL K NAME: go<K>, then the report (copied to S/NAME-report<K>.json); status in S/NAME-round<K>.rc.
round() {
    local ctl=$1 k=$2 name=$3 rc=0
    : >"$ctl/go$k"
    wait_file "$ctl/done$k" || rc=1
    [ -f "$ctl/report$k.json" ] && cp "$ctl/report$k.json" "$S/$name-report$k.json"
    echo "$rc" >"$S/$name-round$k.rc"
    return "$rc"
}

# key_of PID: the doubles' key of a host pid (<pid-namespace inode>-<namespace pid>) and the host pid.
key_of() {
    local ino nspid
    ino=$(stat -L -c %i "/proc/$1/ns/pid" 2>/dev/null)
    nspid=$(awk '/^NSpid:/ { print $NF }' "/proc/$1/status" 2>/dev/null)
    echo "host_pid=$1 key=$ino-$nspid"
}

# make_bundle DIR CTL ID [GPU-MINOR]: the bundle of container ID, CTL bound at /ctl (config.json written whole: there
# is no python or jq in the root). With GPU-MINOR, the container is given /dev/nvidia<GPU-MINOR> (195:GPU-MINOR), as a
# device plugin / CDI gives a container its GPU.
make_bundle() {
    local dir=$1 ctl=$2 id=$3 minor=${4:-} d devices="" allow=""
    if [ -n "$minor" ]; then
        devices='"devices": [{ "path": "/dev/nvidia'$minor'", "type": "c", "major": 195, "minor": '$minor', "fileMode": 438, "uid": 0, "gid": 0 }],'
        allow=', { "allow": true, "type": "c", "major": 195, "minor": '$minor', "access": "rwm" }'
    fi
    local args='"'$W/bin/ccm-sample-workload'", "--dir", "/ctl", "--mib", "8", "--devices", "0", "--rounds", "3"'
    local devmounts='{ "destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "strictatime", "mode=755", "size=65536k"] },
    { "destination": "/dev/pts", "type": "devpts", "source": "devpts", "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"] },
    { "destination": "/dev/shm", "type": "tmpfs", "source": "shm", "options": ["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"] },
    { "destination": "/dev/mqueue", "type": "mqueue", "source": "mqueue", "options": ["nosuid", "noexec", "nodev"] },'
    # Hostile layouts of the container's /dev (HOSTILE, with the host-side sentinel directory SENT).
    case ${HOSTILE:-} in
    hostbind) devmounts='{ "destination": "/dev", "type": "bind", "source": "'$SENT'", "options": ["rbind", "rw"] },' ;;
    plaindev) devmounts='' ;;
    nodelink)
        args='"/bin/sh", "-c", "rm -f /dev/nvidia0 && ln -s '$SENT'/secret /dev/nvidia0 && exec '$W'/bin/ccm-sample-workload --dir /ctl --mib 8 --devices 0 --rounds 3"'
        ;;
    esac
    rm -rf "$dir"
    mkdir -p "$dir/rootfs" "$ctl"
    for d in usr etc proc sys dev tmp ctl "${W#/}"; do mkdir -p "$dir/rootfs/$d"; done
    if [ "${HOSTILE:-}" = devlink ]; then
        # The container's /dev is a link to an absolute path; runc mounts the tmpfs at that path inside the root.
        rmdir "$dir/rootfs/dev"
        ln -s "$SENT" "$dir/rootfs/dev"
    fi
    for d in bin lib lib64 sbin; do ln -s "usr/$d" "$dir/rootfs/$d"; done
    write_runc_config "$dir/config.json" "$id" "$ctl" "$args" "$devices" "$allow" "$devmounts"
}

# run_case NAME [ENV=VALUE...]: one container through run, round 1, checkpoint, restore (runc's environment plus the
# assignments), round 2, round 3 (the workload exits). RUN_MINOR / RESTORE_MINOR: the GPU node each bundle gives.
run_case() {
    local name=$1 id c pid1 pid2
    shift
    id=ccm-rcuda-$name-$$
    c=$S/rcuda-$name
    rm -rf "$W/state" "$c"
    mkdir -p "$W/state" "$c"
    make_bundle "$c/bundle" "$c/ctl" "$id" "${RUN_MINOR:-}"
    piped_runc "$name-run" run -d --bundle "$c/bundle" "$id" || return 0
    if ! wait_file "$c/ctl/ready"; then
        echo 1 >"$S/$name-ready.rc"
        return 0
    fi
    echo 0 >"$S/$name-ready.rc"
    round "$c/ctl" 1 "$name" || return 0
    pid1=$(container_pid "$id")
    echo "before $(key_of "$pid1")" >"$S/$name-keys.txt"

    mkdir -p "$c/img" "$c/img.work" "$c/img.rwork"
    step "$name-checkpoint" runc_ checkpoint --image-path "$c/img" --work-path "$c/img.work" "$id"
    cp "$c/img.work/dump.log" "$S/$name-dump.log" 2>/dev/null
    ls "$c/img" >"$S/$name-images.txt" 2>&1
    [ "$(cat "$S/$name-checkpoint.rc")" = 0 ] || return 0
    ls -l "$W/state" >"$S/$name-state-after-checkpoint.txt" 2>&1
    # The restore's bundle: what the runtime gives the container on the node it comes back on.
    [ -n "${RESTORE_MINOR:-}" ] && make_bundle "$c/bundle" "$c/ctl" "$id" "$RESTORE_MINOR"

    (
        # shellcheck disable=SC2163 # the arguments are NAME=VALUE pairs to export
        [ $# -gt 0 ] && export "$@"
        piped_runc "$name-restore" restore -d --bundle "$c/bundle" --image-path "$c/img" --work-path "$c/img.rwork" "$id"
    )
    cp "$c/img.rwork/restore.log" "$S/$name-restore.log" 2>/dev/null
    [ "$(cat "$S/$name-restore.rc")" = 0 ] || return 0
    pid2=$(container_pid "$id")
    # Never through a link (a hostile /dev): the listing of what the container's root holds at dev.
    if [ -L "/proc/$pid2/root/dev" ]; then
        echo "dev -> $(readlink "/proc/$pid2/root/dev")" >"$S/$name-dev.txt"
    else
        ls "/proc/$pid2/root/dev/" >"$S/$name-dev.txt" 2>&1
        stat -c '%n %F %a %u:%g' "/proc/$pid2/root/dev/nvidia1" >"$S/$name-node1.txt" 2>&1
    fi
    [ -n "${SENT:-}" ] && sentinel_sum >"$S/$name-sentinel-after.txt"

    round "$c/ctl" 2 "$name"
    echo "after $(key_of "$pid2")" >>"$S/$name-keys.txt"
    # The index entry the restored process is found by (re-pointed by the plugin's controller or the process).
    local key
    key=$(key_of "$pid2" | sed 's/.*key=//')
    echo "index proc-$key -> $(readlink "$W/state/proc-$key" 2>/dev/null)" >>"$S/$name-keys.txt"
    ls -l "$W/state" >"$S/$name-state-after-restore.txt" 2>&1

    round "$c/ctl" 3 "$name"
    for _ in $(seq 100); do [ -d "/proc/$pid2" ] || break; sleep 0.1; done
    # A workload that exited normally leaves no registration behind: the registrations left, with their keys (the
    # plugin's driver agents register too, in the host pid namespace, and are killed rather than exit).
    (cd "$W/state" && for r in reg-*; do [ -d "$r" ] && echo "$r $(cat "$r/key" 2>/dev/null)"; done) >"$S/$name-left.txt"
    runc_ delete -f "$id" >/dev/null 2>&1
}

# sentinel_sum: every entry of the host-side sentinel directory SENT (name, type, mode, owner, device, size,
# content): what must be unchanged after a restore of a container with a hostile /dev.
sentinel_sum() {
    find "$SENT" -mindepth 1 -exec stat -c '%n %F %a %u:%g %t:%T %s' {} + | sort
    find "$SENT" -mindepth 1 -type f -exec sha256sum {} + | sort
}

# make_sentinel NAME: a tmpfs on the host side (S/rcuda-sentinel-NAME) standing for host device nodes: a GPU node
# nvidia0 (195:0), a node nvidia1 of another device (1:3), and a set-uid file owned by 1234:4321.
make_sentinel() {
    SENT=$S/rcuda-sentinel-$1
    mkdir -p "$SENT"
    mount -t tmpfs -o mode=755 tmpfs "$SENT" || return 1
    mknod -m 666 "$SENT/nvidia0" c 195 0 && mknod -m 666 "$SENT/null" c 1 3 &&
        echo "host secret" >"$SENT/secret" && chmod 4751 "$SENT/secret" && chown 1234:4321 "$SENT/secret" || return 1
    sentinel_sum >"$S/$1-sentinel-before.txt"
}

: >"$S/flow.log"
: >"$S/host-adjustments.txt"
: >"$HELPERS"

# --- install, as the user guide says; cgroups: cgroup2 only (podman-flow.sh says why; install_with_cgroup2, common.sh)
install_with_cgroup2 step || exit 0
echo "$HYBRID" >"$S/hybrid"

# --- CRIU: the plugin's libdir line in /etc/criu/runc.conf only
runc_conf_with_plugin "$HYBRID" "$S/host-adjustments.txt"
cp /etc/criu/runc.conf "$S/runc.conf"

# --- the simulated stack (tests/sim/stack.sh's layout): two H200s at 0000:06:00.0 and 0000:07:00.0
mkdir -p "$W/lib" "$W/bin" "$W/state"
cp "$S/sim-bin/libcuda_test_double.so" "$W/lib/libcuda.so.1"
cp "$S/sim-bin/libnvml_test_double.so" "$W/lib/libnvidia-ml.so.1"
cp "$S/sim-bin/ccm-sample-workload" "$W/bin/"
cat >"$W/gpus.json" <<EOF
{"driver_version":"580.159.04","cuda_driver_version":13000,"gpus":[
 {"uuid":"$G0","pci_bus_id":"0000:06:00.0","pci_device_id":"0x233510de","pci_subsystem_id":"0x18bf10de","minor":0,"name":"NVIDIA H200","memory_total":1073741824},
 {"uuid":"$G1","pci_bus_id":"0000:07:00.0","pci_device_id":"0x233510de","pci_subsystem_id":"0x18bf10de","minor":1,"name":"NVIDIA H200","memory_total":1073741824}
]}
EOF
# What runc passes on to CRIU and so to the plugin and its driver agent.
export CCM_SIM_CONFIG=$W/gpus.json CCM_SIM_STATE_DIR=$W/state CCM_SIM_CALL_TIMEOUT_MS=20000
export CRIU_CUDA_MIGRATE_LIBCUDA=$W/lib/libcuda.so.1 CRIU_CUDA_MIGRATE_LIBNVML=$W/lib/libnvidia-ml.so.1
unset LD_LIBRARY_PATH CUDA_VISIBLE_DEVICES CCM_SIM_VISIBLE CCM_SIM_FAULTS CRIU_CUDA_MIGRATE_DEVICE_MAP \
    CRIU_CUDA_MIGRATE_USABLE_GPUS CRIU_CUDA_MIGRATE_MODE CRIU_CUDA_MIGRATE_DISABLE CRIU_CUDA_MIGRATE_RECONCILE \
    CRIU_CUDA_MIGRATE_LEAVE_RUNNING
echo "$G0 $G1" >"$S/gpus.txt"

run_case same
note "same: done"
run_case move "CRIU_CUDA_MIGRATE_DEVICE_MAP=$G0=$G1"
note "move: done"
RUN_MINOR=0 RESTORE_MINOR=1 run_case given
note "given: done"
# The hostile /dev layouts, each moved from GPU 0 to GPU 1 by the restore bundle: nothing outside the container's
# own /dev may change (the sentinel), and the restore log says what was left alone.
for h in hostbind devlink nodelink plaindev; do
    if make_sentinel "$h"; then
        HOSTILE=$h RUN_MINOR=0 RESTORE_MINOR=1 run_case "hostile-$h"
        umount -l "$SENT" 2>/dev/null
    else
        echo 1 >"$S/hostile-$h-sentinel.rc"
    fi
    unset SENT
    note "hostile-$h: done"
done
