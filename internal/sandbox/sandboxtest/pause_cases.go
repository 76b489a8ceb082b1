package sandboxtest

import (
	"context"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/dsecproject/dsec/internal/errdefs"
	"github.com/dsecproject/dsec/internal/sandbox"
)

func pauseCases() []Case {
	return []Case{
		{Name: "PauseStopsAndResumeContinues", Needs: []sandbox.Capability{sandbox.CapPause}, Run: testPauseResume},
		{Name: "PausedExecTimeoutWaits", Needs: []sandbox.Capability{sandbox.CapPause}, Run: testPausedTimeout},
	}
}

// counterScript writes a growing number to /tmp/n every 20 ms.
const counterScript = "i=0; while :; do i=$((i+1)); echo $i > /tmp/n.tmp; mv /tmp/n.tmp /tmp/n; sleep 0.02; done"

// readCounter reads /tmp/n through the file API, which works on a paused
// sandbox (no process of it runs the read).
func readCounter(t *testing.T, f *Fixture, id string) string {
	t.Helper()
	var s string
	for range 50 {
		r, _, err := f.Backend.ReadFile(ctxFor(t), id, "/tmp/n")
		if err == nil {
			b, rerr := io.ReadAll(r)
			r.Close()
			if s = strings.TrimSpace(string(b)); rerr == nil && s != "" {
				return s
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("no counter in /tmp/n of %s (last %q)", id, s)
	return ""
}

func paused(t *testing.T, f *Fixture, id string) bool {
	t.Helper()
	st, err := f.Backend.Status(ctxFor(t), id)
	if err != nil {
		t.Fatalf("Status(%s) = %v", id, err)
	}
	return st.Paused
}

// testPauseResume: a paused sandbox's processes do not run (a counter
// stands still), it says so in Status and List, execs are refused, its
// files can be read, pausing it again changes nothing; resumed, the
// counter goes on, the command that ran it still runs, and resuming
// again changes nothing. With restart, the pause survives a reopened
// backend.
func testPauseResume(t *testing.T, f *Fixture) {
	ctx := ctxFor(t)
	p := f.Backend.(sandbox.Pauser)
	id := create(t, f, sandbox.Resources{})
	counter := start(t, f, id, sh(counterScript))
	readCounter(t, f, id)
	if _, err := p.Pause(ctx, id); err != nil {
		t.Fatalf("Pause(%s) = %v", id, err)
	}
	if !paused(t, f, id) {
		t.Errorf("Status(%s).Paused after Pause = false", id)
	}
	sts, err := f.Backend.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, st := range sts {
		if st.ID == id && (!st.Paused || st.State != sandbox.StateRunning) {
			t.Errorf("List entry of the paused sandbox = %+v, want running and paused", st)
		}
	}
	a := readCounter(t, f, id)
	time.Sleep(300 * time.Millisecond)
	if b := readCounter(t, f, id); b != a {
		t.Errorf("counter while paused went from %s to %s", a, b)
	}
	if _, err := p.Pause(ctx, id); err != nil || !paused(t, f, id) {
		t.Errorf("Pause of a paused sandbox = %v (paused %v), want nil and still paused", err, paused(t, f, id))
	}
	refused := sh("true")
	refused.ID = "while-paused"
	err = f.Backend.StartExec(ctx, id, refused)
	if !errdefs.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("StartExec on a paused sandbox = %v, want FailedPrecondition", err)
	}
	if f.Reopen != nil && sandbox.Has(f.Backend, sandbox.CapRestart) {
		f.Backend = f.Reopen(t)
		p = f.Backend.(sandbox.Pauser)
		if !paused(t, f, id) {
			t.Errorf("Status(%s).Paused after the backend reopened = false", id)
		}
		if b := readCounter(t, f, id); b != a {
			t.Errorf("counter after the backend reopened went from %s to %s", a, b)
		}
	}
	if _, err := p.Resume(ctx, id); err != nil {
		t.Fatalf("Resume(%s) = %v", id, err)
	}
	if paused(t, f, id) {
		t.Errorf("Status(%s).Paused after Resume = true", id)
	}
	deadline := time.Now().Add(5 * time.Second)
	for readCounter(t, f, id) == a && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if b := readCounter(t, f, id); b == a {
		t.Errorf("counter after Resume stays at %s", a)
	}
	if _, err := p.Resume(ctx, id); err != nil || paused(t, f, id) {
		t.Errorf("Resume of a running sandbox = %v, want nil and running", err)
	}
	execs, err := f.Backend.ListExecs(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range execs {
		if e.ID == counter && !e.Running {
			t.Errorf("the counter's exec after the pause = %+v, want it running", e)
		}
	}
	if r := Exec(t, f, id, sh("echo after")); r.Stdout != "after\n" {
		t.Errorf("exec after Resume = %+v", r)
	}
	// Deleted while paused: gone, and pausing it again is NotFound.
	if _, err := p.Pause(ctx, id); err != nil {
		t.Fatal(err)
	}
	if err := f.Backend.Delete(ctx, id); err != nil {
		t.Fatalf("Delete of a paused sandbox = %v", err)
	}
	if _, err := p.Pause(ctx, id); !errdefs.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Pause of a deleted sandbox = %v, want NotFound", err)
	}
	if _, err := p.Resume(ctx, id); !errdefs.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Resume of a deleted sandbox = %v, want NotFound", err)
	}
}

// testPausedTimeout: time paused does not count against an exec's
// timeout: a command of 0.6 s with a timeout of 1 s, paused for 1.5 s in
// between, ends on its own.
func testPausedTimeout(t *testing.T, f *Fixture) {
	ctx := ctxFor(t)
	p := f.Backend.(sandbox.Pauser)
	id := create(t, f, sandbox.Resources{})
	x := start(t, f, id, sandbox.ExecSpec{Argv: []string{"/bin/sh", "-c", "sleep 0.6; echo finished"}, Timeout: time.Second})
	time.Sleep(200 * time.Millisecond)
	if _, err := p.Pause(ctx, id); err != nil {
		t.Fatalf("Pause = %v", err)
	}
	time.Sleep(1500 * time.Millisecond)
	if _, err := p.Resume(context.WithoutCancel(ctx), id); err != nil {
		t.Fatalf("Resume = %v", err)
	}
	st := wait(t, f, id, x)
	if st.TimedOut || st.Code != 0 {
		t.Errorf("exec paused for longer than its timeout = %+v, want it to end on its own", st)
	}
}
