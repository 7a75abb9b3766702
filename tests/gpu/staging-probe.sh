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

# anon_rw MAPSFILE: count and MiB of anonymous private rw mappings (no path). python3: the GPU host's awk is mawk,
# which has no strtonum.
anon_rw() {
    python3 - "$1" <<'PY'
import sys
n = s = 0
for l in open(sys.argv[1]):
    f = l.split()
    if len(f) == 5 and f[1] == "rw-p":
        a, b = (int(x, 16) for x in f[0].split("-"))
        n += 1
        s += b - a
print(f"{n} mappings, {s / 1048576:.1f} MiB")
PY
}

# changes A B: the mappings of B not in A (+) and of A not in B (-), with their size in MiB, biggest first.
changes() {
    python3 - "$1" "$2" <<'PY'
import sys
a = [l.rstrip("\n") for l in open(sys.argv[1])]
b = [l.rstrip("\n") for l in open(sys.argv[2])]
sa, sb = set(a), set(b)
rows = [("+", l) for l in b if l not in sa] + [("-", l) for l in a if l not in sb]
def size(l):
    x, y = (int(v, 16) for v in l.split()[0].split("-"))
    return (y - x) / 1048576
for sign, l in sorted(rows, key=lambda r: -size(r[1]))[:40]:
    f = l.split()
    print(f"{sign} {f[0]:<34} {size(l):10.2f} MiB {f[1]} {' '.join(f[5:])}")
PY
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
