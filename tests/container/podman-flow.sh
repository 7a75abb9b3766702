#!/usr/bin/env bash
# The user guide's Podman flow (docs/USER-GUIDE.md, 5.2), run inside a copy of the runtimes root
# (`tests/criu-root.sh prepare-runtimes`) by tests/container_runtime.rs:
#
#   bash tests/container/podman-flow.sh SCRATCH
#
# SCRATCH holds package.deb and receives every step's status (`NAME.rc`), output and the CRIU logs the
# runtimes leave, for the Rust test to check. The script never fails early on a step's failure: it records
# the status and skips what depends on it, so the test can say which step broke.
#
# What it does, with the package installed as a user installs it (dpkg -i) and CRIU configured by files only:
#   1. runc: the libdir line in /etc/criu/runc.conf only. A busybox container counting in its memory:
#      `podman container checkpoint --leave-running --export` (the container keeps running; settings given
#      to podman or conmon do not reach this CRIU, which the dump log shows), then `checkpoint --export` (it stops),
#      `podman rm`, and `podman container restore --import` with the plugin's settings given to conmon
#      through a CONTAINERS_CONF_OVERRIDE file: the container comes back with its memory (same token,
#      counter going on), and CRIU's logs show the plugin loaded with those settings. Before the restore,
#      checkpointctl (forky's 1.3: `show`, `inspect`) and criu-cuda-migrate (`inspect`) read the export.
#   2. crun: crun >= 1.26 with libcriu >= 4.2 (forky: crun 1.28, CRIU 4.2.1) passes CRIU /etc/criu/crun.conf
#      (criu_set_config_file), so the libdir line goes there, and on a hybrid host `manage-cgroups=ignore` with it;
#      crun 1.21 with libcriu 4.1 (trixie) reads no file but /etc/criu/default.conf, which then gets the libdir
#      line. `checkpoint --export` and, where the host allows it, `restore --import` (`crun-conf` says which).
#
# This host's cgroups: CI machines here are hybrid cgroup v1 hosts (every controller bound to a v1
# hierarchy, cgroup2 mounted with none). The script mounts only cgroup2 at /sys/fs/cgroup in its mount
# namespace, which is what crun and runc see on a current distribution, and on a hybrid host adds two
# settings a pure cgroup v2 host does not need (each written to `host-adjustments.txt`):
#   - containers.conf `pids_limit = 0`: the pids controller is not available in cgroup2 there;
#   - `manage-cgroups=ignore` in /etc/criu/runc.conf (with `=`: the option's argument is optional, so in a
#     configuration file `manage-cgroups ignore` is the option without it, CRIU's default soft mode, and a
#     stray word; measured with crun 1.28, whose restore then fails): CRIU reads every task's v1 cgroups from
#     /proc/PID/cgroup and, restoring them, fails to write cpuset.cpus of a cpuset cgroup it creates
#     (Permission denied). runc passes runc.conf to CRIU over RPC, where it overrides runc's own cgroup
#     mode; crun 1.21 cannot pass a configuration file with libcriu 4.1 (criu_set_config_file is 4.2), so on
#     a hybrid host crun's restore is not attempted there (`crun-restore.skipped` says why); with crun.conf it is.
set -u
# No -e (nor pipefail): a status-recording flow. Each step's status goes to S/NAME.rc and the flow goes on;
# the Rust test reads the statuses and names the step that broke.

S=$1
LIBDIR_LINE=
IMAGE=localhost/ccm-busybox:1
# The containers' cgroups, one parent per run: the cleanup below may then sweep it without touching what another
# run, or anything else on the host, keeps in the same cgroup2 hierarchy.
CGROUP_PARENT=/ccm-podman-$$
# The container's loop: a token fixed at start (in the shell's memory only) and a counter, written to a file
# every 0.1 s. After a restore the same token must come back with a larger counter; a restarted container
# would start a new token at 1.
# shellcheck disable=SC2016 # the container's shell expands it
LOOP='tok=$$-$RANDOM-$RANDOM; i=0; while :; do i=$((i+1)); echo "$tok $i" >/tmp/count; sleep 0.1; done'
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

# step, wait_counter
# shellcheck source=tests/container/common.sh
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"

note() { printf '%s\n' "$*" >>"$S/flow.log"; }

# counter NAME: the container's /tmp/count.
counter() { podman exec "$1" cat /tmp/count; }

# The counter line the archive's rootfs diff holds: the container's /tmp/count when it was checkpointed.
# (podman compresses exported checkpoints with zstd whatever the archive's name; tar detects it.)
unpack_archive() {
    local archive=$1 prefix=$2 dir
    dir=$(mktemp -d)
    tar -C "$dir" -xf "$archive" 2>>"$S/$prefix-archive.err"
    (cd "$dir" && find . -type f | sort) >"$S/$prefix-archive.list" 2>&1
    [ -f "$dir/rootfs-diff.tar" ] && tar -xOf "$dir/rootfs-diff.tar" tmp/count >"$S/$prefix-checkpointed-count" 2>/dev/null
    rm -rf "$dir"
    # The loop rewrites its file (truncate, then write): a container frozen between the two left it empty. The
    # line read before the checkpoint has the same token, which is what proves the same memory after restore.
    if [ ! -s "$S/$prefix-checkpointed-count" ] && [ -s "$S/${prefix%%-*}-before.count" ]; then
        note "$prefix: the archive's count file is empty (frozen mid-rewrite); the token read before is used"
        cp "$S/${prefix%%-*}-before.count" "$S/$prefix-checkpointed-count"
    fi
}

# CRIU's logs are not in the exported archive; with --keep podman leaves them in the container's directory.
copy_criu_log() {
    local name=$1 log=$2 dest=$3 dir
    dir=$(podman inspect --format '{{.StaticDir}}' "$name" 2>/dev/null)
    [ -n "$dir" ] && [ -f "$dir/$log" ] && cp "$dir/$log" "$dest"
}

trap 'podman_cleanup "$CGROUP_PARENT"' EXIT

: >"$S/flow.log"
: >"$S/host-adjustments.txt"

# --- install, as the user guide says
step install env DEBIAN_FRONTEND=noninteractive dpkg -i "$S/package.deb" || exit 0
LIBDIR_LINE=$(grep '^libdir ' /etc/criu/criu-cuda-migrate.conf.example)
unset CRIU_LIBS_DIR CRIU_CONFIG_FILE

# --- cgroups: cgroup2 only, as on a current distribution
mkdir -p /sys/fs/cgroup
step cgroup2-mount mount -t cgroup2 cgroup2 /sys/fs/cgroup || exit 0
HYBRID=0
grep -qv '^0::' /proc/self/cgroup && HYBRID=1
echo "$HYBRID" >"$S/hybrid"

# --- podman: storage on a tmpfs, no network (nothing to reach)
podman_storage_and_conf "$HYBRID" "$S/host-adjustments.txt"

# A local image of busybox-static (no registry here): /bin/busybox and the few names the loop uses.
mkdir -p /tmp/ccm-image/bin /tmp/ccm-image/tmp /tmp/ccm-image/proc /tmp/ccm-image/sys /tmp/ccm-image/dev /tmp/ccm-image/etc
cp /bin/busybox /tmp/ccm-image/bin/busybox
for applet in sh sleep cat echo; do ln -sf busybox "/tmp/ccm-image/bin/$applet"; done
tar -C /tmp/ccm-image -cf /tmp/ccm-image.tar .
step image podman import /tmp/ccm-image.tar "$IMAGE" || exit 0

# --- 1. runc, configured by /etc/criu/runc.conf alone
mkdir -p /etc/criu
rm -f /etc/criu/default.conf
{
    echo "$LIBDIR_LINE"
    [ "$HYBRID" = 1 ] && echo 'manage-cgroups=ignore'
} >/etc/criu/runc.conf
cp /etc/criu/runc.conf "$S/runc.conf"
[ "$HYBRID" = 1 ] && echo "runc.conf: manage-cgroups=ignore (CRIU cannot restore this hybrid host's v1 cpuset)" >>"$S/host-adjustments.txt"

if step runc-run podman run --runtime runc -d --name ccm-runc --network none --cgroup-parent "$CGROUP_PARENT" "$IMAGE" /bin/sh -c "$LOOP"; then
    wait_counter 10 counter ccm-runc >"$S/runc-before.count"
    note "runc: counting: $(cat "$S/runc-before.count")"

    # Keep it running. Podman runs runc, runc runs CRIU over RPC, so the plugin cannot see --leave-running.
    # Nor can it be told: podman runs `runc checkpoint` with an environment of its own, so neither podman's
    # environment nor conmon_env_vars reach a checkpoint's CRIU. Both are set here to keep that true: the dump
    # log must say mode strict and leave-running unknown (the plugin then restores the devices after the dump,
    # which is right for --leave-running and only costs time for a final checkpoint).
    cat >"$S/checkpoint-override.conf" <<'EOF'
[engine]
conmon_env_vars = [
  "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
  "CRIU_CUDA_MIGRATE_LEAVE_RUNNING=1",
]
EOF
    step runc-checkpoint-leave-running env CONTAINERS_CONF_OVERRIDE="$S/checkpoint-override.conf" \
        CRIU_CUDA_MIGRATE_MODE=permissive \
        podman container checkpoint --keep --leave-running --export "$S/runc-leave-running.tar.gz" ccm-runc
    podman inspect --format '{{.State.Status}}' ccm-runc >"$S/runc-after-leave-running.state" 2>&1
    copy_criu_log ccm-runc dump.log "$S/runc-leave-running-dump.log"
    unpack_archive "$S/runc-leave-running.tar.gz" runc-leave-running
    wait_counter "$(beyond "$S/runc-before.count")" counter ccm-runc >"$S/runc-after-leave-running.count"

    # The portable checkpoint: the container stops.
    if step runc-checkpoint podman container checkpoint --keep --export "$S/runc.tar.gz" ccm-runc; then
        podman inspect --format '{{.State.Status}}' ccm-runc >"$S/runc-after-checkpoint.state" 2>&1
        copy_criu_log ccm-runc dump.log "$S/runc-dump.log"
        unpack_archive "$S/runc.tar.gz" runc
        # What checkpointctl (forky's 1.3) and criu-cuda-migrate each tell of the export (archive_tools: common.sh).
        archive_tools "$S/runc.tar.gz" runc
        step runc-rm podman rm --force ccm-runc
        # The plugin's settings for this one restore: the user guide's CONTAINERS_CONF_OVERRIDE file.
        cat >"$S/restore-override.conf" <<'EOF'
[engine]
conmon_env_vars = [
  "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
  "CRIU_CUDA_MIGRATE_DEVICE_MAP=GPU-aaaaaaaa-0000-0000-0000-000000000000=GPU-bbbbbbbb-0000-0000-0000-000000000000",
  "CRIU_CUDA_MIGRATE_MODE=permissive",
]
EOF
        if step runc-restore env CONTAINERS_CONF_OVERRIDE="$S/restore-override.conf" \
            podman container restore --keep --import "$S/runc.tar.gz"; then
            copy_criu_log ccm-runc restore.log "$S/runc-restore.log"
            wait_counter "$(beyond "$S/runc-checkpointed-count")" counter ccm-runc \
                >"$S/runc-after-restore.count"
            podman inspect --format '{{.State.Status}}' ccm-runc >"$S/runc-after-restore.state" 2>&1
        else
            find /var/lib/containers -name restore.log -exec cp {} "$S/runc-restore.log" \; 2>/dev/null
        fi
    fi
    podman rm --force --time 0 ccm-runc >/dev/null 2>&1
fi

# --- 2. crun, configured by /etc/criu/crun.conf where crun can pass it, else /etc/criu/default.conf (read by every
# CRIU run, RPC included)
rm -f /etc/criu/runc.conf
# version_ge A B: A >= B, numerically by dot-separated parts.
version_ge() { [ "$(printf '%s\n%s\n' "$2" "$1" | sort -V | head -n1)" = "$2" ]; }
CRUN_VERSION=$(crun --version 2>/dev/null | awk '/^crun version/ { print $3 }')
CRIU_VERSION=$(criu --version 2>/dev/null | awk '/^Version:/ { print $2 }')
CRUN_CONF=0
version_ge "${CRUN_VERSION:-0}" 1.26 && version_ge "${CRIU_VERSION:-0}" 4.2 && CRUN_CONF=1
echo "$CRUN_CONF crun $CRUN_VERSION criu $CRIU_VERSION" >"$S/crun-conf"
if [ "$CRUN_CONF" = 1 ]; then
    {
        echo "$LIBDIR_LINE"
        [ "$HYBRID" = 1 ] && echo 'manage-cgroups=ignore'
    } >/etc/criu/crun.conf
    cp /etc/criu/crun.conf "$S/crun.conf"
    [ "$HYBRID" = 1 ] && echo "crun.conf: manage-cgroups=ignore (CRIU cannot restore this hybrid host's v1 cpuset)" >>"$S/host-adjustments.txt"
else
    echo "$LIBDIR_LINE" >/etc/criu/default.conf
    cp /etc/criu/default.conf "$S/default.conf"
fi
if step crun-run podman run --runtime crun -d --name ccm-crun --network none --cgroup-parent "$CGROUP_PARENT" "$IMAGE" /bin/sh -c "$LOOP"; then
    wait_counter 10 counter ccm-crun >"$S/crun-before.count"
    if step crun-checkpoint podman container checkpoint --keep --export "$S/crun.tar.gz" ccm-crun; then
        copy_criu_log ccm-crun dump.log "$S/crun-dump.log"
        unpack_archive "$S/crun.tar.gz" crun
        step crun-rm podman rm --force ccm-crun
        if [ "$HYBRID" = 1 ] && [ "$CRUN_CONF" = 0 ]; then
            echo "not attempted: this is a hybrid cgroup v1 host; CRIU would restore the tasks' v1 cgroups and fail" \
                "writing cpuset.cpus (Permission denied), and crun $CRUN_VERSION with libcriu $CRIU_VERSION cannot pass" \
                "CRIU the configuration file that says manage-cgroups=ignore (crun.conf needs crun 1.26 and libcriu 4.2)" \
                >"$S/crun-restore.skipped"
        elif step crun-restore podman container restore --keep --import "$S/crun.tar.gz"; then
            copy_criu_log ccm-crun restore.log "$S/crun-restore.log"
            wait_counter "$(beyond "$S/crun-checkpointed-count")" counter ccm-crun \
                >"$S/crun-after-restore.count"
        else
            find /var/lib/containers -name restore.log -exec cp {} "$S/crun-restore.log" \; 2>/dev/null
        fi
    fi
    podman rm --force --time 0 ccm-crun >/dev/null 2>&1
fi
note "done"
