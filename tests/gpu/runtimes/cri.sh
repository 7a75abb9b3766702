# shellcheck shell=bash
# Part of tests/gpu/runtimes.sh, which sources it (with its settings: REPO, RTD, WORK, RESULTS, ...); not run by
# itself. containerd's CRI (the kubelet's calls) with CDI_devices, where a python3 here has grpc: used by the
# containerd phases (runtimes/containerd.sh).

cri() { CCM_CRI_GEN=$CRI_GEN "$CRI_PY" "$REPO/tests/container/cri_client.py" "$CTRD_SOCK" "$@"; }
cri_field() { python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])' "$1" "$2" 2>/dev/null; }
CRI_POD_CONFIG=$(printf '{"metadata":{"name":"ccm-rt-pod","uid":"ccm-rt-pod-uid","namespace":"default","attempt":0},"log_directory":"%s","linux":{"cgroup_parent":"%s","security_context":{"namespace_options":{"network":2,"pid":1,"ipc":0}}}}' "/var/tmp/ccm-rt/work/cri-logs" "$CGROUP_PARENT")

# cri_setup: the registry, the sample image in it (NAME@DIGEST for the restore's pull), the pause image, a pod.
# shellcheck disable=SC2120 # the containerd phases (runtimes/containerd.sh) pass the OCI archive
cri_setup() {
    mkdir -p "$WORK/cri-logs" "$RTD/registry"
    if [[ -z ${REGISTRY_PID:-} ]]; then
        printf 'version: 0.1\nstorage:\n  filesystem:\n    rootdirectory: %s\nhttp:\n  addr: %s\n' "$RTD/registry" "$REG" >"$RTD/registry.yml"
        docker-registry serve "$RTD/registry.yml" >"$WORK/registry.log" 2>&1 &
        REGISTRY_PID=$!
        for _ in $(seq 100); do (echo >"/dev/tcp/${REG%:*}/${REG#*:}") 2>/dev/null && break; sleep 0.1; done
    fi
    k() { ctr --address "$CTRD_SOCK" --namespace k8s.io "$@"; }
    [[ -f $WORK/ccm-pause-oci.tar ]] || oci_image "$WORK/ccm-pause-oci.tar" localhost/ccm-pause:1 '["/usr/bin/sleep","2147483647"]' pause_rootfs
    [[ -f $WORK/ccm-sample-oci.tar ]] || oci_image "$WORK/ccm-sample-oci.tar" "$IMAGE" '["/usr/local/bin/ccm-sample-workload"]' sample_rootfs
    k images import --snapshotter "$SNAP" "$WORK/ccm-pause-oci.tar" >/dev/null 2>&1 &&
        k images import --snapshotter "$SNAP" "${1:-$WORK/ccm-sample-oci.tar}" >/dev/null 2>&1 &&
        k images tag --force "$IMAGE" "$REG/ccm-sample:1" >/dev/null 2>&1 &&
        k images push --plain-http "$REG/ccm-sample:1" >"$WORK/cri-push.log" 2>&1 &&
        cri PullImage "{\"image\":{\"image\":\"$REG/ccm-sample:1\"}}" >/dev/null 2>"$WORK/cri-pull.err" || return 1
    [[ -n ${POD:-} ]] && return 0
    cri RunPodSandbox "{\"config\":$CRI_POD_CONFIG}" >"$WORK/cri-runp.out" 2>&1 || return 1
    POD=$(cri_field "$WORK/cri-runp.out" pod_sandbox_id)
}

# cri_create NAME IMAGE CTL CDI [COMMAND]: CreateContainer in the pod; prints the container id.
cri_create() {
    local cmd=""
    [[ -n ${5:-} ]] && cmd=',"command":["/usr/local/bin/ccm-sample-workload"],"args":["--dir","/ctl","--mib","64","--devices","0","--rounds","'$5'"]'
    cri CreateContainer "$(printf '{"pod_sandbox_id":"%s","config":{"metadata":{"name":"%s","attempt":0},"image":{"image":"%s"}%s,"mounts":[{"container_path":"/ctl","host_path":"%s"}],"CDI_devices":[{"name":"%s"}],"log_path":"%s.log","linux":{"security_context":{"namespace_options":{"network":2,"pid":1,"ipc":0}}}},"sandbox_config":%s}' \
        "$POD" "$1" "$2" "$cmd" "$3" "$4" "$1" "$CRI_POD_CONFIG")" >"$WORK/cri-create-$1.out" 2>&1 &&
        cri_field "$WORK/cri-create-$1.out" container_id
}

cri_gone() { # ID
    cri StopContainer "{\"container_id\":\"$1\",\"timeout\":0}" >/dev/null 2>&1
    cri RemoveContainer "{\"container_id\":\"$1\"}" >/dev/null 2>&1
}

cri_same() {
    local c=$WORK/cri-same id id2 seen t0 td tr pages
    rm -rf "$c"; mkdir -p "$c/ctl" "$c/ctl2"
    # shellcheck disable=SC2119 # the default image archive
    cri_setup || { record c4-cri-cdi "CRI setup (registry, images, pod)" "$(tail -n2 "$WORK/cri-push.log" "$WORK/cri-pull.err" "$WORK/cri-runp.out" 2>/dev/null | one_line)" FAIL -; return; }
    { id=$(cri_create cuda "$REG/ccm-sample:1" "$c/ctl" nvidia.com/gpu=0 3) && cri StartContainer "{\"container_id\":\"$id\"}" >/dev/null 2>"$c/start.err" &&
        wait_file "$c/ctl/ready" "$READY_TIMEOUT"; } || { record c4-cri-cdi "CreateContainer with CDI_devices nvidia.com/gpu=0" "$(tail -n2 "$WORK/cri-create-cuda.out" "$c/start.err" | one_line)" FAIL -; return; }
    go_round "$c/ctl" 1
    t0=$(now)
    cri CheckpointContainer "{\"container_id\":\"$id\",\"location\":\"$c/ckpt.tar\",\"timeout\":120}" >"$c/checkpoint.out" 2>&1 ||
        { record c4-cri-cdi "CheckpointContainer passes" "$(tail -n2 "$c/checkpoint.out" | one_line)" FAIL -; cri_gone "$id"; return; }
    td=$(elapsed "$t0")
    cri_gone "$id"
    archive_preflight c5-archive-preflight-kubelet "$c/ckpt.tar" "CRI CheckpointContainer's archive (the kubelet's form)"
    seen=
    t0=$(now)
    id2=$(cri_create cuda-restored "$c/ckpt.tar" "$c/ctl2" nvidia.com/gpu=0) && cri StartContainer "{\"container_id\":\"$id2\"}" >"$c/restore.out" 2>&1
    cp "$WORK/cri-criu-work/restore.log" "$c/restore.log" 2>/dev/null
    tr=$(elapsed "$t0")
    pages=$(page_files "$c/restore.log")
    if go_round "$c/ctl2" 2 && seen=$(check_sample_report "$c/ctl2/report2.json") && [[ $pages == "page file: "* ]]; then
        record c4-cri-cdi "CRI: CDI_devices nvidia.com/gpu=0, CheckpointContainer, CreateContainer from the archive (CDI again), StartContainer: identity agrees, the device memory through the plugin's page file in the archive" "$seen; $pages; usable GPUs: $(usable_line "$c/restore.log")" PASS "checkpoint ${td}s, restore ${tr}s; $(plugin_times "$c/restore.log")"
    else
        record c4-cri-cdi "the CRI restore runs on this GPU, the page file filled" "${seen:-$(tail -n2 "$WORK/cri-create-cuda-restored.out" "$c/restore.out" | one_line) $(first_error "$c/restore.log")}; $pages" FAIL "checkpoint ${td}s"
    fi
    [[ -n ${id2:-} ]] && cri_gone "$id2"
    rm -f "$c/ckpt.tar"
    save cri-same "$c"
}

# cri_image_restore X GPU_A: the restore Kubernetes users take (issue 31 item 1): machine A's kubelet archive built
# HERE into an OCI checkpoint image (tests/gpu/ckpt-image.sh: buildah, both checkpoint annotations), carried as
# .device/ckpt-image/ckpt-oci.tar; on this machine imported, pushed to the loopback registry, checked with
# `criu-cuda-migrate preflight` against this node, pulled through CRI, and restored by CreateContainer with that image
# and this machine's CDI GPU, then StartContainer. Needs cri_setup done (the base image by NAME@DIGEST, the pod).
cri_image_restore() {
    local x=$1 gpu_a=$2 img=$DEVICE_DIR/ckpt-image/ckpt-oci.tar ref=$REG/ccm-ckpt:1 id seen t0 tr pre
    if [[ ! -f $img ]]; then
        record cx6-cri-image-restore "CRI restore from a checkpoint image on machine B" "not run: no $img (tests/gpu/ckpt-image.sh builds it here from A's archive)" SKIP -
        return
    fi
    DUMPED_ON=$gpu_a archive_preflight cx6a-image-preflight "$img" "machine A's checkpoint image (oci-archive) on machine B, before its restore"
    k() { ctr --address "$CTRD_SOCK" --namespace k8s.io "$@"; }
    if ! { k images import --snapshotter "$SNAP" "$img" >"$x/image-import.out" 2>&1 &&
        k images tag --force localhost/ccm-ckpt:1 "$ref" >>"$x/image-import.out" 2>&1 &&
        k images push --plain-http "$ref" >>"$x/image-import.out" 2>&1 &&
        cri PullImage "{\"image\":{\"image\":\"$ref\"}}" >>"$x/image-import.out" 2>&1; }; then
        record cx6-cri-image-restore "the checkpoint image imported, pushed and pulled through CRI on B" "$(tail -n3 "$x/image-import.out" | one_line)" FAIL -
        return
    fi
    mkdir -p "$x/cri-ctl3"
    rm -f "$WORK/cri-criu-work/restore.log"
    t0=$(now)
    id=$(cri_create cuda-x-from-image "$ref" "$x/cri-ctl3" nvidia.com/gpu=0) && cri StartContainer "{\"container_id\":\"$id\"}" >"$x/cri-image-restore.out" 2>&1
    cp "$WORK/cri-criu-work/restore.log" "$x/cri-image-restore.log" 2>/dev/null
    tr=$(elapsed "$t0")
    pre=$(grep -c 'Found checkpoint of container' "$WORK/containerd.log" 2>/dev/null)
    seen=
    if go_round "$x/cri-ctl3" 2 && seen=$(check_sample_report "$x/cri-ctl3/report2.json"); then
        record cx6-cri-image-restore "CRI restore from A's checkpoint image (buildah, pushed to B's registry; CreateContainer with the image, CDI_devices nvidia.com/gpu=0 of B; StartContainer): identity names B's GPU, data intact" "dumped on $gpu_a, now: $seen; usable GPUs: $(usable_line "$x/cri-image-restore.log"); containerd log lines 'Found checkpoint': ${pre:-?}" "$([[ $gpu_a != "$GPU_UUID" ]] && echo PASS || echo 'PASS (same GPU)')" "restore ${tr}s; $(plugin_times "$x/cri-image-restore.log")"
    else
        record cx6-cri-image-restore "the CRI restore from the checkpoint image runs on B's GPU" "${seen:-$(tail -n2 "$WORK/cri-create-cuda-x-from-image.out" "$x/cri-image-restore.out" 2>/dev/null | one_line) $(first_error "$x/cri-image-restore.log")}" FAIL -
    fi
    [[ -n ${id:-} ]] && cri_gone "$id"
}
