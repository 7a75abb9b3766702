#!/usr/bin/env bash
# HERE, between the containerd phases of tests/gpu/runtimes.sh on two GPU machines (issue 31 item 1): builds the
# OCI checkpoint image Kubernetes users restore from, out of machine A's CRI CheckpointContainer archive (the
# kubelet's form), the way the Kubernetes documentation builds it (buildah from scratch, add the archive, the
# checkpoint annotation, commit), with Debian forky's buildah in the forky runtimes root. The image gets both
# annotations: `org.criu.checkpoint.container.name` (what containerd 2.1 looks for) and
# `io.kubernetes.cri-o.annotations.checkpoint.name` (CRI-O's, the documentation's line).
#
#   sudo bash tests/gpu/ckpt-image.sh XFER_DIR
#
# XFER_DIR holds what `containerd-dump` returned from machine A (meta-containerd.txt and containerd.tar.xz.NNN).
# Writes .device/ckpt-image/ckpt-oci.tar, an oci-archive whose index names the image localhost/ccm-ckpt:1 for
# `ctr images import` (io.containerd.image.name), for the `containerd-restore` phase on machine B to push to its
# registry and restore from (row cx6), and prints what criu-cuda-migrate inspect reads of it here.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
XFER=$(realpath "${1:?usage: ckpt-image.sh XFER_DIR (the parts containerd-dump returned)}")
OUT_DIR=${CCM_DEVICE_DIR:-$REPO/.device}/ckpt-image
ROOT=$(CCM_CRIU_SUITE=forky bash "$REPO/tests/criu-root.sh" runtimes-path)
[[ -x $ROOT/usr/bin/buildah ]] || { echo "ckpt-image: no buildah in $ROOT: run tests/run-all.sh (or CCM_CRIU_SUITE=forky tests/criu-root.sh prepare-runtimes) first" >&2; exit 2; }

work=$(mktemp -d /var/tmp/ccm-ckpt-image.XXXXXX)
trap 'rm -rf "$work"' EXIT
cat "$XFER"/containerd.tar.xz.* | xz -d | tar -C "$work" -xf -
archive=$(find "$work" -name cri-ckpt.tar -type f | head -n1)
[[ -n $archive ]] || { echo "ckpt-image: no cri-ckpt.tar in $XFER's parts (machine A's CRI case did not run?)" >&2; exit 1; }
cp "$archive" "$work/ckpt.tar"
mkdir -p "$work/out"

# The Kubernetes documentation's steps, vfs storage under the scratch dir.
# shellcheck disable=SC2016 # expanded by the inner sh
CCM_TRIXIE_ROOT=$ROOT bash "$REPO/tests/criu-root.sh" run --bind "$work" -- sh -eu -c '
    bah() { buildah --storage-driver vfs --root "$0/buildah" --runroot "$0/buildah-run" "$@"; }
    c=$(bah from scratch)
    bah add "$c" "$0/ckpt.tar" /
    bah config --annotation=org.criu.checkpoint.container.name=cuda-x \
        --annotation=io.kubernetes.cri-o.annotations.checkpoint.name=cuda-x "$c"
    bah commit "$c" localhost/ccm-ckpt:1 >/dev/null
    bah push localhost/ccm-ckpt:1 "oci-archive:$0/out/ckpt-oci.tar:localhost/ccm-ckpt:1"
' "$work"

# `ctr images import` names an image by io.containerd.image.name in the archive's index.json (not a blob: no digest
# changes); buildah writes only the OCI ref name.
python3 - "$work/out/ckpt-oci.tar" "$work/ckpt-oci.tar" <<'EOF'
import io, json, sys, tarfile
src, dst = sys.argv[1], sys.argv[2]
with tarfile.open(src) as tin, tarfile.open(dst, "w") as tout:
    for m in tin.getmembers():
        data = tin.extractfile(m).read() if m.isfile() else None
        if m.name.lstrip("./") == "index.json":
            index = json.loads(data)
            for d in index["manifests"]:
                d.setdefault("annotations", {})["io.containerd.image.name"] = "localhost/ccm-ckpt:1"
            data = json.dumps(index).encode()
            m.size = len(data)
        tout.addfile(m, io.BytesIO(data) if data is not None else None)
EOF
mkdir -p "$OUT_DIR"
cp "$work/ckpt-oci.tar" "$OUT_DIR/ckpt-oci.tar"
sha256sum "$OUT_DIR/ckpt-oci.tar" >"$OUT_DIR/SHA256SUMS"
echo "ckpt-image: $OUT_DIR/ckpt-oci.tar ($(du -m "$OUT_DIR/ckpt-oci.tar" | cut -f1) MiB) from $(basename "$archive") ($(du -m "$archive" | cut -f1) MiB)"
cli=$REPO/target/debug/criu-cuda-migrate
[[ -x $cli ]] || cli=$(command -v criu-cuda-migrate || true)
if [[ -n $cli ]]; then "$cli" inspect "$OUT_DIR/ckpt-oci.tar" || true; fi
