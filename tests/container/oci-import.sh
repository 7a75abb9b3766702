#!/usr/bin/env bash
# Checkpoint images as containerd 2.1 reads them: each oci-archive in SCRATCH/cases/ imported and unpacked by
# containerd's own client (`ctr images import --local`, which unpacks into the snapshotter by the config's
# rootfs.diff_ids, as the CRI restore mounts them), each in a containerd namespace of its own. Run inside the
# forky runtimes root by crates/archive/tests/containerd.rs (issue 35), which builds the cases with the archive
# tests' fixtures and holds ccm-archive's verdict on each against what containerd did:
#
#   bash tests/container/oci-import.sh SCRATCH
#
# For each SCRATCH/cases/NAME.tar: SCRATCH/NAME.{rc,out,err} of the import; where it was imported, the image's
# type and target (`ctr images ls`: NAME.ls) and the files of its unpacked snapshot (NAME.files, from
# `ctr images mount`; its checkpoint/inventory.img in NAME.inventory). A file SCRATCH/cases/NAME.first names a
# case imported into the same namespace before (the snapshot a node already has), its results under NAME.first. No containerd state outlives the run (its root is under /tmp, a tmpfs here).
set -u
# No -e: a status-recording flow; the Rust test reads every status.

S=$1
D=/tmp/ccm-oci-import
SOCK=$D/containerd.sock
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

# step
# shellcheck source=tests/container/common.sh
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"

# shellcheck disable=SC2317 # run by the EXIT trap
cleanup() {
    [ -n "${CONTAINERD_PID:-}" ] && kill "$CONTAINERD_PID" 2>/dev/null && wait "$CONTAINERD_PID" 2>/dev/null
}
trap cleanup EXIT

mkdir -p "$D"
cat >"$D/config.toml" <<EOF
version = 3
root = "$D/root"
state = "$D/state"
disabled_plugins = ["io.containerd.grpc.v1.cri"]
[grpc]
  address = "$SOCK"
EOF
containerd --config "$D/config.toml" >"$S/containerd.log" 2>&1 &
CONTAINERD_PID=$!
for _ in $(seq 150); do ctr --address "$SOCK" version >/dev/null 2>&1 && break; sleep 0.2; done
step version ctr --address "$SOCK" version || exit 0

# import NAMESPACE CASE LABEL: the oci-archive of CASE into NAMESPACE, its results under LABEL; then what
# containerd made of it.
import() {
    local ns=$1 case=$2 name=$3 img
    C() { ctr --address "$SOCK" --namespace "$ns" "$@"; }
    step "$name" C images import --local --snapshotter native "$S/cases/$case.tar" || return 0
    C images ls >"$S/$name.ls" 2>&1
    img=$(C images ls -q | head -n 1)
    mkdir -p "$D/mnt-$name"
    if C images mount --snapshotter native "$img" "$D/mnt-$name" >/dev/null 2>"$S/$name.mount.err"; then
        (cd "$D/mnt-$name" && find . -type f | sort) >"$S/$name.files"
        [ -f "$D/mnt-$name/checkpoint/inventory.img" ] && cat "$D/mnt-$name/checkpoint/inventory.img" >"$S/$name.inventory"
        C images unmount "$D/mnt-$name" >/dev/null 2>&1
    fi
}

for tar in "$S"/cases/*.tar; do
    name=$(basename "$tar" .tar)
    ns=ccm-$name
    [ -f "$S/cases/$name.first" ] && import "$ns" "$(cat "$S/cases/$name.first")" "$name.first"
    import "$ns" "$name" "$name"
done
exit 0
