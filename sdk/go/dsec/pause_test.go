package dsec

import (
	"context"
	"errors"
	"sort"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	sandboxv1 "github.com/dsecproject/dsec/api/dsec/sandbox/v1"
)

// The fake's pause and resume: a sandbox labelled full cannot be resumed
// (the node has no room), one labelled exited cannot be paused.
func (f *fake) Pause(_ context.Context, req *connect.Request[sandboxv1.PauseRequest]) (*connect.Response[sandboxv1.PauseResponse], error) {
	return pauseOrResume(f, req.Msg, req.Msg.GetId(), req.Msg.GetSelector(), sandboxv1.State_STATE_PAUSED, func(rs []*sandboxv1.PauseResult) *connect.Response[sandboxv1.PauseResponse] {
		return connect.NewResponse(&sandboxv1.PauseResponse{Results: rs})
	})
}

func (f *fake) Resume(_ context.Context, req *connect.Request[sandboxv1.ResumeRequest]) (*connect.Response[sandboxv1.ResumeResponse], error) {
	return pauseOrResume(f, req.Msg, req.Msg.GetId(), req.Msg.GetSelector(), sandboxv1.State_STATE_RUNNING, func(rs []*sandboxv1.PauseResult) *connect.Response[sandboxv1.ResumeResponse] {
		return connect.NewResponse(&sandboxv1.ResumeResponse{Results: rs})
	})
}

func pauseOrResume[Resp any](f *fake, m proto.Message, id string, sel map[string]string, to sandboxv1.State, wrap func([]*sandboxv1.PauseResult) *connect.Response[Resp]) (*connect.Response[Resp], error) {
	f.recordCall(m)
	f.mu.Lock()
	defer f.mu.Unlock()
	var ids []string
	if id != "" {
		if _, err := f.sandbox(id); err != nil {
			return nil, err
		}
		ids = []string{id}
	}
	for sid, sb := range f.sandboxes {
		if id == "" && len(sel) > 0 && matchesAll(sb.GetLabels(), sel) {
			ids = append(ids, sid)
		}
	}
	sort.Strings(ids)
	var out []*sandboxv1.PauseResult
	for _, sid := range ids {
		sb := f.sandboxes[sid]
		switch {
		case to == sandboxv1.State_STATE_RUNNING && sb.GetLabels()["full"] != "":
			ie := &sandboxv1.ItemError{Code: "resource_exhausted", Message: "sandbox " + sid + " is paused and node node-1 has no room to resume it", RetryAfter: durationpb.New(5 * time.Second)}
			if id != "" {
				ce := connect.NewError(connect.CodeResourceExhausted, errors.New(ie.Message))
				return nil, ce
			}
			out = append(out, &sandboxv1.PauseResult{Id: sid, Error: ie})
		case to == sandboxv1.State_STATE_PAUSED && sb.GetLabels()["exited"] != "":
			out = append(out, &sandboxv1.PauseResult{Id: sid, Error: &sandboxv1.ItemError{Code: "failed_precondition", Message: "sandbox " + sid + " is exited"}})
		default:
			took := time.Duration(0)
			if sb.GetState() != to {
				took = 120 * time.Millisecond
			}
			sb.State = to
			out = append(out, &sandboxv1.PauseResult{Id: sid, State: to, ResidentBytes: 8 << 20, SwappedBytes: 56 << 20, Took: durationpb.New(took)})
		}
	}
	return wrap(out), nil
}

func matchesAll(labels, sel map[string]string) bool {
	for k, v := range sel {
		if labels[k] != v {
			return false
		}
	}
	return true
}

func TestPauseResume(t *testing.T) {
	f := newFake()
	c, _ := f.start(t, testKey)
	ctx := context.Background()
	sb, err := c.Create(ctx, CreateOptions{Image: "busybox", PausedTTL: 2 * time.Hour, IdleAction: IdlePause, Labels: map[string]string{"job": "a"}})
	if err != nil {
		t.Fatal(err)
	}
	req := f.lastCreate()
	if req.GetPausedTtl().AsDuration() != 2*time.Hour || req.GetIdleAction() != "pause" {
		t.Errorf("create sent paused_ttl %v, idle_action %q", req.GetPausedTtl(), req.GetIdleAction())
	}
	res, err := sb.Pause(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := &PauseResult{ID: sb.ID, State: StatePaused, Resident: 8 << 20, Swapped: 56 << 20, Took: 120 * time.Millisecond}
	if diff := cmp.Diff(want, res); diff != "" {
		t.Errorf("Pause (-want +got):\n%s", diff)
	}
	if sb.State != StatePaused {
		t.Errorf("State after Pause = %s", sb.State)
	}
	if res, err := sb.Pause(ctx); err != nil || res.Took != 0 {
		t.Errorf("Pause of a paused sandbox = %+v, %v, want it as it is", res, err)
	}
	if res, err := sb.Resume(ctx); err != nil || res.State != StateRunning || sb.State != StateRunning {
		t.Errorf("Resume = %+v, %v (state %s)", res, err, sb.State)
	}
	if got := f.lastCall().(*sandboxv1.ResumeRequest); got.GetId() != sb.ID || len(got.GetSelector()) != 0 {
		t.Errorf("Resume sent %v", got)
	}
	if _, err := c.Sandbox("sb-nope").Pause(ctx); !errors.Is(err, ErrNotFound) {
		t.Errorf("Pause(unknown) = %v, want ErrNotFound", err)
	}
}

// TestPauseSelector: by selector, one result per sandbox in ID order, each
// error in the one table's kinds with its retry hint; an empty selector is
// refused before the call.
func TestPauseSelector(t *testing.T) {
	f := newFake()
	c, _ := f.start(t, testKey)
	ctx := context.Background()
	mk := func(labels map[string]string) *Sandbox {
		sb, err := c.Create(ctx, CreateOptions{Image: "busybox", Labels: labels})
		if err != nil {
			t.Fatal(err)
		}
		return sb
	}
	a := mk(map[string]string{"job": "j"})
	b := mk(map[string]string{"job": "j", "exited": "1"})
	full := mk(map[string]string{"job": "j", "full": "1"})
	mk(map[string]string{"job": "other"})
	res, err := c.Pause(ctx, map[string]string{"job": "j"})
	if err != nil {
		t.Fatal(err)
	}
	if len(res) != 3 || res[0].ID != a.ID || res[1].ID != b.ID || res[2].ID != full.ID {
		t.Fatalf("Pause(job=j) = %+v, want a, b, c in ID order", res)
	}
	if res[0].State != StatePaused || res[0].Err != nil {
		t.Errorf("result of a = %+v", res[0])
	}
	if !errors.Is(res[1].Err, ErrFailedPrecondition) || res[1].State != "" {
		t.Errorf("result of the exited b = %+v, want ErrFailedPrecondition", res[1])
	}
	res, err = c.Resume(ctx, map[string]string{"job": "j"})
	if err != nil {
		t.Fatal(err)
	}
	if e := res[2].Err; !errors.Is(e, ErrResourceExhausted) || e.RetryAfter != 5*time.Second {
		t.Errorf("resume of a sandbox without room = %+v, want ErrResourceExhausted with a 5s hint", res[2])
	}
	var e *Error
	if _, err := full.Resume(ctx); !errors.As(err, &e) || !errors.Is(err, ErrResourceExhausted) {
		t.Errorf("Resume(by ID, no room) = %v, want ErrResourceExhausted", err)
	}
	for _, sel := range []map[string]string{nil, {}} {
		if _, err := c.Pause(ctx, sel); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("Pause(%v) = %v, want ErrInvalidArgument", sel, err)
		}
		if _, err := c.Resume(ctx, sel); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("Resume(%v) = %v, want ErrInvalidArgument", sel, err)
		}
	}
}

// TestPausedSandboxFields: a paused sandbox's fields, timeouts on the wire,
// and the paused and resumed events.
func TestPausedSandboxFields(t *testing.T) {
	c := &Client{}
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	sb := c.sandboxFromProto(&sandboxv1.Sandbox{
		Id: "sb-a", State: sandboxv1.State_STATE_PAUSED, PausedAt: timestamppb.New(at), PausedExpiresAt: timestamppb.New(at.Add(24 * time.Hour)),
		PausedTtl: durationpb.New(24 * time.Hour), IdleAction: "pause",
	})
	if sb.State != StatePaused || !sb.PausedAt.Equal(at) || !sb.PausedExpiresAt.Equal(at.Add(24*time.Hour)) || sb.PausedTTL != 24*time.Hour || sb.IdleAction != IdlePause {
		t.Errorf("paused sandbox = %+v", sb)
	}
	for typ, want := range map[sandboxv1.EventType]string{sandboxv1.EventType_EVENT_TYPE_PAUSED: EventPaused, sandboxv1.EventType_EVENT_TYPE_RESUMED: EventResumed} {
		if ev := c.eventFromProto(&sandboxv1.Event{Type: typ}); ev.Type != want {
			t.Errorf("event %v = %s, want %s", typ, ev.Type, want)
		}
	}

	f := newFake()
	cl, _ := f.start(t, testKey)
	ctx := context.Background()
	live, err := cl.Create(ctx, CreateOptions{Image: "busybox"})
	if err != nil {
		t.Fatal(err)
	}
	if err := live.SetTimeouts(ctx, Timeouts{PausedTTL: time.Hour, IdleAction: IdlePause}); err != nil {
		t.Fatal(err)
	}
	got := f.lastCall().(*sandboxv1.SetTimeoutRequest)
	if got.GetPausedTtl().AsDuration() != time.Hour || got.GetIdleAction() != "pause" || got.Ttl != nil || got.IdleTtl != nil {
		t.Errorf("SetTimeouts sent %v", got)
	}
	if err := live.SetTimeouts(ctx, Timeouts{}); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("SetTimeouts(nothing) = %v, want ErrInvalidArgument", err)
	}
	if err := live.SetTimeouts(ctx, Timeouts{PausedTTL: -time.Second}); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("SetTimeouts(negative) = %v, want ErrInvalidArgument", err)
	}
}
