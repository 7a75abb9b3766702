#!/usr/bin/env bash
# The problem this project exists for, at its real size, on the TEST DOUBLES (CI has no GPU): two 8-GPU nodes with
# the seed's PCI layout, a container of 4 ranks given 4 of them, moved from node A to node B and back. Run inside a
# copy of the runtimes root (`tests/criu-root.sh prepare-runtimes`) by tests/container_runtime.rs:
#
#   bash tests/container/runc-pod-flow.sh SCRATCH [CASE...]
#
# SCRATCH holds package.deb and sim-bin/ (the libcuda and NVML doubles and ccm-sample-workload of the build under
# test) and receives every step's status (`NAME.rc`), output, CRIU's logs and the ranks' reports, for the Rust test
# to check. A failed step is recorded and what depends on it skipped; the script itself exits 0. Without CASE, every
# case runs.
#
# The nodes (node_gpu_set): 8 B200-like GPUs each at the bus ids 03, 13, 63, 73, 83, 93, E3, F3 (minors 0-7), the
# same layout on both nodes, other UUIDs on each. The doubles' GPU set file ($W/gpus.json) names the node the
# processes and CRIU run on now: it is replaced (rename) between a dump and a restore, which is a move to the other
# node (the libcuda double takes the file's GPU set at each driver restore, NVML at each first init).
#
# The pod: plain runc (the packaged plugin, libdir in runc.conf), a launcher (sh) as the container's init starting 4
# ranks of ccm-sample-workload, each with LOCAL_RANK=r, seeing all 4 GPUs of the container and holding 8 MiB on
# cuda:<LOCAL_RANK> (`--devices $LOCAL_RANK`); each round every rank reports, for every ordinal, what NCCL's init
# asks: cuDeviceGetPCIBusId, nvmlDeviceGetHandleByPciBusId of it, that handle's UUID against cuDeviceGetUuid
# (`agree`), and whether its data is intact. The GPUs are given the way a runtime gives them, in the spec the
# restoring runc is handed:
#   cdi:    linux.devices /dev/nvidiaN (195:N) and /dev/nvidiactl with their devices-cgroup rules, what a CDI-aware
#           engine (containerd, CRI-O, Podman) writes into the OCI spec for nvidia.com/gpu=... (plain runc reads no
#           CDI spec itself);
#   legacy: NVIDIA_VISIBLE_DEVICES=<4 UUIDs> in process.env, as the NVIDIA device plugin sets it for the legacy
#           runtime hook, and a prestart hook standing in for nvidia-container-runtime-hook, which creates the GPU
#           nodes in the container's /dev (through the container's mount namespace, as the real hook does). No hook
#           at restore: the restored /dev is CRIU's copy of the dumped one, which the plugin fixes.
# No restore is given a device-map or usable-GPU setting: the map comes from the restoring spec.
#
# Cases:
#   seed:    on A given 03/13/63/73 (cdi); round 1; checkpoint; the GPU set switched to node B; a restore into a
#            container given only 63/83/E3 (refused by the preflight before CRIU restores anything; the images'
#            checksums before and after in seed-images-*.sum); the restore into one given 63/83/E3/F3; round 2;
#            checkpoint; back to node A into one given 83/93/E3/F3; round 3 (the ranks exit).
#   noreconcile: the seed's move A -> B with CRIU_CUDA_MIGRATE_RECONCILE=off in runc's environment; round 2 must show
#            the seed's failure (NVML Not Found at the stale bus ids).
#   legacy:  the move A -> B with the GPUs given by NVIDIA_VISIBLE_DEVICES; round 2.
# Per restore: NAME-restoreN.log (CRIU's log), NAME-restoreN-dev.txt (the restored container's /dev),
# NAME-rankR-reportK.json; per case NAME-left.txt (registrations left after the ranks exited).
#
# Every process the flow starts (containers, the stdio pipes' far ends) is killed by the EXIT trap, also on failure.
set -u
# No -e (nor pipefail): a status-recording flow (tests/container/runc-cuda-flow.sh says why).

S=$1
shift
CASES=${*:-seed noreconcile legacy}
W=$S/rpod
RUNC_ROOT=/run/ccm-rpod-$$
CGROUP_PARENT=/ccm-rpod-$$
HELPERS=$S/rpod-helpers.pids
RANKS=4
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

# step, install_with_cgroup2, wait_file, piped_runc, runc_, runc_cleanup, container_pid, write_runc_config
# shellcheck source=tests/container/common.sh
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"

note() { printf '%s\n' "$*" >>"$S/flow.log"; }
trap runc_cleanup EXIT

BUSES=(03 13 63 73 83 93 E3 F3)

# gpu_uuid NODE INDEX: the UUID of GPU INDEX (0-7, bus order) of node NODE (a or b).
gpu_uuid() { echo "GPU-5eed0${1}0${2}-b200-4000-8000-00000000000${2}"; }

# node_gpu_set NODE: the GPU set file of node NODE: 8 GPUs, B200-like (name, PCI ids, 183359 MiB), minor = index.
node_gpu_set() {
    local i sep=""
    printf '{"driver_version":"580.159.04","cuda_driver_version":13000,"gpus":[\n'
    for i in 0 1 2 3 4 5 6 7; do
        printf '%s {"uuid":"%s","pci_bus_id":"0000:%s:00.0","pci_device_id":"0x290110de","pci_subsystem_id":"0x199910de","minor":%s,"name":"NVIDIA B200","memory_total":192265846784}\n' \
            "$sep" "$(gpu_uuid "$1" "$i")" "${BUSES[i]}" "$i"
        sep=,
    done
    printf ']}\n'
}

# on_node NODE: the doubles' GPU set file names node NODE from now on (renamed into place: the containers see the
# directory, so the new file).
on_node() {
    cp "$W/node-$1.json" "$W/gpus.json.new" && mv -f "$W/gpus.json.new" "$W/gpus.json"
    note "GPU set: node $1"
}

# pod_args: process.args of the launcher (its own copy of what torchrun does: one process per local rank).
pod_args() {
    # shellcheck disable=SC2016 # expanded by the launcher's shell, not this one
    printf '"/bin/sh", "-c", "for r in $(seq 0 %s); do export LOCAL_RANK=$r; %s --dir /ctl/rank$r --mib 8 --devices $LOCAL_RANK --rounds $0 & done; wait", "%s"' \
        "$((RANKS - 1))" "$W/bin/ccm-sample-workload" "$ROUNDS"
}

# make_pod_bundle DIR CTL ID FORM NODE INDEX...: the bundle of container ID on node NODE given the GPUs INDEX... by
# FORM (cdi or legacy, above); CTL bound at /ctl.
make_pod_bundle() {
    local dir=$1 ctl=$2 id=$3 form=$4 node=$5 i devices="" allow="" env="" hooks="" uuids="" minors=""
    shift 5
    for i in "$@"; do
        minors="$minors $i"
        uuids="$uuids${uuids:+,}$(gpu_uuid "$node" "$i")"
        allow="$allow, { \"allow\": true, \"type\": \"c\", \"major\": 195, \"minor\": $i, \"access\": \"rwm\" }"
        devices="$devices{ \"path\": \"/dev/nvidia$i\", \"type\": \"c\", \"major\": 195, \"minor\": $i, \"fileMode\": 438, \"uid\": 0, \"gid\": 0 }, "
    done
    allow="$allow, { \"allow\": true, \"type\": \"c\", \"major\": 195, \"minor\": 255, \"access\": \"rwm\" }"
    case $form in
    cdi)
        devices="\"devices\": [$devices{ \"path\": \"/dev/nvidiactl\", \"type\": \"c\", \"major\": 195, \"minor\": 255, \"fileMode\": 438, \"uid\": 0, \"gid\": 0 }],"
        ;;
    legacy)
        devices=""
        env=", \"NVIDIA_VISIBLE_DEVICES=$uuids\""
        if [ "${HOOK:-}" = 1 ]; then
            # shellcheck disable=SC2086 # the minors are words
            hooks="
  \"hooks\": { \"prestart\": [{ \"path\": \"/bin/sh\", \"args\": [\"sh\", \"$W/legacy-hook.sh\"$(printf ', "%s"' $minors)],
    \"env\": [\"PATH=/usr/sbin:/usr/bin:/sbin:/bin\"] }] },"
        fi
        ;;
    esac
    local devmounts='{ "destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "strictatime", "mode=755", "size=65536k"] },
    { "destination": "/dev/pts", "type": "devpts", "source": "devpts", "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"] },
    { "destination": "/dev/shm", "type": "tmpfs", "source": "shm", "options": ["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"] },'
    rm -rf "$dir"
    mkdir -p "$dir/rootfs" "$ctl"
    for ((i = 0; i < RANKS; i++)); do mkdir -p "$ctl/rank$i"; done
    for i in usr etc proc sys dev tmp ctl "${W#/}"; do mkdir -p "$dir/rootfs/$i"; done
    for i in bin lib lib64 sbin; do ln -s "usr/$i" "$dir/rootfs/$i"; done
    write_runc_config "$dir/config.json" "$id" "$ctl" "$(pod_args)" "$devices" "$allow" "$devmounts" "$env" "$hooks"
}

# pod_round CTL K NAME: go<K> to every rank, then each rank's report (S/NAME-rank<R>-report<K>.json); status in
# S/NAME-round<K>.rc (1 when a rank did not answer).
pod_round() {
    local ctl=$1 k=$2 name=$3 r rc=0
    for ((r = 0; r < RANKS; r++)); do : >"$ctl/rank$r/go$k"; done
    for ((r = 0; r < RANKS; r++)); do
        wait_file "$ctl/rank$r/done$k" || rc=1
        [ -f "$ctl/rank$r/report$k.json" ] && cp "$ctl/rank$r/report$k.json" "$S/$name-rank$r-report$k.json"
    done
    echo "$rc" >"$S/$name-round$k.rc"
    return "$rc"
}

# pod_ready CTL NAME: every rank wrote `ready`; status in S/NAME-ready.rc.
pod_ready() {
    local r rc=0
    for ((r = 0; r < RANKS; r++)); do wait_file "$1/rank$r/ready" || rc=1; done
    echo "$rc" >"$S/$2-ready.rc"
    return "$rc"
}

# images_sum IMG: a checksum of every file of an image directory (what must not change when a restore is refused).
images_sum() { (cd "$1" && find . -type f -print0 | sort -z | xargs -0 sha256sum); }

# checkpoint NAME K C ID: `runc checkpoint` K of the container into C/imgK; its log in S/NAME-dumpK.log.
checkpoint() {
    local name=$1 k=$2 c=$3 id=$4
    mkdir -p "$c/img$k" "$c/img$k.work"
    step "$name-checkpoint$k" runc_ checkpoint --image-path "$c/img$k" --work-path "$c/img$k.work" "$id"
    cp "$c/img$k.work/dump.log" "$S/$name-dump$k.log" 2>/dev/null
    ls "$c/img$k" >"$S/$name-images$k.txt" 2>&1
    [ "$(cat "$S/$name-checkpoint$k.rc")" = 0 ]
}

# restore NAME TAG C ID K [ENV=VALUE...]: `runc restore -d` of C/imgK with the bundle C/bundle (runc's environment
# plus the assignments); its log in S/NAME-TAG.log, the restored container's /dev in S/NAME-TAG-dev.txt, the inode
# of its pid namespace in S/NAME-pidns.txt.
restore() {
    local name=$1 tag=$2 c=$3 id=$4 k=$5 pid
    shift 5
    rm -rf "$c/img$k.$tag"
    mkdir -p "$c/img$k.$tag"
    (
        # shellcheck disable=SC2163 # the arguments are NAME=VALUE pairs to export
        [ $# -gt 0 ] && export "$@"
        piped_runc "$name-$tag" restore -d --bundle "$c/bundle" --image-path "$c/img$k" --work-path "$c/img$k.$tag" "$id"
    )
    cp "$c/img$k.$tag/restore.log" "$S/$name-$tag.log" 2>/dev/null
    [ "$(cat "$S/$name-$tag.rc")" = 0 ] || return 1
    pid=$(container_pid "$id")
    ls "/proc/$pid/root/dev/" >"$S/$name-$tag-dev.txt" 2>&1
    stat -L -c %i "/proc/$pid/ns/pid" >"$S/$name-pidns.txt" 2>&1
}

# finish NAME ID: after the last round, the ranks and the launcher exit; the registrations left (NAME-left.txt),
# none of which may be of the last restored container's pid namespace (NAME-pidns.txt, written by restore).
finish() {
    local name=$1 id=$2 pid
    pid=$(container_pid "$id")
    for _ in $(seq 100); do
        if [ -z "$pid" ] || [ ! -d "/proc/$pid" ]; then break; fi
        sleep 0.1
    done
    (cd "$W/state" && for r in reg-*; do [ -d "$r" ] && echo "$r $(cat "$r/key" 2>/dev/null)"; done) >"$S/$name-left.txt"
    runc_ delete -f "$id" >/dev/null 2>&1
}

# start NAME FORM INDEX...: a fresh state directory, node A, the pod given node A's GPUs INDEX...; round 1. Sets C and
# ID; returns 1 when a step failed.
start() {
    local name=$1 form=$2
    shift 2
    ID=ccm-rpod-$name-$$
    C=$S/rpod-$name
    rm -rf "$W/state" "$C"
    mkdir -p "$W/state" "$C"
    on_node a
    HOOK=1 make_pod_bundle "$C/bundle" "$C/ctl" "$ID" "$form" a "$@"
    piped_runc "$name-run" run -d --bundle "$C/bundle" "$ID" || return 1
    pod_ready "$C/ctl" "$name" || return 1
    pod_round "$C/ctl" 1 "$name"
}

case_seed() {
    ROUNDS=3
    start seed cdi 0 1 2 3 || return 0
    checkpoint seed 1 "$C" "$ID" || return 0
    on_node b
    # Node B gives the container three GPUs: refused before CRIU restores anything, the images unchanged.
    images_sum "$C/img1" >"$S/seed-images-before.sum"
    make_pod_bundle "$C/bundle" "$C/ctl" "$ID" cdi b 2 4 6
    restore seed refused "$C" "$ID" 1
    images_sum "$C/img1" >"$S/seed-images-after.sum"
    runc_ delete -f "$ID" >/dev/null 2>&1
    # Then four: 63/83/E3/F3.
    make_pod_bundle "$C/bundle" "$C/ctl" "$ID" cdi b 2 4 6 7
    restore seed restore1 "$C" "$ID" 1 || return 0
    pod_round "$C/ctl" 2 seed || return 0
    # Chained: back to node A, onto 83/93/E3/F3.
    checkpoint seed 2 "$C" "$ID" || return 0
    on_node a
    make_pod_bundle "$C/bundle" "$C/ctl" "$ID" cdi a 4 5 6 7
    restore seed restore2 "$C" "$ID" 2 || return 0
    pod_round "$C/ctl" 3 seed
    finish seed "$ID"
}

case_noreconcile() {
    ROUNDS=2
    start noreconcile cdi 0 1 2 3 || return 0
    checkpoint noreconcile 1 "$C" "$ID" || return 0
    on_node b
    make_pod_bundle "$C/bundle" "$C/ctl" "$ID" cdi b 2 4 6 7
    restore noreconcile restore1 "$C" "$ID" 1 CRIU_CUDA_MIGRATE_RECONCILE=off || return 0
    pod_round "$C/ctl" 2 noreconcile
    finish noreconcile "$ID"
}

case_legacy() {
    ROUNDS=2
    start legacy legacy 0 1 2 3 || return 0
    cp "$C/bundle/config.json" "$S/legacy-run-config.json"
    checkpoint legacy 1 "$C" "$ID" || return 0
    on_node b
    make_pod_bundle "$C/bundle" "$C/ctl" "$ID" legacy b 2 4 6 7
    restore legacy restore1 "$C" "$ID" 1 || return 0
    pod_round "$C/ctl" 2 legacy
    finish legacy "$ID"
}

: >"$S/flow.log"
: >"$S/host-adjustments.txt"
: >"$HELPERS"

# --- install, as the user guide says; cgroup2 only (install_with_cgroup2, common.sh)
install_with_cgroup2 step || exit 0
echo "$HYBRID" >"$S/hybrid"

# --- CRIU: the plugin's libdir line in /etc/criu/runc.conf only
runc_conf_with_plugin "$HYBRID" "$S/host-adjustments.txt"

# --- the simulated stack: the doubles, the workload, the two nodes' GPU sets, the legacy hook's stand-in
mkdir -p "$W/lib" "$W/bin" "$W/state"
cp "$S/sim-bin/libcuda_test_double.so" "$W/lib/libcuda.so.1"
cp "$S/sim-bin/libnvml_test_double.so" "$W/lib/libnvidia-ml.so.1"
cp "$S/sim-bin/ccm-sample-workload" "$W/bin/"
node_gpu_set a >"$W/node-a.json"
node_gpu_set b >"$W/node-b.json"
cat >"$W/legacy-hook.sh" <<'HOOK'
# A stand-in for nvidia-container-runtime-hook (an OCI prestart hook): the GPU nodes of the given minors in the
# container's /dev, made in the container's mount namespace below the bundle's rootfs (before pivot_root).
state=$(cat)
pid=$(printf '%s' "$state" | sed -n 's/.*"pid": *\([0-9][0-9]*\).*/\1/p')
bundle=$(printf '%s' "$state" | sed -n 's/.*"bundle": *"\([^"]*\)".*/\1/p')
for m in "$@"; do
    nsenter -t "$pid" -m mknod -m 666 "$bundle/rootfs/dev/nvidia$m" c 195 "$m" || exit 1
done
HOOK
# What runc passes on to CRIU and so to the plugin and its driver agent.
export CCM_SIM_CONFIG=$W/gpus.json CCM_SIM_STATE_DIR=$W/state CCM_SIM_CALL_TIMEOUT_MS=20000
export CRIU_CUDA_MIGRATE_LIBCUDA=$W/lib/libcuda.so.1 CRIU_CUDA_MIGRATE_LIBNVML=$W/lib/libnvidia-ml.so.1
# The pod's ranks are several CUDA processes, and the test doubles have no kernel driver for the importer check: the
# default (check) would refuse them; warn dumps them, as a node whose check cannot run would be told to.
export CRIU_CUDA_MIGRATE_MULTI_PROCESS=warn
unset LD_LIBRARY_PATH CUDA_VISIBLE_DEVICES CCM_SIM_VISIBLE CCM_SIM_FAULTS CRIU_CUDA_MIGRATE_DEVICE_MAP \
    CRIU_CUDA_MIGRATE_USABLE_GPUS CRIU_CUDA_MIGRATE_MODE CRIU_CUDA_MIGRATE_DISABLE CRIU_CUDA_MIGRATE_RECONCILE \
    CRIU_CUDA_MIGRATE_LEAVE_RUNNING
for n in a b; do
    for i in 0 1 2 3 4 5 6 7; do echo "$n $i $(gpu_uuid "$n" "$i") 0000:${BUSES[i]}:00.0"; done
done >"$S/rpod-gpus.txt"

for c in $CASES; do
    t0=$SECONDS
    "case_$c"
    note "$c: done in $((SECONDS - t0)) s"
    runc_ delete -f "ccm-rpod-$c-$$" >/dev/null 2>&1
done
