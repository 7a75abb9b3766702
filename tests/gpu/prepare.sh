#!/usr/bin/env bash
# Builds everything the GPU run needs, HERE (the GPU machine has no Rust toolchain and no
# registry), and gathers it in `.device/` (git-ignored) for the lead to carry along:
#
#   .device/plugin/libcriu_cuda_migrate.so   the CRIU plugin (run.sh gives CRIU a libdir holding only it)
#   .device/bin/ccm-sample-workload          the sample CUDA workload
#   .device/bin/ccm-bench                    the benchmark controller (bench/run-gpu.sh)
#   .device/bin/criu-cuda-migrate            the CLI, when crates/cli builds (optional)
#   .device/bin/zstd                         this machine's zstd, when it has one (the GPU machine has none)
#   .device/criu-debs/*.deb                  CRIU 4.1.1 and its libraries (unpacked there by run.sh)
#   .device/runc-debs/*.deb                  runc and libseccomp2 from Debian trixie (tests/gpu/container.sh)
#   .device/pkg/criu-cuda-migrate_*.deb      the project's own package (container.sh installs its files)
#   .device/criu-forky/                      CRIU 4.2.1 from the forky root with its libraries and loader
#                                            (CCM_CRIU=forky on the GPU machine: processes.sh)
#   .device/MANIFEST                         git revision, build time, sha256 of every file
#
# Optional (CCM_PREPARE_RUNTIMES=1; CCM_PREPARE_RUNTIMES=only does this step alone, without building), for
# tests/gpu/runtimes.sh (issue 25), each folder carried in a call of its own (the device tool carries at most
# 64 MiB per call; the total is printed):
#   .device/runtime-debs-podman/*.deb        Podman 5.4, crun, libcriu2 (crun dlopens it), conmon, containers-common,
#                                            iptables (CRIU's network lock of a container's own network namespace)
#                                            from Debian trixie, and every library they link except glibc's,
#                                            libgcc's and libstdc++'s (the GPU host's are newer): found with ldd in
#                                            the trixie runtimes root and mapped to their packages with dpkg -S
#   .device/runtime-debs-containerd/*.deb    containerd 2.1 (containerd, its runc shim, ctr) and docker-registry (the
#                                            CRI restore pulls the base image again) from Debian forky, and
#                                            cri-gen/api_pb2.py: CRI's api.proto compiled here with protoc, for
#                                            tests/container/cri_client.py where the GPU host's python3 has grpc
#   .device/runtime-debs-*/MANIFEST          what is in it, with sha256 sums
#   (runc 1.1.15 is in .device/runc-debs/ already.)
#
# Usage: bash tests/gpu/prepare.sh      (CRIU_DEBS=DIR overrides where the .debs come from; CCM_PREPARE_DEST=DIR
#                                       writes DIR instead of .device)
# Binaries built on Debian bookworm (glibc 2.36) run on the GPU machine (Ubuntu 24.04, glibc 2.39).

set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$REPO"
DEST=${CCM_PREPARE_DEST:-$REPO/.device}
# The carried folder must stay well under the device tool's 64 MiB for all carried paths (CCM_DEVICE_LIMIT_MIB
# lower leaves room for more beside it, e.g. the parts of a move: the plugin then loses its line tables).
LIMIT_MIB=${CCM_DEVICE_LIMIT_MIB:-60}

find_debs() {
    local d
    for d in "${CRIU_DEBS:-}" "$REPO/shared/device/criu-debs" "$REPO/../shared/device/criu-debs" /work/shared/device/criu-debs; do
        if [[ -n $d ]] && compgen -G "$d/*.deb" >/dev/null; then
            printf '%s\n' "$d"
            return 0
        fi
    done
    return 1
}

# prepare_runtimes: the .debs of Podman, crun, conmon, iptables, iproute2 (trixie) and containerd 2.1 (forky) with the libraries
# they link, in .device/runtime-debs-podman and .device/runtime-debs-containerd (tests/gpu/runtimes.sh).
RUNTIME_LIMIT_MIB=55
prepare_runtimes() {
    local trixie forky podman_dir=$DEST/runtime-debs-podman ctrd_dir=$DEST/runtime-debs-containerd pkgs total d
    CCM_CRIU_SUITE=trixie bash tests/criu-root.sh prepare-runtimes >/dev/null
    CCM_CRIU_SUITE=forky bash tests/criu-root.sh prepare-runtimes >/dev/null
    trixie=$(CCM_CRIU_SUITE=trixie bash tests/criu-root.sh runtimes-path)
    forky=$(CCM_CRIU_SUITE=forky bash tests/criu-root.sh runtimes-path)
    rm -rf "$podman_dir" "$ctrd_dir" "$DEST/runtime-debs"
    mkdir -p "$podman_dir" "$ctrd_dir/cri-gen"
    # The packages the binaries' libraries come from (inside ROOT), without glibc's, libgcc's and libstdc++'s.
    lib_packages() {
        local root=$1
        shift
        # shellcheck disable=SC2016 # the chroot's sh expands the scripts' $1, $@ and $(...)
        chroot "$root" sh -c 'for b in "$@"; do ldd "$b"; done' sh "$@" |
            awk '/=> \// { print $3 } /^\t\// { print $1 }' | sort -u |
            while read -r lib; do
                chroot "$root" sh -c '{ dpkg -S "$1" 2>/dev/null || dpkg -S "$(readlink -f "$1")" 2>/dev/null; } |
                    grep -v "^diversion" | head -n1 | cut -d: -f1' sh "$lib" || true
            done | { grep -vxE 'libc6|libgcc-s1|libstdc\+\+6|' || true; } | sort -u
    }
    # download ROOT DIR PACKAGE...: apt-get download inside ROOT (its apt lists refreshed when a name is not found).
    download() {
        local root=$1 dir=$2
        shift 2
        rm -rf "$root/tmp/ccm-rt-debs"
        mkdir -p "$root/tmp/ccm-rt-debs"
        chroot "$root" sh -c 'cd /tmp/ccm-rt-debs && { apt-get -qq download "$@" || { apt-get -qq -o Acquire::Check-Valid-Until=false update && apt-get -qq download "$@"; }; }' sh "$@" ||
            { echo "prepare: cannot download $* inside $root" >&2; exit 1; }
        mv "$root"/tmp/ccm-rt-debs/*.deb "$dir/"
        rm -rf "$root/tmp/ccm-rt-debs"
    }
    # iproute2: CRIU runs `ip` to dump and restore a network namespace's addresses and routes when the runtime has it
    # dumped (crun; runc asks for it empty), and the GPU host has no ip.
    pkgs=$(lib_packages "$trixie" /usr/bin/podman /usr/bin/crun /usr/bin/conmon /usr/sbin/xtables-nft-multi /usr/sbin/xtables-legacy-multi /usr/bin/ip)
    # shellcheck disable=SC2086 # one word per package
    download "$trixie" "$podman_dir" podman crun conmon golang-github-containers-common iptables libcriu2 netavark \
        libnetfilter-conntrack3 libnfnetlink0 iproute2 $pkgs
    pkgs=$(lib_packages "$forky" /usr/bin/containerd /usr/bin/containerd-shim-runc-v2 /usr/bin/ctr /usr/bin/docker-registry)
    # shellcheck disable=SC2086
    download "$forky" "$ctrd_dir" containerd docker-registry $pkgs
    # CRI's api.proto compiled with the forky root's protoc (the GPU host has none), as cri_client.py does it.
    local gen=$forky/tmp/ccm-cri-gen
    rm -rf "$gen"
    cp tests/container/cri_client.py "$forky/tmp/ccm-cri-client.py"
    unshare --mount --propagation private -- chroot "$forky" sh -c 'mount -t proc proc /proc &&
        CCM_CRI_GEN=/tmp/ccm-cri-gen python3 -c "
import runpy; m = runpy.run_path(\"/tmp/ccm-cri-client.py\", run_name=\"ccm\"); m[\"api_module\"]()
"' >/dev/null 2>&1 && cp "$gen/api_pb2.py" "$ctrd_dir/cri-gen/" ||
        echo "prepare: WARNING: CRI's api.proto could not be compiled in the forky root; the CRI case will skip" >&2
    chroot "$forky" sh -c 'protoc --version; dpkg-query -W python3-protobuf python3-grpcio' >"$ctrd_dir/cri-gen/VERSIONS" 2>&1 || true
    rm -rf "$gen" "$forky/tmp/ccm-cri-client.py"
    for d in "$podman_dir" "$ctrd_dir"; do
        (cd "$d" && find . -type f ! -name MANIFEST -print0 | sort -z | xargs -0 sha256sum) >"$d/MANIFEST"
    done
    total=$(du -smc "$podman_dir" "$ctrd_dir" | tail -n1 | cut -f1)
    echo "prepare: runtime debs: podman $(du -sm "$podman_dir" | cut -f1) MiB, containerd $(du -sm "$ctrd_dir" | cut -f1) MiB, total $total MiB"
    for d in "$podman_dir" "$ctrd_dir"; do
        if (($(du -sm "$d" | cut -f1) > RUNTIME_LIMIT_MIB)); then
            echo "prepare: $d is over $RUNTIME_LIMIT_MIB MiB: it cannot be carried in one call" >&2
            exit 1
        fi
    done
    echo "prepare: carry .device/runtime-debs-podman and .device/runtime-debs-containerd in calls of their own, and from"
    echo "prepare: now on never .device as a whole (over 64 MiB): carry its folders by name (docs/GPU-TESTING.md, issue 25)"
}

if [[ ${CCM_PREPARE_RUNTIMES:-0} == only ]]; then
    prepare_runtimes
    exit 0
fi

DEBS=$(find_debs) || { echo "prepare: no CRIU .debs found; set CRIU_DEBS=DIR (shared/device/criu-debs)" >&2; exit 1; }

echo "prepare: building the plugin and the sample workload (release)"
cargo build --release -p criu-cuda-migrate -p ccm-workload -p ccm-bench

CLI_BUILT=0
if cargo metadata --format-version 1 --no-deps 2>/dev/null | grep -q '"name":"ccm-cli"'; then
    if cargo build --release -p ccm-cli; then
        CLI_BUILT=1
    else
        echo "prepare: WARNING: ccm-cli does not build; carrying no CLI" >&2
    fi
fi

rm -rf "${DEST:?}/plugin" "${DEST:?}/bin" "${DEST:?}/criu-debs" "${DEST:?}/runc-debs" "${DEST:?}/pkg" "${DEST:?}/MANIFEST" "${DEST:?}/criu-forky"
mkdir -p "$DEST/plugin" "$DEST/bin" "$DEST/criu-debs" "$DEST/runc-debs" "$DEST/pkg"
cp target/release/libcriu_cuda_migrate.so "$DEST/plugin/"
cp target/release/ccm-sample-workload "$DEST/bin/"
cp target/release/ccm-bench "$DEST/bin/"
if ((CLI_BUILT)) && [[ -x target/release/criu-cuda-migrate ]]; then
    cp target/release/criu-cuda-migrate "$DEST/bin/"
fi
cp "$DEBS"/*.deb "$DEST/criu-debs/"
# The GPU machine has xz but no zstd; moves of big image trees (tests/gpu/fork-workers.sh move-dump) use zstd's
# long-distance matching, which finds the pages forked workers share with their parent (xz's window cannot).
if command -v zstd >/dev/null; then
    cp "$(command -v zstd)" "$DEST/bin/"
fi

# runc from Debian trixie, downloaded inside the trixie root that tests/criu-root.sh makes (the GPU
# machine reaches no registry).
if ((CLI_BUILT)); then
    bash packaging/build-deb.sh --no-build --out "$DEST/pkg"
fi
bash tests/criu-root.sh prepare >/dev/null
TRIXIE=${CCM_TRIXIE_ROOT:-/var/cache/criu-cuda-migrate/trixie}
rm -rf "$TRIXIE/tmp/ccm-runc-debs"
mkdir -p "$TRIXIE/tmp/ccm-runc-debs"
chroot "$TRIXIE" sh -c 'cd /tmp/ccm-runc-debs && { apt-get -qq download runc libseccomp2 || { apt-get -qq update && apt-get -qq download runc libseccomp2; }; }' ||
    { echo "prepare: cannot download runc into the trixie root" >&2; exit 1; }
cp "$TRIXIE"/tmp/ccm-runc-debs/*.deb "$DEST/runc-debs/"

# CRIU 4.2.1 from the Debian forky root, with every library it links and forky's own dynamic loader (its glibc is
# newer than the GPU host's), in .device/criu-forky/: run there through the `criu` wrapper (CCM_CRIU=forky,
# tests/gpu/processes.sh). CRIU 4.1.1 cannot dump an inet socket on Linux 6.16 and later (it asks SO_PASSCRED of
# every socket, which those kernels refuse for TCP; fixed in CRIU 4.2: checkpoint-restore/criu#2705), and the GPU
# machines run 6.18: a torchrun tree (TCP to its store) needs CRIU 4.2.
prepare_forky_criu() {
    local forky=${CCM_FORKY_ROOT:-/var/cache/criu-cuda-migrate/forky} d=$DEST/criu-forky lib
    rm -rf "$d"
    if [[ ! -x $forky/usr/sbin/criu ]]; then
        echo "prepare: no forky root with CRIU ($forky): no .device/criu-forky (tests/criu-root.sh makes it)" >&2
        return 0
    fi
    mkdir -p "$d/lib"
    cp "$forky/usr/sbin/criu" "$d/criu.bin"
    for lib in $(chroot "$forky" ldd /usr/sbin/criu | awk '$3 ~ /^\// { print $3 }'); do
        cp -L "$forky$lib" "$d/lib/"
    done
    cp -L "$forky/lib64/ld-linux-x86-64.so.2" "$d/lib/"
    cat >"$d/criu" <<'WRAP'
#!/bin/sh
# CRIU 4.2.1 from Debian forky, run by its own dynamic loader and libraries (tests/gpu/prepare.sh).
here=$(dirname "$(readlink -f "$0")")
exec "$here/lib/ld-linux-x86-64.so.2" --library-path "$here/lib" "$here/criu.bin" "$@"
WRAP
    chmod +x "$d/criu"
    # shellcheck disable=SC2016 # ${Version} is dpkg-query's format, not the shell's
    echo "prepare: CRIU $(chroot "$forky" dpkg-query -W -f '${Version}' criu) from forky in .device/criu-forky ($(du -sm "$d" | cut -f1) MiB)"
}
prepare_forky_criu

# The tools need no debug info there (it is most of their size); the plugin keeps its line tables
# (profile.release debug = 1) for backtraces in CRIU's log, unless the folder gets too big.
for f in "$DEST"/bin/*; do objcopy --strip-debug "$f"; done
# The runtime debs travel in calls of their own: not counted here.
size_mib() { du -sm --exclude='runtime-debs*' "$DEST" | cut -f1; }
if (($(size_mib) > LIMIT_MIB)); then
    echo "prepare: $(size_mib) MiB > $LIMIT_MIB MiB: stripping debug info from the plugin too"
    for f in "$DEST"/plugin/*.so; do objcopy --strip-debug "$f"; done
fi
if (($(size_mib) > LIMIT_MIB)); then
    echo "prepare: .device is $(size_mib) MiB, over $LIMIT_MIB MiB; the device tool carries at most 64 MiB" >&2
    exit 1
fi

{
    echo "revision: $(git rev-parse HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo ' (dirty)')"
    echo "built: $(date -u +%FT%TZ) on $(uname -n)"
    (cd "$DEST" && find plugin bin criu-debs runc-debs pkg -type f -print0 | sort -z | xargs -0 sha256sum)
} >"$DEST/MANIFEST"

echo "prepare: .device is ready ($(size_mib) MiB without the runtime debs):"
(cd "$DEST" && find . -path './runtime-debs*' -prune -o -type f -print | sort)
if [[ ${CCM_PREPARE_RUNTIMES:-0} == 1 ]] || compgen -G "$DEST/runtime-debs-*" >/dev/null; then
    [[ ${CCM_PREPARE_RUNTIMES:-0} == 1 ]] && prepare_runtimes
    echo "prepare: carry .device's folders by name (plugin bin criu-debs runc-debs pkg MANIFEST; the runtime debs in calls of their own)"
    echo "prepare: and run: bash tests/gpu/run.sh (docs/GPU-TESTING.md)"
else
    echo "prepare: carry .device to the GPU machine and run: bash tests/gpu/run.sh"
fi
