package apiserver

import (
	"context"
	"errors"
	"net/http"
	"sort"
	"testing"
	"time"

	"connectrpc.com/connect"

	sandboxv1 "github.com/dsecproject/dsec/api/dsec/sandbox/v1"
	"github.com/dsecproject/dsec/api/dsec/sandbox/v1/sandboxv1connect"
	"github.com/dsecproject/dsec/internal/caller"
	"github.com/dsecproject/dsec/internal/errdefs"
	"github.com/dsecproject/dsec/sdk/go/dsec"
)

// The counting node pauses and resumes as an edge scopes them: by the
// caller's project, which the API server sets from the key.
func (e *countingEdge) Pause(_ context.Context, req *connect.Request[sandboxv1.PauseRequest]) (*connect.Response[sandboxv1.PauseResponse], error) {
	rs, err := e.pauseOrResume(req.Header(), req.Msg.GetId(), req.Msg.GetSelector(), sandboxv1.State_STATE_PAUSED)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&sandboxv1.PauseResponse{Results: rs}), nil
}

func (e *countingEdge) Resume(_ context.Context, req *connect.Request[sandboxv1.ResumeRequest]) (*connect.Response[sandboxv1.ResumeResponse], error) {
	rs, err := e.pauseOrResume(req.Header(), req.Msg.GetId(), req.Msg.GetSelector(), sandboxv1.State_STATE_RUNNING)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&sandboxv1.ResumeResponse{Results: rs}), nil
}

func (e *countingEdge) pauseOrResume(h http.Header, id string, sel map[string]string, to sandboxv1.State) ([]*sandboxv1.PauseResult, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	project := h.Get(caller.HeaderProject)
	var out []*sandboxv1.PauseResult
	for sid, sb := range e.sandboxes {
		if sb.Project != project || id != "" && sid != id || id == "" && !labelsMatch(sb.GetLabels(), sel) {
			continue
		}
		sb.State = to
		out = append(out, &sandboxv1.PauseResult{Id: sid, State: to})
	}
	if id != "" && len(out) == 0 {
		return nil, connect.NewError(connect.CodeNotFound, errors.New("sandbox not found"))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Id < out[j].Id })
	return out, nil
}

func labelsMatch(labels, sel map[string]string) bool {
	for k, v := range sel {
		if labels[k] != v {
			return false
		}
	}
	return len(sel) > 0
}

// TestPauseProjectScoping: pause and resume reach the node under the
// key's own project, whatever the request's headers claim: a key of
// another project can neither pause nor resume a sandbox, by ID or by
// selector.
func TestPauseProjectScoping(t *testing.T) {
	s := newTenancyServer(t, 0)
	ctx := t.Context()
	alice := s.client(t, "alice", dsec.KeyOptions{})
	secret, _, err := s.admin.CreateKey(ctx, dsec.KeyOptions{Project: "mallory"})
	if err != nil {
		t.Fatal(err)
	}
	mallory, err := dsec.New(dsec.Config{Addr: s.addr, APIKey: secret})
	if err != nil {
		t.Fatal(err)
	}
	defer mallory.Close()
	sb, err := alice.Create(ctx, dsec.CreateOptions{Layers: []string{digestOf([]byte("x"))}, Labels: map[string]string{"job": "train"}})
	if err != nil {
		t.Fatal(err)
	}
	state := func() sandboxv1.State {
		s.edge.mu.Lock()
		defer s.edge.mu.Unlock()
		return s.edge.sandboxes[sb.ID].GetState()
	}
	s.edge.mu.Lock()
	s.edge.sandboxes[sb.ID].Labels = map[string]string{"job": "train"} // the counting node keeps none
	s.edge.mu.Unlock()
	if _, err := mallory.Sandbox(sb.ID).Pause(ctx); !errors.Is(err, dsec.ErrNotFound) {
		t.Errorf("mallory: Pause(alice's sandbox) = %v, want NotFound", err)
	}
	if res, err := mallory.Pause(ctx, map[string]string{"job": "train"}); err != nil || len(res) != 0 {
		t.Errorf("mallory: Pause(job=train) = %+v, %v, want nothing", res, err)
	}
	raw := sandboxv1connect.NewSandboxServiceClient(http.DefaultClient, s.addr)
	req := connect.NewRequest(&sandboxv1.PauseRequest{Id: sb.ID})
	req.Header().Set("Authorization", "Bearer "+secret)
	req.Header().Set(caller.HeaderProject, "alice")
	req.Header().Set(caller.HeaderAdmin, "1")
	if _, err := raw.Pause(ctx, req); connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("mallory with forged headers: Pause = %v, want NotFound", err)
	}
	if got := state(); got == sandboxv1.State_STATE_PAUSED {
		t.Errorf("alice's sandbox after mallory's attempts: %v, want not paused", got)
	}
	if res, err := alice.Pause(ctx, map[string]string{"job": "train"}); err != nil || len(res) != 1 || res[0].State != dsec.StatePaused {
		t.Errorf("alice: Pause(job=train) = %+v, %v, want hers paused", res, err)
	}
	if _, err := mallory.Sandbox(sb.ID).Resume(ctx); !errors.Is(err, dsec.ErrNotFound) {
		t.Errorf("mallory: Resume(alice's sandbox) = %v, want NotFound", err)
	}
	if res, err := mallory.Resume(ctx, map[string]string{"job": "train"}); err != nil || len(res) != 0 {
		t.Errorf("mallory: Resume(job=train) = %+v, %v, want nothing", res, err)
	}
	if got := state(); got != sandboxv1.State_STATE_PAUSED {
		t.Errorf("alice's paused sandbox after mallory's attempts: %v, want paused", got)
	}
	// Neither an ID nor a selector, or both.
	for _, m := range []*sandboxv1.PauseRequest{{}, {Id: sb.ID, Selector: map[string]string{"job": "train"}}} {
		req := connect.NewRequest(m)
		req.Header().Set("Authorization", "Bearer "+secret)
		if _, err := raw.Pause(ctx, req); connect.CodeOf(err) != connect.CodeInvalidArgument {
			t.Errorf("Pause(%v) = %v, want InvalidArgument", m, err)
		}
	}
}

// TestPausedTTLProjectMaximum: a paused TTL is a TTL: above the project's
// maximum it is InvalidArgument, at create and in SetTimeout.
func TestPausedTTLProjectMaximum(t *testing.T) {
	s := newTenancyServer(t, 0)
	ctx := t.Context()
	c := s.client(t, "alice", dsec.KeyOptions{})
	layer := []string{digestOf([]byte("x"))}
	if _, err := c.Create(ctx, dsec.CreateOptions{Layers: layer, PausedTTL: 8 * 24 * time.Hour}); !errors.Is(err, dsec.ErrInvalidArgument) {
		t.Errorf("Create(paused TTL 8 days) = %v, want InvalidArgument (above the 7 day maximum)", err)
	}
	sb, err := c.Create(ctx, dsec.CreateOptions{Layers: layer, PausedTTL: 48 * time.Hour, IdleAction: dsec.IdlePause})
	if err != nil {
		t.Fatal(err)
	}
	if got := s.edge.creates[len(s.edge.creates)-1]; got.GetPausedTtl().AsDuration() != 48*time.Hour || got.GetIdleAction() != "pause" {
		t.Errorf("the node got paused_ttl %v, idle_action %q", got.GetPausedTtl(), got.GetIdleAction())
	}
	if err := sb.SetTimeouts(ctx, dsec.Timeouts{PausedTTL: 8 * 24 * time.Hour}); !errors.Is(err, dsec.ErrInvalidArgument) {
		t.Errorf("SetTimeouts(paused TTL 8 days) = %v, want InvalidArgument", err)
	}
}

// TestSandboxKeyCannotPause: the API for sandboxes refuses Pause (a
// sandbox would freeze itself, or make the node swap its project's others
// out and in at will) and lets Resume through (any request resumes).
func TestSandboxKeyCannotPause(t *testing.T) {
	var g sandboxGuard
	if err := g.check(sandboxv1connect.SandboxServicePauseProcedure); !errdefs.Is(err, errdefs.ErrPermissionDenied) {
		t.Errorf("a sandbox's key: Pause = %v, want PermissionDenied", err)
	}
	if err := g.check(sandboxv1connect.SandboxServiceResumeProcedure); err != nil {
		t.Errorf("a sandbox's key: Resume = %v, want allowed", err)
	}
}
