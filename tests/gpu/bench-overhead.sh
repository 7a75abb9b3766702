#!/usr/bin/env bash
# Issue 24, item 8 and 7 on the GPU machine: the plugin's per-side overhead (bench s1, 3 repeats, 64 MiB and 1 GiB)
# with the free-memory check on (the default) and off, side by side in one run, and a tree of two CUDA processes under
# a non-CUDA shell (s3) whose RESUME_DEVICES_LATE timing line must name the work of the batch.
#
# Run THERE after tests/gpu/prepare.sh ran HERE and .device/ was carried:  bash tests/gpu/bench-overhead.sh
# Results: $OUT/on/ and $OUT/off/ (bench-table.txt, bench-results.json), $OUT/timing-lines.txt.
set -uo pipefail
# No -e: both runs go ahead whatever the first one's status (each is printed).
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$REPO" || exit 1
OUT=${OUT:-/tmp/ccm-bench-overhead}
mkdir -p "$OUT/on" "$OUT/off"
export CCM_BENCH_REPEATS=${CCM_BENCH_REPEATS:-3} CCM_BENCH_SIZES=${CCM_BENCH_SIZES:-64,1024}
OUT=$OUT/on CCM_BENCH_SECTIONS="s1 s3" CCM_BENCH_TREE_NS=2 CCM_BENCH_MIB2=1024 bash bench/run-gpu.sh >"$OUT/on/run.log" 2>&1
echo "memory check on: rc=$?"
OUT=$OUT/off CCM_BENCH_SECTIONS="s1" CRIU_CUDA_MIGRATE_MEMORY_CHECK=off bash bench/run-gpu.sh >"$OUT/off/run.log" 2>&1
echo "memory check off: rc=$?"
# The timing lines of the plugin's hooks in the s3 restore logs (a non-CUDA root with two CUDA children).
mkdir -p /tmp/ccm-bench-logs && tar -xzf "$OUT/on/bench-logs.tar.gz" -C /tmp/ccm-bench-logs 2>/dev/null
grep -raH "timing: \|restore of [0-9]* CUDA process\|checkpoint of [0-9]* CUDA process" /tmp/ccm-bench-logs |
    grep "s3" | head -n 80 >"$OUT/timing-lines.txt"
for s in on off; do echo "== $s"; grep -A8 "^### 1b" "$OUT/$s/bench-table.txt"; done
