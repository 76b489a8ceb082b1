package keeper

import (
	"syscall"
	"testing"
	"time"
)

// An exit reaped before a process was made is an older process's of the
// same pid: watch must not hand it to the new one (a create once took a
// stale "exit 0" for the OCI runtime's and read its pid file too early).
func TestReaperIgnoresStaleExits(t *testing.T) {
	r := newReaper()
	defer r.close()
	const pid = 1 << 22 // no such process here
	r.deliver(pid, syscall.WaitStatus(0))
	later := time.Now()
	ch := r.watch(pid, later)
	select {
	case ws := <-ch:
		t.Fatalf("watch(%d, after the exit) = %v at once, want to wait for this process's own exit", pid, ws)
	default:
	}
	r.deliver(pid, syscall.WaitStatus(3<<8))
	if ws := <-ch; ws.ExitStatus() != 3 {
		t.Errorf("watch(%d) delivered %v, want exit 3", pid, ws)
	}

	// An exit reaped after the process was made (it ended before its pid
	// was learned) is its own.
	before := time.Now()
	r.deliver(pid+1, syscall.WaitStatus(7<<8))
	select {
	case ws := <-r.watch(pid+1, before):
		if ws.ExitStatus() != 7 {
			t.Errorf("watch(%d) delivered %v, want exit 7", pid+1, ws)
		}
	case <-time.After(time.Second):
		t.Errorf("watch(%d, before the exit) did not deliver the exit it missed", pid+1)
	}
}

// startProcess registers its waiter before the child can be reaped, and
// drops an older exit of the same pid.
func TestReaperStartProcess(t *testing.T) {
	r := newReaper()
	defer r.close()
	pid, ch, err := r.startProcess([]string{"/bin/sh", "-c", "exit 5"}, nil, []uintptr{0, 1, 2}, &syscall.SysProcAttr{}, "")
	if err != nil {
		t.Fatal(err)
	}
	select {
	case ws := <-ch:
		if ws.ExitStatus() != 5 {
			t.Errorf("process %d ended %v, want exit 5", pid, ws)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("process %d's exit was not delivered", pid)
	}
}
