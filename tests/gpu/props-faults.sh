#!/usr/bin/env bash
# GPU proofs of issue 17: the runtime's cudaDeviceProp copies follow a migration (across machines, chained),
# the preflight refuses a GPU without room, a GPU taken after the preflight fails the restore cleanly, and
# faults on the real driver leave nothing stuck. Each new machine is another GPU at the same PCI location.
#
# Run THERE after tests/gpu/prepare.sh ran HERE and `.device/` was carried:
#   bash tests/gpu/props-faults.sh a          machine A: t1 (PyTorch, same GPU), m1, m2, f1-f3, then the props
#                                             program's first dump (p0) into $OUT/xfer.tar.xz.* and $OUT/meta.txt
#   bash tests/gpu/props-faults.sh b XFER     machine B: restore p0's images without, then with the rewrite (p1),
#                                             dump it again (p2) into $OUT
#   bash tests/gpu/props-faults.sh c XFER     machine C: restore the second dump (p3: chained migration)
#   CASES="a1 a2 a3 a4" bash tests/gpu/props-faults.sh a
#                                             issue 23: the driver agent SIGKILLed (a1) and SIGSTOPped (a2) 0.3 s
#                                             into a 4 GiB checkpoint, SIGKILLed (a3) and SIGSTOPped (a4) 0.2 s into
#                                             an 8 GiB driver restore (CRIU_CUDA_MIGRATE_DRIVER_TIMEOUT=5 for the
#                                             stopped ones)
# Prints `| case | expected | seen | result | times |` rows ($OUT/rows.md) and exits 1 on any FAIL.
# shellcheck disable=SC2317 # whole file: shellcheck 0.9 takes every function here for unreachable code
# (the cases run by name, "case_$c", and the helpers from them)

set -uo pipefail
# No -e: a status-recording flow. A failed case is recorded as a FAIL row and the next case runs.
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
DEVICE_DIR=${CCM_DEVICE_DIR:-$REPO/.device}
WORK=$(realpath -m "${CCM_WORK:-/var/tmp/ccm-p17}")
OUTD=$(realpath -m "${OUT:-$WORK/out}")
CRIU_ROOT=/opt/criu
CRIU_BIN=$CRIU_ROOT/usr/sbin/criu
CRIU_LIBS=$CRIU_ROOT/usr/lib/x86_64-linux-gnu
CRIU_TIMEOUT=240
CLI=$DEVICE_DIR/bin/criu-cuda-migrate
WORKLOAD=$DEVICE_DIR/bin/ccm-sample-workload
XFER=/var/tmp/ccm-p17-xfer
PY=$(command -v python3)
export NCCL_NVLS_ENABLE=0
# shellcheck source=tests/gpu/processes.sh
source "$REPO/tests/gpu/processes.sh"
# now, elapsed, agent_alive (a driver agent that is no zombie: a killed agent waits for init to reap it), ...
# shellcheck source=tests/lib/common.sh
source "$REPO/tests/lib/common.sh"

PHASE=${1:?usage: props-faults.sh a | b XFER | c XFER}
mkdir -p "$WORK" "$OUTD/logs"
: >"$WORK/pids"
trap cleanup_processes EXIT
for f in "$DEVICE_DIR"/criu-debs/*.deb; do dpkg -x "$f" "$CRIU_ROOT"; done
mkdir -p "$WORK/plugins" && cp "$DEVICE_DIR"/plugin/*.so "$WORK/plugins/"
GPU=$(nvidia-smi --query-gpu=uuid --format=csv,noheader | head -n1)
FAILS=0
row() {
    printf '| %s | %s | %s | %s | %s |\n' "$1" "$2" "${3//$'\n'/ }" "$4" "$5" | tee -a "$OUTD/rows.md"
    [[ $4 == PASS ]] || FAILS=$((FAILS + 1))
}
sums() { sha256sum "$1"/*.img | sha256sum | cut -c1-16; }
state() { "$PY" "$REPO/tests/gpu/ckpt_ctl.py" state "$1" 2>&1 | tail -n1; }
# agent_pid LOG: the driver agent's pid, as the plugin's log names it.
agent_pid() { grep -ao 'driver agent, pid [0-9]*\|driver agent pid [0-9]*' "$1" | head -n1 | grep -o '[0-9]*$'; }
plines() { grep -a "criu-cuda-migrate" "$1" | grep -E "$2" | sed 's/^.*criu-cuda-migrate: //' | head -n "${3:-1}" | tr '\n' ';' | cut -c1-260; }
dump() { # PID IMG [ARGS]
    local pid=$1 img=$2
    shift 2
    mkdir -p "$img"
    criu_cmd -- dump -t "$pid" -D "$img" --libdir "$WORK/plugins" -v4 -o dump.log "$@"
}
restore() { # IMG [ENV...]
    local img=$1
    shift
    (cd "$img" && close_inherited_fds && criu_cmd "$@" -- restore -d -D "$img" --libdir "$WORK/plugins" -v4 -o restore.log)
}
go() { : >"$1/go$2"; wait_file "$1/done$2" 120; }
workload() { # DIR MIB: the sample workload; sets W
    mkdir -p "$1"
    start_detached "$1" "$1/w.log" "$WORKLOAD" --dir "$1" --mib "$2" --rounds 2
    W=$STARTED_PID
    wait_file "$1/ready" 120 "$W"
}
report_ok() { "$PY" "$REPO/tests/gpu/gpu_check.py" report "$1" --data-ok --consistent; }
# hog MIB_LEFT DIR: a process that takes all but MIB_LEFT MiB of the GPU once DIR/grab exists (torch is loaded
# before, so the grab itself takes milliseconds); DIR/grabbed holds how much it took.
hog() {
    mkdir -p "$2"
    start_detached "$2" "$2/hog.log" "$PY" -c '
import os, sys, time, torch
left, d = int(sys.argv[1]) << 20, sys.argv[2]
torch.cuda.init(); torch.empty(1, device="cuda")
open(d + "/armed", "w").close()
while not os.path.exists(d + "/grab"): time.sleep(0.002)
free, _ = torch.cuda.mem_get_info()
x = torch.empty(max(free - left, 0), dtype=torch.uint8, device="cuda")
open(d + "/grabbed", "w").write(str(x.numel() >> 20))
time.sleep(3600)' "$1" "$2"
    HOG=$STARTED_PID
    wait_file "$2/armed" 60 "$HOG"
}

case_t1() { # PyTorch on the same GPU: its own cudaDeviceProp cache is found at dump and still right after restore.
    local d=$WORK/t1 pid t0 td tr r
    rm -rf "$d"; mkdir -p "$d/ctl"
    start_detached "$d/ctl" "$d/ctl/log" "$PY" "$REPO/tests/gpu/torch_props.py" --dir "$d/ctl" --mib 256 --rounds 2
    pid=$STARTED_PID
    wait_file "$d/ctl/ready" 180 "$pid" || { row t1-torch-props-same-gpu "-" "torch not ready: $(tail -n2 "$d/ctl/log")" FAIL -; return; }
    go "$d/ctl" 1
    t0=$(now); dump "$pid" "$d/img" || { row t1-torch-props-same-gpu "-" "dump failed: $(plines "$d/img/dump.log" 'rror')" FAIL -; return; }
    td=$(elapsed "$t0"); wait_gone "$pid" 30
    t0=$(now); restore "$d/img" || { row t1-torch-props-same-gpu "-" "restore failed: $(plines "$d/img/restore.log" 'rror')" FAIL -; return; }
    tr=$(elapsed "$t0"); track "$pid"
    go "$d/ctl" 2
    r=$(cat "$d/ctl/report2.json")
    local found; found=$(plines "$d/img/dump.log" 'identity:' | grep -o '[0-9]* cudaDeviceProp cop(ies) ([0-9]* look-alike(s) left alone)')
    if [[ $r == *"\"torch_uuid\": \"$GPU\""* && $r == *'"data_ok": true'* && $r == *"\"driver_uuid\": \"$GPU\""* && ${found%% *} -ge 1 ]]; then
        row t1-torch-props-same-gpu "torch's cached props found at dump; after restore torch names this GPU; data intact" "dump: $found; report: $r" PASS "dump ${td}s, restore ${tr}s, $(du -sm "$d/img" | cut -f1) MiB of images"
    else
        row t1-torch-props-same-gpu "torch's cached props found at dump; after restore torch names this GPU" "dump: $found; report: $r" FAIL -
    fi
    cp "$d/img/dump.log" "$OUTD/logs/t1-dump.log"; kill -9 "$pid" 2>/dev/null; wait_gone "$pid" 10; rm -rf "$d/img"
}

case_m1() { # A GPU without room: refused in preflight (plugin and CLI), images intact, restore once freed.
    local d=$WORK/m1 s0 seen cli
    rm -rf "$d"; workload "$d/w" 4096 || { row m1-memory-refused "-" "workload not ready" FAIL -; return; }
    dump "$W" "$d/img" || { row m1-memory-refused "-" "dump failed" FAIL -; return; }
    wait_gone "$W" 30; s0=$(sums "$d/img")
    hog 2048 "$d/hog"; : >"$d/hog/grab"; wait_file "$d/hog/grabbed" 60 "$HOG"
    cli=$("$CLI" preflight "$d/img" 2>&1 | tail -n1 | cut -c1-200)
    if restore "$d/img"; then row m1-memory-refused "refused" "restore succeeded onto a full GPU" FAIL -; return; fi
    seen="hog took $(cat "$d/hog/grabbed") MiB; plugin: $(plines "$d/img/restore.log" 'free but') CLI: $cli"
    local intact=no; [[ $(sums "$d/img") == "$s0" ]] && intact=yes
    kill -9 "$HOG"; wait_gone "$HOG" 20; sleep 1
    if restore "$d/img"; then
        track "$W"; go "$d/w" 1
        if [[ $seen == *"free but the checkpoint"* && $cli == *"preflight refused"* && $intact == yes ]] && report_ok "$d/w/report1.json" >/dev/null; then
            row m1-memory-refused "refused before CRIU restores anything, naming GPU, need and free; images intact; restores once freed" "$seen; images intact: $intact; retry: $(report_ok "$d/w/report1.json")" PASS "$(plines "$d/img/restore.log" 'preflight: device memory')"
        else
            row m1-memory-refused "refused, intact, retry ok" "$seen; images intact: $intact" FAIL -
        fi
    else
        row m1-memory-refused "retry restores" "$seen; retry failed: $(plines "$d/img/restore.log" 'rror' 2)" FAIL -
    fi
    kill -9 "$W" 2>/dev/null; wait_gone "$W" 10; rm -rf "$d/img"
}

case_m2() { # The GPU is taken after the preflight: the driver's restore fails, strict mode kills, retry works.
    local d=$WORK/m2 s0 seen rc t0
    rm -rf "$d"; workload "$d/w" 8192 || { row m2-oom-race "-" "workload not ready" FAIL -; return; }
    dump "$W" "$d/img" || { row m2-oom-race "-" "dump failed" FAIL -; return; }
    wait_gone "$W" 30; s0=$(sums "$d/img")
    hog 2048 "$d/hog"
    (
        for _ in $(seq 3000); do grep -q "preflight passed" "$d/img/restore.log" 2>/dev/null && break; sleep 0.005; done
        : >"$d/hog/grab"
    ) &
    local watcher=$!
    t0=$(now); restore "$d/img"; rc=$?
    wait "$watcher"
    seen="hog took $(cat "$d/hog/grabbed" 2>/dev/null) MiB after the preflight; restore rc $rc; $(plines "$d/img/restore.log" "driver's restore failed|strict mode: killed" 2)"
    local gone=no intact=no; sleep 1; alive "$W" || gone=yes; [[ $(sums "$d/img") == "$s0" ]] && intact=yes
    kill -9 "$HOG"; wait_gone "$HOG" 20; sleep 1
    if [[ $rc -ne 0 ]] && restore "$d/img"; then
        track "$W"; go "$d/w" 1
        if [[ $gone == yes && $intact == yes && $seen == *"strict mode kills"* ]] && report_ok "$d/w/report1.json" >/dev/null; then
            row m2-oom-race "driver restore fails; tree killed; one error line; images intact; retry after freeing succeeds" "$seen; process gone: $gone; images intact: $intact; retry: $(report_ok "$d/w/report1.json")" PASS "failed restore $(elapsed "$t0")s incl. retry"
        else
            row m2-oom-race "killed, intact, retry ok" "$seen; gone $gone; intact $intact" FAIL -
        fi
    else
        row m2-oom-race "the race fails the first restore; the retry works" "$seen; retry: $(plines "$d/img/restore.log" 'rror' 2)" FAIL -
    fi
    cp "$d/img/restore.log" "$OUTD/logs/m2-restore.log"; kill -9 "$W" 2>/dev/null; wait_gone "$W" 10; rm -rf "$d/img"
}

case_f2() { # CRIU killed during restore, after the driver's restore began.
    local d=$WORK/f2 s0 cpid t0 seen
    rm -rf "$d"; workload "$d/w" 8192 || { row f2-criu-killed-mid-restore "-" "workload not ready" FAIL -; return; }
    dump "$W" "$d/img" || { row f2-criu-killed-mid-restore "-" "dump failed" FAIL -; return; }
    wait_gone "$W" 30; s0=$(sums "$d/img")
    (cd "$d/img" && close_inherited_fds && exec env LD_LIBRARY_PATH="$CRIU_LIBS" "$CRIU_BIN" restore -d -D "$d/img" --libdir "$WORK/plugins" -v4 -o restore.log) &
    cpid=$!
    for _ in $(seq 6000); do grep -q "driver restore started" "$d/img/restore.log" 2>/dev/null && break; sleep 0.005; done
    sleep 0.2
    kill -9 "$cpid"; t0=$(now); wait "$cpid" 2>/dev/null
    for _ in $(seq 1200); do agent_alive || break; sleep 0.05; done
    sleep 0.5
    local gone=no intact=no st; alive "$W" || gone=yes; [[ $(sums "$d/img") == "$s0" ]] && intact=yes
    st=$(state "$W")
    seen="$(plines "$d/img/restore.log" 'went away' 2) process gone: $gone (state: $st); images intact: $intact; agent done $(elapsed "$t0")s after the kill"
    if [[ $gone == yes && $intact == yes ]] && restore "$d/img"; then
        track "$W"; go "$d/w" 1
        if [[ $seen == *"killed it"* ]] && report_ok "$d/w/report1.json" >/dev/null; then
            row f2-criu-killed-mid-restore "the agent finishes the driver restore, kills the half-restored process with an ERROR line; images intact; retry works" "$seen; recover: $("$CLI" recover --pid "$W" 2>&1 | head -n1 | cut -c1-80); retry: $(report_ok "$d/w/report1.json")" PASS "8192 MiB"
        else
            row f2-criu-killed-mid-restore "ERROR line, retry ok" "$seen" FAIL -
        fi
    else
        row f2-criu-killed-mid-restore "no half-restored process left; retry works" "$seen" FAIL -
    fi
    cp "$d/img/restore.log" "$OUTD/logs/f2-restore.log"; kill -9 "$W" 2>/dev/null; wait_gone "$W" 10; rm -rf "$d/img"
}

case_f3() { # Lock timeout against a process busy in a long kernel.
    local d=$WORK/f3 pid t0 rc seen st rec
    rm -rf "$d"; mkdir -p "$d/ctl"
    start_detached "$d/ctl" "$d/ctl/log" "$PY" -c '
import os, sys, time, torch
d = sys.argv[1]
torch.cuda._sleep(1000); torch.cuda.synchronize()
open(d + "/ready", "w").write(str(os.getpid()))
n = 0
while True:
    torch.cuda._sleep(int(8e9)); torch.cuda.synchronize()   # about 4 s per kernel on an H200
    n += 1; open(d + "/kernels", "w").write(str(n))' "$d/ctl"
    pid=$STARTED_PID
    wait_file "$d/ctl/ready" 120 "$pid" || { row f3-lock-timeout-long-kernel "-" "not ready" FAIL -; return; }
    sleep 1
    t0=$(now); dump "$pid" "$d/img" --timeout 2; rc=$?
    seen="dump rc $rc after $(elapsed "$t0")s; $(plines "$d/img/dump.log" 'Lock|lock failed|LOCKED' 2)"
    st=$(state "$pid"); rec=$("$CLI" recover --pid "$pid" 2>&1 | tr '\n' ' ' | cut -c1-120)
    local k0; k0=$(cat "$d/ctl/kernels" 2>/dev/null || echo 0); sleep 10
    local k1; k1=$(cat "$d/ctl/kernels" 2>/dev/null || echo 0)
    if [[ $rc -ne 0 && $st == running ]] && ((k1 > k0)); then
        row f3-lock-timeout-long-kernel "the lock times out, the dump fails, the process runs on (RUNNING, kernels keep completing)" "$seen; state $st; kernels $k0 -> $k1; recover: $rec" PASS "criu --timeout 2"
    else
        row f3-lock-timeout-long-kernel "dump fails, RUNNING" "$seen; state $st; kernels $k0 -> $k1; recover: $rec" FAIL -
    fi
    cp "$d/img/dump.log" "$OUTD/logs/f3-dump.log"; kill -9 "$pid"; wait_gone "$pid" 10
}

case_p0() { # The libcudart program's first dump, for machines B and C.
    local d=$XFER t0
    rm -rf "$d"; mkdir -p "$d/ctl"
    local rt; rt=$(ls /usr/local/cuda/targets/x86_64-linux/lib/libcudart.so.13 2>/dev/null || find / -xdev -name 'libcudart.so.13' 2>/dev/null | head -n1)
    gcc -O1 -I/usr/local/cuda/include "$REPO/tests/gpu/props_probe.c" -o "$d/props_probe" -ldl "$rt" -Wl,-rpath,"$(dirname "$rt")" ||
        { row p0-props-dump "-" "props_probe does not build" FAIL -; return; }
    echo 29999 >/proc/sys/kernel/ns_last_pid
    start_detached "$d/ctl" "$d/ctl/log" "$d/props_probe" "$d/ctl" 4 64
    local pid=$STARTED_PID
    wait_file "$d/ctl/ready" 60 "$pid" || { row p0-props-dump "-" "not ready: $(cat "$d/ctl/log")" FAIL -; return; }
    go "$d/ctl" 1
    t0=$(now); dump "$pid" "$d/img" || { row p0-props-dump "-" "dump failed $(plines "$d/img/dump.log" rror)" FAIL -; return; }
    wait_gone "$pid" 30
    echo "$GPU $pid" >"$d/meta"
    row p0-props-dump "libcudart program: its heap copy and the runtime's cache found at dump (machine A)" "$GPU; $(plines "$d/img/dump.log" 'identity:'); report1: $(tr -d '\n' <"$d/ctl/report1.json" | cut -c1-330)" PASS "dump $(elapsed "$t0")s; images $(du -sm "$d/img" | cut -f1) MiB"
    archive
}

archive() {
    rm -f "$OUTD"/xfer.tar.xz.*
    tar -C /var/tmp -cf - "$(basename "$XFER")" | xz -3 -T4 | split -b 15M - "$OUTD/xfer.tar.xz."
    cp "$XFER/meta" "$OUTD/meta.txt"
}

unpack() {
    [[ -n $(ls "$1"/xfer.tar.xz.* 2>/dev/null) ]] || { echo "no $1/xfer.tar.xz.*" >&2; exit 2; }
    rm -rf "$XFER"; cat "$1"/xfer.tar.xz.* | xz -d | tar -C /var/tmp -xf -
    read -r FROM PPID_ <"$XFER/meta"
}

# props_check REPORT GPU: every view names GPU (the copies by UUID; PCI location unchanged on these machines).
props_check() {
    "$PY" - "$1" "$2" <<'PYEOF'
import json, sys
r, g = json.load(open(sys.argv[1])), sys.argv[2]
ok = all(r[k] == g for k in ("app_uuid", "cudart_uuid", "driver_uuid", "nvml_uuid_at_bus")) and r["data_ok"] and r["work_ok"]
ok = ok and r["app_pci"].lower() == r["cuda_bus_id"].lower() == r["cudart_pci"].lower()
print(f"app {r['app_uuid'][:12]} cudart {r['cudart_uuid'][:12]} driver {r['driver_uuid'][:12]} nvml@bus {r['nvml_uuid_at_bus'][:12]} pci {r['app_pci']} bus {r['cuda_bus_id']} data {r['data_ok']} work {r['work_ok']}")
sys.exit(0 if ok else 1)
PYEOF
}

phase_b() {
    unpack "$1"
    local d=$XFER t0 seen bug
    # First without the rewrite (images are never modified, so the same images serve twice): the bug.
    restore "$d/img" CRIU_CUDA_MIGRATE_RECONCILE=off || { row p1-props-cross-machine "-" "restore failed: $(plines "$d/img/restore.log" rror 2)" FAIL -; return; }
    track "$PPID_"; go "$d/ctl" 2
    bug=$(props_check "$d/ctl/report2.json" "$GPU")
    kill -9 "$PPID_"; wait_gone "$PPID_" 20; rm -f "$d/ctl"/go2 "$d/ctl"/done2 "$d/ctl"/report2.json
    t0=$(now)
    restore "$d/img" || { row p1-props-cross-machine "-" "restore failed: $(plines "$d/img/restore.log" rror 2)" FAIL -; return; }
    track "$PPID_"; go "$d/ctl" 2
    if seen=$(props_check "$d/ctl/report2.json" "$GPU"); then
        row p1-props-cross-machine "dumped on $FROM; every copy names this GPU $GPU after the restore" "without the rewrite: $bug; with it: $seen; $(plines "$d/img/restore.log" 'cudaDeviceProp copies')" PASS "restore $(elapsed "$t0")s"
    else
        row p1-props-cross-machine "every copy names $GPU" "without: $bug; with: $seen" FAIL -
    fi
    cp "$d/img/restore.log" "$OUTD/logs/p1-restore.log"
    mv "$d/img" "$d/img1"; t0=$(now)
    dump "$PPID_" "$d/img" || { row p2-props-dump-again "-" "dump failed" FAIL -; return; }
    wait_gone "$PPID_" 30; rm -rf "$d/img1"
    echo "$GPU $PPID_" >"$d/meta"
    row p2-props-dump-again "the restored process dumped again on B" "$(plines "$d/img/dump.log" 'identity:')" PASS "dump $(elapsed "$t0")s"
    archive
}

phase_c() {
    unpack "$1"
    local d=$XFER t0 seen
    t0=$(now)
    restore "$d/img" || { row p3-props-chained "-" "restore failed: $(plines "$d/img/restore.log" rror 2)" FAIL -; return; }
    track "$PPID_"; go "$d/ctl" 3
    if seen=$(props_check "$d/ctl/report3.json" "$GPU"); then
        row p3-props-chained "second migration ($FROM -> $GPU): every copy names this GPU" "$seen; $(plines "$d/img/restore.log" 'cudaDeviceProp copies')" PASS "restore $(elapsed "$t0")s"
    else
        row p3-props-chained "every copy names $GPU" "$seen" FAIL -
    fi
    cp "$d/img/restore.log" "$OUTD/logs/p3-restore.log"
}

# agent_fault_dump NAME SIG MIB: the driver agent gets SIG 0.3 s into the checkpoint of a MIB workload. The dump
# fails; a fresh agent puts the process back from the state the driver reports: RUNNING, data intact, no agent left.
agent_fault_dump() {
    local name=$1 sig=$2 d=$WORK/$1 cpid t0 apid rc st seen
    rm -rf "$d"; workload "$d/w" "$3" || { row "$name" "-" "workload not ready" FAIL -; return; }
    mkdir -p "$d/img"
    (close_inherited_fds && exec env LD_LIBRARY_PATH="$CRIU_LIBS" CRIU_CUDA_MIGRATE_DRIVER_TIMEOUT=5 \
        "$CRIU_BIN" dump -t "$W" -D "$d/img" --libdir "$WORK/plugins" -v4 -o dump.log) &
    cpid=$!
    for _ in $(seq 3000); do grep -q "cuCheckpointProcessLock" "$d/img/dump.log" 2>/dev/null && break; sleep 0.005; done
    sleep 0.3
    apid=$(agent_pid "$d/img/dump.log")
    [[ -n $apid ]] || { row "$name" "-" "no agent pid in dump.log" FAIL -; kill -9 "$cpid"; return; }
    kill "-$sig" "$apid"; t0=$(now)
    wait "$cpid"; rc=$?
    local tdump; tdump=$(elapsed "$t0")
    for _ in $(seq 600); do agent_alive || break; sleep 0.05; done
    st=$(state "$W")
    seen="dump rc $rc ${tdump}s after SIG$sig; $(plines "$d/img/dump.log" 'did not answer|is gone|rolling back from|rolled back|is left' 5) state after: $st; agent left: $(agent_alive && echo yes || echo no)"
    go "$d/w" 1
    if [[ $rc -ne 0 && $st == running ]] && ! agent_alive && report_ok "$d/w/report1.json" >/dev/null; then
        row "$name" "dump fails at once or at the deadline; a fresh agent puts it back from the reported state: RUNNING, data intact, no agent left" "$seen; $(report_ok "$d/w/report1.json")" PASS "$3 MiB"
    else
        row "$name" "RUNNING, data intact, no agent left" "$seen" FAIL -
    fi
    cp "$d/img/dump.log" "$OUTD/logs/$name-dump.log"; kill -9 "$W" 2>/dev/null; wait_gone "$W" 10; rm -rf "$d/img"
}
case_a1() { agent_fault_dump a1-agent-killed-mid-checkpoint KILL 4096; }
case_a2() { agent_fault_dump a2-agent-stopped-mid-checkpoint STOP 4096; }

# agent_fault_restore NAME SIG MIB: the driver agent gets SIG 0.2 s into the driver's restore of a MIB workload.
# The restored tree is killed with one ERROR line, the images are intact, no agent is left, and a retry restores.
agent_fault_restore() {
    local name=$1 sig=$2 d=$WORK/$1 cpid t0 apid rc s0 seen gone=no intact=no
    rm -rf "$d"; workload "$d/w" "$3" || { row "$name" "-" "workload not ready" FAIL -; return; }
    dump "$W" "$d/img" || { row "$name" "-" "dump failed" FAIL -; return; }
    wait_gone "$W" 30; s0=$(sums "$d/img")
    (cd "$d/img" && close_inherited_fds && exec env LD_LIBRARY_PATH="$CRIU_LIBS" CRIU_CUDA_MIGRATE_DRIVER_TIMEOUT=5 \
        "$CRIU_BIN" restore -d -D "$d/img" --libdir "$WORK/plugins" -v4 -o restore.log) &
    cpid=$!
    for _ in $(seq 6000); do grep -q "driver restore started" "$d/img/restore.log" 2>/dev/null && break; sleep 0.005; done
    sleep 0.2
    apid=$(agent_pid "$d/img/restore.log")
    [[ -n $apid ]] || { row "$name" "-" "no agent pid in restore.log" FAIL -; kill -9 "$cpid"; return; }
    kill "-$sig" "$apid"; t0=$(now)
    wait "$cpid"; rc=$?
    local trest; trest=$(elapsed "$t0")
    for _ in $(seq 600); do agent_alive || break; sleep 0.05; done
    # A killed process holding gigabytes of device memory takes a moment to be torn down by the driver.
    wait_gone "$W" 30 && gone=yes
    [[ $(sums "$d/img") == "$s0" ]] && intact=yes
    seen="restore rc $rc ${trest}s after SIG$sig; $(plines "$d/img/restore.log" 'did not answer|is gone|killed the restored tree' 3) process gone: $gone; images intact: $intact; agent left: $(agent_alive && echo yes || echo no)"
    cp "$d/img/restore.log" "$OUTD/logs/$name-restore.log"
    if [[ $gone == yes && $intact == yes ]] && ! agent_alive && restore "$d/img"; then
        track "$W"; go "$d/w" 1
        if report_ok "$d/w/report1.json" >/dev/null; then
            row "$name" "tree killed with one ERROR line; images intact; no agent left; the retry restores it" "$seen; retry: $(report_ok "$d/w/report1.json")" PASS "$3 MiB"
        else
            row "$name" "retry restores with data" "$seen; retry report bad" FAIL -
        fi
    else
        row "$name" "no half-restored process, images intact, no agent, retry works" "$seen" FAIL -
    fi
    kill -9 "$W" 2>/dev/null; wait_gone "$W" 10; rm -rf "$d/img"
}
case_a3() { agent_fault_restore a3-agent-killed-mid-restore KILL 8192; }
case_a4() { agent_fault_restore a4-agent-stopped-mid-restore STOP 8192; }

echo "GPU $GPU, driver $(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -n1), $(head -n1 "$DEVICE_DIR/MANIFEST")" | tee -a "$OUTD/rows.md"
case $PHASE in
a)
    for c in ${CASES:-t1 m1 m2 f2 f3 p0}; do "case_$c"; done
    # The fault table's first real-GPU case again (CRIU killed during a dump, after the lock).
    OUT=$OUTD/logs bash "$REPO/tests/gpu/kill-criu.sh" | tee -a "$OUTD/rows.md" | grep -q PASS || FAILS=$((FAILS + 1))
    ;;
b) phase_b "${2:?XFER}" ;;
c) phase_c "${2:?XFER}" ;;
*) echo "usage: props-faults.sh a | b XFER | c XFER" >&2; exit 2 ;;
esac
# The device tool brings back few files: the logs as one archive.
tar -C "$OUTD" -czf "$OUTD/logs.tgz" logs 2>/dev/null && rm -rf "$OUTD/logs"
exit $((FAILS > 0))
