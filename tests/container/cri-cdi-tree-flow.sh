#!/usr/bin/env bash
# containerd 2.1's CRI with a CDI GPU and a torchrun-like tree (issue 46), on the TEST DOUBLES: a pod's container
# given one GPU of the doubles' two (`CDI_devices: [nvidia.com/gpu=0]`) runs an agent with CUDA ranks, each with
# DataLoader-like workers forked after cuInit that hold the GPU's nodes; the kubelet's checkpoint (CheckpointContainer,
# the container runs on), then the restore Kubernetes users do: a new container created from the archive and given
# the OTHER GPU by its own CDI device. Run inside a copy of the forky runtimes root (`CCM_CRIU_SUITE=forky
# tests/criu-root.sh prepare-runtimes`) by tests/container_runtime.rs:
#
#   bash tests/container/cri-cdi-tree-flow.sh SCRATCH [RANKS [WORKERS]]
#
# SCRATCH holds package.deb and sim-bin/ (the doubles and ccm-sample-workload) and receives every step's status
# (`ctree-NAME.rc`, .out, .err), CRIU's logs, the ranks' reports, the specs and what every process of the tree holds
# (`ctree-CASE-tree.txt`, tree_holdings in common.sh). RANKS (2) and WORKERS (2 per rank).
#
# The setup is cri-cdi-flow.sh's (containerd 2.1 with the CRI plugin and its runc shim, a loopback registry, the
# plugin's libdir line in /etc/criu/runc.conf), with podman-cdi-tree-flow.sh's stand-ins: /dev/loop-control as
# /dev/nvidiactl and a loop block device as each /dev/nvidiaN (a worker can hold and map them, CRIU cannot dump them),
# named by the CDI spec, and CCM_TEST_DOUBLE_NVIDIA_DEVICES plus CRIU_CUDA_MIGRATE_MULTI_PROCESS=warn in containerd's
# environment (which its shim, runc and CRIU inherit; podman-cdi-tree-flow.sh's header says why each).
#
# The move: containerd builds the restored container's spec from the new request (linux.devices /dev/nvidia1, its
# devices cgroup allowing G1's node), while CRIU restores the dumped container's /dev (nvidia0 only). CRIU reopens
# the workers' descriptors (RESTORE_EXT_FILE, in each restored task) before the plugin fixes /dev for the driver's
# restore (RESUME_DEVICES_LATE): the plugin adds /dev/nvidia1 to the restored /dev at the reopen.
#
# Cases (each rank runs --rounds 3; round k writes report<k>.json, copied to S/ctree-CASE-wR-report<k>.json):
#   run:      the tree as started; round 1 on G0; CheckpointContainer (leave-running: the plugin rolls the ranks
#             back), round 2 on G0;
#   restored: the old container removed, a new one from the archive with CDI_devices [nvidia.com/gpu=1]; the tree as
#             restored (every worker holding /dev/nvidia1), round 2 (the archive was taken after round 1) on G1; the
#             workers told to exit, round 3 reports that every one exited 7.
set -u
# No -e (nor pipefail): a status-recording flow. Each step's status goes to S/NAME.rc and the flow goes on;
# the Rust test reads the statuses and names the step that broke.

S=$1
RANKS=${2:-2}
WORKERS=${3:-2}
P=ctree
D=/tmp/ccm-ctree
SOCK=$D/containerd.sock
IMAGE=localhost/ccm-cuda-tree:1
PAUSE=localhost/ccm-pause:1
CGROUP_PARENT=/ccm-ctree-$$
G0=GPU-5e110000-aabb-ccdd-0001-020304050600
G1=GPU-5e110001-aabb-ccdd-0001-020304050601
SIM=$S/$P-sim
CTL=$S/$P-ctl
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

# step, pstep, ok, note, make_image, cuda_rootfs, write_sim_cdi_spec, sim_stack, runc_for_cri_shim, start_registry,
# write_cri_config, cri, field, state, task_pid, bundle_of, cri_runc_conf, cri_images, cri_restored, cri_cleanup,
# nvidia_nodes, rounds, tree_holdings, tree_doubles, ranks_ready; tests/lib/common.sh: wait_file
# shellcheck source=tests/container/common.sh
. "$HERE/common.sh"

# shellcheck disable=SC2317 # run by the EXIT trap
cleanup() {
    local l
    cri_cleanup 1
    for l in "${LOOPS[@]}"; do losetup -d "$l" 2>/dev/null; done
}
LOOPS=()
trap cleanup EXIT

touch "$S/flow.log"
[ -f /etc/criu/criu-cuda-migrate.conf.example ] ||
    pstep install env DEBIAN_FRONTEND=noninteractive dpkg -i "$S/package.deb" || exit 0
mountpoint -q /sys/fs/cgroup || mount -t cgroup2 cgroup2 /sys/fs/cgroup
mkdir -p "$D" "$S/$P-logs" "$CTL"
cri_runc_conf "$S/$P-runc.conf"

# The stand-in nodes, the doubles, their CDI spec naming the stand-ins.
rm -f /etc/cdi/*.json /etc/cdi/*.yaml
tree_doubles /etc/cdi/ccm-sim.json || exit 0

runc_for_cri_shim "$S/$P-host-adjustments.txt"
start_registry "$D" "$S/$P-registry.log"
REG_IMAGE=$REG/ccm-cuda-tree:1

write_cri_config "$D/config.toml" "$S/$P-criu-work" 1
env CRIU_CUDA_MIGRATE_LIBCUDA="$SIM/lib/libcuda.so.1" CRIU_CUDA_MIGRATE_LIBNVML="$SIM/lib/libnvidia-ml.so.1" \
    CCM_SIM_CONFIG="$SIM/gpus.json" CCM_SIM_STATE_DIR="$SIM/state" CCM_SIM_CALL_TIMEOUT_MS=20000 \
    CCM_TEST_DOUBLE_NVIDIA_DEVICES="$STAND_INS" CRIU_CUDA_MIGRATE_MULTI_PROCESS=warn \
    containerd --config "$D/config.toml" >"$S/$P-containerd.log" 2>&1 &
CONTAINERD_PID=$!
echo "containerd's environment: the doubles (CRIU_CUDA_MIGRATE_LIBCUDA/LIBNVML, CCM_SIM_CONFIG, CCM_SIM_STATE_DIR)," \
    "their stand-in nodes (CCM_TEST_DOUBLE_NVIDIA_DEVICES) and CRIU_CUDA_MIGRATE_MULTI_PROCESS=warn" \
    >"$S/$P-sim-adjustments.txt"

# The images: busybox (with mkdir for the agent), the workload, its libraries and the agent; the sandbox's.
R=/tmp/ccm-ctree-rootfs
rm -rf "$R"
cuda_rootfs "$R" "$S/sim-bin/ccm-sample-workload" "$SIM/lib/libcuda.so.1" "$SIM/lib/libnvidia-ml.so.1"
cp "$HERE/tree-agent.sh" "$R/usr/local/bin/"
mkdir -p "$R/bin" && ln -sf busybox "$R/bin/mkdir"
make_image /tmp/ccm-ctree-oci.tar "$IMAGE" '["/bin/sh","/usr/local/bin/tree-agent.sh"]' "$R"
make_image /tmp/ccm-ctree-pause-oci.tar "$PAUSE" '["/bin/sleep","2147483647"]'
cri_images pstep /tmp/ccm-ctree-oci.tar /tmp/ccm-ctree-pause-oci.tar || exit 0

POD_CONFIG=$(printf '{"metadata":{"name":"ccm-tree-pod","uid":"ccm-tree-pod-uid-%s","namespace":"default","attempt":0},"log_directory":"%s","linux":{"cgroup_parent":"%s","security_context":{"namespace_options":{"network":2,"pid":1,"ipc":0}}}}' \
    "$$" "$S/$P-logs" "$CGROUP_PARENT")
pstep runp cri RunPodSandbox "{\"config\":$POD_CONFIG}" || exit 0
POD=$(field "$S/$P-runp.out" pod_sandbox_id)

# --- run: the agent given GPU 0 through CRI's CDI field (PATH for the workload: CRI's KeyValue.value is bytes, base64
# in protobuf's JSON)
CTR_CONFIG=$(printf '{"metadata":{"name":"tree","attempt":0},"image":{"image":"%s"},"command":["/bin/sh","/usr/local/bin/tree-agent.sh"],"args":["%s","%s","3"],"envs":[{"key":"PATH","value":"%s"}],"mounts":[{"container_path":"/ctl","host_path":"%s"}],"CDI_devices":[{"name":"nvidia.com/gpu=0"}],"log_path":"tree.log","linux":{"security_context":{"namespace_options":{"network":2,"pid":1,"ipc":0}}}}' \
    "$REG_IMAGE" "$RANKS" "$WORKERS" "$(printf /usr/local/bin:/bin | base64)" "$CTL")
pstep create cri CreateContainer "{\"pod_sandbox_id\":\"$POD\",\"config\":$CTR_CONFIG,\"sandbox_config\":$POD_CONFIG}" || exit 0
CTR=$(field "$S/$P-create.out" container_id)
pstep start cri StartContainer "{\"container_id\":\"$CTR\"}" || exit 0
cp "$(bundle_of "$CTR")/config.json" "$S/$P-run-spec.json" 2>/dev/null
nvidia_nodes "$S/$P-run-spec.json" >"$S/$P-run-spec-nodes.txt"
if ! ranks_ready; then
    cat "$S/$P-logs/tree.log" >"$S/$P-ready.err" 2>/dev/null
    exit 0
fi
tree_holdings run "$(task_pid "$CTR")"
rounds run 1 || exit 0

# The kubelet's checkpoint of the whole tree: the container keeps running.
pstep checkpoint cri CheckpointContainer "{\"container_id\":\"$CTR\",\"location\":\"$S/$P-checkpoint.tar\",\"timeout\":60}"
state "$CTR" >"$S/$P-after-checkpoint.state" 2>&1
tar -xOf "$S/$P-checkpoint.tar" dump.log >"$S/$P-dump.log" 2>/dev/null
[ -s "$S/$P-dump.log" ] || tar -xOf "$S/$P-checkpoint.tar" ./dump.log >"$S/$P-dump.log" 2>/dev/null
[ -f "$S/$P-checkpoint.tar" ] || exit 0
pstep inspect criu-cuda-migrate inspect "$S/$P-checkpoint.tar"
rounds run 2
note "checkpoint: done"

# --- restored: the old container goes; a new one from the archive, given GPU 1 through CDI, with the same control
# directories (round 2's files of the running container removed: the archive was taken after round 1).
pstep stop cri StopContainer "{\"container_id\":\"$CTR\",\"timeout\":0}"
pstep rm cri RemoveContainer "{\"container_id\":\"$CTR\"}"
for ((r = 0; r < RANKS; r++)); do rm -f "$CTL/w$r/go2" "$CTL/w$r/done2" "$CTL/w$r/report2.json"; done
RESTORE_CONFIG=$(printf '{"metadata":{"name":"tree-restored","attempt":0},"image":{"image":"%s"},"mounts":[{"container_path":"/ctl","host_path":"%s"}],"CDI_devices":[{"name":"nvidia.com/gpu=1"}],"log_path":"tree-restored.log","linux":{"security_context":{"namespace_options":{"network":2,"pid":1,"ipc":0}}}}' \
    "$S/$P-checkpoint.tar" "$CTL")
pstep restore-create cri CreateContainer "{\"pod_sandbox_id\":\"$POD\",\"config\":$RESTORE_CONFIG,\"sandbox_config\":$POD_CONFIG}" || exit 0
RESTORED=$(field "$S/$P-restore-create.out" container_id)
pstep restore-start cri StartContainer "{\"container_id\":\"$RESTORED\"}"
cri_restored "$P" "$RESTORED"
ok restore-start || exit 0
AGENT=$(task_pid "$RESTORED")
[ -n "$AGENT" ] && ls "/proc/$AGENT/root/dev/" >"$S/$P-restore-dev.txt" 2>&1
tree_holdings restored "$AGENT"
rounds restored 2 || exit 0
# The end of the job: every worker is told to exit, round 3 reports whether each exited 7.
for ((r = 0; r < RANKS; r++)); do : >"$CTL/w$r/child-exit"; done
rounds restored 3
note "restored: done"
exit 0
