#!/usr/bin/env bash
# A fault on the real GPU: CRIU is SIGKILLed during a dump, after the plugin locked the process and while the
# driver's checkpoint runs. The plugin's driver agent sees CRIU's end of its socket close and puts the process back
# (restore onto its GPU, unlock); the process must end RUNNING, with its data, and the agent gone.
#
# CCM_KILL_AT=after-release (issue 47): CRIU is killed by its own network-lock action script instead, after
# CHECKPOINT_DEVICES, when the process is CHECKPOINTED and its staging pages are in the page file and released in the
# task: the agent must fill them back from the page file before it restores and unlocks (row k2).
#
# CCM_KILL_AT=post-dump-fails: CRIU is not killed; its post-dump action script fails after the plugin's exit hook
# was told the dump succeeded, and CRIU resumes the task CHECKPOINTED with its staging pages released. The driver
# agent, handed the process at the hook, must put it back once CRIU is gone (row k3).
#
# CCM_KILL_AT=leave-stopped: `criu dump --leave-stopped`; the task stays stopped and CHECKPOINTED. The agent must
# fill its staging pages back and name `recover`; after `kill -CONT`, `criu-cuda-migrate recover` brings it back (k4).
#
# Run THERE after tests/gpu/prepare.sh ran HERE and `.device/` was carried:   bash tests/gpu/kill-criu.sh
# Prints one table row (`case | expected | seen | result | times`) and exits 1 when it fails.

set -uo pipefail
# No -e: a status-recording flow. A failed case is recorded as a FAIL row and the next case runs.

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
DEVICE_DIR=${CCM_DEVICE_DIR:-$REPO/.device}
WORK=$(realpath -m "${CCM_WORK:-/var/tmp/ccm-kill}")
CRIU_ROOT=/opt/criu
CRIU_BIN=$CRIU_ROOT/usr/sbin/criu
CRIU_LIBS=$CRIU_ROOT/usr/lib/x86_64-linux-gnu
CRIU_TIMEOUT=120
MIB=${CCM_KILL_MIB:-4096}
# shellcheck source=tests/gpu/processes.sh
source "$REPO/tests/gpu/processes.sh"
# agent_alive: a driver agent is there (and no zombie), ...
# shellcheck source=tests/lib/common.sh
source "$REPO/tests/lib/common.sh"

row() { printf '| %s | %s | %s | %s | %s |\n' "$@"; }

rm -rf "$WORK"
mkdir -p "$WORK/plugins" "$WORK/img" "$WORK/w"
: >"$WORK/pids"
trap cleanup_processes EXIT
for f in "$DEVICE_DIR"/criu-debs/*.deb; do dpkg -x "$f" "$CRIU_ROOT"; done
cp "$DEVICE_DIR"/plugin/*.so "$WORK/plugins/"

start_detached "$WORK/w" "$WORK/w/workload.log" "$DEVICE_DIR/bin/ccm-sample-workload" --dir "$WORK/w" --mib "$MIB" --rounds 1
pid=$STARTED_PID
NAME=k1-criu-killed-mid-dump
[[ ${CCM_KILL_AT:-} == after-release ]] && NAME=k2-criu-killed-after-release
[[ ${CCM_KILL_AT:-} == post-dump-fails ]] && NAME=k3-post-dump-script-fails
[[ ${CCM_KILL_AT:-} == leave-stopped ]] && NAME=k4-leave-stopped
wait_file "$WORK/w/ready" 120 "$pid" || { row "$NAME" "-" "workload not ready" FAIL -; exit 1; }

SCRIPT=()
if [[ ${CCM_KILL_AT:-} == leave-stopped ]]; then
    SCRIPT=(--leave-stopped)
elif [[ ${CCM_KILL_AT:-} == post-dump-fails ]]; then
    cat >"$WORK/kill-criu-action.sh" <<'FAIL'
#!/bin/sh
# The post-dump action fails: CRIU resumes the dumped task (its exit hook was told the dump succeeded).
[ "$CRTOOLS_SCRIPT_ACTION" = post-dump ] && exit 1
exit 0
FAIL
    chmod +x "$WORK/kill-criu-action.sh"
    SCRIPT=(--action-script "$WORK/kill-criu-action.sh")
elif [[ ${CCM_KILL_AT:-} == after-release ]]; then
    cat >"$WORK/kill-criu-action.sh" <<'KILL'
#!/bin/sh
# CRIU's first action after CHECKPOINT_DEVICES: kill CRIU (an ancestor of this script).
case $CRTOOLS_SCRIPT_ACTION in network-lock | post-dump) ;; *) exit 0 ;; esac
# By its command line, not its comm: CRIU 4.2.1 from .device/criu-forky runs through its own loader, whose name
# the kernel gives it (`ld-linux-x86-64`).
p=$PPID
while [ "$p" -gt 1 ]; do
    case " $(tr '\0' ' ' <"/proc/$p/cmdline") " in
    *"/criu dump "* | *" criu dump "* | *"/criu.bin dump "*) kill -9 "$p"; exit 0 ;;
    esac
    p=$(sed -n 's/^PPid:[[:space:]]*//p' "/proc/$p/status")
done
exit 0
KILL
    chmod +x "$WORK/kill-criu-action.sh"
    SCRIPT=(--action-script "$WORK/kill-criu-action.sh")
fi
# CRIU itself (no timeout wrapper), so that the SIGKILL reaches it.
(
    close_inherited_fds
    exec env LD_LIBRARY_PATH="$CRIU_LIBS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
        "$CRIU_BIN" dump -t "$pid" -D "$WORK/img" --libdir "$WORK/plugins" -v4 -o dump.log "${SCRIPT[@]}"
) &
criu_pid=$!
for _ in $(seq 600); do grep -q "cuCheckpointProcessLock" "$WORK/img/dump.log" 2>/dev/null && break; sleep 0.01; done
grep -q "cuCheckpointProcessLock" "$WORK/img/dump.log" || { row "$NAME" "-" "CRIU never locked pid $pid" FAIL -; exit 1; }
if ((${#SCRIPT[@]})); then
    # Its own action script kills it, or fails its dump (post-dump-fails).
    for _ in $(seq 1200); do kill -0 "$criu_pid" 2>/dev/null || break; sleep 0.05; done
else
    # Into the checkpoint (about 0.5 s per GiB here).
    sleep 0.3
    kill -9 "$criu_pid"
fi
t0=$(date +%s.%N)
wait "$criu_pid" 2>/dev/null
for _ in $(seq 1200); do agent_alive || break; sleep 0.05; done
agent_s=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.2f", b - a }')
if [[ ${CCM_KILL_AT:-} == leave-stopped ]]; then
    grep -q "pid $pid is left stopped and CHECKPOINTED after the dump" "$WORK/img/dump.log" ||
        { row "$NAME" "-" "no line names the stopped pid $pid" FAIL -; exit 1; }
    kill -CONT "$pid"
    "$DEVICE_DIR/bin/criu-cuda-migrate" recover --pid "$pid" >"$WORK/recover.out" 2>&1 ||
        { row "$NAME" "-" "recover failed: $(tr '\n' ';' <"$WORK/recover.out" | cut -c1-300)" FAIL -; exit 1; }
fi
state=$(python3 "$REPO/tests/gpu/ckpt_ctl.py" state "$pid" 2>&1)
lines=$(grep -o -e 'driver agent: [^(]*' -e 'CRIU resumed it after a dump it had called successful' -e 'is left stopped and CHECKPOINTED after the dump[^;]*' "$WORK/img/dump.log" | sort -u | tr '\n' ';' | cut -c1-400)
checkpointed=$(grep -c "cuCheckpointProcessCheckpoint" "$WORK/img/dump.log")
: >"$WORK/w/go1"
if wait_file "$WORK/w/done1" 60 "$pid" && seen=$(python3 "$REPO/tests/gpu/gpu_check.py" report "$WORK/w/report1.json" --data-ok --consistent) &&
    [[ $state == running ]] && ! agent_alive; then
    row "$NAME" "RUNNING again, data intact, agent gone" "state $state; $lines; $seen; dump.log had $checkpointed checkpoint line(s)" PASS "agent done ${agent_s}s after the kill; ${MIB} MiB"
    cp "$WORK/img/dump.log" "${OUT:-$WORK}/kill-criu-dump.log" 2>/dev/null
    exit 0
fi
row "$NAME" "RUNNING again, data intact, agent gone" "state $state; agent alive: $(agent_alive && echo yes || echo no); $lines; ${seen:-no report}" FAIL "${agent_s}s"
cp "$WORK/img/dump.log" "${OUT:-$WORK}/kill-criu-dump.log" 2>/dev/null
exit 1
