# shellcheck shell=bash
# Part of tests/gpu/runtimes.sh, which sources it (with its settings: REPO, RTD, WORK, RESULTS, ...); not run by
# itself. containerd 2.1 with a CDI GPU through ctr: its setup, `containerd-same`, `containerd-dump`,
# `containerd-restore` (their CRI rows come from runtimes/cri.sh).

# ------------------------------------------------------------------------------------------------
# containerd 2.1: ctr with CDI, and CRI where python3 has grpc

CTRD_DONE=0
CRI_PY=
setup_containerd() {
    ((CTRD_DONE)) && return 0
    setup_base
    if ! unpack_debs runtime-debs-containerd; then
        record c0-containerd-setup "containerd from runtime-debs-containerd" "no runtime-debs-containerd carried or staged (prepare.sh with CCM_PREPARE_RUNTIMES=1; stage it)" SKIP -
        return 1
    fi
    local b
    for b in containerd ctr containerd-shim-runc-v2; do ln -sf "$RT_ROOT/usr/bin/$b" "$RT_BIN/$b"; done
    [[ -x $RT_ROOT/usr/bin/docker-registry ]] && ln -sf "$RT_ROOT/usr/bin/docker-registry" "$RT_BIN/docker-registry"
    # CRI needs grpc and protobuf in a python3 here, CRI's api.proto compiled HERE (cri-gen/api_pb2.py), and the
    # registry (containerd's CRI restore pulls the base image again).
    local gen py
    gen=$(dirname "$(cat "$RTD/unpacked-runtime-debs-containerd")")/runtime-debs-containerd/cri-gen
    CRI_WHY=
    for py in python3 "$TORCH_PY"; do
        if "$py" -c 'import grpc, google.protobuf' 2>/dev/null; then CRI_PY=$py; break; fi
    done
    if [[ ${CCM_RT_NO_CRI:-0} == 1 ]]; then
        CRI_WHY="CCM_RT_NO_CRI=1 (the dry run on the doubles; tests/container/cri-cdi-flow.sh covers CRI there)"; CRI_PY=
    elif [[ -z $CRI_PY ]]; then
        CRI_WHY="neither python3 nor $TORCH_PY has grpc and protobuf (tests/container/cri_client.py needs both)"
    elif [[ ! -f $gen/api_pb2.py ]]; then
        CRI_WHY="no cri-gen/api_pb2.py in runtime-debs-containerd (prepare.sh could not compile CRI's api.proto)"; CRI_PY=
    elif ! CCM_CRI_GEN=$gen "$CRI_PY" -c 'import sys; sys.path.insert(0, sys.argv[1]); import api_pb2' "$gen" 2>"$WORK/cri-import.err"; then
        CRI_WHY="api_pb2.py (protoc $(head -n1 "$gen/VERSIONS" 2>/dev/null)) does not load in $CRI_PY: $(tail -n1 "$WORK/cri-import.err")"; CRI_PY=
    elif [[ ! -x $RT_BIN/docker-registry ]]; then
        CRI_WHY="no docker-registry in runtime-debs-containerd"; CRI_PY=
    fi
    # shellcheck disable=SC2034 # read by cri (runtimes/cri.sh)
    CRI_GEN=$gen
    local snap=overlayfs d
    d=$(mktemp -d)
    mkdir -p "$d/l" "$d/u" "$d/w" "$d/m"
    mount -t overlay overlay -o "lowerdir=$d/l,upperdir=$d/u,workdir=$d/w" "$d/m" 2>/dev/null && umount "$d/m" || snap=native
    rm -rf "$d"
    SNAP=$snap
    mkdir -p "$RTD/containerd" /run/ccm-containerd
    # CRI gives the pod sandbox oomScoreAdj -998. Lowering a score needs CAP_SYS_RESOURCE, which root on the GPU
    # machine lacks (runc init: `failed to update /proc/self/oom_score_adj: Permission denied`, RunPodSandbox fails):
    # then containerd's own knob for that case keeps every score at or above its own.
    OOM_RESTRICT=
    # (Unless CCM_RT_CRI_EXTRA sets it already: a key twice is an error to containerd's TOML reader.)
    if [[ ${CCM_RT_CRI_EXTRA:-} != *restrict_oom_score_adj* ]] && ! (echo -999 >/proc/self/oom_score_adj) 2>/dev/null; then
        OOM_RESTRICT="  restrict_oom_score_adj = true"
        log "this root cannot lower an OOM score (no CAP_SYS_RESOURCE): containerd's CRI gets restrict_oom_score_adj = true"
    fi
    cat >"$RTD/containerd/config.toml" <<EOF
version = 3
root = "$RTD/containerd/root"
state = "/run/ccm-containerd/state"
$([[ -z $CRI_PY ]] && echo 'disabled_plugins = ["io.containerd.grpc.v1.cri"]')
[grpc]
  address = "$CTRD_SOCK"
[plugins."io.containerd.cri.v1.images"]
  snapshotter = "$snap"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = "localhost/ccm-pause:1"
[plugins."io.containerd.cri.v1.runtime"]
${CCM_RT_CRI_EXTRA:-}
$OOM_RESTRICT
  enable_cdi = true
  cdi_spec_dirs = ["/etc/cdi", "/var/run/cdi"]
  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
        BinaryName = "${CCM_RT_RUNC_BINARY:-$RT_BIN/runc}"
        CriuWorkPath = "$WORK/cri-criu-work"
EOF
    # The service's environment: PATH to the wrappers (the shim runs runc, runc runs criu), no plugin setting.
    env PATH="$PATH" containerd --config "$RTD/containerd/config.toml" >"$WORK/containerd.log" 2>&1 &
    # shellcheck disable=SC2034 # read by runtimes.sh's cleanup
    CONTAINERD_PID=$!
    for _ in $(seq 150); do ctr --address "$CTRD_SOCK" version >/dev/null 2>&1 && break; sleep 0.2; done
    if ! ctr --address "$CTRD_SOCK" version >"$WORK/ctr-version.txt" 2>&1; then
        record c0-containerd-setup "containerd 2.1 starts" "$(tail -n3 "$WORK/containerd.log" | one_line)" FAIL -
        return 1
    fi
    {
        echo "containerd: $(containerd --version) (Debian forky, dpkg -x; links glibc only); snapshotter $snap"
        echo "CRI: ${CRI_PY:-not run: $CRI_WHY}${OOM_RESTRICT:+ (restrict_oom_score_adj: this root cannot lower an OOM score)}"
    } >>"$MACHINE"
    CTRD_DONE=1
}

C() { ctr --address "$CTRD_SOCK" --namespace "$CTRD_NS" "$@"; }

# oci_image OUT NAME CMD-JSON ROOTFS-FUNCTION: an OCI image archive of that root (tests/container/common.sh's
# make_image without busybox).
oci_image() {
    local out=$1 name=$2 cmd=$3 fn=$4 w diffid layer config manifest
    w=$(mktemp -d)
    "$fn" "$w/rootfs"
    mkdir -p "$w/oci/blobs/sha256"
    tar -C "$w/rootfs" --owner=0 --group=0 --numeric-owner -cf "$w/layer.tar" .
    diffid=$(sha256sum "$w/layer.tar" | cut -d' ' -f1)
    gzip -n -c "$w/layer.tar" >"$w/layer.tar.gz"
    blob() { local d; d=$(sha256sum "$1" | cut -d' ' -f1); cp "$1" "$w/oci/blobs/sha256/$d"; echo "$d $(stat -c %s "$1")"; }
    layer=$(blob "$w/layer.tar.gz")
    printf '{"architecture":"amd64","os":"linux","config":{"Env":["PATH=/usr/local/bin:/usr/bin:/bin"],"Cmd":%s,"WorkingDir":"/"},"rootfs":{"type":"layers","diff_ids":["sha256:%s"]}}' "$cmd" "$diffid" >"$w/config.json"
    config=$(blob "$w/config.json")
    printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:%s","size":%s},"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar+gzip","digest":"sha256:%s","size":%s}]}' \
        "${config% *}" "${config#* }" "${layer% *}" "${layer#* }" >"$w/manifest.json"
    manifest=$(blob "$w/manifest.json")
    printf '{"schemaVersion":2,"manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:%s","size":%s,"annotations":{"io.containerd.image.name":"%s","org.opencontainers.image.ref.name":"1"}}]}' \
        "${manifest% *}" "${manifest#* }" "$name" >"$w/oci/index.json"
    echo '{"imageLayoutVersion":"1.0.0"}' >"$w/oci/oci-layout"
    tar -C "$w/oci" -cf "$out" oci-layout index.json blobs
    rm -rf "$w"
}

pause_rootfs() {
    local dir=$1 lib
    rm -rf "$dir"
    mkdir -p "$dir/usr/bin" "$dir/proc" "$dir/sys" "$dir/dev" "$dir/etc" "$dir/tmp"
    cp "$(command -v sleep)" "$dir/usr/bin/sleep"
    ldd "$(command -v sleep)" | awk '/=> \// { print $3 } /^\t\// { print $1 }' | while read -r lib; do cp --parents -L "$lib" "$dir/"; done
}

ctr_image() { # the sample image in containerd's namespace (imported from an OCI archive made here or carried)
    local tar=${1:-$WORK/ccm-sample-oci.tar}
    C images ls -q 2>/dev/null | grep -qx "$IMAGE" && return 0
    [[ -f $tar ]] || oci_image "$tar" "$IMAGE" '["/usr/local/bin/ccm-sample-workload"]' sample_rootfs
    C images import --snapshotter "$SNAP" "$tar" >"$WORK/ctr-import.log" 2>&1
}

ctr_run() { # ID CTL ROUNDS
    mkdir -p "$2"
    # shellcheck disable=SC2086 # the dry run's options are words
    C run -d --snapshotter "$SNAP" ${CCM_RT_CTR_RUN_ARGS:-} --device nvidia.com/gpu=0 --mount "type=bind,src=$2,dst=/ctl,options=rbind:rw" \
        "$IMAGE" "$1" /usr/local/bin/ccm-sample-workload --dir /ctl --mib 64 --devices 0 --rounds "$3" >"$WORK/$1.run" 2>&1 &&
        wait_file "$2/ready" "$READY_TIMEOUT"
}

ctr_kill() { C task kill -s KILL "$1" >/dev/null 2>&1; sleep 0.5; C task rm -f "$1" >/dev/null 2>&1; }
task_log() { find "$RTD/containerd/root" /run/ccm-containerd -path "*$CTRD_NS/$1/$2" 2>/dev/null | head -n1; } # ID LOG

phase_containerd_same() {
    setup_containerd || return 0
    cdi || { record c0-cdi-spec "CDI spec written" "$(tail -n2 "$WORK/cdi.txt" | one_line)" FAIL -; return 0; }
    ctr_image || { record c0-ctr-image "ctr images import" "$(tail -n2 "$WORK/ctr-import.log" | one_line)" FAIL -; return 0; }
    local c=$WORK/ctrd-same id=ccm-rt-c1 t0 td tr seen l pages
    rm -rf "$c"; mkdir -p "$c"
    C containers rm "$id" ccm-rt-c2 >/dev/null 2>&1
    if ! ctr_run "$id" "$c/ctl" 4; then
        record c1-ctr-cdi-run "ctr run --device nvidia.com/gpu=0" "not ready: $(tail -n3 "$WORK/$id.run" | one_line)" FAIL -; return 0
    fi
    go_round "$c/ctl" 1
    if seen=$(check_sample_report "$c/ctl/report1.json"); then
        record c1-ctr-cdi-run "ctr run --device nvidia.com/gpu=0 (CDI): identity agrees" "$seen; spec: $(C containers info "$id" 2>/dev/null | python3 -c 'import json,sys; print(" ".join(d["path"] for d in json.load(sys.stdin)["Spec"]["linux"]["devices"]))' 2>/dev/null)" PASS -
    else
        record c1-ctr-cdi-run "identity agrees" "$seen" FAIL -
    fi
    t0=$(now)
    if C task checkpoint --image-path "$c/img" --work-path "$c/work" "$id" >"$c/task-checkpoint.out" 2>&1; then
        td=$(elapsed "$t0")
        go_round "$c/ctl" 2
        if seen=$(check_sample_report "$c/ctl/report2.json"); then
            record c2-ctr-task-checkpoint "ctr task checkpoint (the task runs on): identity agrees" "$seen; identity image(s): $(find "$c/img" -maxdepth 1 -name 'cuda-migrate-*.img' | wc -l)" PASS "checkpoint ${td}s; $(plugin_times "$c/work/dump.log")"
        else
            record c2-ctr-task-checkpoint "runs on, identity agrees" "$seen; the plugin's settings at the dump: $(grep -o 'leave-running [a-z]*[^,]*' "$c/work/dump.log" | head -n1)" FAIL "checkpoint ${td}s"
        fi
    else
        record c2-ctr-task-checkpoint "ctr task checkpoint passes" "$(tail -n2 "$c/task-checkpoint.out" | one_line) $(first_error "$c/work/dump.log")" FAIL -
    fi
    cp "$c/work/dump.log" "$c/task-dump.log" 2>/dev/null
    rm -rf "$c/img"
    t0=$(now)
    if C containers checkpoint --task "$id" localhost/ccm-rt-ckpt:1 >"$c/checkpoint.out" 2>&1; then
        td=$(elapsed "$t0")
        ctr_kill "$id"
        t0=$(now)
        if C containers restore --live ccm-rt-c2 localhost/ccm-rt-ckpt:1 >"$c/restore.out" 2>&1; then
            tr=$(elapsed "$t0")
            l=$(task_log ccm-rt-c2 restore.log)
            [[ -n $l ]] && cp "$l" "$c/restore.log"
            go_round "$c/ctl" 3
            pages=$(page_files "$c/restore.log")
            if seen=$(check_sample_report "$c/ctl/report3.json") && [[ $pages == "page file: "* ]]; then
                record c3-ctr-checkpoint-restore "ctr containers checkpoint --task, kill, containers restore --live: identity agrees, data intact, the device memory through the plugin's page file in the checkpoint image" "$seen; $pages; usable GPUs: $(usable_line "$c/restore.log")" PASS "checkpoint ${td}s, restore ${tr}s; $(plugin_times "$c/restore.log")"
            else
                record c3-ctr-checkpoint-restore "identity agrees after the restore, the page file filled" "$seen; $pages" FAIL "restore ${tr}s"
            fi
        else
            l=$(task_log ccm-rt-c2 restore.log)
            record c3-ctr-checkpoint-restore "ctr containers restore --live passes" "$(tail -n2 "$c/restore.out" | one_line) $([[ -n $l ]] && first_error "$l")" FAIL "checkpoint ${td}s"
        fi
    else
        record c3-ctr-checkpoint-restore "ctr containers checkpoint --task passes" "$(tail -n2 "$c/checkpoint.out" | one_line)" FAIL -
    fi
    ctr_kill ccm-rt-c2; ctr_kill "$id"
    C containers rm "$id" ccm-rt-c2 >/dev/null 2>&1
    C images rm localhost/ccm-rt-ckpt:1 >/dev/null 2>&1
    save containerd-same "$c"
    if [[ -n $CRI_PY ]]; then cri_same; else record c4-cri-cdi "CRI: CDI_devices, CheckpointContainer, restore by CreateContainer" "not run: $CRI_WHY (the ctr cases above ran instead)" SKIP -; fi
}

# ------------------------------------------------------------------------------------------------
# containerd across machines (ctr, and CRI where it can run)
phase_containerd_dump() {
    setup_containerd || return 0
    cdi || { record cx-cdi-spec "CDI spec written" "$(tail -n2 "$WORK/cdi.txt" | one_line)" FAIL -; return 0; }
    local x=$XFER/containerd id=ccm-rt-cx t0 td seen
    rm -rf "$x"; mkdir -p "$x"
    oci_image "$x/image-oci.tar" "$IMAGE" '["/usr/local/bin/ccm-sample-workload"]' sample_rootfs
    C images rm "$IMAGE" >/dev/null 2>&1
    ctr_image "$x/image-oci.tar" || { record cx1-ctr-dump "ctr images import" "$(tail -n2 "$WORK/ctr-import.log" | one_line)" FAIL -; return 0; }
    C containers rm "$id" >/dev/null 2>&1
    if ! ctr_run "$id" "$x/ctl" 3; then
        record cx1-ctr-dump "runs on machine A" "not ready: $(tail -n3 "$WORK/$id.run" | one_line)" FAIL -; return 0
    fi
    go_round "$x/ctl" 1
    seen=$(check_sample_report "$x/ctl/report1.json")
    t0=$(now)
    if C containers checkpoint --task "$id" localhost/ccm-rt-xckpt:1 >"$x/checkpoint.out" 2>&1 &&
        C images export --all-platforms --skip-manifest-json "$x/ckpt-image.tar" localhost/ccm-rt-xckpt:1 >>"$x/checkpoint.out" 2>&1; then
        td=$(elapsed "$t0")
        record cx1-ctr-dump "ctr containers checkpoint --task, images export on machine A (GPU $GPU_UUID)" "before: $seen; checkpoint image $(du -m "$x/ckpt-image.tar" | cut -f1) MiB" PASS "checkpoint ${td}s"
    else
        record cx1-ctr-dump "ctr checkpoint and export" "$(tail -n2 "$x/checkpoint.out" | one_line)" FAIL -
        rm -f "$x/ckpt-image.tar"
    fi
    ctr_kill "$id"
    C containers rm "$id" >/dev/null 2>&1
    C images rm localhost/ccm-rt-xckpt:1 >/dev/null 2>&1
    if [[ -n $CRI_PY ]] && cri_setup "$x/image-oci.tar"; then
        mkdir -p "$x/cri-ctl"
        if id=$(cri_create cuda-x "$REG/ccm-sample:1" "$x/cri-ctl" nvidia.com/gpu=0 3) && cri StartContainer "{\"container_id\":\"$id\"}" >/dev/null 2>&1 &&
            wait_file "$x/cri-ctl/ready" "$READY_TIMEOUT" && go_round "$x/cri-ctl" 1 &&
            cri CheckpointContainer "{\"container_id\":\"$id\",\"location\":\"$x/cri-ckpt.tar\",\"timeout\":120}" >"$x/cri-checkpoint.out" 2>&1; then
            record cx2-cri-dump "CRI CheckpointContainer on machine A" "archive $(du -m "$x/cri-ckpt.tar" | cut -f1) MiB" PASS -
        else
            record cx2-cri-dump "CRI CheckpointContainer on machine A" "$(tail -n2 "$x/cri-checkpoint.out" "$WORK/cri-create-cuda-x.out" 2>/dev/null | one_line)" FAIL -
        fi
        [[ -n ${id:-} ]] && cri_gone "$id"
    else
        record cx2-cri-dump "CRI CheckpointContainer on machine A" "not run: ${CRI_WHY:-CRI setup failed}" SKIP -
    fi
    [[ -f $x/ckpt-image.tar || -f $x/cri-ckpt.tar ]] || return 0
    write_meta containerd "containerd: $(containerd --version)" "snapshotter: $SNAP"
    save containerd-dump "$x/checkpoint.out" "$x/ctl" "$x/meta.txt"
    pack containerd
}

phase_containerd_restore() {
    setup_containerd || return 0
    cdi || { record cx-cdi-spec "CDI spec written" "$(tail -n2 "$WORK/cdi.txt" | one_line)" FAIL -; return 0; }
    local why x=$XFER/containerd gpu_a t0 tr seen l id
    if ! why=$(unpack containerd "${1:-}"); then
        record cx3-ctr-restore "restored on machine B" "$why" FAIL -; return 0
    fi
    gpu_a=$(meta_get "$x/meta.txt" dumped_on_gpu)
    if [[ -f $x/ckpt-image.tar ]]; then
        C images rm "$IMAGE" localhost/ccm-rt-xckpt:1 >/dev/null 2>&1
        C containers rm ccm-rt-cx2 >/dev/null 2>&1
        if ctr_image "$x/image-oci.tar" && C images import --snapshotter "$SNAP" --all-platforms "$x/ckpt-image.tar" >"$x/import.out" 2>&1; then
            t0=$(now)
            if C containers restore --live ccm-rt-cx2 localhost/ccm-rt-xckpt:1 >"$x/restore.out" 2>&1; then
                tr=$(elapsed "$t0")
                l=$(task_log ccm-rt-cx2 restore.log); [[ -n $l ]] && cp "$l" "$x/restore.log"
                go_round "$x/ctl" 2
                if seen=$(check_sample_report "$x/ctl/report2.json"); then
                    record cx3-ctr-restore "ctr containers restore --live on machine B: identity names B's GPU, data intact" "dumped on $gpu_a, now: $seen; $(page_files "$x/restore.log"); usable GPUs: $(usable_line "$x/restore.log"); $(majors_note "$x/meta.txt")" "$([[ $gpu_a != "$GPU_UUID" ]] && echo PASS || echo 'PASS (same GPU)')" "restore ${tr}s; $(plugin_times "$x/restore.log")"
                else
                    record cx3-ctr-restore "identity names B's GPU" "$seen; $(majors_note "$x/meta.txt")" FAIL "restore ${tr}s"
                fi
            else
                l=$(task_log ccm-rt-cx2 restore.log)
                record cx3-ctr-restore "ctr containers restore --live on B" "$(tail -n2 "$x/restore.out" | one_line) $([[ -n $l ]] && first_error "$l"); $(majors_note "$x/meta.txt")" FAIL "dumped on $gpu_a"
            fi
        else
            record cx3-ctr-restore "ctr images import of A's images" "$(tail -n2 "$WORK/ctr-import.log" "$x/import.out" 2>/dev/null | one_line)" FAIL -
        fi
        ctr_kill ccm-rt-cx2
        C containers rm ccm-rt-cx2 >/dev/null 2>&1
    else
        record cx3-ctr-restore "ctr restore on B" "no ctr checkpoint in the dump (its dump failed)" SKIP -
    fi
    # What a user asks on the target node before the restore: the kubelet's archive of A, read in place here.
    [[ -f $x/cri-ckpt.tar ]] && DUMPED_ON=$gpu_a archive_preflight cx5-archive-preflight-cross "$x/cri-ckpt.tar" "machine A's CRI archive on machine B, before its restore"
    if [[ -f $x/cri-ckpt.tar && -n $CRI_PY ]] && cri_setup "$x/image-oci.tar"; then
        mkdir -p "$x/cri-ctl2"
        seen=
        t0=$(now)
        id=$(cri_create cuda-x-restored "$x/cri-ckpt.tar" "$x/cri-ctl2" nvidia.com/gpu=0) && cri StartContainer "{\"container_id\":\"$id\"}" >"$x/cri-restore.out" 2>&1
        cp "$WORK/cri-criu-work/restore.log" "$x/cri-restore.log" 2>/dev/null
        tr=$(elapsed "$t0")
        if go_round "$x/cri-ctl2" 2 && seen=$(check_sample_report "$x/cri-ctl2/report2.json"); then
            record cx4-cri-restore "CRI restore (CreateContainer from A's archive, CDI_devices nvidia.com/gpu=0 of B) on machine B: identity names B's GPU" "dumped on $gpu_a, now: $seen; $(page_files "$x/cri-restore.log"); usable GPUs: $(usable_line "$x/cri-restore.log")" "$([[ $gpu_a != "$GPU_UUID" ]] && echo PASS || echo 'PASS (same GPU)')" "restore ${tr}s; $(plugin_times "$x/cri-restore.log")"
        else
            record cx4-cri-restore "the CRI restore runs on B's GPU" "${seen:-$(tail -n2 "$WORK/cri-create-cuda-x-restored.out" "$x/cri-restore.out" | one_line) $(first_error "$x/cri-restore.log")}" FAIL -
        fi
        [[ -n ${id:-} ]] && cri_gone "$id"
        cri_image_restore "$x" "$gpu_a"
    else
        record cx4-cri-restore "CRI restore on machine B" "not run: ${CRI_WHY:-no CRI archive in the dump, or the CRI setup failed}" SKIP -
    fi
    save containerd-restore "$x/restore.log" "$x/restore.out" "$x/cri-restore.log" "$x/ctl" "$x/cri-ctl2" "$x/cri-ctl3" \
        "$x/cri-image-restore.log" "$x/cri-image-restore.out" "$x/image-import.out"
}
