#!/usr/bin/env bash
# Issue 40 on the GPU machine, under real CRIU 4.1.1 with the plugin: jobs whose CUDA process has children forked
# after CUDA init (DataLoader workers, a multiprocessing Pool, a bare os.fork()) or spawned ones, each dumped
# mid-run and restored, and compared line by line with an uninterrupted reference run of the same program
# (tests/gpu/fork_jobs.py); `criu-cuda-migrate job` asked before each dump; an MPS client; what a forked worker
# holds; and the move of a fork case to another machine.
#
#   bash tests/gpu/fork-workers.sh [bare] [container] [mps] [probe] [probe-uvm]   (all five without arguments)
#   CCM_FORK_SHAPES="tr-uring tr-wayout tr-scale" bash tests/gpu/fork-workers.sh uring-probe bare   (issue 46)
#   bash tests/gpu/fork-workers.sh move-dump                            machine A
#   bash tests/gpu/fork-workers.sh move-restore DIR                     machine B; DIR holds move-dump's parts
#
#   bare          rows dl-fork-pin, dl-fork-8w (eight workers), dl-fork-nopin, dl-forkserver, dl-spawn, pool-fork, bare-fork, c-fork,
#                 c-uvm (managed memory: expected KNOWN, the job check and the dump both refuse): the
#                 reference runs (all at once, --sleep 0), then per shape: run with --pause-at, at `ready` the job
#                 check (exit code and verdict), `criu dump -t ROOT` of the tree (a session of its own: no
#                 --shell-job), `criu restore -d`, wait for `done`, compare every step line, the parameters' hash
#                 (and child_exit=7 for the bare forks) with the reference. PASS: job exit 0, dump and restore
#                 rc 0, identical. KNOWN: the job check said refused, the dump failed (they agree) and the job ran
#                 on to the reference's result (not moved). FAIL otherwise (a job check that disagrees with the
#                 dump, a failed restore, any difference).
#   container     dl-fork-pin inside a runc container given the GPU as CDI does (tests/gpu/container.sh's bundle,
#                 /opt bound, /opt/torch/.venv/bin/python3): runc checkpoint, runc restore, the same comparison
#   mps           a private MPS daemon (CUDA_MPS_PIPE_DIRECTORY / CUDA_MPS_LOG_DIRECTORY under $WORK, given to the
#                 daemon and the client only: CRIU, its plugin and the job check are no MPS clients); the mps
#                 shape as its client: the job check exits 1 naming MPS, the dump fails (rc 1) with the plugin's
#                 refusal naming MPS, the client stays RUNNING and advancing; the daemon is stopped at the end
#                 (always, by the EXIT trap)
#   uring-probe   which way of starting torchrun leaves its tree without an io_uring (CRIU cannot dump one): each
#                 variant (TR_VARIANTS) runs `torchrun --no-python sleep`; the agent's and the tree's io_uring
#                 descriptors and mappings, its threads, and the torch source lines that decide libuv, in
#                 $OUT/torchrun-uring-probe.txt; the first clean variant becomes the tr-* rows' way out
#   tr-*          torchrun shapes for `bare` (CCM_FORK_SHAPES): see launch() below
#   probe         dl-fork-pin with pin_memory on and off: what each worker holds (/dev/nvidia* mappings with their
#                 VmFlags, /dev/nvidia* fds with their fdinfo flags, every fd's kind) in
#                 $OUT/fork-probe-{pin,nopin}.txt
#   holdings-bench  dl-fork-8w's first worker: `ccm-bench holdings` (what its record at dump costs, both ways) in
#                 $OUT/holdings-bench.json
#   probe-uvm     c-fork's parent and c-uvm: their /dev/nvidia-uvm mappings (Size, Rss, Swap, VmFlags), their
#                 mappings by path and the job check, in $OUT/fork-probe-uvm.txt
#   move-dump     CCM_MOVE_SHAPE (default c-fork: libcuda through ctypes, a forked child; images ~600 MiB, a few MB compressed) started at a high
#                 pid (ns_last_pid), dumped at step 10; the images, its folder (logs it holds open, at the same
#                 path) and a reference run's log as one tar (`zstd -19 --long=31` with .device/bin/zstd, else
#                 `xz -3`) in 15 MB parts /var/tmp/ccm-fork-parts/fork-xfer.tar.{zst,xz}.NN, the first 7 also in
#                 $OUT, and $OUT/fork-xfer-meta.txt (dl-fork-pin: ~2.4 GiB of images; fetch the other parts with
#                 later calls of the same machine, e.g. `ls -d /var/tmp/ccm-fork-parts/* | sed -n 8,15p | xargs cp -t $OUT`)
#   move-restore  unpacks DIR's parts to the same path, prints both GPUs' UUIDs (they must differ), restores, waits
#                 for `done`, compares with a reference run on this machine and with machine A's, and checks that
#                 the job's last identity line names this machine's GPU
#
# Every row also keeps, in $OUT/fork-logs (tar.gz at the end): CRIU's dump and restore logs, the job check's
# output, what each process of the tree held before the dump (<row>-holds.txt), the plugin's lines about forked
# children and claims (<row>-claims.txt: 'claimed|forked|placeholder') and its `timing:` lines (<row>-timing.txt).
#
# Needs, carried in .device/ (tests/gpu/prepare.sh): criu-debs, runc-debs, pkg, bin/criu-cuda-migrate; python3
# with torch at /opt/torch/.venv/bin/python3. Writes $OUT/fork-workers-results.tsv and fork-workers-table.md.
# Exits 1 when a row FAILs, 2 when the machine is not set up. Knobs: CCM_FORK_STEPS (40), CCM_FORK_PAUSE (10),
# CCM_FORK_SHAPES (the bare rows, space-separated), CCM_TR_RANKS and CCM_TR_WORKERS (tr-scale's tree: 2 x 16),
# CCM_TR_SCALE_PACE (tr-scale's seconds per step: 2), CCM_FORK_PID_BASE (31000, move-dump), CCM_MOVE_SHAPE (c-fork),
# CCM_XFER_XZ_LEVEL (3), CCM_XFER_ZSTD_LEVEL (19), CCM_XFER_PART_MB (15), CCM_XFER_MAX_PARTS (7: more FAILs the row),
# CCM_XFER_OUT_PARTS (7: how many go to $OUT), CCM_WORK (/var/tmp/ccm-fork-workers).

set -uo pipefail
# No -e: a status-recording flow. A failed row is recorded as FAIL and the next one runs.

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
export CCM_WORK=${CCM_WORK:-/var/tmp/ccm-fork-workers}
# tests/gpu/container.sh: setup (CRIU 4.1.1 in /opt/criu, runc, the package's plugin and runc.conf), make_bundle,
# start_container, checkpoint, restore_container, container_pid, cleanup; and through it processes.sh
# (start_detached, track, wait_gone, cleanup_processes, criu_cmd) and tests/lib/common.sh (log, now, elapsed,
# record, print_table, one_line).
# shellcheck source=tests/gpu/container.sh
. "$REPO/tests/gpu/container.sh"
RESULTS=$RESULTS_DIR/fork-workers-results.tsv
LOGS=$RESULTS_DIR/fork-logs
JOBS=$REPO/tests/gpu/fork_jobs.py
CLI=$DEVICE_DIR/bin/criu-cuda-migrate
CTL=("$(command -v python3)" "$REPO/tests/gpu/ckpt_ctl.py")
TORCH_PY=/opt/torch/.venv/bin/python3
SYS_PY=$(command -v python3)
STEPS=${CCM_FORK_STEPS:-40}
PAUSE_AT=${CCM_FORK_PAUSE:-10}
PID_BASE=${CCM_FORK_PID_BASE:-31000}
# The shape the move carries to another machine (c-fork: small images; dl-fork-pin: the DataLoader training).
MOVE_SHAPE=${CCM_MOVE_SHAPE:-c-fork}
XFER=/var/tmp/ccm-fork-xfer
# Every part of the move's archive (move-dump); $OUT gets the first few.
XFER_PARTS=/var/tmp/ccm-fork-parts
REF=$WORK/ref
# Bounds (seconds): the reference runs together, a job to its `ready`, a job to its `done` after the restore.
REF_TIMEOUT=240
READY_S=120
DONE_S=150
read -r -a BARE_SHAPES <<<"${CCM_FORK_SHAPES:-dl-fork-pin dl-fork-8w dl-fork-nopin dl-forkserver dl-spawn pool-fork bare-fork c-fork c-uvm}"
RESULT_RE='^(step=[0-9]+ loss=|done params_sha256=|child_exit=)'
FAILED=0
MPS_PIPE=""
MPS_ENV=()

# ---------------------------------------------------------------------------------------------------------------
# Helpers (state, plugin_line, descendants and job_check as tests/gpu/ipc-refuse.sh has them).

# verdict CASE EXPECTED SEEN RESULT TIMES: a row; FAIL marks the run failed.
# state PID: the driver's CUDA state of PID (host pid), or GONE.
state() {
    alive "$1" || { echo GONE; return; }
    timeout 30 "${CTL[@]}" state "$1" 2>&1 | tail -n 1 | tr '[:lower:]' '[:upper:]'
}

# plugin_line LOG REGEX: the first plugin line of LOG matching REGEX, without CRIU's prefix.
plugin_line() { grep -E -m1 -- "criu-cuda-migrate: .*($2)" "$1" 2>/dev/null | sed 's/^.*criu-cuda-migrate: //' | cut -c1-300; }

# job_check ROOT ROW: criu-cuda-migrate job; sets JOB_RC, JOB_LINE (its verdict line), JOB_HEAD (its count line).
job_check() {
    job_report "$1" "$LOGS/$2-job.txt"
    JOB_HEAD=$(grep -m1 '^job of pid' <<<"$JOB_OUT" | sed 's/^job of pid [0-9]*: //')
    log "$2: job --pid $1: rc=$JOB_RC; $JOB_HEAD; $JOB_LINE"
}

# wait_line FILE ERE SECONDS [PID]: 0 once FILE has a line matching ERE; 1 after SECONDS; 2 as soon as PID is gone
# without it.
wait_line() {
    local deadline=$((SECONDS + $3)) pid=${4:-}
    until grep -qE -- "$2" "$1" 2>/dev/null; do
        ((SECONDS >= deadline)) && return 1
        if [[ -n $pid ]] && ! alive "$pid"; then
            sleep 0.5
            grep -qE -- "$2" "$1" 2>/dev/null && return 0
            return 2
        fi
        sleep 0.1
    done
}

# first_errors LOG: CRIU's first two Error lines of LOG, without their prefix, on one line.
first_errors() { grep -m2 'Error' "$1" 2>/dev/null | sed 's/^.*Error ([^)]*): //' | one_line 200; }

# keep_logs ROW KIND=FILE...: each FILE among the row's logs as ROW-KIND.log (one that is missing is skipped).
keep_logs() {
    local row=$1 kv
    shift
    for kv in "$@"; do cp "${kv#*=}" "$LOGS/$row-${kv%%=*}.log" 2>/dev/null; done
}

result_lines() { grep -E -- "$RESULT_RE" "$1" 2>/dev/null; }

# compare REF RUN: 0 when RUN's step, child_exit and done lines equal REF's; CMP says what was seen.
compare() {
    local nref nrun first
    nref=$(result_lines "$1" | wc -l)
    nrun=$(result_lines "$2" | wc -l)
    if ! grep -q '^done params_sha256=' "$1" 2>/dev/null; then
        CMP="no reference result ($(tail -n 1 "$1" 2>/dev/null | cut -c1-120))"
        return 1
    fi
    if ! grep -q '^done params_sha256=' "$2" 2>/dev/null; then
        CMP="no done line ($(grep -c '^step=' "$2" 2>/dev/null) steps; last: $(tail -n 1 "$2" 2>/dev/null | cut -c1-160))"
        return 1
    fi
    first=$(diff <(result_lines "$1") <(result_lines "$2") | grep -m1 '^[<>]' | cut -c1-160)
    if [[ -z $first ]]; then
        CMP="identical: $nrun lines ($(grep -c '^step=' "$2") steps$(grep -m1 '^child_exit=' "$2" | sed 's/^/, /')), $(grep -o 'params_sha256=[0-9a-f]\{16\}' "$2")"
        return 0
    fi
    CMP="differs: $nrun vs reference $nref lines; first: $first"
    return 1
}

# fd_flags OCTAL: open flags in words.
fd_flags() {
    local f=$((8#$1)) w
    case $((f & 3)) in 0) w=O_RDONLY ;; 1) w=O_WRONLY ;; *) w=O_RDWR ;; esac
    ((f & 8#2000000)) && w+="|O_CLOEXEC"
    ((f & 8#100000)) && w+="|O_LARGEFILE"
    ((f & 8#4000)) && w+="|O_NONBLOCK"
    ((f & 8#2000)) && w+="|O_APPEND"
    echo "$w"
}

# holds PID: what PID holds of the GPU: its /dev/nvidia* mappings with their VmFlags (smaps), its /dev/nvidia* fds
# with their fdinfo flags, and a count of its fds by kind.
holds() {
    local p=$1 f t fl
    [[ -e /proc/$p ]] || return
    echo "## pid $p ppid $(awk '/^PPid:/ {print $2}' "/proc/$p/status") comm $(cat "/proc/$p/comm"): $(tr '\0' ' ' <"/proc/$p/cmdline" | cut -c1-200)"
    echo "### mappings of /dev/nvidia* (address perms offset dev inode path  VmFlags)"
    awk '/^[0-9a-f]+-[0-9a-f]+ / { hdr = ($6 ~ /^\/dev\/nvidia/) ? $0 : ""; next }
         /^VmFlags:/ && hdr != "" { print hdr "  " $0; hdr = "" }' "/proc/$p/smaps" 2>/dev/null
    echo "### fds on /dev/nvidia*"
    for f in /proc/"$p"/fd/*; do
        t=$(readlink "$f" 2>/dev/null) || continue
        [[ $t == /dev/nvidia* ]] || continue
        fl=$(awk '/^flags:/ {print $2}' "/proc/$p/fdinfo/${f##*/}" 2>/dev/null)
        echo "fd ${f##*/} -> $t flags=$fl $(fd_flags "${fl:-0}")"
    done
    echo "### every fd, by kind"
    for f in /proc/"$p"/fd/*; do readlink "$f" 2>/dev/null; done | sed 's/:\[[0-9]*\]$//' | sort | uniq -c
    echo
}

# tree_snapshot ROOT: every process of ROOT's tree as the kernel shows it now: pid, ppid, state, threads, comm, and
# each thread's children list (what CRIU and `job` walk); for the row whose job and CRIU saw fewer processes than
# this walk (issue 46's tr-scale, run 3).
tree_snapshot() {
    local p t
    for p in $(descendants "$1"); do
        echo "pid $p ppid $(awk '{ print $4 }' "/proc/$p/stat" 2>/dev/null) state $(awk '{ print $3 }' "/proc/$p/stat" 2>/dev/null) threads $(find "/proc/$p/task" -mindepth 1 -maxdepth 1 2>/dev/null | wc -l) comm $(cat "/proc/$p/comm" 2>/dev/null) tgid-status $(awk '/^(Tgid|NSpid):/ { printf "%s ", $0 }' "/proc/$p/status" 2>/dev/null)"
        for t in /proc/"$p"/task/*; do
            [[ -s $t/children ]] && echo "  task ${t##*/} children: $(cat "$t/children")"
        done
    done
}

holds_tree() { # ROOT: holds of every process of ROOT's tree
    local p
    echo "# /proc/devices: $(grep -i nvidia /proc/devices | tr '\n' ' ')"
    for p in $(descendants "$1"); do holds "$p"; done
}

# summary_holds FILE: per non-root process, its /dev/nvidia* mappings and fds, short.
summary_holds() {
    awk '/^## pid / { if (pid != "") out = out sprintf("%s: %d maps %d fds; ", pid, m, f); pid = $3; m = 0; f = 0; next }
         /^[0-9a-f]+-[0-9a-f]+ .*\/dev\/nvidia/ { m++ } /^fd [0-9]+ -> \/dev\/nvidia/ { f++ }
         END { if (pid != "") out = out sprintf("%s: %d maps %d fds", pid, m, f); print out }' "$1" | cut -c1-300
}

# plugin_notes ROW LOG...: the plugin's claim lines and timing lines of the LOGs, to the row's files; sets NOTES
# (count and first claim line) and PTIMES (per log: sum of the timing lines, and the largest).
plugin_notes() {
    local l claims=$LOGS/$1-claims.txt timing=$LOGS/$1-timing.txt
    shift
    : >"$claims"
    : >"$timing"
    PTIMES=""
    for l in "$@"; do
        [[ -f $l ]] || continue
        # All lines, not only those with the plugin's prefix: a multi-line message continues without it.
        grep -iE 'claimed|forked|placeholder' "$l" | sed "s|^|${l##*/}: |" >>"$claims"
        grep 'timing:' "$l" | sed "s|^|${l##*/}: |" >>"$timing"
        # Per hook: how many calls and their sum.
        PTIMES+="${l##*/}: $(grep -o 'timing: .* [0-9.]* s in the plugin' "$l" | awk '
            { h = $2; sub(/\(.*/, "", h); for (i = NF; i > 2; i--) if ($i == "s" && $(i + 1) == "in") { v = $(i - 1); break }
              if (!(h in sum)) order[++k] = h; sum[h] += v; cnt[h]++ }
            END { if (!k) printf "no timing lines"; for (j = 1; j <= k; j++) printf "%s%s %dx %.4f s", (j > 1 ? ", " : ""), order[j], cnt[order[j]], sum[order[j]] }'); "
    done
    NOTES="$(wc -l <"$claims") claim/fork lines$(head -n 1 "$claims" | sed 's/^[^:]*: /, first: /; s/criu-cuda-migrate: //' | cut -c1-200)"
}

py_for() { # SHAPE: the interpreter
    if [[ $1 == c-* ]]; then echo "$SYS_PY"; else echo "$TORCH_PY"; fi
}

# The torchrun shapes (issue 46): a whole torchrun tree (the elastic agent, its ranks, their DataLoader workers
# forked after CUDA init, pinned memory) running fork_jobs.py tr-dl; ROOT is the agent.
#   tr-uring   `torchrun --standalone`, one rank over NCCL, 2 workers: the agent's rendezvous store holds an io_uring
#              (expected KNOWN: the job check says it would fail, the plugin refuses the dump before any lock naming
#              the agent, the job runs on to the reference's result)
#   tr-wayout  the same job started the way the probe (uring-probe) found without an io_uring ($WORK/wayout; the
#              node's io_uring switched off when no torchrun setting does it): dumped, restored right after the
#              dump, identical to the reference
#   tr-scale   tr-wayout with CCM_TR_RANKS ranks (gloo, all on the one GPU) of CCM_TR_WORKERS workers each
TR_SYSCTL=0
TR_PRE=()
IO_URING_WAS=0
TR_RANKS=${CCM_TR_RANKS:-2}
TR_WORKERS=${CCM_TR_WORKERS:-16}
TR_PORT_BASE=${CCM_TR_PORT_BASE:-29610}
# The ways to start torchrun that the probe tries, in order of preference (NAME|ENV|ARGS; PORT is a free port):
# settings of torchrun first, the node's switch last.
TR_VARIANTS=(
    "standalone||--standalone"
    "standalone-uv0|UV_USE_IO_URING=0|--standalone"
    "c10d-libuv-0||--standalone --rdzv-conf use_libuv=0"
    "c10d-libuv-false||--standalone --rdzv-conf use_libuv=False"
    "static||--rdzv-backend static --master-addr 127.0.0.1 --master-port PORT"
    "static-uselibuv0|USE_LIBUV=0|--rdzv-backend static --master-addr 127.0.0.1 --master-port PORT"
    "c10d-uselibuv0|USE_LIBUV=0 TORCH_USE_LIBUV=0|--standalone --rdzv-conf use_libuv=0"
    "no-io-uring|WRAP|--standalone"
    "node-io-uring-off|SYSCTL|--standalone"
)

# tr_variant NAME: sets TR_ENV (array) and TR_ARGS (array) for that way of starting torchrun; TR_SYSCTL=1 when it is
# the node's switch.
tr_variant() {
    local v e a port=$((TR_PORT_BASE + RANDOM % 200))
    TR_ENV=() TR_ARGS=() TR_SYSCTL=0 TR_PRE=()
    for v in "${TR_VARIANTS[@]}"; do
        [[ ${v%%|*} == "$1" ]] || continue
        e=${v#*|}
        a=${e#*|}
        e=${e%%|*}
        if [[ $e == SYSCTL ]]; then TR_SYSCTL=1; e=""; fi
        # The product's way out: `criu-cuda-migrate no-io-uring --` before the launcher.
        if [[ $e == WRAP ]]; then TR_PRE=("$CLI" no-io-uring --); e=""; fi
        [[ -n $e ]] && read -r -a TR_ENV <<<"$e"
        read -r -a TR_ARGS <<<"${a//PORT/$port}"
        return 0
    done
    return 1
}

io_uring_off() { sysctl -qw kernel.io_uring_disabled=2; }
io_uring_on() { sysctl -qw kernel.io_uring_disabled="${IO_URING_WAS:-0}"; }

# launch DIR STDOUT SHAPE LOG STEPS SLEEP PAUSE [ENV-ASSIGNMENT...]: the job SHAPE, detached (STARTED_PID: its root).
launch() {
    local dir=$1 out=$2 shape=$3 logf=$4 steps=$5 sleep_s=$6 pause=$7 nproc=1 workers=2 variant
    shift 7
    if [[ $shape != tr-* ]]; then
        start_detached "$dir" "$out" env "$@" "$(py_for "$shape")" "$JOBS" "$shape" --steps "$steps" --log "$logf" --sleep "$sleep_s" --pause-at "$pause"
        return
    fi
    variant=standalone
    [[ $shape != tr-uring ]] && variant=$(cat "$WORK/wayout" 2>/dev/null || echo node-io-uring-off)
    local epoch=8
    # Many workers per rank: an epoch longer than the run, so that no epoch ends (and no worker is replaced) while
    # the job check and the dump look at the tree (run 3 of GPU-TESTING's torchrun table).
    [[ $shape == tr-scale ]] && nproc=$TR_RANKS workers=$TR_WORKERS epoch=$((STEPS + 8))
    tr_variant "$variant" || variant=standalone
    tr_variant "$variant"
    # The node's switch only for the run that needs it (the tr-uring row needs io_uring on).
    if ((TR_SYSCTL)); then io_uring_off; else io_uring_on; fi
    start_detached "$dir" "$out" env "$@" "${TR_ENV[@]}" OMP_NUM_THREADS=1 "${TR_PRE[@]}" "$TORCH_PY" -m torch.distributed.run \
        --nnodes 1 --nproc-per-node "$nproc" "${TR_ARGS[@]}" "$JOBS" tr-dl --workers "$workers" --epoch-batches "$epoch" --steps "$steps" \
        --logfile "$logf" --sleep "$sleep_s" --pause-at "$pause"
    log "$shape: torchrun ($variant: ${TR_ENV[*]} ${TR_ARGS[*]}), $nproc rank(s) x $workers workers: agent $STARTED_PID"
}

# criu_flags SHAPE: what a dump and a restore of SHAPE add (a torchrun tree holds established loopback TCP
# connections: the ranks' to the agent's store, NCCL's bootstrap).
criu_flags() {
    if [[ $1 == tr-* ]]; then echo "--tcp-established --network-lock nftables"; fi
}

# pace SHAPE: seconds between the job's steps. tr-scale's tree is large enough that reading its holdings, the job
# check and the dump outlast the 30 steps after `ready` at 0.2 s (run 4 of GPU-TESTING's torchrun table: the ranks
# had ended, and the row dumped the agent alone), so its steps are slower (CCM_TR_SCALE_PACE).
pace() {
    if [[ $1 == tr-scale ]]; then echo "${CCM_TR_SCALE_PACE:-2}"; else echo 0.2; fi
}

# tree_whole SHAPE SNAPSHOT: nothing when SNAPSHOT (tree_snapshot's lines) holds every live process a torchrun SHAPE
# has while it trains (the agent, its ranks and their workers), else why not; nothing for other shapes.
tree_whole() {
    local shape=$1 want live ranks=1 workers=2
    [[ $shape == tr-* ]] || return 0
    [[ $shape == tr-scale ]] && ranks=$TR_RANKS workers=$TR_WORKERS
    want=$((1 + ranks * (1 + workers)))
    live=$(awk '$1 == "pid" && $6 != "Z" { n++ } END { print n + 0 }' "$2")
    ((live >= want)) || echo "the tree had $live live process(es) at the dump, not the $want it trains with (1 agent, $ranks rank(s) of $workers worker(s)): the job had ended or was ending, so the row proves nothing"
}

# uring-probe: which way of starting torchrun leaves the tree without an io_uring (the agent's rendezvous store);
# the first torchrun setting that does is the way out (else the node's switch), written to $WORK/wayout.
case_uring_probe() {
    local out=$RESULTS_DIR/torchrun-uring-probe.txt v name d agent rings maps threads tree_rings chosen="" site
    IO_URING_WAS=$(sysctl -n kernel.io_uring_disabled 2>/dev/null || echo 0)
    site=$("$TORCH_PY" -c 'import torch, os; print(os.path.dirname(torch.__file__))')
    {
        echo "# torch $("$TORCH_PY" -c 'import torch; print(torch.__version__)'); kernel.io_uring_disabled=$IO_URING_WAS"
        echo "# where torch's launcher decides libuv:"
        grep -rn "use_libuv\|USE_LIBUV" "$site/distributed/run.py" "$site/distributed/launcher" \
            "$site/distributed/elastic/rendezvous" "$site/distributed/elastic/utils/distributed.py" \
            "$site/distributed/rendezvous.py" 2>/dev/null | sed "s|$site/||" | cut -c1-220 | head -40
        echo "# variant | agent io_uring fds | agent io_uring maps | tree io_uring fds | agent threads (names)"
    } >"$out"
    for v in "${TR_VARIANTS[@]}"; do
        name=${v%%|*}
        # CCM_TR_PROBE: only these variants (space-separated names), for a short run.
        [[ -n ${CCM_TR_PROBE:-} && " $CCM_TR_PROBE " != *" $name "* ]] && continue
        d=$WORK/probe-$name
        rm -rf "$d"
        mkdir -p "$d"
        tr_variant "$name"
        ((TR_SYSCTL)) && io_uring_off
        start_detached "$d" "$d/stdout.log" env "${TR_ENV[@]}" "${TR_PRE[@]}" "$TORCH_PY" -m torch.distributed.run --nnodes 1 \
            --nproc-per-node 1 "${TR_ARGS[@]}" --no-python sleep 60
        agent=$STARTED_PID
        local deadline=$((SECONDS + 40))
        until pgrep -P "$agent" -x sleep >/dev/null 2>&1 || ((SECONDS >= deadline)) || ! alive "$agent"; do sleep 0.2; done
        sleep 1
        rings=$(find "/proc/$agent/fd" -lname 'anon_inode:\[io_uring\]' 2>/dev/null | wc -l)
        maps=$(grep -c 'anon_inode:\[io_uring\]' "/proc/$agent/maps" 2>/dev/null)
        tree_rings=0
        local p
        for p in $(descendants "$agent"); do
            tree_rings=$((tree_rings + $(find "/proc/$p/fd" -lname 'anon_inode:\[io_uring\]' 2>/dev/null | wc -l)))
        done
        threads=$(cat /proc/"$agent"/task/*/comm 2>/dev/null | sort | uniq -c | awk '{printf "%s%s*%s", (NR>1?",":""), $2, $1}')
        local started=no
        pgrep -P "$agent" -x sleep >/dev/null 2>&1 && started=yes
        echo "$name | ${rings:-?} | ${maps:-?} | $tree_rings | rank started: $started | $threads" >>"$out"
        log "uring-probe $name: agent io_uring fds ${rings:-?}, maps ${maps:-?}; rank started: $started"
        if [[ -z $chosen && $started == yes && ${rings:-1} -eq 0 && ${maps:-1} -eq 0 && $tree_rings -eq 0 ]]; then
            chosen=$name
        fi
        tail -n 5 "$d/stdout.log" | sed "s/^/  $name: /" >>"$out"
        cleanup_processes
        io_uring_on
    done
    echo "${chosen:-node-io-uring-off}" >"$WORK/wayout"
    echo "# way out: ${chosen:-none found; node-io-uring-off assumed}" >>"$out"
    verdict uring-probe "a way to start torchrun without an io_uring in its tree" "way out: ${chosen:-none}; $(grep -c '|' "$out") lines in torchrun-uring-probe.txt" \
        "$([[ -n $chosen ]] && echo PASS || echo FAIL)"
}

# ---------------------------------------------------------------------------------------------------------------
# Reference runs: all shapes at once (the result does not depend on the pace or on the GPU's other work).

start_refs() { # SHAPE...
    local s
    mkdir -p "$REF"
    REF_ROOTS=()
    for s in "$@"; do
        rm -f "$REF/$s.log" "$REF/$s.log.release"
        launch "$REF" "$REF/$s.stdout.log" "$s" "$REF/$s.log" "$STEPS" 0 0
        REF_ROOTS+=("$s:$STARTED_PID")
    done
    log "reference runs started: ${REF_ROOTS[*]}"
}

wait_refs() {
    local e s pid deadline=$((SECONDS + REF_TIMEOUT))
    for e in "${REF_ROOTS[@]}"; do
        s=${e%%:*} pid=${e##*:}
        wait_line "$REF/$s.log" '^done ' $((deadline - SECONDS > 1 ? deadline - SECONDS : 1)) "$pid"
        log "reference $s: $(grep -c '^step=' "$REF/$s.log" 2>/dev/null) steps, $(grep -m1 -o '^done params_sha256=[0-9a-f]\{16\}\|^error.*' "$REF/$s.log" 2>/dev/null | cut -c1-200)"
    done
    cleanup_processes
}

# ---------------------------------------------------------------------------------------------------------------
# Bare rows: criu dump / criu restore of the job's tree.

EXPECT_ROW="job exits 0 (ready); criu dump rc 0; criu restore rc 0; every step line, the parameters' hash (and child_exit=7) equal the reference run's"

# row_result ROW JOB-RC DUMP-RC RESTORE-RC SAME: PASS, KNOWN or FAIL (see the header).
row_result() {
    if [[ $2 -eq 0 && $3 -eq 0 && $4 -eq 0 && $5 -eq 0 ]]; then
        echo PASS
    elif [[ $2 -ne 0 && $3 -ne 0 && $5 -eq 0 ]]; then
        echo KNOWN
    else
        echo FAIL
    fi
}

case_bare() {
    local shape=$1 name=$1 d=$WORK/run-$1 root rc=1 rrc=- td=- tr=- img_mb tree_pids p same=1 res extra="" whole
    log "$name: start"
    rm -rf "$d"
    mkdir -p "$d/img"
    launch "$d" "$d/stdout.log" "$shape" "$d/run.log" "$STEPS" "$(pace "$shape")" "$PAUSE_AT"
    root=$STARTED_PID
    if ! wait_line "$d/run.log" "^ready step=$PAUSE_AT\$" "$READY_S" "$root"; then
        verdict "$name" "$EXPECT_ROW" "job not ready: $(tail -n 3 "$d/stdout.log" "$d/run.log" 2>/dev/null | one_line 300)" FAIL
        cp "$d/stdout.log" "$LOGS/$name-stdout.log" 2>/dev/null
        cleanup_processes
        return
    fi
    holds_tree "$root" >"$LOGS/$name-holds.txt"
    tree_snapshot "$root" >"$LOGS/$name-tree-before-job.txt"
    job_check "$root" "$name"
    echo "$JOB_OUT" >"$LOGS/$name-job.txt"
    tree_snapshot "$root" >"$LOGS/$name-tree-before-dump.txt"
    tree_pids=$(descendants "$root")
    log "$name: dumping tree $(echo "$tree_pids" | tr '\n' ' ')"
    whole=$(tree_whole "$shape" "$LOGS/$name-tree-before-dump.txt")
    local t0
    t0=$(now)
    # shellcheck disable=SC2046 # criu_flags gives words
    criu_cmd -- dump -t "$root" -D "$d/img" --libdir "$PLUGIN_LIBDIR" -v4 -o dump.log --link-remap $(criu_flags "$shape") && rc=0 || rc=$?
    td=$(elapsed "$t0")
    img_mb=$(du -sm "$d/img" | cut -f1)
    log "$name: dump rc=$rc in ${td}s, images $img_mb MiB"
    [[ -f $d/img/cuda-migrate-devices.img ]] && extra+="; claims $(stat -c %s "$d/img/cuda-migrate-devices.img") bytes for $(grep -c '^{"holder"' "$d/img/cuda-migrate-devices.img") processes"
    if [[ $rc -eq 0 ]]; then
        # Every process of the tree gone (and the root reaped) before its pids are taken again: the restore
        # starts right after (the plugin waits for pids still held as a group or session and says so).
        for p in $tree_pids; do wait_gone "$p" 30; done
        t0=$(now)
        # shellcheck disable=SC2046
        (close_inherited_fds && criu_cmd -- restore -d -D "$d/img" --libdir "$PLUGIN_LIBDIR" -v4 -o restore.log $(criu_flags "$shape")) && rrc=0 || rrc=$?
        extra+="$(grep -m2 -o 'pid [0-9]* of the checkpoint .*' "$d/img/restore.log" | one_line 200 | sed 's/^./; pid wait: &/')"
        tr=$(elapsed "$t0")
        track "$root"
        log "$name: restore rc=$rrc in ${tr}s"
    else
        extra="; dump error: $(first_errors "$d/img/dump.log")"
    fi
    wait_line "$d/run.log" '^done ' "$DONE_S" "$root"
    io_uring_on
    compare "$REF/$shape.log" "$d/run.log" && same=0
    if [[ $shape == *-fork && $shape != pool-fork ]] && ! grep -qx 'child_exit=7' "$d/run.log"; then
        same=1
        CMP+="; child_exit: $(grep -m1 '^child_exit=' "$d/run.log" || echo none)"
    fi
    [[ $rrc != - && $rrc -ne 0 ]] && extra+="; restore error: $(first_errors "$d/img/restore.log")"
    plugin_notes "$name" "$d/img/dump.log" "$d/img/restore.log"
    res=$(row_result "$name" "$JOB_RC" "$rc" "${rrc/-/1}" "$same")
    # A job that ended before the dump proves nothing, whatever it printed.
    [[ -n $whole ]] && res=FAIL extra+="; $whole"
    verdict "$name" "$EXPECT_ROW" \
        "job rc=$JOB_RC ($JOB_HEAD; ${JOB_LINE#verdict: }); dump rc=$rc; restore rc=$rrc; $CMP$extra; plugin: $NOTES; tree: $(summary_holds "$LOGS/$name-holds.txt")" \
        "$res" "dump ${td}s, restore ${tr}s, images $img_mb MiB; plugin $PTIMES"
    keep_logs "$name" dump="$d/img/dump.log" restore="$d/img/restore.log" run="$d/run.log" stdout="$d/stdout.log"
    rm -rf "$d/img"
    cleanup_processes
}

# ---------------------------------------------------------------------------------------------------------------
# The container row: dl-fork-pin in a runc container given the GPU as CDI does.

case_container() {
    local name=dl-fork-pin-runc c=$WORK/cases/fork-runc id=ccm-fork-runc root rc=1 rrc=- td=- tr=- img_mb same=1 res extra="" args py=$TORCH_PY t0
    log "$name: start"
    rm -rf "$c" "$WORK/$id.stdio.log"
    mkdir -p "$c"
    args=$(python3 -c 'import json, sys; print(json.dumps(sys.argv[1:]))' "$py" "$JOBS" dl-fork-pin --steps "$STEPS" --log /ctl/run.log --pause-at "$PAUSE_AT")
    make_bundle "$c/bundle" "$c/ctl" "$args"
    if ! start_container "$id" "$c/bundle"; then
        verdict "$name" "container started" "runc run failed: $(tail -n 3 "$WORK/$id.stdio.log" | one_line)" FAIL
        return
    fi
    root=$(container_pid "$id")
    if ! wait_line "$c/ctl/run.log" "^ready step=$PAUSE_AT\$" "$READY_S" "$root"; then
        verdict "$name" "job ready in the container" "$(tail -n 3 "$WORK/$id.stdio.log" "$c/ctl/run.log" 2>/dev/null | one_line 300)" FAIL
        runc_ delete -f "$id" >/dev/null 2>&1
        return
    fi
    holds_tree "$root" >"$LOGS/$name-holds.txt"
    job_check "$root" "$name"
    t0=$(now)
    checkpoint "$id" "$c/img" && rc=0 || rc=$?
    td=$(elapsed "$t0")
    img_mb=$(du -sm "$c/img" | cut -f1)
    log "$name: runc checkpoint rc=$rc in ${td}s, images $img_mb MiB"
    if [[ $rc -eq 0 ]]; then
        t0=$(now)
        restore_container "$id" "$c/bundle" "$c/img" && rrc=0 || rrc=$?
        tr=$(elapsed "$t0")
        log "$name: runc restore rc=$rrc in ${tr}s"
        [[ $rrc -ne 0 ]] && extra+="; restore error: $(first_errors "$c/img.rwork/restore.log")"
    else
        extra="; checkpoint error: $(first_errors "$c/img.work/dump.log")"
    fi
    wait_line "$c/ctl/run.log" '^done ' "$DONE_S"
    compare "$REF/dl-fork-pin.log" "$c/ctl/run.log" && same=0
    plugin_notes "$name" "$c/img.work/dump.log" "$c/img.rwork/restore.log"
    res=$(row_result "$name" "$JOB_RC" "$rc" "${rrc/-/1}" "$same")
    verdict "$name" "in a runc container with the GPU as CDI gives it: job exits 0; runc checkpoint and runc restore pass; identical to the reference" \
        "job rc=$JOB_RC ($JOB_HEAD; ${JOB_LINE#verdict: }); checkpoint rc=$rc; restore rc=$rrc; $CMP$extra; plugin: $NOTES; tree: $(summary_holds "$LOGS/$name-holds.txt")" \
        "$res" "checkpoint ${td}s, restore ${tr}s, images $img_mb MiB; plugin $PTIMES"
    keep_logs "$name" dump="$c/img.work/dump.log" restore="$c/img.rwork/restore.log" run="$c/ctl/run.log" stdio="$WORK/$id.stdio.log"
    runc_ delete -f "$id" >/dev/null 2>&1
    rm -rf "$c/img" "$c/img.work" "$c/img.rwork"
}

# ---------------------------------------------------------------------------------------------------------------
# MPS: a private daemon, the mps shape as its client.

# mps_stop: tells the private daemon (when one was started) to quit.
mps_stop() {
    [[ -n $MPS_PIPE ]] || return 0
    echo quit | env "${MPS_ENV[@]}" timeout 20 nvidia-cuda-mps-control >/dev/null 2>&1
    log "MPS daemon of $MPS_PIPE told to quit"
    MPS_PIPE=""
}

case_mps() {
    local name=mps-client d=$WORK/run-mps root rc=1 td ok=0 st before after seen servers line
    log "$name: start"
    rm -rf "$d"
    mkdir -p "$d/img" "$d/mps-pipe" "$d/mps-pipe.log"
    MPS_PIPE=$d/mps-pipe
    # Given to the daemon and its client only: CRIU, the plugin's driver agent, the job check and ckpt_ctl.py are
    # no MPS clients.
    MPS_ENV=("CUDA_MPS_PIPE_DIRECTORY=$MPS_PIPE" "CUDA_MPS_LOG_DIRECTORY=$MPS_PIPE.log")
    if ! env "${MPS_ENV[@]}" nvidia-cuda-mps-control -d; then
        MPS_PIPE=""
        verdict "$name" "MPS daemon started" "nvidia-cuda-mps-control -d failed" FAIL
        return
    fi
    start_detached "$d" "$d/stdout.log" env "${MPS_ENV[@]}" "$TORCH_PY" "$JOBS" mps --steps 100000 --log "$d/run.log" --pause-at 5
    root=$STARTED_PID
    if ! wait_line "$d/run.log" '^ready step=5$' "$READY_S" "$root"; then
        verdict "$name" "MPS client ready" "$(tail -n 3 "$d/stdout.log" "$d/run.log" "$d"/mps-pipe.log/*.log 2>/dev/null | one_line 300)" FAIL
        cleanup_processes
        mps_stop
        return
    fi
    servers=$(echo get_server_list | env "${MPS_ENV[@]}" timeout 10 nvidia-cuda-mps-control 2>&1 | one_line 60)
    holds_tree "$root" >"$LOGS/$name-holds.txt"
    job_check "$root" "$name"
    local t0
    t0=$(now)
    criu_cmd -- dump -t "$root" -D "$d/img" --libdir "$PLUGIN_LIBDIR" -v4 -o dump.log && rc=0 || rc=$?
    td=$(elapsed "$t0")
    line=$(plugin_line "$d/img/dump.log" 'MPS')
    st=$(state "$root")
    before=$(grep -c '^step=' "$d/run.log")
    sleep 2
    after=$(grep -c '^step=' "$d/run.log")
    [[ $JOB_RC -eq 1 && $JOB_LINE == *MPS* ]] || ok=1
    [[ $rc -eq 1 && -n $line ]] || ok=1
    [[ $st == RUNNING && $after -gt $before ]] || ok=1
    ! grep -q '^error' "$d/run.log" || ok=1
    seen="job rc=$JOB_RC (${JOB_LINE#verdict: }); dump rc=$rc; plugin: ${line:-no line naming MPS ($(grep -m1 'Error' "$d/img/dump.log" | one_line 150))}; client $root $st, steps $before -> $after in 2 s; MPS servers: ${servers:-none}"
    plugin_notes "$name" "$d/img/dump.log"
    verdict "$name" "job exits 1 naming MPS; criu dump rc 1, the plugin's refusal names MPS; the client RUNNING and advancing" \
        "$seen" "$([[ $ok -eq 0 ]] && echo PASS || echo FAIL)" "dump ${td}s; plugin $PTIMES"
    keep_logs "$name" dump="$d/img/dump.log" stdout="$d/stdout.log"
    cp -r "$d/mps-pipe.log" "$LOGS/$name-mps-logs" 2>/dev/null
    cleanup_processes
    mps_stop
}

# ---------------------------------------------------------------------------------------------------------------
# Probe: what a DataLoader worker forked after CUDA init holds, pin_memory on and off (both at once).

case_probe() {
    local v d roots=() i=0 out n
    log "probe: start"
    for v in pin nopin; do
        d=$WORK/probe-$v
        rm -rf "$d"
        mkdir -p "$d"
        start_detached "$d" "$d/stdout.log" "$TORCH_PY" "$JOBS" "dl-fork-$v" --steps 100000 --log "$d/run.log" --pause-at 3
        roots+=("$STARTED_PID")
    done
    for v in pin nopin; do
        d=$WORK/probe-$v
        out=$RESULTS_DIR/fork-probe-$v.txt
        if ! wait_line "$d/run.log" '^ready step=3$' "$READY_S" "${roots[$i]}"; then
            verdict "probe-dl-fork-$v" "the workers' GPU fds and mappings written down" "job not ready: $(tail -n 2 "$d/stdout.log" | one_line)" FAIL
            i=$((i + 1))
            continue
        fi
        {
            echo "# dl-fork-$v (pin_memory $([[ $v == pin ]] && echo on || echo off)): a DataLoader with 2 persistent workers forked after CUDA init"
            echo "# $(date -u +%FT%TZ), driver $(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -n1), kernel $(uname -r)"
            holds_tree "${roots[$i]}"
        } >"$out"
        n=$(descendants "${roots[$i]}" | wc -l)
        verdict "probe-dl-fork-$v" "the workers' /dev/nvidia* mappings (VmFlags) and fds (flags) written down (fork-probe-$v.txt)" \
            "$n processes: $(summary_holds "$out"); worker VmFlags: $(grep -m3 -o '/dev/nvidia[a-z0-9-]*  VmFlags:.*' "$out" | one_line 200)" PASS -
        i=$((i + 1))
    done
    cleanup_processes
}

# uvm_maps PID: every /dev/nvidia-uvm mapping of PID with its size, resident and swapped kB and VmFlags.
uvm_maps() {
    awk '/^[0-9a-f]+-[0-9a-f]+ / { hdr = ($6 ~ /^\/dev\/nvidia-uvm/) ? $1 " " $2 " " $3 : ""; next }
         hdr != "" && /^(Size|Rss|Swap):/ { hdr = hdr " " $1 $2 }
         hdr != "" && /^VmFlags:/ { print hdr "  " $0; hdr = "" }' "/proc/$1/smaps" 2>/dev/null
}

# The probe of managed memory: what a process with cuMemAllocManaged memory maps of /dev/nvidia-uvm, next to a
# process without (c-fork's parent), for the job check's UVM rule.
case_probe_uvm() {
    local d s out=$RESULTS_DIR/fork-probe-uvm.txt root i=0 extra
    log "probe-uvm: start"
    : >"$out"
    # c-fork's parent (no managed memory), c-uvm (64 MiB), c-uvm with 4 KiB, 1 MiB and 2 MiB more.
    for s in c-fork c-uvm c-uvm; do
        i=$((i + 1))
        extra=()
        [[ $i -eq 3 ]] && extra=(--extra-managed "4096,1048576,2097152")
        d=$WORK/probe-$i-$s
        rm -rf "$d"
        mkdir -p "$d"
        start_detached "$d" "$d/stdout.log" "$SYS_PY" "$JOBS" "$s" --steps 100000 --log "$d/run.log" --pause-at 3 "${extra[@]}"
        root=$STARTED_PID
        if ! wait_line "$d/run.log" '^ready step=3$' "$READY_S" "$root"; then
            verdict "probe-$s${extra[*]:+ ${extra[*]}}" "the /dev/nvidia-uvm mappings written down" "job not ready: $(tail -n 2 "$d/stdout.log" "$d/run.log" 2>/dev/null | one_line)" FAIL
            continue
        fi
        {
            echo "# $s${extra[*]:+ ${extra[*]}}, pid $root: /dev/nvidia-uvm mappings (range perms offset Size Rss Swap VmFlags)"
            uvm_maps "$root"
            echo "# $s: every mapping's path, by count"
            awk '{ print $6 }' "/proc/$root/maps" | sort | uniq -c | sort -rn | head -n 5
            echo "# $s: job --pid $root"
            timeout 60 "$CLI" job --pid "$root" 2>&1
            echo
        } >>"$out"
        verdict "probe-$s${extra[*]:+ ${extra[*]}}" "the /dev/nvidia-uvm mappings written down (fork-probe-uvm.txt)" \
            "$(uvm_maps "$root" | wc -l) uvm mappings: $(uvm_maps "$root" | awk '{ print $1, $4 }' | one_line 300); job: $(timeout 60 "$CLI" job --pid "$root" 2>&1 | grep -m1 '^verdict' | cut -c1-200)" PASS -
        kill -9 "$root" 2>/dev/null
    done
    cleanup_processes
}

# What a worker's record costs: dl-fork-8w at `ready`, `ccm-bench holdings` on its first worker (the product's
# one `stat` per mapped file against one per mapping, alternating rounds) into $OUT/holdings-bench.json.
case_holdings_bench() {
    local d=$WORK/holdings-bench root worker out=$RESULTS_DIR/holdings-bench.json
    log "holdings-bench: start"
    rm -rf "$d"
    mkdir -p "$d"
    start_detached "$d" "$d/stdout.log" "$TORCH_PY" "$JOBS" dl-fork-8w --steps 100000 --log "$d/run.log" --pause-at 3
    root=$STARTED_PID
    if ! wait_line "$d/run.log" '^ready step=3$' "$READY_S" "$root"; then
        verdict holdings-bench "a worker's holdings timed" "job not ready: $(tail -n 2 "$d/stdout.log" | one_line)" FAIL
        cleanup_processes
        return
    fi
    worker=$(descendants "$root" | sed -n 2p)
    "$DEVICE_DIR/bin/ccm-bench" holdings --pid "$worker" --rounds 20 >"$out" 2>&1
    verdict holdings-bench "a worker's holdings timed, both ways (holdings-bench.json)" "$(python3 -c '
import json, statistics, sys
r = json.load(open(sys.argv[1]))
med = lambda k: statistics.median(x[k] for x in r["rounds"])
print("worker %d: %d mappings (%d of files, %d files), %d NVIDIA mappings, %d NVIDIA descriptors; median of %d rounds: maps read %.3f ms, holdings %.3f ms (descriptors alone %.3f ms), a stat per mapping %.3f ms" % (
    r["pid"], r["mappings"], r["file_mappings"], r["mapped_files"], r["nvidia_mappings"], r["nvidia_descriptors"], len(r["rounds"]),
    med("maps_ms"), med("holdings_ms"), med("descriptors_ms"), med("stat_per_mapping_ms")))' "$out" 2>&1 | one_line 400)" PASS -
    cleanup_processes
}

# ---------------------------------------------------------------------------------------------------------------
# The move to another machine: c-fork (small images).

phase_move_dump() {
    local name=move-dump root rc=1 td img_mb tree_pids p t0 parts whole
    log "$name: start"
    rm -rf "$XFER"
    mkdir -p "$XFER/run" "$XFER/img" "$XFER/ref"
    REF=$XFER/ref
    start_refs "$MOVE_SHAPE"
    wait_refs
    echo $((PID_BASE - 1)) >/proc/sys/kernel/ns_last_pid
    # TMPDIR inside the carried folder: Python's multiprocessing binds its workers' listener sockets in
    # $TMPDIR/pymp-*, and CRIU binds them again at the same path at restore, so that folder must travel with the
    # images (a container's /tmp travels in its root file system; a bare process's files are the mover's to carry).
    mkdir -p "$XFER/run/tmp"
    launch "$XFER/run" "$XFER/run/stdout.log" "$MOVE_SHAPE" "$XFER/run/run.log" "$STEPS" 0.2 "$PAUSE_AT" "TMPDIR=$XFER/run/tmp"
    root=$STARTED_PID
    if ! wait_line "$XFER/run/run.log" "^ready step=$PAUSE_AT\$" "$READY_S" "$root"; then
        verdict "$name" "dumped" "job not ready: $(tail -n 3 "$XFER/run/stdout.log" "$XFER/run/run.log" 2>/dev/null | one_line 300)" FAIL
        cleanup_processes
        return
    fi
    holds_tree "$root" >"$LOGS/$name-holds.txt"
    tree_snapshot "$root" >"$LOGS/$name-tree-before-job.txt"
    job_check "$root" "$name"
    echo "$JOB_OUT" >"$LOGS/$name-job.txt"
    tree_snapshot "$root" >"$LOGS/$name-tree-before-dump.txt"
    tree_pids=$(descendants "$root")
    whole=$(tree_whole "$MOVE_SHAPE" "$LOGS/$name-tree-before-dump.txt")
    t0=$(now)
    # shellcheck disable=SC2046
    criu_cmd -- dump -t "$root" -D "$XFER/img" --libdir "$PLUGIN_LIBDIR" -v4 -o dump.log --link-remap $(criu_flags "$MOVE_SHAPE") && rc=0 || rc=$?
    td=$(elapsed "$t0")
    for p in $tree_pids; do wait_gone "$p" 30; done
    img_mb=$(du -sm "$XFER/img" | cut -f1)
    plugin_notes "$name" "$XFER/img/dump.log"
    cp "$XFER/img/dump.log" "$LOGS/$name-dump.log" 2>/dev/null
    if [[ $rc -ne 0 ]]; then
        verdict "$name" "job exits 0; criu dump rc 0 on machine A" \
            "job rc=$JOB_RC (${JOB_LINE#verdict: }); dump rc=$rc: $(first_errors "$XFER/img/dump.log")" FAIL "dump ${td}s"
        cleanup_processes
        return
    fi
    {
        echo "gpu_uuid: $GPU_UUID"
        echo "gpu_bus: $GPU_BUS"
        echo "host: $(hostname)"
        echo "root_pid: $root"
        echo "shape: $MOVE_SHAPE"
        echo "tree_pids: $(echo "$tree_pids" | tr '\n' ' ')"
        echo "revision: $(sed -n 's/^revision: //p' "$DEVICE_DIR/MANIFEST" 2>/dev/null)"
    } >"$XFER/meta.txt"
    t0=$(now)
    parts=$(xfer_pack)
    cp "$XFER/meta.txt" "$RESULTS_DIR/fork-xfer-meta.txt"
    log "$name: archive $(du -ch "$XFER_PARTS"/fork-xfer.tar.* | tail -n1 | cut -f1) in $parts parts ($(xfer_codec)), $(elapsed "$t0") s"
    verdict "$name" "job exits 0; criu dump rc 0 on machine A; at most ${CCM_XFER_MAX_PARTS:-7} parts" \
        "GPU $GPU_UUID; pid $root; job rc=$JOB_RC (${JOB_LINE#verdict: }); dump rc=$rc; images $img_mb MiB; $parts parts ($(xfer_codec), $(elapsed "$t0") s); plugin: $NOTES; tree: $(summary_holds "$LOGS/$name-holds.txt")${whole:+; $whole}" \
        "$([[ $JOB_RC -eq 0 && $parts -le ${CCM_XFER_MAX_PARTS:-7} && -z $whole ]] && echo PASS || echo FAIL)" "dump ${td}s; plugin $PTIMES"
}

# The codec of the move's archive: the carried zstd when it runs here (its long-distance matching over a 2 GiB
# window finds the pages forked workers share with their parent, megabytes apart in the images), else xz.
xfer_codec() {
    if "$DEVICE_DIR/bin/zstd" --version >/dev/null 2>&1; then echo zstd; else echo xz; fi
}

# xfer_pack: $XFER as one compressed tar in CCM_XFER_PART_MB parts in $XFER_PARTS (the first CCM_XFER_OUT_PARTS
# of them are also in $OUT: the device tool returns a few files per call; the rest are fetched by later calls of
# the same warm machine). Prints the number of parts.
xfer_pack() {
    local codec
    codec=$(xfer_codec)
    rm -rf "$XFER_PARTS"
    mkdir -p "$XFER_PARTS"
    rm -f "$RESULTS_DIR"/fork-xfer.tar.*
    if [[ $codec == zstd ]]; then
        tar -C "${XFER%/*}" -cf - "${XFER##*/}" | "$DEVICE_DIR/bin/zstd" -q "-${CCM_XFER_ZSTD_LEVEL:-19}" --long=31 -T0 |
            split -b "${CCM_XFER_PART_MB:-15}M" -d - "$XFER_PARTS/fork-xfer.tar.zst."
    else
        tar -C "${XFER%/*}" -cf - "${XFER##*/}" | xz "-${CCM_XFER_XZ_LEVEL:-3}" -T0 |
            split -b "${CCM_XFER_PART_MB:-15}M" -d - "$XFER_PARTS/fork-xfer.tar.xz."
    fi
    find "$XFER_PARTS" -maxdepth 1 -name 'fork-xfer.tar.*' | sort | head -n "${CCM_XFER_OUT_PARTS:-7}" | xargs -r cp -t "$RESULTS_DIR"
    count_files "$XFER_PARTS"/fork-xfer.tar.*
}

# xfer_unpack DIR: DIR's parts (either codec) unpacked to $XFER.
xfer_unpack() {
    if compgen -G "$1/fork-xfer.tar.zst.*" >/dev/null; then
        cat "$1"/fork-xfer.tar.zst.* | "$DEVICE_DIR/bin/zstd" -q -d --long=31 | tar -C "${XFER%/*}" -xf -
    else
        cat "$1"/fork-xfer.tar.xz.* | xz -d | tar -C "${XFER%/*}" -xf -
    fi
}

phase_move_restore() {
    local dir=$1 name=move-restore gpu_a root rrc=1 tr t0 same=1 ok=0 ident cmp_a
    log "$name: start"
    compgen -G "$dir/fork-xfer.tar.*" >/dev/null || { echo "no $dir/fork-xfer.tar.*: run move-dump first and carry its parts" >&2; exit 2; }
    rm -rf "$XFER"
    xfer_unpack "$dir" || { echo "$dir's parts do not unpack: are they all there?" >&2; exit 2; }
    gpu_a=$(sed -n 's/^gpu_uuid: //p' "$XFER/meta.txt")
    root=$(sed -n 's/^root_pid: //p' "$XFER/meta.txt")
    MOVE_SHAPE=$(sed -n 's/^shape: //p' "$XFER/meta.txt")
    MOVE_SHAPE=${MOVE_SHAPE:-c-fork}
    log "$name: dumped on GPU $gpu_a ($(sed -n 's/^host: //p' "$XFER/meta.txt")); this machine's GPU $GPU_UUID ($(hostname))"
    echo "dumped on: $gpu_a; restoring on: $GPU_UUID"
    REF=$WORK/ref-b
    rm -rf "$REF"
    start_refs "$MOVE_SHAPE"
    wait_refs
    t0=$(now)
    # shellcheck disable=SC2046
    (close_inherited_fds && criu_cmd -- restore -d -D "$XFER/img" --libdir "$PLUGIN_LIBDIR" -v4 -o restore.log $(criu_flags "$MOVE_SHAPE")) && rrc=0 || rrc=$?
    tr=$(elapsed "$t0")
    track "$root"
    log "$name: restore rc=$rrc in ${tr}s"
    wait_line "$XFER/run/run.log" '^done ' "$DONE_S" "$root"
    compare "$REF/$MOVE_SHAPE.log" "$XFER/run/run.log" && same=0
    local cmp_b=$CMP
    compare "$XFER/ref/$MOVE_SHAPE.log" "$XFER/run/run.log" || same=1
    cmp_a=$CMP
    if [[ $MOVE_SHAPE == c-fork ]] && ! grep -qx 'child_exit=7' "$XFER/run/run.log"; then same=1; fi
    ident=$(grep -m1 '^identity ' "$XFER/run/run.log")
    [[ $rrc -eq 0 && $same -eq 0 ]] || ok=1
    [[ -n $gpu_a && $gpu_a != "$GPU_UUID" ]] || ok=1
    [[ $ident == *"uuid=$GPU_UUID "* ]] || ok=1
    plugin_notes "$name" "$XFER/img/restore.log"
    keep_logs "$name" restore="$XFER/img/restore.log" dump="$XFER/img/dump.log" run="$XFER/run/run.log"
    verdict "$name" "restored on another GPU (UUIDs differ); identical to the reference runs of both machines; child_exit=7; libcuda names this GPU" \
        "GPU $gpu_a -> $GPU_UUID; restore rc=$rrc$([[ $rrc -ne 0 ]] && first_errors "$XFER/img/restore.log" | sed 's/^/: /'); vs this machine's reference: $cmp_b; vs machine A's: $cmp_a; $ident; plugin: $NOTES" \
        "$([[ $ok -eq 0 ]] && echo PASS || echo FAIL)" "restore ${tr}s; plugin $PTIMES"
    cleanup_processes
}

# ---------------------------------------------------------------------------------------------------------------

fork_exit() {
    mps_stop
    cleanup
}

main_fork() {
    [[ $# -gt 0 ]] || set -- bare container mps probe probe-uvm
    [[ -d $DEVICE_DIR ]] || { echo "no $DEVICE_DIR: run tests/gpu/prepare.sh and carry .device" >&2; exit 2; }
    nvidia-smi -L >/dev/null 2>&1 || { echo "no GPU (nvidia-smi -L failed)" >&2; exit 2; }
    [[ -x $TORCH_PY ]] || TORCH_PY=$(command -v python3)
    trap fork_exit EXIT
    setup
    mkdir -p "$LOGS"
    : >"$RESULTS"
    [[ -x $CLI ]] || CLI=$(command -v criu-cuda-migrate)
    "$CLI" --version >"$LOGS/cli-version.txt" 2>&1
    log "GPU: $(nvidia-smi --query-gpu=driver_version,name,uuid --format=csv,noheader | head -n1); torch python: $TORCH_PY; CLI: $CLI; steps $STEPS, dump at $PAUSE_AT"
    local phase s refs=()
    IO_URING_WAS=$(sysctl -n kernel.io_uring_disabled 2>/dev/null || echo 0)
    # The probe first: the torchrun rows' references start the way it found.
    [[ " $* " == *" uring-probe "* ]] && case_uring_probe
    for phase in "$@"; do
        case $phase in
        bare) refs+=("${BARE_SHAPES[@]}") ;;
        container) [[ " ${refs[*]} " == *" dl-fork-pin "* ]] || refs+=(dl-fork-pin) ;;
        esac
    done
    if [[ ${#refs[@]} -gt 0 ]]; then
        rm -rf "$REF"
        start_refs "${refs[@]}"
        wait_refs
    fi
    while [[ $# -gt 0 ]]; do
        case $1 in
        bare) for s in "${BARE_SHAPES[@]}"; do case_bare "$s"; done ;;
        container) case_container ;;
        mps) case_mps ;;
        probe) case_probe ;;
        probe-uvm) case_probe_uvm ;;
        uring-probe) ;;
        holdings-bench) case_holdings_bench ;;
        move-dump) phase_move_dump ;;
        move-restore)
            shift
            phase_move_restore "$(realpath -m "${1:?move-restore needs the folder holding the parts of move-dump}")"
            ;;
        *) echo "unknown phase $1" >&2; exit 2 ;;
        esac
        shift
    done
    print_table | tee "$RESULTS_DIR/fork-workers-table.md"
    tar -C "$RESULTS_DIR" -czf "$RESULTS_DIR/fork-workers-logs.tar.gz" "${LOGS##*/}" && rm -rf "$LOGS"
    log "done: $RESULTS_DIR/fork-workers-table.md, fork-workers-results.tsv, fork-workers-logs.tar.gz"
    return "$FAILED"
}

main_fork "$@"
