package nsexec

import (
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/dsecproject/dsec/internal/testenv"
)

// forkExec starts a child the test reaps.
func forkExec(argv, env []string, files []uintptr, sys *syscall.SysProcAttr) (int, error) {
	return syscall.ForkExec(argv[0], argv, &syscall.ProcAttr{Env: env, Files: files, Sys: sys})
}

// openSelf opens the test binary, which the helper runs through its
// descriptor: uid 1_200_000_000 may not enter the test's directory.
func openSelf(t *testing.T) *os.File {
	t.Helper()
	f, err := os.Open(self(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

// NewUserNS makes a namespace owned by the sandbox's host uid (not by
// root, whose counts every sandbox would share), with its id map and the
// limits set inside it.
func TestNewUserNS(t *testing.T) {
	testenv.RequireRoot(t)
	const host = 1_200_000_000
	u, err := NewUserNS(openSelf(t), host, 65536, []Limit{{"max_inotify_instances", 7}, {"max_user_namespaces", 0}}, forkExec)
	if err != nil {
		t.Fatalf("NewUserNS = %v", err)
	}
	defer func() {
		u.Close()
		if ws := wait4(t, u.Pid()); !ws.Exited() || ws.ExitStatus() != 0 {
			t.Errorf("helper ended %v after Close, want exit 0", ws)
		}
	}()
	owner, err := unix.IoctlGetUint32(int(u.File().Fd()), unix.NS_GET_OWNER_UID)
	if err != nil || owner != host {
		t.Errorf("owner of the namespace = %d, %v; want %d", owner, err, host)
	}
	m, err := os.ReadFile(fmt.Sprintf("/proc/%d/uid_map", u.Pid()))
	if got := strings.Fields(string(m)); err != nil || strings.Join(got, " ") != fmt.Sprintf("0 %d 65536", host) {
		t.Errorf("uid_map = %q, %v", m, err)
	}
	// A process that joins the namespace sees the limits.
	_, err = os.Stat(busybox)
	testenv.Require(t, err == nil, "needs "+busybox)
	stdout, stderr, ws := run(t, helperSpawner(), ExecConfig{
		Pid:  u.Pid(),
		Argv: []string{busybox, "cat", "/proc/sys/user/max_inotify_instances", "/proc/sys/user/max_user_namespaces"},
		Env:  defaultEnv,
	})
	if ws.ExitStatus() != 0 || stdout != "7\n0\n" {
		t.Errorf("limits seen inside = %q (stderr %q, %v), want 7 and 0", stdout, stderr, ws)
	}
}

func TestNewUserNSBadLimit(t *testing.T) {
	testenv.RequireRoot(t)
	for _, l := range []Limit{{"max_nonsense", 1}, {"../../kernel/x", 1}} {
		u, err := NewUserNS(openSelf(t), 1_200_065_536, 65536, []Limit{l}, forkExec)
		if err == nil {
			u.Close()
			wait4(t, u.Pid())
			t.Errorf("NewUserNS with limit %q = nil error", l.Name)
		}
	}
}
