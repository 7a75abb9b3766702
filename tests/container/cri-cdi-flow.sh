#!/usr/bin/env bash
# containerd 2.1's CRI with a CDI GPU (issue 25), on the TEST DOUBLES: the kubelet's calls for a CUDA container given
# its GPU through CRI's `CDI_devices` field, the kubelet's checkpoint (CheckpointContainer) and the restore Kubernetes
# users do (a new container created from the checkpoint archive), given ANOTHER GPU by its own CDI device. Run inside
# a copy of the forky runtimes root (`CCM_CRIU_SUITE=forky tests/criu-root.sh prepare-runtimes`) by
# tests/container_runtime.rs:
#
#   bash tests/container/cri-cdi-flow.sh SCRATCH
#
# SCRATCH holds package.deb and sim-bin/ (the doubles and ccm-sample-workload); every step's status goes to
# SCRATCH/ccdi-NAME.rc, its output to .out/.err, as in cri-flow.sh, whose CRI client (cri_client.py) and setup this
# flow shares: containerd 2.1 with the CRI plugin and its runc shim, the plugin's libdir line in /etc/criu/runc.conf
# only, a loopback registry (containerd 2.1's restore pulls the checkpoint's base image by NAME@DIGEST).
#
#   1. The CDI spec of the doubles' two GPUs in /etc/cdi/ccm-sim.json (write_sim_cdi_spec, common.sh); containerd 2.1
#      has CDI on by default with spec directories /etc/cdi and /var/run/cdi (set explicitly here).
#   2. The image: busybox, the sample workload and its C libraries, pushed to the registry.
#   3. A pod on the node's network; CreateContainer with CDI_devices [nvidia.com/gpu=0]: CDI puts /dev/nvidia0 into
#      the spec's linux.devices, so the doubles show the container G0 only. Round 1 on G0.
#   4. CheckpointContainer: the container keeps running (round 2 on G0, the plugin rolled the driver state back).
#   5. The container is stopped and removed; CreateContainer from the archive with CDI_devices [nvidia.com/gpu=1] and
#      StartContainer: containerd builds the restored container's spec from the NEW request (its CDI devices
#      resolved again: /dev/nvidia1 in linux.devices), so the plugin, without any usable-GPU setting (containerd's
#      environment has none), moves the process G0 -> G1 and gives the restored /dev nvidia1 instead of nvidia0.
#      Round 2 of the restored process (the checkpoint was taken after round 1; its control directory is a new one)
#      on G1; then round 3 and it exits.
#
# What the doubles need that the real driver does not: containerd's environment (which its shim, runc and CRIU
# inherit) names the doubles (CRIU_CUDA_MIGRATE_LIBCUDA / LIBNVML, CCM_SIM_CONFIG, CCM_SIM_STATE_DIR).
set -u
# No -e (nor pipefail): a status-recording flow. Each step's status goes to S/NAME.rc and the flow goes on;
# the Rust test reads the statuses and names the step that broke.

S=$1
D=/tmp/ccm-ccdi
SOCK=$D/containerd.sock
IMAGE=localhost/ccm-cuda:1
PAUSE=localhost/ccm-pause:1
CGROUP_PARENT=/ccm-ccdi-$$
G0=GPU-5e110000-aabb-ccdd-0001-020304050600
G1=GPU-5e110001-aabb-ccdd-0001-020304050601
SIM=$S/ccdi-sim
CTL=$S/ccdi-ctl
CTL2=$S/ccdi-ctl-restored
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

# step, make_image, cuda_rootfs, write_sim_cdi_spec, sim_stack, cri, field, state, task_pid, bundle_of, cri_runc_conf,
# cri_images, cri_restored, cri_cleanup
# shellcheck source=tests/container/common.sh
. "$HERE/common.sh"

note() { printf 'ccdi: %s\n' "$*" >>"$S/flow.log"; }
cstep() {
    local n=$1
    shift
    step "ccdi-$n" "$@"
}

# round DIR K NAME: go<K> in DIR, then its report copied to S/ccdi-NAME-report<K>.json; status in
# S/ccdi-NAME-round<K>.rc.
round() {
    local dir=$1 k=$2 name=$3 rc=0
    : >"$dir/go$k"
    wait_file "$dir/done$k" || rc=1
    [ -f "$dir/report$k.json" ] && cp "$dir/report$k.json" "$S/ccdi-$name-report$k.json"
    echo "$rc" >"$S/ccdi-$name-round$k.rc"
    return "$rc"
}


# shellcheck disable=SC2317 # run by the EXIT trap
cleanup() { cri_cleanup 1; }
trap cleanup EXIT

touch "$S/flow.log"
[ -f /etc/criu/criu-cuda-migrate.conf.example ] ||
    cstep install env DEBIAN_FRONTEND=noninteractive dpkg -i "$S/package.deb" || exit 0
mountpoint -q /sys/fs/cgroup || mount -t cgroup2 cgroup2 /sys/fs/cgroup
mkdir -p "$D" "$S/ccdi-logs" "$CTL" "$CTL2"
cri_runc_conf "$S/ccdi-runc.conf"

# The doubles and their CDI spec.
sim_stack "$SIM" "$S/sim-bin" "$G0" "$G1"
echo "$G0 $G1" >"$S/ccdi-gpus.txt"
rm -f /etc/cdi/*.json /etc/cdi/*.yaml
write_sim_cdi_spec /etc/cdi/ccm-sim.json "$SIM" 0 1
cp /etc/cdi/ccm-sim.json "$S/ccdi-cdi.json"

# The runc of the shim: on a hybrid host without the cpu controller in cgroup2, the wrapper of cri-flow.sh (it drops
# linux.resources.cpu).
runc_for_cri_shim "$S/ccdi-host-adjustments.txt"

start_registry "$D" "$S/ccdi-registry.log"
REG_IMAGE=$REG/ccm-cuda:1

write_cri_config "$D/config.toml" "$S/ccdi-criu-work" 1
cp "$D/config.toml" "$S/ccdi-config.toml"
# containerd's environment: the doubles, and no plugin setting (the restore's GPUs come from the spec).
env CRIU_CUDA_MIGRATE_LIBCUDA="$SIM/lib/libcuda.so.1" CRIU_CUDA_MIGRATE_LIBNVML="$SIM/lib/libnvidia-ml.so.1" \
    CCM_SIM_CONFIG="$SIM/gpus.json" CCM_SIM_STATE_DIR="$SIM/state" CCM_SIM_CALL_TIMEOUT_MS=20000 \
    containerd --config "$D/config.toml" >"$S/ccdi-containerd.log" 2>&1 &
CONTAINERD_PID=$!
echo "containerd's environment: CRIU_CUDA_MIGRATE_LIBCUDA/LIBNVML, CCM_SIM_CONFIG, CCM_SIM_STATE_DIR (the doubles)" \
    >"$S/ccdi-sim-adjustments.txt"

# The images: the CUDA workload's (busybox, the workload, its libraries) and the sandbox's.
R=/tmp/ccm-ccdi-rootfs
rm -rf "$R"
cuda_rootfs "$R" "$S/sim-bin/ccm-sample-workload" "$SIM/lib/libcuda.so.1" "$SIM/lib/libnvidia-ml.so.1"
make_image /tmp/ccm-cuda-oci.tar "$IMAGE" '["/usr/local/bin/ccm-sample-workload"]' "$R"
make_image /tmp/ccm-pause-oci.tar "$PAUSE" '["/bin/sleep","2147483647"]'
cri_images cstep /tmp/ccm-cuda-oci.tar /tmp/ccm-pause-oci.tar || exit 0

POD_CONFIG=$(printf '{"metadata":{"name":"ccm-gpu-pod","uid":"ccm-gpu-pod-uid-%s","namespace":"default","attempt":0},"log_directory":"%s","linux":{"cgroup_parent":"%s","security_context":{"namespace_options":{"network":2,"pid":1,"ipc":0}}}}' \
    "$$" "$S/ccdi-logs" "$CGROUP_PARENT")
cstep runp cri RunPodSandbox "{\"config\":$POD_CONFIG}" || exit 0
POD=$(field "$S/ccdi-runp.out" pod_sandbox_id)

# The container: GPU 0 through CRI's CDI field (what the kubelet passes from a device plugin's CDI answer).
CTR_CONFIG=$(printf '{"metadata":{"name":"cuda","attempt":0},"image":{"image":"%s"},"command":["/usr/local/bin/ccm-sample-workload"],"args":["--dir","/ctl","--mib","8","--devices","0","--rounds","3"],"mounts":[{"container_path":"/ctl","host_path":"%s"}],"CDI_devices":[{"name":"nvidia.com/gpu=0"}],"log_path":"cuda.log","linux":{"security_context":{"namespace_options":{"network":2,"pid":1,"ipc":0}}}}' \
    "$REG_IMAGE" "$CTL")
cstep create cri CreateContainer "{\"pod_sandbox_id\":\"$POD\",\"config\":$CTR_CONFIG,\"sandbox_config\":$POD_CONFIG}" || exit 0
CTR=$(field "$S/ccdi-create.out" container_id)
cstep start cri StartContainer "{\"container_id\":\"$CTR\"}" || exit 0
cp "$(bundle_of "$CTR")/config.json" "$S/ccdi-run-spec.json" 2>/dev/null
nvidia_nodes "$S/ccdi-run-spec.json" >"$S/ccdi-run-spec-nodes.txt"
if ! wait_file "$CTL/ready"; then
    echo 1 >"$S/ccdi-ready.rc"
    cat "$S/ccdi-logs/cuda.log" >"$S/ccdi-ready.err" 2>/dev/null
    exit 0
fi
echo 0 >"$S/ccdi-ready.rc"
round "$CTL" 1 run || exit 0

# The kubelet's checkpoint: the container keeps running.
cstep checkpoint cri CheckpointContainer "{\"container_id\":\"$CTR\",\"location\":\"$S/ccdi-checkpoint.tar\",\"timeout\":60}"
state "$CTR" >"$S/ccdi-after-checkpoint.state" 2>&1
tar -tf "$S/ccdi-checkpoint.tar" >"$S/ccdi-archive.list" 2>&1
tar -xOf "$S/ccdi-checkpoint.tar" dump.log >"$S/ccdi-dump.log" 2>/dev/null
[ -s "$S/ccdi-dump.log" ] || tar -xOf "$S/ccdi-checkpoint.tar" ./dump.log >"$S/ccdi-dump.log" 2>/dev/null
[ -f "$S/ccdi-checkpoint.tar" ] || exit 0
# What checkpointctl (forky's 1.3) and criu-cuda-migrate tell of the kubelet's archive with the identity image.
archive_tools "$S/ccdi-checkpoint.tar" ccdi
round "$CTL" 2 run
note "checkpoint: done"

# The restore: the old container goes; a new one from the archive, given GPU 1 through CDI, with a new control
# directory at the same /ctl (the restored process waits for go2: it was checkpointed after round 1).
cstep stop cri StopContainer "{\"container_id\":\"$CTR\",\"timeout\":0}"
cstep rm cri RemoveContainer "{\"container_id\":\"$CTR\"}"
RESTORE_CONFIG=$(printf '{"metadata":{"name":"cuda-restored","attempt":0},"image":{"image":"%s"},"mounts":[{"container_path":"/ctl","host_path":"%s"}],"CDI_devices":[{"name":"nvidia.com/gpu=1"}],"log_path":"cuda-restored.log","linux":{"security_context":{"namespace_options":{"network":2,"pid":1,"ipc":0}}}}' \
    "$S/ccdi-checkpoint.tar" "$CTL2")
cstep restore-create cri CreateContainer "{\"pod_sandbox_id\":\"$POD\",\"config\":$RESTORE_CONFIG,\"sandbox_config\":$POD_CONFIG}" || exit 0
RESTORED=$(field "$S/ccdi-restore-create.out" container_id)
cstep restore-start cri StartContainer "{\"container_id\":\"$RESTORED\"}"
cri_restored ccdi "$RESTORED"
[ "$(cat "$S/ccdi-restore-start.rc")" = 0 ] || exit 0
PID2=$(task_pid "$RESTORED")
[ -n "$PID2" ] && ls "/proc/$PID2/root/dev/" >"$S/ccdi-restore-dev.txt" 2>&1
round "$CTL2" 2 restored || exit 0
round "$CTL2" 3 restored
note "restore: done"
exit 0
