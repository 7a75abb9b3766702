#!/usr/bin/env bash
# GPU proofs of criu-cuda-migrate (issues 4, 5 and 6) on the 2-GPU machine.
#
# Run THERE, from the repository root, after tests/gpu/prepare.sh ran HERE and `.device/` was
# carried along:   bash tests/gpu/run.sh [CASE-PREFIX ...]
# (no arguments: every case; `bash tests/gpu/run.sh i5 i6-1` runs the cases whose names start so).
#
# Builds nothing. Needs: root, nvidia-smi, python3 (+ torch for the PyTorch cases), dpkg, setsid,
# timeout, sha256sum. Images and scratch go to $CCM_WORK (default /var/tmp/ccm-gpu-test, removed
# case by case); logs, reports and the result table go to $OUT (the device tool's folder) or
# $CCM_WORK/out. Prints `case | expected | seen | result | times` and exits 1 on any FAIL.
# Results: PASS, FAIL, KNOWN (a known limitation recorded, not a script failure).
# See docs/GPU-TESTING.md for what each case proves.

set -uo pipefail
# No -e: a status-recording flow. A failed case is recorded as a FAIL row and the next case runs.

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
DEVICE_DIR=${CCM_DEVICE_DIR:-$REPO/.device}
WORK=$(realpath -m "${CCM_WORK:-/var/tmp/ccm-gpu-test}")
RESULTS_DIR=$(realpath -m "${OUT:-$WORK/out}")
CRIU_ROOT=${CCM_CRIU_ROOT:-/opt/criu}
CRIU_BIN=$CRIU_ROOT/usr/sbin/criu
CRIU_LIBS=$CRIU_ROOT/usr/lib/x86_64-linux-gnu
PLUGIN_DIR=$WORK/plugins
WORKLOAD=$DEVICE_DIR/bin/ccm-sample-workload
CLI=$DEVICE_DIR/bin/criu-cuda-migrate
CKPT_CTL=(python3 "$REPO/tests/gpu/ckpt_ctl.py")
CHECK=(python3 "$REPO/tests/gpu/gpu_check.py")
RESULTS=$RESULTS_DIR/results.tsv
# Bounds: every wait and every criu run has one, so a hung case cannot eat the run.
CRIU_TIMEOUT=${CCM_CRIU_TIMEOUT:-150}
READY_TIMEOUT=${CCM_READY_TIMEOUT:-90}
ROUND_TIMEOUT=${CCM_ROUND_TIMEOUT:-90}
# NVLink SHARP multicast must stay off on the lent machines.
export NCCL_NVLS_ENABLE=0
# CUDA ordinal i is nvidia-smi's GPU i (both in PCI order), so the expectations below can use
# nvidia-smi's table for CUDA ordinals.
export CUDA_DEVICE_ORDER=PCI_BUS_ID

# log, now, elapsed, record CASE EXPECTED SEEN RESULT TIMES (a row of $RESULTS), wait_file, ...
# shellcheck source=tests/lib/common.sh
. "$(dirname "${BASH_SOURCE[0]}")/../lib/common.sh"

# ---------------------------------------------------------------------------------------------
# Results

# fail CASE EXPECTED SEEN [TIMES]: record a failure and leave the case (its subshell).
fail() {
    record "$1" "$2" "$3" FAIL "${4:--}"
    exit 1
}

# print_table: the rows of $RESULTS as a fixed-width text table (this script's own form, not tests/lib's Markdown).
print_table() {
    python3 - "$RESULTS" <<'EOF'
import sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1]) if l.strip()]
head = ["case", "expected", "seen", "result", "times"]
cap = [30, 48, 130, 6, 90]
def cut(s, n): return s if len(s) <= n else s[: n - 1] + "~"
rows = [[cut(c, cap[i]) for i, c in enumerate(r + [""] * (5 - len(r)))] for r in rows]
w = [max([len(head[i])] + [len(r[i]) for r in rows]) for i in range(5)]
fmt = " | ".join("{:%d}" % x for x in w)
print(fmt.format(*head)); print("-+-".join("-" * x for x in w))
for r in rows: print(fmt.format(*r))
EOF
}

# ---------------------------------------------------------------------------------------------
# Processes

# track, cleanup_processes, close_inherited_fds, start_detached, wait_file, wait_gone, alive, criu_cmd
# shellcheck source=tests/gpu/processes.sh
. "$REPO/tests/gpu/processes.sh"

# ---------------------------------------------------------------------------------------------
# CRIU

# dump PID IMG LOG [CRIU-ARGS...]: sets DUMP_SECS; returns criu's status. Without
# --leave-running, waits until PID is gone so its pid is free for the restore.
dump() {
    local pid=$1 img=$2 logfile=$3 t0 rc
    shift 3
    mkdir -p "$img"
    t0=$(now)
    criu_cmd -- dump -t "$pid" -D "$img" --libdir "$PLUGIN_DIR" -v4 -o "$logfile" "$@"
    rc=$?
    DUMP_SECS=$(elapsed "$t0")
    if [[ $rc -eq 0 && " $* " != *" --leave-running "* ]]; then
        # Every task of the dumped tree (one core-PID.img each) must be gone before a restore.
        local core p
        for core in "$img"/core-*.img; do
            p=${core##*/core-}
            p=${p%.img}
            wait_gone "$p" 30 ||
                log "pid $p still exists 30 s after its dump (state $(sed 's/^.*) //' "/proc/$p/stat" 2>/dev/null | cut -d' ' -f1); Z: its parent does not reap), so its restore will fail"
        done
    fi
    return $rc
}

# restore IMG LOG [ENV-ASSIGNMENT...]: `criu restore -d` with the plugin's environment; sets
# RESTORE_SECS; returns criu's status.
restore() {
    local img=$1 logfile=$2 t0 rc
    shift 2
    t0=$(now)
    criu_cmd "$@" -- restore -d -D "$img" --libdir "$PLUGIN_DIR" -v4 -o "$logfile"
    rc=$?
    RESTORE_SECS=$(elapsed "$t0")
    return $rc
}

# criu_tail LOG: the last error-looking line of a CRIU log, for the table.
criu_tail() { grep -E 'Error|error|criu-cuda-migrate' "$1" 2>/dev/null | tail -n 1 | cut -c1-200; }

# ---------------------------------------------------------------------------------------------
# The sample workload

# launch_workload DIR MIB DEVICES ROUNDS: starts ccm-sample-workload, waits for D/ready; sets
# W_PID. Fails the case CASE (global) when it does not become ready.
launch_workload() {
    local dir=$1 mib=$2 devices=$3 rounds=$4 pid
    mkdir -p "$dir"
    start_detached "$dir" "$dir/workload.log" "$WORKLOAD" --dir "$dir" --mib "$mib" --devices "$devices" --rounds "$rounds"
    if ! wait_file "$dir/ready" "$READY_TIMEOUT" "$STARTED_PID"; then
        fail "$CASE" "workload ready" "not ready in ${READY_TIMEOUT}s: $(tail -n 2 "$dir/workload.log" | tr '\n' ' ')"
    fi
    pid=$(<"$dir/ready")
    pid=${pid//[!0-9]/}
    [[ $pid == "$STARTED_PID" ]] || { log "workload pid $pid differs from launched $STARTED_PID"; track "$pid"; }
    W_PID=$pid
}

# round DIR K [PID]: triggers go<K>, waits for done<K>. Returns non-zero on timeout or when PID
# died first.
round() {
    local dir=$1 k=$2 pid=${3:-}
    : >"$dir/go$k"
    wait_file "$dir/done$k" "$ROUND_TIMEOUT" "$pid"
}

# image_hash IMG OUT: sha256 of every file of the image directory, sorted.
image_hash() { (cd "$1" && find . -type f -print0 | sort -z | xargs -0 sha256sum) >"$2"; }

case_dir() {
    local d=$WORK/cases/$1
    rm -rf "$d"
    mkdir -p "$d"
    printf '%s' "$d"
}

# save_logs CASE-DIR: copies logs and reports (never images) to the results folder, then frees
# the images (the 8 GiB case alone writes about 9 GB).
save_logs() {
    local d=$1 dest
    dest=$RESULTS_DIR/logs/${d##*/}
    mkdir -p "$dest"
    (cd "$d" && find . -type f \( -name '*.log' -o -name '*.json' -o -name '*.txt' -o -name '*.sha256' \
        -o -name 'ready*' -o -name '*.pid' \) -size -20M -print0 | xargs -0 -r cp --parents -t "$dest")
    find "$d" -mindepth 1 -maxdepth 1 -type d -name 'img*' -exec rm -rf {} +
}

# ---------------------------------------------------------------------------------------------
# Setup

GPU_UUID=()
GPU_BUS=()
GPU_MEM=()

setup() {
    rm -rf "$WORK"
    mkdir -p "$WORK/cases" "$PLUGIN_DIR" "$RESULTS_DIR/logs"
    : >"$RESULTS"
    : >"$WORK/pids"
    local f plugin
    for f in "$WORKLOAD" "$CLI" "$DEVICE_DIR"/plugin/*.so; do
        [[ -e $f ]] || { echo "missing $f: run tests/gpu/prepare.sh on the build machine and carry .device" >&2; exit 2; }
    done
    if ! ls "$DEVICE_DIR"/criu-debs/*.deb >/dev/null 2>&1; then
        echo "missing $DEVICE_DIR/criu-debs/*.deb: run tests/gpu/prepare.sh" >&2
        exit 2
    fi
    mkdir -p "$CRIU_ROOT"
    for f in "$DEVICE_DIR"/criu-debs/*.deb; do
        dpkg -x "$f" "$CRIU_ROOT" || { echo "cannot unpack $f into $CRIU_ROOT" >&2; exit 2; }
    done
    # Only our plugin in the plugin dir: a CUDA plugin of CRIU's own would answer for every pid.
    for plugin in "$DEVICE_DIR"/plugin/*.so; do cp "$plugin" "$PLUGIN_DIR/"; done
    criu_cmd -- check >"$RESULTS_DIR/logs/criu-check.log" 2>&1
    log "criu check: status $? ($(tail -n 1 "$RESULTS_DIR/logs/criu-check.log"))"

    local idx uuid bus mem
    while read -r idx uuid bus mem; do
        GPU_UUID[idx]=$uuid
        GPU_BUS[idx]=$bus
        GPU_MEM[idx]=$mem
    done < <("${CHECK[@]}" gpus)
    "${CHECK[@]}" gpus >"$RESULTS_DIR/logs/gpus.txt"
    GPU_COUNT=${#GPU_UUID[@]}
    if [[ $GPU_COUNT -lt 1 ]]; then
        echo "nvidia-smi lists no GPU" >&2
        exit 2
    fi
    G0=${GPU_UUID[0]}
    G1=${GPU_UUID[1]:-}
    B0=${GPU_BUS[0]}
    B1=${GPU_BUS[1]:-}
    SWAP="$G0=$G1,$G1=$G0"
    SMI=$(<"$RESULTS_DIR/logs/gpus.txt")
    log "GPU 0: $G0 at $B0 (${GPU_MEM[0]} MiB)${G1:+; GPU 1: $G1 at $B1 (${GPU_MEM[1]} MiB)}"
    log "plugin: $(ls "$PLUGIN_DIR"); workload: $WORKLOAD"
    [[ -f $DEVICE_DIR/MANIFEST ]] && cp "$DEVICE_DIR/MANIFEST" "$RESULTS_DIR/logs/"
}

# ---------------------------------------------------------------------------------------------
# Cases. Each runs in a subshell with `set -e`; `fail` records and leaves it.

# The workload sees both GPUs in CUDA's PCI order, and before any migration every API agrees.
case_baseline() {
    CASE=i0-baseline
    local d seen
    d=$(case_dir baseline)
    "$WORKLOAD" --report-now --mib 16 --devices 0,1 >"$d/report0.json" 2>"$d/workload.log" ||
        fail "$CASE" "report-now works" "workload failed: $(tail -n 1 "$d/workload.log")"
    seen=$("${CHECK[@]}" report "$d/report0.json" --uuid "0=$G0" --uuid "1=$G1" --bus "0=$B0" --bus "1=$B1" \
        --consistent --data-ok) || fail "$CASE" "o0=GPU0 o1=GPU1, all agree" "$seen"
    record "$CASE" "o0=GPU0 o1=GPU1, all agree" "$seen" PASS -
    save_logs "$d"
}

# issue 4 (1): dump, restore, pattern intact, for MIB of device memory on GPU 0.
case_plain() {
    local mib=$1 d seen times
    CASE=i4-1-plain-${mib}MiB
    d=$(case_dir "plain-$mib")
    launch_workload "$d/w" "$mib" 0 1
    dump "$W_PID" "$d/img" "$d/dump.log" ||
        fail "$CASE" "dump+restore, data intact" "dump failed: $(criu_tail "$d/dump.log")" "dump ${DUMP_SECS}s"
    restore "$d/img" "$d/restore.log" ||
        fail "$CASE" "dump+restore, data intact" "restore failed: $(criu_tail "$d/restore.log")" "dump ${DUMP_SECS}s restore ${RESTORE_SECS}s"
    times="dump ${DUMP_SECS}s restore ${RESTORE_SECS}s ckpt $("${CHECK[@]}" phase "$d/dump.log" checkpoint)s rst $("${CHECK[@]}" phase "$d/restore.log" restore)s"
    round "$d/w" 1 "$W_PID" || fail "$CASE" "dump+restore, data intact" "no report after restore" "$times"
    seen=$("${CHECK[@]}" report "$d/w/report1.json" --uuid "0=$G0" --consistent --data-ok) ||
        fail "$CASE" "dump+restore, data intact" "$seen" "$times"
    record "$CASE" "dump+restore, data intact" "$seen" PASS "$times"
    "${CHECK[@]}" plugin-lines "$d/dump.log" >"$d/plugin-dump.txt"
    "${CHECK[@]}" plugin-lines "$d/restore.log" >"$d/plugin-restore.txt"
    save_logs "$d"
}
case_plain_1g() { case_plain 1024; }
case_plain_8g() { case_plain 8192; }

# issue 4 (2): a PyTorch process: tensor intact and new GPU work after restore.
case_torch() {
    CASE=i4-2-pytorch
    local d seen times exp="dump+restore, tensor intact, new work runs"
    d=$(case_dir torch)
    mkdir -p "$d/w"
    start_detached "$d/w" "$d/w/torch.log" python3 "$REPO/tests/gpu/torch_workload.py" --dir "$d/w" --mib 1024 --device cuda:0
    wait_file "$d/w/ready" "$READY_TIMEOUT" "$STARTED_PID" || fail "$CASE" "$exp" "not ready: $(tail -n 2 "$d/w/torch.log" | tr '\n' ' ')"
    W_PID=$(<"$d/w/ready")
    W_PID=${W_PID//[!0-9]/}
    dump "$W_PID" "$d/img" "$d/dump.log" || fail "$CASE" "$exp" "dump failed: $(criu_tail "$d/dump.log")" "dump ${DUMP_SECS}s"
    restore "$d/img" "$d/restore.log" ||
        fail "$CASE" "$exp" "restore failed: $(criu_tail "$d/restore.log")" "dump ${DUMP_SECS}s restore ${RESTORE_SECS}s"
    times="dump ${DUMP_SECS}s restore ${RESTORE_SECS}s ckpt $("${CHECK[@]}" phase "$d/dump.log" checkpoint)s"
    times+=" $("${CHECK[@]}" identity-times "$d/dump.log" "$d/restore.log")"
    round "$d/w" 1 "$W_PID" || fail "$CASE" "$exp" "no report after restore: $(tail -n 2 "$d/w/torch.log" | tr '\n' ' ')" "$times"
    seen=$("${CHECK[@]}" torch "$d/w/report1.json" --uuid "$G0") || fail "$CASE" "$exp" "$seen" "$times"
    record "$CASE" "$exp" "$seen" PASS "$times"
    "${CHECK[@]}" plugin-lines "$d/dump.log" >"$d/plugin-dump.txt"
    "${CHECK[@]}" plugin-lines "$d/restore.log" >"$d/plugin-restore.txt"
    save_logs "$d"
}

# issue 4 (3): --leave-running: the process keeps running and its GPU work continues.
case_leave_running() {
    CASE=i4-3-leave-running
    local d seen exp="dump --leave-running: still running, data intact, GPU work continues"
    d=$(case_dir leave-running)
    launch_workload "$d/w" 1024 0 2
    dump "$W_PID" "$d/img" "$d/dump.log" --leave-running ||
        fail "$CASE" "$exp" "dump failed: $(criu_tail "$d/dump.log")" "dump ${DUMP_SECS}s"
    alive "$W_PID" || fail "$CASE" "$exp" "process $W_PID is gone after --leave-running" "dump ${DUMP_SECS}s"
    round "$d/w" 1 "$W_PID" || fail "$CASE" "$exp" "no report after the dump (left locked or checkpointed?)" "dump ${DUMP_SECS}s"
    seen=$("${CHECK[@]}" report "$d/w/report1.json" --uuid "0=$G0" --consistent --data-ok) ||
        fail "$CASE" "$exp" "$seen" "dump ${DUMP_SECS}s"
    # A second round proves the process goes on working after the first report too.
    round "$d/w" 2 "$W_PID" || fail "$CASE" "$exp" "no second report" "dump ${DUMP_SECS}s"
    "${CHECK[@]}" report "$d/w/report2.json" --data-ok >/dev/null || fail "$CASE" "$exp" "second round: data or context broken"
    record "$CASE" "$exp" "$seen" PASS "dump ${DUMP_SECS}s"
    save_logs "$d"
}

# issue 4 (4): two CUDA processes on two GPUs in one tree (a shell with two workloads): dump and
# restore; the plugin's parallel checkpoint time against the same two dumped one at a time.
case_two_processes() {
    CASE=i4-4-two-processes
    local d seen_a seen_b par s1 s2 ratio times wall1 wall2 exp="tree of 2 (GPU0, GPU1): dump+restore, data intact" mib=2048
    d=$(case_dir two-processes)
    mkdir -p "$d/a" "$d/b"

    # Sequential reference: each workload alone in its own tree, one after the other.
    launch_workload "$d/alone-a" "$mib" 0 1
    dump "$W_PID" "$d/img-a" "$d/dump-a.log" || fail "$CASE" "$exp" "single dump A failed: $(criu_tail "$d/dump-a.log")"
    s1=$("${CHECK[@]}" phase "$d/dump-a.log" checkpoint)
    wall1=$DUMP_SECS
    rm -rf "$d/img-a"
    launch_workload "$d/alone-b" "$mib" 1 1
    dump "$W_PID" "$d/img-b" "$d/dump-b.log" || fail "$CASE" "$exp" "single dump B failed: $(criu_tail "$d/dump-b.log")"
    s2=$("${CHECK[@]}" phase "$d/dump-b.log" checkpoint)
    wall2=$DUMP_SECS
    rm -rf "$d/img-b"

    # The tree: one shell, two workloads (the script expands its own positional parameters).
    # shellcheck disable=SC2016
    start_detached "$d" "$d/tree.log" bash -c \
        '"$0" --dir "$1/a" --mib "$2" --devices 0 --rounds 1 >"$1/a/workload.log" 2>&1 &
         "$0" --dir "$1/b" --mib "$2" --devices 1 --rounds 1 >"$1/b/workload.log" 2>&1 &
         wait' "$WORKLOAD" "$d" "$mib"
    local root=$STARTED_PID
    { wait_file "$d/a/ready" "$READY_TIMEOUT" "$root" && wait_file "$d/b/ready" "$READY_TIMEOUT" "$root"; } ||
        fail "$CASE" "$exp" "tree not ready: $(tail -n 1 "$d/a/workload.log" "$d/b/workload.log" | tr '\n' ' ')"
    dump "$root" "$d/img" "$d/dump.log" || fail "$CASE" "$exp" "tree dump failed: $(criu_tail "$d/dump.log")" "dump ${DUMP_SECS}s"
    par=$("${CHECK[@]}" phase "$d/dump.log" checkpoint)
    "${CHECK[@]}" plugin-lines "$d/dump.log" >"$d/plugin-dump-tree.txt"
    ratio=$("${CHECK[@]}" ratio "$par" "$s1" "$s2")
    times="ckpt tree ${par}s, alone ${s1}s+${s2}s (dump wall ${DUMP_SECS}s vs ${wall1}s+${wall2}s)"
    if [[ $ratio == n/a ]]; then
        record "$CASE-ratio" "parallel/sequential <= 0.8" "no plugin checkpoint timing lines in dump.log" FAIL "$times"
    elif awk -v r="$ratio" 'BEGIN { exit !(r <= 0.8) }'; then
        record "$CASE-ratio" "parallel/sequential <= 0.8" "ratio $ratio" PASS "$times"
    else
        record "$CASE-ratio" "parallel/sequential <= 0.8" "ratio $ratio (not parallel)" FAIL "$times"
    fi
    restore "$d/img" "$d/restore.log" ||
        fail "$CASE" "$exp" "tree restore failed: $(criu_tail "$d/restore.log")" "dump ${DUMP_SECS}s restore ${RESTORE_SECS}s"
    times="dump ${DUMP_SECS}s restore ${RESTORE_SECS}s"
    { round "$d/a" 1 "$root" && round "$d/b" 1 "$root"; } || fail "$CASE" "$exp" "no reports after restore" "$times"
    seen_a=$("${CHECK[@]}" report "$d/a/report1.json" --uuid "0=$G0" --consistent --data-ok) || fail "$CASE" "$exp" "A: $seen_a" "$times"
    seen_b=$("${CHECK[@]}" report "$d/b/report1.json" --uuid "1=$G1" --consistent --data-ok) || fail "$CASE" "$exp" "B: $seen_b" "$times"
    record "$CASE" "$exp" "A data ok, B data ok" PASS "$times"

    save_logs "$d"
}

# issue 5: dumped on GPU 0, restored onto GPU 1 through an explicit map (the swap, which names
# every GPU the process's libcuda enumerated).
case_explicit_map() {
    CASE=i5-1-explicit-map
    local d seen times exp="on GPU1 via DEVICE_MAP swap, data intact, all agree"
    d=$(case_dir explicit-map)
    launch_workload "$d/w" 512 0 1
    dump "$W_PID" "$d/img" "$d/dump.log" || fail "$CASE" "$exp" "dump failed: $(criu_tail "$d/dump.log")"
    restore "$d/img" "$d/restore.log" CRIU_CUDA_MIGRATE_DEVICE_MAP="$SWAP" ||
        fail "$CASE" "$exp" "restore failed: $(criu_tail "$d/restore.log")"
    times="dump ${DUMP_SECS}s restore ${RESTORE_SECS}s"
    round "$d/w" 1 "$W_PID" || fail "$CASE" "$exp" "no report after restore" "$times"
    seen=$("${CHECK[@]}" report "$d/w/report1.json" --uuid "0=$G1" --bus "0=$B1" --consistent --data-ok) ||
        fail "$CASE" "$exp" "$seen" "$times"
    record "$CASE" "$exp" "$seen" PASS "$times"
    save_logs "$d"
}

# issue 5: the automatic map with only GPU 1 usable.
case_auto_map() {
    CASE=i5-2-auto-map
    local d seen times exp="on GPU1 via USABLE_GPUS=GPU1, data intact, all agree"
    d=$(case_dir auto-map)
    # A container-like process limited to GPU 0 (as the orchestrator gives each container its
    # GPUs): it opens only GPU 0's device node, so GPU 0 is the one GPU it uses. (Without
    # CUDA_VISIBLE_DEVICES libcuda opens every GPU's node and both count as used.)
    CUDA_VISIBLE_DEVICES=$G0 launch_workload "$d/w" 512 0 1
    dump "$W_PID" "$d/img" "$d/dump.log" || fail "$CASE" "$exp" "dump failed: $(criu_tail "$d/dump.log")"
    restore "$d/img" "$d/restore.log" CRIU_CUDA_MIGRATE_USABLE_GPUS="$G1" ||
        fail "$CASE" "$exp" "restore failed: $(criu_tail "$d/restore.log")"
    times="dump ${DUMP_SECS}s restore ${RESTORE_SECS}s"
    round "$d/w" 1 "$W_PID" || fail "$CASE" "$exp" "no report after restore" "$times"
    seen=$("${CHECK[@]}" report "$d/w/report1.json" --uuid "0=$G1" --bus "0=$B1" --consistent --data-ok) ||
        fail "$CASE" "$exp" "$seen" "$times"
    record "$CASE" "$exp" "$seen" PASS "$times"
    save_logs "$d"
}

# refused_restore CASE IMG LOG-NAME EXPECTED ENV...: a restore the preflight must refuse: criu
# fails, the plugin says why, no task was restored, the images are byte-identical.
refused_restore() {
    local row=$1 d=$2 name=$3 exp=$4 pid=$5 msg
    shift 5
    restore "$d/img" "$d/$name.log" "$@" &&
        fail "$row" "$exp" "restore SUCCEEDED with $*" "restore ${RESTORE_SECS}s"
    msg=$("${CHECK[@]}" plugin-error "$d/$name.log") || true
    (cd "$d/img" && sha256sum --quiet -c "$d/images.sha256") >"$d/$name-images.txt" 2>&1 ||
        fail "$row" "$exp" "images changed: $(head -n 2 "$d/$name-images.txt" | tr '\n' ' ')"
    if alive "$pid"; then
        fail "$row" "$exp" "refused, but pid $pid exists after the refused restore: $msg"
    fi
    [[ $msg == *criu-cuda-migrate* ]] || fail "$row" "$exp" "refused without the plugin's message: $msg"
    record "$row" "$exp" "refused: $msg; images identical" PASS "restore ${RESTORE_SECS}s"
}

# issue 5: preflight refuses a usable set / map naming GPUs this node lacks; the images stay
# byte-identical; the same images then restore.
case_preflight_refusal() {
    CASE=i5-3-preflight
    local d seen pid bogus=GPU-00000000-0000-0000-0000-000000000000
    d=$(case_dir preflight)
    launch_workload "$d/w" 256 0 1
    pid=$W_PID
    dump "$pid" "$d/img" "$d/dump.log" || fail "$CASE" "dump" "dump failed: $(criu_tail "$d/dump.log")"
    image_hash "$d/img" "$d/images.sha256"
    refused_restore "$CASE-unknown-usable" "$d" restore-unknown-usable "refused: USABLE_GPUS names no GPU here" "$pid" \
        CRIU_CUDA_MIGRATE_USABLE_GPUS="$bogus"
    refused_restore "$CASE-unknown-map" "$d" restore-unknown-map "refused: map target not on this node" "$pid" \
        CRIU_CUDA_MIGRATE_DEVICE_MAP="$G0=$bogus,$G1=$G0"
    restore "$d/img" "$d/restore.log" CRIU_CUDA_MIGRATE_DEVICE_MAP="$SWAP" ||
        fail "$CASE-then-ok" "then restores with the swap" "restore failed: $(criu_tail "$d/restore.log")"
    round "$d/w" 1 "$W_PID" || fail "$CASE-then-ok" "then restores with the swap" "no report after restore"
    seen=$("${CHECK[@]}" report "$d/w/report1.json" --uuid "0=$G1" --consistent --data-ok) ||
        fail "$CASE-then-ok" "then restores with the swap" "$seen"
    record "$CASE-then-ok" "then restores with the swap, data intact" "$seen" PASS "restore ${RESTORE_SECS}s"
    save_logs "$d"
}

# issue 6 (1): the bug, reproduced with reconciliation off: a process on both GPUs restored with
# the swap: ordinal 0 reports GPU 1's UUID, GPU 0's bus id, and NVML by that bus id finds GPU 0.
case_repro_stale() {
    CASE=i6-1-stale-without-reconcile
    local d seen times exp="o0: uuid GPU1, bus of GPU0, NVML(bus)=GPU0 (disagree)"
    d=$(case_dir repro-stale)
    launch_workload "$d/w" 256 0,1 1
    dump "$W_PID" "$d/img" "$d/dump.log" || fail "$CASE" "$exp" "dump failed: $(criu_tail "$d/dump.log")"
    # Permissive too: a strict validation would (rightly) kill the stale process we want to see.
    restore "$d/img" "$d/restore.log" CRIU_CUDA_MIGRATE_DEVICE_MAP="$SWAP" CRIU_CUDA_MIGRATE_RECONCILE=off \
        CRIU_CUDA_MIGRATE_MODE=permissive || fail "$CASE" "$exp" "restore failed: $(criu_tail "$d/restore.log")"
    times="dump ${DUMP_SECS}s restore ${RESTORE_SECS}s"
    round "$d/w" 1 "$W_PID" || fail "$CASE" "$exp" "no report after restore" "$times"
    seen=$("${CHECK[@]}" report "$d/w/report1.json" --uuid "0=$G1" --bus "0=$B0" --nvml-by-bus "0=$G0" \
        --uuid "1=$G0" --bus "1=$B1" --nvml-by-bus "1=$G1" --disagree 0 --disagree 1 --data-ok) ||
        fail "$CASE" "$exp" "$seen" "$times"
    record "$CASE" "$exp" "$seen" PASS "$times"
    save_logs "$d"
}

# issue 6 (2): the same with reconciliation: every ordinal agrees.
case_reconciled() {
    CASE=i6-2-reconciled
    local d seen times exp="swap, reconcile on: o0=GPU1@bus1, o1=GPU0@bus0, all agree, data intact"
    d=$(case_dir reconciled)
    launch_workload "$d/w" 256 0,1 1
    dump "$W_PID" "$d/img" "$d/dump.log" || fail "$CASE" "$exp" "dump failed: $(criu_tail "$d/dump.log")"
    restore "$d/img" "$d/restore.log" CRIU_CUDA_MIGRATE_DEVICE_MAP="$SWAP" ||
        fail "$CASE" "$exp" "restore failed: $(criu_tail "$d/restore.log")"
    times="dump ${DUMP_SECS}s restore ${RESTORE_SECS}s $("${CHECK[@]}" identity-times "$d/dump.log" "$d/restore.log")"
    round "$d/w" 1 "$W_PID" || fail "$CASE" "$exp" "no report after restore" "$times"
    seen=$("${CHECK[@]}" report "$d/w/report1.json" --uuid "0=$G1" --bus "0=$B1" --uuid "1=$G0" --bus "1=$B0" \
        --consistent --data-ok) || fail "$CASE" "$exp" "$seen" "$times"
    record "$CASE" "$exp" "$seen" PASS "$times"
    "${CHECK[@]}" plugin-lines "$d/restore.log" >"$d/plugin-restore.txt"
    save_logs "$d"
}

# issue 6 (3): three chained migrations of one process (swap, swap back, swap).
case_chained() {
    CASE=i6-3-chained
    local d seen k times="" exp="3 chained swaps: all agree each time, data intact" o0 b0 o1 b1
    d=$(case_dir chained)
    launch_workload "$d/w" 256 0,1 3
    for k in 1 2 3; do
        dump "$W_PID" "$d/img$k" "$d/dump$k.log" || fail "$CASE" "$exp" "dump $k failed: $(criu_tail "$d/dump$k.log")" "$times"
        restore "$d/img$k" "$d/restore$k.log" CRIU_CUDA_MIGRATE_DEVICE_MAP="$SWAP" ||
            fail "$CASE" "$exp" "restore $k failed: $(criu_tail "$d/restore$k.log")" "$times"
        times+="#$k ${DUMP_SECS}/${RESTORE_SECS}s "
        round "$d/w" "$k" "$W_PID" || fail "$CASE" "$exp" "no report after migration $k" "$times"
        # Odd migrations put ordinal 0 on GPU 1, even ones bring it back.
        if ((k % 2)); then o0=$G1 b0=$B1 o1=$G0 b1=$B0; else o0=$G0 b0=$B0 o1=$G1 b1=$B1; fi
        seen=$("${CHECK[@]}" report "$d/w/report$k.json" --uuid "0=$o0" --bus "0=$b0" --uuid "1=$o1" --bus "1=$b1" \
            --consistent --data-ok) || fail "$CASE" "$exp" "migration $k: $seen" "$times"
        rm -rf "$d/img$k"
    done
    record "$CASE" "$exp" "after #3: $seen" PASS "$times"
    save_logs "$d"
}

# issue 6 (4): a 2-rank PyTorch + NCCL job restored onto swapped GPUs, NCCL set up after.
case_nccl() {
    local variant=$1 d seen times root exp known=0
    CASE=i6-4$variant-nccl
    local job_variant=$variant
    if [[ $variant == a ]]; then
        exp="ranks see both GPUs: swapped, NCCL busId = new GPU, sum 3"
    elif [[ $variant == c ]]; then
        # The CVD-limited ranks again, with NCCL's CUDA-IPC transports off (P2P and SHM), so NCCL
        # falls back to its socket transport: shows whether CUDA IPC alone is what breaks (b).
        exp="ranks CVD-limited, NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1: swapped, sum 3"
        job_variant=b
        known=1
    else
        exp="ranks CVD-limited: swapped, NCCL busId = new GPU, sum 3"
        known=1
    fi
    d=$(case_dir "nccl-$variant")
    start_detached "$d" "$d/job.log" python3 "$REPO/tests/gpu/nccl_job.py" --dir "$d" --variant "$job_variant" \
        --uuids "$G0,$G1" --mib 256 --timeout 45
    root=$STARTED_PID
    { wait_file "$d/ready-rank0" "$READY_TIMEOUT" "$root" && wait_file "$d/ready-rank1" "$READY_TIMEOUT" "$root"; } ||
        fail "$CASE" "$exp" "ranks not ready: $(tail -n 1 "$d"/rank*.log | tr '\n' ' ')"
    dump "$root" "$d/img" "$d/dump.log" || fail "$CASE" "$exp" "dump failed: $(criu_tail "$d/dump.log")" "dump ${DUMP_SECS}s"
    restore "$d/img" "$d/restore.log" CRIU_CUDA_MIGRATE_DEVICE_MAP="$SWAP" ||
        fail "$CASE" "$exp" "restore failed: $(criu_tail "$d/restore.log")" "dump ${DUMP_SECS}s restore ${RESTORE_SECS}s"
    times="dump ${DUMP_SECS}s restore ${RESTORE_SECS}s $("${CHECK[@]}" identity-times "$d/dump.log" "$d/restore.log")"
    : >"$d/go1"
    if ! { wait_file "$d/done-rank0-1" "$ROUND_TIMEOUT" "$root" && wait_file "$d/done-rank1-1" "$ROUND_TIMEOUT" "$root"; }; then
        seen="ranks did not finish in ${ROUND_TIMEOUT}s: $(grep -h -m1 -E 'failure|Error|error' "$d"/rank*.log | head -n 2 | tr '\n' ' ')"
        ((known)) && { record "$CASE" "$exp" "$seen" KNOWN "$times"; save_logs "$d"; return 0; }
        fail "$CASE" "$exp" "$seen" "$times"
    fi
    # Rank r used GPU r before; after the swap it runs on GPU 1-r.
    if seen=$("${CHECK[@]}" nccl "$d" --ranks 2 --uuid "0=$G1" --uuid "1=$G0" --bus "0=$B1" --bus "1=$B0" --smi "$SMI"); then
        record "$CASE" "$exp" "$seen" PASS "$times"
    elif ((known)); then
        record "$CASE" "$exp" "$seen" KNOWN "$times"
    else
        fail "$CASE" "$exp" "$seen" "$times"
    fi
    "${CHECK[@]}" plugin-lines "$d/dump.log" >"$d/plugin-dump.txt"
    "${CHECK[@]}" plugin-lines "$d/restore.log" >"$d/plugin-restore.txt"
    save_logs "$d"
}
case_nccl_a() { case_nccl a; }
case_nccl_b() { case_nccl b; }
case_nccl_c() { NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 case_nccl c; }

# issue 6 (5): no usable target for a dump GPU: refused by preflight, images intact.
case_no_target() {
    CASE=i6-5-no-target
    local d pid bogus=GPU-ffffffff-ffff-ffff-ffff-ffffffffffff
    d=$(case_dir no-target)
    launch_workload "$d/w" 256 0,1 1
    pid=$W_PID
    dump "$pid" "$d/img" "$d/dump.log" || fail "$CASE" "dump" "dump failed: $(criu_tail "$d/dump.log")"
    image_hash "$d/img" "$d/images.sha256"
    refused_restore "$CASE-absent" "$d" restore-absent "refused: only usable GPU does not exist" "$pid" \
        CRIU_CUDA_MIGRATE_USABLE_GPUS="$bogus"
    # Both GPUs in use, one usable: two dump GPUs may never share one new GPU.
    refused_restore "$CASE-too-few" "$d" restore-too-few "refused: 2 GPUs used, 1 usable" "$pid" \
        CRIU_CUDA_MIGRATE_USABLE_GPUS="$G1"
    save_logs "$d"
}

# The command-line tool on real GPUs (docs/USER-GUIDE.md section 7): node, inspect and preflight of
# real identity images, and recover of a process left CHECKPOINTED the way an interrupted dump
# leaves it (locked and checkpointed from outside through the driver API by ckpt_ctl.py).
case_cli() {
    CASE=c1-cli
    local d out rc seen bogus=GPU-00000000-0000-0000-0000-000000000000 exp
    d=$(case_dir cli)

    exp="node lists both GPUs (table and --json)"
    "$CLI" node >"$d/node.txt" 2>&1 || fail "$CASE-node" "$exp" "node exited $?: $(head -c 200 "$d/node.txt")"
    "$CLI" node --json >"$d/node.json" 2>&1 || fail "$CASE-node" "$exp" "node --json exited $?"
    { grep -q "$G0" "$d/node.txt" && grep -q "$G1" "$d/node.txt" && grep -q "$G0" "$d/node.json" &&
        grep -q "$G1" "$d/node.json"; } || fail "$CASE-node" "$exp" "missing a GPU: $(tr '\n' ' ' <"$d/node.txt" | head -c 200)"
    record "$CASE-node" "$exp" "$(grep -c GPU- "$d/node.txt") GPUs, driver $(head -n 1 "$d/node.txt")" PASS -

    exp="inspect shows the dump GPU; preflight: swap passes, unknown GPU refused (exit 1)"
    launch_workload "$d/w" 256 0 1
    dump "$W_PID" "$d/img" "$d/dump.log" || fail "$CASE-inspect-preflight" "$exp" "dump failed: $(criu_tail "$d/dump.log")"
    "$CLI" inspect "$d/img" >"$d/inspect.txt" 2>&1 || fail "$CASE-inspect-preflight" "$exp" "inspect exited $?"
    grep -E "cuda:0 +$G0" "$d/inspect.txt" >/dev/null ||
        fail "$CASE-inspect-preflight" "$exp" "inspect does not show cuda:0 on GPU 0: $(head -c 300 "$d/inspect.txt")"
    "$CLI" --json inspect "$d/img" >"$d/inspect.json" 2>&1 || fail "$CASE-inspect-preflight" "$exp" "inspect --json exited $?"
    python3 -c 'import json,sys; v=json.load(open(sys.argv[1])); sys.exit(v["processes"][0]["used"][0] != sys.argv[2])' \
        "$d/inspect.json" "$G0" || fail "$CASE-inspect-preflight" "$exp" "inspect --json: used[0] is not GPU 0"
    "$CLI" preflight "$d/img" --device-map "$SWAP" >"$d/preflight-swap.txt" 2>&1 ||
        fail "$CASE-inspect-preflight" "$exp" "preflight with the swap exited $?: $(tail -n 1 "$d/preflight-swap.txt")"
    grep -q "preflight passed" "$d/preflight-swap.txt" || fail "$CASE-inspect-preflight" "$exp" "no 'preflight passed'"
    rc=0
    "$CLI" --json preflight "$d/img" --usable-gpus "$bogus" >"$d/preflight-bogus.json" 2>&1 || rc=$?
    { [[ $rc -eq 1 ]] && grep -q '"ok":false' "$d/preflight-bogus.json"; } ||
        fail "$CASE-inspect-preflight" "$exp" "unknown usable GPU: exit $rc, $(head -c 200 "$d/preflight-bogus.json")"
    restore "$d/img" "$d/restore.log" CRIU_CUDA_MIGRATE_DEVICE_MAP="$SWAP" ||
        fail "$CASE-inspect-preflight" "$exp" "restore failed: $(criu_tail "$d/restore.log")"
    round "$d/w" 1 "$W_PID" || fail "$CASE-inspect-preflight" "$exp" "no report after restore"
    "$CLI" inspect "$d/img" >"$d/inspect-after.txt" 2>&1
    seen="inspect: cuda:0=GPU0; swap passes; bogus refused: $(head -c 90 "$d/preflight-bogus.json")"
    record "$CASE-inspect-preflight" "$exp" "$seen" PASS -

    exp="recover brings a CHECKPOINTED process back: RUNNING, data intact"
    launch_workload "$d/r" 512 0 1
    out=$("${CKPT_CTL[@]}" lock-checkpoint "$W_PID" 2>&1) || fail "$CASE-recover" "$exp" "could not checkpoint it: $out"
    [[ $out == checkpointed ]] || fail "$CASE-recover" "$exp" "state after lock+checkpoint: $out"
    local t0
    t0=$(now)
    "$CLI" recover --pid "$W_PID" >"$d/recover.txt" 2>&1 || fail "$CASE-recover" "$exp" "recover exited $?: $(tr '\n' ' ' <"$d/recover.txt")"
    local secs
    secs=$(elapsed "$t0")
    out=$("${CKPT_CTL[@]}" state "$W_PID" 2>&1)
    [[ $out == running ]] || fail "$CASE-recover" "$exp" "state after recover: $out"
    round "$d/r" 1 "$W_PID" || fail "$CASE-recover" "$exp" "no report after recover"
    seen=$("${CHECK[@]}" report "$d/r/report1.json" --uuid "0=$G0" --consistent --data-ok) || fail "$CASE-recover" "$exp" "$seen"
    record "$CASE-recover" "$exp" "checkpointed -> $(tail -n 1 "$d/recover.txt"); $seen" PASS "recover ${secs}s"
    save_logs "$d"
}

ALL_CASES=(
    case_baseline
    case_plain_1g case_plain_8g case_torch case_leave_running case_two_processes
    case_explicit_map case_auto_map case_preflight_refusal
    case_repro_stale case_reconciled case_chained case_nccl_a case_nccl_b case_nccl_c case_no_target
    case_cli
)

# The case name a function records under (for selection by prefix).
case_label() {
    case $1 in
        case_baseline) echo i0-baseline ;;
        case_plain_1g) echo i4-1-plain-1024MiB ;;
        case_plain_8g) echo i4-1-plain-8192MiB ;;
        case_torch) echo i4-2-pytorch ;;
        case_leave_running) echo i4-3-leave-running ;;
        case_two_processes) echo i4-4-two-processes ;;
        case_explicit_map) echo i5-1-explicit-map ;;
        case_auto_map) echo i5-2-auto-map ;;
        case_preflight_refusal) echo i5-3-preflight ;;
        case_repro_stale) echo i6-1-stale-without-reconcile ;;
        case_reconciled) echo i6-2-reconciled ;;
        case_chained) echo i6-3-chained ;;
        case_nccl_a) echo i6-4a-nccl ;;
        case_nccl_b) echo i6-4b-nccl ;;
        case_nccl_c) echo i6-4c-nccl ;;
        case_no_target) echo i6-5-no-target ;;
        case_cli) echo c1-cli ;;
    esac
}

# How many GPUs a case needs: the rest run on a machine with one (cases that need more are listed
# as `needs N GPUs`, not failed).
case_gpus() {
    case $1 in
        case_plain_1g | case_plain_8g | case_torch | case_leave_running) echo 1 ;;
        *) echo 2 ;;
    esac
}

selected() {
    local label=$1 p
    [[ ${#SELECT[@]} -eq 0 ]] && return 0
    for p in "${SELECT[@]}"; do [[ $label == "$p"* ]] && return 0; done
    return 1
}

main() {
    SELECT=("$@")
    local fn label t0 rc before
    setup
    trap cleanup_processes EXIT
    for fn in "${ALL_CASES[@]}"; do
        label=$(case_label "$fn")
        selected "$label" || continue
        if (($(case_gpus "$fn") > GPU_COUNT)); then
            record "$label" "-" "needs $(case_gpus "$fn") GPUs; this machine has $GPU_COUNT" "needs $(case_gpus "$fn") GPUs" -
            continue
        fi
        log "=== $label"
        before=$(wc -l <"$RESULTS")
        t0=$(now)
        (
            set -e
            "$fn"
        )
        rc=$?
        # A case that stopped on a script error (not through `fail`) still gets its FAIL row.
        if [[ $rc -ne 0 ]] && ! tail -n +"$((before + 1))" "$RESULTS" | grep -q $'\tFAIL\t'; then
            record "$label" "case runs" "script error (status $rc) after $(elapsed "$t0")s; see the case's logs" FAIL -
        fi
        cleanup_processes
        # Logs of a case that failed early (fail exits before save_logs).
        [[ -d $WORK/cases ]] && for d in "$WORK"/cases/*; do [[ -d $d ]] && save_logs "$d"; done
        rm -rf "$WORK/cases"
        mkdir -p "$WORK/cases"
        log "=== $label done in $(elapsed "$t0")s"
    done
    echo
    print_table | tee "$RESULTS_DIR/table.txt"
    if grep -q $'\tFAIL\t' "$RESULTS"; then
        echo "FAILED: $(grep -c $'\tFAIL\t' "$RESULTS") row(s)"
        return 1
    fi
    echo "all cases passed ($(grep -c $'\tKNOWN\t' "$RESULTS") known limitation(s))"
}

# Sourced with CCM_GPU_RUN_AS_LIB=1 (tests/gpu/staging-bench.sh): the functions only.
[[ ${CCM_GPU_RUN_AS_LIB:-0} == 1 ]] || main "$@"
