#!/usr/bin/env bash
# The main job of criu-cuda-migrate, from a fresh Debian machine: install what is needed, build the plugin, then
# checkpoint and restore a sample workload with real CRIU and the plugin loaded, and say what happened.
#
#   bash scripts/demo.sh
#
# What it runs, in order of preference:
#   gpu    `nvidia-smi -L` lists a GPU: the sample CUDA workload (ccm-sample-workload) under the host's CRIU
#          (>= 4.0; set CCM_CRIU to its path if it is not `criu` on PATH).
#   sim    no GPU: the same sample workload on the simulated NVIDIA stack (TEST DOUBLES of libcuda/NVML from
#          crates/sim, two simulated H200s), under CRIU in the Debian trixie root, restored onto the other
#          simulated GPU (a swap map) so the plugin's reconciliation shows.
#   plain  otherwise: a plain shell process under CRIU in the trixie root; the plugin loads, answers -ENOTSUP
#          ("not a CUDA process") and writes nothing.
# CCM_DEMO_MODE=gpu|sim|plain forces one. CCM_DEMO_DIR (default /tmp/ccm-demo) keeps the images and CRIU's logs.
# At the end it runs the command-line tool it built (target/release/criu-cuda-migrate): `inspect` of the images,
# `node` (the GPUs) and the node readiness check `node --check` (in sim mode against the simulated stack, summed up
# by check and explained: a machine without the package, CRIU or a GPU fails it as expected), each command printed
# with the variables it needs, ready to paste; its last line is the migration's result.
# Needs root (CRIU). Works without a terminal.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
PLUGIN_FILE=libcriu_cuda_migrate.so
WORKLOAD_MARK=ccm-demo-plain-workload
# CRIU's line that it loaded the plugin, and the plugin's own lines ("criu-cuda-migrate: ..." and the init line).
PLUGIN_LINES='Plugin "criu-cuda-migrate"|criu-cuda-migrate( [0-9][^:]*)?: '

say() { echo "demo: $*"; }
die() {
    echo "demo: $*" >&2
    exit 1
}

# ---------------------------------------------------------------------------------------------------------------
# The scenario: start a workload detached, criu dump, criu restore -d, check it. Runs where CRIU runs (inside the
# trixie root through tests/criu-root.sh, or on the host for a GPU), so the process and CRIU share one mount
# namespace. Arguments: KIND (plain|workload) WORK_DIR CRIU [WORKLOAD_BIN]. Environment reaches the workload and
# CRIU unchanged (the simulated stack's variables, CRIU_CUDA_MIGRATE_*).
# ---------------------------------------------------------------------------------------------------------------
scenario() {
    local kind=$1 work=$2 criu=$3 workload_bin=${4:-}
    local images=$work/images plugins=$work/plugins ctl=$work/control pid
    # Inherited fds (the caller's pipes, files outside this namespace) would make the process undumpable.
    for fd in "/proc/$$/fd/"*; do
        n=${fd##*/}
        [ "$n" -gt 2 ] && eval "exec $n>&-"
    done 2>/dev/null

    case "$kind" in
    plain)
        # shellcheck disable=SC2016 # $$, $1-$3 and $i are the inner shells', not this one's
        setsid -f sh -c 'echo $$ >"$1.tmp" && mv "$1.tmp" "$1" && exec sh -c "$2" "$3"' sh "$ctl/ready" \
            'i=0; while :; do i=$((i+1)); echo $i; sleep 0.2; done' "$WORKLOAD_MARK" </dev/null >/tmp/ccm-demo.out 2>&1
        ;;
    workload)
        # The workload writes $ctl/ready (its pid) once its data is on the devices; each round k waits for
        # $ctl/go<k>, writes $ctl/report<k>.json (its device identity as CUDA and NVML see it), then $ctl/done<k>.
        setsid -f "$workload_bin" --dir "$ctl" --mib 64 --rounds 2 </dev/null >"$work/workload.out" 2>&1
        ;;
    esac
    wait_for_file "$ctl/ready" 120 || {
        cat "$work/workload.out" 2>/dev/null >&2
        die "the workload did not start"
    }
    pid=$(cat "$ctl/ready")
    say "workload running as pid $pid"
    if [ "$kind" = workload ]; then
        touch "$ctl/go1"
        wait_for_file "$ctl/done1" 60 || die "the workload did not report before the dump"
    fi

    say "criu dump -t $pid -D $images -v4 -o dump.log --libdir $plugins"
    if ! "$criu" dump -t "$pid" -D "$images" -v4 -o dump.log --libdir "$plugins"; then
        grep -E "Error|$PLUGIN_LINES" "$images/dump.log" | tail -n 20 >&2
        kill -9 "$pid" 2>/dev/null || true
        die "criu dump failed (log: $images/dump.log)"
    fi
    say "the plugin in dump.log ($images/dump.log):"
    grep -E "$PLUGIN_LINES" "$images/dump.log" | grep -E 'CUDA process|cuCheckpoint|identity:|wrote|disabled|not a CUDA' |
        sed 's/^([0-9. ]*) */    /' || say "    (no line of the plugin!)"
    # CRIU restores the same pid; the dumped task must be gone and reaped first.
    for _ in $(seq 400); do [ -e "/proc/$pid" ] || break; sleep 0.05; done

    say "criu restore -d -D $images -v4 -o restore.log --libdir $plugins"
    "$criu" restore -d -D "$images" -v4 -o restore.log --libdir "$plugins" ||
        die "criu restore failed (log: $images/restore.log): $(grep Error "$images/restore.log" | tail -n 5)"
    say "the plugin in restore.log ($images/restore.log):"
    grep -E "$PLUGIN_LINES" "$images/restore.log" | grep -E 'preflight passed|cuCheckpoint|reconciliation:|RUNNING|Error' |
        sed 's/^([0-9. ]*) */    /' || say "    (no line of the plugin!)"

    local written
    # An `if`, not `[ ] &&`: with no image (a plain process) the loop's status must not end the demo under set -e.
    written=$(cd "$images" && for f in cuda-migrate-*; do if [ -e "$f" ]; then printf '%s ' "$f"; fi; done)
    say "images the plugin wrote: ${written:-none}"

    case "$kind" in
    plain)
        local before after
        before=$(tail -n 1 /tmp/ccm-demo.out)
        sleep 1
        after=$(tail -n 1 /tmp/ccm-demo.out)
        kill -9 "$pid" 2>/dev/null || true
        [ "$after" -gt "$before" ] || die "the restored process does not run (counter $before -> $after)"
        result "$work" "the restored process $pid runs: its counter went $before -> $after; the plugin stayed out of its way (not a CUDA process)"
        ;;
    workload)
        touch "$ctl/go2"
        wait_for_file "$ctl/done2" 60 || die "the restored workload did not report"
        identity_table "$ctl/report1.json" "$ctl/report2.json"
        tr -d ' \n' <"$ctl/report2.json" | grep -q '"all_data_ok":true' || die "device data was not intact after the restore"
        tr -d ' \n' <"$ctl/report2.json" | grep -q '"all_agree":true' ||
            die "CUDA's bus ids and NVML disagree after the restore (see restore.log)"
        local moved
        moved=$(moves "$ctl/report1.json" "$ctl/report2.json")
        if [ -n "$moved" ]; then
            result "$work" "pid $pid moved $moved; every identity agrees (CUDA's UUID and bus id, NVML by that bus id) and the device data is intact"
        else
            result "$work" "pid $pid came back on the same GPUs; every identity agrees and the device data is intact"
        fi
        ;;
    esac
}

# result WORK TEXT: the scenario's outcome, said now and kept in WORK/result for the demo's last line.
result() {
    say "RESULT: $2"
    echo "$2" >"$1/result"
}

# field REPORT ORDINAL KEY: one string field of one ordinal of a sample-workload report (there is no JSON tool in
# the trixie root).
field() {
    tr -d ' \n' <"$1" | grep -o '"ordinal":'"$2"',[^}]*' | head -n1 | grep -o '"'"$3"'":"[^"]*"' | head -n1 | cut -d'"' -f4
}
ordinals() { tr -d ' \n' <"$1" | grep -o '"ordinal":[0-9]*' | cut -d: -f2; }
short() { printf '%s' "${1:0:12}"; }

# identity_table BEFORE AFTER: per ordinal, before -> after: the GPU CUDA names, its bus id, NVML's GPU at that bus id.
identity_table() {
    local o
    printf '\n    %-7s | %-27s | %-29s | %-27s\n' "ordinal" "GPU (cuDeviceGetUuid)" "PCI (cuDeviceGetPCIBusId)" "NVML by that bus id"
    printf '    %s\n' "--------+-----------------------------+-------------------------------+----------------------------"
    for o in $(ordinals "$2"); do
        printf '    cuda:%-2s | %s -> %s | %s -> %s | %s -> %s\n' "$o" \
            "$(short "$(field "$1" "$o" uuid)")" "$(short "$(field "$2" "$o" uuid)")" \
            "$(field "$1" "$o" cuda_bus_id)" "$(field "$2" "$o" cuda_bus_id)" \
            "$(short "$(field "$1" "$o" nvml_uuid_by_bus)")" "$(short "$(field "$2" "$o" nvml_uuid_by_bus)")"
    done
    echo
}

# moves BEFORE AFTER: "from GPU-a to GPU-b[, ...]" for the ordinals whose GPU changed; empty when none did.
moves() {
    local o a b out=""
    for o in $(ordinals "$2"); do
        a=$(field "$1" "$o" uuid)
        b=$(field "$2" "$o" uuid)
        [ "$a" != "$b" ] && out="${out:+$out, }cuda:$o from $(short "$a") to $(short "$b")"
    done
    printf '%s' "$out"
}

wait_for_file() {
    local file=$1 seconds=$2 i
    for ((i = 0; i < seconds * 10; i++)); do
        [ -e "$file" ] && return 0
        sleep 0.1
    done
    return 1
}

# ---------------------------------------------------------------------------------------------------------------
# The simulated NVIDIA stack (crates/sim: TEST DOUBLES of libcuda.so.1 and libnvidia-ml.so.1, never packaged).
# sim_stack_env prints the environment (NAME=VALUE lines) that makes ccm-sample-workload and the plugin load the
# doubles and describes two simulated GPUs; sim_stack_setup lays those files out after the build.
# ---------------------------------------------------------------------------------------------------------------
SIM_G0=GPU-5e110000-aabb-ccdd-0001-020304050600
SIM_G1=GPU-5e110001-aabb-ccdd-0001-020304050601

sim_dir() { echo "${CCM_DEMO_DIR:-/tmp/ccm-demo}/sim"; }

sim_stack_env() {
    [ -d "$REPO/crates/sim/libcuda" ] || return 1
    local d
    d=$(sim_dir)
    echo "LD_LIBRARY_PATH=$d/lib"
    echo "CCM_SIM_CONFIG=$d/gpus.json"
    echo "CCM_SIM_STATE_DIR=$d/state"
    echo "CRIU_CUDA_MIGRATE_LIBNVML=$d/lib/libnvidia-ml.so.1"
    # Restore onto the other simulated GPU, so the demo shows a migration and its reconciliation.
    echo "CRIU_CUDA_MIGRATE_DEVICE_MAP=$SIM_G0=$SIM_G1,$SIM_G1=$SIM_G0"
}

sim_stack_setup() {
    local d
    d=$(sim_dir)
    mkdir -p "$d/lib" "$d/state"
    cp "$REPO/target/release/libcuda_test_double.so" "$d/lib/libcuda.so.1"
    cp "$REPO/target/release/libnvml_test_double.so" "$d/lib/libnvidia-ml.so.1"
    cat >"$d/gpus.json" <<JSON
{"driver_version":"580.159.04","cuda_driver_version":13000,"gpus":[
 {"uuid":"$SIM_G0","pci_bus_id":"0000:06:00.0","pci_device_id":"0x233510de","pci_subsystem_id":"0x18bf10de","minor":0,"name":"NVIDIA H200 (simulated)","memory_total":1073741824},
 {"uuid":"$SIM_G1","pci_bus_id":"0000:07:00.0","pci_device_id":"0x233510de","pci_subsystem_id":"0x18bf10de","minor":1,"name":"NVIDIA H200 (simulated)","memory_total":1073741824}]}
JSON
}

pick_mode() {
    if [ -n "${CCM_DEMO_MODE:-}" ]; then
        echo "$CCM_DEMO_MODE"
    elif command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
        echo gpu
    elif sim_stack_env >/dev/null; then
        echo sim
    else
        echo plain
    fi
}

main() {
    cd "$REPO"
    [ -x "$HOME/.cargo/bin/cargo" ] && case ":$PATH:" in *":$HOME/.cargo/bin:"*) ;; *) PATH=$HOME/.cargo/bin:$PATH ;; esac
    [ "$(id -u)" -eq 0 ] || die "CRIU needs root: run \`sudo bash scripts/demo.sh\`"
    local mode
    mode=$(pick_mode)
    case "$mode" in
    gpu) say "mode: GPU (nvidia-smi lists $(nvidia-smi -L | grep -c '^GPU ') GPU(s)): a CUDA workload on the real driver" ;;
    sim) say "mode: SIMULATED (no GPU here): the same workload on the test doubles of libcuda and NVML, moved onto the other simulated GPU" ;;
    plain) say "mode: PLAIN (no GPU, no simulated stack): a plain process; the plugin must stay out of its way" ;;
    esac

    say "installing what is missing (clang, libclang-dev, debootstrap, valgrind)"
    bash scripts/install-deps.sh
    say "preparing the Debian trixie root with CRIU 4.x"
    bash tests/criu-root.sh prepare

    # ccm-workload holds ccm-reaper too, which every mode runs the scenario under; ccm-cli is the command-line tool
    # the demo ends with.
    local packages=(-p criu-cuda-migrate -p ccm-workload -p ccm-cli)
    case "$mode" in
    gpu) ;;
    sim) packages+=(-p cuda-test-double -p nvml-test-double) ;;
    plain) ;;
    *) die "CCM_DEMO_MODE=$mode: expected gpu, sim or plain" ;;
    esac
    say "building (release): cargo build --release ${packages[*]}"
    cargo build --release "${packages[@]}"

    local work=${CCM_DEMO_DIR:-/tmp/ccm-demo}
    rm -rf "$work"
    mkdir -p "$work/images" "$work/plugins" "$work/control"
    # The plugin directory holds our plugin alone, so no other plugin (CRIU's own cuda_plugin.so) answers first.
    cp "target/release/$PLUGIN_FILE" "$work/plugins/"
    local workload_bin=$REPO/target/release/ccm-sample-workload
    # The scenario's detached processes (the workload started with setsid, the tree `criu restore -d` leaves, the
    # plugin's driver agent) are re-parented to ccm-reaper, which reaps them: on a host whose pid 1 does not reap,
    # they would stay behind as zombies.
    local reaper=$REPO/target/release/ccm-reaper

    case "$mode" in
    gpu)
        local criu=${CCM_CRIU:-criu}
        command -v "$criu" >/dev/null 2>&1 || die "a GPU is here but no CRIU >= 4.0 on the host: install criu 4.x (Debian trixie) or set CCM_CRIU"
        say "mode gpu: $(nvidia-smi -L | head -n 4 | tr '\n' ';') CRIU: $("$criu" --version | head -n 1)"
        "$reaper" bash "$REPO/scripts/demo.sh" __scenario workload "$work" "$criu" "$workload_bin"
        ;;
    sim)
        say "mode sim: the simulated NVIDIA stack (test doubles, not a GPU) under CRIU in the trixie root"
        sim_stack_setup
        local env_lines=()
        mapfile -t env_lines < <(sim_stack_env)
        env "${env_lines[@]}" bash tests/criu-root.sh run --bind "$work" -- \
            "$reaper" bash "$REPO/scripts/demo.sh" __scenario workload "$work" criu "$workload_bin"
        ;;
    plain)
        say "mode plain: no GPU and no simulated stack yet; a plain process under CRIU in the trixie root"
        bash tests/criu-root.sh run --bind "$work" -- "$reaper" bash "$REPO/scripts/demo.sh" __scenario plain "$work" criu
        ;;
    esac
    look_at_it "$mode" "$work"
    # The last word is the migration's.
    echo
    say "RESULT ($(mode_words "$mode")): $(cat "$work/result")"
    say "images and CRIU's logs: $work/images (dump.log, restore.log)"
}

# mode_words MODE: what the demo ran on, for its last line.
mode_words() {
    case "$1" in
    gpu) echo "real GPUs" ;;
    sim) echo "simulated GPUs: the test doubles of libcuda and NVML, not a GPU" ;;
    plain) echo "a plain process, no GPU" ;;
    esac
}

# look_at_it MODE WORK: the command-line tool on what the demo left and on this node, each command printed first so
# that it can be pasted (in sim mode with the variables that point the tool at the simulated stack: CCM_SIM_CONFIG,
# the doubles' GPU set, and CRIU_CUDA_MIGRATE_LIBNVML / _LIBCUDA, the doubles themselves, on no library path):
# `inspect` of the images, `node` (the GPUs), and the node readiness check `node --check`, which judges a node for
# production use and is explained for what it is here.
look_at_it() {
    local mode=$1 work=$2 cli=$REPO/target/release/criu-cuda-migrate envs=() d
    if [ "$mode" = sim ]; then
        d=$(sim_dir)
        envs=("CCM_SIM_CONFIG=$d/gpus.json" "CCM_SIM_STATE_DIR=$d/state"
            "CRIU_CUDA_MIGRATE_LIBNVML=$d/lib/libnvidia-ml.so.1" "CRIU_CUDA_MIGRATE_LIBCUDA=$d/lib/libcuda.so.1")
    fi
    local prefix=""
    [ ${#envs[@]} -gt 0 ] && prefix="env ${envs[*]} "
    echo
    say "what the plugin recorded (paste to run again):"
    echo "    $cli inspect $work/images"
    "$cli" inspect "$work/images" | sed 's/^/    /' || say "    inspect failed (exit $?)"
    echo
    if [ "$mode" = plain ]; then
        say "no GPU and no simulated stack: the tool's node commands need a driver; on a GPU node run \`sudo $cli node --check\`"
        say "(is the node ready for GPU checkpoint/restore? each FAIL line names its fix; docs/USER-GUIDE.md section 7.4)"
        return 0
    fi
    say "the GPUs of this node, as the tool sees them (paste to run again$([ "$mode" = sim ] && echo '; the variables point the tool at the simulated GPUs')):"
    echo "    ${prefix}$cli node"
    env "${envs[@]}" "$cli" node 2>&1 | sed 's/^/    /' || say "    node failed (exit ${PIPESTATUS[0]})"
    echo
    local check rc=0
    check=$(env "${envs[@]}" "$cli" node --check 2>&1) || rc=$?
    say "is this node ready for GPU checkpoint/restore in production? \`node --check\` looks for what a GPU node needs:"
    say "the package installed and in the libdir of every CRIU caller, CRIU on the host, the NVIDIA driver's checkpoint"
    say "API, persistence mode, the runtimes' restore settings, CRIU's network lock (iptables) and CDI specs."
    echo "    ${prefix}$cli node --check"
    if [ "$mode" = gpu ]; then
        printf '%s\n' "$check" | sed 's/^/    /'
        [ "$rc" -eq 0 ] || say "not ready (exit $rc): each FAIL line names its fix (docs/USER-GUIDE.md section 7.4); the plugin and libdir lines fail until the package is installed (the demo gave CRIU the plugin it built, with --libdir)"
        return 0
    fi
    # Sim mode: the verdict of each check by name. On a machine without the package, CRIU or a GPU (this one) the
    # FAIL lines are expected and say nothing about the demo; pasting the command shows each line with its fix.
    local verdicts
    verdicts=$(printf '%s\n' "$check" | awk '
        $1 == "FAIL" || $1 == "WARN" || $1 == "ok" { names[$1] = names[$1] (names[$1] == "" ? "" : ", ") $2 }
        END {
            split("FAIL WARN ok", order, " ")
            for (i = 1; i <= 3; i++) if (order[i] in names) printf "%s%s %s", (n++ ? "; " : ""), order[i], names[order[i]]
            print ""
        }')
    echo "    here (exit $rc): $verdicts"
    say "expected on this machine, which is no GPU node: the package is not installed (the demo gave CRIU the plugin it"
    say "built, with --libdir), CRIU runs from the Debian test root, not from the host, and what only containers and real"
    say "GPUs need (CRIU's network lock, persistence mode, CDI specs) is not here; the driver's checks see the simulated"
    say "GPUs. On a GPU node, after \`sudo apt install ./criu-cuda-migrate_*.deb\`, run \`sudo criu-cuda-migrate node"
    say "--check\`: each FAIL line names its fix (docs/USER-GUIDE.md section 7.4)."
    return 0
}

if [ "${1:-}" = "__scenario" ]; then
    shift
    scenario "$@"
else
    main "$@"
fi
