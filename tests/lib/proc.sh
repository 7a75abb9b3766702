# shellcheck shell=bash
# Process helpers the test scripts share (issue 30), sourced by tests/lib/common.sh and by tests/gpu/processes.sh
# (which bench/run-gpu.sh sources too: this file defines no log or other name a sourcing script defines itself).
# Functions only: no variables, traps or shell options.

# alive PID: PID exists and is no zombie.
alive() { [[ -e /proc/$1 ]] && [[ $(sed 's/^.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f1) != Z ]]; }

# wait_file FILE [SECONDS [PID]]: 0 once FILE exists; 1 after SECONDS (30); 2 as soon as PID (the process that
# should write FILE, or its tree's root) is gone, so a dead workload does not cost the timeout.
wait_file() {
    local deadline=$((SECONDS + ${2:-30})) pid=${3:-}
    while [[ ! -e $1 ]]; do
        ((SECONDS >= deadline)) && return 1
        if [[ -n $pid ]] && ! alive "$pid"; then
            sleep 0.2
            [[ -e $1 ]] && return 0
            return 2
        fi
        sleep 0.05
    done
}

# close_inherited_fds: closes the fds above stdio of the calling (sub)shell. CRIU cannot dump a process holding
# fds of the launcher's files (pipes, files on other mounts); call it in the subshell that then execs the target.
close_inherited_fds() {
    local path fd
    for path in /proc/"$BASHPID"/fd/*; do
        fd=${path##*/}
        if [[ $fd =~ ^[0-9]+$ ]] && ((fd > 2)) && [[ -e $path ]]; then
            eval "exec $fd>&-"
        fi
    done
}

# agent_alive: whether a driver agent (comm ccm-agent) is there and no zombie (a killed agent waits for init to
# reap it). agent_alive_of STATE_DIR: the same for a simulated run's own agent, the one whose environment
# (inherited from CRIU) has CCM_SIM_STATE_DIR=STATE_DIR.
agent_alive() { agent_alive_of ""; }
agent_alive_of() {
    local comm dir name
    for comm in /proc/[0-9]*/comm; do
        { read -r name <"$comm"; } 2>/dev/null || continue
        [[ $name == ccm-agent ]] || continue
        dir=${comm%/comm}
        grep -q '^State:[[:space:]]*Z' "$dir/status" 2>/dev/null && continue
        if [[ -z $1 ]] || tr '\0' '\n' 2>/dev/null <"$dir/environ" | grep -qx "CCM_SIM_STATE_DIR=$1"; then
            return 0
        fi
    done
    return 1
}
