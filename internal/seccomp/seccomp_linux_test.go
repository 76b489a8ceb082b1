//go:build linux && cgo

package seccomp

// Tests that install compiled filters for real: commands started in a
// namespaced target process through nsexec.Spawn, as the keeper starts
// them, with and without the filter, so each check shows the filter made
// the difference.

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
	"golang.org/x/sys/unix"

	"github.com/dsecproject/dsec/internal/nsexec"
	"github.com/dsecproject/dsec/internal/testenv"
)

const (
	// probeEnv makes the test binary run probe instead of the tests; its
	// value is the file the probe's ioctls go to.
	probeEnv = "DSEC_SECCOMP_PROBE"
	// hostIDBase is where uid and gid 0 of the target map on the host.
	hostIDBase = 1000000000
	// allCaps keeps every capability, so that without the filter the
	// kernel allows what the filter denies.
	allCaps = ^uint64(0)
)

func TestMain(m *testing.M) {
	if file, ok := os.LookupEnv(probeEnv); ok {
		os.Exit(probe(file))
	}
	// Commands started by Spawn are reparented to us when their helper
	// exits, as they are to the keeper.
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		fmt.Fprintln(os.Stderr, "PR_SET_CHILD_SUBREAPER:", err)
		os.Exit(1)
	}
	goleak.VerifyTestMain(m)
}

// probe makes the calls the tests check, one line each on stdout: its name
// and the errno it failed with (0: it succeeded).
func probe(file string) int {
	f, err := os.Open(file)
	if err != nil {
		fmt.Fprintln(os.Stderr, "probe:", err)
		return 2
	}
	defer f.Close()
	fd := f.Fd()
	ioctl := func(cmd uint64) syscall.Errno {
		_, _, e := unix.Syscall(unix.SYS_IOCTL, fd, uintptr(cmd), 0)
		return e
	}
	raw := func(nr uintptr, args ...uintptr) syscall.Errno {
		var a [3]uintptr
		copy(a[:], args)
		_, _, e := unix.RawSyscall(nr, a[0], a[1], a[2])
		return e
	}
	calls := []struct {
		name string
		do   func() syscall.Errno
	}{
		{"ioctl_swapext", func() syscall.Errno { return ioctl(xfsIOCSwapext) }},
		{"ioctl_swapext_high", func() syscall.Errno { return ioctl(0xdeadbeef<<32 | xfsIOCSwapext) }},
		{"ioctl_exchange_range", func() syscall.Errno { return ioctl(xfsIOCExchangeRange) }},
		{"ioctl_exchange_range_high", func() syscall.Errno { return ioctl(0xffffffff<<32 | xfsIOCExchangeRange) }},
		{"ioctl_tcgets", func() syscall.Errno { return ioctl(unix.TCGETS) }},
		{"ioctl_fiemap", func() syscall.Errno { return ioctl(fsIOCFiemap) }},
		{"ioctl_getfsmap", func() syscall.Errno { return ioctl(fsIOCGetfsmap) }},
		{"ioctl_fibmap", func() syscall.Errno { return ioctl(fibmap) }},
		{"personality_query", func() syscall.Errno { return raw(unix.SYS_PERSONALITY, 0xffffffff) }},
		{"personality_addr_no_randomize", func() syscall.Errno { return raw(unix.SYS_PERSONALITY, addrNoRandomize) }},
		// CLONE_FS makes the kernel refuse CLONE_NEWUSER with EINVAL
		// before it creates anything, so without the filter no process
		// is forked under the Go runtime.
		{"clone_newuser", func() syscall.Errno { return raw(unix.SYS_CLONE, unix.CLONE_NEWUSER|unix.CLONE_FS) }},
		{"clone_newuser_high", func() syscall.Errno { return raw(unix.SYS_CLONE, 0xffffffff<<32|unix.CLONE_NEWUSER|unix.CLONE_FS) }},
		{"clone3", func() syscall.Errno { return raw(unix.SYS_CLONE3, 0, 0) }},
		// A Go program has threads, so the kernel refuses with EINVAL.
		{"unshare_newuser", func() syscall.Errno { return raw(unix.SYS_UNSHARE, unix.CLONE_NEWUSER) }},
		{"fsopen", func() syscall.Errno {
			fd, err := unix.Fsopen("tmpfs", unix.FSOPEN_CLOEXEC)
			if err == nil {
				unix.Close(fd)
				return 0
			}
			return err.(syscall.Errno)
		}},
		{"keyctl", func() syscall.Errno {
			_, err := unix.KeyctlGetKeyringID(unix.KEY_SPEC_SESSION_KEYRING, false)
			if err != nil {
				return err.(syscall.Errno)
			}
			return 0
		}},
		{"io_uring_setup", func() syscall.Errno { return raw(unix.SYS_IO_URING_SETUP, 1, 0) }},
		{"x32_getpid", x32Getpid},
		{"getpid", func() syscall.Errno { return raw(unix.SYS_GETPID) }},
		{"threads", threads},
		{"exec", func() syscall.Errno {
			if err := exec.Command("busybox", "true").Run(); err != nil {
				fmt.Fprintln(os.Stderr, "probe: exec:", err)
				return syscall.EIO
			}
			return 0
		}},
	}
	for _, c := range calls {
		fmt.Printf("%s %d\n", c.name, int(c.do()))
	}
	return 0
}

// x32Getpid calls getpid through the x32 ABI on x86_64.
func x32Getpid() syscall.Errno {
	if runtime.GOARCH != "amd64" {
		return syscall.EPERM // what the filter gives; there is no x32 here
	}
	_, _, e := unix.RawSyscall(x32SyscallBit|unix.SYS_GETPID, 0, 0, 0)
	return e
}

// threads runs four goroutines on four threads at once.
func threads() syscall.Errno {
	var wg sync.WaitGroup
	var mu sync.Mutex
	tids := map[int]bool{} // guarded by mu
	for range 4 {
		wg.Go(func() {
			runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
			mu.Lock()
			tids[unix.Gettid()] = true
			mu.Unlock()
			time.Sleep(20 * time.Millisecond)
		})
	}
	wg.Wait()
	if len(tids) != 4 {
		return syscall.EAGAIN
	}
	return 0
}

// sandbox is a target process like a sandbox's init, whose namespaces
// commands join, and files commands in it can reach.
type sandbox struct {
	pid  int
	dir  string // a directory every user in the sandbox can read
	bin  string // a copy of the test binary in dir
	file string // a regular file in dir
	path string // PATH with busybox
}

// newSandbox makes a sandbox. Its target has new user, mount, pid, uts, ipc
// and net namespaces, root mapped to hostIDBase, and shares the host's file
// system (a copy of its mounts), so host paths work inside. setup, when
// not nil, runs before the target starts; mounts it makes are in the
// target's copy.
func newSandbox(t *testing.T, setup func(dir string)) *sandbox {
	t.Helper()
	testenv.RequireRoot(t)
	busybox, err := exec.LookPath("busybox")
	testenv.Require(t, err == nil, "needs busybox (apt-get install busybox-static)")

	dir := t.TempDir()
	// The sandbox's users are not the host's root: open the way to dir.
	for _, d := range []string{filepath.Dir(dir), dir} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	s := &sandbox{dir: dir, bin: filepath.Join(dir, "probe"), file: filepath.Join(dir, "file"), path: "PATH=" + filepath.Dir(busybox)}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	copyFile(t, self, s.bin, 0o755)
	if err := os.WriteFile(s.file, []byte("data\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if setup != nil {
		setup(dir)
	}

	cmd := exec.Command(busybox, "sleep", "100000")
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags: syscall.CLONE_NEWUSER | syscall.CLONE_NEWNS | syscall.CLONE_NEWPID |
			syscall.CLONE_NEWUTS | syscall.CLONE_NEWIPC | syscall.CLONE_NEWNET,
		UidMappings:                []syscall.SysProcIDMap{{ContainerID: 0, HostID: hostIDBase, Size: 65536}},
		GidMappings:                []syscall.SysProcIDMap{{ContainerID: 0, HostID: hostIDBase, Size: 65536}},
		GidMappingsEnableSetgroups: true,
		Credential:                 &syscall.Credential{Uid: 0, Gid: 0},
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start target: %v", err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	s.pid = cmd.Process.Pid
	// Spawn joins the target's namespaces: wait until it has exec'd
	// busybox inside them.
	want := busybox + "\x00sleep\x00100000\x00"
	deadline := time.Now().Add(10 * time.Second)
	for {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", s.pid))
		if err == nil && string(b) == want {
			return s
		}
		if time.Now().After(deadline) {
			t.Fatalf("target %d did not exec %s", s.pid, busybox)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func copyFile(t *testing.T, from, to string, mode os.FileMode) {
	t.Helper()
	src, err := os.Open(from)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	dst, err := os.OpenFile(to, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(dst, src); err != nil {
		dst.Close()
		t.Fatal(err)
	}
	if err := dst.Close(); err != nil {
		t.Fatal(err)
	}
}

// result is what a command did.
type result struct {
	stdout, stderr string
	ws             syscall.WaitStatus
}

func (r result) ok() bool { return r.ws.Exited() && r.ws.ExitStatus() == 0 }

func (r result) String() string {
	return fmt.Sprintf("%v, stdout %q, stderr %q", r.ws, r.stdout, r.stderr)
}

// run runs cfg in the sandbox to its end, or kills it after 30 seconds.
func (s *sandbox) run(t *testing.T, cfg nsexec.ExecConfig) result {
	t.Helper()
	cfg.Pid = s.pid
	if cfg.Env == nil {
		cfg.Env = []string{s.path}
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		outR.Close()
		outW.Close()
		t.Fatal(err)
	}
	helper, child, err := nsexec.Spawn(s.bin, cfg, [3]*os.File{nil, outW, errW})
	outW.Close()
	errW.Close()
	var wg sync.WaitGroup
	var stdout, stderr bytes.Buffer
	for _, c := range []struct {
		r *os.File
		b *bytes.Buffer
	}{{outR, &stdout}, {errR, &stderr}} {
		wg.Go(func() {
			defer c.r.Close()
			_, _ = io.Copy(c.b, c.r)
		})
	}
	if helper > 0 {
		if ws := wait4(t, helper); !ws.Exited() || ws.ExitStatus() != 0 {
			t.Errorf("helper ended with %v, want exit 0", ws)
		}
	}
	if err != nil {
		wg.Wait()
		t.Fatalf("Spawn(%q) = %v", cfg.Argv, err)
	}
	watchdog := time.AfterFunc(30*time.Second, func() { _ = syscall.Kill(child, syscall.SIGKILL) })
	ws := wait4(t, child)
	watchdog.Stop()
	wg.Wait()
	return result{stdout.String(), stderr.String(), ws}
}

// wait4 waits for pid, retrying EINTR.
func wait4(t *testing.T, pid int) syscall.WaitStatus {
	t.Helper()
	var ws syscall.WaitStatus
	for {
		_, err := syscall.Wait4(pid, &ws, 0, nil)
		if err == syscall.EINTR {
			continue
		}
		if err != nil {
			t.Fatalf("wait4(%d) = %v", pid, err)
		}
		return ws
	}
}

func nativeFilter(t *testing.T) []byte {
	t.Helper()
	testenv.Require(t, arches[NativeArch()].nr != nil, "no system call table for "+string(NativeArch()))
	return compile(t, Default(), NativeArch())
}

// TestKernelCommands runs busybox commands with and without the default
// filter, in the ways the keeper can start them.
func TestKernelCommands(t *testing.T) {
	filter := nativeFilter(t)
	s := newSandbox(t, func(dir string) {
		if err := os.Mkdir(filepath.Join(dir, "mnt"), 0o755); err != nil {
			t.Fatal(err)
		}
	})
	mnt := filepath.Join(s.dir, "mnt")
	const eperm = "Operation not permitted"
	tests := []struct {
		name string
		argv []string
		// wantPlain: the command succeeds without the filter.
		// wantOut: what it prints with it ("" to ignore); wantErr: a
		// string its stderr has with the filter ("": it succeeds).
		wantPlain bool
		wantOut   string
		wantErr   string
	}{
		{"ls", []string{"busybox", "ls", "/"}, true, "", ""},
		{"pipeline", []string{"busybox", "sh", "-c", "echo a | busybox cat | busybox tr a b; busybox true & wait"}, true, "b\n", ""},
		{"fork and exec", []string{"busybox", "sh", "-c", "busybox sh -c 'busybox echo $$' > /dev/null && echo ok"}, true, "ok\n", ""},
		{"unshare -U", []string{"busybox", "unshare", "-U", "true"}, true, "", eperm},
		// Other namespaces are the kernel's to allow (with CAP_SYS_ADMIN).
		{"unshare -n -u -i", []string{"busybox", "unshare", "-n", "-u", "-i", "true"}, true, "", ""},
		// busybox mount words EPERM this way.
		{"mount tmpfs", []string{"busybox", "sh", "-c", "busybox mount -t tmpfs x " + mnt + " && busybox umount " + mnt}, true, "", "permission denied"},
	}
	configs := []struct {
		name string
		cfg  nsexec.ExecConfig
	}{
		{"root, all caps, no_new_privs", nsexec.ExecConfig{KeepCaps: allCaps, NoNewPrivs: true}},
		// Without no_new_privs the helper installs the filter before it
		// changes credentials, as the keeper does.
		{"root, all caps", nsexec.ExecConfig{KeepCaps: allCaps}},
	}
	for _, c := range configs {
		for _, tt := range tests {
			t.Run(c.name+"/"+tt.name, func(t *testing.T) {
				cfg := c.cfg
				cfg.Argv = tt.argv
				if plain := s.run(t, cfg); plain.ok() != tt.wantPlain {
					t.Errorf("without a filter: exec %q = %v, want success %v", tt.argv, plain, tt.wantPlain)
				}
				cfg.Seccomp = filter
				got := s.run(t, cfg)
				switch {
				case tt.wantErr == "" && !got.ok(),
					tt.wantErr != "" && (got.ok() || !strings.Contains(got.stderr, tt.wantErr)),
					tt.wantOut != "" && got.stdout != tt.wantOut:
					t.Errorf("with the default filter: exec %q = %v; want stdout %q, stderr with %q (or success)", tt.argv, got, tt.wantOut, tt.wantErr)
				}
			})
		}
	}
	// As the keeper runs commands: a user, Docker's capabilities, no
	// no_new_privs.
	t.Run("user", func(t *testing.T) {
		got := s.run(t, nsexec.ExecConfig{
			UID: 1000, GID: 1000, KeepCaps: nsexec.DefaultCaps, Seccomp: filter,
			Argv: []string{"busybox", "sh", "-c", "busybox id -u; echo a | busybox cat; busybox unshare -U true"},
		})
		if got.stdout != "1000\na\n" || got.ok() || !strings.Contains(got.stderr, eperm) {
			t.Errorf("exec as user 1000 = %v, want stdout %q and unshare failing with %q", got, "1000\na\n", eperm)
		}
	})
}

// probeResults runs the probe in s and parses what it prints.
func (s *sandbox) probeResults(t *testing.T, file string, filter []byte) map[string]syscall.Errno {
	t.Helper()
	r := s.run(t, nsexec.ExecConfig{
		KeepCaps: allCaps, NoNewPrivs: true, Seccomp: filter,
		Argv: []string{s.bin},
		Env:  []string{s.path, probeEnv + "=" + file},
	})
	if !r.ok() {
		t.Fatalf("probe = %v, want exit 0", r)
	}
	got := map[string]syscall.Errno{}
	sc := bufio.NewScanner(strings.NewReader(r.stdout))
	for sc.Scan() {
		name, num, _ := strings.Cut(sc.Text(), " ")
		n, err := strconv.Atoi(num)
		if err != nil {
			t.Fatalf("probe printed %q", sc.Text())
		}
		got[name] = syscall.Errno(n)
	}
	return got
}

// dontCare marks a result that depends on the machine.
const dontCare = syscall.Errno(1 << 30)

// checkProbe compares probe results without and with the filter.
func checkProbe(t *testing.T, plain, filtered map[string]syscall.Errno, want []probeWant) {
	t.Helper()
	for _, w := range want {
		p, ok1 := plain[w.name]
		f, ok2 := filtered[w.name]
		if !ok1 || !ok2 {
			t.Errorf("probe printed nothing for %s", w.name)
			continue
		}
		if w.plain != dontCare && p != w.plain {
			t.Errorf("without a filter: %s = %v (%d), want %v (%d)", w.name, p, p, w.plain, w.plain)
		}
		if f != w.filtered {
			t.Errorf("with the default filter: %s = %v (%d), want %v (%d)", w.name, f, f, w.filtered, w.filtered)
		}
	}
}

type probeWant struct {
	name            string
	plain, filtered syscall.Errno
}

// TestKernelProbe makes single system calls with and without the default
// filter.
func TestKernelProbe(t *testing.T) {
	filter := nativeFilter(t)
	s := newSandbox(t, nil)
	plain := s.probeResults(t, s.file, nil)
	filtered := s.probeResults(t, s.file, filter)
	t.Logf("without a filter: %v", plain)
	t.Logf("with the default filter: %v", filtered)
	checkProbe(t, plain, filtered, []probeWant{
		// An ext4 or tmpfs file knows no XFS ioctl: ENOTTY, unless the
		// filter stops the call first, whatever the high word.
		{"ioctl_swapext", syscall.ENOTTY, syscall.EPERM},
		{"ioctl_swapext_high", syscall.ENOTTY, syscall.EPERM},
		{"ioctl_exchange_range", syscall.ENOTTY, syscall.EPERM},
		{"ioctl_exchange_range_high", syscall.ENOTTY, syscall.EPERM},
		{"ioctl_tcgets", syscall.ENOTTY, syscall.ENOTTY},
		// What the file system makes of them varies; the filter refuses.
		{"ioctl_fiemap", dontCare, syscall.EPERM},
		{"ioctl_getfsmap", dontCare, syscall.EPERM},
		{"ioctl_fibmap", dontCare, syscall.EPERM},
		{"personality_query", 0, 0},
		{"personality_addr_no_randomize", 0, syscall.EPERM},
		{"clone_newuser", syscall.EINVAL, syscall.EPERM},
		{"clone_newuser_high", syscall.EINVAL, syscall.EPERM},
		{"clone3", syscall.EINVAL, syscall.ENOSYS},
		{"unshare_newuser", syscall.EINVAL, syscall.EPERM},
		{"fsopen", 0, syscall.EPERM},
		{"keyctl", dontCare, syscall.EPERM},
		{"io_uring_setup", dontCare, syscall.EPERM},
		{"x32_getpid", dontCare, syscall.EPERM},
		{"getpid", 0, 0},
		{"threads", 0, 0},
		{"exec", 0, 0},
	})
}

// TestKernelXFS checks the ioctl numbers against a real XFS file system:
// without the filter XFS takes the calls (and fails them with EFAULT, for
// the NULL argument), so the numbers are the ones the kernel knows,
// high word or not; with it they fail with EPERM.
func TestKernelXFS(t *testing.T) {
	filter := nativeFilter(t)
	testenv.RequireRoot(t)
	mkfs, err := exec.LookPath("mkfs.xfs")
	testenv.Require(t, err == nil, "needs mkfs.xfs (apt-get install xfsprogs)")
	_, err = os.Stat("/dev/loop-control")
	testenv.Require(t, err == nil, "needs loop devices")

	var file string
	s := newSandbox(t, func(dir string) {
		img := filepath.Join(t.TempDir(), "xfs.img")
		if err := os.WriteFile(img, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Truncate(img, 300<<20); err != nil { // mkfs.xfs's minimum
			t.Fatal(err)
		}
		if out, err := exec.Command(mkfs, "-q", img).CombinedOutput(); err != nil {
			t.Fatalf("mkfs.xfs: %v\n%s", err, out)
		}
		mnt := filepath.Join(dir, "xfs")
		if err := os.Mkdir(mnt, 0o755); err != nil {
			t.Fatal(err)
		}
		if out, err := exec.Command("mount", "-o", "loop", img, mnt).CombinedOutput(); err != nil {
			t.Fatalf("mount -o loop %s: %v\n%s", img, err, out)
		}
		t.Cleanup(func() {
			if err := unix.Unmount(mnt, unix.MNT_DETACH); err != nil {
				t.Errorf("unmount %s: %v", mnt, err)
			}
		})
		file = filepath.Join(mnt, "file")
		if err := os.WriteFile(file, []byte("data\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	})
	plain := s.probeResults(t, file, nil)
	filtered := s.probeResults(t, file, filter)
	checkProbe(t, plain, filtered, []probeWant{
		{"ioctl_swapext", syscall.EFAULT, syscall.EPERM},
		{"ioctl_swapext_high", syscall.EFAULT, syscall.EPERM},
		{"ioctl_exchange_range", syscall.EFAULT, syscall.EPERM},
		{"ioctl_exchange_range_high", syscall.EFAULT, syscall.EPERM},
		{"ioctl_tcgets", syscall.ENOTTY, syscall.ENOTTY},
		// XFS maps blocks: the numbers are the ones it knows (EFAULT for
		// the NULL argument).
		{"ioctl_fiemap", syscall.EFAULT, syscall.EPERM},
		{"ioctl_getfsmap", syscall.EFAULT, syscall.EPERM},
	})
}
