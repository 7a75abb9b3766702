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
