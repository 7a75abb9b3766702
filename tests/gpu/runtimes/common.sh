# shellcheck shell=bash
# Part of tests/gpu/runtimes.sh, which sources it (with its settings: REPO, RTD, WORK, RESULTS, ...); not run by
# itself. The helpers every runtime uses: results and logs, the carried .debs and their wrappers, `stage`,
# the base setup (CRIU, runc, the plugin, the GPU, the network lock), and the parts a dump is handed out in.

# log, now, elapsed, record CASE EXPECTED SEEN RESULT TIMES, one_line, print_table, wait_file FILE SECONDS, ...
# shellcheck source=tests/lib/common.sh
source "$REPO/tests/lib/common.sh"

# page_files RESTORE_LOG [DUMP_LOG]: what the plugin's page file did (issue 47), short: the dump's staging write (when
# its log is there) and the restore's fill; `no page file` when the restore filled none (the staging pages were left
# to CRIU). A row that expects the page file checks for `fill`.
page_files() {
    local w="" f
    [[ -n ${2:-} ]] && w=$(grep -a -m1 -o 'staging write of [^,]*, [0-9]* MiB written' "$2" 2>/dev/null)
    f=$(grep -a -m1 -o 'staging fill of [0-9]* process(es): [0-9]* MiB from page files in [0-9.]* s' "$1" 2>/dev/null)
    if [[ -z $f ]]; then echo "no page file"; else echo "page file: ${w:+$w; }$f"; fi
}

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

# cdi SPEC-ARGS...: /etc/cdi/nvidia.json for this machine (tests/gpu/cdi-spec.sh).
cdi() {
    bash "$REPO/tests/gpu/cdi-spec.sh" "$@" >"$WORK/cdi.txt" 2>&1 || { cat "$WORK/cdi.txt" >&2; return 1; }
    cp /etc/cdi/nvidia.json "$WORK/cdi.txt" "$LOGS/" 2>/dev/null
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
