#!/usr/bin/env bash
# A Debian root that holds real CRIU 4.x and its plugin header, and a way to run commands in it. Two suites:
#   trixie  CRIU 4.1.1; runtimes runc 1.1, crun 1.21, Podman 5.4, containerd 1.7 (the default)
#   forky   CRIU 4.2.1; runtimes runc 1.3, crun 1.28, Podman 5.8, containerd 2.1 (Debian testing; what sid has)
#
# Debian bookworm's criu 3.17 cannot run on the kernels we build and test on ("vdso: Failed to fill self vdso
# symtable"), and bookworm has no libcriu-dev with the device hooks. A root made with debootstrap has both.
# CRIU must be the real root of its mount namespace (a chroot is not enough: it reads mountinfo and compares roots),
# so `run` enters a private mount namespace and pivot_roots into the root.
#
#   tests/criu-root.sh prepare                   make the root if it is missing (idempotent)
#   tests/criu-root.sh run [--bind DIR]... [--] CMD [ARG]...
#                                                run CMD inside the root; exits with CMD's status
#   tests/criu-root.sh path                      print the root's path
#   tests/criu-root.sh suite                     print the root's suite (trixie or forky)
#   tests/criu-root.sh prepare-runtimes          make the runtimes root if it is missing: a copy of the root plus
#                                                Podman, containerd, runc, crun and conmon from the same suite
#                                                (tests/container_runtime.rs), and on forky the CRI client's
#                                                needs (python3-grpcio, protoc, CRI's api.proto)
#   tests/criu-root.sh runtimes-path             print the runtimes root's path
#   tests/criu-root.sh prepare-patched           make the forky root's copy whose CRIU 4.2.1 is rebuilt from Debian's
#                                                source with CRIU PR #3138's plugin options backported
#                                                (tests/criu-patches/, tests/plugin_options.rs); about 1 minute
#   tests/criu-root.sh patched-path              print its path
#   tests/criu-root.sh prepare-zdtm              make the zdtm root if it is missing: a copy of the root holding CRIU's
#                                                source tree of the root's CRIU version (Debian's source package) in
#                                                /opt/criu, with pycriu's protobuf modules generated and the zdtm
#                                                tests of tests/zdtm/tests.txt built, and what zdtm.py needs
#                                                (tests/zdtm/run.sh, tests/zdtm_plugin.rs); about 1 minute
#   tests/criu-root.sh zdtm-path                 print its path
#
# `run` enters whichever root CCM_TRIXIE_ROOT names; the tests point it at a copy of one of the two.
#
# Inside the root: this repository at its own absolute path, every --bind DIR at its own absolute path, fresh
# /proc, /sys, /dev (tmpfs with the basic nodes and devpts), /tmp and /run, PATH set for Debian.
#
# Environment:
#   CCM_CRIU_SUITE       trixie (default) or forky: which Debian suite the root is made of
#   CCM_TRIXIE_ROOT      where the root lives, whatever its suite (default /var/cache/criu-cuda-migrate/SUITE; keep
#                        it outside the clone so CI can cache it; the name is older than the second suite)
#   CCM_RUNTIMES_ROOT    where the runtimes root lives (default $CCM_TRIXIE_ROOT-runtimes)
#   CCM_PATCHED_ROOT     where the patched forky root lives (default /var/cache/criu-cuda-migrate/forky-plugin-options)
#   CCM_ZDTM_ROOT        where the zdtm root lives (default $CCM_TRIXIE_ROOT-zdtm)
#   CCM_DEBIAN_MIRROR    mirror for debootstrap (default: the Debian mirror of this machine's own apt sources; with
#                        neither, prepare stops and says so)
#
# Needs root. Works without a terminal and without stdin (CI=true).
set -euo pipefail

SUITE=${CCM_CRIU_SUITE:-trixie}
case $SUITE in
trixie | forky) ;;
*)
    echo "criu-root.sh: CCM_CRIU_SUITE=$SUITE: unknown suite; use trixie (CRIU 4.1.1) or forky (CRIU 4.2.1)" >&2
    exit 2
    ;;
esac
ROOT=${CCM_TRIXIE_ROOT:-/var/cache/criu-cuda-migrate/$SUITE}
# A root knows its suite (prepare stamps it; a root without the stamp is older than the second suite: trixie).
if [ -d "$ROOT" ]; then
    made_of=$(cat "$ROOT/.ccm-suite" 2>/dev/null || echo trixie)
    if [ "$made_of" != "$SUITE" ]; then
        [ -n "${CCM_CRIU_SUITE:-}" ] &&
            { echo "criu-root.sh: $ROOT is a $made_of root, not $SUITE (CCM_CRIU_SUITE); point CCM_TRIXIE_ROOT elsewhere or unset one of them" >&2; exit 2; }
        SUITE=$made_of
    fi
fi
# The Debian archive this machine's apt already uses (one-line or deb822 sources), so no mirror is written here.
host_mirror() {
    local f
    for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
        [ -f "$f" ] && awk '$1 == "deb" { for (i = 2; i <= NF; i++) if ($i ~ /^https?:\/\//) { print $i; break } }' "$f"
    done
    for f in /etc/apt/sources.list.d/*.sources; do
        [ -f "$f" ] && awk '$1 == "URIs:" { for (i = 2; i <= NF; i++) print $i }' "$f"
    done
}
MIRROR=${CCM_DEBIAN_MIRROR:-$(host_mirror 2>/dev/null | grep -m1 -E '/debian/?$' || true)}
PACKAGES=criu,libcriu-dev
# A suite still in development carries a Valid-Until in its Release file; a mirror snapshot of it goes stale within
# days, while the packages it names stay fetchable. Stable suites have no Valid-Until.
APT_OPTS="-o Acquire::Check-Valid-Until=false"
RUNTIMES_ROOT=${CCM_RUNTIMES_ROOT:-$ROOT-runtimes}
# What the Podman flow needs on top of CRIU: the engine, both OCI runtimes CRIU is driven by, conmon, and
# busybox-static for a container image made locally (no registry is reachable from CI). iptables and iproute2:
# CRIU's network locking and podman's network setup call them even for --network none containers.
# zstd: podman compresses exported checkpoints with it, and tar needs it to read them.
# containerd: its runc shim and ctr (the containerd flow).
RUNTIME_PACKAGES="podman runc crun conmon catatonit netavark aardvark-dns iptables iproute2 busybox-static zstd containerd"
# forky's containerd 2.1 serves CRI's CheckpointContainer: the CRI client (tests/container/cri_client.py) needs gRPC,
# protobuf and protoc for CRI's api.proto, which comes out of golang-k8s-cri-api-dev alone (its Depends are the Go
# world, not needed for one .proto file). checkpointctl (1.3): the Podman and CRI flows hold its reading of their
# archives against ours; buildah: the CRI flow builds the OCI checkpoint image users restore from.
CRI_PACKAGES="python3-grpcio python3-protobuf protobuf-compiler docker-registry openssl checkpointctl buildah"
CRI_PROTO_PACKAGE=golang-k8s-cri-api-dev
CRI_PROTO=usr/share/gocode/src/k8s.io/cri-api/pkg/apis/runtime/v1/api.proto
[ "$SUITE" = forky ] && RUNTIME_PACKAGES="$RUNTIME_PACKAGES $CRI_PACKAGES"
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
PATCHED_ROOT=${CCM_PATCHED_ROOT:-/var/cache/criu-cuda-migrate/forky-plugin-options}
CRIU_PATCH=$REPO/tests/criu-patches/criu-4.2.1-plugin-options.patch
ZDTM_ROOT=${CCM_ZDTM_ROOT:-$ROOT-zdtm}
# The tests to build (tests/zdtm/run.sh runs them); where the source tree lies inside the zdtm root.
ZDTM_LIST=$REPO/tests/zdtm/tests.txt
ZDTM_TREE=/opt/criu
# What zdtm.py needs besides CRIU: make and gcc (it builds and starts each test through make), Python with PyYAML and
# protobuf (pycriu), protoc with protobuf's own .proto files (pycriu's modules are generated from CRIU's images/),
# ip (zdtm_ct brings up lo in the test's network namespace), iptables (CRIU locks a network namespace's network with
# it), ps (zdtm.py lists processes when one does not die), xz (the source tarball).
ZDTM_PACKAGES="make gcc libc6-dev python3 python3-yaml python3-protobuf protobuf-compiler libprotobuf-dev iproute2 iptables procps xz-utils"
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

# cache_ready CACHE COMPLETE WHAT: takes CACHE's lock (two preparations at once, two shells or two CI steps, must not
# both build into the same place; held until this script ends) and, when the function COMPLETE finds the cache whole,
# says so and returns 0.
cache_ready() {
    local fd
    exec {fd}>"$1.lock"
    flock "$fd"
    "$2" || return 1
    echo "criu-root.sh: $3 ready at $1"
}

cmd_prepare() {
    need_root
    mkdir -p "$(dirname "$ROOT")"
    if cache_ready "$ROOT" root_is_complete "$SUITE root (criu $(criu_version 2>/dev/null))"; then return 0; fi
    [ -e "$ROOT" ] && die "$ROOT exists but lacks usr/sbin/criu or usr/include/criu/criu-plugin.h; remove it (rm -rf '$ROOT') and run prepare again"
    ensure_debootstrap
    local tmp="$ROOT.partial.$$"
    rm -rf "$tmp"
    # An older debootstrap (bookworm's) has no script for a newer suite; every suite since buster uses sid's.
    # The mirror comes from this machine's apt sources (or CCM_DEBIAN_MIRROR), never from a host named here.
    [ -n "$MIRROR" ] ||
        die "no Debian mirror found in this machine's apt sources (/etc/apt/sources.list, /etc/apt/sources.list.d/*.list or *.sources, a URI ending in /debian); set CCM_DEBIAN_MIRROR to the URL of a Debian archive this machine can reach"
    local where=("$MIRROR")
    [ -e "/usr/share/debootstrap/scripts/$SUITE" ] || where=("$MIRROR" /usr/share/debootstrap/scripts/sid)
    echo "criu-root.sh: debootstrapping $SUITE with $PACKAGES into $ROOT (about 30 s)" >&2
    if ! debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$tmp" "${where[@]}" </dev/null >"$ROOT.debootstrap.log" 2>&1; then
        tail -n 30 "$ROOT.debootstrap.log" >&2 || true
        rm -rf "$tmp"
        die "debootstrap of $SUITE failed (log: $ROOT.debootstrap.log); check network access to $MIRROR or set CCM_DEBIAN_MIRROR"
    fi
    [ -x "$tmp/usr/sbin/criu" ] || die "debootstrap finished but $tmp/usr/sbin/criu is missing; is the criu package still in $SUITE?"
    [ -f "$tmp/usr/include/criu/criu-plugin.h" ] || die "debootstrap finished but criu/criu-plugin.h is missing; is libcriu-dev still in $SUITE?"
    echo "$SUITE" >"$tmp/.ccm-suite"
    mv "$tmp" "$ROOT"
    echo "criu-root.sh: $SUITE root ready at $ROOT (criu $(criu_version))"
}

# Complete when it was made with today's package list (the list is stamped into it).
runtimes_root_is_complete() {
    [ -x "$RUNTIMES_ROOT/usr/sbin/criu" ] && [ "$(cat "$RUNTIMES_ROOT/.ccm-runtime-packages" 2>/dev/null)" = "$RUNTIME_PACKAGES" ]
}

# A copy of the CRIU root with the container runtimes installed by the root's own apt (about 15 s and 300 MiB
# more). Built under a temporary name and renamed at the end, like the CRIU root.
cmd_prepare_runtimes() {
    need_root
    cmd_prepare >/dev/null
    if cache_ready "$RUNTIMES_ROOT" runtimes_root_is_complete "runtimes root"; then return 0; fi
    # A cache made with another package list (or half made) is ours to replace.
    [ -e "$RUNTIMES_ROOT" ] && rm -rf "$RUNTIMES_ROOT"
    local tmp="$RUNTIMES_ROOT.partial.$$" log="$RUNTIMES_ROOT.apt.log"
    rm -rf "$tmp"
    cp -a "$ROOT" "$tmp"
    cp /etc/resolv.conf "$tmp/etc/resolv.conf" 2>/dev/null || true
    echo "criu-root.sh: installing $RUNTIME_PACKAGES into $RUNTIMES_ROOT (about 20 s)" >&2
    # apt in a chroot is enough here (nothing runs CRIU yet); its own mount namespace keeps /proc private.
    if ! unshare --mount --propagation private -- chroot "$tmp" /bin/sh -c '
            mount -t proc proc /proc &&
            DEBIAN_FRONTEND=noninteractive apt-get '"$APT_OPTS"' update -qq &&
            DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends '"$RUNTIME_PACKAGES"' &&
            if [ '"$SUITE"' = forky ]; then
                cd /tmp && apt-get download '"$CRI_PROTO_PACKAGE"' &&
                dpkg-deb --fsys-tarfile '"$CRI_PROTO_PACKAGE"'_*.deb | tar -x -C / ./'"$CRI_PROTO"' &&
                rm -f '"$CRI_PROTO_PACKAGE"'_*.deb
            fi &&
            apt-get clean' </dev/null >"$log" 2>&1; then
        tail -n 30 "$log" >&2 || true
        rm -rf "$tmp"
        die "installing the runtimes failed (log: $log); check network access to the root's Debian mirror"
    fi
    local needed="usr/bin/podman usr/sbin/runc usr/bin/crun bin/busybox usr/bin/zstd usr/bin/containerd usr/bin/ctr"
    [ "$SUITE" = forky ] && needed="$needed usr/bin/protoc usr/bin/checkpointctl usr/bin/buildah $CRI_PROTO"
    for f in $needed; do
        case $f in
        *.proto) [ -f "$tmp/$f" ] ;;
        *) [ -x "$tmp/$f" ] ;;
        esac || { rm -rf "$tmp"; die "/$f is missing after apt-get install; see $log"; }
    done
    echo "$RUNTIME_PACKAGES" >"$tmp/.ccm-runtime-packages"
    mv "$tmp" "$RUNTIMES_ROOT"
    echo "criu-root.sh: runtimes root ready at $RUNTIMES_ROOT"
}

# copy_with_sources DEST: a copy of the root at DEST whose apt also knows Debian's source packages (a deb-src line for
# each deb line) and resolves names as this machine does. prepare-patched and prepare-zdtm start from it.
copy_with_sources() {
    local dest=$1 deb_src
    rm -rf "$dest"
    cp -a "$ROOT" "$dest"
    cp /etc/resolv.conf "$dest/etc/resolv.conf" 2>/dev/null || true
    deb_src=$(sed -n 's/^deb \(.*\)$/deb-src \1/p' "$dest/etc/apt/sources.list")
    if [ -n "$deb_src" ]; then echo "$deb_src" >>"$dest/etc/apt/sources.list"; fi
}

# apt_in_copy DIR LOG COMMANDS: runs COMMANDS with the copy's /bin/sh chrooted into DIR (apt in a chroot is enough
# here: nothing runs CRIU yet), in a mount namespace of its own with /proc mounted, after an `apt-get update`;
# everything it prints goes to LOG. Fails as COMMANDS fail.
apt_in_copy() {
    local dir=$1 log=$2 commands=$3
    unshare --mount --propagation private -- chroot "$dir" /bin/sh -c '
        mount -t proc proc /proc &&
        export DEBIAN_FRONTEND=noninteractive &&
        apt-get '"$APT_OPTS"' update -qq && '"$commands" </dev/null >"$log" 2>&1
}

# criu_source_commands PACKAGE VERSION MISSING: the commands (for apt_in_copy) that fetch Debian's source package of
# criu (PACKAGE: `criu`, or `criu=DEBIAN-VERSION` for that very version) and unpack its upstream tarball of CRIU
# VERSION as /tmp/criu-VERSION; MISSING is what they say when the archive has no such tarball. `apt-get source` may
# miss the Debian packaging tarball on a stale mirror snapshot; the upstream one holds everything these roots need.
criu_source_commands() {
    local package=$1 version=$2 missing=$3
    # shellcheck disable=SC2016 # the chroot's shell expands $(ls ...)
    printf '%s' 'cd /tmp && { apt-get source --download-only '"'$package'"' || true; } &&
        { ls criu_'"$version"'.orig.tar.* || { echo "'"$missing"': $(ls criu_*.dsc criu_*.orig.tar.* 2>/dev/null)"; false; }; } &&
        tar xf criu_'"$version"'.orig.tar.* && rm -f criu_*.orig.tar.* criu_*.dsc criu_*.debian.tar.*'
}

# Complete when its CRIU was built with today's patch (the patch's checksum is stamped into it).
patched_root_is_complete() {
    [ -x "$PATCHED_ROOT/usr/sbin/criu" ] &&
        [ "$(cat "$PATCHED_ROOT/.ccm-criu-patch" 2>/dev/null)" = "$(sha256sum <"$CRIU_PATCH" | cut -d' ' -f1)" ]
}

# A copy of the forky root whose criu binary and criu-plugin.h come from Debian's criu source (the package's
# upstream tarball) with tests/criu-patches/criu-4.2.1-plugin-options.patch: CRIU PR #3138's plugin options, which
# no packaged CRIU has yet. Built in a second, throw-away copy holding the build dependencies.
cmd_prepare_patched() {
    need_root
    [ "$SUITE" = forky ] || die "prepare-patched needs the forky root (CCM_CRIU_SUITE=forky)"
    cmd_prepare >/dev/null
    if cache_ready "$PATCHED_ROOT" patched_root_is_complete "patched root"; then return 0; fi
    [ -e "$PATCHED_ROOT" ] && rm -rf "$PATCHED_ROOT"
    local build="$PATCHED_ROOT.build.$$" tmp="$PATCHED_ROOT.partial.$$" log="$PATCHED_ROOT.build.log"
    rm -rf "$tmp"
    copy_with_sources "$build"
    cp "$CRIU_PATCH" "$build/tmp/plugin-options.patch"
    echo "criu-root.sh: building CRIU 4.2.1 with plugin options into $PATCHED_ROOT (about 1 minute)" >&2
    # shellcheck disable=SC2016 # the chroot's shell expands $(nproc)
    if ! apt_in_copy "$build" "$log" '
            apt-get install -y -qq --no-install-recommends patch xz-utils make gcc &&
            apt-get build-dep -y -qq --no-install-recommends criu &&
            '"$(criu_source_commands criu 4.2.1 "forky no longer has the criu 4.2.1 source; port tests/criu-patches/ to it")"' &&
            cd criu-4.2.1 && patch -p1 <../plugin-options.patch &&
            make -j"$(nproc)" criu'; then
        tail -n 30 "$log" >&2 || true
        rm -rf "$build"
        die "building the patched CRIU failed (log: $log)"
    fi
    cp -a "$ROOT" "$tmp"
    install -m 755 "$build/tmp/criu-4.2.1/criu/criu" "$tmp/usr/sbin/criu"
    install -m 644 "$build/tmp/criu-4.2.1/criu/include/criu-plugin.h" "$tmp/usr/include/criu/criu-plugin.h"
    rm -rf "$build"
    sha256sum <"$CRIU_PATCH" | cut -d' ' -f1 >"$tmp/.ccm-criu-patch"
    mv "$tmp" "$PATCHED_ROOT"
    echo "criu-root.sh: patched root ready at $PATCHED_ROOT"
}

# The tests tests/zdtm/tests.txt names (`zdtm/static/NAME [flavors] [suites] # comment` lines), one a line, sorted.
zdtm_tests() {
    sed -e 's/#.*//' "$ZDTM_LIST" | awk 'NF { print $1 }' | sort -u
}

# The zdtm root's stamp: what it was made of (the root's CRIU, the packages, the tests), so that a change of any
# makes prepare-zdtm build it again (and an edit of the list's comments or flavors does not).
zdtm_stamp() {
    echo "criu $(criu_version); packages $ZDTM_PACKAGES; tests $(zdtm_tests | sha256sum | cut -d' ' -f1)"
}

zdtm_root_is_complete() {
    [ -x "$ZDTM_ROOT/usr/sbin/criu" ] && [ -f "$ZDTM_ROOT$ZDTM_TREE/test/zdtm.py" ] &&
        [ "$(cat "$ZDTM_ROOT/.ccm-zdtm" 2>/dev/null)" = "$(zdtm_stamp)" ]
}

# A copy of the root that holds CRIU's own test suite, zdtm, for the root's CRIU: the upstream tree of Debian's
# source package of that very version in /opt/criu, pycriu's protobuf modules generated from its images/ (zdtm.py
# imports pycriu), zdtm's library and helpers and the tests tests/zdtm/tests.txt names built (libc headers are all
# they need), and what zdtm.py runs (ZDTM_PACKAGES). Nothing of CRIU itself is built: zdtm runs the root's criu.
cmd_prepare_zdtm() {
    need_root
    cmd_prepare >/dev/null
    [ -f "$ZDTM_LIST" ] || die "$ZDTM_LIST is missing"
    if cache_ready "$ZDTM_ROOT" zdtm_root_is_complete "zdtm root (criu $(criu_version 2>/dev/null))"; then return 0; fi
    [ -e "$ZDTM_ROOT" ] && rm -rf "$ZDTM_ROOT"
    local tmp="$ZDTM_ROOT.partial.$$" log="$ZDTM_ROOT.build.log" debian_version version tests
    debian_version=$(criu_version)
    # 4.1.1-1 -> 4.1.1, the upstream tarball's version (without an epoch; a +dfsg-like suffix would name another
    # tarball, and the source step says which it found)
    version=${debian_version%-*}
    version=${version#*:}
    tests=$(zdtm_tests)
    [ -n "$tests" ] || die "$ZDTM_LIST names no test"
    copy_with_sources "$tmp"
    printf '%s\n' "$tests" >"$tmp/tmp/zdtm-tests"
    echo "criu-root.sh: making the zdtm root of CRIU $version at $ZDTM_ROOT (about 1 minute)" >&2
    # shellcheck disable=SC2016 # the chroot's shell expands the loop and $(nproc)
    if ! apt_in_copy "$tmp" "$log" '
            apt-get install -y -qq --no-install-recommends '"$ZDTM_PACKAGES"' &&
            '"$(criu_source_commands "criu=$debian_version" "$version" "the archive has no source of criu $debian_version, the CRIU of $ROOT; make that root again (rm -rf $ROOT) to get the CRIU the archive has now")"' &&
            mv /tmp/criu-'"$version"' '"$ZDTM_TREE"' && cd '"$ZDTM_TREE"' &&
            make -r -R -f scripts/nmk/scripts/main.mk __nmk_dir=scripts/nmk/scripts/ makefile=Makefile obj=lib/pycriu \
                PYTHON=python3 CRIU_VERSION='"$version"' all &&
            cd test && make umount2 zdtm_ct && make -C zdtm/lib -j"$(nproc)" &&
            for dir in $(sed "s|/[^/]*\$||" /tmp/zdtm-tests | sort -u); do
                make -C "$dir" -j"$(nproc)" $(sed -n "s|^$dir/\\([^/]*\\)\$|\\1|p" /tmp/zdtm-tests) || exit 1
            done &&
            for t in $(cat /tmp/zdtm-tests); do [ -x "$t" ] || { echo "$t was not built"; exit 1; }; done &&
            python3 -c "import sys; sys.path.insert(0, \".\"); import yaml, pycriu; print(\"pycriu\", pycriu.__version__)" &&
            rm -f /tmp/zdtm-tests && apt-get clean'; then
        tail -n 30 "$log" >&2 || true
        rm -rf "$tmp"
        die "making the zdtm root failed (log: $log)"
    fi
    zdtm_stamp >"$tmp/.ccm-zdtm"
    mv "$tmp" "$ZDTM_ROOT"
    echo "criu-root.sh: zdtm root ready at $ZDTM_ROOT (criu $debian_version)"
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
    # From here on every path is the root's. Detach the host's tree so nothing in it can be reached.
    umount -l /.ccm-old-root
    export PATH=$DEBIAN_PATH
    exec "$@"
}

cmd_run() {
    need_root
    root_is_complete || die "no $SUITE root at $ROOT; run \`CCM_CRIU_SUITE=$SUITE tests/criu-root.sh prepare\` first"
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
suite) echo "$SUITE" ;;
prepare-runtimes) cmd_prepare_runtimes ;;
runtimes-path) echo "$RUNTIMES_ROOT" ;;
prepare-patched) cmd_prepare_patched ;;
patched-path) echo "$PATCHED_ROOT" ;;
prepare-zdtm) cmd_prepare_zdtm ;;
zdtm-path) echo "$ZDTM_ROOT" ;;
__enter)
    shift
    enter_root "$@"
    ;;
*)
    echo "usage: $0 prepare | run [--bind DIR]... [--] CMD [ARG]... | path | suite | prepare-runtimes | runtimes-path | prepare-patched | patched-path | prepare-zdtm | zdtm-path" >&2
    exit 2
    ;;
esac
