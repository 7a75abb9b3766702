#!/usr/bin/env bash
# Issue 41 part 6 on the GPU machine: CRIU's zdtm suite with the plugin loaded on the REAL driver, and without it.
# The same tests as CI (tests/zdtm/tests.txt, the trixie ones, CRIU 4.1.1), the tree built in CI's zdtm root
# (tests/criu-root.sh prepare-zdtm): zdtm.py with `--criu-bin` naming the carried CRIU 4.1.1; with the plugin in the
# tree's test/plugins (zdtm starts every criu with CRIU_LIBS_DIR there) the plugin's driver agent loads the machine's
# libcuda, asks about every process and leaves each to CRIU.
#
#   bash tests/gpu/zdtm.sh bundle     HERE: the tree (built tests, pycriu's generated modules) and pure-Python PyYAML
#                                     and protobuf from the zdtm root into .device/zdtm/ (carried with .device)
#   bash tests/gpu/zdtm.sh run        ON THE GPU MACHINE: both passes, per flavor, zdtm's own --parallel
#
# Writes $OUT/zdtm-gpu-results.tsv (test, flavor, without, with), $OUT/zdtm-gpu-table.md, the plugin's evidence
# (zdtm-gpu-plugin.txt) and zdtm's output of both passes (zdtm-gpu-logs.tar.gz). Exits 1 when a test's outcome
# differs between the passes or the plugin pass shows no driver agent.
set -uo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
LIST=$REPO/tests/zdtm/tests.txt
BUNDLE=$REPO/.device/zdtm
WORK_BUNDLE=${TMPDIR:-/tmp}/ccm-zdtm-bundle

# The tests of the list for SUITE, "TEST FLAVORS AREA" per line (tests/zdtm/run.sh's format).
list_tests() {
    awk -v suite="$2" '
        /^## / { area = $2; next }
        { sub(/#.*/, "") }
        NF < 2 { next }
        { suites = (NF >= 3 ? $3 : "trixie,forky") }
        index("," suites ",", "," suite ",") { print $1, $2, area }
    ' "$1"
}

# outcome LOG TEST FLAVOR: FAIL when zdtm's summary lists it, PASS when the summary says all or some passed and it is
# not listed, NONE when zdtm did not get to a summary (it could not start).
outcome() {
    # The flavor in zdtm's list is "unknown" when the test's zdtm_ct exited with a code of its own (it could not
    # set the namespace up); each log is one flavor's.
    if grep -qE "^ +\* $2\(" "$1"; then
        echo FAIL
    elif grep -qE 'TEST\(S\) (PASSED|FAILED)' "$1"; then
        echo PASS
    else
        echo NONE
    fi
}

bundle() {
    local root
    root=$(CCM_CRIU_SUITE=trixie bash "$REPO/tests/criu-root.sh" zdtm-path 2>/dev/null) || root=/var/cache/criu-cuda-migrate/trixie-zdtm
    [[ -d $root/opt/criu/test ]] || { echo "no zdtm root at $root: run tests/criu-root.sh prepare-zdtm" >&2; exit 2; }
    rm -rf "$BUNDLE"
    mkdir -p "$BUNDLE"
    tar -C "$root/opt" --exclude='*.o' --exclude='*.d' --exclude=Documentation -cJf "$BUNDLE/criu-tree.tar.xz" criu
    tar -C "$root/usr/lib/python3/dist-packages" --exclude='*.so' -cJf "$BUNDLE/python.tar.xz" yaml google
    # iproute2's ip with the libraries it needs beyond glibc (all of them ask glibc 2.38 at most): zdtm_ct runs
    # `ip link set up dev lo` in every test's new network namespace, and the GPU machine has no ip.
    local tools=$WORK_BUNDLE/tools l
    rm -rf "$tools"
    mkdir -p "$tools/bin" "$tools/lib"
    cp "$root/usr/bin/ip" "$tools/bin/"
    for l in $(chroot "$root" ldd /usr/bin/ip | awk '$3 ~ /^\// && $1 !~ /^(libc|ld-linux)/ { print $3 }'); do
        cp -L "$root$l" "$tools/lib/"
    done
    tar -C "$tools" -cJf "$BUNDLE/tools.tar.xz" bin lib
    rm -rf "$tools"
    du -sh "$BUNDLE"/*
}

# install_ip: iproute2's ip at /usr/sbin/ip when the machine has none (zdtm_ct runs `ip link set up dev lo` in each
# test's network namespace; the ns flavors copy /sbin/ip or /bin/ip with the libraries ldd names into the test's
# root, at the same paths, so it must be a real binary whose libraries sit in the default search path: the ones this
# machine lacks go to /usr/lib/x86_64-linux-gnu, where nothing of its own uses them).
install_ip() {
    command -v ip >/dev/null && return 0
    local tools=$WORK/tools l added=()
    rm -rf "$tools"
    mkdir -p "$tools"
    tar -C "$tools" -xJf "$BUNDLE/tools.tar.xz"
    for l in "$tools"/lib/*; do
        ldconfig -p | grep -q "^[[:space:]]*${l##*/} " && continue
        install -m 0644 "$l" /usr/lib/x86_64-linux-gnu/
        added+=("${l##*/}")
    done
    ldconfig
    install -m 0755 "$tools/bin/ip" /usr/sbin/ip
    ip link show lo >/dev/null || { echo "ip does not run here: zdtm_ct needs it" >&2; return 1; }
    log "ip: installed /usr/sbin/ip ($(ip -V)); libraries added to /usr/lib/x86_64-linux-gnu: ${added[*]}"
}

run() {
    export CCM_WORK=${CCM_WORK:-/var/tmp/ccm-zdtm-gpu}
    # shellcheck source=tests/gpu/container.sh
    . "$REPO/tests/gpu/container.sh"
    RESULTS=$RESULTS_DIR/zdtm-gpu-results.tsv
    setup
    local names=() z=$WORK/zdtm py=$WORK/zdtm-py logs=$RESULTS_DIR/zdtm-gpu-logs pass flavor t fl area failed=0 n
    rm -rf "$z" "$py" "$logs"
    mkdir -p "$z" "$py" "$logs"
    tar -C "$z" -xJf "$BUNDLE/criu-tree.tar.xz"
    # zdtm.py and pycriu on the system's python3 (zdtm_ct runs zdtm.py by its `env python3` line, so PATH decides),
    # not the torch venv's: pycriu 4.1.1 reads FieldDescriptor.label, which the venv's protobuf 7 no longer has.
    # Its own PyYAML and protobuf where it has them (google is a namespace package: a carried protobuf beside a
    # machine's own upb module breaks both), else the carried pure-Python ones (Debian trixie's).
    export PATH=$WORK/bin:/usr/bin:/bin:$PATH NCCL_NVLS_ENABLE=0
    local m
    for m in yaml google; do
        if ! python3 -c "import ${m/google/google.protobuf}" 2>/dev/null; then
            tar -C "$py" -xJf "$BUNDLE/python.tar.xz" "$m"
            export PYTHONPATH=$py PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION=python
        fi
    done
    log "python3 for zdtm: yaml $(python3 -c 'import yaml; print(yaml.__version__, yaml.__file__)' 2>&1 | tail -n1), protobuf $(python3 -c 'import google.protobuf as p; print(p.__version__, p.__file__)' 2>&1 | tail -n1)"
    install_ip || return 2
    # CRIU locks a test's network namespace with iptables-restore, which the GPU machine lacks: zdtm's criu is a
    # wrapper that asks for CRIU's nftables lock instead (libnftables, among the carried CRIU debs), in both passes.
    local criu_bin=$WORK/bin/criu
    if ! command -v iptables-restore >/dev/null; then
        criu_bin=$WORK/bin/criu-zdtm
        printf '#!/bin/sh\nexec %s "$@" --network-lock nftables\n' "$WORK/bin/criu" >"$criu_bin"
        chmod +x "$criu_bin"
    fi
    list_tests "$LIST" trixie >"$WORK/tests.txt"
    for pass in without with; do
        # zdtm's own plugins/ (its Makefile: zdtm runs `make -C plugins clean`) keeps everything but ours.
        # The package's plugin (setup unpacked it), as a user's CRIU loads it.
        rm -f "$z/criu/test/plugins/criu_cuda_migrate.so"
        if [[ $pass == with ]]; then
            cp "$PLUGIN_LIBDIR/criu_cuda_migrate.so" "$z/criu/test/plugins/" || { echo "no plugin in $PLUGIN_LIBDIR" >&2; return 2; }
        fi
        for flavor in h ns uns; do
            awk -v f="$flavor" 'index("," $2 ",", "," f ",") { print $1 }' "$WORK/tests.txt" >"$WORK/$flavor.list"
            [[ -s $WORK/$flavor.list ]] || continue
            # -t per test: zdtm.py 4.1.1's -F closes its file before reading it. --ignore-taint: the GPU machine's
            # kernel is tainted by the NVIDIA module (4096, out of tree), which zdtm otherwise refuses to start on.
            mapfile -t names <"$WORK/$flavor.list"
            (cd "$z/criu/test" && timeout 900 python3 ./zdtm.py run "${names[@]/#/-t}" -f "$flavor" --parallel 4 \
                --ignore-taint --keep-going --keep-img always --criu-bin "$criu_bin") >"$logs/$pass-$flavor.log" 2>&1
            log "zdtm $pass $flavor: $(grep -E 'TEST\(S\) (PASSED|FAILED)' "$logs/$pass-$flavor.log" | tail -n1)"
        done
        # The plugin's evidence in CRIU's logs (zdtm keeps every test's images and logs under dump/).
        grep -rh 'criu-cuda-migrate: ' "$z/criu/test/dump" 2>/dev/null | sed 's/^([^)]*) //' | sort | uniq -c | sort -rn | head -n 40 >"$RESULTS_DIR/zdtm-gpu-plugin-$pass.txt"
        mv "$z/criu/test/dump" "$logs/dump-$pass" 2>/dev/null
    done
    : >"$RESULTS"
    while read -r t fl area; do
        for flavor in ${fl//,/ }; do
            local w p
            w=$(outcome "$logs/without-$flavor.log" "$t" "$flavor")
            p=$(outcome "$logs/with-$flavor.log" "$t" "$flavor")
            [[ $w != "$p" ]] && failed=1
            printf '%s\t%s\t%s\t%s\t%s\n' "$t" "$area" "$flavor" "$w" "$p" >>"$RESULTS"
        done
    done <"$WORK/tests.txt"
    n=$(grep -c 'driver agent pid' "$RESULTS_DIR/zdtm-gpu-plugin-with.txt" 2>/dev/null)
    [[ ${n:-0} -gt 0 ]] || { echo "the plugin pass shows no driver agent" >&2; failed=1; }
    grep -q $'\tNONE' "$RESULTS" && { echo "zdtm did not run every flavor: see zdtm-gpu-logs.tar.gz" >&2; failed=1; }
    {
        echo "| test | area | flavor | without the plugin | with the plugin |"
        echo "|---|---|---|---|---|"
        awk -F'\t' '{ printf "| %s | %s | %s | %s | %s |\n", $1, $2, $3, $4, $5 }' "$RESULTS"
    } >"$RESULTS_DIR/zdtm-gpu-table.md"
    log "zdtm on the GPU: $(awk -F'\t' '$4 == $5' "$RESULTS" | wc -l) of $(wc -l <"$RESULTS") test runs alike; without: $(grep -c $'\tPASS\t[A-Z]*$' "$RESULTS") PASS; with: $(grep -c $'\tPASS$' "$RESULTS") PASS"
    tar -C "$RESULTS_DIR" -czf "$RESULTS_DIR/zdtm-gpu-logs.tar.gz" --exclude='*.img' --exclude='pages-*' "${logs##*/}" && rm -rf "$logs"
    return "$failed"
}

case ${1:-} in
bundle) bundle ;;
run) run ;;
*) echo "usage: tests/gpu/zdtm.sh bundle|run" >&2; exit 2 ;;
esac
