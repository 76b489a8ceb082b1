//go:build linux && cgo

package nsexec

import (
	"bytes"
	"crypto/rand"
	"debug/elf"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/creack/pty"
	"github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"
	"golang.org/x/sys/unix"

	"github.com/dsecproject/dsec/internal/errdefs"
	"github.com/dsecproject/dsec/internal/testenv"
)

const (
	busybox        = "/usr/bin/busybox"
	targetHostname = "dsec-target"
	// hostIDBase is where uid and gid 0 of the test sandbox map on the host.
	hostIDBase = 1000000000
	// staticEnv marks a run of the statically linked test binary.
	staticEnv = "DSEC_NSEXEC_STATIC_TEST"
)

func TestMain(m *testing.M) {
	// Commands started by Spawn are reparented to us when their helper
	// exits, as they are to the keeper.
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		fmt.Fprintln(os.Stderr, "PR_SET_CHILD_SUBREAPER:", err)
		os.Exit(1)
	}
	goleak.VerifyTestMain(m)
}

func self(t testing.TB) string {
	t.Helper()
	p, err := os.Executable()
	if err != nil {
		t.Fatalf("os.Executable() = %v", err)
	}
	return p
}

// startTarget starts a process in new user, mount, pid, uts, ipc and net
// namespaces, like a sandbox's init, and returns its host pid.
func startTarget(t testing.TB) int {
	t.Helper()
	testenv.RequireRoot(t)
	_, err := os.Stat(busybox)
	testenv.Require(t, err == nil, "needs "+busybox+" (apt-get install busybox-static)")

	cmd := exec.Command(busybox, "sh", "-c",
		busybox+" hostname "+targetHostname+" && exec "+busybox+" sleep 100000")
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags: syscall.CLONE_NEWUSER | syscall.CLONE_NEWNS | syscall.CLONE_NEWPID |
			syscall.CLONE_NEWUTS | syscall.CLONE_NEWIPC | syscall.CLONE_NEWNET,
		UidMappings:                []syscall.SysProcIDMap{{ContainerID: 0, HostID: hostIDBase, Size: 65536}},
		GidMappings:                []syscall.SysProcIDMap{{ContainerID: 0, HostID: hostIDBase, Size: 65536}},
		GidMappingsEnableSetgroups: true,
		Credential:                 &syscall.Credential{Uid: 0, Gid: 0}, // root inside, not the overflow uid
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start target: %v", err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	pid := cmd.Process.Pid
	want := busybox + "\x00sleep\x00100000\x00"
	waitFor(t, "target to set its hostname and exec sleep", func() bool {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		return err == nil && string(b) == want
	})
	return pid
}

func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// wait4 waits for pid, retrying EINTR.
func wait4(t testing.TB, pid int) syscall.WaitStatus {
	t.Helper()
	ws, _ := wait4Rusage(t, pid)
	return ws
}

// wait4Rusage waits for pid and returns the CPU time it used.
func wait4Rusage(t testing.TB, pid int) (syscall.WaitStatus, time.Duration) {
	t.Helper()
	ws, cpu, err := waitPid(pid)
	if err != nil {
		t.Fatalf("wait4(%d) = %v", pid, err)
	}
	return ws, cpu
}

// waitPid waits for pid and returns the CPU time it used. A command
// started through a zygote becomes our child only when the zygote's worker
// has exited, just after Spawn returns: until then wait4 fails with ECHILD,
// which waitPid retries for a while.
func waitPid(pid int) (syscall.WaitStatus, time.Duration, error) {
	var ws syscall.WaitStatus
	var ru syscall.Rusage
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, err := syscall.Wait4(pid, &ws, 0, &ru)
		switch {
		case err == syscall.EINTR:
			continue
		case err == syscall.ECHILD && time.Now().Before(deadline):
			time.Sleep(100 * time.Microsecond)
			continue
		case err != nil:
			return ws, 0, err
		}
		return ws, time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), nil
	}
}

// reapHelper reaps the helper and checks it exited 0, as it always should.
func reapHelper(t testing.TB, pid int) {
	t.Helper()
	if pid == 0 {
		return
	}
	if ws := wait4(t, pid); !ws.Exited() || ws.ExitStatus() != 0 {
		t.Errorf("helper %d ended with %v, want exit 0", pid, ws)
	}
}

// spawner starts commands by one of the package's two ways: a helper per
// command (Spawn) or a zygote (Zygote.Spawn).
type spawner struct {
	name string
	// spawnEncoded starts an encoded config; a helper is reaped (and
	// checked) before it returns.
	spawnEncoded func(t testing.TB, config []byte, cfg *ExecConfig, stdio [3]*os.File) (int, error)
}

// spawn encodes cfg and starts it.
func (s spawner) spawn(t testing.TB, cfg ExecConfig, stdio [3]*os.File) (int, error) {
	t.Helper()
	config, err := cfg.Encode()
	if err != nil {
		return 0, err
	}
	return s.spawnEncoded(t, config, &cfg, stdio)
}

func helperSpawner() spawner {
	return spawner{"helper", func(t testing.TB, config []byte, cfg *ExecConfig, stdio [3]*os.File) (int, error) {
		t.Helper()
		helper, child, err := spawnEncoded(self(t), config, cfg, stdio)
		reapHelper(t, helper)
		return child, err
	}}
}

func zygoteSpawner(z *Zygote) spawner {
	return spawner{"zygote", func(t testing.TB, config []byte, cfg *ExecConfig, stdio [3]*os.File) (int, error) {
		return z.spawnEncoded(config, cfg, stdio)
	}}
}

// spawners returns both ways, the zygote one started for this test.
func spawners(t testing.TB) []spawner {
	return []spawner{helperSpawner(), zygoteSpawner(startZygote(t))}
}

// forEachSpawner runs f as a subtest for each way of starting commands.
func forEachSpawner(t *testing.T, f func(t *testing.T, sp spawner)) {
	for _, sp := range spawners(t) {
		t.Run(sp.name, func(t *testing.T) { f(t, sp) })
	}
}

// proc is a command started by Spawn whose output the test collects.
type proc struct {
	pid    int
	wg     sync.WaitGroup
	stdout bytes.Buffer
	stderr bytes.Buffer
	waited bool
}

// spawn starts cfg with stdin /dev/null and piped stdout and stderr, reaps
// the helper, and kills the command at the end of the test if it still runs.
func spawn(t testing.TB, sp spawner, cfg ExecConfig) *proc {
	t.Helper()
	p := &proc{}
	outR, outW := pipe(t)
	errR, errW := pipe(t)
	child, err := sp.spawn(t, cfg, [3]*os.File{nil, outW, errW})
	outW.Close()
	errW.Close()
	if err != nil {
		t.Fatalf("Spawn(%q) = %v", cfg.Argv, err)
	}
	p.pid = child
	for _, c := range []struct {
		r *os.File
		b *bytes.Buffer
	}{{outR, &p.stdout}, {errR, &p.stderr}} {
		p.wg.Go(func() {
			defer c.r.Close()
			_, _ = io.Copy(c.b, c.r)
		})
	}
	t.Cleanup(func() {
		if !p.waited {
			_ = syscall.Kill(p.pid, syscall.SIGKILL)
			p.wait(t)
		}
	})
	return p
}

// wait waits for the command and for all of its output.
func (p *proc) wait(t testing.TB) syscall.WaitStatus {
	t.Helper()
	ws := wait4(t, p.pid)
	p.waited = true
	p.wg.Wait()
	return ws
}

func (p *proc) kill(t testing.TB) {
	t.Helper()
	if err := syscall.Kill(p.pid, syscall.SIGKILL); err != nil {
		t.Errorf("kill(%d) = %v", p.pid, err)
	}
	if ws := p.wait(t); ws.Signal() != syscall.SIGKILL {
		t.Errorf("command %d ended with %v, want SIGKILL", p.pid, ws)
	}
}

// run runs cfg to its end.
func run(t testing.TB, sp spawner, cfg ExecConfig) (stdout, stderr string, ws syscall.WaitStatus) {
	t.Helper()
	p := spawn(t, sp, cfg)
	ws = p.wait(t)
	return p.stdout.String(), p.stderr.String(), ws
}

func pipe(t testing.TB) (r, w *os.File) {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	return r, w
}

var defaultEnv = []string{"PATH=/usr/bin:/bin"}

func TestExecInSandbox(t *testing.T) {
	target := startTarget(t)
	tests := []struct {
		name string
		cfg  ExecConfig
		want string
	}{
		{"hostname", ExecConfig{Argv: []string{"busybox", "hostname"}}, targetHostname + "\n"},
		{"root", ExecConfig{Argv: []string{"busybox", "id", "-u"}}, "0\n"},
		{
			"user and groups",
			ExecConfig{UID: 1000, GID: 1001, Groups: []uint32{10, 20}, Argv: []string{"busybox", "sh", "-c", "id -u; id -g; id -G"}},
			"1000\n1001\n1001 10 20\n",
		},
		{"default cwd", ExecConfig{Argv: []string{"busybox", "pwd"}}, "/\n"},
		{"cwd", ExecConfig{Cwd: "/etc", Argv: []string{"busybox", "pwd"}}, "/etc\n"},
		{"argv as given", ExecConfig{Argv: []string{"busybox", "sh", "-c", `printf '[%s]' "$@"`, "zero", "a b", "", "$x"}}, "[a b][][$x]"},
		{
			"env exactly as given",
			ExecConfig{Argv: []string{"busybox", "env"}, Env: []string{"PATH=/usr/bin:/bin", "A=1", "EMPTY=", "SPACE=a b"}},
			"PATH=/usr/bin:/bin\nA=1\nEMPTY=\nSPACE=a b\n",
		},
		{"no env: default PATH", ExecConfig{Argv: []string{"busybox", "env"}, Env: []string{}}, ""},
		{"absolute program", ExecConfig{Argv: []string{busybox, "echo", "hi"}, Env: []string{"PATH=/nonexistent"}}, "hi\n"},
		{"PATH with empty and missing entries", ExecConfig{Argv: []string{"busybox", "echo", "hi"}, Env: []string{"PATH=/nonexistent::/etc/passwd:/bin"}}, "hi\n"},
		// ls's own descriptor for the directory is 3: nothing of the
		// helper's or the zygote's reaches the command.
		{"only stdio descriptors", ExecConfig{Argv: []string{"busybox", "ls", "/proc/self/fd"}}, "0\n1\n2\n3\n"},
	}
	forEachSpawner(t, func(t *testing.T, sp spawner) {
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				cfg := tt.cfg
				cfg.Pid = target
				if cfg.Env == nil {
					cfg.Env = defaultEnv
				}
				stdout, stderr, ws := run(t, sp, cfg)
				if !ws.Exited() || ws.ExitStatus() != 0 || stdout != tt.want {
					t.Errorf("exec %q = %q, %v (stderr %q), want %q, exit 0", cfg.Argv, stdout, ws, stderr, tt.want)
				}
			})
		}
	})
}

func TestExecPidNamespace(t *testing.T) {
	target := startTarget(t)
	forEachSpawner(t, func(t *testing.T, sp spawner) {
		stdout, stderr, ws := run(t, sp, ExecConfig{Pid: target, Argv: []string{"busybox", "sh", "-c", "echo $$"}, Env: defaultEnv})
		pid, err := strconv.Atoi(strings.TrimSpace(stdout))
		// The target's sleep is pid 1 inside; the command comes soon after.
		if err != nil || ws.ExitStatus() != 0 || pid < 2 || pid > 100 {
			t.Errorf("exec echo $$ = %q, %v (stderr %q), want a pid in 2..100", stdout, ws, stderr)
		}
	})
}

// procStatus returns the fields of /proc/<pid>/status.
func procStatus(t testing.TB, pid int) map[string]string {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]string{}
	for line := range strings.Lines(string(b)) {
		k, v, _ := strings.Cut(strings.TrimSuffix(line, "\n"), ":")
		m[k] = strings.TrimSpace(v)
	}
	return m
}

func TestExecSeenFromHost(t *testing.T) {
	target := startTarget(t)
	tests := []struct {
		name string
		cfg  ExecConfig
		want map[string]string
	}{
		{
			"root with default caps",
			ExecConfig{KeepCaps: DefaultCaps},
			map[string]string{
				"Uid":        "1000000000\t1000000000\t1000000000\t1000000000",
				"Gid":        "1000000000\t1000000000\t1000000000\t1000000000",
				"Groups":     "",
				"CapBnd":     fmt.Sprintf("%016x", DefaultCaps),
				"CapEff":     fmt.Sprintf("%016x", DefaultCaps),
				"CapPrm":     fmt.Sprintf("%016x", DefaultCaps),
				"CapInh":     "0000000000000000",
				"NoNewPrivs": "0",
				"Seccomp":    "0",
			},
		},
		{
			"user without caps",
			ExecConfig{UID: 1000, GID: 1000, Groups: []uint32{5}, KeepCaps: 1 << unix.CAP_NET_RAW, NoNewPrivs: true, Seccomp: allowAll()},
			map[string]string{
				"Uid":        "1000001000\t1000001000\t1000001000\t1000001000",
				"Gid":        "1000001000\t1000001000\t1000001000\t1000001000",
				"Groups":     "1000000005",
				"CapBnd":     fmt.Sprintf("%016x", 1<<unix.CAP_NET_RAW),
				"CapEff":     "0000000000000000",
				"CapPrm":     "0000000000000000",
				"NoNewPrivs": "1",
				"Seccomp":    "2",
			},
		},
		{
			"root without caps",
			ExecConfig{KeepCaps: 0},
			map[string]string{"CapBnd": "0000000000000000", "CapEff": "0000000000000000"},
		},
	}
	forEachSpawner(t, func(t *testing.T, sp spawner) {
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				cfg := tt.cfg
				cfg.Pid = target
				cfg.Argv = []string{"busybox", "sleep", "1000"}
				cfg.Env = defaultEnv
				p := spawn(t, sp, cfg)
				defer p.kill(t)

				// The spawn returns once the command's close-on-exec pipe
				// closed, which execve does a moment before it installs the
				// new credentials: look again for up to a second.
				var status, got map[string]string
				var diff string
				for try := 0; try < 50; try++ {
					if try > 0 {
						time.Sleep(20 * time.Millisecond)
					}
					status = procStatus(t, p.pid)
					got = map[string]string{}
					for k := range tt.want {
						got[k] = status[k]
					}
					if diff = cmp.Diff(tt.want, got); diff == "" {
						break
					}
				}
				if diff != "" {
					t.Errorf("/proc/%d/status differs (-want +got):\n%s", p.pid, diff)
				}
				// NSpid: the host pid, then a small pid inside the sandbox.
				nspid := strings.Fields(status["NSpid"])
				if len(nspid) != 2 || nspid[0] != strconv.Itoa(p.pid) || len(nspid[1]) > 2 {
					t.Errorf("NSpid of %d = %q, want [%d <small pid>]", p.pid, nspid, p.pid)
				}
				for _, ns := range []string{"user", "mnt", "pid", "net", "uts", "ipc", "cgroup"} {
					want, err1 := os.Readlink(fmt.Sprintf("/proc/%d/ns/%s", target, ns))
					got, err2 := os.Readlink(fmt.Sprintf("/proc/%d/ns/%s", p.pid, ns))
					if err1 != nil || err2 != nil || got != want {
						t.Errorf("namespace %s of the command = %q (%v), want the target's %q (%v)", ns, got, err2, want, err1)
					}
				}
			})
		}
	})
}

func TestExecExitCodes(t *testing.T) {
	target := startTarget(t)
	dir := sandboxDir(t)
	garbage := filepath.Join(dir, "garbage")
	if err := os.WriteFile(garbage, []byte("\x00\x01\x02 not a program\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name       string
		argv       []string
		env        []string
		wantCode   int
		wantStderr string
	}{
		{"exit code", []string{"busybox", "sh", "-c", "exit 3"}, defaultEnv, 3, ""},
		{"missing command", []string{"no-such-command"}, defaultEnv, 127, "dsec: no-such-command: command not found\n"},
		{"not in the given PATH", []string{"busybox"}, []string{"PATH=/nonexistent"}, 127, "dsec: busybox: command not found\n"},
		{"missing path", []string{"/nonexistent/x"}, defaultEnv, 127, "dsec: /nonexistent/x: no such file or directory\n"},
		{"not executable", []string{"/etc/passwd"}, defaultEnv, 126, "dsec: /etc/passwd: permission denied\n"},
		{"not executable in PATH", []string{"passwd"}, []string{"PATH=/etc"}, 126, "dsec: passwd: permission denied\n"},
		{"exec format error", []string{garbage}, defaultEnv, 126, "dsec: " + garbage + ": exec format error\n"},
		{"directory", []string{"/"}, defaultEnv, 126, "dsec: /: permission denied\n"},
	}
	forEachSpawner(t, func(t *testing.T, sp spawner) {
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				stdout, stderr, ws := run(t, sp, ExecConfig{Pid: target, Argv: tt.argv, Env: tt.env})
				if !ws.Exited() || ws.ExitStatus() != tt.wantCode || stderr != tt.wantStderr {
					t.Errorf("exec %q = %v, stderr %q (stdout %q), want exit %d, stderr %q", tt.argv, ws, stderr, stdout, tt.wantCode, tt.wantStderr)
				}
			})
		}
	})
}

// sandboxDir returns a temporary directory that the test sandbox's users
// can use (their host uids own nothing on the host).
func sandboxDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	for _, d := range []string{filepath.Dir(dir), dir} {
		if err := os.Chmod(d, 0o777); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func TestExecSetupErrors(t *testing.T) {
	target := startTarget(t)
	gone := exec.Command(busybox, "true")
	if err := gone.Run(); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name      string
		cfg       ExecConfig
		wantKind  error
		wantErrno syscall.Errno
		wantMsg   string
	}{
		{"no such cwd", ExecConfig{Pid: target, Cwd: "/nonexistent-dir"}, errdefs.ErrFailedPrecondition, syscall.ENOENT, `"/nonexistent-dir"`},
		{"cwd not a directory", ExecConfig{Pid: target, Cwd: "/etc/passwd"}, errdefs.ErrFailedPrecondition, syscall.ENOTDIR, `"/etc/passwd"`},
		{"cwd not accessible", ExecConfig{Pid: target, UID: 1000, Cwd: "/root"}, errdefs.ErrFailedPrecondition, syscall.EACCES, `"/root"`},
		{"unmapped user", ExecConfig{Pid: target, UID: 70000}, errdefs.ErrInvalidArgument, syscall.EINVAL, "user 70000"},
		{"unmapped group", ExecConfig{Pid: target, GID: 70000}, errdefs.ErrInvalidArgument, syscall.EINVAL, "group 70000"},
		{"sandbox gone", ExecConfig{Pid: gone.Process.Pid}, errdefs.ErrFailedPrecondition, syscall.ESRCH, "not running"},
		{"no such cgroup", ExecConfig{Pid: target, CgroupProcs: []string{"/nonexistent/cgroup.procs"}}, errdefs.ErrInternal, syscall.ENOENT, "/nonexistent/cgroup.procs"},
	}
	forEachSpawner(t, func(t *testing.T, sp spawner) {
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				cfg := tt.cfg
				cfg.Argv = []string{"busybox", "true"}
				cfg.Env = defaultEnv
				child, err := sp.spawn(t, cfg, [3]*os.File{})
				var he *HelperError
				if !errors.As(err, &he) || errdefs.Kind(err) != tt.wantKind || !errors.Is(err, tt.wantErrno) ||
					!strings.Contains(err.Error(), tt.wantMsg) || child != 0 {
					t.Fatalf("Spawn(%+v) = %d, %v, want a *HelperError of kind %v, errno %v, with %q", cfg, child, err, tt.wantKind, tt.wantErrno, tt.wantMsg)
				}
			})
		}
	})

	t.Run("invalid config", func(t *testing.T) {
		helper, _, err := Spawn(self(t), ExecConfig{Pid: target}, [3]*os.File{})
		if helper != 0 || !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("Spawn(no argv) = %d, %v, want 0, %v", helper, err, errdefs.ErrInvalidArgument)
		}
		z := startZygote(t)
		child, err := z.Spawn(ExecConfig{Pid: target}, [3]*os.File{})
		if child != 0 || !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("Zygote.Spawn(no argv) = %d, %v, want 0, %v", child, err, errdefs.ErrInvalidArgument)
		}
	})
}

// TestHelperRejectsBadConfig sends the configs DecodeExecConfig rejects to
// the helper's own decoder, which must reject them too, before it acts.
// The zygote turns away a config that is too large before its worker sees
// it.
func TestHelperRejectsBadConfig(t *testing.T) {
	forEachSpawner(t, func(t *testing.T, sp spawner) {
		for _, tt := range badConfigs {
			t.Run(tt.name, func(t *testing.T) {
				child, err := sp.spawnEncoded(t, tt.in, &ExecConfig{}, [3]*os.File{})
				var he *HelperError
				if !errors.As(err, &he) || !(strings.HasPrefix(he.Step, "config") || he.Step == "zygote request") ||
					(he.Errno != syscall.EINVAL && he.Errno != syscall.EFBIG) {
					t.Errorf("helper given config %s = %d, %v, want a config error", tt.name, child, err)
				}
			})
		}
	})
}

// testCgroup makes a cgroup under root for this test and returns its
// cgroup.procs file; it is removed when the test ends.
func testCgroup(t *testing.T, root string) string {
	t.Helper()
	_, err := os.Stat(filepath.Join(root, "cgroup.procs"))
	testenv.Require(t, err == nil, "needs the cgroup hierarchy "+root)
	var b [6]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(root, "dsec-test-"+hex.EncodeToString(b[:]))
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := os.Remove(dir); err != nil {
			t.Errorf("remove cgroup: %v", err)
		}
	})
	return filepath.Join(dir, "cgroup.procs")
}

func TestExecJoinsCgroups(t *testing.T) {
	target := startTarget(t)
	pids := testCgroup(t, "/sys/fs/cgroup/pids")
	unified := testCgroup(t, "/sys/fs/cgroup/unified")

	forEachSpawner(t, func(t *testing.T, sp spawner) {
		p := spawn(t, sp, ExecConfig{Pid: target, CgroupProcs: []string{pids, unified}, Argv: []string{"busybox", "sleep", "1000"}, Env: defaultEnv})
		defer p.kill(t)
		for _, procs := range []string{pids, unified} {
			// A zygote's worker is in the cgroup until it has exited,
			// just after Spawn returns.
			var got []string
			deadline := time.Now().Add(10 * time.Second)
			for {
				b, err := os.ReadFile(procs)
				if err != nil {
					t.Fatal(err)
				}
				got = strings.Fields(string(b))
				if len(got) < 2 || time.Now().After(deadline) {
					break
				}
				time.Sleep(time.Millisecond)
			}
			if !cmp.Equal(got, []string{strconv.Itoa(p.pid)}) {
				t.Errorf("%s = %q, want [%d]", procs, got, p.pid)
			}
		}
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", p.pid))
		if err != nil {
			t.Fatal(err)
		}
		want := ":pids:/" + filepath.Base(filepath.Dir(pids)) + "\n"
		if !strings.Contains(string(b), want) {
			t.Errorf("/proc/%d/cgroup = %q, want a line ending %q", p.pid, b, want)
		}
	})
}

// sockFilter encodes one struct sock_filter in the host's byte order.
func sockFilter(code uint16, jt, jf uint8, k uint32) []byte {
	b := binary.NativeEndian.AppendUint16(nil, code)
	b = append(b, jt, jf)
	return binary.NativeEndian.AppendUint32(b, k)
}

func allowAll() []byte {
	return sockFilter(unix.BPF_RET|unix.BPF_K, 0, 0, unix.SECCOMP_RET_ALLOW)
}

// denyMkdir is a seccomp filter that makes mkdir and mkdirat fail with
// EPERM on x86_64 and allows everything else.
func denyMkdir() []byte {
	return slices.Concat(
		sockFilter(unix.BPF_LD|unix.BPF_W|unix.BPF_ABS, 0, 0, 4), // seccomp_data.arch
		sockFilter(unix.BPF_JMP|unix.BPF_JEQ|unix.BPF_K, 0, 3, unix.AUDIT_ARCH_X86_64),
		sockFilter(unix.BPF_LD|unix.BPF_W|unix.BPF_ABS, 0, 0, 0), // seccomp_data.nr
		sockFilter(unix.BPF_JMP|unix.BPF_JEQ|unix.BPF_K, 2, 0, unix.SYS_MKDIR),
		sockFilter(unix.BPF_JMP|unix.BPF_JEQ|unix.BPF_K, 1, 0, unix.SYS_MKDIRAT),
		sockFilter(unix.BPF_RET|unix.BPF_K, 0, 0, unix.SECCOMP_RET_ALLOW),
		sockFilter(unix.BPF_RET|unix.BPF_K, 0, 0, unix.SECCOMP_RET_ERRNO|uint32(unix.EPERM)),
	)
}

func TestExecSeccomp(t *testing.T) {
	testenv.Require(t, runtime.GOARCH == "amd64", "the test's seccomp filter is written for x86_64")
	target := startTarget(t)
	dir := sandboxDir(t)
	tests := []struct {
		name     string
		cfg      ExecConfig
		wantCode int
		wantErr  string
	}{
		{"no filter", ExecConfig{}, 0, ""},
		{"filter with no_new_privs", ExecConfig{Seccomp: denyMkdir(), NoNewPrivs: true}, 1, "Operation not permitted"},
		// Without no_new_privs the filter goes on before setresuid.
		{"filter, user, no no_new_privs", ExecConfig{Seccomp: denyMkdir(), UID: 1000, GID: 1000}, 1, "Operation not permitted"},
		{"filter, root, no no_new_privs", ExecConfig{Seccomp: denyMkdir()}, 1, "Operation not permitted"},
	}
	forEachSpawner(t, func(t *testing.T, sp spawner) {
		for i, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				sub := filepath.Join(dir, sp.name+strconv.Itoa(i))
				cfg := tt.cfg
				cfg.Pid = target
				cfg.Argv = []string{"busybox", "mkdir", sub}
				cfg.Env = defaultEnv
				_, stderr, ws := run(t, sp, cfg)
				_, err := os.Stat(sub)
				if ws.ExitStatus() != tt.wantCode || !strings.Contains(stderr, tt.wantErr) || (err == nil) != (tt.wantCode == 0) {
					t.Errorf("exec mkdir with %s = %v, stderr %q, stat: %v; want exit %d, stderr with %q", tt.name, ws, stderr, err, tt.wantCode, tt.wantErr)
				}
			})
		}
	})
}

func TestExecTTY(t *testing.T) {
	target := startTarget(t)
	tests := []struct {
		name     string
		tty      bool
		wantCode int
		wantOut  string
	}{
		{"controlling terminal", true, 0, "hello\r\n"},
		{"no controlling terminal", false, 1, "No such device or address"},
	}
	forEachSpawner(t, func(t *testing.T, sp spawner) {
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				master, slave, err := pty.Open()
				if err != nil {
					t.Fatal(err)
				}
				defer master.Close()
				var out bytes.Buffer
				var wg sync.WaitGroup
				wg.Go(func() { _, _ = io.Copy(&out, master) }) // ends with EIO when the last slave closes

				cfg := ExecConfig{
					Pid:    target,
					Argv:   []string{"busybox", "sh", "-c", "echo hello >/dev/tty"},
					Env:    defaultEnv,
					Setsid: true,
					TTY:    tt.tty,
				}
				child, err := sp.spawn(t, cfg, [3]*os.File{slave, slave, slave})
				slave.Close()
				if err != nil {
					master.Close()
					wg.Wait()
					t.Fatalf("Spawn = %v", err)
				}
				ws := wait4(t, child)
				wg.Wait()
				if ws.ExitStatus() != tt.wantCode || !strings.Contains(out.String(), tt.wantOut) {
					t.Errorf("exec echo >/dev/tty (tty %v) = %v, output %q, want exit %d, output with %q", tt.tty, ws, out.String(), tt.wantCode, tt.wantOut)
				}
			})
		}
	})
}

// procState returns the state letter of a process, or 0 when it is gone.
func procState(pid int) byte {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// pid (comm) state ...; comm may contain spaces and parentheses.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+2 >= len(b) {
		return 0
	}
	return b[i+2]
}

// childrenOf lists the pids whose parent is ppid.
func childrenOf(t *testing.T, ppid int) []int {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var kids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue
		}
		i := bytes.LastIndexByte(b, ')')
		fields := strings.Fields(string(b[i+1:]))
		if len(fields) > 1 && fields[1] == strconv.Itoa(ppid) {
			kids = append(kids, pid)
		}
	}
	return kids
}

// filterPipe returns the read end of a pipe holding filter, as the init
// reads it.
func filterPipe(t *testing.T, filter []byte) *os.File {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write(filter); err != nil {
		t.Fatal(err)
	}
	w.Close()
	return r
}

// startInit starts this binary as a sandbox init with cloneflags and
// returns its pid once it runs as init.
func startInit(t *testing.T, cloneflags uintptr) int {
	t.Helper()
	return startInitAs(t, self(t), &syscall.SysProcAttr{Cloneflags: cloneflags})
}

// startInitAs starts bin as a sandbox init with the process attributes sys
// and returns its pid once it runs as init.
func startInitAs(t *testing.T, bin string, sys *syscall.SysProcAttr) int {
	t.Helper()
	extra, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer extra.Close()
	filter := filterPipe(t, denyMkdir())
	defer filter.Close()
	cmd := exec.Command(bin)
	cmd.Env = InitEnv()
	cmd.ExtraFiles = []*os.File{extra, filter} // fd 3 init must close, fd 4 its filter
	cmd.SysProcAttr = sys
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	pid := cmd.Process.Pid
	// It names itself, then closes fds and blocks signals, then waits.
	waitFor(t, "init to start waiting for signals", func() bool {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/wchan", pid))
		return err == nil && procStatus(t, pid)["Name"] == "dsec-init" && strings.Contains(string(b), "sigtimedwait")
	})
	return pid
}

func TestInitIgnoresSignals(t *testing.T) {
	testenv.RequireRoot(t)
	// Not pid 1 of a namespace here, so the kernel does not protect it:
	// only init's own blocking of signals keeps it alive.
	initPid := startInit(t, 0)

	entries, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", initPid))
	if err != nil {
		t.Fatal(err)
	}
	var fds []string
	for _, e := range entries {
		fds = append(fds, e.Name())
	}
	if want := []string{"0", "1", "2"}; !cmp.Equal(fds, want) {
		t.Errorf("fds of init = %q, want %q", fds, want)
	}
	t.Logf("init: VmRSS %s", procStatus(t, initPid)["VmRSS"])

	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGUSR1, syscall.SIGPIPE, syscall.SIGCHLD} {
		if err := syscall.Kill(initPid, sig); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(100 * time.Millisecond)
	if st := procState(initPid); st != 'S' {
		t.Fatalf("init after SIGTERM and others: state %q, want 'S' (sleeping)", st)
	}
}

// The init runs under its filter, is not dumpable (nothing in the sandbox
// may ptrace it or open its /proc files) and holds no descriptor of its
// starter: fds 0-2 are /dev/null, whatever it was started with.
func TestInitIsHardened(t *testing.T) {
	testenv.RequireRoot(t)
	testenv.Require(t, runtime.GOARCH == "amd64", "the test's seccomp filter is written for x86_64")
	initPid := startInit(t, 0)
	st := procStatus(t, initPid)
	if st["Seccomp"] != "2" || st["Seccomp_filters"] != "1" || st["NoNewPrivs"] != "1" {
		t.Errorf("init's Seccomp %q, filters %q, NoNewPrivs %q; want 2, 1, 1", st["Seccomp"], st["Seccomp_filters"], st["NoNewPrivs"])
	}
	for _, fd := range []string{"0", "1", "2"} {
		target, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", initPid, fd))
		if err != nil || target != "/dev/null" {
			t.Errorf("init's fd %s = %q, %v; want /dev/null", fd, target, err)
		}
	}
}

// A non-dumpable process's /proc files belong to root whatever its uid:
// an init running as uid 1000 that a process of uid 1000 could ptrace
// would show 1000.
func TestInitNotDumpable(t *testing.T) {
	testenv.RequireRoot(t)
	pid := startInitAs(t, publicSelf(t), &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 1000, Gid: 1000}})
	var st syscall.Stat_t
	if err := syscall.Stat(fmt.Sprintf("/proc/%d/mem", pid), &st); err != nil {
		t.Fatal(err)
	}
	if st.Uid != 0 {
		t.Errorf("/proc/%d/mem of an init running as uid 1000 belongs to uid %d, want 0 (not dumpable)", pid, st.Uid)
	}
}

// publicSelf returns a copy of the test binary that any user may run
// (the test binary's own directory is root's).
func publicSelf(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "nsexec-bin-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	bin := filepath.Join(dir, "nsexec.test")
	data, err := os.ReadFile(self(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, data, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return bin
}

// An init without a filter does not run.
func TestInitRefusesWithoutFilter(t *testing.T) {
	for name, filter := range map[string][]byte{"none": nil, "partial instruction": {1, 2, 3}} {
		t.Run(name, func(t *testing.T) {
			var extra []*os.File
			if filter != nil {
				null, _ := os.Open(os.DevNull)
				defer null.Close()
				f := filterPipe(t, filter)
				defer f.Close()
				extra = []*os.File{null, f}
			}
			cmd := exec.Command(self(t))
			cmd.Env = InitEnv()
			cmd.ExtraFiles = extra
			out, err := cmd.CombinedOutput()
			if err == nil || !strings.Contains(string(out), "seccomp filter") {
				t.Errorf("init without a usable filter = %v, %q; want exit 1 naming the filter", err, out)
			}
		})
	}
}

func TestInitReapsOrphans(t *testing.T) {
	testenv.RequireRoot(t)
	_, err := os.Stat(busybox)
	testenv.Require(t, err == nil, "needs "+busybox)
	initPid := startInit(t, syscall.CLONE_NEWPID)

	// Orphan a process inside init's pid namespace: it becomes init's child,
	// and when it exits init must reap it.
	stdout, stderr, ws := run(t, helperSpawner(), ExecConfig{
		Pid:  initPid,
		Argv: []string{busybox, "sh", "-c", busybox + " sleep 1000 </dev/null >/dev/null 2>&1 & echo $!"},
		Env:  defaultEnv,
	})
	if ws.ExitStatus() != 0 {
		t.Fatalf("exec sleep & = %v, stderr %q", ws, stderr)
	}
	kids := childrenOf(t, initPid)
	if len(kids) != 1 {
		t.Fatalf("children of init = %v, want the orphaned sleep", kids)
	}
	orphan := kids[0]
	if nspid := strings.Fields(procStatus(t, orphan)["NSpid"]); len(nspid) != 2 || nspid[1]+"\n" != stdout {
		t.Errorf("NSpid of init's child %d = %q, want [%d %s]", orphan, nspid, orphan, strings.TrimSpace(stdout))
	}
	if err := syscall.Kill(orphan, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "init to reap its child", func() bool { return procState(orphan) == 0 })
	if st := procState(initPid); st != 'S' {
		t.Errorf("init after reaping: state %q, want 'S'", st)
	}
}

// TestStaticBinary builds this test binary the way dsec is built for
// sandboxes (static, glibc) and runs the exec, zygote and init tests with
// it.
func TestStaticBinary(t *testing.T) {
	if os.Getenv(staticEnv) != "" {
		t.Skip("already the static binary")
	}
	if testing.Short() {
		t.Skip("builds a static binary; skipped with -short")
	}
	testenv.RequireRoot(t)
	gotool, err := exec.LookPath("go")
	testenv.Require(t, err == nil, "needs the go tool")

	bin := filepath.Join(t.TempDir(), "nsexec.static.test")
	build := exec.Command(gotool, "test", "-c", "-o", bin, "-tags", "netgo,osusergo",
		"-ldflags", "-linkmode external -extldflags -static", ".")
	build.Env = append(os.Environ(), "CGO_ENABLED=1")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go test -c (static) = %v\n%s", err, out)
	}
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Errorf("%s has an ELF interpreter, want a static binary", bin)
		}
	}
	f.Close()

	cmd := exec.Command(bin, "-test.run", "^(TestExecInSandbox|TestExecExitCodes|TestInitIgnoresSignals|TestInitReapsOrphans|TestZygoteProcess|TestZygoteMalformedRequests)$", "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), staticEnv+"=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("static test binary: %v\n%s", err, out)
	}
	var passed []string
	for line := range strings.Lines(string(out)) {
		if name, ok := strings.CutPrefix(line, "--- PASS: "); ok {
			passed = append(passed, strings.Fields(name)[0])
		}
	}
	for _, want := range []string{"TestExecInSandbox", "TestExecExitCodes", "TestInitIgnoresSignals", "TestInitReapsOrphans", "TestZygoteProcess", "TestZygoteMalformedRequests"} {
		if !slices.Contains(passed, want) {
			t.Errorf("static test binary did not pass %s:\n%s", want, out)
		}
	}
}

func TestParseStatus(t *testing.T) {
	cfg := &ExecConfig{Pid: 7, UID: 1000, GID: 1000}
	tests := []struct {
		in        string
		wantPid   int
		wantKind  error
		wantErrno syscall.Errno
		wantStep  string
	}{
		{"ok 123\n", 123, nil, 0, ""},
		{"err 2 chdir: /a b: c\n", 0, errdefs.ErrFailedPrecondition, syscall.ENOENT, "chdir"},
		{"err 22 setresuid: 1000\n", 0, errdefs.ErrInvalidArgument, syscall.EINVAL, "setresuid"},
		{"err 11 fork: \n", 0, errdefs.ErrResourceExhausted, syscall.EAGAIN, "fork"},
		{"err 1 setns: 7\n", 0, errdefs.ErrInternal, syscall.EPERM, "setns"},
		{"err 7 exec: x\n", 0, errdefs.ErrInvalidArgument, syscall.E2BIG, "exec"},
		{"", 0, errdefs.ErrInternal, 0, ""},
		{"ok 123", 0, errdefs.ErrInternal, 0, ""},
		{"ok -1\n", 0, errdefs.ErrInternal, 0, ""},
		{"ok 0\n", 0, errdefs.ErrInternal, 0, ""},
		{"ok 1234567890\n", 0, errdefs.ErrInternal, 0, ""},
		{"err x chdir: /\n", 0, errdefs.ErrInternal, 0, ""},
		{"what\n", 0, errdefs.ErrInternal, 0, ""},
	}
	for _, tt := range tests {
		pid, err := parseStatus([]byte(tt.in), cfg)
		if pid != tt.wantPid || errdefs.Kind(err) != tt.wantKind {
			t.Errorf("parseStatus(%q) = %d, %v, want %d, kind %v", tt.in, pid, err, tt.wantPid, tt.wantKind)
		}
		var he *HelperError
		if tt.wantStep != "" && (!errors.As(err, &he) || he.Step != tt.wantStep || he.Errno != tt.wantErrno) {
			t.Errorf("parseStatus(%q) = %#v, want a *HelperError of step %q, errno %v", tt.in, err, tt.wantStep, tt.wantErrno)
		}
	}
}

// BenchmarkSpawnTrue measures one exec of `true` in a sandbox, from Spawn
// to the command's exit, and reports the median too.
func BenchmarkSpawnTrue(b *testing.B) {
	target := startTarget(b)
	bin := self(b)
	cfg := ExecConfig{Pid: target, Argv: []string{"true"}, Env: defaultEnv, KeepCaps: DefaultCaps}
	times := make([]time.Duration, 0, b.N)
	var cpu time.Duration
	for b.Loop() {
		start := time.Now()
		helper, child, err := Spawn(bin, cfg, [3]*os.File{})
		if err != nil {
			b.Fatal(err)
		}
		ws, helperCPU := wait4Rusage(b, helper)
		if ws.ExitStatus() != 0 {
			b.Fatalf("helper = %v", ws)
		}
		ws, childCPU := wait4Rusage(b, child)
		if ws.ExitStatus() != 0 {
			b.Fatalf("true = %v", ws)
		}
		times = append(times, time.Since(start))
		cpu += helperCPU + childCPU
	}
	slices.Sort(times)
	b.ReportMetric(float64(times[len(times)/2].Microseconds()), "median-µs")
	b.ReportMetric(float64(times[len(times)*9/10].Microseconds()), "p90-µs")
	b.ReportMetric(float64(cpu.Microseconds())/float64(len(times)), "helper+child-cpu-µs/op")
}

// BenchmarkForkExecTrue is the baseline for BenchmarkSpawnTrue: a plain
// fork and exec of true on the host, and its exit.
func BenchmarkForkExecTrue(b *testing.B) {
	testenv.RequireRoot(b)
	prog, err := exec.LookPath("true")
	if err != nil {
		b.Skip("no true in PATH")
	}
	times := make([]time.Duration, 0, b.N)
	var cpu time.Duration
	for b.Loop() {
		start := time.Now()
		pid, err := syscall.ForkExec(prog, []string{"true"}, &syscall.ProcAttr{Env: defaultEnv})
		if err != nil {
			b.Fatal(err)
		}
		ws, childCPU := wait4Rusage(b, pid)
		if ws.ExitStatus() != 0 {
			b.Fatalf("true = %v", ws)
		}
		times = append(times, time.Since(start))
		cpu += childCPU
	}
	slices.Sort(times)
	b.ReportMetric(float64(times[len(times)/2].Microseconds()), "median-µs")
	b.ReportMetric(float64(times[len(times)*9/10].Microseconds()), "p90-µs")
	b.ReportMetric(float64(cpu.Microseconds())/float64(len(times)), "helper+child-cpu-µs/op")
}
