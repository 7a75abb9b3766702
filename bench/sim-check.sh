#!/usr/bin/env bash
# Runs bench/run-gpu.sh on the TEST DOUBLES of libcuda and NVML under real CRIU (CI has no GPU).
# Needs root and the trixie root (tests/criu-root.sh prepare).
#
#   bash bench/sim-check.sh          the check: small sizes on two simulated GPUs; proves the script, ccm-bench, the
#                                    log parsing and the summary end to end (the numbers mean nothing)
#   bash bench/sim-check.sh --scale  section s6 on eight simulated GPUs (the seed's PCI layout): the plugin's cost
#                                    for 1, 2, 4, 8 processes x 1, 4, 8 GPUs (CCM_BENCH_SCALE_PROCS/_GPUS/_MIB,
#                                    CCM_BENCH_REPEATS override), the table printed and left in $CCM_BENCH_SIM_WORK/out
#
# The check builds the debug binaries first; --scale the release ones (what is packaged: a debug build's memory scan
# is some 50 times slower and would be most of what it measures).
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO"
mode=check
[ "${1:-}" = --scale ] && mode=scale
profile=debug build=()
[ "$mode" = scale ] && profile=release build=(--release)
cargo build "${build[@]}" -p criu-cuda-migrate -p ccm-workload -p ccm-bench -p cuda-test-double -p nvml-test-double
W=${CCM_BENCH_SIM_WORK:-/tmp/ccm-bench-sim}
rm -rf "$W"
mkdir -p "$W/dev/bin" "$W/dev/plugin" "$W/lib" "$W/state"
cp "target/$profile/ccm-bench" "target/$profile/ccm-sample-workload" "$W/dev/bin/"
cp "target/$profile/libcriu_cuda_migrate.so" "$W/dev/plugin/"
cp "target/$profile/libcuda_test_double.so" "$W/lib/libcuda.so.1"
cp "target/$profile/libnvml_test_double.so" "$W/lib/libnvidia-ml.so.1"
{
    echo "revision: $(git rev-parse HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo ' (dirty)')"
    echo "built: $(date -u +%FT%TZ) on $(uname -n), $profile, test doubles, $(nproc) CPU(s)"
} >"$W/dev/MANIFEST"
# The GPU set: 2 GPUs for the check, 8 at the seed's bus ids for the scale run; GPU i's UUID ends in i.
buses=(06 07)
[ "$mode" = scale ] && buses=(03 13 63 73 83 93 E3 F3)
gpus="" list=""
for i in "${!buses[@]}"; do
    u=GPU-5e11000$i-aabb-ccdd-0001-02030405060$i
    gpus+="${gpus:+,}"$'\n'" {\"uuid\":\"$u\",\"pci_bus_id\":\"0000:${buses[i]}:00.0\",\"pci_device_id\":\"0x233510de\",\"pci_subsystem_id\":\"0x18bf10de\",\"minor\":$i,\"name\":\"NVIDIA H200\",\"memory_total\":1073741824}"
    list+="${list:+;}$u 0000:${buses[i]}:00.0"
done
printf '{"driver_version":"580.159.04","cuda_driver_version":13000,"gpus":[%s]}\n' "$gpus" >"$W/gpus.json"
# shellcheck disable=SC2054 # the commas are in the values
if [ "$mode" = scale ]; then
    knobs=(CCM_BENCH_SECTIONS=s6 CCM_BENCH_SIM_VIEW=1 CCM_BENCH_SCALE_PROCS="${CCM_BENCH_SCALE_PROCS:-1,2,4,8}"
        CCM_BENCH_SCALE_GPUS="${CCM_BENCH_SCALE_GPUS:-1,4,8}" CCM_BENCH_SCALE_MIB="${CCM_BENCH_SCALE_MIB:-4}"
        CCM_BENCH_REPEATS="${CCM_BENCH_REPEATS:-3}" CCM_BENCH_BUDGET_S=1500 CCM_BENCH_HARD_S=1800)
else
    knobs=(CCM_BENCH_SIZES=8,16,32 CCM_BENCH_MIB2=8 CCM_BENCH_REPEATS=2)
fi
PY=$(dirname "$(python3 -c 'import sys; print(sys.executable)')")
PYROOT=$(python3 -c 'import sys; print(sys.base_prefix)')
bash tests/criu-root.sh run --bind "$W" --bind "$PYROOT" -- env PATH="$PY:/usr/sbin:/usr/bin:/sbin:/bin" \
    LD_LIBRARY_PATH="$W/lib" CCM_SIM_CONFIG="$W/gpus.json" CCM_SIM_STATE_DIR="$W/state" \
    CRIU_CUDA_MIGRATE_LIBNVML="$W/lib/libnvidia-ml.so.1" CCM_SIM_CALL_TIMEOUT_MS=20000 \
    CCM_DEVICE_DIR="$W/dev" CCM_CRIU_BIN=/usr/sbin/criu CCM_BENCH_WORK="$W/work" OUT="$W/out" \
    CCM_BENCH_GPUS="$list" "${knobs[@]}" bash "$REPO/bench/run-gpu.sh"
if [ "$mode" = scale ]; then
    python3 - "$W/out/bench-results.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
assert not r["errors"], r["errors"]
assert r["scale"] and all(x["restore_wall_s"] for x in r["scale"]), r["scale"]
assert all(c["ok"] for c in r["checks"]), r["checks"]
print("bench sim-check --scale OK")
PY
    exit 0
fi
python3 - "$W/out/bench-results.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
assert not r["errors"], r["errors"]
assert [x["mib"] for x in r["floor_vs_plugin"]] == [8, 16, 32], r["floor_vs_plugin"]
assert r["floor_vs_plugin"][0]["plugin"]["overhead_s"]["n"] == 2
assert "plugin" not in r["floor_vs_plugin"][2]
assert [x["processes"] for x in r["per_action"]] == [1, 2]
assert [p["processes"] for p in r["parallel"]] == [2, 4], r["parallel"]
assert all(p["plugin_tree_checkpoint_s"]["n"] == 2 and p["plugin_tree_restore_over_floor"] for p in r["parallel"]), r["parallel"]
assert r["parallel"][0]["goal"]["against"] == "the slowest process alone"
assert all(x["plugin"]["overhead_dump_s"] and x["plugin"]["overhead_restore_s"] for x in r["floor_vs_plugin"][:2])
assert any(i["reconcile_s"] for i in r["identity"]), r["identity"]
assert all(c["ok"] for c in r["checks"]), r["checks"]
print("bench sim-check OK")
PY
