package keeper

import (
	"context"
	"os"
	"strings"
	"syscall"
	"testing"

	"github.com/dsecproject/dsec/internal/errdefs"
)

// TestExecStepKeys: an exec's step key is in the journal, a second exec
// with it is refused naming the first (a plain exec or a session's, before
// and after a restart of the keeper), a start that fails leaves the key
// free, and a claim that names no journal entry is taken over.
func TestExecStepKeys(t *testing.T) {
	dir := shortTempDir(t)
	k1, _, c := newFakeKeeper(t, dir)
	ctx := context.Background()
	const id = "n-steps"
	info, err := c.Create(ctx, CreateRequest{ID: id, Layers: []Layer{{Digest: "sha256:aa", Path: "/x"}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Kill(info.Pid, syscall.SIGKILL) })
	start := func(c *Client, spec ExecSpec) error {
		if spec.Env == nil {
			spec.Env = []string{"PATH=/usr/bin:/bin", "HOME=/"}
		}
		return c.StartExec(ctx, ExecRequest{Sandbox: id, Spec: spec})
	}

	if st := execWait(t, c, id, ExecSpec{ID: "e1", Argv: []string{"sh", "-c", "exit 4"}, StepKey: "step-1"}); st.Code != 4 {
		t.Fatalf("exec with step key = %+v, want code 4", st)
	}
	err = start(c, ExecSpec{ID: "e2", Argv: []string{"true"}, StepKey: "step-1"})
	if !errdefs.Is(err, errdefs.ErrAlreadyExists) || !strings.Contains(err.Error(), "e1") {
		t.Errorf("StartExec(step-1 again) = %v, want AlreadyExists naming exec e1", err)
	}
	if _, err := os.Stat(c.OutputPath(id, "e2", Stdout)); err == nil {
		t.Errorf("the refused exec e2 has output files")
	}
	err = start(c, ExecSpec{ID: "e3", Argv: []string{"echo s"}, Session: "main", StepKey: "step-1"})
	if !errdefs.Is(err, errdefs.ErrAlreadyExists) {
		t.Errorf("session StartExec(step-1 again) = %v, want AlreadyExists", err)
	}
	if st, out, _ := sessionRun(t, c, id, "main", "e4", "echo s", func(s *ExecSpec) { s.StepKey = "step-2" }); st.Code != 0 || out != "s\n" {
		t.Errorf("session exec with step key = %+v, %q", st, out)
	}
	if err := start(c, ExecSpec{ID: "e5", Argv: []string{"true"}, StepKey: "step-2"}); !errdefs.Is(err, errdefs.ErrAlreadyExists) || !strings.Contains(err.Error(), "e4") {
		t.Errorf("StartExec(step-2, a session's) = %v, want AlreadyExists naming e4", err)
	}
	if err := start(c, ExecSpec{ID: "e6", Argv: []string{"true"}, StepKey: strings.Repeat("k", MaxStepKey+1)}); !errdefs.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("StartExec(a %d-byte step key) = %v, want InvalidArgument", MaxStepKey+1, err)
	}
	// A start that fails (the fake driver has no terminals) frees its key.
	if err := start(c, ExecSpec{ID: "e7", Argv: []string{"true"}, TTY: true, StepKey: "step-3"}); !errdefs.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("StartExec(TTY) = %v, want the driver's FailedPrecondition", err)
	}
	if st := execWait(t, c, id, ExecSpec{ID: "e8", Argv: []string{"true"}, StepKey: "step-3"}); st.Code != 0 {
		t.Errorf("step-3 after a failed start = %+v", st)
	}
	// A claim whose exec never made it to the journal (a keeper that died
	// between the two) names nothing.
	if err := writeJSON(k1.stepPath(id, "step-4"), stepClaim{StepKey: "step-4", Exec: "ghost"}); err != nil {
		t.Fatal(err)
	}
	if st := execWait(t, c, id, ExecSpec{ID: "e9", Argv: []string{"true"}, StepKey: "step-4"}); st.Code != 0 {
		t.Errorf("step-4 over a stale claim = %+v", st)
	}

	execs, err := c.ListExecs(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, e := range execs {
		got[e.ID] = e.StepKey
	}
	want := map[string]string{"e1": "step-1", "e4": "step-2", "e8": "step-3", "e9": "step-4"}
	for execID, key := range want {
		if got[execID] != key {
			t.Errorf("ListExecs: exec %s has step key %q, want %q (all: %v)", execID, got[execID], key, got)
		}
	}
	for _, refused := range []string{"e2", "e3", "e5", "e6", "e7"} {
		if _, ok := got[refused]; ok {
			t.Errorf("ListExecs has the refused exec %s", refused)
		}
	}

	// A new keeper on the state dir still refuses the keys.
	c.Close()
	k1.mu.Lock()
	k1.boxes = map[string]*box{}
	k1.mu.Unlock()
	k1.reaper.close()
	k1.reaper = nil
	_ = os.Remove(Layout{StateDir: dir}.Socket())
	_, _, c2 := newFakeKeeper(t, dir)
	if err := start(c2, ExecSpec{ID: "e10", Argv: []string{"true"}, StepKey: "step-1"}); !errdefs.Is(err, errdefs.ErrAlreadyExists) || !strings.Contains(err.Error(), "e1") {
		t.Errorf("StartExec(step-1) after a keeper restart = %v, want AlreadyExists naming e1", err)
	}
}
