#!/usr/bin/env bash
# Builds everything the GPU run needs, HERE (the GPU machine has no Rust toolchain and no
# registry), and gathers it in `.device/` (git-ignored) for the lead to carry along:
#
#   .device/plugin/libcriu_cuda_migrate.so   the CRIU plugin (run.sh gives CRIU a libdir holding only it)
#   .device/bin/ccm-sample-workload          the sample CUDA workload
#   .device/bin/ccm-bench                    the benchmark controller (bench/run-gpu.sh)
#   .device/bin/criu-cuda-migrate            the CLI, when crates/cli builds (optional)
#   .device/criu-debs/*.deb                  CRIU 4.1.1 and its libraries (unpacked there by run.sh)
#   .device/runc-debs/*.deb                  runc and libseccomp2 from Debian trixie (tests/gpu/container.sh)
#   .device/pkg/criu-cuda-migrate_*.deb      the project's own package (container.sh installs its files)
#   .device/MANIFEST                         git revision, build time, sha256 of every file
#
# Usage: bash tests/gpu/prepare.sh      (CRIU_DEBS=DIR overrides where the .debs come from)
# Binaries built on Debian bookworm (glibc 2.36) run on the GPU machine (Ubuntu 24.04, glibc 2.39).

set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$REPO"
DEST=$REPO/.device
# The carried folder must stay well under the device tool's 64 MiB for all carried paths.
LIMIT_MIB=60

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

rm -rf "${DEST:?}/plugin" "${DEST:?}/bin" "${DEST:?}/criu-debs" "${DEST:?}/runc-debs" "${DEST:?}/pkg" "${DEST:?}/MANIFEST"
mkdir -p "$DEST/plugin" "$DEST/bin" "$DEST/criu-debs" "$DEST/runc-debs" "$DEST/pkg"
cp target/release/libcriu_cuda_migrate.so "$DEST/plugin/"
cp target/release/ccm-sample-workload "$DEST/bin/"
cp target/release/ccm-bench "$DEST/bin/"
if ((CLI_BUILT)) && [[ -x target/release/criu-cuda-migrate ]]; then
    cp target/release/criu-cuda-migrate "$DEST/bin/"
fi
cp "$DEBS"/*.deb "$DEST/criu-debs/"

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

# The tools need no debug info there (it is most of their size); the plugin keeps its line tables
# (profile.release debug = 1) for backtraces in CRIU's log, unless the folder gets too big.
for f in "$DEST"/bin/*; do objcopy --strip-debug "$f"; done
size_mib() { du -sm "$DEST" | cut -f1; }
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

echo "prepare: .device is ready ($(size_mib) MiB):"
(cd "$DEST" && find . -type f | sort)
echo "prepare: carry .device to the GPU machine and run: bash tests/gpu/run.sh"
