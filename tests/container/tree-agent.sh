#!/bin/sh
# The "agent" of a torchrun-like job (tests/container/podman-cdi-tree-flow.sh), the container's entrypoint under
# busybox sh: RANKS ranks on the container's one GPU (CUDA ordinal 0), each the sample workload with WORKERS children
# forked after cuInit (DataLoader workers' stand-ins) that hold /dev/nvidiactl and /dev/nvidia0 open and map
# /dev/nvidia0, as a real worker holds the driver's nodes it inherited. Rank R's control directory is /ctl/wR; the
# agent waits for its ranks, as torchrun's elastic agent does.
#
#   tree-agent.sh RANKS WORKERS ROUNDS
ranks=$1 workers=$2 rounds=$3
r=0
while [ "$r" -lt "$ranks" ]; do
    mkdir -p "/ctl/w$r"
    ccm-sample-workload --dir "/ctl/w$r" --mib 1 --devices 0 --rounds "$rounds" --forked-child \
        --forked-children "$workers" --child-open /dev/nvidiactl,/dev/nvidia0 --child-map /dev/nvidia0:65536 &
    r=$((r + 1))
done
wait
