#!/usr/bin/env bash
# Fault injection: the plugin under REAL CRIU on the TEST DOUBLES, one CASE per failure it can meet.
# For each case it checks the outcome CRIU reports, the error line the user sees in CRIU's log, and the
# CUDA state of every process afterwards (through the double's controller `ccm-sim-ctl PID state`):
#   - dump side: whatever fails, every process the plugin touched is back as it was (RUNNING);
#   - restore side: no process is left LOCKED or CHECKPOINTED without a line naming its pid and
#     `criu-cuda-migrate recover --pid N`, and the identity images are never modified.
#
# Runs inside the trixie root: tests/criu-root.sh run tests/sim/faults.sh BIN_DIR CASE
#   BIN_DIR  cargo's target dir: libcriu_cuda_migrate.so, ccm-sample-workload, ccm-sim-ctl,
#            criu-cuda-migrate (the CLI), libcuda_test_double.so, libnvml_test_double.so
#   CASE     lock-timeout | checkpoint-fail-one-of-two | checkpoint-unsupported | multi-process-refuse |
#            multi-process-unchecked | multi-process-ipc-restore | restore-fail | restore-fail-permissive | unlock-fail |
#            criu-killed-mid-restore | nvml-missing-dump |
#            nvml-missing-restore | libcuda-missing-dump | libcuda-missing-restore | image-missing |
#            image-missing-one-of-two |
#            image-truncated | image-newer-version | map-unknown-gpu | sites-moved-strict |
#            sites-moved-permissive | criu-killed-mid-dump | newer-driver | leave-running |
#            agent-stop-lock | agent-kill-lock | agent-stop-checkpoint | agent-kill-checkpoint |
#            agent-stop-restore | agent-kill-restore | agent-panic-lock | agent-panic-checkpoint |
#            agent-panic-restore | image-symlink-zero | image-fifo | image-symlink-secret |
#            image-oversized | image-control | image-pid-renamed | setting-disable-unknown |
#            staging-page-file-cut | staging-page-file-flipped | criu-killed-after-release |
#            custom-storage | custom-storage-one-of-two | custom-storage-criu-killed | post-dump-fails |
#            custom-storage-post-dump-fails | leave-stopped
# Prints `SEEN <line>` (the error line the user sees), `STATE pid=N <state>` (every process after) and
# `FAULT <case> OK`, exit 0, when the case behaves as documented in docs/RELIABILITY.md; exits 1 with
# the relevant logs otherwise.
set -euo pipefail

BIN=${1:?usage: faults.sh BIN_DIR CASE}
CASE=${2:?usage: faults.sh BIN_DIR CASE}
WORK=${CCM_FAULT_WORK:-/tmp/ccm-fault-$CASE}
# shellcheck source=tests/sim/stack.sh
. "$(dirname "${BASH_SOURCE[0]}")/stack.sh"
# A well-formed UUID that is no GPU of the simulated node.
UNKNOWN_GPU=GPU-0badc0de-0000-0000-0000-000000000000

fail() {
    echo "faults[$CASE]: FAIL: $*" >&2
    for f in "$WORK"/w*.out "$WORK"/*.out "$WORK"/img*/dump.log "$WORK"/img*/restore.log; do
        [ -f "$f" ] && { echo "----- $f" >&2; grep -E "criu-cuda-migrate|Error|rror \(|CTL" "$f" | tail -n 60 >&2; }
    done
    exit 1
}

sim_stack_setup 2
# Trees of two CUDA processes on the test doubles, whose importer check cannot run (no kernel driver): the default
# (check) refuses them, which the multi-process-unchecked case proves; the other cases dump them with warn.
export CRIU_CUDA_MIGRATE_MULTI_PROCESS=warn

# Every process this script starts is recorded here and killed at exit (by pid, after checking it is
# still ours), so a failed case leaves nothing behind.
: >"$WORK/started"
cleanup() {
    local p
    while read -r p; do
        [ -n "$p" ] || continue
        if grep -qa -e ccm-sample-workload -e ccm-fault-loop "/proc/$p/cmdline" 2>/dev/null; then
            kill -9 "$p" 2>/dev/null || true
        fi
    done <"$WORK/started"
    # Restored processes were started by CRIU, not recorded here.
    sim_stack_cleanup
}
trap cleanup EXIT

# start DIR DEVICES: a workload leading its own session; prints its pid once its data is on the GPUs.
# The caller's environment goes with it (CCM_SIM_FAULTS=... start ... gives it its own fault knobs).
start() {
    local dir=$1 devices=$2
    (
        close_inherited_fds
        exec setsid "$BIN/ccm-sample-workload" --dir "$dir" --mib 8 --devices "$devices" --rounds 4 </dev/null >"$dir.out" 2>&1
    ) &
    disown $!
    for _ in $(seq 200); do [ -s "$dir/ready" ] && break; sleep 0.05; done
    [ -s "$dir/ready" ] || fail "workload in $dir did not get ready"
    cat "$dir/ready" >>"$WORK/started"
    cat "$dir/ready"
}

# start_tree: one tree, a shell holding two workloads (w0 on GPU 0, w1 on GPU 1); prints the shell's pid.
# W0_FAULTS, W1_FAULTS: fault knobs of w0 or w1 alone (the process that serves a checkpoint call reads its
# own knobs). w1 starts after w0, so w0 has the lower pid and CRIU asks about it first.
start_tree() {
    (
        close_inherited_fds
        # shellcheck disable=SC2016 # the inner bash expands $0-$3 and $$
        exec setsid bash -c 'CCM_SIM_FAULTS="$2" "$0" --dir "$1/w0" --mib 8 --devices 0 --rounds 2 >"$1/w0.out" 2>&1 &
            sleep 0.2
            CCM_SIM_FAULTS="$3" "$0" --dir "$1/w1" --mib 8 --devices 1 --rounds 2 >"$1/w1.out" 2>&1 &
            wait' "$BIN/ccm-sample-workload" "$WORK" "${W0_FAULTS:-}" "${W1_FAULTS:-}" </dev/null >"$WORK/tree.out" 2>&1
    ) &
    local root=$!
    disown $root
    for _ in $(seq 200); do [ -s "$WORK/w0/ready" ] && [ -s "$WORK/w1/ready" ] && break; sleep 0.05; done
    { [ -s "$WORK/w0/ready" ] && [ -s "$WORK/w1/ready" ]; } || fail "tree did not get ready"
    cat "$WORK/w0/ready" "$WORK/w1/ready" >>"$WORK/started"
    echo "$root"
}

# start_plain: a process without CUDA (a shell loop); prints its pid.
start_plain() {
    (
        close_inherited_fds
        # shellcheck disable=SC2016 # the inner bash expands $0-$3 and $$
        exec setsid bash -c 'echo $$ >"$1.tmp" && mv "$1.tmp" "$1"; while :; do sleep 0.1; done' ccm-fault-loop "$WORK/plain.pid" \
            </dev/null >/dev/null 2>&1
    ) &
    disown $!
    for _ in $(seq 200); do [ -s "$WORK/plain.pid" ] && break; sleep 0.05; done
    [ -s "$WORK/plain.pid" ] || fail "plain process did not start"
    cat "$WORK/plain.pid" >>"$WORK/started"
    cat "$WORK/plain.pid"
}

# go DIR ROUND: lets the workload report and waits for its report (it must be RUNNING to answer).
go() {
    local dir=$1 k=$2
    : >"$dir/go$k"
    for _ in $(seq 200); do [ -e "$dir/done$k" ] && break; sleep 0.05; done
    [ -e "$dir/done$k" ] || fail "no report $k from $dir: the workload does not run"
}

# dump IMG PID [CRIU ARGS...]: runs criu dump; returns CRIU's exit status (never fails the script).
dump() {
    local img=$1 pid=$2
    shift 2
    mkdir -p "$img"
    local rc=0
    criu dump -t "$pid" -D "$img" --libdir "$WORK/plugins" -v4 -o dump.log "$@" || rc=$?
    return $rc
}
# dump_ok IMG PID: a dump that must succeed; waits until the dumped pids are free for the restore.
dump_ok() {
    dump "$1" "$2" || fail "criu dump failed"
    local core p
    for core in "$1"/core-*.img; do
        p=${core##*/core-}
        p=${p%.img}
        wait_gone "$p" || fail "pid $p survived criu dump"
    done
}
restore() { # IMG: returns CRIU's exit status
    local rc=0
    criu restore -d -D "$1" --libdir "$WORK/plugins" -v4 -o restore.log || rc=$?
    return $rc
}
wait_gone() { # PID: 0 once the pid no longer exists (10 s at most)
    for _ in $(seq 200); do [ -d "/proc/$1" ] || return 0; sleep 0.05; done
    return 1
}

# state PID: RUNNING, LOCKED, CHECKPOINTED (the double's CUDA state of a live process), GONE, or UNKNOWN.
state() {
    [ -d "/proc/$1" ] || { echo GONE; return; }
    local n
    n=$("$BIN/ccm-sim-ctl" "$1" state 2>/dev/null | sed -n 's/^CTL state=//p' | head -n1)
    case $n in
    0) echo RUNNING ;;
    1) echo LOCKED ;;
    2) echo CHECKPOINTED ;;
    *) echo UNKNOWN ;;
    esac
}
# expect_state PID STATE...: the process's state must be one of these; prints the STATE line.
expect_state() {
    local pid=$1 st
    shift
    st=$(state "$pid")
    echo "STATE pid=$pid $st"
    local want
    for want in "$@"; do [ "$st" = "$want" ] && return 0; done
    fail "pid $pid is $st, expected $*"
}
# seen LOG REGEX: the log must hold a line matching REGEX; prints it (without CRIU's timestamp) as SEEN.
seen() {
    local line
    line=$(grep -E -m1 -- "$2" "$1" 2>/dev/null) || fail "no line matching /$2/ in $1"
    echo "SEEN ${line#*) }"
}
# not_stuck_silently LOG PID...: a process left LOCKED or CHECKPOINTED must be named by an error line that
# says what to run.
not_stuck_silently() {
    local log=$1 pid st
    shift
    for pid in "$@"; do
        st=$(state "$pid")
        case $st in
        LOCKED | CHECKPOINTED)
            grep -qE "pid $pid .*criu-cuda-migrate recover --pid $pid" "$log" ||
                fail "pid $pid is left $st and $log has no line naming it with \`criu-cuda-migrate recover --pid $pid\`"
            ;;
        esac
    done
}
images_sum() { sha256sum "$1"/cuda-migrate-*.img | sha256sum; }
# dir_sum DIR: every entry's name, type, size, link target and (regular files only) content hash, never reading
# through a link or from a FIFO: what "the images are unchanged" means when an image is hostile.
dir_sum() {
    local f
    for f in "$1"/* "$1"/.[!.]*; do
        [ -e "$f" ] || [ -L "$f" ] || continue
        case ${f##*/} in *.log) continue ;; esac
        stat -c '%n %F %s %N' "$f"
        [ -f "$f" ] && [ ! -L "$f" ] && sha256sum <"$f"
    done | sha256sum
}
# no_agent_left: within 10 s, no driver agent of this run is left.
no_agent_left() {
    for _ in $(seq 200); do agent_alive_of "$WORK/state" || { echo "AGENTS none left"; return 0; }; sleep 0.05; done
    fail "a driver agent of this run is still there 10 s after CRIU ended"
}
# recover PID [ARGS...]: the CLI brings a process left LOCKED or CHECKPOINTED back to RUNNING.
# With --json: one document on stdout (the progress line goes to stderr) that says RUNNING after.
recover() {
    "$BIN/criu-cuda-migrate" --json recover --pid "$@" >"$WORK/recover-$1.json" 2>"$WORK/recover-$1.err" ||
        fail "criu-cuda-migrate recover --pid $1 failed: $(cat "$WORK/recover-$1.json" "$WORK/recover-$1.err")"
    { grep -q '"after":"RUNNING"' "$WORK/recover-$1.json" && grep -q '"ok":true' "$WORK/recover-$1.json"; } ||
        fail "recover --json of pid $1 does not say RUNNING and ok: $(cat "$WORK/recover-$1.json")"
    echo "RECOVER $(cat "$WORK/recover-$1.json") $(tr '\n' ';' <"$WORK/recover-$1.err")"
}
# refused_cleanly IMG PID SUM REGEX: a restore refused in preflight: CRIU fails, the refusal names the
# cause, nothing was restored and the images are byte-identical.
refused_cleanly() {
    local img=$1 pid=$2 sum=$3 why=$4
    if restore "$img"; then fail "restore was not refused"; fi
    seen "$img/restore.log" "restore refused before anything was restored: .*$why"
    [ -d "/proc/$pid" ] && fail "a refused restore left pid $pid behind"
    expect_state "$pid" GONE
    [ "$(images_sum "$img")" = "$sum" ] || fail "identity images changed after a refused restore"
}
# restore_works IMG PID DIR ROUND: a restore that must bring the workload back with its data and identity.
restore_works() {
    restore "$1" || fail "criu restore failed"
    expect_state "$2" RUNNING
    go "$3" "$4"
    check_agree "$3" "$4"
}

# both_run_on P0 P1: the tree's two workloads RUNNING, each reporting its data intact (after a refused dump).
both_run_on() {
    expect_state "$1" RUNNING
    expect_state "$2" RUNNING
    go "$WORK/w0" 1
    go "$WORK/w1" 1
    check_agree "$WORK/w0" 1
    check_agree "$WORK/w1" 1
}

# after_checkpoint_script kill|fail FILE: a CRIU action script that, at the first action after CHECKPOINT_DEVICES
# (network-lock; post-dump where there is none), kills CRIU (an ancestor, SIGKILL) or fails, which fails the dump.
after_checkpoint_script() {
    cat >"$2" <<SCRIPT
#!/bin/sh
case \$CRTOOLS_SCRIPT_ACTION in network-lock | post-dump) ;; *) exit 0 ;; esac
[ $1 = fail ] && exit 1
p=\$PPID
while [ "\$p" -gt 1 ]; do
    if [ "\$(cat "/proc/\$p/comm")" = criu ]; then kill -9 "\$p"; exit 0; fi
    p=\$(sed -n 's/^PPid:[[:space:]]*//p' "/proc/\$p/status")
done
exit 0
SCRIPT
    chmod +x "$2"
}

# flip_byte FILE OFFSET: adds one to the byte at OFFSET, in place.
flip_byte() {
    local b
    b=$(od -An -tu1 -j "$2" -N1 "$1" | tr -d ' ')
    printf '%b' "\\0$(printf '%03o' $(((b + 1) % 256)))" | dd of="$1" bs=1 seek="$2" conv=notrunc status=none
}

# flipped_page_file_refused PID REGEX: one byte of PID's page file in $WORK/img flipped, the restore fails with a line
# matching REGEX, the restored tree is gone and the images are as they were (the page file stays flipped).
flipped_page_file_refused() {
    local sum
    flip_byte "$WORK/img/cuda-migrate-pages-$1.img" 4096
    sum=$(images_sum "$WORK/img")
    if restore "$WORK/img"; then fail "a restore from a damaged page file succeeded"; fi
    seen "$WORK/img/restore.log" "$2"
    wait_gone "$1" || fail "pid $1 survived a restore whose page file was damaged"
    [ "$(images_sum "$WORK/img")" = "$sum" ] || fail "images changed after a refused restore"
}

# custom_storage_driver: the doubles' driver offers custom storage (CUDA 13.4).
custom_storage_driver() { sed -i 's/"cuda_driver_version":[0-9]*/"cuda_driver_version":13040/' "$WORK/gpus.json"; }

case $CASE in
lock-timeout)
    # The driver does not lock in time: PAUSE_DEVICES fails, CRIU aborts the dump, nothing changed.
    pid=$(start "$WORK/w0" 0,1)
    echo lock-timeout >"$WORK/state/faults"
    if dump "$WORK/img" "$pid" --timeout 2; then fail "the dump succeeded although the lock timed out"; fi
    rm -f "$WORK/state/faults"
    seen "$WORK/img/dump.log" "PAUSE_DEVICES\(pid $pid\) failed: .*CUDA_ERROR_NOT_READY"
    expect_state "$pid" RUNNING
    go "$WORK/w0" 1
    check_agree "$WORK/w0" 1
    ;;
checkpoint-fail-one-of-two | custom-storage-one-of-two)
    # One process of a two-process tree fails its checkpoint; the other was already checkpointed. On a driver with
    # custom storage (the second case) the other's device memory is in its page file: the rollback restores it from
    # there, and the failed one's unused page file goes.
    [ "$CASE" = custom-storage-one-of-two ] && custom_storage_driver
    root=$(W0_FAULTS=checkpoint-fail start_tree)
    p0=$(cat "$WORK/w0/ready")
    p1=$(cat "$WORK/w1/ready")
    if dump "$WORK/img" "$root"; then fail "the dump succeeded although a checkpoint failed"; fi
    seen "$WORK/img/dump.log" "CHECKPOINT_DEVICES\(pid $p0\) failed: .*CUDA_ERROR_UNKNOWN"
    if [ "$CASE" = custom-storage-one-of-two ]; then
        seen "$WORK/img/dump.log" "pid $p1: cuCheckpointProcessCheckpoint to custom storage"
        [ -e "$WORK/img/cuda-migrate-pages-$p0.img" ] && fail "pid $p0's unused page file was left"
    fi
    seen "$WORK/img/dump.log" "pid $p1: rolled back: cuCheckpointProcessRestore"
    expect_state "$p0" RUNNING
    expect_state "$p1" RUNNING
    [ -d "/proc/$root" ] || fail "the tree's root $root did not survive the failed dump"
    go "$WORK/w0" 1
    go "$WORK/w1" 1
    check_agree "$WORK/w0" 1
    check_agree "$WORK/w1" 1
    ;;
checkpoint-unsupported)
    # The driver answers NOT_SUPPORTED to the checkpoint, as driver 580 does for managed (UVM) memory (measured on
    # the GPU, tests/gpu/ipc-probe.sh): the dump fails, its line names managed memory, MPS and MIG and says the
    # process runs on, and the rollback unlocks it: RUNNING, data intact.
    pid=$(CCM_SIM_FAULTS=checkpoint-fail=801 start "$WORK/w0" 0,1)
    if dump "$WORK/img" "$pid"; then fail "the dump succeeded although the driver could not checkpoint"; fi
    seen "$WORK/img/dump.log" "CHECKPOINT_DEVICES\(pid $pid\) failed: .*CUDA_ERROR_NOT_SUPPORTED.*managed \(UVM\) memory.*MPS.*MIG.*put back to RUNNING"
    seen "$WORK/img/dump.log" "pid $pid: rolled back: unlocked, RUNNING again"
    expect_state "$pid" RUNNING
    go "$WORK/w0" 1
    check_agree "$WORK/w0" 1
    ;;
multi-process-refuse)
    # CRIU_CUDA_MIGRATE_MULTI_PROCESS=refuse and a tree of two CUDA processes: refused before any checkpoint (CUDA
    # IPC between them could not be restored, and nothing shows it from outside); no identity image; both
    # unlocked, RUNNING, data intact.
    root=$(start_tree)
    p0=$(cat "$WORK/w0/ready")
    p1=$(cat "$WORK/w1/ready")
    if CRIU_CUDA_MIGRATE_MULTI_PROCESS=refuse dump "$WORK/img" "$root"; then fail "the dump of two CUDA processes was not refused"; fi
    seen "$WORK/img/dump.log" "refused before any checkpoint \(CRIU_CUDA_MIGRATE_MULTI_PROCESS=refuse\): this dump holds 2 CUDA processes \(pids $p0, $p1\).*runs on"
    seen "$WORK/img/dump.log" "pid $p0: rolled back: unlocked, RUNNING again"
    seen "$WORK/img/dump.log" "pid $p1: rolled back: unlocked, RUNNING again"
    if compgen -G "$WORK/img/cuda-migrate-*.img" >/dev/null; then fail "a refused dump wrote an identity image"; fi
    expect_state "$p0" RUNNING
    expect_state "$p1" RUNNING
    [ -d "/proc/$root" ] || fail "the tree's root $root did not survive the refused dump"
    go "$WORK/w0" 1
    go "$WORK/w1" 1
    check_agree "$WORK/w0" 1
    check_agree "$WORK/w1" 1
    ;;
multi-process-unchecked)
    # The default (check) and a tree of two CUDA processes where the importer check cannot run (no kernel driver
    # under the test doubles): refused before any checkpoint, naming why and the setting that dumps them anyway;
    # no identity image; both unlocked, RUNNING, data intact (issue 41 part 1).
    unset CRIU_CUDA_MIGRATE_MULTI_PROCESS
    root=$(start_tree)
    p0=$(cat "$WORK/w0/ready")
    p1=$(cat "$WORK/w1/ready")
    if dump "$WORK/img" "$root"; then fail "the dump of two unchecked CUDA processes was not refused"; fi
    seen "$WORK/img/dump.log" "refused before any checkpoint: this dump holds 2 CUDA processes \(pids $p0, $p1\), and the importer check could not run \(the resource manager: .*\).*CRIU_CUDA_MIGRATE_MULTI_PROCESS=warn"
    seen "$WORK/img/dump.log" "pid $p0: rolled back: unlocked, RUNNING again"
    seen "$WORK/img/dump.log" "pid $p1: rolled back: unlocked, RUNNING again"
    if compgen -G "$WORK/img/cuda-migrate-*.img" >/dev/null; then fail "a refused dump wrote an identity image"; fi
    both_run_on "$p0" "$p1"
    ;;
multi-process-ipc-restore)
    # Two CUDA processes dumped with CRIU_CUDA_MIGRATE_MULTI_PROCESS=warn (the default, check, refuses them: the
    # multi-process-unchecked case), where the importer check cannot run (no kernel driver under the test
    # doubles): the dump says why, and what CUDA IPC would do. The driver's restore
    # then fails as an IPC importer's does on driver 580 (CUDA_ERROR_INVALID_VALUE, knob restore-fail=1): the line
    # names CUDA IPC as the likely cause and says what can and cannot be done; strict mode kills the tree; the
    # images are unchanged.
    root=$(start_tree)
    p0=$(cat "$WORK/w0/ready")
    p1=$(cat "$WORK/w1/ready")
    dump_ok "$WORK/img" "$root"
    # The test doubles have no kernel driver: the importer check cannot run, and the warning says why.
    seen "$WORK/img/dump.log" "this dump holds 2 CUDA processes \(pids $p0, $p1\), and the importer check could not run \(the resource manager: .*\)\. If one of them has another's device memory open through CUDA IPC.*unchecked.*CRIU_CUDA_MIGRATE_MULTI_PROCESS=refuse"
    sum=$(images_sum "$WORK/img")
    echo restore-fail=1 >"$WORK/state/faults"
    restore "$WORK/img" && rc=0 || rc=$?
    rm -f "$WORK/state/faults"
    [ "$rc" -ne 0 ] || fail "a restore whose driver restore failed succeeded"
    seen "$WORK/img/restore.log" "the driver's restore failed .*CUDA_ERROR_INVALID_VALUE.*likely cause: this is one of several CUDA processes .*CUDA IPC.*The images are intact: these images cannot be restored on driver 580"
    [ "$(images_sum "$WORK/img")" = "$sum" ] || fail "identity images changed"
    wait_gone "$p0" || fail "pid $p0 survived a failed driver restore in strict mode"
    wait_gone "$p1" || fail "pid $p1 survived a failed driver restore in strict mode"
    expect_state "$p0" GONE
    expect_state "$p1" GONE
    ;;
restore-fail)
    # The driver's restore fails (as when a GPU ran out of memory after the preflight). Strict mode:
    # the restored tree is killed, one error line says what to do, the images are intact, and the
    # same images restore once the cause is gone.
    pid=$(start "$WORK/w0" 0,1)
    dump_ok "$WORK/img" "$pid"
    sum=$(images_sum "$WORK/img")
    echo restore-fail >"$WORK/state/faults"
    restore "$WORK/img" && rc=0 || rc=$?
    rm -f "$WORK/state/faults"
    echo "CRIU restore rc=$rc"
    [ "$rc" -ne 0 ] || fail "a restore whose driver restore failed succeeded"
    seen "$WORK/img/restore.log" "pid $pid: the driver's restore failed .*strict mode kills the restored tree. The images are intact"
    [ "$(images_sum "$WORK/img")" = "$sum" ] || fail "identity images changed"
    for _ in $(seq 100); do [ -d "/proc/$pid" ] || break; sleep 0.05; done
    [ -d "/proc/$pid" ] && fail "pid $pid survived a failed driver restore in strict mode"
    restore "$WORK/img" || fail "the retry restore failed"
    go "$WORK/w0" 1
    check_agree "$WORK/w0" 1
    ;;
restore-fail-permissive)
    # Permissive mode: the process stays CHECKPOINTED with an error line naming the fix; the CLI's
    # recover brings it back.
    export CRIU_CUDA_MIGRATE_MODE=permissive
    pid=$(start "$WORK/w0" 0,1)
    dump_ok "$WORK/img" "$pid"
    sum=$(images_sum "$WORK/img")
    echo restore-fail >"$WORK/state/faults"
    restore "$WORK/img" && rc=0 || rc=$?
    rm -f "$WORK/state/faults"
    echo "CRIU restore rc=$rc"
    seen "$WORK/img/restore.log" "pid $pid is left CHECKPOINTED: .*criu-cuda-migrate recover --pid $pid"
    [ "$(images_sum "$WORK/img")" = "$sum" ] || fail "identity images changed"
    expect_state "$pid" CHECKPOINTED
    not_stuck_silently "$WORK/img/restore.log" "$pid"
    recover "$pid"
    expect_state "$pid" RUNNING
    go "$WORK/w0" 1
    check_agree "$WORK/w0" 1
    ;;
unlock-fail)
    pid=$(start "$WORK/w0" 0,1)
    dump_ok "$WORK/img" "$pid"
    echo unlock-fail >"$WORK/state/faults"
    restore "$WORK/img" && rc=0 || rc=$?
    rm -f "$WORK/state/faults"
    echo "CRIU restore rc=$rc"
    seen "$WORK/img/restore.log" "pid $pid is left LOCKED: .*criu-cuda-migrate recover --pid $pid"
    expect_state "$pid" LOCKED
    not_stuck_silently "$WORK/img/restore.log" "$pid"
    recover "$pid"
    expect_state "$pid" RUNNING
    go "$WORK/w0" 1
    check_agree "$WORK/w0" 1
    ;;
nvml-missing-dump)
    # NVML cannot be initialised in CRIU at dump.
    pid=$(start "$WORK/w0" 0,1)
    CCM_SIM_FAULTS=nvml-missing dump "$WORK/img" "$pid" && rc=0 || rc=$?
    echo "CRIU dump rc=$rc"
    seen "$WORK/img/dump.log" "NVML"
    if [ "$rc" = 0 ]; then
        # The dump went through: the restore must still bring the process back on its GPUs.
        wait_gone "$pid" || fail "pid $pid survived criu dump"
        sum=$(images_sum "$WORK/img")
        # The image recorded no GPU identity, so it cannot be migrated: a restore onto other GPUs is
        # refused in preflight, and one onto the same GPUs works.
        export CRIU_CUDA_MIGRATE_DEVICE_MAP="$G0=$G1,$G1=$G0"
        refused_cleanly "$WORK/img" "$pid" "$sum" ""
        unset CRIU_CUDA_MIGRATE_DEVICE_MAP
        restore_works "$WORK/img" "$pid" "$WORK/w0" 1
    else
        expect_state "$pid" RUNNING
        go "$WORK/w0" 1
        check_agree "$WORK/w0" 1
    fi
    ;;
nvml-missing-restore)
    pid=$(start "$WORK/w0" 0,1)
    dump_ok "$WORK/img" "$pid"
    sum=$(images_sum "$WORK/img")
    export CCM_SIM_FAULTS=nvml-missing
    refused_cleanly "$WORK/img" "$pid" "$sum" "NVML"
    unset CCM_SIM_FAULTS
    restore_works "$WORK/img" "$pid" "$WORK/w0" 1
    ;;
libcuda-missing-dump)
    # No libcuda for CRIU: the plugin disables itself and a plain process dumps and restores as before.
    pid=$(start_plain)
    export CRIU_CUDA_MIGRATE_LIBCUDA=$WORK/no-such-dir/libcuda.so.1
    dump "$WORK/img" "$pid" || fail "dump of a plain process failed without libcuda"
    seen "$WORK/img/dump.log" "criu-cuda-migrate: disabled: .*libcuda"
    ls "$WORK"/img/cuda-migrate-*.img >/dev/null 2>&1 && fail "an identity image was written for a plain process"
    wait_gone "$pid" || fail "pid $pid survived criu dump"
    restore "$WORK/img" || fail "restore of a plain process failed without libcuda"
    [ -d "/proc/$pid" ] || fail "plain process $pid was not restored"
    echo "STATE pid=$pid ALIVE (no CUDA)"
    ;;
libcuda-missing-restore)
    pid=$(start "$WORK/w0" 0,1)
    dump_ok "$WORK/img" "$pid"
    sum=$(images_sum "$WORK/img")
    export CRIU_CUDA_MIGRATE_LIBCUDA=$WORK/no-such-dir/libcuda.so.1
    refused_cleanly "$WORK/img" "$pid" "$sum" "libcuda"
    unset CRIU_CUDA_MIGRATE_LIBCUDA
    restore_works "$WORK/img" "$pid" "$WORK/w0" 1
    ;;
image-missing)
    # The identity image is lost between dump and restore.
    pid=$(start "$WORK/w0" 0,1)
    dump_ok "$WORK/img" "$pid"
    mv "$WORK/img/cuda-migrate-$pid.img" "$WORK/saved.img"
    if restore "$WORK/img"; then
        echo "CRIU restore rc=0"
        not_stuck_silently "$WORK/img/restore.log" "$pid"
        expect_state "$pid" RUNNING GONE
    else
        seen "$WORK/img/restore.log" "restore refused before anything was restored: .*cuda-migrate"
        expect_state "$pid" GONE
    fi
    ;;
image-missing-one-of-two)
    # Two CUDA processes, one identity image gone (a checkpoint image's whiteout deletes one at unpack; issue 35):
    # strict mode kills the restored tree, its line naming the image and the permissive escape; the images stay as
    # they were, and the same images restore in permissive mode, that process onto its own GPUs with a warning.
    # Dumped with CRIU writing the staging pages: with the plugin's page file the missing image held the table
    # without which that process's device data cannot be put back, and every restore refuses it (checked below).
    root=$(start_tree)
    p0=$(cat "$WORK/w0/ready")
    p1=$(cat "$WORK/w1/ready")
    CRIU_CUDA_MIGRATE_STAGING=criu dump_ok "$WORK/img" "$root"
    mv "$WORK/img/cuda-migrate-$p1.img" "$WORK/saved.img"
    sum=$(images_sum "$WORK/img")
    restore "$WORK/img" && rc=0 || rc=$?
    echo "CRIU restore rc=$rc"
    [ "$rc" -ne 0 ] || fail "a strict restore of a CUDA process without its identity image succeeded"
    seen "$WORK/img/restore.log" "pid $p1: CHECKPOINTED CUDA process without identity image \(cuda-migrate-$p1.img is not in the image directory\).*strict mode kills the restored tree.*CRIU_CUDA_MIGRATE_MODE=permissive"
    seen "$WORK/img/restore.log" "killed the restored tree .*because pid\(s\) \[$p1\]"
    for p in "$p0" "$p1"; do wait_gone "$p" || fail "pid $p survived the strict restore's kill"; done
    [ "$(images_sum "$WORK/img")" = "$sum" ] || fail "identity images changed"
    CRIU_CUDA_MIGRATE_MODE=permissive restore "$WORK/img" || fail "the permissive restore failed"
    seen "$WORK/img/restore.log" "pid $p1: CHECKPOINTED CUDA process without identity image \(cuda-migrate-$p1.img\); restoring it onto the same GPUs, unchecked \(permissive mode\)"
    both_run_on "$p0" "$p1"
    ;;
image-truncated | image-newer-version)
    pid=$(start "$WORK/w0" 0,1)
    dump_ok "$WORK/img" "$pid"
    img=$WORK/img/cuda-migrate-$pid.img
    cp -p "$img" "$WORK/good.img"
    if [ "$CASE" = image-truncated ]; then
        truncate -s 100 "$img"
        why="truncated.*re-dump"
    else
        # Format version (u16 LE at offset 8) = 9: read before the checksum, so no CRC fix-up is needed.
        printf '\011\000' | dd of="$img" bs=1 seek=8 conv=notrunc status=none
        why="format version 9 is newer than this build of criu-cuda-migrate reads.*upgrade criu-cuda-migrate"
    fi
    sum=$(images_sum "$WORK/img")
    refused_cleanly "$WORK/img" "$pid" "$sum" "$why"
    # Put the good image back: the same directory restores.
    cp -p "$WORK/good.img" "$img"
    restore_works "$WORK/img" "$pid" "$WORK/w0" 1
    ;;
staging-page-file-cut | staging-page-file-flipped)
    # Issue 47: the plugin's page file (the driver's staging pages) is untrusted at restore. Cut, the preflight
    # refuses it before CRIU restores anything; one byte flipped, the fill finds the chunk's CRC32 wrong and the
    # restored tree is killed before the driver's restore. Either way the images stay as they were, and the whole
    # file put back restores the process with its device data intact.
    pid=$(start "$WORK/w0" 0,1)
    dump_ok "$WORK/img" "$pid"
    pages=$WORK/img/cuda-migrate-pages-$pid.img
    [ -s "$pages" ] || fail "no page file written: $(grep -a staging "$WORK/img/dump.log")"
    seen "$WORK/img/dump.log" "pid $pid: staging pages: .* cuda-migrate-pages-$pid.img"
    cp -p "$pages" "$WORK/good-pages.img"
    if [ "$CASE" = staging-page-file-cut ]; then
        truncate -s -4096 "$pages"
        sum=$(images_sum "$WORK/img")
        refused_cleanly "$WORK/img" "$pid" "$sum" "staging pages are in .*cuda-migrate-pages-$pid.img, but it is [0-9]+ bytes where the table names"
    else
        flipped_page_file_refused "$pid" "pid $pid: its staging pages cannot be filled back from its page file: .*CRC32"
    fi
    cp -p "$WORK/good-pages.img" "$pages"
    restore_works "$WORK/img" "$pid" "$WORK/w0" 1
    ;;
map-unknown-gpu)
    pid=$(start "$WORK/w0" 0,1)
    dump_ok "$WORK/img" "$pid"
    sum=$(images_sum "$WORK/img")
    export CRIU_CUDA_MIGRATE_DEVICE_MAP="$G0=$UNKNOWN_GPU,$G1=$G0"
    refused_cleanly "$WORK/img" "$pid" "$sum" "$UNKNOWN_GPU"
    unset CRIU_CUDA_MIGRATE_DEVICE_MAP
    restore_works "$WORK/img" "$pid" "$WORK/w0" 1
    ;;
sites-moved-strict | sites-moved-permissive)
    # The memory the dump recorded no longer holds GPU 0's PCI words: every copy of them is overwritten in
    # CRIU's page images between dump and restore. A swap restore cannot reconcile GPU 0.
    pid=$(start "$WORK/w0" 0,1)
    dump_ok "$WORK/img" "$pid"
    sum=$(images_sum "$WORK/img")
    # G0's six words {0, 6, 0, 0, 0x233510de, 0x18bf10de}, little endian; the bus becomes 0x66.
    n=$(perl -e '
        my $old = pack("V6", 0, 6, 0, 0, 0x233510de, 0x18bf10de);
        my $new = pack("V6", 0, 0x66, 0, 0, 0x233510de, 0x18bf10de);
        my $n = 0;
        for my $f (@ARGV) {
            open(my $h, "+<:raw", $f) or die "$f: $!";
            my $d = do { local $/; <$h> };
            my $c = ($d =~ s/\Q$old\E/$new/g) || 0;
            if ($c) { seek($h, 0, 0) or die; print $h $d or die; }
            close($h) or die;
            $n += $c;
        }
        print $n;' "$WORK"/img/pages-*.img)
    [ "$n" -gt 0 ] || fail "found no copy of GPU 0's PCI words in the page images"
    echo "CORRUPTED $n copies of GPU 0's PCI words"
    export CRIU_CUDA_MIGRATE_DEVICE_MAP="$G0=$G1,$G1=$G0"
    if [ "$CASE" = sites-moved-strict ]; then
        if restore "$WORK/img"; then fail "strict mode restored a process whose identity is inconsistent"; fi
        seen "$WORK/img/restore.log" "pid $pid: GPU identity is inconsistent after restore: "
        seen "$WORK/img/restore.log" "killed the restored tree \(1 process\(es\)\) because pid\(s\) \[$pid\] failed"
        wait_gone "$pid" || true
        expect_state "$pid" GONE
    else
        export CRIU_CUDA_MIGRATE_MODE=permissive
        restore "$WORK/img" || fail "permissive mode failed the restore"
        seen "$WORK/img/restore.log" "pid $pid: GPU identity is inconsistent after restore \(permissive mode: it resumes anyway\)"
        expect_state "$pid" RUNNING
        go "$WORK/w0" 1
        grep -q '"all_data_ok": *true' "$WORK/w0/report1.json" || fail "data not intact"
    fi
    [ "$(images_sum "$WORK/img")" = "$sum" ] || fail "identity images changed"
    ;;
criu-killed-mid-dump)
    # CRIU dies (SIGKILL) between dump hooks: PAUSE_DEVICES has locked w0 and waits for w1's lock (w1's
    # restore thread never answers). The driver agent sees CRIU's end of its socket close and puts back
    # what it locked itself: once CRIU is gone its tasks are no longer traced, so w0's restore thread
    # answers the unlock. Its lines land in CRIU's dump.log. `recover` afterwards finds nothing to do.
    root=$(W1_FAULTS=restore-thread-stall start_tree)
    p0=$(cat "$WORK/w0/ready")
    p1=$(cat "$WORK/w1/ready")
    mkdir -p "$WORK/img"
    criu dump -t "$root" -D "$WORK/img" --libdir "$WORK/plugins" -v4 -o dump.log &
    criu_pid=$!
    for _ in $(seq 400); do grep -q "pid $p0: CUDA process, restore thread" "$WORK/img/dump.log" 2>/dev/null && break; sleep 0.05; done
    grep -q "pid $p0: CUDA process, restore thread" "$WORK/img/dump.log" || fail "CRIU never locked pid $p0"
    sleep 0.3
    grep -q "cuCheckpointProcessLock" <(grep "pid $p1" "$WORK/img/dump.log") && fail "pid $p1 was locked: the stall did not hold"
    kill -9 "$criu_pid"
    wait "$criu_pid" 2>/dev/null || true
    for p in "$root" "$p0" "$p1"; do
        for _ in $(seq 100); do grep -q "^TracerPid:[[:space:]]*0$" "/proc/$p/status" && break; sleep 0.05; done
        grep -q "^TracerPid:[[:space:]]*0$" "/proc/$p/status" || fail "pid $p is still traced after CRIU died"
    done
    for _ in $(seq 600); do [ "$(state "$p0")" = RUNNING ] && break; sleep 0.05; done
    expect_state "$p0" RUNNING
    seen "$WORK/img/dump.log" "driver agent: pid $p0: unlocked, RUNNING again after CRIU went away"
    # w1's stalled lock ends with the double's call timeout; whatever it did, the agent undoes it.
    # (The root has no pgrep.) The agent waits for w1's stalled lock to end (the double's call timeout) and
    # undoes it too; then it exits.
    # Only this run's agent: it inherited CRIU's environment, which names this run's state directory.
    for _ in $(seq 1200); do agent_alive_of "$WORK/state" || break; sleep 0.05; done
    agent_alive_of "$WORK/state" && fail "the driver agent outlived CRIU by more than 60 s"
    expect_state "$p1" RUNNING
    recover "$p0"
    expect_state "$p0" RUNNING
    go "$WORK/w0" 1
    go "$WORK/w1" 1
    check_agree "$WORK/w0" 1
    check_agree "$WORK/w1" 1
    ;;
criu-killed-after-release | custom-storage-criu-killed)
    # Issue 47: CRIU dies (SIGKILL, from its own network-lock action script) after CHECKPOINT_DEVICES: the process is
    # CHECKPOINTED and its staging pages are in the page file and released in the task. The driver agent, told where
    # the page file is before the release, fills the pages back, then restores and unlocks the process: RUNNING with
    # its device data as before the dump. With custom storage (the second case) the agent restores the process from
    # the page file it wrote itself.
    [ "$CASE" = custom-storage-criu-killed ] && custom_storage_driver
    pid=$(start "$WORK/w0" 0,1)
    after_checkpoint_script kill "$WORK/kill-criu.sh"
    dump "$WORK/img" "$pid" --action-script "$WORK/kill-criu.sh" && fail "the dump whose CRIU was killed succeeded"
    if [ "$CASE" = criu-killed-after-release ]; then
        seen "$WORK/img/dump.log" "pid $pid: staging pages: .* released in"
        what="staging pages"
    else
        what="device memory"
    fi
    for _ in $(seq 100); do grep -q "^TracerPid:[[:space:]]*0$" "/proc/$pid/status" && break; sleep 0.05; done
    for _ in $(seq 600); do [ "$(state "$pid")" = RUNNING ] && break; sleep 0.05; done
    expect_state "$pid" RUNNING
    seen "$WORK/img/dump.log" "driver agent: pid $pid: [0-9]+ MiB of $what filled back from .*cuda-migrate-pages-$pid.img"
    seen "$WORK/img/dump.log" "driver agent: pid $pid: unlocked, RUNNING again after CRIU went away"
    go "$WORK/w0" 1
    check_agree "$WORK/w0" 1
    ;;
criu-killed-mid-restore)
    # CRIU dies (SIGKILL) during a restore, while the driver's restore of the process runs (`restore-slow`). The
    # driver agent lets that restore end, then kills the half-restored process (CRIU never finished it) and says so
    # in restore.log; nothing stays LOCKED, the images are intact and restore again.
    pid=$(start "$WORK/w0" 0,1)
    dump_ok "$WORK/img" "$pid"
    sum=$(images_sum "$WORK/img")
    echo restore-slow=1500 >"$WORK/state/faults"
    criu restore -d -D "$WORK/img" --libdir "$WORK/plugins" -v4 -o restore.log &
    criu_pid=$!
    for _ in $(seq 400); do grep -q "pid $pid: driver restore started" "$WORK/img/restore.log" 2>/dev/null && break; sleep 0.02; done
    grep -q "pid $pid: driver restore started" "$WORK/img/restore.log" || fail "the driver's restore of pid $pid never started"
    sleep 0.2
    kill -9 "$criu_pid" 2>/dev/null || fail "CRIU ended before it could be killed (the restore-slow knob did not hold)"
    wait "$criu_pid" 2>/dev/null || true
    rm -f "$WORK/state/faults"
    for _ in $(seq 200); do [ -d "/proc/$pid" ] || break; sleep 0.05; done
    [ -d "/proc/$pid" ] && fail "the half-restored pid $pid is still there after CRIU died"
    seen "$WORK/img/restore.log" "pid $pid: CRIU went away during its restore, after the driver had restored it but before the unlock; killed it .*restore again from them"
    [ "$(images_sum "$WORK/img")" = "$sum" ] || fail "identity images changed"
    restore "$WORK/img" || fail "the restore after the killed one failed"
    go "$WORK/w0" 1
    check_agree "$WORK/w0" 1
    ;;
newer-driver)
    # The restore node's driver is newer than this build knows (CUDA 14.0): its CUcheckpointRestoreArgs may
    # differ, so a migration is refused in preflight (images intact); a restore onto the same GPUs still works.
    pid=$(start "$WORK/w0" 0,1)
    dump_ok "$WORK/img" "$pid"
    sum=$(images_sum "$WORK/img")
    sed -i 's/"cuda_driver_version":13000/"cuda_driver_version":14000/' "$WORK/gpus.json"
    export CRIU_CUDA_MIGRATE_DEVICE_MAP="$G0=$G1,$G1=$G0"
    refused_cleanly "$WORK/img" "$pid" "$sum" "CUDA API 14.0 is newer than this build"
    unset CRIU_CUDA_MIGRATE_DEVICE_MAP
    restore_works "$WORK/img" "$pid" "$WORK/w0" 1
    ;;
leave-running)
    pid=$(start "$WORK/w0" 0,1)
    dump "$WORK/img" "$pid" --leave-running || fail "criu dump --leave-running failed"
    [ -f "$WORK/img/cuda-migrate-$pid.img" ] || fail "no identity image written"
    seen "$WORK/img/dump.log" "rolling back 1 CUDA process\(es\): --leave-running"
    expect_state "$pid" RUNNING
    go "$WORK/w0" 1
    check_agree "$WORK/w0" 1
    ;;
agent-stop-lock | agent-kill-lock | agent-stop-checkpoint | agent-kill-checkpoint)
    # The driver agent stops (SIGSTOP) or dies (SIGKILL) right after it asked the driver to lock or checkpoint
    # (a caller knob of the double: the target goes on with the call). The plugin's deadline (CRIU's --timeout 2 +
    # 10 s for the lock, CRIU_CUDA_MIGRATE_DRIVER_TIMEOUT=3 for the checkpoint) or the closed socket ends the wait:
    # the agent is killed, the hook fails, and at exit(DUMP) a fresh agent reads the state the driver reports and
    # puts the process back: RUNNING, with one ERROR line naming what happened, and no agent left.
    how=${CASE#agent-}
    sig=${how%%-*}
    call=${how#*-}
    pid=$(start "$WORK/w0" 0,1)
    echo "agent-$sig=$call" >"$WORK/state/faults"
    export CRIU_CUDA_MIGRATE_DRIVER_TIMEOUT=3
    t0=$SECONDS
    if dump "$WORK/img" "$pid" --timeout 2; then fail "the dump succeeded although its driver agent was lost"; fi
    echo "DUMP failed after $((SECONDS - t0)) s"
    [ $((SECONDS - t0)) -le 40 ] || fail "the dump took $((SECONDS - t0)) s to fail"
    rm -f "$WORK/state/faults"
    case $sig in
    stop) seen "$WORK/img/dump.log" "Error: the driver agent \(pid [0-9]+\) did not answer cuCheckpointProcess(Lock|Checkpoint) for pid $pid within [0-9.]+ s \(stopped or hung\); it was killed" ;;
    kill) seen "$WORK/img/dump.log" "Error: the driver agent \(pid [0-9]+, the helper process that makes the plugin's driver calls\) is gone" ;;
    esac
    seen "$WORK/img/dump.log" "the driver agent was lost: starting a fresh one to put the processes back"
    seen "$WORK/img/dump.log" "pid $pid: rolling back from CUDA state (LOCKED|CHECKPOINTED)"
    seen "$WORK/img/dump.log" "pid $pid: rolled back: unlocked, RUNNING again"
    expect_state "$pid" RUNNING
    not_stuck_silently "$WORK/img/dump.log" "$pid"
    no_agent_left
    go "$WORK/w0" 1
    check_agree "$WORK/w0" 1
    ;;
agent-stop-restore | agent-kill-restore)
    # The same during the driver's restore: the restored tree is killed (CRIU never finished it and its CUDA state
    # is unknown), the images are intact, no agent is left, and the same images restore.
    sig=${CASE#agent-}
    sig=${sig%%-*}
    pid=$(start "$WORK/w0" 0,1)
    dump_ok "$WORK/img" "$pid"
    sum=$(images_sum "$WORK/img")
    echo "agent-$sig=restore" >"$WORK/state/faults"
    export CRIU_CUDA_MIGRATE_DRIVER_TIMEOUT=3
    t0=$SECONDS
    restore "$WORK/img" && rc=0 || rc=$?
    echo "CRIU restore rc=$rc after $((SECONDS - t0)) s"
    rm -f "$WORK/state/faults"
    [ $((SECONDS - t0)) -le 30 ] || fail "the restore took $((SECONDS - t0)) s"
    seen "$WORK/img/restore.log" "pid $pid: the driver agent \(pid [0-9]+.*, during the driver's restore; its CUDA state is unknown, so the restored tree is killed. The images are intact: restore again"
    seen "$WORK/img/restore.log" "killed the restored tree \(1 process\(es\)\)"
    wait_gone "$pid" || fail "pid $pid survived the loss of its driver agent during its restore"
    expect_state "$pid" GONE
    [ "$(images_sum "$WORK/img")" = "$sum" ] || fail "identity images changed"
    no_agent_left
    unset CRIU_CUDA_MIGRATE_DRIVER_TIMEOUT
    restore_works "$WORK/img" "$pid" "$WORK/w0" 1
    ;;
agent-panic-lock | agent-panic-checkpoint)
    # The driver agent panics while it answers the lock or the checkpoint (the test build's failpoint, before the
    # driver is called): the panic becomes an error reply, the hook fails at once, the same agent puts the process
    # back at exit(DUMP), and it exits as usual.
    call=${CASE#agent-panic-}
    [ "$call" = lock ] && name=cuCheckpointProcessLock || name=cuCheckpointProcessCheckpoint
    pid=$(start "$WORK/w0" 0,1)
    t0=$SECONDS
    if CCM_AGENT_FAILPOINT="panic:$name" dump "$WORK/img" "$pid"; then fail "the dump succeeded although its driver agent panicked"; fi
    echo "DUMP failed after $((SECONDS - t0)) s"
    [ $((SECONDS - t0)) -le 20 ] || fail "the dump took $((SECONDS - t0)) s to fail"
    seen "$WORK/img/dump.log" "Error: .*internal error while answering $name for pid $pid: failpoint panic:$name; this is a bug in criu-cuda-migrate, please report it with this log"
    expect_state "$pid" RUNNING
    not_stuck_silently "$WORK/img/dump.log" "$pid"
    no_agent_left
    go "$WORK/w0" 1
    check_agree "$WORK/w0" 1
    ;;
agent-panic-restore)
    # The same while it answers the driver's restore: the restore fails as a failed driver restore does (strict mode
    # kills the restored tree), the images are intact, and the same images restore.
    pid=$(start "$WORK/w0" 0,1)
    dump_ok "$WORK/img" "$pid"
    sum=$(images_sum "$WORK/img")
    t0=$SECONDS
    CCM_AGENT_FAILPOINT=panic:cuCheckpointProcessRestore restore "$WORK/img" && rc=0 || rc=$?
    echo "CRIU restore rc=$rc after $((SECONDS - t0)) s"
    [ $((SECONDS - t0)) -le 20 ] || fail "the restore took $((SECONDS - t0)) s"
    seen "$WORK/img/restore.log" "internal error while answering cuCheckpointProcessRestore for pid $pid: failpoint panic:cuCheckpointProcessRestore"
    seen "$WORK/img/restore.log" "killed the restored tree \(1 process\(es\)\)"
    wait_gone "$pid" || fail "pid $pid survived a failed driver restore in strict mode"
    expect_state "$pid" GONE
    [ "$(images_sum "$WORK/img")" = "$sum" ] || fail "identity images changed"
    no_agent_left
    restore_works "$WORK/img" "$pid" "$WORK/w0" 1
    ;;
image-symlink-zero | image-fifo | image-symlink-secret | image-oversized | image-control | image-pid-renamed)
    # A hostile identity image: a link to /dev/zero (read until out of memory before), a FIFO (hung for ever
    # before), a link to a secret file (its first bytes were printed before), a 17 MiB file, a driver version with ESC,
    # CR and LF that would forge a line of restore.log, an image renamed to another pid. Each: the restore is
    # refused in the plugin's init within seconds, the line names the file and the rule, no foreign byte is
    # printed, the directory is unchanged, and with the good image back the same directory restores.
    pid=$(start "$WORK/w0" 0,1)
    dump_ok "$WORK/img" "$pid"
    img=$WORK/img/cuda-migrate-$pid.img
    mv "$img" "$WORK/good.img"
    case $CASE in
    image-symlink-zero) ln -s /dev/zero "$img"; why="identity image: .*cuda-migrate-$pid.img is a symbolic link" ;;
    image-fifo) mkfifo "$img"; why="identity image: .*cuda-migrate-$pid.img is a FIFO, not a regular file" ;;
    image-symlink-secret)
        echo "TOPSECRET-0123456789" >"$WORK/secret"
        ln -s "$WORK/secret" "$img"
        why="identity image: .*cuda-migrate-$pid.img is a symbolic link"
        ;;
    image-oversized)
        cp "$WORK/good.img" "$img"
        truncate -s 17M "$img"
        why="identity image: .*cuda-migrate-$pid.img is larger than 16777216 bytes"
        ;;
    image-control)
        cp "$WORK/good.img" "$img"
        # The driver version string (after the hostname: u32 length at offset 32, its bytes from 36, then the
        # version's u32 length and bytes) overwritten in place with ESC, CR and LF, then the CRC32 trailer recomputed
        # (gzip's trailer holds the same CRC-32 of its input).
        perl -e 'open(my $h, "+<:raw", $ARGV[0]) or die; local $/; my $d = <$h>; my $at = 36 + unpack("V", substr($d, 32, 4));
            my $n = unpack("V", substr($d, $at, 4)); die "driver version too short" if $n < 4;
            substr($d, $at + 4, $n) = substr(("\e[2J\r\ncriu-cuda-migrate: Error: forged ") x 40, 0, $n);
            seek($h, 0, 0); print $h $d; close($h) or die' "$img"
        body=$(($(stat -c %s "$img") - 4))
        head -c "$body" "$img" | gzip -c | tail -c 8 | head -c 4 | dd of="$img" bs=1 seek="$body" conv=notrunc status=none
        why="identity image .*cuda-migrate-$pid.img: identity image field .driver_version. holds a control character"
        ;;
    image-pid-renamed)
        cp "$WORK/good.img" "$WORK/img/cuda-migrate-$((pid + 1)).img"
        cp "$WORK/good.img" "$img"
        why="identity image .*cuda-migrate-$((pid + 1)).img holds pid $pid, but its name says pid $((pid + 1))"
        ;;
    esac
    sum=$(dir_sum "$WORK/img")
    t0=$(date +%s%N)
    if restore "$WORK/img"; then fail "a restore with a hostile identity image was not refused"; fi
    took=$((($(date +%s%N) - t0) / 1000000))
    echo "REFUSED after $took ms"
    [ "$took" -le 10000 ] || fail "the refusal took $took ms"
    seen "$WORK/img/restore.log" "restore refused before anything was restored: $why"
    grep -q "TOPSECRET" "$WORK/img/restore.log" && fail "restore.log shows the secret file's bytes"
    grep -q $'\e' "$WORK/img/restore.log" && fail "restore.log holds a raw ESC"
    grep -q "^criu-cuda-migrate: Error: forged" "$WORK/img/restore.log" && fail "restore.log holds a forged line"
    [ "$(dir_sum "$WORK/img")" = "$sum" ] || fail "the image directory changed"
    expect_state "$pid" GONE
    rm -f "$img" "$WORK/img/cuda-migrate-$((pid + 1)).img"
    cp -p "$WORK/good.img" "$img"
    restore_works "$WORK/img" "$pid" "$WORK/w0" 1
    ;;
setting-disable-unknown)
    # CRIU_CUDA_MIGRATE_DISABLE=y (neither 1 nor 0): the plugin refuses it in init, naming the variable, rather
    # than staying on (as before); the dump fails and the process runs on untouched.
    pid=$(start "$WORK/w0" 0,1)
    export CRIU_CUDA_MIGRATE_DISABLE=y
    if dump "$WORK/img" "$pid"; then fail "the dump went through with CRIU_CUDA_MIGRATE_DISABLE=y"; fi
    unset CRIU_CUDA_MIGRATE_DISABLE
    seen "$WORK/img/dump.log" "configuration: CRIU_CUDA_MIGRATE_DISABLE=\"y\" is not valid: expected .on. or .off."
    expect_state "$pid" RUNNING
    go "$WORK/w0" 1
    check_agree "$WORK/w0" 1
    ;;
custom-storage)
    # The driver's custom storage (CUDA 13.4, driver r615; here the doubles'): the driver agent copies the device
    # memory into the page file itself, the process keeps none. A --leave-running dump puts it back from there:
    # RUNNING with its data (a dump that fails after the checkpoint: custom-storage-one-of-two); where that
    # put-back fails, `recover --images` does it. A flipped byte is refused before the driver's restore is called, a node whose driver has no custom storage is
    # refused by the preflight, the images unchanged both times; then the process moves onto the other GPUs.
    custom_storage_driver
    pid=$(start "$WORK/w0" 0,1)
    dump "$WORK/lr" "$pid" --leave-running || fail "criu dump --leave-running failed"
    seen "$WORK/lr/dump.log" "pid $pid: cuCheckpointProcessCheckpoint to custom storage .* 2 region\(s\), 16 MiB of device memory"
    seen "$WORK/lr/dump.log" "pid $pid: rolled back: cuCheckpointProcessRestore"
    expect_state "$pid" RUNNING
    go "$WORK/w0" 1
    check_agree "$WORK/w0" 1
    # The put-back's restore fails: the process stays CHECKPOINTED, its line names `recover --images`, which
    # restores it from the page file once the cause is gone.
    echo restore-fail >"$WORK/state/faults"
    dump "$WORK/lr2" "$pid" --leave-running || fail "criu dump --leave-running failed"
    rm -f "$WORK/state/faults"
    expect_state "$pid" CHECKPOINTED
    seen "$WORK/lr2/dump.log" "pid $pid is left CHECKPOINTED: .*run .criu-cuda-migrate recover --pid $pid --images $WORK/lr2."
    recover "$pid" --images "$WORK/lr2"
    expect_state "$pid" RUNNING
    go "$WORK/w0" 2
    check_agree "$WORK/w0" 2
    dump_ok "$WORK/img" "$pid"
    pages=$WORK/img/cuda-migrate-pages-$pid.img
    [ -s "$pages" ] || fail "no page file written: $(grep -a custom "$WORK/img/dump.log")"
    grep -q "staging pages:" "$WORK/img/dump.log" && fail "the staging path ran beside the custom storage"
    cp -p "$pages" "$WORK/good-pages.img"
    flipped_page_file_refused "$pid" "pid $pid: .*differs from its checksum .*the driver was not called"
    cp -p "$WORK/good-pages.img" "$pages"
    sum=$(images_sum "$WORK/img")
    sed -i 's/"cuda_driver_version":13040/"cuda_driver_version":13000/' "$WORK/gpus.json"
    refused_cleanly "$WORK/img" "$pid" "$sum" "checkpointed through the driver's custom storage .* offers CUDA 13.0"
    custom_storage_driver
    export CRIU_CUDA_MIGRATE_DEVICE_MAP="$G0=$G1,$G1=$G0"
    restore_works "$WORK/img" "$pid" "$WORK/w0" 3
    unset CRIU_CUDA_MIGRATE_DEVICE_MAP
    seen "$WORK/img/restore.log" "pid $pid: cuCheckpointProcessRestore from custom storage \(its page file\) with 2 pair\(s\)"
    [ "$(ordinal_uuid "$WORK/w0/report3.json" 0)" = "$G1" ] || fail "ordinal 0 not moved onto $G1"
    ;;
post-dump-fails | custom-storage-post-dump-fails)
    # CRIU's post-dump action script fails after a dump whose exit hook was told it succeeded: CRIU then resumes the
    # tasks instead of ending them, CHECKPOINTED (their staging pages released, or their device memory in the page
    # file of the driver's custom storage). The driver agent, handed the processes at the hook, stays until CRIU is
    # gone and puts them back: RUNNING with their device data.
    [ "$CASE" = custom-storage-post-dump-fails ] && custom_storage_driver
    pid=$(start "$WORK/w0" 0,1)
    after_checkpoint_script fail "$WORK/fail-post-dump.sh"
    dump "$WORK/img" "$pid" --action-script "$WORK/fail-post-dump.sh" && fail "the dump whose post-dump script failed succeeded"
    seen "$WORK/img/dump.log" "dump done; 1 CUDA process\(es\) stay checkpointed for CRIU to end them"
    for _ in $(seq 600); do [ "$(state "$pid")" = RUNNING ] && break; sleep 0.05; done
    expect_state "$pid" RUNNING
    seen "$WORK/img/dump.log" "pid $pid: CRIU resumed it after a dump it had called successful"
    what="staging pages"
    [ "$CASE" = custom-storage-post-dump-fails ] && what="device memory"
    seen "$WORK/img/dump.log" "driver agent: pid $pid: [0-9]+ MiB of $what filled back"
    seen "$WORK/img/dump.log" "driver agent: pid $pid: unlocked, RUNNING again after CRIU went away"
    no_agent_left
    go "$WORK/w0" 1
    check_agree "$WORK/w0" 1
    ;;
leave-stopped)
    # `criu dump --leave-stopped`: the dump succeeds and CRIU leaves the task stopped, CHECKPOINTED, its staging pages
    # released. The driver agent fills them back into the stopped task and names `recover`, which, once the task is
    # continued, brings it back RUNNING with its device data.
    pid=$(start "$WORK/w0" 0,1)
    dump "$WORK/img" "$pid" --leave-stopped || fail "criu dump --leave-stopped failed"
    for _ in $(seq 200); do grep -q "pid $pid is left stopped" "$WORK/img/dump.log" && break; sleep 0.05; done
    seen "$WORK/img/dump.log" "pid $pid is left stopped and CHECKPOINTED after the dump .*: its [0-9]+ MiB of staging pages are back in it; .*kill -CONT $pid.*criu-cuda-migrate recover --pid $pid"
    no_agent_left
    kill -CONT "$pid"
    recover "$pid"
    expect_state "$pid" RUNNING
    go "$WORK/w0" 1
    check_agree "$WORK/w0" 1
    ;;
*)
    fail "unknown case"
    ;;
esac
echo "FAULT $CASE OK"
