# shellcheck shell=bash
# Sourced by the container flows (podman-flow.sh, containerd-flow.sh). Needs S (the scratch directory).

# step NAME CMD...: runs CMD, its output in S/NAME.out and S/NAME.err, its status in S/NAME.rc; returns the
# status. A flow never stops on a failed step by itself: the Rust test reads the statuses and says which broke.
step() {
    local name=$1 rc
    shift
    "$@" >"$S/$name.out" 2>"$S/$name.err" </dev/null
    rc=$?
    echo "$rc" >"$S/$name.rc"
    return "$rc"
}

# wait_counter MIN CMD...: until CMD prints the container loop's `TOKEN COUNTER` line with COUNTER >= MIN
# (30 s at most); prints the last line read, returns 1 when it never got there.
wait_counter() {
    local min=$1 line
    shift
    # Up to 30 s: a container restored on a loaded 2-core CI machine can take several seconds to run again.
    for _ in $(seq 300); do
        line=$("$@" 2>/dev/null) || line=
        if [ -n "$line" ] && [ "${line##* }" -ge "$min" ] 2>/dev/null; then
            printf '%s\n' "$line"
            return 0
        fi
        sleep 0.1
    done
    printf '%s\n' "$line"
    return 1
}

# beyond FILE: a counter 5 steps past the `TOKEN COUNTER` line in FILE (5 when FILE is missing).
beyond() {
    local n
    n=$(cut -d' ' -f2 "$1" 2>/dev/null)
    echo $((${n:-0} + 5))
}
