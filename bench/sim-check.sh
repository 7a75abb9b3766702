#!/usr/bin/env bash
# Runs bench/run-gpu.sh on the TEST DOUBLES of libcuda and NVML under real CRIU (CI has no GPU),
# with small sizes: proves the script, ccm-bench, the log parsing and the summary end to end.
# The numbers mean nothing. Needs root and the trixie root (tests/criu-root.sh prepare).
#
#   bash bench/sim-check.sh          (builds the debug binaries first)
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO"
cargo build -p criu-cuda-migrate -p ccm-workload -p ccm-bench -p cuda-test-double -p nvml-test-double
W=${CCM_BENCH_SIM_WORK:-/tmp/ccm-bench-sim}
rm -rf "$W"
mkdir -p "$W/dev/bin" "$W/dev/plugin" "$W/lib" "$W/state"
cp target/debug/ccm-bench target/debug/ccm-sample-workload "$W/dev/bin/"
cp target/debug/libcriu_cuda_migrate.so "$W/dev/plugin/"
cp target/debug/libcuda_test_double.so "$W/lib/libcuda.so.1"
cp target/debug/libnvml_test_double.so "$W/lib/libnvidia-ml.so.1"
G0=GPU-5e110000-aabb-ccdd-0001-020304050600
G1=GPU-5e110001-aabb-ccdd-0001-020304050601
cat >"$W/gpus.json" <<JSON
{"driver_version":"580.159.04","cuda_driver_version":13000,"gpus":[
 {"uuid":"$G0","pci_bus_id":"0000:06:00.0","pci_device_id":"0x233510de","pci_subsystem_id":"0x18bf10de","minor":0,"name":"NVIDIA H200","memory_total":1073741824},
 {"uuid":"$G1","pci_bus_id":"0000:07:00.0","pci_device_id":"0x233510de","pci_subsystem_id":"0x18bf10de","minor":1,"name":"NVIDIA H200","memory_total":1073741824}]}
JSON
PY=$(dirname "$(python3 -c 'import sys; print(sys.executable)')")
PYROOT=$(python3 -c 'import sys; print(sys.base_prefix)')
bash tests/criu-root.sh run --bind "$W" --bind "$PYROOT" -- env PATH="$PY:/usr/sbin:/usr/bin:/sbin:/bin" \
    LD_LIBRARY_PATH="$W/lib" CCM_SIM_CONFIG="$W/gpus.json" CCM_SIM_STATE_DIR="$W/state" \
    CRIU_CUDA_MIGRATE_LIBNVML="$W/lib/libnvidia-ml.so.1" CCM_SIM_CALL_TIMEOUT_MS=20000 \
    CCM_DEVICE_DIR="$W/dev" CCM_CRIU_BIN=/usr/sbin/criu CCM_BENCH_WORK="$W/work" OUT="$W/out" \
    CCM_BENCH_GPUS="$G0 0000:06:00.0;$G1 0000:07:00.0" CCM_BENCH_SIZES=8,16,32 CCM_BENCH_MIB2=8 \
    CCM_BENCH_REPEATS=2 bash "$REPO/bench/run-gpu.sh"
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
