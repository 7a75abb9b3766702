#!/usr/bin/env bash
# criu-cuda-migrate's benchmark on a GPU machine of one or two GPUs (docs/BENCHMARKS.md says what each
# figure is; with one GPU the restores go back onto it and the two-process rows share it).
#
# Run THERE, from the repository root, after tests/gpu/prepare.sh ran HERE and `.device/` was
# carried along (it holds ccm-bench, ccm-sample-workload, the plugin and CRIU's .debs):
#
#     bash bench/run-gpu.sh
#
# Builds nothing. Every figure is measured side by side in this one run, min/median/max over
# CCM_BENCH_REPEATS repeats (default 3). Bounded: after CCM_BENCH_BUDGET_S seconds (default 300)
# each remaining row runs once; after CCM_BENCH_HARD_S (default 420) remaining rows are skipped
# (recorded as skipped). Every criu run and every wait has its own timeout.
#
# Output in $OUT (the device tool's folder; else $CCM_BENCH_WORK/out): bench-results.json,
# bench-table.txt, bench-raw.jsonl (every measurement), bench-logs.tar.gz (CRIU's logs, the
# plugin's lines). Images go to /dev/shm when it has room (else $CCM_BENCH_WORK) and are deleted
# after each restore.
#
# Knobs: CCM_BENCH_WORK (default /var/tmp/ccm-bench), CCM_BENCH_IMAGES, CCM_BENCH_REPEATS,
# CCM_BENCH_BUDGET_S, CCM_BENCH_HARD_S, CCM_DEVICE_DIR (default .device), CCM_CRIU_ROOT (default
# /opt/criu), CCM_CRIU_BIN (a criu to use instead of unpacking the .debs), CCM_BENCH_SECTIONS
# (default "s1 s2 s3 s4 s1big": which parts run), CCM_BENCH_SIZES (default 1024,4096,16384: MiB
# of device memory for s1, the last one floor only when s1big runs), CCM_BENCH_HOST_MIB (default 1024,4096,16384:
# MiB of host memory of the PyTorch process in s4), CCM_BENCH_MIB2 (default 4096: MiB per process
# in s3), CCM_BENCH_TREE_NS (default 2,4: processes per s3 tree), CCM_BENCH_GPUS ("UUID BUS;UUID BUS": instead of nvidia-smi, for tests on the doubles).
# s6 (how the cost grows; not in the default sections): CCM_BENCH_SCALE_PROCS (default 1,2,4,8: processes per tree),
# CCM_BENCH_SCALE_GPUS (default 1,4,8: GPUs each process uses; counts above this machine's are skipped and say so),
# CCM_BENCH_SCALE_MIB (default 1024: MiB per process per GPU), CCM_BENCH_SIM_VIEW (1: on the test doubles, also
# limit each process's container view to its GPUs, as a container given G GPUs).

set -uo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DEVICE_DIR=${CCM_DEVICE_DIR:-$REPO/.device}
WORK=$(realpath -m "${CCM_BENCH_WORK:-/var/tmp/ccm-bench}")
OUT_DIR=$(realpath -m "${OUT:-$WORK/out}")
RAW=$WORK/raw
RECORDS=$RAW/records.jsonl
CRIU_ROOT=${CCM_CRIU_ROOT:-/opt/criu}
CRIU_LIBS=$CRIU_ROOT/usr/lib/x86_64-linux-gnu
PLUGIN_DIR=$WORK/plugins
BENCH=$DEVICE_DIR/bin/ccm-bench
WORKLOAD=$DEVICE_DIR/bin/ccm-sample-workload
SUM=(python3 "$REPO/bench/summarize.py")
REPEATS=${CCM_BENCH_REPEATS:-3}
BUDGET_S=${CCM_BENCH_BUDGET_S:-300}
HARD_S=${CCM_BENCH_HARD_S:-420}
SECTIONS=${CCM_BENCH_SECTIONS:-s1 s2 s3 s4 s1big}
IFS=, read -r -a SIZES <<<"${CCM_BENCH_SIZES:-1024,4096,16384}"
HOST_MIB=${CCM_BENCH_HOST_MIB:-1024,4096,16384}
MIB2=${CCM_BENCH_MIB2:-4096}
TREE_NS=${CCM_BENCH_TREE_NS:-2,4}
SCALE_PROCS=${CCM_BENCH_SCALE_PROCS:-1,2,4,8}
SCALE_GPUS=${CCM_BENCH_SCALE_GPUS:-1,4,8}
SCALE_MIB=${CCM_BENCH_SCALE_MIB:-1024}
CRIU_TIMEOUT=150
READY_TIMEOUT=120
STEP_TIMEOUT=180
# NVLink SHARP multicast must stay off on the lent machines.
export NCCL_NVLS_ENABLE=0
# CUDA ordinal i is nvidia-smi's GPU i.
export CUDA_DEVICE_ORDER=PCI_BUS_ID

log() { printf '[%s +%ss] %s\n' "$(date +%T)" "$SECONDS" "$*" >&2; }
now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.3f", b - a }'; }

# ---------------------------------------------------------------------------------------------
# Budget: the run must fit the device tool's command limit with room to spare.

# repeats_for ROW-REPEATS: how many repeats a row may run now (0: skip the row).
repeats_for() {
    if ((SECONDS >= HARD_S)); then
        echo 0
    elif ((SECONDS >= BUDGET_S)); then
        echo 1
    else
        echo "$1"
    fi
}

# rec ARGS...: one line of bench-raw.jsonl (summarize.py escapes and validates it).
rec() { "${SUM[@]}" record --file "$RECORDS" "$@" || log "cannot record: $*"; }
skip() { rec --section "$1" --label "$2" --skipped "$3"; log "SKIP $1 $2: $3"; }

# ---------------------------------------------------------------------------------------------
# Processes (as tests/gpu/run.sh: every process its own session, tracked by pid, killed by pid)

# track, cleanup_processes, close_inherited_fds, start_detached, wait_file, wait_gone, alive, criu_cmd
# shellcheck source=tests/gpu/processes.sh
. "$REPO/tests/gpu/processes.sh"

read_pid() { local p; p=$(<"$1"); printf '%s' "${p//[!0-9]/}"; }

# launch_workload DIR MIB DEVICES: ccm-sample-workload with one round (the final data check).
# Sets W_PID; returns 1 when it does not get ready.
launch_workload() {
    local dir=$1
    mkdir -p "$dir"
    start_detached "$dir" "$dir/workload.log" "$WORKLOAD" --dir "$dir" --mib "$2" --devices "$3" --rounds 1
    wait_file "$dir/ready" "$READY_TIMEOUT" "$STARTED_PID" || return 1
    W_PID=$(read_pid "$dir/ready")
    [[ $W_PID == "$STARTED_PID" ]] || track "$W_PID"
}

# check_workload DIR PID SECTION LABEL: the final round: data intact after every measurement?
check_workload() {
    local dir=$1 pid=$2
    : >"$dir/go1"
    if wait_file "$dir/done1" 60 "$pid"; then
        rec --section "$3" --label "$4" --check "$dir/report1.json"
    else
        rec --section "$3" --label "$4" --error "no report from the workload after the measurements"
    fi
}

# ---------------------------------------------------------------------------------------------
# The measuring commands

# bench SECTION LABEL REPEAT ARGS...: one ccm-bench run, recorded.
bench() {
    local section=$1 label=$2 k=$3 out err
    shift 3
    out=$RAW/$section-$label-$k-$1.json
    err=$RAW/$section-$label-$k-$1.err
    if timeout --kill-after=5 "$STEP_TIMEOUT" "$BENCH" "$@" >"$out" 2>"$err"; then
        rec --section "$section" --label "$label" --repeat "$k" --json "$out"
    else
        rec --section "$section" --label "$label" --repeat "$k" --error "ccm-bench $*: $(tail -c 400 "$err")"
        return 1
    fi
}

# criu_cycle SECTION LABEL REPEAT PID [ENV-ASSIGNMENT...]: criu dump of PID's tree, then criu
# restore -d with the plugin (ENV goes to the restore), both timed, logs kept, images deleted.
criu_cycle() {
    local section=$1 label=$2 k=$3 pid=$4 name img t0 rc dump_s restore_s core p
    shift 4
    name=$section-$label-$k
    img=$IMAGES/$name
    rm -rf "$img"
    mkdir -p "$img" "$RAW/logs"
    t0=$(now)
    criu_cmd -- dump -t "$pid" -D "$img" --libdir "$PLUGIN_DIR" -v4 --display-stats -o "$RAW/logs/$name-dump.log" \
        >"$RAW/logs/$name-dump.stats" 2>&1
    rc=$?
    dump_s=$(elapsed "$t0")
    if ((rc != 0)); then
        rec --section "$section" --label "$label" --repeat "$k" --error "criu dump failed ($rc): $(grep -E 'Error|criu-cuda-migrate.*(error|fail)' "$RAW/logs/$name-dump.log" | tail -n 1 | cut -c1-300)"
        rm -rf "$img"
        return 1
    fi
    for core in "$img"/core-*.img; do
        p=${core##*/core-}
        p=${p%.img}
        wait_gone "$p" 30 || log "pid $p still exists 30 s after its dump"
    done
    t0=$(now)
    criu_cmd "$@" -- restore -d -D "$img" --libdir "$PLUGIN_DIR" -v4 --display-stats -o "$RAW/logs/$name-restore.log" \
        >"$RAW/logs/$name-restore.stats" 2>&1
    rc=$?
    restore_s=$(elapsed "$t0")
    local image_mib
    image_mib=$(du -sm "$img" | cut -f1)
    rm -rf "$img"
    if ((rc != 0)); then
        rec --section "$section" --label "$label" --repeat "$k" --error "criu restore failed ($rc): $(grep -E 'Error|criu-cuda-migrate.*(error|fail)' "$RAW/logs/$name-restore.log" | tail -n 1 | cut -c1-300)"
        return 1
    fi
    rec --section "$section" --label "$label" --repeat "$k" --criu "$RAW/logs/$name-dump.log" "$RAW/logs/$name-restore.log" \
        --dump-wall "$dump_s" --restore-wall "$restore_s" --image-mib "$image_mib"
    log "$name: dump ${dump_s}s restore ${restore_s}s (${image_mib} MiB of images)"
}

# ---------------------------------------------------------------------------------------------
# Sections

# s1 (+ s2 for a tree of 1): one CUDA process with MIB of device memory on GPU 0. Per repeat,
# side by side: the driver floor, then a CRIU dump + restore with the plugin (a migration: the
# swap map, so the restore side includes the identity rewrite), then for the smallest size the
# per-action tool path against the in-process sequence.
section_single() {
    local mib=$1 with_criu=$2 with_per_action=$3 d n k label=${1}MiB
    n=$(repeats_for "$REPEATS")
    ((n > 0)) || { skip s1 "$label" "over the time budget"; return 0; }
    d=$WORK/s1-$mib
    if ! launch_workload "$d" "$mib" 0; then
        rec --section s1 --label "$label" --error "workload ($mib MiB) not ready: $(tail -n 2 "$d/workload.log" | tr '\n' ' ')"
        return 0
    fi
    for ((k = 1; k <= n; k++)); do
        bench s1 "$label" "$k" floor --pid "$W_PID" || break
        if ((with_criu)); then
            criu_cycle s1 "$label" "$k" "$W_PID" "${MAP_ENV[@]}" || break
        fi
        if ((with_per_action)); then
            bench s2 tree1 "$k" per-action --pid "$W_PID" || break
            bench s2 tree1 "$k" floor --pid "$W_PID" || break
        fi
        # The later repeats of this row only while the run is within its budget.
        ((k < n)) && (($(repeats_for "$REPEATS") < 2)) && break
    done
    check_workload "$d" "$W_PID" s1 "$label"
    cleanup_processes
}

# s2, tree of 2: two processes (1 GiB each, GPU 0 and GPU 1): per-action path (serial, as CRIU's
# CUDA plugin) against the in-process sequence (parallel checkpoint/restore, as our plugin).
section_per_action_tree2() {
    local d=$WORK/s2 n k a b mib=${SIZES[0]}
    n=$(repeats_for "$REPEATS")
    ((n > 0)) || { skip s2 tree2 "over the time budget"; return 0; }
    launch_workload "$d/a" "$mib" 0 || { rec --section s2 --label tree2 --error "workload a not ready"; return 0; }
    a=$W_PID
    launch_workload "$d/b" "$mib" "$DEV_B" || { rec --section s2 --label tree2 --error "workload b not ready"; cleanup_processes; return 0; }
    b=$W_PID
    for ((k = 1; k <= n; k++)); do
        bench s2 tree2 "$k" per-action --pid "$a,$b" || break
        bench s2 tree2 "$k" floor --pid "$a,$b" || break
        ((k < n)) && (($(repeats_for "$REPEATS") < 2)) && break
    done
    check_workload "$d/a" "$a" s2 tree2-a
    check_workload "$d/b" "$b" s2 tree2-b
    cleanup_processes
}

# s3: one tree of N workloads (a shell with N of them, MIB2 each; on one GPU they share it, on two they
# alternate). Per repeat: the floor of each alone, the floor of all N driven in parallel by one bare
# controller, then CRIU dump + restore of the tree with the plugin. One tree per N of TREE_NS.
section_parallel() {
    local np=$1 d=$WORK/s3-$1 n k root i ok=1
    local label=tree$np
    local pids=()
    n=$(repeats_for "$REPEATS")
    ((n > 0)) || { skip s3 "$label" "over the time budget"; return 0; }
    for ((i = 1; i <= np; i++)); do mkdir -p "$d/p$i"; done
    # shellcheck disable=SC2016
    start_detached "$d" "$d/tree.log" bash -c \
        'for ((i = 1; i <= $3; i++)); do
             "$0" --dir "$1/p$i" --mib "$2" --devices $(( (i - 1) % $4 )) --rounds 1 >"$1/p$i/workload.log" 2>&1 &
         done
         wait' "$WORKLOAD" "$d" "$MIB2" "$np" "${#GPU_UUID[@]}"
    root=$STARTED_PID
    for ((i = 1; i <= np; i++)); do
        wait_file "$d/p$i/ready" "$READY_TIMEOUT" "$root" || ok=0
    done
    if ((!ok)); then
        rec --section s3 --label "$label" --error "tree not ready: $(tail -q -n 1 "$d"/p*/workload.log | tr '\n' ' ')"
        cleanup_processes
        return 0
    fi
    for ((i = 1; i <= np; i++)); do pids+=("$(read_pid "$d/p$i/ready")"); done
    local all
    all=$(IFS=,; echo "${pids[*]}")
    for ((k = 1; k <= n; k++)); do
        for ((i = 1; i <= np; i++)); do
            bench s3 "$label-single-$i" "$k" floor --pid "${pids[i - 1]}" || break 2
        done
        bench s3 "$label-floor-all" "$k" floor --pid "$all" || break
        criu_cycle s3 "$label" "$k" "$root" || break
        ((k < n)) && (($(repeats_for "$REPEATS") < 2)) && break
    done
    for ((i = 1; i <= np; i++)); do
        check_workload "$d/p$i" "${pids[i - 1]}" s3 "$label-p$i"
    done
    cleanup_processes
}

# s4 + s5: a PyTorch process (256 MiB on cuda:0, seeing both GPUs) holding each amount of host
# memory of HOST_MIB in turn; per repeat a CRIU migration (swap map) with the plugin. The last,
# largest stage runs once.
section_torch() {
    local d=$WORK/s4 pid stage=1 k n mib stages
    if ! python3 -c 'import torch' 2>/dev/null; then
        skip s4 pytorch "python3 has no torch here"
        return 0
    fi
    ((SECONDS < HARD_S)) || { skip s4 pytorch "over the time budget"; return 0; }
    mkdir -p "$d"
    IFS=, read -r -a stages <<<"$HOST_MIB"
    start_detached "$d" "$d/torch.log" python3 "$REPO/bench/torch_hostmem.py" --dir "$d" --device-mib 256 \
        --host-mib "$HOST_MIB" --timeout 600
    if ! wait_file "$d/ready" "$READY_TIMEOUT" "$STARTED_PID"; then
        rec --section s4 --label pytorch --error "PyTorch process not ready: $(tail -n 2 "$d/torch.log" | tr '\n' ' ')"
        cleanup_processes
        return 0
    fi
    pid=$(read_pid "$d/ready")
    [[ $pid == "$STARTED_PID" ]] || track "$pid"
    for mib in "${stages[@]}"; do
        if ((stage > 1)); then
            ((SECONDS < HARD_S)) || { skip s4 "host-${mib}MiB" "over the time budget"; break; }
            : >"$d/go$stage"
            wait_file "$d/ready$stage" "$READY_TIMEOUT" "$pid" ||
                { rec --section s4 --label "host-${mib}MiB" --error "stage $stage not ready: $(tail -n 2 "$d/torch.log" | tr '\n' ' ')"; break; }
        fi
        n=$(repeats_for "$REPEATS")
        ((stage == ${#stages[@]} && stage > 1)) && n=$((n < 1 ? n : 1))
        ((n > 0)) || { skip s4 "host-${mib}MiB" "over the time budget"; break; }
        for ((k = 1; k <= n; k++)); do
            criu_cycle s4 "host-${mib}MiB" "$k" "$pid" "${MAP_ENV[@]}" || break 2
            ((k < n)) && (($(repeats_for "$REPEATS") < 2)) && break
        done
        stage=$((stage + 1))
    done
    : >"$d/verify"
    if wait_file "$d/report.json" 120 "$pid"; then
        rec --section s4 --label pytorch --check "$d/report.json"
    else
        rec --section s4 --label pytorch --error "no report from the PyTorch process: $(tail -n 2 "$d/torch.log" | tr '\n' ' ')"
    fi
    cp "$d/torch.log" "$RAW/logs/" 2>/dev/null
    cleanup_processes
}

# s6: how the plugin's cost grows (issue 36). One tree of NP workloads (a shell with NP of them), each using the
# first G GPUs (CUDA_VISIBLE_DEVICES; with CCM_BENCH_SIM_VIEW=1 also the test doubles' container view) and holding
# SCALE_MIB on each; per repeat one CRIU dump + restore with the plugin, moved by a map (the G GPUs in reverse
# order; one GPU onto the next and back), so every restore reconciles every GPU of every process. No floor: the ratios to the
# one-process tree of the same G (summarize.py) are the figures.
section_scale() {
    local g=$1 np=$2 d=$WORK/s6-g$1-p$2 n k root i ok=1 label=g${1}p${2} cvd="" view="" map="" devs=""
    local pids=()
    n=$(repeats_for "$REPEATS")
    ((n > 0)) || { skip s6 "$label" "over the time budget"; return 0; }
    if ((g > ${#GPU_UUID[@]})); then
        skip s6 "$label" "this machine has ${#GPU_UUID[@]} GPU(s)"
        return 0
    fi
    for ((i = 0; i < g; i++)); do
        cvd+=${cvd:+,}$i
        view+=${view:+,}${GPU_UUID[i]}
        if ((g > 1)); then
            map+=${map:+,}${GPU_UUID[i]}=${GPU_UUID[g - 1 - i]}
        fi
    done
    devs=$cvd
    local env=(CUDA_VISIBLE_DEVICES="$cvd")
    [[ ${CCM_BENCH_SIM_VIEW:-0} == 1 ]] && env+=(CCM_SIM_VISIBLE="$view")
    for ((i = 1; i <= np; i++)); do mkdir -p "$d/p$i"; done
    # shellcheck disable=SC2016
    start_detached "$d" "$d/tree.log" env "${env[@]}" bash -c \
        'for ((i = 1; i <= $3; i++)); do
             "$0" --dir "$1/p$i" --mib "$2" --devices "$4" --rounds 1 >"$1/p$i/workload.log" 2>&1 &
         done
         wait' "$WORKLOAD" "$d" "$SCALE_MIB" "$np" "$devs"
    root=$STARTED_PID
    for ((i = 1; i <= np; i++)); do
        wait_file "$d/p$i/ready" "$READY_TIMEOUT" "$root" || ok=0
    done
    if ((!ok)); then
        rec --section s6 --label "$label" --error "tree not ready: $(tail -q -n 1 "$d"/p*/workload.log | tr '\n' ' ')"
        cleanup_processes
        return 0
    fi
    for ((i = 1; i <= np; i++)); do pids+=("$(read_pid "$d/p$i/ready")"); done
    for ((k = 1; k <= n; k++)); do
        # One GPU: onto the next and back, repeat by repeat (a pair must name a GPU the process has now).
        if ((g == 1 && ${#GPU_UUID[@]} > 1)); then
            map=${GPU_UUID[0]}=${GPU_UUID[1]}
            ((k % 2 == 0)) && map=${GPU_UUID[1]}=${GPU_UUID[0]}
        fi
        criu_cycle s6 "$label" "$k" "$root" ${map:+CRIU_CUDA_MIGRATE_DEVICE_MAP="$map"} || break
        ((k < n)) && (($(repeats_for "$REPEATS") < 2)) && break
    done
    for ((i = 1; i <= np; i++)); do
        check_workload "$d/p$i" "${pids[i - 1]}" s6 "$label-p$i"
    done
    cleanup_processes
}

# ---------------------------------------------------------------------------------------------
# Setup and output

setup() {
    rm -rf "$WORK"
    mkdir -p "$WORK" "$RAW/logs" "$PLUGIN_DIR" "$OUT_DIR"
    : >"$RECORDS"
    : >"$WORK/pids"
    local f
    for f in "$BENCH" "$WORKLOAD" "$DEVICE_DIR"/plugin/*.so; do
        [[ -x $f || -f $f ]] || { echo "missing $f: run tests/gpu/prepare.sh on the build machine and carry .device" >&2; exit 2; }
    done
    if [[ -n ${CCM_CRIU_BIN:-} ]]; then
        CRIU_BIN=$CCM_CRIU_BIN
        CRIU_LIBS=${CCM_CRIU_LIBS:-}
    else
        CRIU_BIN=$CRIU_ROOT/usr/sbin/criu
        ls "$DEVICE_DIR"/criu-debs/*.deb >/dev/null 2>&1 || { echo "missing $DEVICE_DIR/criu-debs/*.deb" >&2; exit 2; }
        mkdir -p "$CRIU_ROOT"
        for f in "$DEVICE_DIR"/criu-debs/*.deb; do
            dpkg -x "$f" "$CRIU_ROOT" || { echo "cannot unpack $f into $CRIU_ROOT" >&2; exit 2; }
        done
    fi
    cp "$DEVICE_DIR"/plugin/*.so "$PLUGIN_DIR/"
    criu_cmd -- check >"$RAW/logs/criu-check.log" 2>&1
    log "criu check: status $? ($(tail -n 1 "$RAW/logs/criu-check.log"))"

    local gpus line
    if [[ -n ${CCM_BENCH_GPUS:-} ]]; then
        gpus=$(tr ';' '\n' <<<"$CCM_BENCH_GPUS")
    else
        gpus=$(nvidia-smi --query-gpu=uuid,pci.bus_id --format=csv,noheader | tr -d ' ' | tr ',' ' ')
    fi
    GPU_UUID=()
    while read -r line; do
        [[ -n $line ]] && GPU_UUID+=("${line%% *}")
    done <<<"$gpus"
    if ((${#GPU_UUID[@]} < 1)); then
        echo "this benchmark needs a GPU; found none" >&2
        exit 2
    fi
    # Two GPUs: restores are migrations (the swap map, so they include the identity rewrite) and
    # the two-process rows put one process on each GPU. One GPU: restores go back onto it, and
    # both processes share it (the one-GPU parallel rows of docs/BENCHMARKS.md).
    if ((${#GPU_UUID[@]} >= 2)); then
        SWAP="${GPU_UUID[0]}=${GPU_UUID[1]},${GPU_UUID[1]}=${GPU_UUID[0]}"
        MAP_ENV=(CRIU_CUDA_MIGRATE_DEVICE_MAP="$SWAP")
        DEV_B=1
    else
        MAP_ENV=()
        DEV_B=0
    fi
    # Images in RAM when there is room (the 16 GiB host-memory stage writes about 17 GiB): CRIU's
    # page writing then measures CRIU, not this VM's disk. CCM_BENCH_IMAGES overrides.
    local shm_free_gib
    shm_free_gib=$(df -B1G --output=avail /dev/shm 2>/dev/null | tail -n 1 | tr -d ' ')
    if [[ -n ${CCM_BENCH_IMAGES:-} ]]; then
        IMAGES=$CCM_BENCH_IMAGES
    elif [[ $shm_free_gib =~ ^[0-9]+$ ]] && ((shm_free_gib >= 48)); then
        IMAGES=/dev/shm/ccm-bench-images
    else
        IMAGES=$WORK/images
    fi
    rm -rf "$IMAGES"
    mkdir -p "$IMAGES"
    rec --meta --gpus "$gpus" --images "$IMAGES" --images-fs "$(df --output=fstype "$IMAGES" | tail -n 1)" \
        --repeats "$REPEATS" --budget "$BUDGET_S" --hard "$HARD_S" \
        --manifest "$DEVICE_DIR/MANIFEST" --criu-version "$(criu_cmd -- --version 2>/dev/null | head -n 1)"
    log "GPUs: ${GPU_UUID[*]}; images in $IMAGES; repeats $REPEATS; budget ${BUDGET_S}s/${HARD_S}s"
}

finish() {
    cleanup_processes
    rm -rf "$IMAGES"
    rec --meta --elapsed "$SECONDS"
    "${SUM[@]}" summarize --records "$RECORDS" --out "$OUT_DIR" || log "summarize failed; the raw records are in bench-raw.jsonl"
    cp "$RECORDS" "$OUT_DIR/bench-raw.jsonl"
    tar -czf "$OUT_DIR/bench-logs.tar.gz" -C "$RAW" . 2>/dev/null
    [[ -f $OUT_DIR/bench-table.txt ]] && cat "$OUT_DIR/bench-table.txt"
    log "done in ${SECONDS}s; results in $OUT_DIR"
}

main() {
    setup
    trap cleanup_processes EXIT
    local s
    for s in $SECTIONS; do
        log "=== $s"
        case $s in
            s1)
                section_single "${SIZES[0]}" 1 1
                # Every further size with CRIU, except the last when s1big (floor only) takes it.
                local last=${#SIZES[@]} i
                [[ " $SECTIONS " == *" s1big "* ]] && last=$((last - 1))
                for ((i = 1; i < last; i++)); do section_single "${SIZES[i]}" 1 0; done
                ;;
            s2) section_per_action_tree2 ;;
            s3)
                local np
                for np in ${TREE_NS//,/ }; do section_parallel "$np"; done
                ;;
            s4) section_torch ;;
            s6)
                local sg sp
                for sg in ${SCALE_GPUS//,/ }; do
                    for sp in ${SCALE_PROCS//,/ }; do section_scale "$sg" "$sp"; done
                done
                ;;
            s1big) ((${#SIZES[@]} > 1)) && section_single "${SIZES[-1]}" 0 0 ;;
            *) log "unknown section $s" ;;
        esac
        cleanup_processes
    done
    finish
}

main "$@"
