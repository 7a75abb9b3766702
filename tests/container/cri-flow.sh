#!/usr/bin/env bash
# The kubelet's checkpoint (`POST /checkpoint/{namespace}/{pod}/{container}`) as the CRI call it becomes,
# `CheckpointContainer`, against containerd 2.1's CRI plugin with its runc shim, and the restore Kubernetes users
# do: a new container created through CRI from the checkpoint archive. Run inside a copy of the forky runtimes root
# (`CCM_CRIU_SUITE=forky tests/criu-root.sh prepare-runtimes`) by tests/container_runtime.rs:
#
#   bash tests/container/cri-flow.sh SCRATCH
#
# SCRATCH holds package.deb; every step's status goes to SCRATCH/cri-NAME.rc, its output to .out/.err, as in
# podman-flow.sh. The CRI client is tests/container/cri_client.py (CRI's api.proto, python3-grpcio). No kubelet:
# Debian has none; the calls are the ones it makes (RunPodSandbox, CreateContainer, StartContainer,
# CheckpointContainer, ContainerStatus).
#
#   1. containerd 2.1 with the CRI plugin, the plugin's libdir line in /etc/criu/runc.conf only (what the user guide
#      says for containerd), its settings in containerd's environment;
#   2. a pod sandbox on the node's network (no CNI here) and a busybox container counting in its memory;
#   3. CheckpointContainer into SCRATCH/cri-checkpoint.tar: the container keeps running (the kubelet's checkpoint
#      is forensic: containerd passes leave-running), and the archive holds CRIU's dump.log with the plugin's lines;
#   4. the container is stopped and removed; CreateContainer with the archive as the image and StartContainer bring
#      it back in the same pod: the same token, the counter going on (containerd restores when the image is a
#      checkpoint archive); CRIU's restore.log is copied from the container's state directory;
#   5. the path the Kubernetes documentation gives: an OCI checkpoint image built from the archive with buildah
#      (`from scratch`, `add` of the archive, `config --annotation`, `commit`; vfs storage), written out as an OCI
#      layout and an oci-archive (read in place by criu-cuda-migrate inspect and preflight) and pushed to the
#      loopback registry; CRI PullImage, then CreateContainer with that image and StartContainer restore it again.
#      containerd 2.1 takes an image for a checkpoint by the annotation `org.criu.checkpoint.container.name` on
#      its manifest (internal/cri/server/container_checkpoint_linux.go, checkIfCheckpointOCIImage); CRI-O by
#      `io.kubernetes.cri-o.annotations.checkpoint.name`, the one the Kubernetes documentation's buildah line sets.
#      The image gets both.
#
# checkpointctl (forky's 1.3) and criu-cuda-migrate read the CheckpointContainer archive too (archive_tools).
set -u
# No -e (nor pipefail): a status-recording flow. Each step's status goes to S/NAME.rc and the flow goes on;
# the Rust test reads the statuses and names the step that broke.

S=$1
D=/tmp/ccm-cri
SOCK=$D/containerd.sock
IMAGE=localhost/ccm-busybox:1
PAUSE=localhost/ccm-pause:1
CGROUP_PARENT=/ccm-cri-$$
# shellcheck disable=SC2016 # the container's shell expands it
LOOP='tok=$$-$RANDOM-$RANDOM; i=0; while :; do i=$((i+1)); echo "$tok $i" >/out/count; sleep 0.1; done'
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

# step, wait_counter, beyond, cri, field, state, cri_runc_conf, cri_cleanup
# shellcheck source=tests/container/common.sh
. "$HERE/common.sh"


# shellcheck disable=SC2317 # run by the EXIT trap
cleanup() { cri_cleanup 0; }
trap cleanup EXIT

[ -f /etc/criu/criu-cuda-migrate.conf.example ] ||
    step cri-install env DEBIAN_FRONTEND=noninteractive dpkg -i "$S/package.deb" || exit 0
mountpoint -q /sys/fs/cgroup || mount -t cgroup2 cgroup2 /sys/fs/cgroup
mkdir -p "$D" "$S/cri-out" "$S/cri-logs"
cri_runc_conf "$S/cri-runc.conf"

# Two local images (no registry here): busybox, and a sandbox ("pause") image that only sleeps (make_image:
# common.sh).

# The sandbox's container always gets CPU shares (containerd's default of 2), which runc writes to cpu.weight; a
# hybrid cgroup v1 host has no cpu controller in cgroup2 (here only hugetlb), so runc would fail ("can't get final
# child's PID from pipe"). There the runc the shim runs is a wrapper that drops linux.resources.cpu from the
# bundle's config.json, then runs the real runc (host-adjustments, as in podman-flow.sh).
runc_for_cri_shim "$S/cri-host-adjustments.txt"

start_registry "$D" "$S/cri-registry.log"
REG_IMAGE=$REG/ccm-busybox:1

write_cri_config "$D/config.toml" "$S/cri-criu-work" 0
cp "$D/config.toml" "$S/cri-config.toml"
# The service environment of the user guide's drop-in.
env CRIU_CUDA_MIGRATE_USABLE_GPUS=0 CRIU_CUDA_MIGRATE_MODE=permissive \
    containerd --config "$D/config.toml" >"$S/cri-containerd.log" 2>&1 &
CONTAINERD_PID=$!
for _ in $(seq 150); do cri Version '{}' >/dev/null 2>&1 && break; sleep 0.2; done
step cri-version cri Version '{}' || exit 0
make_image /tmp/ccm-busybox-oci.tar "$IMAGE" '["/bin/sh"]'
make_image /tmp/ccm-pause-oci.tar "$PAUSE" '["/bin/sleep","2147483647"]'
step cri-image ctr --address "$SOCK" --namespace k8s.io images import /tmp/ccm-busybox-oci.tar || exit 0
step cri-pause-image ctr --address "$SOCK" --namespace k8s.io images import /tmp/ccm-pause-oci.tar || exit 0
# The container's image comes from a registry, as a kubelet's would: containerd 2.1's restore pulls the base image
# by the NAME@DIGEST the checkpoint recorded (ImageRef), and an image only imported has no such name. Debian's
# docker-registry serves it on 127.0.0.1 over plain HTTP, which containerd's resolvers use for a loopback registry
# (the restore's default resolver goes straight to http:// there).
step cri-tag ctr --address "$SOCK" --namespace k8s.io images tag "$IMAGE" "$REG_IMAGE" || exit 0
step cri-push ctr --address "$SOCK" --namespace k8s.io images push --plain-http "$REG_IMAGE" || exit 0
step cri-pull cri PullImage "{\"image\":{\"image\":\"$REG_IMAGE\"}}" || exit 0

# The pod: on the node's network (NamespaceMode NODE = 2), so no CNI is needed; its cgroups under this run's parent.
POD_CONFIG=$(printf '{"metadata":{"name":"ccm-pod","uid":"ccm-pod-uid-%s","namespace":"default","attempt":0},"log_directory":"%s","linux":{"cgroup_parent":"%s","security_context":{"namespace_options":{"network":2,"pid":1,"ipc":0}}}}' \
    "$$" "$S/cri-logs" "$CGROUP_PARENT")
step cri-runp cri RunPodSandbox "{\"config\":$POD_CONFIG}" || exit 0
POD=$(field "$S/cri-runp.out" pod_sandbox_id)
CTR_CONFIG=$(printf '{"metadata":{"name":"counter","attempt":0},"image":{"image":"%s"},"command":["/bin/sh","-c",%s],"mounts":[{"container_path":"/out","host_path":"%s"}],"log_path":"counter.log","linux":{"security_context":{"namespace_options":{"network":2,"pid":1,"ipc":0}}}}' \
    "$REG_IMAGE" "$(python3 -c 'import json,sys; print(json.dumps(sys.argv[1]))' "$LOOP")" "$S/cri-out")
step cri-create cri CreateContainer "{\"pod_sandbox_id\":\"$POD\",\"config\":$CTR_CONFIG,\"sandbox_config\":$POD_CONFIG}" || exit 0
CTR=$(field "$S/cri-create.out" container_id)
step cri-start cri StartContainer "{\"container_id\":\"$CTR\"}" || exit 0
wait_counter 10 cat "$S/cri-out/count" >"$S/cri-before.count"

# What the kubelet's checkpoint API does: CheckpointContainer into an archive; the container keeps running.
step cri-checkpoint cri CheckpointContainer "{\"container_id\":\"$CTR\",\"location\":\"$S/cri-checkpoint.tar\",\"timeout\":60}"
# The loop rewrites the file (truncate, then write): wait for a whole line, never an empty read.
wait_counter 0 cat "$S/cri-out/count" >"$S/cri-checkpointed.count"
state "$CTR" >"$S/cri-after-checkpoint.state" 2>&1
wait_counter "$(beyond "$S/cri-checkpointed.count")" cat "$S/cri-out/count" >"$S/cri-after-checkpoint.count"
tar -tf "$S/cri-checkpoint.tar" >"$S/cri-archive.list" 2>&1
tar -xOf "$S/cri-checkpoint.tar" dump.log >"$S/cri-dump.log" 2>/dev/null
[ -s "$S/cri-dump.log" ] || tar -xOf "$S/cri-checkpoint.tar" ./dump.log >"$S/cri-dump.log" 2>/dev/null
[ -f "$S/cri-checkpoint.tar" ] || exit 0
archive_tools "$S/cri-checkpoint.tar" cri

# The restore Kubernetes users do: the container goes, a new one is created from the checkpoint archive.
step cri-stop cri StopContainer "{\"container_id\":\"$CTR\",\"timeout\":0}"
step cri-rm cri RemoveContainer "{\"container_id\":\"$CTR\"}"
# What the old container wrote last goes: whatever the file holds from now on, the restored one wrote.
echo "removed 0" >"$S/cri-out/count"
RESTORE_CONFIG=$(printf '{"metadata":{"name":"counter-restored","attempt":0},"image":{"image":"%s"},"mounts":[{"container_path":"/out","host_path":"%s"}],"log_path":"counter-restored.log","linux":{"security_context":{"namespace_options":{"network":2,"pid":1,"ipc":0}}}}' \
    "$S/cri-checkpoint.tar" "$S/cri-out")
step cri-restore-create cri CreateContainer "{\"pod_sandbox_id\":\"$POD\",\"config\":$RESTORE_CONFIG,\"sandbox_config\":$POD_CONFIG}" || exit 0
RESTORED=$(field "$S/cri-restore-create.out" container_id)
step cri-restore-start cri StartContainer "{\"container_id\":\"$RESTORED\"}"
cp "$S/cri-criu-work/restore.log" "$S/cri-restore.log" 2>/dev/null
state "$RESTORED" >"$S/cri-after-restore.state" 2>&1
wait_counter "$(beyond "$S/cri-checkpointed.count")" cat "$S/cri-out/count" >"$S/cri-after-restore.count"

# 5. The checkpoint image (buildah, vfs storage under D), as the Kubernetes documentation builds it.
if ! command -v buildah >/dev/null 2>&1; then
    echo "no buildah in this root" >"$S/cri-image.absent"
    exit 0
fi
# shellcheck disable=SC2317 # run through step
bah() { buildah --storage-driver vfs --root "$D/buildah" --runroot "$D/buildah-run" "$@"; }
CKPT_IMAGE=localhost/ccm-checkpoint:1
step cri-image-from bah from scratch || exit 0
WORK=$(tail -n1 "$S/cri-image-from.out")
step cri-image-add bah add "$WORK" "$S/cri-checkpoint.tar" / || exit 0
step cri-image-config bah config --annotation=io.kubernetes.cri-o.annotations.checkpoint.name=counter \
    --annotation=org.criu.checkpoint.container.name=counter "$WORK" || exit 0
step cri-image-commit bah commit "$WORK" "$CKPT_IMAGE" || exit 0
step cri-image-layout bah push "$CKPT_IMAGE" "oci:$S/cri-checkpoint-image" || exit 0
step cri-image-oci-archive bah push "$CKPT_IMAGE" "oci-archive:$S/cri-checkpoint-image.tar" || exit 0
# What criu-cuda-migrate reads of the image, in place: the layout directory and the oci-archive.
step cri-image-ccm-inspect criu-cuda-migrate inspect "$S/cri-checkpoint-image"
step cri-image-ccm-inspect-json criu-cuda-migrate --json inspect "$S/cri-checkpoint-image.tar"
step cri-image-ccm-preflight-json criu-cuda-migrate --json preflight "$S/cri-checkpoint-image"
step cri-image-push bah push --tls-verify=false "$CKPT_IMAGE" "docker://$REG/ccm-checkpoint:1" || exit 0
step cri-image-pull cri PullImage "{\"image\":{\"image\":\"$REG/ccm-checkpoint:1\"}}" || exit 0
# The container restored from the archive goes; a new one is created from the checkpoint image.
cri StopContainer "{\"container_id\":\"$RESTORED\",\"timeout\":0}" >/dev/null 2>&1
cri RemoveContainer "{\"container_id\":\"$RESTORED\"}" >/dev/null 2>&1
echo "removed 0" >"$S/cri-out/count"
IMAGE_CONFIG=$(printf '{"metadata":{"name":"counter-from-image","attempt":0},"image":{"image":"%s"},"mounts":[{"container_path":"/out","host_path":"%s"}],"log_path":"counter-from-image.log","linux":{"security_context":{"namespace_options":{"network":2,"pid":1,"ipc":0}}}}' \
    "$REG/ccm-checkpoint:1" "$S/cri-out")
rm -f "$S/cri-criu-work/restore.log"
step cri-image-restore-create cri CreateContainer "{\"pod_sandbox_id\":\"$POD\",\"config\":$IMAGE_CONFIG,\"sandbox_config\":$POD_CONFIG}" || exit 0
FROM_IMAGE=$(field "$S/cri-image-restore-create.out" container_id)
step cri-image-restore-start cri StartContainer "{\"container_id\":\"$FROM_IMAGE\"}"
cp "$S/cri-criu-work/restore.log" "$S/cri-image-restore.log" 2>/dev/null
state "$FROM_IMAGE" >"$S/cri-after-image-restore.state" 2>&1
wait_counter "$(beyond "$S/cri-checkpointed.count")" cat "$S/cri-out/count" >"$S/cri-after-image-restore.count"

# The same image with CRI-O's annotation only (the Kubernetes documentation's line): containerd 2.1 does not take it
# for a checkpoint (its log names no checkpoint in it) and creates a container from it as from any image, which has no
# command: CreateContainer fails with "no command specified".
step cri-crio-image-from bah from scratch || exit 0
WORK=$(tail -n1 "$S/cri-crio-image-from.out")
step cri-crio-image-add bah add "$WORK" "$S/cri-checkpoint.tar" / || exit 0
step cri-crio-image-config bah config --annotation=io.kubernetes.cri-o.annotations.checkpoint.name=counter "$WORK" || exit 0
step cri-crio-image-commit bah commit "$WORK" localhost/ccm-checkpoint-crio:1 || exit 0
step cri-crio-image-layout bah push localhost/ccm-checkpoint-crio:1 "oci:$S/cri-crio-image" || exit 0
step cri-crio-image-ccm-inspect criu-cuda-migrate inspect "$S/cri-crio-image"
step cri-crio-image-push bah push --tls-verify=false localhost/ccm-checkpoint-crio:1 "docker://$REG/ccm-checkpoint-crio:1" || exit 0
step cri-crio-image-pull cri PullImage "{\"image\":{\"image\":\"$REG/ccm-checkpoint-crio:1\"}}" || exit 0
CRIO_CONFIG=$(printf '{"metadata":{"name":"counter-crio-only","attempt":0},"image":{"image":"%s"},"mounts":[{"container_path":"/out","host_path":"%s"}],"log_path":"counter-crio-only.log","linux":{"security_context":{"namespace_options":{"network":2,"pid":1,"ipc":0}}}}' \
    "$REG/ccm-checkpoint-crio:1" "$S/cri-out")
step cri-crio-image-create cri CreateContainer "{\"pod_sandbox_id\":\"$POD\",\"config\":$CRIO_CONFIG,\"sandbox_config\":$POD_CONFIG}"
grep 'Found checkpoint of container' "$S/cri-containerd.log" >"$S/cri-found-checkpoint.txt"
# Every step's status and output are in $S for the test to check one by one (it names the one that failed).
exit 0
