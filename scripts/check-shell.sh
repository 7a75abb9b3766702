#!/usr/bin/env bash
# Checks every shell script of the repository (issue 30): `bash -n` (and `sh -n` for a #!/bin/sh one), then
# ShellCheck at its default severity with the settings of .shellcheckrc; any finding fails. .ci/run runs it.
# The scripts: every *.sh that git tracks or would add (not ignored), and every such file whose first line is a
# sh or bash #! line (.ci/run, packaging/action-script).
#
#   bash scripts/check-shell.sh
#
# Needs git and shellcheck (Debian package shellcheck; scripts/install-deps.sh installs it).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

die() {
    echo "check-shell.sh: $*" >&2
    exit 1
}
command -v shellcheck >/dev/null 2>&1 || die "no shellcheck: run scripts/install-deps.sh (Debian package shellcheck)"

scripts=() posix=()
while IFS= read -r -d '' f; do
    if [ ! -f "$f" ] || [ -L "$f" ]; then continue; fi
    first=$(head -n1 "$f" 2>/dev/null | tr -d '\0') || first=
    case $first in
    '#!'*[/\ ]sh | '#!'*[/\ ]sh\ *) posix+=("$f") ;;
    '#!'*[/\ ]bash | '#!'*[/\ ]bash\ *) ;;
    *) case $f in *.sh) ;; *) continue ;; esac ;;
    esac
    scripts+=("$f")
done < <(git ls-files -z --cached --others --exclude-standard)
[ ${#scripts[@]} -gt 0 ] || die "no shell script found (not in a git checkout?)"

failed=0
for f in "${scripts[@]}"; do
    bash -n "$f" || { echo "check-shell.sh: bash -n $f failed" >&2; failed=1; }
done
for f in "${posix[@]}"; do
    sh -n "$f" || { echo "check-shell.sh: sh -n $f failed" >&2; failed=1; }
done
shellcheck "${scripts[@]}" || failed=1
[ "$failed" = 0 ] || die "${#scripts[@]} scripts checked: fix the findings above (.shellcheckrc says how a check may be disabled)"
echo "check-shell.sh: ${#scripts[@]} scripts: bash -n (and sh -n for ${#posix[@]}) and shellcheck $(shellcheck --version | sed -n 's/^version: //p'): clean"
