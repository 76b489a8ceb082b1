#!/bin/sh
# quickstart.sh: the README's first command. On a fresh Debian machine it
# installs what is missing, builds dsec, starts `dsec up -d`, builds a
# busybox image and runs a command in a sandbox.
set -eu
cd "$(dirname "$0")/.."
. scripts/lib.sh
need_root
find_go
install_packages $RUNTIME_PACKAGES gcc libc6-dev make
echo "building dsec"
make -s build
install -m 0755 bin/dsec-node /usr/local/bin/dsec-node
install -m 0755 bin/dsec /usr/local/bin/dsec
echo "installed /usr/local/bin/dsec and /usr/local/bin/dsec-node"
if ! curl -fsS http://127.0.0.1:7420/healthz >/dev/null 2>&1 && ! wget -qO- http://127.0.0.1:7420/healthz >/dev/null 2>&1; then
	dsec up -d
fi
if ! dsec image ls -q | grep -qx 'busybox:latest'; then
	root=$(mktemp -d)
	trap 'rm -rf "$root"' EXIT
	scripts/busybox-rootfs.sh "$root"
	dsec image build busybox --from-dir "$root" --public
fi
echo '$ dsec run busybox -- sh -c '\''echo "hello from $(hostname)"; uname -a'\'''
dsec run busybox -- sh -c 'echo "hello from $(hostname)"; uname -a'
