package dsec

import (
	"context"
	"errors"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/testing/protocmp"
	"google.golang.org/protobuf/types/known/durationpb"

	sandboxv1 "github.com/dsecproject/dsec/api/dsec/sandbox/v1"
)

func TestBatchCreate(t *testing.T) {
	f := newFake()
	c, _ := f.start(t, testKey)
	f.mu.Lock()
	f.batchErrs = map[int]*sandboxv1.ItemError{
		1: {Code: "resource_exhausted", Message: "node memory is full", RetryAfter: durationpb.New(3 * time.Second)},
		3: {Code: "no_such_code", Message: "odd"},
	}
	f.mu.Unlock()
	res, err := c.BatchCreate(t.Context(), CreateOptions{Image: "busybox", Labels: map[string]string{"job": "b"}, IdempotencyKey: "k"}, 4)
	if err != nil {
		t.Fatalf("BatchCreate: %v", err)
	}
	wantReq := &sandboxv1.BatchCreateRequest{
		Template: &sandboxv1.CreateRequest{Image: "busybox", Labels: map[string]string{"job": "b"}, Resources: &sandboxv1.Resources{}, IdempotencyKey: "k"},
		Count:    4,
	}
	f.mu.Lock()
	gotReq := f.batchReq
	f.mu.Unlock()
	if diff := cmp.Diff(wantReq, gotReq, protocmp.Transform()); diff != "" {
		t.Errorf("BatchCreateRequest (-want +got):\n%s", diff)
	}
	if len(res) != 4 {
		t.Fatalf("BatchCreate = %d results, want 4", len(res))
	}
	for _, i := range []int{0, 2} {
		if res[i].Index != i || res[i].Err != nil || res[i].Sandbox == nil || res[i].Sandbox.Image != "busybox" {
			t.Errorf("BatchCreate result %d = %+v, want a busybox sandbox", i, res[i])
		}
	}
	if res[0].Sandbox.ID == res[2].Sandbox.ID {
		t.Errorf("items 0 and 2 are both %s", res[0].Sandbox.ID)
	}
	var de *Error
	if !errors.As(res[1].Err, &de) || !errors.Is(res[1].Err, ErrResourceExhausted) || de.RetryAfter != 3*time.Second || res[1].Sandbox != nil {
		t.Errorf("BatchCreate result 1 = %+v, want ErrResourceExhausted with retry after 3s", res[1])
	}
	if !errors.Is(res[3].Err, ErrInternal) {
		t.Errorf("BatchCreate result 3 (unknown code) = %v, want ErrInternal", res[3].Err)
	}
	// The sandboxes it made are usable handles.
	if err := res[0].Sandbox.Refresh(t.Context()); err != nil {
		t.Errorf("Refresh of a batch sandbox: %v", err)
	}

	for _, n := range []int{0, -1, MaxBatch + 1} {
		if _, err := c.BatchCreate(t.Context(), CreateOptions{Image: "busybox"}, n); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("BatchCreate(count %d) = %v, want ErrInvalidArgument", n, err)
		}
	}
	if _, err := c.BatchCreate(t.Context(), CreateOptions{}, 2); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("BatchCreate without image = %v, want ErrInvalidArgument", err)
	}
}

func TestSetTimeoutAndLabels(t *testing.T) {
	f := newFake()
	c, _ := f.start(t, testKey)
	ctx := t.Context()
	sb, err := c.Create(ctx, CreateOptions{Image: "busybox", Labels: map[string]string{"a": "1", "b": "2"}, IdleTTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}

	if err := sb.SetTimeout(ctx, 3*time.Hour, 0); err != nil {
		t.Fatalf("SetTimeout: %v", err)
	}
	want := &sandboxv1.SetTimeoutRequest{Id: sb.ID, Ttl: durationpb.New(3 * time.Hour)}
	if diff := cmp.Diff(want, f.lastCall(), protocmp.Transform()); diff != "" {
		t.Errorf("SetTimeoutRequest (-want +got):\n%s", diff)
	}
	if wantExp := time.Date(2026, 1, 2, 6, 4, 5, 0, time.UTC); !sb.ExpiresAt.Equal(wantExp) || sb.IdleTTL != time.Minute {
		t.Errorf("after SetTimeout: expires %v, idle %v; want %v, 1m", sb.ExpiresAt, sb.IdleTTL, wantExp)
	}
	if err := sb.SetTimeout(ctx, 0, 20*time.Minute); err != nil || sb.IdleTTL != 20*time.Minute {
		t.Errorf("SetTimeout(idle 20m) = %v, idle TTL %v", err, sb.IdleTTL)
	}
	for _, tt := range [][2]time.Duration{{0, 0}, {-time.Second, 0}, {0, -time.Second}} {
		if err := sb.SetTimeout(ctx, tt[0], tt[1]); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("SetTimeout(%v, %v) = %v, want ErrInvalidArgument", tt[0], tt[1], err)
		}
	}

	if err := sb.UpdateLabels(ctx, map[string]string{"c": "3", "a": "9"}, "b"); err != nil {
		t.Fatalf("UpdateLabels: %v", err)
	}
	if diff := cmp.Diff(map[string]string{"a": "9", "c": "3"}, sb.Labels); diff != "" {
		t.Errorf("labels after UpdateLabels (-want +got):\n%s", diff)
	}
	wantLabels := &sandboxv1.UpdateLabelsRequest{Id: sb.ID, Set: map[string]string{"c": "3", "a": "9"}, Remove: []string{"b"}}
	if diff := cmp.Diff(wantLabels, f.lastCall(), protocmp.Transform()); diff != "" {
		t.Errorf("UpdateLabelsRequest (-want +got):\n%s", diff)
	}
	if err := sb.UpdateLabels(ctx, nil); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("UpdateLabels(nothing) = %v, want ErrInvalidArgument", err)
	}
	if err := c.Sandbox("sb-zz").UpdateLabels(ctx, nil, "a"); !errors.Is(err, ErrNotFound) {
		t.Errorf("UpdateLabels of a missing sandbox = %v, want ErrNotFound", err)
	}
}

func TestStats(t *testing.T) {
	f := newFake()
	c, _ := f.start(t, testKey)
	sb, err := c.Create(t.Context(), CreateOptions{Image: "busybox"})
	if err != nil {
		t.Fatal(err)
	}
	f.mu.Lock()
	f.stats = &sandboxv1.StatsResponse{
		CpuUsage: durationpb.New(1500 * time.Millisecond), CpusLimit: 2,
		MemoryBytes: 10 << 20, MemoryLimit: 512 << 20, Pids: 3, PidsLimit: 4096,
		DiskBytes: 1 << 20, DiskLimit: 10 << 30, OomKills: 1, OutputBytes: 100, OutputLimit: 1 << 30,
	}
	f.mu.Unlock()
	got, err := sb.Stats(t.Context())
	if err != nil {
		t.Fatalf("Stats: %v", err)
	}
	want := &Stats{CPU: 1500 * time.Millisecond, CPUs: 2, Memory: 10 << 20, MemoryLimit: 512 << 20, Pids: 3, PidsLimit: 4096,
		Disk: 1 << 20, DiskLimit: 10 << 30, OOMKills: 1, Output: 100, OutputLimit: 1 << 30}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Stats (-want +got):\n%s", diff)
	}
	if _, err := c.Sandbox("sb-zz").Stats(t.Context()); !errors.Is(err, ErrNotFound) {
		t.Errorf("Stats of a missing sandbox = %v, want ErrNotFound", err)
	}
}

func watchEvent(typ sandboxv1.EventType, id, reason string) *sandboxv1.WatchResponse {
	return &sandboxv1.WatchResponse{Msg: &sandboxv1.WatchResponse_Event{Event: &sandboxv1.Event{
		Type: typ, Sandbox: &sandboxv1.Sandbox{Id: id, State: sandboxv1.State_STATE_RUNNING}, Reason: reason, Time: fakeTime,
	}}}
}

func TestWatch(t *testing.T) {
	f := newFake()
	c, _ := f.start(t, testKey)
	keepalive := &sandboxv1.WatchResponse{Msg: &sandboxv1.WatchResponse_Keepalive{Keepalive: &sandboxv1.Keepalive{}}}
	f.mu.Lock()
	f.watch = func(ctx context.Context, send func(*sandboxv1.WatchResponse) error) error {
		for _, m := range []*sandboxv1.WatchResponse{
			watchEvent(sandboxv1.EventType_EVENT_TYPE_CREATED, "sb-a", ""),
			keepalive,
			watchEvent(sandboxv1.EventType_EVENT_TYPE_OOM, "sb-a", "python3 killed"),
			watchEvent(sandboxv1.EventType(99), "sb-a", "from the future"),
			watchEvent(sandboxv1.EventType_EVENT_TYPE_TTL_EXPIRED, "sb-a", "idle for 15m"),
		} {
			if err := send(m); err != nil {
				return err
			}
		}
		<-ctx.Done()
		return ctx.Err()
	}
	f.mu.Unlock()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var got []Event
	err := c.Watch(ctx, WatchOptions{Selector: map[string]string{"job": "w"}, Initial: true}, func(ev Event) error {
		got = append(got, ev)
		if len(got) == 4 {
			cancel()
		}
		return nil
	})
	if err != nil {
		t.Fatalf("Watch ended by its context = %v, want nil", err)
	}
	var types, reasons []string
	for _, ev := range got {
		types = append(types, ev.Type)
		reasons = append(reasons, ev.Reason)
		if ev.Sandbox == nil || ev.Sandbox.ID != "sb-a" || ev.Sandbox.State != StateRunning || !ev.Time.Equal(fakeTime.AsTime()) {
			t.Errorf("event %+v: want sandbox sb-a running at %v", ev, fakeTime.AsTime())
		}
	}
	if diff := cmp.Diff([]string{EventCreated, EventOOM, EventUnknown, EventTTLExpired}, types); diff != "" {
		t.Errorf("event types (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"", "python3 killed", "from the future", "idle for 15m"}, reasons); diff != "" {
		t.Errorf("event reasons (-want +got):\n%s", diff)
	}
	f.mu.Lock()
	wantReq := &sandboxv1.WatchRequest{Selector: map[string]string{"job": "w"}, Initial: true}
	if diff := cmp.Diff(wantReq, f.watchReq, protocmp.Transform()); diff != "" {
		t.Errorf("WatchRequest (-want +got):\n%s", diff)
	}
	f.mu.Unlock()

	// fn's error ends the watch with it.
	stop := errors.New("enough")
	if err := c.Watch(t.Context(), WatchOptions{}, func(Event) error { return stop }); !errors.Is(err, stop) {
		t.Errorf("Watch with a failing fn = %v, want %v", err, stop)
	}

	// A stream the server fails or ends is an error.
	tests := []struct {
		end  error
		want error
	}{
		{connect.NewError(connect.CodeUnavailable, errors.New("apiserver shutting down")), ErrUnavailable},
		{connect.NewError(connect.CodePermissionDenied, errors.New("not your project")), ErrPermissionDenied},
		{nil, ErrUnavailable},
	}
	for _, tt := range tests {
		f.mu.Lock()
		f.watch = func(_ context.Context, send func(*sandboxv1.WatchResponse) error) error {
			if err := send(watchEvent(sandboxv1.EventType_EVENT_TYPE_DELETED, "sb-b", "")); err != nil {
				return err
			}
			return tt.end
		}
		f.mu.Unlock()
		n := 0
		err := c.Watch(t.Context(), WatchOptions{}, func(Event) error { n++; return nil })
		if !errors.Is(err, tt.want) || n != 1 {
			t.Errorf("Watch of a stream that ends with %v = %v after %d events, want %v after 1", tt.end, err, n, tt.want)
		}
	}
}
