package fusion

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/dsecproject/dsec/sdk/go/dsec"
)

// poolKey names the sandboxes one pool holds: those of one image with one
// memory limit.
type poolKey struct {
	image  string
	memory int64
}

// pool keeps up to size sandboxes of one kind created ahead of the calls
// that take them; each is used by one call and then deleted, and the pool
// refills in the background. It holds only sandboxes that have run
// nothing: nothing is ever put back. Its goroutine ends when ctx ends.
type pool struct {
	key     poolKey
	size    int
	maxAge  time.Duration
	create  func(ctx context.Context, key poolKey) (*dsec.Sandbox, error)
	discard func(sb *dsec.Sandbox)
	log     *slog.Logger
	wake    chan struct{}
	// keepWarm refills the pool even when no call took from it for
	// maxAge (the pools of the default memory limit).
	keepWarm bool

	mu       sync.Mutex
	lastUsed time.Time       // guarded by mu
	ready    []*dsec.Sandbox // guarded by mu; oldest first
	// failures counts consecutive failed creates; guarded by mu.
	failures int
}

func newPool(key poolKey, size int, maxAge time.Duration, keepWarm bool, create func(context.Context, poolKey) (*dsec.Sandbox, error), discard func(*dsec.Sandbox), log *slog.Logger) *pool {
	return &pool{
		key: key, size: size, maxAge: maxAge, keepWarm: keepWarm, create: create, discard: discard, log: log,
		wake: make(chan struct{}, 1), lastUsed: time.Now(),
	}
}

// take returns a ready sandbox, or creates one when none is ready, and
// wakes the refill.
func (p *pool) take(ctx context.Context) (*dsec.Sandbox, error) {
	p.mu.Lock()
	p.lastUsed = time.Now()
	var sb *dsec.Sandbox
	for len(p.ready) > 0 && sb == nil {
		// Newest first: it has the most time left.
		cand := p.ready[len(p.ready)-1]
		p.ready = p.ready[:len(p.ready)-1]
		if time.Since(cand.CreatedAt) < p.maxAge {
			sb = cand
		} else {
			p.discard(cand)
		}
	}
	p.mu.Unlock()
	p.kick()
	if sb != nil {
		return sb, nil
	}
	sb, err := p.create(ctx, p.key)
	if err == nil {
		p.mu.Lock()
		p.failures = 0
		p.mu.Unlock()
		p.kick()
	}
	return sb, err
}

func (p *pool) kick() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// idleSince returns when a call last took from the pool.
func (p *pool) idleSince() time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.lastUsed
}

// run refills the pool until ctx ends, then deletes what it holds.
func (p *pool) run(ctx context.Context) {
	defer p.drain()
	tick := time.NewTicker(p.maxAge / 4)
	defer tick.Stop()
	for {
		p.refill(ctx)
		select {
		case <-ctx.Done():
			return
		case <-p.wake:
		case <-tick.C:
			p.expire()
		}
	}
}

// refill creates sandboxes one at a time until the pool is full. After a
// failed create it waits, doubling the wait up to 30 s, so that a missing
// image does not make it spin.
func (p *pool) refill(ctx context.Context) {
	for ctx.Err() == nil {
		p.mu.Lock()
		n, failures := len(p.ready), p.failures
		p.mu.Unlock()
		if n >= p.size || !p.keepWarm && time.Since(p.idleSince()) > p.maxAge {
			return
		}
		if failures > 0 {
			wait := min(time.Duration(1<<min(failures, 5))*time.Second, 30*time.Second)
			select {
			case <-ctx.Done():
				return
			case <-time.After(wait):
			case <-p.wake:
				// A call took from the pool: if its own create worked
				// (the image exists now), failures is 0 and the refill
				// goes on at once; if not, the wait starts again.
				continue
			}
		}
		sb, err := p.create(ctx, p.key)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			p.mu.Lock()
			p.failures++
			first := p.failures == 1
			p.mu.Unlock()
			if first {
				p.log.Warn("sandboxfusion: cannot fill the pool of ready sandboxes", "image", p.key.image, "err", err)
			}
			var de *dsec.Error
			if errors.As(err, &de) && de.RetryAfter > 0 {
				select {
				case <-ctx.Done():
					return
				case <-time.After(de.RetryAfter):
				}
			}
			continue
		}
		p.mu.Lock()
		p.failures = 0
		p.ready = append(p.ready, sb)
		p.mu.Unlock()
	}
}

// expire deletes ready sandboxes that are too old to hand out.
func (p *pool) expire() {
	p.mu.Lock()
	defer p.mu.Unlock()
	kept := p.ready[:0]
	for _, sb := range p.ready {
		if time.Since(sb.CreatedAt) < p.maxAge {
			kept = append(kept, sb)
		} else {
			p.discard(sb)
		}
	}
	p.ready = kept
}

// drain deletes every ready sandbox.
func (p *pool) drain() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, sb := range p.ready {
		p.discard(sb)
	}
	p.ready = nil
}
