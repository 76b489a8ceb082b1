package main

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	sandboxv1 "github.com/dsecproject/dsec/api/dsec/sandbox/v1"
)

// The fake API's pause and resume: by ID, node1-ffffffffffff is unknown and
// node1-eeeeeeeeeeee has no room to resume; a selector matches two
// sandboxes of which the second is exited.
func (f *fakeAPI) Pause(_ context.Context, req *connect.Request[sandboxv1.PauseRequest]) (*connect.Response[sandboxv1.PauseResponse], error) {
	f.record(req.Msg)
	rs, err := fakePauseResults(req.Msg.GetId(), req.Msg.GetSelector(), sandboxv1.State_STATE_PAUSED)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&sandboxv1.PauseResponse{Results: rs}), nil
}

func (f *fakeAPI) Resume(_ context.Context, req *connect.Request[sandboxv1.ResumeRequest]) (*connect.Response[sandboxv1.ResumeResponse], error) {
	f.record(req.Msg)
	rs, err := fakePauseResults(req.Msg.GetId(), req.Msg.GetSelector(), sandboxv1.State_STATE_RUNNING)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&sandboxv1.ResumeResponse{Results: rs}), nil
}

func fakePauseResults(id string, sel map[string]string, to sandboxv1.State) ([]*sandboxv1.PauseResult, error) {
	ok := func(id string) *sandboxv1.PauseResult {
		return &sandboxv1.PauseResult{Id: id, State: to, ResidentBytes: 8 << 20, SwappedBytes: 56 << 20, Took: durationpb.New(250 * time.Millisecond)}
	}
	switch {
	case len(sel) > 0:
		return []*sandboxv1.PauseResult{ok("node1-aaaaaaaaaaaa"), {Id: "node1-bbbbbbbbbbbb", Error: &sandboxv1.ItemError{Code: "failed_precondition", Message: "sandbox node1-bbbbbbbbbbbb is exited (done): only a running sandbox can be paused; create a new one"}}}, nil
	case id == "node1-ffffffffffff":
		return nil, connect.NewError(connect.CodeNotFound, errors.New("sandbox node1-ffffffffffff not found"))
	case id == "node1-eeeeeeeeeeee" && to == sandboxv1.State_STATE_RUNNING:
		return nil, connect.NewError(connect.CodeResourceExhausted, errors.New("sandbox node1-eeeeeeeeeeee is paused and node node1 has no room to resume it"))
	}
	return []*sandboxv1.PauseResult{ok(id)}, nil
}

func TestPauseAndResume(t *testing.T) {
	f := newFakeAPI()
	addr := startFake(t, f)
	out, errOut, code := dsecRun(t, addr, "", "pause", "node1-cccccccccccc", "node1-dddddddddddd")
	if code != 0 {
		t.Fatalf("pause: exit %d: %s", code, errOut)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[0], "ID") || !strings.Contains(lines[1], "node1-cccccccccccc  paused  8M") ||
		!strings.Contains(lines[1], "56M") || !strings.Contains(lines[1], "250ms") || !strings.Contains(lines[2], "node1-dddddddddddd") {
		t.Errorf("pause printed:\n%s", out)
	}
	if reqs := callsOf[*sandboxv1.PauseRequest](f); len(reqs) != 2 || reqs[0].GetId() != "node1-cccccccccccc" || len(reqs[0].GetSelector()) != 0 {
		t.Errorf("pause sent %v", reqs)
	}

	// By selector: a failed sandbox is named on standard error and the exit
	// is its error's.
	out, errOut, code = dsecRun(t, addr, "", "pause", "-l", "job=rl", "-l", "step=3")
	if code != 125 || !strings.Contains(out, "node1-aaaaaaaaaaaa") || strings.Contains(out, "node1-bbbbbbbbbbbb") ||
		!strings.Contains(errOut, "node1-bbbbbbbbbbbb") || !strings.Contains(errOut, "exited") {
		t.Errorf("pause -l: exit %d, out %q, err %q", code, out, errOut)
	}
	if reqs := callsOf[*sandboxv1.PauseRequest](f); reqs[2].GetSelector()["job"] != "rl" || reqs[2].GetSelector()["step"] != "3" || reqs[2].GetId() != "" {
		t.Errorf("pause -l sent %v", reqs[2])
	}
	out, _, code = dsecRun(t, addr, "", "resume", "-l", "job=rl", "-o", "json")
	var results []map[string]any
	if err := json.Unmarshal([]byte(out), &results); err != nil || code != 125 || len(results) != 2 ||
		results[0]["state"] != "STATE_RUNNING" || results[0]["residentBytes"] != "8388608" || results[0]["took"] != "0.250s" ||
		results[1]["error"].(map[string]any)["code"] != "failed_precondition" {
		t.Errorf("resume -o json: exit %d, %s (%v), want the API's JSON names", code, out, err)
	}

	// By ID: each failure is named, the others done, the exit the error's.
	out, errOut, code = dsecRun(t, addr, "", "resume", "node1-eeeeeeeeeeee", "node1-cccccccccccc", "node1-ffffffffffff")
	if code == 0 || !strings.Contains(out, "node1-cccccccccccc  running") || !strings.Contains(errOut, "node1-eeeeeeeeeeee: ") ||
		!strings.Contains(errOut, "no room") || !strings.Contains(errOut, "node1-ffffffffffff") {
		t.Errorf("resume of IDs with failures: exit %d, out %q, err %q", code, out, errOut)
	}

	n := len(callsOf[*sandboxv1.PauseRequest](f)) + len(callsOf[*sandboxv1.ResumeRequest](f))
	for _, args := range [][]string{
		{"pause"}, {"resume"},
		{"pause", "node1-cccccccccccc", "-l", "a=b"},
		{"pause", "-l", "novalue"},
		{"resume", "node1-cccccccccccc", "-o", "yaml"},
	} {
		if _, errOut, code := dsecRun(t, addr, "", args...); code != 2 {
			t.Errorf("%v: exit %d (%s), want 2", args, code, errOut)
		}
	}
	if got := len(callsOf[*sandboxv1.PauseRequest](f)) + len(callsOf[*sandboxv1.ResumeRequest](f)); got != n {
		t.Errorf("refused commands sent %d calls", got-n)
	}
	for _, c := range []string{"pause", "resume"} {
		out, _, code := dsecRun(t, addr, "", c, "--help")
		if code != 0 || !strings.Contains(out, "--label") || !strings.Contains(out, "--output") || !strings.Contains(out, "resume") {
			t.Errorf("%s --help: exit %d:\n%s", c, code, out)
		}
	}
}

// TestPauseFlags: dsec run and dsec timeout send the paused TTL and idle
// action, and refuse a bad idle action before any call.
func TestPauseFlags(t *testing.T) {
	f := newFakeAPI()
	addr := startFake(t, f)
	if _, errOut, code := dsecRun(t, addr, "", "run", "-d", "--paused-ttl", "48h", "--idle-action", "pause", "busybox"); code != 0 {
		t.Fatalf("run --paused-ttl --idle-action: exit %d: %s", code, errOut)
	}
	req := callsOf[*sandboxv1.CreateRequest](f)[0]
	if req.GetPausedTtl().AsDuration() != 48*time.Hour || req.GetIdleAction() != "pause" {
		t.Errorf("run sent paused_ttl %v, idle_action %q", req.GetPausedTtl(), req.GetIdleAction())
	}
	if _, errOut, code := dsecRun(t, addr, "", "timeout", sbID, "--paused-ttl", "72h", "--idle-action", "delete"); code != 0 {
		t.Fatalf("timeout --paused-ttl --idle-action: exit %d: %s", code, errOut)
	}
	st := callsOf[*sandboxv1.SetTimeoutRequest](f)[0]
	if st.GetPausedTtl().AsDuration() != 72*time.Hour || st.GetIdleAction() != "delete" || st.Ttl != nil || st.IdleTtl != nil {
		t.Errorf("timeout sent %v", st)
	}
	for _, args := range [][]string{
		{"run", "-d", "--idle-action", "sleep", "busybox"},
		{"run", "-d", "--paused-ttl", "-1h", "busybox"},
		{"timeout", sbID, "--idle-action", "Pause"},
		{"timeout", sbID},
	} {
		if _, errOut, code := dsecRun(t, addr, "", args...); code != 2 {
			t.Errorf("%v: exit %d (%s), want 2", args, code, errOut)
		}
	}
	if n := len(callsOf[*sandboxv1.CreateRequest](f)) + len(callsOf[*sandboxv1.SetTimeoutRequest](f)); n != 2 {
		t.Errorf("refused commands made calls: %d in all, want 2", n)
	}
	for _, c := range [][]string{{"run", "--help"}, {"timeout", "--help"}} {
		out, _, _ := dsecRun(t, addr, "", c...)
		if !strings.Contains(out, "--paused-ttl") || !strings.Contains(out, "--idle-action") {
			t.Errorf("%v lacks --paused-ttl or --idle-action:\n%s", c, out)
		}
	}
}

// TestPsPaused: ps shows a paused sandbox's state and the time its paused
// TTL leaves, and its paused fields in JSON.
func TestPsPaused(t *testing.T) {
	now := time.Now()
	paused := &sandboxv1.Sandbox{Id: "node1-aaaaaaaaaaaa", Image: "base", State: sandboxv1.State_STATE_PAUSED,
		CreatedAt: timestamppb.New(now), ExpiresAt: timestamppb.New(now.Add(30 * time.Minute)),
		IdleTtl: durationpb.New(time.Minute), PausedTtl: durationpb.New(24 * time.Hour), IdleAction: "pause",
		PausedAt: timestamppb.New(now), PausedExpiresAt: timestamppb.New(now.Add(5*time.Hour + time.Minute))}
	idlePause := &sandboxv1.Sandbox{Id: "node1-bbbbbbbbbbbb", Image: "base", State: sandboxv1.State_STATE_RUNNING,
		CreatedAt: timestamppb.New(now), ExpiresAt: timestamppb.New(now.Add(time.Hour)), IdleAction: "pause",
		IdleTtl: durationpb.New(time.Minute), IdleExpiresAt: timestamppb.New(now.Add(42500 * time.Millisecond))}
	addr := startFakeHandler(t, listAPI{newFakeAPI(), []*sandboxv1.Sandbox{paused, idlePause}})
	out, errOut, code := dsecRun(t, addr, "", "ps")
	if code != 0 {
		t.Fatalf("ps exits %d: %s", code, errOut)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 3 || !strings.Contains(lines[1], " paused ") || !strings.Contains(lines[1], " 5h paused ") || !strings.Contains(lines[2], " 42s idle pause ") {
		t.Errorf("ps printed:\n%s\nwant the paused one with 5h paused left, the other 42s idle pause", out)
	}
	out, _, _ = dsecRun(t, addr, "", "ps", "-o", "json")
	var got []map[string]any
	if err := json.Unmarshal([]byte(out), &got); err != nil || len(got) != 2 {
		t.Fatalf("ps -o json = %s, %v", out, err)
	}
	sb := got[0]
	if sb["state"] != "STATE_PAUSED" || sb["pausedTtl"] != "86400s" || sb["idleAction"] != "pause" || sb["pausedAt"] == nil || sb["pausedExpiresAt"] == nil {
		t.Errorf("ps -o json paused sandbox = %v", sb)
	}
}
