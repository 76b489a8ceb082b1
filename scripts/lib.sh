# Shared by the scripts: find Go, install Debian packages, build dsec.
# shellcheck shell=sh

die() { echo "error: $*" >&2; exit 1; }

# find_go puts a Go toolchain on PATH (the machine's /usr/local/go if the
# shell does not have one yet); the go command fetches the exact version
# go.mod asks for through the module proxy when it is older.
find_go() {
	if ! command -v go >/dev/null 2>&1; then
		for d in /usr/local/go/bin /usr/lib/go/bin; do
			if [ -x "$d/go" ]; then PATH="$d:$PATH"; export PATH; break; fi
		done
	fi
	command -v go >/dev/null 2>&1 || die "Go 1.21 or newer is needed: install it from https://go.dev/dl (it then fetches the version go.mod names)"
}

# need_root stops unless running as root.
need_root() {
	[ "$(id -u)" = 0 ] || die "run this as root (sudo $0): dsec creates namespaces, mounts and cgroups"
}

# install_packages installs the Debian packages dsec needs, if missing.
install_packages() {
	missing=""
	for p in "$@"; do
		dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing="$missing $p"
	done
	[ -z "$missing" ] && return 0
	echo "installing:$missing"
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq >/dev/null || die "apt-get update failed"
	# shellcheck disable=SC2086
	apt-get install -y -qq --no-install-recommends $missing >/dev/null || die "apt-get install$missing failed"
}

# The packages the platform needs at run time, and to build and test it.
RUNTIME_PACKAGES="crun runc busybox-static mmdebstrap python3 python3-venv"
BUILD_PACKAGES="gcc libc6-dev make protobuf-compiler erofs-utils xfsprogs e2fsprogs"
