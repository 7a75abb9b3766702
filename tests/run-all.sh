#!/usr/bin/env bash
# THE test command of criu-cuda-migrate (README, .ci/run): installs what is missing, makes the two Debian roots with
# real CRIU (trixie: CRIU 4.1.1, runc 1.1, crun 1.21, Podman 5.4, containerd 1.7; forky: CRIU 4.2.1, runc 1.3,
# crun 1.28, Podman 5.8, containerd 2.1), builds the workspace once and runs every test on trixie, then the
# real-CRIU suites (criu_plain, package_install, sim_flow, sim_faults, container_runtime, zdtm_plugin) again on forky
# with the same plugin file; tests/plugin_options.rs runs on a copy of forky's CRIU rebuilt with plugin options, and
# tests/zdtm_plugin.rs (CRIU's own zdtm suite with the plugin loaded and without it) on each suite's zdtm root.
#
#   bash tests/run-all.sh
#
# Run it as root (CI does): the real-CRIU tests enter a mount namespace and run criu. As another user the
# installation steps go through sudo and the real-CRIU tests skip with a loud message.
# Environment: CCM_TRIXIE_ROOT (where the trixie root is cached, outside the clone), CCM_FORKY_ROOT (the forky
# one; default /var/cache/criu-cuda-migrate/forky), extra `cargo test` arguments after `--` (e.g.
# `bash tests/run-all.sh -- criu_plain`).
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
cd "$REPO"
[ -x "$HOME/.cargo/bin/cargo" ] && case ":$PATH:" in *":$HOME/.cargo/bin:"*) ;; *) PATH=$HOME/.cargo/bin:$PATH ;; esac

cargo_test_args=()
if [ "${1:-}" = "--" ]; then
    shift
    cargo_test_args=("$@")
fi

started=$SECONDS
step() {
    echo
    echo "==> [$((SECONDS - started)) s] $*"
}

# A hung test must fail the run with its name on screen, not run into CI's limit with nothing said (libtest
# prints "<test> has been running for over 60 seconds" for it). The limits are several times a normal run.
bounded() {
    local limit=$1
    shift
    local rc=0
    timeout --kill-after=30 "$limit" "$@" || rc=$?
    if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
        echo "ERROR: '$*' did not end within $limit s: a test hangs; the last 'has been running for over 60 seconds'" \
            "line above names it" >&2
    fi
    return "$rc"
}

as_root() {
    if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo -n "$@"; fi
}

step "dependencies (clang, libclang-dev, debootstrap)"
bash scripts/install-deps.sh

# The forky pass: tests/criu-root.sh and the tests take the root from CCM_CRIU_SUITE (CCM_TRIXIE_ROOT names the
# root of either suite, so the trixie one's must not leak into this pass).
forky=(env -u CCM_TRIXIE_ROOT -u CCM_RUNTIMES_ROOT CCM_CRIU_SUITE=forky)
[ -n "${CCM_FORKY_ROOT:-}" ] && forky+=("CCM_TRIXIE_ROOT=$CCM_FORKY_ROOT")

step "Debian trixie root with CRIU 4.1.1 (tests/criu-root.sh prepare)"
as_root bash tests/criu-root.sh prepare
step "the same root with Podman, containerd, runc and crun (tests/criu-root.sh prepare-runtimes)"
as_root bash tests/criu-root.sh prepare-runtimes
step "Debian forky root with CRIU 4.2.1, and its runtimes (CCM_CRIU_SUITE=forky tests/criu-root.sh prepare-runtimes)"
as_root "${forky[@]}" bash tests/criu-root.sh prepare-runtimes
step "forky's CRIU 4.2.1 rebuilt with CRIU PR #3138's plugin options (CCM_CRIU_SUITE=forky tests/criu-root.sh prepare-patched)"
as_root "${forky[@]}" bash tests/criu-root.sh prepare-patched
step "CRIU's zdtm suite for both roots: Debian's criu source with the tests built (tests/criu-root.sh prepare-zdtm)"
as_root bash tests/criu-root.sh prepare-zdtm
as_root "${forky[@]}" bash tests/criu-root.sh prepare-zdtm

step "cargo build --workspace"
cargo build --workspace

step "cargo test --workspace --no-fail-fast"
# Kept to list the skipped steps and notes again at the end (tests print them as `######## ... ########`).
test_log=$(mktemp /tmp/ccm-run-all.XXXXXX)
trap 'rm -f "$test_log"' EXIT
bounded 2400 cargo test --workspace --no-fail-fast -- "${cargo_test_args[@]}" 2>&1 | tee "$test_log"

step "the real-CRIU suites again on CRIU 4.2.1 and the forky runtimes (CCM_CRIU_SUITE=forky, the same plugin file)"
# The test binaries the pass above built, run again: nothing is rebuilt, so the plugin is the very file built against
# trixie's header, which is what this pass proves. (`cargo test --test criu_plain ...` would build the root package's
# tests on their own, and cargo builds the build-time crates they do not share with the rest of the workspace (fnv and
# strsim, under nvml-wrapper's derive macro) with other debug settings: 11 crates and the plugin compiled again.)
forky_suites=(criu_plain package_install sim_flow sim_faults container_runtime zdtm_plugin)
forky_pass() {
    local built suite exe left failed=() deadline=$((SECONDS + 1800))
    built=$(cargo test --workspace --no-run --message-format=json)
    for suite in "${forky_suites[@]}"; do
        exe=$(grep -F "\"src_path\":\"$REPO/tests/$suite.rs\"" <<<"$built" | grep -o '"executable":"[^"]*"' | cut -d'"' -f4 || true)
        if [ ! -x "$exe" ]; then
            echo "ERROR: cargo named no test binary for tests/$suite.rs" >&2
            failed+=("$suite")
            continue
        fi
        echo
        echo "     Running tests/$suite.rs ($exe) [forky]"
        # cargo test runs a package's tests from its directory, the repository root here; all six share the limit.
        left=$((deadline - SECONDS))
        [ "$left" -gt 0 ] || left=1
        bounded "$left" "${forky[@]}" "$exe" "${cargo_test_args[@]}" || failed+=("$suite")
    done
    if [ ${#failed[@]} -gt 0 ]; then
        echo "error: the forky pass failed in: ${failed[*]}" >&2
        return 1
    fi
}
forky_pass 2>&1 | sed -u 's/^######## /######## [forky] /' | tee -a "$test_log"

# Further suites (e.g. the simulated NVIDIA stack's end-to-end runs) drop an executable tests/suite-*.sh here;
# each runs from the repository root after the workspace tests and fails the run if it fails.
shopt -s nullglob
for suite in tests/suite-*.sh; do
    step "$suite"
    bounded 1800 bash "$suite" 2>&1 | tee -a "$test_log"
done

step "no test process left behind"
# Every test must end what it started, restored processes included.
left=$(pgrep -a -f 'ccm-sample-workload|ccm-sim-target|ccm-fault-loop|ccm-tcp-pair|torch_workload' | grep -v pgrep || true)
if [ -n "$left" ]; then
    echo "tests left these processes running:"
    echo "$left"
    exit 1
fi
echo "none"

step "skipped steps and notes"
grep -h -o '######## .* ########' "$test_log" | sed 's/^######## //; s/ ########$//' | sort -u | grep . || echo "none"

step "all tests passed"
