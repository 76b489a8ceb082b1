package fusion

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dsecproject/dsec/sdk/go/dsec"
)

// fakeSandboxes makes and discards sandbox handles without a server.
type fakeSandboxes struct {
	c *dsec.Client

	mu        sync.Mutex
	created   int      // guarded by mu
	discarded []string // guarded by mu
	fail      error    // guarded by mu
	age       time.Duration
}

func (f *fakeSandboxes) create(ctx context.Context, key poolKey) (*dsec.Sandbox, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fail != nil {
		return nil, f.fail
	}
	f.created++
	sb := f.c.Sandbox("sb-" + string(rune('a'+f.created-1)))
	sb.CreatedAt = time.Now().Add(-f.age)
	return sb, nil
}

func (f *fakeSandboxes) discard(sb *dsec.Sandbox) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.discarded = append(f.discarded, sb.ID)
}

func (f *fakeSandboxes) counts() (int, int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.created, len(f.discarded)
}

func newFakes(t *testing.T) *fakeSandboxes {
	c, err := dsec.New(dsec.Config{Addr: "http://127.0.0.1:1", APIKey: "k"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &fakeSandboxes{c: c}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for range 500 {
		if cond() {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("timed out waiting for %s", what)
}

func (p *pool) readyCount() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.ready)
}

func TestPoolRefillsAndDrains(t *testing.T) {
	f := newFakes(t)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	p := newPool(poolKey{image: "i", memory: 1}, 3, time.Hour, true, f.create, f.discard, log)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { p.run(ctx); close(done) }()
	waitFor(t, "a full pool", func() bool { return p.readyCount() == 3 })
	sb, err := p.take(ctx)
	if err != nil || sb == nil {
		t.Fatalf("take = %v, %v", sb, err)
	}
	// The refill may already have made a fourth; what take handed out
	// must be one made before it was called.
	if sb.ID != "sb-a" && sb.ID != "sb-b" && sb.ID != "sb-c" {
		t.Errorf("take returned %s, a sandbox made after the call; want one from the pool", sb.ID)
	}
	waitFor(t, "the pool to refill", func() bool { return p.readyCount() == 3 })
	cancel()
	<-done
	if created, discarded := f.counts(); created != 4 || discarded != 3 {
		t.Errorf("after stop: %d created, %d discarded; want 4 and the 3 ready ones discarded", created, discarded)
	}
}

func TestPoolCreatesWhenEmptyAndExpires(t *testing.T) {
	f := newFakes(t)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	p := newPool(poolKey{image: "i"}, 2, time.Minute, true, f.create, f.discard, log)
	ctx := context.Background()
	// Not running: take creates the sandbox itself.
	if sb, err := p.take(ctx); err != nil || sb.ID != "sb-a" {
		t.Fatalf("take from an empty pool = %v, %v", sb, err)
	}
	// Sandboxes past maxAge are discarded, never handed out.
	f.age = 2 * time.Minute
	p.refill(ctx)
	if n := p.readyCount(); n != 2 {
		t.Fatalf("refill left %d ready, want 2", n)
	}
	p.expire()
	if _, discarded := f.counts(); discarded != 2 || p.readyCount() != 0 {
		t.Errorf("expire: %d discarded, %d ready; want 2 and 0", discarded, p.readyCount())
	}
	f.mu.Lock()
	f.fail = errors.New("no image")
	f.mu.Unlock()
	if _, err := p.take(ctx); err == nil {
		t.Errorf("take with failing creates = nil error")
	}
}

// TestRunCodeNeverReusesASandbox: every call takes a sandbox that ran no
// call before, and deletes it after, so nothing a call leaves (files,
// processes) reaches a later one.
func TestRunCodeNeverReusesASandbox(t *testing.T) {
	s := newTestServer(t, Config{})
	s.cfg.PoolSize = 2
	f := newFakes(t)
	s.newSandbox = f.create
	var mu sync.Mutex
	deleted := map[string]int{} // guarded by mu
	s.deleteSandbox = func(_ context.Context, sb *dsec.Sandbox) error {
		mu.Lock()
		defer mu.Unlock()
		deleted[sb.ID]++
		return nil
	}
	nDeleted := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(deleted)
	}
	const calls = 6
	for i := range calls {
		// The client reaches no platform: the call fails writing its
		// files, after it took its sandbox.
		resp := s.RunCode(t.Context(), &RunCodeRequest{Language: "bash", Code: "true", RunTimeout: 1, CompileTimeout: 1})
		if resp.Status != StatusSandboxError || !strings.Contains(resp.Message, "write the code") {
			t.Fatalf("call %d = %s %q, want SandboxError writing the code", i, resp.Status, resp.Message)
		}
		waitFor(t, "the used sandbox deleted", func() bool { return nDeleted() == i+1 })
	}
	if err := s.Close(t.Context()); err != nil {
		t.Fatal(err)
	}
	created, _ := f.counts()
	mu.Lock()
	defer mu.Unlock()
	if len(deleted) != created {
		t.Errorf("%d sandboxes created, %d deleted (%v); want every one deleted", created, len(deleted), deleted)
	}
	for id, n := range deleted {
		if n != 1 {
			t.Errorf("sandbox %s deleted %d times, want once", id, n)
		}
	}
}

// TestPoolRefillsOnceCreatesWork: a pool that failed to create (its image
// was missing) fills again as soon as a call's own create works, not after
// its backoff.
func TestPoolRefillsOnceCreatesWork(t *testing.T) {
	f := newFakes(t)
	f.fail = errors.New("no image")
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	p := newPool(poolKey{image: "i", memory: 1}, 2, time.Hour, true, f.create, f.discard, log)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { p.run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	waitFor(t, "failed creates", func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		return p.failures >= 2 // the pool now waits 4 s
	})
	f.mu.Lock()
	f.fail = nil
	f.mu.Unlock()
	start := time.Now()
	if _, err := p.take(ctx); err != nil {
		t.Fatalf("take = %v", err)
	}
	waitFor(t, "a full pool", func() bool { return p.readyCount() == 2 })
	if d := time.Since(start); d > time.Second {
		t.Errorf("the pool filled %v after creates worked again, want at once (not after its backoff)", d)
	}
}
