#!/usr/bin/env bash
# Issue 47's benchmark on the GPU machine: the sample workload dumped and restored under real CRIU 4.1.1 with the
# plugin, CRIU_CUDA_MIGRATE_STAGING=criu (CRIU's page walk writes the driver's staging pages) side by side with
# =plugin (the plugin's page file, parallel, zero chunks left out), per device-memory size and image storage, in one
# run. Every restore is checked: the workload's next round must find its device data intact.
#
#   bash tests/gpu/staging-bench.sh                       (after tests/gpu/prepare.sh; .device carried)
#   CCM_SB_PLAN="tmpfs:1,8,32 disk:8" bash tests/gpu/staging-bench.sh
#   CCM_SB_PLAN="tmpfs:kv disk:kv" bash tests/gpu/staging-bench.sh   (the torch case below)
#
# A size `kv` is the issue's torch case instead of the sample workload: tests/gpu/torch_workload.py with 16 GiB of
# weights (a pattern) and a KV-cache-like 16 GiB allocation of which 2 GiB are written (CCM_SB_KV="WEIGHTS KV
# WRITTEN", in MiB, changes them); its row's GiB column reads `kv`, and the page file's size is compared with the
# bytes written (weights + written KV) in the log and the table's notes.
#
# Writes $OUT/staging-bench.tsv (one row per run) and $OUT/staging-bench.md (the table for docs/BENCHMARKS.md), and
# each run's CRIU logs under $OUT/logs/. Columns: storage, GiB, mode, dump wall, the driver's checkpoint, the
# plugin's staging write (GB/s), CRIU's own part of the dump (wall - checkpoint - staging write), restore wall, the
# plugin's staging fill, the driver's restore, image size, peak host memory used during the dump (MemAvailable's
# drop), data intact. The storage's sequential speed (dd with O_DIRECT, 4 GiB) is measured first.
set -uo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
export CCM_WORK=${CCM_WORK:-/var/tmp/ccm-staging-bench}
# setup, launch_workload, dump, restore, round, record, fail, criu_tail, CHECK, cleanup_processes.
# shellcheck source=tests/gpu/run.sh
CCM_GPU_RUN_AS_LIB=1 . "$REPO/tests/gpu/run.sh"

PLAN=${CCM_SB_PLAN:-tmpfs:1,8,32 disk:8}
TSV=$RESULTS_DIR/staging-bench.tsv
MD=$RESULTS_DIR/staging-bench.md

storage_dir() { # STORAGE
    case $1 in
    tmpfs) echo /dev/shm/ccm-staging-bench ;;
    *) echo /var/tmp/ccm-staging-bench-disk ;;
    esac
}

# seq_speed DIR: "write W GB/s, read R GB/s" of 4 GiB with O_DIRECT (buffered where the filesystem refuses it).
seq_speed() {
    local f=$1/dd.bin w r flag=direct
    dd if=/dev/zero of="$f" bs=8M count=1 oflag=direct 2>/dev/null || flag=""
    w=$(dd if=/dev/zero of="$f" bs=8M count=512 ${flag:+oflag=$flag} conv=fsync 2>&1 | awk '/copied/ { print $(NF-1), $NF }')
    sync
    echo 3 >/proc/sys/vm/drop_caches
    r=$(dd if="$f" of=/dev/null bs=8M ${flag:+iflag=$flag} 2>&1 | awk '/copied/ { print $(NF-1), $NF }')
    rm -f "$f"
    echo "write $w, read $r (${flag:-buffered})"
}

# mem_sampler FILE: writes the lowest MemAvailable (kB) seen, every 50 ms, until killed.
mem_sampler() {
    local low=999999999999 a
    while :; do
        a=$(awk '/^MemAvailable:/ { print $2 }' /proc/meminfo)
        ((a < low)) && low=$a && echo "$low" >"$1"
        sleep 0.05
    done
}

# timing LOG PATTERN: the first number before " s" on the plugin's line matching PATTERN.
timing() { grep -a "$2" "$1" 2>/dev/null | head -n1 | grep -oE '[0-9]+\.[0-9]+ s' | head -n1 | cut -d' ' -f1; }

# launch_kv_workload DIR: the torch case (see the header), W_PID its pid once ready.
launch_kv_workload() {
    local dir=$1 weights kv written
    read -r weights kv written <<<"${CCM_SB_KV:-16384 16384 2048}"
    mkdir -p "$dir"
    start_detached "$dir" "$dir/torch.log" python3 "$REPO/tests/gpu/torch_workload.py" --dir "$dir" --mib "$weights" \
        --kv-mib "$kv" --kv-written-mib "$written" --rounds 2
    if ! wait_file "$dir/ready" "$READY_TIMEOUT" "$STARTED_PID"; then
        fail "$CASE" "torch workload ready" "not ready in ${READY_TIMEOUT}s: $(tail -n 2 "$dir/torch.log" | tr '\n' ' ')"
    fi
    W_PID=$(<"$dir/ready")
    W_PID=${W_PID//[!0-9]/}
    log "$CASE: torch, $weights MiB of weights, $kv MiB KV of which $written MiB written: pid $W_PID"
}

# keep_failed DIR: a failed run's logs, the workload's output and the kernel's last words (an OOM kill) kept in the
# results folder, its images freed.
keep_failed() {
    dmesg 2>/dev/null | tail -n 20 >"$1/dmesg-tail.txt"
    free -m >"$1/free.txt" 2>&1
    save_logs "$1"
    cleanup_processes
    rm -rf "$1"
}

one_run() { # STORAGE GIB MODE
    local storage=$1 gib=$2 mode=$3 base d avail0 low peak size ckpt write fill drst criu_own data
    base=$(storage_dir "$storage")
    d=$base/$storage-$mode-$gib
    rm -rf "$d"
    mkdir -p "$d"
    CASE="staging-$storage-${gib}GiB-$mode"
    if [[ $gib == kv ]]; then
        launch_kv_workload "$d/w"
    else
        launch_workload "$d/w" $((gib * 1024)) 0 2
    fi
    sync
    echo 3 >/proc/sys/vm/drop_caches
    avail0=$(awk '/^MemAvailable:/ { print $2 }' /proc/meminfo)
    mem_sampler "$d/low" &
    local sampler=$!
    export CRIU_CUDA_MIGRATE_STAGING=$mode
    if ! dump "$W_PID" "$d/img" "$d/dump.log"; then
        kill "$sampler" 2>/dev/null
        record "$CASE" "dump, restore, data intact" "dump failed: $(first_error "$d/dump.log")" FAIL "dump ${DUMP_SECS}s"
        keep_failed "$d"
        return
    fi
    kill "$sampler" 2>/dev/null
    wait "$sampler" 2>/dev/null
    low=$(cat "$d/low" 2>/dev/null || echo "$avail0")
    peak=$(((avail0 - low) / 1024))
    size=$(du -sb "$d/img" | cut -f1)
    # The restore reads the images from the storage, not from the page cache the dump left.
    sync
    echo 3 >/proc/sys/vm/drop_caches
    if ! restore "$d/img" "$d/restore.log"; then
        record "$CASE" "dump, restore, data intact" "restore failed: $(first_error "$d/restore.log")" FAIL "dump ${DUMP_SECS}s restore ${RESTORE_SECS}s"
        keep_failed "$d"
        return
    fi
    data=no
    if [[ $gib == kv ]]; then
        round "$d/w" 1 "$W_PID" && "${CHECK[@]}" torch "$d/w/report1.json" >/dev/null && data=yes
    elif round "$d/w" 1 "$W_PID" && "${CHECK[@]}" report "$d/w/report1.json" --data-ok >/dev/null; then
        data=yes
    fi
    ckpt=$("${CHECK[@]}" phase "$d/dump.log" checkpoint)
    drst=$("${CHECK[@]}" phase "$d/restore.log" restore)
    write=$(timing "$d/dump.log" 'timing: staging write')
    fill=$(timing "$d/restore.log" 'timing: staging fill')
    criu_own=$(awk -v w="$DUMP_SECS" -v c="${ckpt:-0}" -v s="${write:-0}" 'BEGIN { printf "%.2f", w - c - s }')
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$storage" "$gib" "$mode" "$DUMP_SECS" "${ckpt:-n/a}" \
        "${write:--}" "$criu_own" "$RESTORE_SECS" "${fill:--}" "${drst:-n/a}" "$((size >> 20))" "$peak" "$data" >>"$TSV"
    log "$CASE: dump ${DUMP_SECS}s (ckpt $ckpt, staging write ${write:--}), restore ${RESTORE_SECS}s (fill ${fill:--}, driver $drst), $((size >> 20)) MiB, peak +${peak} MiB, data $data"
    local status=PASS
    [[ $data == yes ]] || status=FAIL
    record "$CASE" "dump, restore, data intact" "data $data" "$status" "dump ${DUMP_SECS}s restore ${RESTORE_SECS}s"
    grep -a 'criu-cuda-migrate' "$d/dump.log" | grep -a -E 'timing|staging|checkpoint' >"$d/plugin-dump.txt"
    grep -a 'criu-cuda-migrate' "$d/restore.log" | grep -a -E 'timing|staging|restore' >"$d/plugin-restore.txt"
    round "$d/w" 2 "$W_PID" >/dev/null 2>&1
    save_logs "$d"
    cleanup_processes
    rm -rf "$d"
}

setup
printf 'storage\tGiB\tmode\tdump_s\tckpt_s\tstaging_write_s\tcriu_own_s\trestore_s\tstaging_fill_s\tdriver_restore_s\timage_MiB\tpeak_host_MiB\tdata_intact\n' >"$TSV"
speeds=()
for item in $PLAN; do
    storage=${item%%:*}
    mkdir -p "$(storage_dir "$storage")"
    speeds+=("$storage: $(seq_speed "$(storage_dir "$storage")")")
    log "storage $storage: ${speeds[-1]}"
    IFS=, read -r -a sizes <<<"${item#*:}"
    for gib in "${sizes[@]}"; do
        for mode in criu plugin; do
            # In a subshell: a case's `fail` ends that run only.
            (one_run "$storage" "$gib" "$mode")
            cleanup_processes
        done
    done
done
{
    echo "GPU: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -n1); $(nproc) CPUs"
    # What decides how fast the driver pins the staging pages: huge pages or not, and which memory node they are on.
    echo "transparent huge pages: $(cat /sys/kernel/mm/transparent_hugepage/enabled 2>/dev/null), defrag $(cat /sys/kernel/mm/transparent_hugepage/defrag 2>/dev/null); $(lscpu 2>/dev/null | grep -i '^NUMA node(s)' | tr -s ' ')"
    for s in "${speeds[@]}"; do echo "storage $s"; done
    echo
    echo "| storage | GiB | mode | dump wall | driver checkpoint | staging write | CRIU's own (dump) | restore wall | staging fill | driver restore | images | peak host memory (dump) | data |"
    echo "|---|---|---|---|---|---|---|---|---|---|---|---|---|"
    tail -n +2 "$TSV" | awk -F'\t' '{ printf "| %s | %s | %s | %s s | %s s | %s | %s s | %s s | %s | %s s | %s MiB | %s MiB | %s |\n", $1, $2, $3, $4, $5, ($6 == "-" ? "-" : $6 " s"), $7, $8, ($9 == "-" ? "-" : $9 " s"), $10, $11, $12, $13 }'
} >"$MD"
cat "$MD"
print_table | tee "$RESULTS_DIR/table.txt"
grep -q $'\tFAIL\t' "$RESULTS" && exit 1
exit 0
