#!/usr/bin/env bash
# Podman + runc: a container with its own network namespace (`--network none`, made by runc) holding an established
# TCP connection on 127.0.0.1, checkpointed with --tcp-established and restored from the archive, first without and
# then with the package's CRIU action script. Run inside a copy of the runtimes root by tests/container_runtime.rs:
#
#   bash tests/container/podman-tcp-flow.sh SCRATCH
#
# SCRATCH holds package.deb and tcp-bin/ccm-tcp-pair and receives each step's status (ptcp-NAME.rc, .out, .err),
# CRIU's logs and the counters, for the Rust test to check. The script itself exits 0.
#
# Why: runc dumps a network namespace it created EMPTY (it passes CRIU --empty-ns network) and CRIU restores it
# with its loopback interface down, so the repair of a TCP connection on 127.0.0.1 fails ("Can't connect inet socket
# back: Network is unreachable"): torchrun's ranks in one container are such connections. The package's action
# script (/usr/lib/criu-cuda-migrate/action-script, in /etc/criu/runc.conf) sets the loopback up at CRIU's
# setup-namespaces, before any socket is restored.
#
# Cases, one container, one archive:
#   run:       podman run --runtime runc --network none, ccm-tcp-pair writing `TCP <n>` to /ctl/counter;
#   checkpoint: podman container checkpoint --tcp-established --export A (the container stops), rm;
#   plain:     podman container restore --tcp-established --import A with runc.conf = libdir only: expected to fail
#              in CRIU's TCP repair (the Rust test says what happened either way);
#   script:    rm, the action-script line added to runc.conf, restore --import A again: the container runs and the
#              counter goes on over the restored connection.
set -u
# No -e (nor pipefail): a status-recording flow. Each step's status goes to S/NAME.rc and the flow goes on;
# the Rust test reads the statuses and names the step that broke.

S=$1
P=ptcp
IMAGE=localhost/ccm-tcp:1
NAME=ccm-tcp
CTL=$S/$P-ctl
CGROUP_PARENT=/ccm-ptcp-$$
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

# shellcheck source=tests/container/common.sh
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"

pstep() {
    local n=$1
    shift
    step "$P-$n" "$@"
}
ok() { [ "$(cat "$S/$P-$1.rc" 2>/dev/null)" = 0 ]; }
static_dir() { podman inspect --format '{{.StaticDir}}' "$NAME" 2>/dev/null; }
counter() { cat "$CTL/counter" 2>/dev/null; }

trap 'podman_cleanup "$CGROUP_PARENT"' EXIT

# --- install, as the user guide says; cgroups: cgroup2 only (podman-flow.sh says why; install_with_cgroup2, common.sh)
install_with_cgroup2 pstep || exit 0
: >"$S/$P-host-adjustments.txt"
podman_storage_and_conf "$HYBRID" "$S/$P-host-adjustments.txt"

# runc.conf as the user guide has it: the libdir line (and on a hybrid cgroup v1 host manage-cgroups=ignore).
mkdir -p /etc/criu
rm -f /etc/criu/default.conf /etc/criu/crun.conf
runc_conf() {
    grep '^libdir ' /etc/criu/criu-cuda-migrate.conf.example
    [ "$HYBRID" = 1 ] && echo 'manage-cgroups=ignore'
    # The line the config example carries commented out, as a user uncomments it.
    [ "${1:-}" = script ] && sed -n 's/^#\(action-script .*\)$/\1/p' /etc/criu/criu-cuda-migrate.conf.example
}
runc_conf >/etc/criu/runc.conf

# The image: busybox and the TCP pair with its C libraries (no registry).
R=/tmp/ccm-tcp-rootfs
rm -rf "$R"
mkdir -p "$R/bin" "$R/proc" "$R/sys" "$R/dev" "$R/etc" "$R/tmp"
cp /bin/busybox "$R/bin/busybox"
for applet in sh sleep cat; do ln -sf busybox "$R/bin/$applet"; done
cuda_rootfs "$R" "$S/tcp-bin/ccm-tcp-pair"
tar -C "$R" -cf /tmp/ccm-tcp-rootfs.tar .
pstep image podman import /tmp/ccm-tcp-rootfs.tar "$IMAGE" || exit 0

mkdir -p "$CTL"
pstep run podman run --runtime /usr/sbin/runc -d --name "$NAME" --network none --cgroup-parent "$CGROUP_PARENT" \
    -v "$CTL:/ctl" "$IMAGE" /usr/local/bin/ccm-tcp-pair /ctl/counter || exit 0
wait_counter 5 counter >"$S/$P-before.txt" || {
    podman logs "$NAME" >"$S/$P-run-logs.txt" 2>&1
    exit 0
}
echo 0 >"$S/$P-ready.rc"

A=/tmp/ccm-tcp-A.tar
pstep checkpoint podman container checkpoint --keep --tcp-established --export "$A" "$NAME"
dir=$(static_dir)
[ -n "$dir" ] && cp "$dir/dump.log" "$S/$P-dump.log" 2>/dev/null
ok checkpoint || exit 0
counter >"$S/$P-at-checkpoint.txt"
pstep rm1 podman rm --force --time 0 "$NAME"

# restore CASE: restore --import A (--keep: restore.log stays), its log copied out; then whether the pair goes on.
restore() {
    local case=$1 dir
    pstep "$case" podman container restore --keep --tcp-established --import "$A"
    dir=$(static_dir)
    [ -n "$dir" ] && cp "$dir/restore.log" "$S/$P-$case-restore.log" 2>/dev/null
    if ok "$case"; then
        wait_counter "$(beyond "$S/$P-at-checkpoint.txt")" counter >"$S/$P-$case-after.txt"
        echo $? >"$S/$P-$case-continues.rc"
        podman inspect --format '{{.State.Status}}' "$NAME" >"$S/$P-$case.state" 2>&1
    fi
    podman rm --force --time 0 "$NAME" >/dev/null 2>&1
}

cp /etc/criu/runc.conf "$S/$P-plain-runc.conf"
restore plain
runc_conf script >/etc/criu/runc.conf
cp /etc/criu/runc.conf "$S/$P-script-runc.conf"
restore script
exit 0
