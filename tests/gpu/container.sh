#!/usr/bin/env bash
# GPU proofs for CUDA containers under runc, on one machine and across machines (issue 14).
#
# Run THERE, from the repository root, after tests/gpu/prepare.sh ran HERE and `.device/` was carried:
#
#   bash tests/gpu/container.sh same             same-machine cases (checkpoint/restore, leave-running,
#                                                two CUDA processes, refusal by preflight)
#   bash tests/gpu/container.sh dump             phase 1 of the cross-machine move, on machine A: dumps a
#                                                CUDA container and a bare CUDA process, writes
#                                                $OUT/xfer-*.tar.xz (split into 15 MiB parts) and meta.txt
#   bash tests/gpu/container.sh restore XFER     phase 2, on machine B: XFER is a folder holding phase 1's
#                                                files; restores both there, NCCL after the restore
#   bash tests/gpu/container.sh same dump        several phases in one call (c1 ... c7: one same-machine case;
#                                                c7 is the legacy NVIDIA hook instead of CDI)
#
# Anyone with two single-GPU nodes reruns the move the same way: `dump` on node A, copy $OUT's xfer-* and
# meta.txt to node B, `restore DIR` there. Both nodes need the same driver, the checkout at the same path,
# and python3 (+ torch for the NCCL step).
#
# What the container is, as nvidia-container-toolkit / CDI set one up: the GPU device nodes in
# linux.devices (majors read with stat) and allowed in the devices cgroup, the driver's libraries
# (/usr/local/nvidia) bind-mounted read-only as a mount of their own, the host's /usr, /etc and /opt
# read-only, its own pid, mount, ipc and uts namespaces and /proc, stdio on pipes as a shim gives them.
# runc runs CRIU from PATH; CRIU loads the plugin from the packaged .deb's libdir line in
# /etc/criu/runc.conf only (no --libdir, no plugin environment).
#
# Results: $OUT/container-results.tsv and the table on stdout (`case | expected | seen | result | times`).

set -uo pipefail
# No -e: a status-recording flow. A failed case is recorded as a FAIL row and the next case runs.

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
DEVICE_DIR=${CCM_DEVICE_DIR:-$REPO/.device}
WORK=$(realpath -m "${CCM_WORK:-/var/tmp/ccm-ctr}")
RESULTS_DIR=$(realpath -m "${OUT:-$WORK/out}")
RESULTS=$RESULTS_DIR/container-results.tsv
CRIU_ROOT=/opt/criu
CRIU_BIN=$CRIU_ROOT/usr/sbin/criu
CRIU_LIBS=$CRIU_ROOT/usr/lib/x86_64-linux-gnu
RUNC_ROOT_DIR=/opt/runc
CRIU_TIMEOUT=${CCM_CRIU_TIMEOUT:-150}
READY_TIMEOUT=${CCM_READY_TIMEOUT:-90}
ROUND_TIMEOUT=${CCM_ROUND_TIMEOUT:-180}
WORKLOAD=$DEVICE_DIR/bin/ccm-sample-workload
LATE=$REPO/tests/gpu/late_nccl.py
# What the legacy NVIDIA hook does at a container's start (tests/gpu/legacy_hook.py; the toolkit is not packaged).
LEGACY_HOOK=$REPO/tests/gpu/legacy_hook.py
CHECK=(python3 "$REPO/tests/gpu/gpu_check.py")
PLUGIN_LIBDIR=/usr/lib/criu-cuda-migrate/plugins
export NCCL_NVLS_ENABLE=0
# The bare process of the cross-machine move gets a high pid, free on the next machine.
BARE_PID_BASE=${CCM_BARE_PID_BASE:-30000}

# shellcheck source=tests/gpu/processes.sh
source "$REPO/tests/gpu/processes.sh"
# log, now, elapsed, record CASE EXPECTED SEEN RESULT TIMES, print_table, ...
# shellcheck source=tests/lib/common.sh
source "$REPO/tests/lib/common.sh"

# runc with its Debian libseccomp and a state directory of our own (a script, so that `exec` reaches it).
RUNC=$WORK/bin/ccm-runc
runc_() { "$RUNC" "$@"; }

# ------------------------------------------------------------------------------------------------
# Setup: CRIU and runc from the carried Debian packages, the plugin from its own .deb.

setup() {
    mkdir -p "$WORK/bin" "$WORK/cases" "$RESULTS_DIR/logs" "$WORK/runc-state"
    : >"$WORK/pids"
    [[ -f $RESULTS ]] || : >"$RESULTS"
    local f
    for f in "$DEVICE_DIR"/criu-debs/*.deb; do dpkg -x "$f" "$CRIU_ROOT"; done
    ls "$DEVICE_DIR"/runc-debs/*.deb >/dev/null 2>&1 || { echo "no $DEVICE_DIR/runc-debs: run tests/gpu/prepare.sh" >&2; exit 2; }
    for f in "$DEVICE_DIR"/runc-debs/*.deb; do dpkg -x "$f" "$RUNC_ROOT_DIR"; done
    local pkg
    pkg=$(first_file "$DEVICE_DIR"/pkg/criu-cuda-migrate_*.deb)
    [[ -n $pkg ]] || { echo "no $DEVICE_DIR/pkg/criu-cuda-migrate_*.deb: run tests/gpu/prepare.sh" >&2; exit 2; }
    # The package's files, as `dpkg -i` puts them (its dependency on Debian's criu does not resolve on
    # Ubuntu, whose CRIU is too old; CRIU comes from the carried debs), then the user guide's one step:
    # the libdir line into runc.conf.
    dpkg -x "$pkg" /
    mkdir -p /etc/criu
    grep '^libdir' /etc/criu/criu-cuda-migrate.conf.example >/etc/criu/runc.conf
    # runc runs `criu` from PATH; this one only adds CRIU's own Debian libraries.
    cat >"$WORK/bin/criu" <<EOF
#!/bin/sh
LD_LIBRARY_PATH=$CRIU_LIBS\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH} exec $CRIU_BIN "\$@"
EOF
    chmod +x "$WORK/bin/criu"
    cat >"$RUNC" <<EOF
#!/bin/sh
LD_LIBRARY_PATH=$RUNC_ROOT_DIR/usr/lib/x86_64-linux-gnu exec $RUNC_ROOT_DIR/usr/sbin/runc --root $WORK/runc-state "\$@"
EOF
    chmod +x "$RUNC"
    export PATH=$WORK/bin:$PATH
    GPU_UUID=$(nvidia-smi --query-gpu=uuid --format=csv,noheader | head -n1 | tr -d ' ')
    GPU_BUS=$(nvidia-smi --query-gpu=pci.bus_id --format=csv,noheader | head -n1 | tr -d ' ')
    GPU_BUS=$(python3 -c 'import sys; b=sys.argv[1].lower(); d,rest=b.split(":",1); print("%04x:%s" % (int(d,16), rest))' "$GPU_BUS")
    GPU_MINOR=$(nvidia-smi --query-gpu=index --format=csv,noheader | head -n1)
    GPU_MINOR=$(awk '/Device Minor/ {print $3; exit}' /proc/driver/nvidia/gpus/*/information 2>/dev/null || echo "$GPU_MINOR")
    TORCH_DIR=$(python3 -c 'import torch, os; print(os.path.dirname(os.path.dirname(torch.__file__)))' 2>/dev/null || true)
    {
        echo "host: $(hostname)"
        echo "gpu_uuid: $GPU_UUID"
        echo "gpu_bus: $GPU_BUS"
        echo "gpu_minor: $GPU_MINOR"
        echo "runc: $(runc_ --version | head -n1)"
        echo "criu: $(criu --version | head -n1)"
        echo "driver: $(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -n1)"
        echo "torch: $TORCH_DIR"
        echo "revision: $(sed -n 's/^revision: //p' "$DEVICE_DIR/MANIFEST" 2>/dev/null)"
    } >"$RESULTS_DIR/machine-$(hostname).txt"
    log "GPU $GPU_UUID at $GPU_BUS (minor $GPU_MINOR); $(runc_ --version | head -n1); $(criu --version | head -n1)"
}

cleanup() {
    local id
    for id in $(runc_ list -q 2>/dev/null); do runc_ delete -f "$id" >/dev/null 2>&1; done
    cleanup_processes
    pkill -f "ccm-ctr-stdio" 2>/dev/null
}
trap cleanup EXIT

# ------------------------------------------------------------------------------------------------
# Bundles and containers

# make_bundle DIR CTL ARGS-JSON: a runc bundle whose process runs ARGS (a JSON list); CTL is bound at /ctl.
make_bundle() {
    local dir=$1 ctl=$2 args=$3
    rm -rf "$dir"
    mkdir -p "$dir/rootfs" "$ctl"
    (cd "$dir" && runc_ spec)
    python3 - "$dir" "$ctl" "$args" "$REPO" "${BUNDLE_GPU_MINOR:-$GPU_MINOR}" "$TORCH_DIR" "${EXTRA_DEVICE:-}" "${LEGACY_NVD:-}" "$LEGACY_HOOK" <<'PY'
import json, os, sys
d, ctl, args, repo, minor, torch_dir, extra, legacy_nvd, legacy_hook = sys.argv[1:10]
root = os.path.join(d, "rootfs")
for link, target in (("bin", "usr/bin"), ("lib", "usr/lib"), ("lib64", "usr/lib64"), ("sbin", "usr/sbin")):
    os.symlink(target, os.path.join(root, link))
for sub in ("usr", "etc", "opt", "proc", "sys", "dev", "tmp", "ctl", repo.lstrip("/")):
    os.makedirs(os.path.join(root, sub), exist_ok=True)
c = json.load(open(os.path.join(d, "config.json")))
c["process"]["terminal"] = False
c["process"]["args"] = json.loads(args)
c["process"]["cwd"] = "/tmp"
c["process"]["env"] = [
    "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "LD_LIBRARY_PATH=/usr/local/nvidia/lib64",
    "HOME=/tmp", "NCCL_NVLS_ENABLE=0", "PYTHONDONTWRITEBYTECODE=1",
]
c["root"] = {"path": "rootfs", "readonly": True}
ro = ["rbind", "ro", "nosuid", "nodev"]
mounts = [m for m in c["mounts"] if m["destination"] not in ("/tmp",)]
mounts.append({"destination": "/tmp", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "nodev", "mode=1777"]})
for src in ("/usr", "/etc", "/opt"):
    mounts.append({"destination": src, "type": "bind", "source": src, "options": ro})
# The driver's libraries: a bind mount of their own (as a submount of /usr CRIU refuses them).
if os.path.isdir("/usr/local/nvidia"):
    mounts.append({"destination": "/usr/local/nvidia", "type": "bind", "source": "/usr/local/nvidia", "options": ["bind", "ro", "nosuid", "nodev"]})
mounts.append({"destination": repo, "type": "bind", "source": repo, "options": ["bind", "ro"]})
# PyTorch where pip put it, when that is outside the bound trees.
if torch_dir and not torch_dir.startswith(("/usr/", "/opt/")):
    os.makedirs(os.path.join(root, torch_dir.lstrip("/")), exist_ok=True)
    mounts.append({"destination": torch_dir, "type": "bind", "source": torch_dir, "options": ["rbind", "ro"]})
mounts.append({"destination": "/ctl", "type": "bind", "source": ctl, "options": ["bind", "rw"]})
c["mounts"] = mounts
lin = c["linux"]
lin["namespaces"] = [n for n in lin["namespaces"] if n["type"] in ("pid", "mount", "ipc", "uts")]
devs, allow = [], [{"allow": False, "access": "rwm"}]
for path in ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", f"/dev/nvidia{minor}"):
    if os.path.exists(path):
        st = os.stat(path)
        maj, mi = os.major(st.st_rdev), os.minor(st.st_rdev)
    else:  # a GPU this node does not have (the refusal case): the NVIDIA major, that minor
        maj, mi = os.major(os.stat("/dev/nvidiactl").st_rdev), int(minor)
    # The legacy NVIDIA hook: no GPU node in linux.devices (the hook makes them in the container's /dev);
    # the devices cgroup still lets them through (the hook's other job).
    if not legacy_nvd:
        devs.append({"path": path, "type": "c", "major": maj, "minor": mi, "fileMode": 0o666, "uid": 0, "gid": 0})
    allow.append({"allow": True, "type": "c", "major": maj, "minor": mi, "access": "rwm"})
if legacy_nvd:
    c["process"]["env"].append("NVIDIA_VISIBLE_DEVICES=" + legacy_nvd)
    py = sys.executable
    c["hooks"] = {"createRuntime": [{"path": py, "args": [py, legacy_hook, os.path.join(ctl, "legacy-hook.log")]}]}
# A probe device only one of two bundles has: shows whether a restore takes /dev from the new
# bundle or from the dumped container.
if extra:
    devs.append({"path": extra, "type": "c", "major": 1, "minor": 3, "fileMode": 0o666, "uid": 0, "gid": 0})
    allow.append({"allow": True, "type": "c", "major": 1, "minor": 3, "access": "rwm"})
lin["devices"] = devs
lin.setdefault("resources", {})["devices"] = allow
json.dump(c, open(os.path.join(d, "config.json"), "w"), indent=1)
PY
}

# with_pipes LOG CMD...: CMD with stdin and stdout/stderr on pipes (what a runtime's shim gives a
# container; CRIU refuses host files as container stdio). The pipes' far ends live on in two small
# processes marked ccm-ctr-stdio.
with_pipes() {
    local logfile=$1
    shift
    (
        close_inherited_fds
        exec "$@" < <(exec -a ccm-ctr-stdio sleep 100000) > >(exec -a ccm-ctr-stdio-out cat >>"$logfile") 2>&1
    )
}

# start_container ID BUNDLE: runc run -d.
start_container() {
    with_pipes "$WORK/$1.stdio.log" "$RUNC" run -d --bundle "$2" "$1"
}

# container_pid ID: the container's init, as a host pid.
container_pid() { runc_ state "$1" 2>/dev/null | python3 -c 'import json,sys; print(json.load(sys.stdin)["pid"])'; }

checkpoint() { # ID IMG [runc checkpoint flags...]
    local id=$1 img=$2
    shift 2
    mkdir -p "$img" "$img.work"
    runc_ checkpoint --image-path "$img" --work-path "$img.work" "$@" "$id"
}

restore_container() { # ID BUNDLE IMG [env assignments for the runtime...]
    local id=$1 bundle=$2 img=$3
    shift 3
    mkdir -p "$img.rwork"
    (
        # shellcheck disable=SC2163 # the arguments are NAME=VALUE pairs to export
        [[ $# -gt 0 ]] && export "$@"
        with_pipes "$WORK/$id.stdio.log" "$RUNC" restore -d --bundle "$bundle" --image-path "$img" --work-path "$img.rwork" "$id"
    )
}

go_round() { # CTL K
    : >"$1/go$2"
    wait_file "$1/done$2" "$ROUND_TIMEOUT"
}

images_sum() { (cd "$1" && find . -type f -print0 | sort -z | xargs -0 sha256sum | sha256sum | cut -c1-16); }

plugin_times() { # LOG: the plugin's driver-call times, short
    grep -o 'cuCheckpointProcess[A-Za-z]* [^;]*[0-9.]* s\|cuInit [0-9.]* s in the driver agent[^)]*)' "$1" 2>/dev/null |
        sed 's/cuCheckpointProcess//; s/ (timeout [0-9]* ms)//; s/ in the driver agent (started at init; this hook waited/ (waited/' | tr '\n' ';' | cut -c1-160
}

check_sample_report() { # FILE: the sample workload's report agrees with this machine's GPU
    "${CHECK[@]}" report "$1" --uuid "0=$GPU_UUID" --bus "0=$GPU_BUS" --nvml-by-bus "0=$GPU_UUID" --consistent --data-ok
}

no_thread_warning() { # LOG
    ! grep -q "CRIU has [0-9]* threads after" "$1"
}

save() { # CASE-DIR
    local dest=$RESULTS_DIR/logs/${1##*/}
    mkdir -p "$dest"
    (cd "$1" && find . -type f \( -name '*.log' -o -name '*.json' -o -name '*.txt' -o -name 'ready' \) -size -10M -print0 | xargs -0 -r cp --parents -t "$dest")
    cp "$WORK"/*.stdio.log "$dest/" 2>/dev/null
}

# ------------------------------------------------------------------------------------------------
# Same-machine cases

sample_args() { # CTL-IN-CONTAINER [MIB]
    printf '["%s","--dir","%s","--mib","%s","--devices","0","--rounds","3"]' "$WORKLOAD" "$1" "${2:-256}"
}

case_checkpoint_restore() {
    local c=$WORK/cases/c1 id=ccm-c1 t0 td tr pid1 pid2 seen
    rm -rf "$c"; mkdir -p "$c"
    make_bundle "$c/bundle" "$c/ctl" "$(sample_args /ctl)"
    start_container $id "$c/bundle" || { record c1-runc-checkpoint-restore "restored, identity agrees" "runc run failed: $(tail -n2 "$WORK/$id.stdio.log")" FAIL -; return; }
    wait_file "$c/ctl/ready" "$READY_TIMEOUT" || { record c1-runc-checkpoint-restore "restored, identity agrees" "workload not ready: $(tail -n2 "$WORK/$id.stdio.log")" FAIL -; return; }
    go_round "$c/ctl" 1
    pid1=$(container_pid $id)
    t0=$(now)
    if ! checkpoint $id "$c/img"; then
        record c1-runc-checkpoint-restore "checkpoint passes" "runc checkpoint failed: $(grep -E 'Error' "$c/img.work/dump.log" | head -n2 | tr '\n' ' ' | cut -c1-200)" FAIL "-"
        save "$c"; return
    fi
    td=$(elapsed "$t0")
    t0=$(now)
    EXTRA_DEVICE=/dev/ccm-probe make_bundle "$c/bundle" "$c/ctl" "$(sample_args /ctl)"
    if ! restore_container $id "$c/bundle" "$c/img"; then
        record c1-runc-checkpoint-restore "restore passes" "runc restore failed: $(grep -E 'Error' "$c/img.rwork/restore.log" | head -n2 | tr '\n' ' ' | cut -c1-200)" FAIL "checkpoint ${td}s"
        save "$c"; return
    fi
    tr=$(elapsed "$t0")
    pid2=$(container_pid $id)
    # Which /dev the restored container holds: the dumped one, or the restore bundle's (which alone
    # has /dev/ccm-probe)?
    # shellcheck disable=SC2012 # a listing for people to read
    record c1-info-restored-dev "-" "restored /dev: $(ls /proc/"$pid2"/root/dev | tr '\n' ' '); probe device of the restore bundle $([[ -e /proc/$pid2/root/dev/ccm-probe ]] && echo present || echo absent)" info -
    go_round "$c/ctl" 2
    if seen=$(check_sample_report "$c/ctl/report2.json") && no_thread_warning "$c/img.work/dump.log"; then
        record c1-runc-checkpoint-restore "restored, identity agrees, data intact" "host pid $pid1 -> $pid2; $seen" PASS "checkpoint ${td}s, restore ${tr}s; dump: $(plugin_times "$c/img.work/dump.log") restore: $(plugin_times "$c/img.rwork/restore.log")"
    else
        record c1-runc-checkpoint-restore "restored, identity agrees, data intact" "$seen" FAIL "checkpoint ${td}s, restore ${tr}s"
    fi
    runc_ delete -f $id >/dev/null 2>&1
    save "$c"
}

case_leave_running() {
    local c=$WORK/cases/c2 id=ccm-c2 t0 td seen
    rm -rf "$c"; mkdir -p "$c"
    make_bundle "$c/bundle" "$c/ctl" "$(sample_args /ctl)"
    { start_container $id "$c/bundle" && wait_file "$c/ctl/ready" "$READY_TIMEOUT"; } || { record c2-runc-leave-running "keeps running" "not started: $(tail -n2 "$WORK/$id.stdio.log")" FAIL -; return; }
    go_round "$c/ctl" 1
    t0=$(now)
    if ! checkpoint $id "$c/img" --leave-running; then
        record c2-runc-leave-running "checkpoint passes, container runs on" "runc checkpoint --leave-running failed: $(grep -E 'Error' "$c/img.work/dump.log" | head -n2 | tr '\n' ' ' | cut -c1-200)" FAIL -
        save "$c"; return
    fi
    td=$(elapsed "$t0")
    go_round "$c/ctl" 2
    if seen=$(check_sample_report "$c/ctl/report2.json") && [[ $(runc_ state $id | grep -c '"status": "running"') == 1 ]] && ls "$c"/img/cuda-migrate-*.img >/dev/null; then
        record c2-runc-leave-running "container runs on, RUNNING on its GPU, identity image written" "$seen; $(grep -o 'rolling back [0-9]* CUDA process(es)[^(]*' "$c/img.work/dump.log" | head -n1)" PASS "checkpoint ${td}s; $(plugin_times "$c/img.work/dump.log")"
    else
        record c2-runc-leave-running "container runs on, identity agrees" "${seen:-state $(runc_ state $id 2>&1 | tr -d '\n' | cut -c1-100)}" FAIL "checkpoint ${td}s"
    fi
    runc_ delete -f $id >/dev/null 2>&1
    save "$c"
}

case_two_processes() {
    local c=$WORK/cases/c3 id=ccm-c3 t0 td tr sa sb args
    rm -rf "$c"; mkdir -p "$c/ctl/a" "$c/ctl/b"
    args=$(printf '["/bin/sh","-c","%s --dir /ctl/a --mib 128 --rounds 3 & %s --dir /ctl/b --mib 128 --rounds 3 & wait"]' "$WORKLOAD" "$WORKLOAD")
    make_bundle "$c/bundle" "$c/ctl" "$args"
    mkdir -p "$c/ctl/a" "$c/ctl/b"
    { start_container $id "$c/bundle" && wait_file "$c/ctl/a/ready" "$READY_TIMEOUT" && wait_file "$c/ctl/b/ready" "$READY_TIMEOUT"; } ||
        { record c3-runc-two-processes "both restored" "not started: $(tail -n2 "$WORK/$id.stdio.log")" FAIL -; return; }
    go_round "$c/ctl/a" 1; go_round "$c/ctl/b" 1
    t0=$(now)
    checkpoint $id "$c/img" || { record c3-runc-two-processes "checkpoint passes" "$(grep -E 'Error' "$c/img.work/dump.log" | head -n2 | tr '\n' ' ' | cut -c1-200)" FAIL -; save "$c"; return; }
    td=$(elapsed "$t0")
    t0=$(now)
    restore_container $id "$c/bundle" "$c/img" || { record c3-runc-two-processes "restore passes" "$(grep -E 'Error' "$c/img.rwork/restore.log" | head -n2 | tr '\n' ' ' | cut -c1-200)" FAIL "checkpoint ${td}s"; save "$c"; return; }
    tr=$(elapsed "$t0")
    go_round "$c/ctl/a" 2; go_round "$c/ctl/b" 2
    if sa=$(check_sample_report "$c/ctl/a/report2.json") && sb=$(check_sample_report "$c/ctl/b/report2.json"); then
        record c3-runc-two-processes "both CUDA processes restored, identity agrees, data intact" "a: $sa; b: $sb; images: $(count_files "$c"/img/cuda-migrate-[0-9]*.img)" PASS "checkpoint ${td}s, restore ${tr}s; $(grep -o '^.*criu-cuda-migrate: checkpoint of [0-9]* CUDA process(es) took [0-9.]* s' "$c/img.work/dump.log" | grep -o 'checkpoint of .*' | tail -n1)"
    else
        record c3-runc-two-processes "both restored, identity agrees" "a: ${sa:-?}; b: ${sb:-?}" FAIL "checkpoint ${td}s, restore ${tr}s"
    fi
    runc_ delete -f $id >/dev/null 2>&1
    save "$c"
}

# A PyTorch process in the container (a tensor of 512 MiB on cuda:0, torch loaded before the dump): runc checkpoint
# and restore, then the tensor is checked and new GPU work runs.
case_pytorch() {
    local c=$WORK/cases/c6 id=ccm-c6 t0 td tr seen args
    rm -rf "$c"; mkdir -p "$c"
    args=$(printf '["%s","%s","--dir","/ctl","--mib","512","--device","cuda:0","--rounds","2"]' "$(command -v python3)" "$REPO/tests/gpu/torch_workload.py")
    make_bundle "$c/bundle" "$c/ctl" "$args"
    { start_container $id "$c/bundle" && wait_file "$c/ctl/ready" "$READY_TIMEOUT"; } || { record c6-runc-pytorch "restored, tensor intact" "not started: $(tail -n3 "$WORK/$id.stdio.log" | tr '\n' ' ')" FAIL -; return; }
    t0=$(now)
    checkpoint $id "$c/img" || { record c6-runc-pytorch "checkpoint passes" "$(grep -E 'Error' "$c/img.work/dump.log" | head -n2 | tr '\n' ' ' | cut -c1-200)" FAIL -; save "$c"; return; }
    td=$(elapsed "$t0")
    t0=$(now)
    restore_container $id "$c/bundle" "$c/img" || { record c6-runc-pytorch "restore passes" "$(grep -E 'Error' "$c/img.rwork/restore.log" | head -n2 | tr '\n' ' ' | cut -c1-200)" FAIL "checkpoint ${td}s"; save "$c"; return; }
    tr=$(elapsed "$t0")
    go_round "$c/ctl" 1
    if seen=$("${CHECK[@]}" torch "$c/ctl/report1.json" --uuid "$GPU_UUID"); then
        record c6-runc-pytorch "PyTorch in the container: restored, tensor intact, new GPU work runs, torch names this GPU" "$seen; images $(du -sm "$c/img" | cut -f1) MiB" PASS "checkpoint ${td}s, restore ${tr}s"
    else
        record c6-runc-pytorch "restored, tensor intact" "$seen" FAIL "checkpoint ${td}s, restore ${tr}s"
    fi
    runc_ delete -f $id >/dev/null 2>&1
    rm -rf "$c/img"
    save "$c"
}

# refused_then_restored NAME ID WHY: starts container ID (64 MiB), checkpoints it, and restores it with the refusing
# setup (REFUSE_ENV: an assignment for the runtime's environment; REFUSE_MINOR: the GPU minor the restore bundle
# gives), which the preflight must refuse with a line matching WHY before CRIU restores anything: images
# byte-identical, no process of the container left. Then the same images must restore with the normal bundle.
# Records one row NAME; USABLE_LINE (the plugin's `usable GPUs:` line of the good restore) is added when asked
# (SHOW_USABLE=1).
refused_then_restored() {
    local name=$1 id=$2 why=$3 c=$WORK/cases/$1 sum1 sum2 err procs seen usable="" extra=""
    rm -rf "$c"; mkdir -p "$c"
    make_bundle "$c/bundle" "$c/ctl" "$(sample_args /ctl 64)"
    { start_container "$id" "$c/bundle" && wait_file "$c/ctl/ready" "$READY_TIMEOUT"; } || { record "$name" "refused, then restored" "not started" FAIL -; return; }
    checkpoint "$id" "$c/img" || { record "$name" "checkpoint passes" "$(grep -E 'Error' "$c/img.work/dump.log" | head -n2 | tr '\n' ' ')" FAIL -; save "$c"; return; }
    sum1=$(images_sum "$c/img")
    if [[ -n ${LEGACY_NVD:-} ]]; then
        # What the container saw: the spec gave no GPU node, the hook made them.
        extra="; started with NVIDIA_VISIBLE_DEVICES=$LEGACY_NVD, spec linux.devices: [$(python3 -c 'import json,sys; print(" ".join(d["path"] for d in json.load(open(sys.argv[1]))["linux"].get("devices", [])))' "$c/bundle/config.json")], $(head -n1 "$c/ctl/legacy-hook.log" 2>/dev/null)"
    fi
    [[ -n ${REFUSE_MINOR:-} ]] && BUNDLE_GPU_MINOR=$REFUSE_MINOR make_bundle "$c/bundle" "$c/ctl" "$(sample_args /ctl 64)"
    [[ -n ${REFUSE_NVD:-} ]] && LEGACY_NVD=$REFUSE_NVD make_bundle "$c/bundle" "$c/ctl" "$(sample_args /ctl 64)"
    if restore_container "$id" "$c/bundle" "$c/img" ${REFUSE_ENV:+"$REFUSE_ENV"}; then
        record "$name" "refused by the preflight" "the restore passed" FAIL -
        runc_ delete -f "$id" >/dev/null 2>&1; save "$c"; return
    fi
    sum2=$(images_sum "$c/img")
    cp "$c/img.rwork/restore.log" "$c/refused-restore.log" 2>/dev/null
    err=$(grep -m1 -E "$why" "$c/refused-restore.log" | sed 's/.*criu-cuda-migrate: //' | cut -c1-160)
    [[ -n $err ]] || log "$name: the refused restore's errors: $(grep -m3 -E 'Error|criu-cuda-migrate: (usable|settings)' "$c/refused-restore.log" | tr '\n' ' ' | cut -c1-600)"
    procs=$(pgrep -f -- "--dir /ctl --mib 64" | wc -l)
    runc_ delete -f "$id" >/dev/null 2>&1
    rm -rf "$c/img.rwork"
    # Nothing was lost: the same images restore with the normal bundle and environment.
    LEGACY_NVD=${RETRY_NVD:-${LEGACY_NVD:-}} make_bundle "$c/bundle" "$c/ctl" "$(sample_args /ctl 64)"
    if restore_container "$id" "$c/bundle" "$c/img" && go_round "$c/ctl" 1 && seen=$(check_sample_report "$c/ctl/report1.json") &&
        [[ $sum1 == "$sum2" && -n $err && $procs == 0 ]]; then
        [[ ${SHOW_USABLE:-0} == 1 ]] && usable="; then usable GPUs: $(grep -m1 'usable GPUs: ' "$c/img.rwork/restore.log" | sed 's/.*usable GPUs: //' | cut -c1-200)"
        record "$name" "refused before CRIU restores anything; images byte-identical; no container left; a retry restores" "refused: $err; images $sum1 = $sum2; $procs processes left$usable; retry: $seen$extra" PASS -
    else
        record "$name" "refused cleanly, then restored" "err=${err:-none}; images $sum1 vs $sum2; $procs processes left; retry: ${seen:-failed}" FAIL -
    fi
    runc_ delete -f "$id" >/dev/null 2>&1
    save "$c"
}

# A device map naming a GPU this node does not have, in the runtime's environment (runc passes its
# environment on to CRIU).
case_refusal() {
    REFUSE_ENV="CRIU_CUDA_MIGRATE_DEVICE_MAP=$GPU_UUID=GPU-00000000-0000-0000-0000-00000000dead" \
        refused_then_restored c4-runc-refused-restore ccm-c4 'restore refused before anything was restored'
}

# The container-aware map: the restore bundle gives the container a GPU this node does not have
# (/dev/nvidia7), so the preflight refuses; with the node's own GPU in the bundle the same images restore,
# and the log says the usable set came from the bundle's spec.
case_container_given_gpus() {
    REFUSE_MINOR=7 SHOW_USABLE=1 refused_then_restored c5-runc-container-aware-map ccm-c5 'given no GPU of this node'
}

# The legacy NVIDIA hook instead of CDI (issue 25, item 3): no GPU node in the spec's linux.devices, only
# NVIDIA_VISIBLE_DEVICES in process.env, the nodes made by a createRuntime hook (tests/gpu/legacy_hook.py, what
# nvidia-container-runtime-hook does). Dumped with the GPU's UUID; a restore whose spec names a GPU this node does not
# have is refused by the preflight; the retry's spec names the GPU by its NVML index (0).
case_legacy_hook() {
    LEGACY_NVD=$GPU_UUID REFUSE_NVD=GPU-00000000-0000-0000-0000-00000000dead RETRY_NVD=0 SHOW_USABLE=1 \
        refused_then_restored c7-runc-legacy-hook ccm-c7 'NVIDIA_VISIBLE_DEVICES=.*no GPU of this node'
}

# ------------------------------------------------------------------------------------------------
# Cross-machine move: phase 1 (dump) and phase 2 (restore)

XFER_CTR=/var/tmp/ccm-xfer/ctr
XFER_BARE=/var/tmp/ccm-xfer/bare

# The host's python3 by its path (PyTorch may live in a venv under /opt, which the container binds).
late_args() { printf '["%s","%s","--dir","/ctl","--mib","16","--rounds","2","--nccl-round","2"]' "$(command -v python3)" "$LATE"; }

phase_dump() {
    local id=ccm-x1 t0 td tb pid bare_pid
    rm -rf /var/tmp/ccm-xfer; mkdir -p "$XFER_CTR" "$XFER_BARE/ctl"
    make_bundle "$XFER_CTR/bundle" "$XFER_CTR/ctl" "$(late_args)"
    { start_container $id "$XFER_CTR/bundle" && wait_file "$XFER_CTR/ctl/ready" "$READY_TIMEOUT"; } || { record x1-dump-container "dumped" "not started: $(tail -n3 "$WORK/$id.stdio.log" | tr '\n' ' ')" FAIL -; return; }
    go_round "$XFER_CTR/ctl" 1
    t0=$(now)
    checkpoint $id "$XFER_CTR/img" || { record x1-dump-container "dumped" "$(grep -E 'Error' "$XFER_CTR/img.work/dump.log" | head -n2 | tr '\n' ' ')" FAIL -; return; }
    td=$(elapsed "$t0")
    cp "$XFER_CTR/img.work/dump.log" "$XFER_CTR/dump.log"
    rm -rf "$XFER_CTR/bundle" "$XFER_CTR/img.work"
    record x1-dump-container "runc checkpoint on machine A" "GPU $GPU_UUID; images $(du -sm "$XFER_CTR/img" | cut -f1) MiB" PASS "checkpoint ${td}s; $(plugin_times "$XFER_CTR/dump.log")"

    # The bare process: a high pid that is free on the next machine.
    echo $((BARE_PID_BASE - 1)) >/proc/sys/kernel/ns_last_pid
    start_detached "$XFER_BARE/ctl" "$XFER_BARE/ctl/process.log" python3 "$LATE" --dir "$XFER_BARE/ctl" --mib 16 --rounds 2 --nccl-round 2
    bare_pid=$STARTED_PID
    wait_file "$XFER_BARE/ctl/ready" "$READY_TIMEOUT" "$bare_pid" || { record x2-dump-bare "dumped" "not ready" FAIL -; return; }
    go_round "$XFER_BARE/ctl" 1
    t0=$(now)
    mkdir -p "$XFER_BARE/img"
    criu dump -t "$bare_pid" -D "$XFER_BARE/img" --libdir "$PLUGIN_LIBDIR" -v4 -o dump.log || { record x2-dump-bare "dumped" "$(grep -E 'Error' "$XFER_BARE/img/dump.log" | head -n2 | tr '\n' ' ')" FAIL -; return; }
    tb=$(elapsed "$t0")
    wait_gone "$bare_pid" 30
    record x2-dump-bare "criu dump on machine A" "pid $bare_pid; images $(du -sm "$XFER_BARE/img" | cut -f1) MiB" PASS "dump ${tb}s; $(plugin_times "$XFER_BARE/img/dump.log")"
    echo "$GPU_UUID" >/var/tmp/ccm-xfer/dumped-on-gpu
    echo "$bare_pid" >/var/tmp/ccm-xfer/bare-pid
    t0=$(now)
    tar -C /var/tmp -cf - ccm-xfer | xz -3 -T2 | split -b 15M - "$RESULTS_DIR/xfer.tar.xz."
    log "archive: $(du -ch "$RESULTS_DIR"/xfer.tar.xz.* | tail -n1 | cut -f1) in $(elapsed "$t0") s"
    cp /var/tmp/ccm-xfer/dumped-on-gpu "$RESULTS_DIR/meta.txt"
}

phase_restore() {
    local xfer=$1 id=ccm-x1 a t0 tr seen gpu_a bare_pid
    [[ -n $(ls "$xfer"/xfer.tar.xz.* 2>/dev/null) ]] || { echo "no $xfer/xfer.tar.xz.*: run the dump phase first and carry its files" >&2; exit 2; }
    rm -rf /var/tmp/ccm-xfer
    cat "$xfer"/xfer.tar.xz.* | xz -d | tar -C /var/tmp -xf -
    gpu_a=$(cat /var/tmp/ccm-xfer/dumped-on-gpu)
    # A new bundle on this machine, naming this machine's GPU.
    make_bundle "$XFER_CTR/bundle" "$XFER_CTR/ctl" "$(late_args)"
    t0=$(now)
    if ! restore_container $id "$XFER_CTR/bundle" "$XFER_CTR/img"; then
        record x1-cross-machine-container "restored on B" "$(grep -E 'Error' "$XFER_CTR/img.rwork/restore.log" | head -n3 | tr '\n' ' ' | cut -c1-250)" FAIL "dumped on $gpu_a"
    else
        tr=$(elapsed "$t0")
        go_round "$XFER_CTR/ctl" 2
        seen=$(python3 "$REPO/tests/gpu/late_check.py" "$XFER_CTR/ctl/report2.json" "$GPU_UUID" "$gpu_a" "$GPU_BUS") && a=PASS || a=FAIL
        no_thread_warning "$XFER_CTR/img.rwork/restore.log" || a=FAIL
        record x1-cross-machine-container "every identity names B's GPU; NVML by bus finds it; data intact; NCCL after restore" "$seen" $a "restore ${tr}s; $(plugin_times "$XFER_CTR/img.rwork/restore.log")"
        cp "$XFER_CTR/img.rwork/restore.log" "$RESULTS_DIR/logs/x1-restore.log" 2>/dev/null
        cp "$XFER_CTR/dump.log" "$RESULTS_DIR/logs/x1-dump.log" 2>/dev/null
        cp "$XFER_CTR/ctl/report2.json" "$RESULTS_DIR/logs/x1-report2.json" 2>/dev/null
        runc_ delete -f $id >/dev/null 2>&1
    fi
    bare_pid=$(cat /var/tmp/ccm-xfer/bare-pid)
    t0=$(now)
    if ! (cd "$XFER_BARE/ctl" && close_inherited_fds && criu restore -d -D "$XFER_BARE/img" --libdir "$PLUGIN_LIBDIR" -v4 -o restore.log); then
        record x2-cross-machine-bare "restored on B" "$(grep -E 'Error' "$XFER_BARE/img/restore.log" | head -n3 | tr '\n' ' ' | cut -c1-250)" FAIL "dumped on $gpu_a"
    else
        tr=$(elapsed "$t0")
        track "$bare_pid"
        go_round "$XFER_BARE/ctl" 2
        seen=$(python3 "$REPO/tests/gpu/late_check.py" "$XFER_BARE/ctl/report2.json" "$GPU_UUID" "$gpu_a" "$GPU_BUS") && a=PASS || a=FAIL
        record x2-cross-machine-bare "every identity names B's GPU; data intact; NCCL after restore" "$seen" $a "restore ${tr}s; $(plugin_times "$XFER_BARE/img/restore.log")"
        cp "$XFER_BARE/img/restore.log" "$RESULTS_DIR/logs/x2-restore.log" 2>/dev/null
        cp "$XFER_BARE/img/dump.log" "$RESULTS_DIR/logs/x2-dump.log" 2>/dev/null
        cp "$XFER_BARE/ctl/report2.json" "$RESULTS_DIR/logs/x2-report2.json" 2>/dev/null
    fi
}

# ------------------------------------------------------------------------------------------------

main() {
    [[ $# -gt 0 ]] || set -- same
    setup
    while [[ $# -gt 0 ]]; do
        case $1 in
        same)
            case_checkpoint_restore
            case_leave_running
            case_two_processes
            case_refusal
            case_container_given_gpus
            case_pytorch
            case_legacy_hook
            ;;
        c1) case_checkpoint_restore ;;
        c2) case_leave_running ;;
        c3) case_two_processes ;;
        c4) case_refusal ;;
        c5) case_container_given_gpus ;;
        c6) case_pytorch ;;
        c7) case_legacy_hook ;;
        dump) phase_dump ;;
        restore)
            shift
            phase_restore "${1:?restore needs the folder holding the files of the dump phase}"
            ;;
        *) echo "unknown phase $1" >&2; exit 2 ;;
        esac
        shift
    done
    print_table | tee "$RESULTS_DIR/container-table.md"
    tar -C "$RESULTS_DIR" -czf "$RESULTS_DIR/container-logs.tar.gz" logs && rm -rf "$RESULTS_DIR/logs"
    ! grep -q $'\tFAIL\t' "$RESULTS"
}

# Sourced (tests/gpu/ipc-refuse.sh takes its runc setup and bundles): the functions only.
if [[ ${BASH_SOURCE[0]} == "$0" ]]; then
    main "$@"
fi
