package edge

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestGate: the exclusive side waits for the shared holders and keeps new
// ones out until it is released; waits end with their contexts; a gate
// nobody uses is dropped.
func TestGate(t *testing.T) {
	var g gates
	ctx := context.Background()
	r1, err := g.rlock(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	r2, err := g.rlock(ctx, "a")
	if err != nil {
		t.Fatalf("a second shared holder = %v", err)
	}
	if _, ok := g.tryLock("a"); ok {
		t.Fatal("tryLock with shared holders succeeded")
	}
	got := make(chan func(), 1)
	go func() {
		unlock, err := g.lock(ctx, "a")
		if err != nil {
			t.Error(err)
		}
		got <- unlock
	}()
	waitFor(t, "the exclusive waiter", func() bool {
		g.mu.Lock()
		defer g.mu.Unlock()
		return g.m["a"].waiting == 1
	})
	// A waiting exclusive side keeps new shared holders out.
	sctx, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	if _, err := g.rlock(sctx, "a"); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("rlock while an exclusive waiter waits = %v, want it to wait", err)
	}
	cancel()
	// Other sandboxes are not held up.
	other, err := g.lock(ctx, "b")
	if err != nil {
		t.Fatal(err)
	}
	other()
	r1()
	select {
	case <-got:
		t.Fatal("the exclusive side was given with a shared holder left")
	case <-time.After(20 * time.Millisecond):
	}
	r2()
	unlock := <-got
	lctx, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	if _, err := g.lock(lctx, "a"); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("a second exclusive holder = %v, want it to wait", err)
	}
	cancel()
	unlock()
	unlock() // idempotent
	if g.busy("a") || g.busy("b") {
		t.Errorf("gates left after every holder released: %v", g.m)
	}
	// An exclusive waiter that gives up lets the shared ones in.
	r3, _ := g.rlock(ctx, "a")
	lctx, cancel = context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	go g.lock(lctx, "a")
	waitFor(t, "the exclusive waiter", func() bool {
		g.mu.Lock()
		defer g.mu.Unlock()
		return g.m["a"].waiting == 1
	})
	r4, err := g.rlock(ctx, "a") // waits for the waiter to give up
	if err != nil {
		t.Fatal(err)
	}
	r3()
	r4()
	waitFor(t, "the gate dropped", func() bool { return !g.busy("a") })
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatalf("%s: not within 5 s", what)
}
