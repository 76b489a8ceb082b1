package adversarial

import (
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/dsecproject/dsec/sdk/go/dsec"
)

// TestHostProcessesInvisible looks for processes outside the sandbox from
// inside: /proc lists only the sandbox's own, and ptrace and kill of the
// host's processes (this test, its parent) fail with ESRCH, as for a pid
// that does not exist. Protection: each sandbox's own pid namespace.
func TestHostProcessesInvisible(t *testing.T) {
	Env(t)
	t.Parallel()
	sb := Shared(t)
	InstallProbe(t, sb)
	r := MustSh(t, sb, "ls /proc | grep -c '^[0-9]'; cat /proc/1/cmdline | tr '\\0' ' '")
	lines := strings.SplitN(r, "\n", 2)
	if n := atoi(lines[0]); n < 1 || n > 50 {
		t.Errorf("processes in a sandbox's /proc = %s, want only the sandbox's few", lines[0])
	}
	self, parent := strconv.Itoa(os.Getpid()), strconv.Itoa(os.Getppid())
	want := map[string]string{"ptrace:" + self: "ESRCH", "kill:" + self: "ESRCH", "ptrace:" + parent: "ESRCH", "kill:" + parent: "ESRCH"}
	if d := cmp.Diff(want, probe(t, sb, "ptrace", self, parent)); d != "" {
		t.Errorf("ptrace and kill of host pids from a sandbox (-want +got):\n%s", d)
	}
}

// TestKillAll sends SIGKILL to every process it may (kill -9 -1) as root
// in a sandbox, and checks the host, the platform and another sandbox's
// running command survive, and the sandbox itself still takes commands.
// Protection: the pid namespace (kill -1 reaches only the sandbox's
// processes, and its init ignores signals from inside).
func TestKillAll(t *testing.T) {
	Env(t)
	t.Parallel()
	other := NewSandbox(t, dsec.CreateOptions{})
	ctx := Ctx(t, time.Minute)
	x, err := other.ExecDetached(ctx, dsec.ExecRequest{Shell: "sleep 30; echo survived", Timeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	sb := NewSandbox(t, dsec.CreateOptions{})
	_ = Sh(t, sb, "kill -9 -1; sleep 0.2")
	HostAlive(t)
	if r := Sh(t, sb, "echo alive"); r.Stdout != "alive\n" {
		t.Errorf("exec after kill -9 -1 = %q, %q, %+v; want alive", r.Stdout, r.Stderr, r.ExitStatus)
	}
	execs, err := other.ListExecs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range execs {
		if e.ID == x && !e.Running {
			t.Errorf("another sandbox's command after kill -9 -1 = %+v, want still running", e.Exit)
		}
	}
	if err := other.Signal(ctx, x, 9); err != nil {
		t.Errorf("Signal(%s) = %v", x, err)
	}
}

// TestOtherSandboxesInvisible runs a marked command in one sandbox and
// checks another sees no trace of it: not in ps, not in /proc/*/cmdline,
// and no way to its files through /proc/<pid>/root. Protection: pid and
// mount namespaces per sandbox.
func TestOtherSandboxesInvisible(t *testing.T) {
	Env(t)
	t.Parallel()
	a, b := NewSandbox(t, dsec.CreateOptions{}), Shared(t)
	ctx := Ctx(t, time.Minute)
	MustSh(t, a, "echo a-private > /tmp/a-private")
	x, err := a.ExecDetached(ctx, dsec.ExecRequest{Shell: "exec sleep 1234", Timeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Signal(t.Context(), x, 9) })
	MustSh(t, a, "for i in $(seq 50); do ps | grep -q '[s]leep 1234' && exit 0; sleep 0.1; done; exit 1")
	if r := Sh(t, b, "ps -o args | grep '[s]leep 1234'; cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' ' ' | grep -o 'sleep 12[3]4'; cat /proc/[0-9]*/root/tmp/a-private 2>/dev/null"); r.Stdout != "" {
		t.Errorf("another sandbox's process and files seen from this one: %q", r.Stdout)
	}
}
