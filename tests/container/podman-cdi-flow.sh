#!/usr/bin/env bash
# Podman with a CDI GPU (issue 25), on the TEST DOUBLES: a CUDA container given its GPU as `--device
# nvidia.com/gpu=0`, checkpointed to a portable archive and restored from it. Run inside a copy of the runtimes root
# (`tests/criu-root.sh prepare-runtimes`) by tests/container_runtime.rs:
#
#   bash tests/container/podman-cdi-flow.sh SCRATCH [runc|crun]
#
# SCRATCH holds package.deb and sim-bin/ (the libcuda and NVML doubles and ccm-sample-workload of the build under
# test) and receives every step's status (`pcdi-RUNTIME-NAME.rc`, .out, .err), CRIU's logs, the workload's reports,
# the restored containers' specs and /dev listings, for the Rust test to check. A failed step is recorded and what
# depends on it skipped; the script itself exits 0. The OCI runtime is runc (default) or crun.
#
# The setup, as a user's node has it:
#   - the package installed with dpkg -i, the libdir line in the file the runtime's CRIU reads (section 3 of the user
#     guide): /etc/criu/runc.conf for runc; /etc/criu/crun.conf for crun >= 1.26 with libcriu >= 4.2 (forky), else
#     /etc/criu/default.conf (trixie's crun 1.21). On a hybrid cgroup v1 host crun 1.21 cannot pass CRIU the
#     `manage-cgroups=ignore` it needs there, so its restores are not attempted (`pcdi-crun-restore.skipped` says
#     why; podman-flow.sh has the details), only its checkpoints;
#   - a CDI spec of the doubles' two GPUs in /etc/cdi/ccm-sim.json (write_sim_cdi_spec, common.sh): device `0` is
#     /dev/nvidia0 (195:0), `1` /dev/nvidia1 (195:1), with /dev/nvidiactl, the doubles' environment and directory;
#   - an image made locally (no registry): busybox, the sample workload and the C libraries it and the doubles need
#     (`podman import` of that root);
#   - the container: `podman run --device nvidia.com/gpu=0 --network none`, the sample workload holding 8 MiB on its
#     ordinal 0, its control directory bound at /ctl. CDI puts /dev/nvidia0 into the spec's linux.devices, and the
#     doubles then show the container that GPU only (their container view: the /dev/nvidiaN nodes it has).
#
# What the doubles need that the real driver does not (`pcdi-RUNTIME-sim-adjustments.txt`): CRIU's plugin finds the libcuda
# and NVML doubles, their GPU set and their state directory through the environment (CRIU_CUDA_MIGRATE_LIBCUDA /
# LIBNVML, CCM_SIM_CONFIG, CCM_SIM_STATE_DIR), and podman runs `runc checkpoint` with an environment of its own
# (PATH and XDG_RUNTIME_DIR only). So the container's runtime is /usr/local/lib/ccm-sim/RUNTIME, a script that adds
# those variables and execs the real runtime (CRIU's parent is then runc or crun, whose spec the plugin reads). A real
# node's libcuda is found by the dynamic linker and needs no variable.
#
# Cases, one container and one workload process through all of them (--rounds 6; round k writes report<k>.json):
#   round 1 on G0;
#   lr:       `podman container checkpoint --leave-running --export`: the container keeps running; round 2 on G0;
#   export:   `podman container checkpoint --export A1` (the container stops), `podman rm`;
#   refused:  `podman container restore --import A1` with CRIU_CUDA_MIGRATE_USABLE_GPUS naming a GPU this node does
#             not have (conmon_env_vars in a CONTAINERS_CONF_OVERRIDE file, as the user guide says): the plugin's
#             preflight refuses before CRIU restores anything; the archive is byte-identical, no workload is left;
#   same:     `restore --import A1`: round 3 on G0; the plugin took the usable set from the restoring runtime's spec
#             (linux.devices /dev/nvidia0, what CDI gave the container);
#   respec:   `checkpoint --export A2`, rm; the node's CDI spec changes so that `nvidia.com/gpu=0` is /dev/nvidia1
#             (another node, where the same CDI name is another GPU); `restore --import A2`: round 4. Podman's
#             restore --import takes no --device and reuses the checkpoint's spec.dump (read in Podman's source:
#             libpod's importCheckpointTar -> generateContainerSpec from the dumped spec, CDI not resolved again), so
#             the restored spec is expected to keep /dev/nvidia0; the restored spec (`pcdi-RUNTIME-respec-spec.json`) and round
#             4's GPU say what happened, and the test checks that the plugin followed that spec either way;
#   usable:   `checkpoint --export A3`, rm, the original CDI spec back; `restore --import A3` with
#             CRIU_CUDA_MIGRATE_USABLE_GPUS=G1 through conmon_env_vars: the plugin moves the process G0 -> G1 and
#             gives the restored /dev nvidia1 instead of nvidia0 (CRIU restored the dumped /dev); round 5 on G1.
#   round 6: the workload exits.
#
# Every process the flow starts is ended by the EXIT trap (podman rm, then whatever is left in this run's cgroup).
set -u
# No -e (nor pipefail): a status-recording flow. Each step's status goes to S/NAME.rc and the flow goes on;
# the Rust test reads the statuses and names the step that broke.

S=$1
RT=${2:-runc}
P=pcdi-$RT
IMAGE=localhost/ccm-cuda:1
NAME=ccm-cdi
G0=GPU-5e110000-aabb-ccdd-0001-020304050600
G1=GPU-5e110001-aabb-ccdd-0001-020304050601
GDEAD=GPU-00000000-0000-0000-0000-00000000dead
SIM=$S/$P-sim
CTL=$S/$P-ctl
CDI=/etc/cdi/ccm-sim.json
SIMRT=/usr/local/lib/ccm-sim/$RT
CGROUP_PARENT=/ccm-pcdi-$RT-$$
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

# step, pstep, ok, note, podman_criu_conf, sim_runtime, podman_cuda_image, checkpoint_export, restore_import,
# override, after_restore, static_dir, write_sim_cdi_spec, sim_stack, nvidia_nodes, procs_running, archive_tools
# shellcheck source=tests/container/common.sh
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"

# round K: go<K>, then report<K>.json copied to S/P-report<K>.json; status in S/P-round<K>.rc.
round() {
    local k=$1 rc=0
    : >"$CTL/go$k"
    wait_file "$CTL/done$k" || rc=1
    [ -f "$CTL/report$k.json" ] && cp "$CTL/report$k.json" "$S/$P-report$k.json"
    echo "$rc" >"$S/$P-round$k.rc"
    return "$rc"
}

trap 'podman_cleanup "$CGROUP_PARENT"' EXIT

touch "$S/flow.log"
: >"$S/$P-host-adjustments.txt"

# --- install, as the user guide says; cgroups: cgroup2 only (podman-flow.sh says why; install_with_cgroup2, common.sh)
install_with_cgroup2 pstep || exit 0
echo "$HYBRID" >"$S/$P-hybrid"

mkdir -p /etc/criu
podman_storage_and_conf "$HYBRID" "$S/$P-host-adjustments.txt"
# The file this runtime's CRIU reads (podman-flow.sh: crun.conf needs crun 1.26 and libcriu 4.2).
podman_criu_conf "$RT" || exit 0

# --- the doubles, their CDI spec, and the runtime that hands their environment to CRIU
sim_stack "$SIM" "$S/sim-bin" "$G0" "$G1"
echo "$G0 $G1" >"$S/$P-gpus.txt"
write_sim_cdi_spec "$CDI" "$SIM" 0 1
cp "$CDI" "$S/$P-cdi.json"
sim_runtime "$SIMRT" "$RT_BIN" "$SIM"

# --- the image: busybox, the workload, the C libraries (no registry)
podman_cuda_image "$IMAGE" "$SIM" || exit 0

# --- the container, given GPU 0 through CDI
mkdir -p "$CTL"
pstep run podman run --runtime "$SIMRT" -d --name "$NAME" --network none --cgroup-parent "$CGROUP_PARENT" \
    --device nvidia.com/gpu=0 -v "$CTL:/ctl" "$IMAGE" \
    /usr/local/bin/ccm-sample-workload --dir /ctl --mib 8 --devices 0 --rounds 6 || exit 0
if ! wait_file "$CTL/ready"; then
    echo 1 >"$S/$P-ready.rc"
    podman logs "$NAME" >"$S/$P-ready.err" 2>&1
    exit 0
fi
echo 0 >"$S/$P-ready.rc"
cp "$(static_dir)/config.json" "$S/$P-run-spec.json" 2>/dev/null
nvidia_nodes "$S/$P-run-spec.json" >"$S/$P-run-spec-nodes.txt"
round 1 || exit 0

# --- lr: a checkpoint that leaves the container running
checkpoint_export lr "$S/$P-lr.tar.gz" --leave-running
round 2 || exit 0
note "lr: done"

# --- export: the portable checkpoint; the container stops
checkpoint_export export "$S/$P-a1.tar.gz" || exit 0
pstep export-rm podman rm "$NAME" || exit 0
# What checkpointctl (forky's 1.3) and criu-cuda-migrate tell of an export that holds the plugin's identity image.
archive_tools "$S/$P-a1.tar.gz" "$P-a1"
sha256sum <"$S/$P-a1.tar.gz" >"$S/$P-a1.sum-before"
note "export: done"
[ "$RESTORES" = 1 ] || exit 0

# --- refused: a usable set this node cannot serve; the preflight refuses, the archive stays as it was
override "$S/$P-refuse.conf" "CRIU_CUDA_MIGRATE_USABLE_GPUS=$GDEAD"
restore_import refused "$S/$P-a1.tar.gz" "$S/$P-refuse.conf"
find /var/lib/containers -name restore.log -newer "$S/$P-refuse.conf" -exec cat {} + >"$S/$P-refused-restore.log" 2>/dev/null
sha256sum <"$S/$P-a1.tar.gz" >"$S/$P-a1.sum-after"
podman ps -a --format '{{.Names}} {{.Status}}' >"$S/$P-refused-ps.txt" 2>>"$S/$P-inspect.err"
procs_running ccm-sample-workload >"$S/$P-refused-procs.txt"
podman rm --force --time 0 "$NAME" >/dev/null 2>&1
note "refused: done"

# --- same: the same archive restored on this node; the spec's CDI device says which GPU
restore_import same "$S/$P-a1.tar.gz"
after_restore same
ok same-restore || exit 0
round 3 || exit 0
note "same: done"

# --- respec: the node's CDI spec now says nvidia.com/gpu=0 is /dev/nvidia1 (another node)
checkpoint_export respec "$S/$P-a2.tar.gz" || exit 0
pstep respec-rm podman rm "$NAME" || exit 0
write_sim_cdi_spec "$CDI" "$SIM" 1 0
cp "$CDI" "$S/$P-cdi-other-node.json"
restore_import respec "$S/$P-a2.tar.gz"
after_restore respec
ok respec-restore || exit 0
round 4 || exit 0
note "respec: done"

# --- usable: the move onto G1 through the usable set given to conmon (the original CDI spec back)
checkpoint_export usable "$S/$P-a3.tar.gz" || exit 0
pstep usable-rm podman rm "$NAME" || exit 0
write_sim_cdi_spec "$CDI" "$SIM" 0 1
override "$S/$P-usable.conf" "CRIU_CUDA_MIGRATE_USABLE_GPUS=$G1"
restore_import usable "$S/$P-a3.tar.gz" "$S/$P-usable.conf"
after_restore usable
ok usable-restore || exit 0
round 5 || exit 0
note "usable: done"

round 6
for _ in $(seq 100); do [ "$(podman inspect --format '{{.State.Status}}' "$NAME" 2>/dev/null)" = exited ] && break; sleep 0.1; done
podman inspect --format '{{.State.Status}} {{.State.ExitCode}}' "$NAME" >"$S/$P-final.state" 2>>"$S/$P-inspect.err"
note "done"
