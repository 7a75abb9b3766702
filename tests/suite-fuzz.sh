#!/usr/bin/env bash
# A SHORT coverage-guided fuzz run for CI: cargo-fuzz (libFuzzer + AddressSanitizer, nightly Rust), every target
# of fuzz/, each seeded with its checked-in corpus: the identity image reader (`IdentityImage::decode`: two targets,
# fuzz/seeds/identity_image/, real images from dumps on the test doubles + hand-made edge cases), the device claims
# reader (`DeviceClaims::decode`, fuzz/seeds/device_claims/) and the `/proc/PID/net/unix` parser
# (`ccm_process::sockets::parse_net_unix`, fuzz/seeds/net_unix/).
# tests/run-all.sh runs it after the workspace tests.
#
#   bash tests/suite-fuzz.sh
#
# Fuzzing time: CCM_FUZZ_SECONDS per target (default 25, so 100 s in all; the first build of libFuzzer comes
# on top). Long runs by hand: `cargo +nightly fuzz run identity_image_payload /tmp/corpus fuzz/seeds/identity_image
# -- -runs=10000000` (docs/RELIABILITY.md).
#
# Without a nightly toolchain (or when cargo-fuzz is missing and cannot be installed) this suite is SKIPPED
# with a message; the stable-Rust mutation test (tests/identity_image_mutation.rs, same oracle, same seeds)
# runs in `cargo test` on every toolchain.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
cd "$REPO"
[ -x "$HOME/.cargo/bin/cargo" ] && case ":$PATH:" in *":$HOME/.cargo/bin:"*) ;; *) PATH=$HOME/.cargo/bin:$PATH ;; esac

skip() {
    echo "######## SKIPPED suite-fuzz: $* ########"
    echo "(in cargo test on every toolchain: the mutation test tests/identity_image_mutation.rs, same oracle, and the"
    echo " unit tests of the claims reader and of ccm_process::sockets::parse_net_unix)"
    exit 0
}

cargo +nightly --version >/dev/null 2>&1 ||
    skip "no nightly Rust toolchain (cargo-fuzz needs one: rustup toolchain install nightly)"
if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "suite-fuzz: installing cargo-fuzz (cargo install cargo-fuzz --locked)"
    cargo install cargo-fuzz --locked >/tmp/ccm-cargo-fuzz-install.log 2>&1 ||
        skip "cargo-fuzz is missing and \`cargo install cargo-fuzz --locked\` failed (log: /tmp/ccm-cargo-fuzz-install.log)"
fi

seconds=${CCM_FUZZ_SECONDS:-25}
# Every target of fuzz/Cargo.toml, with its seed corpus.
targets="identity_image_decode:identity_image identity_image_payload:identity_image device_claims_decode:device_claims
net_unix_parse:net_unix"
for pair in $targets; do
    target=${pair%%:*}
    seeds=fuzz/seeds/${pair#*:}
    [ -n "$(ls -A "$seeds")" ] || { echo "suite-fuzz: the seed corpus $seeds is empty" >&2; exit 1; }
    # libFuzzer adds what it finds to the FIRST corpus directory: a scratch one, so the checked-in seeds
    # stay as they are.
    scratch=$(mktemp -d /tmp/ccm-fuzz-corpus.XXXXXX)
    echo "suite-fuzz: $target for ${seconds} s"
    # -malloc_limit_mb: a single allocation above 64 MiB is a finding (the readers bound every count by the
    # bytes left); -timeout: one input taking over 5 s is a hang; -max_len: above the largest real input.
    if ! cargo +nightly fuzz run "$target" "$scratch" "$seeds" -- \
        -max_total_time="$seconds" -malloc_limit_mb=64 -rss_limit_mb=1024 -timeout=5 -max_len=16384 \
        -print_final_stats=1 2>&1 | tail -n 25; then
        rm -rf "$scratch"
        echo "suite-fuzz: $target FAILED; the crashing input is under fuzz/artifacts/$target/" >&2
        exit 1
    fi
    rm -rf "$scratch"
done
echo "suite-fuzz: every target ran ${seconds} s without a crash, hang or oversized allocation"
