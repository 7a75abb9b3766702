#!/usr/bin/env bash
# Issue 29, part 1, under real CRIU with the plugin, on the GPU machine: what a user's dump does to a process with
# managed (UVM) memory and to a pair of processes that share device memory through CUDA IPC (legacy handles and
# cuMem POSIX fds), and the state and data of every process after each. Since issue 34 the default dump refuses the
# importer (tests/gpu/ipc-refuse.sh); the dump-restore and leave-running cases here set CRIU_CUDA_MIGRATE_IPC=allow
# to show what a dump of an importer still costs. tests/gpu/ipc-probe.sh measured the driver
# alone; this is the product's answer.
#
#   bash tests/gpu/ipc-criu.sh        (root; gcc and /usr/local/cuda/include for tests/gpu/ipc_probe.c)
#
# Needs, carried in .device/ (CCM_DEVICE_DIR): plugin/libcriu_cuda_migrate.so and criu-debs/*.deb (CRIU 4.1.1),
# as tests/gpu/prepare.sh gathers them. Writes results.tsv, the table (results.md) and every CRIU log to $OUT (or
# /var/tmp/ccm-ipc-criu/out). Exits 1 when a case does not behave as docs/RELIABILITY.md says.

set -uo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
DEVICE_DIR=${CCM_DEVICE_DIR:-$REPO/.device}
WORK=/var/tmp/ccm-ipc-criu
RESULTS_DIR=${OUT:-$WORK/out}
RESULTS=$RESULTS_DIR/results.tsv
CRIU_ROOT=${CCM_CRIU_ROOT:-/opt/criu}
CRIU_BIN=$CRIU_ROOT/usr/sbin/criu
CRIU_LIBS=$CRIU_ROOT/usr/lib/x86_64-linux-gnu
CRIU_TIMEOUT=120
PLUGIN_DIR=$WORK/plugins
PROBE=$WORK/ipc_probe
CTL=(python3 "$REPO/tests/gpu/ckpt_ctl.py")
export NCCL_NVLS_ENABLE=0

# shellcheck source=tests/lib/common.sh
. "$REPO/tests/lib/common.sh"
# shellcheck source=tests/gpu/processes.sh
. "$REPO/tests/gpu/processes.sh"

FAILED=0
# verdict CASE EXPECTED SEEN OK: one row, PASS when OK is 0.
verdict() {
    local result=PASS
    [ "$4" -eq 0 ] || { result=FAIL; FAILED=1; }
    record "$1" "$2" "$3" "$result" -
}

# wait_line FILE TEXT [SECONDS]: until FILE holds TEXT.
wait_line() {
    local deadline=$((SECONDS + ${3:-30}))
    until grep -q -- "$2" "$1" 2>/dev/null; do
        ((SECONDS >= deadline)) && return 1
        sleep 0.1
    done
}

# state PID: the driver's CUDA state of PID, or GONE.
state() {
    [ -d "/proc/$1" ] || { echo GONE; return; }
    timeout 30 "${CTL[@]}" state "$1" 2>&1 | tail -n 1 | tr '[:lower:]' '[:upper:]'
}

# reads NAME: the last report line of a probe's log; advancing NAME: 0 when it printed a new good line within 2 s.
reads() { tail -n 1 "$1"; }
advancing() {
    local before after
    before=$(grep -c ' ok round=' "$1")
    sleep 2
    after=$(grep -c ' ok round=' "$1")
    [ "$after" -gt "$before" ]
}

# line LOG REGEX: the first plugin line of LOG matching REGEX, without CRIU's prefix (empty when none).
line() { grep -E -m1 -- "$2" "$1" 2>/dev/null | sed 's/^.*criu-cuda-migrate: //' | cut -c1-600; }

# start_pair DIR KIND: exporter and importer (legacy or cumem) under one shell, their own session; sets
# TREE EXP IMP once the importer reads the exporter's memory.
start_pair() {
    local d=$1 kind=$2
    mkdir -p "$d"
    # shellcheck disable=SC2016 # the inner bash expands $0-$2
    start_detached "$d" "$d/tree.log" bash -c '"$0" "export-$2" "$1/s.sock" 64 >"$1/exp.log" 2>&1 &
        sleep 0.5
        "$0" "import-$2" "$1/s.sock" 1 >"$1/imp.log" 2>&1 &
        wait' "$PROBE" "$d" "$kind"
    TREE=$STARTED_PID
    wait_line "$d/imp.log" opened 30 && wait_line "$d/imp.log" 'ok round=1 ' 10 || return 1
    EXP=$(pgrep -P "$TREE" -f "export-$kind")
    IMP=$(pgrep -P "$TREE" -f "import-$kind")
    [ -n "$EXP" ] && [ -n "$IMP" ]
}

criu_dump() { # IMG LOG [ENV...] -- [CRIU ARGS...]
    local img=$1 logfile=$2 envs=()
    shift 2
    while [[ $# -gt 0 && $1 != -- ]]; do envs+=("$1"); shift; done
    shift
    mkdir -p "$img"
    criu_cmd "${envs[@]}" -- dump -t "$TREE" -D "$img" --libdir "$PLUGIN_DIR" -v4 -o "$logfile" "$@"
}

case_uvm() {
    local d=$WORK/uvm rc seen ok=0 st
    mkdir -p "$d"
    start_detached "$d" "$d/probe.log" "$PROBE" managed 256
    TREE=$STARTED_PID
    wait_line "$d/probe.log" 'ok round=1 ' 30 || { verdict uvm "probe ready" "$(tail -n 2 "$d/probe.log")" 1; return; }
    criu_dump "$d/img" dump.log -- && rc=0 || rc=$?
    seen=$(line "$d/img/dump.log" "CUDA_ERROR_NOT_SUPPORTED")
    st=$(state "$TREE")
    [ "$rc" -ne 0 ] && [[ $seen == *"managed (UVM) memory"* ]] && [ "$st" = RUNNING ] || ok=1
    advancing "$d/probe.log" || ok=1
    verdict uvm-dump "dump fails naming UVM/MPS/MIG; RUNNING; data intact" \
        "criu rc=$rc; state $st; reads: $(reads "$d/probe.log"); line: $seen; rollback: $(line "$d/img/dump.log" "rolled back")" "$ok"
    cp "$d/img/dump.log" "$RESULTS_DIR/uvm-dump.log"
    cleanup_processes
}

case_refuse() {
    local kind=$1 d=$WORK/refuse-$1 rc seen ok=0
    start_pair "$d" "$kind" || { verdict "$kind-refuse" "pair ready" "$(tail -n 2 "$d"/*.log)" 1; cleanup_processes; return; }
    criu_dump "$d/img" dump.log CRIU_CUDA_MIGRATE_MULTI_PROCESS=refuse -- && rc=0 || rc=$?
    seen=$(line "$d/img/dump.log" "refused before any checkpoint")
    # The importer check refuses it at the first lock already (issue 34); multi-process refuse would at the checkpoint.
    [ "$rc" -ne 0 ] && [[ $seen == *"pid $IMP has "* || $seen == *"pids $EXP, $IMP"* ]] || ok=1
    [ "$(state "$EXP")" = RUNNING ] && [ "$(state "$IMP")" = RUNNING ] || ok=1
    advancing "$d/imp.log" && advancing "$d/exp.log" || ok=1
    [[ $(reads "$d/imp.log") == *"peer=5eed0002"* ]] || ok=1
    verdict "$kind-refuse" "refused before any checkpoint; both RUNNING; importer reads the peer" \
        "criu rc=$rc; exporter $(state "$EXP"), importer $(state "$IMP"); importer: $(reads "$d/imp.log"); line: $seen" "$ok"
    cp "$d/img/dump.log" "$RESULTS_DIR/$kind-refuse-dump.log"
    cleanup_processes
}

case_dump_restore() {
    local kind=$1 d=$WORK/dump-$1 rc rrc seen warn ok=0 sum
    start_pair "$d" "$kind" || { verdict "$kind-dump-restore" "pair ready" "$(tail -n 2 "$d"/*.log)" 1; cleanup_processes; return; }
    # Told to dump the importer anyway (the default refuses it: tests/gpu/ipc-refuse.sh): what its restore does.
    criu_dump "$d/img" dump.log CRIU_CUDA_MIGRATE_IPC=allow -- && rc=0 || rc=$?
    warn=$(line "$d/img/dump.log" "CRIU_CUDA_MIGRATE_IPC=allow: dumping although")
    wait_gone "$EXP" 30
    wait_gone "$IMP" 30
    wait_gone "$TREE" 30
    sum=$(sha256sum "$d"/img/cuda-migrate-*.img | sha256sum)
    criu_cmd -- restore -d -D "$d/img" --libdir "$PLUGIN_DIR" -v4 -o restore.log && rrc=0 || rrc=$?
    seen=$(line "$d/img/restore.log" "the driver's restore failed")
    [ "$rc" -eq 0 ] && [[ $warn == *"pid $IMP has"* ]] && [ "$rrc" -ne 0 ] && [[ $seen == *"CUDA IPC"* ]] || ok=1
    [ "$(sha256sum "$d"/img/cuda-migrate-*.img | sha256sum)" = "$sum" ] || ok=1
    sleep 1
    verdict "$kind-dump-restore" "dump with IPC=allow warns naming the importer; restore fails naming IPC; tree killed; images intact" \
        "dump rc=$rc, restore rc=$rrc; exporter $(state "$EXP"), importer $(state "$IMP"); warning: ${warn:0:160}...; line: $seen" "$ok"
    cp "$d/img/dump.log" "$RESULTS_DIR/$kind-dump.log"
    cp "$d/img/restore.log" "$RESULTS_DIR/$kind-restore.log"
    kill -9 "$EXP" "$IMP" "$TREE" 2>/dev/null
    cleanup_processes
}

case_leave_running() {
    local kind=$1 d=$WORK/leave-$1 rc seen ok=0 se si
    start_pair "$d" "$kind" || { verdict "$kind-leave-running" "pair ready" "$(tail -n 2 "$d"/*.log)" 1; cleanup_processes; return; }
    criu_dump "$d/img" dump.log CRIU_CUDA_MIGRATE_IPC=allow -- --leave-running && rc=0 || rc=$?
    seen=$(line "$d/img/dump.log" "pid $IMP is left")
    se=$(state "$EXP")
    si=$(state "$IMP")
    # The importer cannot come back (driver 580): what matters is that the line says so, names no false fix, and
    # the exporter runs on.
    [ "$se" = RUNNING ] && [ "$si" = CHECKPOINTED ] && [[ $seen == *"cannot bring it back"* ]] || ok=1
    advancing "$d/exp.log" || ok=1
    verdict "$kind-leave-running" "exporter RUNNING; importer CHECKPOINTED with a line saying recover cannot help" \
        "dump rc=$rc; exporter $se, importer $si; line: $seen" "$ok"
    cp "$d/img/dump.log" "$RESULTS_DIR/$kind-leave-running-dump.log"
    cleanup_processes
}

main() {
    rm -rf "$WORK"
    mkdir -p "$WORK" "$RESULTS_DIR" "$PLUGIN_DIR" "$CRIU_ROOT"
    : >"$RESULTS"
    : >"$WORK/pids"
    local f
    for f in "$DEVICE_DIR"/criu-debs/*.deb; do dpkg -x "$f" "$CRIU_ROOT" || exit 2; done
    cp "$DEVICE_DIR"/plugin/libcriu_cuda_migrate.so "$PLUGIN_DIR/" || exit 2
    gcc -O1 -o "$PROBE" "$REPO/tests/gpu/ipc_probe.c" -I/usr/local/cuda/include -L/usr/local/cuda/lib64/stubs -lcuda || exit 2
    log "GPU: $(nvidia-smi --query-gpu=driver_version,name,uuid --format=csv,noheader)"
    trap cleanup_processes EXIT
    case_uvm
    case_refuse legacy
    case_refuse cumem
    case_dump_restore legacy
    case_dump_restore cumem
    case_leave_running cumem
    case_leave_running legacy
    print_table | tee "$RESULTS_DIR/results.md"
    return "$FAILED"
}

main "$@"
