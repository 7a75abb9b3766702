#!/usr/bin/env bash
# GPU proofs for the runtimes users run GPUs with (issue 25): Podman and containerd 2.1 with a CDI GPU, and a torchrun
# job under Podman, on one machine and across machines (each GPU machine is another H200 at 0000:00:06.0, so a dump
# on one and a restore on the next is a cross-node move onto another GPU).
#
# Run THERE, from the repository root, as root, after tests/gpu/prepare.sh ran HERE with CCM_PREPARE_RUNTIMES=1
# (docs/GPU-TESTING.md, "Runtimes with CDI on the GPU (issue 25): how to run", says what to carry in which call):
#
#   bash tests/gpu/runtimes.sh stage DIR...          copies carried folders into /var/tmp/ccm-rt (kept while the
#                                                    machine stays warm): runtime-debs-* folders, and the parts of a
#                                                    dump phase (for a restore phase on this machine)
#   bash tests/gpu/runtimes.sh podman-same           Podman + CDI on this machine: run, --leave-running, export and
#                                                    import (zstd), a restore the preflight refuses (archive intact),
#                                                    the same with crun
#   bash tests/gpu/runtimes.sh podman-dump           phase 1 on machine A: $OUT gets meta-podman.txt and the first
#                                                    parts of podman.tar.xz (15 MiB each; `fetch podman` the rest)
#   bash tests/gpu/runtimes.sh podman-restore [DIR]  phase 2 on machine B, with the parts staged or in DIR
#   bash tests/gpu/runtimes.sh containerd-same       containerd 2.1 + CDI: `ctr run --device nvidia.com/gpu=0`,
#                                                    `ctr task checkpoint`, `ctr containers checkpoint --task` and
#                                                    `restore --live`; CRI (CDI_devices, CheckpointContainer, restore
#                                                    by CreateContainer) where python3 has grpc, else a loud skip
#   bash tests/gpu/runtimes.sh containerd-dump       phase 1 (ctr, and CRI where it can run)
#   bash tests/gpu/runtimes.sh containerd-restore [DIR]
#   bash tests/gpu/runtimes.sh torchrun-dump         a 2-rank torchrun job (gloo, both ranks on the GPU) in one Podman
#                                                    container with its own network namespace, checkpointed with
#                                                    --tcp-established mid-training; the uninterrupted run's losses
#   bash tests/gpu/runtimes.sh torchrun-restore [DIR]  restored on machine B: losses equal the uninterrupted run's
#   bash tests/gpu/runtimes.sh torchrun-same         the same on one machine (checkpoint, restore here)
#   bash tests/gpu/runtimes.sh fetch NAME            the next parts of NAME's archive into $OUT
#   Several phases in one call run in order (`stage DIR podman-same podman-dump`).
#
# How the runtimes get here: the machine (Ubuntu 24.04, glibc 2.39) reaches no registry. Debian's .debs are unpacked
# with dpkg -x into /var/tmp/ccm-rt/root (nothing installed system-wide), and each binary runs through a wrapper in
# /var/tmp/ccm-rt/bin that points LD_LIBRARY_PATH at the carried libraries for that binary only: Podman 5.4, crun
# 1.21, conmon, iptables (trixie), containerd 2.1 with its runc shim and ctr (forky), runc 1.1.15 and CRIU 4.1.1 as
# tests/gpu/container.sh has them. Their newest glibc symbol is GLIBC_2.38 (../shared/GPU-FACTS.md), so they run on
# the host's glibc; no Debian root is needed. The machine file in the logs says which way each runtime went.
#
# The containers, as CDI sets them up (tests/gpu/cdi-spec.sh writes /etc/cdi/nvidia.json like `nvidia-ctk cdi
# generate`): the GPU's nodes with their real numbers, the driver's libraries as bind mounts, LD_LIBRARY_PATH. The
# sample workload's image is made here (`podman import` / an OCI archive for ctr) of the workload and the C libraries
# it and the driver's libraries need; the torchrun job's image is an empty root whose /usr is the host's (bound
# read-only, not recursively: CRIU refuses the driver's mount as a submount of /usr) with /opt (torch) and the
# driver's directory (CDI, --libs dir) bound. The plugin comes from the project's .deb, its libdir line in
# /etc/criu/runc.conf (runc), and in /etc/criu/default.conf for crun 1.21 (libcriu 4.1 passes CRIU no other file).
# No plugin setting is given anywhere except where a case says so.
#
# What the doubles in CI (tests/container/podman-cdi-flow.sh, cri-cdi-flow.sh) found, and these runs check on the GPU:
#   - Podman's restore --import takes no --device and reuses the checkpoint's spec: the restored container keeps the
#     dumped node's CDI devices, with the majors of the machine it was dumped on. The machines' majors are compared
#     and a difference is said loudly (the restored /dev and the devices cgroup then name the old majors);
#   - containerd's CRI restore builds the spec from the new CreateContainer request (its CDI devices resolved again);
#   - under crun the plugin does not see the restoring runtime (crun's /proc/PID/exe is "/"): the usable set then
#     comes from no spec; the row says what the restore log says.
#
# Network: Podman's `--network none` gives a container its own network namespace, which CRIU locks with iptables
# (default) or nftables while it dumps. The setup probes which works on this kernel (the host's iptables-restore,
# the carried one, or CRIU's nftables); with none, the sample-workload containers use `--network host` (said in the
# machine file and the rows) and the torchrun case is skipped loudly.
#
# Knobs: CCM_PODMAN_RUNTIME (runc, or crun for every Podman case), CCM_TORCH_PY, CCM_TORCH_STEPS1/2, CCM_XZ_LEVEL,
# CCM_READY_TIMEOUT / CCM_ROUND_TIMEOUT, CCM_REGISTRY_PORT. Only for a dry run of this script on the test doubles
# (tests/gpu/runtimes-dry.sh; never on a GPU machine): CCM_RT_CRIU_ENV (VAR=VALUE words for CRIU's wrapper),
# CCM_RT_CRIU_CONF (more lines for the CRIU configuration files), CCM_RT_CONTAINERS_CONF (more lines for
# containers.conf's [containers]), CCM_RT_CTR_RUN_ARGS (more `ctr run` options), CCM_RT_NO_CRI=1, CCM_RT_SKIP_CRUN
# (why the crun case is not run), CCM_RT_CRI_EXTRA (more lines for containerd's CRI runtime section),
# CCM_RT_RUNC_BINARY (the runc containerd's CRI runs).
#
# Results: $OUT/runtimes-table.md (`| case | expected | seen | result | times |`), $OUT/runtimes-logs.tar.gz (every
# case's CRIU logs, reports, the machine file), and for dump phases meta-NAME.txt and parts; at most 8 files.
set -uo pipefail
# No -e: a status-recording flow. A failed case is recorded as a FAIL row and the next case runs.

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
DEVICE_DIR=${CCM_DEVICE_DIR:-$REPO/.device}
RTD=/var/tmp/ccm-rt
STAGE=$RTD/stage
RT_ROOT=$RTD/root
RT_BIN=$RTD/bin
RT_LIBS=$RT_ROOT/usr/lib/x86_64-linux-gnu:$RT_ROOT/lib/x86_64-linux-gnu
WORK=$RTD/work
XFER=$RTD/xfer
OUTPARTS=$RTD/out
INPARTS=$RTD/in
RESULTS_DIR=$(realpath -m "${OUT:-$WORK/out}")
RESULTS=$RESULTS_DIR/runtimes-results.tsv
LOGS=$RESULTS_DIR/logs
CRIU_ROOT=/opt/criu
CRIU_BIN=$CRIU_ROOT/usr/sbin/criu
CRIU_LIBS=$CRIU_ROOT/usr/lib/x86_64-linux-gnu
RUNC_ROOT_DIR=/opt/runc
DRIVER=${CCM_DRIVER_DIR:-/usr/local/nvidia}
PODMAN_RUNTIME=${CCM_PODMAN_RUNTIME:-runc}
WORKLOAD=$DEVICE_DIR/bin/ccm-sample-workload
CHECK=(python3 "$REPO/tests/gpu/gpu_check.py")
TORCH_PY=${CCM_TORCH_PY:-/opt/torch/.venv/bin/python3}
XZ_LEVEL=${CCM_XZ_LEVEL:-3}
PART_BYTES=15M
# $OUT takes 8 files and 64 MiB: the table, the logs, meta-NAME.txt and this many parts of 15 MiB.
PARTS_PER_CALL=4
READY_TIMEOUT=${CCM_READY_TIMEOUT:-120}
# A round of the sample workload takes well under a second; a restored torch job's second phase some seconds.
ROUND_TIMEOUT=${CCM_ROUND_TIMEOUT:-60}
TORCH_TIMEOUT=${CCM_TORCH_TIMEOUT:-300}
CGROUP_PARENT=/ccm-rt
CTRD_SOCK=/run/ccm-containerd/containerd.sock
CTRD_NS=ccm-rt
# containerd 2.1's CRI restore pulls the checkpoint's base image again by NAME@DIGEST: a registry on a fixed loopback
# port, the same on both machines.
REG=127.0.0.1:${CCM_REGISTRY_PORT:-5055}
IMAGE=localhost/ccm-sample:1
TORCH_IMAGE=localhost/ccm-hostusr:1
export NCCL_NVLS_ENABLE=0

# log, now, elapsed, record CASE EXPECTED SEEN RESULT TIMES, one_line, print_table, wait_file FILE SECONDS, ...
# shellcheck source=tests/lib/common.sh
source "$REPO/tests/lib/common.sh"
first_error() { grep -m3 -E 'Error|criu-cuda-migrate: .*(refused|failed)' "$1" 2>/dev/null | sed 's/.*criu-cuda-migrate: //' | one_line 300; }

plugin_times() { # LOG: the plugin's driver-call times, short (as container.sh)
    grep -o 'cuCheckpointProcess[A-Za-z]* [^;]*[0-9.]* s\|cuInit [0-9.]* s in the driver agent[^)]*)' "$1" 2>/dev/null |
        sed 's/cuCheckpointProcess//; s/ (timeout [0-9]* ms)//; s/ in the driver agent (started at init; this hook waited/ (waited/' | tr '\n' ';' | cut -c1-160
}

check_sample_report() { # FILE [UUID]: the sample workload's report names this machine's GPU and agrees
    local uuid=${2:-$GPU_UUID}
    "${CHECK[@]}" report "$1" --uuid "0=$uuid" --bus "0=$GPU_BUS" --nvml-by-bus "0=$uuid" --consistent --data-ok
}

usable_line() { grep -m1 'usable GPUs: ' "$1" 2>/dev/null | sed 's/.*usable GPUs: //' | cut -c1-220; }

# save CASE FILE...: into the logs of CASE.
save() {
    local dest=$LOGS/$1
    shift
    mkdir -p "$dest"
    cp -r "$@" "$dest/" 2>/dev/null
}

# debs_dir NAME: a folder holding NAME's .debs: .device/NAME as carried, else what `stage` kept.
debs_dir() {
    local d
    for d in "$DEVICE_DIR/$1" "$STAGE/$1"; do
        compgen -G "$d/*.deb" >/dev/null && { echo "$d"; return 0; }
    done
    return 1
}

# wrapper NAME TARGET [LIBS]: RT_BIN/NAME runs TARGET with LD_LIBRARY_PATH=LIBS (for TARGET only).
wrapper() {
    local name=$1 target=$2 libs=${3:-$RT_LIBS}
    cat >"$RT_BIN/$name" <<EOF
#!/bin/sh
# tests/gpu/runtimes.sh: Debian's $name with its own libraries.
LD_LIBRARY_PATH=$libs exec $target "\$@"
EOF
    chmod 755 "$RT_BIN/$name"
}

# ------------------------------------------------------------------------------------------------
# stage: carried folders into /var/tmp/ccm-rt (a later call on the same warm machine finds them there)

phase_stage() {
    local d base n
    mkdir -p "$STAGE" "$INPARTS"
    for d in "$@"; do
        [[ -d $d ]] || { record "stage-$d" "a carried folder" "not a folder" FAIL -; continue; }
        base=$(basename "$d")
        if compgen -G "$d/*.deb" >/dev/null; then
            rm -rf "${STAGE:?}/$base"
            cp -r "$d" "$STAGE/$base"
            record "stage-$base" "staged" "$(count_files "$STAGE/$base"/*.deb) debs, $(du -sm "$STAGE/$base" | cut -f1) MiB in $STAGE/$base" PASS -
        fi
        n=0
        for f in "$d"/meta-*.txt "$d"/*.tar.xz.[0-9]*; do
            [[ -f $f ]] || continue
            cp "$f" "$INPARTS/"
            n=$((n + 1))
        done
        # shellcheck disable=SC2012 # a listing for people to read
        ((n > 0)) && record "stage-parts-$base" "staged" "$n file(s) into $INPARTS: $(ls "$INPARTS" | one_line 200)" PASS -
    done
}

# ------------------------------------------------------------------------------------------------
# Setup: CRIU, runc, the plugin (as tests/gpu/container.sh), the GPU, the network lock

BASE_DONE=0
setup_base() {
    ((BASE_DONE)) && return 0
    local f pkg
    mkdir -p "$RT_BIN" "$WORK" "$LOGS" "$XFER" "$OUTPARTS" "$INPARTS"
    [[ -f $RESULTS ]] || : >"$RESULTS"
    compgen -G "$DEVICE_DIR/criu-debs/*.deb" >/dev/null || { echo "no $DEVICE_DIR/criu-debs: carry .device (prepare.sh)" >&2; exit 2; }
    for f in "$DEVICE_DIR"/criu-debs/*.deb; do dpkg -x "$f" "$CRIU_ROOT"; done
    for f in "$DEVICE_DIR"/runc-debs/*.deb; do dpkg -x "$f" "$RUNC_ROOT_DIR"; done
    pkg=$(first_file "$DEVICE_DIR"/pkg/criu-cuda-migrate_*.deb)
    [[ -n $pkg && -x $WORKLOAD ]] || { echo "no $DEVICE_DIR/pkg/*.deb or bin/ccm-sample-workload: run tests/gpu/prepare.sh" >&2; exit 2; }
    dpkg -x "$pkg" /
    # runc, crun and containerd's shim run `criu` from PATH: CRIU with its own libraries, and the driver's directory
    # (where this machine's libcuda is found; a podman checkpoint runs the runtime with PATH alone).
    cat >"$RT_BIN/criu" <<EOF
#!/bin/sh
LD_LIBRARY_PATH=$CRIU_LIBS:$DRIVER/lib64 exec ${CCM_RT_CRIU_ENV:+env $CCM_RT_CRIU_ENV }$CRIU_BIN "\$@"
EOF
    chmod 755 "$RT_BIN/criu"
    wrapper runc "$RUNC_ROOT_DIR/usr/sbin/runc" "$RUNC_ROOT_DIR/usr/lib/x86_64-linux-gnu"
    export PATH=$RT_BIN:$PATH
    GPU_UUID=$(nvidia-smi --query-gpu=uuid --format=csv,noheader | head -n1 | tr -d ' ')
    GPU_BUS=$(nvidia-smi --query-gpu=pci.bus_id --format=csv,noheader | head -n1 | tr -d ' ')
    GPU_BUS=$(python3 -c 'import sys; b=sys.argv[1].lower(); d,rest=b.split(":",1); print("%04x:%s" % (int(d,16), rest))' "$GPU_BUS")
    GPU_MINOR=$(awk '/Device Minor/ {print $3; exit}' /proc/driver/nvidia/gpus/*/information 2>/dev/null || echo 0)
    MAJORS=$(for n in /dev/nvidiactl /dev/nvidia-uvm /dev/nvidia-uvm-tools "/dev/nvidia$GPU_MINOR"; do
        [[ -e $n ]] && printf '%s=%d:%d ' "$n" "0x$(stat -c %t "$n")" "0x$(stat -c %T "$n")"
    done)
    probe_network_lock
    # The plugin from the package's line: runc.conf for runc; default.conf for crun 1.21 (libcriu 4.1 hands CRIU no
    # other file; default.conf is read by every CRIU).
    mkdir -p /etc/criu
    {
        grep '^libdir' /etc/criu/criu-cuda-migrate.conf.example
        # runc restores a network namespace it made with lo down: the package's action script sets it up (the
        # torchrun ranks' TCP connections on 127.0.0.1 need it; tests/container/podman-tcp-flow.sh).
        sed -n 's/^#\(action-script .*\)$/\1/p' /etc/criu/criu-cuda-migrate.conf.example
        [[ $NETLOCK == nftables || $NETLOCK == skip ]] && echo "network-lock $NETLOCK"
        [[ -n ${CCM_RT_CRIU_CONF:-} ]] && printf '%s\n' "$CCM_RT_CRIU_CONF"
    } >/etc/criu/runc.conf
    rm -f /etc/criu/default.conf
    MACHINE=$LOGS/machine-$(hostname).txt
    {
        echo "host: $(hostname)"
        echo "gpu_uuid: $GPU_UUID"
        echo "gpu_bus: $GPU_BUS"
        echo "gpu_minor: $GPU_MINOR"
        echo "device nodes: $MAJORS"
        echo "driver: $(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -n1)"
        echo "libcuda for CRIU: $(ls "$DRIVER"/lib64/libcuda.so.1 2>&1); ld.so.cache: $(ldconfig -p 2>/dev/null | grep -c 'libcuda.so.1')"
        echo "criu: $(criu --version | head -n1)"
        echo "runc: $(runc --version | head -n1) (Debian trixie, LD_LIBRARY_PATH=/opt/runc's libseccomp)"
        echo "network lock: $NETLOCK ($NETLOCK_WHY)"
        echo "kernel: $(uname -r); cgroup: $(stat -fc %T /sys/fs/cgroup)"
        echo "revision: $(sed -n 's/^revision: //p' "$DEVICE_DIR/MANIFEST" 2>/dev/null)"
    } >"$MACHINE"
    log "GPU $GPU_UUID at $GPU_BUS (minor $GPU_MINOR); $MAJORS; network lock $NETLOCK"
    BASE_DONE=1
}

# probe_network_lock: how CRIU can lock a network namespace here (NETLOCK iptables | nftables | none).
probe_network_lock() {
    local rules=$'*filter\n:CCM-PROBE - [0:0]\nCOMMIT\n' v
    NETLOCK=none NETLOCK_WHY=
    # shellcheck disable=SC2016 # the inner sh expands $1
    if command -v iptables-restore >/dev/null && unshare -n sh -c 'printf "%s" "$1" | iptables-restore -w' sh "$rules" 2>/dev/null; then
        NETLOCK=iptables NETLOCK_WHY="the host's $(command -v iptables-restore)"
        return
    fi
    # The carried iptables (runtime-debs-podman): legacy, then nft. Unpacked here too when only containerd runs:
    # CRIU restores a network namespace's iptables rules with iptables-restore when the dump saved some.
    if [[ ! -x $RT_ROOT/usr/sbin/xtables-legacy-multi && ! -x $RT_ROOT/usr/sbin/xtables-nft-multi ]]; then
        unpack_debs runtime-debs-podman >/dev/null 2>&1
    fi
    if [[ -x $RT_ROOT/usr/sbin/xtables-legacy-multi || -x $RT_ROOT/usr/sbin/xtables-nft-multi ]]; then
        for v in legacy nft; do
            [[ -x $RT_ROOT/usr/sbin/xtables-$v-multi ]] || continue
            wrapper iptables-restore "env XTABLES_LIBDIR=$RT_ROOT/usr/lib/x86_64-linux-gnu/xtables $RT_ROOT/usr/sbin/xtables-$v-multi iptables-restore"
            wrapper ip6tables-restore "env XTABLES_LIBDIR=$RT_ROOT/usr/lib/x86_64-linux-gnu/xtables $RT_ROOT/usr/sbin/xtables-$v-multi ip6tables-restore"
            # shellcheck disable=SC2016 # the inner sh expands $1 and $2
            if unshare -n sh -c 'printf "%s" "$1" | "$2" -w' sh "$rules" "$RT_BIN/iptables-restore" 2>/dev/null; then
                NETLOCK=iptables NETLOCK_WHY="Debian's iptables ($v) from runtime-debs-podman"
                return
            fi
        done
        rm -f "$RT_BIN/iptables-restore" "$RT_BIN/ip6tables-restore"
    fi
    if criu check --feature network-lock-nftables >/dev/null 2>&1; then
        NETLOCK=nftables NETLOCK_WHY="CRIU's libnftables (criu check --feature network-lock-nftables)"
        return
    fi
    NETLOCK_WHY="no iptables-restore works in a new network namespace and criu check --feature network-lock-nftables fails"
    # Then CRIU's default (iptables) fails every dump and restore of a container with its own network namespace
    # (`execvp("iptables-restore") failed`). A sample-workload container has no connection to keep: CRIU's `skip`
    # (no lock) is enough for it, and said in the machine file; the torchrun case (TCP) still needs a real lock.
    if ! criu dump --network-lock skip -t 0 -D /nonexistent 2>&1 | grep -q 'Invalid value for --network-lock'; then
        NETLOCK=skip NETLOCK_WHY="$NETLOCK_WHY: CRIU's network-lock skip (no lock; no case but torchrun keeps a connection)"
    fi
}

# unpack_debs NAME: NAME's .debs into RT_ROOT (dpkg -x, nothing installed).
unpack_debs() {
    local d f
    d=$(debs_dir "$1") || return 1
    mkdir -p "$RT_ROOT"
    for f in "$d"/*.deb; do dpkg -x "$f" "$RT_ROOT" || return 1; done
    echo "$d" >"$RTD/unpacked-$1"
}

PODMAN_DONE=0
setup_podman() {
    ((PODMAN_DONE)) && return 0
    setup_base
    if ! unpack_debs runtime-debs-podman; then
        record podman-setup "Podman from runtime-debs-podman" "no runtime-debs-podman carried or staged (prepare.sh with CCM_PREPARE_RUNTIMES=1; stage it)" SKIP -
        return 1
    fi
    wrapper podman "$RT_ROOT/usr/bin/podman"
    wrapper conmon "$RT_ROOT/usr/bin/conmon"
    # crun dlopens libcriu (libcriu2 is in runtime-debs-podman), which runs `criu swrk` from PATH.
    wrapper crun "$RT_ROOT/usr/bin/crun" "$RT_LIBS:$CRIU_LIBS"
    # CRIU runs `ip` for a network namespace it dumps itself (crun's containers; runc has it dumped empty).
    [[ -x $RT_ROOT/usr/bin/ip ]] && ! command -v ip >/dev/null && wrapper ip "$RT_ROOT/usr/bin/ip"
    probe_network_lock
    {
        grep '^libdir' /etc/criu/criu-cuda-migrate.conf.example
        # runc restores a network namespace it made with lo down: the package's action script sets it up (the
        # torchrun ranks' TCP connections on 127.0.0.1 need it; tests/container/podman-tcp-flow.sh).
        sed -n 's/^#\(action-script .*\)$/\1/p' /etc/criu/criu-cuda-migrate.conf.example
        [[ $NETLOCK == nftables || $NETLOCK == skip ]] && echo "network-lock $NETLOCK"
        [[ -n ${CCM_RT_CRIU_CONF:-} ]] && printf '%s\n' "$CCM_RT_CRIU_CONF"
    } >/etc/criu/runc.conf
    echo "network lock (with the carried iptables): $NETLOCK ($NETLOCK_WHY)" >>"$MACHINE"
    NET=none
    [[ $NETLOCK == none ]] && NET=host
    mkdir -p /etc/containers
    local driver=overlay d
    d=$(mktemp -d)
    mkdir -p "$d/l" "$d/u" "$d/w" "$d/m"
    mount -t overlay overlay -o "lowerdir=$d/l,upperdir=$d/u,workdir=$d/w" "$d/m" 2>/dev/null && umount "$d/m" || driver=vfs
    rm -rf "$d"
    cat >/etc/containers/storage.conf <<EOF
[storage]
driver = "$driver"
runroot = "/run/containers/storage"
graphroot = "/var/lib/containers/storage"
EOF
    echo '{ "default": [ { "type": "insecureAcceptAnything" } ] }' >/etc/containers/policy.json
    : >/etc/containers/registries.conf
    # Podman 5 looks for its network backend (netavark) even when no container gets a network of its own; the
    # containers here use --network none or host, which never run it. A stand-in answers Podman's version query, so
    # no netavark (not carried) is needed.
    mkdir -p "$RT_BIN/podman-helpers"
    # The carried netavark when there is one (it also brings a restored container's loopback up), else the stand-in.
    # shellcheck disable=SC2016 # a script written out: its sh expands $1
    [[ -x $RT_ROOT/usr/lib/podman/netavark ]] || printf '%s\n' '#!/bin/sh' '# criu-cuda-migrate GPU tests: stand-in for netavark (no container here has a network of its own)' \
        'case "$1" in --version | version) echo "netavark 1.14.0" ;; *) echo "{}" ;; esac' >"$RT_BIN/podman-helpers/netavark"
    [[ -e $RT_BIN/podman-helpers/netavark ]] && chmod +x "$RT_BIN/podman-helpers/netavark"
    cat >/etc/containers/containers.conf <<EOF
[containers]
seccomp_profile = "$RT_ROOT/usr/share/containers/seccomp.json"
${CCM_RT_CONTAINERS_CONF:-}
[engine]
cgroup_manager = "cgroupfs"
events_logger = "file"
conmon_path = ["$RT_BIN/conmon"]
helper_binaries_dir = ["$RT_ROOT/usr/lib/podman", "$RT_BIN/podman-helpers"]
conmon_env_vars = ["PATH=$RT_BIN:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]
runtime = "$PODMAN_RUNTIME"
[engine.runtimes]
runc = ["$RT_BIN/runc"]
crun = ["$RT_BIN/crun"]
EOF
    {
        echo "podman: $(podman --version 2>&1) (Debian trixie, dpkg -x, LD_LIBRARY_PATH to the carried libraries)"
        echo "conmon: $(conmon --version 2>&1 | head -n1); crun: $(crun --version 2>&1 | head -n1)"
        echo "podman storage: $driver; network: --network $NET"
    } >>"$MACHINE"
    if ! podman info >"$WORK/podman-info.txt" 2>&1; then
        record podman-setup "podman info works" "$(tail -n3 "$WORK/podman-info.txt" | one_line)" FAIL -
        save podman-setup "$WORK/podman-info.txt"
        return 1
    fi
    PODMAN_DONE=1
}

# sample_rootfs DIR: the sample workload and the C libraries it and the driver's libraries need (ldd).
sample_rootfs() {
    local dir=$1 f lib
    rm -rf "$dir"
    mkdir -p "$dir/usr/local/bin" "$dir/ctl" "$dir/tmp" "$dir/proc" "$dir/sys" "$dir/dev" "$dir/etc" "$dir/run"
    cp "$WORKLOAD" "$dir/usr/local/bin/"
    for f in "$WORKLOAD" "$DRIVER"/lib64/libcuda.so.1 "$DRIVER"/lib64/libnvidia-ml.so.1; do
        ldd "$f" 2>/dev/null | awk '/=> \// { print $3 } /^\t\// { print $1 }'
    done | sort -u | while read -r lib; do
        [[ $lib == "$DRIVER"/* ]] && continue
        [[ -f $lib ]] && cp --parents -L "$lib" "$dir/"
    done
}

# hostusr_rootfs DIR: an empty root for a container whose /usr is the host's.
hostusr_rootfs() {
    local dir=$1 d
    rm -rf "$dir"
    for d in usr opt etc tmp ctl proc sys dev run "${REPO#/}"; do mkdir -p "$dir/$d"; done
    for d in bin lib lib64 sbin; do ln -s "usr/$d" "$dir/$d"; done
    : >"$dir/etc/ld.so.cache"
}

podman_image() { # NAME ROOTFS-FUNCTION
    local name=$1 fn=$2 r=$WORK/rootfs-${1//[^a-z0-9]/_}
    podman image exists "$name" 2>/dev/null && return 0
    "$fn" "$r"
    tar -C "$r" -cf "$r.tar" . && podman import "$r.tar" "$name" >"$WORK/import.log" 2>&1
}

# cdi SPEC-ARGS...: /etc/cdi/nvidia.json for this machine (tests/gpu/cdi-spec.sh).
cdi() {
    bash "$REPO/tests/gpu/cdi-spec.sh" "$@" >"$WORK/cdi.txt" 2>&1 || { cat "$WORK/cdi.txt" >&2; return 1; }
    cp /etc/cdi/nvidia.json "$WORK/cdi.txt" "$LOGS/" 2>/dev/null
}

# ------------------------------------------------------------------------------------------------
# Podman cases

static_dir() { podman inspect --format '{{.StaticDir}}' "$1" 2>/dev/null; }
# archive_preflight ROW ARCHIVE WHAT: the package's `criu-cuda-migrate inspect` and `preflight` read the checkpoint
# archive itself (issue 25, item 4) on this node: the GPU it was dumped on, the map a restore would use, a usable set
# naming no GPU of this node refused (exit 1, "ok":false); the archive byte-identical afterwards.
archive_preflight() {
    local row=$1 a=$2 what=$3 d=$WORK/$1 sum1 sum2 t0 ti tp rc_i rc_p rc_r
    mkdir -p "$d"
    sum1=$(sha256sum <"$a")
    t0=$(now); criu-cuda-migrate inspect "$a" >"$d/inspect.txt" 2>&1; rc_i=$?; ti=$(elapsed "$t0")
    t0=$(now); criu-cuda-migrate preflight "$a" >"$d/preflight.txt" 2>&1; rc_p=$?; tp=$(elapsed "$t0")
    criu-cuda-migrate preflight --json --usable-gpus GPU-00000000-0000-0000-0000-00000000dead "$a" >"$d/refused.json" 2>&1; rc_r=$?
    sum2=$(sha256sum <"$a")
    local seen
    seen="inspect rc $rc_i ($(grep -c "${DUMPED_ON:-$GPU_UUID}" "$d/inspect.txt") line(s) name the GPU it was dumped on); preflight rc $rc_p: $(grep -m1 -E '^(preflight|restore refused)' "$d/preflight.txt" | one_line 120), $(grep -m1 -A1 'dump GPU' "$d/preflight.txt" | tail -n1 | one_line 160); absent usable GPU: rc $rc_r, $(grep -o '"ok": *[a-z]*' "$d/refused.json" | head -n1); archive $([[ $sum1 == "$sum2" ]] && echo unchanged || echo CHANGED)"
    if [[ $rc_i == 0 && $rc_p == 0 && $rc_r == 1 && $sum1 == "$sum2" ]] && grep -q "${DUMPED_ON:-$GPU_UUID}" "$d/inspect.txt" && grep -q '"ok": *false' "$d/refused.json"; then
        record "$row" "inspect and preflight of $what, read in place: the dumped GPU, the map here, an absent GPU refused, archive intact" "$seen" PASS "inspect ${ti}s, preflight ${tp}s, $(du -m "$a" | cut -f1) MiB"
    else
        record "$row" "inspect and preflight of $what" "$seen; $(tail -n2 "$d/inspect.txt" "$d/preflight.txt" | one_line 300)" FAIL -
    fi
    cp "$d"/* "$LOGS/" 2>/dev/null
}

pstate() { podman inspect --format '{{.State.Status}}' "$1" 2>/dev/null; }

# podman_override FILE VAR=VALUE...: a CONTAINERS_CONF_OVERRIDE file giving conmon (so the runtime and CRIU) these.
podman_override() {
    local file=$1 kv
    shift
    {
        echo '[engine]'
        echo 'conmon_env_vars = ['
        echo "  \"PATH=$RT_BIN:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\","
        for kv in "$@"; do echo "  \"$kv\","; done
        echo ']'
    } >"$file"
}

# p_run NAME CTL RUNTIME MIB ROUNDS: the sample workload with GPU 0 through CDI.
p_run() {
    local name=$1 ctl=$2 runtime=$3
    podman rm -f --time 0 "$name" >/dev/null 2>&1
    mkdir -p "$ctl"
    podman run --runtime "$runtime" -d --name "$name" --network "$NET" --cgroup-parent "$CGROUP_PARENT" \
        --device nvidia.com/gpu=0 -v "$ctl:/ctl" "$IMAGE" \
        /usr/local/bin/ccm-sample-workload --dir /ctl --mib "$4" --devices 0 --rounds "$5" >"$WORK/$name.run" 2>&1 &&
        wait_file "$ctl/ready" "$READY_TIMEOUT"
}

go_round() { : >"$1/go$2"; wait_file "$1/done$2" "$ROUND_TIMEOUT"; }

p_checkpoint() { # NAME ARCHIVE FLAGS...: podman container checkpoint --keep --export, dump.log copied next to it
    local name=$1 archive=$2 dir rc
    shift 2
    podman container checkpoint --keep "$@" --export "$archive" "$name" >"$archive.out" 2>&1
    rc=$?
    dir=$(static_dir "$name")
    [[ -n $dir ]] && cp "$dir/dump.log" "$archive.dump.log" 2>/dev/null
    return "$rc"
}

p_restore() { # ARCHIVE LOG [OVERRIDE] [FLAGS...]: podman container restore --keep --import; restore.log to LOG
    local archive=$1 logfile=$2 conf=${3:-} rc id
    shift 3 2>/dev/null || shift $#
    if [[ -n $conf ]]; then
        env CONTAINERS_CONF_OVERRIDE="$conf" podman container restore --keep "$@" --import "$archive" >"$logfile.out" 2>&1
    else
        podman container restore --keep "$@" --import "$archive" >"$logfile.out" 2>&1
    fi
    rc=$?
    id=$(tar -xOf "$archive" config.dump 2>/dev/null | python3 -c 'import json,sys; print(json.load(sys.stdin)["id"])' 2>/dev/null)
    if [[ -n $id ]] && compgen -G "/var/lib/containers/storage/overlay-containers/$id/userdata/restore.log" >/dev/null; then
        cp "/var/lib/containers/storage/overlay-containers/$id/userdata/restore.log" "$logfile"
    else
        find /var/lib/containers/storage -name restore.log -newer "$archive" -exec cat {} + >"$logfile" 2>/dev/null
    fi
    return "$rc"
}

spec_nodes() { # NAME: the /dev/nvidia* nodes of the container's spec, with their numbers
    python3 - "$(static_dir "$1")/config.json" <<'PY' 2>/dev/null
import json, sys
c = json.load(open(sys.argv[1]))
print(" ".join(f"{d['path']}={d.get('major')}:{d.get('minor')}" for d in c.get("linux", {}).get("devices", []) if d["path"].startswith("/dev/nvidia")))
PY
}

phase_podman_same() {
    setup_podman || return 0
    cdi || { record p0-cdi-spec "CDI spec written" "cdi-spec.sh failed: $(tail -n2 "$WORK/cdi.txt" | one_line)" FAIL -; return 0; }
    podman_image "$IMAGE" sample_rootfs || { record p0-image "podman import" "$(tail -n2 "$WORK/import.log" | one_line)" FAIL -; return 0; }
    local c=$WORK/podman-same ctl name=ccm-rt-p1 t0 td tr seen nodes a1 sum1 sum2 err procs usable
    rm -rf "$c"; mkdir -p "$c"
    ctl=$c/ctl
    if ! p_run "$name" "$ctl" "$PODMAN_RUNTIME" 64 4; then
        record p1-podman-cdi-run "the workload runs on this GPU" "not ready: $(tail -n3 "$WORK/$name.run" | one_line) $(podman logs "$name" 2>&1 | tail -n3 | one_line)" FAIL -
        return 0
    fi
    nodes=$(spec_nodes "$name")
    go_round "$ctl" 1
    if seen=$(check_sample_report "$ctl/report1.json"); then
        record p1-podman-cdi-run "podman run --device nvidia.com/gpu=0 ($PODMAN_RUNTIME): CDI's nodes in linux.devices; identity agrees" "spec: $nodes; $seen" PASS -
    else
        record p1-podman-cdi-run "identity agrees" "spec: $nodes; $seen" FAIL -
    fi

    t0=$(now)
    if p_checkpoint "$name" "$c/lr.tar.zst" --leave-running --compress zstd; then
        td=$(elapsed "$t0")
        go_round "$ctl" 2
        if seen=$(check_sample_report "$ctl/report2.json") && [[ $(pstate "$name") == running ]]; then
            record p2-podman-leave-running "checkpoint --leave-running --export --compress zstd: runs on, identity agrees" "$seen; archive $(du -m "$c/lr.tar.zst" | cut -f1) MiB; $(grep -o 'rolling back [0-9]* CUDA process(es)' "$c/lr.tar.zst.dump.log" | head -n1)" PASS "checkpoint ${td}s; $(plugin_times "$c/lr.tar.zst.dump.log")"
        else
            record p2-podman-leave-running "runs on, identity agrees" "state $(pstate "$name"); $seen; the plugin's settings at the dump: $(grep -o 'leave-running [a-z]*[^,]*' "$c/lr.tar.zst.dump.log" | head -n1)" FAIL "checkpoint ${td}s"
        fi
    else
        record p2-podman-leave-running "checkpoint passes" "$(tail -n2 "$c/lr.tar.zst.out" | one_line) $(first_error "$c/lr.tar.zst.dump.log")" FAIL -
    fi

    a1=$c/export.tar.zst
    t0=$(now)
    if ! p_checkpoint "$name" "$a1" --compress zstd; then
        record p3-podman-export-import "checkpoint --export passes" "$(tail -n2 "$a1.out" | one_line) $(first_error "$a1.dump.log")" FAIL -
        save podman-same "$c"; return 0
    fi
    td=$(elapsed "$t0")
    podman rm "$name" >/dev/null 2>&1
    # Refused by the preflight (a usable set naming no GPU of this node): nothing restored, the archive intact.
    sum1=$(sha256sum <"$a1")
    podman_override "$c/refuse.conf" "CRIU_CUDA_MIGRATE_USABLE_GPUS=GPU-00000000-0000-0000-0000-00000000dead"
    if p_restore "$a1" "$c/refused-restore.log" "$c/refuse.conf"; then
        record p4-podman-refused-restore "refused by the preflight" "the restore passed" FAIL -
    else
        sum2=$(sha256sum <"$a1")
        err=$(grep -m1 'restore refused before anything was restored' "$c/refused-restore.log" | sed 's/.*criu-cuda-migrate: //' | cut -c1-160)
        procs=$(pgrep -f -- "--dir /ctl --mib 64 --devices 0 --rounds 4" | wc -l)
        if [[ -n $err && $sum1 == "$sum2" && $procs == 0 ]]; then
            record p4-podman-refused-restore "refused before CRIU restores anything; archive byte-identical; no workload left" "refused: $err; archive sha256 unchanged; left: $(podman ps -a --format '{{.Names}} {{.Status}}' | one_line 80)" PASS -
        else
            record p4-podman-refused-restore "refused cleanly" "err=${err:-none ($(first_error "$c/refused-restore.log"))}; archive $([[ $sum1 == "$sum2" ]] && echo unchanged || echo CHANGED); $procs workload(s) left" FAIL -
        fi
    fi
    podman rm -f --time 0 "$name" >/dev/null 2>&1
    archive_preflight p6-archive-preflight-podman "$a1" "Podman's export (tar.zst)"
    t0=$(now)
    if p_restore "$a1" "$c/restore.log"; then
        tr=$(elapsed "$t0")
        usable=$(usable_line "$c/restore.log")
        go_round "$ctl" 3
        if seen=$(check_sample_report "$ctl/report3.json"); then
            record p3-podman-export-import "checkpoint --export --compress zstd, rm, restore --import (the retry after p4): identity agrees, data intact; the usable set from the restored spec" "$seen; usable GPUs: ${usable:-(no line)}" PASS "checkpoint ${td}s, restore ${tr}s; $(plugin_times "$c/restore.log")"
        else
            record p3-podman-export-import "identity agrees after the restore" "$seen" FAIL "checkpoint ${td}s, restore ${tr}s"
        fi
    else
        record p3-podman-export-import "restore --import passes" "$(tail -n2 "$c/restore.log.out" | one_line) $(first_error "$c/restore.log")" FAIL "checkpoint ${td}s"
    fi
    podman rm -f --time 0 "$name" >/dev/null 2>&1

    # crun (1.21, the plugin from default.conf: libcriu 4.1 hands CRIU no other file): run, checkpoint --export,
    # restore --import.
    if [[ -n ${CCM_RT_SKIP_CRUN:-} ]]; then
        record p5-podman-crun-export-import "crun 1.21: restored, identity agrees" "not run: $CCM_RT_SKIP_CRUN" SKIP -
    elif [[ $PODMAN_RUNTIME != crun ]]; then
        cp /etc/criu/runc.conf /etc/criu/default.conf
        seen=
        name=ccm-rt-p5
        ctl=$c/ctl-crun
        if p_run "$name" "$ctl" crun 64 2 && go_round "$ctl" 1 && p_checkpoint "$name" "$c/crun.tar.zst" --compress zstd; then
            podman rm "$name" >/dev/null 2>&1
            if p_restore "$c/crun.tar.zst" "$c/crun-restore.log" && go_round "$ctl" 2 && seen=$(check_sample_report "$ctl/report2.json"); then
                usable=$(usable_line "$c/crun-restore.log")
                [[ -z $usable ]] && usable="none: $(grep -m1 -o "CRIU's parent ([^)]*) is no OCI runtime[^;]*" "$c/crun-restore.log" || echo 'no line')"
                record p5-podman-crun-export-import "crun 1.21 (default.conf): restored, identity agrees" "$seen; usable GPUs from the spec: $usable" PASS "$(plugin_times "$c/crun-restore.log")"
            else
                record p5-podman-crun-export-import "restored, identity agrees" "${seen:-$(tail -n2 "$c/crun-restore.log.out" | one_line) $(first_error "$c/crun-restore.log")}" FAIL -
            fi
        else
            record p5-podman-crun-export-import "run and checkpoint with crun" "$(tail -n2 "$WORK/$name.run" | one_line) $(tail -n2 "$c/crun.tar.zst.out" 2>/dev/null | one_line) $(first_error "$c/crun.tar.zst.dump.log")" FAIL -
        fi
        podman rm -f --time 0 "$name" >/dev/null 2>&1
        rm -f /etc/criu/default.conf
    fi
    rm -f "$c"/*.tar.zst
    save podman-same "$c"
}

# ------------------------------------------------------------------------------------------------
# Moving a dump to another machine: parts of NAME.tar.xz (15 MiB), handed out PARTS_PER_CALL at a time

# pack NAME: XFER/NAME as OUTPARTS/NAME/NAME.tar.xz.NNN, their sha256 in meta-NAME.txt (with XFER/NAME/meta.txt).
pack() {
    local name=$1 o=$OUTPARTS/$1 t0
    rm -rf "$o"; mkdir -p "$o"
    t0=$(now)
    tar -C "$XFER" -cf - "$name" | xz -"$XZ_LEVEL" -T0 | split -b "$PART_BYTES" -d -a 3 - "$o/$name.tar.xz."
    local st=("${PIPESTATUS[@]}")
    if [[ ${st[*]} != "0 0 0" ]]; then
        record "pack-$name" "$name.tar.xz in parts" "tar | xz | split failed (${st[*]}); is xz installed?" FAIL -
        return 1
    fi
    {
        cat "$XFER/$name/meta.txt"
        echo "xz: -$XZ_LEVEL, $(du -cb "$o"/"$name".tar.xz.* | tail -n1 | cut -f1) bytes in $(count_files "$o"/"$name".tar.xz.*) part(s), $(elapsed "$t0") s"
        (cd "$o" && sha256sum "$name".tar.xz.* | sed 's/^/part: /')
    } >"$o/meta-$name.txt"
    : >"$o/handed"
    hand_out "$name"
}

# hand_out NAME: meta-NAME.txt and the next parts not handed out yet into $OUT, as many as the device tool's 8 files
# leave room for (the table and the logs are 2; another dump phase of the same call may have put files there).
hand_out() {
    local name=$1 o=$OUTPARTS/$1 n=0 p left room
    [[ -f $o/meta-$name.txt ]] || { record "fetch-$name" "parts of $name" "no dump of $name on this machine" FAIL -; return; }
    cp "$o/meta-$name.txt" "$RESULTS_DIR/"
    room=$((8 - 2 - $(find "$RESULTS_DIR" -maxdepth 1 -type f ! -name runtimes-results.tsv ! -name runtimes-table.md ! -name runtimes-logs.tar.gz | wc -l)))
    ((room > PARTS_PER_CALL)) && room=$PARTS_PER_CALL
    for p in "$o/$name".tar.xz.*; do
        grep -qxF "${p##*/}" "$o/handed" && continue
        ((n >= room)) && break
        cp "$p" "$RESULTS_DIR/" && echo "${p##*/}" >>"$o/handed"
        n=$((n + 1))
    done
    left=$(($(count_files "$o/$name".tar.xz.*) - $(wc -l <"$o/handed")))
    record "fetch-$name" "parts of $name.tar.xz in \$OUT" "$n part(s) now; $left left$( ((left > 0)) && echo ": run \`bash tests/gpu/runtimes.sh fetch $name\` on this machine")" PASS -
}

# unpack NAME [DIR]: the parts (DIR, or staged) checked against meta-NAME.txt and unpacked into XFER (same paths as
# on the machine that dumped).
unpack() {
    local name=$1 dir=${2:-} meta bad=0 p
    [[ -n $dir ]] && phase_stage "$dir" >/dev/null
    meta=$INPARTS/meta-$name.txt
    [[ -f $meta ]] || { echo "no meta-$name.txt staged (stage the dump phase's files first)"; return 1; }
    while read -r _ sum p; do
        [[ -f $INPARTS/$p ]] || { echo "part $p missing (fetch it on the dumping machine, stage it here)"; bad=1; continue; }
        [[ $(sha256sum <"$INPARTS/$p" | cut -d' ' -f1) == "$sum" ]] || { echo "part $p damaged"; bad=1; }
    done < <(grep '^part: ' "$meta")
    ((bad)) && return 1
    rm -rf "${XFER:?}/$name"
    mkdir -p "$XFER"
    grep '^part: ' "$meta" | awk '{ print $3 }' | while read -r p; do cat "$INPARTS/$p"; done | xz -d | tar -C "$XFER" -xf - ||
        { echo "unpacking failed"; return 1; }
    cp "$meta" "$LOGS/"
}

meta_get() { sed -n "s/^$2: //p" "$1" | head -n1; } # FILE KEY

# majors_note META: says whether the dumping machine's device numbers are this machine's.
majors_note() {
    local theirs
    [[ -f $1 ]] || return 0
    theirs=$(meta_get "$1" "device nodes")
    if [[ $theirs == "$MAJORS" ]]; then
        echo "device numbers the same on both machines ($MAJORS)"
    else
        echo "DEVICE NUMBERS DIFFER: dumped with [$theirs], here [$MAJORS]: the restored /dev and the devices cgroup keep the dumped ones"
    fi
}

write_meta() { # NAME EXTRA-LINES...
    local name=$1
    shift
    {
        echo "name: $name"
        echo "dumped_on_gpu: $GPU_UUID"
        echo "dumped_on_host: $(hostname)"
        echo "device nodes: $MAJORS"
        echo "network: ${NET:-}"
        printf '%s\n' "$@"
    } >"$XFER/$name/meta.txt"
}

phase_podman_dump() {
    setup_podman || return 0
    cdi || { record px-cdi-spec "CDI spec written" "$(tail -n2 "$WORK/cdi.txt" | one_line)" FAIL -; return 0; }
    podman_image "$IMAGE" sample_rootfs || { record px-image "podman import" "$(tail -n2 "$WORK/import.log" | one_line)" FAIL -; return 0; }
    local x=$XFER/podman name=ccm-rt-px t0 td seen
    rm -rf "$x"; mkdir -p "$x"
    if ! p_run "$name" "$x/ctl" "$PODMAN_RUNTIME" 64 3; then
        record px1-podman-dump "runs on machine A" "not ready: $(tail -n3 "$WORK/$name.run" | one_line)" FAIL -; return 0
    fi
    go_round "$x/ctl" 1
    seen=$(check_sample_report "$x/ctl/report1.json")
    t0=$(now)
    if ! p_checkpoint "$name" "$x/ckpt.tar" --compress none; then
        record px1-podman-dump "checkpoint --export on A" "$(tail -n2 "$x/ckpt.tar.out" | one_line) $(first_error "$x/ckpt.tar.dump.log")" FAIL -; return 0
    fi
    td=$(elapsed "$t0")
    podman rm "$name" >/dev/null 2>&1
    podman save -o "$x/image.tar" "$IMAGE" >/dev/null 2>&1
    write_meta podman "podman: $(podman --version)" "runtime: $PODMAN_RUNTIME" "spec.dump nodes: $(tar -xOf "$x/ckpt.tar" spec.dump | python3 -c 'import json,sys; print(" ".join(d["path"] for d in json.load(sys.stdin)["linux"]["devices"]))' 2>/dev/null)"
    record px1-podman-dump "checkpoint --export on machine A (GPU $GPU_UUID)" "before: $seen; archive $(du -m "$x/ckpt.tar" | cut -f1) MiB" PASS "checkpoint ${td}s; $(plugin_times "$x/ckpt.tar.dump.log")"
    save podman-dump "$x/ckpt.tar.dump.log" "$x/ctl" "$x/meta.txt"
    pack podman
}

phase_podman_restore() {
    setup_podman || return 0
    cdi || { record px-cdi-spec "CDI spec written" "$(tail -n2 "$WORK/cdi.txt" | one_line)" FAIL -; return 0; }
    local why x=$XFER/podman name=ccm-rt-px t0 tr seen gpu_a
    if ! why=$(unpack podman "${1:-}"); then
        record px2-podman-restore "restored on machine B" "$why" FAIL -; return 0
    fi
    gpu_a=$(meta_get "$x/meta.txt" dumped_on_gpu)
    [[ $gpu_a == "$GPU_UUID" ]] && log "WARNING: this machine has the GPU the dump was made on ($GPU_UUID): not a move"
    podman rm -f --time 0 "$name" >/dev/null 2>&1
    podman load -i "$x/image.tar" >"$WORK/load.log" 2>&1 || { record px2-podman-restore "podman load of A's image" "$(tail -n2 "$WORK/load.log" | one_line)" FAIL -; return 0; }
    t0=$(now)
    if ! p_restore "$x/ckpt.tar" "$x/restore.log"; then
        record px2-podman-restore "restore --import on B" "$(tail -n2 "$x/restore.log.out" | one_line) $(first_error "$x/restore.log"); $(majors_note "$x/meta.txt")" FAIL "dumped on $gpu_a"
        save podman-restore "$x/restore.log" "$x/restore.log.out"; return 0
    fi
    tr=$(elapsed "$t0")
    go_round "$x/ctl" 2
    if seen=$(check_sample_report "$x/ctl/report2.json"); then
        record px2-podman-restore "restore --import on machine B: every identity names B's GPU, data intact" "dumped on $gpu_a, now: $seen; restored spec: $(spec_nodes "$name"); usable GPUs: $(usable_line "$x/restore.log"); $(majors_note "$x/meta.txt")" "$([[ $gpu_a != "$GPU_UUID" ]] && echo PASS || echo 'PASS (same GPU)')" "restore ${tr}s; $(plugin_times "$x/restore.log")"
    else
        record px2-podman-restore "identity names B's GPU" "$seen; $(majors_note "$x/meta.txt")" FAIL "restore ${tr}s"
    fi
    go_round "$x/ctl" 3
    save podman-restore "$x/restore.log" "$x/ctl"
    podman rm -f --time 0 "$name" >/dev/null 2>&1
}

# ------------------------------------------------------------------------------------------------
# containerd 2.1: ctr with CDI, and CRI where python3 has grpc

CTRD_DONE=0
CRI_PY=
setup_containerd() {
    ((CTRD_DONE)) && return 0
    setup_base
    if ! unpack_debs runtime-debs-containerd; then
        record c0-containerd-setup "containerd from runtime-debs-containerd" "no runtime-debs-containerd carried or staged (prepare.sh with CCM_PREPARE_RUNTIMES=1; stage it)" SKIP -
        return 1
    fi
    local b
    for b in containerd ctr containerd-shim-runc-v2; do ln -sf "$RT_ROOT/usr/bin/$b" "$RT_BIN/$b"; done
    [[ -x $RT_ROOT/usr/bin/docker-registry ]] && ln -sf "$RT_ROOT/usr/bin/docker-registry" "$RT_BIN/docker-registry"
    # CRI needs grpc and protobuf in a python3 here, CRI's api.proto compiled HERE (cri-gen/api_pb2.py), and the
    # registry (containerd's CRI restore pulls the base image again).
    local gen py
    gen=$(dirname "$(cat "$RTD/unpacked-runtime-debs-containerd")")/runtime-debs-containerd/cri-gen
    CRI_WHY=
    for py in python3 "$TORCH_PY"; do
        if "$py" -c 'import grpc, google.protobuf' 2>/dev/null; then CRI_PY=$py; break; fi
    done
    if [[ ${CCM_RT_NO_CRI:-0} == 1 ]]; then
        CRI_WHY="CCM_RT_NO_CRI=1 (the dry run on the doubles; tests/container/cri-cdi-flow.sh covers CRI there)"; CRI_PY=
    elif [[ -z $CRI_PY ]]; then
        CRI_WHY="neither python3 nor $TORCH_PY has grpc and protobuf (tests/container/cri_client.py needs both)"
    elif [[ ! -f $gen/api_pb2.py ]]; then
        CRI_WHY="no cri-gen/api_pb2.py in runtime-debs-containerd (prepare.sh could not compile CRI's api.proto)"; CRI_PY=
    elif ! CCM_CRI_GEN=$gen "$CRI_PY" -c 'import sys; sys.path.insert(0, sys.argv[1]); import api_pb2' "$gen" 2>"$WORK/cri-import.err"; then
        CRI_WHY="api_pb2.py (protoc $(head -n1 "$gen/VERSIONS" 2>/dev/null)) does not load in $CRI_PY: $(tail -n1 "$WORK/cri-import.err")"; CRI_PY=
    elif [[ ! -x $RT_BIN/docker-registry ]]; then
        CRI_WHY="no docker-registry in runtime-debs-containerd"; CRI_PY=
    fi
    CRI_GEN=$gen
    local snap=overlayfs d
    d=$(mktemp -d)
    mkdir -p "$d/l" "$d/u" "$d/w" "$d/m"
    mount -t overlay overlay -o "lowerdir=$d/l,upperdir=$d/u,workdir=$d/w" "$d/m" 2>/dev/null && umount "$d/m" || snap=native
    rm -rf "$d"
    SNAP=$snap
    mkdir -p "$RTD/containerd" /run/ccm-containerd
    # CRI gives the pod sandbox oomScoreAdj -998. Lowering a score needs CAP_SYS_RESOURCE, which root on the GPU
    # machine lacks (runc init: `failed to update /proc/self/oom_score_adj: Permission denied`, RunPodSandbox fails):
    # then containerd's own knob for that case keeps every score at or above its own.
    OOM_RESTRICT=
    if ! (echo -999 >/proc/self/oom_score_adj) 2>/dev/null; then
        OOM_RESTRICT="  restrict_oom_score_adj = true"
        log "this root cannot lower an OOM score (no CAP_SYS_RESOURCE): containerd's CRI gets restrict_oom_score_adj = true"
    fi
    cat >"$RTD/containerd/config.toml" <<EOF
version = 3
root = "$RTD/containerd/root"
state = "/run/ccm-containerd/state"
$([[ -z $CRI_PY ]] && echo 'disabled_plugins = ["io.containerd.grpc.v1.cri"]')
[grpc]
  address = "$CTRD_SOCK"
[plugins."io.containerd.cri.v1.images"]
  snapshotter = "$snap"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = "localhost/ccm-pause:1"
[plugins."io.containerd.cri.v1.runtime"]
${CCM_RT_CRI_EXTRA:-}
$OOM_RESTRICT
  enable_cdi = true
  cdi_spec_dirs = ["/etc/cdi", "/var/run/cdi"]
  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
        BinaryName = "${CCM_RT_RUNC_BINARY:-$RT_BIN/runc}"
        CriuWorkPath = "$WORK/cri-criu-work"
EOF
    # The service's environment: PATH to the wrappers (the shim runs runc, runc runs criu), no plugin setting.
    env PATH="$PATH" containerd --config "$RTD/containerd/config.toml" >"$WORK/containerd.log" 2>&1 &
    CONTAINERD_PID=$!
    for _ in $(seq 150); do ctr --address "$CTRD_SOCK" version >/dev/null 2>&1 && break; sleep 0.2; done
    if ! ctr --address "$CTRD_SOCK" version >"$WORK/ctr-version.txt" 2>&1; then
        record c0-containerd-setup "containerd 2.1 starts" "$(tail -n3 "$WORK/containerd.log" | one_line)" FAIL -
        return 1
    fi
    {
        echo "containerd: $(containerd --version) (Debian forky, dpkg -x; links glibc only); snapshotter $snap"
        echo "CRI: ${CRI_PY:-not run: $CRI_WHY}${OOM_RESTRICT:+ (restrict_oom_score_adj: this root cannot lower an OOM score)}"
    } >>"$MACHINE"
    CTRD_DONE=1
}

C() { ctr --address "$CTRD_SOCK" --namespace "$CTRD_NS" "$@"; }

# oci_image OUT NAME CMD-JSON ROOTFS-FUNCTION: an OCI image archive of that root (tests/container/common.sh's
# make_image without busybox).
oci_image() {
    local out=$1 name=$2 cmd=$3 fn=$4 w diffid layer config manifest
    w=$(mktemp -d)
    "$fn" "$w/rootfs"
    mkdir -p "$w/oci/blobs/sha256"
    tar -C "$w/rootfs" --owner=0 --group=0 --numeric-owner -cf "$w/layer.tar" .
    diffid=$(sha256sum "$w/layer.tar" | cut -d' ' -f1)
    gzip -n -c "$w/layer.tar" >"$w/layer.tar.gz"
    blob() { local d; d=$(sha256sum "$1" | cut -d' ' -f1); cp "$1" "$w/oci/blobs/sha256/$d"; echo "$d $(stat -c %s "$1")"; }
    layer=$(blob "$w/layer.tar.gz")
    printf '{"architecture":"amd64","os":"linux","config":{"Env":["PATH=/usr/local/bin:/usr/bin:/bin"],"Cmd":%s,"WorkingDir":"/"},"rootfs":{"type":"layers","diff_ids":["sha256:%s"]}}' "$cmd" "$diffid" >"$w/config.json"
    config=$(blob "$w/config.json")
    printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:%s","size":%s},"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar+gzip","digest":"sha256:%s","size":%s}]}' \
        "${config% *}" "${config#* }" "${layer% *}" "${layer#* }" >"$w/manifest.json"
    manifest=$(blob "$w/manifest.json")
    printf '{"schemaVersion":2,"manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:%s","size":%s,"annotations":{"io.containerd.image.name":"%s","org.opencontainers.image.ref.name":"1"}}]}' \
        "${manifest% *}" "${manifest#* }" "$name" >"$w/oci/index.json"
    echo '{"imageLayoutVersion":"1.0.0"}' >"$w/oci/oci-layout"
    tar -C "$w/oci" -cf "$out" oci-layout index.json blobs
    rm -rf "$w"
}

pause_rootfs() {
    local dir=$1 lib
    rm -rf "$dir"
    mkdir -p "$dir/usr/bin" "$dir/proc" "$dir/sys" "$dir/dev" "$dir/etc" "$dir/tmp"
    cp "$(command -v sleep)" "$dir/usr/bin/sleep"
    ldd "$(command -v sleep)" | awk '/=> \// { print $3 } /^\t\// { print $1 }' | while read -r lib; do cp --parents -L "$lib" "$dir/"; done
}

ctr_image() { # the sample image in containerd's namespace (imported from an OCI archive made here or carried)
    local tar=${1:-$WORK/ccm-sample-oci.tar}
    C images ls -q 2>/dev/null | grep -qx "$IMAGE" && return 0
    [[ -f $tar ]] || oci_image "$tar" "$IMAGE" '["/usr/local/bin/ccm-sample-workload"]' sample_rootfs
    C images import --snapshotter "$SNAP" "$tar" >"$WORK/ctr-import.log" 2>&1
}

ctr_run() { # ID CTL ROUNDS
    mkdir -p "$2"
    # shellcheck disable=SC2086 # the dry run's options are words
    C run -d --snapshotter "$SNAP" ${CCM_RT_CTR_RUN_ARGS:-} --device nvidia.com/gpu=0 --mount "type=bind,src=$2,dst=/ctl,options=rbind:rw" \
        "$IMAGE" "$1" /usr/local/bin/ccm-sample-workload --dir /ctl --mib 64 --devices 0 --rounds "$3" >"$WORK/$1.run" 2>&1 &&
        wait_file "$2/ready" "$READY_TIMEOUT"
}

ctr_kill() { C task kill -s KILL "$1" >/dev/null 2>&1; sleep 0.5; C task rm -f "$1" >/dev/null 2>&1; }
task_log() { find "$RTD/containerd/root" /run/ccm-containerd -path "*$CTRD_NS/$1/$2" 2>/dev/null | head -n1; } # ID LOG

phase_containerd_same() {
    setup_containerd || return 0
    cdi || { record c0-cdi-spec "CDI spec written" "$(tail -n2 "$WORK/cdi.txt" | one_line)" FAIL -; return 0; }
    ctr_image || { record c0-ctr-image "ctr images import" "$(tail -n2 "$WORK/ctr-import.log" | one_line)" FAIL -; return 0; }
    local c=$WORK/ctrd-same id=ccm-rt-c1 t0 td tr seen l
    rm -rf "$c"; mkdir -p "$c"
    C containers rm "$id" ccm-rt-c2 >/dev/null 2>&1
    if ! ctr_run "$id" "$c/ctl" 4; then
        record c1-ctr-cdi-run "ctr run --device nvidia.com/gpu=0" "not ready: $(tail -n3 "$WORK/$id.run" | one_line)" FAIL -; return 0
    fi
    go_round "$c/ctl" 1
    if seen=$(check_sample_report "$c/ctl/report1.json"); then
        record c1-ctr-cdi-run "ctr run --device nvidia.com/gpu=0 (CDI): identity agrees" "$seen; spec: $(C containers info "$id" 2>/dev/null | python3 -c 'import json,sys; print(" ".join(d["path"] for d in json.load(sys.stdin)["Spec"]["linux"]["devices"]))' 2>/dev/null)" PASS -
    else
        record c1-ctr-cdi-run "identity agrees" "$seen" FAIL -
    fi
    t0=$(now)
    if C task checkpoint --image-path "$c/img" --work-path "$c/work" "$id" >"$c/task-checkpoint.out" 2>&1; then
        td=$(elapsed "$t0")
        go_round "$c/ctl" 2
        if seen=$(check_sample_report "$c/ctl/report2.json"); then
            record c2-ctr-task-checkpoint "ctr task checkpoint (the task runs on): identity agrees" "$seen; identity image(s): $(find "$c/img" -maxdepth 1 -name 'cuda-migrate-*.img' | wc -l)" PASS "checkpoint ${td}s; $(plugin_times "$c/work/dump.log")"
        else
            record c2-ctr-task-checkpoint "runs on, identity agrees" "$seen; the plugin's settings at the dump: $(grep -o 'leave-running [a-z]*[^,]*' "$c/work/dump.log" | head -n1)" FAIL "checkpoint ${td}s"
        fi
    else
        record c2-ctr-task-checkpoint "ctr task checkpoint passes" "$(tail -n2 "$c/task-checkpoint.out" | one_line) $(first_error "$c/work/dump.log")" FAIL -
    fi
    cp "$c/work/dump.log" "$c/task-dump.log" 2>/dev/null
    rm -rf "$c/img"
    t0=$(now)
    if C containers checkpoint --task "$id" localhost/ccm-rt-ckpt:1 >"$c/checkpoint.out" 2>&1; then
        td=$(elapsed "$t0")
        ctr_kill "$id"
        t0=$(now)
        if C containers restore --live ccm-rt-c2 localhost/ccm-rt-ckpt:1 >"$c/restore.out" 2>&1; then
            tr=$(elapsed "$t0")
            l=$(task_log ccm-rt-c2 restore.log)
            [[ -n $l ]] && cp "$l" "$c/restore.log"
            go_round "$c/ctl" 3
            if seen=$(check_sample_report "$c/ctl/report3.json"); then
                record c3-ctr-checkpoint-restore "ctr containers checkpoint --task, kill, containers restore --live: identity agrees, data intact" "$seen; usable GPUs: $(usable_line "$c/restore.log")" PASS "checkpoint ${td}s, restore ${tr}s; $(plugin_times "$c/restore.log")"
            else
                record c3-ctr-checkpoint-restore "identity agrees after the restore" "$seen" FAIL "restore ${tr}s"
            fi
        else
            l=$(task_log ccm-rt-c2 restore.log)
            record c3-ctr-checkpoint-restore "ctr containers restore --live passes" "$(tail -n2 "$c/restore.out" | one_line) $([[ -n $l ]] && first_error "$l")" FAIL "checkpoint ${td}s"
        fi
    else
        record c3-ctr-checkpoint-restore "ctr containers checkpoint --task passes" "$(tail -n2 "$c/checkpoint.out" | one_line)" FAIL -
    fi
    ctr_kill ccm-rt-c2; ctr_kill "$id"
    C containers rm "$id" ccm-rt-c2 >/dev/null 2>&1
    C images rm localhost/ccm-rt-ckpt:1 >/dev/null 2>&1
    save containerd-same "$c"
    if [[ -n $CRI_PY ]]; then cri_same; else record c4-cri-cdi "CRI: CDI_devices, CheckpointContainer, restore by CreateContainer" "not run: $CRI_WHY (the ctr cases above ran instead)" SKIP -; fi
}

# --- CRI (the kubelet's calls), where a python3 here has grpc

cri() { CCM_CRI_GEN=$CRI_GEN "$CRI_PY" "$REPO/tests/container/cri_client.py" "$CTRD_SOCK" "$@"; }
cri_field() { python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])' "$1" "$2" 2>/dev/null; }
CRI_POD_CONFIG=$(printf '{"metadata":{"name":"ccm-rt-pod","uid":"ccm-rt-pod-uid","namespace":"default","attempt":0},"log_directory":"%s","linux":{"cgroup_parent":"%s","security_context":{"namespace_options":{"network":2,"pid":1,"ipc":0}}}}' "/var/tmp/ccm-rt/work/cri-logs" "$CGROUP_PARENT")

# cri_setup: the registry, the sample image in it (NAME@DIGEST for the restore's pull), the pause image, a pod.
cri_setup() {
    mkdir -p "$WORK/cri-logs" "$RTD/registry"
    if [[ -z ${REGISTRY_PID:-} ]]; then
        printf 'version: 0.1\nstorage:\n  filesystem:\n    rootdirectory: %s\nhttp:\n  addr: %s\n' "$RTD/registry" "$REG" >"$RTD/registry.yml"
        docker-registry serve "$RTD/registry.yml" >"$WORK/registry.log" 2>&1 &
        REGISTRY_PID=$!
        for _ in $(seq 100); do (echo >"/dev/tcp/${REG%:*}/${REG#*:}") 2>/dev/null && break; sleep 0.1; done
    fi
    k() { ctr --address "$CTRD_SOCK" --namespace k8s.io "$@"; }
    [[ -f $WORK/ccm-pause-oci.tar ]] || oci_image "$WORK/ccm-pause-oci.tar" localhost/ccm-pause:1 '["/usr/bin/sleep","2147483647"]' pause_rootfs
    [[ -f $WORK/ccm-sample-oci.tar ]] || oci_image "$WORK/ccm-sample-oci.tar" "$IMAGE" '["/usr/local/bin/ccm-sample-workload"]' sample_rootfs
    k images import --snapshotter "$SNAP" "$WORK/ccm-pause-oci.tar" >/dev/null 2>&1 &&
        k images import --snapshotter "$SNAP" "${1:-$WORK/ccm-sample-oci.tar}" >/dev/null 2>&1 &&
        k images tag --force "$IMAGE" "$REG/ccm-sample:1" >/dev/null 2>&1 &&
        k images push --plain-http "$REG/ccm-sample:1" >"$WORK/cri-push.log" 2>&1 &&
        cri PullImage "{\"image\":{\"image\":\"$REG/ccm-sample:1\"}}" >/dev/null 2>"$WORK/cri-pull.err" || return 1
    [[ -n ${POD:-} ]] && return 0
    cri RunPodSandbox "{\"config\":$CRI_POD_CONFIG}" >"$WORK/cri-runp.out" 2>&1 || return 1
    POD=$(cri_field "$WORK/cri-runp.out" pod_sandbox_id)
}

# cri_create NAME IMAGE CTL CDI [COMMAND]: CreateContainer in the pod; prints the container id.
cri_create() {
    local cmd=""
    [[ -n ${5:-} ]] && cmd=',"command":["/usr/local/bin/ccm-sample-workload"],"args":["--dir","/ctl","--mib","64","--devices","0","--rounds","'$5'"]'
    cri CreateContainer "$(printf '{"pod_sandbox_id":"%s","config":{"metadata":{"name":"%s","attempt":0},"image":{"image":"%s"}%s,"mounts":[{"container_path":"/ctl","host_path":"%s"}],"CDI_devices":[{"name":"%s"}],"log_path":"%s.log","linux":{"security_context":{"namespace_options":{"network":2,"pid":1,"ipc":0}}}},"sandbox_config":%s}' \
        "$POD" "$1" "$2" "$cmd" "$3" "$4" "$1" "$CRI_POD_CONFIG")" >"$WORK/cri-create-$1.out" 2>&1 &&
        cri_field "$WORK/cri-create-$1.out" container_id
}

cri_gone() { # ID
    cri StopContainer "{\"container_id\":\"$1\",\"timeout\":0}" >/dev/null 2>&1
    cri RemoveContainer "{\"container_id\":\"$1\"}" >/dev/null 2>&1
}

cri_same() {
    local c=$WORK/cri-same id id2 seen t0 td tr
    rm -rf "$c"; mkdir -p "$c/ctl" "$c/ctl2"
    cri_setup || { record c4-cri-cdi "CRI setup (registry, images, pod)" "$(tail -n2 "$WORK/cri-push.log" "$WORK/cri-pull.err" "$WORK/cri-runp.out" 2>/dev/null | one_line)" FAIL -; return; }
    { id=$(cri_create cuda "$REG/ccm-sample:1" "$c/ctl" nvidia.com/gpu=0 3) && cri StartContainer "{\"container_id\":\"$id\"}" >/dev/null 2>"$c/start.err" &&
        wait_file "$c/ctl/ready" "$READY_TIMEOUT"; } || { record c4-cri-cdi "CreateContainer with CDI_devices nvidia.com/gpu=0" "$(tail -n2 "$WORK/cri-create-cuda.out" "$c/start.err" | one_line)" FAIL -; return; }
    go_round "$c/ctl" 1
    t0=$(now)
    cri CheckpointContainer "{\"container_id\":\"$id\",\"location\":\"$c/ckpt.tar\",\"timeout\":120}" >"$c/checkpoint.out" 2>&1 ||
        { record c4-cri-cdi "CheckpointContainer passes" "$(tail -n2 "$c/checkpoint.out" | one_line)" FAIL -; cri_gone "$id"; return; }
    td=$(elapsed "$t0")
    cri_gone "$id"
    archive_preflight c5-archive-preflight-kubelet "$c/ckpt.tar" "CRI CheckpointContainer's archive (the kubelet's form)"
    seen=
    t0=$(now)
    id2=$(cri_create cuda-restored "$c/ckpt.tar" "$c/ctl2" nvidia.com/gpu=0) && cri StartContainer "{\"container_id\":\"$id2\"}" >"$c/restore.out" 2>&1
    cp "$WORK/cri-criu-work/restore.log" "$c/restore.log" 2>/dev/null
    tr=$(elapsed "$t0")
    if go_round "$c/ctl2" 2 && seen=$(check_sample_report "$c/ctl2/report2.json"); then
        record c4-cri-cdi "CRI: CDI_devices nvidia.com/gpu=0, CheckpointContainer, CreateContainer from the archive (CDI again), StartContainer: identity agrees" "$seen; usable GPUs: $(usable_line "$c/restore.log")" PASS "checkpoint ${td}s, restore ${tr}s; $(plugin_times "$c/restore.log")"
    else
        record c4-cri-cdi "the CRI restore runs on this GPU" "${seen:-$(tail -n2 "$WORK/cri-create-cuda-restored.out" "$c/restore.out" | one_line) $(first_error "$c/restore.log")}" FAIL "checkpoint ${td}s"
    fi
    [[ -n ${id2:-} ]] && cri_gone "$id2"
    rm -f "$c/ckpt.tar"
    save cri-same "$c"
}

phase_containerd_dump() {
    setup_containerd || return 0
    cdi || { record cx-cdi-spec "CDI spec written" "$(tail -n2 "$WORK/cdi.txt" | one_line)" FAIL -; return 0; }
    local x=$XFER/containerd id=ccm-rt-cx t0 td seen
    rm -rf "$x"; mkdir -p "$x"
    oci_image "$x/image-oci.tar" "$IMAGE" '["/usr/local/bin/ccm-sample-workload"]' sample_rootfs
    C images rm "$IMAGE" >/dev/null 2>&1
    ctr_image "$x/image-oci.tar" || { record cx1-ctr-dump "ctr images import" "$(tail -n2 "$WORK/ctr-import.log" | one_line)" FAIL -; return 0; }
    C containers rm "$id" >/dev/null 2>&1
    if ! ctr_run "$id" "$x/ctl" 3; then
        record cx1-ctr-dump "runs on machine A" "not ready: $(tail -n3 "$WORK/$id.run" | one_line)" FAIL -; return 0
    fi
    go_round "$x/ctl" 1
    seen=$(check_sample_report "$x/ctl/report1.json")
    t0=$(now)
    if C containers checkpoint --task "$id" localhost/ccm-rt-xckpt:1 >"$x/checkpoint.out" 2>&1 &&
        C images export --all-platforms --skip-manifest-json "$x/ckpt-image.tar" localhost/ccm-rt-xckpt:1 >>"$x/checkpoint.out" 2>&1; then
        td=$(elapsed "$t0")
        record cx1-ctr-dump "ctr containers checkpoint --task, images export on machine A (GPU $GPU_UUID)" "before: $seen; checkpoint image $(du -m "$x/ckpt-image.tar" | cut -f1) MiB" PASS "checkpoint ${td}s"
    else
        record cx1-ctr-dump "ctr checkpoint and export" "$(tail -n2 "$x/checkpoint.out" | one_line)" FAIL -
        rm -f "$x/ckpt-image.tar"
    fi
    ctr_kill "$id"
    C containers rm "$id" >/dev/null 2>&1
    C images rm localhost/ccm-rt-xckpt:1 >/dev/null 2>&1
    if [[ -n $CRI_PY ]] && cri_setup "$x/image-oci.tar"; then
        mkdir -p "$x/cri-ctl"
        if id=$(cri_create cuda-x "$REG/ccm-sample:1" "$x/cri-ctl" nvidia.com/gpu=0 3) && cri StartContainer "{\"container_id\":\"$id\"}" >/dev/null 2>&1 &&
            wait_file "$x/cri-ctl/ready" "$READY_TIMEOUT" && go_round "$x/cri-ctl" 1 &&
            cri CheckpointContainer "{\"container_id\":\"$id\",\"location\":\"$x/cri-ckpt.tar\",\"timeout\":120}" >"$x/cri-checkpoint.out" 2>&1; then
            record cx2-cri-dump "CRI CheckpointContainer on machine A" "archive $(du -m "$x/cri-ckpt.tar" | cut -f1) MiB" PASS -
        else
            record cx2-cri-dump "CRI CheckpointContainer on machine A" "$(tail -n2 "$x/cri-checkpoint.out" "$WORK/cri-create-cuda-x.out" 2>/dev/null | one_line)" FAIL -
        fi
        [[ -n ${id:-} ]] && cri_gone "$id"
    else
        record cx2-cri-dump "CRI CheckpointContainer on machine A" "not run: ${CRI_WHY:-CRI setup failed}" SKIP -
    fi
    [[ -f $x/ckpt-image.tar || -f $x/cri-ckpt.tar ]] || return 0
    write_meta containerd "containerd: $(containerd --version)" "snapshotter: $SNAP"
    save containerd-dump "$x/checkpoint.out" "$x/ctl" "$x/meta.txt"
    pack containerd
}

phase_containerd_restore() {
    setup_containerd || return 0
    cdi || { record cx-cdi-spec "CDI spec written" "$(tail -n2 "$WORK/cdi.txt" | one_line)" FAIL -; return 0; }
    local why x=$XFER/containerd gpu_a t0 tr seen l id
    if ! why=$(unpack containerd "${1:-}"); then
        record cx3-ctr-restore "restored on machine B" "$why" FAIL -; return 0
    fi
    gpu_a=$(meta_get "$x/meta.txt" dumped_on_gpu)
    if [[ -f $x/ckpt-image.tar ]]; then
        C images rm "$IMAGE" localhost/ccm-rt-xckpt:1 >/dev/null 2>&1
        C containers rm ccm-rt-cx2 >/dev/null 2>&1
        if ctr_image "$x/image-oci.tar" && C images import --snapshotter "$SNAP" --all-platforms "$x/ckpt-image.tar" >"$x/import.out" 2>&1; then
            t0=$(now)
            if C containers restore --live ccm-rt-cx2 localhost/ccm-rt-xckpt:1 >"$x/restore.out" 2>&1; then
                tr=$(elapsed "$t0")
                l=$(task_log ccm-rt-cx2 restore.log); [[ -n $l ]] && cp "$l" "$x/restore.log"
                go_round "$x/ctl" 2
                if seen=$(check_sample_report "$x/ctl/report2.json"); then
                    record cx3-ctr-restore "ctr containers restore --live on machine B: identity names B's GPU, data intact" "dumped on $gpu_a, now: $seen; usable GPUs: $(usable_line "$x/restore.log"); $(majors_note "$x/meta.txt")" "$([[ $gpu_a != "$GPU_UUID" ]] && echo PASS || echo 'PASS (same GPU)')" "restore ${tr}s; $(plugin_times "$x/restore.log")"
                else
                    record cx3-ctr-restore "identity names B's GPU" "$seen; $(majors_note "$x/meta.txt")" FAIL "restore ${tr}s"
                fi
            else
                l=$(task_log ccm-rt-cx2 restore.log)
                record cx3-ctr-restore "ctr containers restore --live on B" "$(tail -n2 "$x/restore.out" | one_line) $([[ -n $l ]] && first_error "$l"); $(majors_note "$x/meta.txt")" FAIL "dumped on $gpu_a"
            fi
        else
            record cx3-ctr-restore "ctr images import of A's images" "$(tail -n2 "$WORK/ctr-import.log" "$x/import.out" 2>/dev/null | one_line)" FAIL -
        fi
        ctr_kill ccm-rt-cx2
        C containers rm ccm-rt-cx2 >/dev/null 2>&1
    else
        record cx3-ctr-restore "ctr restore on B" "no ctr checkpoint in the dump (its dump failed)" SKIP -
    fi
    # What a user asks on the target node before the restore: the kubelet's archive of A, read in place here.
    [[ -f $x/cri-ckpt.tar ]] && DUMPED_ON=$gpu_a archive_preflight cx5-archive-preflight-cross "$x/cri-ckpt.tar" "machine A's CRI archive on machine B, before its restore"
    if [[ -f $x/cri-ckpt.tar && -n $CRI_PY ]] && cri_setup "$x/image-oci.tar"; then
        mkdir -p "$x/cri-ctl2"
        seen=
        t0=$(now)
        id=$(cri_create cuda-x-restored "$x/cri-ckpt.tar" "$x/cri-ctl2" nvidia.com/gpu=0) && cri StartContainer "{\"container_id\":\"$id\"}" >"$x/cri-restore.out" 2>&1
        cp "$WORK/cri-criu-work/restore.log" "$x/cri-restore.log" 2>/dev/null
        tr=$(elapsed "$t0")
        if go_round "$x/cri-ctl2" 2 && seen=$(check_sample_report "$x/cri-ctl2/report2.json"); then
            record cx4-cri-restore "CRI restore (CreateContainer from A's archive, CDI_devices nvidia.com/gpu=0 of B) on machine B: identity names B's GPU" "dumped on $gpu_a, now: $seen; usable GPUs: $(usable_line "$x/cri-restore.log")" "$([[ $gpu_a != "$GPU_UUID" ]] && echo PASS || echo 'PASS (same GPU)')" "restore ${tr}s; $(plugin_times "$x/cri-restore.log")"
        else
            record cx4-cri-restore "the CRI restore runs on B's GPU" "${seen:-$(tail -n2 "$WORK/cri-create-cuda-x-restored.out" "$x/cri-restore.out" | one_line) $(first_error "$x/cri-restore.log")}" FAIL -
        fi
        [[ -n ${id:-} ]] && cri_gone "$id"
    else
        record cx4-cri-restore "CRI restore on machine B" "not run: ${CRI_WHY:-no CRI archive in the dump, or the CRI setup failed}" SKIP -
    fi
    save containerd-restore "$x/restore.log" "$x/restore.out" "$x/cri-restore.log" "$x/ctl" "$x/cri-ctl2"
}

# ------------------------------------------------------------------------------------------------
# torchrun: two ranks (gloo) on the GPU under torchrun's agent, one Podman container with its own network namespace

TORCH_STEPS1=${CCM_TORCH_STEPS1:-40}
TORCH_STEPS2=${CCM_TORCH_STEPS2:-40}

# t_run NAME CTL: the job in a container (host /usr read-only, not recursive; /opt; the repository; the driver by CDI).
t_run() {
    local name=$1 ctl=$2
    podman rm -f --time 0 "$name" >/dev/null 2>&1
    mkdir -p "$ctl"
    podman run --runtime "$PODMAN_RUNTIME" -d --name "$name" --network none --cgroup-parent "$CGROUP_PARENT" \
        --device nvidia.com/gpu=0 -v /usr:/usr:ro,bind -v /opt:/opt:ro -v "$REPO:$REPO:ro" \
        -v /etc/ld.so.cache:/etc/ld.so.cache:ro -v "$ctl:/ctl" \
        -e CUBLAS_WORKSPACE_CONFIG=:4096:8 -e PYTHONDONTWRITEBYTECODE=1 -e PYTHONUNBUFFERED=1 -e HOME=/tmp \
        -e USER=root -e LOGNAME=root -e TORCHINDUCTOR_CACHE_DIR=/tmp/torchinductor \
        -e OMP_NUM_THREADS=1 -e CUDA_MODULE_LOADING=LAZY -e GLOO_SOCKET_IFNAME=lo -e TP_SOCKET_IFNAME=lo \
        "$TORCH_IMAGE" "$TORCH_PY" -m torch.distributed.run --nnodes 1 --node-rank 0 --nproc-per-node 2 \
        --rdzv-backend static --master-addr 127.0.0.1 --master-port 29511 --max-restarts 0 \
        "$REPO/tests/gpu/torchrun_job.py" --ctl /ctl --steps1 "$TORCH_STEPS1" --steps2 "$TORCH_STEPS2" >"$WORK/$name.run" 2>&1
}

t_wait() { # CTL WHAT SECONDS [CONTAINER]: both ranks' WHAT files; fails at once when CONTAINER has exited
    local deadline=$((SECONDS + $3))
    until [[ -e $1/${2}-rank0 && -e $1/${2}-rank1 ]]; do
        ((SECONDS >= deadline)) && return 1
        if [[ -n ${4:-} ]] && [[ $(podman container inspect -f '{{.State.Running}}' "$4" 2>/dev/null) != true ]]; then
            return 1
        fi
        sleep 0.2
    done
}

# shellcheck disable=SC2002 # through cat, a missing file still hashes (as empty)
t_losses() { cat "$1/losses-rank0.txt" 2>/dev/null | sha256sum | cut -c1-16; } # CTL: rank 0's losses (both agree)

# t_reference CTL: the uninterrupted run (go2 there from the start).
t_reference() {
    local ctl=$1
    rm -rf "$ctl"; mkdir -p "$ctl"
    : >"$ctl/go2"
    t_run ccm-rt-tref "$ctl" && t_wait "$ctl" "done" "$TORCH_TIMEOUT" ccm-rt-tref
    local rc=$?
    podman logs ccm-rt-tref >"$ctl/container.log" 2>&1
    podman rm -f --time 0 ccm-rt-tref >/dev/null 2>&1
    return "$rc"
}

# t_check CTL REF-CTL UUID: losses equal the reference's, line for line, both ranks; reports sound on UUID.
t_check() {
    local ctl=$1 ref=$2 uuid=$3 r out="" bad=0 s
    for r in 0 1; do
        if cmp -s "$ctl/losses-rank$r.txt" "$ref/losses-rank$r.txt"; then
            out+="rank $r: $(wc -l <"$ctl/losses-rank$r.txt") losses = reference; "
        else
            out+="rank $r: LOSSES DIFFER from the reference ($(diff "$ctl/losses-rank$r.txt" "$ref/losses-rank$r.txt" | head -n3 | one_line 120)); "
            bad=1
        fi
        s=$("${CHECK[@]}" torch "$ctl/report-rank$r.json" --uuid "$uuid") || bad=1
        out+="$s; agree=$(python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); print(r.get("identity_agrees"), r.get("identity_after",{}).get("torch_uuid","?")[:12])' "$ctl/report-rank$r.json" 2>/dev/null); "
        python3 -c 'import json,sys; sys.exit(0 if json.load(open(sys.argv[1])).get("identity_agrees") else 1)' "$ctl/report-rank$r.json" 2>/dev/null || bad=1
    done
    echo "$out"
    return "$bad"
}

t_setup() {
    setup_podman || return 1
    if [[ $NETLOCK == none || $NETLOCK == skip ]]; then
        record t0-torchrun "a torchrun job with its own network namespace" "not run: CRIU cannot lock a network namespace on this machine: $NETLOCK_WHY" SKIP -
        return 1
    fi
    [[ -x $TORCH_PY ]] || { record t0-torchrun "torch" "no $TORCH_PY (CCM_TORCH_PY)" SKIP -; return 1; }
    # The container's /usr is the host's (read-only): the driver's directory as one CDI mount.
    cdi --libs dir || { record t0-cdi-spec "CDI spec (--libs dir)" "$(tail -n2 "$WORK/cdi.txt" | one_line)" FAIL -; return 1; }
    podman_image "$TORCH_IMAGE" hostusr_rootfs || { record t0-image "podman import" "$(tail -n2 "$WORK/import.log" | one_line)" FAIL -; return 1; }
}

# t_dump X: the job up to step STEPS1 in container ccm-rt-torch (ctl X/ctl), then checkpoint --export
# --tcp-established into X/ckpt.tar. Records TROW.
t_dump() {
    local x=$1 t0 td
    { t_run ccm-rt-torch "$x/ctl" && t_wait "$x/ctl" ready1 "$TORCH_TIMEOUT" ccm-rt-torch; } ||
        { record "$TROW-dump" "the job reaches step $TORCH_STEPS1" "$(tail -n3 "$WORK/ccm-rt-torch.run" | one_line) $(podman logs ccm-rt-torch 2>&1 | tail -n5 | one_line 400)" FAIL -; return 1; }
    podman exec ccm-rt-torch cat /proc/net/tcp >"$x/tcp-before.txt" 2>/dev/null
    t0=$(now)
    p_checkpoint ccm-rt-torch "$x/ckpt.tar" --tcp-established --compress none ||
        { record "$TROW-dump" "checkpoint --tcp-established --export" "$(tail -n2 "$x/ckpt.tar.out" | one_line) $(first_error "$x/ckpt.tar.dump.log")" FAIL -; return 1; }
    td=$(elapsed "$t0")
    podman logs ccm-rt-torch >"$x/container-before.log" 2>&1
    podman rm ccm-rt-torch >/dev/null 2>&1
    echo "established TCP connections at the dump: $(awk 'NR > 1 && $4 == "01"' "$x/tcp-before.txt" | wc -l)" >"$x/dump-info.txt"
    echo "checkpoint: ${td}s, archive $(du -m "$x/ckpt.tar" | cut -f1) MiB; $(plugin_times "$x/ckpt.tar.dump.log")" >>"$x/dump-info.txt"
    record "$TROW-dump" "checkpoint --tcp-established --export at step $TORCH_STEPS1 (GPU $GPU_UUID)" "$(one_line 300 <"$x/dump-info.txt")" PASS "checkpoint ${td}s"
}

# t_restore X REF UUID-BEFORE: restore --import --tcp-established, go2, the checks. Records TROW.
t_restore() {
    local x=$1 ref=$2 before=$3 t0 tr seen
    t0=$(now)
    if ! p_restore "$x/ckpt.tar" "$x/restore.log" "" --tcp-established; then
        record "$TROW" "restore --import --tcp-established" "$(tail -n2 "$x/restore.log.out" | one_line) $(first_error "$x/restore.log"); $(majors_note "$x/meta.txt" 2>/dev/null)" FAIL -
        return 1
    fi
    tr=$(elapsed "$t0")
    : >"$x/ctl/go2"
    if ! t_wait "$x/ctl" "done" "$TORCH_TIMEOUT"; then
        record "$TROW" "the job finishes after the restore" "$(podman logs ccm-rt-torch 2>&1 | tail -n6 | one_line 400)" FAIL "restore ${tr}s"
        podman logs ccm-rt-torch >"$x/container-after.log" 2>&1
        return 1
    fi
    podman logs ccm-rt-torch >"$x/container-after.log" 2>&1
    if seen=$(t_check "$x/ctl" "$ref" "$GPU_UUID"); then
        record "$TROW" "torchrun (2 ranks, gloo, TCP established) restored: losses = the uninterrupted run's, bit for bit; identity (CUDA, NVML, torch) names this GPU; data intact; new work runs" "dumped on $before; $seen" PASS "restore ${tr}s; $(plugin_times "$x/restore.log")"
    else
        record "$TROW" "losses equal, identity agrees" "dumped on $before; $seen" FAIL "restore ${tr}s"
    fi
    podman rm -f --time 0 ccm-rt-torch >/dev/null 2>&1
}

phase_torchrun_same() {
    t_setup || return 0
    local x=$WORK/torch-same TROW=t1-torchrun-same
    rm -rf "$x"; mkdir -p "$x"
    t_reference "$x/ref" || { record t1-torchrun-reference "the uninterrupted run" "$(tail -n5 "$x/ref/container.log" | one_line 400)" FAIL -; save torch-same "$x/ref"; return 0; }
    record t1-torchrun-reference "the uninterrupted run" "losses $(t_losses "$x/ref") ($(wc -l <"$x/ref/losses-rank0.txt") steps)" PASS -
    t_dump "$x" && t_restore "$x" "$x/ref" "$GPU_UUID"
    rm -f "$x/ckpt.tar"
    save torch-same "$x"
}

phase_torchrun_dump() {
    t_setup || return 0
    local x=$XFER/torchrun TROW=tx1-torchrun
    rm -rf "$x"; mkdir -p "$x"
    t_reference "$x/ref-a" || { record tx1-torchrun-reference "the uninterrupted run on A" "$(tail -n5 "$x/ref-a/container.log" | one_line 400)" FAIL -; return 0; }
    record tx1-torchrun-reference "the uninterrupted run on machine A" "losses $(t_losses "$x/ref-a") ($(wc -l <"$x/ref-a/losses-rank0.txt") steps)" PASS -
    t_dump "$x" || { save torchrun-dump "$x"; return 0; }
    podman save -o "$x/image.tar" "$TORCH_IMAGE" >/dev/null 2>&1
    write_meta torchrun "torch: $("$TORCH_PY" -c 'import torch; print(torch.__version__)' 2>/dev/null)" "steps: $TORCH_STEPS1+$TORCH_STEPS2"
    save torchrun-dump "$x/ckpt.tar.dump.log" "$x/dump-info.txt" "$x/ref-a" "$x/meta.txt"
    pack torchrun
}

phase_torchrun_restore() {
    t_setup || return 0
    local why x=$XFER/torchrun TROW=tx2-torchrun-cross-machine gpu_a
    if ! why=$(unpack torchrun "${1:-}"); then
        record "$TROW" "restored on machine B" "$why" FAIL -; return 0
    fi
    gpu_a=$(meta_get "$x/meta.txt" dumped_on_gpu)
    podman rm -f --time 0 ccm-rt-torch >/dev/null 2>&1
    podman load -i "$x/image.tar" >"$WORK/load.log" 2>&1 || { record "$TROW" "podman load of A's image" "$(tail -n2 "$WORK/load.log" | one_line)" FAIL -; return 0; }
    # The uninterrupted run here too: A's and B's must agree with each other and with the restored job.
    if t_reference "$WORK/torch-ref-b"; then
        if cmp -s "$WORK/torch-ref-b/losses-rank0.txt" "$x/ref-a/losses-rank0.txt"; then
            record tx2-torchrun-reference-b "the uninterrupted run on machine B = A's" "losses $(t_losses "$WORK/torch-ref-b")" PASS -
        else
            record tx2-torchrun-reference-b "the uninterrupted run on machine B = A's" "B's losses differ from A's: $(diff "$WORK/torch-ref-b/losses-rank0.txt" "$x/ref-a/losses-rank0.txt" | head -n2 | one_line 200)" FAIL -
        fi
    else
        record tx2-torchrun-reference-b "the uninterrupted run on machine B" "$(tail -n5 "$WORK/torch-ref-b/container.log" | one_line 400)" FAIL -
    fi
    t_restore "$x" "$x/ref-a" "$gpu_a"
    save torchrun-restore "$x/restore.log" "$x/ctl" "$x/container-after.log" "$WORK/torch-ref-b"
}

# ------------------------------------------------------------------------------------------------

cleanup() {
    local t pid
    if [[ -x $RT_BIN/podman ]]; then
        for t in $("$RT_BIN/podman" ps -a --format '{{.Names}}' 2>/dev/null | grep '^ccm-rt-'); do
            "$RT_BIN/podman" rm -f --time 0 "$t" >/dev/null 2>&1
        done
    fi
    if [[ -n ${CONTAINERD_PID:-} ]]; then
        for t in $(C task ls -q 2>/dev/null); do C task kill -s KILL "$t" >/dev/null 2>&1; done
        sleep 0.5
        for t in $(C task ls -q 2>/dev/null); do C task rm -f "$t" >/dev/null 2>&1; done
        for t in $(C containers ls -q 2>/dev/null); do C containers rm "$t" >/dev/null 2>&1; done
        if [[ -n ${POD:-} ]]; then
            cri StopPodSandbox "{\"pod_sandbox_id\":\"$POD\"}" >/dev/null 2>&1
            cri RemovePodSandbox "{\"pod_sandbox_id\":\"$POD\"}" >/dev/null 2>&1
        fi
        kill "$CONTAINERD_PID" 2>/dev/null && wait "$CONTAINERD_PID" 2>/dev/null
        # The shims of this containerd outlive it: by their -address argument.
        for pid in $(pgrep -f "containerd-shim-runc-v2 .*-address $CTRD_SOCK" 2>/dev/null); do kill -9 "$pid" 2>/dev/null; done
    fi
    [[ -n ${REGISTRY_PID:-} ]] && kill "$REGISTRY_PID" 2>/dev/null && wait "$REGISTRY_PID" 2>/dev/null
    # Whatever the runtimes left in this script's cgroup parent.
    if [[ -d /sys/fs/cgroup$CGROUP_PARENT ]]; then
        find "/sys/fs/cgroup$CGROUP_PARENT" -name cgroup.procs -exec cat {} + 2>/dev/null | while read -r pid; do kill -9 "$pid" 2>/dev/null; done
        sleep 0.3
        find "/sys/fs/cgroup$CGROUP_PARENT" -depth -type d -exec rmdir {} + 2>/dev/null
    fi
}
trap cleanup EXIT

main() {
    [[ $# -gt 0 ]] || { sed -n '2,/^set -uo/p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 2; }
    mkdir -p "$RESULTS_DIR" "$LOGS" "$WORK"
    [[ -f $RESULTS ]] || : >"$RESULTS"
    while [[ $# -gt 0 ]]; do
        case $1 in
        stage)
            shift
            local dirs=()
            while [[ $# -gt 0 && -d $1 ]]; do dirs+=("$1"); shift; done
            phase_stage "${dirs[@]}"
            continue
            ;;
        podman-same) phase_podman_same ;;
        podman-dump) phase_podman_dump ;;
        podman-restore | containerd-restore | torchrun-restore)
            local p=$1 dir=
            [[ $# -gt 1 && -d $2 ]] && { dir=$2; shift; }
            "phase_${p//-/_}" "$dir"
            ;;
        containerd-same) phase_containerd_same ;;
        containerd-dump) phase_containerd_dump ;;
        torchrun-same) phase_torchrun_same ;;
        torchrun-dump) phase_torchrun_dump ;;
        fetch)
            shift
            hand_out "${1:?fetch needs a name: podman, containerd or torchrun}"
            ;;
        *) echo "unknown phase $1 (see the header of $0)" >&2; exit 2 ;;
        esac
        shift
    done
    print_table | tee "$RESULTS_DIR/runtimes-table.md"
    cp "$RESULTS" "$LOGS/" 2>/dev/null
    tar -C "$RESULTS_DIR" -czf "$RESULTS_DIR/runtimes-logs.tar.gz" logs && rm -rf "$LOGS"
    rm -f "$RESULTS"
    ! grep -q '| FAIL |' "$RESULTS_DIR/runtimes-table.md"
}

main "$@"
