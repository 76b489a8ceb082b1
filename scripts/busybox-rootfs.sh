#!/bin/sh
# busybox-rootfs.sh DIR: makes a minimal root file system in DIR from
# Debian's static busybox, for tests and the README's first sandbox.
set -eu
[ $# = 1 ] || { echo "usage: $0 DIR" >&2; exit 2; }
dir=$1
bb=$(command -v busybox || true)
[ -n "$bb" ] || { echo "busybox not found: apt-get install busybox-static" >&2; exit 1; }
mkdir -p "$dir/bin" "$dir/sbin" "$dir/usr/bin" "$dir/usr/sbin" "$dir/etc" "$dir/root" \
	"$dir/tmp" "$dir/proc" "$dir/sys" "$dir/dev" "$dir/home" "$dir/var/tmp"
chmod 1777 "$dir/tmp" "$dir/var/tmp"
chmod 0700 "$dir/root"
cp "$bb" "$dir/bin/busybox"
for app in $("$dir/bin/busybox" --list); do
	[ -e "$dir/bin/$app" ] || ln -s busybox "$dir/bin/$app"
done
cat >"$dir/etc/passwd" <<'PASSWD'
root:x:0:0:root:/root:/bin/sh
nobody:x:65534:65534:nobody:/nonexistent:/bin/false
agent:x:1000:1000:agent:/home/agent:/bin/sh
PASSWD
cat >"$dir/etc/group" <<'GROUP'
root:x:0:
tty:x:5:
nogroup:x:65534:
agent:x:1000:
GROUP
mkdir -p "$dir/home/agent"
chown 1000:1000 "$dir/home/agent"
echo "dsec" >"$dir/etc/hostname"
