#!/usr/bin/env bash
# Builds the Debian package of criu-cuda-migrate with dpkg-deb (no cargo-deb: nothing to download, works offline).
#
#   bash packaging/build-deb.sh [--no-build] [--out DIR]
#
#   --no-build   package the release artifacts already in the target directory instead of running cargo build
#   --out DIR    where to write the .deb (default: <target dir>/debian)
#
# Prints the path of the .deb as the last line of stdout; progress goes to stderr.
#
# Contents (and nothing else; the test doubles of crates/sim are never packaged):
#   /usr/lib/criu-cuda-migrate/plugins/criu_cuda_migrate.so   the CRIU plugin, alone in its own libdir
#   /usr/bin/criu-cuda-migrate                                the command-line tool
#   /usr/lib/criu-cuda-migrate/action-script                  CRIU's action script for runc (loopback up at restore)
#   /usr/share/man/man1/criu-cuda-migrate.1.gz                its man page (packaging/criu-cuda-migrate.1)
#   /etc/criu/criu-cuda-migrate.conf.example                  the libdir line to copy into /etc/criu/*.conf
#   /usr/share/doc/criu-cuda-migrate/                         README.md, USER-GUIDE.md, copyright, changelog
# The package never edits /etc/criu/*.conf: which file to put the libdir line in depends on the CRIU caller
# (criu, runc, crun), and a libdir line also hides CRIU's default plugin directory.
#
# Environment: CARGO_TARGET_DIR (default <repo>/target), CARGO (default cargo), SOURCE_DATE_EPOCH (timestamps;
# default: the last commit's time, so rebuilds of one commit give the same package).
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
PACKAGING=$REPO/packaging
PACKAGE=criu-cuda-migrate
PLUGIN_DIR=/usr/lib/criu-cuda-migrate/plugins
TARGET_DIR=${CARGO_TARGET_DIR:-$REPO/target}
CARGO=${CARGO:-cargo}
[ -x "$HOME/.cargo/bin/cargo" ] && case ":$PATH:" in *":$HOME/.cargo/bin:"*) ;; *) PATH=$HOME/.cargo/bin:$PATH ;; esac

die() {
    echo "build-deb.sh: $*" >&2
    exit 1
}
say() {
    echo "build-deb.sh: $*" >&2
}

build=1
out_dir=
while [ $# -gt 0 ]; do
    case "$1" in
    --no-build)
        build=0
        shift
        ;;
    --out)
        [ $# -ge 2 ] || die "--out needs a directory"
        out_dir=$2
        shift 2
        ;;
    -h | --help)
        sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'
        exit 0
        ;;
    *) die "unknown argument $1 (usage: build-deb.sh [--no-build] [--out DIR])" ;;
    esac
done
out_dir=${out_dir:-$TARGET_DIR/debian}

for tool in dpkg-deb dpkg-shlibdeps dpkg gzip strip; do
    command -v "$tool" >/dev/null 2>&1 || die "$tool is missing; install it with \`apt-get install dpkg-dev binutils gzip\`"
done

cd "$REPO"
if [ "$build" = 1 ]; then
    say "cargo build --release -p criu-cuda-migrate -p ccm-cli"
    "$CARGO" build --release -p criu-cuda-migrate -p ccm-cli >&2
fi
PLUGIN_SO=$TARGET_DIR/release/libcriu_cuda_migrate.so
CLI_BIN=$TARGET_DIR/release/criu-cuda-migrate
[ -f "$PLUGIN_SO" ] || die "$PLUGIN_SO is missing; run without --no-build (or \`cargo build --release -p criu-cuda-migrate\`)"
[ -x "$CLI_BIN" ] || die "$CLI_BIN is missing; run without --no-build (or \`cargo build --release -p ccm-cli\`)"

# The package version is the root package's Cargo version; "-1" is the Debian revision.
# `cargo pkgid` prints `path+file:///repo#criu-cuda-migrate@0.1.0` (older cargo: `file:///repo#0.1.0`).
pkgid=$("$CARGO" pkgid -p "$PACKAGE" 2>/dev/null) || die "cargo pkgid -p $PACKAGE failed; run this from a checkout of the workspace"
upstream_version=${pkgid##*#}
upstream_version=${upstream_version##*@}
[[ "$upstream_version" =~ ^[0-9][0-9A-Za-z.+~-]*$ ]] || die "cannot read the package version from \`cargo pkgid\` ($pkgid)"
version=$upstream_version-1
arch=$(dpkg --print-architecture)
if [ -z "${SOURCE_DATE_EPOCH:-}" ]; then
    SOURCE_DATE_EPOCH=$(git -C "$REPO" log -1 --format=%ct 2>/dev/null || date +%s)
fi
export SOURCE_DATE_EPOCH

stage=$(mktemp -d "${TMPDIR:-/tmp}/ccm-deb.XXXXXX")
trap 'rm -rf "$stage"' EXIT
root=$stage/root
doc=$root/usr/share/doc/$PACKAGE
install -d -m 0755 "$root/DEBIAN" "$root$PLUGIN_DIR" "$root/usr/bin" "$root/usr/share/man/man1" "$root/etc/criu" "$doc"

# Debug info stays out of the package (release builds carry line tables for backtraces). --strip-unneeded keeps the
# dynamic symbol table, so CRIU still finds CR_PLUGIN_DESC.
install -m 0644 "$PLUGIN_SO" "$root$PLUGIN_DIR/criu_cuda_migrate.so"
strip --strip-unneeded "$root$PLUGIN_DIR/criu_cuda_migrate.so"
install -m 0755 "$CLI_BIN" "$root/usr/bin/criu-cuda-migrate"
strip --strip-unneeded "$root/usr/bin/criu-cuda-migrate"
install -m 0755 "$PACKAGING/action-script" "$root/usr/lib/criu-cuda-migrate/action-script"

install -m 0644 "$PACKAGING/criu-cuda-migrate.conf" "$root/etc/criu/criu-cuda-migrate.conf.example"
gzip -9n <"$PACKAGING/criu-cuda-migrate.1" >"$root/usr/share/man/man1/criu-cuda-migrate.1.gz"
chmod 0644 "$root/usr/share/man/man1/criu-cuda-migrate.1.gz"
install -m 0644 "$REPO/README.md" "$doc/README.md"
install -m 0644 "$REPO/docs/USER-GUIDE.md" "$doc/USER-GUIDE.md"
install -m 0644 "$REPO/docs/IMAGE-FORMAT.md" "$doc/IMAGE-FORMAT.md"
install -m 0644 "$PACKAGING/debian/copyright" "$doc/copyright"
changelog_date=$(date -u -R -d "@$SOURCE_DATE_EPOCH")
sed -e "s/@VERSION@/$version/g" -e "s/@DATE@/$changelog_date/g" "$PACKAGING/debian/changelog.in" |
    gzip -9n >"$doc/changelog.Debian.gz"
chmod 0644 "$doc/changelog.Debian.gz"

# Shared-library dependencies as Debian computes them (libc6, libgcc-s1), from the binaries themselves.
# dpkg-shlibdeps wants a debian/control next to it; a minimal one in the stage directory does.
mkdir -p "$stage/debian"
printf 'Source: %s\n\nPackage: %s\nArchitecture: any\n' "$PACKAGE" "$PACKAGE" >"$stage/debian/control"
shlibs=$(cd "$stage" && dpkg-shlibdeps -O "root$PLUGIN_DIR/criu_cuda_migrate.so" root/usr/bin/criu-cuda-migrate 2>/dev/null) ||
    die "dpkg-shlibdeps failed on the plugin and the tool; run it by hand to see why (is libc6's shlibs file in /var/lib/dpkg/info?)"
depends=${shlibs#shlibs:Depends=}
if [ "$depends" = "$shlibs" ] || [ -z "$depends" ]; then
    die "dpkg-shlibdeps printed no dependencies ($shlibs)"
fi

installed_size=$(du -k -s --exclude=DEBIAN "$root" | cut -f1)
sed -e "s/@VERSION@/$version/g" -e "s/@ARCH@/$arch/g" -e "s/@DEPENDS@/$depends/g" \
    -e "s/@INSTALLED_SIZE@/$installed_size/g" "$PACKAGING/debian/control.in" >"$root/DEBIAN/control"
echo /etc/criu/criu-cuda-migrate.conf.example >"$root/DEBIAN/conffiles"
(cd "$root" && find . -path ./DEBIAN -prune -o -type f -printf '%P\0' | LC_ALL=C sort -z | xargs -0 md5sum) >"$root/DEBIAN/md5sums"
chmod 0644 "$root/DEBIAN/control" "$root/DEBIAN/conffiles" "$root/DEBIAN/md5sums"

# Guard against packaging a test double by accident (crates/sim builds libcuda.so.1 / libnvidia-ml.so.1 doubles).
if find "$root" -name 'libcuda*' -o -name 'libnvidia-ml*' -o -name '*sim*' -o -name '*test-double*' | grep -q .; then
    die "a test double of crates/sim ended up in the package; they must never be packaged"
fi

find "$root" -exec touch -h -d "@$SOURCE_DATE_EPOCH" {} +
mkdir -p "$out_dir"
deb=$(cd "$out_dir" && pwd -P)/${PACKAGE}_${version}_${arch}.deb
dpkg-deb --root-owner-group -Zxz --build "$root" "$deb" >&2
say "built $deb ($(du -h "$deb" | cut -f1))"
echo "$deb"
