# shellcheck shell=bash
# Sourced by the container flows (tests/container/*-flow.sh). Needs S (the scratch directory).
# Brings the shared helpers of tests/lib/common.sh (wait_file FILE [SECONDS], ...).
# shellcheck source=tests/lib/common.sh
. "$(dirname "${BASH_SOURCE[0]}")/../lib/common.sh"

# step NAME CMD...: runs CMD, its output in S/NAME.out and S/NAME.err, its status in S/NAME.rc; returns the
# status. A flow never stops on a failed step by itself: the Rust test reads the statuses and says which broke.
step() {
    local name=$1 rc
    shift
    "$@" >"$S/$name.out" 2>"$S/$name.err" </dev/null
    rc=$?
    echo "$rc" >"$S/$name.rc"
    return "$rc"
}

# install_with_cgroup2 STEP: the package installed as the user guide says (`dpkg -i`, no plugin path in the
# environment) and cgroup2 mounted where the root has none, each through the flow's STEP function (step, or its
# prefixed form); sets HYBRID=1 on a hybrid cgroup v1 host (podman-flow.sh says what that changes), else 0.
# Returns 1 when a step failed: the flow then ends (exit 0) and the Rust test names the step.
install_with_cgroup2() {
    local run=$1
    "$run" install env DEBIAN_FRONTEND=noninteractive dpkg -i "$S/package.deb" || return 1
    unset CRIU_LIBS_DIR CRIU_CONFIG_FILE
    mkdir -p /sys/fs/cgroup
    mountpoint -q /sys/fs/cgroup || "$run" cgroup2-mount mount -t cgroup2 cgroup2 /sys/fs/cgroup || return 1
    # shellcheck disable=SC2034 # HYBRID is read by the flows that source this file
    if grep -qv '^0::' /proc/self/cgroup; then HYBRID=1; else HYBRID=0; fi
}

# wait_counter MIN CMD...: until CMD prints the container loop's `TOKEN COUNTER` line with COUNTER >= MIN
# (30 s at most); prints the last line read, returns 1 when it never got there.
wait_counter() {
    local min=$1 line
    shift
    # Up to 30 s: a container restored on a loaded 2-core CI machine can take several seconds to run again.
    for _ in $(seq 300); do
        line=$("$@" 2>/dev/null) || line=
        if [ -n "$line" ] && [ "${line##* }" -ge "$min" ] 2>/dev/null; then
            printf '%s\n' "$line"
            return 0
        fi
        sleep 0.1
    done
    printf '%s\n' "$line"
    return 1
}

# beyond FILE: a counter 5 steps past the `TOKEN COUNTER` line in FILE (5 when FILE is missing).
beyond() {
    local n
    n=$(cut -d' ' -f2 "$1" 2>/dev/null)
    echo $((${n:-0} + 5))
}

# make_image OUT NAME CMD-JSON [EXTRA]: a minimal OCI image archive of busybox-static named NAME, running CMD-JSON,
# for `ctr images import` (no registry here). EXTRA: a directory whose contents are added to the image's root (a CUDA
# workload and its libraries: cuda_rootfs below).
make_image() { # make_image OUT NAME CMD-JSON [EXTRA]
    local out=$1 name=$2 cmd=$3 extra=${4:-} w diffid layer layer_size config config_size manifest manifest_size
    w=$(mktemp -d)
    mkdir -p "$w/rootfs/bin" "$w/rootfs/tmp" "$w/rootfs/proc" "$w/rootfs/sys" "$w/rootfs/dev" "$w/rootfs/etc" \
        "$w/rootfs/out" "$w/oci/blobs/sha256"
    cp /bin/busybox "$w/rootfs/bin/busybox"
    for applet in sh sleep cat echo; do ln -s busybox "$w/rootfs/bin/$applet"; done
    [ -n "$extra" ] && cp -a "$extra/." "$w/rootfs/"
    tar -C "$w/rootfs" --owner=0 --group=0 --numeric-owner -cf "$w/layer.tar" .
    diffid=$(sha256sum "$w/layer.tar" | cut -d' ' -f1)
    gzip -n -c "$w/layer.tar" >"$w/layer.tar.gz"
    blob() {
        local d
        d=$(sha256sum "$1" | cut -d' ' -f1)
        cp "$1" "$w/oci/blobs/sha256/$d"
        echo "$d $(stat -c %s "$1")"
    }
    read -r layer layer_size < <(blob "$w/layer.tar.gz")
    printf '{"architecture":"amd64","os":"linux","config":{"Env":["PATH=/bin"],"Cmd":%s,"WorkingDir":"/"},"rootfs":{"type":"layers","diff_ids":["sha256:%s"]}}' \
        "$cmd" "$diffid" >"$w/config.json"
    read -r config config_size < <(blob "$w/config.json")
    printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:%s","size":%s},"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar+gzip","digest":"sha256:%s","size":%s}]}' \
        "$config" "$config_size" "$layer" "$layer_size" >"$w/manifest.json"
    read -r manifest manifest_size < <(blob "$w/manifest.json")
    printf '{"schemaVersion":2,"manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:%s","size":%s,"annotations":{"io.containerd.image.name":"%s","org.opencontainers.image.ref.name":"1"}}]}' \
        "$manifest" "$manifest_size" "$name" >"$w/oci/index.json"
    echo '{"imageLayoutVersion":"1.0.0"}' >"$w/oci/oci-layout"
    tar -C "$w/oci" -cf "$out" oci-layout index.json blobs
    rm -rf "$w"
}

# cuda_rootfs DIR WORKLOAD LIB...: the files a container image needs to run WORKLOAD (at /usr/local/bin) and to load
# LIB... (the libcuda / NVML doubles, which come into the container through CDI mounts, need the same C libraries):
# every shared library ldd names for them, at its own path. No busybox: make_image and the podman flows add it.
cuda_rootfs() {
    local dir=$1 workload=$2 f lib
    shift 2
    mkdir -p "$dir/usr/local/bin" "$dir/ctl" "$dir/tmp"
    cp "$workload" "$dir/usr/local/bin/"
    for f in "$workload" "$@"; do
        ldd "$f" | awk '/=> \// { print $3 } /^\t\// { print $1 }'
    done | sort -u | while read -r lib; do
        [ -f "$lib" ] && cp --parents -L "$lib" "$dir/"
    done
}

# write_sim_cdi_spec FILE SIM MINOR0 MINOR1 [NODE0 NODE1 CTL]: a CDI spec (JSON, cdiVersion 0.6.0) of the test
# doubles' two GPUs, kind nvidia.com/gpu, as `nvidia-ctk cdi generate` writes one for a node: device `0` is the node
# /dev/nvidia<MINOR0> (195:MINOR0), device `1` /dev/nvidia<MINOR1>, `all` both; every device also gets
# /dev/nvidiactl (195:255), the environment that points a container at the doubles (LD_LIBRARY_PATH, CCM_SIM_CONFIG,
# CCM_SIM_STATE_DIR) and the doubles' directory SIM (SIM/lib and SIM/gpus.json read-only, SIM/state read-write, each
# at its own path: the plugin reaches the state directory at the same path). The doubles open no device node, so
# nodes without a driver behind them are enough. Another node, on which the same CDI name is another GPU, is the
# same spec with MINOR0 and MINOR1 swapped. NODE0, NODE1 and CTL (TYPE:MAJOR:MINOR, TYPE c or b) give those three
# nodes other device numbers: the stand-ins of loop_stand_ins (tests/lib/common.sh), which a process can open and map.
write_sim_cdi_spec() {
    local file=$1 sim=$2 m0=$3 m1=$4 n0 n1 ctl
    n0=$(cdi_node "/dev/nvidia$m0" "${5:-c:195:$m0}")
    n1=$(cdi_node "/dev/nvidia$m1" "${6:-c:195:$m1}")
    ctl=$(cdi_node /dev/nvidiactl "${7:-c:195:255}")
    mkdir -p "$(dirname "$file")"
    cat >"$file.tmp" <<EOF
{
  "cdiVersion": "0.6.0",
  "kind": "nvidia.com/gpu",
  "devices": [
    { "name": "0", "containerEdits": { "deviceNodes": [ $n0 ] } },
    { "name": "1", "containerEdits": { "deviceNodes": [ $n1 ] } },
    { "name": "all", "containerEdits": { "deviceNodes": [ $n0, $n1 ] } }
  ],
  "containerEdits": {
    "env": [ "LD_LIBRARY_PATH=$sim/lib", "CCM_SIM_CONFIG=$sim/gpus.json", "CCM_SIM_STATE_DIR=$sim/state" ],
    "deviceNodes": [ $ctl ],
    "mounts": [
      { "hostPath": "$sim/lib", "containerPath": "$sim/lib", "type": "bind", "options": ["ro", "nosuid", "nodev", "bind"] },
      { "hostPath": "$sim/gpus.json", "containerPath": "$sim/gpus.json", "type": "bind", "options": ["ro", "nosuid", "nodev", "bind"] },
      { "hostPath": "$sim/state", "containerPath": "$sim/state", "type": "bind", "options": ["rw", "nosuid", "nodev", "bind"] }
    ]
  }
}
EOF
    mv "$file.tmp" "$file"
}

# cdi_node PATH TYPE:MAJOR:MINOR: one deviceNodes entry of a CDI spec (mode 0666, rw).
cdi_node() {
    local type major minor
    IFS=: read -r type major minor <<<"$2"
    printf '{ "path": "%s", "type": "%s", "major": %s, "minor": %s, "fileMode": 438, "permissions": "rw" }' \
        "$1" "$type" "$major" "$minor"
}

# runc_conf_with_plugin HYBRID NOTES: /etc/criu/runc.conf as the user guide has it (the plugin's libdir line from the
# package's example; on a hybrid cgroup v1 host also manage-cgroups=ignore, noted in NOTES), no default.conf.
runc_conf_with_plugin() {
    mkdir -p /etc/criu
    rm -f /etc/criu/default.conf
    {
        grep '^libdir ' /etc/criu/criu-cuda-migrate.conf.example
        [ "$1" = 1 ] && echo 'manage-cgroups=ignore'
    } >/etc/criu/runc.conf
    if [ "$1" = 1 ]; then
        echo "runc.conf: manage-cgroups=ignore (CRIU cannot restore this hybrid host's v1 cpuset)" >>"$2"
    fi
}

# sim_stack SIM SIM-BIN G0 G1: the doubles' directory (tests/sim/stack.sh's layout): SIM/lib with libcuda.so.1 and
# libnvidia-ml.so.1 from SIM-BIN, SIM/gpus.json with two H200s (G0 at 0000:06:00.0, minor 0; G1 at 0000:07:00.0,
# minor 1), an empty SIM/state.
sim_stack() {
    local sim=$1 bin=$2 g0=$3 g1=$4
    rm -rf "$sim"
    mkdir -p "$sim/lib" "$sim/state"
    cp "$bin/libcuda_test_double.so" "$sim/lib/libcuda.so.1"
    cp "$bin/libnvml_test_double.so" "$sim/lib/libnvidia-ml.so.1"
    cat >"$sim/gpus.json" <<EOF
{"driver_version":"580.159.04","cuda_driver_version":13000,"gpus":[
 {"uuid":"$g0","pci_bus_id":"0000:06:00.0","pci_device_id":"0x233510de","pci_subsystem_id":"0x18bf10de","minor":0,"name":"NVIDIA H200","memory_total":1073741824},
 {"uuid":"$g1","pci_bus_id":"0000:07:00.0","pci_device_id":"0x233510de","pci_subsystem_id":"0x18bf10de","minor":1,"name":"NVIDIA H200","memory_total":1073741824}
]}
EOF
}

# report_uuid FILE: the UUID CUDA answered for ordinal 0 in a report of ccm-sample-workload (no JSON parser in the
# trixie root: the report is pretty-printed, one field a line, ordinal 0 first).
report_uuid() { sed -n 's/^ *"uuid": *"\(GPU-[^"]*\)",*$/\1/p' "$1" 2>/dev/null | head -n1; }

# nvidia_nodes SPEC: the /dev/nvidiaN paths an OCI spec names (its linux.devices), space-separated, sorted.
nvidia_nodes() { grep -o '"path": *"/dev/nvidia[0-9]*"' "$1" 2>/dev/null | grep -o '/dev/nvidia[0-9]*' | sort -u | tr '\n' ' '; }

# procs_running PATTERN: the pids whose command line holds PATTERN (there is no pgrep in these roots).
procs_running() {
    local f pid
    for f in /proc/[0-9]*/cmdline; do
        pid=${f#/proc/}
        pid=${pid%/cmdline}
        [ "$pid" = "$$" ] || [ "$pid" = "$BASHPID" ] && continue
        tr '\0' ' ' 2>/dev/null <"$f" | grep -q -- "$1" && echo "$pid"
    done
}

# write_runc_nocpu OUT REAL: OUT becomes a runc that drops linux.resources.cpu from the bundle's config.json, then runs
# REAL. On a hybrid cgroup v1 host cgroup2 has no cpu controller (only hugetlb), and runc would fail there ("can't
# get final child's PID from pipe") on the CPU shares every CRI sandbox gets.
write_runc_nocpu() {
    cat >"$1" <<'WRAPPER'
#!/bin/sh
# criu-cuda-migrate tests: real runc, minus the CPU resources this host's cgroup2 cannot set.
bundle= prev=
for a in "$@"; do
    case $prev in --bundle | -b) bundle=$a ;; esac
    case $a in --bundle=*) bundle=${a#--bundle=} ;; esac
    prev=$a
done
if [ -n "$bundle" ] && [ -f "$bundle/config.json" ]; then
    python3 -c 'import json, sys
p = sys.argv[1]
c = json.load(open(p))
c.get("linux", {}).get("resources", {}).pop("cpu", None)
json.dump(c, open(p, "w"))' "$bundle/config.json"
fi
WRAPPER
    printf 'exec %q "$@"\n' "$2" >>"$1"
    chmod 755 "$1"
}

# archive_tools ARCHIVE PREFIX: what checkpointctl (where the root has it: forky's 1.3) and this package's
# criu-cuda-migrate tell of a checkpoint archive or image, as the steps PREFIX-checkpointctl-show,
# PREFIX-checkpointctl-inspect (checkpointctl only reads archives), PREFIX-ccm-inspect and PREFIX-ccm-inspect-json;
# without checkpointctl the file PREFIX-checkpointctl.absent says so.
archive_tools() {
    if [ -f "$1" ] && command -v checkpointctl >/dev/null 2>&1; then
        step "$2-checkpointctl-show" checkpointctl show "$1"
        step "$2-checkpointctl-inspect" checkpointctl inspect "$1"
    else
        echo "no checkpointctl in this root, or no archive file" >"$S/$2-checkpointctl.absent"
    fi
    step "$2-ccm-inspect" criu-cuda-migrate inspect "$1"
    step "$2-ccm-inspect-json" criu-cuda-migrate --json inspect "$1"
}

# runc_for_cri_shim NOTES: sets RUNC_BINARY to the runc containerd's shim runs: /usr/sbin/runc, or where cgroup2 has
# no cpu controller write_runc_nocpu's wrapper of it, said in the host-adjustments file NOTES.
runc_for_cri_shim() {
    RUNC_BINARY=/usr/sbin/runc
    : >"$1"
    if ! grep -qw cpu /sys/fs/cgroup/cgroup.controllers; then
        RUNC_BINARY=/usr/local/sbin/ccm-runc-nocpu
        write_runc_nocpu "$RUNC_BINARY" /usr/sbin/runc
        echo "runc of the shim: $RUNC_BINARY drops linux.resources.cpu (no cpu controller in this hybrid host's cgroup2)" >>"$1"
    fi
}

# start_registry DIR LOG: a docker-registry on a free port of the loopback (the roots share the host's network), its
# storage in DIR/registry, its log in LOG; sets REG (host:port) and REGISTRY_PID.
start_registry() {
    local port
    port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    REG=127.0.0.1:$port
    printf 'version: 0.1\nstorage:\n  filesystem:\n    rootdirectory: %s\nhttp:\n  addr: %s\n' "$1/registry" "$REG" >"$1/registry.yml"
    docker-registry serve "$1/registry.yml" >"$2" 2>&1 &
    # shellcheck disable=SC2034 # read by the flow that sourced this file (its cleanup)
    REGISTRY_PID=$!
}

# podman_cleanup CGROUP_PARENT: a Podman flow's EXIT trap: every container removed, whatever podman could not stop
# killed by its cgroup under CGROUP_PARENT (this run's own), those cgroups removed deepest first, Podman's storage
# tmpfs (podman_storage_and_conf) unmounted.
podman_cleanup() {
    podman rm --all --force --time 0 >/dev/null 2>&1
    local cg=/sys/fs/cgroup$1 pid
    if [ -d "$cg" ]; then
        find "$cg" -name cgroup.procs -exec cat {} + 2>/dev/null | while read -r pid; do kill -9 "$pid" 2>/dev/null; done
        sleep 0.5
        find "$cg" -depth -type d -exec rmdir {} + 2>/dev/null
    fi
    umount -l /var/lib/containers 2>/dev/null
}

# podman_storage_and_conf HYBRID NOTES: Podman's storage on a tmpfs (the root copy may sit on overlayfs) and a
# containers.conf for cgroupfs without journald; on a hybrid cgroup v1 host (HYBRID=1) no pids limit, said in NOTES.
podman_storage_and_conf() {
    mkdir -p /var/lib/containers /etc/containers
    mount -t tmpfs tmpfs /var/lib/containers
    {
        echo '[containers]'
        [ "$1" = 1 ] && echo 'pids_limit = 0'
        echo '[engine]'
        echo 'cgroup_manager = "cgroupfs"'
        echo 'events_logger = "file"'
    } >/etc/containers/containers.conf
    [ "$1" = 1 ] && echo "containers.conf: pids_limit = 0 (no pids controller in cgroup2 on this hybrid host)" >>"$2"
    return 0
}

# --- Podman with a CDI GPU on the test doubles (podman-cdi-flow.sh, podman-cdi-tree-flow.sh). These need P (the
# flow's prefix of every status file), NAME (its container) and S.

# note MSG...: a line of this flow in S/flow.log.
note() { printf '%s: %s\n' "$P" "$*" >>"$S/flow.log"; }

# pstep NAME CMD...: step with this flow's prefix (P-NAME).
pstep() {
    local n=$1
    shift
    step "$P-$n" "$@"
}

# ok NAME: whether the step P-NAME passed.
ok() { [ "$(cat "$S/$P-$1.rc" 2>/dev/null)" = 0 ]; }

# version_ge A B: whether version A is B or later.
version_ge() { [ "$(printf '%s\n%s\n' "$2" "$1" | sort -V | head -n1)" = "$2" ]; }

# podman_criu_conf RT: the plugin's libdir line in the file runtime RT's CRIU reads (section 3 of the user guide):
# /etc/criu/runc.conf for runc; /etc/criu/crun.conf for crun >= 1.26 with libcriu >= 4.2, else default.conf (and on a
# hybrid cgroup v1 host, with HYBRID=1, no restore: S/P-restore.skipped says why, RESTORES=0). Sets CONF, RT_BIN (the
# real runtime) and RESTORES; the file's name and copy go to S/P-conf-name and S/P-criu.conf. Returns 1 for an
# unknown runtime (S/P-setup.err).
# shellcheck disable=SC2034 # CONF, RT_BIN and RESTORES are read by the flow
podman_criu_conf() {
    local crun_version criu_version
    RESTORES=1
    mkdir -p /etc/criu
    rm -f /etc/criu/default.conf /etc/criu/crun.conf /etc/criu/runc.conf
    case $1 in
    runc) CONF=runc.conf RT_BIN=/usr/sbin/runc ;;
    crun)
        RT_BIN=/usr/bin/crun
        crun_version=$(crun --version 2>/dev/null | awk '/^crun version/ { print $3 }')
        criu_version=$(criu --version 2>/dev/null | awk '/^Version:/ { print $2 }')
        if version_ge "${crun_version:-0}" 1.26 && version_ge "${criu_version:-0}" 4.2; then
            CONF=crun.conf
        else
            CONF=default.conf
            if [ "$HYBRID" = 1 ]; then
                RESTORES=0
                echo "not attempted: this is a hybrid cgroup v1 host; CRIU would restore the tasks' v1 cgroups and fail" \
                    "writing cpuset.cpus (Permission denied), and crun $crun_version with libcriu $criu_version cannot pass" \
                    "CRIU the configuration file that says manage-cgroups=ignore (crun.conf needs crun 1.26 and libcriu 4.2)" \
                    >"$S/$P-restore.skipped"
            fi
        fi
        ;;
    *)
        echo "unknown runtime $1 (runc or crun)" >"$S/$P-setup.err"
        return 1
        ;;
    esac
    {
        grep '^libdir ' /etc/criu/criu-cuda-migrate.conf.example
        # default.conf is read by every CRIU; the hybrid host's setting goes only where a runtime hands CRIU its file.
        [ "$HYBRID" = 1 ] && [ "$CONF" != default.conf ] && echo 'manage-cgroups=ignore'
    } >"/etc/criu/$CONF"
    echo "$CONF" >"$S/$P-conf-name"
    cp "/etc/criu/$CONF" "$S/$P-criu.conf"
    [ "$HYBRID" = 1 ] && [ "$CONF" != default.conf ] &&
        echo "$CONF: manage-cgroups=ignore (CRIU cannot restore this hybrid host's v1 cpuset)" >>"$S/$P-host-adjustments.txt"
    return 0
}

# sim_runtime OUT REAL SIM [VAR=VALUE...]: OUT becomes the container's runtime: a script that adds what CRIU's plugin
# needs to find the test doubles of SIM (CRIU_CUDA_MIGRATE_LIBCUDA / LIBNVML, CCM_SIM_CONFIG, CCM_SIM_STATE_DIR) and
# VAR=VALUE..., then execs the REAL runtime (CRIU's parent is then runc or crun, whose spec the plugin reads). Podman
# runs a runtime's checkpoint with an environment of its own (PATH and XDG_RUNTIME_DIR only); a real node's libcuda is
# found by the dynamic linker and needs no variable. Said in S/P-sim-adjustments.txt.
sim_runtime() {
    local out=$1 real=$2 sim=$3 kv
    shift 3
    mkdir -p "${out%/*}"
    {
        echo '#!/bin/sh'
        echo "# tests/container ($P): the real $real, with what CRIU's plugin needs to find the test doubles."
        echo "export CRIU_CUDA_MIGRATE_LIBCUDA=$sim/lib/libcuda.so.1 CRIU_CUDA_MIGRATE_LIBNVML=$sim/lib/libnvidia-ml.so.1"
        echo "export CCM_SIM_CONFIG=$sim/gpus.json CCM_SIM_STATE_DIR=$sim/state CCM_SIM_CALL_TIMEOUT_MS=20000"
        for kv in "$@"; do printf 'export %q\n' "$kv"; done
        echo "exec $real \"\$@\""
    } >"$out"
    chmod 755 "$out"
    echo "runtime $out: the real ${real##*/} plus CRIU_CUDA_MIGRATE_LIBCUDA/LIBNVML, CCM_SIM_CONFIG, CCM_SIM_STATE_DIR${*:+, $*} (podman gives a runtime's checkpoint no environment of ours)" \
        >"$S/$P-sim-adjustments.txt"
}

# podman_cuda_image IMAGE SIM [FILE...]: the image IMAGE made locally (no registry) and imported (step P-image):
# busybox, the sample workload of S/sim-bin, the C libraries it and the doubles of SIM need, and FILE... in
# /usr/local/bin.
podman_cuda_image() {
    local image=$1 sim=$2 r=/tmp/ccm-cuda-rootfs applet
    shift 2
    rm -rf "$r"
    mkdir -p "$r/bin" "$r/proc" "$r/sys" "$r/dev" "$r/etc"
    cp /bin/busybox "$r/bin/busybox"
    for applet in sh sleep cat echo ls mkdir; do ln -sf busybox "$r/bin/$applet"; done
    cuda_rootfs "$r" "$S/sim-bin/ccm-sample-workload" "$sim/lib/libcuda.so.1" "$sim/lib/libnvidia-ml.so.1"
    [ $# -gt 0 ] && cp "$@" "$r/usr/local/bin/"
    tar -C "$r" -cf /tmp/ccm-cuda-rootfs.tar .
    pstep image podman import /tmp/ccm-cuda-rootfs.tar "$image"
}

# static_dir: the container's directory (podman's bundle: config.json, and with --keep CRIU's logs).
# shellcheck disable=SC2153 # NAME is the flow's (the container), not a misspelt local
static_dir() { podman inspect --format '{{.StaticDir}}' "$NAME" 2>/dev/null; }

# after_restore CASE: what the restored container is: its spec's GPU nodes, its /dev, CRIU's restore log.
after_restore() {
    local case=$1 dir pid
    dir=$(static_dir)
    [ -n "$dir" ] && cp "$dir/config.json" "$S/$P-$case-spec.json" 2>/dev/null
    [ -n "$dir" ] && cp "$dir/restore.log" "$S/$P-$case-restore.log" 2>/dev/null
    nvidia_nodes "$S/$P-$case-spec.json" >"$S/$P-$case-spec-nodes.txt"
    pid=$(podman inspect --format '{{.State.Pid}}' "$NAME" 2>/dev/null)
    if [ -n "$pid" ] && [ "$pid" != 0 ]; then
        ls "/proc/$pid/root/dev/" >"$S/$P-$case-dev.txt" 2>&1
    fi
    podman inspect --format '{{.State.Status}}' "$NAME" >"$S/$P-$case.state" 2>>"$S/$P-inspect.err"
}

# checkpoint_export CASE ARCHIVE [FLAGS...]: the container's checkpoint into ARCHIVE (--keep: CRIU's dump.log stays
# in the container's directory), its dump log and the archive's listing copied out.
checkpoint_export() {
    local case=$1 archive=$2 dir
    shift 2
    pstep "$case-checkpoint" podman container checkpoint --keep "$@" --export "$archive" "$NAME"
    dir=$(static_dir)
    [ -n "$dir" ] && cp "$dir/dump.log" "$S/$P-$case-dump.log" 2>/dev/null
    tar -tf "$archive" >"$S/$P-$case-archive.list" 2>&1
    podman inspect --format '{{.State.Status}}' "$NAME" >"$S/$P-$case-after-checkpoint.state" 2>>"$S/$P-inspect.err"
    ok "$case-checkpoint"
}

# override FILE [VAR=VALUE...]: a CONTAINERS_CONF_OVERRIDE file giving conmon (and so runc and CRIU) VAR=VALUE.
override() {
    local file=$1 kv
    shift
    {
        echo '[engine]'
        echo 'conmon_env_vars = ['
        echo '  "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",'
        for kv in "$@"; do echo "  \"$kv\","; done
        echo ']'
    } >"$file"
}

# restore_import CASE ARCHIVE [OVERRIDE-FILE]: `podman container restore --keep --import ARCHIVE`.
restore_import() {
    local case=$1 archive=$2 conf=${3:-}
    if [ -n "$conf" ]; then
        pstep "$case-restore" env CONTAINERS_CONF_OVERRIDE="$conf" podman container restore --keep --import "$archive"
    else
        pstep "$case-restore" podman container restore --keep --import "$archive"
    fi
}

# write_cri_config OUT CRIU_WORK CDI: containerd 2.x's configuration for the CRI flows: its root and state under D,
# its socket SOCK, the sandbox image PAUSE, runc of the shim RUNC_BINARY with CRIU's work directory (its logs) at
# CRIU_WORK, outside the task's bundle, which goes with a failed task; CDI=1 writes containerd 2.x's CDI defaults out.
write_cri_config() {
    local cdi=""
    [ "$3" = 1 ] && cdi='  # containerd 2.x'"'"'s defaults, written out: CDI on, the CDI spec directories.
  enable_cdi = true
  cdi_spec_dirs = ["/etc/cdi", "/var/run/cdi"]'
    cat >"$1" <<EOF
version = 3
root = "$D/root"
state = "$D/state"
[grpc]
  address = "$SOCK"
[plugins."io.containerd.cri.v1.images"]
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = "$PAUSE"
[plugins."io.containerd.cri.v1.runtime"]
  # The sandbox asks for oom_score_adj -998, below this process tree's own; without CAP_SYS_RESOURCE (a test
  # machine's root may lack it) the kernel refuses, so containerd keeps it no lower than its own (as rootless does).
  restrict_oom_score_adj = true
$cdi
  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
        BinaryName = "$RUNC_BINARY"
        CriuWorkPath = "$2"
EOF
}

# --- containerd's CRI (cri-flow.sh, cri-cdi-flow.sh, cri-cdi-tree-flow.sh). These need SOCK (containerd's socket)
# and D (its root and state directory).
CONTAINER_FLOWS=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

# cri CALL JSON: one CRI call (cri_client.py); its answer as JSON on stdout.
cri() { python3 "$CONTAINER_FLOWS/cri_client.py" "$SOCK" "$@"; }
# field JSON-FILE KEY: a top-level string field of a response.
field() { python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])' "$1" "$2" 2>/dev/null; }
# state ID: the container's CRI state (CONTAINER_RUNNING, ...).
state() { cri ContainerStatus "{\"container_id\":\"$1\"}" | python3 -c 'import json,sys; print(json.load(sys.stdin)["status"]["state"])'; }
# task_pid ID: the container's host pid; bundle_of ID: its runc shim's bundle (config.json), while it exists.
task_pid() { cri ContainerStatus "{\"container_id\":\"$1\",\"verbose\":true}" | python3 -c 'import json,sys; print(json.loads(json.load(sys.stdin)["info"]["info"])["pid"])' 2>/dev/null; }
bundle_of() { echo "$D/state/io.containerd.runtime.v2.task/k8s.io/$1"; }

# cri_runc_conf COPY: the plugin's libdir line in /etc/criu/runc.conf only (what the user guide says for containerd;
# on a hybrid cgroup v1 host also manage-cgroups=ignore: CRIU cannot restore the v1 cpuset, podman-flow.sh says
# more), the other CRIU configuration files removed; a copy of it in COPY.
cri_runc_conf() {
    mkdir -p /etc/criu
    rm -f /etc/criu/default.conf /etc/criu/crun.conf
    {
        grep '^libdir ' /etc/criu/criu-cuda-migrate.conf.example
        grep -qv '^0::' /proc/self/cgroup && echo 'manage-cgroups=ignore'
    } >/etc/criu/runc.conf
    cp /etc/criu/runc.conf "$1"
}

# cri_images STEP IMAGE-TAR PAUSE-TAR: once containerd's CRI answers, the workload's image (IMAGE) and the sandbox's
# imported, IMAGE tagged REG_IMAGE, pushed to the loopback registry and pulled through CRI, each through the flow's
# step function STEP (with its prefix); returns 1 at the first failed step. The container's image comes from a
# registry, as a kubelet's would: containerd 2.1's restore pulls the base image by the NAME@DIGEST the checkpoint
# recorded (ImageRef), and an image only imported has no such name. Debian's docker-registry serves it on 127.0.0.1
# over plain HTTP, which containerd's resolvers use for a loopback registry.
# shellcheck disable=SC2153 # IMAGE and REG_IMAGE are the flow's
cri_images() {
    local run=$1
    for _ in $(seq 150); do cri Version '{}' >/dev/null 2>&1 && break; sleep 0.2; done
    "$run" version cri Version '{}' || return 1
    "$run" image ctr --address "$SOCK" --namespace k8s.io images import "$2" || return 1
    "$run" pause-image ctr --address "$SOCK" --namespace k8s.io images import "$3" || return 1
    "$run" tag ctr --address "$SOCK" --namespace k8s.io images tag "$IMAGE" "$REG_IMAGE" || return 1
    "$run" push ctr --address "$SOCK" --namespace k8s.io images push --plain-http "$REG_IMAGE" || return 1
    "$run" pull cri PullImage "{\"image\":{\"image\":\"$REG_IMAGE\"}}" || return 1
}

# cri_restored PREFIX ID: what a CRI restore (StartContainer of container ID, made from a checkpoint) leaves for the
# test: CRIU's restore log, the restored container's spec, the NVIDIA nodes the spec gives and its state, as
# S/PREFIX-restore.log, -restore-spec.json, -restore-spec-nodes.txt and -after-restore.state.
cri_restored() {
    local p=$1 id=$2
    cp "$S/$p-criu-work/restore.log" "$S/$p-restore.log" 2>/dev/null
    cp "$(bundle_of "$id")/config.json" "$S/$p-restore-spec.json" 2>/dev/null
    nvidia_nodes "$S/$p-restore-spec.json" >"$S/$p-restore-spec-nodes.txt"
    state "$id" >"$S/$p-after-restore.state" 2>&1
}

# cri_cleanup STOP: what a CRI flow (cri-flow.sh, cri-cdi-flow.sh) leaves behind, for its EXIT trap: its
# containers (with STOP=1, stopped before they are removed), the pod sandbox, containerd and the registry, every
# process and cgroup under CGROUP_PARENT, containerd's shims of SOCK (they outlive containerd), the mounts under
# D/root. Needs the flow's `cri` function, SOCK, D and CGROUP_PARENT; uses POD, CONTAINERD_PID and REGISTRY_PID
# where they are set. Every step is best effort.
cri_cleanup() {
    local stop=$1 id
    for id in $(cri ListContainers '{}' 2>/dev/null | python3 -c 'import json,sys; [print(c["id"]) for c in json.load(sys.stdin).get("containers", [])]' 2>/dev/null); do
        [ "$stop" = 1 ] && cri StopContainer "{\"container_id\":\"$id\",\"timeout\":0}" >/dev/null 2>&1
        cri RemoveContainer "{\"container_id\":\"$id\"}" >/dev/null 2>&1
    done
    [ -n "${POD:-}" ] && cri StopPodSandbox "{\"pod_sandbox_id\":\"$POD\"}" >/dev/null 2>&1
    [ -n "${POD:-}" ] && cri RemovePodSandbox "{\"pod_sandbox_id\":\"$POD\"}" >/dev/null 2>&1
    [ -n "${CONTAINERD_PID:-}" ] && kill "$CONTAINERD_PID" 2>/dev/null && wait "$CONTAINERD_PID" 2>/dev/null
    [ -n "${REGISTRY_PID:-}" ] && kill "$REGISTRY_PID" 2>/dev/null && wait "$REGISTRY_PID" 2>/dev/null
    local cg=/sys/fs/cgroup$CGROUP_PARENT pid cmdline
    if [ -d "$cg" ]; then
        find "$cg" -name cgroup.procs -exec cat {} + 2>/dev/null | while read -r pid; do kill -9 "$pid" 2>/dev/null; done
        sleep 0.3
        find "$cg" -depth -type d -exec rmdir {} + 2>/dev/null
    fi
    # (no pgrep in this root: /proc is read directly)
    for cmdline in /proc/[0-9]*/cmdline; do
        tr '\0' ' ' <"$cmdline" 2>/dev/null | grep -q "^/usr/bin/containerd-shim-runc-v2 .*-address $SOCK" || continue
        pid=${cmdline#/proc/}
        kill -9 "${pid%/cmdline}" 2>/dev/null
    done
    umount -R "$D/root" 2>/dev/null
}

# --- plain runc on the test doubles (runc-cuda-flow.sh, runc-pod-flow.sh). These need RUNC_ROOT (runc's state
# directory of this run), CGROUP_PARENT (the cgroup parent of this run's containers), HELPERS (a file collecting the
# pids of the stdio helpers) and W (the doubles' directory, bound into every container at its own path).

# runc_ ARGS...: this run's runc.
runc_() { runc --root "$RUNC_ROOT" "$@"; }

# runc_cleanup: the flow's EXIT trap: every container of RUNC_ROOT deleted, whatever runc could not stop killed by
# its cgroup under CGROUP_PARENT, the stdio helpers killed by pid.
runc_cleanup() {
    local id pid comm cg
    for id in $(runc_ list -q 2>/dev/null); do runc_ delete -f "$id" >/dev/null 2>&1; done
    # Whatever runc could not stop: kill it by cgroup, then remove the cgroups, deepest first.
    cg=/sys/fs/cgroup$CGROUP_PARENT
    if [ -d "$cg" ]; then
        find "$cg" -name cgroup.procs -exec cat {} + 2>/dev/null | while read -r pid; do kill -9 "$pid" 2>/dev/null; done
        sleep 0.3
        find "$cg" -depth -type d -exec rmdir {} + 2>/dev/null
    fi
    # The stdio helpers, each by its pid, only while it still is the helper we started.
    if [ -f "$HELPERS" ]; then
        while read -r pid; do
            comm=$(cat "/proc/$pid/comm" 2>/dev/null) || continue
            case $comm in sleep | cat) kill "$pid" 2>/dev/null ;; esac
        done <"$HELPERS"
    fi
    rm -rf "$RUNC_ROOT"
}

# piped_runc NAME ARGS...: runc ARGS with stdin, stdout and stderr on pipes whose far ends are a `sleep` and a `cat`
# appending to S/NAME.err (runc hands its stdio to the container, at restore too); its status in S/NAME.rc, as `step`
# records it. The helpers write their pids to HELPERS themselves.
piped_runc() {
    local name=$1 rc
    shift
    : >"$S/$name.out"
    (
        # Nothing of the caller's but the three pipes may reach the container (CRIU could not restore it).
        for fd in /proc/self/fd/*; do
            fd=${fd##*/}
            [ "$fd" -gt 2 ] 2>/dev/null && eval "exec $fd>&-" 2>/dev/null
        done
        exec runc --root "$RUNC_ROOT" "$@" < <(exec sh -c 'echo $$ >>"$1"; exec sleep 100000' sh "$HELPERS") \
            > >(exec sh -c 'echo $$ >>"$1"; exec cat >>"$2"' sh "$HELPERS" "$S/$name.err") 2>&1
    )
    rc=$?
    echo "$rc" >"$S/$name.rc"
    return "$rc"
}

# container_pid ID: the container's init as a pid of this (host) pid namespace.
container_pid() { runc_ state "$1" 2>/dev/null | sed -n 's/^ *"pid": *\([0-9]*\),*$/\1/p'; }

# write_runc_config FILE ID CTL ARGS DEVICES ALLOW DEVMOUNTS [ENV [HOOKS]]: the config.json of a container ID on the
# test doubles, written whole (there is no python or jq in the trixie root): its own pid, ipc, uts and mount
# namespaces (no network namespace) and /proc, the root's /usr and /etc read-only, W bound at its own path and CTL at
# /ctl, the doubles found through LD_LIBRARY_PATH, CCM_SIM_CONFIG and CCM_SIM_STATE_DIR. ARGS: the JSON items of
# process.args; DEVICES: a `"devices": [...],` member of linux (or empty); ALLOW: `, {...}` items of the devices
# cgroup after its deny-all; DEVMOUNTS: the /dev mounts, each item followed by a comma; ENV: `, "NAME=VALUE"` items
# added to process.env; HOOKS: a `"hooks": {...},` member (or empty).
write_runc_config() {
    local file=$1 id=$2 ctl=$3 args=$4 devices=$5 allow=$6 devmounts=$7 env=${8:-} hooks=${9:-}
    cat >"$file" <<EOF
{
  "ociVersion": "1.2.0",
  "process": {
    "terminal": false,
    "user": { "uid": 0, "gid": 0 },
    "args": [$args],
    "env": [
      "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
      "HOME=/tmp",
      "LD_LIBRARY_PATH=$W/lib",
      "CCM_SIM_CONFIG=$W/gpus.json",
      "CCM_SIM_STATE_DIR=$W/state"$env
    ],
    "cwd": "/tmp",
    "capabilities": {
      "bounding": ["CAP_AUDIT_WRITE", "CAP_KILL", "CAP_NET_BIND_SERVICE"],
      "effective": ["CAP_AUDIT_WRITE", "CAP_KILL", "CAP_NET_BIND_SERVICE"],
      "permitted": ["CAP_AUDIT_WRITE", "CAP_KILL", "CAP_NET_BIND_SERVICE"],
      "ambient": ["CAP_AUDIT_WRITE", "CAP_KILL", "CAP_NET_BIND_SERVICE"]
    },
    "rlimits": [{ "type": "RLIMIT_NOFILE", "hard": 1024, "soft": 1024 }],
    "noNewPrivileges": true
  },
  "root": { "path": "rootfs", "readonly": true },
  "hostname": "ccm-rcuda",$hooks
  "mounts": [
    { "destination": "/proc", "type": "proc", "source": "proc" },
    $devmounts
    { "destination": "/sys", "type": "sysfs", "source": "sysfs", "options": ["nosuid", "noexec", "nodev", "ro"] },
    { "destination": "/tmp", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "nodev", "mode=1777"] },
    { "destination": "/usr", "type": "bind", "source": "/usr", "options": ["rbind", "ro", "nosuid", "nodev"] },
    { "destination": "/etc", "type": "bind", "source": "/etc", "options": ["rbind", "ro", "nosuid", "nodev"] },
    { "destination": "$W", "type": "bind", "source": "$W", "options": ["bind", "rw"] },
    { "destination": "/ctl", "type": "bind", "source": "$ctl", "options": ["bind", "rw"] }
  ],
  "linux": {
    "cgroupsPath": "$CGROUP_PARENT/$id",
    $devices
    "resources": { "devices": [{ "allow": false, "access": "rwm" }$allow] },
    "namespaces": [{ "type": "pid" }, { "type": "ipc" }, { "type": "uts" }, { "type": "mount" }],
    "maskedPaths": ["/proc/acpi", "/proc/asound", "/proc/kcore", "/proc/keys", "/proc/latency_stats", "/proc/timer_list",
                    "/proc/timer_stats", "/proc/sched_debug", "/sys/firmware", "/proc/scsi"],
    "readonlyPaths": ["/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"]
  }
}
EOF
}

# --- A torchrun-like tree in a container (tree-agent.sh: an agent, RANKS ranks of the sample workload, each with
# forked workers holding the GPU's nodes; podman-cdi-tree-flow.sh, cri-cdi-tree-flow.sh). These need P, S, CTL (the
# ranks' control directories' parent on this side: CTL/wR) and RANKS; tree_doubles also SIM, G0 and G1.

# rounds CASE K: round K of every rank (go<K>, then done<K>), each rank's report<K>.json copied to
# S/P-CASE-w<R>-report<K>.json; the status (1 when a rank did not report) in S/P-CASE-round<K>.rc.
rounds() {
    local case=$1 k=$2 r rc=0
    for ((r = 0; r < RANKS; r++)); do : >"$CTL/w$r/go$k"; done
    for ((r = 0; r < RANKS; r++)); do
        wait_file "$CTL/w$r/done$k" 60 || rc=1
        [ -f "$CTL/w$r/report$k.json" ] && cp "$CTL/w$r/report$k.json" "$S/$P-$case-w$r-report$k.json"
    done
    echo "$rc" >"$S/$P-$case-round$k.rc"
    return "$rc"
}

# tree_doubles CDI-SPEC: the stand-in nodes of the two GPUs (loop_stand_ins in S/P-loops: LOOPS, STAND_INS), the
# doubles of G0 and G1 in SIM, and their CDI spec at CDI-SPEC naming the stand-ins' numbers; S/P-stand-ins.txt,
# S/P-gpus.txt and S/P-cdi.json record them. Returns 1 (S/P-setup.err says why) when no loop device was free.
tree_doubles() {
    mkdir -p "$S/$P-loops" "$(dirname "$1")"
    if ! loop_stand_ins "$S/$P-loops" 2; then
        echo "no free loop device for the stand-ins of /dev/nvidia0 and /dev/nvidia1" >"$S/$P-setup.err"
        return 1
    fi
    echo "$STAND_INS" >"$S/$P-stand-ins.txt"
    sim_stack "$SIM" "$S/sim-bin" "$G0" "$G1"
    echo "$G0 $G1" >"$S/$P-gpus.txt"
    write_sim_cdi_spec "$1" "$SIM" 0 1 "${STAND_IN_NUMBERS[@]}"
    cp "$1" "$S/$P-cdi.json"
}

# ranks_ready: waits for every rank's ready file (60 s each); the status in S/P-ready.rc. Returns 1 when one did not
# come (the flow then saves the container's log in S/P-ready.err and ends).
ranks_ready() {
    local r ready=0
    for ((r = 0; r < RANKS; r++)); do
        wait_file "$CTL/w$r/ready" 60 || ready=1
    done
    echo "$ready" >"$S/$P-ready.rc"
    return "$ready"
}

# children_of PID: the pids whose parent is PID (there is no pgrep in these roots).
children_of() {
    local f line ppid
    for f in /proc/[0-9]*/stat; do
        line=$(cat "$f" 2>/dev/null) || continue
        read -r _ ppid _ <<<"${line##*) }"
        if [ "$ppid" = "$1" ]; then
            f=${f#/proc/}
            echo "${f%/stat}"
        fi
    done
}

# ns_pid PID: PID as its own (innermost) pid namespace numbers it.
ns_pid() { awk '/^NSpid:/ { print $NF }' "/proc/$1/status" 2>/dev/null; }

# held PID: the NVIDIA nodes (and the plugin's placeholders) PID's descriptors and mappings name, as
# `fds=A,B maps=C` (paths inside its mount namespace, sorted, each once).
held() {
    local fds maps f
    fds=$(for f in /proc/"$1"/fd/*; do readlink "$f"; done 2>/dev/null | grep -E '^/dev/nvidia' | sort -u | paste -sd, -)
    maps=$(awk '$6 ~ /^\/dev\/nvidia/ || $6 ~ /criu-cuda-migrate-placeholder/ { print $6 }' "/proc/$1/maps" 2>/dev/null |
        sort -u | paste -sd, -)
    echo "fds=$fds maps=$maps"
}

# tree_holdings CASE AGENT: the container's tree below its agent's host pid AGENT as S/P-CASE-tree.txt: `rank R
# pid=NS host=PID workers=N` for each rank (R from its control directory's ready file, which holds its pid), `worker R
# pid=NS host=PID fds=... maps=...` for each of its children.
tree_holdings() {
    local out=$S/$P-$1-tree.txt agent=$2 rank ns r w workers
    : >"$out"
    if [ -z "$agent" ] || [ "$agent" = 0 ]; then
        echo "no running container" >>"$out"
        return 1
    fi
    echo "agent pid=$(ns_pid "$agent") host=$agent comm=$(cat "/proc/$agent/comm" 2>/dev/null)" >>"$out"
    for rank in $(children_of "$agent"); do
        ns=$(ns_pid "$rank")
        r=unknown
        for ((w = 0; w < RANKS; w++)); do
            [ "$(cat "$CTL/w$w/ready" 2>/dev/null)" = "$ns" ] && r=$w
        done
        workers=$(children_of "$rank")
        echo "rank $r pid=$ns host=$rank comm=$(cat "/proc/$rank/comm" 2>/dev/null) workers=$(echo "$workers" | grep -c .)" >>"$out"
        for w in $workers; do
            echo "worker $r pid=$(ns_pid "$w") host=$w $(held "$w")" >>"$out"
        done
    done
}
