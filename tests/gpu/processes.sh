# shellcheck shell=bash
# Sourced by the GPU scripts (tests/gpu/run.sh, bench/run-gpu.sh): starting, tracking, waiting for and
# cleaning up the processes a case runs, and running CRIU. Needs WORK (the scratch dir holding the list of pids);
# criu_cmd needs CRIU_BIN, CRIU_LIBS and CRIU_TIMEOUT.

# close_inherited_fds, wait_file FILE SECONDS [PID], alive PID and agent_alive come from tests/lib/proc.sh.
# shellcheck source=tests/lib/proc.sh
. "$(dirname "${BASH_SOURCE[0]}")/../lib/proc.sh"

# Every process a case started or restored, by pid: cleanup kills exactly these (and, as each is
# a session and group leader, its process group).
# descendants PID: PID and every descendant (host pids), depth first.
descendants() {
    local p=$1 c
    echo "$p"
    cat /proc/"$p"/task/*/children 2>/dev/null | tr ' ' '\n' | while read -r c; do
        [[ -n $c ]] && descendants "$c"
    done
}

# job_report ROOT FILE: `criu-cuda-migrate job --pid ROOT` ($CLI) into FILE; sets JOB_RC, JOB_LINE (its verdict line)
# and JOB_OUT (the whole output).
# shellcheck disable=SC2034 # JOB_RC and JOB_LINE are for the scripts that source this file
job_report() {
    # The CRIU that dumps the tree is the one asked for its version (with its own libraries on the path).
    JOB_OUT=$(LD_LIBRARY_PATH="${CRIU_LIBS:-}" "$CLI" job --pid "$1" --criu "$CRIU_BIN" 2>&1)
    JOB_RC=$?
    printf '%s\n' "$JOB_OUT" >"$2"
    JOB_LINE=$(grep -m1 '^verdict:' <<<"$JOB_OUT" | cut -c1-300)
}

track() { printf '%s\n' "$1" >>"$WORK/pids"; }

cleanup_processes() {
    local pid
    [[ -f $WORK/pids ]] || return 0
    while read -r pid; do
        [[ $pid =~ ^[0-9]+$ ]] || continue
        kill -9 -- "-$pid" 2>/dev/null
        kill -9 "$pid" 2>/dev/null
    done <"$WORK/pids"
    while read -r pid; do
        [[ $pid =~ ^[0-9]+$ ]] && wait_gone "$pid" 10
    done <"$WORK/pids"
    : >"$WORK/pids"
}

# start_detached DIR LOG CMD...: CMD in its own session (CRIU dumps a session whole without
# --shell-job), cwd DIR, stdin /dev/null, stdout+stderr to LOG. Sets STARTED_PID.
start_detached() {
    local dir=$1 logfile=$2
    shift 2
    (
        cd "$dir" || exit 1
        exec </dev/null >"$logfile" 2>&1
        close_inherited_fds
        # Not a group leader here (no job control), so setsid(1) calls setsid(2) without forking:
        # $! below is CMD's pid.
        exec setsid "$@"
    ) &
    STARTED_PID=$!
    track "$STARTED_PID"
}

# wait_gone PID SECONDS: until PID no longer exists (reaping it if it is our zombie child).
wait_gone() {
    local pid=$1 deadline=$((SECONDS + ${2:-30})) state
    while [[ -e /proc/$pid ]]; do
        state=$(sed 's/^.*) //' "/proc/$pid/stat" 2>/dev/null | cut -d' ' -f1)
        [[ $state == Z ]] && wait "$pid" 2>/dev/null
        ((SECONDS >= deadline)) && return 1
        sleep 0.05
    done
}

# criu_cmd ENV-ASSIGNMENT... -- CRIU-ARGS...: CRIU with its own libraries. LD_LIBRARY_PATH is set
# for CRIU only: the Debian libraries must not shadow Ubuntu's in the workloads (python, torch).
criu_cmd() {
    local envs=()
    while [[ $# -gt 0 && $1 != -- ]]; do
        envs+=("$1")
        shift
    done
    shift
    env "${envs[@]}" LD_LIBRARY_PATH="$CRIU_LIBS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
        timeout --kill-after=10 "$CRIU_TIMEOUT" "$CRIU_BIN" "$@"
}

# CCM_CRIU=forky: CRIU 4.2.1 (.device/criu-forky, tests/gpu/prepare.sh) instead of the criu-debs' 4.1.1, which
# cannot dump an inet socket on the GPU machines' kernel (6.18). Applied where this file is sourced, after the
# script set CRIU_BIN; its wrapper loads its own libraries, so CRIU_LIBS is emptied.
if [[ ${CCM_CRIU:-} == forky ]]; then
    if [[ -x ${DEVICE_DIR:-}/criu-forky/criu ]]; then
        CRIU_BIN=$DEVICE_DIR/criu-forky/criu
        CRIU_LIBS=
    else
        echo "CCM_CRIU=forky, but ${DEVICE_DIR:-.device}/criu-forky/criu is not there: run tests/gpu/prepare.sh" >&2
    fi
fi
