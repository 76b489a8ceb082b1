package adversarial

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/dsecproject/dsec/sdk/go/dsec"
)

// Rollouts: a rollout's worker reaches the API (dsec-api) as its own key,
// which must act on its own rollout only. These attacks come from inside a
// real worker, through the node's proxy, with a forged admin key on every
// request (the probe's api command), and check what each attempt changed.

// newRollout makes a rollout of a busybox worker allowed dsec-api and a
// busybox agent, labelled for the suite, deleted when t ends.
func newRollout(t *testing.T, c *dsec.Client) *dsec.Rollout {
	t.Helper()
	ro, err := c.CreateRollout(Ctx(t, time.Minute), dsec.RolloutSpec{
		Labels: map[string]string{LabelKey: labelValue(t.Name())},
		Members: []dsec.RolloutMember{
			{Name: "worker", Role: dsec.RoleWorker, Sandbox: dsec.CreateOptions{Image: "busybox", Memory: 64 << 20, Network: dsec.NetworkFlag("allow=dsec-api")}},
			{Name: "agent", Sandbox: dsec.CreateOptions{Image: "busybox", Memory: 64 << 20}},
		},
	}, dsec.CreateRolloutOptions{})
	if err != nil {
		t.Fatalf("CreateRollout = %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := c.DeleteRollout(ctx, ro.ID); err != nil {
			t.Errorf("DeleteRollout(%s) = %v", ro.ID, err)
		}
	})
	return ro
}

// TestRolloutMemberKeyStaysInItsRollout relies on the rollout member's key
// (apiserver: memberAllowed; edge: a caller with a rollout sees its
// members only) and the reserved label dsec.rollout. From rollout A's
// worker: exec and status in A work; exec in B's sandboxes or in another
// sandbox of the project, listing, creating, deleting, relabelling, timeouts,
// pausing and B's status are refused and change nothing. With the user's
// own key, the label cannot be forged to join a rollout either.
func TestRolloutMemberKeyStaysInItsRollout(t *testing.T) {
	Env(t)
	t.Parallel()
	c := Admin(t)
	ctx := Ctx(t, 4*time.Minute)
	a, b := newRollout(t, c), newRollout(t, c)
	plain := NewSandbox(t, dsec.CreateOptions{})
	worker := a.Worker()
	InstallProbe(t, worker)
	info, err := worker.Network(ctx)
	if err != nil {
		t.Fatal(err)
	}
	call := func(proc, body string, stream ...string) (string, string) {
		t.Helper()
		args := []string{"probe", "api", info.Gateway, proc, body}
		args = append(args, stream...)
		r := Sh(t, worker, shellJoin(args))
		status, rest, _ := strings.Cut(r.Stdout, "\n")
		return status, rest
	}
	agentA, agentB, workerB := a.Member("agent").ID, b.Member("agent").ID, b.Worker().ID

	// Its own rollout: exec, status, reading.
	status, out := call("dsec.sandbox.v1.SandboxService/Exec", fmt.Sprintf(`{"sandboxId":%q,"shell":"echo mine"}`, agentA), "stream")
	if status != "200" || !strings.Contains(out, base64.StdEncoding.EncodeToString([]byte("mine\n"))) || !strings.Contains(out, `"exit"`) {
		t.Fatalf("Exec in its own rollout's agent = %s %s; want its output and exit", status, out)
	}
	if status, out := call("dsec.rollout.v1.RolloutService/SetStatus", fmt.Sprintf(`{"id":%q,"set":{"step.1":"done"}}`, a.ID)); status != "200" {
		t.Errorf("SetStatus of its own rollout = %s %s", status, out)
	}
	if got, err := c.Rollout(ctx, a.ID); err != nil || got.Status["step.1"] != "done" {
		t.Errorf("rollout %s's status after the worker's SetStatus = %v, %v", a.ID, got, err)
	}
	if status, out := call("dsec.rollout.v1.RolloutService/Get", fmt.Sprintf(`{"id":%q}`, a.ID)); status != "200" || !strings.Contains(out, agentA) {
		t.Errorf("Get of its own rollout = %s %s", status, out)
	}

	// Another rollout's sandboxes, and the project's other sandbox: as if
	// they did not exist, and untouched.
	for _, id := range []string{agentB, workerB, plain.ID} {
		status, out := call("dsec.sandbox.v1.SandboxService/Exec", fmt.Sprintf(`{"sandboxId":%q,"shell":"echo theirs > /tmp/owned"}`, id), "stream")
		if !strings.Contains(out, `"not_found"`) {
			t.Errorf("Exec in %s = %s %s; want not_found", id, status, out)
		}
		if status, out := call("dsec.sandbox.v1.SandboxService/MakeDir", fmt.Sprintf(`{"sandboxId":%q,"path":"/owned"}`, id)); status != "404" {
			t.Errorf("MakeDir in %s = %s %s; want 404", id, status, out)
		}
		if status, out := call("dsec.sandbox.v1.SandboxService/Get", fmt.Sprintf(`{"id":%q}`, id)); status != "404" {
			t.Errorf("Get of %s = %s %s; want 404", id, status, out)
		}
		execs, err := c.Sandbox(id).ListExecs(ctx)
		if err != nil || len(execs) != 0 {
			t.Errorf("the journal of %s after the attempts = %v, %v; want empty", id, execs, err)
		}
		if _, err := c.Sandbox(id).Stat(ctx, "/owned"); !errors.Is(err, dsec.ErrNotFound) {
			t.Errorf("Stat(%s:/owned) = %v; want NotFound", id, err)
		}
	}
	if status, out := call("dsec.rollout.v1.RolloutService/Get", fmt.Sprintf(`{"id":%q}`, b.ID)); status != "404" {
		t.Errorf("Get of another rollout = %s %s; want 404", status, out)
	}
	if status, out := call("dsec.rollout.v1.RolloutService/SetStatus", fmt.Sprintf(`{"id":%q,"set":{"step.1":"forged"}}`, b.ID)); status != "404" {
		t.Errorf("SetStatus of another rollout = %s %s; want 404", status, out)
	}
	if got, err := c.Rollout(ctx, b.ID); err != nil || len(got.Status) != 0 {
		t.Errorf("rollout %s's status after the attempt = %v, %v; want empty", b.ID, got.Status, err)
	}

	// Nothing but its rollout: no listing, creating, deleting, leaving or
	// joining, timeouts or pauses.
	lbl := fmt.Sprintf(`{%q:%q}`, LabelKey, labelValue(t.Name()))
	for _, refused := range []struct{ proc, body string }{
		{"dsec.sandbox.v1.SandboxService/List", `{}`},
		{"dsec.rollout.v1.RolloutService/List", `{}`},
		{"dsec.sandbox.v1.SandboxService/Create", `{"image":"busybox"}`},
		{"dsec.sandbox.v1.SandboxService/BatchCreate", `{"count":2,"template":{"image":"busybox"}}`},
		{"dsec.rollout.v1.RolloutService/Create", `{"spec":{"members":[{"name":"x","sandbox":{"image":"busybox"}}]}}`},
		{"dsec.sandbox.v1.SandboxService/Delete", fmt.Sprintf(`{"id":%q}`, agentA)},
		{"dsec.sandbox.v1.SandboxService/Delete", fmt.Sprintf(`{"id":%q}`, agentB)},
		{"dsec.sandbox.v1.SandboxService/Delete", fmt.Sprintf(`{"selector":%s}`, lbl)},
		{"dsec.rollout.v1.RolloutService/Delete", fmt.Sprintf(`{"id":%q}`, a.ID)},
		{"dsec.rollout.v1.RolloutService/Delete", fmt.Sprintf(`{"id":%q}`, b.ID)},
		{"dsec.sandbox.v1.SandboxService/UpdateLabels", fmt.Sprintf(`{"id":%q,"set":{"dsec.rollout":%q}}`, agentA, b.ID)},
		{"dsec.sandbox.v1.SandboxService/UpdateLabels", fmt.Sprintf(`{"id":%q,"remove":["dsec.rollout"]}`, worker.ID)},
		{"dsec.sandbox.v1.SandboxService/SetTimeout", fmt.Sprintf(`{"id":%q,"ttl":"604800s"}`, agentA)},
		{"dsec.sandbox.v1.SandboxService/Pause", fmt.Sprintf(`{"selector":%s}`, lbl)},
		{"dsec.sandbox.v1.SandboxService/Resume", fmt.Sprintf(`{"id":%q}`, agentB)},
	} {
		if status, out := call(refused.proc, refused.body); status != "403" {
			t.Errorf("%s %s from a member = %s %s; want 403", refused.proc, refused.body, status, out)
		}
	}
	if status, out := call("dsec.sandbox.v1.SandboxService/Watch", `{}`, "stream"); !strings.Contains(out, `"permission_denied"`) {
		t.Errorf("Watch from a member = %s %s; want permission_denied", status, out)
	}
	sbs, err := c.List(ctx, map[string]string{LabelKey: labelValue(t.Name())})
	if err != nil {
		t.Fatal(err)
	}
	if len(sbs) != 5 {
		t.Errorf("the test's sandboxes after the attempts: %d, want 5 (two rollouts of two, one plain)", len(sbs))
	}
	for _, sb := range sbs {
		want := map[string]string{agentA: a.ID, worker.ID: a.ID, agentB: b.ID, workerB: b.ID}[sb.ID]
		if sb.State != dsec.StateRunning || sb.Rollout != want || sb.Labels[dsec.RolloutLabel] != want {
			t.Errorf("%s after the attempts: %s, rollout %q, label %q; want running in rollout %q", sb.ID, sb.State, sb.Rollout, sb.Labels[dsec.RolloutLabel], want)
		}
	}

	// The label is the platform's: the user's own key cannot forge it to
	// put a sandbox in a rollout (or take one out).
	if _, err := c.Create(ctx, dsec.CreateOptions{Image: "busybox", Memory: 64 << 20, Labels: map[string]string{dsec.RolloutLabel: a.ID, LabelKey: labelValue(t.Name())}}); !errors.Is(err, dsec.ErrInvalidArgument) {
		t.Errorf("Create(label %s=%s) = %v; want InvalidArgument", dsec.RolloutLabel, a.ID, err)
	}
	_, err = c.CreateRollout(ctx, dsec.RolloutSpec{Members: []dsec.RolloutMember{{Name: "x", Sandbox: dsec.CreateOptions{Image: "busybox", Labels: map[string]string{dsec.RolloutLabel: a.ID}}}}}, dsec.CreateRolloutOptions{})
	if !errors.Is(err, dsec.ErrInvalidArgument) {
		t.Errorf("CreateRollout(a member labelled %s=%s) = %v; want InvalidArgument", dsec.RolloutLabel, a.ID, err)
	}
	if err := plain.UpdateLabels(ctx, map[string]string{dsec.RolloutLabel: a.ID}); !errors.Is(err, dsec.ErrInvalidArgument) {
		t.Errorf("UpdateLabels(plain, %s=%s) = %v; want InvalidArgument", dsec.RolloutLabel, a.ID, err)
	}
	if err := c.Sandbox(agentB).UpdateLabels(ctx, nil, dsec.RolloutLabel); !errors.Is(err, dsec.ErrInvalidArgument) {
		t.Errorf("UpdateLabels(%s, remove %s) = %v; want InvalidArgument", agentB, dsec.RolloutLabel, err)
	}
	if err := c.Delete(ctx, agentB); !errors.Is(err, dsec.ErrFailedPrecondition) {
		t.Errorf("Delete(%s, a member alone) = %v; want FailedPrecondition", agentB, err)
	}
}

// shellJoin quotes args for /bin/sh.
func shellJoin(args []string) string {
	q := make([]string, len(args))
	for i, a := range args {
		q[i] = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
	}
	return strings.Join(q, " ")
}
