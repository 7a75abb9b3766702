#!/usr/bin/env bash
# The plugin's whole flow under REAL CRIU on the TEST DOUBLES (CI has no GPU):
#   ccm-sample-workload on both simulated GPUs → criu dump with the plugin (lock, parallel
#   checkpoint, identity image) → criu restore -d with the plugin and a device map → report.
#
# Runs inside the trixie root: tests/criu-root.sh run tests/sim/plugin-flow.sh BIN_DIR CASE
#   BIN_DIR  cargo's target dir holding libcriu_cuda_migrate.so, ccm-sample-workload, the doubles
#   CASE     same | swap | swap-noreconcile | chain3 | refuse | cycle3 | no-plugin | two-procs | memory | forked |
#            forked-swap | managed | node
# Prints `FLOW <case> OK` and exits 0 when the case shows what it must; exits 1 with logs otherwise.
set -euo pipefail

BIN=${1:?usage: plugin-flow.sh BIN_DIR CASE}
CASE=${2:?usage: plugin-flow.sh BIN_DIR CASE}
WORK=${CCM_FLOW_WORK:-/tmp/ccm-flow-$CASE}
# shellcheck source=tests/sim/stack.sh
. "$(dirname "${BASH_SOURCE[0]}")/stack.sh"

fail() {
    echo "plugin-flow[$CASE]: FAIL: $*" >&2
    for f in "$WORK"/w*.out "$WORK"/img*/dump.log "$WORK"/img*/restore.log; do
        [ -f "$f" ] && { echo "----- $f" >&2; grep -E "criu-cuda-migrate|Error|rror \(" "$f" | tail -n 60 >&2; }
    done
    exit 1
}

# The memory case fills a small GPU: 64 MiB each.
[ "$CASE" = memory ] && SIM_MEMORY_TOTAL=$((64 << 20))
case $CASE in
cycle3) sim_stack_setup 3 ;;
node) sim_stack_setup 8 ;;
*) sim_stack_setup 2 ;;
esac
# Every case ends what it started, restored processes included, even when it fails.
trap sim_stack_cleanup EXIT

# start DIR DEVICES: a workload leading its own session, holding no inherited descriptor
# (WL_MIB: MiB per device, default 8; WL_ARGS: more arguments, e.g. --device-props).
start() {
    local dir=$1 devices=$2
    (
        close_inherited_fds
        # shellcheck disable=SC2086
        exec setsid "$BIN/ccm-sample-workload" --dir "$dir" --mib "${WL_MIB:-8}" --devices "$devices" --rounds 4 ${WL_ARGS:-} </dev/null >"$dir.out" 2>&1
    ) &
    disown $!
    for _ in $(seq 200); do [ -s "$dir/ready" ] && break; sleep 0.05; done
    [ -s "$dir/ready" ] || fail "workload in $dir did not get ready"
    cat "$dir/ready"
}

# go DIR ROUND: lets the workload report and waits for its report.
go() {
    local dir=$1 k=$2
    : >"$dir/go$k"
    for _ in $(seq 200); do [ -e "$dir/done$k" ] && break; sleep 0.05; done
    [ -e "$dir/done$k" ] || fail "no report $k from $dir"
    cat "$dir/report$k.json"
}

dump() { # IMG PID
    mkdir -p "$1"
    criu dump -t "$2" -D "$1" --libdir "$WORK/plugins" -v4 -o dump.log || fail "criu dump failed"
    # The dumped tasks are killed; their pids must be free again before CRIU restores them.
    local core p
    for core in "$1"/core-*.img; do
        p=${core##*/core-}
        p=${p%.img}
        for _ in $(seq 200); do [ -d "/proc/$p" ] || break; sleep 0.05; done
        [ -d "/proc/$p" ] && fail "pid $p survived criu dump"
    done
    return 0
}
restore() { # IMG
    criu restore -d -D "$1" --libdir "$WORK/plugins" -v4 -o restore.log
}
# check_props DIR ROUND: the runtime-style cudaDeviceProp copies name the GPUs the driver reports, and
# the decoys beside them are byte for byte as written.
check_props() {
    local r="$1/report$2.json" flat
    flat=$(tr -d ' \n' <"$r")
    grep -q '"device_props":{' <<<"$flat" || fail "no device_props in $r"
    grep -q '"decoys_intact":true' <<<"$flat" || fail "a decoy cudaDeviceProp was touched: $(cat "$r")"
    grep -q '"decoys_intact":true,"all_agree":true' <<<"$flat" || fail "a cudaDeviceProp copy names the old GPU: $(cat "$r")"
}

# stand_in_cleanup: what sim_stack_cleanup ends, and the stand-ins' loop devices detached.
stand_in_cleanup() {
    local l
    sim_stack_cleanup
    for l in "${LOOPS[@]}"; do losetup -d "$l" 2>/dev/null || true; done
}

# stand_in_nodes GPUS: the NVIDIA nodes as the test doubles present them to the plugin (loop_stand_ins,
# tests/lib/common.sh: loop-control as /dev/nvidiactl, a loop block device over a scratch file as /dev/nvidiaN for each
# of the first GPUS GPUs), named to the plugin and the CLI in CCM_TEST_DOUBLE_NVIDIA_DEVICES.
stand_in_nodes() {
    trap stand_in_cleanup EXIT
    loop_stand_ins "$WORK" "$1" || fail "no free loop device for a stand-in of /dev/nvidiaN"
    export CCM_TEST_DOUBLE_NVIDIA_DEVICES=$STAND_INS
}

case $CASE in
same)
    pid=$(start "$WORK/w0" 0,1)
    dump "$WORK/img" "$pid"
    [ -f "$WORK/img/cuda-migrate-$pid.img" ] || fail "no identity image written"
    restore "$WORK/img" || fail "criu restore failed"
    go "$WORK/w0" 1 >/dev/null
    check_agree "$WORK/w0" 1
    ;;
swap | swap-noreconcile)
    pid=$(WL_ARGS=--device-props start "$WORK/w0" 0,1)
    dump "$WORK/img" "$pid"
    export CRIU_CUDA_MIGRATE_DEVICE_MAP="$G0=$G1,$G1=$G0"
    [ "$CASE" = swap-noreconcile ] && export CRIU_CUDA_MIGRATE_RECONCILE=off
    restore "$WORK/img" || fail "criu restore failed"
    go "$WORK/w0" 1 >/dev/null
    r="$WORK/w0/report1.json"
    grep -q '"all_data_ok": *true' "$r" || fail "data not intact: $(cat "$r")"
    uuid0=$(ordinal_uuid "$r" 0)
    [ "$uuid0" = "$G1" ] || fail "ordinal 0 is $uuid0, expected $G1 after the swap"
    if [ "$CASE" = swap ]; then
        check_agree "$WORK/w0" 1
        check_props "$WORK/w0" 1
        # The workload's 2 copies (and a stack copy of one, when its main thread left one there); the decoys are
        # among the look-alikes left alone, and so are libcuda's own UUID copies.
        grep -Eq "[2-9] cudaDeviceProp cop\(ies\) \(" "$WORK/img/dump.log" ||
            fail "the dump did not find the 2 copies: $(grep -a 'identity:' "$WORK/img/dump.log")"
        grep -Eq "cudaDeviceProp copies: [2-9] rewritten, 0 already right, 0 skipped" "$WORK/img/restore.log" ||
            fail "the restore did not rewrite the copies: $(grep -a 'reconciliation' "$WORK/img/restore.log")"
        grep -q "preflight: device memory: " "$WORK/img/restore.log" || fail "the preflight did not check device memory"
        grep -q "sites recorded at dump" "$WORK/img/restore.log" || fail "restore did not use the recorded sites"
        # The tool reads the same images: the GPUs, and the report the plugin left next to them.
        "$BIN/criu-cuda-migrate" inspect "$WORK/img" >"$WORK/inspect.txt" || fail "criu-cuda-migrate inspect failed"
        { grep -q "cuda:0" "$WORK/inspect.txt" && grep -q "sites rewritten" "$WORK/inspect.txt"; } ||
            fail "inspect lacks the GPUs or the restore report: $(cat "$WORK/inspect.txt")"
        "$BIN/criu-cuda-migrate" --json inspect "$WORK/img" >"$WORK/inspect.json" || fail "inspect --json failed"
        # JSON for scripts: GPUs as nvidia-smi writes them, not as byte arrays.
        { grep -q '"processes"' "$WORK/inspect.json" && grep -q "\"uuid\": \"$G0\"" "$WORK/inspect.json"; } ||
            fail "inspect --json lacks the processes or GPU $G0 as text: $(head -c 600 "$WORK/inspect.json")"
        "$BIN/criu-cuda-migrate" --json node | grep -q "\"uuid\":\"$G1\"" || fail "node --json lacks GPU $G1 as text"
        "$BIN/criu-cuda-migrate" preflight "$WORK/img" --device-map "$G0=$G1,$G1=$G0" >"$WORK/preflight.txt" ||
            fail "preflight refused a valid map: $(cat "$WORK/preflight.txt")"
        grep -q "preflight passed" "$WORK/preflight.txt" || fail "preflight output: $(cat "$WORK/preflight.txt")"
        if "$BIN/criu-cuda-migrate" preflight "$WORK/img" --usable-gpus "$G1" >"$WORK/preflight2.txt"; then
            fail "preflight accepted 1 usable GPU for a process that uses 2"
        fi
        grep -q "preflight refused" "$WORK/preflight2.txt" || fail "preflight refusal output: $(cat "$WORK/preflight2.txt")"
        # With a container bundle: the GPUs its spec gives the container, as the plugin reads them at restore.
        mkdir -p "$WORK/bundle1" "$WORK/bundle2"
        echo '{"ociVersion":"1.2.0","linux":{"devices":[{"path":"/dev/nvidia1","type":"c","major":195,"minor":1}]}}' >"$WORK/bundle1/config.json"
        echo '{"ociVersion":"1.2.0","linux":{"devices":[{"path":"/dev/nvidia0","type":"c","major":195,"minor":0},{"path":"/dev/nvidia1","type":"c","major":195,"minor":1}]}}' >"$WORK/bundle2/config.json"
        if env -u CRIU_CUDA_MIGRATE_DEVICE_MAP "$BIN/criu-cuda-migrate" preflight "$WORK/img" --bundle "$WORK/bundle1" >"$WORK/preflight3.txt"; then
            fail "preflight accepted a bundle giving 1 GPU for a process that uses 2: $(cat "$WORK/preflight3.txt")"
        fi
        { grep -q "usable GPUs from the bundle's spec (linux.devices /dev/nvidia1 (minor 1)): $G1" "$WORK/preflight3.txt" && grep -q "preflight refused" "$WORK/preflight3.txt"; } ||
            fail "preflight --bundle output: $(cat "$WORK/preflight3.txt")"
        env -u CRIU_CUDA_MIGRATE_DEVICE_MAP "$BIN/criu-cuda-migrate" preflight "$WORK/img" --bundle "$WORK/bundle2" >"$WORK/preflight4.txt" ||
            fail "preflight refused a bundle giving both GPUs: $(cat "$WORK/preflight4.txt")"
    else
        grep -q '"all_agree": *false' "$r" || fail "without reconciliation the bug must show: $(cat "$r")"
        tr -d ' \n' <"$r" | grep -q '"decoys_intact":true,"all_agree":false' ||
            fail "without reconciliation the cudaDeviceProp copies must still name the old GPUs: $(cat "$r")"
    fi
    ;;
chain3)
    pid=$(WL_ARGS=--device-props start "$WORK/w0" 0,1)
    for k in 1 2 3; do
        dump "$WORK/img$k" "$pid"
        if [ $((k % 2)) -eq 1 ]; then
            export CRIU_CUDA_MIGRATE_DEVICE_MAP="$G0=$G1,$G1=$G0"
        else
            export CRIU_CUDA_MIGRATE_DEVICE_MAP="$G1=$G0,$G0=$G1"
        fi
        restore "$WORK/img$k" || fail "criu restore $k failed"
        go "$WORK/w0" "$k" >/dev/null
        check_agree "$WORK/w0" "$k"
        check_props "$WORK/w0" "$k"
    done
    ;;
memory)
    # 8 MiB of device memory on G0 at dump; G1 (64 MiB) is mostly held by another process.
    pid=$(CUDA_VISIBLE_DEVICES=$G0 start "$WORK/w0" 0)
    dump "$WORK/img" "$pid"
    "$BIN/criu-cuda-migrate" inspect "$WORK/img" >"$WORK/inspect.txt" || fail "inspect failed"
    grep "$G0" "$WORK/inspect.txt" | grep -Eq ' 8$' || fail "inspect does not show 8 MiB held on $G0: $(cat "$WORK/inspect.txt")"
    hog=$(CUDA_VISIBLE_DEVICES=$G1 WL_MIB=60 start "$WORK/w1" 0)
    sum_before=$(sha256sum "$WORK"/img/*.img | sha256sum)
    export CRIU_CUDA_MIGRATE_USABLE_GPUS=$G1
    if "$BIN/criu-cuda-migrate" preflight "$WORK/img" >"$WORK/preflight.txt"; then
        fail "preflight accepted a GPU without room: $(cat "$WORK/preflight.txt")"
    fi
    grep -q "preflight refused: GPU $G1 (NVIDIA H200) has 4 MiB (4194304 bytes) free but" "$WORK/preflight.txt" ||
        fail "preflight's memory refusal: $(cat "$WORK/preflight.txt")"
    if restore "$WORK/img"; then fail "a restore onto a GPU without room was not refused"; fi
    grep -q "has 4 MiB (4194304 bytes) free but the checkpoint's process(es) \[$pid\] need" "$WORK/img/restore.log" ||
        fail "no memory refusal in the restore log: $(grep -a 'criu-cuda-migrate' "$WORK/img/restore.log" | tail -5)"
    [ -d "/proc/$pid" ] && fail "a refused restore left pid $pid behind"
    [ "$sum_before" = "$(sha256sum "$WORK"/img/*.img | sha256sum)" ] || fail "images changed after a refused restore"
    # The other process ends (its memory freed): the same images restore onto G1.
    go "$WORK/w1" 1 >/dev/null
    go "$WORK/w1" 2 >/dev/null
    go "$WORK/w1" 3 >/dev/null
    go "$WORK/w1" 4 >/dev/null
    for _ in $(seq 100); do [ -d "/proc/$hog" ] || break; sleep 0.05; done
    restore "$WORK/img" || fail "the restore after freeing memory failed"
    go "$WORK/w0" 1 >/dev/null
    check_agree "$WORK/w0" 1
    [ "$(ordinal_uuid "$WORK/w0/report1.json" 0)" = "$G1" ] || fail "ordinal 0 not on $G1"
    ;;
parity)
    # One preflight, two front ends: for each case, `criu-cuda-migrate preflight` and the plugin's init(RESTORE)
    # under real CRIU give the same verdict, and a refusal the same reason. The images are dumped once; each
    # refused restore leaves them as they were.
    pid=$(start "$WORK/w0" 0,1)
    dump "$WORK/img" "$pid"
    sum=$(sha256sum "$WORK"/img/*.img | sha256sum)
    cp "$WORK/gpus.json" "$WORK/gpus.json.orig"
    # The same checkpoint as an archive laid out as Podman exports one (checkpoint/ beside spec.dump), gzip'd:
    # the CLI's archive form must give the directory form's verdict, word for word.
    mkdir -p "$WORK/export"
    cp -a "$WORK/img" "$WORK/export/checkpoint"
    echo '{"ociVersion":"1.0.2","process":{"env":["NVIDIA_VISIBLE_DEVICES=all"]}}' >"$WORK/export/spec.dump"
    tar -C "$WORK/export" -czf "$WORK/export.tar.gz" checkpoint spec.dump
    verdicts() { # NAME: prints `NAME cli=<passed|refused> plugin=<passed|refused>` and compares the reasons
        local name=$1 cli plugin cli_why plugin_why
        if "$BIN/criu-cuda-migrate" preflight "$WORK/img" >"$WORK/p-$name.txt" 2>&1; then cli=passed; else cli=refused; fi
        cli_why=$(sed -n 's/^preflight refused: //p' "$WORK/p-$name.txt" | head -n1 || true)
        local arch arch_why
        if "$BIN/criu-cuda-migrate" preflight "$WORK/export.tar.gz" >"$WORK/a-$name.txt" 2>&1; then arch=passed; else arch=refused; fi
        arch_why=$(sed -n 's/^preflight refused: //p' "$WORK/a-$name.txt" | head -n1 || true)
        { [ "$arch" = "$cli" ] && [ "$arch_why" = "$cli_why" ]; } ||
            fail "$name: the archive form says $arch ($arch_why), the directory form $cli ($cli_why): $(cat "$WORK/a-$name.txt")"
        # The plugin's verdict without restoring anything: CRIU's init fails on a refusal; a pass restores, so
        # it is undone by killing the restored tree at once (the images stay).
        if restore "$WORK/img"; then plugin=passed; kill -9 "$pid" 2>/dev/null; for _ in $(seq 100); do [ -d "/proc/$pid" ] || break; sleep 0.05; done
        else plugin=refused; fi
        plugin_why=$(grep -a -m1 "restore refused before anything was restored: " "$WORK/img/restore.log" | sed 's/.*restore refused before anything was restored: //; s/\. The images are unchanged; fix this and run the restore again\.$//' || true)
        echo "VERDICT $name cli=$cli archive=$arch plugin=$plugin"
        [ "$cli" = "$plugin" ] || fail "$name: the CLI says $cli, the plugin $plugin: CLI: $(cat "$WORK/p-$name.txt"); plugin: $plugin_why"
        if [ "$cli" = refused ]; then
            { [ -n "$cli_why" ] && [ "$cli_why" = "$plugin_why" ]; } || fail "$name: different reasons: CLI: $cli_why; plugin: $plugin_why"
        fi
        [ "$sum" = "$(sha256sum "$WORK"/img/*.img | sha256sum)" ] || fail "$name: the images changed"
    }
    # A map onto a GPU this node lacks, from the environment: both name the variable.
    CRIU_CUDA_MIGRATE_DEVICE_MAP="$G0=GPU-0badc0de-0000-0000-0000-000000000000,$G1=$G0" verdicts unknown-target
    # A usable set of one GPU for a process that uses two.
    CRIU_CUDA_MIGRATE_USABLE_GPUS=$G1 verdicts too-few-usable
    # No NVML on this node.
    CCM_SIM_FAULTS=nvml-missing verdicts no-nvml
    # A driver newer than this build knows, with a map that moves GPUs: the restore-argument layout gate (the
    # CLI lacked it before: it passed what the plugin refused).
    sed -i 's/"cuda_driver_version":13000/"cuda_driver_version":14000/' "$WORK/gpus.json"
    CRIU_CUDA_MIGRATE_DEVICE_MAP="$G0=$G1,$G1=$G0" verdicts newer-driver-with-map
    cp "$WORK/gpus.json.orig" "$WORK/gpus.json"
    # And a pass: both accept the swap.
    CRIU_CUDA_MIGRATE_DEVICE_MAP="$G0=$G1,$G1=$G0" verdicts swap
    ;;
refuse)
    # Limited to GPU 0 like a container's rank: it opens only GPU 0's node, so only GPU 0 is "used".
    pid=$(CUDA_VISIBLE_DEVICES=$G0 start "$WORK/w0" 0)
    dump "$WORK/img" "$pid"
    sum_before=$(sha256sum "$WORK"/img/*.img | sha256sum)
    # A usable set naming a GPU that does not exist: preflight must refuse before anything is restored.
    export CRIU_CUDA_MIGRATE_USABLE_GPUS=GPU-00000000-0000-0000-0000-000000000000
    if restore "$WORK/img"; then fail "restore was not refused"; fi
    grep -q "restore refused before anything was restored" "$WORK/img/restore.log" || fail "no refusal message"
    [ -d "/proc/$pid" ] && fail "a refused restore left pid $pid behind"
    sum_after=$(sha256sum "$WORK"/img/*.img | sha256sum)
    [ "$sum_before" = "$sum_after" ] || fail "images changed after a refused restore"
    # Then a valid usable set: automatic map onto GPU 1.
    export CRIU_CUDA_MIGRATE_USABLE_GPUS=$G1
    restore "$WORK/img" || fail "restore with a valid usable set failed"
    go "$WORK/w0" 1 >/dev/null
    check_agree "$WORK/w0" 1
    uuid0=$(ordinal_uuid "$WORK/w0/report1.json" 0)
    [ "$uuid0" = "$G1" ] || fail "automatic map put ordinal 0 on $uuid0, expected $G1"
    # The environment names the GPU the process now runs on, for its children.
    tr '\0' '\n' <"/proc/$pid/environ" | grep -qx "CUDA_VISIBLE_DEVICES=$G1" || fail "CUDA_VISIBLE_DEVICES was not rewritten to $G1"
    ;;
cycle3)
    # Three GPUs moved in a cycle (0->1, 1->2, 2->0): rewritten from one snapshot of the sites.
    pid=$(start "$WORK/w0" 0,1,2)
    dump "$WORK/img" "$pid"
    export CRIU_CUDA_MIGRATE_DEVICE_MAP="$G0=$G1,$G1=$G2,$G2=$G0"
    restore "$WORK/img" || fail "criu restore failed"
    go "$WORK/w0" 1 >/dev/null
    check_agree "$WORK/w0" 1
    [ "$(ordinal_uuid "$WORK/w0/report1.json" 0)" = "$G1" ] || fail "ordinal 0 not on $G1"
    [ "$(ordinal_uuid "$WORK/w0/report1.json" 1)" = "$G2" ] || fail "ordinal 1 not on $G2"
    [ "$(ordinal_uuid "$WORK/w0/report1.json" 2)" = "$G0" ] || fail "ordinal 2 not on $G0"
    ;;
no-plugin)
    # The dump lists the plugin in CRIU's image inventory: a restore without it must fail clearly
    # instead of resuming a process whose GPU state was never restored. Then with it, it works.
    pid=$(start "$WORK/w0" 0)
    dump "$WORK/img" "$pid"
    mkdir -p "$WORK/no-plugins"
    if criu restore -d -D "$WORK/img" --libdir "$WORK/no-plugins" -v4 -o restore-without.log; then
        fail "a restore without the plugin succeeded"
    fi
    grep -q "Missing required plugin" "$WORK/img/restore-without.log" || fail "CRIU did not name the missing plugin"
    restore "$WORK/img" || fail "criu restore with the plugin failed"
    go "$WORK/w0" 1 >/dev/null
    check_agree "$WORK/w0" 1
    ;;
two-procs)
    # One tree: a shell with two workloads, one per GPU. Dump and restore it whole, swapped. The test doubles have no
    # kernel driver, so the importer check cannot run: multi-process warn dumps them anyway (the default refuses).
    export CRIU_CUDA_MIGRATE_MULTI_PROCESS=warn
    (
        close_inherited_fds
        # shellcheck disable=SC2016 # the inner bash expands $0-$3 and $$
        exec setsid bash -c '"$0" --dir "$1/w0" --mib 8 --devices 0 --rounds 2 >"$1/w0.out" 2>&1 &
            "$0" --dir "$1/w1" --mib 8 --devices 1 --rounds 2 >"$1/w1.out" 2>&1 &
            wait' "$BIN/ccm-sample-workload" "$WORK" </dev/null >"$WORK/tree.out" 2>&1
    ) &
    root=$!
    disown $root
    for _ in $(seq 200); do [ -s "$WORK/w0/ready" ] && [ -s "$WORK/w1/ready" ] && break; sleep 0.05; done
    [ -s "$WORK/w1/ready" ] || fail "tree did not get ready"
    dump "$WORK/img" "$root"
    [ "$(count_files "$WORK"/img/cuda-migrate-[0-9]*.img)" = 2 ] || fail "expected 2 identity images"
    grep -q "checkpoint of 2 CUDA process(es)" "$WORK/img/dump.log" || fail "the two processes were not checkpointed together"
    export CRIU_CUDA_MIGRATE_DEVICE_MAP="$G0=$G1,$G1=$G0"
    restore "$WORK/img" || fail "criu restore of the tree failed"
    go "$WORK/w0" 1 >/dev/null
    go "$WORK/w1" 1 >/dev/null
    check_agree "$WORK/w0" 1
    check_agree "$WORK/w1" 1
    [ "$(ordinal_uuid "$WORK/w0/report1.json" 0)" = "$G1" ] || fail "process 0 not on $G1"
    ;;
forked)
    # A child forked after cuInit (a DataLoader worker's shape) that holds NVIDIA nodes without a CUDA context.
    # The test doubles present as the NVIDIA nodes two devices this machine has (docs/TEST-DOUBLES.md):
    # loop-control (char 10:237) as /dev/nvidiactl, and a loop block device over a scratch file as /dev/nvidia0,
    # which the child both holds open and maps (a mapping of a device CRIU cannot dump, as the driver's).
    stand_in_nodes 1
    pid=$(WL_ARGS="--forked-child --child-open /dev/nvidiactl,/dev/nvidia0 --child-map /dev/nvidia0:65536" start "$WORK/w0" 0)
    child=$(cat "$WORK/w0/forked")
    # The job check names the child as a process without a CUDA context whose nodes are handled, and says ready (it
    # sees no GPU of the doubles' parent: it reads the kernel driver's list, which the doubles do not fake).
    "$BIN/criu-cuda-migrate" job --pid "$pid" >"$WORK/job.txt" 2>&1 || fail "job check refused: $(cat "$WORK/job.txt")"
    grep -Eq "^$child +ccm-sample-work +fork" "$WORK/job.txt" || fail "job check did not mark the child: $(cat "$WORK/job.txt")"
    grep -q "pid $child (ccm-sample-work): no CUDA context, 2 NVIDIA descriptor(s) and 1 device mapping(s).*: handled" "$WORK/job.txt" ||
        fail "job check did not name the forked child as handled: $(cat "$WORK/job.txt")"
    # A --leave-running dump first: the tree runs on, the child with its own descriptors, untouched.
    mkdir -p "$WORK/img-r"
    criu dump -R -t "$pid" -D "$WORK/img-r" --libdir "$WORK/plugins" -v4 -o dump.log || fail "criu dump -R failed"
    [ -f "$WORK/img-r/cuda-migrate-devices.img" ] || fail "no device claims written by the leave-running dump"
    kill -0 "$child" || fail "the forked child did not run on after --leave-running"
    go "$WORK/w0" 1 >/dev/null
    check_agree "$WORK/w0" 1
    dump "$WORK/img" "$pid"
    [ -f "$WORK/img/cuda-migrate-devices.img" ] || fail "no device claims written"
    grep -q "pid $child (ccm-sample-work) is no CUDA process but holds 2 NVIDIA descriptor(s) and 1 device mapping(s)" "$WORK/img/dump.log" ||
        fail "the dump did not claim the child's nodes"
    "$BIN/criu-cuda-migrate" inspect "$WORK/img" >"$WORK/inspect.txt" 2>&1 || fail "inspect failed: $(cat "$WORK/inspect.txt")"
    grep -q "pid $child (ccm-sample-work): 2 GPU descriptor(s), 1 device mapping(s)" "$WORK/inspect.txt" ||
        fail "inspect does not show the claims: $(cat "$WORK/inspect.txt")"
    restore "$WORK/img" || fail "criu restore failed"
    grep -q "RESTORE_EXT_FILE(file .*reopened as fd" "$WORK/img/restore.log" || fail "no descriptor reopened"
    grep -q "UPDATE_VMA_MAP(.*placeholder fd" "$WORK/img/restore.log" || fail "no placeholder mapped"
    # The restored child holds the restoring node's nodes again, and a placeholder where the device was mapped.
    links=$(for f in "/proc/$child"/fd/*; do readlink "$f"; done)
    grep -qx /dev/nvidiactl <<<"$links" || fail "restored child lacks /dev/nvidiactl: $links"
    grep -qx /dev/nvidia0 <<<"$links" || fail "restored child lacks /dev/nvidia0: $links"
    grep -q "criu-cuda-migrate-placeholder" "/proc/$child/maps" || fail "no placeholder in the child's maps: $(cat "/proc/$child/maps")"
    go "$WORK/w0" 2 >/dev/null
    check_agree "$WORK/w0" 2
    # A chained move: the restored child (reopened descriptors, placeholders) is dumped and restored again.
    dump "$WORK/img2" "$pid"
    grep -q "pid $child (ccm-sample-work) is no CUDA process but holds 2 NVIDIA descriptor(s)" "$WORK/img2/dump.log" ||
        fail "the second dump did not claim the restored child's descriptors"
    restore "$WORK/img2" || fail "the chained restore failed"
    go "$WORK/w0" 3 >/dev/null
    check_agree "$WORK/w0" 3
    : >"$WORK/w0/child-exit"
    go "$WORK/w0" 4 >/dev/null
    tr -d ' \n' <"$WORK/w0/report4.json" | grep -q '"forked_child":{"pid":'"$child"',"exit_code":7}' ||
        fail "the forked child's exit code was not kept: $(cat "$WORK/w0/report4.json")"
    ;;
forked-swap)
    # The same child on node A's GPU 0, restored with the swap map: its GPU descriptor is reopened as the node of the
    # GPU the map gives (/dev/nvidia1), never by the path in the images; the parent's identity is reconciled.
    stand_in_nodes 2
    pid=$(WL_ARGS="--forked-child --child-open /dev/nvidiactl,/dev/nvidia0 --child-map /dev/nvidia0:65536" start "$WORK/w0" 0)
    child=$(cat "$WORK/w0/forked")
    dump "$WORK/img" "$pid"
    export CRIU_CUDA_MIGRATE_DEVICE_MAP="$G0=$G1,$G1=$G0"
    "$BIN/criu-cuda-migrate" preflight "$WORK/img" >"$WORK/preflight.txt" 2>&1 || fail "preflight refused: $(cat "$WORK/preflight.txt")"
    grep -q "reopened as /dev/nvidia1" "$WORK/preflight.txt" || fail "preflight does not plan /dev/nvidia1: $(cat "$WORK/preflight.txt")"
    # A bundle whose devices cgroup lets the container open GPU 0's node only (as Podman's `restore --import` keeps
    # the checkpoint's spec), both GPUs usable: the preflight refuses the swap onto GPU 1 as the plugin does, naming
    # the node.
    mkdir -p "$WORK/bundle-denied"
    IFS=: read -r _ maj0 min0 <<<"${STAND_IN_NUMBERS[0]}"
    printf '{"ociVersion":"1.2.0","linux":{"devices":[{"path":"/dev/nvidia0","type":"b","major":%s,"minor":%s}],"resources":{"devices":[{"allow":false,"access":"rwm"},{"allow":true,"type":"b","major":%s,"minor":%s,"access":"rwm"}]}}}\n' \
        "$maj0" "$min0" "$maj0" "$min0" >"$WORK/bundle-denied/config.json"
    if "$BIN/criu-cuda-migrate" preflight "$WORK/img" --bundle "$WORK/bundle-denied" --usable-gpus "$G0,$G1" \
        >"$WORK/preflight-denied.txt" 2>&1; then
        fail "preflight accepted a restore onto a GPU whose node the bundle's devices cgroup denies: $(cat "$WORK/preflight-denied.txt")"
    fi
    grep -q "does not let the container open /dev/nvidia1 (block 7:" "$WORK/preflight-denied.txt" ||
        fail "preflight --bundle did not name the denied node: $(cat "$WORK/preflight-denied.txt")"
    restore "$WORK/img" || fail "criu restore with the swap map failed"
    grep -q "reopened as /dev/nvidia1 (block 7:" "$WORK/img/restore.log" || fail "the plan did not map the child's GPU node"
    links=$(for f in "/proc/$child"/fd/*; do readlink "$f"; done)
    grep -qx /dev/nvidia1 <<<"$links" || fail "the restored child does not hold /dev/nvidia1: $links"
    if grep -qx /dev/nvidia0 <<<"$links"; then fail "the restored child still holds /dev/nvidia0: $links"; fi
    go "$WORK/w0" 1 >/dev/null
    check_agree "$WORK/w0" 1
    [ "$(ordinal_uuid "$WORK/w0/report1.json" 0)" = "$G1" ] || fail "the parent is not on $G1 after the swap"
    ;;
node)
    # The seed's job at node scale (issue 46): a torchrun-like tree of CCM_NODE_RANKS ranks (8) on GPUs 0-3 of an
    # 8-GPU node (two ranks per GPU, each seeing only its own GPU), each rank with CCM_NODE_WORKERS (32) children
    # forked after cuInit that hold /dev/nvidiactl and their rank's /dev/nvidiaN and map it. Dumped whole; restored
    # where only GPUs 4-7 are usable (another pod has 0-3): every worker's GPU descriptor opens a usable GPU, the one
    # its rank's map gives; the claims hold every worker.
    ranks=${CCM_NODE_RANKS:-8}
    workers=${CCM_NODE_WORKERS:-32}
    stand_in_nodes 8
    export CRIU_CUDA_MIGRATE_MULTI_PROCESS=warn
    {
        echo '#!/bin/bash'
        for ((r = 0; r < ranks; r++)); do
            g=$((r / 2))
            mkdir -p "$WORK/w$r"
            echo "CUDA_VISIBLE_DEVICES=${SIM_UUIDS[$g]} '$BIN/ccm-sample-workload' --dir '$WORK/w$r' --mib 1 --devices 0 --rounds 2 --forked-child --forked-children $workers --child-open /dev/nvidiactl,/dev/nvidia$g --child-map /dev/nvidia$g:65536 >'$WORK/w$r.out' 2>&1 &"
        done
        echo wait
    } >"$WORK/ranks.sh"
    (
        close_inherited_fds
        exec setsid bash "$WORK/ranks.sh" </dev/null >"$WORK/tree.out" 2>&1
    ) &
    root=$!
    disown $root
    for ((r = 0; r < ranks; r++)); do
        for _ in $(seq 600); do [ -s "$WORK/w$r/ready" ] && break; sleep 0.1; done
        [ -s "$WORK/w$r/ready" ] || fail "rank $r did not get ready: $(cat "$WORK/w$r.out")"
    done
    "$BIN/criu-cuda-migrate" job --pid "$root" >"$WORK/job.txt" 2>&1 || fail "job check refused: $(tail -n 3 "$WORK/job.txt")"
    forks=$(grep -Ec '^[0-9]+ +ccm-sample-work +fork' "$WORK/job.txt")
    [ "$forks" = $((ranks * workers)) ] || fail "job check marked $forks forked workers, not $((ranks * workers)): $(tail -n 3 "$WORK/job.txt")"
    t0=$(date +%s.%N)
    dump "$WORK/img" "$root"
    t1=$(date +%s.%N)
    holders=$(grep -c '^{"holder"' "$WORK/img/cuda-migrate-devices.img")
    [ "$holders" = $((ranks * workers)) ] || fail "the claims hold $holders processes, not $((ranks * workers))"
    grep -q "device claims before the first lock: $((ranks * workers)) process(es) of the tree hold NVIDIA nodes" "$WORK/img/dump.log" ||
        fail "no claims bound check before the first lock: $(grep -a 'device claims' "$WORK/img/dump.log")"
    export CRIU_CUDA_MIGRATE_USABLE_GPUS="${SIM_UUIDS[4]},${SIM_UUIDS[5]},${SIM_UUIDS[6]},${SIM_UUIDS[7]}"
    restore "$WORK/img" || fail "criu restore of the node's tree failed"
    t2=$(date +%s.%N)
    # Every worker holds a usable GPU's node (4-7) and none of 0-3 (another pod's).
    bad=0
    for ((r = 0; r < ranks; r++)); do
        first=$(cat "$WORK/w$r/forked")
        links=$(for f in /proc/"$first"/fd/*; do readlink "$f"; done)
        grep -Eqx '/dev/nvidia[4-7]' <<<"$links" || bad=1
        grep -Eqx '/dev/nvidia[0-3]' <<<"$links" && bad=1
    done
    [ "$bad" = 0 ] || fail "a restored worker holds a GPU outside the usable set"
    if grep -a "reopened as /dev/nvidia[0-3] " "$WORK/img/restore.log"; then fail "a descriptor was planned on GPU 0-3"; fi
    for ((r = 0; r < ranks; r++)); do
        go "$WORK/w$r" 1 >/dev/null
        check_agree "$WORK/w$r" 1
        u=$(ordinal_uuid "$WORK/w$r/report1.json" 0)
        case ",$CRIU_CUDA_MIGRATE_USABLE_GPUS," in *",$u,"*) ;; *) fail "rank $r restored on $u, outside the usable GPUs" ;; esac
        : >"$WORK/w$r/child-exit"
        go "$WORK/w$r" 2 >/dev/null
        tr -d ' \n' <"$WORK/w$r/report2.json" | grep -q '"exit_code":7' || fail "rank $r's workers did not all exit 7: $(cat "$WORK/w$r/report2.json")"
    done
    echo "NODE ranks=$ranks workers=$workers claims_bytes=$(stat -c %s "$WORK/img/cuda-migrate-devices.img") dump_s=$(awk -v a="$t0" -v b="$t1" 'BEGIN{printf "%.1f", b-a}') restore_s=$(awk -v a="$t1" -v b="$t2" 'BEGIN{printf "%.1f", b-a}') images_mb=$(du -sm "$WORK/img" | cut -f1)"
    ;;
managed)
    # A CUDA process with managed memory: the test doubles present a loop block device over a 64 MiB scratch file as
    # /dev/nvidia-uvm, and the workload maps all of it (where the kernel places mmaps), as a cuMemAllocManaged
    # allocation maps the driver's node. The dump refuses it before any lock; it runs on.
    stand_in_nodes 1
    truncate -s 64M "$WORK/uvm.img"
    uvm=$(losetup -f --show "$WORK/uvm.img") || fail "no free loop device for the stand-in of /dev/nvidia-uvm"
    LOOPS+=("$uvm")
    mknod /dev/nvidia-uvm b 7 "${uvm#/dev/loop}"
    export CCM_TEST_DOUBLE_NVIDIA_DEVICES="$CCM_TEST_DOUBLE_NVIDIA_DEVICES,block:7:${uvm#/dev/loop}=nvidia-uvm"
    pid=$(WL_ARGS="--map /dev/nvidia-uvm:$((64 << 20))" start "$WORK/w0" 0)
    # (The job check's verdict on managed memory is proven on the GPU: it tells CUDA processes by the kernel driver's
    # view, which the doubles do not fake, so here it sees no CUDA process.)
    mkdir -p "$WORK/img"
    if criu dump -t "$pid" -D "$WORK/img" --libdir "$WORK/plugins" -v4 -o dump.log; then fail "criu dump went through"; fi
    grep -q "refused before any lock: pid $pid (ccm-sample-work) maps 64 MiB of CUDA managed memory (1 /dev/nvidia-uvm mapping(s)" "$WORK/img/dump.log" ||
        fail "the dump's refusal does not name the managed memory"
    if grep -q "cuCheckpointProcessLock" "$WORK/img/dump.log"; then fail "the process was locked"; fi
    kill -0 "$pid" || fail "the workload did not run on"
    go "$WORK/w0" 1 >/dev/null
    check_agree "$WORK/w0" 1
    ;;
*)
    fail "unknown case"
    ;;
esac
echo "FLOW $CASE OK"
