#!/usr/bin/env bash
# The user guide's containerd flow (docs/USER-GUIDE.md, 5.3), run inside a copy of the runtimes root by
# tests/container_runtime.rs, after podman-flow.sh installed the package into the same copy:
#
#   bash tests/container/containerd-flow.sh SCRATCH
#
# containerd 1.7 with its runc shim, the libdir line in /etc/criu/runc.conf only, and the plugin's settings in
# containerd's own environment (what the guide's systemd drop-in gives the service; systemd itself does not run
# here, containerd is started with that environment). With `ctr`:
#   - `ctr task checkpoint --image-path --work-path`: a checkpoint that leaves the task running, CRIU's dump.log
#     kept in the work path;
#   - `ctr containers checkpoint --task`: a checkpoint into containerd's content store (the task keeps running),
#     then the task is killed and `ctr containers restore --live` brings it back from that checkpoint with its
#     memory (same token, counter going on); CRIU's restore.log is copied while the task exists.
# Every step's status goes to SCRATCH/ctrd-NAME.rc as in podman-flow.sh.
#
# No host adjustment is needed beyond the cgroup2-only view: CRIU's soft cgroup mode finds every v1 cgroup of
# a containerd task existing (containerd leaves its tasks in the v1 root cgroups here), and the one missing
# cgroup2 controller is avoided with `--cpu-shares 0` (ctr asks for cpu.weight by default).
set -u
# No -e (nor pipefail): a status-recording flow. Each step's status goes to S/NAME.rc and the flow goes on;
# the Rust test reads the statuses and names the step that broke.

S=$1
D=/tmp/ccm-containerd
IMAGE=localhost/ccm-busybox:1
CHECKPOINT=localhost/ccm-checkpoint:1
# shellcheck disable=SC2016 # the container's shell expands it
LOOP='tok=$$-$RANDOM-$RANDOM; i=0; while :; do i=$((i+1)); echo "$tok $i" >/out/count; sleep 0.1; done'
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

# step, wait_counter
# shellcheck source=tests/container/common.sh
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"

# A containerd namespace of this run's own: its tasks' cgroups are /NAMESPACE/ID, which the cleanup may remove
# without touching anything else in the host's cgroup2 hierarchy.
NS=ccm-$$
C() { ctr --address "$D/containerd.sock" --namespace "$NS" "$@"; }

cleanup() {
    local t c
    for t in $(C task ls -q 2>/dev/null); do C task kill -s KILL "$t" >/dev/null 2>&1; done
    sleep 0.5
    for t in $(C task ls -q 2>/dev/null); do C task rm -f "$t" >/dev/null 2>&1; done
    for c in $(C containers ls -q 2>/dev/null); do C containers rm "$c" >/dev/null 2>&1; done
    [ -n "${CONTAINERD_PID:-}" ] && kill "$CONTAINERD_PID" 2>/dev/null && wait "$CONTAINERD_PID" 2>/dev/null
    # This run's cgroups, deepest first.
    [ -d "/sys/fs/cgroup/$NS" ] && find "/sys/fs/cgroup/$NS" -depth -type d -exec rmdir {} + 2>/dev/null
}
trap cleanup EXIT

[ -f /etc/criu/criu-cuda-migrate.conf.example ] || { echo "the package is not installed" >"$S/ctrd-setup.err"; exit 0; }
mountpoint -q /sys/fs/cgroup || mount -t cgroup2 cgroup2 /sys/fs/cgroup
mkdir -p /etc/criu "$D" "$S/ctrd-out"
rm -f /etc/criu/default.conf
grep '^libdir ' /etc/criu/criu-cuda-migrate.conf.example >/etc/criu/runc.conf
cp /etc/criu/runc.conf "$S/ctrd-runc.conf"


cat >"$D/config.toml" <<EOF
version = 2
root = "$D/root"
state = "$D/state"
disabled_plugins = ["io.containerd.grpc.v1.cri"]
[grpc]
  address = "$D/containerd.sock"
EOF
# The service environment of the guide's drop-in (what `systemctl edit containerd` would give it).
env CRIU_CUDA_MIGRATE_USABLE_GPUS=0 CRIU_CUDA_MIGRATE_MODE=permissive \
    containerd --config "$D/config.toml" >"$S/ctrd-containerd.log" 2>&1 &
CONTAINERD_PID=$!
for _ in $(seq 100); do C version >/dev/null 2>&1 && break; sleep 0.1; done
step ctrd-version C version || exit 0
make_image /tmp/ccm-busybox-oci.tar "$IMAGE" '["/bin/sh"]'
step ctrd-image C images import /tmp/ccm-busybox-oci.tar || exit 0

step ctrd-run C run -d --cpu-shares 0 --mount "type=bind,src=$S/ctrd-out,dst=/out,options=rbind:rw" \
    "$IMAGE" ccm-c1 /bin/sh -c "$LOOP" || exit 0
wait_counter 10 cat "$S/ctrd-out/count" >"$S/ctrd-before.count"

# A checkpoint that leaves the task running, with its CRIU log kept in the work path.
step ctrd-checkpoint-workpath C task checkpoint --image-path "$S/ctrd-img" --work-path "$S/ctrd-work" ccm-c1
cp "$S/ctrd-work/dump.log" "$S/ctrd-dump.log" 2>/dev/null
wait_counter "$(beyond "$S/ctrd-before.count")" cat "$S/ctrd-out/count" >"$S/ctrd-after-checkpoint.count"

# The checkpoint into the content store, then the task ends and comes back from it.
step ctrd-checkpoint C containers checkpoint --task ccm-c1 "$CHECKPOINT" || exit 0
# The loop rewrites the file (truncate, then write): wait for a whole line, never an empty read.
wait_counter 0 cat "$S/ctrd-out/count" >"$S/ctrd-checkpointed.count"
C task kill -s KILL ccm-c1 >/dev/null 2>&1
sleep 0.5
C task rm --force ccm-c1 >/dev/null 2>&1
step ctrd-restore C containers restore --live ccm-c2 "$CHECKPOINT"
cp "$D/root/io.containerd.runtime.v2.task/$NS/ccm-c2/restore.log" "$S/ctrd-restore.log" 2>/dev/null
wait_counter "$(beyond "$S/ctrd-checkpointed.count")" cat "$S/ctrd-out/count" >"$S/ctrd-after-restore.count"
C task ls >"$S/ctrd-tasks.txt" 2>&1
