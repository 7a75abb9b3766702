# shellcheck shell=bash
# Sourced by the container flows (podman-flow.sh, containerd-flow.sh). Needs S (the scratch directory).

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

# make_image OUT NAME CMD-JSON: a minimal OCI image archive of busybox-static named NAME, running CMD-JSON, for
# `ctr images import` (no registry here).
make_image() { # make_image OUT NAME CMD-JSON
    local out=$1 name=$2 cmd=$3 w diffid layer layer_size config config_size manifest manifest_size
    w=$(mktemp -d)
    mkdir -p "$w/rootfs/bin" "$w/rootfs/tmp" "$w/rootfs/proc" "$w/rootfs/sys" "$w/rootfs/dev" "$w/rootfs/etc" \
        "$w/rootfs/out" "$w/oci/blobs/sha256"
    cp /bin/busybox "$w/rootfs/bin/busybox"
    for applet in sh sleep cat echo; do ln -s busybox "$w/rootfs/bin/$applet"; done
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
