package keeper

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"sync"
	"time"
)

// diskPool keeps a few writable-layer disks of the common size ready, so
// that a create takes one instead of making it (an ext4 image per sandbox
// costs ~10 ms where the kernel has no project quotas). A goroutine owned
// by the keeper refills it in the background.
type diskPool struct {
	c     *containerDriver
	size  int64 // the disk size pooled
	want  int   // how many to keep ready
	kick  chan struct{}
	mu    sync.Mutex
	ready []string // guarded by mu: names of ready disks
}

func newDiskPool(c *containerDriver, size int64, want int) *diskPool {
	return &diskPool{c: c, size: size, want: want, kick: make(chan struct{}, 1)}
}

// take returns a ready disk of size bytes, or "" when there is none.
func (p *diskPool) take(size int64) string {
	if p == nil || size != p.size {
		return ""
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.ready) == 0 {
		p.poke()
		return ""
	}
	name := p.ready[len(p.ready)-1]
	p.ready = p.ready[:len(p.ready)-1]
	p.poke()
	return name
}

// poke asks the refiller to look; guarded by mu or not, it never blocks.
func (p *diskPool) poke() {
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

// run refills the pool until ctx ends, then removes the ready disks.
func (p *diskPool) run(ctx context.Context) {
	defer p.drain()
	p.poke()
	for {
		select {
		case <-ctx.Done():
			return
		case <-p.kick:
		}
		for ctx.Err() == nil {
			p.mu.Lock()
			n := len(p.ready)
			p.mu.Unlock()
			if n >= p.want {
				break
			}
			name := "pool-" + randomHex(6)
			cctx, cancel := context.WithTimeout(ctx, time.Minute)
			_, err := p.c.disk.Create(cctx, name, p.size, 0)
			cancel()
			if err != nil {
				if ctx.Err() == nil {
					p.c.log.Warn("prepare a sandbox disk", "err", err)
				}
				break // try again at the next kick
			}
			p.mu.Lock()
			p.ready = append(p.ready, name)
			p.mu.Unlock()
		}
	}
}

// drain removes the disks still ready; they belong to no sandbox.
func (p *diskPool) drain() {
	p.mu.Lock()
	names := p.ready
	p.ready = nil
	p.mu.Unlock()
	for _, n := range names {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		_ = p.c.disk.Remove(ctx, n)
		cancel()
	}
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
