#!/usr/bin/env bash
# On the GPU machine (issue 31 item 3 and issue 29's library rule): `criu-cuda-migrate node` with the default
# libraries and with CRIU_CUDA_MIGRATE_LIBCUDA/_LIBNVML naming them (opened once, loaded through /proc/self/fd/N),
# then `node --check` on the bare machine and again once the node is set up as docs/USER-GUIDE.md says (CRIU on
# PATH, the plugin in the package's libdir, the libdir line in /etc/criu/default.conf). Changes the machine's /:
# run it only on a lent, throw-away GPU machine.
#
#   bash tests/gpu/node-check.sh      (needs .device/bin/criu-cuda-migrate, .device/plugin/*.so, .device/criu-debs,
#                                      and for the ready node .device/iptables-debs: iptables 1.8.11 and its libraries
#                                      from Debian trixie, as tests/gpu/prepare.sh CCM_PREPARE_RUNTIMES=1 gathers them)
set -u
D=${CCM_DEVICE_DIR:-.device}
CLI=$D/bin/criu-cuda-migrate
libdir=/usr/lib/criu-cuda-migrate/plugins

echo "== node (default libraries)"
"$CLI" node
echo "rc=$?"
echo "== node with CRIU_CUDA_MIGRATE_LIBCUDA and _LIBNVML set"
CRIU_CUDA_MIGRATE_LIBCUDA=$(readlink -f /usr/local/nvidia/lib64/libcuda.so.1) \
    CRIU_CUDA_MIGRATE_LIBNVML=$(readlink -f /usr/local/nvidia/lib64/libnvidia-ml.so.1) "$CLI" node
echo "rc=$?"
echo "== node --check on the bare GPU machine"
"$CLI" node --check
echo "rc=$?"
for f in "$D"/criu-debs/*.deb; do dpkg -x "$f" / >/dev/null 2>&1; done
install -d "$libdir" /etc/criu
# The package's name for the plugin (packaging/build-deb.sh).
cp "$D"/plugin/libcriu_cuda_migrate.so "$libdir/criu_cuda_migrate.so"
cp "$CLI" /usr/bin/criu-cuda-migrate
echo "libdir $libdir" >/etc/criu/default.conf
echo "== node --check after installing CRIU and the plugin"
criu-cuda-migrate node --check
echo "rc=$?"
# What a node needs beyond that: iptables for CRIU's network lock (dpkg -x runs no maintainer script, so the
# alternatives link update-alternatives would make is made here) and a CDI spec of the GPUs.
for f in "$D"/iptables-debs/*.deb; do dpkg -x "$f" / >/dev/null 2>&1; done
ln -sf xtables-nft-multi /usr/sbin/iptables-restore
ln -sf xtables-nft-multi /usr/sbin/iptables
ln -sf xtables-nft-multi /usr/sbin/ip6tables-restore
ln -sf xtables-nft-multi /usr/sbin/ip6tables
bash "$(dirname "${BASH_SOURCE[0]}")/cdi-spec.sh" >/dev/null
echo "== node --check after adding iptables and a CDI spec"
criu-cuda-migrate node --check
echo "rc=$?"
echo "== node --check --json"
criu-cuda-migrate node --check --json | head -c 4000
echo
