package adversarial

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/dsecproject/dsec/sdk/go/dsec"
)

// TestTimedOutSessionCommandCannotLookFine: an agent's command in a shell
// session catches the interrupt its timeout sends and exits 0, or makes
// the shell report a chosen status, to pass as a command that ran to the
// end. The result still says timed out, by SIGINT, with no exit code
// (issue 13). Without a timeout the same trap exits 0, so the test can
// tell the two apart.
func TestTimedOutSessionCommandCannotLookFine(t *testing.T) {
	sb := NewSandbox(t, dsec.CreateOptions{Image: "busybox", Memory: 64 << 20})
	ss := sb.Session("agent")
	ctx := Ctx(t, time.Minute)
	for _, cmdline := range []string{
		"trap 'exit 0' INT; sleep 30 & wait",           // the shell itself exits 0 on SIGINT
		"sh -c 'trap \"exit 0\" INT; sleep 30 & wait'", // a child does, the session's shell stays
		"(trap 'exit 7' INT; sleep 30 & wait); exit 0", // a status chosen after the interrupt
	} {
		r, err := ss.Run(ctx, cmdline, dsec.WithTimeout(500*time.Millisecond))
		if err != nil {
			t.Fatalf("%q: %v", cmdline, err)
		}
		if !r.TimedOut || r.ExitCode != 0 || (r.Signal != 2 && r.Signal != 9) {
			t.Errorf("%q with a 500ms timeout = timed out %v, exit %d, signal %d; want timed out by signal 2 (or 9 if its shell had to be killed), no exit code",
				cmdline, r.TimedOut, r.ExitCode, r.Signal)
		}
	}
	// The control: the same trap, no timeout, the interrupt sent by the
	// command itself: it exits 0 and says so.
	r, err := ss.Run(ctx, "sh -c 'trap \"exit 0\" INT; kill -INT $$; sleep 1'")
	if err != nil {
		t.Fatal(err)
	}
	if r.TimedOut || r.ExitCode != 0 || r.Signal != 0 {
		t.Errorf("the trap without a timeout = %+v, want exit 0", r.ExitStatus)
	}
}

// TestNeverFitErrorsHideTheHost: a hostile key asks for sizes no node can
// give (pids beyond the kernel's, memory and disk beyond the machine's):
// each is refused as InvalidArgument at once, and no message names a host
// path (the pids one once carried the cgroup path of the kernel's EINVAL).
func TestNeverFitErrorsHideTheHost(t *testing.T) {
	c := Intruder(t)
	for _, opts := range []dsec.CreateOptions{
		{Image: "busybox", Pids: 1 << 40},
		{Image: "busybox", Pids: 1<<31 - 1},
		{Image: "busybox", Memory: 1 << 50},
		{Image: "busybox", Disk: 1 << 50},
	} {
		start := time.Now()
		sb, err := c.Create(Ctx(t, 30*time.Second), opts)
		if err == nil {
			sb.Delete(Ctx(t, 30*time.Second))
			t.Errorf("create with pids %d, memory %d, disk %d succeeded", opts.Pids, opts.Memory, opts.Disk)
			continue
		}
		if !errors.Is(err, dsec.ErrInvalidArgument) || time.Since(start) > 5*time.Second {
			t.Errorf("create with pids %d, memory %d, disk %d = %v after %v; want InvalidArgument at once", opts.Pids, opts.Memory, opts.Disk, err, time.Since(start))
		}
		for _, leak := range []string{"/sys/", "/proc/", "cgroup", Env(t).StateDir} {
			if strings.Contains(err.Error(), leak) {
				t.Errorf("create with pids %d, memory %d, disk %d: the error %q names %q of the host", opts.Pids, opts.Memory, opts.Disk, err, leak)
			}
		}
	}
}
