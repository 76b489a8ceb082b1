package edge

import (
	"context"
	"sync"
)

// gates order, per sandbox, the changes that stop or start it or take it
// away (pause, resume, delete, and the reconcile tick's settling of them:
// the exclusive side, one at a time) with the starts of the operations
// that need it running (exec, file operations, attach, port dials: the
// shared side, any number at once). So a pause waits for the operations
// being started on its sandbox and then keeps new ones waiting until it is
// done; they find the sandbox paused and resume it. Exclusive waiters go
// first: a stream of operations cannot keep a pause out for ever.
//
// An operation holds the shared side only while it starts (an exec until
// the backend has started it, not while its output streams), so a pause
// never waits for a command to end. Every wait ends with its context.
// The zero value works.
type gates struct {
	mu sync.Mutex
	m  map[string]*gate // guarded by mu
}

// gate is one sandbox's; every field is guarded by gates.mu.
type gate struct {
	refs   int  // holders and waiters: the gate is dropped at zero
	shared int  // holders of the shared side
	excl   bool // the exclusive side is held
	// waiting counts the waiters for the exclusive side: while there are
	// any, the shared side is not given.
	waiting int
	// wake is closed (and replaced) whenever the gate is released.
	wake chan struct{}
}

// lock takes sandbox id's exclusive side, waiting for ctx at most.
func (g *gates) lock(ctx context.Context, id string) (unlock func(), err error) {
	return g.acquire(ctx, id, true)
}

// rlock takes sandbox id's shared side, waiting for ctx at most.
func (g *gates) rlock(ctx context.Context, id string) (unlock func(), err error) {
	return g.acquire(ctx, id, false)
}

// tryLock takes sandbox id's exclusive side if nobody holds or awaits
// either side.
func (g *gates) tryLock(id string) (unlock func(), ok bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if gt := g.m[id]; gt != nil {
		return nil, false
	}
	gt := g.ref(id)
	gt.excl = true
	return g.releaser(id, gt, true), true
}

// busy reports whether anyone holds or awaits sandbox id's gate.
func (g *gates) busy(id string) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.m[id] != nil
}

func (g *gates) acquire(ctx context.Context, id string, excl bool) (func(), error) {
	g.mu.Lock()
	gt := g.ref(id)
	if excl {
		gt.waiting++
	}
	for {
		free := !gt.excl && (excl && gt.shared == 0 || !excl && gt.waiting == 0)
		if free {
			if excl {
				gt.waiting--
				gt.excl = true
			} else {
				gt.shared++
			}
			g.mu.Unlock()
			return g.releaser(id, gt, excl), nil
		}
		wake := gt.wake
		g.mu.Unlock()
		select {
		case <-wake:
			g.mu.Lock()
		case <-ctx.Done():
			g.mu.Lock()
			if excl {
				gt.waiting--
				// Shared waiters held back by this one may go now.
				g.broadcast(gt)
			}
			g.unref(id, gt)
			g.mu.Unlock()
			return nil, ctx.Err()
		}
	}
}

// ref returns sandbox id's gate, made if need be, counting one more user;
// g.mu is held.
func (g *gates) ref(id string) *gate {
	if g.m == nil {
		g.m = map[string]*gate{}
	}
	gt := g.m[id]
	if gt == nil {
		gt = &gate{wake: make(chan struct{})}
		g.m[id] = gt
	}
	gt.refs++
	return gt
}

// unref counts one user less and drops a gate nobody uses; g.mu is held.
func (g *gates) unref(id string, gt *gate) {
	if gt.refs--; gt.refs == 0 {
		delete(g.m, id)
	}
}

// broadcast wakes every waiter of gt; g.mu is held.
func (g *gates) broadcast(gt *gate) {
	close(gt.wake)
	gt.wake = make(chan struct{})
}

// releaser returns the func that releases a side of gt once.
func (g *gates) releaser(id string, gt *gate, excl bool) func() {
	var once sync.Once
	return func() {
		once.Do(func() {
			g.mu.Lock()
			defer g.mu.Unlock()
			if excl {
				gt.excl = false
			} else {
				gt.shared--
			}
			g.broadcast(gt)
			g.unref(id, gt)
		})
	}
}
