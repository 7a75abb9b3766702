#!/usr/bin/env bash
# Issue 34 on the GPU machine, under real CRIU with the plugin: a tree that holds a CUDA IPC importer is refused
# before any checkpoint, by default, and keeps running with its data; trees that share nothing dump and restore;
# `criu-cuda-migrate job` answers the same for each; what the importer check costs; and the resource manager's
# free memory beside NVML's (part 5).
#
#   bash tests/gpu/ipc-refuse.sh [refuse] [container] [share-nothing] [fbinfo]     (all four without arguments)
#
#   refuse         bare trees: legacy IPC pair, cuMem POSIX-fd pair (tests/gpu/ipc_probe.c), torch.multiprocessing
#                  parent and child, CuPy pair (tests/gpu/share_jobs.py): `job` exits 1 naming the importer; the
#                  default `criu dump` fails with the plugin's refusal; every CUDA process RUNNING, its reads good
#   container      the same four inside a runc container given the GPU as CDI does (tests/gpu/container.sh's
#                  bundle), checkpointed with `runc checkpoint`
#   share-nothing  two plain CUDA processes, torch with expandable segments, a captured CUDA graph, a one-rank NCCL
#                  communicator (CRIU 4.2.1, --tcp-established): `job` exits 0; dump and restore; reads good after
#   fbinfo         tests/gpu/rm_fbinfo.c idle and with 4 GiB and 12 GiB held by other processes
#
# Needs, carried in .device/ (tests/gpu/prepare.sh): plugin, bin (criu-cuda-migrate), criu-debs, runc-debs, pkg,
# and criu-debs-4.2.1 (shared/device/criu-debs-4.2.1). Writes $OUT/ipc-refuse-results.tsv, the table
# (ipc-refuse-table.md), fbinfo.txt and every CRIU log. Exits 1 when a case does not behave as issue 34 asks.

set -uo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
export CCM_WORK=${CCM_WORK:-/var/tmp/ccm-ipc-refuse}
# tests/gpu/container.sh: setup (CRIU 4.1.1 in /opt/criu, runc, the package's plugin and runc.conf), make_bundle,
# start_container, checkpoint, container_pid, cleanup; and through it processes.sh and tests/lib/common.sh.
# shellcheck source=tests/gpu/container.sh
. "$REPO/tests/gpu/container.sh"
RESULTS=$RESULTS_DIR/ipc-refuse-results.tsv
CRIU42_ROOT=/opt/criu42
CTL=("$(command -v python3)" "$REPO/tests/gpu/ckpt_ctl.py")
JOBS=$REPO/tests/gpu/share_jobs.py
CLI=$DEVICE_DIR/bin/criu-cuda-migrate
PROBE_DIR=$WORK/probe
FAILED=0

verdict() { # CASE EXPECTED SEEN OK TIMES
    local result=PASS
    [[ $4 -eq 0 ]] || { result=FAIL; FAILED=1; }
    record "$1" "$2" "$3" "$result" "${5:--}"
}

# state PID: the driver's CUDA state of PID (host pid), or GONE.
state() {
    alive "$1" || { echo GONE; return; }
    timeout 30 "${CTL[@]}" state "$1" 2>&1 | tail -n 1 | tr '[:lower:]' '[:upper:]'
}

# advancing LOG: 0 when LOG got a new good line within 2 s.
advancing() {
    local before after
    before=$(grep -c '^ok round=\|: ok round=\| ok round=' "$1" 2>/dev/null)
    sleep 2
    after=$(grep -c '^ok round=\|: ok round=\| ok round=' "$1" 2>/dev/null)
    [[ $after -gt $before ]] && tail -n 1 "$1" | grep -q 'ok round='
}

# plugin_line LOG REGEX: the first plugin line of LOG matching REGEX, without CRIU's prefix.
plugin_line() { grep -E -m1 -- "$2" "$1" 2>/dev/null | sed 's/^.*criu-cuda-migrate: //' | cut -c1-700; }

# host_pid INIT NSPID: the host pid of the process of INIT's tree whose innermost pid is NSPID.
host_pid() {
    local p
    for p in $(descendants "$1"); do
        [[ $(awk '/^NSpid:/ { print $NF }' "/proc/$p/status" 2>/dev/null) == "$2" ]] && { echo "$p"; return; }
    done
}

# job_check ROOT EXPECTED-RC LABEL: criu-cuda-migrate job; sets JOB_RC, JOB_LINE (its verdict line) and JOB_MS.
job_check() {
    job_report "$1" "$RESULTS_DIR/logs/$3-job.txt"
    JOB_MS=$(grep -o 'answered in [0-9.]* ms' <<<"$JOB_OUT" | grep -o '[0-9.]*')
}

setup_ipc() {
    setup
    mkdir -p "$RESULTS_DIR/logs" "$PROBE_DIR" "$CRIU42_ROOT"
    : >"$RESULTS"
    local f
    for f in "$DEVICE_DIR"/criu-debs-4.2.1/*.deb; do dpkg -x "$f" "$CRIU42_ROOT"; done
    [[ -x $CLI ]] || CLI=$(command -v criu-cuda-migrate)
    gcc -O1 -o "$PROBE_DIR/ipc_probe" "$REPO/tests/gpu/ipc_probe.c" -I/usr/local/cuda/include -L/usr/local/cuda/lib64/stubs -lcuda || exit 2
    gcc -O1 -Wall -o "$PROBE_DIR/rm_fbinfo" "$REPO/tests/gpu/rm_fbinfo.c" -ldl || exit 2
    PY=""
    local p
    for p in /opt/torch/.venv/bin/python3 python3; do
        if "$p" -c 'import torch, cupy' 2>/dev/null; then PY=$(command -v "$p"); break; fi
    done
    [[ -n $PY ]] || for p in /opt/torch/.venv/bin/python3 python3; do "$p" -c 'import torch' 2>/dev/null && { PY=$(command -v "$p"); break; }; done
    CUPY_PY=""
    for p in "$PY" /opt/torch/.venv/bin/python3 python3; do "$p" -c 'import cupy' 2>/dev/null && { CUPY_PY=$(command -v "$p"); break; }; done
    log "python with torch: ${PY:-none}; with CuPy: ${CUPY_PY:-none}; CLI: $CLI"
    "$CLI" --version >"$RESULTS_DIR/cli-version.txt" 2>&1
}

# ---------------------------------------------------------------------------------------------------------------
# A tree and its CUDA processes. start_tree KIND DIR [IN-CONTAINER-DIR]: the launch command for KIND, as a JSON
# list (for a bundle) in TREE_ARGS; the files name the roles: exporter/importer logs and pid files.

# tree_cmd KIND DIR: the command that runs KIND's tree with its files in DIR (the probe binary is DIR/ipc_probe),
# in TREE_CMD; tree_args KIND DIR: the same as a JSON list, for a bundle.
tree_cmd() {
    local kind=$1 d=$2
    case $kind in
    legacy | cumem)
        TREE_CMD=(/bin/bash -c "$d/ipc_probe export-$kind $d/s.sock 64 >$d/exporter.log 2>&1 & sleep 0.5; $d/ipc_probe import-$kind $d/s.sock 1 >$d/importer.log 2>&1 & wait")
        ;;
    torch-mp) TREE_CMD=("$PY" "$JOBS" torch-mp "$d") ;;
    cupy-pair) TREE_CMD=("$CUPY_PY" "$JOBS" cupy-pair "$d") ;;
    esac
}
tree_args() {
    tree_cmd "$1" "$2"
    python3 -c 'import json, sys; print(json.dumps(sys.argv[1:]))' "${TREE_CMD[@]}"
}

# The importer's and the other process's logs, by kind.
importer_log() { case $1 in legacy | cumem) echo importer.log ;; torch-mp) echo child.log ;; cupy-pair) echo parent.log ;; esac; }
other_log() { case $1 in legacy | cumem) echo exporter.log ;; torch-mp) echo parent.log ;; cupy-pair) echo child.log ;; esac; }

# wait_tree KIND DIR: until the importer reads the peer's memory.
wait_tree() {
    local deadline=$((SECONDS + 120)) log
    log=$2/$(importer_log "$1")
    until grep -q 'ok round=.*peer=[1-9]\|ok round=.*peer=5eed0002' "$log" 2>/dev/null; do
        ((SECONDS >= deadline)) && return 1
        sleep 0.2
    done
}

# cuda_pids KIND DIR ROOT: the tree's CUDA processes (host pids), importer first.
cuda_pids() {
    local kind=$1 d=$2 root=$3 imp exp
    case $kind in
    legacy | cumem)
        # Anchored: the launching shell's command line holds both command lines too.
        imp=$(pgrep -f "^$d/ipc_probe import-$kind" | head -n1)
        exp=$(pgrep -f "^$d/ipc_probe export-$kind" | head -n1)
        ;;
    *)
        local ipid opid
        ipid=$(cat "$d/$(importer_log "$kind" | sed 's/log$/pid/')")
        opid=$(cat "$d/$(other_log "$kind" | sed 's/log$/pid/')")
        if [[ -n ${IN_CONTAINER:-} ]]; then
            imp=$(host_pid "$root" "$ipid")
            exp=$(host_pid "$root" "$opid")
        else
            imp=$ipid
            exp=$opid
        fi
        ;;
    esac
    echo "$imp $exp"
}

case_refuse_bare() {
    local kind=$1 name=refuse-$1 d=$WORK/refuse-$1 rc t0 td seen ok=0 imp exp si se
    rm -rf "$d"
    mkdir -p "$d"
    cp "$PROBE_DIR/ipc_probe" "$d/"
    tree_cmd "$kind" "$d"
    start_detached "$d" "$d/tree.log" "${TREE_CMD[@]}"
    local root=$STARTED_PID
    wait_tree "$kind" "$d" || { verdict "$name" "tree ready" "$(tail -n 3 "$d"/*.log | one_line)" 1; cleanup_processes; return; }
    read -r imp exp <<<"$(cuda_pids "$kind" "$d" "$root")"
    job_check "$root" 1 "$name"
    mkdir -p "$d/img"
    t0=$(now)
    criu_cmd -- dump -t "$root" -D "$d/img" --libdir "$PLUGIN_LIBDIR" -v4 -o dump.log --timeout 60 && rc=0 || rc=$?
    td=$(elapsed "$t0")
    seen=$(plugin_line "$d/img/dump.log" "refused before any checkpoint")
    si=$(state "$imp")
    se=$(state "$exp")
    [[ $rc -ne 0 && $seen == *"pid $imp has "*" MiB of another process's device memory open on GPU"* ]] || ok=1
    [[ $si == RUNNING && $se == RUNNING ]] || ok=1
    advancing "$d/$(importer_log "$kind")" && advancing "$d/$(other_log "$kind")" || ok=1
    [[ $JOB_RC -eq 1 && $JOB_LINE == *"would be refused"*"pid $imp has"* ]] || ok=1
    ! compgen -G "$d/img/cuda-migrate-*.img" >/dev/null || ok=1
    verdict "$name" "job exits 1 naming the importer; dump refused before any checkpoint naming pid, GPU, MiB; all RUNNING, reads good" \
        "job rc=$JOB_RC; criu rc=$rc; importer $imp $si, other $exp $se; importer reads: $(tail -n 1 "$d/$(importer_log "$kind")"); line: $seen" \
        "$ok" "dump ${td}s; job check ${JOB_MS:-?} ms; $(plugin_line "$d/img/dump.log" 'importer check before the first lock' | grep -o '[0-9.]* ms')"
    cp "$d/img/dump.log" "$RESULTS_DIR/logs/$name-dump.log" 2>/dev/null
    cleanup_processes
}

case_refuse_container() {
    local kind=$1 name=refuse-$1-runc c=$WORK/cases/refuse-$1 id=ccm-ipc-$1 rc t0 td seen ok=0 root imp exp si se
    rm -rf "$c"
    mkdir -p "$c"
    make_bundle "$c/bundle" "$c/ctl" "$(tree_args "$kind" /ctl)"
    cp "$PROBE_DIR/ipc_probe" "$c/ctl/"
    start_container "$id" "$c/bundle" || { verdict "$name" "container started" "$(tail -n 2 "$WORK/$id.stdio.log" | one_line)" 1; return; }
    wait_tree "$kind" "$c/ctl" || { verdict "$name" "tree ready" "$(tail -n 3 "$c"/ctl/*.log | one_line)" 1; runc_ delete -f "$id"; return; }
    root=$(container_pid "$id")
    case $kind in
    legacy | cumem)
        imp=$(pgrep -f "^/ctl/ipc_probe import-$kind" | head -n1)
        exp=$(pgrep -f "^/ctl/ipc_probe export-$kind" | head -n1)
        ;;
    *) read -r imp exp <<<"$(IN_CONTAINER=1 cuda_pids "$kind" "$c/ctl" "$root")" ;;
    esac
    job_check "$root" 1 "$name"
    t0=$(now)
    checkpoint "$id" "$c/img" && rc=0 || rc=$?
    td=$(elapsed "$t0")
    seen=$(plugin_line "$c/img.work/dump.log" "refused before any checkpoint")
    si=$(state "$imp")
    se=$(state "$exp")
    [[ $rc -ne 0 && $seen == *"pid $imp has "*" MiB of another process's device memory open on GPU"* ]] || ok=1
    [[ $si == RUNNING && $se == RUNNING ]] || ok=1
    advancing "$c/ctl/$(importer_log "$kind")" && advancing "$c/ctl/$(other_log "$kind")" || ok=1
    [[ $JOB_RC -eq 1 && $JOB_LINE == *"would be refused"*"pid $imp has"* ]] || ok=1
    [[ $(runc_ state "$id" 2>/dev/null | python3 -c 'import json,sys; print(json.load(sys.stdin)["status"])') == running ]] || ok=1
    verdict "$name" "the same in a runc container with the GPU as CDI gives it (runc checkpoint); the container runs on" \
        "job rc=$JOB_RC; runc checkpoint rc=$rc; importer $imp $si, other $exp $se; importer reads: $(tail -n 1 "$c/ctl/$(importer_log "$kind")"); line: $seen" \
        "$ok" "checkpoint ${td}s; job check ${JOB_MS:-?} ms; $(plugin_line "$c/img.work/dump.log" 'importer check before the first lock' | grep -o '[0-9.]* ms')"
    cp "$c/img.work/dump.log" "$RESULTS_DIR/logs/$name-dump.log" 2>/dev/null
    runc_ delete -f "$id" >/dev/null 2>&1
}

# ---------------------------------------------------------------------------------------------------------------
# Trees that share nothing: dumped and restored.

case_share_nothing() {
    local kind=$1 name=dump-$1 d=$WORK/nothing-$1 rc rrc t0 td tr ok=0 logs=() cmd criu_root=/opt/criu extra=()
    rm -rf "$d"
    mkdir -p "$d"
    case $kind in
    two-plain)
        cp "$PROBE_DIR/ipc_probe" "$d/"
        cmd=(bash -c "$d/ipc_probe plain 64 >$d/a.log 2>&1 & $d/ipc_probe plain 64 >$d/b.log 2>&1 & wait")
        logs=(a.log b.log)
        ;;
    nccl1)
        cmd=("$PY" "$JOBS" nccl1 "$d")
        logs=(main.log)
        criu_root=$CRIU42_ROOT
        extra=(--tcp-established --network-lock skip)
        ;;
    *)
        cmd=("$PY" "$JOBS" "$kind" "$d")
        logs=(main.log)
        ;;
    esac
    start_detached "$d" "$d/tree.log" "${cmd[@]}"
    local root=$STARTED_PID l deadline=$((SECONDS + 120))
    for l in "${logs[@]}"; do
        until grep -q 'ok round=' "$d/$l" 2>/dev/null; do
            ((SECONDS >= deadline)) && { verdict "$name" "tree ready" "$(tail -n 3 "$d"/*.log | one_line)" 1; cleanup_processes; return; }
            sleep 0.2
        done
    done
    job_check "$root" 0 "$name"
    local tree_pids
    tree_pids=$(descendants "$root")
    mkdir -p "$d/img"
    t0=$(now)
    CRIU_BIN=$criu_root/usr/sbin/criu CRIU_LIBS=$criu_root/usr/lib/x86_64-linux-gnu \
        criu_cmd -- dump -t "$root" -D "$d/img" --libdir "$PLUGIN_LIBDIR" -v4 -o dump.log "${extra[@]}" && rc=0 || rc=$?
    td=$(elapsed "$t0")
    # Every process of the tree, not only the root: a child's zombie still holds the root's pid as its session
    # and group id, and CRIU's restore cannot take that pid until it is reaped (measured: `Can't fork for PID:
    # File exists`).
    local p
    for p in $tree_pids; do wait_gone "$p" 30; done
    local before
    before=$(grep -c 'ok round=' "$d/${logs[0]}")
    t0=$(now)
    CRIU_BIN=$criu_root/usr/sbin/criu CRIU_LIBS=$criu_root/usr/lib/x86_64-linux-gnu \
        criu_cmd -- restore -d -D "$d/img" --libdir "$PLUGIN_LIBDIR" -v4 -o restore.log "${extra[@]}" && rrc=0 || rrc=$?
    tr=$(elapsed "$t0")
    track "$root"
    [[ $rc -eq 0 && $rrc -eq 0 ]] || ok=1
    for l in "${logs[@]}"; do advancing "$d/$l" || ok=1; done
    [[ $(grep -c 'ok round=' "$d/${logs[0]}") -gt $before ]] || ok=1
    ! grep -q '^bad\|^error\|failed' "$d/${logs[0]}" || ok=1
    [[ $JOB_RC -eq 0 && $JOB_LINE == *"ready"* ]] || ok=1
    local cleared
    cleared=$(plugin_line "$d/img/dump.log" "reports no device memory imported")
    [[ -n $cleared ]] || ok=1
    ! grep -q "this dump holds [0-9]* CUDA processes" "$d/img/dump.log" || ok=1
    verdict "$name" "job exits 0; dump (no sharing warning, the RM's all-clear line) and restore; reads good after" \
        "job rc=$JOB_RC ($JOB_LINE); dump rc=$rc, restore rc=$rrc; last read: $(tail -n 1 "$d/${logs[0]}"); line: $cleared" \
        "$ok" "dump ${td}s, restore ${tr}s; job check ${JOB_MS:-?} ms; check before the first lock $(plugin_line "$d/img/dump.log" 'importer check before the first lock' | grep -o '[0-9.]* ms'); $(grep -o 'timing: PAUSE_DEVICES(pid [0-9]*) [0-9.]* s' "$d/img/dump.log" | head -n 2 | tr '\n' ' ')"
    cp "$d/img/dump.log" "$RESULTS_DIR/logs/$name-dump.log" 2>/dev/null
    cp "$d/img/restore.log" "$RESULTS_DIR/logs/$name-restore.log" 2>/dev/null
    cleanup_processes
}

# ---------------------------------------------------------------------------------------------------------------
# Part 5: the resource manager's free memory beside NVML's.

case_fbinfo() {
    local out=$RESULTS_DIR/fbinfo.txt d=$WORK/fbinfo i
    rm -rf "$d"
    mkdir -p "$d"
    : >"$out"
    for i in 1 2 3; do "$PROBE_DIR/rm_fbinfo" "idle-$i" >>"$out" 2>&1; done
    start_detached "$d" "$d/h1.log" "$PROBE_DIR/ipc_probe" plain 4096
    wait_line_in "$d/h1.log" 'ok round=' 60
    for i in 1 2 3; do "$PROBE_DIR/rm_fbinfo" "holder-4GiB-$i" >>"$out" 2>&1; done
    start_detached "$d" "$d/h2.log" "$PROBE_DIR/ipc_probe" plain 8192
    wait_line_in "$d/h2.log" 'ok round=' 60
    for i in 1 2 3; do "$PROBE_DIR/rm_fbinfo" "holders-12GiB-$i" >>"$out" 2>&1; done
    nvidia-smi --query-gpu=memory.free,memory.total,memory.used,memory.reserved --format=csv >>"$out" 2>&1
    cleanup_processes
    local ok=0
    grep -q 'list=0x[1-9]' "$out" || ok=1
    verdict fbinfo "RM's heap free and NVML's free memory, side by side (fbinfo.txt)" "$(grep -o 'fbinfo [^ ]* .*diff_free_mib=[-0-9.]*' "$out" | sed 's/rm_heap_size_mib=[0-9.]* rm_total_ram_mib=[0-9.]* //' | tail -n 3 | one_line 400)" "$ok"
}

wait_line_in() { # FILE TEXT SECONDS
    local deadline=$((SECONDS + $3))
    until grep -q -- "$2" "$1" 2>/dev/null; do
        ((SECONDS >= deadline)) && return 1
        sleep 0.2
    done
}

main_ipc() {
    [[ $# -gt 0 ]] || set -- refuse container share-nothing fbinfo
    setup_ipc
    log "GPU: $(nvidia-smi --query-gpu=driver_version,name,uuid --format=csv,noheader)"
    local k
    for phase in "$@"; do
        case $phase in
        refuse) for k in legacy cumem torch-mp cupy-pair; do case_refuse_bare "$k"; done ;;
        container) for k in legacy cumem torch-mp cupy-pair; do case_refuse_container "$k"; done ;;
        share-nothing) for k in two-plain expandable graph nccl1; do case_share_nothing "$k"; done ;;
        fbinfo) case_fbinfo ;;
        *) echo "unknown phase $phase" >&2; exit 2 ;;
        esac
    done
    print_table | tee "$RESULTS_DIR/ipc-refuse-table.md"
    return "$FAILED"
}

main_ipc "$@"
