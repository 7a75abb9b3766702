# shellcheck shell=bash
# The helpers the test scripts share (issue 30), sourced by path relative to the sourcing script, e.g.
#   . "$(dirname "${BASH_SOURCE[0]}")/../lib/common.sh"
# Functions only: no variables, traps or shell options, so it serves the flows that record PASS/FAIL per step and
# carry on (no -e) as well as the scripts under `set -euo pipefail`. The process helpers (alive, wait_file,
# close_inherited_fds, agent_alive) are in tests/lib/proc.sh, which this file sources.

# shellcheck source=tests/lib/proc.sh
. "$(dirname "${BASH_SOURCE[0]}")/proc.sh"

# log MSG...: one line on stderr with the time of day.
log() { printf '[%s] %s\n' "$(date +%T)" "$*" >&2; }

# now: seconds since the epoch, with nanoseconds; elapsed START: seconds since START (a `now`), two decimals.
now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.2f", b - a }'; }

# one_line [MAX]: stdin on one line (newlines to spaces, runs of spaces squeezed), cut to MAX characters (240).
one_line() { tr '\n' ' ' | tr -s ' ' | cut -c1-"${1:-240}"; }

# first_error LOG: CRIU's and the plugin's first errors in a CRIU log (refusals, failures, CRIU going away), on one
# line: the last line of a failed dump only says that it failed.
first_error() {
    grep -a -m3 -E 'Error|criu-cuda-migrate: .*(refus|fail|error|went away)' "$1" 2>/dev/null |
        sed 's/.*criu-cuda-migrate: //' | one_line 300
}

# record CASE EXPECTED SEEN RESULT TIMES: one tab-separated row of the result table appended to $RESULTS (SEEN's
# newlines as spaces), and logged.
record() {
    printf '%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "${3//$'\n'/ }" "$4" "$5" >>"$RESULTS"
    log "$1: $4 ($3) [$5]"
}

# verdict CASE EXPECTED SEEN RESULT [TIMES]: record, and FAILED=1 when RESULT is FAIL (a script's exit code).
verdict() {
    # shellcheck disable=SC2034 # FAILED is the sourcing script's: its exit code.
    [[ $4 == FAIL ]] && FAILED=1
    record "$1" "$2" "$3" "$4" "${5:--}"
}

# print_table: the rows of $RESULTS as a Markdown table (the form docs/GPU-TESTING.md quotes).
print_table() {
    echo
    echo "| case | expected | seen | result | times |"
    echo "|---|---|---|---|---|"
    awk -F'\t' '{ printf "| %s | %s | %s | %s | %s |\n", $1, $2, $3, $4, $5 }' "$RESULTS"
}

# count_files PATH...: how many of the PATHs exist; given a glob, how many files it matched (a glob that matches
# nothing stays itself, which does not exist).
count_files() {
    local n=0 f
    for f in "$@"; do
        if [[ -e $f ]]; then n=$((n + 1)); fi
    done
    echo "$n"
}

# first_file PATH...: the first of the PATHs that exists (a glob's first match in its sorted order), or nothing.
first_file() {
    local f
    for f in "$@"; do
        if [[ -e $f ]]; then
            echo "$f"
            return 0
        fi
    done
}

# loop_stand_ins DIR GPUS: the NVIDIA nodes as the test doubles present them to the plugin (docs/TEST-DOUBLES.md), in
# this mount namespace's /dev: /dev/loop-control (char 10:237) as /dev/nvidiactl and, for each of the first GPUS GPUs,
# a loop block device over a 1 MiB file in DIR as /dev/nvidiaN (a device a forked child can hold open and map, which
# CRIU cannot dump, as the driver's). Sets LOOPS (the loop devices: `losetup -d` each at the end), STAND_INS (the value
# of CCM_TEST_DOUBLE_NVIDIA_DEVICES) and STAND_IN_NUMBERS (TYPE:MAJOR:MINOR of nvidia0, nvidia1, ..., then of
# nvidiactl, as a CDI spec names nodes). Returns 1 when no loop device was free.
loop_stand_ins() {
    local i dev
    LOOPS=()
    STAND_INS="char:10:237=nvidiactl"
    STAND_IN_NUMBERS=()
    [[ -e /dev/loop-control ]] || mknod /dev/loop-control c 10 237
    for i in $(seq 0 63); do [[ -e /dev/loop$i ]] || mknod "/dev/loop$i" b 7 "$i"; done
    for ((i = 0; i < $2; i++)); do
        truncate -s 1M "$1/loop$i.img"
        dev=$(losetup -f --show "$1/loop$i.img") || return 1
        LOOPS+=("$dev")
        mknod "/dev/nvidia$i" b 7 "${dev#/dev/loop}"
        STAND_INS+=",block:7:${dev#/dev/loop}=nvidia$i"
        STAND_IN_NUMBERS+=("b:7:${dev#/dev/loop}")
    done
    mknod /dev/nvidiactl c 10 237
    STAND_IN_NUMBERS+=("c:10:237")
}
