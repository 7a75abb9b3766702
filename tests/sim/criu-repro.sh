#!/usr/bin/env bash
# Reproduces the stale PCI identity under REAL CRIU, on the test doubles, WITHOUT the plugin:
#   start ccm-sim-target → lock + checkpoint (ccm-sim-ctl) → criu dump → criu restore -d
#   → restore with the swap map + unlock (ccm-sim-ctl) → the target reports its identity.
# Expected (the bug): ordinal 0's UUID is the NEW GPU, cuDeviceGetPCIBusId(0) still names the OLD
# GPU's bus, and NVML at that bus id answers the OTHER GPU. Data in device memory is intact.
#
# Runs inside the trixie root: tests/criu-root.sh run tests/sim/criu-repro.sh BIN_DIR
#   BIN_DIR   directory holding ccm-sim-target, ccm-sim-ctl, libcuda_test_double.so and
#             libnvml_test_double.so (cargo's target/debug)
# Prints `REPRO OK` and exits 0 when the bug shows exactly as expected; exits 1 otherwise with the
# logs on stderr. Leaves its files in $CCM_REPRO_WORK (default /tmp/ccm-repro, the root's tmpfs).
set -euo pipefail

BIN=${1:?usage: criu-repro.sh BIN_DIR}
WORK=${CCM_REPRO_WORK:-/tmp/ccm-repro}
G0=GPU-5e110000-aabb-ccdd-0001-020304050600
G1=GPU-5e110001-aabb-ccdd-0001-020304050601
# shellcheck source=tests/lib/common.sh
. "$(dirname "${BASH_SOURCE[0]}")/../lib/common.sh"

fail() {
    echo "criu-repro: FAIL: $*" >&2
    for f in "$WORK"/target.out "$WORK"/ctl.log "$WORK"/dump.log "$WORK"/restore.log; do
        [ -f "$f" ] && { echo "----- $f" >&2; tail -n 40 "$f" >&2; }
    done
    exit 1
}

for f in ccm-sim-target ccm-sim-ctl libcuda_test_double.so libnvml_test_double.so; do
    [ -e "$BIN/$f" ] || fail "$BIN/$f is missing; run: cargo build -p ccm-sim-common -p cuda-test-double -p nvml-test-double"
done

rm -rf "$WORK"
mkdir -p "$WORK/lib" "$WORK/state" "$WORK/img" "$WORK/no-plugins"
cp "$BIN/libcuda_test_double.so" "$WORK/lib/libcuda.so.1"
cp "$BIN/libnvml_test_double.so" "$WORK/lib/libnvidia-ml.so.1"
cat >"$WORK/gpus.json" <<JSON
{"driver_version":"580.159.04","cuda_driver_version":13000,"gpus":[
 {"uuid":"$G0","pci_bus_id":"0000:06:00.0","pci_device_id":"0x233510de","pci_subsystem_id":"0x18bf10de","minor":0,"name":"NVIDIA H200","memory_total":1073741824},
 {"uuid":"$G1","pci_bus_id":"0000:07:00.0","pci_device_id":"0x233510de","pci_subsystem_id":"0x18bf10de","minor":1,"name":"NVIDIA H200","memory_total":1073741824}]}
JSON
export LD_LIBRARY_PATH=$WORK/lib CCM_SIM_CONFIG=$WORK/gpus.json CCM_SIM_STATE_DIR=$WORK/state
unset CUDA_VISIBLE_DEVICES CCM_SIM_VISIBLE CCM_SIM_FAULTS

# The target must not inherit descriptors (CRIU would have to restore them) and must lead its own
# session (so CRIU needs no --shell-job).
(
    close_inherited_fds
    exec setsid "$BIN/ccm-sim-target" --go "$WORK/go" --bytes $((8 << 20)) </dev/null >"$WORK/target.out" 2>&1
) &
PID=$!
# criu dump kills the target; keep bash from reporting that.
disown "$PID"
for _ in $(seq 200); do
    grep -q '^READY' "$WORK/target.out" 2>/dev/null && break
    sleep 0.05
done
grep -q "^READY pid=$PID\$" "$WORK/target.out" || fail "the target did not start as pid $PID"

ctl() { "$BIN/ccm-sim-ctl" "$PID" "$@" >>"$WORK/ctl.log" 2>&1; }
ctl lockckpt || fail "lock + checkpoint failed"
grep -q '^CTL state=2$' "$WORK/ctl.log" || fail "the target is not CHECKPOINTED"
for fd in "/proc/$PID/fd/"*; do
    case $(readlink "$fd" 2>/dev/null) in
    *"$WORK/state"*) fail "the checkpointed target still holds a descriptor in the state directory" ;;
    esac
done

criu dump -t "$PID" -D "$WORK/img" --libdir "$WORK/no-plugins" -v4 -o dump.log ||
    fail "criu dump failed"
for _ in $(seq 100); do [ -d "/proc/$PID" ] || break; sleep 0.05; done
[ -d "/proc/$PID" ] && fail "the target survived criu dump"
criu restore -d -D "$WORK/img" --libdir "$WORK/no-plugins" -v4 -o restore.log ||
    fail "criu restore failed"
[ -d "/proc/$PID" ] || fail "criu restore did not bring back pid $PID"

: >"$WORK/ctl.log"
ctl state || fail "state after criu restore"
grep -q '^CTL state=2$' "$WORK/ctl.log" || fail "the restored target is not CHECKPOINTED"
ctl restore swap || fail "restore with the swap map failed"
ctl unlock || fail "unlock failed"
touch "$WORK/go"
for _ in $(seq 200); do
    grep -q '^IDENTITY' "$WORK/target.out" && break
    sleep 0.05
done

out=$WORK/target.out
grep -q '^DATA intact$' "$out" || fail "device memory did not survive"
grep -q "^AFTER ordinal=0 cuda_uuid=$G1 cuda_bus_id=0000:06:00.0 attr_bus_id=0000:06:00.0 nvml_uuid_at_bus_id=$G0 agree=no\$" "$out" ||
    fail "ordinal 0 does not show the stale identity"
grep -q "^AFTER ordinal=1 cuda_uuid=$G0 cuda_bus_id=0000:07:00.0 attr_bus_id=0000:07:00.0 nvml_uuid_at_bus_id=$G1 agree=no\$" "$out" ||
    fail "ordinal 1 does not show the stale identity"
grep '^AFTER' "$out"
echo "REPRO OK"
