#!/bin/sh
# fresh-build.sh: proves that BUILD_PACKAGES (scripts/lib.sh) are all a new
# machine needs to build dsec and regenerate its API code. It makes a
# minimal Debian root of this machine's release with exactly those packages
# (mmdebstrap --variant=minbase, plus git, which made the clone), and runs
# `make build check-gen` there on a copy of this work tree, with this
# machine's Go toolchain and module cache and no module downloads. A package
# missing from the list fails here, on every machine, however much the
# machine itself has installed.
#
# Nothing is left behind: mmdebstrap discards the root, and the bind mounts
# live in a mount namespace that ends with the build.
set -eu
cd "$(dirname "$0")/.."
. scripts/lib.sh

if [ "${1:-}" = --in-root ]; then
	# The customize hook: $2 is the new root. Runs in its own mount
	# namespace, so that the binds vanish with it whatever happens.
	root=$2
	mkdir -p "$root/opt/go" "$root/opt/modcache" "$root/opt/gocache" "$root/opt/src"
	mount --bind "$GOROOT_HOST" "$root/opt/go"
	mount -o remount,bind,ro "$root/opt/go"
	mount --bind "$GOMODCACHE_HOST" "$root/opt/modcache"
	mount -o remount,bind,ro "$root/opt/modcache"
	mount --bind "$GOCACHE_HOST" "$root/opt/gocache"
	# The work tree as it is now (uncommitted changes included), without
	# build output.
	tar -C "$SRC_HOST" --exclude=./bin -cf - . | tar -C "$root/opt/src" -xf -
	exec chroot "$root" /usr/bin/env -i PATH=/opt/go/bin:/usr/bin:/bin HOME=/root \
		GOROOT=/opt/go GOMODCACHE=/opt/modcache GOCACHE=/opt/gocache GOPROXY=off GOFLAGS=-buildvcs=false \
		GOTOOLCHAIN=local GOTELEMETRY=off \
		sh -c 'git config --global --add safe.directory /opt/src && cd /opt/src && make -s build check-gen && echo "fresh root: build and generated code ok"'
fi

need_root
find_go
command -v mmdebstrap >/dev/null 2>&1 || die "mmdebstrap is not installed: apt-get install mmdebstrap"
suite=$(. /etc/os-release && echo "${VERSION_CODENAME:?no VERSION_CODENAME in /etc/os-release}")
# Everything the build needs must be in the module cache already.
go mod download
GOROOT_HOST=$(go env GOROOT) GOMODCACHE_HOST=$(go env GOMODCACHE) GOCACHE_HOST=$(go env GOCACHE) SRC_HOST=$(pwd)
export GOROOT_HOST GOMODCACHE_HOST GOCACHE_HOST SRC_HOST
include=$(echo "$BUILD_PACKAGES git" | tr ' ' ,)
self=$(pwd)/scripts/fresh-build.sh
mmdebstrap --quiet --variant=minbase --include="$include" \
	--customize-hook="unshare --mount --propagation private '$self' --in-root \"\$1\"" \
	"$suite" /dev/null
