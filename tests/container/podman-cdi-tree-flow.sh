#!/usr/bin/env bash
# Podman with a CDI GPU and a torchrun-like tree (issue 46), on the TEST DOUBLES: a container given one GPU of the
# doubles' two (`--device nvidia.com/gpu=0`) runs an agent with CUDA ranks, each with DataLoader-like workers forked
# after cuInit that hold the GPU's nodes; it is checkpointed to a portable archive and restored from it with the
# packaged plugin. Run inside a copy of the runtimes root (`tests/criu-root.sh prepare-runtimes`) by
# tests/container_runtime.rs:
#
#   bash tests/container/podman-cdi-tree-flow.sh SCRATCH [RANKS [WORKERS]]
#
# SCRATCH holds package.deb and sim-bin/ (the libcuda and NVML doubles and ccm-sample-workload of the build under
# test) and receives every step's status (`ptree-NAME.rc`, .out, .err), CRIU's logs, the ranks' reports, the restored
# containers' specs and /dev listings and what every process of the tree holds, for the Rust test to check. A failed
# step is recorded and what depends on it skipped; the script itself exits 0. RANKS (2) and WORKERS (4 per rank).
#
# The setup is podman-cdi-flow.sh's with runc (runc.conf; its header says what the doubles need and why the container
# runs under /usr/local/lib/ccm-sim/runc), and:
#   - the NVIDIA nodes are the doubles' stand-ins (loop_stand_ins, tests/lib/common.sh): /dev/loop-control (char
#     10:237) as /dev/nvidiactl and a loop block device over a scratch file as each /dev/nvidiaN, which a worker can
#     hold open and map and CRIU cannot dump, as the driver's nodes. The CDI spec names those numbers
#     (write_sim_cdi_spec with NODE0 NODE1 CTL), so the container gets them as CDI gives it a GPU's nodes: /dev/nvidia0
#     and /dev/nvidiactl in its /dev and its devices cgroup. The plugin learns them from CCM_TEST_DOUBLE_NVIDIA_DEVICES,
#     which the runtime script adds to CRIU's environment (`ptree-sim-adjustments.txt`);
#   - CRIU_CUDA_MIGRATE_MULTI_PROCESS=warn in that script as well: the dump of several CUDA processes asks the kernel
#     driver's resource manager whether one imported another's memory, which the doubles do not fake (the check
#     cannot run: without the setting the dump is refused, as on a node where /dev/nvidiactl cannot be asked);
#   - the container's entrypoint is tests/container/tree-agent.sh under busybox sh: RANKS ranks of the sample workload
#     on ordinal 0 (the container sees one GPU), each with WORKERS children holding /dev/nvidiactl and /dev/nvidia0
#     (a descriptor each) and a 64 KiB shared mapping of /dev/nvidia0; rank R's control directory is CTL/wR (/ctl/wR).
#
# What every process of the tree holds is read from this side, through /proc/PID/fd and /proc/PID/maps of the
# container's processes (`ptree-CASE-tree.txt`: a `rank` line per rank, a `worker` line per worker with the device
# nodes its descriptors and mappings name inside the container, pids as the container's pid namespace numbers them,
# which CRIU's log uses).
#
# Cases (each rank runs --rounds 3; round k writes report<k>.json, copied to S/ptree-CASE-wR-report<k>.json):
#   run:    the tree as started; round 1 on G0;
#   export: `podman container checkpoint --export A1` (the container stops), `podman rm`; `criu-cuda-migrate inspect`
#           of the archive (its claims: every worker);
#   same:   `restore --import A1`: every worker holds /dev/nvidia0 again (reopened by the plugin; its mapping an inert
#           placeholder), round 2 on G0. Then the container is removed (`podman rm --force`) and round 2's files with
#           it, so that A1 is restored again from the same point;
#   usable: `restore --import A1` with CRIU_CUDA_MIGRATE_USABLE_GPUS=G1 through conmon_env_vars (the user guide's
#           way): the plugin plans the move (the ranks G0 -> G1, every worker's GPU descriptor reopened as
#           /dev/nvidia1, never /dev/nvidia0). Under Podman the restore fails (measured, trixie and forky): Podman's
#           restore --import reuses the checkpoint's spec, and the devices cgroup that runc sets up from it before
#           CRIU runs (CRIU and the restored tasks are in it) lets no process of the container open the other GPU's
#           node: the plugin reads that spec's rules at init and refuses the restore there, naming the node (the
#           workers' reopen would otherwise fail on it). CRIU's log, the archive's sum and the processes left are
#           recorded, and the flow goes on with
#   retry:  `restore --import A1` again without the setting: back on G0, every worker holding /dev/nvidia0.
#           (Where the move passes, the flow goes on with the usable container instead, and the test checks it.)
#   end:    round 2 on the last restore's GPU; the workers are told to exit and round 3 reports that every one exited
#           7; the agent ends with its ranks.
#
# Every process the flow starts is ended by the EXIT trap (podman rm, then whatever is left in this run's cgroup), and
# the stand-ins' loop devices are detached.
set -u
# No -e (nor pipefail): a status-recording flow. Each step's status goes to S/NAME.rc and the flow goes on;
# the Rust test reads the statuses and names the step that broke.

S=$1
RANKS=${2:-2}
WORKERS=${3:-4}
RT=runc
P=ptree
IMAGE=localhost/ccm-cuda-tree:1
NAME=ccm-tree
G0=GPU-5e110000-aabb-ccdd-0001-020304050600
G1=GPU-5e110001-aabb-ccdd-0001-020304050601
SIM=$S/$P-sim
CTL=$S/$P-ctl
CDI=/etc/cdi/ccm-sim.json
SIMRT=/usr/local/lib/ccm-sim/$RT
CGROUP_PARENT=/ccm-ptree-$$
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

# step, pstep, ok, note, install_with_cgroup2, podman_storage_and_conf, podman_criu_conf, sim_stack, sim_runtime,
# write_sim_cdi_spec, podman_cuda_image, checkpoint_export, restore_import, override, after_restore, podman_cleanup,
# rounds, tree_holdings, tree_doubles, ranks_ready;
# tests/lib/common.sh: loop_stand_ins, wait_file
# shellcheck source=tests/container/common.sh
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"

# agent_pid: the host pid of the container's agent (empty when it does not run).
agent_pid() { podman inspect --format '{{.State.Pid}}' "$NAME" 2>/dev/null; }

cleanup() {
    local l
    podman_cleanup "$CGROUP_PARENT"
    for l in "${LOOPS[@]}"; do losetup -d "$l" 2>/dev/null; done
}
LOOPS=()
trap cleanup EXIT

touch "$S/flow.log"
: >"$S/$P-host-adjustments.txt"

# --- install, as the user guide says; cgroups: cgroup2 only (install_with_cgroup2, common.sh)
install_with_cgroup2 pstep || exit 0
echo "$HYBRID" >"$S/$P-hybrid"
podman_storage_and_conf "$HYBRID" "$S/$P-host-adjustments.txt"
podman_criu_conf "$RT" || exit 0

# --- the stand-in nodes, the doubles, their CDI spec naming the stand-ins, the runtime that hands CRIU their settings
tree_doubles "$CDI" || exit 0
sim_runtime "$SIMRT" "$RT_BIN" "$SIM" "CCM_TEST_DOUBLE_NVIDIA_DEVICES=$STAND_INS" CRIU_CUDA_MIGRATE_MULTI_PROCESS=warn

# --- the image: busybox, the workload, the C libraries, the agent (no registry)
podman_cuda_image "$IMAGE" "$SIM" "$(dirname "${BASH_SOURCE[0]}")/tree-agent.sh" || exit 0

# --- run: the tree in a container given GPU 0 through CDI
mkdir -p "$CTL"
pstep run podman run --runtime "$SIMRT" -d --name "$NAME" --network none --cgroup-parent "$CGROUP_PARENT" \
    --device nvidia.com/gpu=0 -v "$CTL:/ctl" "$IMAGE" /bin/sh /usr/local/bin/tree-agent.sh "$RANKS" "$WORKERS" 3 || exit 0
if ! ranks_ready; then
    podman logs "$NAME" >"$S/$P-ready.err" 2>&1
    exit 0
fi
cp "$(static_dir)/config.json" "$S/$P-run-spec.json" 2>/dev/null
nvidia_nodes "$S/$P-run-spec.json" >"$S/$P-run-spec-nodes.txt"
tree_holdings run "$(agent_pid)"
rounds run 1 || exit 0
note "run: done"

# --- export: the portable checkpoint of the whole tree; the container stops
checkpoint_export export "$S/$P-a1.tar.gz" || exit 0
pstep export-rm podman rm "$NAME" || exit 0
pstep a1-inspect criu-cuda-migrate inspect "$S/$P-a1.tar.gz"
note "export: done"

# --- same: restored on this node, onto the GPU its spec gives (G0)
restore_import same "$S/$P-a1.tar.gz"
after_restore same
ok same-restore || exit 0
tree_holdings same "$(agent_pid)"
rounds same 2 || exit 0
# A1 again below: this container goes, and the round it played with it.
pstep same-rm podman rm --force --time 0 "$NAME" || exit 0
for ((r = 0; r < RANKS; r++)); do rm -f "$CTL/w$r/go2" "$CTL/w$r/done2" "$CTL/w$r/report2.json"; done
note "same: done"

# --- usable: A1 restored where only G1 may be used (the usable set given to conmon)
override "$S/$P-usable.conf" "CRIU_CUDA_MIGRATE_USABLE_GPUS=$G1"
# What the user can ask first: the preflight of the archive with that usable set (the doubles' NVML and stand-ins).
pstep usable-preflight env CRIU_CUDA_MIGRATE_LIBNVML="$SIM/lib/libnvidia-ml.so.1" CCM_SIM_CONFIG="$SIM/gpus.json" \
    CCM_SIM_STATE_DIR="$SIM/state" CCM_TEST_DOUBLE_NVIDIA_DEVICES="$STAND_INS" \
    criu-cuda-migrate preflight "$S/$P-a1.tar.gz" --usable-gpus "$G1"
sha256sum <"$S/$P-a1.tar.gz" >"$S/$P-a1.sum-before"
restore_import usable "$S/$P-a1.tar.gz" "$S/$P-usable.conf"
if ok usable-restore; then
    after_restore usable
    tree_holdings usable "$(agent_pid)"
    LAST=usable
else
    # What a failed restore leaves: CRIU's log, the archive, no process of the tree.
    find /var/lib/containers -name restore.log -newer "$S/$P-usable.conf" -exec cat {} + >"$S/$P-usable-restore.log" 2>/dev/null
    sha256sum <"$S/$P-a1.tar.gz" >"$S/$P-a1.sum-after"
    procs_running ccm-sample-workload >"$S/$P-usable-procs.txt"
    podman rm --force --time 0 "$NAME" >/dev/null 2>&1
    note "usable: the restore failed"
    # --- retry: the same archive restored again without the setting (onto G0, as its spec gives)
    for ((r = 0; r < RANKS; r++)); do rm -f "$CTL/w$r/go2" "$CTL/w$r/done2" "$CTL/w$r/report2.json"; done
    restore_import retry "$S/$P-a1.tar.gz"
    after_restore retry
    ok retry-restore || exit 0
    tree_holdings retry "$(agent_pid)"
    LAST=retry
fi
rounds "$LAST" 2 || exit 0
# The end of the job: every worker is told to exit, round 3 reports whether each exited 7, the agent ends.
for ((r = 0; r < RANKS; r++)); do : >"$CTL/w$r/child-exit"; done
rounds "$LAST" 3
for _ in $(seq 100); do [ "$(podman inspect --format '{{.State.Status}}' "$NAME" 2>/dev/null)" = exited ] && break; sleep 0.1; done
podman inspect --format '{{.State.Status}} {{.State.ExitCode}}' "$NAME" >"$S/$P-final.state" 2>>"$S/$P-inspect.err"
echo "$LAST" >"$S/$P-last-case"
note "$LAST: done"
