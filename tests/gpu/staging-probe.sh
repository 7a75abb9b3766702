#!/usr/bin/env bash
# Issue 47, "What the staging pages are": what the driver's checkpoint adds to a CUDA process's mappings, measured.
# For the sample workload with 64 MiB, 1 GiB and 4 GiB of device memory and a torch process with 1 GiB: its
# /proc/PID/maps before the lock, after cuCheckpointProcessCheckpoint, and after cuCheckpointProcessRestore + unlock
# (tests/gpu/ckpt_ctl.py, no CRIU). Writes $OUT/staging-probe.txt: per case the mappings that appeared, vanished or
# changed between the snapshots (diff of the maps), with their sizes, and the anonymous private rw mappings' total.
#
#   bash tests/gpu/staging-probe.sh
#
# Needs .device/bin/ccm-sample-workload (tests/gpu/prepare.sh) and /opt/torch/.venv/bin/python3.
set -uo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# shellcheck source=tests/lib/common.sh
. "$REPO/tests/lib/common.sh"
OUTF=${OUT:-/tmp}/staging-probe.txt
WORK=/var/tmp/ccm-staging
CTL=(python3 "$REPO/tests/gpu/ckpt_ctl.py")
WL=$REPO/.device/bin/ccm-sample-workload
TORCH_PY=/opt/torch/.venv/bin/python3
rm -rf "$WORK"
mkdir -p "$WORK"
: >"$OUTF"

# anon_rw MAPSFILE: count and MiB of anonymous private rw mappings (no path).
anon_rw() { awk '$2 == "rw-p" && NF == 5 { n++; s += strtonum("0x" substr($1, index($1, "-") + 1)) - strtonum("0x" substr($1, 1, index($1, "-") - 1)) } END { printf "%d mappings, %.1f MiB", n, s / 1048576 }' "$1"; }

# changes A B: the mappings of B not in A (+) and of A not in B (-), with their size in MiB.
changes() {
    diff <(cut -c1-200 "$1") <(cut -c1-200 "$2") | awk '/^[<>]/ { split($2, r, "-"); sz = (strtonum("0x" r[2]) - strtonum("0x" r[1])) / 1048576;
        printf "%s %-34s %8.2f MiB %s %s\n", ($1 == ">" ? "+" : "-"), $2, sz, $3, $7 }' | sort -k4 -rn | head -n 40
}

probe() { # NAME PID
    local name=$1 pid=$2
    cat "/proc/$pid/maps" >"$WORK/$name.before"
    local t0
    t0=$(now)
    "${CTL[@]}" lock-checkpoint "$pid" >"$WORK/$name.ctl" 2>&1
    local tc
    tc=$(elapsed "$t0")
    cat "/proc/$pid/maps" >"$WORK/$name.ckpt"
    t0=$(now)
    "${CTL[@]}" restore-unlock "$pid" >>"$WORK/$name.ctl" 2>&1
    local tr
    tr=$(elapsed "$t0")
    cat "/proc/$pid/maps" >"$WORK/$name.after"
    {
        echo "## $name (pid $pid): checkpoint ${tc}s, restore+unlock ${tr}s"
        echo "before lock:      $(wc -l <"$WORK/$name.before") mappings; anonymous private rw: $(anon_rw "$WORK/$name.before")"
        echo "after checkpoint: $(wc -l <"$WORK/$name.ckpt") mappings; anonymous private rw: $(anon_rw "$WORK/$name.ckpt")"
        echo "after restore:    $(wc -l <"$WORK/$name.after") mappings; anonymous private rw: $(anon_rw "$WORK/$name.after")"
        echo "### before lock -> after checkpoint (+ new, - gone)"
        changes "$WORK/$name.before" "$WORK/$name.ckpt"
        echo "### after checkpoint -> after restore"
        changes "$WORK/$name.ckpt" "$WORK/$name.after"
        echo
    } >>"$OUTF"
    log "staging-probe $name: checkpoint ${tc}s, restore ${tr}s"
}

for mib in 64 1024 4096; do
    d=$WORK/wl$mib
    mkdir -p "$d"
    "$WL" --dir "$d" --mib "$mib" --rounds 1 >"$d.out" 2>&1 &
    for _ in $(seq 300); do [[ -s $d/ready ]] && break; sleep 0.1; done
    pid=$(cat "$d/ready")
    probe "sample-$mib-MiB" "$pid"
    : >"$d/go1"
    wait
done
if [[ -x $TORCH_PY ]]; then
    "$TORCH_PY" -c '
import torch, time
x = torch.empty(1 << 28, dtype=torch.float32, device="cuda")  # 1 GiB
x.fill_(1.5); torch.cuda.synchronize()
print("ready", flush=True)
time.sleep(120)
' >"$WORK/torch.out" 2>&1 </dev/null &
    tp=$!
    for _ in $(seq 300); do grep -q ready "$WORK/torch.out" 2>/dev/null && break; sleep 0.1; done
    probe torch-1-GiB "$tp"
    kill "$tp" 2>/dev/null
fi
log "written: $OUTF"
