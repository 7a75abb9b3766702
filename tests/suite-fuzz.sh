#!/usr/bin/env bash
# A SHORT coverage-guided fuzz run of the identity image reader (`IdentityImage::decode`) for CI: cargo-fuzz
# (libFuzzer + AddressSanitizer, nightly Rust), both targets of fuzz/, seeded with the checked-in corpus
# fuzz/seeds/identity_image/ (real images from dumps on the test doubles + hand-made edge cases).
# tests/run-all.sh runs it after the workspace tests.
#
#   bash tests/suite-fuzz.sh
#
# Fuzzing time: CCM_FUZZ_SECONDS per target (default 25, so 50 s in all; the first build of libFuzzer comes
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
    echo "(the stable-Rust mutation test tests/identity_image_mutation.rs covers the same oracle in cargo test)"
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
seeds=fuzz/seeds/identity_image
[ -n "$(ls -A "$seeds")" ] || { echo "suite-fuzz: the seed corpus $seeds is empty" >&2; exit 1; }
for target in identity_image_decode identity_image_payload; do
    # libFuzzer adds what it finds to the FIRST corpus directory: a scratch one, so the checked-in seeds
    # stay as they are.
    scratch=$(mktemp -d /tmp/ccm-fuzz-corpus.XXXXXX)
    echo "suite-fuzz: $target for ${seconds} s"
    # -malloc_limit_mb: a single allocation above 64 MiB is a finding (the reader bounds every count by the
    # bytes left); -timeout: one input taking over 5 s is a hang; -max_len: above the largest real image.
    if ! cargo +nightly fuzz run "$target" "$scratch" "$seeds" -- \
        -max_total_time="$seconds" -malloc_limit_mb=64 -rss_limit_mb=1024 -timeout=5 -max_len=16384 \
        -print_final_stats=1 2>&1 | tail -n 25; then
        rm -rf "$scratch"
        echo "suite-fuzz: $target FAILED; the crashing input is under fuzz/artifacts/$target/" >&2
        exit 1
    fi
    rm -rf "$scratch"
done
echo "suite-fuzz: both targets ran ${seconds} s each without a crash, hang or oversized allocation"
