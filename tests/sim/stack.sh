# shellcheck shell=bash
# Sourced by the simulated-stack scripts (plugin-flow.sh, faults.sh): lays out the TEST DOUBLES, the plugin
# and a node of simulated H200s in $WORK, and points this shell's environment at them.
# Needs BIN (cargo's target dir with the built doubles and plugin) and WORK (scratch dir, recreated).

G0=GPU-5e110000-aabb-ccdd-0001-020304050600
G1=GPU-5e110001-aabb-ccdd-0001-020304050601
G2=GPU-5e110002-aabb-ccdd-0001-020304050602
# A node of eight (the `node` case: the seed's layout).
SIM_UUIDS=("$G0" "$G1" "$G2")
for i in 3 4 5 6 7; do SIM_UUIDS+=("GPU-5e11000$i-aabb-ccdd-0001-02030405060$i"); done

# sim_stack_setup GPUS: GPUS simulated H200s (2, 3 or 8) at 0000:06:00.0, 07, 08, ..., minors 0, 1, 2, ..., of 1 GiB
# each (SIM_MEMORY_TOTAL bytes when set).
sim_stack_setup() {
    local n=$1 i sep=""
    local uuids=("${SIM_UUIDS[@]}")
    rm -rf "$WORK"
    mkdir -p "$WORK/lib" "$WORK/state" "$WORK/plugins" "$WORK/w0" "$WORK/w1"
    cp "$BIN/libcuda_test_double.so" "$WORK/lib/libcuda.so.1"
    cp "$BIN/libnvml_test_double.so" "$WORK/lib/libnvidia-ml.so.1"
    cp "$BIN/libcriu_cuda_migrate.so" "$WORK/plugins/"
    {
        echo '{"driver_version":"580.159.04","cuda_driver_version":13000,"gpus":['
        for ((i = 0; i < n; i++)); do
            printf '%s {"uuid":"%s","pci_bus_id":"0000:%02x:00.0","pci_device_id":"0x233510de","pci_subsystem_id":"0x18bf10de","minor":%d,"name":"NVIDIA H200","memory_total":%d}\n' \
                "$sep" "${uuids[$i]}" $((6 + i)) "$i" "${SIM_MEMORY_TOTAL:-1073741824}"
            sep=","
        done
        echo ']}'
    } >"$WORK/gpus.json"
    export LD_LIBRARY_PATH=$WORK/lib CCM_SIM_CONFIG=$WORK/gpus.json CCM_SIM_STATE_DIR=$WORK/state
    export CRIU_CUDA_MIGRATE_LIBNVML=$WORK/lib/libnvidia-ml.so.1
    unset CUDA_VISIBLE_DEVICES CCM_SIM_VISIBLE CCM_SIM_FAULTS CRIU_CUDA_MIGRATE_DEVICE_MAP CRIU_CUDA_MIGRATE_USABLE_GPUS \
        CRIU_CUDA_MIGRATE_MODE CRIU_CUDA_MIGRATE_LIBCUDA CRIU_CUDA_MIGRATE_DISABLE CRIU_CUDA_MIGRATE_RECONCILE \
        CRIU_CUDA_MIGRATE_LEAVE_RUNNING
}

# The shared helpers (tests/lib/common.sh): close_inherited_fds (the processes CRIU dumps must not inherit
# descriptors of files outside the root), agent_alive_of, wait_file, ...
# shellcheck source=tests/lib/common.sh
. "$(dirname "${BASH_SOURCE[0]}")/../lib/common.sh"

# sim_stack_cleanup: kills every workload of this stack, the ones CRIU restored included (they are
# nobody's children here): found by the CCM_SIM_STATE_DIR of their environment, so other runs'
# processes are never touched. Scripts call it at EXIT.
sim_stack_cleanup() {
    local d p cmd
    for d in /proc/[0-9]*; do
        p=${d#/proc/}
        tr '\0' '\n' 2>/dev/null <"$d/environ" | grep -qx "CCM_SIM_STATE_DIR=$WORK/state" || continue
        cmd=$(tr '\0' ' ' 2>/dev/null <"$d/cmdline")
        case $cmd in
        *ccm-sample-workload* | *ccm-sim-target*) kill -9 "$p" 2>/dev/null || true ;;
        esac
    done
}

# check_agree DIR ROUND: the workload's report of that round says its data is intact and its identity agrees (the
# caller's `fail` names what is wrong).
check_agree() {
    local r="$1/report$2.json"
    grep -q '"all_data_ok": *true' "$r" || fail "data not intact in $r: $(cat "$r")"
    grep -q '"all_agree": *true' "$r" || fail "identity disagrees in $r: $(cat "$r")"
}

# ordinal_uuid REPORT ORDINAL: the GPU UUID the workload's report names for that CUDA ordinal.
ordinal_uuid() { tr -d ' \n' <"$1" | grep -o '"ordinal":'"$2"',[^}]*' | grep -o '"uuid":"[^"]*"' | head -n1 | cut -d'"' -f4; }
