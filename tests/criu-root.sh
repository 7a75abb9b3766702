#!/usr/bin/env bash
# A Debian trixie root that holds CRIU 4.x and its plugin header, and a way to run commands in it.
#
# Debian bookworm's criu 3.17 cannot run on the kernels we build and test on ("vdso: Failed to fill self vdso
# symtable"), and bookworm has no libcriu-dev with the device hooks. A trixie root made with debootstrap has both.
# CRIU must be the real root of its mount namespace (a chroot is not enough: it reads mountinfo and compares roots),
# so `run` enters a private mount namespace and pivot_roots into the trixie root.
#
#   tests/criu-root.sh prepare                   make the root if it is missing (idempotent)
#   tests/criu-root.sh run [--bind DIR]... [--] CMD [ARG]...
#                                                run CMD inside the root; exits with CMD's status
#   tests/criu-root.sh path                      print the root's path
#
# Inside the root: this repository at its own absolute path, every --bind DIR at its own absolute path, fresh
# /proc, /sys, /dev (tmpfs with the basic nodes and devpts), /tmp and /run, PATH set for Debian.
#
# Environment:
#   CCM_TRIXIE_ROOT      where the root lives (default /var/cache/criu-cuda-migrate/trixie; keep it outside the
#                        clone so CI can cache it)
#   CCM_DEBIAN_MIRROR    mirror for debootstrap (default http://deb.debian.org/debian)
#
# Needs root. Works without a terminal and without stdin (CI=true).
set -euo pipefail

ROOT=${CCM_TRIXIE_ROOT:-/var/cache/criu-cuda-migrate/trixie}
MIRROR=${CCM_DEBIAN_MIRROR:-http://deb.debian.org/debian}
SUITE=trixie
PACKAGES=criu,libcriu-dev
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
DEBIAN_PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

die() {
    echo "criu-root.sh: $*" >&2
    exit 1
}

need_root() {
    [ "$(id -u)" -eq 0 ] || die "must run as root (it debootstraps and mounts); run it with sudo"
}

# The root is complete when CRIU and the plugin header are both there. A half-made root never takes this name:
# prepare builds under a temporary name and renames it at the end.
root_is_complete() {
    [ -x "$ROOT/usr/sbin/criu" ] && [ -f "$ROOT/usr/include/criu/criu-plugin.h" ]
}

# The packaged version, read from the root's dpkg database (the root's criu cannot run outside the root).
criu_version() {
    awk '/^Package: criu$/ { found = 1 } found && /^Version:/ { print $2; exit }' "$ROOT/var/lib/dpkg/status"
}

ensure_debootstrap() {
    command -v debootstrap >/dev/null 2>&1 && return 0
    command -v apt-get >/dev/null 2>&1 || die "debootstrap is missing and there is no apt-get to install it; install debootstrap by hand"
    echo "criu-root.sh: installing debootstrap with apt-get" >&2
    DEBIAN_FRONTEND=noninteractive apt-get update -qq </dev/null >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap </dev/null >/dev/null
}

cmd_prepare() {
    need_root
    mkdir -p "$(dirname "$ROOT")"
    # Two preparations at once (two shells, two CI steps) must not both debootstrap into the same place.
    exec 9>"$ROOT.lock"
    flock 9
    if root_is_complete; then
        echo "criu-root.sh: trixie root ready at $ROOT (criu $(criu_version))"
        return 0
    fi
    [ -e "$ROOT" ] && die "$ROOT exists but lacks usr/sbin/criu or usr/include/criu/criu-plugin.h; remove it (rm -rf '$ROOT') and run prepare again"
    ensure_debootstrap
    local tmp="$ROOT.partial.$$"
    rm -rf "$tmp"
    echo "criu-root.sh: debootstrapping $SUITE with $PACKAGES into $ROOT (about 30 s)" >&2
    if ! debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$tmp" "$MIRROR" </dev/null >"$ROOT.debootstrap.log" 2>&1; then
        tail -n 30 "$ROOT.debootstrap.log" >&2 || true
        rm -rf "$tmp"
        die "debootstrap of $SUITE failed (log: $ROOT.debootstrap.log); check network access to $MIRROR or set CCM_DEBIAN_MIRROR"
    fi
    [ -x "$tmp/usr/sbin/criu" ] || die "debootstrap finished but $tmp/usr/sbin/criu is missing; is the criu package still in $SUITE?"
    [ -f "$tmp/usr/include/criu/criu-plugin.h" ] || die "debootstrap finished but criu/criu-plugin.h is missing; is libcriu-dev still in $SUITE?"
    mv "$tmp" "$ROOT"
    echo "criu-root.sh: trixie root ready at $ROOT (criu $(criu_version))"
}

# Runs in the fresh mount namespace (as the host's bash, before pivot_root): mounts, pivot_root, then exec CMD.
# Arguments: number of bind dirs, the bind dirs, then CMD.
enter_root() {
    local nbinds=$1
    shift
    local binds=("${@:1:$nbinds}")
    shift "$nbinds"

    # pivot_root needs the new root to be a mount point; a bind mount of the directory on itself makes it one.
    mount --bind "$ROOT" "$ROOT"
    mount -t proc proc "$ROOT/proc"
    mount -t sysfs sysfs "$ROOT/sys" 2>/dev/null || mount --rbind /sys "$ROOT/sys"
    mount -t tmpfs -o mode=1777 tmpfs "$ROOT/tmp"
    mkdir -p "$ROOT/run"
    mount -t tmpfs -o mode=755 tmpfs "$ROOT/run"
    # A /dev of our own rather than a bind of the host's: CRIU refuses files opened on bind mounts of foreign
    # file systems it cannot resolve, so the dumped process's /dev/null must live on a mount of this namespace.
    mount -t tmpfs -o mode=755,nosuid tmpfs "$ROOT/dev"
    local node
    for node in null:1:3 zero:1:5 full:1:7 random:1:8 urandom:1:9 tty:5:0; do
        IFS=: read -r name major minor <<<"$node"
        mknod -m 666 "$ROOT/dev/$name" c "$major" "$minor"
    done
    # criu check probes /dev/net/tun; without the node it prints an error (the tun module may still be absent).
    mkdir -p "$ROOT/dev/net" "$ROOT/dev/pts" "$ROOT/dev/shm"
    mknod -m 666 "$ROOT/dev/net/tun" c 10 200
    mount -t devpts -o newinstance,ptmxmode=0666,mode=620 devpts "$ROOT/dev/pts"
    ln -s pts/ptmx "$ROOT/dev/ptmx"
    mount -t tmpfs -o mode=1777 tmpfs "$ROOT/dev/shm"
    ln -s /proc/self/fd "$ROOT/dev/fd"
    ln -s /proc/self/fd/0 "$ROOT/dev/stdin"
    ln -s /proc/self/fd/1 "$ROOT/dev/stdout"
    ln -s /proc/self/fd/2 "$ROOT/dev/stderr"

    local dir
    for dir in "$REPO" "${binds[@]}"; do
        mkdir -p "$ROOT$dir"
        mount --bind "$dir" "$ROOT$dir"
    done

    mkdir -p "$ROOT/.ccm-old-root"
    cd "$ROOT"
    pivot_root . .ccm-old-root
    cd /
    # From here on every path is the trixie root's. Detach the host's tree so nothing in it can be reached.
    umount -l /.ccm-old-root
    export PATH=$DEBIAN_PATH
    exec "$@"
}

cmd_run() {
    need_root
    root_is_complete || die "no trixie root at $ROOT; run \`tests/criu-root.sh prepare\` first"
    local binds=()
    while [ $# -gt 0 ]; do
        case "$1" in
        --bind)
            [ $# -ge 2 ] || die "--bind needs a directory"
            [ -d "$2" ] || die "--bind $2: not a directory"
            binds+=("$(cd "$2" && pwd -P)")
            shift 2
            ;;
        --)
            shift
            break
            ;;
        -*) die "run: unknown option $1" ;;
        *) break ;;
        esac
    done
    [ $# -gt 0 ] || die "run: no command given (usage: $0 run [--bind DIR]... [--] CMD [ARG]...)"
    # --propagation private: nothing mounted here leaks to the host, and pivot_root accepts the new root.
    exec unshare --mount --propagation private -- "$BASH" "${BASH_SOURCE[0]}" __enter "${#binds[@]}" "${binds[@]}" "$@"
}

case "${1:-}" in
prepare) cmd_prepare ;;
run)
    shift
    cmd_run "$@"
    ;;
path) echo "$ROOT" ;;
__enter)
    shift
    enter_root "$@"
    ;;
*)
    echo "usage: $0 prepare | run [--bind DIR]... [--] CMD [ARG]... | path" >&2
    exit 2
    ;;
esac
