#!/usr/bin/env bash
# Issue 41 part 2 on the GPU machine, under real CRIU 4.1.1 with the plugin: what the dump's identity scan costs.
#
#   bash tests/gpu/scan-cost.sh [llm] [tenant]        (both without arguments)
#
#   llm      tests/gpu/scan_jobs.py llm (torch + a transformers causal LM, bf16, greedy generate with the KV cache):
#            a --leave-running dump, then a dump and `criu restore -d`; the plugin's scan lines (bytes, mappings,
#            time, sites) at dump and restore; the generated ids after the restore equal the ones before.
#   tenant   the issue's reproduction: a CUDA process with 32 000 untouched MAP_NORESERVE chunks of 64 MiB (2 TiB
#            virtual); a --leave-running dump: the scan's bytes and time, CRIU's peak RSS (getrusage of its
#            waited children), the tenant's VmRSS and VmPTE before and after (a scan that faulted the chunks in
#            would grow both, charged to root), and the tenant's device buffer intact afterwards.
#
# Needs .device (tests/gpu/prepare.sh). Writes $OUT/scan-cost-results.tsv, scan-cost-table.md and the CRIU logs
# in $OUT/scan-logs.tar.gz.

set -uo pipefail
# No -e: a status-recording flow.

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
export CCM_WORK=${CCM_WORK:-/var/tmp/ccm-scan-cost}
# shellcheck source=tests/gpu/container.sh
. "$REPO/tests/gpu/container.sh"
RESULTS=$RESULTS_DIR/scan-cost-results.tsv
LOGS=$RESULTS_DIR/scan-logs
JOBS=$REPO/tests/gpu/scan_jobs.py
TORCH_PY=/opt/torch/.venv/bin/python3
FAILED=0

# rusage_run CMD...: CMD's exit status; prints `maxrss_kib=N wall_s=S` of CMD and what it waited for, on fd 3.
rusage_run() {
    python3 -c '
import resource, subprocess, sys, time
t = time.monotonic()
rc = subprocess.call(sys.argv[1:])
with open("/proc/self/fd/3", "w") as f:
    f.write("maxrss_kib=%d wall_s=%.2f\n" % (resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, time.monotonic() - t))
sys.exit(rc)' "$@"
}

criu_dump() { # IMG PID [criu args...]: CRIU's dump with the plugin; sets DUMP_RC, DUMP_USAGE
    local img=$1 pid=$2
    shift 2
    mkdir -p "$img"
    DUMP_USAGE=$(rusage_run env LD_LIBRARY_PATH="$CRIU_LIBS" timeout --kill-after=10 "$CRIU_TIMEOUT" "$CRIU_BIN" \
        dump -t "$pid" -D "$img" --libdir "$PLUGIN_LIBDIR" -v4 -o dump.log "$@" 3>&1 >/dev/null 2>&1)
    DUMP_RC=$?
}

vm_of() { awk '/^(VmRSS|VmPTE):/ { printf "%s%s kB ", $1, $2 }' "/proc/$1/status" 2>/dev/null; }

# scan_lines LOG...: the plugin's scan figures (sites, bytes, mappings, time) and any budget or deadline stop.
scan_lines() {
    grep -hoE '[0-9]+ PCI site\(s\)|scanned [0-9]+ MiB in [0-9]+ mapping\(s\) in [0-9.]+ s( \(total [0-9.]+ s\)|: [0-9]+ site\(s\))?|[^:]*(budget|deadline)[^;]*' "$@" 2>/dev/null | one_line 400
}

start_job() { # SHAPE PYTHON: sets D, PID
    D=$WORK/$1
    rm -rf "$D"
    mkdir -p "$D"
    start_detached "$D" "$D/stdout.log" "$2" "$JOBS" "$1" --dir "$D"
    PID=$STARTED_PID
    wait_file "$D/ready" 300 "$PID"
}

case_llm() {
    local name=llm rc2=1 rrc=1 t0 td tr before
    log "$name: start"
    if ! start_job llm "$TORCH_PY"; then
        verdict "$name" "ready" "not ready: $(tail -n 3 "$D/stdout.log" | one_line)" FAIL
        cleanup_processes
        return
    fi
    before=$(vm_of "$PID")
    criu_dump "$D/img-lr" "$PID" --leave-running
    cp "$D/img-lr/dump.log" "$LOGS/llm-leave-running-dump.log"
    log "$name: leave-running dump rc=$DUMP_RC $DUMP_USAGE"
    local lr
    lr="leave-running dump rc=$DUMP_RC ($DUMP_USAGE; target $before → $(vm_of "$PID")): $(scan_lines "$D/img-lr/dump.log")"
    rm -rf "$D/img-lr"
    t0=$(now)
    criu_dump "$D/img" "$PID"
    rc2=$DUMP_RC
    td=$(elapsed "$t0")
    if [[ $rc2 -eq 0 ]]; then
        wait_gone "$PID" 30
        t0=$(now)
        (close_inherited_fds && criu_cmd -- restore -d -D "$D/img" --libdir "$PLUGIN_LIBDIR" -v4 -o restore.log) && rrc=0 || rrc=$?
        tr=$(elapsed "$t0")
        track "$PID"
    fi
    touch "$D/go"
    wait_file "$D/done" 120 "$PID"
    cp "$D/img/dump.log" "$LOGS/llm-dump.log" 2>/dev/null
    cp "$D/img/restore.log" "$LOGS/llm-restore.log" 2>/dev/null
    local res=FAIL
    [[ $DUMP_RC -eq 0 && $rc2 -eq 0 && $rrc -eq 0 ]] && grep -qx 'same=1' "$D/done" 2>/dev/null && res=PASS
    verdict "$name" "dumps (leave-running and full) and the restore pass; the scan is bounded and finds the PCI words; generate gives the same ids after the restore" \
        "$(grep -m1 '^model=' "$D/ready"); $(grep -m1 '^rss_kib=' "$D/ready"); $lr; dump rc=$rc2 ($DUMP_USAGE): $(scan_lines "$D/img/dump.log"); restore rc=$rrc: $(scan_lines "$D/img/restore.log"); $(tr '\n' ' ' <"$D/done" 2>/dev/null)" \
        "$res" "dump ${td}s, restore ${tr:--}s"
    rm -rf "$D/img"
    cleanup_processes
}

case_tenant() {
    local name=tenant before after
    log "$name: start"
    if ! start_job tenant python3; then
        verdict "$name" "ready" "not ready: $(tail -n 3 "$D/stdout.log" | one_line)" FAIL
        cleanup_processes
        return
    fi
    before=$(vm_of "$PID")
    criu_dump "$D/img" "$PID" --leave-running
    after=$(vm_of "$PID")
    log "$name: leave-running dump rc=$DUMP_RC $DUMP_USAGE; $before → $after"
    touch "$D/go"
    wait_file "$D/done" 60 "$PID"
    cp "$D/img/dump.log" "$LOGS/tenant-dump.log" 2>/dev/null
    local res=FAIL rss_b rss_a
    rss_a=$(grep -o 'VmRSS:[0-9]*' <<<"$after" | cut -d: -f2)
    rss_b=$(grep -o 'VmRSS:[0-9]*' <<<"$before" | cut -d: -f2)
    if [[ $DUMP_RC -eq 0 ]] && grep -qx 'same=1' "$D/done" 2>/dev/null && ((${rss_a:-0} < ${rss_b:-0} + 262144)); then res=PASS; fi
    verdict "$name" "the leave-running dump passes; the scan stays within its budget and deadline; the tenant's RSS grows < 256 MiB; its device buffer intact" \
        "$(grep -m1 '^chunks=' "$D/ready"), $(grep -m1 '^vm_kib=' "$D/ready"); dump rc=$DUMP_RC ($DUMP_USAGE); tenant $before → $after; plugin: $(scan_lines "$D/img/dump.log"); $(tr '\n' ' ' <"$D/done" 2>/dev/null)" \
        "$res" "$DUMP_USAGE"
    rm -rf "$D/img"
    cleanup_processes
}

main_scan() {
    setup
    mkdir -p "$LOGS"
    trap 'cleanup_processes' EXIT
    [[ $# -gt 0 ]] || set -- llm tenant
    for c in "$@"; do
        case $c in
        llm) case_llm ;;
        tenant) case_tenant ;;
        *) echo "unknown case $c" >&2; exit 2 ;;
        esac
    done
    print_table | tee "$RESULTS_DIR/scan-cost-table.md"
    # One archive: the device tool brings back a handful of files per call.
    tar -C "$RESULTS_DIR" -czf "$RESULTS_DIR/scan-logs.tar.gz" "${LOGS##*/}" && rm -rf "$LOGS"
    return "$FAILED"
}

main_scan "$@"
