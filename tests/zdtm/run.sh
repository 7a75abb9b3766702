#!/usr/bin/env bash
# CRIU's own test suite, zdtm, with this plugin loaded into every `criu dump` and `criu restore`, and without it
# (issue 41 part 6): the plugin must never harm a process it does not own. Each test of tests/zdtm/tests.txt runs in
# each flavor listed there, twice, from the zdtm root of the suite CCM_CRIU_SUITE names (trixie: CRIU 4.1.1, forky:
# 4.2.1; `tests/criu-root.sh prepare-zdtm` makes it):
#
#   without  the test doubles' node (tests/sim/stack.sh: libcuda and NVML doubles, two simulated GPUs) in criu's
#            environment, and no plugin;
#   with     the same, and the plugin in zdtm's plugin directory: zdtm.py starts every criu with
#            --no-default-config and CRIU_LIBS_DIR=<tree>/test/plugins, so CRIU loads every .so there. The plugin
#            must show in every dump.log that it ran with its driver agent started (`driver agent pid N loaded`),
#            asked about each process of the tree (`pid N is not a CUDA process; leaving it to CRIU`), and was not
#            disabled, and in every restore.log that it ran (`init stage=restore`), and it must write no image.
#
# It fails when a test's outcome differs between the two passes (the plugin changed what CRIU does), when the plugin
# pass lacks that evidence or the pass without it shows the plugin, and when a test fails in both passes (the list
# holds only tests that pass on CI's machine: such a failure is the environment's, and says so).
#
#   bash tests/zdtm/run.sh [--bin DIR] [--out DIR] [--list FILE]
#
#   --bin DIR    cargo's target directory holding libcriu_cuda_migrate.so and the test doubles (target/debug)
#   --out DIR    where the results go (a new /tmp/ccm-zdtm.XXXXXX): results-without.tsv, results-with.tsv (test,
#                area, flavor, outcome, seconds, the plugin's evidence), table.md, and logs/ with zdtm's output and
#                CRIU's logs of every test that did not pass as it should
#   --list FILE  the tests (tests/zdtm/tests.txt); each must be built in the zdtm root
#
# Needs root (like every real-CRIU test). Prints the table and a summary line with both passes' times; exits 1 when a
# check fails, 2 when it cannot run (no zdtm root, a test not built, no plugin).
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd -P)
# The shared helpers (log, now, elapsed, one_line).
# shellcheck source=tests/lib/common.sh
. "$REPO/tests/lib/common.sh"

# The tree's place inside the zdtm root (tests/criu-root.sh's ZDTM_TREE) and where a pass copies it: zdtm.py writes
# into its tree (each test's files, the ns flavor's root, the images), so each pass works on a fresh copy on the
# root's /tmp (a tmpfs of the pass's own mount namespace).
TREE=/opt/criu
WORKDIR=/tmp/ccm-zdtm
# zdtm's named cgroup hierarchies (zdtm_mount_cgroups makes them); the passes hold them with a cgroup of their own.
ZDTM_CGROUPS="zdtmtst zdtmtst.defaultroot"

die() {
    echo "zdtm/run.sh: $*" >&2
    exit 2
}

# list_tests FILE [SUITE]: the tests of a list (tests/zdtm/tests.txt's format: `TEST FLAVOR[,FLAVOR...] [SUITE,...]`,
# `#` comments, `## AREA` headings naming the area of the tests under them), those of SUITE only when given, one
# "TEST FLAVORS AREA" a line.
list_tests() {
    awk -v suite="${2:-}" '
        /^## / { area = $2; next }
        { sub(/#.*/, "") }
        NF == 0 { next }
        NF == 1 { print "zdtm/run.sh: " $1 ": no flavor" > "/dev/stderr"; exit 1 }
        { suites = (NF >= 3 ? $3 : "trixie,forky") }
        suite == "" || index("," suites ",", "," suite ",") { print $1, $2, (area == "" ? "-" : area) }
    ' "$1"
}

# ---------------------------------------------------------------------------------------------------------------
# Inside the zdtm root (tests/criu-root.sh run): one pass over the list.

# cgroup_hold NAME: zdtm's named hierarchies exist and hold a cgroup NAME, for the whole pass. zdtm.py makes them
# at its start when they are missing and removes its own holder at its end; with one zdtm.py per test, a hierarchy
# left without a cgroup between two tests is killed while the next test's zdtm.py takes it for there, and that
# one's cleanup then fails to mount it. A hierarchy being killed cannot be mounted for a moment: wait for it.
cgroup_hold() {
    local name dir tries
    for name in $ZDTM_CGROUPS; do
        dir=$(mktemp -d /tmp/ccm-zdtm-cg.XXXXXX)
        tries=0
        until mount -t cgroup -o "none,name=$name" zdtm "$dir" 2>/dev/null; do
            tries=$((tries + 1))
            [ "$tries" -lt 100 ] || die "cannot mount zdtm's cgroup hierarchy name=$name"
            sleep 0.1
        done
        mkdir -p "$dir/$1"
        umount "$dir"
        rmdir "$dir"
    done
}

# cgroup_release NAME: removes the cgroup NAME; a hierarchy left with no cgroup is unmounted again, which ends it,
# so no zdtm hierarchy outlives the run (the other tests' CRIU would dump it with their processes).
cgroup_release() {
    local name dir
    for name in $ZDTM_CGROUPS; do
        dir=$(mktemp -d /tmp/ccm-zdtm-cg.XXXXXX)
        if mount -t cgroup -o "none,name=$name" zdtm "$dir" 2>/dev/null; then
            rmdir "$dir/$1" 2>/dev/null || true
            umount "$dir"
        fi
        rmdir "$dir"
    done
    # The removed cgroup goes offline asynchronously: an unmount before that keeps the hierarchy. Once more after.
    sleep 0.5
    for name in $ZDTM_CGROUPS; do
        grep -q "name=$name:" /proc/self/cgroup || continue
        dir=$(mktemp -d /tmp/ccm-zdtm-cg.XXXXXX)
        if mount -t cgroup -o "none,name=$name" zdtm "$dir" 2>/dev/null; then umount "$dir"; fi
        rmdir "$dir"
    done
}

# evidence PASS DIR: what CRIU's logs under DIR (one test's images: dump.log, restore.log) say of the plugin, as one
# word and its detail: `ok: agent pid N, K processes left to CRIU` or `absent` as PASS expects, else `BAD: why`.
evidence() {
    local pass=$1 dir=$2 dumps restores agent others images
    dumps=$(find "$dir" -name dump.log -exec cat {} + 2>/dev/null)
    restores=$(find "$dir" -name restore.log -exec cat {} + 2>/dev/null)
    images=$(find "$dir" -name 'cuda-migrate-*' 2>/dev/null | head -n1)
    if [ -z "$dumps" ] || [ -z "$restores" ]; then
        echo "BAD: CRIU's dump.log or restore.log is missing"
    elif [ "$pass" = without ]; then
        # The plugin's lines and CRIU's line loading it (not the root's path, /var/cache/criu-cuda-migrate/..., which
        # CRIU logs with the mounts).
        if grep -q -e 'criu-cuda-migrate: ' -e 'Plugin "criu-cuda-migrate"' <<<"$dumps$restores"; then
            echo "BAD: the plugin is in CRIU's log"
        else
            echo "absent"
        fi
    elif ! grep -q ': init stage=dump' <<<"$dumps"; then
        echo "BAD: the plugin did not run at dump"
    elif ! grep -q ': init stage=restore' <<<"$restores"; then
        echo "BAD: the plugin did not run at restore"
    elif grep -q 'criu-cuda-migrate: disabled' <<<"$dumps$restores"; then
        echo "BAD: the plugin disabled itself: $(grep -m1 'criu-cuda-migrate: disabled' <<<"$dumps$restores" | one_line 200)"
    else
        agent=$(sed -n 's/.*criu-cuda-migrate: driver agent pid \([0-9]*\) loaded .*/\1/p' <<<"$dumps" | head -n1)
        others=$(grep -c 'is not a CUDA process; leaving it to CRIU' <<<"$dumps" || true)
        if [ -z "$agent" ]; then
            echo "BAD: no driver agent started at dump"
        elif [ "$others" -lt 1 ]; then
            echo "BAD: the plugin was asked about no process"
        elif [ -n "$images" ]; then
            echo "BAD: the plugin wrote an image: ${images#"$dir"/}"
        else
            echo "ok: agent pid $agent, $others process(es) left to CRIU"
        fi
    fi
}

run_pass() {
    local pass=$1 bin=$2 out=$3 list=$4 holder test flavors area flavor t0 secs log outcome ev step
    local results="$out/results-$pass.tsv"
    rm -rf "$WORKDIR"
    mkdir -p "$WORKDIR"
    cp -a "$TREE" "$WORKDIR/criu"
    # The test doubles' node in this shell's environment, which zdtm.py hands to every criu it starts.
    # shellcheck disable=SC2034 # BIN and WORK are tests/sim/stack.sh's inputs
    BIN=$bin WORK=$WORKDIR/sim
    # shellcheck source=tests/sim/stack.sh
    . "$REPO/tests/sim/stack.sh"
    sim_stack_setup 2
    cd "$WORKDIR/criu/test"
    if [ "$pass" = with ]; then
        cp "$bin/libcriu_cuda_migrate.so" plugins/
    fi
    holder="holder.ccm-zdtm-$$"
    cgroup_hold "$holder"
    # Whatever ends the pass, its cgroup goes (the hierarchies are the machine's, not this mount namespace's).
    # shellcheck disable=SC2064 # the holder's name now
    trap "cd / && cgroup_release '$holder'" EXIT
    : >"$results"
    local pass_start
    pass_start=$(now)
    while read -r test flavors area; do
        for flavor in ${flavors//,/ }; do
            log="$WORKDIR/zdtm.log"
            t0=$(now)
            # zdtm's own timeouts bound each step (the test's start, each criu); --keep-img always leaves CRIU's
            # logs for the plugin's evidence, removed below.
            if python3 ./zdtm.py run -t "$test" -f "$flavor" --criu-bin /usr/sbin/criu --keep-img always \
                >"$log" 2>&1 </dev/null; then
                if grep -q "Test $test PASS" "$log"; then
                    outcome=PASS
                elif grep -q "^Skipping $test" "$log"; then
                    outcome="SKIP ($(sed -n "s|^Skipping $test (\(.*\))|\1|p" "$log" | head -n1))"
                else
                    outcome="FAIL (zdtm.py said neither PASS nor skip)"
                fi
            else
                step=$(sed -n "s|.*Test $test FAIL at \(.*\) #*\$|\1|p" "$log" | head -n1 | sed 's/ *#*$//')
                outcome="FAIL${step:+ at $step}"
            fi
            secs=$(elapsed "$t0")
            if [ "$outcome" = PASS ]; then ev=$(evidence "$pass" "dump/$test"); else ev="-"; fi
            if [ "$outcome" != PASS ] || [ "${ev%%:*}" = BAD ]; then
                local keep
                keep="$out/logs/$pass/$flavor/${test//\//_}"
                mkdir -p "$keep"
                cp "$log" "$keep/zdtm.log"
                find "dump/$test" \( -name '*.log' \) -exec cp --parents {} "$keep/" \; 2>/dev/null || true
            fi
            rm -rf "dump/$test"
            printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$test" "$area" "$flavor" "$outcome" "$secs" "$ev" >>"$results"
            log "[$pass] $test ($flavor): $outcome in $secs s; plugin: $ev"
        done
    done <"$list"
    { elapsed "$pass_start"; echo; } >"$out/seconds-$pass"
    cd /
    rm -rf "$WORKDIR"
}

if [ "${1:-}" = __pass ]; then
    shift
    run_pass "$@"
    exit 0
fi

# ---------------------------------------------------------------------------------------------------------------
# On the host: both passes, then the comparison.

BIN_DIR=$REPO/target/debug
OUT=
LIST=$REPO/tests/zdtm/tests.txt
while [ $# -gt 0 ]; do
    case $1 in
    --bin) BIN_DIR=$(cd "${2:?--bin needs a directory}" && pwd -P) && shift 2 ;;
    --out) OUT=${2:?--out needs a directory} && shift 2 ;;
    --list) LIST=${2:?--list needs a file} && shift 2 ;;
    *) die "unknown argument $1 (usage: $0 [--bin DIR] [--out DIR] [--list FILE])" ;;
    esac
done
[ "$(id -u)" -eq 0 ] || die "must run as root (zdtm and criu need it)"
for f in libcriu_cuda_migrate.so libcuda_test_double.so libnvml_test_double.so; do
    [ -f "$BIN_DIR/$f" ] || die "$BIN_DIR/$f is missing: run \`cargo build --workspace\` first"
done
[ -f "$LIST" ] || die "no test list $LIST"
SUITE=$(bash "$REPO/tests/criu-root.sh" suite)
ZDTM_ROOT=$(bash "$REPO/tests/criu-root.sh" zdtm-path)
[ -f "$ZDTM_ROOT/.ccm-zdtm" ] ||
    die "no zdtm root at $ZDTM_ROOT: run \`CCM_CRIU_SUITE=$SUITE bash tests/criu-root.sh prepare-zdtm\` (tests/run-all.sh does)"
if [ -z "$OUT" ]; then OUT=$(mktemp -d /tmp/ccm-zdtm.XXXXXX); fi
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd -P)
list_tests "$LIST" "$SUITE" >"$OUT/tests.run"
[ -s "$OUT/tests.run" ] || die "$LIST names no test for $SUITE"
while read -r test _; do
    [ -x "$ZDTM_ROOT$TREE/test/$test" ] ||
        die "$test is not built in $ZDTM_ROOT: run \`CCM_CRIU_SUITE=$SUITE bash tests/criu-root.sh prepare-zdtm\` again"
done <"$OUT/tests.run"
CRIU_VERSION=$(awk '/^Package: criu$/ { found = 1 } found && /^Version:/ { print $2; exit }' "$ZDTM_ROOT/var/lib/dpkg/status")

for pass in without with; do
    log "zdtm on $SUITE (CRIU $CRIU_VERSION), $pass the plugin: $(wc -l <"$OUT/tests.run") tests"
    CCM_TRIXIE_ROOT=$ZDTM_ROOT CCM_CRIU_SUITE=$SUITE bash "$REPO/tests/criu-root.sh" run --bind "$BIN_DIR" --bind "$OUT" -- \
        bash "$REPO/tests/zdtm/run.sh" __pass "$pass" "$BIN_DIR" "$OUT" "$OUT/tests.run" ||
        die "the pass $pass the plugin did not finish (see above)"
done

# One row per test and flavor: both outcomes, both times, and the verdict.
joined_results() {
    awk -F'\t' -v OFS='\t' 'NR == FNR { o[$1 FS $3] = $4; s[$1 FS $3] = $5; e[$1 FS $3] = $6; next }
        { k = $1 FS $3; print $1, $2, $3, o[k], $4, s[k], $5, e[k], $6 }' "$OUT/results-without.tsv" "$OUT/results-with.tsv"
}
bad=0 same=0 env=0 rows=0
{
    echo "| test | area | flavor | without plugin | with plugin | s without | s with | the plugin in CRIU's logs |"
    echo "|---|---|---|---|---|---|---|---|"
} >"$OUT/table.md"
while IFS=$'\t' read -r test area flavor o_without o_with s_without s_with e_without e_with; do
    rows=$((rows + 1))
    verdict=""
    if [ "$o_without" != "$o_with" ]; then
        verdict="DIFFERS"
    elif [ "$o_without" != PASS ]; then
        verdict="fails in both passes (the environment, not the plugin)"
        env=$((env + 1))
    fi
    if [ "${e_without%%:*}" = BAD ]; then verdict="${verdict:+$verdict; }without: $e_without"; fi
    if [ "${e_with%%:*}" = BAD ]; then verdict="${verdict:+$verdict; }with: $e_with"; fi
    if [ -z "$verdict" ]; then
        same=$((same + 1))
    else
        bad=$((bad + 1))
        echo "zdtm/run.sh: $test ($flavor): without the plugin $o_without, with it $o_with: $verdict" >&2
    fi
    printf '| %s | %s | %s | %s | %s | %s | %s | %s |\n' "${test#zdtm/static/}" "$area" "$flavor" "$o_without" "$o_with" \
        "$s_without" "$s_with" "${verdict:+**}${verdict:-$e_with}${verdict:+**}" >>"$OUT/table.md"
done < <(joined_results)
cat "$OUT/table.md"
tests_n=$(wc -l <"$OUT/tests.run")
echo
echo "zdtm on $SUITE (CRIU $CRIU_VERSION): $tests_n tests, $rows runs per pass; without the plugin $(cat "$OUT/seconds-without") s," \
    "with it $(cat "$OUT/seconds-with") s; $same the same and passing in both, $bad not ($env failing in both)"
echo "results: $OUT"
[ "$bad" -eq 0 ]
