# shellcheck shell=bash
# Part of tests/gpu/runtimes.sh, which sources it (with its settings: REPO, RTD, WORK, RESULTS, ...); not run by
# itself. Podman with a CDI GPU: its setup and images, `podman-same`, `podman-dump`, `podman-restore`.

# ------------------------------------------------------------------------------------------------
# Podman setup and images
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
    # shellcheck disable=SC2153 # DRIVER is runtimes.sh's setting (the driver's directory), not this file's driver
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
    local c=$WORK/podman-same ctl name=ccm-rt-p1 t0 td tr seen nodes a1 sum1 sum2 err procs usable pages
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
        pages=$(page_files "$c/restore.log" "$a1.dump.log")
        if seen=$(check_sample_report "$ctl/report3.json") && [[ $pages == "page file: "* ]]; then
            record p3-podman-export-import "checkpoint --export --compress zstd, rm, restore --import (the retry after p4): identity agrees, data intact, the device memory through the plugin's page file in the archive; the usable set from the restored spec" "$seen; $pages; usable GPUs: ${usable:-(no line)}" PASS "checkpoint ${td}s, restore ${tr}s; $(plugin_times "$c/restore.log")"
        else
            record p3-podman-export-import "identity agrees after the restore, the page file filled" "$seen; $pages" FAIL "checkpoint ${td}s, restore ${tr}s"
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
# Podman across machines
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
        record px2-podman-restore "restore --import on machine B: every identity names B's GPU, data intact" "dumped on $gpu_a, now: $seen; $(page_files "$x/restore.log"); restored spec: $(spec_nodes "$name"); usable GPUs: $(usable_line "$x/restore.log"); $(majors_note "$x/meta.txt")" "$([[ $gpu_a != "$GPU_UUID" ]] && echo PASS || echo 'PASS (same GPU)')" "restore ${tr}s; $(plugin_times "$x/restore.log")"
    else
        record px2-podman-restore "identity names B's GPU" "$seen; $(majors_note "$x/meta.txt")" FAIL "restore ${tr}s"
    fi
    go_round "$x/ctl" 3
    save podman-restore "$x/restore.log" "$x/ctl"
    podman rm -f --time 0 "$name" >/dev/null 2>&1
}
