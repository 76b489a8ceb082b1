package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"

	sandboxv1 "github.com/dsecproject/dsec/api/dsec/sandbox/v1"
	"github.com/dsecproject/dsec/api/dsec/sandbox/v1/sandboxv1connect"
	"github.com/dsecproject/dsec/internal/testenv"
	"github.com/dsecproject/dsec/sdk/go/dsec"
)

// drillSteps is how many steps each rollout's agent takes in the drill.
const drillSteps = 6

// TestRolloutPreemptionDrill is issue 15's preemption drill, with the
// example of examples/rollout: a Python trainer (the SDK, a stub policy
// over HTTP) runs two rollouts whose workers (Python, in their own
// sandboxes, reaching the policy through the operator's network config
// and the API through dsec-api) drive a multi-step agent; mid-run the
// trainer is killed with SIGKILL, the job's sandboxes are paused by label
// (as a scheduler's preemption hook would), and a new trainer process
// resumes them, reconnects by rollout ID and finishes. No completed step
// runs again: each step appends its number to a file in its agent's
// sandbox, and each number must be there once.
func TestRolloutPreemptionDrill(t *testing.T) {
	python := requirePython(t)
	addrs := nodeAddrs(t)
	if len(addrs) == 0 {
		t.Fatal("this host has no IPv4 address but loopback: the trainer's policy needs one the sandboxes reach through the node's proxy")
	}
	host := addrs[0]
	ln, err := net.Listen("tcp", host+":0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	cfg, err := os.ReadFile(filepath.Join(testenv.ModuleRoot(), "examples", "rollout", "network.toml"))
	if err != nil {
		t.Fatal(err)
	}
	cfgPath := filepath.Join(t.TempDir(), "network.toml")
	text := strings.ReplaceAll(strings.ReplaceAll(string(cfg), "HOST_IP", host), "8765", strconv.Itoa(port))
	if err := os.WriteFile(cfgPath, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	p := newPlatform(t, func(p *platform) { p.Extra = append(p.Extra, "--network-config", cfgPath) })
	p.Busybox(t)
	pythonImage(t, p, "test/python")
	c := p.Client(t, p.AdminKey(t))
	ctx := ctxT(t)

	job := "drill-" + randHex(4)
	dir := t.TempDir()
	state := filepath.Join(dir, "rollouts.json")
	trainer := func(name string) (*exec.Cmd, *bytes.Buffer) {
		cmd := exec.Command(python, filepath.Join(testenv.ModuleRoot(), "examples", "rollout", "trainer.py"),
			"--job", job, "--rollouts", "2", "--steps", strconv.Itoa(drillSteps),
			"--policy-listen", net.JoinHostPort(host, strconv.Itoa(port)),
			"--worker-image", "test/python", "--agent-image", "busybox",
			"--step-seconds", "1", "--think-seconds", "0.1", "--state", state, "--keep")
		cmd.Dir = dir
		cmd.Env = append(pythonEnv(t, p), "PYTHONPATH="+filepath.Join(testenv.ModuleRoot(), "sdk", "python"))
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Start(); err != nil {
			t.Fatalf("start the %s trainer: %v", name, err)
		}
		t.Cleanup(func() {
			if cmd.ProcessState == nil {
				cmd.Process.Kill()
				cmd.Wait()
			}
		})
		return cmd, &out
	}
	rolloutIDs := func() []string {
		b, err := os.ReadFile(state)
		if err != nil {
			return nil
		}
		var s struct{ Rollouts []string }
		if json.Unmarshal(b, &s) != nil {
			return nil
		}
		return s.Rollouts
	}
	progress := func() map[string]int {
		out := map[string]int{}
		for _, id := range rolloutIDs() {
			if ro, err := c.Rollout(ctx, id); err == nil {
				out[id], _ = strconv.Atoi(ro.Status["progress"])
			}
		}
		return out
	}

	// The first trainer, killed once every rollout is past its second step.
	first, out1 := trainer("first")
	deadline := time.Now().Add(3 * time.Minute)
	for {
		pr := progress()
		done := len(pr) == 2
		for _, n := range pr {
			done = done && n >= 2
		}
		if done {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the rollouts did not pass their second step in 3 minutes (progress %v); the first trainer said:\n%s", pr, out1)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if err := first.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	first.Wait()
	killedAt := progress()
	t.Logf("the first trainer killed at progress %v", killedAt)
	ids := rolloutIDs()

	// The preemption hook: every sandbox of the job paused by its label.
	api := sandboxv1connect.NewSandboxServiceClient(http.DefaultClient, p.URL())
	req := connect.NewRequest(&sandboxv1.PauseRequest{Selector: map[string]string{"job": job}})
	req.Header().Set("Authorization", "Bearer "+p.AdminKey(t))
	resp, err := api.Pause(ctx, req)
	if err != nil {
		t.Fatalf("Pause by selector job=%s: %v (the drill needs pause and resume by selector, issue 15)", job, err)
	}
	if n := len(resp.Msg.GetResults()); n != 4 {
		t.Errorf("Pause by selector job=%s paused %d sandboxes, want 4 (2 rollouts of 2): %v", job, n, resp.Msg.GetResults())
	}
	for _, r := range resp.Msg.GetResults() {
		if r.GetError() != nil || r.GetState() != sandboxv1.State_STATE_PAUSED {
			t.Errorf("Pause of %s = %v, %v; want paused", r.GetId(), r.GetState(), r.GetError())
		}
	}
	sbs, err := c.List(ctx, map[string]string{"job": job})
	if err != nil {
		t.Fatal(err)
	}
	for _, sb := range sbs {
		if sb.State != dsec.StatePaused {
			t.Errorf("%s is %s after the pause, want paused", sb.ID, sb.State)
		}
	}
	time.Sleep(2 * time.Second)
	if pr := progress(); fmt.Sprint(pr) != fmt.Sprint(killedAt) {
		// A step running when the pause came may have been recorded
		// before it; nothing may move while paused.
		time.Sleep(2 * time.Second)
		if again := progress(); fmt.Sprint(again) != fmt.Sprint(pr) {
			t.Errorf("progress moved while the job was paused: %v, then %v", pr, again)
		}
	}

	// A new trainer: it resumes the job, reconnects by ID, and finishes.
	second, out2 := trainer("second")
	waited := make(chan error, 1)
	go func() { waited <- second.Wait() }()
	select {
	case err := <-waited:
		if err != nil {
			t.Fatalf("the second trainer: %v\n%s", err, out2)
		}
	case <-time.After(3 * time.Minute):
		second.Process.Kill()
		<-waited
		t.Fatalf("the second trainer did not finish in 3 minutes:\n%s", out2)
	}
	if !strings.Contains(out2.String(), "reconnecting to 2 rollouts") {
		t.Errorf("the second trainer did not reconnect by ID:\n%s", out2)
	}
	results := 0
	sc := bufio.NewScanner(bytes.NewReader(out2.Bytes()))
	for sc.Scan() {
		var r struct {
			Rollout string
			Answer  string
			Steps   int
		}
		if json.Unmarshal(sc.Bytes(), &r) == nil && r.Rollout != "" {
			results++
			if r.Steps != drillSteps || r.Answer != strconv.Itoa(drillSteps) {
				t.Errorf("rollout %s: %d steps, answer %q; want %d and %d", r.Rollout, r.Steps, r.Answer, drillSteps, drillSteps)
			}
		}
	}
	if results != 2 {
		t.Errorf("the second trainer reported %d rollouts, want 2:\n%s", results, out2)
	}

	// The side effects: each step once, in order, in every agent; each
	// step once in the journal; the worker started once.
	var want strings.Builder
	for i := range drillSteps {
		fmt.Fprintf(&want, "%d\n", i)
	}
	for _, id := range ids {
		ro, err := c.Rollout(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.DeleteRollout(context.WithoutCancel(ctx), id) })
		if ro.Status["state"] != "done" || ro.Status["progress"] != strconv.Itoa(drillSteps) {
			t.Errorf("rollout %s's status = %v, want done after %d steps", id, ro.Status, drillSteps)
		}
		agent := ro.Member("agent")
		effects, err := agent.ReadFile(ctx, "/workspace/effects.log")
		if err != nil || string(effects) != want.String() {
			t.Errorf("rollout %s: the agent's side effects = %q, %v; want each of %d steps once: %q", id, effects, err, drillSteps, want.String())
		}
		execs, err := agent.ListExecs(ctx)
		if err != nil {
			t.Fatal(err)
		}
		keys := map[string]int{}
		for _, e := range execs {
			keys[e.StepKey]++
		}
		for i := range drillSteps {
			if n := keys[fmt.Sprintf("step-%d", i)]; n != 1 {
				t.Errorf("rollout %s: step-%d has %d execs in the agent's journal, want 1 (%v)", id, i, n, keys)
			}
		}
		if w, err := ro.Worker().ListExecs(ctx, dsec.WithStepKeys("worker")); err != nil || len(w) != 1 {
			t.Errorf("rollout %s: the worker's execs = %v, %v; want it started once", id, w, err)
		}
	}
	if t.Failed() {
		t.Logf("the first trainer said:\n%s\nthe second:\n%s", out1, out2)
	}
}
