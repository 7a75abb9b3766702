#!/usr/bin/env bash
# Two builds of the plugin side by side on the GPU machine: the plugin's own time at each hook (its `timing:` lines)
# for the same dump and restore, paired, alternating A and B, as ratios B/A of the medians. Issue 34 measured with
# it what the importer check adds to PAUSE_DEVICES and CHECKPOINT_DEVICES, and what the restore's init saves when
# the free memory comes from the resource manager instead of NVML (docs/BENCHMARKS.md, "The importer check and the
# preflight's memory").
#
#   bash bench/plugin-ab.sh A_PLUGIN_DIR B_PLUGIN_DIR [ROUNDS]      (root; ROUNDS pairs, default 7)
#
# Each directory holds one libcriu_cuda_migrate.so. The workloads are tests/gpu/ipc_probe.c's `plain` (64 MiB of
# device memory): one process, and a tree of two. CRIU 4.1.1 from .device/criu-debs (CCM_CRIU_ROOT, default
# /opt/criu, unpacked when missing). Writes $OUT/plugin-ab.tsv (every figure) and $OUT/plugin-ab.md (the table).

set -uo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DEVICE_DIR=${CCM_DEVICE_DIR:-$REPO/.device}
WORK=/var/tmp/ccm-plugin-ab
OUT_DIR=${OUT:-$WORK/out}
CRIU_ROOT=${CCM_CRIU_ROOT:-/opt/criu}
CRIU_BIN=$CRIU_ROOT/usr/sbin/criu
CRIU_LIBS=$CRIU_ROOT/usr/lib/x86_64-linux-gnu
CRIU_TIMEOUT=120
# Absolute: CRIU resolves --libdir after it changed into its work directory.
A_DIR=$(realpath -e "${1:?usage: plugin-ab.sh A_PLUGIN_DIR B_PLUGIN_DIR [ROUNDS]}") || exit 2
B_DIR=$(realpath -e "${2:?usage: plugin-ab.sh A_PLUGIN_DIR B_PLUGIN_DIR [ROUNDS]}") || exit 2
ROUNDS=${3:-7}
TSV=$OUT_DIR/plugin-ab.tsv

# shellcheck source=tests/lib/common.sh
. "$REPO/tests/lib/common.sh"
# shellcheck source=tests/gpu/processes.sh
. "$REPO/tests/gpu/processes.sh"

descendants() { # PID: PID and every descendant
    echo "$1"
    cat /proc/"$1"/task/*/children 2>/dev/null | tr ' ' '\n' | while read -r c; do
        [[ -n $c ]] && descendants "$c"
    done
}

# one VARIANT DIR SHAPE ROUND: a dump and a restore of SHAPE (one, two) with the plugin in DIR; one TSV row per
# timing line: variant shape round hook seconds.
one() {
    local variant=$1 dir=$2 shape=$3 round=$4 d=$WORK/$1-$3-$4 tree p
    rm -rf "$d"
    mkdir -p "$d/img"
    case $shape in
    one) start_detached "$d" "$d/a.log" "$WORK/ipc_probe" plain 64 ;;
    two) start_detached "$d" "$d/tree.log" bash -c "$WORK/ipc_probe plain 64 >$d/a.log 2>&1 & $WORK/ipc_probe plain 64 >$d/b.log 2>&1 & wait" ;;
    esac
    local root=$STARTED_PID logs=("$d/a.log") l deadline=$((SECONDS + 60))
    [[ $shape == two ]] && logs+=("$d/b.log")
    for l in "${logs[@]}"; do
        until grep -q 'ok round=' "$l" 2>/dev/null; do
            ((SECONDS >= deadline)) && { log "$variant $shape $round: the workload did not start"; return; }
            sleep 0.1
        done
    done
    tree=$(descendants "$root")
    if ! criu_cmd -- dump -t "$root" -D "$d/img" --libdir "$dir" -v4 -o dump.log >/dev/null 2>&1; then
        log "$variant $shape $round: dump failed: $(grep -m2 'Error' "$d/img/dump.log" | tr '\n' ' ' | cut -c1-300)"
        cp "$d/img/dump.log" "$OUT_DIR/failed-$variant-$shape-$round-dump.log" 2>/dev/null
        cleanup_processes
        return
    fi
    for p in $tree; do wait_gone "$p" 30; done
    criu_cmd -- restore -d -D "$d/img" --libdir "$dir" -v4 -o restore.log >/dev/null 2>&1 ||
        log "$variant $shape $round: restore failed: $(grep -m2 'Error' "$d/img/restore.log" | tr '\n' ' ' | cut -c1-300)"
    track "$root"
    grep -h -o 'timing: [A-Z_a-z]*([a-z0-9 ]*) [0-9.]* s' "$d/img/dump.log" "$d/img/restore.log" |
        sed -E 's/timing: ([A-Za-z_]+)\((pid )?[0-9]+\)/\1/; s/timing: ([a-z]+)\(([a-z]+)\)/\1(\2)/; s/ s$//' |
        awk -v v="$variant" -v s="$shape" -v r="$round" '{ n[$1]++; h = $1; if ($1 ~ /^[A-Z]/) h = $1 "#" n[$1]; printf "%s\t%s\t%s\t%s\t%s\n", v, s, r, h, $2 }' >>"$TSV"
    grep -h -o 'importer check before the first lock: .*([0-9.]* ms)' "$d/img/dump.log" | grep -o '[0-9.]* ms' | head -n1 |
        awk -v v="$variant" -v s="$shape" -v r="$round" '{ printf "%s\t%s\t%s\timporter check (tree)\t%s\n", v, s, r, $1 / 1000 }' >>"$TSV"
    cleanup_processes
    for p in $tree; do wait_gone "$p" 30; done
}

main() {
    rm -rf "$WORK"
    mkdir -p "$WORK" "$OUT_DIR"
    : >"$WORK/pids"
    : >"$TSV"
    if [[ ! -x $CRIU_BIN ]]; then
        local f
        for f in "$DEVICE_DIR"/criu-debs/*.deb; do dpkg -x "$f" "$CRIU_ROOT"; done
    fi
    gcc -O1 -o "$WORK/ipc_probe" "$REPO/tests/gpu/ipc_probe.c" -I/usr/local/cuda/include -L/usr/local/cuda/lib64/stubs -lcuda || exit 2
    trap cleanup_processes EXIT
    local r shape
    for r in $(seq 1 "$ROUNDS"); do
        for shape in one two; do
            # Alternating which goes first, so that neither always meets a warmer driver.
            if ((r % 2)); then
                one A "$A_DIR" "$shape" "$r"
                one B "$B_DIR" "$shape" "$r"
            else
                one B "$B_DIR" "$shape" "$r"
                one A "$A_DIR" "$shape" "$r"
            fi
        done
    done
    python3 - "$TSV" "$A_DIR" "$B_DIR" <<'PY' | tee "$OUT_DIR/plugin-ab.md"
import collections, statistics, sys
rows = collections.defaultdict(list)
for line in open(sys.argv[1]):
    v, shape, r, hook, sec = line.rstrip("\n").split("\t")
    rows[(shape, hook, v)].append(float(sec))
print("A = %s, B = %s; medians (min-max) over the rounds, milliseconds of the plugin's own time" % (sys.argv[2], sys.argv[3]))
print()
print("| tree | hook | A | B | B/A |")
print("|---|---|---|---|---|")
keys = sorted({(s, h) for (s, h, _) in rows})
for s, h in keys:
    a, b = rows.get((s, h, "A"), []), rows.get((s, h, "B"), [])
    fmt = lambda x: "%.2f (%.2f-%.2f)" % (statistics.median(x) * 1e3, min(x) * 1e3, max(x) * 1e3) if x else "-"
    ratio = "%.2f" % (statistics.median(b) / statistics.median(a)) if a and b and statistics.median(a) > 0 else "-"
    print("| %s | %s | %s | %s | %s |" % (s, h, fmt(a), fmt(b), ratio))
PY
}

main "$@"
