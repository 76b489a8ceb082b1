package keeper

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dsecproject/dsec/internal/errdefs"
)

// recordingHandler keeps the log records at Warn and above.
type recordingHandler struct {
	mu sync.Mutex
	// guarded by mu
	warns []string
}

func (h *recordingHandler) Enabled(_ context.Context, l slog.Level) bool { return true }
func (h *recordingHandler) WithAttrs([]slog.Attr) slog.Handler           { return h }
func (h *recordingHandler) WithGroup(string) slog.Handler                { return h }
func (h *recordingHandler) Handle(_ context.Context, r slog.Record) error {
	if r.Level < slog.LevelWarn {
		return nil
	}
	var sb strings.Builder
	sb.WriteString(r.Message)
	r.Attrs(func(a slog.Attr) bool {
		sb.WriteString(" " + a.String())
		return true
	})
	h.mu.Lock()
	h.warns = append(h.warns, sb.String())
	h.mu.Unlock()
	return nil
}

func (h *recordingHandler) warnings() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]string(nil), h.warns...)
}

// TestWarmShapeFailingIsDropped: a shape whose warm starts keep failing is
// retried after longer and longer waits, then dropped with one warning,
// and not retried when it is asked for again; one whose failure can never
// succeed is dropped at once; a good shape is kept warm all along.
func TestWarmShapeFailingIsDropped(t *testing.T) {
	const (
		retry    = 20 * time.Millisecond
		failures = 4
	)
	failing := CreateRequest{Layers: []Layer{{Digest: "sha256:failing"}}}
	hopeless := CreateRequest{Layers: []Layer{{Digest: "sha256:hopeless"}}}
	good := CreateRequest{Layers: []Layer{{Digest: "sha256:good"}}}

	h := &recordingHandler{}
	w := newWarmPoolOf(slog.New(h), 2)
	w.retry, w.retryMax, w.failures = retry, 4*retry, failures
	var mu sync.Mutex
	attempts := map[warmKey][]time.Time{}
	w.start = func(_ context.Context, req CreateRequest) (*box, error) {
		mu.Lock()
		defer mu.Unlock()
		attempts[keyOf(req)] = append(attempts[keyOf(req)], time.Now())
		switch keyOf(req) {
		case keyOf(failing):
			return nil, errors.New("sandbox cgroup: set pids.max: invalid argument")
		case keyOf(hopeless):
			return nil, errdefs.Newf(errdefs.ErrNotFound, "layer sha256:hopeless not found")
		}
		return &box{}, nil
	}
	var removed sync.WaitGroup
	w.remove = func(*box) { removed.Done() }
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { defer close(done); w.run(ctx) }()
	defer func() {
		removed.Add(2) // the good shape's ready ones, at the end
		cancel()
		<-done
		removed.Wait()
	}()

	w.want(failing)
	w.want(hopeless)
	w.want(good)
	// 20 + 40 + 80 ms of waits, then the 4th failure drops it; a fixed
	// wait would try it about 30 times in this time.
	time.Sleep(600 * time.Millisecond)
	w.want(failing) // asked for again: still dropped
	w.want(hopeless)
	time.Sleep(200 * time.Millisecond)

	mu.Lock()
	fa, ha, ga := attempts[keyOf(failing)], attempts[keyOf(hopeless)], len(attempts[keyOf(good)])
	mu.Unlock()
	if len(fa) != failures {
		t.Errorf("a failing shape was tried %d times, want %d, then dropped", len(fa), failures)
	}
	for i := 1; i < len(fa); i++ {
		if gap, want := fa[i].Sub(fa[i-1]), min(retry<<(i-1), 4*retry); gap < want {
			t.Errorf("failed warm start %d was retried after %s, want at least %s (doubling)", i, gap, want)
		}
	}
	if len(ha) != 1 {
		t.Errorf("a shape whose layer is not found was tried %d times, want 1", len(ha))
	}
	if ga != 2 {
		t.Errorf("the good shape was started %d times, want 2 (the pool's size), failing shapes beside it", ga)
	}
	w.mu.Lock()
	_, fok := w.shapes[keyOf(failing)]
	_, hok := w.shapes[keyOf(hopeless)]
	ready := len(w.shapes[keyOf(good)].ready)
	w.mu.Unlock()
	if fok || hok || ready != 2 {
		t.Errorf("shapes kept: failing %v, hopeless %v, good with %d ready; want only good, with 2", fok, hok, ready)
	}
	warns := h.warnings()
	if len(warns) != 2 {
		t.Fatalf("warnings = %q, want one for each dropped shape", warns)
	}
	for _, want := range []string{"pids.max: invalid argument", "not found"} {
		found := false
		for _, m := range warns {
			found = found || (strings.Contains(m, "no longer kept warm") && strings.Contains(m, want))
		}
		if !found {
			t.Errorf("warnings = %q, want one saying the shape is no longer kept warm because of %q", warns, want)
		}
	}
}
