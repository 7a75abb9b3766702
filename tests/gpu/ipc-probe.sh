#!/usr/bin/env bash
# Issue 29, part 1, on the GPU machine: what the driver's checkpoint API does to processes that share device memory
# (legacy CUDA IPC and cuMem POSIX-fd handles) or use managed memory, and whether anything visible from outside the
# process tells an importer before anything is locked. No CRIU and no plugin: the driver API alone (ckpt_ctl.py).
#
#   bash tests/gpu/ipc-probe.sh            (root; gcc and the CUDA headers at /usr/local/cuda/include)
#
# Writes to $OUT (or /var/tmp/ccm-ipc-probe/out): snap/*.txt (fds, fdinfo of the NVIDIA fds, mappings without
# addresses, nvidia-smi's compute apps, per process and moment), *-diff.txt (what importing changed, against a plain
# process over the same time), scan-*.txt (where the exporter's handle bytes and pid lie in each process's memory),
# logs of every process and results.tsv (`case | what | seen`). Exits 0 when every step ran (the verdicts are data).

set -uo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
WORK=/var/tmp/ccm-ipc-probe
OUT=${OUT:-$WORK/out}
PROBE=$WORK/ipc_probe
CTL=(python3 "$REPO/tests/gpu/ckpt_ctl.py")
SCAN=(python3 "$REPO/tests/gpu/ipc_scan.py")
export NCCL_NVLS_ENABLE=0
mkdir -p "$WORK" "$OUT/snap"
RESULTS=$OUT/results.tsv
: >"$RESULTS"
PIDS=()

log() { printf '[%s] %s\n' "$(date +%T)" "$*" >&2; }
record() {
    printf '%s\t%s\t%s\n' "$1" "$2" "${3//$'\n'/ }" >>"$RESULTS"
    log "$1 | $2 | $3"
}
cleanup() {
    local p
    for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null; done
}
trap cleanup EXIT

# wait_line FILE TEXT: until FILE holds a line with TEXT (20 s).
wait_line() {
    local i
    for ((i = 0; i < 200; i++)); do
        grep -q -- "$2" "$1" 2>/dev/null && return 0
        sleep 0.1
    done
    log "timed out waiting for '$2' in $1"
    return 1
}

# start NAME ARGS...: the probe in the background, its output in $WORK/NAME.log; sets STARTED to its pid.
start() {
    local name=$1
    shift
    setsid "$PROBE" "$@" >"$WORK/$name.log" 2>&1 </dev/null &
    STARTED=$!
    PIDS+=("$STARTED")
}

# snapshot PID LABEL: what anyone outside the process can see of it, without addresses (so moments can be diffed).
snapshot() {
    local pid=$1 file=$OUT/snap/$2.txt fd target
    {
        echo "== fds (target, count)"
        for fd in /proc/"$pid"/fd/*; do readlink "$fd"; done | sed -E 's/\[[0-9]+\]/[N]/' | sort | uniq -c
        echo "== fdinfo of NVIDIA and anon-inode fds"
        for fd in /proc/"$pid"/fd/*; do
            target=$(readlink "$fd")
            case $target in
                /dev/nvidia* | anon_inode:*)
                    echo "-- $target"
                    grep -v -E '^(pos|ino|mnt_id):' /proc/"$pid"/fdinfo/"${fd##*/}"
                    ;;
            esac
        done | awk '/^-- /{ if (blk != "") print blk; blk=$0; next } { blk = blk " | " $0 } END { print blk }' | sort | uniq -c
        echo "== mappings (size KiB, perms, path), counted"
        awk '{ split($1, a, "-"); size = (strtonum("0x" a[2]) - strtonum("0x" a[1])) / 1024;
               print size, $2, ($6 == "" ? "[anon]" : $6) }' /proc/"$pid"/maps | sort | uniq -c
        echo "== nvidia-smi compute apps"
        nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader | grep -E "^$pid," || echo "(not listed)"
        echo "== status"
        grep -E '^(Threads|VmRSS|TracerPid):' /proc/"$pid"/status
    } >"$file" 2>&1
}

# compare KIND: what the import changed in the importer, and what the same seconds changed in a plain process.
compare() {
    local kind=$1
    {
        echo "### importer: before the open -> after"
        diff "$OUT/snap/$kind-imp-before.txt" "$OUT/snap/$kind-imp-after.txt"
        echo "### exporter: before the import -> after"
        diff "$OUT/snap/$kind-exp-before.txt" "$OUT/snap/$kind-exp-after.txt"
        echo "### a plain process over the same seconds"
        diff "$OUT/snap/$kind-plain-before.txt" "$OUT/snap/$kind-plain-after.txt"
        echo "### importer after vs plain after (what an importer has that a plain process has not)"
        diff "$OUT/snap/$kind-plain-after.txt" "$OUT/snap/$kind-imp-after.txt"
    } >"$OUT/$kind-diff.txt" 2>&1
}

# last_line NAME: the process's last report line.
last_line() { tail -n 1 "$WORK/$1.log"; }

# ctl ACTION PID: one driver call through ckpt_ctl.py, its output on one line.
ctl() { timeout 60 "${CTL[@]}" "$1" "$2" 2>&1 | tr '\n' ' '; }

# signals KIND: exporter + importer + a plain process, snapshots around the import, scans.
signals() {
    local kind=$1 exp imp plain handle
    start "$kind-exp" "export-$kind" "$WORK/$kind.sock" 64
    exp=$STARTED
    wait_line "$WORK/$kind-exp.log" ready || return 1
    start "$kind-plain" plain 1
    plain=$STARTED
    start "$kind-imp" "import-$kind" "$WORK/$kind.sock" 4
    imp=$STARTED
    wait_line "$WORK/$kind-imp.log" ready || return 1
    wait_line "$WORK/$kind-plain.log" ready || return 1
    snapshot "$imp" "$kind-imp-before"
    snapshot "$exp" "$kind-exp-before"
    snapshot "$plain" "$kind-plain-before"
    wait_line "$WORK/$kind-imp.log" opened || return 1
    sleep 0.5
    snapshot "$imp" "$kind-imp-after"
    snapshot "$exp" "$kind-exp-after"
    snapshot "$plain" "$kind-plain-after"
    compare "$kind"
    record "$kind-signals" "importer reads the peer" "$(last_line "$kind-imp")"
    handle=$(sed -n 's/.*handle \([0-9a-f]*\) pid.*/\1/p' "$WORK/$kind-exp.log")
    {
        echo "exporter pid $exp, importer pid $imp, plain pid $plain"
        [ -n "$handle" ] && echo "handle $handle"
        local pidhex
        pidhex=$(printf '%08x' "$exp" | sed -E 's/(..)(..)(..)(..)/\4\3\2\1/')
        for p in "$imp" "$exp" "$plain"; do
            echo "-- pid $p: the exporter's pid as le32 ($pidhex)${handle:+, the first 16 bytes of the handle, all 64}"
            "${SCAN[@]}" "$p" "$pidhex" ${handle:+"${handle:0:32}"} ${handle:+"$handle"}
        done
    } >"$OUT/scan-$kind.txt" 2>&1
    SIG_EXP=$exp SIG_IMP=$imp SIG_PLAIN=$plain
}

# inplace KIND ORDER: lock+checkpoint both, restore+unlock in ORDER (exp-first or imp-first), then what each reads.
inplace() {
    local kind=$1 order=$2 exp=$SIG_EXP imp=$SIG_IMP first second
    record "$kind-$order" "lock+checkpoint importer" "$(ctl lock-checkpoint "$imp")"
    record "$kind-$order" "lock+checkpoint exporter" "$(ctl lock-checkpoint "$exp")"
    if [ "$order" = exp-first ]; then first=$exp second=$imp; else first=$imp second=$exp; fi
    record "$kind-$order" "restore+unlock pid $first" "$(ctl restore-unlock "$first")"
    record "$kind-$order" "restore+unlock pid $second" "$(ctl restore-unlock "$second")"
    record "$kind-$order" "retry restore+unlock importer" "$(ctl restore-unlock "$imp")"
    sleep 1
    record "$kind-$order" "states exp/imp" "$(ctl state "$exp") / $(ctl state "$imp")"
    record "$kind-$order" "exporter reads" "$(last_line "$kind-exp")"
    record "$kind-$order" "importer reads" "$(last_line "$kind-imp")"
    kill -9 "$exp" "$imp" "$SIG_PLAIN" 2>/dev/null
    sleep 0.5
}

# only-exporter KIND: checkpoint the exporter alone while the importer runs on (a dump of one side of the pair).
only_exporter() {
    local kind=$1
    signals "$kind" >/dev/null 2>&1 || return 1
    record "$kind-exporter-alone" "lock+checkpoint exporter" "$(ctl lock-checkpoint "$SIG_EXP")"
    sleep 1
    record "$kind-exporter-alone" "importer reads meanwhile" "$(last_line "$kind-imp")"
    record "$kind-exporter-alone" "restore+unlock exporter" "$(ctl restore-unlock "$SIG_EXP")"
    sleep 1
    record "$kind-exporter-alone" "exporter / importer read" "$(last_line "$kind-exp") / $(last_line "$kind-imp")"
    kill -9 "$SIG_EXP" "$SIG_IMP" "$SIG_PLAIN" 2>/dev/null
    sleep 0.5
}

uvm() {
    local plain managed
    start uvm-plain plain 64
    plain=$STARTED
    start uvm-managed managed 64
    managed=$STARTED
    wait_line "$WORK/uvm-plain.log" ready && wait_line "$WORK/uvm-managed.log" ready || return 1
    sleep 0.5
    snapshot "$plain" uvm-plain
    snapshot "$managed" uvm-managed
    diff "$OUT/snap/uvm-plain.txt" "$OUT/snap/uvm-managed.txt" >"$OUT/uvm-diff.txt"
    record uvm "lock+checkpoint managed" "$(ctl lock-checkpoint "$managed")"
    record uvm "state after" "$(ctl state "$managed")"
    record uvm "unlock" "$(ctl unlock "$managed")"
    sleep 1
    record uvm "managed reads" "$(last_line uvm-managed)"
    kill -9 "$plain" "$managed" 2>/dev/null
}

main() {
    log "driver $(nvidia-smi --query-gpu=driver_version,name,uuid --format=csv,noheader)"
    gcc -O1 -o "$PROBE" "$REPO/tests/gpu/ipc_probe.c" -I/usr/local/cuda/include -L/usr/local/cuda/lib64/stubs -lcuda ||
        { record build gcc FAIL; exit 1; }
    local kind order
    for kind in legacy cumem; do
        for order in exp-first imp-first; do
            if signals "$kind"; then
                [ "$order" = exp-first ] && cp "$OUT/$kind-diff.txt" "$OUT/$kind-diff-first.txt"
                inplace "$kind" "$order"
            else
                record "$kind-$order" setup FAIL
                cleanup
            fi
        done
        only_exporter "$kind"
    done
    uvm || record uvm setup FAIL
    cp "$WORK"/*.log "$OUT/" 2>/dev/null
    column -t -s $'\t' "$RESULTS"
}

main "$@"
