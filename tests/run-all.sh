#!/usr/bin/env bash
# THE test command of criu-cuda-migrate (README, .ci/run): installs what is missing, makes the Debian trixie root
# with real CRIU 4.x, builds the workspace and runs every test, the real-CRIU integration tests included.
#
#   bash tests/run-all.sh
#
# Run it as root (CI does): the real-CRIU tests enter a mount namespace and run criu. As another user the
# installation steps go through sudo and the real-CRIU tests skip with a loud message.
# Environment: CCM_TRIXIE_ROOT (where the trixie root is cached, outside the clone), extra `cargo test`
# arguments after `--` (e.g. `bash tests/run-all.sh -- criu_plain`).
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

as_root() {
    if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo -n "$@"; fi
}

step "dependencies (clang, libclang-dev, debootstrap)"
bash scripts/install-deps.sh

step "Debian trixie root with CRIU 4.x (tests/criu-root.sh prepare)"
as_root bash tests/criu-root.sh prepare
step "the same root with Podman, containerd, runc and crun (tests/criu-root.sh prepare-runtimes)"
as_root bash tests/criu-root.sh prepare-runtimes

step "cargo build --workspace"
cargo build --workspace

step "cargo test --workspace --no-fail-fast"
# Kept to list the skipped steps and notes again at the end (tests print them as `######## ... ########`).
test_log=$(mktemp /tmp/ccm-run-all.XXXXXX)
trap 'rm -f "$test_log"' EXIT
cargo test --workspace --no-fail-fast -- "${cargo_test_args[@]}" 2>&1 | tee "$test_log"

# Further suites (e.g. the simulated NVIDIA stack's end-to-end runs) drop an executable tests/suite-*.sh here;
# each runs from the repository root after the workspace tests and fails the run if it fails.
shopt -s nullglob
for suite in tests/suite-*.sh; do
    step "$suite"
    bash "$suite" 2>&1 | tee -a "$test_log"
done

step "no test process left behind"
# Every test must end what it started, restored processes included.
left=$(pgrep -a -f 'ccm-sample-workload|ccm-sim-target|ccm-fault-loop|torch_workload' | grep -v pgrep || true)
if [ -n "$left" ]; then
    echo "tests left these processes running:"
    echo "$left"
    exit 1
fi
echo "none"

step "skipped steps and notes"
grep -h -o '######## .* ########' "$test_log" | sed 's/^######## //; s/ ########$//' | sort -u | grep . || echo "none"

step "all tests passed"
