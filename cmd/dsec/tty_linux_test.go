package main

import (
	"bytes"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/creack/pty"
	"golang.org/x/sys/unix"

	sandboxv1 "github.com/dsecproject/dsec/api/dsec/sandbox/v1"
)

// syncBuffer is a bytes.Buffer safe for one writer and one reader.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// waitFor polls cond for up to 10s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestExecTTY(t *testing.T) {
	f := newFakeAPI()
	addr := startFake(t, f)
	ptm, tty, err := pty.Open()
	if err != nil {
		t.Skipf("no pseudo-terminal: %v", err)
	}
	defer ptm.Close()
	defer tty.Close()
	if err := pty.Setsize(ptm, &pty.Winsize{Rows: 40, Cols: 100}); err != nil {
		t.Fatal(err)
	}
	before, err := unix.IoctlGetTermios(int(tty.Fd()), unix.TCGETS)
	if err != nil {
		t.Fatal(err)
	}

	out := &syncBuffer{}
	type result struct {
		stderr string
		code   int
	}
	done := make(chan result, 1)
	go func() {
		errOut, code := dsecRunIO(t, addr, tty, out, "exec", "-t", sbID, "--", "/bin/sh")
		done <- result{errOut, code}
	}()

	// A keystroke comes back once the session is up.
	if _, err := ptm.Write([]byte("a")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the echo of a keystroke", func() bool { return strings.Contains(out.String(), "a") })
	during, err := unix.IoctlGetTermios(int(tty.Fd()), unix.TCGETS)
	if err != nil {
		t.Fatal(err)
	}
	if during.Lflag&(unix.ICANON|unix.ECHO|unix.ISIG) != 0 {
		t.Errorf("terminal flags during -t = %#x, want ICANON, ECHO and ISIG off (raw mode)", during.Lflag)
	}

	if err := pty.Setsize(ptm, &pty.Winsize{Rows: 50, Cols: 132}); err != nil {
		t.Fatal(err)
	}
	if err := unix.Kill(unix.Getpid(), unix.SIGWINCH); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the resize", func() bool { return len(callsOf[*sandboxv1.ResizeTTYRequest](f)) > 0 })
	if r := callsOf[*sandboxv1.ResizeTTYRequest](f)[0]; r.GetRows() != 50 || r.GetCols() != 132 || r.GetExecId() != "ex-1" {
		t.Errorf("ResizeTTY = %v, want 50x132 of ex-1", r)
	}

	// Ctrl-C is a keystroke for the command, Ctrl-D ends the fake shell.
	if _, err := ptm.Write([]byte("\x03b\x04")); err != nil {
		t.Fatal(err)
	}
	var res result
	select {
	case res = <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("exec -t did not return after the command exited")
	}
	if res.code != 0 || out.String() != "a\x03b\x04" {
		t.Errorf("exec -t = %q, stderr %q, exit %d; want the keystrokes echoed, exit 0", out.String(), res.stderr, res.code)
	}
	execs := callsOf[*sandboxv1.ExecRequest](f)
	if len(execs) != 1 || !execs[0].GetTty() || execs[0].GetRows() != 40 || execs[0].GetCols() != 100 {
		t.Errorf("exec -t sent %v, want tty 40x100", execs)
	}
	after, err := unix.IoctlGetTermios(int(tty.Fd()), unix.TCGETS)
	if err != nil {
		t.Fatal(err)
	}
	if *after != *before {
		t.Errorf("terminal after exec -t = %+v, want it restored to %+v", after, before)
	}
	// The input pump still reads the terminal: closing it ends it.
	tty.Close()
	ptm.Close()
}

func TestExecForwardsSignals(t *testing.T) {
	f := newFakeAPI()
	addr := startFake(t, f)
	out := &syncBuffer{}
	type result struct {
		stderr string
		code   int
	}
	done := make(chan result, 1)
	go func() {
		errOut, code := dsecRunIO(t, addr, strings.NewReader(""), out, "exec", sbID, "--", "sleep", "1000")
		done <- result{errOut, code}
	}()
	// Output comes once dsec handles the signals itself.
	waitFor(t, "output", func() bool { return strings.Contains(out.String(), "sleeping") })
	if err := unix.Kill(unix.Getpid(), unix.SIGINT); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the forwarded signal", func() bool { return len(callsOf[*sandboxv1.SignalRequest](f)) > 0 })
	if sig := callsOf[*sandboxv1.SignalRequest](f)[0]; sig.GetSignal() != 2 || sig.GetExecId() != "ex-1" {
		t.Errorf("forwarded %v, want SIGINT (2) to ex-1", sig)
	}
	if err := unix.Kill(unix.Getpid(), unix.SIGINT); err != nil {
		t.Fatal(err)
	}
	select {
	case res := <-done:
		if res.code != 130 || !strings.Contains(res.stderr, "runs on") {
			t.Errorf("exec after a second Ctrl-C = stderr %q, exit %d; want a note that it runs on, exit 130", res.stderr, res.code)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("exec did not return after a second Ctrl-C")
	}
}
