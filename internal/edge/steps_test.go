package edge

import (
	"context"
	"strings"
	"testing"

	"connectrpc.com/connect"

	sandboxv1 "github.com/dsecproject/dsec/api/dsec/sandbox/v1"
	"github.com/dsecproject/dsec/internal/errdefs"
	"github.com/dsecproject/dsec/internal/sandbox"
)

// TestExecStepKeys: the edge passes a step key to the backend, which
// refuses a second exec with it (AlreadyExists naming the first); the
// journal shows it and ListExecs filters by it; a key too long is refused
// here, and a backend without step keys refuses them rather than ignore
// them.
func TestExecStepKeys(t *testing.T) {
	n := newTestNode(t)
	e := n.open()
	defer e.Close()
	ctx := context.Background()
	r := create(t, e, 64*testMiB)
	run := func(key string, argv ...string) (string, error) {
		var execID string
		err := e.Exec(ctx, admin, ExecParams{Sandbox: r.ID, Argv: argv, StepKey: key}, func(ev ExecEvent) error {
			if ev.Started != "" {
				execID = ev.Started
			}
			return nil
		})
		return execID, err
	}
	first, err := run("step-1", "echo", "one")
	if err != nil {
		t.Fatalf("Exec(step-1) = %v", err)
	}
	if _, err := run("step-1", "echo", "again"); !errdefs.Is(err, errdefs.ErrAlreadyExists) || !strings.Contains(err.Error(), first) {
		t.Errorf("Exec(step-1 again) = %v, want AlreadyExists naming %s", err, first)
	}
	second, err := run("step-2", "echo", "two")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := run("", "echo", "no key"); err != nil {
		t.Fatal(err)
	}
	if _, err := run(strings.Repeat("k", sandbox.MaxStepKey+1), "true"); !errdefs.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("Exec(a %d-byte step key) = %v, want InvalidArgument", sandbox.MaxStepKey+1, err)
	}

	api := &sandboxAPI{e: e}
	list := func(keys ...string) map[string]string {
		t.Helper()
		req := connect.NewRequest(&sandboxv1.ListExecsRequest{SandboxId: r.ID, StepKeys: keys})
		admin.SetHeader(req.Header())
		resp, err := api.ListExecs(ctx, req)
		if err != nil {
			t.Fatalf("ListExecs(%v) = %v", keys, err)
		}
		out := map[string]string{}
		for _, x := range resp.Msg.GetExecs() {
			out[x.GetExecId()] = x.GetStepKey()
		}
		return out
	}
	if got := list(); len(got) != 3 || got[first] != "step-1" || got[second] != "step-2" {
		t.Errorf("ListExecs() = %v, want 3 execs, %s step-1 and %s step-2", got, first, second)
	}
	if got := list("step-2", "step-9"); len(got) != 1 || got[second] != "step-2" {
		t.Errorf("ListExecs(step_keys step-2, step-9) = %v, want only %s", got, second)
	}

	// A backend that does not declare step keys refuses them.
	n.node.Features = []sandbox.Capability{sandbox.CapRestart}
	if _, err := run("step-3", "true"); !errdefs.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("Exec(step key) on a backend without step keys = %v, want FailedPrecondition", err)
	}
}
