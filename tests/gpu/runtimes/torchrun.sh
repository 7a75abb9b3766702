# shellcheck shell=bash
# Part of tests/gpu/runtimes.sh, which sources it (with its settings: REPO, RTD, WORK, RESULTS, ...); not run by
# itself. a 2-rank torchrun job under Podman: `torchrun-same`, `torchrun-dump`, `torchrun-restore`.

# ------------------------------------------------------------------------------------------------
# torchrun: two ranks (gloo) on the GPU under torchrun's agent, one Podman container with its own network namespace

TORCH_STEPS1=${CCM_TORCH_STEPS1:-40}
TORCH_STEPS2=${CCM_TORCH_STEPS2:-40}

# t_run NAME CTL: the job in a container (host /usr read-only, not recursive; /opt; the repository; the driver by CDI).
t_run() {
    local name=$1 ctl=$2
    podman rm -f --time 0 "$name" >/dev/null 2>&1
    mkdir -p "$ctl"
    podman run --runtime "$PODMAN_RUNTIME" -d --name "$name" --network none --cgroup-parent "$CGROUP_PARENT" \
        --device nvidia.com/gpu=0 -v /usr:/usr:ro,bind -v /opt:/opt:ro -v "$REPO:$REPO:ro" \
        -v /etc/ld.so.cache:/etc/ld.so.cache:ro -v "$ctl:/ctl" \
        -e CUBLAS_WORKSPACE_CONFIG=:4096:8 -e PYTHONDONTWRITEBYTECODE=1 -e PYTHONUNBUFFERED=1 -e HOME=/tmp \
        -e USER=root -e LOGNAME=root -e TORCHINDUCTOR_CACHE_DIR=/tmp/torchinductor \
        -e OMP_NUM_THREADS=1 -e CUDA_MODULE_LOADING=LAZY -e GLOO_SOCKET_IFNAME=lo -e TP_SOCKET_IFNAME=lo \
        "$TORCH_IMAGE" "$TORCH_PY" -m torch.distributed.run --nnodes 1 --node-rank 0 --nproc-per-node 2 \
        --rdzv-backend static --master-addr 127.0.0.1 --master-port 29511 --max-restarts 0 \
        "$REPO/tests/gpu/torchrun_job.py" --ctl /ctl --steps1 "$TORCH_STEPS1" --steps2 "$TORCH_STEPS2" >"$WORK/$name.run" 2>&1
}

t_wait() { # CTL WHAT SECONDS [CONTAINER]: both ranks' WHAT files; fails at once when CONTAINER has exited
    local deadline=$((SECONDS + $3))
    until [[ -e $1/${2}-rank0 && -e $1/${2}-rank1 ]]; do
        ((SECONDS >= deadline)) && return 1
        if [[ -n ${4:-} ]] && [[ $(podman container inspect -f '{{.State.Running}}' "$4" 2>/dev/null) != true ]]; then
            return 1
        fi
        sleep 0.2
    done
}

# shellcheck disable=SC2002 # through cat, a missing file still hashes (as empty)
t_losses() { cat "$1/losses-rank0.txt" 2>/dev/null | sha256sum | cut -c1-16; } # CTL: rank 0's losses (both agree)

# t_reference CTL: the uninterrupted run (go2 there from the start).
t_reference() {
    local ctl=$1
    rm -rf "$ctl"; mkdir -p "$ctl"
    : >"$ctl/go2"
    t_run ccm-rt-tref "$ctl" && t_wait "$ctl" "done" "$TORCH_TIMEOUT" ccm-rt-tref
    local rc=$?
    podman logs ccm-rt-tref >"$ctl/container.log" 2>&1
    podman rm -f --time 0 ccm-rt-tref >/dev/null 2>&1
    return "$rc"
}

# t_check CTL REF-CTL UUID: losses equal the reference's, line for line, both ranks; reports sound on UUID.
t_check() {
    local ctl=$1 ref=$2 uuid=$3 r out="" bad=0 s
    for r in 0 1; do
        if cmp -s "$ctl/losses-rank$r.txt" "$ref/losses-rank$r.txt"; then
            out+="rank $r: $(wc -l <"$ctl/losses-rank$r.txt") losses = reference; "
        else
            out+="rank $r: LOSSES DIFFER from the reference ($(diff "$ctl/losses-rank$r.txt" "$ref/losses-rank$r.txt" | head -n3 | one_line 120)); "
            bad=1
        fi
        s=$("${CHECK[@]}" torch "$ctl/report-rank$r.json" --uuid "$uuid") || bad=1
        out+="$s; agree=$(python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); print(r.get("identity_agrees"), r.get("identity_after",{}).get("torch_uuid","?")[:12])' "$ctl/report-rank$r.json" 2>/dev/null); "
        python3 -c 'import json,sys; sys.exit(0 if json.load(open(sys.argv[1])).get("identity_agrees") else 1)' "$ctl/report-rank$r.json" 2>/dev/null || bad=1
    done
    echo "$out"
    return "$bad"
}

t_setup() {
    setup_podman || return 1
    if [[ $NETLOCK == none || $NETLOCK == skip ]]; then
        record t0-torchrun "a torchrun job with its own network namespace" "not run: CRIU cannot lock a network namespace on this machine: $NETLOCK_WHY" SKIP -
        return 1
    fi
    [[ -x $TORCH_PY ]] || { record t0-torchrun "torch" "no $TORCH_PY (CCM_TORCH_PY)" SKIP -; return 1; }
    # The container's /usr is the host's (read-only): the driver's directory as one CDI mount.
    cdi --libs dir || { record t0-cdi-spec "CDI spec (--libs dir)" "$(tail -n2 "$WORK/cdi.txt" | one_line)" FAIL -; return 1; }
    podman_image "$TORCH_IMAGE" hostusr_rootfs || { record t0-image "podman import" "$(tail -n2 "$WORK/import.log" | one_line)" FAIL -; return 1; }
}

# t_dump X: the job up to step STEPS1 in container ccm-rt-torch (ctl X/ctl), then checkpoint --export
# --tcp-established into X/ckpt.tar. Records TROW.
t_dump() {
    local x=$1 t0 td
    { t_run ccm-rt-torch "$x/ctl" && t_wait "$x/ctl" ready1 "$TORCH_TIMEOUT" ccm-rt-torch; } ||
        { record "$TROW-dump" "the job reaches step $TORCH_STEPS1" "$(tail -n3 "$WORK/ccm-rt-torch.run" | one_line) $(podman logs ccm-rt-torch 2>&1 | tail -n5 | one_line 400)" FAIL -; return 1; }
    podman exec ccm-rt-torch cat /proc/net/tcp >"$x/tcp-before.txt" 2>/dev/null
    t0=$(now)
    p_checkpoint ccm-rt-torch "$x/ckpt.tar" --tcp-established --compress none ||
        { record "$TROW-dump" "checkpoint --tcp-established --export" "$(tail -n2 "$x/ckpt.tar.out" | one_line) $(first_error "$x/ckpt.tar.dump.log")" FAIL -; return 1; }
    td=$(elapsed "$t0")
    podman logs ccm-rt-torch >"$x/container-before.log" 2>&1
    podman rm ccm-rt-torch >/dev/null 2>&1
    echo "established TCP connections at the dump: $(awk 'NR > 1 && $4 == "01"' "$x/tcp-before.txt" | wc -l)" >"$x/dump-info.txt"
    echo "checkpoint: ${td}s, archive $(du -m "$x/ckpt.tar" | cut -f1) MiB; $(plugin_times "$x/ckpt.tar.dump.log")" >>"$x/dump-info.txt"
    record "$TROW-dump" "checkpoint --tcp-established --export at step $TORCH_STEPS1 (GPU $GPU_UUID)" "$(one_line 300 <"$x/dump-info.txt")" PASS "checkpoint ${td}s"
}

# t_restore X REF UUID-BEFORE: restore --import --tcp-established, go2, the checks. Records TROW.
t_restore() {
    local x=$1 ref=$2 before=$3 t0 tr seen
    t0=$(now)
    if ! p_restore "$x/ckpt.tar" "$x/restore.log" "" --tcp-established; then
        record "$TROW" "restore --import --tcp-established" "$(tail -n2 "$x/restore.log.out" | one_line) $(first_error "$x/restore.log"); $(majors_note "$x/meta.txt" 2>/dev/null)" FAIL -
        return 1
    fi
    tr=$(elapsed "$t0")
    : >"$x/ctl/go2"
    if ! t_wait "$x/ctl" "done" "$TORCH_TIMEOUT"; then
        record "$TROW" "the job finishes after the restore" "$(podman logs ccm-rt-torch 2>&1 | tail -n6 | one_line 400)" FAIL "restore ${tr}s"
        podman logs ccm-rt-torch >"$x/container-after.log" 2>&1
        return 1
    fi
    podman logs ccm-rt-torch >"$x/container-after.log" 2>&1
    if seen=$(t_check "$x/ctl" "$ref" "$GPU_UUID"); then
        record "$TROW" "torchrun (2 ranks, gloo, TCP established) restored: losses = the uninterrupted run's, bit for bit; identity (CUDA, NVML, torch) names this GPU; data intact; new work runs" "dumped on $before; $seen" PASS "restore ${tr}s; $(plugin_times "$x/restore.log")"
    else
        record "$TROW" "losses equal, identity agrees" "dumped on $before; $seen" FAIL "restore ${tr}s"
    fi
    podman rm -f --time 0 ccm-rt-torch >/dev/null 2>&1
}

phase_torchrun_same() {
    t_setup || return 0
    local x=$WORK/torch-same TROW=t1-torchrun-same
    rm -rf "$x"; mkdir -p "$x"
    t_reference "$x/ref" || { record t1-torchrun-reference "the uninterrupted run" "$(tail -n5 "$x/ref/container.log" | one_line 400)" FAIL -; save torch-same "$x/ref"; return 0; }
    record t1-torchrun-reference "the uninterrupted run" "losses $(t_losses "$x/ref") ($(wc -l <"$x/ref/losses-rank0.txt") steps)" PASS -
    t_dump "$x" && t_restore "$x" "$x/ref" "$GPU_UUID"
    rm -f "$x/ckpt.tar"
    save torch-same "$x"
}

phase_torchrun_dump() {
    t_setup || return 0
    local x=$XFER/torchrun TROW=tx1-torchrun
    rm -rf "$x"; mkdir -p "$x"
    t_reference "$x/ref-a" || { record tx1-torchrun-reference "the uninterrupted run on A" "$(tail -n5 "$x/ref-a/container.log" | one_line 400)" FAIL -; return 0; }
    record tx1-torchrun-reference "the uninterrupted run on machine A" "losses $(t_losses "$x/ref-a") ($(wc -l <"$x/ref-a/losses-rank0.txt") steps)" PASS -
    t_dump "$x" || { save torchrun-dump "$x"; return 0; }
    podman save -o "$x/image.tar" "$TORCH_IMAGE" >/dev/null 2>&1
    write_meta torchrun "torch: $("$TORCH_PY" -c 'import torch; print(torch.__version__)' 2>/dev/null)" "steps: $TORCH_STEPS1+$TORCH_STEPS2"
    save torchrun-dump "$x/ckpt.tar.dump.log" "$x/dump-info.txt" "$x/ref-a" "$x/meta.txt"
    pack torchrun
}

phase_torchrun_restore() {
    t_setup || return 0
    local why x=$XFER/torchrun TROW=tx2-torchrun-cross-machine gpu_a
    if ! why=$(unpack torchrun "${1:-}"); then
        record "$TROW" "restored on machine B" "$why" FAIL -; return 0
    fi
    gpu_a=$(meta_get "$x/meta.txt" dumped_on_gpu)
    podman rm -f --time 0 ccm-rt-torch >/dev/null 2>&1
    podman load -i "$x/image.tar" >"$WORK/load.log" 2>&1 || { record "$TROW" "podman load of A's image" "$(tail -n2 "$WORK/load.log" | one_line)" FAIL -; return 0; }
    # The uninterrupted run here too: A's and B's must agree with each other and with the restored job.
    if t_reference "$WORK/torch-ref-b"; then
        if cmp -s "$WORK/torch-ref-b/losses-rank0.txt" "$x/ref-a/losses-rank0.txt"; then
            record tx2-torchrun-reference-b "the uninterrupted run on machine B = A's" "losses $(t_losses "$WORK/torch-ref-b")" PASS -
        else
            record tx2-torchrun-reference-b "the uninterrupted run on machine B = A's" "B's losses differ from A's: $(diff "$WORK/torch-ref-b/losses-rank0.txt" "$x/ref-a/losses-rank0.txt" | head -n2 | one_line 200)" FAIL -
        fi
    else
        record tx2-torchrun-reference-b "the uninterrupted run on machine B" "$(tail -n5 "$WORK/torch-ref-b/container.log" | one_line 400)" FAIL -
    fi
    t_restore "$x" "$x/ref-a" "$gpu_a"
    save torchrun-restore "$x/restore.log" "$x/ctl" "$x/container-after.log" "$WORK/torch-ref-b"
}
