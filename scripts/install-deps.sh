#!/usr/bin/env bash
# Installs what building and testing criu-cuda-migrate needs on Debian, only what is missing, quietly:
# clang and libclang-dev (bindgen reads CRIU's plugin header), debootstrap (the Debian trixie root with CRIU 4.x,
# see tests/criu-root.sh), valgrind (the FFI test, tests/ffi_valgrind.rs), shellcheck (scripts/check-shell.sh, the
# check of every shell script that .ci/run runs). Rust itself comes from rustup; this script checks for it and says
# how to get it.
# Used by .ci/run, tests/run-all.sh and scripts/demo.sh. Safe to run any number of times, with or without a terminal.
set -euo pipefail

PACKAGES=(clang libclang-dev debootstrap valgrind shellcheck)

die() {
    echo "install-deps.sh: $*" >&2
    exit 1
}

# Root does it directly; anyone else goes through sudo (a developer laptop), non-interactively.
as_root() {
    if [ "$(id -u)" -eq 0 ]; then
        "$@"
    elif command -v sudo >/dev/null 2>&1; then
        sudo -n "$@" || die "\`sudo $*\` failed; run this script as root or allow sudo without a password"
    else
        die "need root to run \`$*\`; run this script as root"
    fi
}

if ! command -v cargo >/dev/null 2>&1; then
    [ -x "$HOME/.cargo/bin/cargo" ] || die "no Rust toolchain: install it with \`curl https://sh.rustup.rs -sSf | sh -s -- -y\`, then open a new shell (or \`. \$HOME/.cargo/env\`)"
fi

missing=()
for pkg in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
    command -v apt-get >/dev/null 2>&1 || die "missing ${missing[*]} and no apt-get to install them; install them by hand"
    echo "install-deps.sh: installing ${missing[*]} with apt-get"
    as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq </dev/null >/dev/null
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" </dev/null >/dev/null
fi
