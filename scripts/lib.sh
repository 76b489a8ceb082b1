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

# install_packages installs the Debian packages dsec needs, if missing, then
# checks that each provides what dsec uses of it (check_packages).
install_packages() {
	missing=""
	for p in "$@"; do
		dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing="$missing $p"
	done
	if [ -n "$missing" ]; then
		echo "installing:$missing"
		export DEBIAN_FRONTEND=noninteractive
		apt-get update -qq >/dev/null || die "apt-get update failed"
		# shellcheck disable=SC2086
		apt-get install -y -qq --no-install-recommends $missing >/dev/null || die "apt-get install$missing failed"
	fi
	check_packages "$@"
}

# The packages the platform needs at run time, and to build and test it.
# Every package named here has a line in PROBES; scripts/fresh-build.sh
# proves on a minimal Debian root that BUILD_PACKAGES are enough to build
# dsec and regenerate its API code.
RUNTIME_PACKAGES="crun runc busybox-static mmdebstrap python3 python3-venv"
BUILD_PACKAGES="gcc libc6-dev make protobuf-compiler libprotobuf-dev erofs-utils xfsprogs e2fsprogs"

# PROBES: for each package, what of it the build, the platform or the tests
# use: commands (looked up on PATH), absolute paths, or py:MODULE (a module
# Debian's /usr/bin/python3 imports). A machine can have a
# file for another reason (a package installed by hand, or as a
# recommendation); checking what is used, after installing exactly the
# lists above, is what makes a missing entry fail here, with the package's
# name, instead of deep inside a test.
PROBES='
crun              crun
runc              runc
busybox-static    busybox
mmdebstrap        mmdebstrap
python3           python3
python3-venv      py:ensurepip py:venv
gcc               gcc
libc6-dev         /usr/include/stdio.h /usr/lib/x86_64-linux-gnu/libc.a
make              make
protobuf-compiler protoc
libprotobuf-dev   /usr/include/google/protobuf/timestamp.proto /usr/include/google/protobuf/duration.proto
erofs-utils       mkfs.erofs fsck.erofs
xfsprogs          mkfs.xfs
e2fsprogs         mkfs.ext4
'

# check_packages stops, naming the package, when something the given
# packages should provide is missing, or when a package has no probe.
check_packages() {
	bad=""
	for p in "$@"; do
		line=$(printf '%s\n' "$PROBES" | awk -v p="$p" '$1 == p')
		[ -n "$line" ] || die "package $p has no line in PROBES (scripts/lib.sh): say what dsec uses of it"
		for want in ${line#"$p"}; do
			case $want in
			/*) [ -e "$want" ] ;;
			py:*) /usr/bin/python3 -c "import ${want#py:}" >/dev/null 2>&1 ;;
			*) command -v "$want" >/dev/null 2>&1 ;;
			esac || bad="$bad\n  $want (from package $p)"
		done
	done
	[ -z "$bad" ] || die "missing after installing the packages:$(printf "$bad")
reinstall them (apt-get install --reinstall PACKAGE) or fix PROBES in scripts/lib.sh"
}
