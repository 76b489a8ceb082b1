package e2e

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/dsecproject/dsec/sdk/go/dsec"
)

// TestRollouts is issue 15's rollouts and exec step keys on real
// sandboxes, through the CLI and the Go SDK: a rollout made from a JSON
// and a YAML spec, read, listed, selected by its label, its status set,
// refused when one member cannot be made (nothing left), deleted whole;
// and steps that a second run fast-forwards through without running any
// again (counted by the side effects they append to a file).
func TestRollouts(t *testing.T) {
	p := newPlatform(t)
	p.Busybox(t)
	c := p.Client(t, p.AdminKey(t))
	dir := t.TempDir()
	spec := filepath.Join(dir, "spec.json")
	if err := os.WriteFile(spec, []byte(`{
  "labels": {"job": "cli"},
  "ttl": "1800s",
  "members": [
    {"name": "worker", "role": "worker", "sandbox": {"image": "busybox", "resources": {"memoryBytes": "67108864"}, "env": {"MODE": "w"}}},
    {"name": "agent", "sandbox": {"image": "busybox", "resources": {"memoryBytes": "67108864"}, "labels": {"part": "agent"}}}
  ]
}`), 0o644); err != nil {
		t.Fatal(err)
	}
	yml := filepath.Join(dir, "spec.yaml")
	if err := os.WriteFile(yml, []byte(`labels: {job: yaml}
members:
  - name: agent
    sandbox: {image: busybox, resources: {memoryBytes: "67108864"}}
`), 0o644); err != nil {
		t.Fatal(err)
	}

	t.Run("CLI", func(t *testing.T) {
		out, errOut, code := p.CLI(t, "", "rollout", "create", "-f", spec)
		id := strings.TrimSpace(out)
		if code != 0 || !strings.HasPrefix(id, "e2e-r-") {
			t.Fatalf("dsec rollout create -f spec.json = %q, %q, exit %d; want a rollout ID of node e2e", out, errOut, code)
		}
		out, _, code = p.CLI(t, "", "rollout", "get", id)
		if code != 0 || !strings.Contains(out, "worker") || !strings.Contains(out, "agent") || strings.Count(out, "running") != 2 || !strings.Contains(out, "job=cli") {
			t.Errorf("dsec rollout get = exit %d\n%s", code, out)
		}
		out, _, _ = p.CLI(t, "", "rollout", "get", "-o", "json", id)
		var ro struct {
			ID      string `json:"id"`
			Members []struct {
				Name, Role, SandboxID, State string
			} `json:"members"`
			ExpiresAt string `json:"expiresAt"`
		}
		if err := json.Unmarshal([]byte(out), &ro); err != nil || ro.ID != id || len(ro.Members) != 2 || ro.Members[0].Role != "worker" || ro.Members[1].State != "STATE_RUNNING" {
			t.Errorf("dsec rollout get -o json = %s (%v)", out, err)
		}
		r, err := c.Rollout(ctxT(t), id)
		if err != nil {
			t.Fatal(err)
		}
		if left := time.Until(r.ExpiresAt); left < 29*time.Minute || left > 30*time.Minute {
			t.Errorf("the rollout expires in %v, want its ttl of 30m", left)
		}
		worker, agent := r.Worker(), r.Member("agent")
		out, _, _ = p.CLI(t, "", "ps", "-q", "-l", "dsec.rollout="+id)
		if got := strings.Fields(out); len(got) != 2 || !slices.Contains(got, worker.ID) || !slices.Contains(got, agent.ID) {
			t.Errorf("dsec ps -q -l dsec.rollout=%s = %v, want %s and %s", id, got, worker.ID, agent.ID)
		}
		out, _, _ = p.CLI(t, "", "exec", worker.ID, "--", "sh", "-c", "echo $MODE $DSEC_ROLLOUT $DSEC_ROLLOUT_MEMBER $DSEC_ROLLOUT_MEMBERS")
		if want := "w " + id + " worker worker=" + worker.ID + ",agent=" + agent.ID + "\n"; out != want {
			t.Errorf("the worker's environment = %q, want %q", out, want)
		}
		_, errOut, code = p.CLI(t, "", "rm", agent.ID)
		if code != 125 || !strings.Contains(errOut, id) {
			t.Errorf("dsec rm of a member alone = exit %d, %q; want 125 naming the rollout", code, errOut)
		}
		_, errOut, code = p.CLI(t, "", "label", agent.ID, "dsec.rollout=other")
		if code == 0 || !strings.Contains(errOut, "dsec.rollout") {
			t.Errorf("dsec label %s dsec.rollout=other = exit %d, %q; want refused", agent.ID, code, errOut)
		}
		if _, err := c.SetRolloutStatus(ctxT(t), id, map[string]string{"step/1": "ok", "progress": "1/3"}); err != nil {
			t.Fatal(err)
		}
		out, _, _ = p.CLI(t, "", "rollout", "get", id)
		if !strings.Contains(out, "progress") || !strings.Contains(out, "1/3") {
			t.Errorf("dsec rollout get after SetStatus lacks it:\n%s", out)
		}

		y1, _, code := p.CLI(t, "", "rollout", "create", "-f", yml, "--idempotency-key", "yaml-1")
		y2, _, code2 := p.CLI(t, "", "rollout", "create", "-f", yml, "--idempotency-key", "yaml-1")
		if code != 0 || code2 != 0 || y1 != y2 {
			t.Errorf("dsec rollout create -f spec.yaml twice with one key = %q (exit %d), %q (exit %d); want one rollout", y1, code, y2, code2)
		}
		out, _, _ = p.CLI(t, "", "rollout", "ls", "-q")
		if got := strings.Fields(out); !slices.Equal(got, slices.Sorted(slices.Values([]string{id, strings.TrimSpace(y1)}))) {
			t.Errorf("dsec rollout ls -q = %v, want %s and %s", got, id, y1)
		}
		out, _, _ = p.CLI(t, "", "rollout", "ls", "-l", "job=yaml")
		if !strings.Contains(out, strings.TrimSpace(y1)) || strings.Contains(out, id) || !strings.Contains(out, "1/1 running") {
			t.Errorf("dsec rollout ls -l job=yaml =\n%s", out)
		}

		// A spec the server cannot make whole leaves nothing.
		bad := filepath.Join(dir, "bad.json")
		os.WriteFile(bad, []byte(`{"labels":{"job":"bad"},"members":[{"name":"a","sandbox":{"image":"busybox","resources":{"memoryBytes":"67108864"}}},{"name":"b","sandbox":{"image":"no-such-image"}}]}`), 0o644)
		_, errOut, code = p.CLI(t, "", "rollout", "create", "-f", bad)
		if code != 125 || !strings.Contains(errOut, "member b") {
			t.Errorf("dsec rollout create with a missing image = exit %d, %q; want 125 naming member b", code, errOut)
		}
		if out, _, _ := p.CLI(t, "", "ps", "-q", "-l", "job=bad"); strings.TrimSpace(out) != "" {
			t.Errorf("sandboxes left of the refused rollout: %q", out)
		}
		os.WriteFile(bad, []byte(`{"members":[{"name":"a","sandbox":{"image":"busybox"}}],"tll":"1s"}`), 0o644)
		if _, errOut, code := p.CLI(t, "", "rollout", "create", "-f", bad); code != 2 || !strings.Contains(errOut, "tll") {
			t.Errorf("dsec rollout create with a misspelt field = exit %d, %q; want 2 naming it", code, errOut)
		}

		out, _, code = p.CLI(t, "", "rollout", "rm", id, strings.TrimSpace(y1))
		if code != 0 || len(strings.Fields(out)) != 2 {
			t.Errorf("dsec rollout rm = %q, exit %d", out, code)
		}
		if out, _, _ := p.CLI(t, "", "ps", "-q"); strings.TrimSpace(out) != "" {
			t.Errorf("sandboxes after dsec rollout rm: %q", out)
		}
		if _, errOut, code := p.CLI(t, "", "rollout", "get", id); code != 125 || !strings.Contains(errOut, "not found") {
			t.Errorf("dsec rollout get after rm = exit %d, %q; want not found", code, errOut)
		}
	})

	t.Run("StepKeys", func(t *testing.T) {
		ctx := ctxT(t)
		sb, err := c.Create(ctx, dsec.CreateOptions{Image: "busybox", Memory: 64 << 20})
		if err != nil {
			t.Fatal(err)
		}
		defer sb.Delete(ctx)
		step := func(i int, cmd string) dsec.Step {
			return dsec.Step{Key: "step-" + string(rune('0'+i)), Request: dsec.ExecRequest{Shell: cmd}}
		}
		effect := func(i int) string {
			return "echo " + string(rune('0'+i)) + " >> /tmp/effects; echo out" + string(rune('0'+i))
		}
		plan := []dsec.Step{step(1, effect(1)), step(2, effect(2)+"; exit 3"), step(3, "sleep 1; "+effect(3)), step(4, effect(4))}
		rs, err := sb.RunSteps(ctx, plan[:2])
		if err != nil || len(rs) != 2 || rs[1].ExitCode != 3 {
			t.Fatalf("RunSteps(1, 2) = %v, %v", rs, err)
		}
		// Step 3 started by a client that then went away.
		if _, err := sb.ExecDetached(ctx, dsec.ExecRequest{Shell: plan[2].Request.Shell, StepKey: plan[2].Key}); err != nil {
			t.Fatal(err)
		}
		rs, err = sb.RunSteps(ctx, plan)
		if err != nil {
			t.Fatal(err)
		}
		var from, outs []string
		for _, r := range rs {
			from = append(from, r.From.String())
			outs = append(outs, strings.TrimSpace(string(r.Stdout)))
		}
		if want := []string{"recorded", "recorded", "attached", "ran"}; !slices.Equal(from, want) {
			t.Errorf("the second run's sources = %v, want %v", from, want)
		}
		if want := []string{"out1", "out2", "out3", "out4"}; !slices.Equal(outs, want) || rs[1].ExitCode != 3 {
			t.Errorf("the second run's outputs = %v (step 2 exit %d), want %v and exit 3", outs, rs[1].ExitCode, want)
		}
		res, err := sb.Shell(ctx, "cat /tmp/effects")
		if err != nil || string(res.Stdout) != "1\n2\n3\n4\n" {
			t.Errorf("side effects = %q, %v; want each step once", res.Stdout, err)
		}
		// The CLI: a step key taken is refused, and the journal shows it.
		_, errOut, code := p.CLI(t, "", "exec", "--step-key", "step-1", sb.ID, "--", "sh", "-c", effect(1))
		if code != 125 || !strings.Contains(errOut, "step-1") {
			t.Errorf("dsec exec --step-key step-1 again = exit %d, %q; want 125 naming it", code, errOut)
		}
		out, _, _ := p.CLI(t, "", "execs", "--step-key", "step-3", "--step-key", "step-4", sb.ID)
		if lines := strings.Split(strings.TrimSpace(out), "\n"); len(lines) != 3 || !strings.Contains(out, "step-3") || strings.Contains(out, "step-1") {
			t.Errorf("dsec execs --step-key step-3 --step-key step-4 =\n%s", out)
		}
		if _, err := sb.Shell(ctx, "true", dsec.WithStepKey(strings.Repeat("k", 257))); !errors.Is(err, dsec.ErrInvalidArgument) {
			t.Errorf("an exec with a 257-byte step key = %v, want InvalidArgument", err)
		}
	})
}
