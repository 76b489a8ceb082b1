package adversarial

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/sys/unix"

	"github.com/dsecproject/dsec/sdk/go/dsec"
)

// hostInit returns the host pid of sb's init, from the keeper's record in
// the platform's state dir.
func hostInit(t *testing.T, sb *dsec.Sandbox) int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(Env(t).StateDir, "sandboxes", sb.ID, "keeper.json"))
	if err != nil {
		t.Fatalf("keeper record of %s: %v", sb.ID, err)
	}
	var rec struct {
		Pid int `json:"pid"`
	}
	if err := json.Unmarshal(b, &rec); err != nil || rec.Pid <= 0 {
		t.Fatalf("keeper record of %s = %s, %v; want a pid", sb.ID, b, err)
	}
	return rec.Pid
}

// TestHostDevNullUntouched: creating sandboxes and chmod/chown of
// /dev/null inside one leave the host's /dev/null as it was. Protection:
// the keeper gives the OCI runtime pipes as its stdio, never a host file or
// device (runtimes chown their stdio to the container's root, and the init
// inherits them); the sandbox's /dev/null is the host's device node, owned
// by the host's root, which no sandbox id maps to.
func TestHostDevNullUntouched(t *testing.T) {
	Env(t)
	var before unix.Stat_t
	if err := unix.Stat("/dev/null", &before); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// Leave the host as it was found, whatever the outcome.
		_ = unix.Chown("/dev/null", int(before.Uid), int(before.Gid))
		_ = unix.Chmod("/dev/null", before.Mode&0o7777)
	})
	sb := NewSandbox(t, dsec.CreateOptions{})
	chmod := Sh(t, sb, "chmod 600 /dev/null")
	r := Sh(t, sb, "chown 0:0 /dev/null; chmod 600 /proc/self/fd/0 /proc/self/fd/1 /proc/self/fd/2; ls -ln /dev/null")
	stdin := MustSh(t, sb, "readlink /proc/self/fd/0")
	var after unix.Stat_t
	if err := unix.Stat("/dev/null", &after); err != nil {
		t.Fatal(err)
	}
	if after.Uid != before.Uid || after.Gid != before.Gid || after.Mode != before.Mode {
		t.Errorf("host /dev/null after a create and chmod 600 inside = %d:%d %o, want %d:%d %o as before (inside: %q %q)",
			after.Uid, after.Gid, after.Mode&0o7777, before.Uid, before.Gid, before.Mode&0o7777, r.Stdout, r.Stderr)
	}
	if after.Uid != 0 {
		t.Errorf("host /dev/null belongs to uid %d, want root: something chowned it", after.Uid)
	}
	if chmod.Code() == 0 {
		t.Errorf("chmod 600 /dev/null inside = exit 0, want it refused")
	}
	if !strings.HasPrefix(stdin, "pipe:") {
		t.Errorf("an exec's stdin is %q, want a pipe, not the host's /dev/null", stdin)
	}
}

// TestInitUnreachable: nothing in a sandbox may ptrace its init, open its
// memory or descriptors, or read its memory; and the init itself runs
// under the sandbox's seccomp filter, so code injected into it would gain
// nothing. Protection: the init makes itself non-dumpable before anything
// else and installs the filter it is given (nsexec's init mode); the
// sandbox has no CAP_SYS_PTRACE.
func TestInitUnreachable(t *testing.T) {
	Env(t)
	t.Parallel()
	sb := NewSandbox(t, dsec.CreateOptions{})
	InstallProbe(t, sb)
	got := probe(t, sb, "init")
	want := map[string]string{
		"ptrace_attach": "EPERM", "ptrace_seize": "EPERM",
		"mem_rdwr": "EACCES", "mem_read": "EACCES",
		"process_vm_readv": "EPERM",
		"fd_0":             "EACCES", "fd_1": "EACCES", "fd_2": "EACCES",
		// The init holds 0-2 only (the dsec binary and its filter, 3 and
		// 4 at start, are closed).
		"fd_3": "ENOENT", "fd_4": "ENOENT",
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("attacks on pid 1 from inside (-want +got):\n%s", d)
	}
	status := MustSh(t, sb, "grep -E '^(Seccomp|NoNewPrivs):' /proc/1/status")
	if !strings.Contains(status, "Seccomp:\t2") || !strings.Contains(status, "NoNewPrivs:\t1") {
		t.Errorf("/proc/1/status = %q, want Seccomp 2 (filtered) and NoNewPrivs 1", status)
	}
}

// TestInitFDsNotHostDisk: writing to every descriptor of pid 1 does not
// reach the host's disk. Protection: the init's fds 0-2 are the
// sandbox's own /dev/null, and /proc/1/fd is closed to the sandbox (the
// init is not dumpable). Before, they were the keeper's deleted run-*.out
// file, outside every quota.
func TestInitFDsNotHostDisk(t *testing.T) {
	p := Env(t)
	sb := NewSandbox(t, dsec.CreateOptions{Disk: 64 << 20})
	var before, after unix.Statfs_t
	if err := unix.Statfs(p.StateDir, &before); err != nil {
		t.Fatal(err)
	}
	r := Sh(t, sb, "for fd in 0 1 2 3 4 5; do dd if=/dev/zero of=/proc/1/fd/$fd bs=1M count=300 2>&1 | tail -n1; done")
	if err := unix.Statfs(p.StateDir, &after); err != nil {
		t.Fatal(err)
	}
	used := (int64(before.Bavail) - int64(after.Bavail)) * before.Bsize
	if used > 100<<20 {
		t.Errorf("writing 300 MiB to each fd of pid 1 took %d MiB of the host's disk, want none (inside: %q)", used>>20, r.Stdout)
	}
	if strings.Contains(r.Stdout, "300+0 records out") {
		t.Errorf("a write of 300 MiB to an fd of pid 1 succeeded: %q", r.Stdout)
	}
}

// TestMountInAgentNamespaceNotSeen: an agent's attempt at a mount of its
// own (in a namespace it makes) is refused, and nothing it did is what a
// later exec or the file API sees. Protection: the seccomp filter and the
// missing CAP_SYS_ADMIN refuse mounts; execs and file operations join the
// init's namespaces, checked against those it was started in.
func TestMountInAgentNamespaceNotSeen(t *testing.T) {
	Env(t)
	t.Parallel()
	sb := NewSandbox(t, dsec.CreateOptions{})
	Sh(t, sb, "mkdir -p /opt/view; unshare -m sh -c 'mount -t tmpfs x /opt/view && touch /opt/view/planted'; "+
		"mount -t tmpfs x /opt/view && touch /opt/view/planted")
	if r := Sh(t, sb, "ls -A /opt/view"); r.Stdout != "" {
		t.Errorf("a later exec sees %q in /opt/view, want the sandbox's own empty directory", r.Stdout)
	}
	ents, _, err := sb.ListDir(Ctx(t, time.Minute), "/opt/view")
	if err != nil || len(ents) != 0 {
		t.Errorf("ListDir(/opt/view) = %v, %v; want the sandbox's own empty directory", ents, err)
	}
}

// TestInotifyPerSandbox: three sandboxes holding every inotify instance
// they can leave the host's root and a fourth sandbox able to make one.
// Protection: each sandbox's user namespace is made by its own host uid
// (the kernel charges a namespace's counts to its owner), and each sandbox
// has host ids of its own; a per-namespace limit is set inside.
func TestInotifyPerSandbox(t *testing.T) {
	Env(t)
	var holders []*dsec.Sandbox
	for range 3 {
		sb := NewSandbox(t, dsec.CreateOptions{})
		InstallProbe(t, sb)
		MustSh(t, sb, "probe inotify 100000 hold > /tmp/inotify 2>&1 &")
		holders = append(holders, sb)
	}
	for i, sb := range holders {
		var out string
		for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
			if out = MustSh(t, sb, "cat /tmp/inotify"); out != "" {
				break
			}
		}
		var n int
		var res string
		if _, err := fmt.Sscanf(out, "inotify %d %s", &n, &res); err != nil || n < 64 || res == "ok" {
			t.Errorf("sandbox %d made %q inotify instances, want at least 64 and then a refusal", i, out)
		}
	}
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC)
	if err != nil {
		t.Errorf("inotify_init1 on the host as root while three sandboxes hold all they can = %v, want success", err)
	} else {
		unix.Close(fd)
	}
	fourth := NewSandbox(t, dsec.CreateOptions{})
	InstallProbe(t, fourth)
	if out := MustSh(t, fourth, "probe inotify 1"); out != "inotify 1 ok\n" {
		t.Errorf("inotify in a fourth sandbox = %q, want one made", out)
	}
}

// TestSandboxesOwnIDs: two sandboxes have distinct host id ranges, and
// each one's user namespace belongs to its own host root, not to the
// host's. Protection: the keeper's pool of id ranges and the user
// namespace helper running as the sandbox's host root.
func TestSandboxesOwnIDs(t *testing.T) {
	Env(t)
	t.Parallel()
	base := func(sb *dsec.Sandbox) uint32 {
		f := strings.Fields(MustSh(t, sb, "cat /proc/self/uid_map"))
		if len(f) != 3 || f[0] != "0" {
			t.Fatalf("uid_map of %s = %q", sb.ID, f)
		}
		v, _ := strconv.ParseUint(f[1], 10, 32)
		return uint32(v)
	}
	a, b := NewSandbox(t, dsec.CreateOptions{}), NewSandbox(t, dsec.CreateOptions{})
	ba, bb := base(a), base(b)
	if ba == bb {
		t.Errorf("sandboxes %s and %s both map root to host uid %d, want ranges of their own", a.ID, b.ID, ba)
	}
	for _, c := range []struct {
		sb   *dsec.Sandbox
		base uint32
	}{{a, ba}, {b, bb}} {
		ns, err := os.Open(fmt.Sprintf("/proc/%d/ns/user", hostInit(t, c.sb)))
		if err != nil {
			t.Fatal(err)
		}
		owner, err := unix.IoctlGetUint32(int(ns.Fd()), unix.NS_GET_OWNER_UID)
		ns.Close()
		if err != nil || owner != c.base {
			t.Errorf("owner of %s's user namespace = %d, %v; want its host root %d", c.sb.ID, owner, err, c.base)
		}
	}
}

// TestBlockMapRefused: no program in a sandbox learns where its files
// lie on the host's disk. Protection: the seccomp policy refuses
// FS_IOC_FIEMAP, FS_IOC_GETFSMAP and FIBMAP.
func TestBlockMapRefused(t *testing.T) {
	Env(t)
	t.Parallel()
	sb := Shared(t)
	InstallProbe(t, sb)
	want := map[string]string{"fiemap": "EPERM", "getfsmap": "EPERM", "fibmap": "EPERM"}
	if d := cmp.Diff(want, probe(t, sb, "syscall", "fiemap", "getfsmap", "fibmap")); d != "" {
		t.Errorf("block-mapping ioctls from inside (-want +got):\n%s", d)
	}
}

// hostPath matches what a path of this host looks like in mount options.
var hostPath = regexp.MustCompile(`(lowerdir|upperdir|workdir|lowerdir\+|datadir\+)=([^,]*)`)

// TestViewRevealsNothingOfHost: a sandbox's mount table and cgroup
// membership name no path of the host. Protection: the overlay root is
// mounted from descriptors (layers and a detached clone of the writable
// layer's directory), and the runtime starts in the sandbox's cgroup2
// group, so the cgroup namespace's root is the sandbox's own group.
func TestViewRevealsNothingOfHost(t *testing.T) {
	p := Env(t)
	t.Parallel()
	sb := Shared(t)
	mi := MustSh(t, sb, "cat /proc/self/mountinfo")
	if strings.Contains(mi, p.StateDir) {
		t.Errorf("/proc/self/mountinfo names the platform's state dir %s:\n%s", p.StateDir, mi)
	}
	for _, m := range hostPath.FindAllStringSubmatch(mi, -1) {
		if m[2] != "/" && m[2] != "/upper" && m[2] != "/work" {
			t.Errorf("/proc/self/mountinfo has %s=%s, want nothing of the host's paths", m[1], m[2])
		}
	}
	cg := MustSh(t, sb, "cat /proc/self/cgroup")
	for _, line := range strings.Split(strings.TrimSpace(cg), "\n") {
		if i := strings.LastIndexByte(line, ':'); i < 0 || line[i+1:] != "/" {
			t.Errorf("/proc/self/cgroup line %q names a group of the host, want /", line)
		}
	}
}
